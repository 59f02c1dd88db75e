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
//!
//! Here: the connection (pool, READ COMMITTED sessions, server version and packet size), the
//! migrations, the store's clock in SQL (`now_ms!`), the statement builder and the text, size
//! and error helpers the subsystems share, and the base `Store`; the queue's SQL is in
//! `queue.rs`, the journal's in `journal.rs`.

use std::ops::Range;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use sqlx::migrate::Migrator;
use sqlx::mysql::{
    MySql, MySqlArguments, MySqlConnectOptions, MySqlPool, MySqlPoolOptions, MySqlRow,
};
use sqlx::{Arguments, Connection, Encode, Executor, Row, Transaction, Type};

use super::queue::ReclaimThrottle;
use super::Store;
use crate::error::{Error, Result};

/// The MySQL migrations, embedded. Applied by `migrate`, recorded in `gnl_schema`.
pub static MIGRATOR: Migrator = sqlx::migrate!("rust/migrations/mysql");

/// The store's clock in SQL: epoch ms, on the server (sessions run in UTC).
macro_rules! now_ms {
    () => {
        "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)"
    };
}

mod events;
mod journal;
mod queue;
#[cfg(test)]
mod tests;
mod triggers;

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

/// Statements with more rows than this are prepared for one use only.
const CACHED_ROWS: usize = 16;

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
    /// The journal's step writes (`super::held`).
    held: super::held::Held<MySql>,
    /// The worker's claims (`claim_on`): two held connections, one a claim in flight (a
    /// worker keeps at most two), so a claim pays no acquire and no ping on release
    /// (`super::held`; DECISIONS "A worker's claims go on two held connections too").
    claims: [super::held::Held<MySql>; 2],
    queries: AtomicU64,
    /// Bytes a statement's arguments may take: half the server's `max_allowed_packet`.
    budget: usize,
    max_packet: usize,
    /// False once the server refused locking clauses inside UNION ALL (claims then read one
    /// lane per statement).
    union_locks: AtomicBool,
    /// When this store last looked for expired leases (monotonic).
    reclaims: ReclaimThrottle,
    /// This process's wake-ups (MySQL has no watcher: other processes' changes are polled).
    wake: std::sync::Arc<super::Wakeups>,
    /// The server is MariaDB (its statement timeout is spelled differently: `bounded`).
    mariadb: bool,
    read_timeout: super::ReadTimeout,
}

impl MysqlStore {
    /// A connection holding the migrators' named lock (per database; waits up to 30 s).
    async fn migrate_lock(&self) -> Result<sqlx::pool::PoolConnection<sqlx::MySql>> {
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
        Ok(conn)
    }

    pub async fn connect(url: &str, max_connections: u32) -> Result<Self> {
        let opts = MySqlConnectOptions::from_str(url)
            .map_err(|e| Error::invalid(format!("bad MySQL URL: {}", super::url::reason(&e))))?
            .timezone(Some(String::from("+00:00")))
            .statement_cache_capacity(STATEMENT_CACHE);
        if opts.get_database().is_none_or(str::is_empty) {
            // No database selected: every statement would fail (DECISIONS "Store URLs").
            return Err(Error::invalid(format!(
                "store URL {:?} names no database: give one, mysql://USER@HOST:PORT/DATABASE",
                super::url::redact(url)
            )));
        }
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
            Err(e) => {
                return Err(super::pool_error(
                    &opts,
                    &super::url::server(opts.get_socket(), opts.get_host(), opts.get_port()),
                    e,
                )
                .await)
            }
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
            held: super::held::Held::new(),
            claims: [super::held::Held::new(), super::held::Held::new()],
            queries: AtomicU64::new(1),
            budget: max_packet / 2,
            max_packet,
            union_locks: AtomicBool::new(true),
            reclaims: ReclaimThrottle::new(),
            wake: super::Wakeups::new(false),
            mariadb: version.to_ascii_lowercase().contains("mariadb"),
            read_timeout: super::ReadTimeout::default(),
        })
    }

    /// `select` (a statement that starts with `SELECT `) cut off by the server after `ms`
    /// (0: not cut off): the one mechanism by which dashboard reads and `count_jobs` are
    /// bounded (`ReadTimeout`). MySQL reads the `MAX_EXECUTION_TIME` hint (ms, top-level
    /// SELECTs only); MariaDB ignores it and takes `SET STATEMENT max_statement_time` (s)
    /// instead, which MySQL does not parse. Either lasts for this statement only.
    fn bounded(&self, select: &str, ms: i64) -> String {
        let rest = select
            .strip_prefix("SELECT ")
            .expect("a bounded read is a SELECT");
        match (ms > 0, self.mariadb) {
            (false, _) => select.to_string(),
            (true, true) => format!(
                "SET STATEMENT max_statement_time = {:.3} FOR {select}",
                ms as f64 / 1000.0
            ),
            (true, false) => format!("SELECT /*+ MAX_EXECUTION_TIME({ms}) */ {rest}"),
        }
    }

    /// `bounded` by the store's `ReadTimeout`.
    fn read(&self, select: &str) -> String {
        self.bounded(select, self.read_timeout.get())
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

    fn read_timeout(&self) -> &super::ReadTimeout {
        &self.read_timeout
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

    async fn settled_schema_version(&self) -> Result<Option<i64>> {
        // The migrators' named lock, taken and given back: a migration in progress (its
        // versions commit one by one) is waited for, up to 30 s.
        let mut conn = self.migrate_lock().await?;
        self.counted(1);
        let released =
            sqlx::query("SELECT RELEASE_LOCK(CONCAT('gnl_migrate:', LEFT(DATABASE(), 48)))")
                .execute(&mut *conn)
                .await;
        if released.is_err() {
            // Never back into the pool holding the lock: the session ends, and the lock with it.
            let _ = sqlx::Connection::close(conn.detach()).await;
        }
        self.schema_version().await
    }

    async fn migrate(&self) -> Result<()> {
        // MySQL DDL commits as it goes: a named lock (per database) keeps two migrators apart.
        let mut conn = self.migrate_lock().await?;
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
        self.wake.close();
        self.held.close().await;
        for h in &self.claims {
            h.close().await;
        }
        self.pool.close().await;
    }

    fn wakeups(&self) -> &std::sync::Arc<super::Wakeups> {
        &self.wake
    }
}
