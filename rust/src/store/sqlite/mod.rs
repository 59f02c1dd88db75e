//! The SQLite engine (embedded default): WAL, one writer at a time (`BEGIN IMMEDIATE`, and a
//! per-process write lock so this process's writers queue in tokio instead of in SQLite's
//! sleeping busy handler), the process clock of the machine that holds the file.
//!
//! Here: the connection (pragmas, busy handler, pool), the migrations and the base `Store`;
//! the queue's SQL is in `queue.rs`, the journal's in `journal.rs`.

use std::str::FromStr;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use sqlx::migrate::Migrator;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{Executor, Sqlite, Transaction};

use super::queue::ReclaimThrottle;
use super::url::SqliteTarget;
use super::Store;
use crate::error::{Error, Result};

mod checkpoint;
mod events;
mod journal;
mod now;
mod queue;
mod raw;
#[cfg(test)]
mod tests;
mod triggers;

/// The SQLite migrations, embedded. Applied by `migrate`, recorded in `gnl_schema`.
pub static MIGRATOR: Migrator = sqlx::migrate!("rust/migrations/sqlite");

/// How long a statement waits for another process's write lock before the store counts as
/// unavailable (and the caller retries with backoff).
const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

pub struct SqliteStore {
    pool: SqlitePool,
    write: std::sync::Arc<tokio::sync::Mutex<()>>,
    queries: AtomicU64,
    /// When expired leases were last looked for (monotonic).
    reclaims: std::sync::Arc<ReclaimThrottle>,
    /// Bind parameters per statement (`sqlite3_limit(SQLITE_LIMIT_VARIABLE_NUMBER)`).
    var_limit: usize,
    /// Added to the wall clock (ms): 0 except where a test steps the clock (`step_clock`).
    clock_shift_ms: AtomicI64,
    /// The file (None: in memory), for the journal's fast path (`now.rs`).
    path: Option<String>,
    raw: std::sync::Mutex<Option<now::Raw>>,
    /// The queue's hot path's connection (`raw.rs`; file stores), opened on first use.
    hot: std::sync::Arc<std::sync::Mutex<Option<raw::Db>>>,
    /// Checkpoints the hot connection's WAL (`checkpoint.rs`; file stores).
    wal: Option<std::sync::Arc<checkpoint::Checkpointer>>,
    wake: std::sync::Arc<super::Wakeups>,
    /// How the `PRAGMA data_version` watcher connects (None: in memory, no other process).
    watch_opts: Option<SqliteConnectOptions>,
    read_timeout: super::ReadTimeout,
}

/// Virtual machine instructions between two looks at a bounded read's deadline.
const PROGRESS_OPS: i32 = 1_000;

/// A dashboard read's pooled connection (`SqliteStore::read_within`): with a deadline,
/// SQLite's progress handler interrupts its statements once it passed. Dropped before
/// `done` (the read failed or was canceled), the handler is disarmed: the connection goes
/// back to the pool with a handler that never interrupts (the next bounded read replaces it).
struct Read {
    conn: sqlx::pool::PoolConnection<Sqlite>,
    armed: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
}

impl std::ops::Deref for Read {
    type Target = sqlx::SqliteConnection;
    fn deref(&self) -> &Self::Target {
        &self.conn
    }
}

impl std::ops::DerefMut for Read {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.conn
    }
}

impl Drop for Read {
    fn drop(&mut self) {
        if let Some(a) = &self.armed {
            a.store(false, Ordering::Relaxed);
        }
    }
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

/// The hot path's connection to `path`: gnl's pragmas and busy handler, its WAL checkpointed by
/// `wal` (started with the first one).
fn open_hot(path: &str, wal: Option<std::sync::Arc<checkpoint::Checkpointer>>) -> Result<raw::Db> {
    let mut db = raw::Db::open(path, Some(busy_handler))?;
    if let Some(c) = wal {
        c.start();
        db.watch_wal(c);
    }
    Ok(db)
}

/// The wall clock, in epoch ms (the store's clock: due instants and leases).
fn wall_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

type Tx<'a> = Transaction<'a, Sqlite>;

impl Drop for SqliteStore {
    fn drop(&mut self) {
        // A store dropped without `close`: its checkpointer ends (not waited for).
        if let Some(c) = &self.wal {
            c.stop();
        }
    }
}

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
                // Setup errors, not outages: retrying cannot shorten a name the file system
                // cannot hold (a component past its length limit), make the directory
                // appear, nor make a directory given as the file go away (each open failed as
                // CANTOPEN, which `gnl run` retried forever). (`ErrorKind::InvalidFilename`
                // is newer than this crate's MSRV: the errno.)
                if let Err(e) = std::fs::symlink_metadata(path) {
                    if cfg!(unix) && e.raw_os_error() == Some(libc::ENAMETOOLONG) {
                        return Err(Error::InvalidArgument(format!(
                            "the SQLite path {path:?} cannot name a file here: {e}"
                        )));
                    }
                }
                if std::path::Path::new(path).is_dir() {
                    return Err(Error::InvalidArgument(format!(
                        "the SQLite path {path:?} is a directory, not a file: name the file in \
                         it (e.g. {:?})",
                        std::path::Path::new(path).join("gnl.db")
                    )));
                }
                let dir = std::path::Path::new(path)
                    .parent()
                    .filter(|d| !d.as_os_str().is_empty());
                if let Some(dir) = dir.filter(|d| !d.is_dir()) {
                    return Err(Error::InvalidArgument(format!(
                        "the directory {dir:?} of the SQLite file {path:?} does not exist: \
                         gnl creates the file, not its directory; create the directory first"
                    )));
                }
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
        let watch_opts = (!memory).then(|| opts.clone());
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
            .await
            .map_err(|e| match (&target, Error::from(e)) {
                // Name the file: "unable to open database file" alone does not say which.
                (SqliteTarget::File(path), Error::StoreUnavailable { reason, code }) => {
                    Error::StoreUnavailable {
                        reason: format!(
                            "cannot open the SQLite file {path:?} (does its directory exist, \
                             and may this process write there?): {reason}"
                        ),
                        code,
                    }
                }
                // SQLITE_NOTADB: a file that is something else (a mistyped path, a text
                // file). A setup error: retrying cannot change it.
                (
                    SqliteTarget::File(path),
                    Error::Store {
                        code: Some(code), ..
                    },
                ) if code.parse::<u32>().is_ok_and(|n| n & 0xff == 26) => {
                    Error::InvalidArgument(format!(
                        "the file {path:?} is not a SQLite database (SQLITE_NOTADB): is the \
                         URL's path the store's file?"
                    ))
                }
                (_, e) => e,
            })?;
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
            write: std::sync::Arc::new(tokio::sync::Mutex::new(())),
            queries: AtomicU64::new(0),
            reclaims: std::sync::Arc::new(ReclaimThrottle::new()),
            var_limit,
            clock_shift_ms: AtomicI64::new(0),
            path: match &target {
                SqliteTarget::File(p) => Some(p.clone()),
                SqliteTarget::Memory => None,
            },
            raw: std::sync::Mutex::new(None),
            hot: std::sync::Arc::new(std::sync::Mutex::new(None)),
            wal: match &target {
                SqliteTarget::File(p) => Some(checkpoint::Checkpointer::new(p.clone())),
                SqliteTarget::Memory => None,
            },
            wake: super::Wakeups::new(false),
            watch_opts,
            read_timeout: super::ReadTimeout::default(),
        })
    }

    /// The store's clock (epoch ms): the wall clock, shifted by the test seam.
    fn clock_ms(&self) -> i64 {
        wall_ms() + self.clock_shift_ms.load(Ordering::Relaxed)
    }

    /// Test seam: step the store's wall clock by `ms` (negative: back), as NTP or a VM
    /// restore would.
    #[cfg(test)]
    pub(crate) fn step_clock(&self, ms: i64) {
        self.clock_shift_ms.fetch_add(ms, Ordering::Relaxed);
    }

    fn counted(&self, n: u64) {
        self.queries.fetch_add(n, Ordering::Relaxed);
    }

    /// Run `f` (a write: it takes this process's writers' lock) on a raw connection in one
    /// hop, with the store's clock: a file store's own connection on tokio's blocking pool,
    /// an in-memory store's pooled connection at once (see `raw.rs`). A connection that
    /// failed is closed and the next call opens another.
    async fn on_raw<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut raw::Db, i64) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let w = self.write.clone().lock_owned().await;
        if self.pool.is_closed() {
            return Err(Error::Closed);
        }
        let shift = self.clock_shift_ms.load(Ordering::Relaxed);
        let (r, n) = match &self.path {
            Some(path) => {
                let (slot, path, wal) = (self.hot.clone(), path.clone(), self.wal.clone());
                tokio::task::spawn_blocking(move || {
                    let _w = w;
                    let mut g = slot.lock().unwrap_or_else(|p| p.into_inner());
                    if g.is_none() {
                        match open_hot(&path, wal) {
                            Ok(db) => *g = Some(db),
                            Err(e) => return (Err(e), 1),
                        }
                    }
                    let Some(db) = g.as_mut() else {
                        return (Err(Error::Closed), 0);
                    };
                    let r = f(db, wall_ms() + shift);
                    let n = db.take_count();
                    if r.is_err() {
                        *g = None;
                    }
                    (r, n)
                })
                .await
                .map_err(|e| Error::Store {
                    message: format!("a SQLite call panicked: {e}"),
                    code: None,
                })?
            }
            None => {
                let _w = w;
                let mut conn = self.pool.acquire().await?;
                let mut handle = conn.lock_handle().await?;
                // SAFETY: the pooled connection is locked (ours alone) while `db` lives.
                let mut db = unsafe { raw::Db::borrowed(handle.as_raw_handle().as_ptr()) };
                let r = f(&mut db, wall_ms() + shift);
                let n = db.take_count();
                (r, n)
            }
        };
        self.counted(n);
        r
    }

    /// `on_raw` at once on the calling thread, or not at all (`None`, nothing written): a
    /// file store whose writers' lock, hot connection and file write lock are all free (no
    /// waiting: the busy handler is off for the call).
    fn on_raw_now<T>(&self, f: impl FnOnce(&mut raw::Db, i64) -> Result<T>) -> Option<Result<T>> {
        let path = self.path.as_deref()?;
        let _w = self.write.try_lock().ok()?;
        if self.pool.is_closed() {
            return Some(Err(Error::Closed));
        }
        let mut g = self.hot.try_lock().ok()?;
        if g.is_none() {
            *g = Some(open_hot(path, self.wal.clone()).ok()?);
        }
        let db = g.as_mut()?;
        db.set_busy(None);
        let r = f(db, self.clock_ms());
        db.set_busy(Some(busy_handler));
        self.counted(db.take_count());
        match r {
            Err(e) if e.is_sqlite_busy() => None,
            Err(e) => {
                *g = None;
                Some(Err(e))
            }
            ok => Some(ok),
        }
    }

    /// A connection for a read interrupted after `ms` (0: not interrupted): the one
    /// mechanism by which dashboard reads and `count_jobs` are bounded (`ReadTimeout`).
    /// SQLite has no statement timeout: a progress handler, called every `PROGRESS_OPS`
    /// instructions, interrupts the statement past the deadline (`SQLITE_INTERRUPT`). End the
    /// read with `done`.
    async fn read_within(&self, ms: i64) -> Result<Read> {
        let mut conn = self.pool.acquire().await?;
        if ms <= 0 {
            return Ok(Read { conn, armed: None });
        }
        let armed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let deadline = std::time::Instant::now() + Duration::from_millis(ms as u64);
        let live = armed.clone();
        conn.lock_handle()
            .await?
            .set_progress_handler(PROGRESS_OPS, move || {
                !(live.load(Ordering::Relaxed) && std::time::Instant::now() >= deadline)
            });
        Ok(Read {
            conn,
            armed: Some(armed),
        })
    }

    /// `read_within` the store's `ReadTimeout`.
    async fn read(&self) -> Result<Read> {
        self.read_within(self.read_timeout.get()).await
    }

    async fn done(&self, mut r: Read) -> Result<()> {
        if let Some(a) = r.armed.take() {
            a.store(false, Ordering::Relaxed);
            r.conn.lock_handle().await?.remove_progress_handler();
        }
        Ok(())
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
}

#[async_trait]
impl Store for SqliteStore {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    fn read_timeout(&self) -> &super::ReadTimeout {
        &self.read_timeout
    }

    fn query_count(&self) -> u64 {
        self.queries.load(Ordering::Relaxed)
    }

    async fn now_ms(&self) -> Result<i64> {
        Ok(self.clock_ms())
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
        self.wake.close();
        self.pool.close().await;
        let _w = self.write.lock().await;
        *self.hot.lock().unwrap_or_else(|p| p.into_inner()) = None;
        // Its connection is the file's last one to close (which folds the WAL into the file).
        if let Some(t) = self.wal.as_ref().and_then(|c| c.stop()) {
            let _ = tokio::task::spawn_blocking(move || t.join()).await;
        }
    }

    fn wakeups(&self) -> &std::sync::Arc<super::Wakeups> {
        &self.wake
    }

    fn watch(&self, rt: &tokio::runtime::Handle) {
        if let Some(opts) = &self.watch_opts {
            if self.wake.start_watching() {
                rt.spawn(watch_data_version(
                    opts.clone(),
                    std::sync::Arc::downgrade(&self.wake),
                    self.wake.closed(),
                ));
            }
        }
    }

    fn watches_others(&self) -> bool {
        self.watch_opts.is_some()
    }
}

/// The SQLite watcher: `PRAGMA data_version` on a connection of its own every
/// `DATA_VERSION_EVERY`; a new value means another connection committed (another process's,
/// or this one's other connections): it wakes this process's waiters on every topic (they
/// look, one read each). Reconnects with backoff when the file cannot be opened.
async fn watch_data_version(
    opts: SqliteConnectOptions,
    wake: std::sync::Weak<super::Wakeups>,
    mut closed: tokio::sync::watch::Receiver<bool>,
) {
    use sqlx::Connection;
    let mut conn: Option<sqlx::SqliteConnection> = None;
    let mut last: Option<i64> = None;
    let mut pause = super::wake::DATA_VERSION_EVERY;
    loop {
        tokio::select! {
            _ = super::wake::until_closed(&mut closed) => break,
            _ = tokio::time::sleep(pause) => {}
        }
        let Some(w) = wake.upgrade() else { break };
        if conn.is_none() {
            match sqlx::SqliteConnection::connect_with(&opts).await {
                Ok(c) => conn = Some(c),
                Err(_) => {
                    pause = (pause * 2).min(super::wake::WATCH_MAX_BACKOFF);
                    continue;
                }
            }
        }
        let c = conn.as_mut().expect("connected above");
        match sqlx::query_scalar::<_, i64>("PRAGMA data_version")
            .fetch_one(&mut *c)
            .await
        {
            Ok(v) => {
                if last.is_some_and(|l| l != v) {
                    w.bump_remote(None);
                }
                last = Some(v);
                pause = super::wake::DATA_VERSION_EVERY;
            }
            Err(_) => {
                // A new connection starts a new count: the first value it reads is no change.
                conn = None;
                last = None;
                w.bump_remote(None);
                pause = (pause * 2).min(super::wake::WATCH_MAX_BACKOFF);
            }
        }
    }
    if let Some(c) = conn {
        let _ = c.close().await;
    }
}
