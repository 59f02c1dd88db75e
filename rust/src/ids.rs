//! Identifiers: generated job ids (time-ordered UUIDv7), fencing tokens and run ids.

/// A new time-ordered job id (UUIDv7, lowercase hyphenated): sorts by creation time.
pub fn new_job_id() -> String {
    uuid::Uuid::now_v7().hyphenated().to_string()
}

/// The durable run id of a job: stable across reclaims and retries of the same job.
///
/// `job:<org>:<id>`, both parts escaped (`%` as `%25`, then `:` as `%3A`); no organization
/// is the empty org (`job::<id>`). Neither escaped part contains `:`, so the text splits back
/// into its one (org, id) pair: two pairs never map to one run id (docs/DECISIONS.md).
pub fn job_run_id(org: &str, id: &str) -> String {
    format!("job:{}:{}", escape(org), escape(id))
}

fn escape(part: &str) -> std::borrow::Cow<'_, str> {
    if part.contains(['%', ':']) {
        part.replace('%', "%25").replace(':', "%3A").into()
    } else {
        part.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ids_are_unique_and_time_ordered() {
        let a = new_job_id();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = new_job_id();
        assert_ne!(a, b);
        assert!(a < b, "{a} < {b}");
        assert_eq!(a.len(), 36);
    }

    #[test]
    fn run_ids_do_not_collide_across_organizations() {
        assert_ne!(job_run_id("a:b", "c"), job_run_id("a", "b:c"));
        // The review's pair: the no-organization job "a:x" and job "x" of organization "a".
        assert_ne!(job_run_id("", "a:x"), job_run_id("a", "x"));
        assert_ne!(job_run_id("", "%3A"), job_run_id("", ":"));
        assert_eq!(job_run_id("", "x"), "job::x");
        assert_eq!(job_run_id("acme", "x"), "job:acme:x");
        assert_eq!(job_run_id("a%b", "c:d"), "job:a%25b:c%3Ad");
    }
}
