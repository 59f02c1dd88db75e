//! Python values -> JSON text, strictly (API.md "Conventions"): dict with str keys, list, str,
//! int, float, bool, None. Anything else is a `TypeError` naming where it sits; NaN and ±inf
//! are an `InvalidArgumentError`. Nothing is written when either is raised.

use std::fmt::Write;

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString};

use super::errors::InvalidArgumentError;

/// Deeper nesting than this is refused (it also stops self-referencing lists).
const MAX_DEPTH: usize = 256;

/// Encode `value` as JSON text; `what` names it in errors ("payload", "result", ...).
pub fn encode(value: &Bound<'_, PyAny>, what: &str) -> PyResult<String> {
    let mut out = String::with_capacity(64);
    encode_into(value, what, &mut out)?;
    Ok(out)
}

/// Append `value` as JSON text to `out`; when it fails, `out` may hold part of it (callers
/// that keep `out` truncate it).
pub fn encode_into(value: &Bound<'_, PyAny>, what: &str, out: &mut String) -> PyResult<()> {
    let mut path = String::with_capacity(32);
    path.push_str(what);
    write(value, out, &mut path, 0)
}

fn write(v: &Bound<'_, PyAny>, out: &mut String, path: &mut String, depth: usize) -> PyResult<()> {
    if depth > MAX_DEPTH {
        return Err(InvalidArgumentError::new_err(format!(
            "{} is nested deeper than {MAX_DEPTH} levels (or refers to itself)",
            shown(path)
        )));
    }
    if v.is_none() {
        out.push_str("null");
    } else if let Ok(s) = v.cast::<PyString>() {
        let s = s.to_str().map_err(|_| {
            InvalidArgumentError::new_err(format!(
                "{path} is a str that is not valid Unicode (a lone surrogate)"
            ))
        })?;
        push_str(out, s);
    } else if let Ok(b) = v.cast::<PyBool>() {
        out.push_str(if b.is_true() { "true" } else { "false" });
    } else if let Ok(i) = v.cast::<PyInt>() {
        if let Ok(n) = i.extract::<i64>() {
            let _ = write!(out, "{n}");
        } else {
            // A big int: int's own decimal form (`int.__repr__`, never a subclass's __str__).
            let text = v
                .py()
                .get_type::<PyInt>()
                .call_method1("__repr__", (i,))
                .map_err(|e| {
                    InvalidArgumentError::new_err(format!(
                        "{path} is an int too large to write as JSON ({})",
                        e.value(v.py())
                    ))
                })?;
            out.push_str(&text.str()?.to_cow()?);
        }
    } else if let Ok(f) = v.cast::<PyFloat>() {
        let x = f.value();
        if !x.is_finite() {
            return Err(InvalidArgumentError::new_err(format!(
                "{path} is {x}: NaN and infinities are not JSON"
            )));
        }
        // serde_json's (ryu's) shortest form, e.g. 1.0, 1e+300.
        match serde_json::Number::from_f64(x) {
            Some(n) => {
                let _ = write!(out, "{n}");
            }
            None => return Err(InvalidArgumentError::new_err(format!("{path} is {x}"))),
        }
    } else if let Ok(d) = v.cast::<PyDict>() {
        out.push('{');
        let base = path.len();
        for (n, (k, val)) in d.iter().enumerate() {
            let key = k.cast::<PyString>().map_err(|_| {
                PyTypeError::new_err(format!(
                    "{path} has a key of type {} ({}); JSON object keys must be str",
                    type_name(&k),
                    k.repr().map(|r| r.to_string()).unwrap_or_default()
                ))
            })?;
            let key = key.to_str().map_err(|_| {
                InvalidArgumentError::new_err(format!("{path} has a key that is not valid Unicode"))
            })?;
            if n > 0 {
                out.push(',');
            }
            push_str(out, key);
            out.push(':');
            path.push('.');
            path.push_str(key);
            write(&val, out, path, depth + 1)?;
            path.truncate(base);
        }
        out.push('}');
    } else if let Ok(l) = v.cast::<PyList>() {
        out.push('[');
        let base = path.len();
        for (n, item) in l.iter().enumerate() {
            if n > 0 {
                out.push(',');
            }
            let _ = write!(path, "[{n}]");
            write(&item, out, path, depth + 1)?;
            path.truncate(base);
        }
        out.push(']');
    } else {
        let t = type_name(v);
        let hint = match t.as_str() {
            "tuple" => " (use a list)",
            "set" | "frozenset" => " (use a sorted list)",
            "datetime" | "date" => " (use epoch ms or an ISO-8601 str)",
            "bytes" | "bytearray" => " (use a str, e.g. base64)",
            "Decimal" => " (use a str or a float)",
            _ => "",
        };
        return Err(PyTypeError::new_err(format!(
            "{} is of type {t}, which is not JSON{hint}",
            shown(path)
        )));
    }
    Ok(())
}

/// `path` for a message: whole up to `SHOWN_PATH` characters, else its start and end around
/// "..." (a 256-deep path is ~800 characters of `[0]`).
fn shown(path: &str) -> String {
    const SHOWN_PATH: usize = 96;
    let n = path.chars().count();
    if n <= SHOWN_PATH {
        return path.to_owned();
    }
    let head: String = path.chars().take(SHOWN_PATH / 2).collect();
    let tail: String = path.chars().skip(n - SHOWN_PATH / 2 + 8).collect();
    format!("{head}...{tail}")
}

fn type_name(v: &Bound<'_, PyAny>) -> String {
    v.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

/// `s` as a JSON string, escaped as serde_json escapes it: quotes, backslashes and control
/// characters; everything else (non-ASCII included) as is.
fn push_str(out: &mut String, s: &str) {
    out.reserve(s.len() + 2);
    out.push('"');
    let mut start = 0;
    for (i, &b) in s.as_bytes().iter().enumerate() {
        let esc = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0x08 => "\\b",
            0x0c => "\\f",
            0x00..=0x1f => "",
            _ => continue,
        };
        // `b` is ASCII, so `i` is a char boundary.
        out.push_str(&s[start..i]);
        if esc.is_empty() {
            let _ = write!(out, "\\u{b:04x}");
        } else {
            out.push_str(esc);
        }
        start = i + 1;
    }
    out.push_str(&s[start..]);
    out.push('"');
}
