//! Misfire: what one poll of one trigger fires, drops and schedules next (API.md "Scheduler").
//! Pure: the grid, the slot the trigger owes, the grace, `now` and the policy in; a `Plan` out.
//! The store side applies the plan (fire lock, run, compare-and-set of the state).
//!
//! A poll at `now` finds due every occurrence from the stored slot up to `now`: the slot
//! itself, then the grid's occurrences after it. An occurrence is *missed* when the same poll
//! also finds a later one due, or finds it more than `misfire_grace_ms` late. No missed one:
//! the (only) due occurrence fires. Otherwise the policy decides over all the due ones:
//! `latest` fires the last once, `earliest` the oldest once, `none` none, `catchup` every one,
//! oldest first, one per poll (the next slot is then the next due one). Under every policy
//! the schedule then goes on from the first occurrence after `now` on its planned grid.
//! `max_catchup = n` (catchup only): only the n latest fire; the older ones are skipped.
//!
//! The work is bounded whatever the gap: occurrences are counted and the one needed is found
//! by rank (`Cron::count_between`, `Cron::nth_after`), never listed.

use std::fmt;

use crate::cron::{iso_utc, Cron, YEAR_10000_MS};

/// The occurrences of a trigger.
#[derive(Clone, Debug)]
pub enum Grid {
    /// A cron expression's fire times.
    Cron(Cron),
    /// `anchor + k * every_ms` for k >= 1 (the anchor is the registration time).
    Every { anchor_ms: i64, every_ms: i64 },
    /// One shot.
    At(i64),
}

/// What a poll does when it finds missed occurrences.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    Latest,
    Earliest,
    None,
    Catchup,
}

impl Policy {
    pub fn parse(text: &str) -> Option<Policy> {
        match text {
            "latest" => Some(Policy::Latest),
            "earliest" => Some(Policy::Earliest),
            "none" => Some(Policy::None),
            "catchup" => Some(Policy::Catchup),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Latest => "latest",
            Policy::Earliest => "earliest",
            Policy::None => "none",
            Policy::Catchup => "catchup",
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The outcome of one poll of one trigger.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Occurrences due at this poll (from the stored slot up to `now`).
    pub due: u64,
    /// The occurrence to fire now (its `scheduled_for`); at most one per poll.
    pub fire: Option<i64>,
    /// Due occurrences that were missed and will never fire (`TriggerInfo.missed` grows by
    /// this), the skipped ones included.
    pub dropped: u64,
    /// Of `dropped`: the ones `max_catchup` skipped (the warning's count), and the oldest.
    pub skipped: u64,
    pub oldest_skipped: Option<i64>,
    /// The slot the trigger owes after this poll (its next `next_run_at`); None: no more
    /// occurrences (a fired one-shot, or no cron time before the year 10000).
    pub next_slot: Option<i64>,
}

impl Grid {
    /// The first occurrence strictly after `t`.
    fn next_after(&self, t: i64) -> Option<i64> {
        self.nth_after(t, 1)
    }

    /// The n-th (n >= 1) occurrence strictly after `t`.
    fn nth_after(&self, t: i64, n: u64) -> Option<i64> {
        match self {
            Grid::Cron(c) => c.nth_after(t, n),
            Grid::Every {
                anchor_ms,
                every_ms,
            } => {
                let k = every_index(*anchor_ms, *every_ms, t) + i128::from(n);
                let at = i128::from(*anchor_ms) + k * i128::from(*every_ms);
                (at < i128::from(YEAR_10000_MS)).then_some(at as i64)
            }
            Grid::At(_) => None,
        }
    }

    /// Occurrences `o` with `after < o <= upto`.
    fn count_between(&self, after: i64, upto: i64) -> u64 {
        match self {
            Grid::Cron(c) => c.count_between(after, upto),
            Grid::Every {
                anchor_ms,
                every_ms,
            } => {
                let upto = upto.min(YEAR_10000_MS - 1);
                let n = every_index(*anchor_ms, *every_ms, upto)
                    - every_index(*anchor_ms, *every_ms, after);
                n.clamp(0, i128::from(u64::MAX)) as u64
            }
            Grid::At(_) => 0,
        }
    }
}

/// How many occurrences of `anchor + k * every` (k >= 1) are at or before `t`.
fn every_index(anchor: i64, every: i64, t: i64) -> i128 {
    let every = i128::from(every.max(1));
    (i128::from(t) - i128::from(anchor))
        .div_euclid(every)
        .max(0)
}

/// Plan one poll of one trigger.
///
/// `slot` is the occurrence the trigger owes (its stored `next_run_at`), `now_ms` the poll's
/// instant, `max_catchup` applies to `Policy::Catchup` only (`Some(0)` is read as 1: the
/// caller validates). A one-shot (`Grid::At`) fires when due, however late: API.md's "a past
/// instant fires on the first poll"; the policy is not asked.
pub fn plan(
    grid: &Grid,
    slot: i64,
    now_ms: i64,
    grace_ms: i64,
    policy: Policy,
    max_catchup: Option<u64>,
) -> Plan {
    if slot > now_ms {
        return Plan {
            due: 0,
            fire: None,
            dropped: 0,
            skipped: 0,
            oldest_skipped: None,
            next_slot: Some(slot),
        };
    }
    let mut out = Plan {
        due: 1,
        fire: Some(slot),
        dropped: 0,
        skipped: 0,
        oldest_skipped: None,
        next_slot: None,
    };
    if let Grid::At(_) = grid {
        return out;
    }
    let later = grid.count_between(slot, now_ms);
    out.due = later.saturating_add(1);
    let last = if later == 0 {
        Some(slot)
    } else {
        grid.nth_after(slot, later)
    };
    let after_now = grid.next_after(now_ms);
    let late = last.is_none_or(|l| i128::from(now_ms) - i128::from(l) > i128::from(grace_ms));
    if later == 0 && !late {
        out.next_slot = after_now;
        return out;
    }
    match policy {
        Policy::Latest => {
            out.fire = last;
            out.dropped = later;
            out.next_slot = after_now;
        }
        Policy::Earliest => {
            out.dropped = later;
            out.next_slot = after_now;
        }
        Policy::None => {
            out.fire = None;
            out.dropped = out.due;
            out.next_slot = after_now;
        }
        Policy::Catchup => {
            let keep = max_catchup.map(|n| n.max(1)).unwrap_or(u64::MAX);
            if out.due > keep {
                // Fire the oldest of the `keep` latest: the (due - keep + 1)-th due one.
                let skip = out.due - keep;
                out.skipped = skip;
                out.dropped = skip;
                out.oldest_skipped = Some(slot);
                out.fire = grid.nth_after(slot, skip);
            }
            // The next one after the fired one: still due (the next poll fires it) or, when
            // none is left, the first after now.
            out.next_slot = out.fire.and_then(|f| grid.next_after(f)).or(after_now);
        }
    }
    out
}

/// The one warning a poll logs (logger `gnl`) when `max_catchup` skipped occurrences.
pub fn max_catchup_warning(
    trigger_id: &str,
    max_catchup: u64,
    skipped: u64,
    oldest_skipped_ms: i64,
) -> String {
    let s = if skipped == 1 { "" } else { "s" };
    format!(
        "trigger {trigger_id:?}: max_catchup={max_catchup} skipped {skipped} missed occurrence{s}, the oldest at {}",
        iso_utc(oldest_skipped_ms)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: i64 = 60_000;
    const DAY: i64 = 1_440 * MIN;

    fn cron(e: &str) -> Grid {
        Grid::Cron(Cron::parse(e).unwrap())
    }

    #[test]
    fn not_due_and_on_time() {
        let g = cron("* * * * *");
        let p = plan(&g, 10 * MIN, 10 * MIN - 1, 60_000, Policy::Latest, None);
        assert_eq!((p.due, p.fire, p.next_slot), (0, None, Some(10 * MIN)));
        let p = plan(&g, 10 * MIN, 10 * MIN + 5_000, 60_000, Policy::None, None);
        assert_eq!((p.due, p.fire, p.dropped), (1, Some(10 * MIN), 0));
        assert_eq!(p.next_slot, Some(11 * MIN));
    }

    #[test]
    fn a_day_asleep_on_a_minute_cron() {
        let g = cron("* * * * *");
        let now = DAY + 30_000;
        let p = plan(&g, MIN, now, 60_000, Policy::Latest, None);
        assert_eq!(p.due, 1_440);
        assert_eq!((p.fire, p.dropped), (Some(DAY), 1_439));
        assert_eq!(p.next_slot, Some(DAY + MIN));
        let p = plan(&g, MIN, now, 60_000, Policy::Earliest, None);
        assert_eq!(
            (p.fire, p.dropped, p.next_slot),
            (Some(MIN), 1_439, Some(DAY + MIN))
        );
        let p = plan(&g, MIN, now, 60_000, Policy::None, None);
        assert_eq!(
            (p.fire, p.dropped, p.next_slot),
            (None, 1_440, Some(DAY + MIN))
        );
        let p = plan(&g, MIN, now, 60_000, Policy::Catchup, None);
        assert_eq!(
            (p.fire, p.dropped, p.next_slot),
            (Some(MIN), 0, Some(2 * MIN))
        );
        let p = plan(&g, MIN, now, 60_000, Policy::Catchup, Some(10));
        assert_eq!((p.skipped, p.oldest_skipped), (1_430, Some(MIN)));
        assert_eq!(
            (p.fire, p.next_slot),
            (Some(1_431 * MIN), Some(1_432 * MIN))
        );
        let p = plan(&g, MIN, now, 60_000, Policy::Catchup, Some(1));
        assert_eq!(
            (p.fire, p.skipped, p.next_slot),
            (Some(DAY), 1_439, Some(DAY + MIN))
        );
    }

    #[test]
    fn centuries_asleep_stay_bounded() {
        let g = cron("* * * * *");
        let t = std::time::Instant::now();
        let now = 300 * 365 * DAY;
        let p = plan(&g, MIN, now, 0, Policy::Catchup, Some(100_000_000));
        assert_eq!(p.due, (now / MIN) as u64);
        assert_eq!(p.skipped, p.due - 100_000_000);
        assert_eq!(p.fire, Some(now - 99_999_999 * MIN));
        let p = plan(&g, MIN, now, 0, Policy::Latest, None);
        assert_eq!(p.fire, Some(now));
        assert!(t.elapsed() < std::time::Duration::from_millis(500));
    }

    #[test]
    fn the_last_one_late_beyond_grace_is_missed() {
        let g = cron("0 * * * *");
        let p = plan(&g, 60 * MIN, 62 * MIN, 60_000, Policy::None, None);
        assert_eq!((p.fire, p.dropped, p.next_slot), (None, 1, Some(120 * MIN)));
        let p = plan(&g, 60 * MIN, 62 * MIN, 60_000, Policy::Latest, None);
        assert_eq!((p.fire, p.dropped), (Some(60 * MIN), 0));
    }

    #[test]
    fn every_grid_is_anchored_at_registration() {
        let g = Grid::Every {
            anchor_ms: 1_000,
            every_ms: 500,
        };
        let p = plan(&g, 1_500, 3_200, 100, Policy::Latest, None);
        // due: 1500 2000 2500 3000
        assert_eq!(
            (p.due, p.fire, p.dropped, p.next_slot),
            (4, Some(3_000), 3, Some(3_500))
        );
        let p = plan(&g, 1_500, 3_200, 100, Policy::Catchup, Some(2));
        assert_eq!(
            (p.fire, p.skipped, p.next_slot),
            (Some(2_500), 2, Some(3_000))
        );
    }

    #[test]
    fn one_shots_fire_however_late() {
        let p = plan(&Grid::At(5), 5, DAY, 0, Policy::None, None);
        assert_eq!((p.fire, p.dropped, p.next_slot), (Some(5), 0, None));
    }

    #[test]
    fn the_warning_names_count_and_oldest() {
        assert_eq!(
            max_catchup_warning("nightly", 10, 1_430, 1_767_236_400_000),
            "trigger \"nightly\": max_catchup=10 skipped 1430 missed occurrences, the oldest at 2026-01-01T03:00:00Z"
        );
    }
}
