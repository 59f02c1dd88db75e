//! `gnl._native`'s cron and misfire functions (pure; `gnl.cron` wraps the public ones). Each
//! call runs under `catch_unwind`, so a Rust panic becomes a `gnl.GnlError`.

use std::panic::{catch_unwind, AssertUnwindSafe};

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

use super::errors::{internal, to_py, InvalidArgumentError};
use crate::cron::{self, Cron};
use crate::error::Error;
use crate::misfire::{self, Grid, Policy};

/// The longest list `cron_times` builds.
const MAX_COUNT: usize = 1_000_000;

fn guard<T>(f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| Err(internal("a cron call panicked")))
}

fn parse(expr: &str) -> PyResult<Cron> {
    Cron::parse(expr).map_err(|e| to_py(Error::from(e)))
}

/// The first fire time strictly after `after_ms`, or None (none before the year 10000).
#[pyfunction]
fn next_cron_time(expr: &str, after_ms: i64) -> PyResult<Option<i64>> {
    guard(|| Ok(parse(expr)?.next_after(after_ms)))
}

/// The next `count` fire times after `after_ms` (fewer when the year 10000 comes first).
#[pyfunction]
fn cron_times(expr: &str, after_ms: i64, count: usize) -> PyResult<Vec<i64>> {
    if count > MAX_COUNT {
        return Err(InvalidArgumentError::new_err(format!(
            "count must be <= {MAX_COUNT}, got {count}"
        )));
    }
    guard(|| Ok(parse(expr)?.times_after(after_ms, count)))
}

/// The sorted values one field's text denotes over `lo..=hi`.
#[pyfunction]
fn parse_field(text: &str, lo: i64, hi: i64) -> PyResult<Vec<u32>> {
    guard(|| {
        let (Ok(lo), Ok(hi)) = (u32::try_from(lo), u32::try_from(hi)) else {
            return Err(InvalidArgumentError::new_err(format!(
                "parse_field needs 0 <= lo <= hi <= 59, got lo={lo} hi={hi}"
            )));
        };
        cron::parse_field(text, lo, hi).map_err(|e| to_py(Error::from(e)))
    })
}

/// One poll's misfire plan (`crate::misfire::plan`), for tests.
#[pyclass(frozen, module = "gnl._native")]
pub struct MisfirePlan {
    #[pyo3(get)]
    due: u64,
    #[pyo3(get)]
    fire: Option<i64>,
    #[pyo3(get)]
    dropped: u64,
    #[pyo3(get)]
    skipped: u64,
    #[pyo3(get)]
    oldest_skipped: Option<i64>,
    #[pyo3(get)]
    next_slot: Option<i64>,
}

/// `misfire_plan(kind, spec, anchor_ms, slot_ms, now_ms, misfire_grace_ms, misfire,
/// max_catchup)`: `kind` is `"cron"` (spec: the expression), `"every"` (spec: every_ms,
/// anchored at `anchor_ms`) or `"at"` (spec: the instant).
#[pyfunction]
#[allow(clippy::too_many_arguments)]
#[pyo3(signature = (kind, spec, anchor_ms, slot_ms, now_ms, misfire_grace_ms, misfire, max_catchup))]
fn misfire_plan(
    kind: &str,
    spec: &Bound<'_, PyAny>,
    anchor_ms: i64,
    slot_ms: i64,
    now_ms: i64,
    misfire_grace_ms: i64,
    misfire: &str,
    max_catchup: Option<u64>,
) -> PyResult<MisfirePlan> {
    let grid = match kind {
        "cron" => Grid::Cron(parse(&spec.extract::<String>()?)?),
        "every" => {
            let every_ms: i64 = spec.extract()?;
            if every_ms < 1 {
                return Err(InvalidArgumentError::new_err("every_ms must be >= 1"));
            }
            Grid::Every {
                anchor_ms,
                every_ms,
            }
        }
        "at" => Grid::At(spec.extract()?),
        other => {
            return Err(PyTypeError::new_err(format!(
                "kind must be 'cron', 'every' or 'at', not {other:?}"
            )))
        }
    };
    let Some(policy) = Policy::parse(misfire) else {
        return Err(InvalidArgumentError::new_err(format!(
            "misfire must be 'latest', 'earliest', 'none' or 'catchup', not {misfire:?}"
        )));
    };
    if misfire_grace_ms < 0 || max_catchup == Some(0) {
        return Err(InvalidArgumentError::new_err(
            "misfire_grace_ms must be >= 0 and max_catchup >= 1",
        ));
    }
    guard(|| {
        let p = misfire::plan(
            &grid,
            slot_ms,
            now_ms,
            misfire_grace_ms,
            policy,
            max_catchup,
        );
        Ok(MisfirePlan {
            due: p.due,
            fire: p.fire,
            dropped: p.dropped,
            skipped: p.skipped,
            oldest_skipped: p.oldest_skipped,
            next_slot: p.next_slot,
        })
    })
}

/// The warning a poll logs when `max_catchup` skipped occurrences.
#[pyfunction]
fn max_catchup_warning(
    trigger_id: &str,
    max_catchup: u64,
    skipped: u64,
    oldest_skipped_ms: i64,
) -> String {
    misfire::max_catchup_warning(trigger_id, max_catchup, skipped, oldest_skipped_ms)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<MisfirePlan>()?;
    m.add_function(wrap_pyfunction!(next_cron_time, m)?)?;
    m.add_function(wrap_pyfunction!(cron_times, m)?)?;
    m.add_function(wrap_pyfunction!(parse_field, m)?)?;
    m.add_function(wrap_pyfunction!(misfire_plan, m)?)?;
    m.add_function(wrap_pyfunction!(max_catchup_warning, m)?)?;
    Ok(())
}
