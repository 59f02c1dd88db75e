//! The MySQL journal (`JournalStore`): runs (`gnl_runs`), their steps (`gnl_run_steps`, the
//! first writer's kept by `INSERT IGNORE`: one statement, whose affected-row count says who
//! won) and leased locks (`gnl_locks`). Rows are keyed by SHA-256 of their text (run ids and
//! step names may be longer than an InnoDB key); every lookup compares the text too. MySQL has
//! no `RETURNING`: a write that must report a row reads it after (READ COMMITTED: the read sees
//! it), and the waker's claim locks due runs with `FOR UPDATE SKIP LOCKED` in a transaction.

use async_trait::async_trait;
use sqlx::mysql::MySqlRow;
use sqlx::Row;

use super::{opt_text, text, MysqlStore};
use crate::error::Result;
use crate::store::held::on_held;
use crate::store::journal::*;

/// The key of a run id (binds it).
const KEY: &str = "UNHEX(SHA2(?, 256))";

/// A step's row: binds run_id, run_id, name, name, n.
const STEP_WHERE: &str = "run_key = UNHEX(SHA2(?, 256)) AND run_id = ? \
     AND name_key = UNHEX(SHA2(?, 256)) AND name = ? AND n = ?";

/// A run's row: binds run_id, run_id.
const RUN_WHERE: &str = "run_key = UNHEX(SHA2(?, 256)) AND run_id = ?";

fn opt_i64(r: &MySqlRow, i: usize) -> Option<i64> {
    r.try_get_unchecked::<Option<i64>, _>(i).ok().flatten()
}

fn run_row(r: &MySqlRow) -> RunRow {
    RunRow {
        run_id: text(r, 0),
        workflow: text(r, 1),
        preset: opt_text(r, 2),
        state: text(r, 3),
        input: opt_text(r, 4),
        result: opt_text(r, 5),
        error: opt_text(r, 6),
        scheduled_for: opt_i64(r, 7),
        wake_at: opt_i64(r, 8),
        lease_owner: opt_text(r, 9),
        lease_expires_at: opt_i64(r, 10),
        token: r.try_get_unchecked(11).unwrap_or(0),
        created_at: r.try_get_unchecked(12).unwrap_or(0),
        updated_at: r.try_get_unchecked(13).unwrap_or(0),
    }
}

fn step_row(r: &MySqlRow) -> StepRow {
    StepRow {
        name: text(r, 0),
        n: r.try_get_unchecked::<i32, _>(1).map(i64::from).unwrap_or(0),
        position: r.try_get_unchecked::<i32, _>(2).map(i64::from).unwrap_or(0),
        state: text(r, 3),
        result: opt_text(r, 4),
        started_at: r.try_get_unchecked(5).unwrap_or(0),
        finished_at: opt_i64(r, 6),
    }
}

type MyQuery<'q> = sqlx::query::Query<'q, sqlx::MySql, sqlx::mysql::MySqlArguments>;

impl MysqlStore {
    async fn affected<'q>(
        &self,
        sql: &'q str,
        f: impl FnOnce(MyQuery<'q>) -> MyQuery<'q>,
    ) -> Result<u64> {
        self.counted(1);
        Ok(f(sqlx::query(sql))
            .execute(&self.pool)
            .await?
            .rows_affected())
    }

    async fn steps_of(&self, run_id: &str, ms: i64) -> Result<Vec<StepRow>> {
        self.counted(1);
        let rows = sqlx::query(&self.bounded(
            &format!(
            "SELECT {STEP_COLS} FROM gnl_run_steps WHERE {RUN_WHERE} ORDER BY position, name, n"
            ),
            ms,
        ))
        .bind(run_id.as_bytes())
        .bind(run_id.as_bytes())
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.iter().map(step_row).collect())
    }

    async fn run_of(&self, run_id: &str, ms: i64) -> Result<Option<(RunRow, i64)>> {
        self.counted(1);
        let row = sqlx::query(&self.bounded(
            &format!(
                "SELECT {RUN_COLS}, {} FROM gnl_runs WHERE {RUN_WHERE}",
                now_ms!()
            ),
            ms,
        ))
        .bind(run_id.as_bytes())
        .bind(run_id.as_bytes())
        .fetch_optional(&self.pool)
        .await?;
        Ok(row
            .as_ref()
            .map(|r| (run_row(r), r.try_get_unchecked(14).unwrap_or(0))))
    }

    async fn insert_step(
        &self,
        run_id: &str,
        name: &str,
        n: i64,
        position: i64,
        result: Option<&str>,
        token: i64,
    ) -> Result<Option<StepRow>> {
        self.check_size(
            "the step's result",
            result.map_or(0, str::len) + 2 * (run_id.len() + name.len()),
        )?;
        let state = if result.is_some() { "done" } else { "intent" };
        let sql = format!(
            "INSERT IGNORE INTO gnl_run_steps (run_key, name_key, n, run_id, name, position, \
             state, result, token, started_at, finished_at) \
             VALUES ({KEY}, {KEY}, ?, ?, ?, ?, ?, ?, ?, {now}, IF(? = 'done', {now}, NULL))",
            now = now_ms!()
        );
        self.counted(1);
        let q = sqlx::query(&sql)
            .bind(run_id.as_bytes())
            .bind(name.as_bytes())
            .bind(n)
            .bind(run_id.as_bytes())
            .bind(name.as_bytes())
            .bind(position)
            .bind(state)
            .bind(result)
            .bind(token)
            .bind(state);
        if on_held!(self, ex => q.execute(ex)).rows_affected() == 1 {
            return Ok(None);
        }
        kept(self.step_get(run_id, name, n).await?, run_id, name)
    }
}

#[async_trait]
impl JournalStore for MysqlStore {
    async fn step_get(&self, run_id: &str, name: &str, n: i64) -> Result<Option<StepRow>> {
        self.counted(1);
        let row = sqlx::query(&format!(
            "SELECT {STEP_COLS} FROM gnl_run_steps WHERE {STEP_WHERE}"
        ))
        .bind(run_id.as_bytes())
        .bind(run_id.as_bytes())
        .bind(name.as_bytes())
        .bind(name.as_bytes())
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
        self.insert_step(run_id, name, n, position, Some(result), 0)
            .await
    }

    async fn step_intent(
        &self,
        run_id: &str,
        name: &str,
        n: i64,
        position: i64,
        token: i64,
    ) -> Result<Option<StepRow>> {
        self.insert_step(run_id, name, n, position, None, token)
            .await
    }

    async fn step_finish(
        &self,
        run_id: &str,
        name: &str,
        n: i64,
        token: i64,
        result: &str,
    ) -> Result<bool> {
        self.check_size("the step's result", result.len())?;
        let sql = format!(
            "UPDATE gnl_run_steps SET state = 'done', result = ?, finished_at = {} \
             WHERE {STEP_WHERE} AND state = 'intent' AND token = ?",
            now_ms!()
        );
        self.counted(1);
        let q = sqlx::query(&sql)
            .bind(result)
            .bind(run_id.as_bytes())
            .bind(run_id.as_bytes())
            .bind(name.as_bytes())
            .bind(name.as_bytes())
            .bind(n)
            .bind(token);
        Ok(on_held!(self, ex => q.execute(ex)).rows_affected() == 1)
    }

    async fn step_resolve(
        &self,
        run_id: &str,
        name: &str,
        n: i64,
        result: Option<&str>,
    ) -> Result<bool> {
        let (sql, value) = match result {
            Some(r) => {
                self.check_size("the step's result", r.len())?;
                (
                    format!(
                        "UPDATE gnl_run_steps SET result = ?, finished_at = {}, state = 'done' \
                         WHERE {STEP_WHERE} AND state = 'intent'",
                        now_ms!()
                    ),
                    Some(r),
                )
            }
            None => (
                format!("DELETE FROM gnl_run_steps WHERE ? IS NULL AND {STEP_WHERE} AND state = 'intent'"),
                None,
            ),
        };
        let rows = self
            .affected(&sql, |q| {
                q.bind(value)
                    .bind(run_id.as_bytes())
                    .bind(run_id.as_bytes())
                    .bind(name.as_bytes())
                    .bind(name.as_bytes())
                    .bind(n)
            })
            .await?;
        Ok(rows == 1)
    }

    async fn run_start(&self, s: &RunStart) -> Result<RunStarted> {
        self.check_size(
            "the run's input",
            s.input.as_deref().map_or(0, str::len) + 2 * s.run_id.len(),
        )?;
        // Taken unless done, another workflow's, or executed by another owner under a live
        // lease. MySQL assigns left to right, and later assignments read the new values (of
        // `VALUES(col)` too, in MariaDB, once `col` is assigned): the condition reads no
        // `VALUES()` of an assigned column (the owner is bound again, the clock is `NOW(3)`,
        // constant in a statement); the columns no condition reads go first; then
        // `lease_owner` (once it is ours the live-lease clause is false, so the condition
        // keeps its value), `lease_expires_at`, and `state` last.
        let cond = format!(
            "(state <> 'done' AND workflow = VALUES(workflow) AND NOT (state = 'running' \
             AND COALESCE(lease_expires_at, 0) > {now} AND NOT (lease_owner <=> ?)))",
            now = now_ms!()
        );
        let sql = format!(
            "INSERT INTO gnl_runs (run_key, run_id, workflow, preset, state, input, \
             scheduled_for, lease_owner, lease_expires_at, due_at, token, created_at, updated_at) \
             VALUES ({KEY}, ?, ?, ?, 'running', ?, ?, ?, {now} + ?, {now} + ?, 1, {now}, {now}) \
             ON DUPLICATE KEY UPDATE \
             due_at = IF({cond}, VALUES(due_at), due_at), \
             error = IF({cond}, NULL, error), \
             token = IF({cond}, token + 1, token), \
             updated_at = IF({cond}, VALUES(updated_at), updated_at), \
             lease_owner = IF({cond}, VALUES(lease_owner), lease_owner), \
             lease_expires_at = IF({cond}, VALUES(lease_expires_at), lease_expires_at), \
             state = IF({cond}, 'running', state)",
            now = now_ms!()
        );
        self.affected(&sql, |q| {
            let mut q = q
                .bind(s.run_id.as_bytes())
                .bind(s.run_id.as_bytes())
                .bind(s.workflow.as_bytes())
                .bind(s.preset.as_deref())
                .bind(s.input.as_deref())
                .bind(s.scheduled_for)
                .bind(s.owner.as_bytes())
                .bind(s.lease_ms)
                .bind(s.lease_ms);
            for _ in 0..7 {
                q = q.bind(s.owner.as_bytes()); // each `{cond}`'s owner
            }
            q
        })
        .await?;
        let (run, now) = match self.run_of(&s.run_id, 0).await? {
            Some((run, now)) => (Some(run), now),
            None => (None, 0),
        };
        started(run, s, now, || self.steps_of(&s.run_id, 0)).await
    }

    async fn run_renew(&self, run_id: &str, owner: &str, lease_ms: i64) -> Result<bool> {
        let sql = format!(
            "UPDATE gnl_runs SET lease_expires_at = {n} + ?, due_at = {n} + ? \
             WHERE {RUN_WHERE} AND state = 'running' AND lease_expires_at IS NOT NULL \
             AND lease_owner = ?",
            n = now_ms!()
        );
        Ok(self
            .affected(&sql, |q| {
                q.bind(lease_ms)
                    .bind(lease_ms)
                    .bind(run_id.as_bytes())
                    .bind(run_id.as_bytes())
                    .bind(owner.as_bytes())
            })
            .await?
            == 1)
    }

    async fn run_suspend(&self, run_id: &str, wake_at: i64) -> Result<bool> {
        let sql = format!(
            "UPDATE gnl_runs SET wake_at = ?, due_at = ?, lease_owner = NULL, \
             lease_expires_at = NULL, updated_at = {}, state = 'suspended' \
             WHERE {RUN_WHERE} AND state = 'running'",
            now_ms!()
        );
        Ok(self
            .affected(&sql, |q| {
                q.bind(wake_at)
                    .bind(wake_at)
                    .bind(run_id.as_bytes())
                    .bind(run_id.as_bytes())
            })
            .await?
            == 1)
    }

    async fn run_finish(&self, run_id: &str, result: &str) -> Result<Option<String>> {
        self.check_size("the run's result", result.len())?;
        let sql = format!(
            "UPDATE gnl_runs SET result = ?, error = NULL, wake_at = NULL, due_at = NULL, \
             lease_owner = NULL, lease_expires_at = NULL, updated_at = {}, state = 'done' \
             WHERE {RUN_WHERE} AND state <> 'done'",
            now_ms!()
        );
        if self
            .affected(&sql, |q| {
                q.bind(result)
                    .bind(run_id.as_bytes())
                    .bind(run_id.as_bytes())
            })
            .await?
            == 1
        {
            return Ok(None);
        }
        Ok(self.run_of(run_id, 0).await?.and_then(|(r, _)| r.result))
    }

    async fn run_fail(&self, run_id: &str, error: &str) -> Result<bool> {
        let error: String = error.chars().take(100_000).collect();
        let sql = format!(
            "UPDATE gnl_runs SET error = ?, due_at = NULL, lease_owner = NULL, \
             lease_expires_at = NULL, updated_at = {}, state = 'failed' \
             WHERE {RUN_WHERE} AND state <> 'done'",
            now_ms!()
        );
        Ok(self
            .affected(&sql, |q| {
                q.bind(error)
                    .bind(run_id.as_bytes())
                    .bind(run_id.as_bytes())
            })
            .await?
            == 1)
    }

    async fn run_wake(&self, run_id: &str) -> Result<bool> {
        // `state` last: the condition reads it.
        let sql = format!(
            "UPDATE gnl_runs SET wake_at = {n}, due_at = {n}, error = NULL, updated_at = {n}, \
             state = 'suspended' WHERE {RUN_WHERE} AND state = 'failed'",
            n = now_ms!()
        );
        Ok(self
            .affected(&sql, |q| q.bind(run_id.as_bytes()).bind(run_id.as_bytes()))
            .await?
            == 1)
    }

    async fn run_get(&self, run_id: &str) -> Result<Option<(RunRow, Vec<StepRow>)>> {
        let ms = self.read_timeout.get();
        match self.run_of(run_id, ms).await? {
            None => Ok(None),
            Some((r, _)) => Ok(Some((r, self.steps_of(run_id, ms).await?))),
        }
    }

    async fn list_runs(&self, q: &RunQuery) -> Result<Vec<RunRow>> {
        self.counted(1);
        // `created_at <= ?` first: a range on the listing index (an OR alone is not one).
        const AFTER: &str = "(? IS NULL OR (created_at <= ? AND (created_at < ? OR \
             run_key < UNHEX(SHA2(?, 256)))))";
        const ORDER: &str = "ORDER BY created_at DESC, run_key DESC";
        let from = match q.scan {
            None => "gnl_runs".to_string(),
            // A derived table with a LIMIT is materialized: only with a scan bound, and only
            // the keys (read from the listing index alone), joined back to their rows.
            Some(_) => format!(
                "gnl_runs NATURAL JOIN \
                 (SELECT run_key FROM gnl_runs WHERE {AFTER} {ORDER} LIMIT ?) w"
            ),
        };
        let sql = format!(
            "SELECT {RUN_COLS} FROM {from} WHERE (? IS NULL OR state = ?) \
             AND (? IS NULL OR workflow = ?) AND {AFTER} {ORDER} LIMIT ?"
        );
        let at = q.before.as_ref().map(|b| b.0);
        let id = q.before.as_ref().map(|b| b.1.as_str());
        let sql = self.read(&sql);
        let mut query = sqlx::query(&sql);
        if let Some(scan) = q.scan {
            query = query.bind(at).bind(at).bind(at).bind(id).bind(scan);
        }
        let rows = query
            .bind(q.state.as_deref())
            .bind(q.state.as_deref())
            .bind(q.workflow.as_deref().map(str::as_bytes))
            .bind(q.workflow.as_deref().map(str::as_bytes))
            .bind(at)
            .bind(at)
            .bind(at)
            .bind(id)
            .bind(q.limit)
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.iter().map(run_row).collect())
    }

    async fn runs_edge(
        &self,
        before: Option<(i64, &str)>,
        scan: i64,
    ) -> Result<Option<(i64, String)>> {
        self.counted(1);
        let at = before.map(|b| b.0);
        let row = sqlx::query(&self.read(
            "SELECT created_at, run_id FROM gnl_runs WHERE (? IS NULL OR (created_at <= ? AND \
             (created_at < ? OR run_key < UNHEX(SHA2(?, 256))))) \
             ORDER BY created_at DESC, run_key DESC LIMIT 1 OFFSET ?",
        ))
        .bind(at)
        .bind(at)
        .bind(at)
        .bind(before.map(|b| b.1))
        .bind(scan - 1)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|r| (r.get(0), text(&r, 1))))
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
        let marks = vec!["?"; workflows.len()].join(", ");
        let mut tx = self.begin().await?;
        self.counted(1);
        let pick = format!(
            "SELECT run_key FROM gnl_runs WHERE due_at <= {} AND workflow IN ({marks}) \
             ORDER BY due_at LIMIT ? FOR UPDATE SKIP LOCKED",
            now_ms!()
        );
        let mut q = sqlx::query_scalar::<_, Vec<u8>>(&pick);
        for w in workflows {
            q = q.bind(w.as_bytes());
        }
        let keys: Vec<Vec<u8>> = q.bind(limit).fetch_all(&mut *tx).await?;
        if keys.is_empty() {
            self.commit(tx).await?;
            return Ok(vec![]);
        }
        let kmarks = vec!["?"; keys.len()].join(", ");
        self.counted(1);
        let claim = format!(
            "UPDATE gnl_runs SET wake_at = IF(state = 'suspended', wake_at, NULL), \
             lease_owner = ?, lease_expires_at = {n} + ?, due_at = {n} + ?, \
             token = token + 1, updated_at = {n}, state = 'running' WHERE run_key IN ({kmarks})",
            n = now_ms!()
        );
        let mut u = sqlx::query(&claim)
            .bind(owner.as_bytes())
            .bind(lease_ms)
            .bind(lease_ms);
        for k in &keys {
            u = u.bind(k.as_slice());
        }
        u.execute(&mut *tx).await?;
        self.counted(1);
        let read =
            format!("SELECT {RUN_COLS} FROM gnl_runs WHERE run_key IN ({kmarks}) ORDER BY due_at");
        let mut sel = sqlx::query(&read);
        for k in &keys {
            sel = sel.bind(k.as_slice());
        }
        let rows = sel.fetch_all(&mut *tx).await?;
        self.commit(tx).await?;
        Ok(rows.iter().map(run_row).collect())
    }

    async fn lock_acquire(&self, key: &str, owner: &str, ttl_ms: i64) -> Result<Option<i64>> {
        let free = format!("(expires_at <= {})", now_ms!());
        // `expires_at` is read by every assignment before its own, which comes last.
        let sql = format!(
            "INSERT INTO gnl_locks (lock_key, lock_name, owner, token, expires_at) \
             VALUES ({KEY}, ?, ?, 1, {n} + ?) ON DUPLICATE KEY UPDATE \
             owner = IF({free}, VALUES(owner), owner), \
             token = IF({free}, token + 1, token), \
             expires_at = IF({free}, VALUES(expires_at), expires_at)",
            n = now_ms!()
        );
        self.affected(&sql, |q| {
            q.bind(key.as_bytes())
                .bind(key.as_bytes())
                .bind(owner.as_bytes())
                .bind(ttl_ms)
        })
        .await?;
        // The owner is unique per acquisition: the lock is ours when it names us.
        self.counted(1);
        let row = sqlx::query(
            "SELECT token, owner FROM gnl_locks WHERE lock_key = UNHEX(SHA2(?, 256)) \
             AND lock_name = ?",
        )
        .bind(key.as_bytes())
        .bind(key.as_bytes())
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.and_then(|r| {
            let token: i64 = r.try_get_unchecked(0).unwrap_or(0);
            (text(&r, 1) == owner).then_some(token)
        }))
    }

    async fn lock_renew(&self, key: &str, token: i64, ttl_ms: i64) -> Result<bool> {
        let sql = format!(
            "UPDATE gnl_locks SET expires_at = {} + ? WHERE lock_key = UNHEX(SHA2(?, 256)) \
             AND lock_name = ? AND token = ?",
            now_ms!()
        );
        Ok(self
            .affected(&sql, |q| {
                q.bind(ttl_ms)
                    .bind(key.as_bytes())
                    .bind(key.as_bytes())
                    .bind(token)
            })
            .await?
            == 1)
    }

    async fn lock_release(&self, key: &str, token: i64) -> Result<bool> {
        Ok(self
            .affected(
                "UPDATE gnl_locks SET expires_at = 0 WHERE lock_key = UNHEX(SHA2(?, 256)) AND lock_name = ? \
                 AND token = ?",
                |q| q.bind(key.as_bytes()).bind(key.as_bytes()).bind(token),
            )
            .await?
            == 1)
    }
}
