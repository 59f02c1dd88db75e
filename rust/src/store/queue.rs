//! The queue's store operations (`QueueStore`): enqueue, claim, outcomes, lease renewal,
//! listings, retry and cancel; and the calls that wrap them (a deadlock run again, a batch
//! that arrives in parts). Each engine implements it in its `queue.rs`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use async_trait::async_trait;

use super::again_on_deadlock;
use crate::error::{Error, Result};
use crate::model::{
    ClaimRequest, ClaimedJob, JobBatch, JobCounts, JobRow, LeaseRef, ListQuery, ListScope, NewJob,
    Outcome, RenewStatus,
};

/// How often a call that writes anyway (outcomes, a claim without the empty-poll read) also
/// looks for expired leases, in ms: a stale lease waits that much longer, a busy worker saves
/// a statement per claim (docs/DECISIONS.md, "Expired leases").
const RECLAIM_EVERY_MS: u64 = 250;

/// When a store last looked for expired leases, on this process's monotonic clock. Never the
/// wall clock: one that steps back (NTP, a VM restore) would stop the looks for as long as it
/// stepped (issue 9, finding 9). Lease decisions themselves use the store's clock.
pub(crate) struct ReclaimThrottle {
    started: Instant,
    /// The last look, in ms since `started` (at least 1); 0: never.
    last: AtomicU64,
}

impl ReclaimThrottle {
    pub(crate) fn new() -> Self {
        ReclaimThrottle {
            started: Instant::now(),
            last: AtomicU64::new(0),
        }
    }

    fn now(&self) -> u64 {
        (self.started.elapsed().as_millis() as u64).max(1)
    }

    /// Whether a call should look now: the first time, then at most every `RECLAIM_EVERY_MS`
    /// (one of racing calls wins). A `true` is recorded as a look.
    pub(crate) fn due(&self) -> bool {
        let now = self.now();
        let last = self.last.load(Ordering::Relaxed);
        (last == 0 || now.saturating_sub(last) >= RECLAIM_EVERY_MS)
            && self
                .last
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// Record a look the call makes anyway (an empty poll that saw an expired lease).
    pub(crate) fn looked(&self) {
        self.last.store(self.now(), Ordering::Relaxed);
    }
}

/// `?,?,…`: `n` anonymous SQL parameters.
pub(crate) fn marks(n: usize) -> String {
    let mut m = String::with_capacity(2 * n);
    for i in 0..n {
        m.push_str(if i == 0 { "?" } else { ",?" });
    }
    m
}

/// A lane pick's organizations in turn (at most `limit`), each with the types of its lanes
/// that were read, from rows of (org, type, served_at) read per type, each type's first
/// `limit` rows in (served_at, org) order: the first `limit` organizations in that order over
/// every type, by their earliest row. A claim writes an organization's new ticket on every
/// lane of it that it read (its due lanes of the claim's types), and a new lane takes the
/// organization's newest ticket, so for a worker's types an organization's due lanes share
/// one ticket, and each type's first `limit` rows hold every due lane of those organizations.
pub(crate) fn orgs_in_turn<O: Ord + Clone, T: Ord>(
    mut rows: Vec<(O, T, i64)>,
    limit: usize,
) -> Vec<(O, Vec<T>)> {
    rows.sort_by(|a, b| (a.2, &a.0, &a.1).cmp(&(b.2, &b.0, &b.1)));
    let mut at: std::collections::BTreeMap<O, usize> = Default::default();
    let mut out: Vec<(O, Vec<T>)> = vec![];
    for (org, typ, _) in rows {
        if let Some(&i) = at.get(&org) {
            out[i].1.push(typ);
        } else if out.len() < limit {
            at.insert(org.clone(), out.len());
            out.push((org, vec![typ]));
        }
    }
    out
}

/// The share of a claim's pass taking `limit` jobs that the `i`-th of `n` organizations in
/// turn gets: an equal share, the first ones the rest, at most `per_org` when that is not 0
/// (`ClaimRequest::per_org`). Postgres computes the same in `gnl_claim` (migration 0010).
pub(crate) fn share(limit: usize, n: usize, i: usize, per_org: usize) -> usize {
    let even = limit / n + usize::from(i < limit % n);
    if per_org > 0 {
        even.min(per_org)
    } else {
        even
    }
}

/// A claim with no per-organization cap serves a big batch a quantum at a time: its first pass
/// serves at most `first_pass_orgs` organizations in turn (a quarter of the batch, at least
/// `CLAIM_MIN_ORGS`), an equal share each: four jobs each over many organizations; when they
/// hold fewer jobs than the batch, a second pass gives what is left to the next organizations
/// in turn, an equal share each. Most of a claim's time is per lane it serves (its lock, its
/// job lookups, its next head's, its update), so serving a few jobs a lane instead of one or
/// two takes a batch of 100 over 1,000 organizations in two thirds of the time (Postgres:
/// benches/RESULTS.md, 2026-12-04); fairness is the same round robin, in units of up to four
/// jobs. A batch of up to 16 is served as before (one job a lane over 16 or more lanes). A
/// claim capped per organization (a worker's claims that may race for the lanes) takes one
/// pass over up to `limit` organizations. Postgres does the same in `gnl_claim` (migration
/// 0010).
pub(crate) const CLAIM_QUANTUM: usize = 4;

/// The organizations a claim's first pass serves at the least (when as many are in turn and
/// the batch is as big).
pub(crate) const CLAIM_MIN_ORGS: usize = 16;

/// The organizations in turn the first pass of a claim of `limit` jobs serves at most.
pub(crate) fn first_pass_orgs(limit: usize, per_org: usize) -> usize {
    if per_org > 0 {
        limit
    } else {
        limit.min(limit.div_ceil(CLAIM_QUANTUM).max(CLAIM_MIN_ORGS))
    }
}

/// The jobs a claim's second pass asks for, over as many organizations, once its first pass
/// took `taken` of `limit` jobs from the `read` organizations in turn it read of the `orgs` it
/// could serve (`first_pass_orgs`). None: no second pass (capped per organization, the batch
/// full, or fewer organizations in turn than the first pass could serve: none is left).
pub(crate) fn second_pass(
    limit: usize,
    per_org: usize,
    taken: usize,
    read: usize,
    orgs: usize,
) -> Option<usize> {
    let want = limit.saturating_sub(taken);
    (per_org == 0 && want > 0 && read >= orgs).then_some(want)
}

/// What the queue asks of a database. All instants are the store's clock (epoch ms).
#[async_trait]
pub trait QueueStore: Send + Sync {
    /// Insert jobs in one transaction, all or none. Ids already present (or repeated in the
    /// call) are one job. Fails with `QueueFull` (and writes nothing) when a job's
    /// `max_depth` would be exceeded by its organization's pending jobs.
    async fn enqueue_batch(&self, jobs: &JobBatch) -> Result<()>;

    /// Whether `enqueue_parts` starts writing before the last part arrives (else it collects
    /// the parts and calls `enqueue_batch`: a caller gains nothing by cutting a batch).
    fn streams_enqueue(&self) -> bool {
        false
    }

    /// `enqueue_batch` of a batch of `jobs` jobs that arrives in parts, in order, on `parts`;
    /// `orgs` holds every organization the parts will hold. The sender ends with `Part::End`;
    /// a channel closed before it abandons the call, and nothing is written. Returns, besides
    /// the result, the whole batch as it arrived (all of it, even on failure), for running it
    /// again.
    async fn enqueue_parts(
        &self,
        jobs: usize,
        orgs: &[String],
        parts: &mut PartReceiver,
    ) -> (Result<()>, JobBatch) {
        let _ = orgs;
        let mut all = JobBatch::default();
        if let Err(e) = receive_all(jobs, parts, &mut all).await {
            return (Err(e), all);
        }
        (self.enqueue_batch(&all).await, all)
    }

    /// `enqueue_batch` of these jobs, packed.
    async fn enqueue(&self, jobs: &[NewJob]) -> Result<()> {
        self.enqueue_batch(&JobBatch::from(jobs)).await
    }

    /// Write `finished` outcomes, reclaim expired leases, then claim up to `req.limit` due jobs
    /// taking the lanes that waited longest in turn, in one transaction.
    async fn claim(&self, finished: &[Outcome], req: &ClaimRequest) -> Result<Vec<ClaimedJob>>;
    /// `claim` at once on the calling thread, when the engine can (SQLite: a file store whose
    /// locks are all free, see `sqlite/raw.rs`): `Some` with its result; `None` when it could
    /// not (a lock held, another engine), having written nothing: use `claim`.
    fn claim_now(
        &self,
        _finished: &[Outcome],
        _req: &ClaimRequest,
    ) -> Option<Result<Vec<ClaimedJob>>> {
        None
    }
    /// Write outcomes; each is conditional on (seq, token, state running).
    async fn finish(&self, outcomes: &[Outcome]) -> Result<()>;
    /// Extend leases by `ttl_ms`; one status per lease, in order.
    async fn renew(&self, leases: &[LeaseRef], ttl_ms: i64) -> Result<Vec<RenewStatus>>;

    /// Which of these leases are still held and which jobs were asked to stop (one status
    /// per lease, in order), and whether the leases were extended by `ttl_ms` meanwhile: a
    /// worker's early look for cancels (`worker::CANCEL_CHECK`). By default a renewal; an
    /// engine whose renewal costs a write per lease may read instead.
    async fn check_cancels(
        &self,
        leases: &[LeaseRef],
        ttl_ms: i64,
    ) -> Result<(Vec<RenewStatus>, bool)> {
        Ok((renew(self, leases, ttl_ms).await?, true))
    }

    /// Whether some lane of one of `types` may have a due job (its next-due bound has passed).
    /// A claim for `types` that came back empty while this is true met lanes that concurrent
    /// claims held.
    async fn has_due(&self, types: &[String]) -> Result<bool>;

    async fn get_job(&self, org: &str, id: &str) -> Result<Option<JobRow>>;
    /// At least the highest committed job seq (0 when none was ever written): a listing's
    /// snapshot (jobs enqueued after it are not listed).
    async fn max_seq(&self) -> Result<i64>;
    async fn list_jobs(&self, q: &ListQuery) -> Result<Vec<JobRow>>;
    /// dead -> pending with attempts 0; false (and no change) otherwise.
    async fn retry_job(&self, org: &str, id: &str) -> Result<bool>;
    /// pending -> canceled; running -> cancel requested; false for finished or unknown jobs.
    async fn cancel_job(&self, org: &str, id: &str, reason: Option<&str>) -> Result<bool>;

    /// Organizations that have (or had) jobs, `""` (no organization) included, in name
    /// order, strictly after `after` (None: from the first), at most `limit`. Reads the lanes'
    /// key: one bounded query.
    async fn list_orgs(&self, after: Option<&str>, limit: i64) -> Result<Vec<String>>;

    /// Counts by state of organization `org`'s latest `scan` jobs (at most), and of those that
    /// finished at or after `since_ms`, by minute: one query along the lane's key, bounded by
    /// `scan`, cut off after `timeout_ms` (Postgres `statement_timeout`, MySQL
    /// `max_execution_time`, MariaDB `max_statement_time`, SQLite an interrupt: see
    /// `store::ReadTimeout`).
    async fn count_jobs(
        &self,
        org: &str,
        scan: i64,
        since_ms: i64,
        timeout_ms: i64,
    ) -> Result<JobCounts>;

    /// `count_jobs` of each of `orgs`, in order (an engine may answer them in one query).
    async fn count_jobs_of(
        &self,
        orgs: &[String],
        scan: i64,
        since_ms: i64,
        timeout_ms: i64,
    ) -> Result<Vec<JobCounts>> {
        let mut out = Vec::with_capacity(orgs.len());
        for org in orgs {
            out.push(self.count_jobs(org, scan, since_ms, timeout_ms).await?);
        }
        Ok(out)
    }
}

/// `count_jobs`'s result from its rows (state, minute since `since_ms` if finished since, jobs).
pub(crate) fn job_counts(rows: Vec<(String, Option<i64>, i64)>) -> JobCounts {
    let mut c = JobCounts::default();
    for (state, minute, n) in rows {
        c.scanned += n;
        match c.states.iter_mut().find(|(s, _)| *s == state) {
            Some(e) => e.1 += n,
            None => c.states.push((state.clone(), n)),
        }
        if let Some(m) = minute {
            c.finished.push((m, state, n));
        }
    }
    c.states.sort();
    c.finished.sort();
    c
}

/// A bounded, filtered listing: examine at most `scan` jobs after `after` in listing order
/// (`lane` Some: that lane in enqueue order; None: every lane, as `ListScope::All`), up to
/// `snapshot`, and keep those of `state` and `typ` (None: any), at most `limit`. Returns the
/// jobs kept and the position to go on from (None: nothing is left to examine). A page can
/// hold fewer than `limit` jobs (even none) while more are left: the scan bound keeps every
/// page one bounded read along the key, however rare the matches.
#[allow(clippy::too_many_arguments)]
pub async fn scan_jobs(
    store: &(impl QueueStore + ?Sized),
    lane: Option<&str>,
    state: Option<&str>,
    typ: Option<&str>,
    snapshot: i64,
    after: Option<(String, i64)>,
    scan: i64,
    limit: usize,
) -> Result<(Vec<JobRow>, Option<(String, i64)>)> {
    // Without a filter every job examined is kept: examine no more than a page.
    let scan = if state.is_none() && typ.is_none() {
        scan.min(limit as i64)
    } else {
        scan
    };
    let scope = match lane {
        Some(org) => ListScope::Lane {
            org: org.to_string(),
            state: None,
            typ: None,
        },
        None => ListScope::All,
    };
    let rows = store
        .list_jobs(&ListQuery {
            scope,
            snapshot,
            after,
            limit: scan,
        })
        .await?;
    let full = rows.len() as i64 >= scan;
    let n = rows.len();
    let mut kept = Vec::new();
    let mut next = None;
    for (i, r) in rows.into_iter().enumerate() {
        let pos = (r.org.clone(), r.seq);
        let keep = state.is_none_or(|s| r.state == s) && typ.is_none_or(|t| r.typ == t);
        let last = i + 1 == n;
        if keep {
            kept.push(r);
            if kept.len() >= limit {
                next = (!last || full).then_some(pos);
                break;
            }
        }
        if last && full {
            next = Some(pos);
        }
    }
    Ok((kept, next))
}

/// `QueueStore::enqueue_batch`, run again when the server aborted it to break a deadlock (see
/// `again_on_deadlock`): two calls that insert overlapping ids in different orders can
/// deadlock, and the rows (ids included) are fixed before the call, so running it again is
/// idempotent.
/// Waiting workers are woken once it committed.
pub async fn enqueue(store: &(impl super::Store + ?Sized), jobs: &JobBatch) -> Result<()> {
    again_on_deadlock(|| store.enqueue_batch(jobs)).await?;
    if !jobs.is_empty() {
        store.wakeups().changed(super::Topic::Jobs);
    }
    Ok(())
}

/// One message of `QueueStore::enqueue_parts`.
#[derive(Debug)]
pub enum Part {
    /// The next jobs of the batch.
    Jobs(Box<JobBatch>),
    /// The batch is complete.
    End,
}

pub type PartSender = tokio::sync::mpsc::UnboundedSender<Part>;
pub type PartReceiver = tokio::sync::mpsc::UnboundedReceiver<Part>;

/// Append every part still to come to `all`, up to `Part::End`; `Abandoned` when the channel
/// closes before it. `jobs`: the whole batch's size.
pub async fn receive_all(jobs: usize, parts: &mut PartReceiver, all: &mut JobBatch) -> Result<()> {
    loop {
        match parts.recv().await {
            Some(Part::Jobs(b)) => append_part(jobs, all, &b),
            Some(Part::End) => return Ok(()),
            None => return Err(Error::Abandoned),
        }
    }
}

/// Append a part of a batch of `jobs` jobs to `all`, making room for the whole batch when
/// the first part comes (growing it part by part would copy it over and over).
pub fn append_part(jobs: usize, all: &mut JobBatch, part: &JobBatch) {
    if all.is_empty() && !part.is_empty() {
        all.reserve(jobs, part.text_bytes().div_ceil(part.len()) + 8);
    }
    all.append(part);
}

/// `QueueStore::enqueue_parts`, run again as one batch when the server aborted it to break a
/// deadlock (see `enqueue`).
pub async fn enqueue_parts(
    store: &(impl super::Store + ?Sized),
    jobs: usize,
    orgs: &[String],
    parts: &mut PartReceiver,
) -> Result<()> {
    match store.enqueue_parts(jobs, orgs, parts).await {
        (Err(e), all) if e.is_deadlock() => enqueue(store, &all).await,
        (r, _) => {
            if r.is_ok() && jobs > 0 {
                store.wakeups().changed(super::Topic::Jobs);
            }
            r
        }
    }
}

/// Outcomes in the order their job rows are locked, so that a write of outcomes never waits
/// for a renewal of the same worker's leases that waits for it. Every engine locks a write's
/// job rows in its outcomes' order, its done ones first, then its failed ones; a renewal locks
/// all the worker's held jobs (those whose outcome is queued included) by seq. Outcomes in
/// completion order deadlocked with the renewal: Postgres breaks a deadlock only after
/// `deadlock_timeout` (1 s), with both waiting meanwhile, so two in a row cost a live worker
/// a 2 s lease (tests/test_multiprocess.py, CI of session 14, on a loaded 2-core machine).
/// So each kind goes by seq; and when a failed seq is below a done one (done-then-failed
/// would not ascend) the batch splits: the failed ones are returned to be written first, by
/// themselves (the rarer case: a batch holding both kinds, interleaved).
pub(crate) fn in_lock_order(outcomes: &[Outcome]) -> (Vec<Outcome>, Vec<Outcome>) {
    let (mut done, mut failed): (Vec<Outcome>, Vec<Outcome>) = outcomes
        .iter()
        .cloned()
        .partition(|o| matches!(o, Outcome::Done { .. }));
    done.sort_by_key(Outcome::seq);
    failed.sort_by_key(Outcome::seq);
    match (done.last(), failed.first()) {
        (Some(d), Some(f)) if f.seq() < d.seq() => (failed, done),
        _ => {
            done.append(&mut failed);
            (vec![], done)
        }
    }
}

/// `QueueStore::claim` with its outcomes in lock order (`in_lock_order`; a split batch's
/// failed ones are written first, by `finish`), run again when the server aborted it to break
/// a deadlock (see `again_on_deadlock`; on MySQL a claim's lane locks can meet an enqueue's
/// lane upsert). The aborted transaction wrote nothing, and every outcome is conditional on
/// its fencing token, so running it again, or writing again outcomes already written, is safe.
pub async fn claim(
    store: &(impl QueueStore + ?Sized),
    finished: &[Outcome],
    req: &ClaimRequest,
) -> Result<Vec<ClaimedJob>> {
    let (first, rest) = in_lock_order(finished);
    if !first.is_empty() {
        again_on_deadlock(|| store.finish(&first)).await?;
    }
    again_on_deadlock(|| store.claim(&rest, req)).await
}

/// `QueueStore::finish` with its outcomes in lock order (`in_lock_order`), run again when the
/// server aborted it to break a deadlock (see `again_on_deadlock`); every outcome is
/// conditional on its fencing token.
pub async fn finish(store: &(impl QueueStore + ?Sized), outcomes: &[Outcome]) -> Result<()> {
    let (first, rest) = in_lock_order(outcomes);
    for part in [first, rest] {
        if !part.is_empty() {
            again_on_deadlock(|| store.finish(&part)).await?;
        }
    }
    Ok(())
}

/// `QueueStore::renew`, run again when the server aborted it to break a deadlock (see
/// `again_on_deadlock`). It locks the held jobs by seq, as outcomes are written
/// (`in_lock_order`). A renewal only extends leases still held, so running it again is
/// idempotent.
pub async fn renew(
    store: &(impl QueueStore + ?Sized),
    leases: &[LeaseRef],
    ttl_ms: i64,
) -> Result<Vec<RenewStatus>> {
    again_on_deadlock(|| store.renew(leases, ttl_ms)).await
}

/// The columns of a `JobRow`, in `job_row`'s order (every engine selects these).
pub(crate) const JOB_COLS: &str =
    "seq, org, id, type, payload, state, attempts, max_attempts, last_error, result, \
     created_at, updated_at, run_at, finished_at";

/// A `JobRow` from a row of `JOB_COLS`, on an engine whose text columns decode as `String`
/// (SQLite, Postgres; MySQL reads its binary text columns as bytes).
pub(crate) fn job_row<'r, R>(r: &'r R) -> JobRow
where
    R: sqlx::Row,
    usize: sqlx::ColumnIndex<R>,
    i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    JobRow {
        seq: r.get(0),
        org: r.get(1),
        id: r.get(2),
        typ: r.get(3),
        payload: r.get(4),
        state: r.get(5),
        attempts: r.get(6),
        max_attempts: r.get(7),
        last_error: r.get(8),
        result: r.get(9),
        created_at: r.get(10),
        updated_at: r.get(11),
        run_at: r.get(12),
        finished_at: r.get(13),
    }
}

#[cfg(test)]
mod tests {
    use super::in_lock_order;
    use crate::model::Outcome;

    fn done(seq: i64) -> Outcome {
        Outcome::Done {
            seq,
            token: 1,
            org: "o".into(),
            result: None,
        }
    }

    fn failed(seq: i64) -> Outcome {
        Outcome::Failed {
            seq,
            token: 1,
            org: "o".into(),
            error: "e".into(),
            delay_ms: 0,
        }
    }

    fn seqs(v: &[Outcome]) -> Vec<i64> {
        v.iter().map(Outcome::seq).collect()
    }

    #[test]
    fn outcomes_are_written_in_ascending_seq_order_per_statement() {
        // One kind: one write, by seq.
        let (first, rest) = in_lock_order(&[done(5), done(2), done(9)]);
        assert_eq!((seqs(&first), seqs(&rest)), (vec![], vec![2, 5, 9]));
        // Done ones below failed ones: done-then-failed ascends, one write.
        let (first, rest) = in_lock_order(&[failed(8), done(3), failed(7), done(1)]);
        assert_eq!((seqs(&first), seqs(&rest)), (vec![], vec![1, 3, 7, 8]));
        // A failed one below a done one: the failed ones first, by themselves.
        let (first, rest) = in_lock_order(&[done(4), failed(6), failed(2), done(9)]);
        assert_eq!((seqs(&first), seqs(&rest)), (vec![2, 6], vec![4, 9]));
        assert!(matches!(first[0], Outcome::Failed { .. }));
        assert!(rest.iter().all(|o| matches!(o, Outcome::Done { .. })));
    }
}
