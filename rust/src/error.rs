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
    /// The store's schema is older than this package (`url` is shown: password redacted).
    SchemaOutdated {
        found: i64,
        expected: i64,
        url: String,
    },
    /// The store's schema is newer than this package.
    SchemaTooNew { found: i64, expected: i64 },
    /// The server is too old or otherwise unsupported.
    UnsupportedStore(String),
    /// The storage was closed.
    Closed,
    /// A call fed in parts was abandoned by its caller before the last part (nothing was
    /// written); the caller has reported why.
    Abandoned,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidArgument(m) | Error::WrongType(m) | Error::Cron(m) => f.write_str(m),
            Error::QueueFull { org, depth, max_depth } => write!(
                f,
                "queue full: organization {} has {depth} pending jobs with this call, max_depth is {max_depth}; nothing was written",
                org.as_deref().map(|o| format!("{o:?}")).unwrap_or_else(|| "<none>".into())
            ),
            Error::StoreUnavailable { reason, code } => match code {
                Some(c) => write!(f, "store unavailable ({c}): {reason}"),
                None => write!(f, "store unavailable: {reason}"),
            },
            Error::Store { message, code } => match code {
                Some(c) => write!(f, "store error ({c}): {message}"),
                None => write!(f, "store error: {message}"),
            },
            Error::SchemaOutdated { found, expected, url } => write!(
                f,
                "the store's gnl schema is version {found}, this package needs {expected}: run `gnl upgrade {url}`"
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

impl std::error::Error for Error {}

impl Error {
    /// True when retrying the same call later may succeed (connection lost, busy, pool timeout).
    pub fn is_transient(&self) -> bool {
        matches!(self, Error::StoreUnavailable { .. })
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

/// SQLite result codes that mean "try again later" rather than "this statement is wrong".
const SQLITE_TRANSIENT: &[&str] = &["5", "6", "261", "262", "517", "10", "14"];
/// Postgres SQLSTATEs (besides class 08) that mean "try again later".
const PG_TRANSIENT: &[&str] = &["40001", "40P01", "53300", "57P01", "57P02", "57P03"];
/// MySQL / MariaDB error numbers that mean "try again later".
const MYSQL_TRANSIENT: &[u16] = &[1040, 1053, 1205, 1213, 1927, 2006, 2013, 4031];

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
                let transient = match (mysql, code.as_deref()) {
                    // MySQL: lock wait timeout, deadlock, too many connections, shutdown in
                    // progress, connection killed, server gone / lost, idle disconnect.
                    (Some(n), _) => MYSQL_TRANSIENT.contains(&n),
                    // SQLite: busy / locked / IO / cantopen.
                    (None, Some(c)) if SQLITE_TRANSIENT.contains(&c) => true,
                    // Postgres: connection exceptions, serialization failure, deadlock, too
                    // many connections, admin shutdown, crash shutdown, cannot connect now.
                    (None, Some(c)) => c.starts_with("08") || PG_TRANSIENT.contains(&c),
                    (None, None) => false,
                };
                if transient {
                    Error::StoreUnavailable {
                        reason: db.message().to_string(),
                        code,
                    }
                } else {
                    Error::Store {
                        message: db.message().to_string(),
                        code,
                    }
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
        };
        assert!(e.to_string().contains("gnl upgrade sqlite:///x.db"));
    }

    #[test]
    fn pool_timeout_is_transient() {
        assert!(Error::from(sqlx::Error::PoolTimedOut).is_transient());
        assert!(!Error::invalid("x").is_transient());
    }
}
