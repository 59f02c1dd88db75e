//! `gnl._native`'s scheduler functions (`gnl.scheduler` wraps them): the `TriggerStore` calls.
//! The fire lock and its renewal are the journal's (`lock_acquire`, `RunKeeper`). Keys are
//! checked here before anything is written.

use pyo3::prelude::*;

use super::errors::to_py;
use super::{spawn, NativeStore};
use crate::store::triggers::{check_trigger_key, TriggerDef, TriggerRow, TriggerState};

/// A trigger as stored, for `gnl.TriggerInfo` (input still JSON text).
#[pyclass(frozen, get_all, module = "gnl._native")]
pub struct RawTrigger {
    id: String,
    name: String,
    kind: String,
    spec: String,
    anchor_ms: i64,
    misfire: String,
    max_catchup: Option<i64>,
    misfire_grace_ms: i64,
    input: Option<String>,
    max_attempts: i64,
    definition: String,
    state: String,
    fire_count: i64,
    next_run_at: Option<i64>,
    owed_slot: Option<i64>,
    retry_slot: Option<i64>,
    attempts: i64,
    last_error: Option<String>,
    last_fired_at: Option<i64>,
    last_scheduled_for: Option<i64>,
    missed: i64,
    deferrals: i64,
    last_deferral_at: Option<i64>,
    version: i64,
    created_at: i64,
    updated_at: i64,
}

impl From<TriggerRow> for RawTrigger {
    fn from(r: TriggerRow) -> Self {
        let (d, s) = (r.def, r.state);
        RawTrigger {
            id: d.id,
            name: d.name,
            kind: d.kind,
            spec: d.spec,
            anchor_ms: d.anchor_ms,
            misfire: d.misfire,
            max_catchup: d.max_catchup,
            misfire_grace_ms: d.misfire_grace_ms,
            input: d.input,
            max_attempts: d.max_attempts,
            definition: d.definition,
            state: s.state,
            fire_count: s.fire_count,
            next_run_at: s.next_run_at,
            owed_slot: s.owed_slot,
            retry_slot: s.retry_slot,
            attempts: s.attempts,
            last_error: s.last_error,
            last_fired_at: s.last_fired_at,
            last_scheduled_for: s.last_scheduled_for,
            missed: s.missed,
            deferrals: s.deferrals,
            last_deferral_at: s.last_deferral_at,
            version: r.version,
            created_at: r.created_at,
            updated_at: r.updated_at,
        }
    }
}

/// `(id, name, kind, spec, anchor_ms, misfire, max_catchup, misfire_grace_ms, input,
/// max_attempts, definition)`.
type PyDef = (
    String,
    String,
    String,
    String,
    i64,
    String,
    Option<i64>,
    i64,
    Option<String>,
    i64,
    String,
);

/// `(state, fire_count, next_run_at, owed_slot, retry_slot, attempts, last_error,
/// last_fired_at, last_scheduled_for, missed, deferrals, last_deferral_at)`.
type PyState = (
    String,
    i64,
    Option<i64>,
    Option<i64>,
    Option<i64>,
    i64,
    Option<String>,
    Option<i64>,
    Option<i64>,
    i64,
    i64,
    Option<i64>,
);

fn state_of(s: PyState) -> TriggerState {
    TriggerState {
        state: s.0,
        fire_count: s.1,
        next_run_at: s.2,
        owed_slot: s.3,
        retry_slot: s.4,
        attempts: s.5,
        // Postgres text cannot hold NUL.
        last_error: s.6.map(|e| e.replace('\0', "\u{FFFD}")),
        last_fired_at: s.7,
        last_scheduled_for: s.8,
        missed: s.9,
        deferrals: s.10,
        last_deferral_at: s.11,
    }
}

/// Register a trigger unless its id is: `(created, the trigger as stored)`.
#[pyfunction]
fn trigger_register<'py>(
    py: Python<'py>,
    store: &NativeStore,
    def: PyDef,
    initial: PyState,
) -> PyResult<Bound<'py, PyAny>> {
    check_trigger_key("id", &def.0).map_err(to_py)?;
    check_trigger_key("name", &def.1).map_err(to_py)?;
    let d = TriggerDef {
        id: def.0,
        name: def.1,
        kind: def.2,
        spec: def.3,
        anchor_ms: def.4,
        misfire: def.5,
        max_catchup: def.6,
        misfire_grace_ms: def.7,
        input: def.8,
        max_attempts: def.9,
        definition: def.10,
    };
    let st = state_of(initial);
    let s = store.inner.clone();
    spawn(py, async move {
        let (created, row) = crate::store::triggers::register(&*s, &d, &st).await?;
        Ok((created, RawTrigger::from(row)))
    })
}

/// Due triggers: `(now_ms, [RawTrigger], next_due_ms)` (`DueTriggers`).
#[pyfunction]
#[pyo3(signature = (store, now_ms, after, limit))]
fn triggers_due<'py>(
    py: Python<'py>,
    store: &NativeStore,
    now_ms: Option<i64>,
    after: Option<(i64, String)>,
    limit: i64,
) -> PyResult<Bound<'py, PyAny>> {
    let s = store.inner.clone();
    spawn(py, async move {
        let due = s.triggers_due(now_ms, after, limit).await?;
        Ok((
            due.now_ms,
            due.rows
                .into_iter()
                .map(RawTrigger::from)
                .collect::<Vec<_>>(),
            due.next_due_ms,
        ))
    })
}

/// One trigger, or None.
#[pyfunction]
fn trigger_get<'py>(
    py: Python<'py>,
    store: &NativeStore,
    id: String,
) -> PyResult<Bound<'py, PyAny>> {
    let s = store.inner.clone();
    spawn(py, async move {
        Ok(s.trigger_get(&id).await?.map(RawTrigger::from))
    })
}

/// The triggers after `after` (None: from the first), by id, at most `limit` (None: all).
#[pyfunction]
#[pyo3(signature = (store, after=None, limit=None))]
fn list_triggers<'py>(
    py: Python<'py>,
    store: &NativeStore,
    after: Option<String>,
    limit: Option<i64>,
) -> PyResult<Bound<'py, PyAny>> {
    let s = store.inner.clone();
    spawn(py, async move {
        Ok(s.list_triggers(after.as_deref(), limit.unwrap_or(i64::MAX))
            .await?
            .into_iter()
            .map(RawTrigger::from)
            .collect::<Vec<_>>())
    })
}

/// Compare-and-set the trigger's state (`fence`: `(lock_key, token)` of the fire lock).
#[pyfunction]
#[pyo3(signature = (store, id, version, state, fence))]
fn trigger_update<'py>(
    py: Python<'py>,
    store: &NativeStore,
    id: String,
    version: i64,
    state: PyState,
    fence: Option<(String, i64)>,
) -> PyResult<Bound<'py, PyAny>> {
    let st = state_of(state);
    let s = store.inner.clone();
    spawn(py, async move {
        s.trigger_update(
            &id,
            version,
            &st,
            fence.as_ref().map(|(k, t)| (k.as_str(), *t)),
        )
        .await
    })
}

/// Remove a trigger; False when there was none.
#[pyfunction]
fn trigger_delete<'py>(
    py: Python<'py>,
    store: &NativeStore,
    id: String,
) -> PyResult<Bound<'py, PyAny>> {
    let s = store.inner.clone();
    spawn(py, async move { s.trigger_delete(&id).await })
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<RawTrigger>()?;
    m.add_function(wrap_pyfunction!(trigger_register, m)?)?;
    m.add_function(wrap_pyfunction!(triggers_due, m)?)?;
    m.add_function(wrap_pyfunction!(trigger_get, m)?)?;
    m.add_function(wrap_pyfunction!(list_triggers, m)?)?;
    m.add_function(wrap_pyfunction!(trigger_update, m)?)?;
    m.add_function(wrap_pyfunction!(trigger_delete, m)?)?;
    Ok(())
}
