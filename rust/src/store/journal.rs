//! The journal's store operations (`JournalStore`): durable runs (`gnl_runs`), their steps keyed
//! `(run_id, name, n)` with the first writer's result kept (`gnl_run_steps`), and leased locks
//! with fencing tokens (`gnl_locks`). Each engine implements it in its `journal.rs`.
//!
//! All instants are the store's clock (epoch ms). JSON travels as text, checked before it
//! reaches the store.

use async_trait::async_trait;

use crate::error::{Error, Result};

/// The states of a run.
pub const RUN_STATES: [&str; 4] = ["running", "suspended", "done", "failed"];

/// The longest run id, step name, workflow name or lock key, in characters.
pub const MAX_KEY_LEN: usize = 4_000;

/// Check a run id, step name, workflow name or lock key (`what` names it): non-empty, at most
/// `MAX_KEY_LEN` characters, no NUL.
pub fn check_key(what: &str, v: &str) -> Result<()> {
    if v.is_empty() {
        return Err(Error::invalid(format!("{what} must be a non-empty string")));
    }
    let n = v.chars().count();
    if n > MAX_KEY_LEN {
        return Err(Error::invalid(format!(
            "{what} is {n} characters long; at most {MAX_KEY_LEN} are allowed"
        )));
    }
    if v.contains('\0') {
        return Err(Error::invalid(format!(
            "{what} must not contain NUL characters"
        )));
    }
    Ok(())
}

/// A recorded step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepRow {
    pub name: String,
    /// The earlier calls of `name` in the run.
    pub n: i64,
    /// Its place among the run's steps (0-based).
    pub position: i64,
    /// `"intent"` (an at-most-once step whose function was called, no result yet) or `"done"`.
    pub state: String,
    /// JSON, once done.
    pub result: Option<String>,
    pub started_at: i64,
    pub finished_at: Option<i64>,
}

/// A run's recorded steps in position order as `run_start` reads them back, packed for a
/// replay: the results as one JSON array (one decode on the Python side, no string a step),
/// each distinct name and state once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// The distinct names (`StepMeta::name` indexes them).
    pub names: Vec<String>,
    /// The distinct states (`StepMeta::state` indexes them).
    pub states: Vec<String>,
    /// The steps, in the order `(position, name, n)` (names compared as bytes).
    pub rows: Vec<StepMeta>,
    /// `[result,...]` in row order (a missing result: `null`).
    pub results: String,
}

/// A step of a `Recorded`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepMeta {
    pub name: u32,
    pub n: i64,
    pub position: i64,
    pub state: u32,
    /// Where its result is in `Recorded::results` (byte range), None when missing.
    pub result: Option<(usize, usize)>,
    pub started_at: i64,
    pub finished_at: Option<i64>,
}

impl Default for Recorded {
    /// No steps (`results` is `[]`).
    fn default() -> Recorded {
        RecordedBuilder::default().finish()
    }
}

impl Recorded {
    /// Pack `rows` (in any order).
    pub fn from_rows(rows: &[StepRow]) -> Recorded {
        let mut b = RecordedBuilder::default();
        for r in rows {
            b.push(
                r.name.as_bytes(),
                r.n,
                r.position,
                r.state.as_bytes(),
                r.result.as_deref().map(str::as_bytes),
                r.started_at,
                r.finished_at,
            );
        }
        b.finish()
    }

    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Row `i`'s result (JSON text), None when missing.
    pub fn result(&self, i: usize) -> Option<&str> {
        self.rows[i].result.map(|(a, b)| &self.results[a..b])
    }

    /// The steps unpacked, in order.
    pub fn to_rows(&self) -> Vec<StepRow> {
        (0..self.rows.len())
            .map(|i| {
                let r = &self.rows[i];
                StepRow {
                    name: self.names[r.name as usize].clone(),
                    n: r.n,
                    position: r.position,
                    state: self.states[r.state as usize].clone(),
                    result: self.result(i).map(str::to_owned),
                    started_at: r.started_at,
                    finished_at: r.finished_at,
                }
            })
            .collect()
    }
}

/// Packs steps read one by one (as bytes straight from a driver's row) into a `Recorded`.
#[derive(Default)]
pub struct RecordedBuilder {
    names: Vec<Vec<u8>>,
    /// `names`' indexes, for a run of many names.
    name_ix: std::collections::HashMap<Vec<u8>, u32>,
    states: Vec<Vec<u8>>,
    rows: Vec<StepMeta>,
    results: Vec<u8>,
    sorted: bool,
}

impl RecordedBuilder {
    /// The index of `name` in `names`, added when missing (the previous row's is tried first:
    /// the rows of a run mostly repeat one name).
    fn name(&mut self, name: &[u8]) -> u32 {
        if let Some(r) = self.rows.last() {
            if self.names[r.name as usize] == name {
                return r.name;
            }
        }
        if let Some(&i) = self.name_ix.get(name) {
            return i;
        }
        let i = self.names.len() as u32;
        self.names.push(name.to_vec());
        self.name_ix.insert(name.to_vec(), i);
        i
    }

    /// The index of `state` in `states` (a handful), added when missing.
    fn state(&mut self, state: &[u8]) -> u32 {
        match self.states.iter().position(|x| x.as_slice() == state) {
            Some(i) => i as u32,
            None => {
                self.states.push(state.to_vec());
                (self.states.len() - 1) as u32
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub fn push(
        &mut self,
        name: &[u8],
        n: i64,
        position: i64,
        state: &[u8],
        result: Option<&[u8]>,
        started_at: i64,
        finished_at: Option<i64>,
    ) {
        let name = self.name(name);
        let state = self.state(state);
        if self.rows.is_empty() {
            self.sorted = true;
            self.results.push(b'[');
        } else {
            self.results.push(b',');
        }
        let result = result.map(|r| {
            let a = self.results.len();
            self.results.extend_from_slice(r);
            (a, self.results.len())
        });
        if result.is_none() {
            self.results.extend_from_slice(b"null");
        }
        let row = StepMeta {
            name,
            n,
            position,
            state,
            result,
            started_at,
            finished_at,
        };
        if let Some(last) = self.rows.last() {
            if self.key(last) > self.key(&row) {
                self.sorted = false;
            }
        }
        self.rows.push(row);
    }

    fn key<'a>(&'a self, r: &StepMeta) -> (i64, &'a [u8], i64) {
        (r.position, &self.names[r.name as usize], r.n)
    }

    /// The `Recorded`, its rows sorted by `(position, name, n)`; text that is not UTF-8 (never
    /// written by gnl) is read lossily, as the other reads do.
    pub fn finish(mut self) -> Recorded {
        if self.rows.is_empty() {
            self.results.push(b'[');
        }
        self.results.push(b']');
        let text = |v: Vec<u8>| {
            String::from_utf8(v).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into())
        };
        let mut rows = std::mem::take(&mut self.rows);
        let results = if self.sorted {
            match String::from_utf8(std::mem::take(&mut self.results)) {
                Ok(text) => Some(text),
                Err(e) => {
                    self.results = e.into_bytes();
                    None
                }
            }
        } else {
            rows.sort_by(|a, b| self.key(a).cmp(&self.key(b)));
            None
        };
        let results = results.unwrap_or_else(|| {
            // Rebuilt in row order, each result read on its own.
            let mut out = String::with_capacity(self.results.len());
            out.push('[');
            for (i, r) in rows.iter_mut().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                r.result = r.result.map(|(a, b)| {
                    let start = out.len();
                    out.push_str(&String::from_utf8_lossy(&self.results[a..b]));
                    (start, out.len())
                });
                if r.result.is_none() {
                    out.push_str("null");
                }
            }
            out.push(']');
            out
        });
        Recorded {
            names: self.names.into_iter().map(text).collect(),
            states: self.states.into_iter().map(text).collect(),
            rows,
            results,
        }
    }
}

/// A run's record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunRow {
    pub run_id: String,
    pub workflow: String,
    pub preset: Option<String>,
    /// One of `RUN_STATES`.
    pub state: String,
    pub input: Option<String>,
    pub result: Option<String>,
    pub error: Option<String>,
    pub scheduled_for: Option<i64>,
    pub wake_at: Option<i64>,
    pub lease_owner: Option<String>,
    pub lease_expires_at: Option<i64>,
    pub token: i64,
    pub created_at: i64,
    pub updated_at: i64,
}

/// What an execution of a run asks for when it starts.
#[derive(Debug, Clone)]
pub struct RunStart {
    pub run_id: String,
    pub workflow: String,
    pub preset: Option<String>,
    /// JSON text (recorded when the run is new; a resumed run keeps its own).
    pub input: Option<String>,
    pub scheduled_for: Option<i64>,
    /// The executing process.
    pub owner: String,
    /// The lease that tells the waker this process is alive; `None`: the run is not the
    /// waker's to resume (a job's run: the job's own lease covers it).
    pub lease_ms: Option<i64>,
}

/// The answer to `run_start`.
#[derive(Debug, Clone)]
pub struct RunStarted {
    pub run: RunRow,
    /// Its recorded steps in position order (empty for a done run).
    pub steps: Recorded,
    /// True when this call created the run.
    pub created: bool,
    /// The store's clock when it started.
    pub now_ms: i64,
}

/// The filter of a run listing.
#[derive(Debug, Clone, Default)]
pub struct RunQuery {
    pub state: Option<String>,
    pub workflow: Option<String>,
    pub limit: i64,
    /// Only runs listed after this one, `(created_at, run_id)` of the last run of the previous
    /// page (the listing is newest first, so: created before it, or at the same instant with
    /// a lower key).
    pub before: Option<(i64, String)>,
    /// Examine at most this many runs past `before` (in listing order) and return those of
    /// them that match: a bounded read whatever the filter (`runs_edge` says where it ended).
    pub scan: Option<i64>,
}

/// The same workflow name must run under one run id: a run started as `recorded` cannot be
/// executed as `asked`.
pub fn check_workflow(run: &RunRow, asked: &str) -> Result<()> {
    if run.workflow != asked {
        return Err(Error::invalid(format!(
            "run {:?} is a run of workflow {:?}, not {:?}",
            run.run_id, run.workflow, asked
        )));
    }
    Ok(())
}

/// What the journal asks of a database.
#[async_trait]
pub trait JournalStore: Send + Sync {
    /// Step `(run_id, name, n)` as recorded.
    async fn step_get(&self, run_id: &str, name: &str, n: i64) -> Result<Option<StepRow>>;

    /// Record step `(run_id, name, n)` as done with `result` (JSON) unless it is recorded.
    /// Returns `None` when this call recorded it, else the row that was there first (done, or
    /// an at-most-once step's intent).
    async fn step_put(
        &self,
        run_id: &str,
        name: &str,
        n: i64,
        position: i64,
        result: &str,
    ) -> Result<Option<StepRow>>;

    /// `step_put` at once on the calling thread, when the engine can (SQLite: see
    /// `sqlite/now.rs`): `Some(())` when this call recorded the step; `None` when it did not
    /// (a lock held, the step already recorded, an error, another engine): use `step_put`.
    fn step_put_now(
        &self,
        _run_id: &str,
        _name: &str,
        _n: i64,
        _position: i64,
        _result: &str,
    ) -> Option<()> {
        None
    }

    /// Record an at-most-once step's intent (state `intent`, `token` its writer's) unless the
    /// step is recorded. Returns `None` when this call recorded it, else the row there first.
    async fn step_intent(
        &self,
        run_id: &str,
        name: &str,
        n: i64,
        position: i64,
        token: i64,
    ) -> Result<Option<StepRow>>;

    /// Complete the intent written with `token` with `result`. Returns false when that intent
    /// is gone (an operator resolved it meanwhile), and changes nothing then.
    async fn step_finish(
        &self,
        run_id: &str,
        name: &str,
        n: i64,
        token: i64,
        result: &str,
    ) -> Result<bool>;

    /// Resolve an intent without result: `Some(result)` marks it done with that result, `None`
    /// removes it so that a later execution runs the step again. Returns false when step
    /// `(run_id, name, n)` is not an intent (unknown or done), changing nothing.
    async fn step_resolve(
        &self,
        run_id: &str,
        name: &str,
        n: i64,
        result: Option<&str>,
    ) -> Result<bool>;

    /// Start an execution in one call: create the run (state running) or read it, and read its
    /// recorded steps. A run that is not done becomes running under `owner` with a fresh
    /// fencing token and, with `lease_ms`, a lease the waker watches. Another workflow name
    /// under the same run id is refused (`InvalidArgument`), and so is a run that another
    /// owner executes under a live lease (`RunBusy`: two executions never overlap while the
    /// first one's process is alive); nothing written either way. A run whose lease lapsed
    /// (its process died or stalled) is taken over.
    async fn run_start(&self, start: &RunStart) -> Result<RunStarted>;

    /// `run_start` at once on the calling thread, when the engine can (SQLite: see
    /// `sqlite/now.rs`); `None` when it did not (a lock held, a refusal to report, an error,
    /// another engine): use `run_start`, which then does all of it (nothing was written).
    fn run_start_now(&self, _start: &RunStart) -> Option<RunStarted> {
        None
    }

    /// Renew a running run's lease, held by `owner`. False when it is not running under
    /// `owner` any more (another execution took it over once the lease lapsed, or it ended).
    async fn run_renew(&self, run_id: &str, owner: &str, lease_ms: i64) -> Result<bool>;

    /// A running run sleeps until `wake_at`: state suspended, due to the waker then.
    async fn run_suspend(&self, run_id: &str, wake_at: i64) -> Result<bool>;

    /// The run returned `result` (JSON): state done unless it is done already. Returns `None`
    /// when this call recorded it, else the result recorded first.
    async fn run_finish(&self, run_id: &str, result: &str) -> Result<Option<String>>;

    /// `run_finish` at once on the calling thread, when the engine can: `Some(())` when this
    /// call recorded the result; `None` when it did not (a lock held, the run done already, an
    /// error, another engine): use `run_finish`.
    fn run_finish_now(&self, _run_id: &str, _result: &str) -> Option<()> {
        None
    }

    /// The run's execution failed with `error`: state failed (not the waker's to resume; a
    /// later `run_workflow` runs it again), unless it is done.
    async fn run_fail(&self, run_id: &str, error: &str) -> Result<bool>;

    /// Hand a failed run to the waker (`gnl.resume_run`): state suspended, due now, its error
    /// cleared. False (nothing changed) when it is not failed.
    async fn run_wake(&self, run_id: &str) -> Result<bool>;

    /// A run with its recorded steps.
    async fn run_get(&self, run_id: &str) -> Result<Option<(RunRow, Vec<StepRow>)>>;

    /// Runs, newest first.
    async fn list_runs(&self, q: &RunQuery) -> Result<Vec<RunRow>>;

    /// The `(created_at, run_id)` of the `scan`-th run past `before` in listing order (where a
    /// scan of `scan` runs ends), or `None` when fewer are left.
    async fn runs_edge(
        &self,
        before: Option<(i64, &str)>,
        scan: i64,
    ) -> Result<Option<(i64, String)>>;

    /// Claim up to `limit` runs of `workflows` that the waker should resume — suspended runs
    /// whose `wake_at` passed and running runs whose lease expired — oldest due first: each
    /// becomes running under `owner` with a lease of `lease_ms` (compare-and-set, so several
    /// wakers never claim one wake-up twice). A run claimed from its sleep keeps its
    /// `wake_at`; one claimed because its lease expired gets none (the waker logs those).
    async fn runs_due(
        &self,
        workflows: &[String],
        owner: &str,
        lease_ms: i64,
        limit: i64,
    ) -> Result<Vec<RunRow>>;

    /// Take lock `key` for `ttl_ms` unless it is held unexpired (by anyone: `owner`, unique
    /// per acquisition, only names the holder). Returns the fresh fencing token (one more than
    /// any token the lock had), or `None` when it is held.
    async fn lock_acquire(&self, key: &str, owner: &str, ttl_ms: i64) -> Result<Option<i64>>;

    /// `lock_acquire` at once on the calling thread, when the engine can: `Some(token)` when
    /// this call took the lock; `None` when it did not (held, a lock of the store's held, an
    /// error, another engine): use `lock_acquire`.
    fn lock_acquire_now(&self, _key: &str, _owner: &str, _ttl_ms: i64) -> Option<i64> {
        None
    }

    /// Extend the lock held with `token`; false when it is not held with that token any more.
    async fn lock_renew(&self, key: &str, token: i64, ttl_ms: i64) -> Result<bool>;

    /// Release the lock held with `token` (it expires; its row keeps the token count, so the
    /// next holder's token is fresh); false when it was not held with it.
    async fn lock_release(&self, key: &str, token: i64) -> Result<bool>;

    /// `lock_release` at once on the calling thread, when the engine can: `Some(())` when
    /// this call released it; `None` when it did not (not held with `token`, a lock of the
    /// store's held, an error, another engine): use `lock_release`.
    fn lock_release_now(&self, _key: &str, _token: i64) -> Option<()> {
        None
    }
}

/// The columns of a `RunRow`, in order (`run_row`).
pub(crate) const RUN_COLS: &str = "run_id, workflow, preset, state, input, result, error, \
     scheduled_for, wake_at, lease_owner, lease_expires_at, token, created_at, updated_at";

/// The columns of a `StepRow`, in order (`step_row`).
pub(crate) const STEP_COLS: &str = "name, n, position, state, result, started_at, finished_at";

/// A `RunRow` from a row of `RUN_COLS`, on an engine whose text columns decode as `String`
/// (SQLite, Postgres; MySQL reads its binary text columns as bytes).
pub(crate) fn run_row<'r, R>(r: &'r R) -> RunRow
where
    R: sqlx::Row,
    usize: sqlx::ColumnIndex<R>,
    i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    RunRow {
        run_id: r.get(0),
        workflow: r.get(1),
        preset: r.get(2),
        state: r.get(3),
        input: r.get(4),
        result: r.get(5),
        error: r.get(6),
        scheduled_for: r.get(7),
        wake_at: r.get(8),
        lease_owner: r.get(9),
        lease_expires_at: r.get(10),
        token: r.get(11),
        created_at: r.get(12),
        updated_at: r.get(13),
    }
}

/// A `StepRow` from a row of `STEP_COLS` (as `run_row`).
pub(crate) fn step_row<'r, R>(r: &'r R) -> StepRow
where
    R: sqlx::Row,
    usize: sqlx::ColumnIndex<R>,
    i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    StepRow {
        name: r.get(0),
        n: r.get(1),
        position: r.get(2),
        state: r.get(3),
        result: r.get(4),
        started_at: r.get(5),
        finished_at: r.get(6),
    }
}

/// The row a losing write found; it is there (rows are never deleted but by an operator's
/// resolve, which a racing writer cannot meet here without a store error).
pub(crate) fn kept(row: Option<StepRow>, run_id: &str, name: &str) -> Result<Option<StepRow>> {
    match row {
        Some(r) => Ok(Some(r)),
        None => Err(Error::Store {
            message: format!("step {name:?} of run {run_id:?} vanished after it was written"),
            code: None,
        }),
    }
}

/// The run an engine's `run_start` read back after its upsert, checked: refused when it is
/// another workflow's; with whether this call created it (token 1) and whether its steps are
/// to be read (a resumed run's; a created or done one has none to read).
pub(crate) fn started_run(run: Option<RunRow>, start: &RunStart) -> Result<(RunRow, bool, bool)> {
    let run = run.ok_or_else(|| Error::Store {
        message: format!("run {:?} vanished while it started", start.run_id),
        code: None,
    })?;
    check_workflow(&run, &start.workflow)?;
    if run.state != "done"
        && !(run.state == "running" && run.lease_owner.as_deref() == Some(&start.owner))
    {
        // The upsert left it alone: another execution's lease is live (see `run_start`). Worded
        // and quoted as the Python side's RunBusyError messages (`durable.py`).
        return Err(Error::RunBusy(format!(
            "run '{}' is being executed elsewhere (by {}, whose lease is live); nothing ran",
            start.run_id,
            run.lease_owner.as_deref().unwrap_or("another execution"),
        )));
    }
    let created = run.state != "done" && run.token == 1;
    let read = !created && run.state != "done";
    Ok((run, created, read))
}

/// The answer to `run_start` once the engine has the run's record after its upsert: a done
/// run (or one of another workflow: refused) comes back as it is; a resumed one with its
/// steps (`steps`, one read); a created one (token 1) has none to read.
pub(crate) async fn started<F, Fut>(
    run: Option<RunRow>,
    start: &RunStart,
    now_ms: i64,
    steps: F,
) -> Result<RunStarted>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<Vec<StepRow>>>,
{
    let (run, created, read) = started_run(run, start)?;
    let steps = if read {
        Recorded::from_rows(&steps().await?)
    } else {
        Recorded::default()
    };
    Ok(RunStarted {
        run,
        steps,
        created,
        now_ms,
    })
}

#[cfg(test)]
mod recorded_tests {
    use super::*;

    fn row(name: &str, n: i64, position: i64, state: &str, result: Option<&str>) -> StepRow {
        StepRow {
            name: name.into(),
            n,
            position,
            state: state.into(),
            result: result.map(str::to_owned),
            started_at: 10 + position,
            finished_at: result.map(|_| 20 + position),
        }
    }

    #[test]
    fn packs_rows_in_position_order_with_their_results_as_one_array() {
        // Key order (name, n), as SQLite reads them: a0 at 1, b0 at 0, b1 at 3, c0 at 2.
        let rows = [
            row("a", 0, 1, "done", Some("{\"x\":[1,2]}")),
            row("b", 0, 0, "done", Some("\"\u{1F600}\"")),
            row("b", 1, 3, "intent", None),
            row("c", 0, 2, "done", Some("null")),
        ];
        let rec = Recorded::from_rows(&rows);
        assert_eq!(rec.results, "[\"\u{1F600}\",{\"x\":[1,2]},null,null]");
        let mut sorted = rows.to_vec();
        sorted.sort_by_key(|r| r.position);
        assert_eq!(rec.to_rows(), sorted);
        assert_eq!(rec.names.len(), 3);
        assert_eq!(rec.states, vec!["done".to_string(), "intent".to_string()]);
        assert_eq!(rec.result(3), None);
        assert_eq!(rec.result(2), Some("null"));
    }

    #[test]
    fn rows_in_order_and_many_names_pack_as_they_come() {
        let rows: Vec<StepRow> = (0..300)
            .map(|i| {
                let name = format!("s{}", i % 150);
                row(&name, i / 150, i, "done", Some(&i.to_string()))
            })
            .collect();
        let rec = Recorded::from_rows(&rows);
        assert_eq!(rec.names.len(), 150);
        assert_eq!(rec.to_rows(), rows);
        let want: Vec<String> = (0..300).map(|i| i.to_string()).collect();
        assert_eq!(rec.results, format!("[{}]", want.join(",")));
    }

    #[test]
    fn no_rows_is_an_empty_array_and_bad_utf8_is_read_lossily() {
        assert_eq!(Recorded::default().results, "[]");
        assert!(Recorded::from_rows(&[]).is_empty());
        let mut b = RecordedBuilder::default();
        b.push(b"n", 0, 0, b"done", Some(b"\"a\xffb\""), 1, Some(1));
        b.push(b"n", 1, 1, b"done", Some(b"2"), 1, Some(1));
        let rec = b.finish();
        assert_eq!(rec.results, "[\"a\u{FFFD}b\",2]");
        assert_eq!(rec.result(1), Some("2"));
    }
}
