//! `gnl._native`'s event functions (`gnl.events` wraps them): emit (specs checked as
//! `enqueue` checks jobs, packed into one `JobBatch`, written in one transaction), a consumer's
//! open / fetch / settle under its lease's fencing token, lag, and quarantine records.

use pyo3::prelude::*;

use super::errors::{to_py, InvalidArgumentError};
use super::{jobs, spawn, NativeStore};
use crate::store::events::{check_name, EventOutcome, EventRow};

/// An event as Python sees it: `(seq, id, org, payload_json, emitted_at, attempt)`.
type PyEvent = (i64, String, String, String, i64, i64);

/// A quarantine record: `(id, seq, org, attempts, error, at, payload_json, handed_back)`.
type PyDead = (String, i64, String, i64, String, i64, String, bool);

fn names(topic: &str, name: Option<&str>) -> PyResult<()> {
    check_name("topic", topic).map_err(to_py)?;
    if let Some(n) = name {
        check_name("consumer name", n).map_err(to_py)?;
    }
    Ok(())
}

/// Append events (job-shaped specs: the type field is unused) to `topic`; their ids in order.
/// One invalid spec refuses the call before anything is written.
#[pyfunction]
fn event_emit<'py>(
    py: Python<'py>,
    store: &NativeStore,
    topic: String,
    specs: &Bound<'py, PyAny>,
    single: bool,
) -> PyResult<Bound<'py, PyAny>> {
    names(&topic, None)?;
    let (batch, ids) = jobs::convert(py, specs, single)?;
    let s = store.inner.clone();
    spawn(py, async move {
        s.emit(&topic, &batch).await?;
        if !batch.is_empty() {
            s.wakeups().changed(crate::store::Topic::Events);
        }
        Ok(ids)
    })
}

/// Bind the consumer to a fresh lease's fencing token.
#[pyfunction]
fn event_consumer_open<'py>(
    py: Python<'py>,
    store: &NativeStore,
    topic: String,
    name: String,
    token: i64,
) -> PyResult<Bound<'py, PyAny>> {
    names(&topic, Some(&name))?;
    let s = store.inner.clone();
    spawn(
        py,
        async move { s.consumer_open(&topic, &name, token).await },
    )
}

/// The next due events for the holder of `token`; None when it no longer holds the consumer.
#[pyfunction]
fn event_fetch<'py>(
    py: Python<'py>,
    store: &NativeStore,
    topic: String,
    name: String,
    token: i64,
    limit: i64,
) -> PyResult<Bound<'py, PyAny>> {
    let s = store.inner.clone();
    spawn(py, async move {
        Ok(s.event_fetch(&topic, &name, token, limit)
            .await?
            .map(py_events))
    })
}

/// `event_fetch` at once on the calling thread (the GIL released meanwhile) when the store
/// can (a SQLite file whose locks are free): `(rows,)` (rows None: `token` no longer holds the
/// consumer), or None when nothing was done (then call `event_fetch`).
#[pyfunction]
fn event_fetch_now(
    py: Python<'_>,
    store: &NativeStore,
    topic: &str,
    name: &str,
    token: i64,
    limit: i64,
) -> PyResult<Option<(Option<Vec<PyEvent>>,)>> {
    let s = store.inner.clone();
    match py.detach(|| s.event_fetch_now(topic, name, token, limit)) {
        None => Ok(None),
        Some(r) => Ok(Some((r.map_err(to_py)?.map(py_events),))),
    }
}

fn py_events(rows: Vec<EventRow>) -> Vec<PyEvent> {
    rows.into_iter()
        .map(|e| (e.seq, e.id, e.org, e.payload, e.emitted_at, e.attempt))
        .collect()
}

type PyOutcome = (i64, Option<String>, Option<i64>);

fn outcomes_of(outcomes: Vec<PyOutcome>) -> Vec<EventOutcome> {
    outcomes
        .into_iter()
        .map(|(seq, error, retry)| match error {
            None => EventOutcome::Accepted { seq },
            Some(error) => EventOutcome::Failed {
                seq,
                error,
                retry_after_ms: retry,
            },
        })
        .collect()
}

/// `event_settle` at once on the calling thread when the store can (as `event_fetch_now`):
/// True / False as `event_settle`, or None when nothing was done (then call `event_settle`).
#[pyfunction]
fn event_settle_now(
    py: Python<'_>,
    store: &NativeStore,
    topic: &str,
    name: &str,
    token: i64,
    outcomes: Vec<PyOutcome>,
) -> PyResult<Option<bool>> {
    let outs = outcomes_of(outcomes);
    let s = store.inner.clone();
    py.detach(|| s.event_settle_now(topic, name, token, &outs))
        .transpose()
        .map_err(to_py)
}

/// Write outcomes `(seq, error, retry_after_ms)`: error None = accepted; retry None =
/// quarantined. False when `token` no longer holds the consumer.
#[pyfunction]
fn event_settle<'py>(
    py: Python<'py>,
    store: &NativeStore,
    topic: String,
    name: String,
    token: i64,
    outcomes: Vec<PyOutcome>,
) -> PyResult<Bound<'py, PyAny>> {
    let outs = outcomes_of(outcomes);
    let s = store.inner.clone();
    spawn(py, async move {
        s.event_settle(&topic, &name, token, &outs).await
    })
}

/// `(cursor, behind, oldest_unacked_at, heartbeat_at, dead)` or None.
#[pyfunction]
fn event_lag<'py>(
    py: Python<'py>,
    store: &NativeStore,
    topic: String,
    name: String,
) -> PyResult<Bound<'py, PyAny>> {
    names(&topic, Some(&name))?;
    let s = store.inner.clone();
    spawn(py, async move {
        Ok(s.consumer_lag(&topic, &name).await?.map(|l| {
            (
                l.cursor,
                l.behind,
                l.oldest_unacked_at,
                l.heartbeat_at,
                l.dead,
            )
        }))
    })
}

/// The consumer's quarantine records in log order, past `after_seq`, at most `limit`.
#[pyfunction]
#[pyo3(signature = (store, topic, name, after_seq=0, limit=i64::MAX))]
fn event_dead<'py>(
    py: Python<'py>,
    store: &NativeStore,
    topic: String,
    name: String,
    after_seq: i64,
    limit: i64,
) -> PyResult<Bound<'py, PyAny>> {
    names(&topic, Some(&name))?;
    if limit < 1 {
        return Err(InvalidArgumentError::new_err(format!(
            "limit must be at least 1, got {limit}"
        )));
    }
    let s = store.inner.clone();
    spawn(py, async move {
        Ok(s.dead_events(&topic, &name, after_seq, limit)
            .await?
            .into_iter()
            .map(|d| {
                (
                    d.id,
                    d.seq,
                    d.org,
                    d.attempts,
                    d.error,
                    d.at,
                    d.payload,
                    d.handed_back,
                )
            })
            .collect::<Vec<PyDead>>())
    })
}

/// The consumers that ever ran, `(topic, name, heartbeat_at, dead)` in `(topic, name)` order,
/// after `after`, at most `limit` (1 to 10,000).
#[pyfunction]
#[pyo3(signature = (store, after, limit))]
fn event_consumers<'py>(
    py: Python<'py>,
    store: &NativeStore,
    after: Option<(String, String)>,
    limit: i64,
) -> PyResult<Bound<'py, PyAny>> {
    if !(1..=10_000).contains(&limit) {
        return Err(InvalidArgumentError::new_err(format!(
            "limit must be between 1 and 10000, got {limit}"
        )));
    }
    let s = store.inner.clone();
    spawn(py, async move {
        let after = after.as_ref().map(|(t, n)| (t.as_str(), n.as_str()));
        Ok(s.consumers(after, limit)
            .await?
            .into_iter()
            .map(|c| (c.topic, c.name, c.heartbeat_at, c.dead))
            .collect::<Vec<_>>())
    })
}

/// Hand quarantined event `id` back.
#[pyfunction]
fn event_dead_retry<'py>(
    py: Python<'py>,
    store: &NativeStore,
    topic: String,
    name: String,
    id: String,
) -> PyResult<Bound<'py, PyAny>> {
    names(&topic, Some(&name))?;
    crate::validate::lookup_id("id", &id, "event").map_err(to_py)?;
    crate::validate::job_id(&id).map_err(to_py)?;
    let s = store.inner.clone();
    spawn(py, async move { s.dead_retry(&topic, &name, &id).await })
}

/// The lock key of consumer `(topic, name)`'s lease (checks both names).
#[pyfunction]
fn event_lease_key(topic: &str, name: &str) -> PyResult<String> {
    names(topic, Some(name))?;
    Ok(crate::store::events::lease_key(topic, name))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(event_emit, m)?)?;
    m.add_function(wrap_pyfunction!(event_lease_key, m)?)?;
    m.add_function(wrap_pyfunction!(event_consumer_open, m)?)?;
    m.add_function(wrap_pyfunction!(event_fetch, m)?)?;
    m.add_function(wrap_pyfunction!(event_settle, m)?)?;
    m.add_function(wrap_pyfunction!(event_fetch_now, m)?)?;
    m.add_function(wrap_pyfunction!(event_settle_now, m)?)?;
    m.add_function(wrap_pyfunction!(event_lag, m)?)?;
    m.add_function(wrap_pyfunction!(event_dead, m)?)?;
    m.add_function(wrap_pyfunction!(event_dead_retry, m)?)?;
    m.add_function(wrap_pyfunction!(event_consumers, m)?)?;
    Ok(())
}
