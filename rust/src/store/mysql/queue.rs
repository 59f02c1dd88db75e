//! The MySQL queue (`QueueStore`): enqueue in multi-row inserts sized in bytes, claims that
//! lock lanes and jobs with `FOR UPDATE SKIP LOCKED` through indexes in claim order, outcomes,
//! reclaims of expired leases, renewals, listings, retry and cancel.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use async_trait::async_trait;
use sqlx::mysql::{MySqlConnection, MySqlRow};
use sqlx::{Connection, Row};

use super::{is_syntax_error, opt_text, plan, text, MysqlStore, Sql};
use crate::error::{Error, Result};
use crate::model::*;
use crate::store::held::Held;
use crate::store::queue::{
    first_pass_orgs, job_counts, marks, orgs_in_turn, second_pass, share, JOB_COLS,
};
use crate::store::QueueStore;

/// The most jobs one claim takes.
const MAX_CLAIM: usize = 10_000;

/// Whether a lane of one of `types` has a due job: a lane in the turn, or a waiting lane whose
/// next_run_at has come (parameters: the types, the types). Index seeks, two per type, whatever
/// the number of lanes.
fn some_due(types: usize) -> String {
    let m = marks(types);
    format!(
        "CAST(EXISTS (SELECT 1 FROM gnl_lanes FORCE INDEX (gnl_lanes_turn) \
           WHERE type IN ({m}) AND due_turn IS NOT NULL) \
         OR EXISTS (SELECT 1 FROM gnl_lanes FORCE INDEX (gnl_lanes_next) \
           WHERE type IN ({m}) AND wait_at <= {}) AS SIGNED)",
        now_ms!()
    )
}

/// The empty poll for `types` (parameters: the types, the types): one read, index seeks only,
/// whatever the number of lanes.
pub(super) fn precheck(types: usize) -> String {
    format!(
        concat!(
            "SELECT {}, CAST(COALESCE((SELECT MIN(lease_expires_at) FROM gnl_jobs \
             WHERE state = 'running') < ",
            now_ms!(),
            ", 0) AS SIGNED)"
        ),
        some_due(types)
    )
}

/// Whether a lane of one of `types` has a due job (parameters: the types, the types).
pub(super) fn has_due_sql(types: usize) -> String {
    format!("SELECT {}", some_due(types))
}

/// The lane pick's part for one type (parameters: the type, how many): its lanes in the turn
/// that waited longest, from the turn index (lanes whose jobs are all due later are not in
/// it), locked (busy lanes are skipped). Rows: org, type, served_at, 0.
const CLAIM_LANES_TURN: &str = "SELECT org, type, served_at, CAST(0 AS SIGNED) FROM gnl_lanes \
     FORCE INDEX (gnl_lanes_turn) WHERE type = ? AND due_turn IS NOT NULL \
     ORDER BY due_turn, org LIMIT ? FOR UPDATE SKIP LOCKED";

/// The lane pick's part for the waiting lanes of `types` whose next_run_at has come (they join
/// the turn with the tickets they had; parameters: the types), locked. Rows: org, type,
/// served_at, 1.
fn claim_lanes_waiting(types: usize) -> String {
    format!(
        "SELECT org, type, served_at, CAST(1 AS SIGNED) FROM gnl_lanes FORCE INDEX (gnl_lanes_next) \
         WHERE type IN ({}) AND wait_at <= {} FOR UPDATE SKIP LOCKED",
        marks(types),
        now_ms!()
    )
}

/// The whole lane pick for `types`, one statement: each type's part, then the waiting lanes.
pub(super) fn claim_lanes(types: usize) -> String {
    let mut sql = String::new();
    for _ in 0..types {
        sql.push('(');
        sql.push_str(CLAIM_LANES_TURN);
        sql.push_str(") UNION ALL ");
    }
    sql.push('(');
    sql.push_str(&claim_lanes_waiting(types));
    sql.push(')');
    sql
}

pub(super) const CLAIM_JOBS_PART: &str = concat!(
    "SELECT seq, lease_token, org, id, type, payload, attempts, run_at \
     FROM gnl_jobs FORCE INDEX (gnl_jobs_due) \
     WHERE org = ? AND state = 'pending' AND type = ? AND run_at <= ",
    now_ms!(),
    " ORDER BY run_at, seq LIMIT ? FOR UPDATE SKIP LOCKED"
);

const RECLAIM_PICK: &str = concat!(
    "SELECT seq FROM gnl_jobs FORCE INDEX (gnl_jobs_lease) \
     WHERE state = 'running' AND lease_expires_at < ",
    now_ms!(),
    " FOR UPDATE SKIP LOCKED"
);

/// Raise a lane's bound only downwards (`next_run_at` is a lower bound of its due jobs).
const LANE_LOWER: &str = " ON DUPLICATE KEY UPDATE next_run_at = \
     LEAST(COALESCE(gnl_lanes.next_run_at, VALUES(next_run_at)), VALUES(next_run_at))";

fn job_row(r: &MySqlRow) -> JobRow {
    JobRow {
        seq: r.get(0),
        org: text(r, 1),
        id: text(r, 2),
        typ: text(r, 3),
        payload: text(r, 4),
        state: text(r, 5),
        attempts: r.get(6),
        max_attempts: r.get(7),
        last_error: opt_text(r, 8),
        result: opt_text(r, 9),
        created_at: r.get(10),
        updated_at: r.get(11),
        run_at: r.get(12),
        finished_at: r.get(13),
    }
}

/// An enqueue's INSERT carries at most this many bytes of rows (fewer when the server's
/// `max_allowed_packet` is smaller): more parts cost a round trip each, bigger ones memory.
const ENQUEUE_PART_BYTES: usize = 256 << 10;

impl MysqlStore {
    /// A claim's transaction on `conn`: outcomes, (when `reclaim`) expired leases taken back,
    /// the lanes of jobs due again, then up to two passes over the lanes in turn.
    async fn claim_on(
        &self,
        conn: &mut MySqlConnection,
        finished: &[Outcome],
        req: &ClaimRequest,
        reclaim: bool,
    ) -> Result<Vec<ClaimedJob>> {
        self.counted(1);
        let mut tx = conn.begin().await?;
        let mut back = vec![];
        self.write_outcomes(&mut tx, finished, &mut back).await?;
        if reclaim {
            self.reclaim(&mut tx, &mut back).await?;
        }
        back.sort_unstable();
        back.dedup();
        self.lanes_due(&mut tx, &back).await?;
        let mut out = Vec::new();
        // At most MAX_CLAIM jobs a call: every statement below then stays under the
        // placeholder limit (four per lane).
        let limit = req.limit.min(MAX_CLAIM);
        if limit > 0 && !req.types.is_empty() {
            let orgs = first_pass_orgs(limit, req.per_org);
            let read = self.claim_pass(&mut tx, req, limit, orgs, &mut out).await?;
            if let Some(want) = second_pass(limit, req.per_org, out.len(), read, orgs) {
                self.claim_pass(&mut tx, req, want, want, &mut out).await?;
            }
        }
        self.counted(1);
        tx.commit().await?;
        Ok(out)
    }

    /// Write outcomes (conditional on seq, token and state running); the seqs of failed
    /// attempts go to `back` (their lanes may need lowering).
    async fn write_outcomes(
        &self,
        tx: &mut MySqlConnection,
        outcomes: &[Outcome],
        back: &mut Vec<i64>,
    ) -> Result<()> {
        let mut done: Vec<(i64, i64, Option<&str>)> = vec![];
        let mut failed: Vec<(i64, i64, String, i64)> = vec![];
        for o in outcomes {
            match o {
                Outcome::Done {
                    seq, token, result, ..
                } => {
                    let too_big = result
                        .as_deref()
                        .is_some_and(|r| self.check_size("the result", r.len()).is_err());
                    if too_big {
                        // It cannot be stored: the attempt fails (it would fail every time).
                        let len = result.as_deref().map_or(0, str::len);
                        failed.push((
                            *seq,
                            *token,
                            format!(
                                "the handler's result is {len} bytes, more than this MySQL server \
                                 accepts in one packet (max_allowed_packet = {}); it was not stored",
                                self.max_packet
                            ),
                            0,
                        ));
                    } else {
                        done.push((*seq, *token, result.as_deref()));
                    }
                }
                Outcome::Failed {
                    seq,
                    token,
                    error,
                    delay_ms,
                    ..
                } => {
                    let mut e = error.clone();
                    let cap = self.budget.saturating_sub(1024).max(1024);
                    if e.len() > cap {
                        let mut cut = cap;
                        while !e.is_char_boundary(cut) {
                            cut -= 1;
                        }
                        e.truncate(cut);
                    }
                    failed.push((*seq, *token, e, (*delay_ms).max(0)));
                }
            }
        }
        for r in plan(done.len(), 3, self.budget, |i| {
            done[i].2.map_or(0, str::len)
        }) {
            let rows = &done[r];
            let mut q = Sql::new("UPDATE (");
            q.rows = rows.len();
            for (i, (seq, tok, res)) in rows.iter().enumerate() {
                q.s(if i == 0 {
                    "SELECT CAST(? AS SIGNED) AS seq, CAST(? AS SIGNED) AS tok, CAST(? AS CHAR CHARACTER SET utf8mb4) AS res"
                } else {
                    " UNION ALL SELECT CAST(? AS SIGNED), CAST(? AS SIGNED), CAST(? AS CHAR CHARACTER SET utf8mb4)"
                });
                q.bind(*seq)?.bind(*tok)?.bind(*res)?;
            }
            q.s(concat!(
                ") o STRAIGHT_JOIN gnl_jobs g FORCE INDEX (PRIMARY) ON g.seq = o.seq \
                 SET g.result = o.res, g.finished_at = ",
                now_ms!(),
                ", g.updated_at = ",
                now_ms!(),
                ", g.lease_expires_at = NULL, g.lease_owner = NULL, \
                 g.state = IF(g.cancel_requested <> 0, 'canceled', 'done') \
                 WHERE g.lease_token = o.tok AND g.state = 'running'"
            ));
            self.counted(1);
            q.execute(&mut *tx).await?;
        }
        for r in plan(failed.len(), 4, self.budget, |i| failed[i].2.len()) {
            let rows = &failed[r];
            let mut q = Sql::new("UPDATE (");
            q.rows = rows.len();
            for (i, (seq, tok, err, delay)) in rows.iter().enumerate() {
                q.s(if i == 0 {
                    "SELECT CAST(? AS SIGNED) AS seq, CAST(? AS SIGNED) AS tok, \
                     CAST(? AS CHAR CHARACTER SET utf8mb4) AS err, CAST(? AS SIGNED) AS delay_ms"
                } else {
                    " UNION ALL SELECT CAST(? AS SIGNED), CAST(? AS SIGNED), \
                     CAST(? AS CHAR CHARACTER SET utf8mb4), CAST(? AS SIGNED)"
                });
                q.bind(*seq)?.bind(*tok)?.bind(err.as_str())?.bind(*delay)?;
                back.push(*seq);
            }
            q.s(concat!(
                ") o STRAIGHT_JOIN gnl_jobs g FORCE INDEX (PRIMARY) ON g.seq = o.seq SET \
                 g.run_at = IF(g.cancel_requested = 0 AND g.attempts < g.max_attempts, ",
                now_ms!(),
                " + o.delay_ms, g.run_at), \
                 g.finished_at = IF(g.cancel_requested = 0 AND g.attempts < g.max_attempts, NULL, ",
                now_ms!(),
                "), g.last_error = IF(g.cancel_requested <> 0, COALESCE(g.last_error, o.err), o.err), \
                 g.updated_at = ",
                now_ms!(),
                ", g.lease_expires_at = NULL, g.lease_owner = NULL, \
                 g.state = CASE WHEN g.cancel_requested <> 0 THEN 'canceled' \
                                WHEN g.attempts >= g.max_attempts THEN 'dead' ELSE 'pending' END \
                 WHERE g.lease_token = o.tok AND g.state = 'running'"
            ));
            self.counted(1);
            q.execute(&mut *tx).await?;
        }
        Ok(())
    }

    /// Expired leases: the holder stopped renewing. The attempt stays counted; the job is
    /// pending again (due at once), or dead once its attempts are used up. Rows another
    /// transaction holds (an outcome being written) are skipped.
    async fn reclaim(&self, tx: &mut MySqlConnection, back: &mut Vec<i64>) -> Result<()> {
        self.counted(1);
        let seqs: Vec<i64> = sqlx::query_scalar(RECLAIM_PICK).fetch_all(&mut *tx).await?;
        for r in plan(seqs.len(), 1, self.budget, |_| 8) {
            let part = &seqs[r];
            let mut q = Sql::new(concat!(
                "UPDATE gnl_jobs FORCE INDEX (PRIMARY) SET \
                 last_error = CONCAT('lease expired: the worker ', COALESCE(lease_owner, '?'), \
                   ' stopped renewing attempt ', attempts, ' (crashed, stopped or cut off)'), \
                 finished_at = IF(cancel_requested = 0 AND attempts < max_attempts, NULL, ",
                now_ms!(),
                "), state = CASE WHEN cancel_requested <> 0 THEN 'canceled' \
                   WHEN attempts >= max_attempts THEN 'dead' ELSE 'pending' END, \
                 lease_expires_at = NULL, lease_owner = NULL, updated_at = ",
                now_ms!(),
                " WHERE state = 'running' AND seq IN ("
            ));
            q.rows = part.len();
            for (i, s) in part.iter().enumerate() {
                q.s(if i == 0 { "?" } else { ",?" });
                q.bind(*s)?;
            }
            q.s(")");
            self.counted(1);
            q.execute(&mut *tx).await?;
        }
        back.extend(seqs);
        Ok(())
    }

    /// Lower the lanes of the jobs in `seqs` that are pending (lanes in (org, type) order). The
    /// jobs are read with a plain SELECT: MySQL's INSERT … SELECT and UPDATE … (SELECT) lock the
    /// rows they read, and a claimer must never wait on a row another transaction holds.
    async fn lanes_due(&self, tx: &mut MySqlConnection, seqs: &[i64]) -> Result<()> {
        let mut lanes: BTreeMap<(Vec<u8>, Vec<u8>), i64> = BTreeMap::new();
        for r in plan(seqs.len(), 1, self.budget, |_| 8) {
            let part = &seqs[r];
            let mut q = Sql::new(
                "SELECT org, type, MIN(run_at) FROM gnl_jobs FORCE INDEX (PRIMARY) \
                 WHERE state = 'pending' AND seq IN (",
            );
            q.rows = part.len();
            for (i, s) in part.iter().enumerate() {
                q.s(if i == 0 { "?" } else { ",?" });
                q.bind(*s)?;
            }
            q.s(") GROUP BY org, type");
            self.counted(1);
            for row in q.fetch_all(&mut *tx).await? {
                let org: Vec<u8> = row.try_get_unchecked(0)?;
                let typ: Vec<u8> = row.try_get_unchecked(1)?;
                let run_at: i64 = row.get(2);
                let e = lanes.entry((org, typ)).or_insert(run_at);
                *e = (*e).min(run_at);
            }
        }
        let lanes: Vec<(Vec<u8>, Vec<u8>, Option<i64>)> = lanes
            .into_iter()
            .map(|((o, t), at)| (o, t, Some(at)))
            .collect();
        self.lower_lanes(tx, &lanes).await
    }

    /// Lower (or create) lanes' `next_run_at` bounds (None: create only, or lock), in (org,
    /// type) order. A new lane takes its organization's turn ticket (a consistent read: no
    /// lock on the organization's other lanes).
    async fn lower_lanes(
        &self,
        tx: &mut MySqlConnection,
        lanes: &[(Vec<u8>, Vec<u8>, Option<i64>)],
    ) -> Result<()> {
        for r in plan(lanes.len(), 3, self.budget, |i| {
            lanes[i].0.len() + lanes[i].1.len() + 8
        }) {
            let mut q = Sql::new(
                "INSERT INTO gnl_lanes (org, type, next_run_at, served_at) \
                 SELECT v.org, v.type, v.at, \
                   COALESCE((SELECT MAX(l.served_at) FROM gnl_lanes l WHERE l.org = v.org), 0) FROM (",
            );
            q.rows = r.len();
            for (k, i) in r.enumerate() {
                q.s(if k == 0 {
                    "SELECT CAST(? AS BINARY) AS org, CAST(? AS BINARY) AS type, CAST(? AS SIGNED) AS at"
                } else {
                    " UNION ALL SELECT CAST(? AS BINARY), CAST(? AS BINARY), CAST(? AS SIGNED)"
                });
                q.bind(lanes[i].0.as_slice())?
                    .bind(lanes[i].1.as_slice())?
                    .bind(lanes[i].2)?;
            }
            q.s(") v");
            q.s(LANE_LOWER);
            self.counted(1);
            q.execute(&mut *tx).await?;
        }
        Ok(())
    }

    /// The server refused a locking clause inside a union (`message`): from now on, claims
    /// send a union's parts one by one.
    fn refuse_union_locks(&self, message: &str) {
        log::warn!(
            "gnl: this MySQL server refuses FOR UPDATE inside UNION ALL ({message}); \
             claims read one lane per statement"
        );
        self.union_locks.store(false, Ordering::Relaxed);
    }

    /// The lane pick for `types` (`claim_lanes`), locked: one statement, or its parts on a
    /// server that refuses locking clauses inside a union. Rows: org, type, served_at,
    /// whether the lane was waiting.
    async fn pick_lanes(
        &self,
        tx: &mut MySqlConnection,
        types: &[String],
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>, i64, i64)>> {
        if self.union_locks.load(Ordering::Relaxed) {
            let sql = claim_lanes(types.len());
            let mut q = sqlx::query_as(&sql);
            for t in types {
                q = q.bind(t.as_bytes()).bind(limit as i64);
            }
            for t in types {
                q = q.bind(t.as_bytes());
            }
            self.counted(1);
            match q.fetch_all(&mut *tx).await {
                Ok(rows) => return Ok(rows),
                Err(sqlx::Error::Database(db)) if is_syntax_error(db.as_ref()) => {
                    self.refuse_union_locks(db.message());
                }
                Err(e) => return Err(e.into()),
            }
        }
        let mut rows: Vec<(Vec<u8>, Vec<u8>, i64, i64)> = vec![];
        for t in types {
            self.counted(1);
            rows.extend(
                sqlx::query_as(CLAIM_LANES_TURN)
                    .bind(t.as_bytes())
                    .bind(limit as i64)
                    .fetch_all(&mut *tx)
                    .await?,
            );
        }
        let sql = claim_lanes_waiting(types.len());
        let mut q = sqlx::query_as(&sql);
        for t in types {
            q = q.bind(t.as_bytes());
        }
        self.counted(1);
        rows.extend(q.fetch_all(&mut *tx).await?);
        Ok(rows)
    }

    /// One pass of a claim (`CLAIM_QUANTUM`): the first `orgs` organizations in turn share
    /// `want` jobs, appended to `out` in turn order, each organization's oldest first; their
    /// lanes get their next tickets. Returns how many organizations in turn it read.
    async fn claim_pass(
        &self,
        tx: &mut MySqlConnection,
        req: &ClaimRequest,
        want: usize,
        orgs: usize,
        out: &mut Vec<ClaimedJob>,
    ) -> Result<usize> {
        let picked = self.pick_lanes(tx, &req.types, orgs).await?;
        // Waiting lanes whose next_run_at has come join the turn (all of them, with the
        // tickets they had; the pick holds their locks).
        let waiting: Vec<(&[u8], &[u8])> = picked
            .iter()
            .filter(|l| l.3 != 0)
            .map(|l| (l.0.as_slice(), l.1.as_slice()))
            .collect();
        for part in waiting.chunks(MAX_CLAIM) {
            let mut q = Sql::new("UPDATE gnl_lanes SET due = 1 WHERE (org, type) IN (");
            q.rows = part.len();
            for (i, (org, typ)) in part.iter().enumerate() {
                q.s(if i == 0 { "(?,?)" } else { ",(?,?)" });
                q.bind(*org)?.bind(*typ)?;
            }
            q.s(")");
            self.counted(1);
            q.execute(&mut *tx).await?;
        }
        let turned = orgs_in_turn(picked.into_iter().map(|l| (l.0, l.1, l.2)).collect(), orgs);
        let read = turned.len();
        if !turned.is_empty() {
            // Organizations in turn: each gets an equal share of the pass, the first ones
            // the rest; an organization's share goes to its earliest due jobs of its lanes
            // (each lane read for at most the share).
            let n = turned.len();
            let share = |i: usize| share(want, n, i, req.per_org) as i64;
            let lanes: Vec<(&[u8], &[u8], i64)> = turned
                .iter()
                .enumerate()
                .flat_map(|(i, (o, ts))| {
                    ts.iter()
                        .map(move |t| (o.as_slice(), t.as_slice(), share(i)))
                })
                .collect();
            let turn: BTreeMap<&[u8], usize> = turned
                .iter()
                .enumerate()
                .map(|(i, (o, _))| (o.as_slice(), i))
                .collect();
            let rows = self.pick_jobs(tx, &lanes).await?;
            let mut picked: Vec<(usize, ClaimedJob)> = rows
                .iter()
                .map(|r| {
                    let org_b: Vec<u8> = r.try_get_unchecked(2).unwrap_or_default();
                    let lane = turn.get(org_b.as_slice()).copied().unwrap_or(usize::MAX);
                    (
                        lane,
                        ClaimedJob {
                            seq: r.get(0),
                            // Read under the row lock: the update below adds one to each.
                            token: r.get::<i64, _>(1) + 1,
                            org: text(r, 2),
                            id: text(r, 3),
                            typ: text(r, 4),
                            payload: text(r, 5),
                            attempt: r.get::<i64, _>(6) + 1,
                            run_at: r.get(7),
                        },
                    )
                })
                .collect();
            picked.sort_by_key(|(lane, j)| (*lane, j.run_at, j.seq));
            // An organization with lanes of several types: its share of the earliest.
            let mut taken = vec![0i64; n];
            picked.retain(|(lane, _)| {
                taken.get_mut(*lane).is_some_and(|t| {
                    *t += 1;
                    *t <= share(*lane)
                })
            });
            let served: Vec<bool> = taken.iter().map(|t| *t > 0).collect();
            if !picked.is_empty() {
                let mut q = Sql::new(concat!(
                    "UPDATE gnl_jobs FORCE INDEX (PRIMARY) SET state = 'running', attempts = attempts + 1, \
                     max_attempts = ?, lease_token = lease_token + 1, lease_expires_at = ",
                    now_ms!(),
                    " + ?, lease_owner = ?, updated_at = ",
                    now_ms!(),
                    " WHERE seq IN ("
                ));
                q.rows = picked.len();
                q.bind(req.max_attempts)?
                    .bind(req.ttl_ms)?
                    .bind(req.owner.as_str())?;
                for (k, (_, j)) in picked.iter().enumerate() {
                    q.s(if k == 0 { "?" } else { ",?" });
                    q.bind(j.seq)?;
                }
                q.s(")");
                self.counted(1);
                q.execute(&mut *tx).await?;
            }
            // Each lane's new lower bound, and the base of this claim's turn tickets: a
            // plain (non-locking) read after the claim, which sees every job committed
            // before it; a job committed later lowers its lane's bound itself, after this
            // transaction (it waits for the lane row). Tickets strictly increase (claims
            // within one millisecond do not tie) and stay near the store's clock (in
            // 1/4096 ms), so a new organization's ticket 0 sorts first.
            let mut q = Sql::new(concat!(
                "SELECT x.org, x.type, (SELECT j.run_at FROM gnl_jobs j FORCE INDEX (gnl_jobs_due) \
                 WHERE j.org = x.org AND j.state = 'pending' AND j.type = x.type \
                 ORDER BY j.run_at LIMIT 1), \
                 CAST(GREATEST(",
                now_ms!(),
                " * 4096, COALESCE((SELECT MAX(served_at) FROM gnl_lanes), 0) + 1) AS SIGNED) \
                 FROM ("
            ));
            q.rows = lanes.len();
            for (i, (org, typ, _)) in lanes.iter().enumerate() {
                q.s(if i == 0 {
                    "SELECT CAST(? AS BINARY) AS org, CAST(? AS BINARY) AS type"
                } else {
                    " UNION ALL SELECT CAST(? AS BINARY), CAST(? AS BINARY)"
                });
                q.bind(*org)?.bind(*typ)?;
            }
            q.s(") x");
            self.counted(1);
            let mut base = 0i64;
            let next: BTreeMap<(Vec<u8>, Vec<u8>), Option<i64>> = q
                .fetch_all(&mut *tx)
                .await?
                .iter()
                .map(|r| {
                    base = r.get(3);
                    let org: Vec<u8> = r.try_get_unchecked(0).unwrap_or_default();
                    let typ: Vec<u8> = r.try_get_unchecked(1).unwrap_or_default();
                    ((org, typ), r.get::<Option<i64>, _>(2))
                })
                .collect();
            // Then the served organizations' tickets (on every lane of theirs the claim
            // holds), in the order they were served, and every looked-at lane's bound.
            let tickets: Vec<Option<i64>> = {
                let mut rank = 0i64;
                served
                    .iter()
                    .map(|s| {
                        s.then(|| {
                            rank += 1;
                            base + rank - 1
                        })
                    })
                    .collect()
            };
            let mut q = Sql::new("UPDATE (");
            q.rows = lanes.len();
            for (i, (org, typ, _)) in lanes.iter().enumerate() {
                q.s(if i == 0 {
                    "SELECT CAST(? AS BINARY) AS org, CAST(? AS BINARY) AS type, \
                     CAST(? AS SIGNED) AS ticket, CAST(? AS SIGNED) AS next_run_at"
                } else {
                    " UNION ALL SELECT CAST(? AS BINARY), CAST(? AS BINARY), CAST(? AS SIGNED), \
                     CAST(? AS SIGNED)"
                });
                let ticket = turn.get(org).and_then(|k| tickets[*k]);
                q.bind(*org)?
                    .bind(*typ)?
                    .bind(ticket)?
                    .bind(next.get(&(org.to_vec(), typ.to_vec())).copied().flatten())?;
            }
            // A lane stays in the turn while its earliest pending job is due.
            q.s(concat!(
                ") x STRAIGHT_JOIN gnl_lanes l FORCE INDEX (PRIMARY) ON l.org = x.org AND l.type = x.type SET \
                 l.served_at = COALESCE(x.ticket, l.served_at), l.next_run_at = x.next_run_at, \
                 l.due = COALESCE(x.next_run_at <= ",
                now_ms!(),
                ", 0)"
            ));
            self.counted(1);
            q.execute(&mut *tx).await?;
            out.extend(picked.into_iter().map(|(_, j)| j));
        }
        Ok(read)
    }

    /// Each lane's oldest due jobs, locked (`lanes`: organization, type, at most how many):
    /// one statement (UNION ALL), or one per lane on a server that refuses locking clauses
    /// inside a union.
    async fn pick_jobs(
        &self,
        tx: &mut MySqlConnection,
        lanes: &[(&[u8], &[u8], i64)],
    ) -> Result<Vec<MySqlRow>> {
        if lanes.len() > 1 && self.union_locks.load(Ordering::Relaxed) {
            let mut q = Sql::new("");
            q.rows = lanes.len();
            for (i, (org, typ, share)) in lanes.iter().enumerate() {
                if i > 0 {
                    q.s(" UNION ALL ");
                }
                q.s("(").s(CLAIM_JOBS_PART).s(")");
                q.bind(*org)?.bind(*typ)?.bind(*share)?;
            }
            self.counted(1);
            match q.fetch_all(&mut *tx).await {
                Ok(rows) => return Ok(rows),
                Err(sqlx::Error::Database(db)) if is_syntax_error(db.as_ref()) => {
                    self.refuse_union_locks(db.message());
                }
                Err(e) => return Err(e.into()),
            }
        }
        let mut rows = vec![];
        for (org, typ, share) in lanes {
            self.counted(1);
            rows.extend(
                sqlx::query(CLAIM_JOBS_PART)
                    .bind(*org)
                    .bind(*typ)
                    .bind(*share)
                    .fetch_all(&mut *tx)
                    .await?,
            );
        }
        Ok(rows)
    }
}

#[async_trait]
impl QueueStore for MysqlStore {
    async fn enqueue_batch(&self, jobs: &JobBatch) -> Result<()> {
        if jobs.is_empty() {
            return Ok(());
        }
        for (i, j) in jobs.iter().enumerate() {
            let len = jobs.text_len(i);
            if len + 4096 > self.max_packet {
                self.check_size(&format!("job {:?}", j.id), len)?;
            }
        }
        let mut tx = self.begin().await?;
        self.counted(1);
        let now: i64 = sqlx::query_scalar(concat!("SELECT ", now_ms!()))
            .fetch_one(&mut *tx)
            .await?;
        let summary = jobs.lanes();
        let row_tail = format!(",'pending',{now},{now})");
        // Parts of at most ENQUEUE_PART_BYTES: a part's statement and its encoded copy are
        // what the call holds besides the batch.
        let budget = self.budget.min(ENQUEUE_PART_BYTES);
        for r in plan(jobs.len(), 5, budget, |i| jobs.text_len(i) + 8) {
            let mut q = Sql::new(
                "INSERT INTO gnl_jobs (org, id, type, payload, run_at, state, created_at, updated_at) VALUES ",
            );
            q.rows = r.len();
            for i in r {
                let j = jobs.get(i);
                q.s(if q.text.ends_with(' ') {
                    "(?,?,?,?,?"
                } else {
                    ",(?,?,?,?,?"
                })
                .s(&row_tail);
                q.bind(j.org.as_bytes())?
                    .bind(j.id.as_bytes())?
                    .bind(j.typ.as_bytes())?
                    .bind(j.payload)?
                    .bind(j.due.at(now))?;
            }
            // Only the duplicate key is ignored (INSERT IGNORE would swallow other errors).
            q.s(" ON DUPLICATE KEY UPDATE seq = seq");
            self.counted(1);
            q.execute(&mut *tx).await?;
        }
        // Each lane's bound is lowered once per call, lanes in (org, type) order; an
        // organization with a max_depth also takes its lock row (type '').
        let mut lanes: Vec<(Vec<u8>, Vec<u8>, Option<i64>)> = jobs
            .type_lanes()
            .into_iter()
            .map(|(o, t, l)| {
                (
                    o.as_bytes().to_vec(),
                    t.as_bytes().to_vec(),
                    Some(l.earliest(now)),
                )
            })
            .collect();
        lanes.extend(
            summary
                .iter()
                .filter(|(_, l)| l.max_depth.is_some())
                .map(|(o, _)| (o.as_bytes().to_vec(), vec![], None)),
        );
        lanes.sort();
        self.lower_lanes(&mut tx, &lanes).await?;
        // The depth check runs after the lanes above are written (and so locked; the lock row
        // whatever the jobs' types): an enqueue with a max_depth into the same organization
        // waits for this transaction, and this read sees every one
        // that committed before it, so the check is exact.
        let limits: BTreeMap<&str, i64> = summary
            .iter()
            .filter_map(|(o, l)| l.max_depth.map(|m| (*o, m)))
            .collect();
        if !limits.is_empty() {
            let orgs: Vec<&str> = limits.keys().copied().collect();
            let mut depths: BTreeMap<String, i64> = BTreeMap::new();
            for r in plan(orgs.len(), 1, self.budget, |i| orgs[i].len()) {
                let mut q = Sql::new(
                    "SELECT org, COUNT(*) FROM gnl_jobs FORCE INDEX (gnl_jobs_due) \
                     WHERE state = 'pending' AND org IN (",
                );
                q.rows = r.len();
                for (k, i) in r.enumerate() {
                    q.s(if k == 0 { "?" } else { ",?" });
                    q.bind(orgs[i].as_bytes())?;
                }
                q.s(") GROUP BY org");
                self.counted(1);
                for row in q.fetch_all(&mut *tx).await? {
                    depths.insert(text(&row, 0), row.get(1));
                }
            }
            for (org, max_depth) in &limits {
                let depth = depths.get(*org).copied().unwrap_or(0);
                if depth > *max_depth {
                    self.rollback(tx).await?;
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
        }
        self.commit(tx).await
    }

    async fn claim(&self, finished: &[Outcome], req: &ClaimRequest) -> Result<Vec<ClaimedJob>> {
        // A claim that carries outcomes (no probe) looks for expired leases at most every
        // 250 ms (`ReclaimThrottle`, on this process's monotonic clock; lease decisions
        // themselves use the server's).
        let reclaim;
        if finished.is_empty() && req.probe {
            // The empty poll: one read, whatever the number of lanes (both are index seeks).
            self.counted(1);
            let sql = precheck(req.types.len());
            let mut q = sqlx::query_as(&sql);
            for t in req.types.iter().chain(&req.types) {
                q = q.bind(t.as_bytes());
            }
            let (due, expired): (i64, i64) = q.fetch_one(&self.pool).await?;
            if due == 0 && expired == 0 {
                return Ok(vec![]);
            }
            reclaim = expired != 0;
            if reclaim {
                self.reclaims.looked();
            }
        } else {
            reclaim = self.reclaims.due();
        }
        // A worker keeps up to two claims in flight: each runs on a held connection that is
        // free (no pool acquire, no sqlx ping on release: `store::held`), else on the pool's.
        match Held::take_free(&self.claims, &self.pool).await? {
            Some(mut h) => {
                let r = self.claim_on(h.conn(), finished, req, reclaim).await;
                h.settle_ok(r.is_ok());
                r
            }
            None => {
                let mut conn = self.pool.acquire().await?;
                self.claim_on(&mut conn, finished, req, reclaim).await
            }
        }
    }

    async fn finish(&self, outcomes: &[Outcome]) -> Result<()> {
        if outcomes.is_empty() {
            return Ok(());
        }
        let mut tx = self.begin().await?;
        let mut back = vec![];
        self.write_outcomes(&mut tx, outcomes, &mut back).await?;
        back.sort_unstable();
        back.dedup();
        self.lanes_due(&mut tx, &back).await?;
        self.commit(tx).await
    }

    async fn renew(&self, leases: &[LeaseRef], ttl_ms: i64) -> Result<Vec<RenewStatus>> {
        self.lease_status(leases, Some(ttl_ms)).await
    }

    /// A read: MySQL's renewal writes every lease's row.
    async fn check_cancels(
        &self,
        leases: &[LeaseRef],
        _ttl_ms: i64,
    ) -> Result<(Vec<RenewStatus>, bool)> {
        Ok((self.lease_status(leases, None).await?, false))
    }

    async fn get_job(&self, org: &str, id: &str) -> Result<Option<JobRow>> {
        self.counted(1);
        let row = sqlx::query(&self.read(&format!(
            "SELECT {JOB_COLS} FROM gnl_jobs \
             WHERE org = ? AND id_key = UNHEX(SHA2(?, 256)) AND id = ?"
        )))
        .bind(org.as_bytes())
        .bind(id.as_bytes())
        .bind(id.as_bytes())
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.as_ref().map(job_row))
    }

    async fn has_due(&self, types: &[String]) -> Result<bool> {
        if types.is_empty() {
            return Ok(false);
        }
        let sql = has_due_sql(types.len());
        let mut q = sqlx::query_scalar(&sql);
        for t in types.iter().chain(types) {
            q = q.bind(t.as_bytes());
        }
        self.counted(1);
        let due: i64 = q.fetch_one(&self.pool).await?;
        Ok(due != 0)
    }

    async fn max_seq(&self) -> Result<i64> {
        self.counted(1);
        Ok(
            sqlx::query_scalar("SELECT CAST(COALESCE(MAX(seq), 0) AS SIGNED) FROM gnl_jobs")
                .fetch_one(&self.pool)
                .await?,
        )
    }

    async fn list_jobs(&self, q: &ListQuery) -> Result<Vec<JobRow>> {
        self.counted(1);
        let rows = match &q.scope {
            ListScope::Lane { org, state, typ } => {
                let after = q.after.as_ref().map(|a| a.1).unwrap_or(0);
                sqlx::query(&self.read(&format!(
                    "SELECT {JOB_COLS} FROM gnl_jobs FORCE INDEX (gnl_jobs_lane_seq) \
                     WHERE org = ? AND seq > ? AND seq <= ? \
                       AND (? IS NULL OR state = ?) AND (? IS NULL OR type = ?) \
                     ORDER BY seq LIMIT ?"
                )))
                .bind(org.as_bytes())
                .bind(after)
                .bind(q.snapshot)
                .bind(state.as_deref())
                .bind(state.as_deref())
                .bind(typ.as_deref().map(str::as_bytes))
                .bind(typ.as_deref().map(str::as_bytes))
                .bind(q.limit)
                .fetch_all(&self.pool)
                .await?
            }
            ListScope::All => {
                let (ao, aq) = q.after.clone().unwrap_or((String::new(), 0));
                sqlx::query(&self.read(&format!(
                    "SELECT {JOB_COLS} FROM gnl_jobs FORCE INDEX (gnl_jobs_lane_seq) \
                     WHERE (org > ? OR (org = ? AND seq > ?)) AND seq <= ? \
                     ORDER BY org, seq LIMIT ?"
                )))
                .bind(ao.as_bytes())
                .bind(ao.as_bytes())
                .bind(aq)
                .bind(q.snapshot)
                .bind(q.limit)
                .fetch_all(&self.pool)
                .await?
            }
        };
        Ok(rows.iter().map(job_row).collect())
    }

    async fn retry_job(&self, org: &str, id: &str) -> Result<bool> {
        let mut tx = self.begin().await?;
        self.counted(1);
        let n = sqlx::query(concat!(
            "UPDATE gnl_jobs SET state = 'pending', attempts = 0, run_at = ",
            now_ms!(),
            ", updated_at = ",
            now_ms!(),
            ", finished_at = NULL, cancel_requested = 0 \
             WHERE org = ? AND id_key = UNHEX(SHA2(?, 256)) AND id = ? AND state = 'dead'"
        ))
        .bind(org.as_bytes())
        .bind(id.as_bytes())
        .bind(id.as_bytes())
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if n > 0 {
            self.counted(1);
            let typ: Vec<u8> = sqlx::query_scalar(
                "SELECT type FROM gnl_jobs WHERE org = ? AND id_key = UNHEX(SHA2(?, 256)) AND id = ?",
            )
            .bind(org.as_bytes())
            .bind(id.as_bytes())
            .bind(id.as_bytes())
            .fetch_one(&mut *tx)
            .await?;
            self.counted(1);
            let now: i64 = sqlx::query_scalar(concat!("SELECT ", now_ms!()))
                .fetch_one(&mut *tx)
                .await?;
            self.lower_lanes(&mut tx, &[(org.as_bytes().to_vec(), typ, Some(now))])
                .await?;
        }
        self.commit(tx).await?;
        Ok(n > 0)
    }

    async fn cancel_job(&self, org: &str, id: &str, reason: Option<&str>) -> Result<bool> {
        let why = format!("canceled: {}", reason.unwrap_or("cancel_job was called"));
        self.counted(1);
        let n = sqlx::query(concat!(
            "UPDATE gnl_jobs SET \
               finished_at = IF(state = 'pending', ",
            now_ms!(),
            ", finished_at), \
               state = IF(state = 'pending', 'canceled', state), \
               cancel_requested = 1, last_error = ?, updated_at = ",
            now_ms!(),
            " WHERE org = ? AND id_key = UNHEX(SHA2(?, 256)) AND id = ? \
               AND state IN ('pending', 'running')"
        ))
        .bind(why.as_str())
        .bind(org.as_bytes())
        .bind(id.as_bytes())
        .bind(id.as_bytes())
        .execute(&self.pool)
        .await?
        .rows_affected();
        Ok(n > 0)
    }

    async fn list_orgs(&self, after: Option<&str>, limit: i64) -> Result<Vec<String>> {
        self.counted(1);
        let rows = sqlx::query(&self.read(
            "SELECT DISTINCT org FROM gnl_lanes WHERE ? IS NULL OR org > ? ORDER BY org LIMIT ?",
        ))
        .bind(after.map(str::as_bytes))
        .bind(after.map(str::as_bytes))
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.iter().map(|r| text(r, 0)).collect())
    }

    async fn count_jobs(
        &self,
        org: &str,
        scan: i64,
        since_ms: i64,
        timeout_ms: i64,
    ) -> Result<JobCounts> {
        self.counted(1);
        let rows = sqlx::query(&self.bounded(
            "SELECT state, \
                    CASE WHEN finished_at >= ? THEN (finished_at - ?) DIV 60000 END AS m, \
                    count(*) \
             FROM (SELECT state, finished_at FROM gnl_jobs FORCE INDEX (gnl_jobs_lane_seq) \
                   WHERE org = ? ORDER BY seq DESC LIMIT ?) w GROUP BY state, m",
            timeout_ms.max(1),
        ))
        .bind(since_ms)
        .bind(since_ms)
        .bind(org.as_bytes())
        .bind(scan)
        .fetch_all(&self.pool)
        .await?;
        Ok(job_counts(
            rows.iter()
                .map(|r| (text(r, 0), r.get::<Option<i64>, _>(1), r.get::<i64, _>(2)))
                .collect(),
        ))
    }
}

impl MysqlStore {
    /// Each lease's status (held, cancel requested, lost), in order; with `extend`, the
    /// leases still held are extended by that many ms first.
    async fn lease_status(
        &self,
        leases: &[LeaseRef],
        extend: Option<i64>,
    ) -> Result<Vec<RenewStatus>> {
        if leases.is_empty() {
            return Ok(vec![]);
        }
        let mut sorted: Vec<LeaseRef> = leases.to_vec();
        sorted.sort_by_key(|l| l.seq);
        let mut status: BTreeMap<i64, RenewStatus> = BTreeMap::new();
        for r in plan(sorted.len(), 2, self.budget, |_| 16) {
            let part = &sorted[r];
            let derived = |q: &mut Sql| -> Result<()> {
                for (i, l) in part.iter().enumerate() {
                    q.s(if i == 0 {
                        "SELECT CAST(? AS SIGNED) AS seq, CAST(? AS SIGNED) AS tok"
                    } else {
                        " UNION ALL SELECT CAST(? AS SIGNED), CAST(? AS SIGNED)"
                    });
                    q.bind(l.seq)?.bind(l.token)?;
                }
                Ok(())
            };
            // Extend, then read back which leases are ours (a lease is (seq, token, running):
            // a token only grows, so no lease becomes ours between the two statements).
            if let Some(ttl_ms) = extend {
                let mut q = Sql::new("UPDATE (");
                q.rows = part.len();
                derived(&mut q)?;
                q.s(concat!(
                    ") l STRAIGHT_JOIN gnl_jobs g FORCE INDEX (PRIMARY) ON g.seq = l.seq \
                     SET g.lease_expires_at = ",
                    now_ms!(),
                    " + ? WHERE g.lease_token = l.tok AND g.state = 'running'"
                ));
                q.bind(ttl_ms)?;
                self.counted(1);
                q.execute(&self.pool).await?;
            }
            let mut q = Sql::new("SELECT g.seq, g.cancel_requested FROM (");
            q.rows = part.len();
            derived(&mut q)?;
            q.s(
                ") l STRAIGHT_JOIN gnl_jobs g FORCE INDEX (PRIMARY) ON g.seq = l.seq \
                 WHERE g.lease_token = l.tok AND g.state = 'running'",
            );
            self.counted(1);
            for row in q.fetch_all(&self.pool).await? {
                let cancel: i64 = row.try_get_unchecked::<i8, _>(1).map(i64::from)?;
                status.insert(
                    row.get(0),
                    if cancel != 0 {
                        RenewStatus::CancelRequested
                    } else {
                        RenewStatus::Held
                    },
                );
            }
        }
        Ok(leases
            .iter()
            .map(|l| status.get(&l.seq).copied().unwrap_or(RenewStatus::Lost))
            .collect())
    }
}
