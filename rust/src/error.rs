//! One internal error enum. The pyo3 layer maps each variant to one class of `gnl.errors`
//! (in `py::errors`), so this is the only place that decides what kind of failure a thing is.

use std::fmt;

/// Result alias used across the native core.
pub type Result<T> = std::result::Result<T, Error>;

/// Every failure the native core can report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// A bad argument value (maps to `gnl.InvalidArgumentError`).
    InvalidArgument(String),
    /// An argument of the wrong type (maps to plain `TypeError`).
    WrongType(String),
    /// A refused cron expression (maps to `gnl.CronError`); the message names the field.
    Cron(String),
    /// `max_depth` would be exceeded (maps to `gnl.QueueFullError`).
    QueueFull {
        org: Option<String>,
        depth: i64,
        max_depth: i64,
    },
    /// The store cannot be reached, or is busy past its timeout (maps to
    /// `gnl.StoreUnavailableError`); callers that loop retry it with backoff.
    StoreUnavailable {
        reason: String,
        code: Option<String>,
    },
    /// The database refused a statement (maps to `gnl.GnlError` with `.code`).
    Store {
        message: String,
        code: Option<String>,
    },
    /// The database refused the data of a statement: a value, a constraint (maps to
    /// `gnl.GnlError` with `.code`, like `Store`). Running it again fails again.
    Refused {
        message: String,
        code: Option<String>,
    },
    /// The store's schema is older than this package (`url` is shown: password redacted).
    SchemaOutdated {
        found: i64,
        expected: i64,
        url: String,
        /// The engine whose migrations the versions count (`Store::backend`).
        backend: &'static str,
    },
    /// The store's schema is newer than this package.
    SchemaTooNew { found: i64, expected: i64 },
    /// The server is too old or otherwise unsupported.
    UnsupportedStore(String),
    /// A run is being executed by another execution whose lease is live (maps to
    /// `gnl.RunBusyError` with `at_lock_acquisition=True`); nothing was written.
    RunBusy(String),
    /// The storage was closed.
    Closed,
    /// A call fed in parts was abandoned by its caller before the last part (nothing was
    /// written); the caller has reported why.
    Abandoned,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidArgument(m) | Error::WrongType(m) | Error::Cron(m) | Error::RunBusy(m) => {
                f.write_str(m)
            }
            Error::QueueFull { org, depth, max_depth } => write!(
                f,
                "queue full: organization {} has {depth} pending jobs with this call, max_depth is {max_depth}; nothing was written",
                org.as_deref().map(|o| format!("{o:?}")).unwrap_or_else(|| "<none>".into())
            ),
            Error::StoreUnavailable { reason, code } => match code {
                Some(c) => write!(f, "store unavailable ({c}): {reason}"),
                None => write!(f, "store unavailable: {reason}"),
            },
            Error::Store { message, code } | Error::Refused { message, code } => match code {
                Some(c) => write!(f, "store error ({c}): {message}"),
                None => write!(f, "store error: {message}"),
            },
            // Schema versions count each engine's own migrations (SQLite, Postgres and MySQL
            // differ), so the message names the engine.
            Error::SchemaOutdated { found: 0, expected, url, backend } => write!(
                f,
                "this database holds no gnl store yet (schema version 0; this package needs {} schema {expected}): create it with `gnl upgrade {url}`",
                engine_name(backend)
            ),
            Error::SchemaOutdated { found, expected, url, backend } => write!(
                f,
                "the store's gnl schema is version {found}, this package needs {} schema {expected}: run `gnl upgrade {url}`",
                engine_name(backend)
            ),
            Error::SchemaTooNew { found, expected } => write!(
                f,
                "the store's gnl schema is version {found}, newer than this package's {expected}: upgrade the gnl package"
            ),
            Error::UnsupportedStore(m) => f.write_str(m),
            Error::Closed => f.write_str("this storage is closed"),
            Error::Abandoned => f.write_str("the call was abandoned before its last part"),
        }
    }
}

/// A backend's name (`Store::backend`) as messages spell it.
fn engine_name(backend: &str) -> &str {
    match backend {
        "postgres" => "Postgres",
        "mysql" => "MySQL",
        "sqlite" => "SQLite",
        other => other,
    }
}

impl std::error::Error for Error {}

impl Error {
    /// True when retrying the same call later may succeed (connection lost, busy, pool timeout).
    pub fn is_transient(&self) -> bool {
        matches!(self, Error::StoreUnavailable { .. })
    }

    /// True when the store refused the data of the statement (a value, a constraint): the
    /// same statement fails again however often it is retried.
    pub fn is_data_error(&self) -> bool {
        matches!(self, Error::Refused { .. })
    }

    /// True for a deadlock the server broke by aborting this transaction (Postgres 40P01,
    /// MySQL 1213): the same transaction may simply be run again.
    pub fn is_deadlock(&self) -> bool {
        matches!(self, Error::StoreUnavailable { code: Some(c), .. } if c == "40P01" || c == "1213")
    }

    pub fn invalid(msg: impl Into<String>) -> Self {
        Error::InvalidArgument(msg.into())
    }
}

impl From<crate::cron::CronError> for Error {
    fn from(e: crate::cron::CronError) -> Self {
        Error::Cron(e.message)
    }
}

/// SQLite primary result codes (an extended code's low byte) that mean "try again later"
/// rather than "this statement is wrong": BUSY, LOCKED (and their variants), IOERR (every
/// extended I/O code), FULL, CANTOPEN.
const SQLITE_TRANSIENT: &[u16] = &[5, 6, 10, 13, 14];
/// Postgres SQLSTATEs (besides classes 08, connection, and 53, insufficient resources: disk
/// full, out of memory, too many connections) that mean "try again later": serialization
/// failure, deadlock, read-only transaction (a demoted primary), lock not available
/// (`lock_timeout`), query canceled (`statement_timeout`), admin / crash shutdown, cannot
/// connect now, and "object not in prerequisite state" (55000: a database that is not
/// accepting connections, `ALLOW_CONNECTIONS false` during maintenance).
const PG_TRANSIENT: &[&str] = &[
    "40001", "40P01", "25006", "55000", "55P03", "57014", "57P01", "57P02", "57P03",
];
/// MySQL / MariaDB error numbers that mean "try again later": too many connections, shutdown
/// in progress, lock wait timeout, deadlock, read-only (`--read-only`, 1290; 1836 read-only
/// mode), query interrupted, connection killed, server gone / lost, idle disconnect.
const MYSQL_TRANSIENT: &[u16] = &[
    1040, 1053, 1205, 1213, 1290, 1317, 1836, 1927, 2006, 2013, 4031,
];

/// Postgres SQLSTATE classes of errors caused by the data of a statement: data exception,
/// integrity constraint violation, program limit exceeded (a value too large).
const PG_DATA_CLASSES: &[&str] = &["22", "23", "54"];
/// SQLite primary codes caused by the data: TOOBIG, CONSTRAINT, MISMATCH, RANGE.
const SQLITE_DATA: &[u16] = &[18, 19, 20, 25];
/// MySQL / MariaDB error numbers caused by the data: data too long, bad value, NULL in a NOT
/// NULL column, duplicate key, invalid JSON, check constraint (MySQL 3819, MariaDB 4025),
/// packet too large, value out of range.
const MYSQL_DATA: &[u16] = &[1048, 1062, 1153, 1264, 1292, 1366, 1406, 3140, 3819, 4025];

impl Error {
    /// A SQLite error from its extended result code `ext` and message, classified as the
    /// sqlx path classifies it (transient: `StoreUnavailable`; the data's: `Refused`).
    pub(crate) fn sqlite(ext: i32, message: String) -> Self {
        let p = (ext as u32 & 0xff) as u16;
        let code = Some(ext.to_string());
        if SQLITE_TRANSIENT.contains(&p) {
            Error::StoreUnavailable {
                reason: message,
                code,
            }
        } else if SQLITE_DATA.contains(&p) {
            Error::Refused { message, code }
        } else {
            Error::Store { message, code }
        }
    }
}

impl Error {
    /// A SQLite lock held by another connection (SQLITE_BUSY and its extended codes).
    pub(crate) fn is_sqlite_busy(&self) -> bool {
        match self {
            Error::StoreUnavailable { code: Some(c), .. } => {
                c.parse::<u32>().is_ok_and(|n| n & 0xff == 5)
            }
            _ => false,
        }
    }
}

impl From<sqlx::Error> for Error {
    fn from(e: sqlx::Error) -> Self {
        match e {
            sqlx::Error::Database(db) => {
                // MySQL: carry the error number (more precise than its SQLSTATE).
                let mysql = db
                    .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                    .map(|m| m.number());
                let code = match mysql {
                    Some(n) => Some(n.to_string()),
                    None => db.code().map(|c| c.into_owned()),
                };
                // SQLite reports its extended code: the primary code is its low byte.
                let sqlite = match (mysql, code.as_deref()) {
                    (None, Some(c))
                        if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() =>
                    {
                        c.parse::<u32>().ok().map(|n| (n & 0xff) as u16)
                    }
                    _ => None,
                };
                let (transient, data) = match (mysql, sqlite, code.as_deref()) {
                    (Some(n), _, _) => (MYSQL_TRANSIENT.contains(&n), MYSQL_DATA.contains(&n)),
                    (None, Some(p), _) => (SQLITE_TRANSIENT.contains(&p), SQLITE_DATA.contains(&p)),
                    // Postgres: connection exceptions, insufficient resources, and the list.
                    (None, None, Some(c)) => (
                        c.starts_with("08") || c.starts_with("53") || PG_TRANSIENT.contains(&c),
                        PG_DATA_CLASSES.iter().any(|k| c.starts_with(k)),
                    ),
                    (None, None, None) => (false, false),
                };
                let message = db.message().to_string();
                if transient {
                    Error::StoreUnavailable {
                        reason: message,
                        code,
                    }
                } else if data {
                    Error::Refused { message, code }
                } else {
                    Error::Store { message, code }
                }
            }
            sqlx::Error::Io(io) => Error::StoreUnavailable {
                reason: io.to_string(),
                code: None,
            },
            sqlx::Error::PoolTimedOut => Error::StoreUnavailable {
                reason: "timed out waiting for a connection from the pool".into(),
                code: None,
            },
            sqlx::Error::PoolClosed => Error::Closed,
            sqlx::Error::Tls(t) => Error::StoreUnavailable {
                reason: t.to_string(),
                code: None,
            },
            sqlx::Error::Protocol(p) => Error::StoreUnavailable {
                reason: p,
                code: None,
            },
            other => Error::Store {
                message: other.to_string(),
                code: None,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_outdated_names_the_upgrade_command() {
        let e = Error::SchemaOutdated {
            found: 0,
            expected: 1,
            url: "sqlite:///x.db".into(),
            backend: "sqlite",
        };
        assert!(e.to_string().contains("gnl upgrade sqlite:///x.db"));
        assert!(e.to_string().contains("needs SQLite schema 1"));
    }

    #[test]
    fn extended_sqlite_codes_and_server_timeouts_are_transient() {
        // The review's list: every code an outage or a timeout gives, not the data's fault.
        assert!(SQLITE_TRANSIENT.contains(&((778u32 & 0xff) as u16))); // IOERR_WRITE
        assert!(SQLITE_TRANSIENT.contains(&((1034u32 & 0xff) as u16))); // IOERR_FSYNC
        assert!(SQLITE_TRANSIENT.contains(&((517u32 & 0xff) as u16))); // BUSY_SNAPSHOT
        for c in ["57014", "55P03", "25006", "53100", "53200"] {
            assert!(PG_TRANSIENT.contains(&c) || c.starts_with("53"), "{c}");
        }
        for n in [1290, 1836, 1205, 1213] {
            assert!(MYSQL_TRANSIENT.contains(&n), "{n}");
        }
    }

    #[test]
    fn pool_timeout_is_transient() {
        assert!(Error::from(sqlx::Error::PoolTimedOut).is_transient());
        assert!(!Error::invalid("x").is_transient());
    }
}
