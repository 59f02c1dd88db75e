//! Checks on values a user hands in (organization ids, job ids, job types, durations).
//! Each returns `Error::InvalidArgument` with a message that names the argument and the rule.

use crate::error::{Error, Result};

/// The longest organization id, in characters (API.md: at most 200).
pub const MAX_ORG_LEN: usize = 200;
/// The longest job id, in characters.
pub const MAX_ID_LEN: usize = 1_000;
/// The longest job type, in characters.
pub const MAX_TYPE_LEN: usize = 200;

fn is_control(c: char) -> bool {
    c.is_control() || c == '\u{2028}' || c == '\u{2029}'
}

/// `org_id`: a non-empty string of at most 200 characters without control characters.
pub fn org_id(org: &str) -> Result<()> {
    if org.is_empty() {
        return Err(Error::invalid(
            "org_id must be a non-empty string (use None for no organization)",
        ));
    }
    let n = org.chars().count();
    if n > MAX_ORG_LEN {
        return Err(Error::invalid(format!(
            "org_id is {n} characters long; at most {MAX_ORG_LEN} are allowed"
        )));
    }
    if let Some(c) = org.chars().find(|c| is_control(*c)) {
        return Err(Error::invalid(format!(
            "org_id must not contain control characters (found U+{:04X})",
            c as u32
        )));
    }
    Ok(())
}

/// A job id given by the caller: non-empty, at most 1,000 characters, no NUL.
pub fn job_id(id: &str) -> Result<()> {
    if id.is_empty() {
        return Err(Error::invalid(
            "id must be a non-empty string (use None for a generated id)",
        ));
    }
    let n = id.chars().count();
    if n > MAX_ID_LEN {
        return Err(Error::invalid(format!(
            "id is {n} characters long; at most {MAX_ID_LEN} are allowed"
        )));
    }
    if id.contains('\0') {
        return Err(Error::invalid("id must not contain NUL characters"));
    }
    Ok(())
}

/// The id of a job or event looked up (get, retry, cancel, a dead event's retry): an empty
/// one names nothing (enqueue and emit refuse it), so it is a mistake, not a miss.
pub fn lookup_id(name: &str, id: &str, what: &str) -> Result<()> {
    if id.is_empty() {
        return Err(Error::invalid(format!(
            "{name} must be a non-empty string (no {what} has an empty id)"
        )));
    }
    Ok(())
}

/// A job type: non-empty, at most 200 characters, no control characters.
pub fn job_type(t: &str) -> Result<()> {
    if t.is_empty() {
        return Err(Error::invalid("type must be a non-empty string"));
    }
    let n = t.chars().count();
    if n > MAX_TYPE_LEN {
        return Err(Error::invalid(format!(
            "type is {n} characters long; at most {MAX_TYPE_LEN} are allowed"
        )));
    }
    if t.chars().any(is_control) {
        return Err(Error::invalid("type must not contain control characters"));
    }
    Ok(())
}

/// A duration in ms that must be `>= min`.
pub fn duration_ms(name: &str, v: i64, min: i64) -> Result<()> {
    if v < min {
        return Err(Error::invalid(format!(
            "{name} must be >= {min} ms, got {v}"
        )));
    }
    Ok(())
}

/// A count that must be `>= min`.
pub fn count(name: &str, v: i64, min: i64) -> Result<()> {
    if v < min {
        return Err(Error::invalid(format!("{name} must be >= {min}, got {v}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn org_id_rules() {
        assert!(org_id("acme").is_ok());
        assert!(org_id(&"x".repeat(200)).is_ok());
        assert!(org_id(&"é".repeat(200)).is_ok(), "characters, not bytes");
        assert!(org_id("").unwrap_err().to_string().contains("non-empty"));
        assert!(org_id(&"x".repeat(201))
            .unwrap_err()
            .to_string()
            .contains("201"));
        assert!(org_id("a\nb").unwrap_err().to_string().contains("U+000A"));
        assert!(org_id("a\u{2028}b").is_err());
    }

    #[test]
    fn id_and_type_rules() {
        assert!(job_id("import:1").is_ok());
        assert!(job_id("").is_err());
        assert!(job_id("a\0b").is_err());
        assert!(job_type("reindex").is_ok());
        assert!(job_type("").is_err());
        assert!(job_type("a\tb").is_err());
    }
}
