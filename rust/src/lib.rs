//! gnl native core: the store engines, claims, fair lanes, leases and their renewal timers,
//! batched writes and list cursors; cron and misfire arithmetic. Nothing outside `py` imports
//! pyo3, so `cargo test` runs without Python.

pub mod cron;
pub mod cursor;
pub mod error;
pub mod ids;
pub mod misfire;
pub mod model;
pub mod retry;
pub mod store;
pub mod validate;
pub mod worker;

#[cfg(feature = "python")]
mod py;

pub use error::{Error, Result};
