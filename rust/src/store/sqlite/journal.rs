//! The SQLite journal (`JournalStore`): runs (`gnl_runs`), their steps (`gnl_run_steps`, the
//! first writer's kept by `ON CONFLICT DO NOTHING`) and leased locks (`gnl_locks`). Every write
//! is one autocommit statement behind the process's write lock (SQLite takes its own write lock
//! for it at once, so no transaction upgrades a read lock); runs the waker claims are taken in
//! one `UPDATE … RETURNING`.

use std::sync::LazyLock;

use async_trait::async_trait;
use sqlx::sqlite::SqliteArguments;
use sqlx::{Arguments, Row};

use super::SqliteStore;
use crate::error::{Error, Result};
use crate::store::journal::*;

/// A run's record.
pub(super) static RUN_READ: LazyLock<String> =
    LazyLock::new(|| format!("SELECT {RUN_COLS} FROM gnl_runs WHERE run_id = ?1"));

/// `run_start`'s write: create the run, or make it running again unless it is done or
/// another workflow's (then no row).
pub(super) static RUN_UPSERT: LazyLock<String> = LazyLock::new(|| {
    format!(
        "INSERT INTO gnl_runs (run_id, workflow, preset, state, input, scheduled_for, \
         lease_owner, lease_expires_at, due_at, token, created_at, updated_at) \
         VALUES (?1, ?2, ?3, 'running', ?4, ?5, ?6, ?7, ?7, 1, ?8, ?8) \
         ON CONFLICT (run_id) DO UPDATE SET state = 'running', \
         lease_owner = excluded.lease_owner, lease_expires_at = excluded.lease_expires_at, \
         due_at = excluded.due_at, error = NULL, token = gnl_runs.token + 1, \
         updated_at = excluded.updated_at \
         WHERE gnl_runs.state <> 'done' AND gnl_runs.workflow = excluded.workflow \
         AND NOT (gnl_runs.state = 'running' AND coalesce(gnl_runs.lease_expires_at, 0) > ?8 \
         AND gnl_runs.lease_owner IS NOT excluded.lease_owner) \
         RETURNING {RUN_COLS}"
    )
});

/// `run_finish`'s write (`?1` run id, `?2` result, `?3` now): one row when it recorded it.
pub(super) const RUN_FINISH: &str = "UPDATE gnl_runs SET state = 'done', result = ?2, \
     error = NULL, wake_at = NULL, due_at = NULL, lease_owner = NULL, lease_expires_at = NULL, \
     updated_at = ?3 WHERE run_id = ?1 AND state <> 'done'";

/// `lock_acquire`'s write (`?1` key, `?2` owner, `?3` expiry, `?4` now): the token when taken.
pub(super) const LOCK_ACQUIRE: &str = "INSERT INTO gnl_locks (lock_key, owner, token, \
     expires_at) VALUES (?1, ?2, 1, ?3) ON CONFLICT (lock_key) DO UPDATE SET \
     owner = excluded.owner, token = gnl_locks.token + 1, expires_at = excluded.expires_at \
     WHERE gnl_locks.expires_at <= ?4 RETURNING token";

/// `lock_release`'s write (`?1` key, `?2` token): one row when released.
pub(super) const LOCK_RELEASE: &str =
    "UPDATE gnl_locks SET expires_at = 0 WHERE lock_key = ?1 AND token = ?2";

/// The kept row of a step that this call did not record.
const STEP_GET: &str = "SELECT name, n, position, state, result, started_at, finished_at \
     FROM gnl_run_steps WHERE run_id = ?1 AND name = ?2 AND n = ?3";

impl SqliteStore {
    async fn write_one(&self, sql: &str, args: SqliteArguments<'_>) -> Result<u64> {
        let _w = self.write.lock().await;
        self.counted(1);
        Ok(sqlx::query_with(sql, args)
            .execute(&self.pool)
            .await?
            .rows_affected())
    }

    async fn steps_of(&self, run_id: &str) -> Result<Vec<StepRow>> {
        if let Some(steps) = self.read_steps_now(run_id) {
            return Ok(steps);
        }
        self.steps_on(&self.pool, run_id).await
    }

    async fn steps_on<'e>(
        &self,
        ex: impl sqlx::SqliteExecutor<'e>,
        run_id: &str,
    ) -> Result<Vec<StepRow>> {
        self.counted(1);
        let rows = sqlx::query(&format!(
            "SELECT {STEP_COLS} FROM gnl_run_steps WHERE run_id = ?1 ORDER BY position, name, n"
        ))
        .bind(run_id)
        .fetch_all(ex)
        .await?;
        Ok(rows.iter().map(step_row).collect())
    }

    async fn run_of(&self, run_id: &str) -> Result<Option<RunRow>> {
        self.run_on(&self.pool, run_id).await
    }

    async fn run_on<'e>(
        &self,
        ex: impl sqlx::SqliteExecutor<'e>,
        run_id: &str,
    ) -> Result<Option<RunRow>> {
        self.counted(1);
        let row = sqlx::query(&RUN_READ)
            .bind(run_id)
            .fetch_optional(ex)
            .await?;
        Ok(row.as_ref().map(run_row))
    }
}

fn args() -> SqliteArguments<'static> {
    SqliteArguments::default()
}

fn add<'q, T: 'q + sqlx::Encode<'q, sqlx::Sqlite> + sqlx::Type<sqlx::Sqlite>>(
    a: &mut SqliteArguments<'q>,
    v: T,
) -> Result<()> {
    a.add(v).map_err(|e| Error::invalid(e.to_string()))
}

#[async_trait]
impl JournalStore for SqliteStore {
    async fn step_get(&self, run_id: &str, name: &str, n: i64) -> Result<Option<StepRow>> {
        self.counted(1);
        let row = sqlx::query(STEP_GET)
            .bind(run_id)
            .bind(name)
            .bind(n)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.as_ref().map(step_row))
    }

    async fn step_put(
        &self,
        run_id: &str,
        name: &str,
        n: i64,
        position: i64,
        result: &str,
    ) -> Result<Option<StepRow>> {
        let mut a = args();
        add(&mut a, run_id)?;
        add(&mut a, name)?;
        add(&mut a, n)?;
        add(&mut a, position)?;
        add(&mut a, result)?;
        add(&mut a, self.clock_ms())?;
        let won = self
            .write_one(
                "INSERT INTO gnl_run_steps (run_id, name, n, position, state, result, \
                 started_at, finished_at) VALUES (?1, ?2, ?3, ?4, 'done', ?5, ?6, ?6) \
                 ON CONFLICT DO NOTHING",
                a,
            )
            .await?;
        if won == 1 {
            return Ok(None);
        }
        kept(self.step_get(run_id, name, n).await?, run_id, name)
    }

    fn step_put_now(
        &self,
        run_id: &str,
        name: &str,
        n: i64,
        position: i64,
        result: &str,
    ) -> Option<()> {
        self.put_step_now(run_id, name, n, position, result)
    }

    async fn step_intent(
        &self,
        run_id: &str,
        name: &str,
        n: i64,
        position: i64,
        token: i64,
    ) -> Result<Option<StepRow>> {
        let mut a = args();
        add(&mut a, run_id)?;
        add(&mut a, name)?;
        add(&mut a, n)?;
        add(&mut a, position)?;
        add(&mut a, token)?;
        add(&mut a, self.clock_ms())?;
        let won = self
            .write_one(
                "INSERT INTO gnl_run_steps (run_id, name, n, position, state, token, started_at) \
                 VALUES (?1, ?2, ?3, ?4, 'intent', ?5, ?6) ON CONFLICT DO NOTHING",
                a,
            )
            .await?;
        if won == 1 {
            return Ok(None);
        }
        kept(self.step_get(run_id, name, n).await?, run_id, name)
    }

    async fn step_finish(
        &self,
        run_id: &str,
        name: &str,
        n: i64,
        token: i64,
        result: &str,
    ) -> Result<bool> {
        let mut a = args();
        add(&mut a, run_id)?;
        add(&mut a, name)?;
        add(&mut a, n)?;
        add(&mut a, token)?;
        add(&mut a, result)?;
        add(&mut a, self.clock_ms())?;
        Ok(self
            .write_one(
                "UPDATE gnl_run_steps SET state = 'done', result = ?5, finished_at = ?6 \
                 WHERE run_id = ?1 AND name = ?2 AND n = ?3 AND state = 'intent' AND token = ?4",
                a,
            )
            .await?
            == 1)
    }

    async fn step_resolve(
        &self,
        run_id: &str,
        name: &str,
        n: i64,
        result: Option<&str>,
    ) -> Result<bool> {
        let mut a = args();
        add(&mut a, run_id)?;
        add(&mut a, name)?;
        add(&mut a, n)?;
        let sql = match result {
            Some(r) => {
                add(&mut a, r)?;
                add(&mut a, self.clock_ms())?;
                "UPDATE gnl_run_steps SET state = 'done', result = ?4, finished_at = ?5 \
                 WHERE run_id = ?1 AND name = ?2 AND n = ?3 AND state = 'intent'"
            }
            None => {
                "DELETE FROM gnl_run_steps \
                 WHERE run_id = ?1 AND name = ?2 AND n = ?3 AND state = 'intent'"
            }
        };
        Ok(self.write_one(sql, a).await? == 1)
    }

    async fn run_start(&self, s: &RunStart) -> Result<RunStarted> {
        let now = self.clock_ms();
        let lease_until = s.lease_ms.map(|l| now + l);
        let row = {
            let _w = self.write.lock().await;
            self.counted(1);
            sqlx::query(&RUN_UPSERT)
                .bind(&s.run_id)
                .bind(&s.workflow)
                .bind(&s.preset)
                .bind(&s.input)
                .bind(s.scheduled_for)
                .bind(&s.owner)
                .bind(lease_until)
                .bind(now)
                .fetch_optional(&self.pool)
                .await?
        };
        let run = match row.as_ref().map(run_row) {
            Some(run) => Some(run),
            None => self.run_of(&s.run_id).await?, // done, or another workflow's run
        };
        started(run, s, now, || self.steps_of(&s.run_id)).await
    }

    fn run_start_now(&self, s: &RunStart) -> Option<RunStarted> {
        self.start_run_now(s)
    }

    async fn run_renew(&self, run_id: &str, owner: &str, lease_ms: i64) -> Result<bool> {
        let mut a = args();
        add(&mut a, run_id)?;
        add(&mut a, self.clock_ms() + lease_ms)?;
        add(&mut a, owner)?;
        Ok(self
            .write_one(
                "UPDATE gnl_runs SET lease_expires_at = ?2, due_at = ?2 \
                 WHERE run_id = ?1 AND state = 'running' AND lease_expires_at IS NOT NULL \
                 AND lease_owner = ?3",
                a,
            )
            .await?
            == 1)
    }

    async fn run_suspend(&self, run_id: &str, wake_at: i64) -> Result<bool> {
        let mut a = args();
        add(&mut a, run_id)?;
        add(&mut a, wake_at)?;
        add(&mut a, self.clock_ms())?;
        Ok(self
            .write_one(
                "UPDATE gnl_runs SET state = 'suspended', wake_at = ?2, due_at = ?2, \
                 lease_owner = NULL, lease_expires_at = NULL, updated_at = ?3 \
                 WHERE run_id = ?1 AND state = 'running'",
                a,
            )
            .await?
            == 1)
    }

    async fn run_finish(&self, run_id: &str, result: &str) -> Result<Option<String>> {
        let mut a = args();
        add(&mut a, run_id)?;
        add(&mut a, result)?;
        add(&mut a, self.clock_ms())?;
        let won = self.write_one(RUN_FINISH, a).await?;
        if won == 1 {
            return Ok(None);
        }
        Ok(self.run_of(run_id).await?.and_then(|r| r.result))
    }

    fn run_finish_now(&self, run_id: &str, result: &str) -> Option<()> {
        self.finish_run_now(run_id, result)
    }

    async fn run_fail(&self, run_id: &str, error: &str) -> Result<bool> {
        let mut a = args();
        add(&mut a, run_id)?;
        add(&mut a, error)?;
        add(&mut a, self.clock_ms())?;
        Ok(self
            .write_one(
                "UPDATE gnl_runs SET state = 'failed', error = ?2, due_at = NULL, \
                 lease_owner = NULL, lease_expires_at = NULL, updated_at = ?3 \
                 WHERE run_id = ?1 AND state <> 'done'",
                a,
            )
            .await?
            == 1)
    }

    async fn run_wake(&self, run_id: &str) -> Result<bool> {
        let mut a = args();
        add(&mut a, run_id)?;
        add(&mut a, self.clock_ms())?;
        Ok(self
            .write_one(
                "UPDATE gnl_runs SET state = 'suspended', wake_at = ?2, due_at = ?2, \
                 error = NULL, updated_at = ?2 WHERE run_id = ?1 AND state = 'failed'",
                a,
            )
            .await?
            == 1)
    }

    async fn run_get(&self, run_id: &str) -> Result<Option<(RunRow, Vec<StepRow>)>> {
        let mut c = self.read().await?;
        let got = match self.run_on(&mut *c, run_id).await? {
            None => None,
            Some(r) => Some((r, self.steps_on(&mut *c, run_id).await?)),
        };
        self.done(c).await?;
        Ok(got)
    }

    async fn list_runs(&self, q: &RunQuery) -> Result<Vec<RunRow>> {
        self.counted(1);
        let mut r = self.read().await?;
        const AFTER: &str = "(?4 IS NULL OR created_at < ?4 OR (created_at = ?4 AND run_id < ?5))";
        const ORDER: &str = "ORDER BY created_at DESC, run_id DESC";
        let from = match q.scan {
            None => "gnl_runs".to_string(),
            Some(_) => format!("(SELECT * FROM gnl_runs WHERE {AFTER} {ORDER} LIMIT ?6)"),
        };
        let rows = sqlx::query(&format!(
            "SELECT {RUN_COLS} FROM {from} WHERE (?1 IS NULL OR state = ?1) \
             AND (?2 IS NULL OR workflow = ?2) AND {AFTER} AND ?6 >= 0 {ORDER} LIMIT ?3"
        ))
        .bind(&q.state)
        .bind(&q.workflow)
        .bind(q.limit)
        .bind(q.before.as_ref().map(|b| b.0))
        .bind(q.before.as_ref().map(|b| b.1.as_str()))
        .bind(q.scan.unwrap_or(0))
        .fetch_all(&mut *r)
        .await?;
        self.done(r).await?;
        Ok(rows.iter().map(run_row).collect())
    }

    async fn runs_edge(
        &self,
        before: Option<(i64, &str)>,
        scan: i64,
    ) -> Result<Option<(i64, String)>> {
        self.counted(1);
        let mut r = self.read().await?;
        let row = sqlx::query(
            "SELECT created_at, run_id FROM gnl_runs \
             WHERE (?1 IS NULL OR created_at < ?1 OR (created_at = ?1 AND run_id < ?2)) \
             ORDER BY created_at DESC, run_id DESC LIMIT 1 OFFSET ?3",
        )
        .bind(before.map(|b| b.0))
        .bind(before.map(|b| b.1))
        .bind(scan - 1)
        .fetch_optional(&mut *r)
        .await?;
        self.done(r).await?;
        Ok(row.map(|r| (r.get(0), r.get(1))))
    }

    async fn runs_due(
        &self,
        workflows: &[String],
        owner: &str,
        lease_ms: i64,
        limit: i64,
    ) -> Result<Vec<RunRow>> {
        if workflows.is_empty() || limit < 1 {
            return Ok(vec![]);
        }
        let now = self.clock_ms();
        let mut a = args();
        add(&mut a, owner)?;
        add(&mut a, now + lease_ms)?;
        add(&mut a, now)?;
        add(&mut a, limit)?;
        let mut marks = String::new();
        for (i, w) in workflows.iter().enumerate() {
            if i > 0 {
                marks.push_str(", ");
            }
            marks.push_str(&format!("?{}", i + 5));
            add(&mut a, w.as_str())?;
        }
        let _w = self.write.lock().await;
        self.counted(1);
        let rows = sqlx::query_with(
            &format!(
                "UPDATE gnl_runs SET wake_at = CASE WHEN state = 'suspended' THEN wake_at END, \
                 state = 'running', lease_owner = ?1, lease_expires_at = ?2, \
                 due_at = ?2, token = token + 1, updated_at = ?3 \
                 WHERE run_id IN (SELECT run_id FROM gnl_runs WHERE due_at <= ?3 \
                 AND workflow IN ({marks}) ORDER BY due_at LIMIT ?4) RETURNING {RUN_COLS}"
            ),
            a,
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.iter().map(run_row).collect())
    }

    async fn lock_acquire(&self, key: &str, owner: &str, ttl_ms: i64) -> Result<Option<i64>> {
        let now = self.clock_ms();
        let _w = self.write.lock().await;
        self.counted(1);
        Ok(sqlx::query_scalar(LOCK_ACQUIRE)
            .bind(key)
            .bind(owner)
            .bind(now + ttl_ms)
            .bind(now)
            .fetch_optional(&self.pool)
            .await?)
    }

    fn lock_acquire_now(&self, key: &str, owner: &str, ttl_ms: i64) -> Option<i64> {
        self.acquire_lock_now(key, owner, ttl_ms)
    }

    async fn lock_renew(&self, key: &str, token: i64, ttl_ms: i64) -> Result<bool> {
        let mut a = args();
        add(&mut a, key)?;
        add(&mut a, token)?;
        add(&mut a, self.clock_ms() + ttl_ms)?;
        Ok(self
            .write_one(
                "UPDATE gnl_locks SET expires_at = ?3 WHERE lock_key = ?1 AND token = ?2",
                a,
            )
            .await?
            == 1)
    }

    async fn lock_release(&self, key: &str, token: i64) -> Result<bool> {
        let mut a = args();
        add(&mut a, key)?;
        add(&mut a, token)?;
        Ok(self.write_one(LOCK_RELEASE, a).await? == 1)
    }

    fn lock_release_now(&self, key: &str, token: i64) -> Option<()> {
        self.release_lock_now(key, token)
    }
}
