//! One cron field's text to the set of values it denotes (Debian cron's grammar):
//! `list = range {"," range}`, `range = "*" ["/" step] | value ["-" value] ["/" step]`,
//! `value = digits | name`. A single value with a step (`a/n`) runs from `a` to the field's
//! maximum. Sets are bitsets (`u64`, bit `v` for value `v`).

use std::fmt;

/// The five fields of a cron expression, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    Minute,
    Hour,
    DayOfMonth,
    Month,
    DayOfWeek,
}

pub const FIELDS: [Field; 5] = [
    Field::Minute,
    Field::Hour,
    Field::DayOfMonth,
    Field::Month,
    Field::DayOfWeek,
];

const MONTHS: [&str; 12] = [
    "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
];
const WEEKDAYS: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];

impl Field {
    /// The field's name in messages (API.md's terms).
    pub fn name(self) -> &'static str {
        match self {
            Field::Minute => "minute",
            Field::Hour => "hour",
            Field::DayOfMonth => "day-of-month",
            Field::Month => "month",
            Field::DayOfWeek => "day-of-week",
        }
    }

    /// The values the field's text may name; day-of-week runs to 7 (Sunday again).
    pub fn range(self) -> (u32, u32) {
        match self {
            Field::Minute => (0, 59),
            Field::Hour => (0, 23),
            Field::DayOfMonth => (1, 31),
            Field::Month => (1, 12),
            Field::DayOfWeek => (0, 7),
        }
    }

    /// The field whose range is `(lo, hi)`, if any (`parse_field` names and folds by it).
    pub fn by_range(lo: u32, hi: u32) -> Option<Field> {
        match (lo, hi) {
            (0, 6) | (0, 7) => Some(Field::DayOfWeek),
            _ => FIELDS.into_iter().find(|f| f.range() == (lo, hi)),
        }
    }

    fn names(self) -> &'static [&'static str] {
        match self {
            Field::Month => &MONTHS,
            Field::DayOfWeek => &WEEKDAYS,
            _ => &[],
        }
    }

    /// The value of the first name (month names start at 1).
    fn first_name_value(self) -> u32 {
        if self == Field::Month {
            1
        } else {
            0
        }
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The range a field's text is read over: a cron field's, or any `parse_field(text, lo, hi)`.
#[derive(Clone, Copy, Debug)]
pub struct Spec {
    pub field: Option<Field>,
    pub lo: u32,
    pub hi: u32,
}

impl Spec {
    pub fn of(field: Field) -> Spec {
        let (lo, hi) = field.range();
        Spec {
            field: Some(field),
            lo,
            hi,
        }
    }
}

/// Messages quote at most this many characters of the offending text.
const QUOTE_MAX: usize = 40;

/// `text` quoted for a message, cut to `QUOTE_MAX` characters.
pub fn quote(text: &str) -> String {
    if text.chars().count() <= QUOTE_MAX {
        format!("{text:?}")
    } else {
        let cut: String = text.chars().take(QUOTE_MAX).collect();
        format!("{cut:?}…")
    }
}

/// Parse one field's text over `spec`; the error is the problem, without the field's name.
pub fn parse(text: &str, spec: Spec) -> Result<u64, String> {
    if text.is_empty() {
        return Err("the field is empty".into());
    }
    let mut bits = 0u64;
    for term in text.split(',') {
        bits |= term_bits(term, spec)?;
    }
    Ok(bits)
}

fn term_bits(term: &str, spec: Spec) -> Result<u64, String> {
    if term.is_empty() {
        return Err("a list has an empty item".into());
    }
    if let Some(c) = term.chars().find(|c| matches!(c, '?' | '#')) {
        return Err(extension(c, term));
    }
    let (range, step) = match term.split_once('/') {
        None => (term, None),
        Some((r, s)) => (r, Some(step(s, term)?)),
    };
    let (start, end) = if range == "*" {
        (spec.lo, spec.hi)
    } else if let Some((a, b)) = range.split_once('-') {
        let (a, b) = (value(a, term, spec)?, value(b, term, spec)?);
        if a > b {
            return Err(format!(
                "the range {} is reversed ({a} > {b})",
                quote(range)
            ));
        }
        (a, b)
    } else {
        let a = value(range, term, spec)?;
        // `a/n` runs from a to the field's maximum; a single value without a step is itself.
        (a, if step.is_some() { spec.hi } else { a })
    };
    let step = step.unwrap_or(1);
    let mut bits = 0u64;
    let mut v = u64::from(start);
    while v <= u64::from(end) {
        bits |= 1 << v;
        v = v.saturating_add(step);
    }
    Ok(bits)
}

fn step(text: &str, term: &str) -> Result<u64, String> {
    match number(text) {
        Some(0) => Err(format!(
            "the step in {} is 0 (a step is at least 1)",
            quote(term)
        )),
        Some(n) => Ok(n),
        None if text.is_empty() => Err(format!("{} has no step after '/'", quote(term))),
        None => Err(format!(
            "the step {} in {} is not a number",
            quote(text),
            quote(term)
        )),
    }
}

/// Digits (ASCII only) to a number; more digits than a `u64` holds saturate (still a number,
/// out of every range).
fn number(text: &str) -> Option<u64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(text.bytes().fold(0u64, |n, b| {
        n.saturating_mul(10).saturating_add(u64::from(b - b'0'))
    }))
}

fn value(text: &str, term: &str, spec: Spec) -> Result<u32, String> {
    if let Some(n) = number(text) {
        if n < u64::from(spec.lo) || n > u64::from(spec.hi) {
            return Err(format!(
                "{} is out of range {}-{}",
                quote(text),
                spec.lo,
                spec.hi
            ));
        }
        return Ok(n as u32);
    }
    if let Some(field) = spec.field {
        if let Some(i) = field
            .names()
            .iter()
            .position(|n| n.eq_ignore_ascii_case(text))
        {
            return Ok(i as u32 + field.first_name_value());
        }
    }
    if text.is_empty() {
        return Err(format!("{} has a range with a missing end", quote(term)));
    }
    if let Some(c) = text.chars().find(|c| matches!(c, 'L' | 'l' | 'W' | 'w')) {
        if text.trim_start_matches(|c: char| c.is_ascii_digit()).len() <= 2 {
            return Err(extension(c, term));
        }
    }
    let what = match spec.field {
        Some(Field::Month) => "a number or a month name (JAN-DEC)",
        Some(Field::DayOfWeek) => "a number or a weekday name (SUN-SAT)",
        _ => "a number",
    };
    Err(format!("{} is not {what}", quote(text)))
}

fn extension(c: char, term: &str) -> String {
    format!(
        "{} uses '{c}', an extension of other crons (L W # ?) that gnl does not accept",
        quote(term)
    )
}
