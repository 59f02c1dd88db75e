//! The MySQL / MariaDB scheduler store (`TriggerStore`): `gnl_triggers`, keyed by the id (at
//! most 255 characters), one autocommit statement per write; the due poll is one range read of
//! `gnl_triggers_due (due_at, id)`. Instants are the server's clock (`now_ms!`). A fenced
//! state write checks the fire lock (keyed by the SHA-256 of its key) in the same statement.

use async_trait::async_trait;
use sqlx::mysql::MySqlRow;
use sqlx::Row;

use super::{opt_text, text, MysqlStore};
use crate::error::Result;
use crate::store::triggers::*;
use crate::store::Store;

fn p(_: usize) -> String {
    "?".into()
}

fn row(r: &MySqlRow) -> TriggerRow {
    trigger_row_with(
        |k| text(r, k),
        |k| opt_text(r, k),
        |k| r.try_get_unchecked::<i64, _>(k).unwrap_or(0),
        |k| r.try_get_unchecked::<Option<i64>, _>(k).ok().flatten(),
    )
}

impl MysqlStore {
    async fn trigger_of(&self, id: &str, ms: i64) -> Result<Option<TriggerRow>> {
        self.counted(1);
        let r = sqlx::query(&self.bounded(
            &format!("SELECT {TRIGGER_COLS} FROM gnl_triggers WHERE id = ?"),
            ms,
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        Ok(r.as_ref().map(row))
    }
}

#[async_trait]
impl TriggerStore for MysqlStore {
    async fn trigger_register(
        &self,
        def: &TriggerDef,
        initial: &TriggerState,
    ) -> Result<(bool, TriggerRow)> {
        // IGNORE only meets the duplicate key: every value was checked before the call.
        let sql = insert_sql(p, now_ms!()).replacen("INSERT INTO", "INSERT IGNORE INTO", 1);
        self.counted(1);
        let won = bind_state(bind_def(sqlx::query(&sql), def), initial)
            .execute(&self.pool)
            .await?
            .rows_affected();
        Ok((
            won == 1,
            registered(self.trigger_of(&def.id, 0).await?, &def.id)?,
        ))
    }

    async fn triggers_due(
        &self,
        now_ms: Option<i64>,
        after: Option<(i64, String)>,
        limit: i64,
    ) -> Result<DueTriggers> {
        let now = match now_ms {
            Some(t) => t,
            None => self.now_ms().await?,
        };
        let page = if after.is_some() {
            "AND (due_at > ? OR (due_at = ? AND id > ?))"
        } else {
            ""
        };
        // One row past the page: the first trigger not due yet (`DueTriggers::split`).
        let sql = format!(
            "SELECT {TRIGGER_COLS} FROM gnl_triggers \
             WHERE due_at IS NOT NULL {page} ORDER BY due_at, id LIMIT ?"
        );
        let mut q = sqlx::query(&sql);
        if let Some((a_due, a_id)) = &after {
            q = q.bind(*a_due).bind(*a_due).bind(a_id.as_str());
        }
        self.counted(1);
        let rows = q
            .bind(limit.saturating_add(1))
            .fetch_all(&self.pool)
            .await?;
        Ok(DueTriggers::split(
            now,
            rows.iter().map(row).collect(),
            limit,
        ))
    }

    async fn trigger_get(&self, id: &str) -> Result<Option<TriggerRow>> {
        self.trigger_of(id, self.read_timeout.get()).await
    }

    async fn list_triggers(&self, after: Option<&str>, limit: i64) -> Result<Vec<TriggerRow>> {
        self.counted(1);
        let rows = sqlx::query(&self.read(&format!(
            "SELECT {TRIGGER_COLS} FROM gnl_triggers WHERE ? IS NULL OR id > ? ORDER BY id LIMIT ?"
        )))
        .bind(after)
        .bind(after)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.iter().map(row).collect())
    }

    async fn trigger_update(
        &self,
        id: &str,
        version: i64,
        state: &TriggerState,
        fence: Option<(&str, i64)>,
    ) -> Result<bool> {
        let fenced = if fence.is_some() {
            " AND EXISTS (SELECT 1 FROM gnl_locks WHERE lock_key = UNHEX(SHA2(?, 256)) \
             AND lock_name = ? AND token = ?)"
        } else {
            ""
        };
        // `version` is compared before it is assigned (assignments run left to right).
        let sql = format!(
            "UPDATE gnl_triggers SET {}, version = version + 1, updated_at = {} \
             WHERE id = ? AND version = ?{fenced}",
            set_clause(p, 1),
            now_ms!(),
        );
        self.counted(1);
        let mut q = bind_state(sqlx::query(&sql), state).bind(id).bind(version);
        if let Some((key, token)) = fence {
            q = q.bind(key.as_bytes()).bind(key.as_bytes()).bind(token);
        }
        Ok(q.execute(&self.pool).await?.rows_affected() == 1)
    }

    async fn trigger_delete(&self, id: &str) -> Result<bool> {
        self.counted(1);
        Ok(sqlx::query("DELETE FROM gnl_triggers WHERE id = ?")
            .bind(id)
            .execute(&self.pool)
            .await?
            .rows_affected()
            == 1)
    }
}
