//! `gnl._native`'s journal functions (`gnl.durable` wraps them): steps, runs, the waker's
//! claim, locks, and `RunKeeper`, the tokio task that renews a running run's lease and its
//! run lock off the Python thread. Arguments are checked here (keys, JSON) before anything is
//! written.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pyo3::prelude::*;
use pyo3::types::{PyList, PyString};

use super::errors::{to_py, InvalidArgumentError};
use super::{json, ready, spawn, with_python, NativeStore};
use crate::store::journal::{
    check_key, Recorded, RunQuery, RunRow, RunStart, RunStarted, StepRow, RUN_STATES,
};
use crate::store::Store;

/// A step as Python sees it: `(name, n, position, state, result_json, started_at)`.
type PyStep = (String, i64, i64, String, Option<String>, i64);

fn py_step(s: StepRow) -> PyStep {
    (s.name, s.n, s.position, s.state, s.result, s.started_at)
}

/// A run's recorded steps as `run_start` hands them to Python (`gnl.durable`'s replay), in
/// position order: their results as one JSON array (`results`: one decode for all, no string
/// a step), the names of the steps the replay may serve without a check of its own (`lean`),
/// and any one step's record on demand (`get`). A resume of 1,000 steps makes a handful of
/// Python objects here, not 1,000 tuples.
#[pyclass(frozen, name = "Recorded", module = "gnl._native")]
pub struct PyRecorded(Recorded);

#[pymethods]
impl PyRecorded {
    fn __len__(&self) -> usize {
        self.0.len()
    }

    /// The steps' results in row order, as one JSON array's text (a missing one: null).
    #[getter]
    fn results(&self) -> &str {
        &self.0.results
    }

    /// The record at `position` as `(name, n, position, state, row, started_at)` (`row`: its
    /// index in `results`), or None; of two rows at one position (two executors of different
    /// code), the last in `(name, n)` order.
    fn get(&self, position: i64) -> Option<(&str, i64, i64, &str, usize, i64)> {
        let rec = &self.0;
        let i = rec
            .rows
            .partition_point(|r| r.position <= position)
            .checked_sub(1)?;
        let r = &rec.rows[i];
        (r.position == position).then(|| {
            let (name, state) = (&rec.names[r.name as usize], &rec.states[r.state as usize]);
            (
                name.as_str(),
                r.n,
                r.position,
                state.as_str(),
                i,
                r.started_at,
            )
        })
    }

    /// What a replay that starts at position `start` with `counts` (the calls of each name
    /// before it) may serve without a check of its own: a list whose item `p` is the name of
    /// the done step recorded at position `p` when, every call before it being the recorded
    /// one, its call is the recorded call `n` of that name (else None: the full path checks
    /// it). It covers the journal's first rows while row `p` is position `p` (one row a
    /// position, none missing: item `p` is also row `p` of `results`) and, from `start` on,
    /// each row's `n` counts the earlier calls of its name; it ends at the first row that is
    /// not so. Names starting `gnl.` (gnl's own steps) are None; each name is one interned
    /// Python string.
    fn lean<'py>(
        &self,
        py: Python<'py>,
        start: i64,
        counts: HashMap<String, i64>,
    ) -> PyResult<Bound<'py, PyList>> {
        let rec = &self.0;
        let mut seen: Vec<i64> = rec
            .names
            .iter()
            .map(|n| counts.get(n).copied().unwrap_or(0))
            .collect();
        let mut names: Vec<Option<Option<Bound<'py, PyString>>>> = vec![None; rec.names.len()];
        let done = rec.states.iter().position(|s| s == "done");
        let mut out: Vec<Option<Bound<'py, PyString>>> = Vec::with_capacity(rec.rows.len());
        for (i, r) in rec.rows.iter().enumerate() {
            if r.position != i as i64 {
                if r.position == i as i64 - 1 {
                    out.pop(); // two rows at the last position: the full path picks one
                }
                break;
            }
            if r.position < start {
                out.push(None);
                continue;
            }
            let k = r.name as usize;
            if r.n != seen[k] {
                break;
            }
            seen[k] += 1;
            let name = names[k].get_or_insert_with(|| {
                let name = &rec.names[k];
                (!name.starts_with("gnl.")).then(|| PyString::intern(py, name))
            });
            out.push(name.clone().filter(|_| Some(r.state as usize) == done));
        }
        PyList::new(py, out)
    }

    fn __repr__(&self) -> String {
        format!("<gnl._native.Recorded steps={}>", self.0.len())
    }
}

/// A run's record, for `gnl.RunInfo` (JSON fields still as text).
#[pyclass(frozen, module = "gnl._native")]
pub struct RawRun {
    #[pyo3(get)]
    run_id: String,
    #[pyo3(get)]
    workflow: String,
    #[pyo3(get)]
    preset: Option<String>,
    #[pyo3(get)]
    state: String,
    #[pyo3(get)]
    input: Option<String>,
    #[pyo3(get)]
    result: Option<String>,
    #[pyo3(get)]
    error: Option<String>,
    #[pyo3(get)]
    scheduled_for: Option<i64>,
    #[pyo3(get)]
    wake_at: Option<i64>,
    #[pyo3(get)]
    lease_owner: Option<String>,
    #[pyo3(get)]
    lease_expires_at: Option<i64>,
    #[pyo3(get)]
    created_at: i64,
    #[pyo3(get)]
    updated_at: i64,
}

impl From<RunRow> for RawRun {
    fn from(r: RunRow) -> Self {
        RawRun {
            run_id: r.run_id,
            workflow: r.workflow,
            preset: r.preset,
            state: r.state,
            input: r.input,
            result: r.result,
            error: r.error,
            scheduled_for: r.scheduled_for,
            wake_at: r.wake_at,
            lease_owner: r.lease_owner,
            lease_expires_at: r.lease_expires_at,
            created_at: r.created_at,
            updated_at: r.updated_at,
        }
    }
}

fn keys(run_id: &str, name: &str) -> PyResult<()> {
    check_key("run_id", run_id).map_err(to_py)?;
    check_key("step name", name).map_err(to_py)
}

/// Step `(run_id, name, n)` as recorded: `(name, n, position, state, result, started_at)`.
#[pyfunction]
fn step_get<'py>(
    py: Python<'py>,
    store: &NativeStore,
    run_id: String,
    name: String,
    n: i64,
) -> PyResult<Bound<'py, PyAny>> {
    keys(&run_id, &name)?;
    let s = store.inner.clone();
    spawn(py, async move {
        Ok(s.step_get(&run_id, &name, n).await?.map(py_step))
    })
}

/// Record `value` (checked as JSON first) as step `(run_id, name, n)` unless recorded: None
/// when this call recorded it, else the row there first.
#[pyfunction]
fn step_put<'py>(
    py: Python<'py>,
    store: &NativeStore,
    run_id: String,
    name: String,
    n: i64,
    position: i64,
    value: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    keys(&run_id, &name)?;
    let text = json::encode(value, &format!("the result of step {name:?}"))?;
    let s = store.inner.clone();
    spawn(py, async move {
        Ok(s.step_put(&run_id, &name, n, position, &text)
            .await?
            .map(py_step))
    })
}

/// Record `value` (checked as JSON first) as step `(run_id, name, n)` at once, on the calling
/// thread, when the store can (`JournalStore::step_put_now`): True when recorded, False when
/// not done (then call `step_put`).
#[pyfunction]
fn step_put_now(
    store: &NativeStore,
    run_id: &str,
    name: &str,
    n: i64,
    position: i64,
    value: &Bound<'_, PyAny>,
) -> PyResult<bool> {
    keys(run_id, name)?;
    let text = json::encode(value, &format!("the result of step {name:?}"))?;
    let s = store.inner.clone();
    let py = value.py();
    Ok(py.detach(|| s.step_put_now(run_id, name, n, position, &text).is_some()))
}

/// Record an at-most-once step's intent: None when this call recorded it, else the row.
#[pyfunction]
fn step_intent<'py>(
    py: Python<'py>,
    store: &NativeStore,
    run_id: String,
    name: String,
    n: i64,
    position: i64,
    token: i64,
) -> PyResult<Bound<'py, PyAny>> {
    keys(&run_id, &name)?;
    let s = store.inner.clone();
    spawn(py, async move {
        Ok(s.step_intent(&run_id, &name, n, position, token)
            .await?
            .map(py_step))
    })
}

/// Complete the intent written with `token` with `value` (checked as JSON first).
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn step_finish<'py>(
    py: Python<'py>,
    store: &NativeStore,
    run_id: String,
    name: String,
    n: i64,
    token: i64,
    value: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    keys(&run_id, &name)?;
    let text = json::encode(value, &format!("the result of step {name:?}"))?;
    let s = store.inner.clone();
    spawn(py, async move {
        s.step_finish(&run_id, &name, n, token, &text).await
    })
}

/// Resolve an intent: mark it done with `value` (checked as JSON), or with `retry` remove it.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn step_resolve<'py>(
    py: Python<'py>,
    store: &NativeStore,
    run_id: String,
    name: String,
    n: i64,
    value: &Bound<'py, PyAny>,
    retry: bool,
) -> PyResult<Bound<'py, PyAny>> {
    keys(&run_id, &name)?;
    let text = if retry {
        None
    } else {
        Some(json::encode(value, "value")?)
    };
    let s = store.inner.clone();
    spawn(py, async move {
        s.step_resolve(&run_id, &name, n, text.as_deref()).await
    })
}

/// `run_start`'s answer as Python sees it: `(state, result, input, scheduled_for, created,
/// now_ms, recorded)`.
type PyStarted = (
    String,
    Option<String>,
    Option<String>,
    Option<i64>,
    bool,
    i64,
    PyRecorded,
);

fn py_started(st: RunStarted) -> PyStarted {
    (
        st.run.state,
        st.run.result,
        st.run.input,
        st.run.scheduled_for,
        st.created,
        st.now_ms,
        PyRecorded(st.steps),
    )
}

/// Start an execution: `(state, result, input, scheduled_for, created, now_ms, recorded)`
/// (`recorded`: a `Recorded` of the steps in position order; see `JournalStore::run_start`). With `now`, done at once on the calling thread when
/// the store can (`JournalStore::run_start_now`): the future comes back resolved, and
/// awaiting it does not yield to the loop.
#[pyfunction]
#[pyo3(signature = (store, run_id, workflow, preset, input, scheduled_for, owner, lease_ms, now=false))]
#[allow(clippy::too_many_arguments)]
fn run_start<'py>(
    py: Python<'py>,
    store: &NativeStore,
    run_id: String,
    workflow: String,
    preset: Option<String>,
    input: &Bound<'py, PyAny>,
    scheduled_for: Option<i64>,
    owner: String,
    lease_ms: Option<i64>,
    now: bool,
) -> PyResult<Bound<'py, PyAny>> {
    check_key("run_id", &run_id).map_err(to_py)?;
    check_key("workflow name", &workflow).map_err(to_py)?;
    if let Some(l) = lease_ms {
        crate::validate::duration_ms("lease_ms", l, 3).map_err(to_py)?;
    }
    let input = if input.is_none() {
        None
    } else {
        Some(json::encode(input, "input")?)
    };
    let start = RunStart {
        run_id,
        workflow,
        preset,
        input,
        scheduled_for,
        owner,
        lease_ms,
    };
    let s = store.inner.clone();
    if now {
        if let Some(st) = py.detach(|| s.run_start_now(&start)) {
            return ready(py, py_started(st));
        }
    }
    spawn(
        py,
        async move { Ok(py_started(s.run_start(&start).await?)) },
    )
}

/// A running run sleeps until `wake_at`.
#[pyfunction]
fn run_suspend<'py>(
    py: Python<'py>,
    store: &NativeStore,
    run_id: String,
    wake_at: i64,
) -> PyResult<Bound<'py, PyAny>> {
    let s = store.inner.clone();
    spawn(py, async move { s.run_suspend(&run_id, wake_at).await })
}

/// The run returned `value` (checked as JSON first): None when this call recorded it, else
/// the result recorded first.
#[pyfunction]
fn run_finish<'py>(
    py: Python<'py>,
    store: &NativeStore,
    run_id: String,
    value: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let text = json::encode(value, "the workflow's result")?;
    let s = store.inner.clone();
    spawn(py, async move { s.run_finish(&run_id, &text).await })
}

/// `run_finish` at once, on the calling thread, when the store can
/// (`JournalStore::run_finish_now`): True when this call recorded `value` (checked as JSON
/// first), False when not done (then call `run_finish`).
#[pyfunction]
fn run_finish_now(store: &NativeStore, run_id: &str, value: &Bound<'_, PyAny>) -> PyResult<bool> {
    let text = json::encode(value, "the workflow's result")?;
    let s = store.inner.clone();
    Ok(value
        .py()
        .detach(|| s.run_finish_now(run_id, &text).is_some()))
}

/// The run's execution failed with `error`.
#[pyfunction]
fn run_fail<'py>(
    py: Python<'py>,
    store: &NativeStore,
    run_id: String,
    error: String,
) -> PyResult<Bound<'py, PyAny>> {
    let s = store.inner.clone();
    spawn(py, async move { s.run_fail(&run_id, &error).await })
}

/// Hand a failed run to the waker; False when it is not failed.
#[pyfunction]
fn run_wake<'py>(
    py: Python<'py>,
    store: &NativeStore,
    run_id: String,
) -> PyResult<Bound<'py, PyAny>> {
    check_key("run_id", &run_id).map_err(to_py)?;
    let s = store.inner.clone();
    spawn(py, async move { s.run_wake(&run_id).await })
}

/// A run and its steps, or None.
#[pyfunction]
fn run_get<'py>(
    py: Python<'py>,
    store: &NativeStore,
    run_id: String,
) -> PyResult<Bound<'py, PyAny>> {
    check_key("run_id", &run_id).map_err(to_py)?;
    let s = store.inner.clone();
    spawn(py, async move {
        Ok(s.run_get(&run_id).await?.map(|(r, steps)| {
            (
                RawRun::from(r),
                steps.into_iter().map(py_step).collect::<Vec<_>>(),
            )
        }))
    })
}

/// A run listing's limit (1 to 10,000) and state filter.
fn check_run_query(state: Option<&str>, limit: i64) -> PyResult<()> {
    if !(1..=10_000).contains(&limit) {
        return Err(InvalidArgumentError::new_err(format!(
            "limit must be between 1 and 10000, got {limit}"
        )));
    }
    if let Some(st) = state {
        if !RUN_STATES.contains(&st) {
            return Err(InvalidArgumentError::new_err(format!(
                "state must be one of {}, got {st:?}",
                RUN_STATES.join(", ")
            )));
        }
    }
    Ok(())
}

/// Runs, newest first.
#[pyfunction]
#[pyo3(signature = (store, state, workflow, limit, before=None))]
fn list_runs<'py>(
    py: Python<'py>,
    store: &NativeStore,
    state: Option<String>,
    workflow: Option<String>,
    limit: i64,
    before: Option<(i64, String)>,
) -> PyResult<Bound<'py, PyAny>> {
    check_run_query(state.as_deref(), limit)?;
    let s = store.inner.clone();
    let q = RunQuery {
        state,
        workflow,
        limit,
        before,
        scan: None,
    };
    spawn(py, async move {
        Ok(s.list_runs(&q)
            .await?
            .into_iter()
            .map(RawRun::from)
            .collect::<Vec<_>>())
    })
}

/// Runs, newest first, of at most `scan` examined past `before`: `(runs, next)`, `next` the
/// cursor of the next page (the last run returned when the page is full, else where the scan
/// ended) or None at the end of the listing.
#[pyfunction]
#[pyo3(signature = (store, state, workflow, limit, scan, before))]
#[allow(clippy::too_many_arguments)]
fn scan_runs<'py>(
    py: Python<'py>,
    store: &NativeStore,
    state: Option<String>,
    workflow: Option<String>,
    limit: i64,
    scan: i64,
    before: Option<(i64, String)>,
) -> PyResult<Bound<'py, PyAny>> {
    check_run_query(state.as_deref(), limit)?;
    if !(limit..=100_000).contains(&scan) {
        return Err(InvalidArgumentError::new_err(format!(
            "scan must be between limit ({limit}) and 100000, got {scan}"
        )));
    }
    let s = store.inner.clone();
    // Without a filter every run examined matches: the plain listing, no window needed.
    let filtered = state.is_some() || workflow.is_some();
    let q = RunQuery {
        state,
        workflow,
        limit,
        before,
        scan: filtered.then_some(scan),
    };
    spawn(py, async move {
        let rows = s.list_runs(&q).await?;
        let next = if rows.len() as i64 == limit {
            rows.last().map(|r| (r.created_at, r.run_id.clone()))
        } else if filtered {
            let before = q.before.as_ref().map(|(at, id)| (*at, id.as_str()));
            s.runs_edge(before, scan).await?
        } else {
            None
        };
        Ok((rows.into_iter().map(RawRun::from).collect::<Vec<_>>(), next))
    })
}

/// Claim up to `limit` due runs of `workflows` for the waker.
#[pyfunction]
fn runs_due<'py>(
    py: Python<'py>,
    store: &NativeStore,
    workflows: Vec<String>,
    owner: String,
    lease_ms: i64,
    limit: i64,
) -> PyResult<Bound<'py, PyAny>> {
    let s = store.inner.clone();
    spawn(py, async move {
        Ok(s.runs_due(&workflows, &owner, lease_ms, limit)
            .await?
            .into_iter()
            .map(RawRun::from)
            .collect::<Vec<_>>())
    })
}

/// Take lock `key`: its fencing token, or None when it is held.
#[pyfunction]
fn lock_acquire<'py>(
    py: Python<'py>,
    store: &NativeStore,
    key: String,
    owner: String,
    ttl_ms: i64,
) -> PyResult<Bound<'py, PyAny>> {
    check_key("lock key", &key).map_err(to_py)?;
    let s = store.inner.clone();
    spawn(
        py,
        async move { s.lock_acquire(&key, &owner, ttl_ms).await },
    )
}

/// `lock_acquire` at once, on the calling thread, when the store can
/// (`JournalStore::lock_acquire_now`): the token, or None when not taken (then call
/// `lock_acquire`, which also answers whether it is held).
#[pyfunction]
fn lock_acquire_now(
    py: Python<'_>,
    store: &NativeStore,
    key: &str,
    owner: &str,
    ttl_ms: i64,
) -> PyResult<Option<i64>> {
    check_key("lock key", key).map_err(to_py)?;
    let s = store.inner.clone();
    Ok(py.detach(|| s.lock_acquire_now(key, owner, ttl_ms)))
}

/// `lock_release` at once, on the calling thread, when the store can: True when released,
/// False when not done (then call `lock_release`).
#[pyfunction]
fn lock_release_now(py: Python<'_>, store: &NativeStore, key: &str, token: i64) -> bool {
    let s = store.inner.clone();
    py.detach(|| s.lock_release_now(key, token).is_some())
}

/// Release lock `key` held with `token`.
#[pyfunction]
fn lock_release<'py>(
    py: Python<'py>,
    store: &NativeStore,
    key: String,
    token: i64,
) -> PyResult<Bound<'py, PyAny>> {
    let s = store.inner.clone();
    spawn(py, async move { s.lock_release(&key, token).await })
}

/// Renews a running run's lease (`lease_ms`, every third of it; fenced by its owner,
/// `lease_owner`) and its run lock, in a tokio task, so a Python thread that blocks does not
/// stop it. The lease and the lock count as held until a
/// deadline `ttl_ms - ttl_ms/6` after the last good renewal was *sent* (the acquisition's,
/// `age_ms` before the keeper was made, for the first): the server's expiry is at least
/// `ttl_ms` after that instant, so the keeper gives the lock up before another holder can
/// take it (the queue's lease-loss rule, docs/DECISIONS.md). It is lost when a renewal answers
/// that it is not ours, or at that deadline: `on_lost("lease-lost")` is then scheduled on the
/// loop. `held()` answers from the same deadline, without a store call, so a caller checks it
/// right before a side effect. `stop()` ends the task and releases the lock; `stop_now()` ends
/// a keeper without a lock at once, unless a renewal is in flight.
#[pyclass(module = "gnl._native")]
pub struct RunKeeper {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    /// True once stopped; the task holds it while a renewal is in flight, so `stop_now` knows
    /// that none runs after it returns.
    stopped: Arc<tokio::sync::Mutex<bool>>,
    /// Whether it keeps a run lock (released by `stop()`).
    locks: bool,
    task: Option<tokio::task::JoinHandle<Option<(String, i64)>>>,
    store: Arc<dyn Store>,
    /// Until when the lock counts as held; `None`: lost (or there is no lock).
    held_until: Arc<std::sync::Mutex<Option<Instant>>>,
}

#[pymethods]
impl RunKeeper {
    #[new]
    #[pyo3(signature = (store, run_id, ttl_ms, lease_owner, lock_key, lock_token, on_lost, event_loop, age_ms=0))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        store: &NativeStore,
        run_id: String,
        ttl_ms: i64,
        lease_owner: Option<String>,
        lock_key: Option<String>,
        lock_token: i64,
        on_lost: Py<PyAny>,
        event_loop: Py<PyAny>,
        age_ms: i64,
    ) -> PyResult<Self> {
        crate::validate::duration_ms("ttl_ms", ttl_ms, 3).map_err(to_py)?;
        if age_ms < 0 {
            return Err(InvalidArgumentError::new_err(format!(
                "age_ms must be >= 0, got {age_ms}"
            )));
        }
        let s = store.inner.clone();
        let (tx, mut rx) = tokio::sync::oneshot::channel::<()>();
        let every = Duration::from_millis((ttl_ms / 3).max(1) as u64);
        // The queue's rule: a lease is given up ttl/6 before it ends.
        let keep = Duration::from_millis((ttl_ms - ttl_ms / 6) as u64);
        let sent = Instant::now()
            .checked_sub(Duration::from_millis(age_ms as u64))
            .unwrap_or_else(Instant::now);
        let kept = lock_key.is_some() || lease_owner.is_some();
        let held_until = Arc::new(std::sync::Mutex::new(kept.then_some(sent + keep)));
        let lost = move || {
            with_python(|py| {
                let _ = event_loop.call_method1(
                    py,
                    "call_soon_threadsafe",
                    (on_lost.clone_ref(py), "lease-lost"),
                );
            });
        };
        let until = held_until.clone();
        let stopped = Arc::new(tokio::sync::Mutex::new(false));
        let gate = stopped.clone();
        let locks = lock_key.is_some();
        let rt = pyo3_async_runtimes::tokio::get_runtime();
        let task = rt.spawn(async move {
            let mut lock = lock_key.map(|k| (k, lock_token));
            // The run's lease, while it is still this execution's.
            let mut lease = lease_owner;
            let mut deadline = sent + keep;
            let give_up = |lock: &mut Option<(String, i64)>, lease: &mut Option<String>| {
                *lock = None;
                *lease = None;
                *until.lock().unwrap() = None;
                lost();
            };
            if (lock.is_some() || lease.is_some()) && Instant::now() >= deadline {
                give_up(&mut lock, &mut lease);
            }
            loop {
                let held = lock.is_some() || lease.is_some();
                tokio::select! {
                    _ = &mut rx => return lock,
                    _ = tokio::time::sleep(every) => {}
                    _ = tokio::time::sleep_until(deadline.into()), if held => {
                        give_up(&mut lock, &mut lease);
                        continue;
                    }
                }
                let gate = gate.lock().await;
                if *gate {
                    return lock;
                }
                let at = Instant::now();
                // (renewed without error, the lease or the lock refused as not ours)
                let renew = async {
                    let mut ok = true;
                    let mut refused = false;
                    if let Some(o) = &lease {
                        match s.run_renew(&run_id, o, ttl_ms).await {
                            Ok(true) => {}
                            Ok(false) => refused = true,
                            Err(_) => ok = false,
                        }
                    }
                    if let Some((k, t)) = &lock {
                        match s.lock_renew(k, *t, ttl_ms).await {
                            Ok(true) => {}
                            Ok(false) => refused = true,
                            Err(_) => ok = false,
                        }
                    }
                    (ok, refused)
                };
                // A renewal still unanswered at the deadline is a loss, then and there.
                let answer = if held {
                    tokio::time::timeout_at(deadline.into(), renew).await.ok()
                } else {
                    Some(renew.await)
                };
                let ok = match answer {
                    None | Some((_, true)) => {
                        give_up(&mut lock, &mut lease);
                        continue;
                    }
                    Some((ok, false)) => ok,
                };
                if ok && held {
                    deadline = at + keep;
                    *until.lock().unwrap() = Some(deadline);
                } else if held && Instant::now() >= deadline {
                    give_up(&mut lock, &mut lease);
                }
                drop(gate);
            }
        });
        Ok(RunKeeper {
            stop: Some(tx),
            stopped,
            locks,
            task: Some(task),
            store: store.inner.clone(),
            held_until,
        })
    }

    /// Whether the lock still counts as held (its deadline is ahead and no renewal was
    /// refused). No store call. False when the keeper has no lock.
    fn held(&self) -> bool {
        self.held_until
            .lock()
            .unwrap()
            .is_some_and(|t| Instant::now() < t)
    }

    /// Stop renewing at once, without a store call: True when stopped (no renewal runs after
    /// this); False, changing nothing, when it keeps a run lock or a renewal is in flight
    /// (then await `stop()`).
    fn stop_now(&mut self) -> bool {
        if self.locks {
            return false;
        }
        let Ok(mut stopped) = self.stopped.try_lock() else {
            return false;
        };
        *stopped = true;
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        self.task = None;
        true
    }

    /// Stop renewing and release the run lock (if still held; a failed release is left to
    /// the lock's expiry).
    fn stop<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        let task = self.task.take();
        let s = self.store.clone();
        spawn(py, async move {
            if let Some(t) = task {
                if let Ok(Some((k, tok))) = t.await {
                    // A release that fails (the store away) changes nothing the caller can
                    // act on: the lock expires `ttl_ms` after its last renewal.
                    let _ = s.lock_release(&k, tok).await;
                }
            }
            Ok(())
        })
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<RawRun>()?;
    m.add_class::<RunKeeper>()?;
    m.add_class::<PyRecorded>()?;
    m.add_function(wrap_pyfunction!(step_get, m)?)?;
    m.add_function(wrap_pyfunction!(step_put, m)?)?;
    m.add_function(wrap_pyfunction!(step_put_now, m)?)?;
    m.add_function(wrap_pyfunction!(step_intent, m)?)?;
    m.add_function(wrap_pyfunction!(step_finish, m)?)?;
    m.add_function(wrap_pyfunction!(step_resolve, m)?)?;
    m.add_function(wrap_pyfunction!(run_start, m)?)?;
    m.add_function(wrap_pyfunction!(run_suspend, m)?)?;
    m.add_function(wrap_pyfunction!(run_finish, m)?)?;
    m.add_function(wrap_pyfunction!(run_finish_now, m)?)?;
    m.add_function(wrap_pyfunction!(run_fail, m)?)?;
    m.add_function(wrap_pyfunction!(run_wake, m)?)?;
    m.add_function(wrap_pyfunction!(run_get, m)?)?;
    m.add_function(wrap_pyfunction!(list_runs, m)?)?;
    m.add_function(wrap_pyfunction!(scan_runs, m)?)?;
    m.add_function(wrap_pyfunction!(runs_due, m)?)?;
    m.add_function(wrap_pyfunction!(lock_acquire, m)?)?;
    m.add_function(wrap_pyfunction!(lock_acquire_now, m)?)?;
    m.add_function(wrap_pyfunction!(lock_release, m)?)?;
    m.add_function(wrap_pyfunction!(lock_release_now, m)?)?;
    Ok(())
}
