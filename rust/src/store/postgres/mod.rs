//! The Postgres engine. Every instant is the server's clock (`statement_timestamp()`), so many
//! worker processes on many machines agree on due times and leases.
//!
//! Claims take lanes and jobs with `FOR UPDATE SKIP LOCKED`: concurrent claimers never take the
//! same job and never wait for each other. Batches travel as arrays (`unnest`), so a write is
//! one statement whatever its size (the protocol's 65,535 bind parameters never bind).
//!
//! Lock order, to keep transactions from deadlocking each other: job rows first, then lane rows
//! (several lanes in one statement, sorted by org). Claimers lock lanes and jobs with SKIP
//! LOCKED only, so they never wait on a row after they hold a lane.
//!
//! Here: the connection (pool, server version), the migrations, the store's clock in SQL
//! (`now_ms!`), the text helper the subsystems share, and the base `Store`; the queue's SQL is
//! in `queue.rs`, the journal's in `journal.rs`.

use std::borrow::Cow;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{Executor, Postgres, Transaction};

use super::queue::ReclaimThrottle;
use super::Store;
use crate::error::{Error, Result};

/// The Postgres migrations, embedded. Applied by `migrate`, recorded in `gnl_schema`.
pub static MIGRATOR: Migrator = sqlx::migrate!("rust/migrations/postgres");

/// The store's clock in SQL: epoch ms of the statement's start, on the server.
macro_rules! now_ms {
    () => {
        "(floor(extract(epoch from statement_timestamp()) * 1000)::bigint)"
    };
}

mod events;
mod journal;
mod queue;
#[cfg(test)]
mod tests;
mod triggers;
mod vacuum;
mod wake;

/// The oldest server this engine runs on (`server_version_num`).
const MIN_SERVER_VERSION: i64 = 120_000;

/// How long a call waits for a pooled connection (sqlx retries a refused connection inside
/// this) before the store counts as unavailable: an outage is reported, and logged by the
/// loops that carry on through it, within this time.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(2);

/// Postgres `text` cannot hold NUL: free text (errors, reasons, owners) gets U+FFFD instead.
fn pg_text(s: &str) -> Cow<'_, str> {
    if s.contains('\0') {
        Cow::Owned(s.replace('\0', "\u{FFFD}"))
    } else {
        Cow::Borrowed(s)
    }
}

type Tx = Transaction<'static, Postgres>;

pub struct PostgresStore {
    pool: PgPool,
    /// The journal's step writes (`super::held`).
    held: super::held::Held<Postgres>,
    /// The worker's claims (`claim_call`): two held connections, one a claim in flight (a
    /// worker keeps at most two), so a claim pays no acquire and no ping on release
    /// (`super::held`; DECISIONS "A worker's claims go on two held connections too").
    claims: [super::held::Held<Postgres>; 2],
    /// Shared with the notification sender, whose statements count too.
    queries: std::sync::Arc<AtomicU64>,
    wake: std::sync::Arc<super::Wakeups>,
    /// How the listener connects (`watch`).
    opts: PgConnectOptions,
    /// When a call of this store last looked for expired leases (monotonic).
    reclaims: ReclaimThrottle,
    /// Vacuums the lanes and lease records the claims churn (`vacuum`).
    vacuum: vacuum::Vacuum,
    read_timeout: super::ReadTimeout,
}

/// A dashboard read's connection (`PostgresStore::read_within`): a transaction whose
/// statements the server cuts off after the timeout, or a plain pooled connection when
/// there is none.
enum Read {
    Bounded(Tx),
    Plain(sqlx::pool::PoolConnection<Postgres>),
}

impl std::ops::Deref for Read {
    type Target = sqlx::PgConnection;
    fn deref(&self) -> &Self::Target {
        match self {
            Read::Bounded(tx) => tx,
            Read::Plain(c) => c,
        }
    }
}

impl std::ops::DerefMut for Read {
    fn deref_mut(&mut self) -> &mut Self::Target {
        match self {
            Read::Bounded(tx) => &mut *tx,
            Read::Plain(c) => &mut *c,
        }
    }
}

impl PostgresStore {
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self> {
        let opts = PgConnectOptions::from_str(url)
            .map_err(|e| Error::invalid(format!("bad Postgres URL: {}", super::url::reason(&e))))?
            .statement_cache_capacity(256);
        if opts.get_database().is_none_or(str::is_empty) {
            // The server would take the database named after the user (for an empty name
            // too), and gnl would create its tables there (a bare `postgres://`): name it
            // (DECISIONS "Store URLs").
            return Err(Error::invalid(format!(
                "store URL {:?} names no database: give one, postgres://USER@HOST:PORT/DATABASE \
                 (or ?dbname=, or PGDATABASE)",
                super::url::redact(url)
            )));
        }
        let pool = PgPoolOptions::new()
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
        let store = PostgresStore {
            pool,
            held: super::held::Held::new(),
            claims: [super::held::Held::new(), super::held::Held::new()],
            queries: std::sync::Arc::new(AtomicU64::new(0)),
            wake: super::Wakeups::new(true),
            opts: opts.clone(),
            reclaims: ReclaimThrottle::new(),
            vacuum: vacuum::Vacuum::new(vacuum::VACUUM_EVERY),
            read_timeout: super::ReadTimeout::default(),
        };
        store.counted(1);
        let (num, text): (String, String) = sqlx::query_as(
            "SELECT current_setting('server_version_num'), current_setting('server_version')",
        )
        .fetch_one(&store.pool)
        .await?;
        let num: i64 = num.trim().parse().unwrap_or(0);
        if num < MIN_SERVER_VERSION {
            store.pool.close().await;
            return Err(Error::UnsupportedStore(format!(
                "this Postgres server is version {text}; gnl needs PostgreSQL 12 or newer"
            )));
        }
        tokio::spawn(wake::send(
            store.pool.clone(),
            store.queries.clone(),
            store
                .wake
                .outbox()
                .expect("a Postgres store sends its changes"),
            store.wake.nonce().to_string(),
            store.wake.closed(),
        ));
        Ok(store)
    }

    fn counted(&self, n: u64) {
        self.queries.fetch_add(n, Ordering::Relaxed);
    }

    /// Errors with `InvalidArgumentError` when the connection's search path names no schema
    /// that exists (a URL's `search_path` option naming one nobody created): gnl creates its
    /// tables in the current schema, not the schema itself. (The server's own error came at
    /// `gnl upgrade`: "no schema has been selected to create in", code 3F000.) Asked by
    /// `schema_version` when it finds no store, which opening and upgrading read before they
    /// migrate.
    async fn schema_exists(&self) -> Result<()> {
        self.counted(1);
        let (exists, path): (bool, String) =
            sqlx::query_as("SELECT current_schema() IS NOT NULL, current_setting('search_path')")
                .fetch_one(&self.pool)
                .await?;
        if exists {
            return Ok(());
        }
        Err(Error::invalid(format!(
            "no schema of the search path ({path}) exists in this database: gnl creates its \
             tables, not the schema; create it first (CREATE SCHEMA ...)"
        )))
    }

    /// A connection for a read cut off after `ms` (0: not cut off): the one mechanism by
    /// which dashboard reads and `count_jobs` are bounded (`ReadTimeout`). `SET LOCAL` lasts
    /// until the transaction ends, so the pool's connections keep no timeout; end the read
    /// with `done`.
    async fn read_within(&self, ms: i64) -> Result<Read> {
        if ms <= 0 {
            return Ok(Read::Plain(self.pool.acquire().await?));
        }
        // One round trip: both statements go as one simple query.
        self.counted(2);
        let tx = self
            .pool
            .begin_with(format!("BEGIN; SET LOCAL statement_timeout = {ms}"))
            .await?;
        Ok(Read::Bounded(tx))
    }

    /// `read_within` the store's `ReadTimeout`.
    async fn read(&self) -> Result<Read> {
        self.read_within(self.read_timeout.get()).await
    }

    async fn done(&self, r: Read) -> Result<()> {
        match r {
            Read::Bounded(tx) => self.commit(tx).await,
            Read::Plain(_) => Ok(()),
        }
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
}

#[async_trait]
impl Store for PostgresStore {
    fn backend(&self) -> &'static str {
        "postgres"
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
        let has: bool = sqlx::query_scalar("SELECT to_regclass('gnl_schema') IS NOT NULL")
            .fetch_one(&self.pool)
            .await?;
        if !has {
            self.schema_exists().await?;
            return Ok(None);
        }
        self.counted(1);
        let v: Option<i64> = sqlx::query_scalar("SELECT version FROM gnl_schema WHERE id = 1")
            .fetch_optional(&self.pool)
            .await?;
        Ok(Some(v.unwrap_or(0)))
    }

    async fn migrate(&self) -> Result<()> {
        let mut tx = self.begin().await?;
        // One migrator at a time per schema; the lock ends with the transaction. DDL is
        // transactional here: a failed migration leaves nothing behind.
        self.counted(1);
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext('gnl_migrate:' || current_schema()))")
            .execute(&mut *tx)
            .await?;
        self.counted(1);
        tx.execute(
            "CREATE TABLE IF NOT EXISTS gnl_schema (id integer PRIMARY KEY CHECK (id = 1), version bigint NOT NULL)",
        )
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
            sqlx::query(
                "INSERT INTO gnl_schema (id, version) VALUES (1, $1) \
                 ON CONFLICT (id) DO UPDATE SET version = excluded.version",
            )
            .bind(latest)
            .execute(&mut *tx)
            .await?;
        }
        self.commit(tx).await
    }

    async fn close(&self) {
        // The changes not sent yet go before the pool closes (a process that enqueues and
        // closes at once still wakes the others).
        if let Some(outbox) = self.wake.outbox() {
            let _sending = outbox.sending.lock().await;
            let bits = outbox.take();
            if bits != 0 {
                self.counted(1);
                wake::notify(&self.pool, bits, self.wake.nonce()).await;
            }
        }
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

    fn watch(&self, rt: &tokio::runtime::Handle) {
        if self.wake.start_watching() {
            rt.spawn(wake::listen(
                self.opts.clone(),
                std::sync::Arc::downgrade(&self.wake),
                self.wake.closed(),
            ));
        }
    }

    fn watches_others(&self) -> bool {
        true
    }
}
