//! Job specs from Python (`dict` or `gnl.JobSpec`) -> a `JobBatch`, checked the way `enqueue`
//! checks one job (API.md "Queue"). Runs with the GIL, before anything is sent to the store.

use pyo3::exceptions::PyTypeError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};

use super::errors::{to_py, InvalidArgumentError, InvalidJobError};
use super::json;
use crate::ids::new_job_id;
use crate::model::{Due, JobBatch};
use crate::validate;

/// The last instant accepted (9999-12-31T23:59:59.999Z), in epoch ms (Python:
/// `gnl._native.MAX_INSTANT_MS`).
pub(crate) const MAX_INSTANT_MS: i64 = 253_402_300_799_999;

const SPEC_KEYS: [&str; 3] = ["type", "payload", "options"];
const OPTION_KEYS: [&str; 5] = ["id", "org_id", "run_at", "delay_ms", "max_depth"];

fn did_you_mean(k: &str) -> &'static str {
    match k {
        "orgId" | "org" | "organization" => " (did you mean 'org_id'?)",
        "runAt" => " (did you mean 'run_at'?)",
        "delayMs" | "delay" => " (did you mean 'delay_ms'?)",
        "maxDepth" => " (did you mean 'max_depth'?)",
        "jobId" | "job_id" => " (did you mean 'id'?)",
        _ => "",
    }
}

/// An int argument (a bool or float is the wrong type).
pub fn int_arg(v: &Bound<'_, PyAny>, name: &str) -> PyResult<i64> {
    if v.is_instance_of::<PyBool>() || !v.is_instance_of::<PyInt>() {
        return Err(PyTypeError::new_err(format!(
            "{name} must be an int, not {}",
            v.get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default()
        )));
    }
    v.extract::<i64>().map_err(|_| {
        InvalidArgumentError::new_err(format!(
            "{name} is out of range: {} does not fit in a signed 64-bit integer",
            v.str().map(|s| s.to_string()).unwrap_or_default()
        ))
    })
}

/// An instant: int epoch ms, or an aware datetime (a naive one is refused).
pub fn instant_arg(v: &Bound<'_, PyAny>, name: &str) -> PyResult<i64> {
    if v.is_instance_of::<PyInt>() && !v.is_instance_of::<PyBool>() {
        return int_arg(v, name);
    }
    if v.is_instance_of::<PyFloat>() {
        return Err(PyTypeError::new_err(format!(
            "{name} must be int epoch ms or an aware datetime, not float"
        )));
    }
    let py = v.py();
    let datetime = py.import("datetime")?.getattr("datetime")?;
    if !v.is_instance(&datetime)? {
        return Err(PyTypeError::new_err(format!(
            "{name} must be int epoch ms or an aware datetime, not {}",
            v.get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default()
        )));
    }
    if v.call_method0("utcoffset")?.is_none() {
        return Err(InvalidArgumentError::new_err(format!(
            "{name} is a naive datetime; pass an aware one (e.g. tzinfo=datetime.timezone.utc) or epoch ms"
        )));
    }
    let secs: f64 = v.call_method0("timestamp")?.extract()?;
    Ok((secs * 1000.0).round() as i64)
}

fn opt_present(v: Option<Bound<'_, PyAny>>) -> Option<Bound<'_, PyAny>> {
    v.filter(|v| !v.is_none())
}

/// The name of a dict key, for the messages about unknown keys.
fn key_name(k: &Bound<'_, PyAny>) -> String {
    k.str().map(|s| s.to_string()).unwrap_or_default()
}

/// A str argument borrowed from Python (no copy).
fn str_arg<'a>(v: &'a Bound<'_, PyAny>, name: &str) -> PyResult<&'a str> {
    match v.cast::<PyString>() {
        Ok(s) => s
            .to_str()
            .map_err(|_| InvalidArgumentError::new_err(format!("{name} is not valid Unicode"))),
        Err(_) => Err(PyTypeError::new_err(format!(
            "{name} must be a str, not {}",
            v.get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default()
        ))),
    }
}

/// Check one job and add it to `batch`; returns its id (the caller's str when it gave one).
fn one(spec: &Bound<'_, PyAny>, batch: &mut JobBatch) -> PyResult<Py<PyAny>> {
    let py = spec.py();
    let (typ, payload, opts): (
        Bound<'_, PyAny>,
        Bound<'_, PyAny>,
        [Option<Bound<'_, PyAny>>; 5],
    );
    if let Ok(d) = spec.cast::<PyDict>() {
        let mut found = [None, None, None];
        for (k, v) in d.iter() {
            let i = k
                .cast::<PyString>()
                .ok()
                .and_then(|k| k.to_str().ok())
                .and_then(|k| SPEC_KEYS.iter().position(|x| *x == k));
            match i {
                Some(i) => found[i] = Some(v),
                None => {
                    let ks = key_name(&k);
                    return Err(PyTypeError::new_err(format!(
                        "unknown job key {ks:?}{}; a job is {{'type', 'payload', 'options'}}",
                        did_you_mean(&ks)
                    )));
                }
            }
        }
        let [t, p, options] = found;
        typ = t.ok_or_else(|| PyTypeError::new_err("a job needs a 'type'"))?;
        payload = p.ok_or_else(|| PyTypeError::new_err("a job needs a 'payload'"))?;
        let mut o: [Option<Bound<'_, PyAny>>; 5] = Default::default();
        if let Some(options) = opt_present(options) {
            let od = options.cast::<PyDict>().map_err(|_| {
                PyTypeError::new_err(format!(
                    "a job's 'options' must be a dict, not {}",
                    options
                        .get_type()
                        .name()
                        .map(|n| n.to_string())
                        .unwrap_or_default()
                ))
            })?;
            for (k, v) in od.iter() {
                let i = k
                    .cast::<PyString>()
                    .ok()
                    .and_then(|k| k.to_str().ok())
                    .and_then(|k| OPTION_KEYS.iter().position(|x| *x == k));
                match i {
                    Some(i) => o[i] = Some(v),
                    None => {
                        let ks = key_name(&k);
                        return Err(PyTypeError::new_err(format!(
                            "unknown job option {ks:?}{}; options are {}",
                            did_you_mean(&ks),
                            OPTION_KEYS.join(", ")
                        )));
                    }
                }
            }
        }
        opts = o;
    } else if spec.hasattr(intern!(py, "__gnl_job_spec__"))? {
        typ = spec.getattr(intern!(py, "type"))?;
        payload = spec.getattr(intern!(py, "payload"))?;
        let mut o: [Option<Bound<'_, PyAny>>; 5] = Default::default();
        for (i, k) in OPTION_KEYS.iter().enumerate() {
            o[i] = Some(spec.getattr(*k)?);
        }
        opts = o;
    } else {
        return Err(PyTypeError::new_err(format!(
            "a job must be a dict {{'type', 'payload', 'options'}} or a gnl.JobSpec, not {}",
            spec.get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default()
        )));
    }
    if typ.is_none() {
        return Err(PyTypeError::new_err("type must be a str, not None"));
    }
    let typ_s = str_arg(&typ, "type")?;
    validate::job_type(typ_s).map_err(to_py)?;
    let [id, org, run_at, delay_ms, max_depth] = opts;
    let org = opt_present(org);
    let org_s = match &org {
        Some(o) => {
            let o = str_arg(o, "org_id")?;
            validate::org_id(o).map_err(to_py)?;
            o
        }
        None => "",
    };
    let id = opt_present(id);
    let generated;
    let (id_s, id_obj) = match &id {
        Some(v) => {
            let s = str_arg(v, "id")?;
            validate::job_id(s).map_err(to_py)?;
            (s, v.clone().unbind())
        }
        None => {
            generated = new_job_id();
            (
                generated.as_str(),
                PyString::new(py, &generated).into_any().unbind(),
            )
        }
    };
    let run_at = opt_present(run_at)
        .map(|v| instant_arg(&v, "run_at"))
        .transpose()?;
    let delay_ms = opt_present(delay_ms)
        .map(|v| {
            // One past i64 is past the limit too: say the limit, not the integer width.
            int_arg(&v, "delay_ms").map_err(|e| match v.lt(0) {
                Ok(neg) if e.is_instance_of::<InvalidArgumentError>(v.py()) => {
                    InvalidArgumentError::new_err(if neg {
                        format!("delay_ms must be >= 0 ms, got {v}")
                    } else {
                        format!(
                            "delay_ms must be at most {} (about ten years), got {v}",
                            crate::retry::MAX_RETRY_DELAY_MS
                        )
                    })
                }
                _ => e,
            })
        })
        .transpose()?;
    if run_at.is_some() && delay_ms.is_some() {
        return Err(InvalidArgumentError::new_err(
            "give run_at or delay_ms, not both",
        ));
    }
    if let Some(d) = delay_ms {
        validate::duration_ms("delay_ms", d, 0).map_err(to_py)?;
        if d > crate::retry::MAX_RETRY_DELAY_MS {
            return Err(InvalidArgumentError::new_err(format!(
                "delay_ms must be at most {} (about ten years), got {d}",
                crate::retry::MAX_RETRY_DELAY_MS
            )));
        }
    }
    if let Some(r) = run_at {
        if !(0..=MAX_INSTANT_MS).contains(&r) {
            return Err(InvalidArgumentError::new_err(format!(
                "run_at must be between 0 and {MAX_INSTANT_MS} epoch ms (year 9999), got {r}"
            )));
        }
    }
    let max_depth = opt_present(max_depth)
        .map(|v| int_arg(&v, "max_depth"))
        .transpose()?;
    if let Some(m) = max_depth {
        validate::count("max_depth", m, 1).map_err(to_py)?;
    }
    batch.push_with(
        org_s,
        id_s,
        typ_s,
        Due::of(run_at, delay_ms),
        max_depth,
        |out| json::encode_into(&payload, "payload", out),
    )?;
    Ok(id_obj)
}

/// Check every job and pack them; returns the batch and the jobs' ids in order. The first bad
/// job refuses the call. With `single`, its error is raised as is (`enqueue`); otherwise
/// wrapped in `InvalidJobError` with `.index` (`enqueue_many`).
pub fn convert(
    py: Python<'_>,
    jobs: &Bound<'_, PyAny>,
    single: bool,
) -> PyResult<(JobBatch, Vec<Py<PyAny>>)> {
    let mut whole = None;
    let ids = convert_parts(py, jobs, single, usize::MAX, |b| whole = Some(b))?;
    Ok((whole.unwrap_or_default(), ids))
}

/// `convert`, handing the batch to `emit` in parts of `part_jobs` jobs as they are packed
/// (the last part may be shorter; an empty list gives one empty part). When a job is bad,
/// the parts emitted so far are all there is: the caller abandons them.
pub fn convert_parts(
    py: Python<'_>,
    jobs: &Bound<'_, PyAny>,
    single: bool,
    part_jobs: usize,
    mut emit: impl FnMut(JobBatch),
) -> PyResult<Vec<Py<PyAny>>> {
    let n = jobs.len().unwrap_or(0);
    // Ids and payloads of the peerbench's jobs take ~80 bytes; the buffer grows if needed.
    let part_of = |left: usize| {
        let k = left.min(part_jobs);
        JobBatch::with_capacity(k, k * 80)
    };
    let mut batch = part_of(n);
    let mut ids = Vec::with_capacity(n);
    for (i, spec) in jobs.try_iter()?.enumerate() {
        let spec = spec?;
        match one(&spec, &mut batch) {
            Ok(id) => ids.push(id),
            Err(e) if single => return Err(e),
            Err(e) => {
                let msg = format!("job {i} is invalid: {}", e.value(py));
                let err = InvalidJobError::new_err((msg, i));
                err.set_cause(py, Some(e));
                return Err(err);
            }
        }
        if batch.len() == part_jobs {
            emit(std::mem::replace(
                &mut batch,
                part_of(n.saturating_sub(i + 1)),
            ));
        }
    }
    if !batch.is_empty() || ids.is_empty() {
        emit(batch);
    }
    Ok(ids)
}

/// The organizations of a list of job specs, sorted and distinct ("" for none), read without
/// checking anything else: `None` when `jobs` is not a list or tuple of dicts and
/// `gnl.JobSpec`s whose organization is None or a str (the caller then converts the plain way,
/// which reports what is wrong).
pub fn organizations(jobs: &Bound<'_, PyAny>) -> Option<Vec<String>> {
    let py = jobs.py();
    let items: Vec<Bound<'_, PyAny>> = if let Ok(l) = jobs.cast::<PyList>() {
        l.iter().collect()
    } else if let Ok(t) = jobs.cast::<PyTuple>() {
        t.iter().collect()
    } else {
        return None;
    };
    let mut orgs = std::collections::BTreeSet::<String>::new();
    let mut last: Option<Bound<'_, PyAny>> = None;
    for spec in items {
        let org = if let Ok(d) = spec.cast::<PyDict>() {
            match d.get_item(intern!(py, "options")).ok()? {
                None => None,
                Some(o) if o.is_none() => None,
                Some(o) => o
                    .cast::<PyDict>()
                    .ok()?
                    .get_item(intern!(py, "org_id"))
                    .ok()?,
            }
        } else if spec.hasattr(intern!(py, "__gnl_job_spec__")).ok()? {
            Some(spec.getattr(intern!(py, "org_id")).ok()?)
        } else {
            return None;
        };
        let org = org.filter(|o| !o.is_none());
        // The same str object as the last job's: nothing new.
        if let (Some(o), Some(l)) = (&org, &last) {
            if o.is(l) {
                continue;
            }
        }
        let name = match &org {
            None => "",
            Some(o) => o.cast::<PyString>().ok()?.to_str().ok()?,
        };
        if !orgs.contains(name) {
            orgs.insert(name.to_string());
        }
        last = org;
    }
    Some(orgs.into_iter().collect())
}
