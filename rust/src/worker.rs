//! The native half of a queue worker: claims, the lease set and its renewal timer, and the
//! group-committed outcome writer. The Python half (`gnl.worker`) runs handlers and calls in.
//!
//! * `claim(n)` writes every outcome that is waiting and claims up to `n` jobs in one store
//!   call (one transaction), and adds the new leases to the lease set.
//! * `finish(outcome)` takes the lease out of the set and queues the outcome. A writer task
//!   writes whatever has queued in one transaction (group commit): at once when `kick()` asks
//!   (the Python side does at the end of a burst of outcomes while a claim is in flight), else
//!   `WRITE_AFTER` after the first one, unless a claim took them meanwhile. The writer and a
//!   claim may write at the same time (two connections): each outcome is taken by one of them,
//!   and each write is conditional on its lease's fencing token, so their order does not
//!   matter. `flush()` writes what is waiting and waits for the writes in flight.
//! * A renewal task extends every held lease each `ttl_ms/3`, off the Python thread. A lease
//!   that the store says is not ours, or three renewals in a row that fail, reach the Python
//!   side through `on_revoke(seq, token, why)`; so does a `cancel_job` of a running job.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::error::{Error, Result};
use crate::model::{ClaimRequest, ClaimedJob, LeaseRef, Outcome, RenewStatus};
use crate::store::{self, Store};

/// Called (from a tokio thread) when a held attempt `(seq, token)` must stop: `why` is
/// "lease-lost" or "canceled".
pub type RevokeFn = Arc<dyn Fn(i64, i64, &'static str) + Send + Sync>;

/// One attempt of a job: (seq, fencing token). A job the same worker claims again (its lease
/// was lost, then reclaimed) is a new attempt with a new token, so every per-attempt record
/// is keyed by both: the old attempt's end never touches the new one's.
pub type Attempt = (i64, i64);
/// Called (from a tokio thread) to report a store problem a loop carries on through.
pub type LogFn = Arc<dyn Fn(String) + Send + Sync>;

/// Renewals in a row that may fail before the holder assumes its leases are lost.
pub const MAX_RENEW_FAILURES: u32 = 3;

/// How long a queued outcome waits for a claim (or a `kick`) to take it before the writer
/// writes it on its own.
pub const WRITE_AFTER: Duration = Duration::from_millis(5);

struct Shared {
    store: Arc<dyn Store>,
    req: ClaimRequest,
    /// The last claim came back full (jobs are likely due: the next one skips the probe).
    full: AtomicBool,
    /// Held leases: attempt -> the job's organization.
    held: Mutex<HashMap<Attempt, String>>,
    /// Attempts whose cancel has been reported already.
    cancel_told: Mutex<HashSet<Attempt>>,
    /// Outcomes waiting to be written.
    pending: Mutex<Vec<Outcome>>,
    /// An outcome was queued (the writer writes it after `WRITE_AFTER`).
    queued: Notify,
    /// Write now.
    kicked: Notify,
    /// Held (shared) by every write of outcomes in flight; `flush()` takes it exclusively to
    /// wait for them.
    writes: tokio::sync::RwLock<()>,
    closed: AtomicBool,
    /// Set by `close`: the loops end at their next wait (never inside a store call: a
    /// transaction dropped half-way would keep its connection's locks until it is used again).
    stop: tokio::sync::watch::Sender<bool>,
    on_revoke: RevokeFn,
    log: LogFn,
}

pub struct WorkerCore {
    shared: Arc<Shared>,
    tasks: Vec<JoinHandle<()>>,
}

impl WorkerCore {
    /// Start the renewal and writer tasks on `rt`.
    pub fn start(
        rt: &tokio::runtime::Handle,
        store: Arc<dyn Store>,
        req: ClaimRequest,
        on_revoke: RevokeFn,
        log: LogFn,
    ) -> Self {
        let shared = Arc::new(Shared {
            store,
            req,
            full: AtomicBool::new(false),
            held: Mutex::new(HashMap::new()),
            cancel_told: Mutex::new(HashSet::new()),
            pending: Mutex::new(Vec::new()),
            queued: Notify::new(),
            kicked: Notify::new(),
            writes: tokio::sync::RwLock::new(()),
            closed: AtomicBool::new(false),
            stop: tokio::sync::watch::channel(false).0,
            on_revoke,
            log,
        });
        let tasks = vec![
            rt.spawn(renew_loop(shared.clone())),
            rt.spawn(writer_loop(shared.clone())),
        ];
        WorkerCore { shared, tasks }
    }

    /// Write waiting outcomes and claim up to `n` jobs, in one store call.
    pub async fn claim(&self, n: usize) -> Result<Vec<ClaimedJob>> {
        claim(self.shared.clone(), n).await
    }

    /// The organization of a claimed attempt that is not finished yet ("" when unknown).
    pub fn org_of(&self, seq: i64, token: i64) -> String {
        let held = self.shared.held.lock().unwrap();
        held.get(&(seq, token)).cloned().unwrap_or_default()
    }

    /// Queue the outcome of an attempt; the lease stops being renewed now.
    pub fn finish(&self, outcome: Outcome) {
        let s = &self.shared;
        let attempt = outcome.attempt();
        s.held.lock().unwrap().remove(&attempt);
        s.cancel_told.lock().unwrap().remove(&attempt);
        s.pending.lock().unwrap().push(outcome);
        s.queued.notify_one();
    }

    /// Ask the writer to write the queued outcomes now.
    pub fn kick(&self) {
        self.shared.kicked.notify_one();
    }

    /// Write every queued outcome now, and wait for the writes in flight. Returns how many
    /// outcomes this call wrote itself.
    pub async fn flush(&self) -> Result<usize> {
        flush(self.shared.clone()).await
    }

    pub fn shared_flush(
        &self,
    ) -> impl std::future::Future<Output = Result<usize>> + Send + 'static {
        flush(self.shared.clone())
    }

    pub fn shared_claim(
        &self,
        n: usize,
    ) -> impl std::future::Future<Output = Result<Vec<ClaimedJob>>> + Send + 'static {
        claim(self.shared.clone(), n)
    }

    /// The store this worker claims from.
    pub fn store(&self) -> Arc<dyn Store> {
        self.shared.store.clone()
    }

    /// The number of leases held.
    pub fn held(&self) -> usize {
        self.shared.held.lock().unwrap().len()
    }

    /// Stop the timers (each ends at its next wait, after a store call in flight). Held leases
    /// are not released early: they expire (API: `stop` releases nothing early), so a job
    /// whose handler never finished is reclaimed after `ttl_ms`.
    pub fn close(&mut self) {
        self.shared.closed.store(true, Ordering::SeqCst);
        self.shared.stop.send_replace(true);
        self.tasks.clear();
    }
}

impl Drop for WorkerCore {
    fn drop(&mut self) {
        self.close();
    }
}

async fn claim(s: Arc<Shared>, n: usize) -> Result<Vec<ClaimedJob>> {
    if s.closed.load(Ordering::SeqCst) {
        return Err(Error::Closed);
    }
    let _write = s.writes.read().await;
    let outcomes = std::mem::take(&mut *s.pending.lock().unwrap());
    let mut req = s.req.clone();
    req.limit = n;
    req.probe = !s.full.load(Ordering::Relaxed);
    match store::claim(s.store.as_ref(), &outcomes, &req).await {
        Ok(jobs) => {
            s.full.store(n > 0 && jobs.len() == n, Ordering::Relaxed);
            let mut held = s.held.lock().unwrap();
            for j in &jobs {
                held.insert((j.seq, j.token), j.org.clone());
            }
            Ok(jobs)
        }
        Err(e) => {
            // Nothing was written: put the outcomes back in front of any newer ones.
            put_back(&s, outcomes);
            Err(e)
        }
    }
}

fn put_back(s: &Shared, outcomes: Vec<Outcome>) {
    if outcomes.is_empty() {
        return;
    }
    let mut p = s.pending.lock().unwrap();
    let newer = std::mem::replace(&mut *p, outcomes);
    p.extend(newer);
}

/// Write what is waiting now (one transaction), beside any write in flight; returns how many
/// outcomes it wrote.
async fn write_pending(s: &Shared) -> Result<usize> {
    let _write = s.writes.read().await;
    let batch = std::mem::take(&mut *s.pending.lock().unwrap());
    if batch.is_empty() {
        return Ok(0);
    }
    match store::finish(s.store.as_ref(), &batch).await {
        Ok(()) => Ok(batch.len()),
        Err(e) => {
            if e.is_transient() {
                put_back(s, batch);
            }
            Err(e)
        }
    }
}

async fn flush(s: Arc<Shared>) -> Result<usize> {
    let mut written = 0;
    loop {
        written += write_pending(&s).await?;
        // Wait for the writes that were in flight (a claim's, the writer's); one that failed
        // put its outcomes back, and they are written on the next turn.
        drop(s.writes.write().await);
        if s.pending.lock().unwrap().is_empty() {
            return Ok(written);
        }
    }
}

/// Resolves once `close` was called.
async fn stopped(s: &Shared) {
    let mut rx = s.stop.subscribe();
    let _ = rx.wait_for(|stop| *stop).await;
}

async fn writer_loop(s: Arc<Shared>) {
    let mut backoff_ms = 50u64;
    loop {
        tokio::select! {
            _ = stopped(&s) => return,
            _ = s.kicked.notified() => {}
            _ = s.queued.notified() => {
                // Give a claim the chance to take them; a kick writes at once.
                tokio::select! {
                    _ = s.kicked.notified() => {}
                    _ = tokio::time::sleep(WRITE_AFTER) => {}
                }
            }
        }
        loop {
            if s.pending.lock().unwrap().is_empty() {
                break;
            }
            match write_pending(&s).await {
                Ok(_) => backoff_ms = 50,
                Err(e) if e.is_transient() => {
                    (s.log)(format!(
                        "gnl worker: writing job outcomes failed, retrying in {backoff_ms} ms: {e}"
                    ));
                    tokio::select! {
                        _ = stopped(&s) => return,
                        _ = tokio::time::sleep(Duration::from_millis(backoff_ms)) => {}
                    }
                    backoff_ms = (backoff_ms * 2).min(5_000);
                }
                Err(e) => {
                    // Not retryable: the leases of these jobs expire and the jobs are reclaimed.
                    (s.log)(format!("gnl worker: job outcomes could not be written and were dropped (the jobs will be reclaimed after their lease): {e}"));
                    break;
                }
            }
        }
    }
}

async fn renew_loop(s: Arc<Shared>) {
    let every = Duration::from_millis((s.req.ttl_ms / 3).max(1) as u64);
    let mut failures = 0u32;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = stopped(&s) => return,
            _ = tick.tick() => {}
        }
        let leases: Vec<LeaseRef> = {
            let held = s.held.lock().unwrap();
            held.iter()
                .map(|(&(seq, token), org)| LeaseRef {
                    seq,
                    token,
                    org: org.clone(),
                })
                .collect()
        };
        if leases.is_empty() {
            failures = 0;
            continue;
        }
        // A renewal that hangs (a store stalled on locks) counts as unanswered after one period.
        // In its own task: one that times out runs on (dropped half-way, its transaction would
        // keep the connection's locks until the connection is used again).
        let store = s.store.clone();
        let (batch, ttl_ms) = (leases.clone(), s.req.ttl_ms);
        let mut call =
            tokio::spawn(async move { store::renew(store.as_ref(), &batch, ttl_ms).await });
        let answer = match tokio::time::timeout(every, &mut call).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(Error::invalid("the lease renewal task failed")),
            Err(_) => Err(Error::StoreUnavailable {
                reason: format!("no answer within {} ms", every.as_millis()),
                code: None,
            }),
        };
        match answer {
            Ok(status) => {
                failures = 0;
                for (l, st) in leases.iter().zip(status) {
                    match st {
                        RenewStatus::Held => {}
                        RenewStatus::CancelRequested => {
                            if s.cancel_told.lock().unwrap().insert((l.seq, l.token)) {
                                (s.on_revoke)(l.seq, l.token, "canceled");
                            }
                        }
                        RenewStatus::Lost => {
                            // Not there any more: finished meanwhile.
                            let was_ours =
                                s.held.lock().unwrap().remove(&(l.seq, l.token)).is_some();
                            if was_ours {
                                (s.on_revoke)(l.seq, l.token, "lease-lost");
                            }
                        }
                    }
                }
            }
            Err(e) => {
                failures += 1;
                (s.log)(format!(
                    "gnl worker: lease renewal failed ({failures} in a row, {MAX_RENEW_FAILURES} allowed): {e}"
                ));
                if failures >= MAX_RENEW_FAILURES {
                    let lost: Vec<Attempt> = {
                        let mut held = s.held.lock().unwrap();
                        leases
                            .iter()
                            .map(|l| (l.seq, l.token))
                            .filter(|a| held.remove(a).is_some())
                            .collect()
                    };
                    for (seq, token) in lost {
                        (s.on_revoke)(seq, token, "lease-lost");
                    }
                    failures = 0;
                }
            }
        }
    }
}
