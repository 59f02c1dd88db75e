//! The Postgres queue (`QueueStore`): enqueue (`COPY`, or `INSERT … SELECT FROM unnest(…)`,
//! under the enqueue locks), claims and outcomes in one statement (`gnl_claim`, `FOR UPDATE
//! SKIP LOCKED`), renewals of leases and their lease records, listings, retry and cancel.

use std::borrow::Cow;
use std::collections::BTreeMap;

use async_trait::async_trait;
use sqlx::Row;

use super::{pg_text, PostgresStore, Tx};
use crate::error::{Error, Result};
use crate::model::*;
use crate::store::held::on_held;
use crate::store::queue::{append_part, job_counts, job_row, receive_all, JOB_COLS};
use crate::store::{Part, PartReceiver, QueueStore};

/// One `INSERT … SELECT FROM unnest(…)` carries at most this many jobs / bytes of job text.
const CHUNK_ROWS: usize = 50_000;

const CHUNK_BYTES: usize = 64 << 20;

/// Batches of at least this many jobs are written with `COPY` (fewer: one statement).
const COPY_MIN_ROWS: usize = 1_000;

/// `COPY` data is sent in messages of about this size (the batch is never encoded whole).
const COPY_SEND_BYTES: usize = 256 << 10;

const COPY_JOBS: &str =
    "COPY gnl_jobs (org, id, type, payload, run_at, in_order, state, created_at, updated_at) \
                         FROM STDIN (FORMAT binary)";

/// SQLSTATE unique_violation.
const UNIQUE_VIOLATION: &str = "23505";

/// Whether a lane of one of the job types $1 has a due job: a lane in the turn, or a waiting
/// lane whose next_run_at has come (index seeks, two per type, whatever the number of lanes).
macro_rules! some_due {
    () => {
        concat!(
            "(EXISTS (SELECT 1 FROM gnl_lanes WHERE due AND type = ANY ($1::text[])) OR coalesce(\
              (SELECT min(w.m) FROM unnest($1::text[]) AS t(type) CROSS JOIN LATERAL \
                 (SELECT min(next_run_at) AS m FROM gnl_lanes \
                  WHERE NOT due AND type = t.type AND next_run_at IS NOT NULL) w) <= ",
            now_ms!(),
            ", false))"
        )
    };
}

/// The empty poll for the job types $1: one read, index seeks only (two per type and one),
/// whatever the number of lanes.
pub(super) const PRECHECK: &str = concat!(
    "SELECT ",
    some_due!(),
    ", coalesce((SELECT min(expires_at) FROM gnl_leases) < ",
    now_ms!(),
    ", false)"
);

/// A claim in one round trip (`gnl_claim`, migration 0002): outcomes (done: $1-$3 and $13
/// orgs, failed: $4-$7 and $14 orgs), then, when $8, expired leases, then up to $9 due jobs, lanes in turn, claimed with
/// max_attempts $10, a lease of $11 ms and holder $12 ($9 = 0: no claim), of the types $15, at most $16 an organization (0: no cap; migration 0009; < 0: uncapped, waiting for the lanes a claim in flight holds, migration 0011). Each outcome is
/// conditional on (seq, token, state running), so a stale holder's late outcome changes
/// nothing. Called as one statement it is one transaction; inside it every statement takes a
/// fresh snapshot, so the job claim (after the lane pick) sees every job committed before the
/// lanes were locked (see the migration).
const CLAIM: &str = "SELECT seq, lease_token, org, id, type, payload, attempts, run_at \
     FROM gnl_claim($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)";

/// The jobs of an enqueue from six arrays ($1 org, $2 id, $3 type, $4 payload, $5 run_at,
/// $6 delay_ms); an id already present is skipped. A job due at the server's clock (no
/// run_at, no delay) is `in_order`: its lane's head finds it, the due index does not hold it. `$gate` is
/// a condition on the whole statement (see `enqueue_one!`).
macro_rules! insert_jobs {
    ($gate:literal) => {
        concat!(
            "INSERT INTO gnl_jobs (org, id, type, payload, run_at, in_order, state, created_at, updated_at)
             SELECT u.o, u.i, u.t, u.p, coalesce(u.r, ",
            now_ms!(),
            " + u.d), coalesce(u.r, ",
            now_ms!(),
            " + u.d) = ",
            now_ms!(),
            ", 'pending', ",
            now_ms!(),
            ", ",
            now_ms!(),
            "
             FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::bigint[])
                  AS u(o, i, t, p, r, d)",
            $gate,
            "
             ON CONFLICT (id, org) DO NOTHING"
        )
    };
}

const INSERT_JOBS: &str = insert_jobs!("");

/// Enqueue locks: transaction-level advisory locks that only enqueues take, from before their
/// jobs get seqs until they commit. Enqueues into one lane so commit in seq order, which the
/// lanes' heads rely on (migration 0001); claims never take them, so an enqueue in flight never
/// keeps a lane from being served. A batch of at most `LANE_LOCKS_MAX` lanes takes the
/// gnl-wide lock shared, then each lane's lock in org order (`lock_each_lane!`); a batch of
/// more lanes, whose locks would crowd the server's lock table (64 a connection by default),
/// takes the gnl-wide lock alone, exclusively (`lock_all_lanes!`). Each is a CTE `lk` of one
/// row over the organizations $1; reading it takes the locks.
const LANE_LOCKS_MAX: usize = 32;

macro_rules! lock_each_lane {
    () => {
        "lk AS (
           SELECT count(pg_advisory_xact_lock(hashtextextended('gnl_lane:' || current_schema() || ':' || k.o, 0)))
           FROM (SELECT DISTINCT o FROM unnest($1::text[]) AS o ORDER BY o) AS k
           WHERE (SELECT count(pg_advisory_xact_lock_shared(hashtextextended('gnl_lanes:' || current_schema(), 0)))) >= 0
         )"
    };
}

macro_rules! lock_all_lanes {
    () => {
        "lk AS (
           SELECT count(pg_advisory_xact_lock(hashtextextended('gnl_lanes:' || current_schema(), 0)))
           WHERE cardinality($1::text[]) >= 0
         )"
    };
}

/// A whole enqueue in one statement: the enqueue locks, then the jobs (their `WHERE` waits for
/// the locks), then their lanes (from the rows actually inserted).
///
/// A new lane reads its organization's turn ticket as `max(served_at + 0)` (here and in
/// `ENQUEUE_LANES`): over the bare column the planner may answer `max()` by walking
/// `gnl_lanes_served` backward, filtered by organization, and did after a bulk enqueue with
/// the statistics not gathered yet: a walk over every lane for each lane enqueued into (an
/// enqueue of 1,000,000 jobs over 10,000 organizations took 15 minutes). The expression
/// is no indexed column, so the organization's few lanes are read by the key.
macro_rules! enqueue_one {
    ($lock:expr) => {
        concat!(
            "WITH ",
            $lock,
            ",
             ins AS (",
            insert_jobs!(
                "
             WHERE (SELECT * FROM lk) >= 0"
            ),
            "
               RETURNING org, type, seq, run_at
             ),
             ln AS (
               INSERT INTO gnl_lanes (org, type, next_run_at, served_at, head)
               SELECT i.org, i.type, min(i.run_at),
                      coalesce((SELECT max(x.served_at + 0) FROM gnl_lanes x WHERE x.org = i.org), 0),
                      min(i.seq)
               FROM ins i GROUP BY i.org, i.type ORDER BY i.org, i.type
               ON CONFLICT (org, type) DO UPDATE SET next_run_at = least(gnl_lanes.next_run_at, excluded.next_run_at)
             )
             SELECT count(*) FROM ins"
        )
    };
}

/// Before a multi-statement enqueue writes its jobs: the enqueue locks of $1's organizations
/// and the server's clock (the `now` of the jobs' rows).
macro_rules! enqueue_lock {
    ($lock:expr) => {
        concat!(
            "WITH ",
            $lock,
            " SELECT ",
            now_ms!(),
            ", (SELECT * FROM lk)"
        )
    };
}

/// The enqueue statements, with the locks of each lane or of all (`LANE_LOCKS_MAX`).
pub(super) const ENQUEUE_ONE: [&str; 2] = [
    enqueue_one!(lock_each_lane!()),
    enqueue_one!(lock_all_lanes!()),
];

const ENQUEUE_LOCK: [&str; 2] = [
    enqueue_lock!(lock_each_lane!()),
    enqueue_lock!(lock_all_lanes!()),
];

/// Which of `ENQUEUE_ONE` / `ENQUEUE_LOCK` a batch of `lanes` lanes takes: 1 (the gnl-wide
/// lock alone) past `LANE_LOCKS_MAX`.
fn lock_kind(lanes: usize) -> usize {
    usize::from(lanes > LANE_LOCKS_MAX)
}

/// A batch's organizations, sorted.
fn org_names(jobs: &JobBatch) -> Vec<&str> {
    jobs.lanes().into_iter().map(|(o, _)| o).collect()
}

/// What `enqueue_copy` writes: a batch, or one arriving in parts (kept in `got`).
enum Feed<'a> {
    Whole(&'a JobBatch),
    Parts {
        parts: &'a mut PartReceiver,
        /// The parts received so far.
        got: &'a mut Vec<JobBatch>,
        /// Set when `Part::End` was received (`got` is the whole batch).
        whole: &'a mut bool,
    },
}

/// After a multi-statement enqueue wrote its jobs: the lanes ($1 orgs, $2 types, $3 each one's
/// earliest due instant). A new lane takes its organization's turn ticket, and its highest
/// head as its own (every job of this enqueue comes after it: the enqueue holds the
/// organization's enqueue lock, and a head is never past the organization's last job + 1).
pub(super) const ENQUEUE_LANES: &str = "INSERT INTO gnl_lanes (org, type, next_run_at, served_at, head)
     SELECT u.o, u.t, u.a,
            coalesce((SELECT max(x.served_at + 0) FROM gnl_lanes x WHERE x.org = u.o), 0),
            coalesce((SELECT max(x.head) FROM gnl_lanes x WHERE x.org = u.o), 0)
     FROM unnest($1::text[], $2::text[], $3::bigint[]) AS u(o, t, a)
     ORDER BY u.o COLLATE \"C\", u.t COLLATE \"C\"
     ON CONFLICT (org, type) DO UPDATE SET next_run_at = least(gnl_lanes.next_run_at, excluded.next_run_at)";

/// The pending depth of each organization in $1: its in_order jobs from its head, and the
/// others from the due index. It runs after the enqueue wrote its jobs and lanes, holding the
/// organizations' enqueue locks: an enqueue into the same organization waits for this
/// transaction, and this statement sees every one that committed before, so the check is exact.
const DEPTHS: &str =
    "SELECT d.o,
       (SELECT count(*) FROM gnl_lanes x JOIN gnl_jobs g ON g.org = x.org AND g.seq >= x.head
        WHERE x.org = d.o AND g.type = x.type AND g.state = 'pending' AND g.in_order)
     + (SELECT count(*) FROM gnl_jobs g WHERE g.org = d.o AND g.state = 'pending' AND NOT g.in_order)
     FROM unnest($1::text[]) AS d(o)";

/// Renewal: the jobs still held (seq $1, token $2, org $4) get a lease of $3 ms from the
/// server's clock; then their lease records (locked in id order, after the job rows, as
/// everywhere: migration 0001) end with the earliest lease of their running jobs: the new
/// one, or that of a job of the record this renewal leaves out (a worker renews every job it
/// still holds; one whose handler returned is no longer renewed), so an expired record always
/// names an expired job. A job's row is written first: a reclaim that meets it locked skips
/// it, and one that meets the new row finds its lease not expired. (The records are read in
/// the statement's snapshot, which does not see the new leases: those jobs are left out by
/// key. A job finished since then still counts with its old lease, which at worst lets a
/// reclaim look at the record early and set it right.)
const RENEW: &str = concat!(
    "WITH j AS (
       UPDATE gnl_jobs g SET lease_expires_at = ",
    now_ms!(),
    " + $3
       FROM unnest($1::bigint[], $2::bigint[], $4::text[]) AS l(seq, tok, org)
       WHERE g.org = l.org AND g.seq = l.seq AND g.lease_token = l.tok AND g.state = 'running'
       RETURNING g.org, g.seq, g.cancel_requested, g.lease_id
     ),
     k AS (
       SELECT x.id, x.orgs, x.seqs FROM gnl_leases x WHERE x.id IN (SELECT j.lease_id FROM j)
       ORDER BY x.id FOR UPDATE
     ),
     u AS (
       UPDATE gnl_leases x SET expires_at = least(",
    now_ms!(),
    " + $3, (
         SELECT min(g.lease_expires_at) FROM unnest(k.orgs, k.seqs) AS q(org, seq)
         JOIN gnl_jobs g ON g.org = q.org AND g.seq = q.seq
         WHERE g.lease_id = k.id AND g.state = 'running'
           AND NOT EXISTS (SELECT 1 FROM j WHERE j.org = g.org AND j.seq = g.seq)))
       FROM k WHERE x.id = k.id
     )
     SELECT j.seq, j.cancel_requested FROM j"
);

const RETRY: &str = concat!(
    "WITH r AS (
       UPDATE gnl_jobs SET state = 'pending', in_order = false, attempts = 0, run_at = ",
    now_ms!(),
    ", updated_at = ",
    now_ms!(),
    ",
         finished_at = NULL, cancel_requested = false
       WHERE org = $1 AND id = $2 AND state = 'dead'
       RETURNING org, type, run_at
     ),
     ln AS (
       INSERT INTO gnl_lanes (org, type, next_run_at, served_at) SELECT org, type, run_at, 0 FROM r
       ON CONFLICT (org, type) DO UPDATE SET next_run_at = least(gnl_lanes.next_run_at, excluded.next_run_at)
     )
     SELECT count(*) FROM r"
);

const CANCEL: &str = concat!(
    "UPDATE gnl_jobs SET
       state = CASE WHEN state = 'pending' THEN 'canceled' ELSE state END,
       in_order = in_order OR state = 'pending',
       finished_at = CASE WHEN state = 'pending' THEN ",
    now_ms!(),
    " ELSE finished_at END,
       cancel_requested = true, last_error = $3, updated_at = ",
    now_ms!(),
    "
     WHERE org = $1 AND id = $2 AND state IN ('pending', 'running')"
);

impl PostgresStore {
    /// Write outcomes, (when `reclaim`) take back expired leases, and claim up to `limit` jobs,
    /// in one statement (`gnl_claim`).
    async fn claim_call(
        &self,
        outcomes: &[Outcome],
        reclaim: bool,
        limit: usize,
        req: Option<&ClaimRequest>,
    ) -> Result<Vec<ClaimedJob>> {
        let (mut d_seq, mut d_tok, mut d_res, mut d_org) = (vec![], vec![], vec![], vec![]);
        let (mut f_seq, mut f_tok, mut f_err, mut f_delay, mut f_org) =
            (vec![], vec![], vec![], vec![], vec![]);
        for o in outcomes {
            match o {
                Outcome::Done {
                    seq,
                    token,
                    org,
                    result,
                } => {
                    d_seq.push(*seq);
                    d_tok.push(*token);
                    d_res.push(result.as_deref());
                    d_org.push(org.as_str());
                }
                Outcome::Failed {
                    seq,
                    token,
                    org,
                    error,
                    delay_ms,
                } => {
                    f_seq.push(*seq);
                    f_tok.push(*token);
                    f_err.push(pg_text(error));
                    f_delay.push(*delay_ms);
                    f_org.push(org.as_str());
                }
            }
        }
        let (max_attempts, ttl_ms, owner, types, per_org) = match req {
            Some(r) => (
                r.max_attempts,
                r.ttl_ms,
                pg_text(&r.owner),
                r.types.as_slice(),
                // Migration 0011: < 0 waits for the lanes (uncapped).
                if r.wait_lanes { -1 } else { r.per_org as i64 },
            ),
            None => (0, 0, Cow::Borrowed(""), &[][..], 0),
        };
        self.counted(1);
        let q = sqlx::query(CLAIM)
            .bind(d_seq)
            .bind(d_tok)
            .bind(d_res)
            .bind(f_seq)
            .bind(f_tok)
            .bind(f_err)
            .bind(f_delay)
            .bind(reclaim)
            .bind(limit as i64)
            .bind(max_attempts)
            .bind(ttl_ms)
            .bind(owner)
            .bind(d_org)
            .bind(f_org)
            .bind(types)
            .bind(per_org);
        // A worker keeps up to two claims in flight: each takes a held connection that is free.
        let rows = on_held!(self, &self.claims, ex => q.fetch_all(ex));
        if !rows.is_empty() || !outcomes.is_empty() {
            // It rewrote lanes and lease records (`super::vacuum`).
            self.vacuum.after_writes(&self.pool, &self.queries);
        }
        Ok(rows
            .iter()
            .map(|r| ClaimedJob {
                seq: r.get(0),
                token: r.get(1),
                org: r.get(2),
                id: r.get(3),
                typ: r.get(4),
                payload: r.get(5),
                attempt: r.get(6),
                run_at: r.get(7),
            })
            .collect())
    }
}

impl PostgresStore {
    /// Insert a batch with `COPY … FROM STDIN (FORMAT binary)`, streamed in messages of
    /// `COPY_SEND_BYTES` as its jobs are encoded (or, from `Feed::Parts`, as its parts
    /// arrive), then the lanes, in one transaction. `COPY` has no `ON CONFLICT`: when an id is
    /// taken (or repeated in the batch) the transaction is rolled back and `false` returned:
    /// the caller then takes `enqueue_unnest`, which skips taken ids. So does a part holding an
    /// organization outside `orgs` (its enqueue lock was not taken).
    async fn enqueue_copy(&self, orgs: &[&str], mut feed: Feed<'_>) -> Result<bool> {
        let mut tx = self.begin().await?;
        let now = self.lock_lanes(&mut tx, orgs).await?;
        self.counted(1);
        let mut copy = tx.copy_in_raw(COPY_JOBS).await?;
        let mut buf = Vec::with_capacity(COPY_SEND_BYTES + 4096);
        buf.extend_from_slice(copy_binary::HEADER);
        // Every organization's lock is held when each lane's is (else the gnl-wide one is).
        let locked = |org: &str| lock_kind(orgs.len()) == 1 || orgs.binary_search(&org).is_ok();
        let (mut unlocked, mut abandoned) = (false, false);
        match &mut feed {
            Feed::Whole(jobs) => {
                for j in jobs.iter() {
                    copy_binary::row(&mut buf, &j, now);
                    if buf.len() >= COPY_SEND_BYTES {
                        copy.send(buf.as_slice()).await?;
                        buf.clear();
                    }
                }
            }
            Feed::Parts { parts, got, whole } => loop {
                match parts.recv().await {
                    Some(Part::Jobs(part)) => {
                        // Kept first: `got` must be whole whatever fails below.
                        got.push(*part);
                        for j in got[got.len() - 1].iter() {
                            unlocked |= !locked(j.org);
                            copy_binary::row(&mut buf, &j, now);
                            if buf.len() >= COPY_SEND_BYTES {
                                copy.send(buf.as_slice()).await?;
                                buf.clear();
                            }
                        }
                        if unlocked {
                            break;
                        }
                    }
                    Some(Part::End) => {
                        **whole = true;
                        break;
                    }
                    None => {
                        abandoned = true;
                        break;
                    }
                }
            },
        }
        buf.extend_from_slice(copy_binary::TRAILER);
        copy.send(buf.as_slice()).await?;
        drop(buf);
        // Abandoned, or an organization without its lock: the COPY is ended the normal way,
        // then rolled back. (`CopyFail` is not used: when the server had already refused the
        // data, sqlx's abort returns that error one ReadyForQuery early, and the pooled
        // connection would answer every later statement with the one before's reply.)
        if abandoned || unlocked {
            match copy.finish().await {
                Ok(_) | Err(sqlx::Error::Database(_)) => {}
                Err(e) => return Err(e.into()),
            }
            self.rollback(tx).await?;
            return if abandoned {
                Err(Error::Abandoned)
            } else {
                Ok(false)
            };
        }
        match copy.finish().await {
            Ok(_) => {}
            Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some(UNIQUE_VIOLATION) => {
                self.rollback(tx).await?;
                return Ok(false);
            }
            Err(e) => return Err(e.into()),
        }
        let (lanes, type_lanes) = match feed {
            Feed::Whole(jobs) => (jobs.lanes(), jobs.type_lanes()),
            Feed::Parts { got, .. } => (lanes_of(got.iter()), type_lanes_of(got.iter())),
        };
        self.upsert_lanes(&mut tx, &type_lanes, now).await?;
        self.check_limits(&mut tx, &lanes).await?;
        self.commit(tx).await?;
        Ok(true)
    }

    /// Take the enqueue locks of the organizations `orgs` (sorted, distinct; `lock_each_lane!`
    /// or `lock_all_lanes!`); returns the server's clock.
    async fn lock_lanes(&self, tx: &mut Tx, orgs: &[&str]) -> Result<i64> {
        self.counted(1);
        let (now, _): (i64, i64) = sqlx::query_as(ENQUEUE_LOCK[lock_kind(orgs.len())])
            .bind(orgs)
            .fetch_one(&mut **tx)
            .await?;
        Ok(now)
    }

    /// Upsert the batch's lanes, lowering each one's next_run_at to its jobs' earliest due
    /// instant, with `now` the clock `lock_lanes` read: no later than any of the jobs' rows
    /// read it, so the bound is never above a job's run_at.
    async fn upsert_lanes(
        &self,
        tx: &mut Tx,
        lanes: &[(&str, &str, LaneSummary)],
        now: i64,
    ) -> Result<()> {
        let orgs: Vec<&str> = lanes.iter().map(|(o, _, _)| *o).collect();
        let types: Vec<&str> = lanes.iter().map(|(_, t, _)| *t).collect();
        let due: Vec<i64> = lanes.iter().map(|(_, _, l)| l.earliest(now)).collect();
        self.counted(1);
        sqlx::query(ENQUEUE_LANES)
            .bind(orgs)
            .bind(types)
            .bind(due)
            .execute(&mut **tx)
            .await?;
        Ok(())
    }

    /// Insert a batch with `INSERT … SELECT FROM unnest(…) ON CONFLICT DO NOTHING` (taken ids
    /// are skipped): one statement when it fits `CHUNK_ROWS`/`CHUNK_BYTES` and asks no
    /// `max_depth`, else several in one transaction.
    async fn enqueue_unnest(&self, jobs: &JobBatch) -> Result<()> {
        let parts = chunks(jobs);
        let lanes = jobs.lanes();
        let one = ENQUEUE_ONE[lock_kind(lanes.len())];
        if parts.len() == 1 && !jobs.has_limits() {
            // One statement is one transaction.
            let (o, i, t, p, r, d) = job_arrays(jobs, 0..jobs.len());
            self.counted(1);
            sqlx::query(one)
                .bind(o)
                .bind(i)
                .bind(t)
                .bind(p)
                .bind(r)
                .bind(d)
                .fetch_one(&self.pool)
                .await?;
            return Ok(());
        }
        let mut tx = self.begin().await?;
        if parts.len() == 1 {
            let (o, i, t, p, r, d) = job_arrays(jobs, 0..jobs.len());
            self.counted(1);
            sqlx::query(one)
                .bind(o)
                .bind(i)
                .bind(t)
                .bind(p)
                .bind(r)
                .bind(d)
                .fetch_one(&mut *tx)
                .await?;
        } else {
            let orgs: Vec<&str> = lanes.iter().map(|(o, _)| *o).collect();
            let now = self.lock_lanes(&mut tx, &orgs).await?;
            for part in parts {
                let (o, i, t, p, r, d) = job_arrays(jobs, part);
                self.counted(1);
                sqlx::query(INSERT_JOBS)
                    .bind(o)
                    .bind(i)
                    .bind(t)
                    .bind(p)
                    .bind(r)
                    .bind(d)
                    .execute(&mut *tx)
                    .await?;
            }
            self.upsert_lanes(&mut tx, &jobs.type_lanes(), now).await?;
        }
        self.check_limits(&mut tx, &lanes).await?;
        self.commit(tx).await
    }

    /// When the batch asks for `max_depth`s: `QueueFull` (the transaction rolled back) for the
    /// first organization, in name order, whose pending depth now exceeds its limit.
    async fn check_limits(&self, tx: &mut Tx, lanes: &[(&str, LaneSummary)]) -> Result<()> {
        let limits: BTreeMap<&str, i64> = lanes
            .iter()
            .filter_map(|(o, l)| l.max_depth.map(|m| (*o, m)))
            .collect();
        if limits.is_empty() {
            return Ok(());
        }
        let limit_orgs: Vec<&str> = limits.keys().copied().collect();
        self.counted(1);
        let depths: Vec<(String, i64)> = sqlx::query_as(DEPTHS)
            .bind(limit_orgs)
            .fetch_all(&mut **tx)
            .await?;
        check_depths(&depths, &limits)
    }
}

/// Split a batch into statements of at most `CHUNK_ROWS` rows and `CHUNK_BYTES` bytes of text.
fn chunks(jobs: &JobBatch) -> Vec<std::ops::Range<usize>> {
    let mut out = vec![];
    let (mut start, mut bytes) = (0, 0);
    for i in 0..jobs.len() {
        let b = jobs.text_len(i) + 32;
        if i > start && (i - start >= CHUNK_ROWS || bytes + b > CHUNK_BYTES) {
            out.push(start..i);
            start = i;
            bytes = 0;
        }
        bytes += b;
    }
    out.push(start..jobs.len());
    out
}

/// The column arrays of one `INSERT … SELECT FROM unnest(…)`: org, id, type, payload,
/// absolute run_at, delay (the server adds its clock).
#[allow(clippy::type_complexity)]
fn job_arrays(
    jobs: &JobBatch,
    range: std::ops::Range<usize>,
) -> (
    Vec<&str>,
    Vec<&str>,
    Vec<&str>,
    Vec<&str>,
    Vec<Option<i64>>,
    Vec<i64>,
) {
    let n = range.len();
    let (mut o, mut i, mut t, mut p, mut r, mut d) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    for k in range {
        let j = jobs.get(k);
        o.push(j.org);
        i.push(j.id);
        t.push(j.typ);
        p.push(j.payload);
        let (at, after) = match j.due {
            Due::At(a) => (Some(a), 0),
            Due::After(x) => (None, x),
            Due::Now => (None, 0),
        };
        r.push(at);
        d.push(after);
    }
    (o, i, t, p, r, d)
}

/// COPY's binary format (PostgreSQL docs, "COPY", "Binary Format"): a header, then per row a
/// field count and each field as a length and its bytes (`text` and `json` as UTF-8, `bigint`
/// as 8 bytes big-endian, `boolean` as one byte), then a trailer.
mod copy_binary {
    pub const HEADER: &[u8] = b"PGCOPY\n\xff\r\n\0\0\0\0\0\0\0\0\0";
    pub const TRAILER: &[u8] = &[0xff, 0xff];

    pub fn fields(buf: &mut Vec<u8>, n: i16) {
        buf.extend_from_slice(&n.to_be_bytes());
    }

    pub fn text(buf: &mut Vec<u8>, s: &str) {
        buf.extend_from_slice(&(s.len() as i32).to_be_bytes());
        buf.extend_from_slice(s.as_bytes());
    }

    pub fn int8(buf: &mut Vec<u8>, v: i64) {
        buf.extend_from_slice(&8i32.to_be_bytes());
        buf.extend_from_slice(&v.to_be_bytes());
    }

    pub fn boolean(buf: &mut Vec<u8>, v: bool) {
        buf.extend_from_slice(&1i32.to_be_bytes());
        buf.push(v as u8);
    }

    /// One job's row of `COPY_JOBS`, with the server's clock `now`: a job due at it is
    /// `in_order`.
    pub fn row(buf: &mut Vec<u8>, j: &crate::model::JobRef<'_>, now: i64) {
        let run_at = j.due.at(now);
        fields(buf, 9);
        text(buf, j.org);
        text(buf, j.id);
        text(buf, j.typ);
        text(buf, j.payload);
        int8(buf, run_at);
        boolean(buf, run_at == now);
        text(buf, super::PENDING);
        int8(buf, now);
        int8(buf, now);
    }
}

/// `QueueFull` for the first organization (in name order) whose depth exceeds its limit.
fn check_depths(depths: &[(String, i64)], limits: &BTreeMap<&str, i64>) -> Result<()> {
    let depths: BTreeMap<&str, i64> = depths.iter().map(|(o, d)| (o.as_str(), *d)).collect();
    for (org, max_depth) in limits {
        let depth = depths.get(org).copied().unwrap_or(0);
        if depth > *max_depth {
            return Err(Error::QueueFull {
                org: if org.is_empty() {
                    None
                } else {
                    Some(org.to_string())
                },
                depth,
                max_depth: *max_depth,
            });
        }
    }
    Ok(())
}

#[async_trait]
impl QueueStore for PostgresStore {
    async fn enqueue_batch(&self, jobs: &JobBatch) -> Result<()> {
        if jobs.is_empty() {
            return Ok(());
        }
        // COPY is ~2x the unnest statement's speed on big batches, but cannot skip taken ids:
        // when one is taken, the statement that can.
        if jobs.len() >= COPY_MIN_ROWS
            && self
                .enqueue_copy(&org_names(jobs), Feed::Whole(jobs))
                .await?
        {
            return Ok(());
        }
        self.enqueue_unnest(jobs).await
    }

    fn streams_enqueue(&self) -> bool {
        true
    }

    async fn enqueue_parts(
        &self,
        jobs: usize,
        orgs: &[String],
        parts: &mut PartReceiver,
    ) -> (Result<()>, JobBatch) {
        let mut got = vec![];
        let mut whole = false;
        let orgs: Vec<&str> = orgs.iter().map(String::as_str).collect();
        let feed = Feed::Parts {
            parts,
            got: &mut got,
            whole: &mut whole,
        };
        let copied = self.enqueue_copy(&orgs, feed).await;
        if matches!(copied, Ok(true) | Err(Error::Abandoned)) {
            return (copied.map(|_| ()), JobBatch::default());
        }
        // The batch whole (the parts are not kept twice on the COPY path), for the statement
        // that skips taken ids or for a caller that runs it again.
        let mut all = JobBatch::default();
        for part in got.drain(..) {
            append_part(jobs, &mut all, &part);
        }
        if !whole {
            if let Err(e) = receive_all(jobs, parts, &mut all).await {
                return (Err(e), all);
            }
        }
        let r = match copied {
            Ok(_) => self.enqueue_unnest(&all).await,
            Err(e) => Err(e),
        };
        (r, all)
    }

    async fn claim(&self, finished: &[Outcome], req: &ClaimRequest) -> Result<Vec<ClaimedJob>> {
        let reclaim;
        if finished.is_empty() && req.probe {
            // The empty poll: one read, whatever the number of lanes (both are index seeks).
            self.counted(1);
            let (due, expired): (bool, bool) = sqlx::query_as(PRECHECK)
                .bind(&req.types)
                .fetch_one(&self.pool)
                .await?;
            if !due && !expired {
                return Ok(vec![]);
            }
            reclaim = expired;
        } else {
            // Calls that write anyway look at most every 250 ms (`ReclaimThrottle`).
            reclaim = self.reclaims.due();
        }
        self.claim_call(finished, reclaim, req.limit, Some(req))
            .await
    }

    async fn finish(&self, outcomes: &[Outcome]) -> Result<()> {
        if outcomes.is_empty() {
            return Ok(());
        }
        // One statement: its own transaction.
        self.claim_call(outcomes, self.reclaims.due(), 0, None)
            .await?;
        Ok(())
    }

    async fn renew(&self, leases: &[LeaseRef], ttl_ms: i64) -> Result<Vec<RenewStatus>> {
        if leases.is_empty() {
            return Ok(vec![]);
        }
        let mut sorted: Vec<LeaseRef> = leases.to_vec();
        sorted.sort_by_key(|l| l.seq);
        let seqs: Vec<i64> = sorted.iter().map(|l| l.seq).collect();
        let toks: Vec<i64> = sorted.iter().map(|l| l.token).collect();
        let orgs: Vec<&str> = sorted.iter().map(|l| l.org.as_str()).collect();
        self.counted(1);
        let rows: Vec<(i64, bool)> = sqlx::query_as(RENEW)
            .bind(seqs)
            .bind(toks)
            .bind(ttl_ms)
            .bind(orgs)
            .fetch_all(&self.pool)
            .await?;
        let status: BTreeMap<i64, RenewStatus> = rows
            .into_iter()
            .map(|(seq, cancel)| {
                (
                    seq,
                    if cancel {
                        RenewStatus::CancelRequested
                    } else {
                        RenewStatus::Held
                    },
                )
            })
            .collect();
        Ok(leases
            .iter()
            .map(|l| status.get(&l.seq).copied().unwrap_or(RenewStatus::Lost))
            .collect())
    }

    async fn get_job(&self, org: &str, id: &str) -> Result<Option<JobRow>> {
        self.counted(1);
        let mut r = self.read().await?;
        let row = sqlx::query(&format!(
            "SELECT {JOB_COLS} FROM gnl_jobs WHERE org = $1 AND id = $2"
        ))
        .bind(org)
        .bind(id)
        .fetch_optional(&mut *r)
        .await?;
        self.done(r).await?;
        Ok(row.as_ref().map(job_row))
    }

    async fn has_due(&self, types: &[String]) -> Result<bool> {
        self.counted(1);
        Ok(sqlx::query_scalar(concat!("SELECT ", some_due!()))
            .bind(types)
            .fetch_one(&self.pool)
            .await?)
    }

    async fn max_seq(&self) -> Result<i64> {
        self.counted(1);
        // The identity's last value: at least the highest committed seq, read in O(1) (seq
        // alone has no index: the key is (org, seq)). Seqs of rolled-back inserts count too.
        Ok(sqlx::query_scalar(
            "SELECT coalesce(pg_sequence_last_value(pg_get_serial_sequence('gnl_jobs', 'seq')::regclass), 0)",
        )
        .fetch_one(&self.pool)
        .await?)
    }

    async fn list_jobs(&self, q: &ListQuery) -> Result<Vec<JobRow>> {
        self.counted(1);
        let mut r = self.read().await?;
        let rows = match &q.scope {
            ListScope::Lane { org, state, typ } => {
                let after = q.after.as_ref().map(|a| a.1).unwrap_or(0);
                sqlx::query(&format!(
                    "SELECT {JOB_COLS} FROM gnl_jobs WHERE org = $1 AND seq > $2 AND seq <= $3 \
                       AND ($4::text IS NULL OR state = $4) AND ($5::text IS NULL OR type = $5) \
                     ORDER BY seq LIMIT $6"
                ))
                .bind(org)
                .bind(after)
                .bind(q.snapshot)
                .bind(state.as_deref())
                .bind(typ.as_deref())
                .bind(q.limit)
                .fetch_all(&mut *r)
                .await?
            }
            ListScope::All => {
                let (ao, aq) = q.after.clone().unwrap_or((String::new(), 0));
                sqlx::query(&format!(
                    "SELECT {JOB_COLS} FROM gnl_jobs WHERE (org, seq) > ($1, $2) AND seq <= $3 \
                     ORDER BY org, seq LIMIT $4"
                ))
                .bind(ao)
                .bind(aq)
                .bind(q.snapshot)
                .bind(q.limit)
                .fetch_all(&mut *r)
                .await?
            }
        };
        self.done(r).await?;
        Ok(rows.iter().map(job_row).collect())
    }

    async fn retry_job(&self, org: &str, id: &str) -> Result<bool> {
        self.counted(1);
        let n: i64 = sqlx::query_scalar(RETRY)
            .bind(org)
            .bind(id)
            .fetch_one(&self.pool)
            .await?;
        Ok(n > 0)
    }

    async fn cancel_job(&self, org: &str, id: &str, reason: Option<&str>) -> Result<bool> {
        let why = format!("canceled: {}", reason.unwrap_or("cancel_job was called"));
        self.counted(1);
        let n = sqlx::query(CANCEL)
            .bind(org)
            .bind(id)
            .bind(pg_text(&why))
            .execute(&self.pool)
            .await?
            .rows_affected();
        Ok(n > 0)
    }

    async fn list_orgs(&self, after: Option<&str>, limit: i64) -> Result<Vec<String>> {
        self.counted(1);
        let mut r = self.read().await?;
        let orgs = sqlx::query_scalar(
            "SELECT DISTINCT org FROM gnl_lanes WHERE $1::text IS NULL OR org > $1 ORDER BY org LIMIT $2",
        )
        .bind(after)
        .bind(limit)
        .fetch_all(&mut *r)
        .await?;
        self.done(r).await?;
        Ok(orgs)
    }

    async fn count_jobs(
        &self,
        org: &str,
        scan: i64,
        since_ms: i64,
        timeout_ms: i64,
    ) -> Result<JobCounts> {
        let mut all = self
            .count_jobs_of(&[org.to_string()], scan, since_ms, timeout_ms)
            .await?;
        Ok(all.pop().unwrap_or_default())
    }

    /// One query for every organization (a lateral read of each lane's latest jobs), in one
    /// transaction under the timeout: 4 round trips, however many organizations.
    async fn count_jobs_of(
        &self,
        orgs: &[String],
        scan: i64,
        since_ms: i64,
        timeout_ms: i64,
    ) -> Result<Vec<JobCounts>> {
        let mut r = self.read_within(timeout_ms.max(1)).await?;
        self.counted(1);
        let rows: Vec<(i32, String, Option<i64>, i64)> = sqlx::query_as(
            "SELECT o.i::int4, w.state, \
                    CASE WHEN w.finished_at >= $2 THEN (w.finished_at - $2) / 60000 END AS m, \
                    count(*) \
             FROM unnest($1::text[]) WITH ORDINALITY AS o(org, i) \
             CROSS JOIN LATERAL (SELECT state, finished_at FROM gnl_jobs \
                                 WHERE gnl_jobs.org = o.org ORDER BY seq DESC LIMIT $3) w \
             GROUP BY o.i, w.state, m",
        )
        .bind(orgs)
        .bind(since_ms)
        .bind(scan)
        .fetch_all(&mut *r)
        .await?;
        self.done(r).await?;
        let mut per: Vec<Vec<(String, Option<i64>, i64)>> = vec![Vec::new(); orgs.len()];
        for (i, state, m, n) in rows {
            if let Some(v) = usize::try_from(i - 1).ok().and_then(|i| per.get_mut(i)) {
                v.push((state, m, n));
            }
        }
        Ok(per.into_iter().map(job_counts).collect())
    }
}
