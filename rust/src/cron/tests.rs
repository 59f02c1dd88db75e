//! The classic traps, refusals, and the search functions against a minute-by-minute scan.

use super::calendar::{days_from_civil, YEAR_10000_MS};
use super::*;
use proptest::prelude::*;

fn ms(y: i64, mo: u32, d: u32, h: i64, mi: i64) -> i64 {
    (days_from_civil(y, mo, d) * 1440 + h * 60 + mi) * 60_000
}

fn next(expr: &str, after: i64) -> Option<i64> {
    Cron::parse(expr).unwrap().next_after(after)
}

fn times(expr: &str, after: i64, n: usize) -> Vec<i64> {
    Cron::parse(expr).unwrap().times_after(after, n)
}

fn err(expr: &str) -> CronError {
    Cron::parse(expr).expect_err(expr)
}

#[test]
fn strictly_after_and_on_minute_boundaries() {
    let t = ms(2026, 1, 1, 3, 0);
    assert_eq!(next("0 3 * * *", t - 1), Some(t));
    assert_eq!(next("0 3 * * *", t), Some(ms(2026, 1, 2, 3, 0)));
    assert_eq!(next("* * * * *", t + 59_999), Some(t + 60_000));
    assert_eq!(next("* * * * *", -1), Some(0));
    assert_eq!(next("* * * * *", -60_001), Some(-60_000));
}

#[test]
fn leap_days_across_2100() {
    // 2100 is not a leap year: from 2096-03-01 the next Feb 29 is in 2104.
    assert_eq!(
        next("0 0 29 2 *", ms(2096, 3, 1, 0, 0)),
        Some(ms(2104, 2, 29, 0, 0))
    );
    assert_eq!(
        next("0 0 29 2 *", ms(2096, 1, 1, 0, 0)),
        Some(ms(2096, 2, 29, 0, 0))
    );
    assert_eq!(
        times("0 0 29 2 *", ms(2095, 1, 1, 0, 0), 3),
        vec![
            ms(2096, 2, 29, 0, 0),
            ms(2104, 2, 29, 0, 0),
            ms(2108, 2, 29, 0, 0)
        ]
    );
    // Feb 28 -> Mar 1 in 2100, and 2000 is a leap year.
    assert_eq!(
        next("0 12 * 2-3 *", ms(2100, 2, 28, 12, 0)),
        Some(ms(2100, 3, 1, 12, 0))
    );
    assert_eq!(
        next("0 12 * 2-3 *", ms(2000, 2, 28, 12, 0)),
        Some(ms(2000, 2, 29, 12, 0))
    );
    assert_eq!(
        next("0 0 29 2 *", ms(2400, 1, 1, 0, 0)),
        Some(ms(2400, 2, 29, 0, 0))
    );
}

#[test]
fn the_day_rule() {
    // 1-31 is restricted (it does not start with *): with a weekday, either matches: every day.
    let from = ms(2026, 1, 1, 0, 0); // a Thursday
    assert_eq!(
        times("0 0 1-31 * 1", from, 3),
        vec![
            ms(2026, 1, 2, 0, 0),
            ms(2026, 1, 3, 0, 0),
            ms(2026, 1, 4, 0, 0)
        ]
    );
    // */2 starts with *: unrestricted, so both must match: odd days that are Mondays.
    assert_eq!(
        times("0 0 */2 * 1", from, 3),
        vec![
            ms(2026, 1, 5, 0, 0),
            ms(2026, 1, 19, 0, 0),
            ms(2026, 2, 9, 0, 0)
        ]
    );
    // Both restricted: the 13th or a Friday.
    assert_eq!(
        times("0 0 13 * 5", from, 3),
        vec![
            ms(2026, 1, 2, 0, 0),
            ms(2026, 1, 9, 0, 0),
            ms(2026, 1, 13, 0, 0)
        ]
    );
    // dom restricted, dow * : only the dom.
    assert_eq!(next("0 0 13 * *", from), Some(ms(2026, 1, 13, 0, 0)));
    // dom *, dow restricted: only the weekday.
    assert_eq!(next("0 0 * * 5", from), Some(ms(2026, 1, 2, 0, 0)));
    // dow */1 starts with *: AND with the 13th -> Friday the 13th? no: */1 is every day.
    assert_eq!(next("0 0 13 * */1", from), Some(ms(2026, 1, 13, 0, 0)));
}

#[test]
fn sunday_is_0_and_7_and_names_in_any_case() {
    let from = ms(2026, 1, 1, 0, 0);
    let sunday = Some(ms(2026, 1, 4, 0, 0));
    for e in [
        "0 0 * * 0",
        "0 0 * * 7",
        "0 0 * * sun",
        "0 0 * * SuN",
        "0 0 * * 7-7",
    ] {
        assert_eq!(next(e, from), sunday, "{e}");
    }
    assert_eq!(Cron::parse("0 0 * * 5-7"), Cron::parse("0 0 * * 0,5,6"));
    assert_eq!(Cron::parse("0 0 * * 1/2"), Cron::parse("0 0 * * 0,1,3,5"));
    assert_eq!(Cron::parse("0 0 * * */2"), Cron::parse("0 0 * * 0,2,4,6"));
    assert_eq!(Cron::parse("0 0 * * MON-FRI"), Cron::parse("0 0 * * 1-5"));
    assert_eq!(Cron::parse("0 0 * jan-Mar/2 *"), Cron::parse("0 0 * 1,3 *"));
    assert_eq!(Cron::parse("0 0 1 dec *"), Cron::parse("0 0 1 12 *"));
}

#[test]
fn steps_ranges_and_lists() {
    assert_eq!(
        Cron::parse("*/15 * * * *"),
        Cron::parse("0,15,30,45 * * * *")
    );
    assert_eq!(
        Cron::parse("5/15 * * * *"),
        Cron::parse("5,20,35,50 * * * *")
    );
    assert_eq!(
        Cron::parse("10-30/7 * * * *"),
        Cron::parse("10,17,24 * * * *")
    );
    // Debian: a range with a step steps within it, also when it is one value.
    assert_eq!(Cron::parse("5-5/10 * * * *"), Cron::parse("5 * * * *"));
    assert_eq!(Cron::parse("*/100 * * * *"), Cron::parse("0 * * * *"));
    assert_eq!(
        Cron::parse("*/99999999999999999999999 * * * *"),
        Cron::parse("0 * * * *")
    );
    assert_eq!(Cron::parse("07 * * * *"), Cron::parse("7 * * * *"));
    assert_eq!(Cron::parse("1,1,2 * * * *"), Cron::parse("1-2 * * * *"));
    assert_eq!(parse_field("*/15", 0, 59).unwrap(), vec![0, 15, 30, 45]);
    assert_eq!(parse_field("5-7", 0, 7).unwrap(), vec![0, 5, 6]);
    assert_eq!(parse_field("feb-apr", 1, 12).unwrap(), vec![2, 3, 4]);
    assert!(parse_field("3/20", 0, 100).is_err());
    assert_eq!(parse_field("3/20", 0, 50).unwrap(), vec![3, 23, 43]);
}

#[test]
fn macros() {
    for (m, e) in [
        ("@yearly", "0 0 1 1 *"),
        ("@annually", "0 0 1 1 *"),
        ("@monthly", "0 0 1 * *"),
        ("@weekly", "0 0 * * 0"),
        ("@daily", "0 0 * * *"),
        ("@midnight", "0 0 * * *"),
        ("@hourly", "0 * * * *"),
        ("  @daily\t", "0 0 * * *"),
    ] {
        assert_eq!(Cron::parse(m), Cron::parse(e), "{m}");
    }
    assert!(err("@reboot").message.contains("no fire time"));
    assert!(err("@DAILY").message.contains("lowercase"));
    assert!(err("@daily 5").message.contains("stands alone"));
    assert!(err("@often").message.contains("not a macro"));
}

#[test]
fn refusals_name_the_field() {
    let cases = [
        ("0 0 * * * 2026", Field::DayOfWeek, "found 6"),
        ("0 0 * *", Field::DayOfWeek, "found 4"),
        ("0 0", Field::DayOfMonth, "found 2"),
        ("60 * * * *", Field::Minute, "out of range 0-59"),
        ("* 24 * * *", Field::Hour, "out of range 0-23"),
        ("* * 0 * *", Field::DayOfMonth, "out of range 1-31"),
        ("* * 32 * *", Field::DayOfMonth, "out of range"),
        ("* * * 13 *", Field::Month, "out of range 1-12"),
        ("* * * * 8", Field::DayOfWeek, "out of range 0-7"),
        ("*/0 * * * *", Field::Minute, "step"),
        ("* 5-2 * * *", Field::Hour, "reversed"),
        ("* * * * SAT-SUN", Field::DayOfWeek, "reversed"),
        ("* * L * *", Field::DayOfMonth, "'L'"),
        ("* * 15W * *", Field::DayOfMonth, "'W'"),
        ("* * LW * *", Field::DayOfMonth, "extension"),
        ("* * * * 5L", Field::DayOfWeek, "'L'"),
        ("* * * * MON#2", Field::DayOfWeek, "'#'"),
        ("* * ? * *", Field::DayOfMonth, "'?'"),
        ("* * * * ?", Field::DayOfWeek, "'?'"),
        ("0 0 30 2 *", Field::DayOfMonth, "never fire"),
        ("0 0 31 4,6 *", Field::DayOfMonth, "never fire"),
        ("0 0 31 2,4,6,9,11 */2", Field::DayOfMonth, "never fire"),
        ("* * * JAN *", Field::Month, ""),
        ("MON * * * *", Field::Minute, "not a number"),
        ("* * * * MONDAY", Field::DayOfWeek, "weekday name"),
        ("1,,2 * * * *", Field::Minute, "empty item"),
        ("1- * * * *", Field::Minute, "missing end"),
        ("-1 * * * *", Field::Minute, "missing end"),
        ("1-2-3 * * * *", Field::Minute, "not a number"),
        ("*/2/3 * * * *", Field::Minute, "not a number"),
        ("*/ * * * *", Field::Minute, "no step"),
        ("*/MON * * * 1", Field::Minute, "not a number"),
        ("* * * * */MON", Field::DayOfWeek, "not a number"),
        (
            "99999999999999999999999 * * * *",
            Field::Minute,
            "out of range",
        ),
        ("+5 * * * *", Field::Minute, "not a number"),
        ("٣ * * * *", Field::Minute, "not a number"),
        ("*5 * * * *", Field::Minute, "not a number"),
    ];
    for (expr, field, text) in cases {
        if expr == "* * * JAN *" {
            assert!(Cron::parse(expr).is_ok());
            continue;
        }
        let e = err(expr);
        assert_eq!(e.field, Some(field), "{expr}: {}", e.message);
        assert!(e.message.contains(field.name()), "{expr}: {}", e.message);
        assert!(e.message.contains(text), "{expr}: {}", e.message);
    }
    assert!(err("").message.contains("found none"));
    assert!(err(&"1,".repeat(600)).message.contains("longest accepted"));
}

#[test]
fn impossible_with_an_or_is_possible() {
    // Both day fields restricted: Feb 30 never comes, but a Monday in February does.
    assert_eq!(
        next("0 0 30 2 1", ms(2026, 1, 1, 0, 0)),
        Some(ms(2026, 2, 2, 0, 0))
    );
    // 31 exists in some listed month: fires only there.
    assert_eq!(
        next("0 0 31 2,3 *", ms(2026, 1, 1, 0, 0)),
        Some(ms(2026, 3, 31, 0, 0))
    );
}

#[test]
fn the_end_of_time() {
    let last = ms(9999, 12, 31, 23, 59);
    assert_eq!(last + 60_000, YEAR_10000_MS);
    assert_eq!(next("* * * * *", last - 1), Some(last));
    assert_eq!(next("* * * * *", last), None);
    assert_eq!(next("0 0 29 2 *", ms(9996, 3, 1, 0, 0)), None);
    assert_eq!(next("0 0 29 2 *", i64::MAX), None);
    assert!(next("0 0 29 2 *", i64::MIN).is_some());
    let c = Cron::parse("* * * * *").unwrap();
    assert_eq!(c.nth_after(0, u64::MAX), None);
    assert_eq!(c.nth_after(last - 60_000, 2), None);
    assert_eq!(c.count_between(last - 60_000, i64::MAX), 1);
    assert_eq!(c.prev_at_or_before(i64::MAX), Some(last));
    assert_eq!(c.prev_at_or_before(i64::MIN), None);
}

#[test]
fn a_400_year_horizon_is_fast() {
    let c = Cron::parse("0 0 29 2 1").unwrap(); // OR: Mondays in Feb, or Feb 29
    let t = std::time::Instant::now();
    let mut x = ms(2000, 1, 1, 0, 0);
    for _ in 0..1000 {
        x = c.next_after(x).unwrap();
    }
    let c2 = Cron::parse("0 0 29 2 *").unwrap();
    let mut y = ms(1600, 3, 1, 0, 0);
    for _ in 0..100 {
        y = c2.next_after(y).unwrap(); // 100 leap days: ~400 years
    }
    assert!(y > ms(1990, 1, 1, 0, 0));
    let m = Cron::parse("* * * * *").unwrap();
    assert_eq!(
        m.count_between(ms(1600, 1, 1, 0, 0) - 1, ms(2000, 1, 1, 0, 0) - 1),
        146_097 * 1440
    );
    // Debug build, a loaded machine: generous. The release figure is in benches/.
    assert!(
        t.elapsed() < std::time::Duration::from_millis(500),
        "{:?}",
        t.elapsed()
    );
}

/// Minute-by-minute scan: the slow, obvious reading of the same sets.
fn scan_matches(c: &Cron, minute: i64) -> bool {
    let z = minute.div_euclid(1440);
    let r = minute.rem_euclid(1440);
    c.day_matches_for_test(z) && c.hours & (1 << (r / 60)) != 0 && c.minutes & (1 << (r % 60)) != 0
}

impl Cron {
    fn day_matches_for_test(&self, z: i64) -> bool {
        let (y, m, d) = super::calendar::civil_from_days(z);
        let wd = super::calendar::weekday(z);
        if self.months & (1 << m) == 0 {
            return false;
        }
        let dom = self.days & (1 << d) != 0;
        let dow = self.weekdays & (1 << wd) != 0;
        let _ = y;
        if self.day_or {
            dom || dow
        } else {
            dom && dow
        }
    }
}

fn arb_field(lo: u32, hi: u32) -> impl Strategy<Value = String> {
    let value = lo..=hi;
    let term = prop_oneof![
        Just("*".to_string()),
        value.clone().prop_map(|v| v.to_string()),
        (value.clone(), value.clone()).prop_map(|(a, b)| format!("{}-{}", a.min(b), a.max(b))),
        (1u32..20).prop_map(|s| format!("*/{s}")),
        (value.clone(), 1u32..20).prop_map(|(a, s)| format!("{a}/{s}")),
        (value.clone(), value, 1u32..20).prop_map(|(a, b, s)| format!(
            "{}-{}/{s}",
            a.min(b),
            a.max(b)
        )),
    ];
    prop::collection::vec(term, 1..3).prop_map(|v| v.join(","))
}

fn arb_expr() -> impl Strategy<Value = String> {
    (
        arb_field(0, 59),
        arb_field(0, 23),
        arb_field(1, 31),
        arb_field(1, 12),
        arb_field(0, 7),
    )
        .prop_map(|(a, b, c, d, e)| format!("{a} {b} {c} {d} {e}"))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// next / nth / count / prev agree with a minute-by-minute scan over a few days.
    #[test]
    fn search_agrees_with_a_scan(expr in arb_expr(), start_min in -50_000_000i64..4_000_000_000) {
        let Ok(c) = Cron::parse(&expr) else { return Ok(()) };
        let span = 4 * 1440;
        let hits: Vec<i64> = (start_min + 1..=start_min + span)
            .filter(|m| scan_matches(&c, *m))
            .collect();
        let after = start_min * 60_000 + 30_000;
        let got_next = c.next_after(after);
        if let Some(first) = hits.iter().find(|m| **m * 60_000 > after) {
            prop_assert_eq!(got_next, Some(first * 60_000));
        } else {
            prop_assert!(got_next.is_none_or(|t| t > (start_min + span) * 60_000));
        }
        let base = start_min * 60_000;
        prop_assert_eq!(
            c.count_between(base, (start_min + span) * 60_000),
            hits.len() as u64
        );
        for (i, h) in hits.iter().enumerate().take(50) {
            prop_assert_eq!(c.nth_after(base, i as u64 + 1), Some(h * 60_000));
            prop_assert_eq!(c.prev_at_or_before(h * 60_000 + 59_999), Some(h * 60_000));
            if i > 0 {
                prop_assert_eq!(c.prev_at_or_before(h * 60_000 - 1), Some(hits[i - 1] * 60_000));
            }
        }
    }

    /// No input makes parsing or searching panic.
    #[test]
    fn never_panics(expr in "\\PC{0,40}", t in any::<i64>(), n in any::<u64>()) {
        if let Ok(c) = Cron::parse(&expr) {
            let _ = c.next_after(t);
            let _ = c.nth_after(t, n % 1_000_000_000 + 1);
            let _ = c.prev_at_or_before(t);
            let _ = c.count_between(t, t.saturating_add(n as i64 % 1_000_000_000_000));
        }
        let _ = parse_field(&expr, 0, 59);
    }

    #[test]
    fn never_panics_on_valid_shapes(expr in arb_expr(), t in any::<i64>(), n in any::<u64>()) {
        if let Ok(c) = Cron::parse(&expr) {
            let _ = c.next_after(t);
            let _ = c.nth_after(t, n);
            let _ = c.prev_at_or_before(t);
            let _ = c.count_between(t.min(0), t.max(0));
            let _ = c.count_between(i64::MIN, i64::MAX);
        }
    }

    #[test]
    fn odd_characters(expr in "[0-9*/,\\- a-zA-Z@#?\u{00a0}\u{2003}é٣]{0,30}") {
        match Cron::parse(&expr) {
            Ok(c) => { let _ = c.next_after(0); }
            Err(e) => prop_assert!(!e.message.is_empty()),
        }
    }
}
