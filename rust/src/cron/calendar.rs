//! The proleptic Gregorian calendar in UTC, on day numbers (days since 1970-01-01) and minute
//! numbers (minutes since 1970-01-01T00:00Z). Pure integer arithmetic, valid for every `i64`
//! day number a minute number can reach.

/// Milliseconds in a minute.
pub const MINUTE_MS: i64 = 60_000;
/// Minutes in a day.
pub const DAY_MINUTES: i64 = 1_440;
/// Days in 400 Gregorian years: the calendar (dates and weekdays) repeats with this period.
pub const CYCLE_DAYS: i64 = 146_097;
/// 10000-01-01T00:00Z in epoch ms: no fire time or slot is at or after it.
pub const YEAR_10000_MS: i64 = 253_402_300_800_000;

/// True for a Gregorian leap year (2000 is one, 2100 is not).
pub fn is_leap(y: i64) -> bool {
    y % 4 == 0 && (y % 100 != 0 || y % 400 == 0)
}

/// Days in month `m` (1..=12) of year `y`.
pub fn days_in_month(y: i64, m: u32) -> u32 {
    match m {
        2 if is_leap(y) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// The day number of `y-m-d` (H. Hinnant's `days_from_civil`).
pub fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(m);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * CYCLE_DAYS + doe - 719_468
}

/// The date `(y, m, d)` of day number `z` (H. Hinnant's `civil_from_days`).
pub fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(CYCLE_DAYS);
    let doe = z.rem_euclid(CYCLE_DAYS);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// The weekday of day number `z`: 0 = Sunday … 6 = Saturday (1970-01-01 was a Thursday).
pub fn weekday(z: i64) -> u32 {
    (z + 4).rem_euclid(7) as u32
}

/// `ms` as ISO-8601 UTC: `2026-01-01T03:00:00Z`, with `.sss` when the milliseconds are not 0.
pub fn iso_utc(ms: i64) -> String {
    let days = ms.div_euclid(86_400_000);
    let rest = ms.rem_euclid(86_400_000);
    let (y, m, d) = civil_from_days(days);
    let (hh, mm, ss, mss) = (
        rest / 3_600_000,
        rest / 60_000 % 60,
        rest / 1_000 % 60,
        rest % 1_000,
    );
    let year = if (0..=9999).contains(&y) {
        format!("{y:04}")
    } else {
        format!("{y:+05}")
    };
    if mss == 0 {
        format!("{year}-{m:02}-{d:02}T{hh:02}:{mm:02}:{ss:02}Z")
    } else {
        format!("{year}-{m:02}-{d:02}T{hh:02}:{mm:02}:{ss:02}.{mss:03}Z")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_across_eras_and_leap_centuries() {
        for z in (-800_000..800_000).step_by(7) {
            let (y, m, d) = civil_from_days(z);
            assert!((1..=12).contains(&m) && d >= 1 && d <= days_in_month(y, m));
            assert_eq!(days_from_civil(y, m, d), z);
        }
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(
            civil_from_days(days_from_civil(2100, 2, 28) + 1),
            (2100, 3, 1)
        );
        assert_eq!(
            civil_from_days(days_from_civil(2000, 2, 28) + 1),
            (2000, 2, 29)
        );
        assert_eq!(days_from_civil(10000, 1, 1) * 86_400_000, YEAR_10000_MS);
    }

    #[test]
    fn extreme_day_numbers_do_not_overflow() {
        for z in [i64::MIN / 1_440, i64::MAX / 1_440] {
            let (y, m, d) = civil_from_days(z);
            assert_eq!(days_from_civil(y, m, d), z);
        }
    }

    #[test]
    fn weekdays_and_iso() {
        assert_eq!(weekday(0), 4);
        assert_eq!(weekday(days_from_civil(2026, 1, 1)), 4);
        assert_eq!(weekday(days_from_civil(2024, 2, 29)), 4);
        assert_eq!(iso_utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(iso_utc(1_767_236_400_123), "2026-01-01T03:00:00.123Z");
        assert_eq!(iso_utc(-1), "1969-12-31T23:59:59.999Z");
    }
}
