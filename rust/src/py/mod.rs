//! `gnl._native`: the pyo3 layer. It converts types and errors and nothing else; the logic
//! lives in the pyo3-free modules. Every awaitable runs its work in a tokio task, so a Rust
//! panic becomes a `gnl.GnlError` instead of reaching the user.

mod bridge;
mod cron;
mod errors;
mod events;
mod jobs;
mod journal;
mod json;
mod scheduler;

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::IntoPyObjectExt;

use crate::cursor::Cursor;
use crate::error::Error;
use crate::model::{ClaimRequest, JobRow, ListQuery, ListScope, Outcome, STATES};
use crate::store::{self, Store};
use crate::worker::WorkerCore;
use errors::{internal, to_py, InvalidArgumentError};

/// `enqueue_many` calls of at least this many jobs go to a store that streams them
/// (`Store::streams_enqueue`) in parts of `STREAM_PART_JOBS`, written while the rest are
/// checked and packed.
const STREAM_MIN_JOBS: usize = 4_096;
const STREAM_PART_JOBS: usize = 2_048;

/// Native threads inside (or about to enter) Python. `quiesce` waits for them at exit.
static INFLIGHT: AtomicUsize = AtomicUsize::new(0);
/// Set by `quiesce` (an `atexit` hook): from then on native threads never enter Python.
static EXITING: AtomicBool = AtomicBool::new(false);
/// `gnl._bridge.resolve(fut, ok, value)`.
static RESOLVE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
/// `asyncio.get_running_loop`.
static GET_LOOP: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// Run `f` with the GIL from a native thread, unless the interpreter is exiting.
///
/// Entering Python while the interpreter finalizes aborts the process (pyo3-async-runtimes
/// issue #40), so every native thread enters through here and `quiesce` can wait them out.
pub(crate) fn with_python<R>(f: impl FnOnce(Python<'_>) -> R) -> Option<R> {
    INFLIGHT.fetch_add(1, Ordering::SeqCst);
    let r = if EXITING.load(Ordering::SeqCst) {
        None
    } else {
        Some(Python::attach(f))
    };
    INFLIGHT.fetch_sub(1, Ordering::SeqCst);
    r
}

fn cached<'py>(
    cell: &'static PyOnceLock<Py<PyAny>>,
    py: Python<'py>,
    module: &str,
    name: &str,
) -> PyResult<Bound<'py, PyAny>> {
    cell.get_or_try_init(py, || {
        Ok::<_, PyErr>(py.import(module)?.getattr(name)?.unbind())
    })
    .map(|f| f.bind(py).clone())
}

/// An asyncio future already holding `value` (a call done at once, in `spawn`'s shape):
/// awaiting it does not yield to the loop.
fn ready<'py, T: IntoPyObject<'py>>(py: Python<'py>, value: T) -> PyResult<Bound<'py, PyAny>> {
    let fut = cached(&GET_LOOP, py, "asyncio", "get_running_loop")?
        .call0()?
        .call_method0("create_future")?;
    fut.call_method1("set_result", (value.into_bound_py_any(py)?,))?;
    Ok(fut)
}

/// Run `fut` on the tokio runtime and return an asyncio future for its result.
///
/// The result goes back through the loop's completion queue (`bridge`): the tokio task queues
/// it as a Rust value and the loop thread converts it and sets the future, so no native thread
/// takes the GIL. A loop without a queue (one that cannot watch a descriptor) gets it with
/// `call_soon_threadsafe` from a native thread that enters Python through `with_python`. A
/// panic becomes a `gnl.GnlError`. One tokio task a call: the panic is caught where `fut` is
/// polled (`caught`), not by awaiting a second task (pyo3-async-runtimes' shape, which costs a
/// task and a wake-up more per call).
fn spawn<'py, F, T>(py: Python<'py>, fut: F) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = Result<T, Error>> + Send + 'static,
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    let event_loop = cached(&GET_LOOP, py, "asyncio", "get_running_loop")?.call0()?;
    let py_fut = event_loop.call_method0(pyo3::intern!(py, "create_future"))?;
    let fut_ref = py_fut.clone().unbind();
    let rt = pyo3_async_runtimes::tokio::get_runtime();
    if let Some(queue) = bridge::queue_of(py, &event_loop)? {
        rt.spawn(async move {
            let res = outcome(fut).await;
            queue.push(fut_ref, Box::new(move |py| settle(py, res)));
        });
        return Ok(py_fut);
    }
    let resolve = cached(&RESOLVE, py, "gnl._bridge", "resolve")?.unbind();
    let loop_ref = event_loop.unbind();
    rt.spawn(async move {
        let res = outcome(fut).await;
        with_python(move |py| {
            let (ok, value) = settle(py, res);
            // A closed loop means nobody is waiting any more.
            let _ =
                loop_ref.call_method1(py, "call_soon_threadsafe", (resolve, fut_ref, ok, value));
        });
    });
    Ok(py_fut)
}

/// `fut`'s result, its error or its panic as the Python error to raise (no GIL needed).
async fn outcome<F, T>(fut: F) -> PyResult<T>
where
    F: Future<Output = Result<T, Error>>,
{
    match caught(fut).await {
        Some(r) => r.map_err(to_py),
        None => Err(internal("a task panicked")),
    }
}

/// A call's outcome as Python: `(ok, value)`, the value being the exception when not ok.
fn settle<T: for<'a> IntoPyObject<'a>>(py: Python<'_>, res: PyResult<T>) -> (bool, Py<PyAny>) {
    match res.and_then(|v| v.into_bound_py_any(py)) {
        Ok(v) => (true, v.unbind()),
        Err(e) => (false, e.into_value(py).into_any()),
    }
}

/// `fut`'s output, or None when polling it panicked (the panic is not propagated).
async fn caught<F: Future>(fut: F) -> Option<F::Output> {
    let mut fut = std::pin::pin!(fut);
    std::future::poll_fn(move |cx| {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| fut.as_mut().poll(cx))) {
            Ok(p) => p.map(Some),
            Err(_) => std::task::Poll::Ready(None),
        }
    })
    .await
}

/// The longest `cancel_job` reason, in characters (it is kept as the job's `last_error`).
const MAX_CANCEL_REASON: usize = 10_000;

/// A job as stored, for `gnl.JobInfo` (JSON fields still as text).
#[pyclass(frozen, module = "gnl._native")]
pub struct RawJob {
    #[pyo3(get)]
    id: String,
    #[pyo3(get)]
    r#type: String,
    #[pyo3(get)]
    org_id: Option<String>,
    #[pyo3(get)]
    payload: String,
    #[pyo3(get)]
    state: String,
    #[pyo3(get)]
    attempts: i64,
    #[pyo3(get)]
    max_attempts: i64,
    #[pyo3(get)]
    last_error: Option<String>,
    #[pyo3(get)]
    result: Option<String>,
    #[pyo3(get)]
    created_at: i64,
    #[pyo3(get)]
    updated_at: i64,
    #[pyo3(get)]
    run_at: i64,
    #[pyo3(get)]
    finished_at: Option<i64>,
}

fn org_opt(org: String) -> Option<String> {
    if org.is_empty() {
        None
    } else {
        Some(org)
    }
}

/// A claimed job for Python: (seq, token, org_id, id, type, payload_json, attempt).
type PyJob = (i64, i64, Option<String>, String, String, String, i64);

fn py_jobs(jobs: Vec<crate::model::ClaimedJob>) -> Vec<PyJob> {
    jobs.into_iter()
        .map(|j| {
            (
                j.seq,
                j.token,
                org_opt(j.org),
                j.id,
                j.typ,
                j.payload,
                j.attempt,
            )
        })
        .collect()
}

impl From<JobRow> for RawJob {
    fn from(r: JobRow) -> Self {
        RawJob {
            id: r.id,
            r#type: r.typ,
            org_id: org_opt(r.org),
            payload: r.payload,
            state: r.state,
            attempts: r.attempts,
            max_attempts: r.max_attempts,
            last_error: r.last_error,
            result: r.result,
            created_at: r.created_at,
            updated_at: r.updated_at,
            run_at: r.run_at,
            finished_at: r.finished_at,
        }
    }
}

fn org_key(org: Option<&str>) -> PyResult<String> {
    match org {
        None => Ok(String::new()),
        Some(o) => {
            crate::validate::org_id(o).map_err(to_py)?;
            Ok(o.to_string())
        }
    }
}

/// The id of a job looked up (get, retry, cancel): `validate::lookup_id`.
fn lookup_id(id: &str) -> PyResult<String> {
    crate::validate::lookup_id("job_id", id, "job").map_err(to_py)?;
    Ok(id.to_string())
}

/// An open store (connection pool). `gnl.Storage` wraps one.
#[pyclass(frozen, module = "gnl._native")]
pub struct NativeStore {
    inner: Arc<dyn Store>,
}

#[pymethods]
impl NativeStore {
    #[getter]
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    #[getter]
    fn query_count(&self) -> u64 {
        self.inner.query_count()
    }

    fn now_ms<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let s = self.inner.clone();
        spawn(py, async move { s.now_ms().await })
    }

    /// Check and insert jobs (`enqueue` when `single`, else `enqueue_many`); returns the ids.
    fn enqueue<'py>(
        &self,
        py: Python<'py>,
        jobs: &Bound<'py, PyAny>,
        single: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let s = self.inner.clone();
        let n = jobs.len().unwrap_or(0);
        if !single && s.streams_enqueue() && n >= STREAM_MIN_JOBS {
            if let Some(orgs) = jobs::organizations(jobs) {
                // The store writes the first parts while the rest are checked and packed.
                let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
                let store = s.clone();
                let task = pyo3_async_runtimes::tokio::get_runtime().spawn(async move {
                    store::enqueue_parts(store.as_ref(), n, &orgs, &mut rx).await
                });
                // A bad job returns here: `tx` is dropped without `End`, and the store rolls
                // back what it began.
                let ids = jobs::convert_parts(py, jobs, false, STREAM_PART_JOBS, |part| {
                    let _ = tx.send(store::Part::Jobs(Box::new(part)));
                })?;
                let _ = tx.send(store::Part::End);
                return spawn(py, async move {
                    match task.await {
                        Ok(r) => r?,
                        Err(_) => {
                            return Err(Error::Store {
                                message: "the enqueue task failed".into(),
                                code: None,
                            })
                        }
                    }
                    Ok(ids)
                });
            }
        }
        let (batch, ids) = jobs::convert(py, jobs, single)?;
        spawn(py, async move {
            store::enqueue(s.as_ref(), &batch).await?;
            drop(batch);
            Ok(ids)
        })
    }

    #[pyo3(signature = (org_id, id))]
    fn get_job<'py>(
        &self,
        py: Python<'py>,
        org_id: Option<&str>,
        id: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        let org = org_key(org_id)?;
        let id = lookup_id(id)?;
        let s = self.inner.clone();
        spawn(py, async move {
            Ok(s.get_job(&org, &id).await?.map(RawJob::from))
        })
    }

    /// One page of one lane (`org_id` None: jobs without organization) or, with `all`, of
    /// every lane. Returns `(jobs, next_cursor)`.
    #[pyo3(signature = (all, org_id, state, r#type, limit, cursor))]
    #[allow(clippy::too_many_arguments)]
    fn list_jobs<'py>(
        &self,
        py: Python<'py>,
        all: bool,
        org_id: Option<&str>,
        state: Option<&str>,
        r#type: Option<&str>,
        limit: i64,
        cursor: Option<&str>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let f = if all { "list_all_jobs" } else { "list_jobs" };
        if !(1..=10_000).contains(&limit) {
            return Err(InvalidArgumentError::new_err(format!(
                "limit must be between 1 and 10000, got {limit}"
            )));
        }
        if let Some(st) = state {
            if !STATES.contains(&st) {
                return Err(InvalidArgumentError::new_err(format!(
                    "state must be one of {}, got {st:?}",
                    STATES.join(", ")
                )));
            }
        }
        let org = org_key(org_id)?;
        let filters: Vec<Option<String>> = if all {
            vec![]
        } else {
            vec![
                org_id.map(String::from),
                state.map(String::from),
                r#type.map(String::from),
            ]
        };
        let decoded = cursor
            .map(|c| Cursor::decode(c, f, &filters))
            .transpose()
            .map_err(to_py)?;
        let scope = if all {
            ListScope::All
        } else {
            ListScope::Lane {
                org,
                state: state.map(String::from),
                typ: r#type.map(String::from),
            }
        };
        let s = self.inner.clone();
        let f = f.to_string();
        spawn(py, async move {
            let snapshot = match &decoded {
                Some(c) => c.s,
                None => s.max_seq().await?,
            };
            let after = decoded.as_ref().map(|c| (c.o.clone(), c.q));
            let q = ListQuery {
                scope,
                snapshot,
                after,
                limit: limit + 1,
            };
            let mut rows = s.list_jobs(&q).await?;
            let next = if rows.len() as i64 > limit {
                rows.truncate(limit as usize);
                let last = rows.last().expect("limit >= 1");
                Some(
                    Cursor {
                        f,
                        k: filters,
                        s: snapshot,
                        o: last.org.clone(),
                        q: last.seq,
                    }
                    .encode(),
                )
            } else {
                None
            };
            Ok((rows.into_iter().map(RawJob::from).collect::<Vec<_>>(), next))
        })
    }

    #[pyo3(signature = (org_id, id))]
    fn retry_job<'py>(
        &self,
        py: Python<'py>,
        org_id: Option<&str>,
        id: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        let org = org_key(org_id)?;
        let id = lookup_id(id)?;
        let s = self.inner.clone();
        spawn(
            py,
            async move { store::retry_job(s.as_ref(), &org, &id).await },
        )
    }

    #[pyo3(signature = (org_id, id, reason))]
    fn cancel_job<'py>(
        &self,
        py: Python<'py>,
        org_id: Option<&str>,
        id: &str,
        reason: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let org = org_key(org_id)?;
        let id = lookup_id(id)?;
        if reason.as_deref() == Some("") {
            return Err(to_py(crate::error::Error::invalid(
                "reason must be a non-empty string (None records 'cancel_job was called')",
            )));
        }
        if let Some(n) = reason.as_deref().map(|r| r.chars().count()) {
            if n > MAX_CANCEL_REASON {
                return Err(to_py(crate::error::Error::invalid(format!(
                    "reason is {n} characters long; at most {MAX_CANCEL_REASON} are allowed"
                ))));
            }
        }
        let s = self.inner.clone();
        spawn(py, async move {
            store::cancel_job(s.as_ref(), &org, &id, reason.as_deref()).await
        })
    }

    /// The store's schema version (None: no schema yet).
    fn schema_version<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let s = self.inner.clone();
        spawn(py, async move { s.schema_version().await })
    }

    /// Organizations in name order after `after` (`None` in the result: no organization).
    #[pyo3(signature = (after, limit))]
    fn list_orgs<'py>(
        &self,
        py: Python<'py>,
        after: Option<String>,
        limit: i64,
    ) -> PyResult<Bound<'py, PyAny>> {
        let s = self.inner.clone();
        spawn(py, async move {
            let orgs = s.list_orgs(after.as_deref(), limit).await?;
            Ok(orgs.into_iter().map(org_opt).collect::<Vec<_>>())
        })
    }

    /// `count_jobs` of each of `orgs` (None: no organization), in order; each is
    /// `(states [(state, n)], scanned, finished [(minute, state, n)])`.
    #[pyo3(signature = (orgs, scan, since_ms, timeout_ms))]
    fn count_jobs<'py>(
        &self,
        py: Python<'py>,
        orgs: Vec<Option<String>>,
        scan: i64,
        since_ms: i64,
        timeout_ms: i64,
    ) -> PyResult<Bound<'py, PyAny>> {
        let keys = orgs
            .iter()
            .map(|o| org_key(o.as_deref()))
            .collect::<PyResult<Vec<_>>>()?;
        let s = self.inner.clone();
        spawn(py, async move {
            let counts = s.count_jobs_of(&keys, scan, since_ms, timeout_ms).await?;
            Ok(counts
                .into_iter()
                .map(|c| (c.states, c.scanned, c.finished))
                .collect::<Vec<_>>())
        })
    }

    /// One page of a bounded scan (`store::scan_jobs`): `org_id` None scans every lane, `""`
    /// the jobs without organization. Returns `(jobs, next_cursor)`.
    #[pyo3(signature = (org_id, state, r#type, limit, scan, cursor))]
    #[allow(clippy::too_many_arguments)]
    fn scan_jobs<'py>(
        &self,
        py: Python<'py>,
        org_id: Option<&str>,
        state: Option<&str>,
        r#type: Option<&str>,
        limit: i64,
        scan: i64,
        cursor: Option<&str>,
    ) -> PyResult<Bound<'py, PyAny>> {
        if let Some(st) = state {
            if !STATES.contains(&st) {
                return Err(InvalidArgumentError::new_err(format!(
                    "state must be one of {}, got {st:?}",
                    STATES.join(", ")
                )));
            }
        }
        let lane = match org_id {
            None => None,
            Some("") => Some(String::new()),
            Some(o) => Some(org_key(Some(o))?),
        };
        let filters: Vec<Option<String>> = vec![
            org_id.map(String::from),
            state.map(String::from),
            r#type.map(String::from),
        ];
        let decoded = cursor
            .map(|c| Cursor::decode(c, "scan_jobs", &filters))
            .transpose()
            .map_err(to_py)?;
        let state = state.map(String::from);
        let typ = r#type.map(String::from);
        let s = self.inner.clone();
        spawn(py, async move {
            let snapshot = match &decoded {
                Some(c) => c.s,
                None => s.max_seq().await?,
            };
            let after = decoded.as_ref().map(|c| (c.o.clone(), c.q));
            let (rows, next) = store::scan_jobs(
                s.as_ref(),
                lane.as_deref(),
                state.as_deref(),
                typ.as_deref(),
                snapshot,
                after,
                scan,
                limit as usize,
            )
            .await?;
            let next = next.map(|(o, q)| {
                Cursor {
                    f: "scan_jobs".into(),
                    k: filters,
                    s: snapshot,
                    o,
                    q,
                }
                .encode()
            });
            Ok((rows.into_iter().map(RawJob::from).collect::<Vec<_>>(), next))
        })
    }
    fn close<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let s = self.inner.clone();
        spawn(py, async move {
            s.close().await;
            Ok(())
        })
    }

    /// The current version of wake-up topic `topic` ("jobs", "cancels", "events", "triggers"): read it
    /// before looking at the store, then `wake_wait` for a newer one.
    fn wake_version(&self, topic: &str) -> PyResult<u64> {
        Ok(self.inner.wakeups().version(wake_topic(topic)?))
    }

    /// Wait until `topic`'s version is past `seen` (True), at most `timeout_ms` (False), or
    /// until the store closes (False). Starts the engine's watcher of other processes'
    /// changes the first time.
    fn wake_wait<'py>(
        &self,
        py: Python<'py>,
        topic: &str,
        seen: u64,
        timeout_ms: u64,
    ) -> PyResult<Bound<'py, PyAny>> {
        let t = wake_topic(topic)?;
        let s = self.inner.clone();
        s.watch(pyo3_async_runtimes::tokio::get_runtime().handle());
        spawn(py, async move {
            Ok(s.wakeups()
                .wait(t, seen, Duration::from_millis(timeout_ms))
                .await)
        })
    }

    /// How many wake-ups came from other processes so far (notifications, SQLite changes).
    #[getter]
    fn remote_wakeups(&self) -> u64 {
        self.inner.wakeups().remote_count()
    }
}

fn wake_topic(name: &str) -> PyResult<store::Topic> {
    store::Topic::parse(name).ok_or_else(|| {
        InvalidArgumentError::new_err(format!(
            "topic must be \"jobs\", \"cancels\", \"events\" or \"triggers\", not {name:?}"
        ))
    })
}

/// The native half of a worker (see `crate::worker`).
#[pyclass(module = "gnl._native")]
pub struct NativeWorker {
    core: Option<WorkerCore>,
    /// The job types it has handlers for (the only ones it claims).
    types: Vec<String>,
}

impl NativeWorker {
    fn core(&self) -> PyResult<&WorkerCore> {
        self.core.as_ref().ok_or_else(|| to_py(Error::Closed))
    }
}

#[pymethods]
impl NativeWorker {
    /// `on_revoke(seq, token, why)` is scheduled on `loop` with `call_soon_threadsafe`;
    /// `on_log(message)` is called from a native thread.
    #[new]
    #[pyo3(signature = (store, owner, ttl_ms, max_attempts, on_revoke, on_log, event_loop, types))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        store: &NativeStore,
        owner: String,
        ttl_ms: i64,
        max_attempts: i64,
        on_revoke: Py<PyAny>,
        on_log: Py<PyAny>,
        event_loop: Py<PyAny>,
        types: Vec<String>,
    ) -> PyResult<Self> {
        crate::validate::duration_ms("ttl_ms", ttl_ms, 3).map_err(to_py)?;
        crate::validate::count("max_attempts", max_attempts, 1).map_err(to_py)?;
        // Native threads enter Python only through `with_python` (see `quiesce`).
        let revoke = Arc::new(move |seq: i64, token: i64, why: &'static str| {
            with_python(|py| {
                // A closed loop means the worker is gone; nothing is left to tell.
                let _ = event_loop.call_method1(
                    py,
                    "call_soon_threadsafe",
                    (on_revoke.clone_ref(py), seq, token, why),
                );
            });
        });
        let log = Arc::new(move |msg: String| {
            with_python(|py| {
                let _ = on_log.call1(py, (msg,));
            });
        });
        let rt = pyo3_async_runtimes::tokio::get_runtime().handle().clone();
        let req = ClaimRequest {
            owner,
            limit: 0,
            ttl_ms,
            max_attempts,
            types: types.clone(),
            probe: true,
            per_org: 0,
            wait_lanes: false,
        };
        Ok(NativeWorker {
            types,
            core: Some(WorkerCore::start(
                &rt,
                store.inner.clone(),
                req,
                revoke,
                log,
            )),
        })
    }

    /// Write waiting outcomes and claim up to `n` jobs:
    /// `[(seq, token, org_id, id, type, payload_json, attempt)]`. With `carry` false no
    /// outcomes are written (a second claim in flight); at most `per_org` jobs an
    /// organization (0: no cap); with `wait` it waits for the lanes a claim in flight holds
    /// (Postgres, uncapped: `ClaimRequest::wait_lanes`).
    #[pyo3(signature = (n, carry = true, per_org = 0, wait = false))]
    fn claim<'py>(
        &self,
        py: Python<'py>,
        n: usize,
        carry: bool,
        per_org: usize,
        wait: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let fut = self.core()?.shared_claim(n, carry, per_org, wait);
        spawn(py, async move { Ok(py_jobs(fut.await?)) })
    }

    /// `claim` at once on the calling thread (the GIL released meanwhile) when the store can
    /// (a SQLite file whose locks are free): the jobs, or None (nothing done: call `claim`).
    fn claim_now(&self, py: Python<'_>, n: usize) -> PyResult<Option<Vec<PyJob>>> {
        let core = self.core()?;
        match py.detach(|| core.claim_now(n)) {
            None => Ok(None),
            Some(r) => Ok(Some(py_jobs(r.map_err(to_py)?))),
        }
    }

    /// The handler returned `result`; a result that is not JSON raises and records nothing.
    fn done(&self, seq: i64, token: i64, result: &Bound<'_, PyAny>) -> PyResult<()> {
        let text = if result.is_none() {
            None
        } else {
            Some(json::encode(result, "the handler's result")?)
        };
        let core = self.core()?;
        core.finish(Outcome::Done {
            seq,
            token,
            org: core.org_of(seq, token),
            result: text,
        });
        Ok(())
    }

    /// The attempt failed; retried after `delay_ms` (None: the default exponential backoff).
    #[pyo3(signature = (seq, token, error, attempt, delay_ms))]
    fn fail(
        &self,
        seq: i64,
        token: i64,
        error: String,
        attempt: i64,
        delay_ms: Option<i64>,
    ) -> PyResult<()> {
        let delay = match delay_ms {
            Some(d) => d.clamp(0, crate::retry::MAX_RETRY_DELAY_MS),
            None => {
                crate::retry::default_job_retry_delay_ms(attempt, rand::random::<f64>() * 2.0 - 1.0)
            }
        };
        let core = self.core()?;
        core.finish(Outcome::Failed {
            seq,
            token,
            org: core.org_of(seq, token),
            error,
            delay_ms: delay,
        });
        Ok(())
    }

    /// Jobs are likely due (a wake-up): the next claim skips the empty-poll probe.
    fn expect_jobs(&self) -> PyResult<()> {
        self.core()?.expect_jobs();
        Ok(())
    }

    /// Ask the outcome writer to write the queued outcomes now (it otherwise waits a few ms
    /// for a claim to take them along).
    fn kick(&self) -> PyResult<()> {
        self.core()?.kick();
        Ok(())
    }

    /// Whether some job of the worker's types may be due (see `Store::has_due`).
    fn has_due<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let store = self.core()?.store();
        let types = self.types.clone();
        spawn(py, async move { store.has_due(&types).await })
    }

    /// Forget the outcomes given up so far (logged then); `flush` reports later ones only.
    fn forget_given_up(&self) -> PyResult<()> {
        self.core()?.forget_given_up();
        Ok(())
    }

    fn flush<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let fut = self.core()?.shared_flush();
        spawn(py, fut)
    }

    #[getter]
    fn held(&self) -> usize {
        self.core.as_ref().map(|c| c.held()).unwrap_or(0)
    }

    fn close(&mut self) {
        if let Some(mut c) = self.core.take() {
            c.close();
        }
    }
}

/// Open a store: `connect(url, max_connections, create) -> NativeStore`.
#[pyfunction]
fn connect(
    py: Python<'_>,
    url: String,
    max_connections: u32,
    create: bool,
    read_timeout_ms: i64,
) -> PyResult<Bound<'_, PyAny>> {
    if max_connections == 0 {
        return Err(InvalidArgumentError::new_err(
            "max_connections must be >= 1",
        ));
    }
    crate::store::url::parse(&url).map_err(to_py)?;
    spawn(py, async move {
        let inner = store::open(&url, max_connections, create).await?;
        inner.read_timeout().set(read_timeout_ms);
        Ok(NativeStore { inner })
    })
}

/// Bring a store to the current schema; returns the version.
#[pyfunction]
fn upgrade(py: Python<'_>, url: String) -> PyResult<Bound<'_, PyAny>> {
    crate::store::url::parse(&url).map_err(to_py)?;
    spawn(py, async move { store::upgrade(&url).await })
}

/// Check `value` as JSON and return its text (`what` names it in errors).
#[pyfunction]
fn encode_json(value: &Bound<'_, PyAny>, what: &str) -> PyResult<String> {
    json::encode(value, what)
}

/// The durable run id of a job.
#[pyfunction]
#[pyo3(signature = (org_id, id))]
fn job_run_id(org_id: Option<&str>, id: &str) -> String {
    crate::ids::job_run_id(org_id.unwrap_or(""), id)
}

/// `url` as it may be shown to people: its password replaced by `***`.
#[pyfunction]
fn redact_url(url: &str) -> String {
    crate::store::url::redact(url)
}

/// How many organizations a Postgres/SQLite/MySQL claim of `limit` jobs serves at most in its
/// first pass (`store::queue::first_pass_orgs`; `per_org` 0: uncapped, a quantum at a time).
/// The worker reads a full claim whose jobs came from fewer as one that took every due lane.
#[pyfunction]
fn first_pass_orgs(limit: usize, per_org: usize) -> usize {
    crate::store::queue::first_pass_orgs(limit, per_org)
}

/// Check a trigger id or workflow name as registration does (`what` names it in the error):
/// InvalidArgumentError, without I/O (`App.schedule` checks at declaration).
#[pyfunction]
fn check_trigger_key(what: &str, value: &str) -> PyResult<()> {
    crate::store::triggers::check_trigger_key(what, value).map_err(to_py)
}

/// Check a job type as enqueue does: InvalidArgumentError, without I/O (`App.job` and
/// `create_worker` check their handlers' types with it).
#[pyfunction]
fn check_job_type(value: &str) -> PyResult<()> {
    crate::validate::job_type(value).map_err(to_py)
}

/// The default retry delay (ms) after failed attempt `attempt`, with jitter.
#[pyfunction]
fn default_retry_delay_ms(attempt: i64) -> i64 {
    crate::retry::default_job_retry_delay_ms(attempt, rand::random::<f64>() * 2.0 - 1.0)
}

/// Called at interpreter exit (`atexit`): stop native threads from entering Python and wait
/// up to `timeout_ms` for those inside it to leave.
#[pyfunction]
fn quiesce(py: Python<'_>, timeout_ms: u64) {
    EXITING.store(true, Ordering::SeqCst);
    py.detach(|| {
        let deadline = Instant::now() + Duration::from_millis(timeout_ms);
        while INFLIGHT.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    });
}

/// An awaitable whose task panics (the test of `spawn`'s panic path): it raises GnlError.
#[pyfunction]
fn panic_in_task(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    spawn::<_, ()>(py, async { panic!("gnl._native.panic_in_task") })
}

#[pymodule]
#[pyo3(name = "_native")]
fn native_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<NativeStore>()?;
    m.add_class::<NativeWorker>()?;
    m.add_class::<RawJob>()?;
    m.add_function(wrap_pyfunction!(connect, m)?)?;
    m.add_function(wrap_pyfunction!(upgrade, m)?)?;
    m.add_function(wrap_pyfunction!(encode_json, m)?)?;
    m.add_function(wrap_pyfunction!(job_run_id, m)?)?;
    m.add_function(wrap_pyfunction!(redact_url, m)?)?;
    m.add_function(wrap_pyfunction!(default_retry_delay_ms, m)?)?;
    m.add_function(wrap_pyfunction!(first_pass_orgs, m)?)?;
    m.add_function(wrap_pyfunction!(check_trigger_key, m)?)?;
    m.add_function(wrap_pyfunction!(check_job_type, m)?)?;
    m.add_function(wrap_pyfunction!(quiesce, m)?)?;
    m.add_function(wrap_pyfunction!(panic_in_task, m)?)?;
    bridge::register(m)?;
    cron::register(m)?;
    journal::register(m)?;
    scheduler::register(m)?;
    events::register(m)?;
    m.add("SCHEMA_VERSION", store::latest_version("sqlite"))?;
    m.add("MAX_INSTANT_MS", jobs::MAX_INSTANT_MS)?;
    Ok(())
}
