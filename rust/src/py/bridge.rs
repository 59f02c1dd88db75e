//! The completion queue of the asyncio <-> tokio bridge (`spawn` in `mod.rs`).
//!
//! Each event loop that can watch a file descriptor (`loop.add_reader`) gets a `LoopQueue`
//! (`gnl._bridge.queue_for`). A tokio task that finishes a native call pushes its result, still
//! a Rust value with the converter that makes it Python, onto the queue of the caller's loop,
//! and wakes the loop only when the queue was empty, by writing to an eventfd (a pipe off
//! Linux) the loop watches. `drain` runs on the loop thread, the GIL held: it takes every queued
//! completion, converts each and sets its future. So no tokio thread takes the GIL to hand a
//! result over, and a burst of completions costs the loop one wake-up.
//!
//! The loop's `close` closes its queue (`gnl._bridge`): what is queued is dropped, the
//! descriptor closed, and later completions are dropped where they finish. A loop that cannot
//! be watched or hooked gets no queue; its calls take the `call_soon_threadsafe` path.

use std::cell::RefCell;
use std::sync::{Arc, Mutex, MutexGuard};

use pyo3::exceptions::PyOSError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

/// Makes a finished call's result Python on the loop thread: `(ok, value)`, the value being
/// the exception when not ok.
pub(crate) type Settle = Box<dyn FnOnce(Python<'_>) -> (bool, Py<PyAny>) + Send>;

/// A finished call waiting for its loop: the asyncio future and how to settle it.
struct Completion {
    fut: Py<PyAny>,
    settle: Settle,
}

struct State {
    items: Vec<Completion>,
    closed: bool,
}

/// One loop's queue; tokio tasks hold it by `Arc` until they push.
pub(crate) struct Queue {
    state: Mutex<State>,
    wake: wake::Fds,
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing panics while the lock is held; a poisoned lock's state is still whole.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn is_closed(&self) -> bool {
        self.lock().closed
    }

    /// Queue `fut`'s outcome for the loop (from any thread, without the GIL). The descriptor is
    /// written under the lock, so `close` cannot close it between the check and the write.
    pub(crate) fn push(&self, fut: Py<PyAny>, settle: Settle) {
        let c = Completion { fut, settle };
        let mut st = self.lock();
        if st.closed {
            // The loop is gone and nobody awaits: dropped (Python references are released
            // when the GIL is next taken, pyo3's reference pool).
            drop(st);
            drop(c);
            return;
        }
        let was_empty = st.items.is_empty();
        st.items.push(c);
        if was_empty {
            self.wake.signal();
        }
    }

    /// Mark closed, close the descriptor; returns what was queued (for the caller to drop).
    fn shut(&self) -> Vec<Completion> {
        let mut st = self.lock();
        if st.closed {
            return Vec::new();
        }
        st.closed = true;
        self.wake.close();
        std::mem::take(&mut st.items)
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        self.wake.close();
    }
}

/// `gnl._native.LoopQueue`: the completion queue of one event loop (see the module doc).
#[pyclass(frozen, module = "gnl._native")]
pub struct LoopQueue {
    inner: Arc<Queue>,
}

#[pymethods]
impl LoopQueue {
    #[new]
    fn new() -> PyResult<Self> {
        let wake = wake::Fds::open().map_err(|e| PyOSError::new_err(e.to_string()))?;
        Ok(LoopQueue {
            inner: Arc::new(Queue {
                state: Mutex::new(State {
                    items: Vec::new(),
                    closed: false,
                }),
                wake,
            }),
        })
    }

    /// The descriptor the loop watches (`add_reader`).
    fn fileno(&self) -> i64 {
        self.inner.wake.read_fd() as i64
    }

    /// Settle every queued completion (the loop's reader callback: loop thread, GIL held).
    /// A future already done (its caller cancelled it) is skipped.
    fn drain(&self, py: Python<'_>) {
        let items = {
            let mut st = self.inner.lock();
            if st.closed {
                return;
            }
            // Cleared before the items are taken: a push after the take sees an empty queue
            // and writes again.
            self.inner.wake.clear();
            std::mem::take(&mut st.items)
        };
        for c in items {
            let fut = c.fut.bind(py);
            match fut
                .call_method0(intern!(py, "done"))
                .and_then(|d| d.is_truthy())
            {
                Ok(false) => {}
                _ => continue,
            }
            let (ok, value) = (c.settle)(py);
            let method = if ok {
                intern!(py, "set_result")
            } else {
                intern!(py, "set_exception")
            };
            // It was pending a moment ago on this thread: nothing else can have settled it.
            let _ = fut.call_method1(method, (value,));
        }
    }

    /// Drop what is queued and close the descriptor (the loop closed); later completions are
    /// dropped. Idempotent.
    fn close(&self) {
        let queued = self.inner.shut();
        LAST.with(|l| {
            let mut l = l.borrow_mut();
            if l.as_ref().is_some_and(|(_, q)| Arc::ptr_eq(q, &self.inner)) {
                *l = None;
            }
        });
        drop(queued);
    }

    #[getter]
    fn closed(&self) -> bool {
        self.inner.is_closed()
    }

    /// Completions queued and not yet drained.
    fn __len__(&self) -> usize {
        self.inner.lock().items.len()
    }
}

thread_local! {
    /// This thread's last loop (its address) and its queue. A loop's address is reused only
    /// after the loop is freed, and a freed loop's queue is closed (`gnl._bridge`'s finalizer),
    /// so an open cached queue belongs to the loop at that address.
    static LAST: RefCell<Option<(usize, Arc<Queue>)>> = const { RefCell::new(None) };
}

/// `gnl._bridge.queue_for`.
static QUEUE_FOR: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// The queue of `event_loop`, or None when the loop has none (the `call_soon_threadsafe`
/// path).
pub(crate) fn queue_of(
    py: Python<'_>,
    event_loop: &Bound<'_, PyAny>,
) -> PyResult<Option<Arc<Queue>>> {
    let key = event_loop.as_ptr() as usize;
    let hit = LAST.with(|l| match &*l.borrow() {
        Some((k, q)) if *k == key && !q.is_closed() => Some(q.clone()),
        _ => None,
    });
    if hit.is_some() {
        return Ok(hit);
    }
    let q = super::cached(&QUEUE_FOR, py, "gnl._bridge", "queue_for")?.call1((event_loop,))?;
    if q.is_none() {
        return Ok(None);
    }
    let inner = q.cast::<LoopQueue>()?.get().inner.clone();
    LAST.with(|l| *l.borrow_mut() = Some((key, inner.clone())));
    Ok(Some(inner))
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<LoopQueue>()
}

/// The wake-up descriptor: an eventfd on Linux, a pipe on other Unix systems, none elsewhere
/// (`open` fails and the loop takes the `call_soon_threadsafe` path).
mod wake {
    use std::io;
    use std::sync::atomic::{AtomicBool, Ordering};

    pub(crate) struct Fds {
        read: i32,
        write: i32,
        closed: AtomicBool,
    }

    impl Fds {
        pub(crate) fn read_fd(&self) -> i32 {
            self.read
        }

        #[cfg(target_os = "linux")]
        pub(crate) fn open() -> io::Result<Fds> {
            // SAFETY: eventfd takes no pointers.
            let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(Fds {
                read: fd,
                write: fd,
                closed: AtomicBool::new(false),
            })
        }

        #[cfg(all(unix, not(target_os = "linux")))]
        pub(crate) fn open() -> io::Result<Fds> {
            let mut fds = [0i32; 2];
            // SAFETY: `fds` has room for the two descriptors pipe writes.
            if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
                return Err(io::Error::last_os_error());
            }
            for fd in fds {
                // SAFETY: fcntl on descriptors just opened.
                unsafe {
                    libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
                    let fl = libc::fcntl(fd, libc::F_GETFL);
                    libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
                }
            }
            Ok(Fds {
                read: fds[0],
                write: fds[1],
                closed: AtomicBool::new(false),
            })
        }

        #[cfg(not(unix))]
        pub(crate) fn open() -> io::Result<Fds> {
            Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "no wake-up descriptor on this platform",
            ))
        }

        /// Make the read end readable (the caller holds the queue's lock, the fd is open).
        pub(crate) fn signal(&self) {
            #[cfg(unix)]
            {
                let one: u64 = 1;
                // SAFETY: writes 8 bytes from `one`. A full pipe (EAGAIN) is readable already.
                unsafe { libc::write(self.write, (&one as *const u64).cast(), 8) };
            }
        }

        /// Consume the wake-ups written so far (the caller holds the queue's lock).
        pub(crate) fn clear(&self) {
            #[cfg(unix)]
            {
                let mut buf = [0u8; 64];
                loop {
                    // SAFETY: reads at most `buf.len()` bytes into `buf`.
                    let n = unsafe { libc::read(self.read, buf.as_mut_ptr().cast(), buf.len()) };
                    // An eventfd is emptied by one read; a pipe is read until it is empty.
                    if cfg!(target_os = "linux") || n < buf.len() as isize {
                        break;
                    }
                }
            }
        }

        /// Close the descriptors once (the caller holds the queue's lock, or owns it).
        pub(crate) fn close(&self) {
            if self.closed.swap(true, Ordering::SeqCst) {
                return;
            }
            #[cfg(unix)]
            // SAFETY: closes descriptors this value opened, once.
            unsafe {
                libc::close(self.read);
                if self.write != self.read {
                    libc::close(self.write);
                }
            }
        }
    }
}
