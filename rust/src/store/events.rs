//! The event log's store operations (`EventStore`): topics (`gnl_topics`, a counter row per
//! topic), the log (`gnl_events`, one row per event, numbered per topic), and per consumer
//! `(topic, name)` a cursor row (`gnl_consumers`), marks for the events past the cursor that were
//! delivered (`gnl_event_marks`: waiting for a retry, accepted, or quarantined) and quarantine
//! records (`gnl_dead_events`). Each engine implements it in its `events.rs`.
//!
//! Why the cursor never skips an event (docs/DECISIONS.md "Events"): an emitting transaction
//! locks its topic's counter row, numbers its events after the counter and writes the counter
//! back before it commits. A second emitter waits on that row lock until the first commits (or
//! rolls back, releasing its numbers with the counter), so per topic the committed events are
//! always the gapless prefix `1..=last_seq`: an event that is not visible yet has a number
//! above every visible one. The cursor only moves over events that carry an accepted or
//! quarantined mark, which only visible events can carry, so it can never pass an event that
//! commits late.
//!
//! All instants are the store's clock (epoch ms). JSON travels as text, checked before it
//! reaches the store.

use async_trait::async_trait;

use crate::error::{Error, Result};
use crate::model::JobBatch;

/// The longest topic or consumer name, in characters.
pub const MAX_NAME_LEN: usize = 200;

/// Check a topic or consumer name (`what` names it): non-empty, at most `MAX_NAME_LEN`
/// characters, no control characters.
pub fn check_name(what: &str, v: &str) -> Result<()> {
    if v.is_empty() {
        return Err(Error::invalid(format!("{what} must be a non-empty string")));
    }
    let n = v.chars().count();
    if n > MAX_NAME_LEN {
        return Err(Error::invalid(format!(
            "{what} is {n} characters long; at most {MAX_NAME_LEN} are allowed"
        )));
    }
    if v.chars().any(char::is_control) {
        return Err(Error::invalid(format!(
            "{what} must not contain control characters"
        )));
    }
    Ok(())
}

/// The lock key (`gnl_locks`) of consumer `(topic, name)`'s lease. Both parts are escaped so
/// that the key is injective over (topic, name).
pub fn lease_key(topic: &str, name: &str) -> String {
    let esc = |s: &str| s.replace('%', "%25").replace(':', "%3A");
    format!("events:{}:{}", esc(topic), esc(name))
}

/// An event handed to a consumer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventRow {
    /// Its place in the topic's log (1-based, gapless).
    pub seq: i64,
    pub id: String,
    /// '' = no organization.
    pub org: String,
    /// JSON text.
    pub payload: String,
    pub emitted_at: i64,
    /// The attempt this delivery is (1-based): the charged attempts before it + 1 (a lone
    /// delivery is charged when handed out, a batch's when a failure of it settles).
    pub attempt: i64,
}

/// How a delivered event's handler ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventOutcome {
    /// The handler returned: the event is accepted (its mark written with a compare-and-set).
    Accepted { seq: i64 },
    /// The handler failed with `error`: retried `retry_after_ms` later, or quarantined when
    /// `None`.
    Failed {
        seq: i64,
        error: String,
        retry_after_ms: Option<i64>,
    },
}

impl EventOutcome {
    pub fn seq(&self) -> i64 {
        match self {
            EventOutcome::Accepted { seq } | EventOutcome::Failed { seq, .. } => *seq,
        }
    }
}

/// The seqs of the accepted outcomes.
pub fn accepted_seqs(outcomes: &[EventOutcome]) -> Vec<i64> {
    outcomes
        .iter()
        .filter_map(|o| match o {
            EventOutcome::Accepted { seq } => Some(*seq),
            _ => None,
        })
        .collect()
}

/// A consumer's position (`consumer_lag`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerLag {
    /// The last seq the cursor passed.
    pub cursor: i64,
    /// Events neither accepted nor quarantined (past the cursor, or handed back).
    pub behind: i64,
    /// When the oldest of those was emitted.
    pub oldest_unacked_at: Option<i64>,
    /// The last time the holder of its lease wrote (fetched or settled).
    pub heartbeat_at: Option<i64>,
    /// Quarantine records.
    pub dead: i64,
}

/// A consumer in a listing (`consumers`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerRow {
    pub topic: String,
    pub name: String,
    /// The last write of its lease holder.
    pub heartbeat_at: Option<i64>,
    /// Its quarantine records (handed-back ones included until redelivered).
    pub dead: i64,
}

/// A quarantine record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadEventRow {
    pub id: String,
    pub seq: i64,
    pub org: String,
    pub attempts: i64,
    pub error: String,
    /// When it was quarantined.
    pub at: i64,
    /// JSON text.
    pub payload: String,
    /// Handed back by `dead_retry`, waiting for its redelivery.
    pub handed_back: bool,
}

/// The most events one fetch hands out.
pub const MAX_FETCH: i64 = 1_000;

/// Which of the due candidates (in seq order, each with `lone`: it must go out alone) one
/// fetch hands out. A lone event (one with a mark that was charged before, or whose batch
/// delivery was never settled: its holder died or lost the lease) goes out alone, charged at
/// the fetch, so a death during it is charged to it exactly; other events go out together, up
/// to the first lone one, uncharged until they settle (docs/DECISIONS.md "Events: a holder's
/// death is charged to the event it hit").
pub fn pick(mut due: Vec<(EventRow, bool)>) -> Vec<(EventRow, bool)> {
    match due.first() {
        Some((_, true)) => due.truncate(1),
        _ => {
            let n = due.iter().take_while(|(_, lone)| !lone).count();
            due.truncate(n);
        }
    }
    due
}

/// The attempts to write for a picked event at its fetch and whether its mark is `batched`: a
/// lone event is charged now (`attempt`), a batched one is not (`attempt - 1`, charged when a
/// failure of it settles).
pub fn fetch_charge(e: &EventRow, lone: bool) -> (i64, i64) {
    if lone {
        (e.attempt, 0)
    } else {
        (e.attempt - 1, 1)
    }
}

/// What the event log asks of a database.
#[async_trait]
pub trait EventStore: Send + Sync {
    /// Append `events` to `topic` in one transaction (all or none), in batch order. An id
    /// already in the topic (or earlier in the batch) is that event: nothing is written for it.
    /// The batch's type field is unused.
    async fn emit(&self, topic: &str, events: &JobBatch) -> Result<()>;

    /// Bind consumer `(topic, name)` to the fencing `token` of its freshly taken lease
    /// (creating its cursor at the start of the log). False when a newer token holds it.
    async fn consumer_open(&self, topic: &str, name: &str, token: i64) -> Result<bool>;

    /// Hand out the next due events (`pick`, at most `limit`) to the holder of `token`: a
    /// lone one charged (its attempt counted), a batch uncharged (`fetch_charge`). `None` when
    /// `token` no longer holds the consumer.
    async fn event_fetch(
        &self,
        topic: &str,
        name: &str,
        token: i64,
        limit: i64,
    ) -> Result<Option<Vec<EventRow>>>;

    /// `event_fetch` at once on the calling thread, when the engine can (SQLite: a file store
    /// whose locks are all free, see `sqlite/raw.rs`): `Some` with its result; `None` when it
    /// could not (a lock held, another engine), having written nothing: use `event_fetch`.
    fn event_fetch_now(
        &self,
        _topic: &str,
        _name: &str,
        _token: i64,
        _limit: i64,
    ) -> Option<Result<Option<Vec<EventRow>>>> {
        None
    }

    /// Write the outcomes of delivered events (one transaction), then move the cursor over
    /// every accepted or quarantined event in front of it. False, writing nothing, when `token`
    /// no longer holds the consumer.
    async fn event_settle(
        &self,
        topic: &str,
        name: &str,
        token: i64,
        outcomes: &[EventOutcome],
    ) -> Result<bool>;

    /// `event_settle` at once on the calling thread, when the engine can (as
    /// `event_fetch_now`); `None`, having written nothing: use `event_settle`.
    fn event_settle_now(
        &self,
        _topic: &str,
        _name: &str,
        _token: i64,
        _outcomes: &[EventOutcome],
    ) -> Option<Result<bool>> {
        None
    }

    /// Consumer `(topic, name)`'s position; `None` when it never ran.
    async fn consumer_lag(&self, topic: &str, name: &str) -> Result<Option<ConsumerLag>>;

    /// The consumer's quarantine records in log order: those past `after_seq`, at most `limit`.
    async fn dead_events(
        &self,
        topic: &str,
        name: &str,
        after_seq: i64,
        limit: i64,
    ) -> Result<Vec<DeadEventRow>>;

    /// The consumers that ever ran, in `(topic, name)` order: those after `after`, at most
    /// `limit`, each with its heartbeat and its count of quarantine records.
    async fn consumers(&self, after: Option<(&str, &str)>, limit: i64) -> Result<Vec<ConsumerRow>>;

    /// Hand quarantined event `id` back for one more series of attempts. True when it is (or
    /// already was) handed back; false when there is no such record.
    async fn dead_retry(&self, topic: &str, name: &str, id: &str) -> Result<bool>;
}

/// The ids of a batch to write: the first occurrence of each id not in `taken`, in order.
pub(crate) fn fresh(events: &JobBatch, taken: &std::collections::HashSet<String>) -> Vec<usize> {
    let mut seen: std::collections::HashSet<&str> = std::collections::HashSet::new();
    (0..events.len())
        .filter(|&i| {
            let id = events.get(i).id;
            !taken.contains(id) && seen.insert(id)
        })
        .collect()
}

/// The cursor after a settle: `first_open` is the lowest seq past `cursor` that is neither
/// accepted nor quarantined, `last_passed` the highest seq past it that is.
pub(crate) fn next_cursor(cursor: i64, first_open: Option<i64>, last_passed: Option<i64>) -> i64 {
    match (first_open, last_passed) {
        (Some(o), _) => (o - 1).max(cursor),
        (None, Some(p)) => p.max(cursor),
        (None, None) => cursor,
    }
}

/// A `ConsumerLag` from the counts an engine read: past the cursor (unpassed count and oldest
/// emission) and handed back below it (count and oldest emission).
#[allow(clippy::too_many_arguments)]
pub(crate) fn lag_of(
    cursor: i64,
    heartbeat_at: Option<i64>,
    dead: i64,
    ahead: i64,
    ahead_oldest: Option<i64>,
    back: i64,
    back_oldest: Option<i64>,
) -> ConsumerLag {
    let oldest = match (ahead_oldest, back_oldest) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    ConsumerLag {
        cursor,
        behind: ahead + back,
        oldest_unacked_at: oldest,
        heartbeat_at,
        dead,
    }
}
