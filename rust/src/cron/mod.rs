//! Cron expressions exactly as Debian (Vixie) cron reads them, in UTC at minute resolution:
//! parsing (`Cron::parse`, `parse_field`) and searching (`search`: the next and previous fire
//! time, how many fire times lie in a span, the n-th one after an instant). No I/O, no pyo3.
//!
//! Grammar (API.md "Scheduler"): five fields (minute hour day-of-month month day-of-week);
//! numbers, `*`, ranges `a-b`, lists, steps `*/n`, `a-b/n`, `a/n` (= `a-max/n`, max 7 for
//! weekdays); month and weekday names in any case; 0 and 7 both Sunday; the macros `@yearly
//! @annually @monthly @weekly @daily @midnight @hourly`. When both day fields are restricted a
//! day matches either; a day field whose text starts with `*` is unrestricted (then a day must
//! match both). Refused: another field count, out-of-range values, step 0, reversed ranges,
//! `L W # ?`, and expressions that can never fire (`0 0 30 2 *`).

mod calendar;
mod field;
mod search;
#[cfg(test)]
mod tests;

use std::fmt;

pub use calendar::{iso_utc, MINUTE_MS, YEAR_10000_MS};
pub use field::Field;

/// Expressions longer than this are refused (the longest meaningful one is about 450).
pub const MAX_EXPR_LEN: usize = 1_024;

/// A refused cron expression or field. `field` is the field at fault, when one is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CronError {
    pub field: Option<Field>,
    pub message: String,
}

impl fmt::Display for CronError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CronError {}

/// A parsed cron expression: one bitset per field (bit `v` set when value `v` matches).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cron {
    minutes: u64,
    hours: u32,
    /// Bits 1..=31.
    days: u32,
    /// Bits 1..=12.
    months: u16,
    /// Bits 0..=6 (a 7 is folded into 0).
    weekdays: u8,
    /// Both day fields restricted: a day matches either (else it must match both).
    day_or: bool,
}

const MACROS: [(&str, &str); 7] = [
    ("@yearly", "0 0 1 1 *"),
    ("@annually", "0 0 1 1 *"),
    ("@monthly", "0 0 1 * *"),
    ("@weekly", "0 0 * * 0"),
    ("@daily", "0 0 * * *"),
    ("@midnight", "0 0 * * *"),
    ("@hourly", "0 * * * *"),
];

impl Cron {
    /// Parse a cron expression (API.md "Scheduler"); the error names the field at fault.
    pub fn parse(expr: &str) -> Result<Cron, CronError> {
        let whole = |field: Option<Field>, problem: String| CronError {
            field,
            message: match field {
                Some(f) => format!("cron expression {}: {f}: {problem}", field::quote(expr)),
                None => format!("cron expression {}: {problem}", field::quote(expr)),
            },
        };
        if expr.len() > MAX_EXPR_LEN {
            return Err(whole(
                None,
                format!(
                    "it is {} bytes long; the longest accepted is {MAX_EXPR_LEN}",
                    expr.len()
                ),
            ));
        }
        let text = expr.trim_matches(|c: char| c.is_ascii_whitespace());
        let source = if text.starts_with('@') {
            match MACROS.iter().find(|(name, _)| *name == text) {
                Some((_, e)) => *e,
                None => return Err(whole(None, macro_problem(text))),
            }
        } else {
            text
        };
        let mut fields = [""; 5];
        let mut n = 0;
        for f in source.split_ascii_whitespace() {
            if n < 5 {
                fields[n] = f;
            }
            n += 1;
        }
        if n != 5 {
            // `.field` names the first missing field; the message does not start with it
            // (`"hour: expected 5 fields"` reads as if the hour were wrong).
            let all: Vec<&str> = source.split_ascii_whitespace().collect();
            return Err(CronError {
                field: field_count_field(n),
                ..whole(None, field_count_problem(&all))
            });
        }
        let mut bits = [0u64; 5];
        for (i, f) in field::FIELDS.into_iter().enumerate() {
            bits[i] = field::parse(fields[i], field::Spec::of(f))
                .map_err(|p| whole(Some(f), format!("{p} (in {})", field::quote(fields[i]))))?;
        }
        let mut weekdays = bits[4];
        if weekdays & (1 << 7) != 0 {
            weekdays = (weekdays | 1) & !(1 << 7);
        }
        let cron = Cron {
            minutes: bits[0],
            hours: bits[1] as u32,
            days: bits[2] as u32,
            months: bits[3] as u16,
            weekdays: weekdays as u8,
            day_or: !fields[2].starts_with('*') && !fields[4].starts_with('*'),
        };
        if !cron.can_fire() {
            return Err(whole(
                Some(Field::DayOfMonth),
                format!(
                    "no month in {} has a day {}: the expression can never fire",
                    field::quote(fields[3]),
                    cron.days.trailing_zeros()
                ),
            ));
        }
        Ok(cron)
    }

    /// False when no day can ever match: both day fields must match (one starts with `*`)
    /// and no month of the month field has the first day of the day-of-month field (every
    /// date falls on every weekday in some year, so that is the only way).
    fn can_fire(&self) -> bool {
        if self.day_or {
            return true;
        }
        let first_day = self.days.trailing_zeros();
        (1..=12u32).any(|m| self.months & (1 << m) != 0 && first_day <= max_days(m))
    }
}

/// The most days month `m` has in any year.
fn max_days(m: u32) -> u32 {
    if m == 2 {
        29
    } else {
        calendar::days_in_month(2001, m)
    }
}

fn macro_problem(text: &str) -> String {
    let word = text.split_ascii_whitespace().next().unwrap_or(text);
    let names = "@yearly @annually @monthly @weekly @daily @midnight @hourly";
    if word == "@reboot" {
        format!("@reboot has no fire time (the macros are {names})")
    } else if MACROS.iter().any(|(n, _)| *n == word) {
        format!("{word} stands alone: nothing may follow it")
    } else if MACROS.iter().any(|(n, _)| n.eq_ignore_ascii_case(word)) {
        format!(
            "{} is not a macro; macros are lowercase ({names})",
            field::quote(word)
        )
    } else {
        format!(
            "{} is not a macro (the macros are {names})",
            field::quote(word)
        )
    }
}

/// The field a wrong field count is about: the first missing one, or day-of-week (the last)
/// when there are too many.
fn field_count_field(n: usize) -> Option<Field> {
    match n {
        0 => None,
        1..=4 => Some(field::FIELDS[n]),
        _ => Some(Field::DayOfWeek),
    }
}

fn field_count_problem(fields: &[&str]) -> String {
    let expected = "expected 5 fields (minute hour day-of-month month day-of-week)";
    match fields.len() {
        0 => format!("{expected}, found none"),
        n @ 1..=4 => format!(
            "{expected}, found {n}: {} and the fields after it are missing",
            field::FIELDS[n]
        ),
        n => format!(
            "{expected}, found {n}: {} comes after day-of-week (a seconds or year field is not accepted)",
            field::quote(fields[5])
        ),
    }
}

/// `gnl.parse_field(text, lo, hi)`: the sorted values `text` denotes over `lo..=hi`, with
/// the grammar of a cron field. The ranges of the month (1, 12) and day-of-week (0, 7) or
/// (0, 6) fields take their names, and day-of-week answers Sunday as 0.
pub fn parse_field(text: &str, lo: u32, hi: u32) -> Result<Vec<u32>, CronError> {
    if lo > hi || hi > 59 {
        return Err(CronError {
            field: None,
            message: format!("parse_field needs 0 <= lo <= hi <= 59, got lo={lo} hi={hi}"),
        });
    }
    let f = Field::by_range(lo, hi);
    let label = f.map(Field::name).unwrap_or("field");
    let mut bits = field::parse(text, field::Spec { field: f, lo, hi }).map_err(|p| CronError {
        field: f,
        message: format!("{label}: {p} (in {})", field::quote(text)),
    })?;
    if f == Some(Field::DayOfWeek) && bits & (1 << 7) != 0 {
        bits = (bits | 1) & !(1 << 7);
    }
    Ok((0..64).filter(|v| bits & (1u64 << v) != 0).collect())
}
