//! Fire-time search on a parsed `Cron`. Everything jumps: months by bitmask, days by the
//! month's mask of matching days, hours and minutes by bitmask; spans longer than 400 years
//! (the Gregorian cycle, after which dates and weekdays repeat) are counted by the cycle. No
//! loop runs minute by minute; the slowest call (the n-th fire time for a huge n) walks at
//! most one 400-year cycle month by month.
//!
//! Internally instants are minute numbers (minutes since 1970-01-01T00:00Z) and days are day
//! numbers; the `*_ms` functions are the public face, in epoch ms. Fire times exist from the
//! year -292,000,000 (near the smallest `i64` ms) to the end of the year 9999.

use super::calendar::{
    civil_from_days, days_from_civil, days_in_month, weekday, CYCLE_DAYS, DAY_MINUTES, MINUTE_MS,
    YEAR_10000_MS,
};
use super::Cron;

/// No fire time is at or after this year.
const END_YEAR: i64 = 10_000;
/// No fire time is before this year (its ms still fit an `i64`).
const MIN_YEAR: i64 = -292_000_000;
/// The first minute number of the year 10000.
const END_MINUTE: i64 = YEAR_10000_MS / MINUTE_MS;

/// `DAYS_AT[r]`: the days d (bits 1..=31) with (d - 1) % 7 == r.
const DAYS_AT: [u64; 7] = {
    let mut t = [0u64; 7];
    let mut d = 1;
    while d <= 31 {
        t[(d - 1) % 7] |= 1 << d;
        d += 1;
    }
    t
};

/// The days 1..=31 of a month whose day 1 is weekday `first` that fall on a weekday of
/// `weekdays` (bits 0..=6).
fn weekday_days(weekdays: u8, first: u32) -> u64 {
    let mut out = 0;
    let mut w = weekdays;
    while w != 0 {
        let x = w.trailing_zeros();
        w &= w - 1;
        out |= DAYS_AT[((x + 7 - first) % 7) as usize];
    }
    out
}

/// The n-th (1-based) set bit of `bits`.
fn select_bit(mut bits: u64, n: u32) -> u32 {
    for _ in 1..n {
        bits &= bits - 1;
    }
    bits.trailing_zeros()
}

/// Bits `from..` of a 64-bit mask (`from` may be 64 or more: none).
fn bits_from(bits: u64, from: u32) -> u64 {
    if from >= 64 {
        0
    } else {
        bits & (u64::MAX << from)
    }
}

/// Bits `..=to` of a 64-bit mask.
fn bits_to(bits: u64, to: u32) -> u64 {
    if to >= 63 {
        bits
    } else {
        bits & ((1u64 << (to + 1)) - 1)
    }
}

fn next_month(y: i64, m: u32) -> (i64, u32) {
    if m == 12 {
        (y + 1, 1)
    } else {
        (y, m + 1)
    }
}

fn prev_month(y: i64, m: u32) -> (i64, u32) {
    if m == 1 {
        (y - 1, 12)
    } else {
        (y, m - 1)
    }
}

impl Cron {
    /// The matching days (bits 1..=31) of month `m` of year `y`.
    fn month_days(&self, y: i64, m: u32) -> u64 {
        if self.months & (1 << m) == 0 {
            return 0;
        }
        let valid = bits_to(u64::MAX, days_in_month(y, m)) & !1;
        let by_weekday = weekday_days(self.weekdays, weekday(days_from_civil(y, m, 1)));
        let days = u64::from(self.days);
        valid
            & if self.day_or {
                days | by_weekday
            } else {
                days & by_weekday
            }
    }

    fn day_matches(&self, z: i64) -> bool {
        let (y, m, d) = civil_from_days(z);
        self.month_days(y, m) & (1 << d) != 0
    }

    /// The last matching day at or before day `z`, from the year -292,000,000 on.
    fn prev_day(&self, z: i64) -> Option<i64> {
        let (mut y, mut m, d) = civil_from_days(z);
        let mut mask = bits_to(self.month_days(y, m), d);
        while mask == 0 {
            (y, m) = prev_month(y, m);
            if y < MIN_YEAR {
                return None;
            }
            mask = self.month_days(y, m);
        }
        Some(days_from_civil(y, m, 63 - mask.leading_zeros()))
    }

    /// Matching days in `z1..=z2` (fewer than 400 years), month by month.
    fn count_days_short(&self, z1: i64, z2: i64) -> u64 {
        let (mut y, mut m, d1) = civil_from_days(z1);
        let (y2, m2, d2) = civil_from_days(z2);
        let mut mask = bits_from(self.month_days(y, m), d1);
        let mut total = 0u64;
        while (y, m) != (y2, m2) {
            total += u64::from(mask.count_ones());
            (y, m) = next_month(y, m);
            mask = self.month_days(y, m);
        }
        total + u64::from(bits_to(mask, d2).count_ones())
    }

    /// Matching days in `z1..=z2`.
    fn count_days(&self, mut z1: i64, z2: i64) -> u64 {
        if z1 > z2 {
            return 0;
        }
        let cycles = (z2 - z1 + 1) / CYCLE_DAYS;
        let mut total = 0u64;
        if cycles > 0 {
            total = cycles as u64 * self.count_days_short(z1, z1 + CYCLE_DAYS - 1);
            z1 += cycles * CYCLE_DAYS;
        }
        if z1 <= z2 {
            total += self.count_days_short(z1, z2);
        }
        total
    }

    /// The n-th (n >= 1) matching day at or after day `z`, before the year 10000.
    fn nth_day(&self, mut z: i64, mut n: u64) -> Option<i64> {
        // More matching days than one cycle can hold: skip whole cycles first.
        if n > CYCLE_DAYS as u64 {
            let per_cycle = self.count_days_short(z, z + CYCLE_DAYS - 1);
            let skip = (n - 1) / per_cycle.max(1);
            let years = (skip as i128) * 400;
            if years >= i128::from(END_YEAR - MIN_YEAR) {
                return None;
            }
            n -= skip * per_cycle;
            z += skip as i64 * CYCLE_DAYS;
        }
        let (mut y, mut m, d) = civil_from_days(z);
        let mut mask = bits_from(self.month_days(y, m), d);
        loop {
            if y >= END_YEAR {
                return None;
            }
            let c = u64::from(mask.count_ones());
            if n <= c {
                return Some(days_from_civil(y, m, select_bit(mask, n as u32)));
            }
            n -= c;
            (y, m) = next_month(y, m);
            mask = self.month_days(y, m);
        }
    }

    /// Fire times in a matching day.
    fn per_day(&self) -> u64 {
        u64::from(self.hours.count_ones()) * u64::from(self.minutes.count_ones())
    }

    /// Fire times of a matching day at or after minute-of-day `r` (0..=1440).
    fn slots_from(&self, r: i64) -> u64 {
        let (h, mi) = ((r / 60) as u32, (r % 60) as u32);
        let in_hour = if h < 24 && self.hours & (1 << h) != 0 {
            u64::from(bits_from(self.minutes, mi).count_ones())
        } else {
            0
        };
        let later_hours = bits_from(u64::from(self.hours), h + 1).count_ones();
        in_hour + u64::from(later_hours) * u64::from(self.minutes.count_ones())
    }

    /// The n-th (n >= 1) fire time of a matching day at or after minute-of-day `r`.
    fn nth_slot(&self, r: i64, mut n: u64) -> Option<i64> {
        let (h0, mi0) = ((r / 60) as u32, (r % 60) as u32);
        let mut hours = bits_from(u64::from(self.hours), h0);
        while hours != 0 {
            let h = hours.trailing_zeros();
            hours &= hours - 1;
            let mins = if h == h0 {
                bits_from(self.minutes, mi0)
            } else {
                self.minutes
            };
            let c = u64::from(mins.count_ones());
            if n <= c {
                return Some(i64::from(h * 60 + select_bit(mins, n as u32)));
            }
            n -= c;
        }
        None
    }

    /// The last fire time of a matching day at or before minute-of-day `r`.
    fn last_slot(&self, r: i64) -> Option<i64> {
        let (h0, mi0) = ((r / 60) as u32, (r % 60) as u32);
        let mut hours = bits_to(u64::from(self.hours), h0);
        while hours != 0 {
            let h = 63 - hours.leading_zeros();
            hours &= !(1 << h);
            let mins = if h == h0 {
                bits_to(self.minutes, mi0)
            } else {
                self.minutes
            };
            if mins != 0 {
                return Some(i64::from(h * 60 + 63 - mins.leading_zeros()));
            }
        }
        None
    }

    /// The n-th (n >= 1) fire minute at or after minute `m0`.
    fn nth_minute(&self, m0: i64, n: u64) -> Option<i64> {
        let (z, r) = (m0.div_euclid(DAY_MINUTES), m0.rem_euclid(DAY_MINUTES));
        let mut n = n;
        if self.day_matches(z) {
            let c = self.slots_from(r);
            if n <= c {
                return self.nth_slot(r, n).map(|s| z * DAY_MINUTES + s);
            }
            n -= c;
        }
        let per = self.per_day();
        let day = self.nth_day(z + 1, (n - 1) / per + 1)?;
        let slot = self.nth_slot(0, (n - 1) % per + 1)?;
        Some(day * DAY_MINUTES + slot)
    }

    /// Fire minutes in `m1..=m2`.
    fn count_minutes(&self, m1: i64, m2: i64) -> u64 {
        let m2 = m2.min(END_MINUTE - 1);
        if m1 > m2 {
            return 0;
        }
        let (z1, r1) = (m1.div_euclid(DAY_MINUTES), m1.rem_euclid(DAY_MINUTES));
        let (z2, r2) = (m2.div_euclid(DAY_MINUTES), m2.rem_euclid(DAY_MINUTES));
        if z1 == z2 {
            return if self.day_matches(z1) {
                self.slots_from(r1) - self.slots_from(r2 + 1)
            } else {
                0
            };
        }
        let first = if self.day_matches(z1) {
            self.slots_from(r1)
        } else {
            0
        };
        let last = if self.day_matches(z2) {
            self.per_day() - self.slots_from(r2 + 1)
        } else {
            0
        };
        first + last + self.count_days(z1 + 1, z2 - 1) * self.per_day()
    }

    /// The first fire time strictly after `after_ms` (epoch ms), or None when there is none
    /// before the year 10000.
    pub fn next_after(&self, after_ms: i64) -> Option<i64> {
        self.nth_after(after_ms, 1)
    }

    /// The n-th (n >= 1) fire time strictly after `after_ms`, or None when it would be in the
    /// year 10000 or later.
    pub fn nth_after(&self, after_ms: i64, n: u64) -> Option<i64> {
        if n == 0 {
            return None;
        }
        let m0 = after_ms.div_euclid(MINUTE_MS) + 1;
        if m0 >= END_MINUTE {
            return None;
        }
        self.nth_minute(m0, n)
            .filter(|m| *m < END_MINUTE)
            .map(|m| m * MINUTE_MS)
    }

    /// The next `count` fire times strictly after `after_ms`, in order (fewer when the year
    /// 10000 comes first).
    pub fn times_after(&self, after_ms: i64, count: usize) -> Vec<i64> {
        let mut out = Vec::with_capacity(count.min(1 << 16));
        let mut t = after_ms;
        while out.len() < count {
            let Some(x) = self.next_after(t) else { break };
            out.push(x);
            t = x;
        }
        out
    }

    /// The last fire time at or before `at_ms`, or None when there is none from the year
    /// -292,000,000 on.
    pub fn prev_at_or_before(&self, at_ms: i64) -> Option<i64> {
        let m = at_ms.div_euclid(MINUTE_MS).min(END_MINUTE - 1);
        let (z, r) = (m.div_euclid(DAY_MINUTES), m.rem_euclid(DAY_MINUTES));
        let found = match self.day_matches(z).then(|| self.last_slot(r)).flatten() {
            Some(s) => z * DAY_MINUTES + s,
            None => {
                let day = self.prev_day(z - 1)?;
                day * DAY_MINUTES + self.last_slot(DAY_MINUTES - 1)?
            }
        };
        found.checked_mul(MINUTE_MS)
    }

    /// How many fire times `t` have `after_ms < t <= upto_ms` (none from the year 10000 on).
    pub fn count_between(&self, after_ms: i64, upto_ms: i64) -> u64 {
        self.count_minutes(
            after_ms.div_euclid(MINUTE_MS) + 1,
            upto_ms.div_euclid(MINUTE_MS),
        )
    }
}
