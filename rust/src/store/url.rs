//! Store URLs (API.md "Connecting").

use crate::error::{Error, Result};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SqliteTarget {
    Memory,
    File(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Sqlite(SqliteTarget),
    Postgres(String),
    Mysql(String),
}

const ACCEPTED: &str =
    "sqlite:///relative/path.db, sqlite:////absolute/path.db, sqlite::memory:, postgres://..., postgresql://..., mysql://...";

/// Parse a store URL. `sqlite:///x.db` is relative to the working directory,
/// `sqlite:////x.db` absolute.
pub fn parse(url: &str) -> Result<Target> {
    if url == "sqlite::memory:" || url == "sqlite://:memory:" {
        return Ok(Target::Sqlite(SqliteTarget::Memory));
    }
    if let Some(rest) = url.strip_prefix("sqlite://") {
        let path = rest.strip_prefix('/').unwrap_or(rest);
        if path.is_empty() {
            return Err(Error::invalid(format!(
                "store URL {url:?} names no file; accepted: {ACCEPTED}"
            )));
        }
        if path.contains('?') {
            return Err(Error::invalid(format!(
                "store URL {url:?}: query parameters are not supported for SQLite"
            )));
        }
        return Ok(Target::Sqlite(SqliteTarget::File(path.to_string())));
    }
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        return Ok(Target::Postgres(url.to_string()));
    }
    if url.starts_with("mysql://") || url.starts_with("mariadb://") {
        return Ok(Target::Mysql(url.replacen("mariadb://", "mysql://", 1)));
    }
    Err(Error::invalid(format!(
        "unsupported store URL {url:?}; accepted: {ACCEPTED}"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_paths() {
        assert_eq!(
            parse("sqlite:///rel/x.db").unwrap(),
            Target::Sqlite(SqliteTarget::File("rel/x.db".into()))
        );
        assert_eq!(
            parse("sqlite:////abs/x.db").unwrap(),
            Target::Sqlite(SqliteTarget::File("/abs/x.db".into()))
        );
        assert_eq!(
            parse("sqlite::memory:").unwrap(),
            Target::Sqlite(SqliteTarget::Memory)
        );
    }

    #[test]
    fn other_schemes() {
        assert!(matches!(
            parse("postgresql://u@h/db").unwrap(),
            Target::Postgres(_)
        ));
        assert!(matches!(
            parse("mysql://root@h/db").unwrap(),
            Target::Mysql(_)
        ));
        let e = parse("redis://x").unwrap_err().to_string();
        assert!(e.contains("sqlite:///") && e.contains("postgres://"), "{e}");
        assert!(parse("sqlite:///").is_err());
    }
}
