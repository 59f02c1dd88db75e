//! The queue's churning small tables, vacuumed by the store that churns them (Postgres).
//!
//! Every claim rewrites the lanes it serves (`gnl_lanes`: a new turn ticket, so a new entry in
//! the turn index, `gnl_lanes_turn`) and inserts and deletes lease records (`gnl_leases`).
//! Postgres keeps the old index entries until a VACUUM removes them, and they gather where
//! the next claim starts reading: an old ticket sorts before every live one, an old lease's
//! end before every live one. A claim steps over all of them. Autovacuum looks at a database
//! at most once a `autovacuum_naptime` (1 minute by default), and a worker over 1,000
//! organizations rewrites ~10,000 lanes a second: a sustained drain of 200,000 jobs at C=10
//! slowed from 5,300 to 2,200 jobs/s within the minute (a claim 1.8 -> 4.9 ms), and ran flat
//! at ~5,400 with these two tables vacuumed every second (benches/RESULTS.md, 2026-12-07).
//!
//! So a store whose calls wrote lanes or lease records vacuums them itself, in a task beside
//! its calls (never in one): at most once every `VACUUM_EVERY`, or every `COST_SHARE` times
//! the last vacuum's duration when that is longer (a vacuum takes at most ~2% of the time of
//! one server backend, however big the tables grow); and not when any process vacuumed them
//! (or autovacuum did) within that interval, which one look at the tables' statistics tells
//! before. `VACUUM (SKIP_LOCKED)`: a vacuum that finds a table locked (another vacuum, a
//! migration) skips it rather than waits. Only a role allowed to vacuum them (their owner, a
//! member of its role, a superuser) does: a role that is not is seen at the first look and
//! never tries again (its tables are left to autovacuum; docs/engines.md). A failed look or
//! vacuum (the store away) is tried again at the next interval. MySQL (InnoDB's purge runs
//! all the time) and SQLite (no dead row versions) need none of this.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::postgres::PgPool;

/// The shortest time between two vacuums of the tables by any process.
pub(super) const VACUUM_EVERY: Duration = Duration::from_secs(1);
/// A vacuum waits at least this many times the last one's duration after it.
const COST_SHARE: u64 = 50;

/// Whether this store's role may vacuum the tables (owner, member of the owner's role with
/// its privileges, superuser), and how long ago any process (or autovacuum) last vacuumed
/// `gnl_lanes`, in ms (NULL: never). No row: the store has no queue tables yet.
const LOOK: &str = "SELECT pg_has_role(c.relowner, 'USAGE'), \
     (extract(epoch FROM clock_timestamp() - greatest(s.last_vacuum, s.last_autovacuum)) \
      * 1000)::bigint \
     FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid \
     WHERE c.oid = to_regclass('gnl_lanes')";

/// Both tables, one statement (the simple protocol: VACUUM runs outside a transaction).
/// `INDEX_CLEANUP ON`: since Postgres 14 a vacuum skips the indexes when few heap pages hold
/// dead rows, and the entries to remove are those the claims read first. `TRUNCATE OFF`: the
/// tables' empty last pages are filled again within the second, and cutting them off takes
/// the table's ACCESS EXCLUSIVE lock (every claim waits meanwhile) or, while claims hold
/// their locks, retries for up to 5 s (seen as `VacuumTruncate` waits during a drain).
const VACUUM: &str = "VACUUM (SKIP_LOCKED, INDEX_CLEANUP ON, TRUNCATE OFF) gnl_lanes, gnl_leases";

/// When this store last vacuumed (or looked), and whether it may (see the module's text).
pub(super) struct Vacuum {
    state: Arc<State>,
}

struct State {
    started: Instant,
    every: Duration,
    /// The next look, in ms since `started` (0: at the first writes).
    next: AtomicU64,
    /// A look or a vacuum is in flight.
    running: AtomicBool,
    /// A look found that this store's role may not vacuum the tables: it never looks again.
    may_not: AtomicBool,
    /// Vacuums this store ran (tests).
    ran: AtomicU64,
}

impl Vacuum {
    /// `every`: `VACUUM_EVERY` (tests: shorter).
    pub(super) fn new(every: Duration) -> Self {
        Vacuum {
            state: Arc::new(State {
                started: Instant::now(),
                every,
                next: AtomicU64::new(0),
                running: AtomicBool::new(false),
                may_not: AtomicBool::new(false),
                ran: AtomicU64::new(0),
            }),
        }
    }

    /// A call of this store wrote lanes or lease records: when a vacuum may be due, look (and
    /// vacuum) in a task of its own on `pool`; its statements count in `queries`. Costs one
    /// clock read otherwise.
    pub(super) fn after_writes(&self, pool: &PgPool, queries: &Arc<AtomicU64>) {
        let s = &self.state;
        if s.may_not.load(Ordering::Relaxed)
            || s.ms() < s.next.load(Ordering::Relaxed)
            || s.running.swap(true, Ordering::Acquire)
        {
            return;
        }
        if tokio::runtime::Handle::try_current().is_err() {
            s.running.store(false, Ordering::Release);
            return;
        }
        let (pool, queries, state) = (pool.clone(), queries.clone(), s.clone());
        tokio::spawn(async move {
            let wait = state.look_and_vacuum(&pool, &queries).await;
            state
                .next
                .store(state.ms() + wait.as_millis() as u64, Ordering::Relaxed);
            state.running.store(false, Ordering::Release);
        });
    }

    /// Vacuums this store ran.
    #[cfg(test)]
    pub(super) fn ran(&self) -> u64 {
        self.state.ran.load(Ordering::Relaxed)
    }

    /// Whether a look found that this store's role may not vacuum the tables.
    #[cfg(test)]
    pub(super) fn may_not(&self) -> bool {
        self.state.may_not.load(Ordering::Relaxed)
    }
}

impl State {
    fn ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// One look, and a vacuum when it is due; returns how long to wait before the next look.
    async fn look_and_vacuum(&self, pool: &PgPool, queries: &AtomicU64) -> Duration {
        if pool.is_closed() {
            return self.every;
        }
        queries.fetch_add(1, Ordering::Relaxed);
        let look: Option<(bool, Option<i64>)> =
            match sqlx::query_as(LOOK).fetch_optional(pool).await {
                Ok(r) => r,
                Err(_) => return self.every,
            };
        let Some((may, since)) = look else {
            return self.every;
        };
        if !may {
            self.may_not.store(true, Ordering::Relaxed);
            return self.every;
        }
        let every = self.every.as_millis() as i64;
        if let Some(since) = since.filter(|&ms| (0..every).contains(&ms)) {
            // Vacuumed lately (by another process, or autovacuum): look again when the
            // interval since that vacuum has passed.
            return Duration::from_millis((every - since) as u64);
        }
        queries.fetch_add(1, Ordering::Relaxed);
        let t0 = Instant::now();
        if sqlx::raw_sql(VACUUM).execute(pool).await.is_err() {
            return self.every;
        }
        self.ran.fetch_add(1, Ordering::Relaxed);
        self.every.max(t0.elapsed() * COST_SHARE as u32)
    }
}
