//! The scheduler's store operations (`TriggerStore`): triggers (`gnl_triggers`), each an
//! immutable definition and a state that only moves by compare-and-set. Each engine implements
//! it in its `triggers.rs`. The fire lock is the journal's leased lock (`gnl_locks`, keyed
//! `<run_id>:fire`); a state write made while firing is fenced by that lock's token.
//!
//! A trigger is due when its state is `pending` and `next_run_at <= now`: `due_at` mirrors
//! `next_run_at` for pending triggers (NULL otherwise) and is indexed, so an idle poll reads one
//! index entry whatever the number of triggers. All instants are epoch ms.

use async_trait::async_trait;

use crate::error::{Error, Result};

/// The longest trigger id or workflow name, in characters (MySQL keys the table by the id).
pub const MAX_TRIGGER_ID_LEN: usize = 255;

/// The states of a trigger.
pub const TRIGGER_STATES: [&str; 3] = ["pending", "done", "failed"];

/// Check a trigger id or workflow name (`what` names it): non-empty, at most
/// `MAX_TRIGGER_ID_LEN` characters, no NUL.
pub fn check_trigger_key(what: &str, v: &str) -> Result<()> {
    if v.is_empty() {
        return Err(Error::invalid(format!("{what} must be a non-empty string")));
    }
    let n = v.chars().count();
    if n > MAX_TRIGGER_ID_LEN {
        return Err(Error::invalid(format!(
            "{what} is {n} characters long; at most {MAX_TRIGGER_ID_LEN} are allowed"
        )));
    }
    if v.contains('\0') {
        return Err(Error::invalid(format!(
            "{what} must not contain NUL characters"
        )));
    }
    Ok(())
}

/// A trigger's definition: immutable once registered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TriggerDef {
    pub id: String,
    /// The workflow name handed to the runner.
    pub name: String,
    /// `"cron"`, `"every"` or `"at"`.
    pub kind: String,
    /// The cron expression, `every_ms` or the `at` instant, as text.
    pub spec: String,
    /// The registration instant (anchors an `every` grid).
    pub anchor_ms: i64,
    pub misfire: String,
    pub max_catchup: Option<i64>,
    pub misfire_grace_ms: i64,
    /// JSON text.
    pub input: Option<String>,
    pub max_attempts: i64,
    /// The definition as canonical text: a second registration of the id must bring the same.
    pub definition: String,
}

/// A trigger's state: what polls move.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TriggerState {
    /// One of `TRIGGER_STATES`.
    pub state: String,
    /// Fires that finished (the next fire's run id is `sched:<id>:<fire_count>`).
    pub fire_count: i64,
    /// When the trigger is next due (a slot, or a retry after a failure or a deferral).
    pub next_run_at: Option<i64>,
    /// The grid slot the trigger owes (misfire plans start from it).
    pub owed_slot: Option<i64>,
    /// The slot of a fire that failed or was deferred and is retried (its `scheduled_for`).
    pub retry_slot: Option<i64>,
    /// Failed attempts of the current fire.
    pub attempts: i64,
    pub last_error: Option<String>,
    pub last_fired_at: Option<i64>,
    pub last_scheduled_for: Option<i64>,
    /// Occurrences that were missed and never fired.
    pub missed: i64,
    pub deferrals: i64,
    pub last_deferral_at: Option<i64>,
}

impl TriggerState {
    /// The `due_at` column: `next_run_at` while pending, else NULL (not due ever).
    pub fn due_at(&self) -> Option<i64> {
        (self.state == "pending")
            .then_some(self.next_run_at)
            .flatten()
    }
}

/// A registered trigger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TriggerRow {
    pub def: TriggerDef,
    pub state: TriggerState,
    /// +1 on every state write: the compare-and-set's witness.
    pub version: i64,
    pub created_at: i64,
    pub updated_at: i64,
}

/// The page of due triggers a poll reads.
#[derive(Debug, Clone)]
pub struct DueTriggers {
    /// The instant they are due at (the caller's `now`, else the store's clock).
    pub now_ms: i64,
    /// Ordered by `(next_run_at, id)`.
    pub rows: Vec<TriggerRow>,
    /// On the last page (fewer than `limit` rows): the earliest `next_run_at` after `now_ms`
    /// of a pending trigger, if any (the scheduler sleeps no longer than until then).
    pub next_due_ms: Option<i64>,
}

impl DueTriggers {
    /// A page from up to `limit + 1` pending triggers read in `(due_at, id)` order from the
    /// page's start, due or not: those due by `now_ms` (at most `limit`), and the first one
    /// not due yet, whose instant is `next_due_ms` (one read along the due index gives both).
    pub(crate) fn split(now_ms: i64, read: Vec<TriggerRow>, limit: i64) -> Self {
        let limit = usize::try_from(limit).unwrap_or(0);
        let mut rows = Vec::with_capacity(read.len().min(limit));
        let mut next_due_ms = None;
        for r in read {
            match r.state.due_at() {
                Some(at) if at > now_ms => {
                    if rows.len() < limit {
                        next_due_ms = Some(at);
                    }
                    break;
                }
                _ if rows.len() == limit => break,
                _ => rows.push(r),
            }
        }
        DueTriggers {
            now_ms,
            rows,
            next_due_ms,
        }
    }
}

/// What the scheduler asks of a database.
#[async_trait]
pub trait TriggerStore: Send + Sync {
    /// Register `def` with the state `initial` unless its id is registered. Returns whether
    /// this call created it, and the trigger as stored (the caller compares definitions).
    async fn trigger_register(
        &self,
        def: &TriggerDef,
        initial: &TriggerState,
    ) -> Result<(bool, TriggerRow)>;

    /// Pending triggers with `next_run_at <= now` (`now`: the store's clock when `None`),
    /// ordered by `(next_run_at, id)`, after `after` (keyset paging), at most `limit`; on
    /// the last page, the next instant a pending trigger is due at (`DueTriggers::split`).
    async fn triggers_due(
        &self,
        now_ms: Option<i64>,
        after: Option<(i64, String)>,
        limit: i64,
    ) -> Result<DueTriggers>;

    /// One trigger.
    async fn trigger_get(&self, id: &str) -> Result<Option<TriggerRow>>;

    /// The triggers whose id is after `after` (None: from the first), by id, at most
    /// `limit`: one read along the key.
    async fn list_triggers(&self, after: Option<&str>, limit: i64) -> Result<Vec<TriggerRow>>;

    /// Write `state` over the trigger's if its version is still `version` and, with a fence
    /// `(lock_key, token)`, the lock `lock_key` is still held with `token` (the fire lock of the
    /// fire that writes). Returns false, changing nothing, otherwise.
    async fn trigger_update(
        &self,
        id: &str,
        version: i64,
        state: &TriggerState,
        fence: Option<(&str, i64)>,
    ) -> Result<bool>;

    /// Remove a trigger; false when there was none.
    async fn trigger_delete(&self, id: &str) -> Result<bool>;
}

/// The columns of a `TriggerRow`, in order (`trigger_row`).
pub(crate) const TRIGGER_COLS: &str = "id, name, kind, spec, anchor_ms, misfire, max_catchup, \
     misfire_grace_ms, input, max_attempts, definition, state, fire_count, next_run_at, \
     owed_slot, retry_slot, attempts, last_error, last_fired_at, last_scheduled_for, missed, \
     deferrals, last_deferral_at, version, created_at, updated_at";

/// The state columns a write sets, in order, each followed by its placeholder (`due_at` last).
pub(crate) const STATE_COLS: [&str; 13] = [
    "state",
    "fire_count",
    "next_run_at",
    "owed_slot",
    "retry_slot",
    "attempts",
    "last_error",
    "last_fired_at",
    "last_scheduled_for",
    "missed",
    "deferrals",
    "last_deferral_at",
    "due_at",
];

/// A `TriggerRow` from a row of `TRIGGER_COLS`, text read by `t` / `ot` and integers by `i` /
/// `oi` (MySQL reads its binary text columns as bytes).
pub(crate) fn trigger_row_with(
    t: impl Fn(usize) -> String,
    ot: impl Fn(usize) -> Option<String>,
    i: impl Fn(usize) -> i64,
    oi: impl Fn(usize) -> Option<i64>,
) -> TriggerRow {
    TriggerRow {
        def: TriggerDef {
            id: t(0),
            name: t(1),
            kind: t(2),
            spec: t(3),
            anchor_ms: i(4),
            misfire: t(5),
            max_catchup: oi(6),
            misfire_grace_ms: i(7),
            input: ot(8),
            max_attempts: i(9),
            definition: t(10),
        },
        state: TriggerState {
            state: t(11),
            fire_count: i(12),
            next_run_at: oi(13),
            owed_slot: oi(14),
            retry_slot: oi(15),
            attempts: i(16),
            last_error: ot(17),
            last_fired_at: oi(18),
            last_scheduled_for: oi(19),
            missed: i(20),
            deferrals: i(21),
            last_deferral_at: oi(22),
        },
        version: i(23),
        created_at: i(24),
        updated_at: i(25),
    }
}

/// A `TriggerRow` on an engine whose text columns decode as `String` (SQLite, Postgres).
pub(crate) fn trigger_row<'r, R>(r: &'r R) -> TriggerRow
where
    R: sqlx::Row,
    usize: sqlx::ColumnIndex<R>,
    i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    trigger_row_with(|k| r.get(k), |k| r.get(k), |k| r.get(k), |k| r.get(k))
}

/// The row a registration found; it is there (only `unschedule` deletes, and a racing one
/// makes the call fail with this error, nothing written).
pub(crate) fn registered(row: Option<TriggerRow>, id: &str) -> Result<TriggerRow> {
    row.ok_or_else(|| Error::Store {
        message: format!("trigger {id:?} vanished while it was registered"),
        code: None,
    })
}

/// `"col = <p(k)>, …"` over `STATE_COLS`, placeholders numbered from `first`.
pub(crate) fn set_clause(p: impl Fn(usize) -> String, first: usize) -> String {
    STATE_COLS
        .iter()
        .enumerate()
        .map(|(k, c)| format!("{c} = {}", p(first + k)))
        .collect::<Vec<_>>()
        .join(", ")
}

type Q<'q, DB> = sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments<'q>>;

/// Bind `STATE_COLS`' values, in order.
pub(crate) fn bind_state<'q, DB>(q: Q<'q, DB>, s: &'q TriggerState) -> Q<'q, DB>
where
    DB: sqlx::Database,
    i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    Option<i64>: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    Option<&'q str>: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    q.bind(s.state.as_str())
        .bind(s.fire_count)
        .bind(s.next_run_at)
        .bind(s.owed_slot)
        .bind(s.retry_slot)
        .bind(s.attempts)
        .bind(s.last_error.as_deref())
        .bind(s.last_fired_at)
        .bind(s.last_scheduled_for)
        .bind(s.missed)
        .bind(s.deferrals)
        .bind(s.last_deferral_at)
        .bind(s.due_at())
}

/// Bind the definition's columns (`DEF_COLS`), in order.
pub(crate) fn bind_def<'q, DB>(q: Q<'q, DB>, d: &'q TriggerDef) -> Q<'q, DB>
where
    DB: sqlx::Database,
    i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    Option<i64>: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    Option<&'q str>: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    q.bind(d.id.as_str())
        .bind(d.name.as_str())
        .bind(d.kind.as_str())
        .bind(d.spec.as_str())
        .bind(d.anchor_ms)
        .bind(d.misfire.as_str())
        .bind(d.max_catchup)
        .bind(d.misfire_grace_ms)
        .bind(d.input.as_deref())
        .bind(d.max_attempts)
        .bind(d.definition.as_str())
}

/// The definition's columns, in `bind_def`'s order.
pub(crate) const DEF_COLS: &str = "id, name, kind, spec, anchor_ms, misfire, max_catchup, \
     misfire_grace_ms, input, max_attempts, definition";

/// `INSERT INTO gnl_triggers (DEF_COLS, STATE_COLS, version, created_at, updated_at)
/// VALUES (…)` with placeholders `p(1..)`, the clock `now` for the instants: 24 placeholders,
/// then the clock twice.
pub(crate) fn insert_sql(p: impl Fn(usize) -> String, now: &str) -> String {
    let n = 11 + STATE_COLS.len();
    let ph = (1..=n).map(&p).collect::<Vec<_>>().join(", ");
    format!(
        "INSERT INTO gnl_triggers ({DEF_COLS}, {}, version, created_at, updated_at) \
         VALUES ({ph}, 1, {now}, {now})",
        STATE_COLS.join(", ")
    )
}

/// `TriggerStore::trigger_register`, waking the scheduler's pollers (this process's at once,
/// others' through the engine's notification or their next poll) when it created the
/// trigger: a new trigger may be due before their next poll.
pub async fn register(
    store: &(impl super::Store + ?Sized),
    def: &TriggerDef,
    initial: &TriggerState,
) -> Result<(bool, TriggerRow)> {
    let (created, row) = store.trigger_register(def, initial).await?;
    if created {
        store.wakeups().changed(super::Topic::Triggers);
    }
    Ok((created, row))
}
