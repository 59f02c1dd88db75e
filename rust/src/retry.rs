//! Retry spacing and empty-poll backoff: pure arithmetic, shared by the queue and the events.

/// The longest retry delay, in ms (about ten years): a larger one is clamped to it, so that
/// "now + delay" never overflows a store's integer.
pub const MAX_RETRY_DELAY_MS: i64 = 315_360_000_000;

/// The default delay before retrying a failed job attempt, in ms.
///
/// Exponential from 1,000 ms, doubling per failed attempt, capped at 60,000 ms, then ±20%
/// jitter (`jitter` in `[-1, 1]` picks where in that band). `attempt` is the 1-based number of
/// the attempt that failed.
pub fn default_job_retry_delay_ms(attempt: i64, jitter: f64) -> i64 {
    exponential_ms(attempt, 1_000, 60_000, jitter)
}

/// `base * 2^(attempt-1)` capped at `cap`, scaled by `1 + 0.2 * jitter`.
pub fn exponential_ms(attempt: i64, base: i64, cap: i64, jitter: f64) -> i64 {
    let exp = (attempt.max(1) - 1).min(62) as u32;
    let raw = base
        .saturating_mul(1i64.checked_shl(exp).unwrap_or(i64::MAX))
        .min(cap);
    let j = jitter.clamp(-1.0, 1.0);
    ((raw as f64) * (1.0 + 0.2 * j)).round() as i64
}

/// The next empty-poll interval: double up to `max_poll_ms`.
pub fn next_poll_interval_ms(current: i64, max_poll_ms: i64) -> i64 {
    current.saturating_mul(2).min(max_poll_ms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn doubles_from_one_second_and_caps_at_a_minute() {
        let d: Vec<i64> = (1..=8)
            .map(|a| default_job_retry_delay_ms(a, 0.0))
            .collect();
        assert_eq!(
            d,
            vec![1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 60_000, 60_000]
        );
    }

    #[test]
    fn poll_interval_doubles_to_the_cap() {
        let mut i = 200;
        let mut seen = vec![];
        for _ in 0..7 {
            i = next_poll_interval_ms(i, 6_400);
            seen.push(i);
        }
        assert_eq!(seen, vec![400, 800, 1_600, 3_200, 6_400, 6_400, 6_400]);
    }

    proptest! {
        #[test]
        fn jitter_stays_within_twenty_percent(attempt in 1i64..1000, j in -1.0f64..=1.0) {
            let base = default_job_retry_delay_ms(attempt, 0.0);
            let d = default_job_retry_delay_ms(attempt, j);
            prop_assert!(d as f64 >= base as f64 * 0.8 - 1.0);
            prop_assert!(d as f64 <= base as f64 * 1.2 + 1.0);
            prop_assert!(d <= 72_000);
        }
    }
}
