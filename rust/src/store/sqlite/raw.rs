//! The queue's hot path on a raw connection: a claim (with the outcomes it carries) or a
//! write of outcomes is one call on one thread, every statement of its transaction run by
//! `libsqlite3` directly. Through sqlx each statement is a round trip to the connection's
//! worker thread (~35-40 µs on the reference machine, several times the statement itself),
//! and a claim is ~7 of them; here the whole transaction is one hop (`SqliteStore::on_raw`).
//!
//! A file store uses a connection of its own, opened on first use (gnl's pragmas, the
//! busy handler), run on tokio's blocking pool so that a wait for another process's write
//! lock never holds a runtime thread. An in-memory store has one connection for the life of
//! its pool: the call locks that one (`lock_handle`) and runs at once (no other process can
//! hold its lock).

use std::collections::HashMap;
use std::ffi::{c_int, CStr, CString};
use std::ptr;
use std::sync::Arc;

use libsqlite3_sys as ffi;

use super::checkpoint::{self, Checkpointer};

use crate::error::{Error, Result};

/// A bound parameter or a column's value.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Val {
    Null,
    Int(i64),
    Text(String),
}

impl Val {
    pub(super) fn int(&self) -> i64 {
        match self {
            Val::Int(i) => *i,
            _ => 0,
        }
    }

    pub(super) fn opt_int(&self) -> Option<i64> {
        match self {
            Val::Int(i) => Some(*i),
            _ => None,
        }
    }

    pub(super) fn text(self) -> Option<String> {
        match self {
            Val::Text(s) => Some(s),
            _ => None,
        }
    }
}

impl From<i64> for Val {
    fn from(v: i64) -> Self {
        Val::Int(v)
    }
}

impl From<&str> for Val {
    fn from(v: &str) -> Self {
        Val::Text(v.to_string())
    }
}

impl From<&String> for Val {
    fn from(v: &String) -> Self {
        Val::Text(v.clone())
    }
}

impl From<Option<&str>> for Val {
    fn from(v: Option<&str>) -> Self {
        v.map_or(Val::Null, Val::from)
    }
}

/// A busy handler, as `sqlite3_busy_handler` takes it.
type Busy = unsafe extern "C" fn(*mut std::ffi::c_void, c_int) -> c_int;

/// Prepared statements kept per connection at most; past it the cache starts over.
const KEEP: usize = 128;

/// A connection to run a transaction on (owned: opened here; or borrowed from sqlx's pool).
pub(super) struct Db {
    db: *mut ffi::sqlite3,
    owned: bool,
    kept: HashMap<String, *mut ffi::sqlite3_stmt>,
    /// Statements run since the last `take_count`.
    count: u64,
    /// Who checkpoints this connection's WAL (`watch_wal`): kept alive while its hook is set.
    wal: Option<Arc<Checkpointer>>,
}

// SAFETY: a `Db` is used by one thread at a time (the `Mutex` that holds an owned one, the
// locked handle for a borrowed one); SQLite connections may move between threads (the
// library is built thread-safe).
unsafe impl Send for Db {}

impl Drop for Db {
    fn drop(&mut self) {
        // SAFETY: the statements came from this connection and are finalized once, here; an
        // owned connection is closed once, after them.
        unsafe {
            for (_, st) in self.kept.drain() {
                ffi::sqlite3_finalize(st);
            }
            if self.owned {
                ffi::sqlite3_close(self.db);
            }
        }
    }
}

impl Db {
    /// Open `path` (an existing store in WAL mode) with gnl's pragmas and `busy` as its busy
    /// handler (None: a lock held elsewhere fails at once).
    pub(super) fn open(
        path: &str,
        busy: Option<extern "C" fn(*mut std::ffi::c_void, c_int) -> c_int>,
    ) -> Result<Db> {
        let cpath = CString::new(path).map_err(|e| Error::invalid(e.to_string()))?;
        let mut db = ptr::null_mut();
        // SAFETY: valid C strings and out-pointer; a failed open still returns a handle, which
        // the `Db` built at once closes on drop.
        let mut out = unsafe {
            let rc = ffi::sqlite3_open_v2(
                cpath.as_ptr(),
                &mut db,
                ffi::SQLITE_OPEN_READWRITE | ffi::SQLITE_OPEN_NOMUTEX,
                ptr::null(),
            );
            let mut out = Db {
                db,
                owned: true,
                kept: HashMap::new(),
                count: 0,
                wal: None,
            };
            if rc != ffi::SQLITE_OK {
                return Err(out.error(rc));
            }
            out.set_busy(busy);
            out
        };
        out.batch("PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = OFF")?;
        // Opening is not one of the calls' queries.
        out.count = 0;
        Ok(out)
    }

    /// A connection of sqlx's pool, locked by the caller for as long as the `Db` lives.
    ///
    /// # Safety
    /// `db` must stay open and used by nobody else until the `Db` is dropped.
    pub(super) unsafe fn borrowed(db: *mut ffi::sqlite3) -> Db {
        Db {
            db,
            owned: false,
            kept: HashMap::new(),
            count: 0,
            wal: None,
        }
    }

    /// Hand this connection's automatic checkpoint to `wal` (`checkpoint.rs`): its commits
    /// tell it how large the WAL has grown.
    pub(super) fn watch_wal(&mut self, wal: Arc<Checkpointer>) {
        // SAFETY: a valid connection; the context pointer is the `Checkpointer` this `Db` keeps
        // (in `self.wal`) until it closes the connection, after which no hook runs.
        unsafe {
            ffi::sqlite3_wal_hook(
                self.db,
                Some(checkpoint::wal_hook),
                Arc::as_ptr(&wal) as *mut std::ffi::c_void,
            )
        };
        self.wal = Some(wal);
    }

    /// A PASSIVE checkpoint of the WAL (copies what no reader still needs, waits for nobody).
    pub(super) fn checkpoint(&mut self) -> Result<()> {
        let (mut log, mut done) = (0, 0);
        // SAFETY: a valid connection and out-pointers; a NULL schema means every attached one.
        let rc = unsafe {
            ffi::sqlite3_wal_checkpoint_v2(
                self.db,
                ptr::null(),
                ffi::SQLITE_CHECKPOINT_PASSIVE,
                &mut log,
                &mut done,
            )
        };
        if rc == ffi::SQLITE_OK || rc == ffi::SQLITE_BUSY {
            Ok(())
        } else {
            Err(self.error(rc))
        }
    }

    /// Set the busy handler (None: a lock held by another connection fails at once).
    pub(super) fn set_busy(
        &mut self,
        busy: Option<extern "C" fn(*mut std::ffi::c_void, c_int) -> c_int>,
    ) {
        // SAFETY: a valid connection; the handler is a plain function.
        unsafe { ffi::sqlite3_busy_handler(self.db, busy.map(|f| f as Busy), ptr::null_mut()) };
    }

    /// The connection's handle, for statements its owner prepares itself (and finalizes
    /// before the `Db` is dropped).
    pub(super) fn handle(&self) -> *mut ffi::sqlite3 {
        self.db
    }

    /// Statements run since the last call.
    pub(super) fn take_count(&mut self) -> u64 {
        std::mem::take(&mut self.count)
    }

    /// The connection's last error, as gnl's error for `rc`.
    fn error(&self, rc: c_int) -> Error {
        // SAFETY: `sqlite3_errmsg` returns a NUL-terminated string owned by the connection,
        // copied at once; a NULL handle (failed open) has a static message.
        let msg = unsafe {
            let ext = ffi::sqlite3_extended_errcode(self.db);
            let p = ffi::sqlite3_errmsg(self.db);
            let m = if p.is_null() {
                String::from("unknown SQLite error")
            } else {
                CStr::from_ptr(p).to_string_lossy().into_owned()
            };
            (
                if self.db.is_null() || ext == 0 {
                    rc
                } else {
                    ext
                },
                m,
            )
        };
        Error::sqlite(msg.0, msg.1)
    }

    /// Run statements without parameters or rows (BEGIN, COMMIT, pragmas).
    fn batch(&mut self, sql: &str) -> Result<()> {
        self.count += 1;
        let c = CString::new(sql).map_err(|e| Error::invalid(e.to_string()))?;
        // SAFETY: a valid connection and C string; no callback.
        let rc = unsafe {
            ffi::sqlite3_exec(self.db, c.as_ptr(), None, ptr::null_mut(), ptr::null_mut())
        };
        if rc == ffi::SQLITE_OK {
            Ok(())
        } else {
            Err(self.error(rc))
        }
    }

    /// Run `f` in a write transaction (`BEGIN IMMEDIATE`): committed when it returns `Ok`,
    /// rolled back otherwise.
    /// BEGIN and COMMIT are kept prepared (`sqlite3_exec` parses them every time).
    pub(super) fn write<T>(&mut self, f: impl FnOnce(&mut Db) -> Result<T>) -> Result<T> {
        self.exec("BEGIN IMMEDIATE", &[], true)?;
        let r = f(self).and_then(|v| self.exec("COMMIT", &[], true).map(|_| v));
        if r.is_err() {
            // SAFETY: a valid connection; true while a transaction is open.
            if unsafe { ffi::sqlite3_get_autocommit(self.db) } == 0 {
                let _ = self.batch("ROLLBACK");
            }
        }
        r
    }

    /// Run `sql` with `args` and return its rows. `keep`: keep the prepared statement for
    /// the next call with the same text (a statement whose text is made per call is not).
    pub(super) fn rows(&mut self, sql: &str, args: &[Val], keep: bool) -> Result<Vec<Vec<Val>>> {
        let mut rows = Vec::new();
        self.each(sql, args, keep, |row| {
            rows.push(row);
            true
        })?;
        Ok(rows)
    }

    /// Run `sql` with `args`, handing its rows to `f` one at a time until `f` answers false
    /// (the rest are never read). `keep` as for `rows`.
    pub(super) fn each(
        &mut self,
        sql: &str,
        args: &[Val],
        keep: bool,
        mut f: impl FnMut(Vec<Val>) -> bool,
    ) -> Result<()> {
        self.count += 1;
        let (st, kept) = match self.kept.get(sql) {
            Some(&st) => (st, true),
            None => {
                let mut st = ptr::null_mut();
                // SAFETY: `sql` is valid for its length; the statement comes out in `st`.
                let rc = unsafe {
                    ffi::sqlite3_prepare_v3(
                        self.db,
                        sql.as_ptr().cast(),
                        sql.len() as c_int,
                        if keep {
                            ffi::SQLITE_PREPARE_PERSISTENT
                        } else {
                            0
                        },
                        &mut st,
                        ptr::null_mut(),
                    )
                };
                if rc != ffi::SQLITE_OK {
                    return Err(self.error(rc));
                }
                if keep && self.owned {
                    if self.kept.len() >= KEEP {
                        for (_, old) in self.kept.drain() {
                            // SAFETY: kept statements are not in use between calls.
                            unsafe { ffi::sqlite3_finalize(old) };
                        }
                    }
                    self.kept.insert(sql.to_string(), st);
                }
                (st, keep && self.owned)
            }
        };
        // SAFETY: a statement of this connection, used by this thread alone; text is bound
        // with SQLITE_TRANSIENT (copied); columns are read while it is on a row; it is reset
        // (kept) or finalized (not kept) before returning.
        let out = unsafe {
            let mut rc = ffi::SQLITE_OK;
            for (i, a) in args.iter().enumerate() {
                let i = i as c_int + 1;
                rc = match a {
                    Val::Null => ffi::sqlite3_bind_null(st, i),
                    Val::Int(v) => ffi::sqlite3_bind_int64(st, i, *v),
                    Val::Text(s) => ffi::sqlite3_bind_text(
                        st,
                        i,
                        s.as_ptr().cast(),
                        s.len() as c_int,
                        ffi::SQLITE_TRANSIENT(),
                    ),
                };
                if rc != ffi::SQLITE_OK {
                    break;
                }
            }
            if rc == ffi::SQLITE_OK {
                let n = ffi::sqlite3_column_count(st);
                loop {
                    rc = ffi::sqlite3_step(st);
                    if rc != ffi::SQLITE_ROW {
                        break;
                    }
                    let mut row = Vec::with_capacity(n as usize);
                    for c in 0..n {
                        row.push(match ffi::sqlite3_column_type(st, c) {
                            ffi::SQLITE_NULL => Val::Null,
                            ffi::SQLITE_INTEGER => Val::Int(ffi::sqlite3_column_int64(st, c)),
                            _ => {
                                let p = ffi::sqlite3_column_text(st, c);
                                let len = ffi::sqlite3_column_bytes(st, c) as usize;
                                if p.is_null() {
                                    Val::Null
                                } else {
                                    let b = std::slice::from_raw_parts(p, len);
                                    Val::Text(String::from_utf8_lossy(b).into_owned())
                                }
                            }
                        });
                    }
                    if !f(row) {
                        rc = ffi::SQLITE_DONE;
                        break;
                    }
                }
            }
            let r = if rc == ffi::SQLITE_DONE {
                Ok(())
            } else {
                Err(self.error(rc))
            };
            if kept {
                ffi::sqlite3_reset(st);
                ffi::sqlite3_clear_bindings(st);
            } else {
                ffi::sqlite3_finalize(st);
            }
            r
        };
        out
    }

    /// Run `sql` with `args`; the number of rows it changed.
    pub(super) fn exec(&mut self, sql: &str, args: &[Val], keep: bool) -> Result<u64> {
        self.rows(sql, args, keep)?;
        // SAFETY: a valid connection.
        Ok(unsafe { ffi::sqlite3_changes64(self.db) } as u64)
    }
}
