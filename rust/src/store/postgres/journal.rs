//! The Postgres journal (`JournalStore`): a run's step results in `gnl_steps`, the first
//! writer's kept (one statement: insert unless present, then read what is kept).

use async_trait::async_trait;

use super::PostgresStore;
use crate::error::Result;
use crate::store::JournalStore;

const STEP_PUT: &str = concat!(
    "WITH ins AS (
       INSERT INTO gnl_steps (run_id, name, result, created_at) VALUES ($1, $2, $3, ",
    now_ms!(),
    ")
       ON CONFLICT (run_id, name) DO NOTHING
       RETURNING result
     )
     SELECT result FROM ins
     UNION ALL
     SELECT result FROM gnl_steps WHERE run_id = $1 AND name = $2
     LIMIT 1"
);

#[async_trait]
impl JournalStore for PostgresStore {
    async fn step_get(&self, run_id: &str, name: &str) -> Result<Option<String>> {
        self.counted(1);
        Ok(
            sqlx::query_scalar("SELECT result FROM gnl_steps WHERE run_id = $1 AND name = $2")
                .bind(run_id)
                .bind(name)
                .fetch_optional(&self.pool)
                .await?,
        )
    }

    async fn step_put(&self, run_id: &str, name: &str, result: &str) -> Result<String> {
        loop {
            self.counted(1);
            let kept: Option<String> = sqlx::query_scalar(STEP_PUT)
                .bind(run_id)
                .bind(name)
                .bind(result)
                .fetch_optional(&self.pool)
                .await?;
            // None: another writer's row committed after this statement's snapshot (it waited
            // on that writer); the next statement sees it.
            if let Some(k) = kept {
                return Ok(k);
            }
        }
    }
}
