//! The journal's store operations (`JournalStore`): a run's recorded step results, the first
//! writer's kept. Each engine implements it in its `journal.rs`; durable runs grow it.

use async_trait::async_trait;

use crate::error::Result;

/// What the journal asks of a database.
#[async_trait]
pub trait JournalStore: Send + Sync {
    /// The recorded result (JSON text) of step `name` of run `run_id`.
    async fn step_get(&self, run_id: &str, name: &str) -> Result<Option<String>>;
    /// Record a step result unless one exists; returns the kept (first written) result.
    async fn step_put(&self, run_id: &str, name: &str, result: &str) -> Result<String>;
}
