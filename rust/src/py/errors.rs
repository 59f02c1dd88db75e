//! The one place where a native `Error` becomes a Python exception of `gnl.errors`.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

use crate::error::Error;

pyo3::import_exception!(gnl.errors, GnlError);
pyo3::import_exception!(gnl.errors, InvalidArgumentError);
pyo3::import_exception!(gnl.errors, CronError);
pyo3::import_exception!(gnl.errors, InvalidJobError);
pyo3::import_exception!(gnl.errors, QueueFullError);
pyo3::import_exception!(gnl.errors, StoreUnavailableError);
pyo3::import_exception!(gnl.errors, SchemaOutdatedError);
pyo3::import_exception!(gnl.errors, SchemaTooNewError);
pyo3::import_exception!(gnl.errors, UnsupportedStoreError);
pyo3::import_exception!(gnl.errors, RunBusyError);

/// Convert a native error into the matching `gnl.errors` class (lazily: no GIL needed).
pub fn to_py(e: Error) -> PyErr {
    let msg = e.to_string();
    match e {
        Error::InvalidArgument(_) => InvalidArgumentError::new_err(msg),
        Error::WrongType(_) => PyTypeError::new_err(msg),
        Error::Cron(_) => CronError::new_err(msg),
        Error::QueueFull {
            org,
            depth,
            max_depth,
        } => QueueFullError::new_err((msg, org, depth, max_depth)),
        Error::StoreUnavailable { reason, code } => {
            StoreUnavailableError::new_err((msg, code, reason))
        }
        Error::Store { code, .. } | Error::Refused { code, .. } => GnlError::new_err((msg, code)),
        Error::SchemaOutdated {
            found, expected, ..
        } => SchemaOutdatedError::new_err((msg, found, expected)),
        Error::SchemaTooNew { found, expected } => {
            SchemaTooNewError::new_err((msg, found, expected))
        }
        Error::UnsupportedStore(_) => UnsupportedStoreError::new_err(msg),
        Error::RunBusy(_) => RunBusyError::new_err((msg, true)),
        Error::Closed | Error::Abandoned => GnlError::new_err(msg),
    }
}

/// The error that stands in for a Rust panic: a `GnlError`, never a `PanicException`.
pub fn internal(what: &str) -> PyErr {
    GnlError::new_err(format!(
        "internal error in gnl's native core ({what}); please report it"
    ))
}
