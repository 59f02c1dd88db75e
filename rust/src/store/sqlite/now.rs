//! The SQLite journal's synchronous fast path: a step's record written on the calling thread,
//! through a connection of its own (raw `libsqlite3`, one prepared statement), without the
//! hops of an async call (to sqlx's connection thread, back, and to the caller's event loop),
//! which cost several times the insert itself.
//!
//! It only ever does the common case, at once or not at all: when this process's writers'
//! lock is free, the file's write lock is free (busy timeout 0: no waiting on the caller's
//! thread) and the step is new. Anything else (a lock held, a conflict, an error) answers
//! `None` and the caller takes the async path, which waits, reads the kept row and reports
//! errors as every other call does.

use std::ffi::{c_int, CString};
use std::ptr;

use libsqlite3_sys as ffi;

use super::SqliteStore;
use crate::store::journal::StepRow;

const INSERT_STEP: &str = "INSERT INTO gnl_run_steps (run_id, name, n, position, state, result, \
     started_at, finished_at) VALUES (?1, ?2, ?3, ?4, 'done', ?5, ?6, ?6) ON CONFLICT DO NOTHING";

const READ_STEPS: &str = "SELECT name, n, position, state, result, started_at, finished_at \
     FROM gnl_run_steps WHERE run_id = ?1 ORDER BY position, name, n";

/// The fast path's connection and statements.
pub(super) struct Raw {
    db: *mut ffi::sqlite3,
    insert: *mut ffi::sqlite3_stmt,
    read: *mut ffi::sqlite3_stmt,
}

// SAFETY: the handles are used only under the `Mutex` that holds them, by one thread at a time;
// SQLite connections may move between threads (the library is built thread-safe).
unsafe impl Send for Raw {}

impl Drop for Raw {
    fn drop(&mut self) {
        // SAFETY: both came from SQLite and are finalized/closed once, here.
        unsafe {
            ffi::sqlite3_finalize(self.insert);
            ffi::sqlite3_finalize(self.read);
            ffi::sqlite3_close(self.db);
        }
    }
}

impl Raw {
    /// Open `path` (an existing, migrated store) with gnl's pragmas; `None` when anything fails.
    pub(super) fn open(path: &str) -> Option<Raw> {
        let cpath = CString::new(path).ok()?;
        let mut db = ptr::null_mut();
        // SAFETY: valid C strings and out-pointers; a failed open still returns a handle that
        // must be closed, which `Raw`'s Drop does once the struct exists.
        unsafe {
            let rc = ffi::sqlite3_open_v2(
                cpath.as_ptr(),
                &mut db,
                ffi::SQLITE_OPEN_READWRITE | ffi::SQLITE_OPEN_NOMUTEX,
                ptr::null(),
            );
            let mut raw = Raw {
                db,
                insert: ptr::null_mut(),
                read: ptr::null_mut(),
            };
            if rc != ffi::SQLITE_OK {
                return None;
            }
            let pragmas =
                CString::new("PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = OFF").ok()?;
            if ffi::sqlite3_exec(db, pragmas.as_ptr(), None, ptr::null_mut(), ptr::null_mut())
                != ffi::SQLITE_OK
            {
                return None;
            }
            for (sql, out) in [(INSERT_STEP, &mut raw.insert), (READ_STEPS, &mut raw.read)] {
                let sql = CString::new(sql).ok()?;
                let rc = ffi::sqlite3_prepare_v3(
                    db,
                    sql.as_ptr(),
                    -1,
                    ffi::SQLITE_PREPARE_PERSISTENT,
                    out,
                    ptr::null_mut(),
                );
                if rc != ffi::SQLITE_OK {
                    return None;
                }
            }
            Some(raw)
        }
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
            let changed = ffi::sqlite3_changes(self.db);
            ffi::sqlite3_reset(st);
            ffi::sqlite3_clear_bindings(st);
            (rc == ffi::SQLITE_DONE).then_some(changed == 1)
        }
    }
}

/// Column `i` of the current row as text (NULL: None).
///
/// # Safety
/// `st` must be a statement positioned on a row (`sqlite3_step` returned `SQLITE_ROW`).
unsafe fn col_text(st: *mut ffi::sqlite3_stmt, i: c_int) -> Option<String> {
    let p = ffi::sqlite3_column_text(st, i);
    if p.is_null() {
        return None;
    }
    let n = ffi::sqlite3_column_bytes(st, i) as usize;
    let b = std::slice::from_raw_parts(p, n);
    Some(String::from_utf8_lossy(b).into_owned())
}

impl Raw {
    /// The steps of `run_id` in position order; `None` when they cannot be read at once.
    fn read_steps(&mut self, run_id: &str) -> Option<Vec<StepRow>> {
        let st = self.read;
        let mut out = Vec::new();
        // SAFETY: as `insert`; columns are read while the statement is on a row.
        unsafe {
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
                    ffi::SQLITE_ROW => out.push(StepRow {
                        name: col_text(st, 0).unwrap_or_default(),
                        n: ffi::sqlite3_column_int64(st, 1),
                        position: ffi::sqlite3_column_int64(st, 2),
                        state: col_text(st, 3).unwrap_or_default(),
                        result: col_text(st, 4),
                        started_at: ffi::sqlite3_column_int64(st, 5),
                        finished_at: (ffi::sqlite3_column_type(st, 6) != ffi::SQLITE_NULL)
                            .then(|| ffi::sqlite3_column_int64(st, 6)),
                    }),
                    ffi::SQLITE_DONE => break,
                    _ => ok = false,
                }
            }
            ffi::sqlite3_reset(st);
            ffi::sqlite3_clear_bindings(st);
            ok.then_some(out)
        }
    }
}

impl SqliteStore {
    /// The steps of `run_id` read at once on this thread; `None`: read them through the pool.
    pub(super) fn read_steps_now(&self, run_id: &str) -> Option<Vec<StepRow>> {
        let path = self.path.as_deref()?;
        let mut raw = self.raw.try_lock().ok()?;
        if raw.is_none() {
            *raw = Some(Raw::open(path)?);
        }
        self.counted(1);
        raw.as_mut()?.read_steps(run_id)
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
        let path = self.path.as_deref()?;
        let _w = self.write.try_lock().ok()?;
        let mut raw = self.raw.try_lock().ok()?;
        if raw.is_none() {
            *raw = Some(Raw::open(path)?);
        }
        self.counted(1);
        match raw
            .as_mut()?
            .insert(run_id, name, n, position, result, self.clock_ms())
        {
            Some(true) => Some(()),
            _ => None,
        }
    }
}
