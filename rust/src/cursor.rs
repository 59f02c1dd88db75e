//! Opaque list cursors. A cursor carries the listing's snapshot (the highest job `seq` when its
//! first page was read), its keyset position and the function and filters it belongs to, so a
//! cursor handed to another function or filter is refused instead of listing the wrong thing.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cursor {
    /// Which listing: "list_jobs" or "list_all_jobs".
    pub f: String,
    /// The filters of the listing, in a fixed order: org, state, type.
    pub k: Vec<Option<String>>,
    /// The snapshot: highest seq included.
    pub s: i64,
    /// Keyset position: after (org, seq).
    pub o: String,
    pub q: i64,
}

const PREFIX: &str = "gnl1.";

impl Cursor {
    pub fn encode(&self) -> String {
        let json = serde_json::to_vec(self).expect("cursor serializes");
        format!("{PREFIX}{}", URL_SAFE_NO_PAD.encode(json))
    }

    /// Decode `text` and check it belongs to `f` with filters `k`.
    pub fn decode(text: &str, f: &str, k: &[Option<String>]) -> Result<Cursor> {
        let bad = || {
            Error::invalid("cursor is not a cursor this listing produced (garbled or truncated)")
        };
        let body = text.strip_prefix(PREFIX).ok_or_else(bad)?;
        let raw = URL_SAFE_NO_PAD.decode(body).map_err(|_| bad())?;
        let c: Cursor = serde_json::from_slice(&raw).map_err(|_| bad())?;
        if c.f != f {
            return Err(Error::invalid(format!(
                "cursor came from {}(), not {f}()",
                c.f
            )));
        }
        if c.k != k {
            return Err(Error::invalid(
                "cursor came from a listing with other filters (org_id, state, type); pass the same filters or start over without a cursor",
            ));
        }
        if c.s < 0 || c.q < 0 {
            return Err(bad());
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c() -> Cursor {
        Cursor {
            f: "list_jobs".into(),
            k: vec![Some("acme".into()), None, None],
            s: 10,
            o: "acme".into(),
            q: 4,
        }
    }

    #[test]
    fn round_trips() {
        let k = vec![Some("acme".to_string()), None, None];
        assert_eq!(Cursor::decode(&c().encode(), "list_jobs", &k).unwrap(), c());
    }

    #[test]
    fn refuses_other_functions_filters_and_garbage() {
        let k = vec![Some("acme".to_string()), None, None];
        let t = c().encode();
        assert!(Cursor::decode(&t, "list_all_jobs", &k).is_err());
        assert!(Cursor::decode(&t, "list_jobs", &[None, None, None]).is_err());
        assert!(Cursor::decode("nope", "list_jobs", &k).is_err());
        assert!(Cursor::decode(&t[..t.len() - 3], "list_jobs", &k).is_err());
        assert!(Cursor::decode("gnl1.!!!", "list_jobs", &k).is_err());
    }
}
