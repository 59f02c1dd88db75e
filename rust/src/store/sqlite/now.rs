//! The SQLite journal's synchronous fast path: a run's start, a step's record, the run's
//! finish and its run lock, each done on the calling thread through a connection of its own
//! (raw `libsqlite3`, statements prepared once), without the hops of an async call (to a tokio
//! thread and sqlx's connection thread, back, and to the caller's event loop), which cost
//! several times the statements themselves, and far more on a loaded machine, where each hop
//! waits for a core.
//!
//! It only ever does the common case, at once or not at all: when this process's writers'
//! lock is free, the file's write lock is free (no busy handler: no waiting on the caller's
//! thread) and the write is the plain one (a new step, a run that is not done, a free lock).
//! Anything else (a lock held, a conflict, a refusal, an error) answers `None` having written
//! nothing, and the caller takes the async path, which waits, reads the kept row and reports
//! errors as every other call does. A finished run's start writes nothing, so it is only read:
//! its recorded result comes back at once even while another writer holds the file's lock.

use std::ffi::{c_int, CString};
use std::ptr;

use libsqlite3_sys as ffi;

use super::journal::{LOCK_ACQUIRE, LOCK_RELEASE, RUN_FINISH, RUN_READ, RUN_UPSERT};
use super::raw::{Db, Val};
use super::SqliteStore;
use crate::error::Error;
use crate::store::journal::{
    started_run, Recorded, RecordedBuilder, RunRow, RunStart, RunStarted, StepRow,
};

const INSERT_STEP: &str = "INSERT INTO gnl_run_steps (run_id, name, n, position, state, result, \
     started_at, finished_at) VALUES (?1, ?2, ?3, ?4, 'done', ?5, ?6, ?6) ON CONFLICT DO NOTHING";

/// In key order, sorted by position here (`read_steps`): SQLite's `ORDER BY position` sorts
/// the run's rows in a temporary b-tree, several times the cost of sorting them in memory.
const READ_STEPS: &str = "SELECT name, n, position, state, result, started_at, finished_at \
     FROM gnl_run_steps WHERE run_id = ?1";

/// The fast path's connection (the runs' and locks' statements go through `Db`, kept) and the
/// two statements of the steps, bound and read here directly (a run writes or reads 1,000).
pub(super) struct Raw {
    db: Db,
    insert: *mut ffi::sqlite3_stmt,
    read: *mut ffi::sqlite3_stmt,
}

// SAFETY: the handles are used only under the `Mutex` that holds them, by one thread at a time;
// SQLite connections may move between threads (the library is built thread-safe).
unsafe impl Send for Raw {}

impl Drop for Raw {
    fn drop(&mut self) {
        // SAFETY: both came from this connection (or are NULL: a no-op) and are finalized once,
        // here, before `db` closes the connection (a struct's fields drop after its Drop).
        unsafe {
            ffi::sqlite3_finalize(self.insert);
            ffi::sqlite3_finalize(self.read);
        }
    }
}

impl Raw {
    /// Open `path` (an existing, migrated store) with gnl's pragmas and no busy handler;
    /// `None` when anything fails.
    pub(super) fn open(path: &str) -> Option<Raw> {
        // No busy handler: a lock held by another connection fails at once, so the caller's
        // thread never waits.
        let db = Db::open(path, None).ok()?;
        let h = db.handle();
        let mut raw = Raw {
            db,
            insert: ptr::null_mut(),
            read: ptr::null_mut(),
        };
        for (sql, out) in [(INSERT_STEP, &mut raw.insert), (READ_STEPS, &mut raw.read)] {
            let sql = CString::new(sql).ok()?;
            // SAFETY: a valid connection and C string; the statement comes out in `out`
            // (finalized by `Raw`'s Drop).
            let rc = unsafe {
                ffi::sqlite3_prepare_v3(
                    h,
                    sql.as_ptr(),
                    -1,
                    ffi::SQLITE_PREPARE_PERSISTENT,
                    out,
                    ptr::null_mut(),
                )
            };
            if rc != ffi::SQLITE_OK {
                return None;
            }
        }
        Some(raw)
    }

    /// Insert a new step; `Some(true)` when inserted, `Some(false)` when it existed, `None`
    /// when it could not be done at once.
    fn insert(
        &mut self,
        run_id: &str,
        name: &str,
        n: i64,
        position: i64,
        result: &str,
        now: i64,
    ) -> Option<bool> {
        let st = self.insert;
        // SAFETY: a prepared statement of this connection, used by this thread alone (the
        // Mutex); text is bound with SQLITE_TRANSIENT (copied), so the borrows may end.
        unsafe {
            let text = |i: c_int, s: &str| {
                ffi::sqlite3_bind_text(
                    st,
                    i,
                    s.as_ptr().cast(),
                    s.len() as c_int,
                    ffi::SQLITE_TRANSIENT(),
                )
            };
            let ok = text(1, run_id) == ffi::SQLITE_OK
                && text(2, name) == ffi::SQLITE_OK
                && ffi::sqlite3_bind_int64(st, 3, n) == ffi::SQLITE_OK
                && ffi::sqlite3_bind_int64(st, 4, position) == ffi::SQLITE_OK
                && text(5, result) == ffi::SQLITE_OK
                && ffi::sqlite3_bind_int64(st, 6, now) == ffi::SQLITE_OK;
            let rc = if ok {
                ffi::sqlite3_step(st)
            } else {
                ffi::SQLITE_ERROR
            };
            let changed = ffi::sqlite3_changes(self.db.handle());
            ffi::sqlite3_reset(st);
            ffi::sqlite3_clear_bindings(st);
            (rc == ffi::SQLITE_DONE).then_some(changed == 1)
        }
    }
}

/// The steps of `run_id` through `st` (`READ_STEPS`) in the order of the async path's
/// `ORDER BY position, name, n` (names compared as bytes, as SQLite's BINARY collation);
/// `None` when they cannot be read at once.
///
/// # Safety
/// `st` must be a prepared `READ_STEPS` of a connection used by this thread alone.
unsafe fn read_steps(st: *mut ffi::sqlite3_stmt, run_id: &str) -> Option<Vec<StepRow>> {
    read_recorded(st, run_id).map(|r| r.to_rows())
}

/// Column `i` of the current row as bytes (NULL: None), borrowed until the next step.
///
/// # Safety
/// `st` must be a statement positioned on a row; the slice must not outlive that row.
unsafe fn col_bytes<'a>(st: *mut ffi::sqlite3_stmt, i: c_int) -> Option<&'a [u8]> {
    let p = ffi::sqlite3_column_text(st, i);
    if p.is_null() {
        return None;
    }
    let n = ffi::sqlite3_column_bytes(st, i) as usize;
    Some(std::slice::from_raw_parts(p, n))
}

/// `read_steps` packed for a replay (`Recorded`): each row's text goes from SQLite's buffer
/// into the packed form without a string of its own (key order is position order for a run
/// of one step name: already sorted, nothing to sort).
///
/// # Safety
/// As `read_steps`.
unsafe fn read_recorded(st: *mut ffi::sqlite3_stmt, run_id: &str) -> Option<Recorded> {
    let mut out = RecordedBuilder::default();
    let bound = ffi::sqlite3_bind_text(
        st,
        1,
        run_id.as_ptr().cast(),
        run_id.len() as c_int,
        ffi::SQLITE_TRANSIENT(),
    );
    let mut ok = bound == ffi::SQLITE_OK;
    while ok {
        match ffi::sqlite3_step(st) {
            ffi::SQLITE_ROW => out.push(
                col_bytes(st, 0).unwrap_or_default(),
                ffi::sqlite3_column_int64(st, 1),
                ffi::sqlite3_column_int64(st, 2),
                col_bytes(st, 3).unwrap_or_default(),
                col_bytes(st, 4),
                ffi::sqlite3_column_int64(st, 5),
                (ffi::sqlite3_column_type(st, 6) != ffi::SQLITE_NULL)
                    .then(|| ffi::sqlite3_column_int64(st, 6)),
            ),
            ffi::SQLITE_DONE => break,
            _ => ok = false,
        }
    }
    ffi::sqlite3_reset(st);
    ffi::sqlite3_clear_bindings(st);
    ok.then(|| out.finish())
}

/// A `RunRow` from a row of `RUN_COLS` read through `Db`.
fn run_of(row: Vec<Val>) -> Option<RunRow> {
    let mut v = row.into_iter();
    let mut next = || v.next().unwrap_or(Val::Null);
    Some(RunRow {
        run_id: next().text()?,
        workflow: next().text()?,
        preset: next().text(),
        state: next().text()?,
        input: next().text(),
        result: next().text(),
        error: next().text(),
        scheduled_for: next().opt_int(),
        wake_at: next().opt_int(),
        lease_owner: next().text(),
        lease_expires_at: next().opt_int(),
        token: next().int(),
        created_at: next().int(),
        updated_at: next().int(),
    })
}

fn opt(v: Option<i64>) -> Val {
    v.map_or(Val::Null, Val::Int)
}

impl SqliteStore {
    /// The fast path's connection, locked, opened on first use; `None` when it is in use, in
    /// memory (no file: no fast path) or cannot be opened.
    fn raw_now(&self) -> Option<std::sync::MutexGuard<'_, Option<Raw>>> {
        let path = self.path.as_deref()?;
        let mut raw = self.raw.try_lock().ok()?;
        if raw.is_none() {
            *raw = Some(Raw::open(path)?);
        }
        Some(raw)
    }

    /// The steps of `run_id` read at once on this thread; `None`: read them through the pool.
    pub(super) fn read_steps_now(&self, run_id: &str) -> Option<Vec<StepRow>> {
        let mut raw = self.raw_now()?;
        self.counted(1);
        // SAFETY: the connection's own `READ_STEPS`, under its Mutex.
        unsafe { read_steps(raw.as_mut()?.read, run_id) }
    }

    /// Record step `(run_id, name, n)` as done with `result` at once, on this thread: `Some(())`
    /// when this call recorded it; `None` when it cannot be done at once (see the module).
    pub(super) fn put_step_now(
        &self,
        run_id: &str,
        name: &str,
        n: i64,
        position: i64,
        result: &str,
    ) -> Option<()> {
        let _w = self.write.try_lock().ok()?;
        let mut raw = self.raw_now()?;
        self.counted(1);
        match raw
            .as_mut()?
            .insert(run_id, name, n, position, result, self.clock_ms())
        {
            Some(true) => Some(()),
            _ => None,
        }
    }

    /// `run_start` at once, on this thread: a done run read back (nothing written), or the
    /// run's upsert and its steps' read in one transaction; `None` (nothing written) when the
    /// upsert refuses (done meanwhile, another workflow's run: the async path reports it) or
    /// cannot be done at once.
    pub(super) fn start_run_now(&self, s: &RunStart) -> Option<RunStarted> {
        let mut guard = self.raw_now()?;
        let raw = guard.as_mut()?;
        let now = self.clock_ms();
        self.counted(1);
        let found = raw
            .db
            .rows(&RUN_READ, &[s.run_id.as_str().into()], true)
            .ok()?;
        if let Some(run) = found.into_iter().next().and_then(run_of) {
            if run.state == "done" {
                let (run, created, _) = started_run(Some(run), s).ok()?;
                return Some(RunStarted {
                    run,
                    steps: Recorded::default(),
                    created,
                    now_ms: now,
                });
            }
        }
        let _w = self.write.try_lock().ok()?;
        let args = [
            s.run_id.as_str().into(),
            s.workflow.as_str().into(),
            s.preset.as_deref().into(),
            s.input.as_deref().into(),
            opt(s.scheduled_for),
            s.owner.as_str().into(),
            opt(s.lease_ms.map(|l| now + l)),
            now.into(),
        ];
        let read = raw.read;
        raw.db
            .write(|db| {
                self.counted(1);
                let run = db.rows(&RUN_UPSERT, &args, true)?.into_iter().next();
                let (run, created, resumed) = started_run(run.and_then(run_of), s)?;
                let steps = if resumed {
                    self.counted(1);
                    // SAFETY: the connection's own `READ_STEPS`, under its Mutex.
                    unsafe { read_recorded(read, &s.run_id) }
                        .ok_or_else(|| Error::invalid("the steps could not be read at once"))?
                } else {
                    Recorded::default()
                };
                Ok(RunStarted {
                    run,
                    steps,
                    created,
                    now_ms: now,
                })
            })
            .ok()
    }

    /// `run_finish` at once, on this thread: `Some(())` when this call recorded `result`;
    /// `None` (the run done already, or not at once) otherwise.
    pub(super) fn finish_run_now(&self, run_id: &str, result: &str) -> Option<()> {
        let _w = self.write.try_lock().ok()?;
        let mut raw = self.raw_now()?;
        self.counted(1);
        let args = [run_id.into(), result.into(), self.clock_ms().into()];
        let won = raw.as_mut()?.db.exec(RUN_FINISH, &args, true).ok()?;
        (won == 1).then_some(())
    }

    /// `lock_acquire` at once, on this thread: the fresh token when this call took the lock;
    /// `None` (held, or not at once) otherwise.
    pub(super) fn acquire_lock_now(&self, key: &str, owner: &str, ttl_ms: i64) -> Option<i64> {
        let now = self.clock_ms();
        let _w = self.write.try_lock().ok()?;
        let mut raw = self.raw_now()?;
        self.counted(1);
        let args = [key.into(), owner.into(), (now + ttl_ms).into(), now.into()];
        let rows = raw.as_mut()?.db.rows(LOCK_ACQUIRE, &args, true).ok()?;
        rows.first()?.first().map(Val::int)
    }

    /// `lock_release` at once, on this thread: `Some(())` when this call released the lock
    /// held with `token`; `None` (not held with it, or not at once) otherwise.
    pub(super) fn release_lock_now(&self, key: &str, token: i64) -> Option<()> {
        let _w = self.write.try_lock().ok()?;
        let mut raw = self.raw_now()?;
        self.counted(1);
        let args = [key.into(), token.into()];
        let won = raw.as_mut()?.db.exec(LOCK_RELEASE, &args, true).ok()?;
        (won == 1).then_some(())
    }
}
