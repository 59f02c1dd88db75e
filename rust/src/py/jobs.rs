//! Job specs from Python (`dict` or `gnl.JobSpec`) -> `NewJob`, checked the way `enqueue`
//! checks one job (API.md "Queue"). Runs with the GIL, before anything is sent to the store.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyString};

use super::errors::{to_py, InvalidArgumentError, InvalidJobError};
use super::json;
use crate::ids::new_job_id;
use crate::model::NewJob;
use crate::validate;

/// The last instant accepted (9999-12-31T23:59:59.999Z), in epoch ms.
const MAX_INSTANT_MS: i64 = 253_402_300_799_999;

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
    v.extract::<i64>()
        .map_err(|_| InvalidArgumentError::new_err(format!("{name} is out of range")))
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

fn opt_str(v: Option<Bound<'_, PyAny>>, name: &str) -> PyResult<Option<String>> {
    match v {
        None => Ok(None),
        Some(v) if v.is_none() => Ok(None),
        Some(v) => match v.cast::<PyString>() {
            Ok(s) => Ok(Some(
                s.to_str()
                    .map_err(|_| {
                        InvalidArgumentError::new_err(format!("{name} is not valid Unicode"))
                    })?
                    .to_string(),
            )),
            Err(_) => Err(PyTypeError::new_err(format!(
                "{name} must be a str, not {}",
                v.get_type()
                    .name()
                    .map(|n| n.to_string())
                    .unwrap_or_default()
            ))),
        },
    }
}

fn opt_present(v: Option<Bound<'_, PyAny>>) -> Option<Bound<'_, PyAny>> {
    v.filter(|v| !v.is_none())
}

/// Check one job and turn it into a `NewJob`.
fn one(spec: &Bound<'_, PyAny>) -> PyResult<NewJob> {
    let (typ, payload, opts): (
        Bound<'_, PyAny>,
        Bound<'_, PyAny>,
        [Option<Bound<'_, PyAny>>; 5],
    );
    if let Ok(d) = spec.cast::<PyDict>() {
        for k in d.keys() {
            let ks: String = k.str()?.to_string();
            if !SPEC_KEYS.contains(&ks.as_str()) {
                return Err(PyTypeError::new_err(format!(
                    "unknown job key {ks:?}{}; a job is {{'type', 'payload', 'options'}}",
                    did_you_mean(&ks)
                )));
            }
        }
        typ = d
            .get_item("type")?
            .ok_or_else(|| PyTypeError::new_err("a job needs a 'type'"))?;
        payload = d
            .get_item("payload")?
            .ok_or_else(|| PyTypeError::new_err("a job needs a 'payload'"))?;
        let mut o: [Option<Bound<'_, PyAny>>; 5] = Default::default();
        if let Some(options) = opt_present(d.get_item("options")?) {
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
                let ks: String = k.str()?.to_string();
                match OPTION_KEYS.iter().position(|x| *x == ks) {
                    Some(i) => o[i] = Some(v),
                    None => {
                        return Err(PyTypeError::new_err(format!(
                            "unknown job option {ks:?}{}; options are {}",
                            did_you_mean(&ks),
                            OPTION_KEYS.join(", ")
                        )))
                    }
                }
            }
        }
        opts = o;
    } else if spec.hasattr("__gnl_job_spec__")? {
        typ = spec.getattr("type")?;
        payload = spec.getattr("payload")?;
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
    let typ = opt_str(Some(typ), "type")?
        .ok_or_else(|| PyTypeError::new_err("type must be a str, not None"))?;
    validate::job_type(&typ).map_err(to_py)?;
    let [id, org, run_at, delay_ms, max_depth] = opts;
    let org = opt_str(org, "org_id")?;
    if let Some(o) = &org {
        validate::org_id(o).map_err(to_py)?;
    }
    let id = match opt_str(id, "id")? {
        Some(id) => {
            validate::job_id(&id).map_err(to_py)?;
            id
        }
        None => new_job_id(),
    };
    let run_at = opt_present(run_at)
        .map(|v| instant_arg(&v, "run_at"))
        .transpose()?;
    let delay_ms = opt_present(delay_ms)
        .map(|v| int_arg(&v, "delay_ms"))
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
    let payload = json::encode(&payload, "payload")?;
    Ok(NewJob {
        org: org.unwrap_or_default(),
        id,
        typ,
        payload,
        run_at,
        delay_ms,
        max_depth,
    })
}

/// Check every job; the first bad one refuses the call. With `single`, its error is raised as
/// is (`enqueue`); otherwise wrapped in `InvalidJobError` with `.index` (`enqueue_many`).
pub fn convert(py: Python<'_>, jobs: &Bound<'_, PyAny>, single: bool) -> PyResult<Vec<NewJob>> {
    let mut out = Vec::with_capacity(jobs.len().unwrap_or(0));
    for (i, spec) in jobs.try_iter()?.enumerate() {
        let spec = spec?;
        match one(&spec) {
            Ok(j) => out.push(j),
            Err(e) if single => return Err(e),
            Err(e) => {
                let msg = format!("job {i} is invalid: {}", e.value(py));
                let err = InvalidJobError::new_err((msg, i));
                err.set_cause(py, Some(e));
                return Err(err);
            }
        }
    }
    Ok(out)
}
