//! The SQLite journal (`JournalStore`): a run's step results in `gnl_steps`, the first
//! writer's kept (`ON CONFLICT DO NOTHING` inside one write transaction).

use async_trait::async_trait;

use super::SqliteStore;
use crate::error::Result;
use crate::store::JournalStore;

#[async_trait]
impl JournalStore for SqliteStore {
    async fn step_get(&self, run_id: &str, name: &str) -> Result<Option<String>> {
        self.counted(1);
        Ok(
            sqlx::query_scalar("SELECT result FROM gnl_steps WHERE run_id = ?1 AND name = ?2")
                .bind(run_id)
                .bind(name)
                .fetch_optional(&self.pool)
                .await?,
        )
    }

    async fn step_put(&self, run_id: &str, name: &str, result: &str) -> Result<String> {
        let _w = self.write.lock().await;
        let mut tx = self.begin_write().await?;
        self.counted(2);
        sqlx::query("INSERT INTO gnl_steps (run_id, name, result, created_at) VALUES (?1, ?2, ?3, ?4) ON CONFLICT DO NOTHING")
            .bind(run_id)
            .bind(name)
            .bind(result)
            .bind(self.clock_ms())
            .execute(&mut *tx)
            .await?;
        let kept: String =
            sqlx::query_scalar("SELECT result FROM gnl_steps WHERE run_id = ?1 AND name = ?2")
                .bind(run_id)
                .bind(name)
                .fetch_one(&mut *tx)
                .await?;
        self.commit(tx).await?;
        Ok(kept)
    }
}
