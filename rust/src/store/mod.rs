//! The `Store` trait: everything the queue asks of a database, one engine per backend.
//!
//! Engines: `sqlite` (embedded default). The Postgres and MySQL engines implement the same
//! trait (their own SQL and migrations); one conformance suite (tests/) proves they agree.

use std::sync::Arc;

use async_trait::async_trait;

use crate::error::{Error, Result};
use crate::model::{
    ClaimRequest, ClaimedJob, JobBatch, JobRow, LeaseRef, ListQuery, NewJob, Outcome, RenewStatus,
};

pub mod mysql;
pub mod postgres;
pub mod sqlite;
pub mod url;

/// The operations of a work store and journal. All instants are the store's clock (epoch ms).
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// "sqlite", "postgres" or "mysql".
    fn backend(&self) -> &'static str;
    /// The number of SQL statements sent so far.
    fn query_count(&self) -> u64;
    /// The store's clock, epoch ms UTC.
    async fn now_ms(&self) -> Result<i64>;
    /// The schema version recorded in the store; `None` for a store without gnl tables.
    async fn schema_version(&self) -> Result<Option<i64>>;
    /// Apply every migration newer than the store's version (idempotent, safe under races).
    async fn migrate(&self) -> Result<()>;

    /// Insert jobs in one transaction, all or none. Ids already present (or repeated in the
    /// call) are one job. Fails with `QueueFull` (and writes nothing) when a job's
    /// `max_depth` would be exceeded by its organization's pending jobs.
    async fn enqueue_batch(&self, jobs: &JobBatch) -> Result<()>;

    /// Whether `enqueue_parts` starts writing before the last part arrives (else it collects
    /// the parts and calls `enqueue_batch`: a caller gains nothing by cutting a batch).
    fn streams_enqueue(&self) -> bool {
        false
    }

    /// `enqueue_batch` of a batch of `jobs` jobs that arrives in parts, in order, on `parts`;
    /// `orgs` holds every organization the parts will hold. The sender ends with `Part::End`;
    /// a channel closed before it abandons the call, and nothing is written. Returns, besides
    /// the result, the whole batch as it arrived (all of it, even on failure), for running it
    /// again.
    async fn enqueue_parts(
        &self,
        jobs: usize,
        orgs: &[String],
        parts: &mut PartReceiver,
    ) -> (Result<()>, JobBatch) {
        let _ = orgs;
        let mut all = JobBatch::default();
        if let Err(e) = receive_all(jobs, parts, &mut all).await {
            return (Err(e), all);
        }
        (self.enqueue_batch(&all).await, all)
    }

    /// `enqueue_batch` of these jobs, packed.
    async fn enqueue(&self, jobs: &[NewJob]) -> Result<()> {
        self.enqueue_batch(&JobBatch::from(jobs)).await
    }

    /// Write `finished` outcomes, reclaim expired leases, then claim up to `req.limit` due jobs
    /// taking the lanes that waited longest in turn, in one transaction.
    async fn claim(&self, finished: &[Outcome], req: &ClaimRequest) -> Result<Vec<ClaimedJob>>;
    /// Write outcomes; each is conditional on (seq, token, state running).
    async fn finish(&self, outcomes: &[Outcome]) -> Result<()>;
    /// Extend leases by `ttl_ms`; one status per lease, in order.
    async fn renew(&self, leases: &[LeaseRef], ttl_ms: i64) -> Result<Vec<RenewStatus>>;

    /// Whether some lane may have a due job (its next-due bound has passed). A claim that came
    /// back empty while this is true met lanes that concurrent claims held.
    async fn has_due(&self) -> Result<bool>;

    async fn get_job(&self, org: &str, id: &str) -> Result<Option<JobRow>>;
    /// At least the highest committed job seq (0 when none was ever written): a listing's
    /// snapshot (jobs enqueued after it are not listed).
    async fn max_seq(&self) -> Result<i64>;
    async fn list_jobs(&self, q: &ListQuery) -> Result<Vec<JobRow>>;
    /// dead -> pending with attempts 0; false (and no change) otherwise.
    async fn retry_job(&self, org: &str, id: &str) -> Result<bool>;
    /// pending -> canceled; running -> cancel requested; false for finished or unknown jobs.
    async fn cancel_job(&self, org: &str, id: &str, reason: Option<&str>) -> Result<bool>;

    /// The recorded result (JSON text) of step `name` of run `run_id`.
    async fn step_get(&self, run_id: &str, name: &str) -> Result<Option<String>>;
    /// Record a step result unless one exists; returns the kept (first written) result.
    async fn step_put(&self, run_id: &str, name: &str, result: &str) -> Result<String>;

    async fn close(&self);
}

/// `Store::enqueue_batch`, run again when the server aborted it to break a deadlock (see
/// `again_on_deadlock`): two calls that insert overlapping ids in different orders can
/// deadlock, and the rows (ids included) are fixed before the call, so running it again is
/// idempotent.
pub async fn enqueue(store: &dyn Store, jobs: &JobBatch) -> Result<()> {
    again_on_deadlock(|| store.enqueue_batch(jobs)).await
}

/// One message of `Store::enqueue_parts`.
#[derive(Debug)]
pub enum Part {
    /// The next jobs of the batch.
    Jobs(Box<JobBatch>),
    /// The batch is complete.
    End,
}

pub type PartSender = tokio::sync::mpsc::UnboundedSender<Part>;
pub type PartReceiver = tokio::sync::mpsc::UnboundedReceiver<Part>;

/// Append every part still to come to `all`, up to `Part::End`; `Abandoned` when the channel
/// closes before it. `jobs`: the whole batch's size.
pub async fn receive_all(jobs: usize, parts: &mut PartReceiver, all: &mut JobBatch) -> Result<()> {
    loop {
        match parts.recv().await {
            Some(Part::Jobs(b)) => append_part(jobs, all, &b),
            Some(Part::End) => return Ok(()),
            None => return Err(Error::Abandoned),
        }
    }
}

/// Append a part of a batch of `jobs` jobs to `all`, making room for the whole batch when
/// the first part comes (growing it part by part would copy it over and over).
pub fn append_part(jobs: usize, all: &mut JobBatch, part: &JobBatch) {
    if all.is_empty() && !part.is_empty() {
        all.reserve(jobs, part.text_bytes().div_ceil(part.len()) + 8);
    }
    all.append(part);
}

/// `Store::enqueue_parts`, run again as one batch when the server aborted it to break a
/// deadlock (see `enqueue`).
pub async fn enqueue_parts(
    store: &dyn Store,
    jobs: usize,
    orgs: &[String],
    parts: &mut PartReceiver,
) -> Result<()> {
    match store.enqueue_parts(jobs, orgs, parts).await {
        (Err(e), all) if e.is_deadlock() => enqueue(store, &all).await,
        (r, _) => r,
    }
}

/// `Store::claim`, run again when the server aborted it to break a deadlock (see
/// `again_on_deadlock`; on MySQL a claim's lane locks can meet an enqueue's lane upsert). The
/// aborted transaction wrote nothing, and every outcome is conditional on its fencing token,
/// so running it again is safe.
pub async fn claim(
    store: &dyn Store,
    finished: &[Outcome],
    req: &ClaimRequest,
) -> Result<Vec<ClaimedJob>> {
    again_on_deadlock(|| store.claim(finished, req)).await
}

/// `Store::finish`, run again when the server aborted it to break a deadlock (see
/// `again_on_deadlock`); every outcome is conditional on its fencing token.
pub async fn finish(store: &dyn Store, outcomes: &[Outcome]) -> Result<()> {
    again_on_deadlock(|| store.finish(outcomes)).await
}

/// The error of a pool that could not open its first connection. sqlx's pool retries a
/// failed connection until its acquire timeout and then reports only that it timed out, so
/// one direct attempt finds the driver's reason (e.g. a refused connection) to report
/// instead. Any other error is reported as it is.
pub(crate) async fn pool_error<O>(opts: &O, e: sqlx::Error) -> Error
where
    O: sqlx::ConnectOptions,
    O::Connection: Sized,
{
    if !matches!(e, sqlx::Error::PoolTimedOut) {
        return e.into();
    }
    match tokio::time::timeout(std::time::Duration::from_secs(5), opts.connect()).await {
        Ok(Err(cause)) => match Error::from(cause) {
            Error::StoreUnavailable { reason, code } => Error::StoreUnavailable {
                reason: format!("cannot connect: {reason}"),
                code,
            },
            other => other,
        },
        _ => e.into(),
    }
}

/// `Store::renew`, run again when the server aborted it to break a deadlock (see
/// `again_on_deadlock`; a renewal and an outcome can lock two of a worker's jobs in opposite
/// orders). A renewal only extends leases still held, so running it again is idempotent.
pub async fn renew(
    store: &dyn Store,
    leases: &[LeaseRef],
    ttl_ms: i64,
) -> Result<Vec<RenewStatus>> {
    again_on_deadlock(|| store.renew(leases, ttl_ms)).await
}

/// Run `f` again (up to 3 times, after 5-25 ms) while the server aborts its transaction to
/// break a deadlock (`Error::is_deadlock`): a deadlock is two transactions meeting, not the
/// store going away, so it is not reported while running again can end it.
async fn again_on_deadlock<T, F, Fut>(f: F) -> Result<T>
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
    match store.schema_version().await? {
        None if create => store.migrate().await?,
        None => {
            return Err(Error::SchemaOutdated {
                found: 0,
                expected: latest,
                url: url.to_string(),
            })
        }
        Some(v) if v < latest => {
            return Err(Error::SchemaOutdated {
                found: v,
                expected: latest,
                url: url.to_string(),
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
