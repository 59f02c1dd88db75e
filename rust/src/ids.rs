//! Identifiers: generated job ids (time-ordered UUIDv7), fencing tokens and run ids.

/// A new time-ordered job id (UUIDv7, lowercase hyphenated): sorts by creation time.
pub fn new_job_id() -> String {
    uuid::Uuid::now_v7().hyphenated().to_string()
}

/// The durable run id of a job: stable across reclaims and retries of the same job.
///
/// `job:<id>` for a job without organization, `job:<org>:<id>` otherwise, with `%` and `:`
/// escaped in the organization so that two (org, id) pairs never map to one run id.
pub fn job_run_id(org: &str, id: &str) -> String {
    if org.is_empty() {
        format!("job:{id}")
    } else {
        let esc = org.replace('%', "%25").replace(':', "%3A");
        format!("job:{esc}:{id}")
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
        // ("a:b", "c") and ("a", "b:c") must differ.
        assert_ne!(job_run_id("a:b", "c"), job_run_id("a", "b:c"));
        assert_eq!(job_run_id("", "x"), "job:x");
        assert_eq!(job_run_id("acme", "x"), "job:acme:x");
    }
}
