//! Held connections (Postgres and MySQL): a connection a store keeps outside its pool for one
//! kind of hot call, so that the call pays no acquire and no ping on release: a run's step
//! writes (the journal's, both engines), and a worker's claims (two of them, one a claim in
//! flight: `PostgresStore::claims`, one statement; `MysqlStore::claims`, a transaction).
//!
//! Through the pool a statement costs more than its round trip: the acquire, and on release
//! sqlx pings the connection (one more round trip, in a task of its own) before the pool may
//! hand it out again, so a run's next step takes a second connection while the first one's
//! ping is in flight. A workflow's steps come one after another; the held connection serves
//! them without either. A call that finds it in use (another run's step in flight) takes the
//! pool, as every other call does.
//!
//! The connection comes from the pool (its connect options, timeouts and session set-up) and
//! is detached from it, so a store keeps at most its pool's `max_connections` plus its held
//! ones. It is pinged before use once idle for `IDLE_PING` (as the pool's `before_acquire`
//! does), closed and taken again after `MAX_LIFETIME` (the pool's `max_lifetime`), and dropped
//! after any error (it may be broken); the next call takes a fresh one. As with a pooled
//! connection, a connection the server ended less than `IDLE_PING` ago fails the one statement
//! sent on it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sqlx::{Connection, Database, Pool};
use tokio::sync::{Mutex, MutexGuard};

use crate::error::Result;

/// A connection idle this long is pinged before use.
const IDLE_PING: Duration = Duration::from_secs(1);
/// How long that ping may take before the connection counts as broken.
const PING_TIMEOUT: Duration = Duration::from_secs(2);
/// A connection this old is closed and replaced.
const MAX_LIFETIME: Duration = Duration::from_secs(1800);

struct Kept<DB: Database> {
    conn: DB::Connection,
    born: Instant,
    used: Instant,
}

/// The held connection of one store (see the module's text).
pub(crate) struct Held<DB: Database> {
    slot: Mutex<Option<Kept<DB>>>,
    closed: AtomicBool,
}

/// The held connection, taken for one call; `settle` gives it back (dropped unsettled, as by
/// a call cut off half-way, the connection goes: it may be in the middle of a statement).
pub(crate) struct HeldConn<'a, DB: Database> {
    guard: MutexGuard<'a, Option<Kept<DB>>>,
    settled: bool,
}

impl<DB: Database> Held<DB> {
    pub(crate) fn new() -> Self {
        Held {
            slot: Mutex::new(None),
            closed: AtomicBool::new(false),
        }
    }

    /// The held connection, or None when a call is using it or the store is closed (then use
    /// the pool). The first call (and the first after the connection broke or aged) takes one
    /// from `pool`.
    ///
    /// Errors: those of the pool's acquire (the store is unavailable).
    pub(crate) async fn take(&self, pool: &Pool<DB>) -> Result<Option<HeldConn<'_, DB>>> {
        let Ok(mut guard) = self.slot.try_lock() else {
            return Ok(None);
        };
        if self.closed.load(Ordering::Acquire) {
            return Ok(None);
        }
        if let Some(k) = guard.as_mut() {
            if k.born.elapsed() > MAX_LIFETIME {
                if let Some(k) = guard.take() {
                    let _ = k.conn.close().await;
                }
            } else if k.used.elapsed() > IDLE_PING {
                let alive = tokio::time::timeout(PING_TIMEOUT, k.conn.ping()).await;
                if !matches!(alive, Ok(Ok(()))) {
                    *guard = None;
                }
            }
        }
        if guard.is_none() {
            let conn = pool.acquire().await?.detach();
            let now = Instant::now();
            *guard = Some(Kept {
                conn,
                born: now,
                used: now,
            });
        }
        Ok(Some(HeldConn {
            guard,
            settled: false,
        }))
    }

    /// The first of `held` that is free (`take`), or None when every one is in use or closed.
    ///
    /// Errors: those of the pool's acquire (the store is unavailable).
    pub(crate) async fn take_free<'a>(
        held: &'a [Held<DB>],
        pool: &Pool<DB>,
    ) -> Result<Option<HeldConn<'a, DB>>> {
        for h in held {
            if let Some(c) = h.take(pool).await? {
                return Ok(Some(c));
            }
        }
        Ok(None)
    }

    /// Close the held connection; later calls take the pool (closed too, by then).
    pub(crate) async fn close(&self) {
        self.closed.store(true, Ordering::Release);
        if let Some(k) = self.slot.lock().await.take() {
            let _ = k.conn.close().await;
        }
    }
}

impl<DB: Database> HeldConn<'_, DB> {
    pub(crate) fn conn(&mut self) -> &mut DB::Connection {
        &mut self
            .guard
            .as_mut()
            .expect("a taken held connection is present")
            .conn
    }

    /// Give the connection back after a call that answered `r`: kept after a success, dropped
    /// after an error (the connection may be broken: a server that ends a session answers the
    /// next statement with a database error first, then the socket closes).
    pub(crate) fn settle<T>(self, r: &sqlx::Result<T>) {
        self.settle_ok(r.is_ok());
    }

    /// `settle` after a call of several statements (a transaction) that succeeded or not.
    pub(crate) fn settle_ok(mut self, ok: bool) {
        if let (true, Some(k)) = (ok, self.guard.as_mut()) {
            k.used = Instant::now();
            self.settled = true;
        }
    }
}

impl<DB: Database> Drop for HeldConn<'_, DB> {
    fn drop(&mut self) {
        if !self.settled {
            *self.guard = None;
        }
    }
}

/// `$call` (a statement's future, sent to the executor `$ex`) on `$store`'s held connection
/// when it is free (or on the first free one of the held connections `$store.$held`, a
/// slice), else through its pool; the statement's result, `?` applied.
macro_rules! on_held {
    ($store:expr, $ex:ident => $call:expr) => {
        $crate::store::held::on_held!($store, std::slice::from_ref(&$store.held), $ex => $call)
    };
    ($store:expr, $held:expr, $ex:ident => $call:expr) => {
        match $crate::store::held::Held::take_free($held, &$store.pool).await? {
            Some(mut h) => {
                let r = {
                    let $ex = h.conn();
                    $call
                }
                .await;
                h.settle(&r);
                r?
            }
            None => {
                let $ex = &$store.pool;
                $call.await?
            }
        }
    };
}
pub(crate) use on_held;

/// The held connections' tests (the journal's and the claims'), instantiated in each server
/// engine's `tests.rs` (they reach the store's pool and held connections): `$store` the
/// engine's store type, `$id` the SQL of the connection's server id, `$kill` the statement
/// that ends a connection (`{}`: the id).
#[cfg(test)]
macro_rules! held_connection_tests {
    ($engine:ident, $store:ty, $id:literal, $kill:literal) => {
        use crate::store::journal::JournalStore as _;
        use crate::store::Store as _;

        /// A run's steps go on the held connection: with the pool's only connection taken
        /// elsewhere they are still recorded (through the pool they waited for it, then failed).
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn steps_do_not_wait_for_the_pool() {
            with_store(Engine::$engine, |_, url| async move {
                let s = <$store>::connect(&url, 1).await.unwrap();
                assert_eq!(s.step_put("r", "a", 0, 0, "0").await.unwrap(), None);
                let taken = s.pool.acquire().await.unwrap();
                for i in 1..20 {
                    let v = i.to_string();
                    assert_eq!(s.step_put("r", "a", i, i, &v).await.unwrap(), None);
                }
                let token = 7;
                assert_eq!(s.step_intent("r", "b", 0, 20, token).await.unwrap(), None);
                assert!(s.step_finish("r", "b", 0, token, "\"b\"").await.unwrap());
                drop(taken);
                let kept = s.step_put("r", "a", 3, 3, "9").await.unwrap().unwrap();
                assert_eq!(kept.result.as_deref(), Some("3"));
                s.close().await;
            })
            .await;
        }

        /// The server ends the held connection: the step sent on it at once fails (as on a
        /// pooled connection), the next takes a fresh one; after an idle second the ping
        /// finds it broken and no step fails.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_held_connection_the_server_ended_is_replaced() {
            with_store(Engine::$engine, |_, url| async move {
                let s = <$store>::connect(&url, 2).await.unwrap();
                async fn kill(s: &$store) {
                    let mut h = s.held.take(&s.pool).await.unwrap().unwrap();
                    let id = sqlx::query_scalar::<_, i64>($id).fetch_one(h.conn()).await;
                    h.settle(&id);
                    let sql = format!($kill, id.unwrap());
                    sqlx::Executor::execute(&s.pool, sql.as_str())
                        .await
                        .unwrap();
                }
                assert_eq!(s.step_put("r", "a", 0, 0, "0").await.unwrap(), None);
                kill(&s).await;
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                let _ = s.step_put("r", "a", 1, 1, "1").await;
                assert_eq!(s.step_put("r", "a", 2, 2, "2").await.unwrap(), None);
                kill(&s).await;
                tokio::time::sleep(std::time::Duration::from_millis(1_200)).await;
                assert_eq!(s.step_put("r", "a", 3, 3, "3").await.unwrap(), None);
                for n in [0, 2, 3] {
                    let row = s.step_get("r", "a", n).await.unwrap().unwrap();
                    assert_eq!(row.result, Some(n.to_string()));
                }
                s.close().await;
            })
            .await;
        }

        /// A worker's claims go on the store's two held claim connections: once they are open,
        /// with the pool's only connection taken elsewhere, two claims in flight at once are
        /// both served, and so is the next one, which carries their outcomes (through the pool
        /// they would wait for it, then fail).
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn claims_do_not_wait_for_the_pool() {
            use crate::model::ClaimRequest;
            use crate::store::suite;
            use crate::store::QueueStore as _;
            with_store(Engine::$engine, |s, url| async move {
                let jobs: Vec<_> = (0..6).map(|i| suite::job(&format!("o{i}"), "j")).collect();
                s.enqueue(&jobs).await.unwrap();
                let store = <$store>::connect(&url, 1).await.unwrap();
                use tokio::time::timeout as in_time;
                let t = std::time::Duration::from_secs(5);
                // No probe first (a probe is a statement through the pool, as a worker's claim
                // that carries no outcomes may send).
                let req = ClaimRequest {
                    probe: false,
                    ..suite::req(1, 60_000)
                };
                let mut got = vec![];
                for pool_taken in [false, true] {
                    // The first pair opens the held connections (each from the pool, then
                    // detached).
                    let taken = if pool_taken {
                        Some(store.pool.acquire().await.unwrap())
                    } else {
                        None
                    };
                    let (a, b) = tokio::join!(
                        in_time(t, store.claim(&[], &req)),
                        in_time(t, store.claim(&[], &req))
                    );
                    got.extend(a.expect("a claim waited").unwrap());
                    got.extend(b.expect("a claim waited").unwrap());
                    if pool_taken {
                        let done: Vec<_> = got.iter().map(|j| suite::done(j, "null")).collect();
                        let req = ClaimRequest {
                            limit: 6,
                            ..req.clone()
                        };
                        let c = in_time(t, store.claim(&done, &req))
                            .await
                            .expect("a claim waited")
                            .unwrap();
                        // Two claims at once may find each other's lanes locked (SKIP LOCKED):
                        // the jobs they left are the last one's.
                        assert_eq!(c.len(), 6 - got.len(), "{got:?} {c:?}");
                    }
                    drop(taken);
                }
                assert!(got.len() >= 2, "{got:?}");
                let mut states = vec![];
                for i in 0..6 {
                    let row = s.get_job(&format!("o{i}"), "j").await.unwrap().unwrap();
                    states.push(row.state);
                }
                let done = states.iter().filter(|st| st.as_str() == "done").count();
                let running = states.iter().filter(|st| st.as_str() == "running").count();
                assert_eq!((done, running), (got.len(), 6 - got.len()), "{states:?}");
                store.close().await;
            })
            .await;
        }
    };
}
#[cfg(test)]
pub(crate) use held_connection_tests;
