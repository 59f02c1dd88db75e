//! The MySQL journal (`JournalStore`): a run's step results in `gnl_steps`, keyed by a hash of
//! (run_id, name), the first writer's kept (`ON DUPLICATE KEY` leaves it as it is).

use async_trait::async_trait;

use super::{text, MysqlStore};
use crate::error::{Error, Result};
use crate::store::JournalStore;

/// The key of a step: SHA-256 over (run_id, name), run_id's length first so that no two pairs
/// share it. Binds run_id, run_id, name.
const STEP_KEY: &str = "UNHEX(SHA2(CONCAT(LENGTH(?), ':', ?, ?), 256))";

#[async_trait]
impl JournalStore for MysqlStore {
    async fn step_get(&self, run_id: &str, name: &str) -> Result<Option<String>> {
        self.counted(1);
        let row = sqlx::query(&format!(
            "SELECT result FROM gnl_steps WHERE step_key = {STEP_KEY} AND run_id = ? AND name = ?"
        ))
        .bind(run_id.as_bytes())
        .bind(run_id.as_bytes())
        .bind(name.as_bytes())
        .bind(run_id.as_bytes())
        .bind(name.as_bytes())
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.as_ref().map(|r| text(r, 0)))
    }

    async fn step_put(&self, run_id: &str, name: &str, result: &str) -> Result<String> {
        self.check_size(
            "the step's result",
            result.len() + run_id.len() + name.len(),
        )?;
        self.counted(1);
        // Only the duplicate key is ignored; the first writer's row stays as it is.
        sqlx::query(&format!(
            "INSERT INTO gnl_steps (step_key, run_id, name, result, created_at) \
             VALUES ({STEP_KEY}, ?, ?, ?, {}) ON DUPLICATE KEY UPDATE step_key = step_key",
            now_ms!()
        ))
        .bind(run_id.as_bytes())
        .bind(run_id.as_bytes())
        .bind(name.as_bytes())
        .bind(run_id.as_bytes())
        .bind(name.as_bytes())
        .bind(result)
        .execute(&self.pool)
        .await?;
        // READ COMMITTED: this statement sees the row, ours or the first writer's.
        self.step_get(run_id, name)
            .await?
            .ok_or_else(|| Error::Store {
                message: format!("step {name:?} of run {run_id:?} vanished after it was written"),
                code: None,
            })
    }
}
