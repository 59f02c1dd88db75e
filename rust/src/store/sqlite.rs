//! The SQLite engine (embedded default): WAL, one writer at a time (`BEGIN IMMEDIATE`, and a
//! per-process write lock so this process's writers queue in tokio instead of in SQLite's
//! sleeping busy handler), the process clock of the machine that holds the file.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use sqlx::migrate::Migrator;
use sqlx::sqlite::{
    SqliteArguments, SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteSynchronous,
};
use sqlx::{Arguments, Executor, Row, Sqlite, Transaction};

use super::url::SqliteTarget;
use super::{JournalStore, QueueStore, Store};
use crate::error::{Error, Result};
use crate::model::*;

/// The SQLite migrations, embedded. Applied by `migrate`, recorded in `gnl_schema`.
pub static MIGRATOR: Migrator = sqlx::migrate!("rust/migrations/sqlite");

/// How long a statement waits for another process's write lock before the store counts as
/// unavailable (and the caller retries with backoff).
const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// How often a claim that carries outcomes also looks for expired leases, in ms.
const RECLAIM_EVERY_MS: i64 = 250;

pub struct SqliteStore {
    pool: SqlitePool,
    write: tokio::sync::Mutex<()>,
    queries: AtomicU64,
    /// When expired leases were last looked for (process clock, ms).
    last_reclaim: AtomicI64,
    /// Bind parameters per statement (`sqlite3_limit(SQLITE_LIMIT_VARIABLE_NUMBER)`).
    var_limit: usize,
}

/// SQLite's own busy handler sleeps up to 100 ms between tries, so a process waiting for
/// another process's write lock loses its turn again and again (and its lease renewals stall).
/// This one retries every ~0.5 ms, for up to `BUSY_TIMEOUT`.
extern "C" fn busy_handler(_arg: *mut std::ffi::c_void, tries: std::ffi::c_int) -> std::ffi::c_int {
    let waited_us = i64::from(tries) * 500;
    if waited_us >= BUSY_TIMEOUT.as_micros() as i64 {
        return 0;
    }
    std::thread::sleep(Duration::from_micros(250 + (tries as u64 % 4) * 125));
    1
}

fn clock_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

const JOB_COLS: &str =
    "seq, org, id, type, payload, state, attempts, max_attempts, last_error, result, \
     created_at, updated_at, run_at, finished_at";

fn job_row(r: &sqlx::sqlite::SqliteRow) -> JobRow {
    JobRow {
        seq: r.get(0),
        org: r.get(1),
        id: r.get(2),
        typ: r.get(3),
        payload: r.get(4),
        state: r.get(5),
        attempts: r.get(6),
        max_attempts: r.get(7),
        last_error: r.get(8),
        result: r.get(9),
        created_at: r.get(10),
        updated_at: r.get(11),
        run_at: r.get(12),
        finished_at: r.get(13),
    }
}

type Tx<'a> = Transaction<'a, Sqlite>;

impl SqliteStore {
    pub async fn connect(target: SqliteTarget, max_connections: u32, create: bool) -> Result<Self> {
        let (opts, max) = match &target {
            SqliteTarget::Memory => {
                // One connection holds the in-memory database for the life of the pool.
                let name = format!(
                    "file:gnl-mem-{}?mode=memory&cache=shared",
                    crate::ids::new_job_id()
                );
                let o = SqliteConnectOptions::from_str(&format!("sqlite:{name}"))
                    .map_err(|e| Error::invalid(e.to_string()))?;
                (o, 1)
            }
            SqliteTarget::File(path) => {
                if !create && !std::path::Path::new(path).exists() {
                    return Err(Error::StoreUnavailable {
                        reason: format!("there is no SQLite file at {path:?} (create=False does not create one)"),
                        code: None,
                    });
                }
                let o = SqliteConnectOptions::new()
                    .filename(path)
                    .create_if_missing(true)
                    .journal_mode(SqliteJournalMode::Wal)
                    .synchronous(SqliteSynchronous::Normal);
                (o, max_connections.max(2))
            }
        };
        let opts = opts
            .busy_timeout(BUSY_TIMEOUT)
            .pragma("foreign_keys", "OFF")
            .statement_cache_capacity(256);
        let memory = matches!(target, SqliteTarget::Memory);
        let pool = SqlitePoolOptions::new()
            .max_connections(max)
            .min_connections(if memory { 1 } else { 0 })
            .idle_timeout(if memory {
                None
            } else {
                Some(Duration::from_secs(300))
            })
            .max_lifetime(if memory {
                None
            } else {
                Some(Duration::from_secs(3600))
            })
            .acquire_timeout(BUSY_TIMEOUT)
            // A pooled connection to a local file needs no ping before each use.
            .test_before_acquire(false)
            .after_connect(move |conn, _| {
                Box::pin(async move {
                    // Check the pragmas on every new connection: a file store must be in WAL.
                    let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
                        .fetch_one(&mut *conn)
                        .await?;
                    if !memory && !mode.eq_ignore_ascii_case("wal") {
                        return Err(sqlx::Error::Configuration(
                            format!("SQLite journal_mode is {mode}, gnl needs wal").into(),
                        ));
                    }
                    let mut handle = conn.lock_handle().await?;
                    // SAFETY: a valid open connection, locked for the call; the handler is a
                    // plain function that touches no connection state.
                    unsafe {
                        libsqlite3_sys::sqlite3_busy_handler(
                            handle.as_raw_handle().as_ptr(),
                            Some(busy_handler),
                            std::ptr::null_mut(),
                        );
                    }
                    Ok(())
                })
            })
            .connect_with(opts)
            .await?;
        let var_limit = {
            let mut conn = pool.acquire().await?;
            let mut handle = conn.lock_handle().await?;
            let raw = handle.as_raw_handle().as_ptr();
            // SAFETY: a valid open connection handle, held locked for the call; -1 only reads.
            let n = unsafe {
                libsqlite3_sys::sqlite3_limit(raw, libsqlite3_sys::SQLITE_LIMIT_VARIABLE_NUMBER, -1)
            };
            n.max(999) as usize
        };
        Ok(SqliteStore {
            pool,
            write: tokio::sync::Mutex::new(()),
            queries: AtomicU64::new(0),
            last_reclaim: AtomicI64::new(0),
            var_limit,
        })
    }

    fn counted(&self, n: u64) {
        self.queries.fetch_add(n, Ordering::Relaxed);
    }

    async fn begin_write(&self) -> Result<Tx<'static>> {
        self.counted(1);
        Ok(self.pool.begin_with("BEGIN IMMEDIATE").await?)
    }

    async fn commit(&self, tx: Tx<'static>) -> Result<()> {
        self.counted(1);
        tx.commit().await?;
        Ok(())
    }

    /// Lower a lane's `next_run_at` bound to `run_at` (creating the lane if needed).
    async fn lane_due(&self, tx: &mut Tx<'static>, org: &str, run_at: i64) -> Result<()> {
        self.counted(1);
        sqlx::query(
            "INSERT INTO gnl_lanes (org, next_run_at, served_at) VALUES (?1, ?2, 0) \
             ON CONFLICT (org) DO UPDATE SET next_run_at = \
             min(coalesce(gnl_lanes.next_run_at, excluded.next_run_at), excluded.next_run_at)",
        )
        .bind(org)
        .bind(run_at)
        .execute(&mut **tx)
        .await?;
        Ok(())
    }

    /// Write outcomes of finished attempts (conditional on the lease's fencing token).
    async fn write_outcomes(
        &self,
        tx: &mut Tx<'static>,
        outcomes: &[Outcome],
        now: i64,
    ) -> Result<()> {
        let done: Vec<(i64, i64, Option<&str>)> = outcomes
            .iter()
            .filter_map(|o| match o {
                Outcome::Done {
                    seq, token, result, ..
                } => Some((*seq, *token, result.as_deref())),
                _ => None,
            })
            .collect();
        // Done: one statement per chunk, the outcomes joined as a VALUES table. Anonymous `?`
        // only: SQLite looks numbered parameters up by a linear scan (quadratic binds), and
        // `now` is an integer we format ourselves.
        let per_chunk = (self.var_limit / 3).max(1);
        for chunk in done.chunks(per_chunk) {
            let mut sql = String::with_capacity(300 + chunk.len() * 8);
            sql.push_str("WITH o(seq, tok, res) AS (VALUES ");
            let mut args = SqliteArguments::default();
            for (i, (seq, tok, res)) in chunk.iter().enumerate() {
                if i > 0 {
                    sql.push(',');
                }
                sql.push_str("(?,?,?)");
                args.add(*seq).map_err(|e| Error::invalid(e.to_string()))?;
                args.add(*tok).map_err(|e| Error::invalid(e.to_string()))?;
                args.add(*res).map_err(|e| Error::invalid(e.to_string()))?;
            }
            sql.push_str(&format!(
                ") UPDATE gnl_jobs SET \
                   state = CASE WHEN cancel_requested = 1 THEN 'canceled' ELSE 'done' END, \
                   result = o.res, finished_at = {now}, updated_at = {now}, lease_expires_at = NULL, lease_owner = NULL \
                 FROM o WHERE gnl_jobs.seq = o.seq AND gnl_jobs.lease_token = o.tok AND gnl_jobs.state = 'running'"
            ));
            self.counted(1);
            sqlx::query_with(&sql, args)
                .persistent(false)
                .execute(&mut **tx)
                .await?;
        }
        for o in outcomes {
            if let Outcome::Failed {
                seq,
                token,
                error,
                delay_ms,
                ..
            } = o
            {
                self.counted(1);
                let row = sqlx::query(
                    "UPDATE gnl_jobs SET \
                       state = CASE WHEN cancel_requested = 1 THEN 'canceled' \
                                    WHEN attempts >= max_attempts THEN 'dead' ELSE 'pending' END, \
                       last_error = CASE WHEN cancel_requested = 1 THEN coalesce(last_error, ?4) ELSE ?4 END, \
                       updated_at = ?1, lease_expires_at = NULL, lease_owner = NULL, \
                       run_at = CASE WHEN cancel_requested = 0 AND attempts < max_attempts THEN ?1 + ?5 ELSE run_at END, \
                       finished_at = CASE WHEN cancel_requested = 0 AND attempts < max_attempts THEN NULL ELSE ?1 END \
                     WHERE seq = ?2 AND lease_token = ?3 AND state = 'running' \
                     RETURNING org, state, run_at",
                )
                .bind(now)
                .bind(seq)
                .bind(token)
                .bind(error)
                .bind(delay_ms.max(&0))
                .fetch_optional(&mut **tx)
                .await?;
                if let Some(r) = row {
                    let state: String = r.get(1);
                    if state == PENDING {
                        self.lane_due(tx, r.get::<String, _>(0).as_str(), r.get(2))
                            .await?;
                    }
                }
            }
        }
        Ok(())
    }

    /// After a claim: give the lanes that were served new turn tickets, in the order they were
    /// served, and recompute the next-due bound of every lane the claim looked at; one
    /// statement. Tickets strictly increase (claims within one millisecond must not tie) and
    /// stay near the store's clock (in 1/4096 ms), so a new lane's ticket 0 sorts first.
    async fn lanes_served(
        &self,
        tx: &mut Tx<'static>,
        looked: &[String],
        served: &[&str],
        now: i64,
    ) -> Result<()> {
        let mut sql = String::from(
            "WITH b(v) AS MATERIALIZED (SELECT max(?, coalesce(max(served_at), 0) + 1) FROM gnl_lanes) \
             UPDATE gnl_lanes SET served_at = ",
        );
        let mut args = SqliteArguments::default();
        args.add(now * 4096)
            .map_err(|e| Error::invalid(e.to_string()))?;
        if served.is_empty() {
            sql.push_str("served_at");
        } else {
            sql.push_str("CASE org");
            for (i, org) in served.iter().enumerate() {
                sql.push_str(&format!(" WHEN ? THEN (SELECT v FROM b) + {i}"));
                args.add(*org).map_err(|e| Error::invalid(e.to_string()))?;
            }
            sql.push_str(" ELSE served_at END");
        }
        sql.push_str(
            ", next_run_at = \
             (SELECT min(j.run_at) FROM gnl_jobs j WHERE j.org = gnl_lanes.org AND j.state = 'pending') \
             WHERE org IN (",
        );
        for (i, org) in looked.iter().enumerate() {
            sql.push_str(if i == 0 { "?" } else { ",?" });
            args.add(org.as_str())
                .map_err(|e| Error::invalid(e.to_string()))?;
        }
        sql.push(')');
        self.counted(1);
        sqlx::query_with(&sql, args)
            .persistent(looked.len() <= 4)
            .execute(&mut **tx)
            .await?;
        Ok(())
    }

    /// Expired leases: the holder stopped renewing (crashed, partitioned). The attempt it used
    /// stays counted; the job is pending again, or dead once its attempts are used up.
    async fn reclaim(&self, tx: &mut Tx<'static>, now: i64) -> Result<()> {
        self.counted(1);
        let rows = sqlx::query(
            "UPDATE gnl_jobs SET \
               state = CASE WHEN cancel_requested = 1 THEN 'canceled' \
                            WHEN attempts >= max_attempts THEN 'dead' ELSE 'pending' END, \
               last_error = 'lease expired: the worker ' || coalesce(lease_owner, '?') || \
                            ' stopped renewing attempt ' || attempts || ' (crashed, stopped or cut off)', \
               finished_at = CASE WHEN cancel_requested = 0 AND attempts < max_attempts THEN NULL ELSE ?1 END, \
               lease_expires_at = NULL, lease_owner = NULL, updated_at = ?1 \
             WHERE state = 'running' AND lease_expires_at < ?1 \
             RETURNING org, state, run_at",
        )
        .bind(now)
        .fetch_all(&mut **tx)
        .await?;
        let mut lanes: BTreeMap<String, i64> = BTreeMap::new();
        for r in rows {
            let state: String = r.get(1);
            if state == PENDING {
                let org: String = r.get(0);
                let run_at: i64 = r.get(2);
                let e = lanes.entry(org).or_insert(run_at);
                *e = (*e).min(run_at);
            }
        }
        for (org, run_at) in lanes {
            self.lane_due(tx, &org, run_at).await?;
        }
        Ok(())
    }
}

#[async_trait]
impl Store for SqliteStore {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    fn query_count(&self) -> u64 {
        self.queries.load(Ordering::Relaxed)
    }

    async fn now_ms(&self) -> Result<i64> {
        Ok(clock_ms())
    }

    async fn schema_version(&self) -> Result<Option<i64>> {
        self.counted(1);
        let has: Option<String> = sqlx::query_scalar(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'gnl_schema'",
        )
        .fetch_optional(&self.pool)
        .await?;
        if has.is_none() {
            return Ok(None);
        }
        self.counted(1);
        let v: Option<i64> = sqlx::query_scalar("SELECT version FROM gnl_schema WHERE id = 1")
            .fetch_optional(&self.pool)
            .await?;
        Ok(Some(v.unwrap_or(0)))
    }

    async fn migrate(&self) -> Result<()> {
        let _w = self.write.lock().await;
        let mut tx = self.begin_write().await?;
        self.counted(1);
        tx.execute("CREATE TABLE IF NOT EXISTS gnl_schema (id INTEGER PRIMARY KEY CHECK (id = 1), version INTEGER NOT NULL)")
            .await?;
        self.counted(1);
        let current: i64 = sqlx::query_scalar("SELECT coalesce(max(version), 0) FROM gnl_schema")
            .fetch_one(&mut *tx)
            .await?;
        for m in MIGRATOR
            .iter()
            .filter(|m| m.version > current && !m.migration_type.is_down_migration())
        {
            self.counted(1);
            (&mut *tx).execute(&*m.sql).await?;
        }
        let latest = MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0);
        if latest > current {
            self.counted(1);
            sqlx::query("INSERT INTO gnl_schema (id, version) VALUES (1, ?1) ON CONFLICT (id) DO UPDATE SET version = excluded.version")
                .bind(latest)
                .execute(&mut *tx)
                .await?;
        }
        self.commit(tx).await
    }

    async fn close(&self) {
        self.pool.close().await;
    }
}

#[async_trait]
impl QueueStore for SqliteStore {
    async fn enqueue_batch(&self, jobs: &JobBatch) -> Result<()> {
        if jobs.is_empty() {
            return Ok(());
        }
        let _w = self.write.lock().await;
        let mut tx = self.begin_write().await?;
        let now = clock_ms();
        // 5 binds a row, anonymous `?` only (see `write_outcomes`); `now` is a literal.
        let per_chunk = (self.var_limit / 5).max(1);
        let tail = format!("'pending',{now},{now})");
        let mut start = 0;
        while start < jobs.len() {
            let end = (start + per_chunk).min(jobs.len());
            let mut sql = String::with_capacity(160 + (end - start) * 40);
            sql.push_str(
                "INSERT INTO gnl_jobs (org, id, type, payload, run_at, state, created_at, updated_at) VALUES ",
            );
            let mut args = SqliteArguments::default();
            for i in start..end {
                let j = jobs.get(i);
                if i > start {
                    sql.push(',');
                }
                sql.push_str("(?,?,?,?,?,");
                sql.push_str(&tail);
                for v in [j.org, j.id, j.typ, j.payload] {
                    args.add(v).map_err(|e| Error::invalid(e.to_string()))?;
                }
                args.add(j.due.at(now))
                    .map_err(|e| Error::invalid(e.to_string()))?;
            }
            sql.push_str(" ON CONFLICT (org, id) DO NOTHING");
            self.counted(1);
            sqlx::query_with(&sql, args)
                .persistent(false)
                .execute(&mut *tx)
                .await?;
            start = end;
        }
        let lanes = jobs.lanes();
        for (org, lane) in &lanes {
            let Some(max_depth) = lane.max_depth else {
                continue;
            };
            self.counted(1);
            let depth: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM gnl_jobs WHERE org = ?1 AND state = 'pending'",
            )
            .bind(*org)
            .fetch_one(&mut *tx)
            .await?;
            if depth > max_depth {
                self.counted(1);
                tx.rollback().await?;
                return Err(Error::QueueFull {
                    org: if org.is_empty() {
                        None
                    } else {
                        Some(org.to_string())
                    },
                    depth,
                    max_depth,
                });
            }
        }
        // Each organization's turn is taken once per call.
        for (org, lane) in lanes {
            self.lane_due(&mut tx, org, lane.earliest(now)).await?;
        }
        self.commit(tx).await
    }

    async fn claim(&self, finished: &[Outcome], req: &ClaimRequest) -> Result<Vec<ClaimedJob>> {
        let now = clock_ms();
        let mut expired = false;
        if finished.is_empty() && req.probe {
            // The empty poll: one read, whatever the number of lanes (both are index seeks).
            self.counted(1);
            let (next_due, next_expiry): (Option<i64>, Option<i64>) = sqlx::query_as(
                "SELECT (SELECT min(next_run_at) FROM gnl_lanes WHERE next_run_at IS NOT NULL), \
                        (SELECT min(lease_expires_at) FROM gnl_jobs WHERE state = 'running')",
            )
            .fetch_one(&self.pool)
            .await?;
            expired = next_expiry.is_some_and(|t| t < now);
            let due = next_due.is_some_and(|t| t <= now);
            if !due && !expired {
                return Ok(vec![]);
            }
        }
        let _w = self.write.lock().await;
        let mut tx = self.begin_write().await?;
        let now = clock_ms();
        self.write_outcomes(&mut tx, finished, now).await?;
        // Without the probe (a claim that carries outcomes), look for expired leases at most
        // every RECLAIM_EVERY_MS: a stale lease waits that much longer, a busy worker saves a
        // statement per claim.
        if expired || now - self.last_reclaim.load(Ordering::Relaxed) >= RECLAIM_EVERY_MS {
            self.last_reclaim.store(now, Ordering::Relaxed);
            self.reclaim(&mut tx, now).await?;
        }
        let mut out = Vec::new();
        if req.limit > 0 {
            self.counted(1);
            let lanes: Vec<String> = sqlx::query_scalar(
                "SELECT org FROM gnl_lanes WHERE next_run_at <= ?1 ORDER BY served_at, org LIMIT ?2",
            )
            .bind(now)
            .bind(req.limit as i64)
            .fetch_all(&mut *tx)
            .await?;
            let n = lanes.len().max(1);
            let expires = now + req.ttl_ms;
            let mut served: Vec<&str> = Vec::with_capacity(lanes.len());
            for (i, org) in lanes.iter().enumerate() {
                // Lanes in turn: each gets an equal share of the batch, the first ones the rest.
                let share = req.limit / n + usize::from(i < req.limit % n);
                self.counted(1);
                let rows = sqlx::query(
                    "UPDATE gnl_jobs SET state = 'running', attempts = attempts + 1, max_attempts = ?2, \
                       lease_token = lease_token + 1, lease_expires_at = ?3, lease_owner = ?4, updated_at = ?1 \
                     WHERE seq IN (SELECT seq FROM gnl_jobs WHERE org = ?5 AND state = 'pending' AND run_at <= ?1 \
                                   ORDER BY run_at, seq LIMIT ?6) \
                     RETURNING seq, lease_token, id, type, payload, attempts, run_at",
                )
                .bind(now)
                .bind(req.max_attempts)
                .bind(expires)
                .bind(&req.owner)
                .bind(org)
                .bind(share as i64)
                .fetch_all(&mut *tx)
                .await?;
                if !rows.is_empty() {
                    served.push(org.as_str());
                }
                let mut got: Vec<ClaimedJob> = rows
                    .iter()
                    .map(|r| ClaimedJob {
                        seq: r.get(0),
                        token: r.get(1),
                        org: org.clone(),
                        id: r.get(2),
                        typ: r.get(3),
                        payload: r.get(4),
                        attempt: r.get(5),
                        run_at: r.get(6),
                    })
                    .collect();
                got.sort_by_key(|j| (j.run_at, j.seq));
                out.extend(got);
            }
            if !lanes.is_empty() {
                self.lanes_served(&mut tx, &lanes, &served, now).await?;
            }
        }
        self.commit(tx).await?;
        Ok(out)
    }

    async fn finish(&self, outcomes: &[Outcome]) -> Result<()> {
        if outcomes.is_empty() {
            return Ok(());
        }
        let _w = self.write.lock().await;
        let mut tx = self.begin_write().await?;
        self.write_outcomes(&mut tx, outcomes, clock_ms()).await?;
        self.commit(tx).await
    }

    async fn renew(&self, leases: &[LeaseRef], ttl_ms: i64) -> Result<Vec<RenewStatus>> {
        if leases.is_empty() {
            return Ok(vec![]);
        }
        let _w = self.write.lock().await;
        let mut tx = self.begin_write().await?;
        let now = clock_ms();
        let mut status: BTreeMap<i64, RenewStatus> = BTreeMap::new();
        let per_chunk = (self.var_limit / 2).max(1);
        for chunk in leases.chunks(per_chunk) {
            let mut sql = String::from("WITH l(seq, tok) AS (VALUES ");
            let mut args = SqliteArguments::default();
            for (i, l) in chunk.iter().enumerate() {
                if i > 0 {
                    sql.push(',');
                }
                sql.push_str("(?,?)");
                args.add(l.seq).map_err(|e| Error::invalid(e.to_string()))?;
                args.add(l.token)
                    .map_err(|e| Error::invalid(e.to_string()))?;
            }
            sql.push_str(&format!(
                ") UPDATE gnl_jobs SET lease_expires_at = {} FROM l \
                 WHERE gnl_jobs.seq = l.seq AND gnl_jobs.lease_token = l.tok AND gnl_jobs.state = 'running' \
                 RETURNING gnl_jobs.seq, gnl_jobs.cancel_requested",
                now + ttl_ms
            ));
            self.counted(1);
            for r in sqlx::query_with(&sql, args)
                .persistent(false)
                .fetch_all(&mut *tx)
                .await?
            {
                let c: i64 = r.get(1);
                status.insert(
                    r.get(0),
                    if c != 0 {
                        RenewStatus::CancelRequested
                    } else {
                        RenewStatus::Held
                    },
                );
            }
        }
        self.commit(tx).await?;
        Ok(leases
            .iter()
            .map(|l| status.get(&l.seq).copied().unwrap_or(RenewStatus::Lost))
            .collect())
    }

    async fn get_job(&self, org: &str, id: &str) -> Result<Option<JobRow>> {
        self.counted(1);
        let row = sqlx::query(&format!(
            "SELECT {JOB_COLS} FROM gnl_jobs WHERE org = ?1 AND id = ?2"
        ))
        .bind(org)
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.as_ref().map(job_row))
    }

    async fn has_due(&self) -> Result<bool> {
        self.counted(1);
        let next: Option<i64> = sqlx::query_scalar(
            "SELECT min(next_run_at) FROM gnl_lanes WHERE next_run_at IS NOT NULL",
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(next.is_some_and(|t| t <= clock_ms()))
    }

    async fn max_seq(&self) -> Result<i64> {
        self.counted(1);
        Ok(
            sqlx::query_scalar("SELECT coalesce(max(seq), 0) FROM gnl_jobs")
                .fetch_one(&self.pool)
                .await?,
        )
    }

    async fn list_jobs(&self, q: &ListQuery) -> Result<Vec<JobRow>> {
        self.counted(1);
        let rows = match &q.scope {
            ListScope::Lane { org, state, typ } => {
                let after = q.after.as_ref().map(|a| a.1).unwrap_or(0);
                sqlx::query(&format!(
                    "SELECT {JOB_COLS} FROM gnl_jobs WHERE org = ?1 AND seq > ?2 AND seq <= ?3 \
                       AND (?4 IS NULL OR state = ?4) AND (?5 IS NULL OR type = ?5) \
                     ORDER BY seq LIMIT ?6"
                ))
                .bind(org)
                .bind(after)
                .bind(q.snapshot)
                .bind(state.as_deref())
                .bind(typ.as_deref())
                .bind(q.limit)
                .fetch_all(&self.pool)
                .await?
            }
            ListScope::All => {
                let (ao, aq) = q.after.clone().unwrap_or((String::new(), 0));
                sqlx::query(&format!(
                    "SELECT {JOB_COLS} FROM gnl_jobs WHERE (org, seq) > (?1, ?2) AND seq <= ?3 \
                     ORDER BY org, seq LIMIT ?4"
                ))
                .bind(ao)
                .bind(aq)
                .bind(q.snapshot)
                .bind(q.limit)
                .fetch_all(&self.pool)
                .await?
            }
        };
        Ok(rows.iter().map(job_row).collect())
    }

    async fn retry_job(&self, org: &str, id: &str) -> Result<bool> {
        let _w = self.write.lock().await;
        let mut tx = self.begin_write().await?;
        let now = clock_ms();
        self.counted(1);
        let row = sqlx::query(
            "UPDATE gnl_jobs SET state = 'pending', attempts = 0, run_at = ?3, updated_at = ?3, \
               finished_at = NULL, cancel_requested = 0 \
             WHERE org = ?1 AND id = ?2 AND state = 'dead' RETURNING run_at",
        )
        .bind(org)
        .bind(id)
        .bind(now)
        .fetch_optional(&mut *tx)
        .await?;
        let ok = row.is_some();
        if ok {
            self.lane_due(&mut tx, org, now).await?;
        }
        self.commit(tx).await?;
        Ok(ok)
    }

    async fn cancel_job(&self, org: &str, id: &str, reason: Option<&str>) -> Result<bool> {
        let _w = self.write.lock().await;
        let mut tx = self.begin_write().await?;
        let now = clock_ms();
        let why = format!("canceled: {}", reason.unwrap_or("cancel_job was called"));
        self.counted(1);
        let n = sqlx::query(
            "UPDATE gnl_jobs SET \
               state = CASE WHEN state = 'pending' THEN 'canceled' ELSE state END, \
               finished_at = CASE WHEN state = 'pending' THEN ?3 ELSE finished_at END, \
               cancel_requested = 1, last_error = ?4, updated_at = ?3 \
             WHERE org = ?1 AND id = ?2 AND state IN ('pending', 'running')",
        )
        .bind(org)
        .bind(id)
        .bind(now)
        .bind(&why)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        self.commit(tx).await?;
        Ok(n > 0)
    }
}

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
            .bind(clock_ms())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{open, Store};
    use std::sync::Arc;

    async fn store() -> Arc<dyn Store> {
        open("sqlite::memory:", 1, true).await.unwrap()
    }

    fn job(org: &str, id: &str) -> NewJob {
        NewJob {
            org: org.into(),
            id: id.into(),
            typ: "t".into(),
            payload: "{}".into(),
            run_at: None,
            delay_ms: None,
            max_depth: None,
        }
    }

    fn req(limit: usize, ttl_ms: i64) -> ClaimRequest {
        ClaimRequest {
            owner: "w".into(),
            limit,
            ttl_ms,
            max_attempts: 2,
            probe: true,
        }
    }

    #[tokio::test]
    async fn lanes_are_served_in_turn() {
        let s = store().await;
        let mut jobs: Vec<NewJob> = (0..50).map(|i| job("big", &format!("b{i}"))).collect();
        jobs.push(job("small", "s0"));
        jobs.push(job("", "n0"));
        s.enqueue(&jobs).await.unwrap();
        let mut first = vec![];
        for _ in 0..3 {
            let got = s.claim(&[], &req(1, 60_000)).await.unwrap();
            first.push(got[0].org.clone());
        }
        first.sort();
        assert_eq!(first, vec!["".to_string(), "big".into(), "small".into()]);
    }

    #[tokio::test]
    async fn a_batch_takes_lanes_in_turn_and_each_lane_in_order() {
        let s = store().await;
        let jobs: Vec<NewJob> = (0..6)
            .map(|i| job(["a", "b"][i % 2], &format!("j{i}")))
            .collect();
        s.enqueue(&jobs).await.unwrap();
        let got = s.claim(&[], &req(4, 60_000)).await.unwrap();
        let ids: Vec<&str> = got.iter().map(|j| j.id.as_str()).collect();
        assert_eq!(ids, vec!["j0", "j2", "j1", "j3"]);
    }

    #[tokio::test]
    async fn an_empty_poll_is_one_query() {
        let s = store().await;
        let before = s.query_count();
        assert!(s.claim(&[], &req(10, 1_000)).await.unwrap().is_empty());
        assert_eq!(s.query_count() - before, 1);
    }

    #[tokio::test]
    async fn a_stale_holder_cannot_write_after_a_reclaim() {
        let s = store().await;
        s.enqueue(&[job("", "x")]).await.unwrap();
        let first = s.claim(&[], &req(1, 5)).await.unwrap().remove(0);
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        // The lease expired: another claim reclaims the job with a new fencing token.
        let second = s.claim(&[], &req(1, 60_000)).await.unwrap().remove(0);
        assert_eq!(second.seq, first.seq);
        assert_eq!(second.attempt, 2);
        assert!(second.token > first.token);
        // The stale holder's renewal and outcome change nothing.
        let st = s
            .renew(
                &[LeaseRef {
                    seq: first.seq,
                    token: first.token,
                    org: first.org.clone(),
                }],
                60_000,
            )
            .await
            .unwrap();
        assert_eq!(st, vec![RenewStatus::Lost]);
        s.finish(&[Outcome::Done {
            seq: first.seq,
            token: first.token,
            org: first.org.clone(),
            result: Some("1".into()),
        }])
        .await
        .unwrap();
        assert_eq!(s.get_job("", "x").await.unwrap().unwrap().state, RUNNING);
        s.finish(&[Outcome::Done {
            seq: second.seq,
            token: second.token,
            org: second.org.clone(),
            result: Some("2".into()),
        }])
        .await
        .unwrap();
        let row = s.get_job("", "x").await.unwrap().unwrap();
        assert_eq!(
            (row.state.as_str(), row.result.as_deref()),
            (DONE, Some("2"))
        );
    }

    #[tokio::test]
    async fn a_crash_on_the_last_attempt_dead_letters_the_job() {
        let s = store().await;
        s.enqueue(&[job("", "x")]).await.unwrap();
        for _ in 0..2 {
            assert_eq!(s.claim(&[], &req(1, 1)).await.unwrap().len(), 1);
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        assert!(s.claim(&[], &req(1, 1)).await.unwrap().is_empty());
        let row = s.get_job("", "x").await.unwrap().unwrap();
        assert_eq!((row.state.as_str(), row.attempts), (DEAD, 2));
        assert!(row.last_error.unwrap().contains("lease expired"));
    }

    #[tokio::test]
    async fn failures_retry_after_the_delay_then_dead_letter() {
        let s = store().await;
        s.enqueue(&[job("", "x")]).await.unwrap();
        let j = s.claim(&[], &req(1, 60_000)).await.unwrap().remove(0);
        let fail = Outcome::Failed {
            seq: j.seq,
            token: j.token,
            org: j.org.clone(),
            error: "boom".into(),
            delay_ms: 60_000,
        };
        assert!(
            s.claim(&[fail], &req(1, 60_000)).await.unwrap().is_empty(),
            "not due before its delay"
        );
        let row = s.get_job("", "x").await.unwrap().unwrap();
        assert_eq!(
            (row.state.as_str(), row.last_error.as_deref()),
            (PENDING, Some("boom"))
        );
    }

    #[tokio::test]
    async fn max_depth_counts_the_calls_own_jobs_and_writes_nothing() {
        let s = store().await;
        let mut jobs: Vec<NewJob> = (0..3).map(|i| job("a", &format!("{i}"))).collect();
        jobs[0].max_depth = Some(2);
        assert!(matches!(
            s.enqueue(&jobs).await,
            Err(Error::QueueFull {
                depth: 3,
                max_depth: 2,
                ..
            })
        ));
        assert_eq!(s.max_seq().await.unwrap(), 0);
    }

    #[tokio::test]
    async fn steps_keep_the_first_result() {
        let s = store().await;
        assert_eq!(s.step_put("r", "n", "1").await.unwrap(), "1");
        assert_eq!(s.step_put("r", "n", "2").await.unwrap(), "1");
        assert_eq!(s.step_get("r", "n").await.unwrap().as_deref(), Some("1"));
    }

    #[tokio::test]
    async fn big_batches_are_split_below_the_variable_limit() {
        let s = store().await;
        let jobs: Vec<NewJob> = (0..20_000).map(|i| job("a", &format!("{i}"))).collect();
        s.enqueue(&jobs).await.unwrap();
        assert_eq!(s.max_seq().await.unwrap(), 20_000);
    }
}
