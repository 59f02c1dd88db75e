//! WAL checkpoints off the queue's hot path. SQLite's automatic checkpoint runs inside the
//! commit that grows the WAL past 1,000 frames, and a checkpoint waits for the disk twice (it
//! syncs the WAL before copying it into the file, and the file after): on the reference
//! machine an `fsync` takes ~4 ms, so a claim's commit paid ~7-10 ms every ~160 claims over 50
//! organizations (each claim dirties a page of a different lane's due index), ~40% of a claim.
//!
//! The hot connection (`raw.rs`) hands the automatic checkpoint to a thread of its own
//! instead: its WAL hook asks the checkpointer for a PASSIVE checkpoint every
//! `EVERY` frames (what SQLite's automatic checkpoint does, so the WAL is synced as often as
//! before, and writers never wait for it), and checkpoints inline only when the WAL reaches
//! `RESTART_AT` frames. A WAL restarts from its start only once every frame is in the file:
//! while writes keep coming, a checkpoint on another thread never catches up with the last
//! commit, so the inline one (which does, holding this process's writers) keeps the file's size
//! bounded (it waits for one under way on the thread first: with two at once, the later one
//! fails busy).

use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use libsqlite3_sys as ffi;

use super::raw::Db;

/// Frames added to the WAL between two checkpoints (SQLite's default automatic checkpoint).
const EVERY: i64 = 1_000;
/// WAL size (frames, ~4 KiB each) at which the committing connection checkpoints itself, so
/// the WAL can restart from its start.
const RESTART_AT: c_int = 8_000;

/// A file store's checkpointer: a thread started with the store's first hot connection, asked
/// for a checkpoint by that connection's WAL hook.
pub(super) struct Checkpointer {
    path: String,
    state: Mutex<State>,
    wake: Condvar,
    /// Signalled when a checkpoint on the thread ends.
    idle: Condvar,
    /// The WAL's size (frames) when a checkpoint was last asked for.
    asked_at: AtomicI64,
}

#[derive(Default)]
struct State {
    wanted: bool,
    /// A checkpoint runs on the thread.
    busy: bool,
    stop: bool,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Checkpointer {
    pub(super) fn new(path: String) -> Arc<Checkpointer> {
        Arc::new(Checkpointer {
            path,
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
            idle: Condvar::new(),
            asked_at: AtomicI64::new(0),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Start the thread (once; not after `stop`).
    pub(super) fn start(self: &Arc<Self>) {
        let mut s = self.state();
        if s.thread.is_some() || s.stop {
            return;
        }
        let me = self.clone();
        s.thread = std::thread::Builder::new()
            .name("gnl-sqlite-checkpoint".into())
            .spawn(move || me.run())
            .ok();
    }

    fn ask(&self) {
        self.state().wanted = true;
        self.wake.notify_one();
    }

    /// Stop the thread; the handle to wait for its end (a checkpoint under way completes).
    pub(super) fn stop(&self) -> Option<std::thread::JoinHandle<()>> {
        let mut s = self.state();
        s.stop = true;
        self.wake.notify_one();
        s.thread.take()
    }

    fn run(self: Arc<Self>) {
        let mut db: Option<Db> = None;
        loop {
            {
                let mut s = self.state();
                while !s.wanted && !s.stop {
                    s = self.wake.wait(s).unwrap_or_else(|p| p.into_inner());
                }
                if s.stop {
                    return;
                }
                s.wanted = false;
                s.busy = true;
            }
            if db.is_none() {
                // The checkpoint needs no lock another connection waits for: no busy handler.
                db = Db::open(&self.path, None).ok();
            }
            // A failed checkpoint (the file gone, an I/O error) is tried again on a new
            // connection when asked next; meanwhile the inline one at `RESTART_AT` remains.
            if db.as_mut().is_some_and(|d| d.checkpoint().is_err()) {
                db = None;
            }
            self.state().busy = false;
            self.idle.notify_all();
        }
    }

    /// A checkpoint on the calling connection, once the thread's (if one runs) has ended: two
    /// at once, the later one would fail busy and the WAL would not restart.
    fn inline(&self, db: *mut ffi::sqlite3, name: *const c_char) {
        let mut s = self.state();
        while s.busy && !s.stop {
            s = self.idle.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        // What SQLite's automatic checkpoint does (PASSIVE, errors ignored: the commit is
        // done); the thread does not start another meanwhile (`s` is held).
        // SAFETY: the connection and schema name SQLite passed to its callback, during it.
        unsafe { ffi::sqlite3_wal_checkpoint(db, name) };
        self.asked_at.store(0, Ordering::Relaxed);
        drop(s);
    }
}

/// The hot connection's WAL hook (`sqlite3_wal_hook`), called after each commit with the
/// WAL's size in frames: `ctx` is the connection's `Checkpointer`.
pub(super) extern "C" fn wal_hook(
    ctx: *mut c_void,
    db: *mut ffi::sqlite3,
    name: *const c_char,
    frames: c_int,
) -> c_int {
    // SAFETY: `ctx` is the `Arc<Checkpointer>` the connection's `Db` holds for as long as the
    // hook is set (`Db::watch_wal`).
    let c = unsafe { &*(ctx as *const Checkpointer) };
    if frames >= RESTART_AT {
        // Every frame is then in the file, so the next write restarts the WAL.
        c.inline(db, name);
        return ffi::SQLITE_OK;
    }
    let frames = i64::from(frames);
    let asked = c.asked_at.load(Ordering::Relaxed);
    // A WAL smaller than when last asked has restarted.
    let since = if frames < asked { 0 } else { asked };
    // The last stretch before `RESTART_AT` is left to the inline checkpoint.
    if frames >= since + EVERY && frames + EVERY < i64::from(RESTART_AT) {
        c.asked_at.store(frames, Ordering::Relaxed);
        c.ask();
    }
    ffi::SQLITE_OK
}
