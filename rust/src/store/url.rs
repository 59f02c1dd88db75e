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
    "sqlite:///relative/path.db, sqlite:////absolute/path.db, sqlite::memory:, postgres://..., postgresql://..., mysql://..., mariadb://...";

/// A query parameter whose value is a secret: `password`, `sslpassword` (libpq), and any
/// key naming a password, secret or token, in any case.
fn is_secret_param(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    ["password", "secret", "token"]
        .iter()
        .any(|w| k.contains(w))
}

/// `url` as it may be shown to people (errors, `repr`, logs): a password in its credentials
/// (`user:secret@`) or in a query parameter naming a password, secret or token
/// (`password=`, `sslpassword=`) becomes `***`. The full URL is only ever used to connect.
pub fn redact(url: &str) -> String {
    let Some(start) = url.find("://").map(|i| i + 3) else {
        return url.to_string();
    };
    let rest = &url[start..];
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let mut out = url[..start].to_string();
    match authority.rfind('@') {
        Some(at) => match authority[..at].find(':') {
            Some(colon) => {
                out.push_str(&authority[..=colon]);
                out.push_str("***");
                out.push_str(&authority[at..]);
            }
            None => out.push_str(authority),
        },
        None => out.push_str(authority),
    }
    match tail.find('?') {
        Some(q) => {
            out.push_str(&tail[..=q]);
            let params: Vec<String> = tail[q + 1..]
                .split('&')
                .map(|p| match p.split_once('=') {
                    Some((k, _)) if is_secret_param(k) => format!("{k}=***"),
                    _ => p.to_string(),
                })
                .collect();
            out.push_str(&params.join("&"));
        }
        None => out.push_str(tail),
    }
    out
}

/// sqlx's error about a URL it could not parse, without the "error with configuration: "
/// prefix it repeats once per wrapping (`?sslmode=bogus` read "error with configuration:
/// error with configuration: unknown value \"bogus\"").
pub(crate) fn reason(e: &sqlx::Error) -> String {
    let mut m = e.to_string();
    while let Some(rest) = m.strip_prefix("error with configuration: ") {
        m = rest.to_string();
    }
    m
}

/// The server a connection goes to, as an error names it: the socket's path when one is set,
/// else `host:port` (an IPv6 address in brackets).
pub fn server(socket: Option<&std::path::PathBuf>, host: &str, port: u16) -> String {
    match socket {
        Some(path) => format!("the socket {}", path.display()),
        None if host.contains(':') => format!("[{host}]:{port}"),
        None => format!("{host}:{port}"),
    }
}

/// Parse a store URL. `sqlite:///x.db` is relative to the working directory,
/// `sqlite:////x.db` absolute.
pub fn parse(url: &str) -> Result<Target> {
    // `sqlite:///:memory:` too (SQLAlchemy's spelling): as a file name, SQLite opened a
    // database of its own for every pooled connection and the store's pool timed out.
    if url == "sqlite::memory:" || url == "sqlite://:memory:" || url == "sqlite:///:memory:" {
        return Ok(Target::Sqlite(SqliteTarget::Memory));
    }
    if let Some(rest) = url.strip_prefix("sqlite://") {
        let path = rest.strip_prefix('/').unwrap_or(rest);
        if path.is_empty() {
            return Err(Error::invalid(format!(
                "store URL {:?} names no file; accepted: {ACCEPTED}",
                redact(url)
            )));
        }
        if path.contains('?') {
            return Err(Error::invalid(format!(
                "store URL {:?}: query parameters are not supported for SQLite",
                redact(url)
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
        "unsupported store URL {:?}; accepted: {ACCEPTED}",
        redact(url)
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_are_named_by_host_and_port_or_socket() {
        assert_eq!(server(None, "127.0.0.1", 5432), "127.0.0.1:5432");
        assert_eq!(server(None, "::1", 3306), "[::1]:3306");
        let sock = std::path::PathBuf::from("/run/postgresql");
        assert_eq!(
            server(Some(&sock), "localhost", 5432),
            "the socket /run/postgresql"
        );
    }

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
        for memory in ["sqlite::memory:", "sqlite://:memory:", "sqlite:///:memory:"] {
            assert_eq!(parse(memory).unwrap(), Target::Sqlite(SqliteTarget::Memory));
        }
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

    #[test]
    fn redact_hides_passwords_only() {
        for (url, shown) in [
            ("postgres://u:pw@h:5432/db", "postgres://u:***@h:5432/db"),
            ("mysql://u:p@ss:w@h/db?x=1", "mysql://u:***@h/db?x=1"),
            (
                "postgres://u@h/db?password=pw&a=b",
                "postgres://u@h/db?password=***&a=b",
            ),
            ("redis://:pw@h:6379/0", "redis://:***@h:6379/0"),
            (
                "postgres://u@h/db?sslpassword=k&sslmode=require&Auth_Token=t",
                "postgres://u@h/db?sslpassword=***&sslmode=require&Auth_Token=***",
            ),
            ("postgres://h/db", "postgres://h/db"),
            ("sqlite:///x.db", "sqlite:///x.db"),
            ("sqlite::memory:", "sqlite::memory:"),
        ] {
            assert_eq!(redact(url), shown, "{url}");
        }
        let e = parse("postgress://u:pw@h/db").unwrap_err().to_string();
        assert!(e.contains("u:***@h") && !e.contains("pw"), "{e}");
    }
}
