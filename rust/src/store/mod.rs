//! The store: one trait per subsystem, one engine per backend.
//!
//! * `Store` (here): the engine's base (backend, clock, schema version, migrations, close),
//!   and `open` / `upgrade`. It requires every subsystem's trait, so `Arc<dyn Store>` is the
//!   whole store.
//! * `queue.rs`: `QueueStore` (enqueue, claim, outcomes, renewals, listings) and the calls that
//!   wrap it; `journal.rs`: `JournalStore` (a run's recorded steps); `triggers.rs`:
//!   `TriggerStore` (the scheduler's triggers: definitions, states moved by compare-and-set).
//! * Each engine is a folder, `sqlite/`, `postgres/`, `mysql/`: its `mod.rs` holds the
//!   connection, migrations, error and SQL helpers and `impl Store`; one file per subsystem
//!   holds that subsystem's SQL (`queue.rs`, `journal.rs`); `tests.rs` its own tests.
//! * `suite/`: the engine suite every engine passes, split the same way (`queue.rs`,
//!   `journal.rs`), on a fresh database of each engine.
//! * `events.rs`: `EventStore` (the event log, consumer cursors, marks, quarantine).
//! * `held.rs`: the connection Postgres and MySQL hold outside their pool for a run's steps.
//! * `url.rs`: store URLs. Migrations: `rust/migrations/<engine>/`.

use std::sync::Arc;

use async_trait::async_trait;

use crate::error::{Error, Result};

pub mod events;
pub(crate) mod held;
pub mod journal;
pub mod mysql;
pub mod postgres;
pub mod queue;
pub mod sqlite;
#[cfg(test)]
pub(crate) mod suite;
pub mod triggers;
pub mod url;
pub mod wake;

pub use events::EventStore;
pub use journal::JournalStore;
pub use queue::{
    append_part, claim, enqueue, enqueue_parts, finish, receive_all, renew, scan_jobs, Part,
    PartReceiver, PartSender, QueueStore,
};
pub use triggers::TriggerStore;
pub use wake::{Topic, Wakeups};

/// The engine's base: what every subsystem's store shares (its backend, clock, schema and
/// pool). `Arc<dyn Store>` is the whole store, every subsystem's operations included. All
/// instants are the store's clock (epoch ms).
#[async_trait]
pub trait Store:
    QueueStore + JournalStore + TriggerStore + EventStore + Send + Sync + 'static
{
    /// "sqlite", "postgres" or "mysql".
    fn backend(&self) -> &'static str;
    /// The number of SQL statements sent so far.
    fn query_count(&self) -> u64;
    /// The store's clock, epoch ms UTC.
    async fn now_ms(&self) -> Result<i64>;
    /// The schema version recorded in the store; `None` for a store without gnl tables.
    async fn schema_version(&self) -> Result<Option<i64>>;
    /// The schema version once no migration is running (a migrator elsewhere is waited
    /// for). Engines whose migrations commit as a whole (SQLite, Postgres) never show a
    /// version in between: the default reads it.
    async fn settled_schema_version(&self) -> Result<Option<i64>> {
        self.schema_version().await
    }
    /// Apply every migration newer than the store's version (idempotent, safe under races).
    async fn migrate(&self) -> Result<()>;

    async fn close(&self);

    /// The statement timeout of this store's reads for dashboards (listings, look-ups,
    /// counts; see `ReadTimeout`).
    fn read_timeout(&self) -> &ReadTimeout;

    /// This store's wake-ups (see `wake`): what this process changed, and what other
    /// processes changed once `watch` has started the engine's watcher.
    fn wakeups(&self) -> &Arc<Wakeups>;

    /// Start the watcher of other processes' changes on `rt` (once per store; later calls do
    /// nothing): Postgres LISTENs, SQLite checks `PRAGMA data_version`, MySQL has none.
    fn watch(&self, rt: &tokio::runtime::Handle) {
        let _ = rt;
    }

    /// Whether `watch` learns of other processes' changes (false: only the poll finds them,
    /// and a worker looks for cancels of its running jobs every `worker::CANCEL_CHECK`).
    fn watches_others(&self) -> bool {
        false
    }
}

/// The statement timeout (ms; 0: none, the default) of a store's reads for dashboards: the
/// listings and look-ups Studio's pages make (`list_orgs`, `list_jobs`, `get_job`,
/// `list_runs`, `runs_edge`, `run_get`, `list_triggers`, `consumers`, `dead_events`,
/// `consumer_lag`). Each engine runs them, and `count_jobs` with its own `timeout_ms`, through
/// one mechanism: Postgres `SET LOCAL statement_timeout` in the read's transaction, MySQL the
/// `MAX_EXECUTION_TIME` hint (MariaDB `SET STATEMENT max_statement_time … FOR`), SQLite a
/// progress handler that interrupts the statement past its deadline. A read cut off fails
/// (`Error::Db`); the connection it ran on serves the next read as before.
#[derive(Debug, Default)]
pub struct ReadTimeout(std::sync::atomic::AtomicI64);

impl ReadTimeout {
    pub fn get(&self) -> i64 {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// `ms` <= 0: no timeout.
    pub fn set(&self, ms: i64) {
        self.0
            .store(ms.max(0), std::sync::atomic::Ordering::Relaxed);
    }
}

/// `QueueStore::retry_job`, waking this process's workers (and, where the engine tells them,
/// other processes') when a job became pending again.
pub async fn retry_job(store: &(impl Store + ?Sized), org: &str, id: &str) -> Result<bool> {
    let r = store.retry_job(org, id).await?;
    if r {
        store.wakeups().changed(Topic::Jobs);
    }
    Ok(r)
}

/// `QueueStore::cancel_job`, reaching the worker that runs the job at once: this process's
/// directly, another's through the engine's notification or its next short check.
pub async fn cancel_job(
    store: &(impl Store + ?Sized),
    org: &str,
    id: &str,
    reason: Option<&str>,
) -> Result<bool> {
    let r = store.cancel_job(org, id, reason).await?;
    if r {
        store.wakeups().changed(Topic::Cancels);
    }
    Ok(r)
}

/// The error of a pool that could not open its first connection. sqlx's pool retries a
/// failed connection until its acquire timeout and then reports only that it timed out, so
/// one direct attempt finds the driver's reason (e.g. a refused connection) to report
/// instead, naming the server it tried (`server`: `host:port`, or the socket's path) so a
/// wrong host or port shows in the message. Any other error is reported as it is.
pub(crate) async fn pool_error<O>(opts: &O, server: &str, e: sqlx::Error) -> Error
where
    O: sqlx::ConnectOptions,
    O::Connection: Sized,
{
    let cause = if matches!(e, sqlx::Error::PoolTimedOut) {
        match tokio::time::timeout(std::time::Duration::from_secs(5), opts.connect()).await {
            Ok(Err(cause)) => cause,
            _ => e,
        }
    } else {
        e
    };
    match Error::from(cause) {
        Error::StoreUnavailable { reason, code } => Error::StoreUnavailable {
            reason: format!("cannot connect to {server}: {reason}"),
            code,
        },
        // The server answered, and refused the URL's database or user: not transient (the
        // same URL is refused again), so a store error, which names the server and what to
        // change.
        Error::Store {
            message,
            code: Some(code),
        } if connect_advice(&code).is_some() => {
            let advice = connect_advice(&code).unwrap_or_default();
            Error::Store {
                message: format!("cannot connect to {server}: {message}; {advice}"),
                code: Some(code),
            }
        }
        other => other,
    }
}

/// What to change when the server refuses a connection's database or user, by the server's
/// error code (Postgres SQLSTATE, MySQL error number).
fn connect_advice(code: &str) -> Option<&'static str> {
    match code {
        // invalid_catalog_name; ER_BAD_DB_ERROR
        "3D000" | "1049" => Some("create the database first, or name an existing one in the URL"),
        // invalid_authorization_specification, invalid_password; ER_DBACCESS_DENIED_ERROR,
        // ER_ACCESS_DENIED_ERROR, ER_ACCESS_DENIED_NO_PASSWORD_ERROR
        "28000" | "28P01" | "1044" | "1045" | "1698" => Some(
            "check the URL's user and password, and that the server lets that user in from here",
        ),
        _ => None,
    }
}

/// Run `f` again (up to 3 times, after 5-25 ms) while the server aborts its transaction to
/// break a deadlock (`Error::is_deadlock`): a deadlock is two transactions meeting, not the
/// store going away, so it is not reported while running again can end it.
pub(crate) async fn again_on_deadlock<T, F, Fut>(f: F) -> Result<T>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let mut tries = 0u64;
    loop {
        match f().await {
            Err(e) if e.is_deadlock() && tries < 3 => {
                tries += 1;
                tokio::time::sleep(std::time::Duration::from_millis(
                    5 * tries + rand::random::<u64>() % 10,
                ))
                .await;
            }
            r => return r,
        }
    }
}

/// Open a store by URL and check its schema: an empty store gets the current schema when
/// `create`, an older one is refused with `SchemaOutdated`, a newer one with `SchemaTooNew`.
pub async fn open(url: &str, max_connections: u32, create: bool) -> Result<Arc<dyn Store>> {
    with_busy_retry(|| open_once(url, max_connections, create)).await
}

/// Run `f` again while it fails because a SQLite file is locked in a way that SQLite reports
/// at once instead of through its busy handler (a fresh file switching to WAL, WAL recovery
/// by another process): up to ~10 s, the way the busy handler would have waited.
async fn with_busy_retry<T, F, Fut>(f: F) -> Result<T>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let mut waited_ms = 0u64;
    loop {
        match f().await {
            Err(Error::StoreUnavailable { code: Some(c), .. })
                if (c == "5" || c == "6" || c == "261" || c == "517") && waited_ms < 10_000 =>
            {
                let pause = 20 + rand::random::<u64>() % 30;
                tokio::time::sleep(std::time::Duration::from_millis(pause)).await;
                waited_ms += pause;
            }
            r => return r,
        }
    }
}

async fn open_once(url: &str, max_connections: u32, create: bool) -> Result<Arc<dyn Store>> {
    let store = connect(url, max_connections, create).await?;
    let latest = latest_version(store.backend());
    let mut found = store.schema_version().await?;
    if matches!(found, Some(v) if v < latest) {
        // Maybe a migration in progress elsewhere (MySQL's DDL commits migration by
        // migration): the version once it is done decides.
        found = store.settled_schema_version().await?;
    }
    match found {
        None if create => store.migrate().await?,
        None => {
            return Err(Error::SchemaOutdated {
                found: 0,
                expected: latest,
                url: url::redact(url),
                backend: store.backend(),
            })
        }
        Some(v) if v < latest => {
            return Err(Error::SchemaOutdated {
                found: v,
                expected: latest,
                url: url::redact(url),
                backend: store.backend(),
            })
        }
        Some(v) if v > latest => {
            return Err(Error::SchemaTooNew {
                found: v,
                expected: latest,
            })
        }
        Some(_) => {}
    }
    Ok(store)
}

/// Bring a store to the current schema (`gnl upgrade`).
pub async fn upgrade(url: &str) -> Result<i64> {
    with_busy_retry(|| upgrade_once(url)).await
}

async fn upgrade_once(url: &str) -> Result<i64> {
    let store = connect(url, 2, true).await?;
    let latest = latest_version(store.backend());
    if let Some(v) = store.schema_version().await? {
        if v > latest {
            store.close().await;
            return Err(Error::SchemaTooNew {
                found: v,
                expected: latest,
            });
        }
    }
    let r = store.migrate().await;
    store.close().await;
    r.map(|_| latest)
}

async fn connect(url: &str, max_connections: u32, create: bool) -> Result<Arc<dyn Store>> {
    match url::parse(url)? {
        url::Target::Sqlite(t) => Ok(Arc::new(
            sqlite::SqliteStore::connect(t, max_connections, create).await?,
        )),
        url::Target::Postgres(u) => Ok(Arc::new(
            postgres::PostgresStore::connect(&u, max_connections).await?,
        )),
        url::Target::Mysql(u) => Ok(Arc::new(
            mysql::MysqlStore::connect(&u, max_connections).await?,
        )),
    }
}

/// The newest schema version this package knows for `backend`.
pub fn latest_version(backend: &str) -> i64 {
    match backend {
        "sqlite" => sqlite::MIGRATOR
            .iter()
            .map(|m| m.version)
            .max()
            .unwrap_or(0),
        "postgres" => postgres::MIGRATOR
            .iter()
            .map(|m| m.version)
            .max()
            .unwrap_or(0),
        "mysql" => mysql::MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0),
        _ => 0,
    }
}
