//! The Postgres journal (`JournalStore`): runs (`gnl_runs`), their steps (`gnl_run_steps`, the
//! first writer's kept: one statement inserts unless present and reads what is kept) and leased
//! locks (`gnl_locks`). A run starts with one upsert that returns its record (and, resumed, one
//! read of its steps); the waker claims due runs with `FOR UPDATE SKIP LOCKED`.

use async_trait::async_trait;
use sqlx::Row;

use super::{pg_text, PostgresStore};
use crate::error::Result;
use crate::store::held::on_held;
use crate::store::journal::*;

/// Insert a step row unless one exists; returns `(won, the kept row's STEP_COLS)`: won true
/// (and NULLs) when this statement inserted it. No row: another writer's insert committed
/// after this statement's snapshot (the insert waited for it); the next statement sees it.
macro_rules! step_insert {
    ($cols:literal, $vals:literal) => {
        concat!(
            "WITH ins AS (INSERT INTO gnl_run_steps (run_id, name, n, position, state, ",
            $cols,
            ") VALUES ($1, $2, $3, $4, ",
            $vals,
            ") ON CONFLICT DO NOTHING RETURNING 1)
             SELECT true, NULL::text, NULL::bigint, NULL::bigint, NULL::text, NULL::text,
                    NULL::bigint, NULL::bigint FROM ins
             UNION ALL
             SELECT false, name, n, position, state, result, started_at, finished_at
             FROM gnl_run_steps WHERE run_id = $1 AND name = $2 AND n = $3
             LIMIT 1"
        )
    };
}

const STEP_PUT: &str = step_insert!(
    "result, started_at, finished_at",
    "'done', $5, (SELECT t FROM now_t), (SELECT t FROM now_t)"
);
const STEP_INTENT: &str = step_insert!("token, started_at", "'intent', $5, (SELECT t FROM now_t)");

impl PostgresStore {
    async fn insert_step(
        &self,
        sql: &'static str,
        run_id: &str,
        name: &str,
        n: i64,
        position: i64,
        fifth: Fifth<'_>,
    ) -> Result<Option<StepRow>> {
        let sql = with_now(sql);
        loop {
            self.counted(1);
            let q = sqlx::query(&sql)
                .bind(run_id)
                .bind(name)
                .bind(n)
                .bind(position);
            let q = match fifth {
                Fifth::Text(t) => q.bind(t),
                Fifth::Int(i) => q.bind(i),
            };
            if let Some(r) = on_held!(self, ex => q.fetch_optional(ex)) {
                let won: bool = r.get(0);
                if won {
                    return Ok(None);
                }
                return Ok(Some(StepRow {
                    name: r.get(1),
                    n: r.get(2),
                    position: r.get(3),
                    state: r.get(4),
                    result: r.get(5),
                    started_at: r.get(6),
                    finished_at: r.get(7),
                }));
            }
        }
    }

    async fn steps_of<'e>(
        &self,
        ex: impl sqlx::PgExecutor<'e>,
        run_id: &str,
    ) -> Result<Vec<StepRow>> {
        self.counted(1);
        let rows = sqlx::query(&format!(
            "SELECT {STEP_COLS} FROM gnl_run_steps WHERE run_id = $1 ORDER BY position, name, n"
        ))
        .bind(run_id)
        .fetch_all(ex)
        .await?;
        Ok(rows.iter().map(step_row).collect())
    }

    async fn run_of<'e>(
        &self,
        ex: impl sqlx::PgExecutor<'e>,
        run_id: &str,
    ) -> Result<Option<(RunRow, i64)>> {
        self.counted(1);
        let row = sqlx::query(&format!(
            "SELECT {RUN_COLS}, {} FROM gnl_runs WHERE run_id = $1",
            now_ms!()
        ))
        .bind(run_id)
        .fetch_optional(ex)
        .await?;
        Ok(row.as_ref().map(|r| (run_row(r), r.get(14))))
    }

    async fn affected<'q>(
        &self,
        sql: &'q str,
        f: impl FnOnce(PgQuery<'q>) -> PgQuery<'q>,
    ) -> Result<u64> {
        self.counted(1);
        Ok(f(sqlx::query(sql))
            .execute(&self.pool)
            .await?
            .rows_affected())
    }
}

type PgQuery<'q> = sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>;

#[derive(Clone, Copy)]
enum Fifth<'a> {
    Text(&'a str),
    Int(i64),
}

/// `sql` with the store's clock bound once as `now_t` (a CTE), so every use agrees.
fn with_now(sql: &str) -> String {
    match sql.strip_prefix("WITH ") {
        Some(rest) => format!("WITH now_t(t) AS (SELECT {}), {rest}", now_ms!()),
        None => format!("WITH now_t(t) AS (SELECT {}) {sql}", now_ms!()),
    }
}

#[async_trait]
impl JournalStore for PostgresStore {
    async fn step_get(&self, run_id: &str, name: &str, n: i64) -> Result<Option<StepRow>> {
        self.counted(1);
        let row = sqlx::query(&format!(
            "SELECT {STEP_COLS} FROM gnl_run_steps WHERE run_id = $1 AND name = $2 AND n = $3"
        ))
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
        self.insert_step(STEP_PUT, run_id, name, n, position, Fifth::Text(result))
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
        self.insert_step(STEP_INTENT, run_id, name, n, position, Fifth::Int(token))
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
        let sql = format!(
            "UPDATE gnl_run_steps SET state = 'done', result = $5, finished_at = {} \
             WHERE run_id = $1 AND name = $2 AND n = $3 AND state = 'intent' AND token = $4",
            now_ms!()
        );
        self.counted(1);
        let q = sqlx::query(&sql).bind(run_id).bind(name).bind(n);
        let q = q.bind(token).bind(result);
        Ok(on_held!(self, ex => q.execute(ex)).rows_affected() == 1)
    }

    async fn step_resolve(
        &self,
        run_id: &str,
        name: &str,
        n: i64,
        result: Option<&str>,
    ) -> Result<bool> {
        let key = "run_id = $1 AND name = $2 AND n = $3 AND state = 'intent'";
        let n_rows = match result {
            Some(r) => {
                let sql = format!(
                    "UPDATE gnl_run_steps SET state = 'done', result = $4, finished_at = {} \
                     WHERE {key}",
                    now_ms!()
                );
                self.affected(&sql, |q| q.bind(run_id).bind(name).bind(n).bind(r))
                    .await?
            }
            None => {
                let sql = format!("DELETE FROM gnl_run_steps WHERE {key}");
                self.affected(&sql, |q| q.bind(run_id).bind(name).bind(n))
                    .await?
            }
        };
        Ok(n_rows == 1)
    }

    async fn run_start(&self, s: &RunStart) -> Result<RunStarted> {
        self.counted(1);
        let sql = with_now(&format!(
            "WITH up AS (INSERT INTO gnl_runs (run_id, workflow, preset, state, input, \
             scheduled_for, lease_owner, lease_expires_at, due_at, token, created_at, updated_at) \
             SELECT $1, $2, $3, 'running', $4, $5, $6, t + $7, t + $7, 1, t, t FROM now_t \
             ON CONFLICT (run_id) DO UPDATE SET state = 'running', \
             lease_owner = excluded.lease_owner, lease_expires_at = excluded.lease_expires_at, \
             due_at = excluded.due_at, error = NULL, token = gnl_runs.token + 1, \
             updated_at = excluded.updated_at \
             WHERE gnl_runs.state <> 'done' AND gnl_runs.workflow = excluded.workflow \
             AND NOT (gnl_runs.state = 'running' \
             AND coalesce(gnl_runs.lease_expires_at, 0) > excluded.updated_at \
             AND gnl_runs.lease_owner IS DISTINCT FROM excluded.lease_owner) \
             RETURNING {RUN_COLS}) SELECT up.*, now_t.t FROM up, now_t"
        ));
        let row = sqlx::query(&sql)
            .bind(&s.run_id)
            .bind(&s.workflow)
            .bind(&s.preset)
            .bind(&s.input)
            .bind(s.scheduled_for)
            .bind(pg_text(&s.owner))
            .bind(s.lease_ms)
            .fetch_optional(&self.pool)
            .await?;
        let (run, now) = match row {
            Some(r) => (Some(run_row(&r)), r.get::<i64, _>(14)),
            // Done, or another workflow's run.
            None => match self.run_of(&self.pool, &s.run_id).await? {
                Some((run, now)) => (Some(run), now),
                None => (None, 0),
            },
        };
        started(run, s, now, || self.steps_of(&self.pool, &s.run_id)).await
    }

    async fn run_renew(&self, run_id: &str, owner: &str, lease_ms: i64) -> Result<bool> {
        let sql = format!(
            "UPDATE gnl_runs SET lease_expires_at = {n} + $2, due_at = {n} + $2 \
             WHERE run_id = $1 AND state = 'running' AND lease_expires_at IS NOT NULL \
             AND lease_owner = $3",
            n = now_ms!()
        );
        let owner = pg_text(owner);
        Ok(self
            .affected(&sql, |q| q.bind(run_id).bind(lease_ms).bind(owner.as_ref()))
            .await?
            == 1)
    }

    async fn run_suspend(&self, run_id: &str, wake_at: i64) -> Result<bool> {
        let sql = format!(
            "UPDATE gnl_runs SET state = 'suspended', wake_at = $2, due_at = $2, \
             lease_owner = NULL, lease_expires_at = NULL, updated_at = {} \
             WHERE run_id = $1 AND state = 'running'",
            now_ms!()
        );
        Ok(self
            .affected(&sql, |q| q.bind(run_id).bind(wake_at))
            .await?
            == 1)
    }

    async fn run_finish(&self, run_id: &str, result: &str) -> Result<Option<String>> {
        let sql = format!(
            "UPDATE gnl_runs SET state = 'done', result = $2, error = NULL, wake_at = NULL, \
             due_at = NULL, lease_owner = NULL, lease_expires_at = NULL, updated_at = {} \
             WHERE run_id = $1 AND state <> 'done'",
            now_ms!()
        );
        if self.affected(&sql, |q| q.bind(run_id).bind(result)).await? == 1 {
            return Ok(None);
        }
        Ok(self
            .run_of(&self.pool, run_id)
            .await?
            .and_then(|(r, _)| r.result))
    }

    async fn run_fail(&self, run_id: &str, error: &str) -> Result<bool> {
        let sql = format!(
            "UPDATE gnl_runs SET state = 'failed', error = $2, due_at = NULL, \
             lease_owner = NULL, lease_expires_at = NULL, updated_at = {} \
             WHERE run_id = $1 AND state <> 'done'",
            now_ms!()
        );
        let error = pg_text(error);
        Ok(self
            .affected(&sql, |q| q.bind(run_id).bind(error.as_ref()))
            .await?
            == 1)
    }

    async fn run_wake(&self, run_id: &str) -> Result<bool> {
        let sql = format!(
            "UPDATE gnl_runs SET state = 'suspended', wake_at = {n}, due_at = {n}, error = NULL, \
             updated_at = {n} WHERE run_id = $1 AND state = 'failed'",
            n = now_ms!()
        );
        Ok(self.affected(&sql, |q| q.bind(run_id)).await? == 1)
    }

    async fn run_get(&self, run_id: &str) -> Result<Option<(RunRow, Vec<StepRow>)>> {
        let mut c = self.read().await?;
        let got = match self.run_of(&mut *c, run_id).await? {
            None => None,
            Some((r, _)) => Some((r, self.steps_of(&mut *c, run_id).await?)),
        };
        self.done(c).await?;
        Ok(got)
    }

    async fn list_runs(&self, q: &RunQuery) -> Result<Vec<RunRow>> {
        self.counted(1);
        let mut r = self.read().await?;
        const AFTER: &str = "($4::bigint IS NULL OR (created_at, run_id) < ($4, $5::text))";
        const ORDER: &str = "ORDER BY created_at DESC, run_id DESC";
        let from = match q.scan {
            None => "gnl_runs".to_string(),
            Some(_) => format!("(SELECT * FROM gnl_runs WHERE {AFTER} {ORDER} LIMIT $6) w"),
        };
        let rows = sqlx::query(&format!(
            "SELECT {RUN_COLS} FROM {from} WHERE ($1::text IS NULL OR state = $1) \
             AND ($2::text IS NULL OR workflow = $2) AND {AFTER} AND $6::bigint >= 0 \
             {ORDER} LIMIT $3"
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
             WHERE ($1::bigint IS NULL OR (created_at, run_id) < ($1, $2::text)) \
             ORDER BY created_at DESC, run_id DESC LIMIT 1 OFFSET $3",
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
        self.counted(1);
        let sql = with_now(&format!(
            "UPDATE gnl_runs SET wake_at = CASE WHEN state = 'suspended' THEN wake_at END, \
             state = 'running', lease_owner = $1, \
             lease_expires_at = (SELECT t FROM now_t) + $2, due_at = (SELECT t FROM now_t) + $2, \
             token = token + 1, updated_at = (SELECT t FROM now_t) \
             WHERE run_id IN (SELECT run_id FROM gnl_runs \
                 WHERE due_at <= (SELECT t FROM now_t) AND workflow = ANY($3) \
                 ORDER BY due_at LIMIT $4 FOR UPDATE SKIP LOCKED) \
             AND due_at <= (SELECT t FROM now_t) RETURNING {RUN_COLS}"
        ));
        let rows = sqlx::query(&sql)
            .bind(pg_text(owner))
            .bind(lease_ms)
            .bind(workflows)
            .bind(limit)
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.iter().map(run_row).collect())
    }

    async fn lock_acquire(&self, key: &str, owner: &str, ttl_ms: i64) -> Result<Option<i64>> {
        self.counted(1);
        let sql = with_now(
            "INSERT INTO gnl_locks (lock_key, owner, token, expires_at) \
             SELECT $1, $2, 1, t + $3 FROM now_t \
             ON CONFLICT (lock_key) DO UPDATE SET owner = excluded.owner, \
             token = gnl_locks.token + 1, expires_at = excluded.expires_at \
             WHERE gnl_locks.expires_at <= (SELECT t FROM now_t) RETURNING token",
        );
        Ok(sqlx::query_scalar(&sql)
            .bind(key)
            .bind(pg_text(owner))
            .bind(ttl_ms)
            .fetch_optional(&self.pool)
            .await?)
    }

    async fn lock_renew(&self, key: &str, token: i64, ttl_ms: i64) -> Result<bool> {
        let sql = format!(
            "UPDATE gnl_locks SET expires_at = {} + $3 WHERE lock_key = $1 AND token = $2",
            now_ms!()
        );
        Ok(self
            .affected(&sql, |q| q.bind(key).bind(token).bind(ttl_ms))
            .await?
            == 1)
    }

    async fn lock_release(&self, key: &str, token: i64) -> Result<bool> {
        Ok(self
            .affected(
                "UPDATE gnl_locks SET expires_at = 0 WHERE lock_key = $1 AND token = $2",
                |q| q.bind(key).bind(token),
            )
            .await?
            == 1)
    }
}
