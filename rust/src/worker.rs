//! The native half of a queue worker: claims, the lease set and its renewal timer, and the
//! group-committed outcome writer. The Python half (`gnl.worker`) runs handlers and calls in.
//!
//! * `claim(n)` writes every outcome that is waiting and claims up to `n` jobs in one store
//!   call (one transaction), and adds the new leases to the lease set. A claim that came back
//!   after `ttl_ms/3` or more has its leases renewed before its jobs are handed out (the store
//!   dated them from the claim's start): a job whose lease is gone by then is not started.
//! * `finish(outcome)` queues the outcome of an attempt. Its lease stays in the set, renewed,
//!   until the outcome is written (or given up, below). A writer task writes whatever has
//!   queued in one transaction (group commit): at once when `kick()` asks, else once the
//!   oldest waiting outcome was queued `WRITE_AFTER` ago, unless a claim took them meanwhile.
//!   The writer and a claim may write at the same time (two connections): each outcome is
//!   taken by one of them, and each write is conditional on its lease's fencing token, so
//!   their order does not matter.
//! * Writes are retried with backoff until they succeed or the outcome's lease runs out (the
//!   last good renewal + `ttl_ms`): then another worker may have reclaimed the job, and the
//!   outcome is given up. A batch the store refuses for another reason than being away is
//!   split, one outcome per statement, so that one outcome whose data the store refuses (a
//!   poison outcome) fails alone: a refused `Done` becomes a `Failed` that says why. `flush()`
//!   writes what is waiting, waits for the writes in flight, and fails naming how many
//!   outcomes were given up since the last `flush()`.
//! * A renewal task extends every held lease each `ttl_ms/3`, off the Python thread. The
//!   holder learns that a lease is lost through `on_revoke(seq, token, why)`: when the store
//!   says it is not ours, or at the lease-loss deadline, `LOSS_MARGIN` before the lease would
//!   end (the last good renewal's send time + `ttl_ms`), whatever the renewals in flight: so
//!   before another worker can reclaim it. A `cancel_job` of a running job comes the same way,
//!   and sooner: the store's wake-ups (`store::wake`, topic `Cancels`) make the renewal task
//!   look at once (this process's cancel, a Postgres notification); on a SQLite change of
//!   another connection (which may be a cancel) at most once per `CANCEL_GAP`; on an engine
//!   without a watcher (MySQL) every `CANCEL_CHECK` while it holds leases (a read there).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::model::{ClaimRequest, ClaimedJob, LeaseRef, Outcome, RenewStatus};
use crate::store::{self, Store, Topic};

/// Called (from a tokio thread) when a held attempt `(seq, token)` must stop: `why` is
/// "lease-lost" or "canceled".
pub type RevokeFn = Arc<dyn Fn(i64, i64, &'static str) + Send + Sync>;
/// Called (from a tokio thread) to report a store problem a loop carries on through.
pub type LogFn = Arc<dyn Fn(String) + Send + Sync>;

/// One attempt of a job: (seq, fencing token). A job the same worker claims again (its lease
/// was lost, then reclaimed) is a new attempt with a new token, so every per-attempt record
/// is keyed by both: the old attempt's end never touches the new one's.
pub type Attempt = (i64, i64);

/// How long a queued outcome waits for a claim (or a `kick`) to take it before the writer
/// writes it on its own.
pub const WRITE_AFTER: Duration = Duration::from_millis(5);

/// The lease-loss deadline comes this share of `ttl_ms` before the lease would end: room for
/// the signal to reach the handler before another worker can reclaim the job.
pub const LOSS_MARGIN_DIV: u32 = 6;

/// The shortest pause between two early looks for cancels on a change that may not be one
/// (`Topic::Changed`: SQLite's watcher saw another connection commit): a busy store is not
/// answered by a look per commit.
pub const CANCEL_GAP: Duration = Duration::from_millis(500);

/// How often a worker holding leases looks for cancels on an engine that cannot tell it
/// (no watcher: MySQL).
pub const CANCEL_CHECK: Duration = Duration::from_millis(500);

/// The longest pause between two tries of a write that failed: an outcome is written within
/// 2 s of the store's return (the worker's claim backs off to the same cap).
const MAX_BACKOFF: Duration = Duration::from_secs(2);

struct Lease {
    org: String,
    /// When the claim, or the last renewal that held, was sent: the store keeps the lease
    /// until at least this + `ttl_ms`.
    renewed: Instant,
    /// Its outcome is queued, not written yet: still renewed, but its handler has ended, so
    /// nobody is told when it is lost.
    finished: bool,
}

struct Shared {
    store: Arc<dyn Store>,
    req: ClaimRequest,
    ttl: Duration,
    /// The last claim came back full (jobs are likely due: the next one skips the probe).
    full: AtomicBool,
    /// Held leases, by attempt.
    held: Mutex<HashMap<Attempt, Lease>>,
    /// Attempts whose cancel has been reported already.
    cancel_told: Mutex<HashSet<Attempt>>,
    /// Outcomes waiting to be written.
    pending: Mutex<Vec<Outcome>>,
    /// When `pending` last went from empty to not empty (read and written under its lock):
    /// its oldest outcome has waited since then, and the writer writes it `WRITE_AFTER` later
    /// unless a claim took it first.
    pending_since: Mutex<Instant>,
    /// Outcomes a write refused for another reason than the store being away: the writer
    /// writes each on its own (claims do not take them).
    suspect: Mutex<Vec<Outcome>>,
    /// Outcomes given up since the last `flush()`, and the last reason.
    given_up: Mutex<(usize, Option<Error>)>,
    /// An outcome was queued (the writer writes it after `WRITE_AFTER`).
    queued: Notify,
    /// Write now.
    kicked: Notify,
    /// The instant the deadline task sleeps until: a claim whose leases' deadline comes
    /// before it (a claim sent before the task's last look) wakes the task (`early`).
    next_look: Mutex<Instant>,
    early: Notify,
    /// Held (shared) by every write of outcomes in flight; `flush()` takes it exclusively to
    /// wait for them.
    writes: tokio::sync::RwLock<()>,
    closed: AtomicBool,
    /// Set by `close`: the loops end at their next wait (never inside a store call: a
    /// transaction dropped half-way would keep its connection's locks until it is used again).
    stop: tokio::sync::watch::Sender<bool>,
    on_revoke: RevokeFn,
    log: LogFn,
    /// This worker's key in the store's `Wakeups` (its registered job types).
    wake_key: u64,
}

pub struct WorkerCore {
    shared: Arc<Shared>,
}

impl WorkerCore {
    /// Start the renewal, deadline and writer tasks on `rt`.
    pub fn start(
        rt: &tokio::runtime::Handle,
        store: Arc<dyn Store>,
        req: ClaimRequest,
        on_revoke: RevokeFn,
        log: LogFn,
    ) -> Self {
        let ttl = Duration::from_millis(req.ttl_ms.max(1) as u64);
        store.watch(rt);
        let wake_key = store.wakeups().register(req.types.clone());
        let shared = Arc::new(Shared {
            store,
            req,
            ttl,
            full: AtomicBool::new(false),
            held: Mutex::new(HashMap::new()),
            cancel_told: Mutex::new(HashSet::new()),
            pending: Mutex::new(Vec::new()),
            pending_since: Mutex::new(Instant::now()),
            suspect: Mutex::new(Vec::new()),
            given_up: Mutex::new((0, None)),
            queued: Notify::new(),
            kicked: Notify::new(),
            next_look: Mutex::new(Instant::now()),
            early: Notify::new(),
            writes: tokio::sync::RwLock::new(()),
            closed: AtomicBool::new(false),
            stop: tokio::sync::watch::channel(false).0,
            on_revoke,
            log,
            wake_key,
        });
        rt.spawn(renew_loop(shared.clone()));
        rt.spawn(deadline_loop(shared.clone()));
        rt.spawn(writer_loop(shared.clone()));
        WorkerCore { shared }
    }

    /// Write waiting outcomes and claim up to `n` jobs, in one store call.
    pub async fn claim(&self, n: usize) -> Result<Vec<ClaimedJob>> {
        claim(self.shared.clone(), n, true, 0, false).await
    }

    /// `claim` at once on the calling thread, when the store can; `None`: use `claim`.
    pub fn claim_now(&self, n: usize) -> Option<Result<Vec<ClaimedJob>>> {
        claim_now(&self.shared, n)
    }

    /// Jobs are likely due (a wake-up after an enqueue): the next claim skips the empty-poll
    /// probe, as after a full claim.
    pub fn expect_jobs(&self) {
        self.shared.full.store(true, Ordering::Relaxed);
    }

    /// The organization of a claimed attempt whose lease is held ("" when unknown).
    pub fn org_of(&self, seq: i64, token: i64) -> String {
        let held = self.shared.held.lock().unwrap();
        held.get(&(seq, token))
            .map(|l| l.org.clone())
            .unwrap_or_default()
    }

    /// Queue the outcome of an attempt. Its lease is renewed until the outcome is written.
    pub fn finish(&self, outcome: Outcome) {
        let s = &self.shared;
        let attempt = outcome.attempt();
        if let Some(l) = s.held.lock().unwrap().get_mut(&attempt) {
            l.finished = true;
        }
        s.cancel_told.lock().unwrap().remove(&attempt);
        queue(s, outcome);
        s.queued.notify_one();
    }

    /// Ask the writer to write the queued outcomes now.
    pub fn kick(&self) {
        self.shared.kicked.notify_one();
    }

    /// Write every queued outcome now (retrying until each is written or its lease runs out),
    /// and wait for the writes in flight. Returns how many outcomes this call wrote itself;
    /// fails (`StoreUnavailable`) naming how many outcomes were given up since the last call
    /// (or `forget_given_up`).
    pub async fn flush(&self) -> Result<usize> {
        flush(self.shared.clone()).await
    }

    /// Forget the outcomes given up so far (each was logged when it was given up, and its
    /// job is reclaimed): the next `flush()` reports only those given up after this call.
    /// `stop()` calls it first, so it raises only for outcomes it could not write itself.
    pub fn forget_given_up(&self) {
        *self.shared.given_up.lock().unwrap() = (0, None);
    }

    pub fn shared_flush(
        &self,
    ) -> impl std::future::Future<Output = Result<usize>> + Send + 'static {
        flush(self.shared.clone())
    }

    /// `claim`; with `carry` false it writes no outcomes (they wait for a later claim or the
    /// writer): a claim sent while another one that carries outcomes is in flight, since
    /// outcomes lock lease records without SKIP LOCKED and could wait on that claim. At most
    /// `per_org` jobs an organization (0: no cap, `ClaimRequest::per_org`); `wait`: wait for
    /// the lanes a claim in flight holds (`ClaimRequest::wait_lanes`).
    pub fn shared_claim(
        &self,
        n: usize,
        carry: bool,
        per_org: usize,
        wait: bool,
    ) -> impl std::future::Future<Output = Result<Vec<ClaimedJob>>> + Send + 'static {
        claim(self.shared.clone(), n, carry, per_org, wait)
    }

    /// The store this worker claims from.
    pub fn store(&self) -> Arc<dyn Store> {
        self.shared.store.clone()
    }

    /// The number of leases held (outcomes not written yet included).
    pub fn held(&self) -> usize {
        self.shared.held.lock().unwrap().len()
    }

    /// Stop the timers (each ends at its next wait, after a store call in flight). Held leases
    /// are not released early: they expire (API: `stop` releases nothing early), so a job
    /// whose handler never finished is reclaimed after `ttl_ms`.
    pub fn close(&mut self) {
        if !self.shared.closed.swap(true, Ordering::SeqCst) {
            self.shared.store.wakeups().unregister(self.shared.wake_key);
        }
        self.shared.stop.send_replace(true);
    }
}

impl Drop for WorkerCore {
    fn drop(&mut self) {
        self.close();
    }
}

async fn claim(
    s: Arc<Shared>,
    n: usize,
    carry: bool,
    per_org: usize,
    wait: bool,
) -> Result<Vec<ClaimedJob>> {
    if s.closed.load(Ordering::SeqCst) {
        return Err(Error::Closed);
    }
    let _write = s.writes.read().await;
    let outcomes = if carry {
        std::mem::take(&mut *s.pending.lock().unwrap())
    } else {
        Vec::new()
    };
    let mut req = s.req.clone();
    req.limit = n;
    req.per_org = per_org;
    req.wait_lanes = wait;
    req.probe = !s.full.load(Ordering::Relaxed);
    let sent = Instant::now();
    let r = store::claim(s.store.as_ref(), &outcomes, &req).await;
    let (r, sent) = match r {
        Ok(jobs) if !jobs.is_empty() && sent.elapsed() >= s.ttl / 3 => {
            confirm_late(&s, jobs, sent).await
        }
        r => (r, sent),
    };
    claimed(&s, n, outcomes, sent, r)
}

/// A claim that came back after a third of the lease or more (a store that stalled, a
/// machine too loaded to answer): the store dated its leases from when the claim began, so
/// they may end any moment, and a job started now may be taken back as expired while it runs
/// (by another worker, or by this one's next claim) and run twice. Renew them first: the ones
/// the store still gives this worker are started with a lease dated from the renewal; the
/// others are not started (they lapse and are reclaimed, counted as an attempt).
async fn confirm_late(
    s: &Shared,
    jobs: Vec<ClaimedJob>,
    sent: Instant,
) -> (Result<Vec<ClaimedJob>>, Instant) {
    let took = sent.elapsed();
    let leases: Vec<LeaseRef> = jobs
        .iter()
        .map(|j| LeaseRef {
            seq: j.seq,
            token: j.token,
            org: j.org.clone(),
        })
        .collect();
    let again = Instant::now();
    match store::renew(s.store.as_ref(), &leases, s.req.ttl_ms).await {
        Ok(status) => {
            let n = jobs.len();
            let kept: Vec<ClaimedJob> = jobs
                .into_iter()
                .zip(status)
                .filter(|(_, st)| *st != RenewStatus::Lost)
                .map(|(j, _)| j)
                .collect();
            if kept.len() < n {
                (s.log)(format!(
                    "gnl worker: a claim took {} ms (lease {} ms): {} of its {n} job(s) were no longer held and are not started (they are reclaimed)",
                    took.as_millis(),
                    s.req.ttl_ms,
                    n - kept.len()
                ));
            }
            (Ok(kept), again)
        }
        // The store is in trouble: the deadline task tells the handlers if their leases end.
        Err(_) => (Ok(jobs), sent),
    }
}

/// `claim` at once on the calling thread when the store can (`QueueStore::claim_now`); `None`:
/// it could not (nothing written, the outcomes wait again): use `claim`.
fn claim_now(s: &Arc<Shared>, n: usize) -> Option<Result<Vec<ClaimedJob>>> {
    if s.closed.load(Ordering::SeqCst) {
        return Some(Err(Error::Closed));
    }
    let _write = s.writes.try_read().ok()?;
    let outcomes = std::mem::take(&mut *s.pending.lock().unwrap());
    let mut req = s.req.clone();
    req.limit = n;
    req.probe = !s.full.load(Ordering::Relaxed);
    let sent = Instant::now();
    match s.store.claim_now(&outcomes, &req) {
        Some(r) => Some(claimed(s, n, outcomes, sent, r)),
        None => {
            requeue(s, outcomes);
            None
        }
    }
}

/// After a claim sent at `sent` carrying `outcomes`: the new leases join the set, the written
/// outcomes' leave it; on an error the outcomes wait again (see below).
fn claimed(
    s: &Shared,
    n: usize,
    outcomes: Vec<Outcome>,
    sent: Instant,
    r: Result<Vec<ClaimedJob>>,
) -> Result<Vec<ClaimedJob>> {
    match r {
        Ok(jobs) => {
            s.full.store(n > 0 && jobs.len() == n, Ordering::Relaxed);
            written(s, &outcomes);
            let mut stale: Vec<Attempt> = Vec::new();
            if !jobs.is_empty() {
                let mut held = s.held.lock().unwrap();
                // A claim gives a job a new token only once its earlier lease is gone: an
                // earlier attempt of it still here has lost its lease.
                let seqs: HashSet<i64> = jobs.iter().map(|j| j.seq).collect();
                stale.extend(held.keys().filter(|a| seqs.contains(&a.0)).copied());
                for j in &jobs {
                    held.insert(
                        (j.seq, j.token),
                        Lease {
                            org: j.org.clone(),
                            renewed: sent,
                            finished: false,
                        },
                    );
                }
                stale.retain(|a| held.remove(a).is_some_and(|l| !l.finished));
                // Sent before the deadline task's last look: their deadline may come first.
                if sent + keep(s) < *s.next_look.lock().unwrap() {
                    s.early.notify_one();
                }
            }
            for (seq, token) in stale {
                (s.on_revoke)(seq, token, "lease-lost");
            }
            Ok(jobs)
        }
        Err(e) => {
            // Nothing was written. The store away: the outcomes go back in front of any newer
            // ones. Else one of them may be what the store refuses: the writer sorts them out.
            if e.is_transient() {
                // The writer retries them (with backoff, until their leases run out) unless
                // the next claim takes them first.
                if !outcomes.is_empty() {
                    requeue(s, outcomes);
                    s.queued.notify_one();
                }
            } else if !outcomes.is_empty() {
                put_back(&s.suspect, outcomes, || {});
                s.kicked.notify_one();
            }
            Err(e)
        }
    }
}

/// Queue a new outcome for writing (after the others); the oldest waiting one dates the wait.
fn queue(s: &Shared, outcome: Outcome) {
    let mut p = s.pending.lock().unwrap();
    if p.is_empty() {
        *s.pending_since.lock().unwrap() = Instant::now();
    }
    p.push(outcome);
}

/// Queue again `outcomes` that went out with a write that did not happen, in front of newer
/// ones.
fn requeue(s: &Shared, outcomes: Vec<Outcome>) {
    put_back(&s.pending, outcomes, || {
        *s.pending_since.lock().unwrap() = Instant::now();
    });
}

/// Put `outcomes` back in front of `queue`'s; `was_empty` runs, under its lock, when the queue
/// was empty.
fn put_back(queue: &Mutex<Vec<Outcome>>, outcomes: Vec<Outcome>, was_empty: impl FnOnce()) {
    if outcomes.is_empty() {
        return;
    }
    let mut p = queue.lock().unwrap();
    if p.is_empty() {
        was_empty();
    }
    let newer = std::mem::replace(&mut *p, outcomes);
    p.extend(newer);
}

/// These outcomes are written: their leases leave the set.
fn written(s: &Shared, outcomes: &[Outcome]) {
    if outcomes.is_empty() {
        return;
    }
    let mut held = s.held.lock().unwrap();
    for o in outcomes {
        held.remove(&o.attempt());
    }
}

fn nothing_waits(s: &Shared) -> bool {
    s.pending.lock().unwrap().is_empty() && s.suspect.lock().unwrap().is_empty()
}

/// One round of writing: the suspect outcomes one by one, then what is pending in one
/// transaction (split up when the store refuses it). Returns how many outcomes were written,
/// or the error of the store being away (the outcomes not written are queued again).
async fn write_round(s: &Shared) -> Result<usize> {
    let _write = s.writes.read().await;
    let mut n = 0;
    let suspect = std::mem::take(&mut *s.suspect.lock().unwrap());
    if !suspect.is_empty() {
        n += write_each(s, suspect).await?;
    }
    let batch = std::mem::take(&mut *s.pending.lock().unwrap());
    if batch.is_empty() {
        return Ok(n);
    }
    match store::finish(s.store.as_ref(), &batch).await {
        Ok(()) => {
            written(s, &batch);
            Ok(n + batch.len())
        }
        Err(e) if retry_later(&e) => {
            requeue(s, batch);
            Err(e)
        }
        Err(_) if batch.len() > 1 => Ok(n + write_each(s, batch).await?),
        Err(e) => {
            poisoned(s, batch.into_iter().next().unwrap(), e);
            Ok(n)
        }
    }
}

/// Whether a failed write may succeed later as it is (the store away or busy, this worker's
/// connection refused, a lock or statement timeout) rather than never (the store refuses an
/// outcome's data).
fn retry_later(e: &Error) -> bool {
    match e {
        Error::StoreUnavailable { .. } => true,
        Error::Closed => false,
        _ => !e.is_data_error(),
    }
}

/// Write `outcomes` one per statement: each one the store refuses fails alone. On the store
/// being away, the rest is queued again.
async fn write_each(s: &Shared, outcomes: Vec<Outcome>) -> Result<usize> {
    let mut n = 0;
    let mut rest = outcomes.into_iter();
    while let Some(o) = rest.next() {
        match store::finish(s.store.as_ref(), std::slice::from_ref(&o)).await {
            Ok(()) => {
                written(s, std::slice::from_ref(&o));
                n += 1;
            }
            Err(e) if retry_later(&e) => {
                let mut back = vec![o];
                back.extend(rest);
                requeue(s, back);
                return Err(e);
            }
            Err(e) => poisoned(s, o, e),
        }
    }
    Ok(n)
}

/// The store refused outcome `o` for `e`: a `Done` is written again as a `Failed` that says
/// why (the attempt is retried), anything else is given up.
fn poisoned(s: &Shared, o: Outcome, e: Error) {
    match o {
        Outcome::Done {
            seq, token, org, ..
        } => {
            (s.log)(format!(
                "gnl worker: the result of job seq {seq} could not be written ({e}); its attempt is recorded as failed"
            ));
            s.suspect.lock().unwrap().push(Outcome::Failed {
                seq,
                token,
                org,
                error: format!("the handler's result could not be written: {e}"),
                delay_ms: crate::retry::default_job_retry_delay_ms(1, 0.0),
            });
        }
        Outcome::Failed { .. } => give_up(s, vec![o], e),
    }
}

/// Stop trying to write `outcomes`: their leases leave the set (they lapse, and the jobs are
/// reclaimed). Counted for the next `flush()` unless their lease was already lost.
fn give_up(s: &Shared, outcomes: Vec<Outcome>, e: Error) {
    let mut counted = 0;
    {
        let mut held = s.held.lock().unwrap();
        for o in &outcomes {
            if held.remove(&o.attempt()).is_some() {
                counted += 1;
            }
        }
    }
    (s.log)(format!(
        "gnl worker: {} job outcome(s) could not be written and were given up (the jobs are reclaimed when their lease ends): {e}",
        outcomes.len()
    ));
    if counted > 0 {
        let mut g = s.given_up.lock().unwrap();
        g.0 += counted;
        g.1 = Some(e);
    }
}

/// Give up the queued outcomes whose lease has run out (or was lost): another worker may
/// have reclaimed their jobs. Returns the earliest lease end among the others.
fn give_up_expired(s: &Shared, e: &Error) -> Option<Instant> {
    let now = Instant::now();
    let mut earliest: Option<Instant> = None;
    let mut expired = Vec::new();
    for queue in [&s.pending, &s.suspect] {
        let held = s.held.lock().unwrap();
        let mut q = queue.lock().unwrap();
        let (keep, gone): (Vec<Outcome>, Vec<Outcome>) = std::mem::take(&mut *q)
            .into_iter()
            .partition(|o| match held.get(&o.attempt()) {
                Some(l) if l.renewed + s.ttl > now => {
                    let end = l.renewed + s.ttl;
                    earliest = Some(earliest.map_or(end, |t| t.min(end)));
                    true
                }
                _ => false,
            });
        *q = keep;
        expired.extend(gone);
    }
    if !expired.is_empty() {
        give_up(s, expired, e.clone());
    }
    earliest
}

/// Write until nothing waits: retry with backoff while the store is away, giving up the
/// outcomes whose lease runs out meanwhile. Returns how many outcomes it wrote.
async fn write_all(s: &Shared) -> usize {
    let mut written = 0;
    let mut backoff = Duration::from_millis(50);
    while !nothing_waits(s) {
        match write_round(s).await {
            Ok(n) => {
                written += n;
                backoff = Duration::from_millis(50);
            }
            Err(e) => {
                let Some(end) = give_up_expired(s, &e) else {
                    continue;
                };
                (s.log)(format!(
                    "gnl worker: writing job outcomes failed, retrying in {} ms: {e}",
                    backoff.as_millis()
                ));
                let wake = (Instant::now() + backoff).min(end);
                tokio::select! {
                    _ = stopped(s) => return written,
                    _ = tokio::time::sleep_until(wake) => {}
                    _ = s.kicked.notified() => {}
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
    written
}

async fn flush(s: Arc<Shared>) -> Result<usize> {
    let mut written = 0;
    loop {
        written += write_all(&s).await;
        // Wait for the writes that were in flight (a claim's, the writer's); one that failed
        // put its outcomes back, and they are written on the next turn.
        drop(s.writes.write().await);
        if nothing_waits(&s) {
            break;
        }
    }
    let (n, e) = std::mem::take(&mut *s.given_up.lock().unwrap());
    if n > 0 {
        let (reason, code) = match e {
            Some(Error::StoreUnavailable { reason, code }) => (reason, code),
            Some(Error::Store { message, code } | Error::Refused { message, code }) => {
                (message, code)
            }
            Some(other) => (other.to_string(), None),
            None => (String::new(), None),
        };
        return Err(Error::StoreUnavailable {
            reason: format!(
                "{n} job outcome(s) could not be written before their leases ran out (those jobs run again): {reason}"
            ),
            code,
        });
    }
    Ok(written)
}

/// Resolves once `close` was called.
async fn stopped(s: &Shared) {
    let mut rx = s.stop.subscribe();
    let _ = rx.wait_for(|stop| *stop).await;
}

async fn writer_loop(s: Arc<Shared>) {
    loop {
        tokio::select! {
            _ = stopped(&s) => return,
            _ = s.kicked.notified() => {}
            _ = s.queued.notified() => {
                // Give a claim the chance to take them: the oldest waiting outcome is written
                // `WRITE_AFTER` after it was queued, unless a claim took it first (then the
                // newer ones wait from their own queueing); a kick writes at once.
                loop {
                    let due = {
                        let p = s.pending.lock().unwrap();
                        if p.is_empty() {
                            break;
                        }
                        *s.pending_since.lock().unwrap() + WRITE_AFTER
                    };
                    if due <= Instant::now() {
                        break;
                    }
                    tokio::select! {
                        _ = s.kicked.notified() => break,
                        _ = tokio::time::sleep_until(due) => {}
                    }
                }
            }
        }
        // Not raced against `stopped`: a write in flight runs to its end.
        write_all(&s).await;
    }
}

/// How long after its claim or last good renewal was sent a held lease is given up.
fn keep(s: &Shared) -> Duration {
    s.ttl - s.ttl / LOSS_MARGIN_DIV
}

/// The lease-loss deadline: a held lease whose handler runs is given up `ttl/LOSS_MARGIN_DIV`
/// before it would end, unless a renewal moved it on meanwhile.
async fn deadline_loop(s: Arc<Shared>) {
    let margin = s.ttl / LOSS_MARGIN_DIV;
    let keep = keep(&s);
    loop {
        let now = Instant::now();
        // A lease claimed from now on ends after any held now, unless its claim was sent
        // before this look: then `early` wakes this task to look again.
        let mut next = now + keep;
        let lost: Vec<Attempt> = {
            let mut held = s.held.lock().unwrap();
            let lost: Vec<Attempt> = held
                .iter()
                .filter(|(_, l)| !l.finished)
                .filter_map(|(a, l)| {
                    let deadline = l.renewed + keep;
                    if deadline <= now {
                        Some(*a)
                    } else {
                        next = next.min(deadline);
                        None
                    }
                })
                .collect();
            for a in &lost {
                held.remove(a);
            }
            // Under the lease set's lock: a claim adds its leases before this look (seen
            // above) or reads this instant after it (and wakes the task if it is too late).
            *s.next_look.lock().unwrap() = next;
            lost
        };
        if !lost.is_empty() {
            (s.log)(format!(
                "gnl worker: no lease renewal held for {} ms ({} ms before the lease ends): {} job(s) told their lease is lost",
                keep.as_millis(),
                margin.as_millis(),
                lost.len()
            ));
        }
        for (seq, token) in lost {
            (s.on_revoke)(seq, token, "lease-lost");
        }
        tokio::select! {
            _ = stopped(&s) => return,
            _ = tokio::time::sleep_until(next) => {}
            _ = s.early.notified() => {}
        }
    }
}

/// Whether a handler of this worker runs (a lease is held whose outcome is not queued).
fn runs(s: &Shared) -> bool {
    s.held.lock().unwrap().values().any(|l| !l.finished)
}

/// What the renewal task does next.
enum Look {
    /// The renewal (every `ttl_ms/3`).
    Renew,
    /// An early look for cancels: a cancel was made (this process's, a notification), a
    /// change that may be one, or the periodic look of an engine without a watcher.
    Cancels,
}

async fn renew_loop(s: Arc<Shared>) {
    let every = Duration::from_millis((s.req.ttl_ms / 3).max(1) as u64);
    let wake = s.store.wakeups().clone();
    // Without a watcher, a look every CANCEL_CHECK finds other processes' cancels.
    let hour = Duration::from_secs(3600);
    let check_every = if s.store.watches_others() {
        hour
    } else {
        CANCEL_CHECK
    };
    let mut failures = 0u32;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let mut seen = wake.version(Topic::Cancels);
    let mut seen_changed = wake.version(Topic::Changed);
    let mut looked = Instant::now();
    // A look asked for by a change that may be a cancel, due at this instant.
    let mut maybe: Option<Instant> = None;
    loop {
        // A closed store's waits end at once: then only the timer runs.
        let open = !*wake.closed().borrow();
        let maybe_at = maybe.unwrap_or_else(|| Instant::now() + hour);
        let look = tokio::select! {
            _ = stopped(&s) => return,
            _ = tick.tick() => Look::Renew,
            _ = wake.wait(Topic::Cancels, seen, check_every), if open => {
                seen = wake.version(Topic::Cancels);
                Look::Cancels
            }
            _ = wake.wait(Topic::Changed, seen_changed, hour), if open && maybe.is_none() => {
                seen_changed = wake.version(Topic::Changed);
                if !runs(&s) {
                    continue;
                }
                // Not at once: at most one such look per CANCEL_GAP, the renewals going on.
                maybe = Some((looked + CANCEL_GAP).max(Instant::now()));
                continue;
            }
            _ = tokio::time::sleep_until(maybe_at), if maybe.is_some() => Look::Cancels,
        };
        if let Look::Cancels = look {
            maybe = None;
            if !runs(&s) {
                continue; // nothing runs: nothing to stop
            }
        }
        let leases: Vec<LeaseRef> = {
            let held = s.held.lock().unwrap();
            held.iter()
                .map(|(&(seq, token), l)| LeaseRef {
                    seq,
                    token,
                    org: l.org.clone(),
                })
                .collect()
        };
        if leases.is_empty() {
            failures = 0;
            continue;
        }
        // Awaited to its end, however long it takes (dropped half-way, its transaction would
        // keep the connection's locks): the deadline task does not wait for it.
        let sent = Instant::now();
        looked = sent;
        // A renewal answers a pending look too.
        maybe = None;
        let result = match look {
            Look::Renew => store::renew(s.store.as_ref(), &leases, s.req.ttl_ms)
                .await
                .map(|st| (st, true)),
            Look::Cancels => s.store.check_cancels(&leases, s.req.ttl_ms).await,
        };
        match result {
            Ok((status, extended)) => {
                if extended {
                    failures = 0;
                }
                told(&s, &leases, status, extended.then_some(sent));
            }
            Err(e) => {
                if let Look::Cancels = look {
                    continue; // the renewal reports the store's trouble
                }
                failures += 1;
                (s.log)(format!(
                    "gnl worker: lease renewal failed ({failures} in a row; a lease is lost {} ms after its last good renewal): {e}",
                    (s.ttl - s.ttl / LOSS_MARGIN_DIV).as_millis()
                ));
            }
        }
    }
}

/// The store's answer about `leases`: the lost ones are revoked, the canceled ones told once,
/// and (when `renewed` says the renewal sent then held) the held ones' deadlines moved on.
fn told(s: &Shared, leases: &[LeaseRef], status: Vec<RenewStatus>, renewed: Option<Instant>) {
    let mut canceled = Vec::new();
    let mut lost = Vec::new();
    {
        let mut held = s.held.lock().unwrap();
        for (l, st) in leases.iter().zip(status) {
            let a = (l.seq, l.token);
            match st {
                RenewStatus::Held | RenewStatus::CancelRequested => {
                    let Some(lease) = held.get_mut(&a) else {
                        continue; // written or given up meanwhile
                    };
                    if let Some(sent) = renewed {
                        lease.renewed = lease.renewed.max(sent);
                    }
                    if st == RenewStatus::CancelRequested && !lease.finished {
                        canceled.push(a);
                    }
                }
                RenewStatus::Lost => {
                    if held.remove(&a).is_some_and(|l| !l.finished) {
                        lost.push(a);
                    }
                }
            }
        }
    }
    for (seq, token) in lost {
        (s.on_revoke)(seq, token, "lease-lost");
    }
    for a in canceled {
        if s.cancel_told.lock().unwrap().insert(a) {
            (s.on_revoke)(a.0, a.1, "canceled");
        }
    }
}
