//! The MySQL / MariaDB engine (MySQL >= 8.0.1, MariaDB >= 10.6: both have SKIP LOCKED). Every
//! instant is the server's clock (`NOW(3)` in UTC), so processes on many machines agree.
//!
//! * Sessions run at READ COMMITTED: no gap locks, and a statement sees every commit before it.
//! * Claims lock lanes and jobs with `FOR UPDATE SKIP LOCKED`, read through indexes that give
//!   the claim order directly (`gnl_jobs_due`, `gnl_lanes_turn`): no filesort, so InnoDB locks
//!   only the rows it takes. MySQL has no `UPDATE … RETURNING`: a claim reads the rows it
//!   locked, then updates them by primary key (the fencing token is read under the lock).
//! * Multi-row statements are sized from the server's `max_allowed_packet` (half of it) and
//!   the 65,535 placeholders a prepared statement may hold, all inside one transaction.
//! * Lock order, to keep transactions from deadlocking each other: job rows first, then lane
//!   rows, sorted by org; claimers wait on nothing once they hold a lane.
//! * Column assignments in a MySQL UPDATE see the columns already assigned to their left: every
//!   UPDATE below assigns a column only after the assignments that read it.

use std::collections::BTreeMap;
use std::ops::Range;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use sqlx::migrate::Migrator;
use sqlx::mysql::{
    MySql, MySqlArguments, MySqlConnectOptions, MySqlConnection, MySqlPool, MySqlPoolOptions,
    MySqlRow,
};
use sqlx::{Arguments, Connection, Encode, Executor, Row, Transaction, Type};

use super::{JournalStore, QueueStore, Store};
use crate::error::{Error, Result};
use crate::model::*;

/// The MySQL migrations, embedded. Applied by `migrate`, recorded in `gnl_schema`.
pub static MIGRATOR: Migrator = sqlx::migrate!("rust/migrations/mysql");

/// The store's clock in SQL: epoch ms, on the server (sessions run in UTC).
macro_rules! now_ms {
    () => {
        "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)"
    };
}

/// How long a call waits for a pooled connection (sqlx retries a refused connection inside
/// this) before the store counts as unavailable: an outage is reported, and logged by the
/// loops that carry on through it, within this time.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(2);
/// Placeholders per prepared statement (the protocol's limit is 65,535).
const MAX_PARAMS: usize = 65_000;
/// Bytes a placeholder costs in a COM_STMT_EXECUTE packet besides its value (type, length).
const PARAM_OVERHEAD: usize = 12;
/// Prepared statements kept per connection: the server caps them all (`max_prepared_stmt_count`,
/// 16,382 by default) across every connection of every process.
const STATEMENT_CACHE: usize = 32;
/// How often a claim that carries outcomes looks for expired leases (as SQLite's engine).
const RECLAIM_EVERY_MS: u64 = 250;
/// The most jobs one claim takes.
const MAX_CLAIM: usize = 10_000;
/// Statements with more rows than this are prepared for one use only.
const CACHED_ROWS: usize = 16;

const JOB_COLS: &str =
    "seq, org, id, type, payload, state, attempts, max_attempts, last_error, result, \
     created_at, updated_at, run_at, finished_at";

/// The empty poll: one read, two index seeks (MIN over an index), whatever the number of lanes.
const PRECHECK: &str = concat!(
    "SELECT CAST(COALESCE((SELECT MIN(next_run_at) FROM gnl_lanes) <= ",
    now_ms!(),
    ", 0) AS SIGNED), CAST(COALESCE((SELECT MIN(lease_expires_at) FROM gnl_jobs WHERE state = 'running') < ",
    now_ms!(),
    ", 0) AS SIGNED)"
);

/// Whether some lane has a due job: one index end read. MIN() skips NULLs; with `WHERE
/// next_run_at IS NOT NULL` MariaDB read the index as a range instead (45 ms at 100,000 lanes
/// with jobs due later).
const HAS_DUE: &str = concat!(
    "SELECT CAST(COALESCE((SELECT MIN(next_run_at) FROM gnl_lanes) <= ",
    now_ms!(),
    ", 0) AS SIGNED)"
);

const CLAIM_LANES: &str = concat!(
    "SELECT org FROM gnl_lanes FORCE INDEX (gnl_lanes_turn) \
     WHERE due_turn IS NOT NULL AND next_run_at <= ",
    now_ms!(),
    " ORDER BY due_turn, org LIMIT ? FOR UPDATE SKIP LOCKED"
);

const CLAIM_JOBS_PART: &str = concat!(
    "SELECT seq, lease_token, org, id, type, payload, attempts, run_at \
     FROM gnl_jobs FORCE INDEX (gnl_jobs_due) \
     WHERE org = ? AND state = 'pending' AND run_at <= ",
    now_ms!(),
    " ORDER BY run_at, seq LIMIT ? FOR UPDATE SKIP LOCKED"
);

const RECLAIM_PICK: &str = concat!(
    "SELECT seq FROM gnl_jobs FORCE INDEX (gnl_jobs_lease) \
     WHERE state = 'running' AND lease_expires_at < ",
    now_ms!(),
    " FOR UPDATE SKIP LOCKED"
);

/// Raise a lane's bound only downwards (`next_run_at` is a lower bound of its due jobs).
const LANE_LOWER: &str = " ON DUPLICATE KEY UPDATE next_run_at = \
     LEAST(COALESCE(gnl_lanes.next_run_at, VALUES(next_run_at)), VALUES(next_run_at))";

/// The key of a step: SHA-256 over (run_id, name), run_id's length first so that no two pairs
/// share it. Binds run_id, run_id, name.
const STEP_KEY: &str = "UNHEX(SHA2(CONCAT(LENGTH(?), ':', ?, ?), 256))";

/// A statement with its arguments, built up piece by piece.
struct Sql {
    text: String,
    args: MySqlArguments,
    rows: usize,
}

impl Sql {
    fn new(text: impl Into<String>) -> Self {
        Sql {
            text: text.into(),
            args: MySqlArguments::default(),
            rows: 0,
        }
    }

    fn s(&mut self, t: &str) -> &mut Self {
        self.text.push_str(t);
        self
    }

    fn bind<'q, T: 'q + Encode<'q, MySql> + Type<MySql>>(&mut self, v: T) -> Result<&mut Self> {
        self.args
            .add(v)
            .map_err(|e| Error::invalid(e.to_string()))?;
        Ok(self)
    }

    async fn execute<'c, E>(self, ex: E) -> Result<u64>
    where
        E: Executor<'c, Database = MySql>,
    {
        let persistent = self.rows <= CACHED_ROWS;
        Ok(sqlx::query_with(&self.text, self.args)
            .persistent(persistent)
            .execute(ex)
            .await?
            .rows_affected())
    }

    async fn fetch_all<'c, E>(self, ex: E) -> std::result::Result<Vec<MySqlRow>, sqlx::Error>
    where
        E: Executor<'c, Database = MySql>,
    {
        let persistent = self.rows <= CACHED_ROWS;
        sqlx::query_with(&self.text, self.args)
            .persistent(persistent)
            .fetch_all(ex)
            .await
    }
}

/// A text column read as bytes (binary collations and VARBINARY columns do not type-check as
/// `String` in sqlx), decoded as UTF-8.
fn text(r: &MySqlRow, i: usize) -> String {
    let b: Vec<u8> = r.try_get_unchecked(i).unwrap_or_default();
    String::from_utf8(b).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

fn opt_text(r: &MySqlRow, i: usize) -> Option<String> {
    let b: Option<Vec<u8>> = r.try_get_unchecked(i).ok().flatten();
    b.map(|b| {
        String::from_utf8(b).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
    })
}

fn job_row(r: &MySqlRow) -> JobRow {
    JobRow {
        seq: r.get(0),
        org: text(r, 1),
        id: text(r, 2),
        typ: text(r, 3),
        payload: text(r, 4),
        state: text(r, 5),
        attempts: r.get(6),
        max_attempts: r.get(7),
        last_error: opt_text(r, 8),
        result: opt_text(r, 9),
        created_at: r.get(10),
        updated_at: r.get(11),
        run_at: r.get(12),
        finished_at: r.get(13),
    }
}

/// An enqueue's INSERT carries at most this many bytes of rows (fewer when the server's
/// `max_allowed_packet` is smaller): more parts cost a round trip each, bigger ones memory.
const ENQUEUE_PART_BYTES: usize = 256 << 10;

/// Split `n` rows into statements: at most `MAX_PARAMS` placeholders and `budget` bytes each.
/// A row bigger than the budget gets a statement of its own.
fn plan(
    n: usize,
    params_per_row: usize,
    budget: usize,
    bytes: impl Fn(usize) -> usize,
) -> Vec<Range<usize>> {
    let max_rows = (MAX_PARAMS / params_per_row.max(1)).max(1);
    let mut out = vec![];
    let (mut start, mut size) = (0, 0);
    for i in 0..n {
        let b = bytes(i) + params_per_row * PARAM_OVERHEAD + 16;
        if i > start && (i - start >= max_rows || size + b > budget) {
            out.push(start..i);
            start = i;
            size = 0;
        }
        size += b;
    }
    if start < n {
        out.push(start..n);
    }
    out
}

/// The server's version text is MySQL >= 8.0.1 or MariaDB >= 10.6.
fn check_version(v: &str) -> Result<()> {
    let nums: Vec<u32> = v
        .split(|c: char| !c.is_ascii_digit())
        .take(3)
        .map(|p| p.parse().unwrap_or(0))
        .collect();
    let ver = (
        nums.first().copied().unwrap_or(0),
        nums.get(1).copied().unwrap_or(0),
        nums.get(2).copied().unwrap_or(0),
    );
    let (ok, need) = if v.to_ascii_lowercase().contains("mariadb") {
        (ver >= (10, 6, 0), "MariaDB 10.6")
    } else {
        (ver >= (8, 0, 1), "MySQL 8.0.1")
    };
    if ok {
        Ok(())
    } else {
        Err(Error::UnsupportedStore(format!(
            "this server is version {v}; gnl needs {need} or newer (for SELECT … FOR UPDATE SKIP LOCKED)"
        )))
    }
}

type Tx = Transaction<'static, MySql>;

pub struct MysqlStore {
    pool: MySqlPool,
    queries: AtomicU64,
    /// Bytes a statement's arguments may take: half the server's `max_allowed_packet`.
    budget: usize,
    max_packet: usize,
    /// False once the server refused locking clauses inside UNION ALL (claims then read one
    /// lane per statement).
    union_locks: AtomicBool,
    /// When this store last looked for expired leases (ms since `started`; 0: never).
    last_reclaim: AtomicU64,
    started: std::time::Instant,
}

impl MysqlStore {
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self> {
        let opts = MySqlConnectOptions::from_str(url)
            .map_err(|e| Error::invalid(format!("bad MySQL URL: {e}")))?
            .timezone(Some(String::from("+00:00")))
            .statement_cache_capacity(STATEMENT_CACHE);
        let pool = MySqlPoolOptions::new()
            .max_connections(max_connections.max(1))
            .min_connections(0)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            // A connection used within the last second is alive (sqlx pings it on release);
            // only one that idled longer is pinged before use, which spares a round trip
            // per call on a busy pool and still drops connections a server restart broke.
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if meta.idle_for > Duration::from_secs(1) {
                        sqlx::Connection::ping(conn).await?;
                    }
                    Ok(true)
                })
            })
            .idle_timeout(Some(Duration::from_secs(300)))
            .max_lifetime(Some(Duration::from_secs(1800)))
            .after_connect(|conn, _| {
                Box::pin(async move {
                    conn.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                        .await?;
                    Ok(())
                })
            })
            .connect_with(opts.clone())
            .await;
        let pool = match pool {
            Ok(p) => p,
            Err(e) => return Err(super::pool_error(&opts, e).await),
        };
        let row = sqlx::query("SELECT VERSION(), DATABASE(), CAST(@@max_allowed_packet AS SIGNED)")
            .fetch_one(&pool)
            .await?;
        let version = text(&row, 0);
        let db = opt_text(&row, 1);
        let max_packet: i64 = row.get(2);
        if let Err(e) = check_version(&version) {
            pool.close().await;
            return Err(e);
        }
        if db.is_none() {
            pool.close().await;
            return Err(Error::invalid(
                "the MySQL URL names no database: use mysql://user:password@host:3306/dbname",
            ));
        }
        let max_packet = (max_packet.max(1 << 20)) as usize;
        Ok(MysqlStore {
            pool,
            queries: AtomicU64::new(1),
            budget: max_packet / 2,
            max_packet,
            union_locks: AtomicBool::new(true),
            last_reclaim: AtomicU64::new(0),
            started: std::time::Instant::now(),
        })
    }

    fn counted(&self, n: u64) {
        self.queries.fetch_add(n, Ordering::Relaxed);
    }

    async fn begin(&self) -> Result<Tx> {
        self.counted(1);
        Ok(self.pool.begin().await?)
    }

    async fn commit(&self, tx: Tx) -> Result<()> {
        self.counted(1);
        tx.commit().await?;
        Ok(())
    }

    async fn rollback(&self, tx: Tx) -> Result<()> {
        self.counted(1);
        tx.rollback().await?;
        Ok(())
    }

    /// The most bytes one value may have: it must fit one packet with its statement.
    fn check_size(&self, what: &str, len: usize) -> Result<()> {
        if len + 4096 > self.max_packet {
            return Err(Error::invalid(format!(
                "{what} is {len} bytes, more than this MySQL server accepts in one packet \
                 (max_allowed_packet = {}); raise max_allowed_packet or keep large data elsewhere",
                self.max_packet
            )));
        }
        Ok(())
    }

    /// Write outcomes (conditional on seq, token and state running); the seqs of failed
    /// attempts go to `back` (their lanes may need lowering).
    async fn write_outcomes(
        &self,
        tx: &mut MySqlConnection,
        outcomes: &[Outcome],
        back: &mut Vec<i64>,
    ) -> Result<()> {
        let mut done: Vec<(i64, i64, Option<&str>)> = vec![];
        let mut failed: Vec<(i64, i64, String, i64)> = vec![];
        for o in outcomes {
            match o {
                Outcome::Done {
                    seq, token, result, ..
                } => {
                    let too_big = result
                        .as_deref()
                        .is_some_and(|r| self.check_size("the result", r.len()).is_err());
                    if too_big {
                        // It cannot be stored: the attempt fails (it would fail every time).
                        let len = result.as_deref().map_or(0, str::len);
                        failed.push((
                            *seq,
                            *token,
                            format!(
                                "the handler's result is {len} bytes, more than this MySQL server \
                                 accepts in one packet (max_allowed_packet = {}); it was not stored",
                                self.max_packet
                            ),
                            0,
                        ));
                    } else {
                        done.push((*seq, *token, result.as_deref()));
                    }
                }
                Outcome::Failed {
                    seq,
                    token,
                    error,
                    delay_ms,
                    ..
                } => {
                    let mut e = error.clone();
                    let cap = self.budget.saturating_sub(1024).max(1024);
                    if e.len() > cap {
                        let mut cut = cap;
                        while !e.is_char_boundary(cut) {
                            cut -= 1;
                        }
                        e.truncate(cut);
                    }
                    failed.push((*seq, *token, e, (*delay_ms).max(0)));
                }
            }
        }
        for r in plan(done.len(), 3, self.budget, |i| {
            done[i].2.map_or(0, str::len)
        }) {
            let rows = &done[r];
            let mut q = Sql::new("UPDATE (");
            q.rows = rows.len();
            for (i, (seq, tok, res)) in rows.iter().enumerate() {
                q.s(if i == 0 {
                    "SELECT CAST(? AS SIGNED) AS seq, CAST(? AS SIGNED) AS tok, CAST(? AS CHAR CHARACTER SET utf8mb4) AS res"
                } else {
                    " UNION ALL SELECT CAST(? AS SIGNED), CAST(? AS SIGNED), CAST(? AS CHAR CHARACTER SET utf8mb4)"
                });
                q.bind(*seq)?.bind(*tok)?.bind(*res)?;
            }
            q.s(concat!(
                ") o STRAIGHT_JOIN gnl_jobs g FORCE INDEX (PRIMARY) ON g.seq = o.seq \
                 SET g.result = o.res, g.finished_at = ",
                now_ms!(),
                ", g.updated_at = ",
                now_ms!(),
                ", g.lease_expires_at = NULL, g.lease_owner = NULL, \
                 g.state = IF(g.cancel_requested <> 0, 'canceled', 'done') \
                 WHERE g.lease_token = o.tok AND g.state = 'running'"
            ));
            self.counted(1);
            q.execute(&mut *tx).await?;
        }
        for r in plan(failed.len(), 4, self.budget, |i| failed[i].2.len()) {
            let rows = &failed[r];
            let mut q = Sql::new("UPDATE (");
            q.rows = rows.len();
            for (i, (seq, tok, err, delay)) in rows.iter().enumerate() {
                q.s(if i == 0 {
                    "SELECT CAST(? AS SIGNED) AS seq, CAST(? AS SIGNED) AS tok, \
                     CAST(? AS CHAR CHARACTER SET utf8mb4) AS err, CAST(? AS SIGNED) AS delay_ms"
                } else {
                    " UNION ALL SELECT CAST(? AS SIGNED), CAST(? AS SIGNED), \
                     CAST(? AS CHAR CHARACTER SET utf8mb4), CAST(? AS SIGNED)"
                });
                q.bind(*seq)?.bind(*tok)?.bind(err.as_str())?.bind(*delay)?;
                back.push(*seq);
            }
            q.s(concat!(
                ") o STRAIGHT_JOIN gnl_jobs g FORCE INDEX (PRIMARY) ON g.seq = o.seq SET \
                 g.run_at = IF(g.cancel_requested = 0 AND g.attempts < g.max_attempts, ",
                now_ms!(),
                " + o.delay_ms, g.run_at), \
                 g.finished_at = IF(g.cancel_requested = 0 AND g.attempts < g.max_attempts, NULL, ",
                now_ms!(),
                "), g.last_error = IF(g.cancel_requested <> 0, COALESCE(g.last_error, o.err), o.err), \
                 g.updated_at = ",
                now_ms!(),
                ", g.lease_expires_at = NULL, g.lease_owner = NULL, \
                 g.state = CASE WHEN g.cancel_requested <> 0 THEN 'canceled' \
                                WHEN g.attempts >= g.max_attempts THEN 'dead' ELSE 'pending' END \
                 WHERE g.lease_token = o.tok AND g.state = 'running'"
            ));
            self.counted(1);
            q.execute(&mut *tx).await?;
        }
        Ok(())
    }

    /// Expired leases: the holder stopped renewing. The attempt stays counted; the job is
    /// pending again (due at once), or dead once its attempts are used up. Rows another
    /// transaction holds (an outcome being written) are skipped.
    async fn reclaim(&self, tx: &mut MySqlConnection, back: &mut Vec<i64>) -> Result<()> {
        self.counted(1);
        let seqs: Vec<i64> = sqlx::query_scalar(RECLAIM_PICK).fetch_all(&mut *tx).await?;
        for r in plan(seqs.len(), 1, self.budget, |_| 8) {
            let part = &seqs[r];
            let mut q = Sql::new(concat!(
                "UPDATE gnl_jobs FORCE INDEX (PRIMARY) SET \
                 last_error = CONCAT('lease expired: the worker ', COALESCE(lease_owner, '?'), \
                   ' stopped renewing attempt ', attempts, ' (crashed, stopped or cut off)'), \
                 finished_at = IF(cancel_requested = 0 AND attempts < max_attempts, NULL, ",
                now_ms!(),
                "), state = CASE WHEN cancel_requested <> 0 THEN 'canceled' \
                   WHEN attempts >= max_attempts THEN 'dead' ELSE 'pending' END, \
                 lease_expires_at = NULL, lease_owner = NULL, updated_at = ",
                now_ms!(),
                " WHERE state = 'running' AND seq IN ("
            ));
            q.rows = part.len();
            for (i, s) in part.iter().enumerate() {
                q.s(if i == 0 { "?" } else { ",?" });
                q.bind(*s)?;
            }
            q.s(")");
            self.counted(1);
            q.execute(&mut *tx).await?;
        }
        back.extend(seqs);
        Ok(())
    }

    /// Lower the lanes of the jobs in `seqs` that are pending (lanes in org order). The jobs
    /// are read with a plain SELECT: MySQL's INSERT … SELECT and UPDATE … (SELECT) lock the rows
    /// they read, and a claimer must never wait on a row another transaction holds.
    async fn lanes_due(&self, tx: &mut MySqlConnection, seqs: &[i64]) -> Result<()> {
        let mut lanes: BTreeMap<Vec<u8>, i64> = BTreeMap::new();
        for r in plan(seqs.len(), 1, self.budget, |_| 8) {
            let part = &seqs[r];
            let mut q = Sql::new(
                "SELECT org, MIN(run_at) FROM gnl_jobs FORCE INDEX (PRIMARY) \
                 WHERE state = 'pending' AND seq IN (",
            );
            q.rows = part.len();
            for (i, s) in part.iter().enumerate() {
                q.s(if i == 0 { "?" } else { ",?" });
                q.bind(*s)?;
            }
            q.s(") GROUP BY org");
            self.counted(1);
            for row in q.fetch_all(&mut *tx).await? {
                let org: Vec<u8> = row.try_get_unchecked(0)?;
                let run_at: i64 = row.get(1);
                let e = lanes.entry(org).or_insert(run_at);
                *e = (*e).min(run_at);
            }
        }
        let lanes: Vec<(Vec<u8>, i64)> = lanes.into_iter().collect();
        self.lower_lanes(tx, &lanes).await
    }

    /// Lower (or create) lanes' `next_run_at` bounds, in org order.
    async fn lower_lanes(&self, tx: &mut MySqlConnection, lanes: &[(Vec<u8>, i64)]) -> Result<()> {
        for r in plan(lanes.len(), 2, self.budget, |i| lanes[i].0.len() + 8) {
            let mut q = Sql::new("INSERT INTO gnl_lanes (org, next_run_at, served_at) VALUES ");
            q.rows = r.len();
            for (k, i) in r.enumerate() {
                q.s(if k == 0 { "(?,?,0)" } else { ",(?,?,0)" });
                q.bind(lanes[i].0.as_slice())?.bind(lanes[i].1)?;
            }
            q.s(LANE_LOWER);
            self.counted(1);
            q.execute(&mut *tx).await?;
        }
        Ok(())
    }

    /// Each lane's oldest due jobs, locked: one statement (UNION ALL), or one per lane on a
    /// server that refuses locking clauses inside a union.
    async fn pick_jobs(
        &self,
        tx: &mut MySqlConnection,
        lanes: &[(Vec<u8>, i64)],
    ) -> Result<Vec<MySqlRow>> {
        if lanes.len() > 1 && self.union_locks.load(Ordering::Relaxed) {
            let mut q = Sql::new("");
            q.rows = lanes.len();
            for (i, (org, share)) in lanes.iter().enumerate() {
                if i > 0 {
                    q.s(" UNION ALL ");
                }
                q.s("(").s(CLAIM_JOBS_PART).s(")");
                q.bind(org.as_slice())?.bind(*share)?;
            }
            self.counted(1);
            match q.fetch_all(&mut *tx).await {
                Ok(rows) => return Ok(rows),
                Err(sqlx::Error::Database(db)) if is_syntax_error(db.as_ref()) => {
                    log::warn!(
                        "gnl: this MySQL server refuses FOR UPDATE inside UNION ALL ({}); \
                         claims read one lane per statement",
                        db.message()
                    );
                    self.union_locks.store(false, Ordering::Relaxed);
                }
                Err(e) => return Err(e.into()),
            }
        }
        let mut rows = vec![];
        for (org, share) in lanes {
            self.counted(1);
            rows.extend(
                sqlx::query(CLAIM_JOBS_PART)
                    .bind(org.as_slice())
                    .bind(*share)
                    .fetch_all(&mut *tx)
                    .await?,
            );
        }
        Ok(rows)
    }
}

fn is_syntax_error(db: &dyn sqlx::error::DatabaseError) -> bool {
    db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
        .is_some_and(|e| matches!(e.number(), 1064 | 1221 | 1235 | 3729))
}

#[async_trait]
impl Store for MysqlStore {
    fn backend(&self) -> &'static str {
        "mysql"
    }

    fn query_count(&self) -> u64 {
        self.queries.load(Ordering::Relaxed)
    }

    async fn now_ms(&self) -> Result<i64> {
        self.counted(1);
        Ok(sqlx::query_scalar(concat!("SELECT ", now_ms!()))
            .fetch_one(&self.pool)
            .await?)
    }

    async fn schema_version(&self) -> Result<Option<i64>> {
        self.counted(1);
        let has: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM information_schema.tables \
             WHERE table_schema = DATABASE() AND table_name = 'gnl_schema'",
        )
        .fetch_one(&self.pool)
        .await?;
        if has == 0 {
            return Ok(None);
        }
        self.counted(1);
        // No row yet: a first migration is finishing (MySQL DDL is not transactional), which
        // is an empty store to the caller (`open` then migrates, and waits for that one).
        Ok(
            sqlx::query_scalar("SELECT version FROM gnl_schema WHERE id = 1")
                .fetch_optional(&self.pool)
                .await?,
        )
    }

    async fn migrate(&self) -> Result<()> {
        // MySQL DDL commits as it goes: a named lock (per database) keeps two migrators apart.
        let mut conn = self.pool.acquire().await?;
        self.counted(1);
        let got: Option<i64> =
            sqlx::query_scalar("SELECT GET_LOCK(CONCAT('gnl_migrate:', LEFT(DATABASE(), 48)), 30)")
                .fetch_one(&mut *conn)
                .await?;
        if got != Some(1) {
            return Err(Error::StoreUnavailable {
                reason: "another process has been migrating this database's gnl schema for 30 s"
                    .into(),
                code: None,
            });
        }
        let r = async {
            // gnl_schema appears only once migration 1 is complete (DDL is not transactional
            // here): a concurrent `open` sees an empty store, not a half-built one.
            self.counted(1);
            let has: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM information_schema.tables \
                 WHERE table_schema = DATABASE() AND table_name = 'gnl_schema'",
            )
            .fetch_one(&mut *conn)
            .await?;
            let current: i64 = if has == 0 {
                0
            } else {
                self.counted(1);
                sqlx::query_scalar(
                    "SELECT CAST(COALESCE(MAX(version), 0) AS SIGNED) FROM gnl_schema",
                )
                .fetch_one(&mut *conn)
                .await?
            };
            for m in MIGRATOR
                .iter()
                .filter(|m| m.version > current && !m.migration_type.is_down_migration())
            {
                self.counted(1);
                conn.execute(&*m.sql).await?;
                self.counted(2);
                conn.execute(
                    "CREATE TABLE IF NOT EXISTS gnl_schema \
                     (id INT NOT NULL PRIMARY KEY, version BIGINT NOT NULL) ENGINE=InnoDB",
                )
                .await?;
                sqlx::query(
                    "INSERT INTO gnl_schema (id, version) VALUES (1, ?) \
                     ON DUPLICATE KEY UPDATE version = VALUES(version)",
                )
                .bind(m.version)
                .execute(&mut *conn)
                .await?;
            }
            Ok::<(), Error>(())
        }
        .await;
        self.counted(1);
        let released = sqlx::query("DO RELEASE_LOCK(CONCAT('gnl_migrate:', LEFT(DATABASE(), 48)))")
            .execute(&mut *conn)
            .await;
        if released.is_err() {
            // The lock ends with the session: drop this connection rather than pool it.
            let _ = conn.detach().close().await;
        }
        r
    }

    async fn close(&self) {
        self.pool.close().await;
    }
}

#[async_trait]
impl QueueStore for MysqlStore {
    async fn enqueue_batch(&self, jobs: &JobBatch) -> Result<()> {
        if jobs.is_empty() {
            return Ok(());
        }
        for (i, j) in jobs.iter().enumerate() {
            let len = jobs.text_len(i);
            if len + 4096 > self.max_packet {
                self.check_size(&format!("job {:?}", j.id), len)?;
            }
        }
        let mut tx = self.begin().await?;
        self.counted(1);
        let now: i64 = sqlx::query_scalar(concat!("SELECT ", now_ms!()))
            .fetch_one(&mut *tx)
            .await?;
        let summary = jobs.lanes();
        let row_tail = format!(",'pending',{now},{now})");
        // Parts of at most ENQUEUE_PART_BYTES: a part's statement and its encoded copy are
        // what the call holds besides the batch.
        let budget = self.budget.min(ENQUEUE_PART_BYTES);
        for r in plan(jobs.len(), 5, budget, |i| jobs.text_len(i) + 8) {
            let mut q = Sql::new(
                "INSERT INTO gnl_jobs (org, id, type, payload, run_at, state, created_at, updated_at) VALUES ",
            );
            q.rows = r.len();
            for i in r {
                let j = jobs.get(i);
                q.s(if q.text.ends_with(' ') {
                    "(?,?,?,?,?"
                } else {
                    ",(?,?,?,?,?"
                })
                .s(&row_tail);
                q.bind(j.org.as_bytes())?
                    .bind(j.id.as_bytes())?
                    .bind(j.typ.as_bytes())?
                    .bind(j.payload)?
                    .bind(j.due.at(now))?;
            }
            // Only the duplicate key is ignored (INSERT IGNORE would swallow other errors).
            q.s(" ON DUPLICATE KEY UPDATE seq = seq");
            self.counted(1);
            q.execute(&mut *tx).await?;
        }
        // Each organization's turn is taken once per call; lanes in org order.
        let lanes: Vec<(Vec<u8>, i64)> = summary
            .iter()
            .map(|(o, l)| (o.as_bytes().to_vec(), l.earliest(now)))
            .collect();
        self.lower_lanes(&mut tx, &lanes).await?;
        // The depth check runs after the lanes above are written (and so locked): an enqueue
        // into the same organization waits for this transaction, and this read sees every one
        // that committed before it, so the check is exact.
        let limits: BTreeMap<&str, i64> = summary
            .iter()
            .filter_map(|(o, l)| l.max_depth.map(|m| (*o, m)))
            .collect();
        if !limits.is_empty() {
            let orgs: Vec<&str> = limits.keys().copied().collect();
            let mut depths: BTreeMap<String, i64> = BTreeMap::new();
            for r in plan(orgs.len(), 1, self.budget, |i| orgs[i].len()) {
                let mut q = Sql::new(
                    "SELECT org, COUNT(*) FROM gnl_jobs FORCE INDEX (gnl_jobs_due) \
                     WHERE state = 'pending' AND org IN (",
                );
                q.rows = r.len();
                for (k, i) in r.enumerate() {
                    q.s(if k == 0 { "?" } else { ",?" });
                    q.bind(orgs[i].as_bytes())?;
                }
                q.s(") GROUP BY org");
                self.counted(1);
                for row in q.fetch_all(&mut *tx).await? {
                    depths.insert(text(&row, 0), row.get(1));
                }
            }
            for (org, max_depth) in &limits {
                let depth = depths.get(*org).copied().unwrap_or(0);
                if depth > *max_depth {
                    self.rollback(tx).await?;
                    return Err(Error::QueueFull {
                        org: if org.is_empty() {
                            None
                        } else {
                            Some(org.to_string())
                        },
                        depth,
                        max_depth: *max_depth,
                    });
                }
            }
        }
        self.commit(tx).await
    }

    async fn claim(&self, finished: &[Outcome], req: &ClaimRequest) -> Result<Vec<ClaimedJob>> {
        // A claim that carries outcomes (no probe) looks for expired leases at most every
        // RECLAIM_EVERY (a stale lease waits that much longer; a busy worker saves a statement
        // per claim). The interval is measured on this process's monotonic clock; lease
        // decisions themselves use the server's.
        let since_start = (self.started.elapsed().as_millis() as u64).max(1);
        let last = self.last_reclaim.load(Ordering::Relaxed);
        let mut reclaim = last == 0 || since_start.saturating_sub(last) >= RECLAIM_EVERY_MS;
        if finished.is_empty() && req.probe {
            // The empty poll: one read, whatever the number of lanes (both are index seeks).
            self.counted(1);
            let (due, expired): (i64, i64) = sqlx::query_as(PRECHECK).fetch_one(&self.pool).await?;
            if due == 0 && expired == 0 {
                return Ok(vec![]);
            }
            reclaim = expired != 0;
        }
        let mut tx = self.begin().await?;
        let mut back = vec![];
        self.write_outcomes(&mut tx, finished, &mut back).await?;
        if reclaim {
            self.last_reclaim.store(since_start, Ordering::Relaxed);
            self.reclaim(&mut tx, &mut back).await?;
        }
        back.sort_unstable();
        back.dedup();
        self.lanes_due(&mut tx, &back).await?;
        let mut out = Vec::new();
        // At most MAX_CLAIM jobs a call: every statement below then stays under the
        // placeholder limit (four per lane).
        let limit = req.limit.min(MAX_CLAIM);
        if limit > 0 {
            self.counted(1);
            let lanes: Vec<Vec<u8>> = sqlx::query_scalar(CLAIM_LANES)
                .bind(limit as i64)
                .fetch_all(&mut *tx)
                .await?;
            if !lanes.is_empty() {
                // Lanes in turn: each gets an equal share of the batch, the first ones the rest.
                let n = lanes.len();
                let shared: Vec<(Vec<u8>, i64)> = lanes
                    .into_iter()
                    .enumerate()
                    .map(|(i, o)| (o, (limit / n + usize::from(i < limit % n)) as i64))
                    .collect();
                let turn: BTreeMap<Vec<u8>, usize> = shared
                    .iter()
                    .enumerate()
                    .map(|(i, (o, _))| (o.clone(), i))
                    .collect();
                let rows = self.pick_jobs(&mut tx, &shared).await?;
                let mut picked: Vec<(usize, ClaimedJob)> = rows
                    .iter()
                    .map(|r| {
                        let org_b: Vec<u8> = r.try_get_unchecked(2).unwrap_or_default();
                        let lane = turn.get(&org_b).copied().unwrap_or(usize::MAX);
                        (
                            lane,
                            ClaimedJob {
                                seq: r.get(0),
                                // Read under the row lock: the update below adds one to each.
                                token: r.get::<i64, _>(1) + 1,
                                org: text(r, 2),
                                id: text(r, 3),
                                typ: text(r, 4),
                                payload: text(r, 5),
                                attempt: r.get::<i64, _>(6) + 1,
                                run_at: r.get(7),
                            },
                        )
                    })
                    .collect();
                picked.sort_by_key(|(lane, j)| (*lane, j.run_at, j.seq));
                let served: Vec<bool> = {
                    let mut s = vec![false; n];
                    for (lane, _) in &picked {
                        if let Some(x) = s.get_mut(*lane) {
                            *x = true;
                        }
                    }
                    s
                };
                if !picked.is_empty() {
                    let mut q = Sql::new(concat!(
                        "UPDATE gnl_jobs FORCE INDEX (PRIMARY) SET state = 'running', attempts = attempts + 1, \
                         max_attempts = ?, lease_token = lease_token + 1, lease_expires_at = ",
                        now_ms!(),
                        " + ?, lease_owner = ?, updated_at = ",
                        now_ms!(),
                        " WHERE seq IN ("
                    ));
                    q.rows = picked.len();
                    q.bind(req.max_attempts)?
                        .bind(req.ttl_ms)?
                        .bind(req.owner.as_str())?;
                    for (k, (_, j)) in picked.iter().enumerate() {
                        q.s(if k == 0 { "?" } else { ",?" });
                        q.bind(j.seq)?;
                    }
                    q.s(")");
                    self.counted(1);
                    q.execute(&mut *tx).await?;
                }
                // Each lane's new lower bound, and the base of this claim's turn tickets: a
                // plain (non-locking) read after the claim, which sees every job committed
                // before it; a job committed later lowers its lane's bound itself, after this
                // transaction (it waits for the lane row). Tickets strictly increase (claims
                // within one millisecond do not tie) and stay near the store's clock (in
                // 1/4096 ms), so a new lane's ticket 0 sorts first.
                let mut q = Sql::new(concat!(
                    "SELECT x.org, (SELECT j.run_at FROM gnl_jobs j FORCE INDEX (gnl_jobs_due) \
                     WHERE j.org = x.org AND j.state = 'pending' ORDER BY j.run_at LIMIT 1), \
                     CAST(GREATEST(",
                    now_ms!(),
                    " * 4096, COALESCE((SELECT MAX(served_at) FROM gnl_lanes), 0) + 1) AS SIGNED) \
                     FROM ("
                ));
                q.rows = n;
                for (i, (org, _)) in shared.iter().enumerate() {
                    q.s(if i == 0 {
                        "SELECT CAST(? AS BINARY) AS org"
                    } else {
                        " UNION ALL SELECT CAST(? AS BINARY)"
                    });
                    q.bind(org.as_slice())?;
                }
                q.s(") x");
                self.counted(1);
                let mut base = 0i64;
                let next: BTreeMap<Vec<u8>, Option<i64>> = q
                    .fetch_all(&mut *tx)
                    .await?
                    .iter()
                    .map(|r| {
                        base = r.get(2);
                        let org: Vec<u8> = r.try_get_unchecked(0).unwrap_or_default();
                        (org, r.get::<Option<i64>, _>(1))
                    })
                    .collect();
                // Then the served lanes' tickets, in the order they were served, and every
                // looked-at lane's bound.
                let mut q = Sql::new("UPDATE (");
                q.rows = n;
                let mut rank = 0i64;
                for (i, (org, _)) in shared.iter().enumerate() {
                    q.s(if i == 0 {
                        "SELECT CAST(? AS BINARY) AS org, CAST(? AS SIGNED) AS ticket, \
                         CAST(? AS SIGNED) AS next_run_at"
                    } else {
                        " UNION ALL SELECT CAST(? AS BINARY), CAST(? AS SIGNED), CAST(? AS SIGNED)"
                    });
                    let ticket = served[i].then(|| {
                        rank += 1;
                        base + rank - 1
                    });
                    q.bind(org.as_slice())?
                        .bind(ticket)?
                        .bind(next.get(org).copied().flatten())?;
                }
                q.s(
                    ") x STRAIGHT_JOIN gnl_lanes l FORCE INDEX (PRIMARY) ON l.org = x.org SET \
                     l.served_at = COALESCE(x.ticket, l.served_at), l.next_run_at = x.next_run_at",
                );
                self.counted(1);
                q.execute(&mut *tx).await?;
                out = picked.into_iter().map(|(_, j)| j).collect();
            }
        }
        self.commit(tx).await?;
        Ok(out)
    }

    async fn finish(&self, outcomes: &[Outcome]) -> Result<()> {
        if outcomes.is_empty() {
            return Ok(());
        }
        let mut tx = self.begin().await?;
        let mut back = vec![];
        self.write_outcomes(&mut tx, outcomes, &mut back).await?;
        back.sort_unstable();
        back.dedup();
        self.lanes_due(&mut tx, &back).await?;
        self.commit(tx).await
    }

    async fn renew(&self, leases: &[LeaseRef], ttl_ms: i64) -> Result<Vec<RenewStatus>> {
        if leases.is_empty() {
            return Ok(vec![]);
        }
        let mut sorted: Vec<LeaseRef> = leases.to_vec();
        sorted.sort_by_key(|l| l.seq);
        let mut status: BTreeMap<i64, RenewStatus> = BTreeMap::new();
        for r in plan(sorted.len(), 2, self.budget, |_| 16) {
            let part = &sorted[r];
            let derived = |q: &mut Sql| -> Result<()> {
                for (i, l) in part.iter().enumerate() {
                    q.s(if i == 0 {
                        "SELECT CAST(? AS SIGNED) AS seq, CAST(? AS SIGNED) AS tok"
                    } else {
                        " UNION ALL SELECT CAST(? AS SIGNED), CAST(? AS SIGNED)"
                    });
                    q.bind(l.seq)?.bind(l.token)?;
                }
                Ok(())
            };
            // Extend, then read back which leases are ours (a lease is (seq, token, running):
            // a token only grows, so no lease becomes ours between the two statements).
            let mut q = Sql::new("UPDATE (");
            q.rows = part.len();
            derived(&mut q)?;
            q.s(concat!(
                ") l STRAIGHT_JOIN gnl_jobs g FORCE INDEX (PRIMARY) ON g.seq = l.seq \
                 SET g.lease_expires_at = ",
                now_ms!(),
                " + ? WHERE g.lease_token = l.tok AND g.state = 'running'"
            ));
            q.bind(ttl_ms)?;
            self.counted(1);
            q.execute(&self.pool).await?;
            let mut q = Sql::new("SELECT g.seq, g.cancel_requested FROM (");
            q.rows = part.len();
            derived(&mut q)?;
            q.s(
                ") l STRAIGHT_JOIN gnl_jobs g FORCE INDEX (PRIMARY) ON g.seq = l.seq \
                 WHERE g.lease_token = l.tok AND g.state = 'running'",
            );
            self.counted(1);
            for row in q.fetch_all(&self.pool).await? {
                let cancel: i64 = row.try_get_unchecked::<i8, _>(1).map(i64::from)?;
                status.insert(
                    row.get(0),
                    if cancel != 0 {
                        RenewStatus::CancelRequested
                    } else {
                        RenewStatus::Held
                    },
                );
            }
        }
        Ok(leases
            .iter()
            .map(|l| status.get(&l.seq).copied().unwrap_or(RenewStatus::Lost))
            .collect())
    }

    async fn get_job(&self, org: &str, id: &str) -> Result<Option<JobRow>> {
        self.counted(1);
        let row = sqlx::query(&format!(
            "SELECT {JOB_COLS} FROM gnl_jobs \
             WHERE org = ? AND id_key = UNHEX(SHA2(?, 256)) AND id = ?"
        ))
        .bind(org.as_bytes())
        .bind(id.as_bytes())
        .bind(id.as_bytes())
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.as_ref().map(job_row))
    }

    async fn has_due(&self) -> Result<bool> {
        self.counted(1);
        let due: i64 = sqlx::query_scalar(HAS_DUE).fetch_one(&self.pool).await?;
        Ok(due != 0)
    }

    async fn max_seq(&self) -> Result<i64> {
        self.counted(1);
        Ok(
            sqlx::query_scalar("SELECT CAST(COALESCE(MAX(seq), 0) AS SIGNED) FROM gnl_jobs")
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
                    "SELECT {JOB_COLS} FROM gnl_jobs FORCE INDEX (gnl_jobs_lane_seq) \
                     WHERE org = ? AND seq > ? AND seq <= ? \
                       AND (? IS NULL OR state = ?) AND (? IS NULL OR type = ?) \
                     ORDER BY seq LIMIT ?"
                ))
                .bind(org.as_bytes())
                .bind(after)
                .bind(q.snapshot)
                .bind(state.as_deref())
                .bind(state.as_deref())
                .bind(typ.as_deref().map(str::as_bytes))
                .bind(typ.as_deref().map(str::as_bytes))
                .bind(q.limit)
                .fetch_all(&self.pool)
                .await?
            }
            ListScope::All => {
                let (ao, aq) = q.after.clone().unwrap_or((String::new(), 0));
                sqlx::query(&format!(
                    "SELECT {JOB_COLS} FROM gnl_jobs FORCE INDEX (gnl_jobs_lane_seq) \
                     WHERE (org > ? OR (org = ? AND seq > ?)) AND seq <= ? \
                     ORDER BY org, seq LIMIT ?"
                ))
                .bind(ao.as_bytes())
                .bind(ao.as_bytes())
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
        let mut tx = self.begin().await?;
        self.counted(1);
        let n = sqlx::query(concat!(
            "UPDATE gnl_jobs SET state = 'pending', attempts = 0, run_at = ",
            now_ms!(),
            ", updated_at = ",
            now_ms!(),
            ", finished_at = NULL, cancel_requested = 0 \
             WHERE org = ? AND id_key = UNHEX(SHA2(?, 256)) AND id = ? AND state = 'dead'"
        ))
        .bind(org.as_bytes())
        .bind(id.as_bytes())
        .bind(id.as_bytes())
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if n > 0 {
            self.counted(1);
            sqlx::query(&format!(
                "INSERT INTO gnl_lanes (org, next_run_at, served_at) VALUES (?, {}, 0){LANE_LOWER}",
                now_ms!()
            ))
            .bind(org.as_bytes())
            .execute(&mut *tx)
            .await?;
        }
        self.commit(tx).await?;
        Ok(n > 0)
    }

    async fn cancel_job(&self, org: &str, id: &str, reason: Option<&str>) -> Result<bool> {
        let why = format!("canceled: {}", reason.unwrap_or("cancel_job was called"));
        self.counted(1);
        let n = sqlx::query(concat!(
            "UPDATE gnl_jobs SET \
               finished_at = IF(state = 'pending', ",
            now_ms!(),
            ", finished_at), \
               state = IF(state = 'pending', 'canceled', state), \
               cancel_requested = 1, last_error = ?, updated_at = ",
            now_ms!(),
            " WHERE org = ? AND id_key = UNHEX(SHA2(?, 256)) AND id = ? \
               AND state IN ('pending', 'running')"
        ))
        .bind(why.as_str())
        .bind(org.as_bytes())
        .bind(id.as_bytes())
        .bind(id.as_bytes())
        .execute(&self.pool)
        .await?
        .rows_affected();
        Ok(n > 0)
    }
}

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

#[cfg(test)]
mod tests {
    use sqlx::mysql::MySqlPoolOptions;
    use sqlx::Executor;

    use super::check_version;
    use crate::error::Error;
    use crate::store::open;
    use crate::store::suite::{self, mysql_url, with_db, with_store, Engine};

    /// A claim never waits for another transaction: not for an enqueue still open in the lane
    /// it serves, nor for a lane or an expired job row another transaction holds.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_claim_never_waits_on_open_transactions() {
        with_store(Engine::Mysql, |s, url| async move {
            // "expired": claimed with a 1 ms lease, then held by an open transaction.
            s.enqueue(&[suite::job("x", "expired")]).await.unwrap();
            let got = s.claim(&[], &suite::req(1, 1)).await.unwrap();
            assert_eq!(got[0].id, "expired");
            let expired = got[0].seq;
            let jobs: Vec<_> = (0..3).map(|i| suite::job("o", &format!("{i}"))).collect();
            s.enqueue(&jobs).await.unwrap();
            s.enqueue(&[suite::job("busy", "b")]).await.unwrap();
            let pool = MySqlPoolOptions::new()
                .max_connections(1)
                .connect(&url)
                .await
                .unwrap();
            let mut tx = pool.begin().await.unwrap();
            tx.execute(
                "INSERT INTO gnl_jobs (org, id, type, payload, run_at, state, created_at, updated_at) \
                 VALUES ('o', 'open', 't', '{}', 0, 'pending', 0, 0)",
            )
            .await
            .unwrap();
            tx.execute("SELECT org FROM gnl_lanes WHERE org = 'busy' FOR UPDATE")
                .await
                .unwrap();
            sqlx::query("SELECT seq FROM gnl_jobs WHERE seq = ? FOR UPDATE")
                .bind(expired)
                .execute(&mut *tx)
                .await
                .unwrap();
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            let ten = suite::req(10, 60_000);
            let claim = s.claim(&[], &ten);
            let got = tokio::time::timeout(std::time::Duration::from_secs(5), claim)
                .await
                .expect("the claim waited on another transaction")
                .unwrap();
            let mut ids: Vec<&str> = got.iter().map(|j| j.id.as_str()).collect();
            ids.sort();
            assert_eq!(ids, vec!["0", "1", "2"]);
            tx.commit().await.unwrap();
            pool.close().await;
            // The job committed meanwhile is claimable now (its lane bound was lowered).
            let got = s.claim(&[], &suite::req(10, 60_000)).await.unwrap();
            let ids: Vec<&str> = got.iter().map(|j| j.id.as_str()).collect();
            assert!(ids.contains(&"b"), "{ids:?}");
        })
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn long_unicode_ids_are_unique_keys() {
        // 1,000 four-byte characters: longer than an InnoDB key, kept unique by its hash.
        with_store(Engine::Mysql, |s, _url| async move {
            let a: String = "\u{1F600}".repeat(1_000);
            let b: String = format!("{}\u{1F601}", "\u{1F600}".repeat(999));
            s.enqueue(&[suite::job("", &a), suite::job("", &b), suite::job("", &a)])
                .await
                .unwrap();
            assert_eq!(s.max_seq().await.unwrap(), 2);
            assert_eq!(s.get_job("", &a).await.unwrap().unwrap().id, a);
            assert_eq!(s.get_job("", &b).await.unwrap().unwrap().id, b);
        })
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_payload_over_the_packet_limit_is_refused_before_writing() {
        with_store(Engine::Mysql, |s, _url| async move {
            let packet: i64 = {
                let n = s.now_ms().await.unwrap();
                assert!(n > 0);
                let pool = sqlx::MySqlPool::connect(&mysql_url()).await.unwrap();
                let p: i64 = sqlx::query_scalar("SELECT CAST(@@max_allowed_packet AS SIGNED)")
                    .fetch_one(&pool)
                    .await
                    .unwrap();
                pool.close().await;
                p
            };
            let mut big = suite::job("", "huge");
            big.payload = format!("\"{}\"", "x".repeat(packet as usize));
            let r = s.enqueue(&[suite::job("", "small"), big]).await;
            assert!(
                matches!(&r, Err(Error::InvalidArgument(m)) if m.contains("max_allowed_packet")),
                "{r:?}"
            );
            assert_eq!(s.max_seq().await.unwrap(), 0);
        })
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn claims_read_indexes_without_filesort() {
        with_store(Engine::Mysql, |s, url| async move {
            let jobs: Vec<_> = (0..3_000)
                .map(|i| suite::job(&format!("o{}", i % 300), &format!("{i}")))
                .collect();
            s.enqueue(&jobs).await.unwrap();
            let pool = sqlx::MySqlPool::connect(&url).await.unwrap();
            pool.execute("ANALYZE TABLE gnl_jobs, gnl_lanes")
                .await
                .unwrap();
            let explain = |sql: String| {
                let pool = pool.clone();
                async move {
                    let rows = sqlx::query(&format!("EXPLAIN {sql}"))
                        .fetch_all(&pool)
                        .await
                        .unwrap();
                    rows.iter()
                        .map(|r| {
                            (0..sqlx::Row::len(r))
                                .map(|i| super::opt_text(r, i).unwrap_or_default())
                                .collect::<Vec<_>>()
                                .join(" | ")
                        })
                        .collect::<Vec<_>>()
                        .join("\n")
                }
            };
            let pick = super::CLAIM_JOBS_PART
                .replacen("org = ?", "org = 'o7'", 1)
                .replacen("LIMIT ?", "LIMIT 5", 1);
            let plan = explain(pick).await;
            assert!(
                plan.contains("gnl_jobs_due") && !plan.contains("filesort"),
                "{plan}"
            );
            let lanes = super::CLAIM_LANES.replacen("LIMIT ?", "LIMIT 5", 1);
            let plan = explain(lanes).await;
            assert!(
                plan.contains("gnl_lanes_turn") && !plan.contains("filesort"),
                "{plan}"
            );
            let plan = explain(super::PRECHECK.to_string()).await;
            assert!(!plan.contains("ALL"), "{plan}");
            let plan = explain(super::HAS_DUE.to_string()).await;
            assert!(plan.contains("optimized away"), "{plan}");
            pool.close().await;
        })
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_migrations_agree() {
        suite::concurrent_migrations_agree(Engine::Mysql).await;
    }

    #[tokio::test]
    async fn an_unreachable_server_is_unavailable() {
        let r = open("mysql://root@127.0.0.1:1/test", 1, true)
            .await
            .map(|_| ());
        assert!(matches!(r, Err(Error::StoreUnavailable { .. })), "{r:?}");
    }

    #[tokio::test]
    async fn a_url_without_database_is_refused() {
        let base = mysql_url();
        let url = with_db(&base, "");
        if let Err(e) = MySqlPoolOptions::new()
            .max_connections(1)
            .connect(&base)
            .await
        {
            eprintln!("note: MySQL unreachable ({e}); test skipped");
            assert_ne!(std::env::var("CI").as_deref(), Ok("true"));
            return;
        }
        let r = open(&url, 1, true).await.map(|_| ());
        assert!(
            matches!(&r, Err(Error::InvalidArgument(m)) if m.contains("names no database")),
            "{r:?}"
        );
    }

    #[test]
    fn server_versions() {
        assert!(check_version("8.0.1").is_ok());
        assert!(check_version("8.4.2-commercial").is_ok());
        assert!(check_version("10.6.12-MariaDB-log").is_ok());
        assert!(check_version("10.11.19-MariaDB-0+deb12u1").is_ok());
        assert!(check_version("11.4.2-MariaDB").is_ok());
        let e = check_version("5.7.44-log").unwrap_err().to_string();
        assert!(e.contains("5.7.44") && e.contains("MySQL 8.0.1"), "{e}");
        let e = check_version("10.5.22-MariaDB").unwrap_err().to_string();
        assert!(e.contains("10.5.22") && e.contains("MariaDB 10.6"), "{e}");
        assert!(matches!(
            check_version("8.0.0-dmr"),
            Err(Error::UnsupportedStore(_))
        ));
    }

    #[test]
    fn database_urls() {
        assert_eq!(
            with_db("mysql://root@127.0.0.1:3306/test", "x"),
            "mysql://root@127.0.0.1:3306/x"
        );
        assert_eq!(
            with_db("mysql://root:pw@h/test?ssl-mode=disabled", "x"),
            "mysql://root:pw@h/x?ssl-mode=disabled"
        );
        assert_eq!(with_db("mysql://h", "x"), "mysql://h/x");
    }

    #[test]
    fn statements_are_sized_by_bytes_and_placeholders() {
        let p = super::plan(10, 5, 1_000, |_| 300);
        assert!(p.iter().all(|r| r.len() <= 2), "{p:?}");
        assert_eq!(p.iter().map(|r| r.len()).sum::<usize>(), 10);
        let p = super::plan(100_000, 5, usize::MAX, |_| 10);
        assert!(p.iter().all(|r| r.len() * 5 <= 65_000));
        assert_eq!(p.iter().map(|r| r.len()).sum::<usize>(), 100_000);
        let p = super::plan(3, 1, 10, |_| 1_000);
        assert_eq!(
            p.len(),
            3,
            "a row over the budget gets a statement of its own"
        );
        assert!(super::plan(0, 3, 10, |_| 1).is_empty());
    }
}
