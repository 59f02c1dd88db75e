//! The SQLite scheduler store (`TriggerStore`): `gnl_triggers`, written by one autocommit
//! statement each behind the process's write lock; the due poll reads the partial index
//! `gnl_triggers_due`. A fenced state write checks the fire lock in the same statement.

use async_trait::async_trait;

use super::SqliteStore;
use crate::error::Result;
use crate::store::triggers::*;

fn p(k: usize) -> String {
    format!("?{k}")
}

impl SqliteStore {
    async fn trigger_of<'e>(
        &self,
        ex: impl sqlx::SqliteExecutor<'e>,
        id: &str,
    ) -> Result<Option<TriggerRow>> {
        self.counted(1);
        let row = sqlx::query(&format!(
            "SELECT {TRIGGER_COLS} FROM gnl_triggers WHERE id = ?1"
        ))
        .bind(id)
        .fetch_optional(ex)
        .await?;
        Ok(row.as_ref().map(trigger_row))
    }
}

#[async_trait]
impl TriggerStore for SqliteStore {
    async fn trigger_register(
        &self,
        def: &TriggerDef,
        initial: &TriggerState,
    ) -> Result<(bool, TriggerRow)> {
        let now = self.clock_ms();
        let sql = format!(
            "{} ON CONFLICT (id) DO NOTHING",
            insert_sql(p, &now.to_string())
        );
        let won = {
            let _w = self.write.lock().await;
            self.counted(1);
            bind_state(bind_def(sqlx::query(&sql), def), initial)
                .execute(&self.pool)
                .await?
                .rows_affected()
        };
        Ok((
            won == 1,
            registered(self.trigger_of(&self.pool, &def.id).await?, &def.id)?,
        ))
    }

    async fn triggers_due(
        &self,
        now_ms: Option<i64>,
        after: Option<(i64, String)>,
        limit: i64,
    ) -> Result<DueTriggers> {
        let now = now_ms.unwrap_or_else(|| self.clock_ms());
        self.counted(1);
        let page = if after.is_some() {
            "AND (due_at > ?2 OR (due_at = ?2 AND id > ?3))"
        } else {
            ""
        };
        let (a_due, a_id) = after.unwrap_or((0, String::new()));
        // One row past the page: the first trigger not due yet (`DueTriggers::split`).
        let sql = format!(
            "SELECT {TRIGGER_COLS} FROM gnl_triggers \
             WHERE due_at IS NOT NULL {page} ORDER BY due_at, id LIMIT ?1"
        );
        let mut q = sqlx::query(&sql).bind(limit.saturating_add(1));
        if !page.is_empty() {
            q = q.bind(a_due).bind(a_id);
        }
        let rows = q.fetch_all(&self.pool).await?;
        Ok(DueTriggers::split(
            now,
            rows.iter().map(trigger_row).collect(),
            limit,
        ))
    }

    async fn trigger_get(&self, id: &str) -> Result<Option<TriggerRow>> {
        let mut r = self.read().await?;
        let row = self.trigger_of(&mut *r, id).await?;
        self.done(r).await?;
        Ok(row)
    }

    async fn list_triggers(&self, after: Option<&str>, limit: i64) -> Result<Vec<TriggerRow>> {
        self.counted(1);
        let mut r = self.read().await?;
        let rows = sqlx::query(&format!(
            "SELECT {TRIGGER_COLS} FROM gnl_triggers WHERE ?1 IS NULL OR id > ?1 ORDER BY id LIMIT ?2"
        ))
        .bind(after)
        .bind(limit)
        .fetch_all(&mut *r)
        .await?;
        self.done(r).await?;
        Ok(rows.iter().map(trigger_row).collect())
    }

    async fn trigger_update(
        &self,
        id: &str,
        version: i64,
        state: &TriggerState,
        fence: Option<(&str, i64)>,
    ) -> Result<bool> {
        let n = STATE_COLS.len();
        let fenced = if fence.is_some() {
            format!(
                " AND EXISTS (SELECT 1 FROM gnl_locks WHERE lock_key = ?{} AND token = ?{})",
                n + 4,
                n + 5
            )
        } else {
            String::new()
        };
        let sql = format!(
            "UPDATE gnl_triggers SET {}, version = version + 1, updated_at = ?{} \
             WHERE id = ?{} AND version = ?{}{fenced}",
            set_clause(p, 1),
            n + 1,
            n + 2,
            n + 3,
        );
        let now = self.clock_ms();
        let _w = self.write.lock().await;
        self.counted(1);
        let mut q = bind_state(sqlx::query(&sql), state)
            .bind(now)
            .bind(id)
            .bind(version);
        if let Some((key, token)) = fence {
            q = q.bind(key).bind(token);
        }
        Ok(q.execute(&self.pool).await?.rows_affected() == 1)
    }

    async fn trigger_delete(&self, id: &str) -> Result<bool> {
        let _w = self.write.lock().await;
        self.counted(1);
        Ok(sqlx::query("DELETE FROM gnl_triggers WHERE id = ?1")
            .bind(id)
            .execute(&self.pool)
            .await?
            .rows_affected()
            == 1)
    }
}
