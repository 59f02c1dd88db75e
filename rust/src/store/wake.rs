//! Wake-ups: the one mechanism by which a change to the store reaches the loops that wait for
//! it (workers, their lease renewals, event consumers, the scheduler's pollers) before their
//! poll timer fires (docs/DECISIONS.md, "Wake-ups").
//!
//! Each store holds one `Wakeups`: a counter per `Topic` that anyone can wait on beside a
//! timer. A committed enqueue, retry, cancel, emit or new trigger of this process bumps it directly
//! (`changed`, no store round trip). Changes from other processes arrive by the engine's
//! watcher, started once per store by `Store::watch`: on Postgres a LISTEN connection (the
//! writers `NOTIFY` once per committed call, coalesced), on SQLite a `PRAGMA data_version`
//! check on a dedicated connection every `DATA_VERSION_EVERY`; MySQL has none (the poll).
//! Polling stays the fallback: a lost notification delays a job by at most the poll interval.
//!
//! A waiter reads the topic's version before it looks at the store (`version`) and then waits
//! for a newer one (`wait`): a change committed between its look and its wait is never missed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{watch, Notify};

/// What changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Topic {
    /// Jobs may be due: an enqueue, a retry.
    Jobs = 0,
    /// A running job was asked to stop (`cancel_job`).
    Cancels = 1,
    /// Events were emitted.
    Events = 2,
    /// Another connection committed something, what is not known (SQLite's watcher): a
    /// worker holding jobs looks for cancels, at most every `worker::CANCEL_GAP`.
    Changed = 3,
    /// A trigger was registered (it may be due before the pollers' next poll).
    Triggers = 4,
}

pub const TOPICS: [Topic; 5] = [
    Topic::Jobs,
    Topic::Cancels,
    Topic::Events,
    Topic::Changed,
    Topic::Triggers,
];

impl Topic {
    /// The one-letter code a notification carries.
    pub fn code(self) -> char {
        match self {
            Topic::Jobs => 'j',
            Topic::Cancels => 'c',
            Topic::Events => 'e',
            Topic::Changed => 'x',
            Topic::Triggers => 't',
        }
    }

    pub fn from_code(c: char) -> Option<Topic> {
        match c {
            'j' => Some(Topic::Jobs),
            'c' => Some(Topic::Cancels),
            'e' => Some(Topic::Events),
            'x' => Some(Topic::Changed),
            't' => Some(Topic::Triggers),
            _ => None,
        }
    }

    pub fn parse(name: &str) -> Option<Topic> {
        match name {
            "jobs" => Some(Topic::Jobs),
            "cancels" => Some(Topic::Cancels),
            "events" => Some(Topic::Events),
            "changed" => Some(Topic::Changed),
            "triggers" => Some(Topic::Triggers),
            _ => None,
        }
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// How often the SQLite watcher reads `PRAGMA data_version` (a read of the WAL index in
/// shared memory: no table is touched).
pub const DATA_VERSION_EVERY: Duration = Duration::from_millis(15);

/// The longest pause between two tries of a watcher that lost its connection: one refused
/// connect a second while the server is away, and its waiters (a worker backing off from the
/// outage among them) woken within a second of its return.
pub const WATCH_MAX_BACKOFF: Duration = Duration::from_secs(1);

/// Changes to send to other processes (Postgres: a `NOTIFY` carrying them), coalesced: while
/// one notification is in flight, the changes of every call that commits meanwhile wait for
/// the next one.
pub struct Outbox {
    bits: AtomicU8,
    ready: Notify,
    /// Held while changes taken are being sent: the store's close waits for the send in
    /// flight before it closes the pool.
    pub sending: tokio::sync::Mutex<()>,
}

impl Outbox {
    /// Wait until changes are waiting.
    pub async fn ready(&self) {
        loop {
            let notified = self.ready.notified();
            if self.bits.load(Ordering::Acquire) != 0 {
                return;
            }
            notified.await;
        }
    }

    /// Take the changes waiting (bits of `Topic`), waiting for one if none is.
    pub async fn next(&self) -> u8 {
        loop {
            self.ready().await;
            let b = self.take();
            if b != 0 {
                return b;
            }
        }
    }

    /// Take the changes waiting (0: none), without waiting.
    pub fn take(&self) -> u8 {
        self.bits.swap(0, Ordering::AcqRel)
    }

    /// The topics of `bits`.
    pub fn topics(bits: u8) -> impl Iterator<Item = Topic> {
        TOPICS.into_iter().filter(move |t| bits & t.bit() != 0)
    }
}

pub struct Wakeups {
    topics: [watch::Sender<u64>; 5],
    /// Tells this process's notifications from others' (the payload carries it).
    nonce: String,
    /// Set when the engine sends changes to other processes.
    outbox: Option<Arc<Outbox>>,
    /// The engine's watcher was started.
    watching: AtomicBool,
    /// Dropped (or set) when the store closes: the watcher and sender tasks end.
    closed: watch::Sender<bool>,
    /// The job types of the workers waiting on this store, by worker (the SQLite watcher
    /// asks whether one of them is due before it wakes them).
    types: Mutex<HashMap<u64, Vec<String>>>,
    next_worker: AtomicU64,
    /// Wake-ups that came from other processes (notifications, data_version changes).
    remote: AtomicU64,
}

impl Wakeups {
    /// `outbox`: whether changes are sent to other processes (see `Outbox`).
    pub fn new(outbox: bool) -> Arc<Self> {
        Arc::new(Wakeups {
            topics: std::array::from_fn(|_| watch::channel(0).0),
            nonce: format!("{:016x}", rand::random::<u64>()),
            outbox: outbox.then(|| {
                Arc::new(Outbox {
                    bits: AtomicU8::new(0),
                    ready: Notify::new(),
                    sending: tokio::sync::Mutex::new(()),
                })
            }),
            watching: AtomicBool::new(false),
            closed: watch::channel(false).0,
            types: Mutex::new(HashMap::new()),
            next_worker: AtomicU64::new(1),
            remote: AtomicU64::new(0),
        })
    }

    /// A change of this process was committed: wake its waiters now, and tell other
    /// processes (when the engine does).
    pub fn changed(&self, t: Topic) {
        self.bump(t);
        if let Some(o) = &self.outbox {
            o.bits.fetch_or(t.bit(), Ordering::AcqRel);
            o.ready.notify_one();
        }
    }

    /// Wake this process's waiters on `t` (nothing is sent elsewhere).
    pub fn bump(&self, t: Topic) {
        self.topics[t as usize].send_modify(|v| *v += 1);
    }

    /// A change another process made, or may have made (every topic when `None`: a watcher
    /// that reconnected may have missed some, or cannot tell what changed).
    pub fn bump_remote(&self, t: Option<Topic>) {
        self.remote.fetch_add(1, Ordering::Relaxed);
        match t {
            Some(t) => self.bump(t),
            // Not a cancel for sure: `Changed` says "look, at most every CANCEL_GAP".
            None => [Topic::Jobs, Topic::Events, Topic::Changed, Topic::Triggers]
                .into_iter()
                .for_each(|t| self.bump(t)),
        }
    }

    /// The number of wake-ups that came from other processes so far.
    pub fn remote_count(&self) -> u64 {
        self.remote.load(Ordering::Relaxed)
    }

    /// The current version of `t`: read it before looking at the store, then `wait` for a
    /// newer one.
    pub fn version(&self, t: Topic) -> u64 {
        *self.topics[t as usize].borrow()
    }

    /// Wait until `t`'s version is past `seen` (true at once if it is already), at most
    /// `timeout`, or until the store closes (false: the timeout or the close).
    pub async fn wait(&self, t: Topic, seen: u64, timeout: Duration) -> bool {
        let mut rx = self.topics[t as usize].subscribe();
        let mut closed = self.closed.subscribe();
        if *closed.borrow_and_update() {
            return false;
        }
        let newer = rx.wait_for(|v| *v != seen);
        tokio::select! {
            r = newer => r.is_ok(),
            _ = tokio::time::sleep(timeout) => false,
            _ = closed.changed() => false,
        }
    }

    /// The nonce this process's notifications carry.
    pub fn nonce(&self) -> &str {
        &self.nonce
    }

    pub fn outbox(&self) -> Option<Arc<Outbox>> {
        self.outbox.clone()
    }

    /// True the first time only: the caller starts the engine's watcher.
    pub fn start_watching(&self) -> bool {
        !self.watching.swap(true, Ordering::AcqRel)
    }

    /// Resolves when the store closes (or its `Wakeups` is dropped).
    pub fn closed(&self) -> watch::Receiver<bool> {
        self.closed.subscribe()
    }

    pub fn close(&self) {
        self.closed.send_replace(true);
    }

    /// Register a worker's job types; returns its key for `unregister`.
    pub fn register(&self, types: Vec<String>) -> u64 {
        let k = self.next_worker.fetch_add(1, Ordering::Relaxed);
        self.types.lock().unwrap().insert(k, types);
        k
    }

    pub fn unregister(&self, key: u64) {
        self.types.lock().unwrap().remove(&key);
    }

    /// The job types of every registered worker, sorted, once each.
    pub fn worker_types(&self) -> Vec<String> {
        let mut all: Vec<String> = self
            .types
            .lock()
            .unwrap()
            .values()
            .flatten()
            .cloned()
            .collect();
        all.sort();
        all.dedup();
        all
    }

    /// Whether a worker is registered.
    pub fn has_workers(&self) -> bool {
        !self.types.lock().unwrap().is_empty()
    }
}

impl Drop for Wakeups {
    fn drop(&mut self) {
        self.closed.send_replace(true);
    }
}

/// Resolves once `rx` says closed (or its sender is gone).
pub async fn until_closed(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|c| *c).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_change_between_the_look_and_the_wait_is_not_missed() {
        let w = Wakeups::new(false);
        let seen = w.version(Topic::Jobs);
        w.changed(Topic::Jobs);
        assert!(w.wait(Topic::Jobs, seen, Duration::from_secs(5)).await);
        let seen = w.version(Topic::Jobs);
        assert!(!w.wait(Topic::Jobs, seen, Duration::from_millis(20)).await);
        // Another topic does not wake it.
        w.changed(Topic::Events);
        assert!(!w.wait(Topic::Jobs, seen, Duration::from_millis(20)).await);
    }

    #[tokio::test]
    async fn a_wait_ends_when_the_store_closes() {
        let w = Wakeups::new(false);
        let seen = w.version(Topic::Jobs);
        let w2 = w.clone();
        let t =
            tokio::spawn(async move { w2.wait(Topic::Jobs, seen, Duration::from_secs(60)).await });
        tokio::time::sleep(Duration::from_millis(10)).await;
        w.close();
        assert!(!t.await.unwrap());
    }

    #[tokio::test]
    async fn the_outbox_coalesces() {
        let w = Wakeups::new(true);
        w.changed(Topic::Jobs);
        w.changed(Topic::Jobs);
        w.changed(Topic::Cancels);
        let o = w.outbox().unwrap();
        let bits = o.next().await;
        let got: Vec<Topic> = Outbox::topics(bits).collect();
        assert_eq!(got, vec![Topic::Jobs, Topic::Cancels]);
    }
}
