//! The SQLite queue (`QueueStore`): enqueue in chunks under the variable limit, claims that
//! take lanes in turn inside `BEGIN IMMEDIATE`, outcomes, reclaims of expired leases,
//! renewals, listings, retry and cancel.

use std::collections::BTreeMap;

use async_trait::async_trait;
use sqlx::sqlite::SqliteArguments;
use sqlx::{Arguments, Row};

use super::raw::{Db, Val};
use super::{SqliteStore, Tx};
use crate::error::{Error, Result};
use crate::model::*;
use crate::store::queue::{
    first_pass_orgs, job_counts, job_row, marks, orgs_in_turn, second_pass, share, ReclaimThrottle,
    JOB_COLS,
};
use crate::store::QueueStore;

/// Whether a lane of one of `types` has a due job: a lane in the turn, or a waiting lane whose
/// next_run_at has come (parameters: the types, the types, now). Two index seeks per type,
/// whatever the number of lanes.
fn some_due(types: usize) -> String {
    let m = marks(types);
    format!(
        "(EXISTS (SELECT 1 FROM gnl_lanes WHERE due = 1 AND type IN ({m})) OR \
          EXISTS (SELECT 1 FROM gnl_lanes WHERE due = 0 AND type IN ({m}) AND next_run_at <= ?))"
    )
}

/// Bind `types`, `types` and `now` (`some_due`'s parameters).
fn bind_some_due(args: &mut SqliteArguments<'_>, types: &[String], now: i64) -> Result<()> {
    for t in types.iter().chain(types) {
        args.add(t.clone())
            .map_err(|e| Error::invalid(e.to_string()))?;
    }
    args.add(now).map_err(|e| Error::invalid(e.to_string()))?;
    Ok(())
}

/// The lane pick for `types`: a first row (org NULL) that says whether a waiting lane of those
/// types has a due job (it must join the turn first: parameters the types, now), then per type
/// the rows in the turn that waited longest, from the turn index (parameters: the type and how
/// many). Rows: org, type, served_at, the flag.
fn pick_lanes_sql(types: usize) -> String {
    let mut sql = format!(
        "SELECT NULL, NULL, NULL, EXISTS (SELECT 1 FROM gnl_lanes \
           WHERE due = 0 AND type IN ({}) AND next_run_at <= ?)",
        marks(types)
    );
    for _ in 0..types {
        sql.push_str(
            " UNION ALL SELECT * FROM (SELECT org, type, served_at, 0 FROM gnl_lanes \
               WHERE due = 1 AND type = ? ORDER BY served_at, org LIMIT ?)",
        );
    }
    sql
}

/// Lower the `next_run_at` bound of the lane of `org` and `typ` (parameters 1, 2) to `run_at`
/// (3), creating the lane if needed, with its organization's turn ticket.
const LANE_DUE: &str = "INSERT INTO gnl_lanes (org, type, next_run_at, served_at) \
     VALUES (?1, ?2, ?3, coalesce((SELECT max(served_at) FROM gnl_lanes WHERE org = ?1), 0)) \
     ON CONFLICT (org, type) DO UPDATE SET next_run_at = \
     min(coalesce(gnl_lanes.next_run_at, excluded.next_run_at), excluded.next_run_at)";

/// A failed attempt's outcome (parameters: now, seq, token, error, delay): pending again after
/// the delay, or dead once its attempts are used up (canceled when a cancel was asked).
const FAILED: &str = "UPDATE gnl_jobs SET \
       state = CASE WHEN cancel_requested = 1 THEN 'canceled' \
                    WHEN attempts >= max_attempts THEN 'dead' ELSE 'pending' END, \
       last_error = CASE WHEN cancel_requested = 1 THEN coalesce(last_error, ?4) ELSE ?4 END, \
       updated_at = ?1, lease_expires_at = NULL, lease_owner = NULL, \
       run_at = CASE WHEN cancel_requested = 0 AND attempts < max_attempts THEN ?1 + ?5 ELSE run_at END, \
       finished_at = CASE WHEN cancel_requested = 0 AND attempts < max_attempts THEN NULL ELSE ?1 END \
     WHERE seq = ?2 AND lease_token = ?3 AND state = 'running' \
     RETURNING org, type, state, run_at";

/// Expired leases (parameter: now): the job is pending again, or dead once its attempts
/// are used up.
const RECLAIM: &str = "UPDATE gnl_jobs SET \
       state = CASE WHEN cancel_requested = 1 THEN 'canceled' \
                    WHEN attempts >= max_attempts THEN 'dead' ELSE 'pending' END, \
       last_error = 'lease expired: the worker ' || coalesce(lease_owner, '?') || \
                    ' stopped renewing attempt ' || attempts || ' (crashed, stopped or cut off)', \
       finished_at = CASE WHEN cancel_requested = 0 AND attempts < max_attempts THEN NULL ELSE ?1 END, \
       lease_expires_at = NULL, lease_owner = NULL, updated_at = ?1 \
     WHERE state = 'running' AND lease_expires_at < ?1 \
     RETURNING org, type, state, run_at";

impl SqliteStore {
    /// `LANE_DUE` through the pool (the writers that are not on the hot path).
    async fn lane_due(
        &self,
        tx: &mut Tx<'static>,
        org: &str,
        typ: &str,
        run_at: i64,
    ) -> Result<()> {
        self.counted(1);
        sqlx::query(LANE_DUE)
            .bind(org)
            .bind(typ)
            .bind(run_at)
            .execute(&mut **tx)
            .await?;
        Ok(())
    }
}

/// What a claim or a write of outcomes needs besides its connection (taken from the store
/// before it leaves for the connection's thread).
pub(super) struct Hot {
    pub(super) now: i64,
    /// Look for expired leases in this transaction.
    pub(super) reclaim: bool,
    pub(super) var_limit: usize,
}

/// Pending again: lower its lane's bound (rows of org, type, state, run_at).
fn lanes_due_of(db: &mut Db, rows: Vec<Vec<Val>>) -> Result<()> {
    let mut lanes: BTreeMap<(String, String), i64> = BTreeMap::new();
    for r in rows {
        let mut r = r.into_iter();
        let (org, typ, state, run_at) = (r.next(), r.next(), r.next(), r.next());
        let (Some(org), Some(typ), Some(state), Some(run_at)) = (org, typ, state, run_at) else {
            continue;
        };
        if state.text().as_deref() == Some(PENDING) {
            let run_at = run_at.int();
            let e = lanes
                .entry((
                    org.text().unwrap_or_default(),
                    typ.text().unwrap_or_default(),
                ))
                .or_insert(run_at);
            *e = (*e).min(run_at);
        }
    }
    for ((org, typ), run_at) in lanes {
        db.exec(
            LANE_DUE,
            &[Val::Text(org), Val::Text(typ), Val::Int(run_at)],
            true,
        )?;
    }
    Ok(())
}

/// Write outcomes of finished attempts (conditional on the lease's fencing token).
pub(super) fn write_outcomes(db: &mut Db, outcomes: &[Outcome], hot: &Hot) -> Result<()> {
    let now = hot.now;
    let done: Vec<(i64, i64, Option<&str>)> = outcomes
        .iter()
        .filter_map(|o| match o {
            Outcome::Done {
                seq, token, result, ..
            } => Some((*seq, *token, result.as_deref())),
            _ => None,
        })
        .collect();
    // Done: one statement per chunk, the outcomes joined as a VALUES table. Anonymous `?`
    // only: SQLite looks numbered parameters up by a linear scan (quadratic binds); `now` is
    // bound last, numbered past the anonymous ones.
    let per_chunk = (hot.var_limit.saturating_sub(1) / 3).max(1);
    for chunk in done.chunks(per_chunk) {
        let mut sql = String::with_capacity(300 + chunk.len() * 8);
        sql.push_str("WITH o(seq, tok, res) AS (VALUES ");
        let mut args = Vec::with_capacity(chunk.len() * 3 + 1);
        for (i, (seq, tok, res)) in chunk.iter().enumerate() {
            if i > 0 {
                sql.push(',');
            }
            sql.push_str("(?,?,?)");
            args.extend([Val::Int(*seq), Val::Int(*tok), Val::from(*res)]);
        }
        let n = args.len() + 1;
        args.push(Val::Int(now));
        sql.push_str(&format!(
            ") UPDATE gnl_jobs SET \
               state = CASE WHEN cancel_requested = 1 THEN 'canceled' ELSE 'done' END, \
               result = o.res, finished_at = ?{n}, updated_at = ?{n}, lease_expires_at = NULL, lease_owner = NULL \
             FROM o WHERE gnl_jobs.seq = o.seq AND gnl_jobs.lease_token = o.tok AND gnl_jobs.state = 'running'"
        ));
        // The common sizes (one outcome, a few) keep their statement.
        db.exec(&sql, &args, chunk.len() <= 8)?;
    }
    for o in outcomes {
        if let Outcome::Failed {
            seq,
            token,
            error,
            delay_ms,
            ..
        } = o
        {
            let args = [
                Val::Int(now),
                Val::Int(*seq),
                Val::Int(*token),
                Val::from(error),
                Val::Int(*delay_ms.max(&0)),
            ];
            let rows = db.rows(FAILED, &args, true)?;
            lanes_due_of(db, rows)?;
        }
    }
    Ok(())
}

/// After a claim: give the organizations that were served new turn tickets (on the lanes
/// the claim looked at), in the order they were served, and recompute whether each lane the
/// claim looked at (`looked`: organizations and their types) stays in the turn; one
/// statement. Tickets strictly increase (claims within one millisecond must not tie) and stay
/// near the store's clock (in 1/4096 ms), so a new organization's ticket 0 sorts first.
///
/// Only rows that change are written (each lane row written also moves entries of the
/// lanes' indexes, which a claim's commit pays for page by page):
/// * a lane that stays in the turn keeps its `next_run_at` (read only while it waits: a lane
///   that leaves the turn gets its bound recomputed here, and `LANE_DUE` lowers it);
/// * one organization served alone that already holds the newest ticket, holds it alone,
///   and has been given one (not the 0 of a lane never served, which a new organization's
///   lane ties with) keeps it: a new ticket would leave every lane's order as it is (it is
///   already last, and every later ticket is larger).
fn lanes_served(
    db: &mut Db,
    looked: &[(String, Vec<String>)],
    served: &[&str],
    now: i64,
) -> Result<()> {
    let mut args = vec![Val::Int(now * 4096)];
    let mut sql = String::from(
        "WITH b(v) AS MATERIALIZED (SELECT max(?, coalesce(max(served_at), 0) + 1) FROM gnl_lanes), \
         l(org, type) AS (VALUES ",
    );
    let mut first = true;
    for (org, types) in looked {
        for t in types {
            sql.push_str(if first { "(?,?)" } else { ",(?,?)" });
            first = false;
            args.extend([Val::from(org), Val::from(t)]);
        }
    }
    sql.push_str("), x(org, type, m, t) AS MATERIALIZED (SELECT org, type, m, ");
    match served {
        [] => sql.push_str("NULL"),
        [org] => {
            // Kept when it is the newest ticket and this organization's alone.
            sql.push_str(
                "CASE WHEN org = ? AND NOT ((SELECT max(served_at) FROM gnl_lanes WHERE org = ?) \
                   = (SELECT max(served_at) FROM gnl_lanes) AND (SELECT max(served_at) FROM gnl_lanes) > 0 \
                   AND NOT EXISTS (SELECT 1 FROM gnl_lanes \
                   WHERE org <> ? AND served_at = (SELECT max(served_at) FROM gnl_lanes))) \
                 THEN (SELECT v FROM b) END",
            );
            args.extend([Val::from(*org), Val::from(*org), Val::from(*org)]);
        }
        _ => {
            sql.push_str("CASE org");
            for (i, org) in served.iter().enumerate() {
                sql.push_str(&format!(" WHEN ? THEN (SELECT v FROM b) + {i}"));
                args.push(Val::from(*org));
            }
            sql.push_str(" END");
        }
    }
    // A lane stays in the turn while its earliest pending job is due.
    sql.push_str(
        " FROM (SELECT l.org, l.type, (SELECT min(j.run_at) FROM gnl_jobs j \
           WHERE j.org = l.org AND j.type = l.type AND j.state = 'pending') AS m FROM l))",
    );
    let n = args.len() + 1;
    args.push(Val::Int(now));
    sql.push_str(&format!(
        " UPDATE gnl_lanes SET served_at = coalesce(x.t, gnl_lanes.served_at), \
           due = coalesce(x.m <= ?{n}, 0), \
           next_run_at = CASE WHEN coalesce(x.m <= ?{n}, 0) THEN gnl_lanes.next_run_at ELSE x.m END \
         FROM x WHERE gnl_lanes.org = x.org AND gnl_lanes.type = x.type \
           AND (x.t IS NOT NULL OR gnl_lanes.due <> coalesce(x.m <= ?{n}, 0) \
                OR (NOT coalesce(x.m <= ?{n}, 0) AND gnl_lanes.next_run_at IS NOT x.m))"
    ));
    // Kept up to the sizes a claim at C <= 16 makes (preparing it costs more than running it).
    db.exec(&sql, &args, looked.len() <= 16 && served.len() <= 16)?;
    Ok(())
}

/// Organizations in turn, each with the types of its lanes a claim looked at.
type Turn = Vec<(String, Vec<String>)>;

/// The organizations in turn that waited longest (at most `limit`) with their lanes' types,
/// among lanes of `types`; None when a waiting lane of those types has a due job (it must
/// join the turn first).
fn pick_lanes(db: &mut Db, types: &[String], now: i64, limit: usize) -> Result<Option<Turn>> {
    let sql = pick_lanes_sql(types.len());
    let mut args: Vec<Val> = types.iter().map(Val::from).collect();
    args.push(Val::Int(now));
    for t in types {
        args.extend([Val::from(t), Val::Int(limit as i64)]);
    }
    let rows = db.rows(&sql, &args, types.len() <= 4)?;
    let mut lanes = Vec::with_capacity(rows.len());
    for r in rows {
        let mut r = r.into_iter();
        let (org, typ, at, waiting_due) = (r.next(), r.next(), r.next(), r.next());
        match (org, typ, at) {
            (Some(Val::Text(o)), Some(Val::Text(t)), Some(Val::Int(at))) => lanes.push((o, t, at)),
            _ if waiting_due.is_some_and(|w| w.int() != 0) => return Ok(None),
            _ => {}
        }
    }
    Ok(Some(orgs_in_turn(lanes, limit)))
}

/// One organization's share of a claim: its earliest due jobs of `types` (each type read
/// from the due index, at most the share each). Parameters: per type (org, type, now, share),
/// then the share again when there are several types.
fn lane_sql(sql: &mut String, types: usize) {
    let one = "SELECT seq, run_at FROM gnl_jobs WHERE org = ? AND type = ? \
               AND state = 'pending' AND run_at <= ? ORDER BY run_at, seq LIMIT ?";
    if types == 1 {
        sql.push_str(&one.replacen("SELECT seq, run_at", "SELECT seq", 1));
    } else {
        sql.push_str("SELECT seq FROM (");
        for k in 0..types {
            if k > 0 {
                sql.push_str(" UNION ALL ");
            }
            sql.push_str("SELECT * FROM (");
            sql.push_str(one);
            sql.push(')');
        }
        sql.push_str(") ORDER BY run_at, seq LIMIT ?");
    }
}

/// The claim's statement for the shares of several organizations (`types`: how many types
/// each has), one statement whatever their number: a statement's own cost (its cursors, the
/// IN list's and RETURNING's temporary tables) is several times a claimed row's. Parameters:
/// max_attempts, the lease's end, the owner, now, then each organization's (`lane_sql`).
fn claim_sql(types: &[usize]) -> String {
    let mut sql = String::from(
        "UPDATE gnl_jobs SET state = 'running', attempts = attempts + 1, max_attempts = ?, \
           lease_token = lease_token + 1, lease_expires_at = ?, lease_owner = ?, updated_at = ? \
         WHERE seq IN (",
    );
    if let [t] = types {
        lane_sql(&mut sql, *t);
    } else {
        for (i, t) in types.iter().enumerate() {
            if i > 0 {
                sql.push_str(" UNION ALL ");
            }
            // A compound's arms take no ORDER BY or LIMIT of their own: each is a subquery.
            sql.push_str("SELECT seq FROM (");
            lane_sql(&mut sql, *t);
            sql.push(')');
        }
    }
    sql.push_str(") RETURNING seq, lease_token, id, type, payload, attempts, run_at, org");
    sql
}

/// Organizations per claim statement at most. One statement for a claim's organizations
/// saves a statement's fixed cost per organization, but a compound's cost per arm grows with
/// its arms: CPU a job over 50 organizations, one process (session 10, A/B): C=100 ~37 us
/// with 4 a statement, ~40 with 1 or 16, ~47 with 64; C=16 ~55-60 with 4 or 8, ~61-68 with
/// 64; C=1 the same with any.
const LANES_PER_CLAIM: usize = 8;

/// A claim statement is kept prepared when its lanes have at most this many types each.
const MAX_KEPT_TYPES: usize = 4;

/// The largest power of two not above `n` (`n` >= 1).
fn prev_power_of_two(n: usize) -> usize {
    1 << (usize::BITS - 1 - n.leading_zeros())
}

/// A claim's transaction: the outcomes it carries, expired leases (when `hot.reclaim`), then
/// up to `req.limit` jobs, lanes in turn.
pub(super) fn claim_tx(
    db: &mut Db,
    finished: &[Outcome],
    req: &ClaimRequest,
    hot: &Hot,
) -> Result<Vec<ClaimedJob>> {
    let now = hot.now;
    write_outcomes(db, finished, hot)?;
    if hot.reclaim {
        let rows = db.rows(RECLAIM, &[Val::Int(now)], true)?;
        lanes_due_of(db, rows)?;
    }
    let mut out = Vec::new();
    if req.limit == 0 || req.types.is_empty() {
        return Ok(out);
    }
    let orgs = first_pass_orgs(req.limit, req.per_org);
    let read = claim_pass(db, req, hot, req.limit, orgs, &mut out)?;
    if let Some(want) = second_pass(req.limit, req.per_org, out.len(), read, orgs) {
        claim_pass(db, req, hot, want, want, &mut out)?;
    }
    Ok(out)
}

/// One pass of a claim (`CLAIM_QUANTUM`): the first `orgs` organizations in turn share `want`
/// jobs, appended to `out` in turn order, each organization's oldest first; their lanes get
/// their next tickets. Returns how many organizations in turn it read.
fn claim_pass(
    db: &mut Db,
    req: &ClaimRequest,
    hot: &Hot,
    want: usize,
    orgs: usize,
    out: &mut Vec<ClaimedJob>,
) -> Result<usize> {
    let now = hot.now;
    let mut lanes = pick_lanes(db, &req.types, now, orgs)?;
    if lanes.is_none() {
        // Waiting lanes whose next_run_at has come join the turn, with the tickets they had
        // (so a lane is served in the same order as if it had never waited).
        let mut args: Vec<Val> = req.types.iter().map(Val::from).collect();
        args.push(Val::Int(now));
        db.exec(
            &format!(
                "UPDATE gnl_lanes SET due = 1 WHERE due = 0 AND type IN ({}) AND next_run_at <= ?",
                marks(req.types.len())
            ),
            &args,
            req.types.len() <= 4,
        )?;
        lanes = pick_lanes(db, &req.types, now, orgs)?;
    }
    let lanes = lanes.unwrap_or_default();
    let n = lanes.len().max(1);
    let expires = now + req.ttl_ms;
    let mut served: Vec<&str> = Vec::with_capacity(lanes.len());
    let mut got: Vec<(usize, ClaimedJob)> = Vec::with_capacity(want);
    let head = [
        Val::Int(req.max_attempts),
        Val::Int(expires),
        Val::from(&req.owner),
        Val::Int(now),
    ];
    // Lanes in chunks of at most `per` (a power of two whose padded statement stays under
    // the variable limit). Each chunk is padded to a power of two of lanes, each lane to the
    // chunk's largest number of types, with arms that match nothing (`org`/`type` NULL): so a
    // claim's statement has one of a few shapes, always kept prepared (a 50-arm statement
    // prepared for every claim cost ~10 us a job at C=100 over 50 organizations).
    let widest = 4 * MAX_KEPT_TYPES + 1;
    let per = prev_power_of_two(((hot.var_limit.saturating_sub(head.len())) / widest).max(1))
        .min(LANES_PER_CLAIM);
    let mut start = 0;
    while start < lanes.len() {
        let mut end = (start + per).min(lanes.len());
        let width = lanes[start..end]
            .iter()
            .map(|(_, t)| t.len())
            .max()
            .unwrap_or(1);
        let mut padded = (end - start).next_power_of_two();
        // Lanes of many types: fewer lanes a statement.
        while padded > 1 && head.len() + padded * (4 * width + 1) > hot.var_limit {
            padded /= 2;
            end = start + padded;
        }
        let mut args = head.to_vec();
        for at in start..start + padded {
            let (org, t, share) = match lanes.get(at).filter(|_| at < end) {
                // Lanes in turn: each gets an equal share of the batch, the first ones the rest.
                Some((org, t)) => (
                    Val::from(org),
                    t.as_slice(),
                    share(want, n, at, req.per_org) as i64,
                ),
                None => (Val::Null, &[][..], 0),
            };
            for k in 0..width {
                args.extend([
                    if k < t.len() { org.clone() } else { Val::Null },
                    t.get(k).map_or(Val::Null, Val::from),
                    Val::Int(now),
                    Val::Int(share),
                ]);
            }
            if width > 1 {
                args.push(Val::Int(share));
            }
        }
        let keep = width <= MAX_KEPT_TYPES;
        let sql = claim_sql(&vec![width; padded]);
        let chunk = &lanes[start..end];
        db.each(&sql, &args, keep, |r| {
            let mut r = r.into_iter();
            let mut next = || r.next().unwrap_or(Val::Null);
            let (seq, token, id, typ, payload, attempt, run_at, org) = (
                next(),
                next(),
                next(),
                next(),
                next(),
                next(),
                next(),
                next(),
            );
            let org = org.text().unwrap_or_default();
            let at = chunk.iter().position(|(o, _)| *o == org).unwrap_or(0) + start;
            got.push((
                at,
                ClaimedJob {
                    seq: seq.int(),
                    token: token.int(),
                    org,
                    id: id.text().unwrap_or_default(),
                    typ: typ.text().unwrap_or_default(),
                    payload: payload.text().unwrap_or_default(),
                    attempt: attempt.int(),
                    run_at: run_at.int(),
                },
            ));
            true
        })?;
        start = end;
    }
    // In the lanes' turn, each organization's jobs oldest first.
    got.sort_by_key(|(at, j)| (*at, j.run_at, j.seq));
    for (at, j) in got {
        if served.last() != Some(&lanes[at].0.as_str()) {
            served.push(lanes[at].0.as_str());
        }
        out.push(j);
    }
    if !lanes.is_empty() {
        lanes_served(db, &lanes, &served, now)?;
    }
    Ok(lanes.len())
}

/// A claim on `db`: when it carries no outcomes and `req.probe`, first the empty poll (one
/// read, whatever the number of lanes: both are index seeks, no write lock taken); then the
/// claim's transaction (`claim_tx`), looking for expired leases when the poll saw one, else
/// at most every 250 ms (`ReclaimThrottle`, on the monotonic clock).
fn claim_db(
    db: &mut Db,
    finished: &[Outcome],
    req: &ClaimRequest,
    now: i64,
    reclaims: &ReclaimThrottle,
    var_limit: usize,
) -> Result<Vec<ClaimedJob>> {
    let mut expired = false;
    if finished.is_empty() && req.probe {
        let mut args: Vec<Val> = req.types.iter().chain(&req.types).map(Val::from).collect();
        args.push(Val::Int(now));
        let sql = format!(
            "SELECT {}, (SELECT min(lease_expires_at) FROM gnl_jobs WHERE state = 'running')",
            some_due(req.types.len())
        );
        let row = db.rows(&sql, &args, req.types.len() <= 4)?;
        let mut row = row.into_iter().next().unwrap_or_default().into_iter();
        let due = row.next().is_some_and(|v| v.int() != 0);
        expired = matches!(row.next(), Some(Val::Int(t)) if t < now);
        if !due && !expired {
            return Ok(vec![]);
        }
        if expired {
            reclaims.looked();
        }
    }
    let hot = Hot {
        now,
        reclaim: expired || reclaims.due(),
        var_limit,
    };
    db.write(|db| claim_tx(db, finished, req, &hot))
}

#[async_trait]
impl QueueStore for SqliteStore {
    async fn enqueue_batch(&self, jobs: &JobBatch) -> Result<()> {
        if jobs.is_empty() {
            return Ok(());
        }
        let _w = self.write.lock().await;
        let mut tx = self.begin_write().await?;
        let now = self.clock_ms();
        // 5 binds a row, anonymous `?` only (see `write_outcomes`); `now` is a literal.
        let per_chunk = (self.var_limit / 5).max(1);
        let tail = format!("'pending',{now},{now})");
        let mut start = 0;
        while start < jobs.len() {
            let end = (start + per_chunk).min(jobs.len());
            let mut sql = String::with_capacity(160 + (end - start) * 40);
            sql.push_str(
                "INSERT INTO gnl_jobs (org, id, type, payload, run_at, state, created_at, updated_at) VALUES ",
            );
            let mut args = SqliteArguments::default();
            for i in start..end {
                let j = jobs.get(i);
                if i > start {
                    sql.push(',');
                }
                sql.push_str("(?,?,?,?,?,");
                sql.push_str(&tail);
                for v in [j.org, j.id, j.typ, j.payload] {
                    args.add(v).map_err(|e| Error::invalid(e.to_string()))?;
                }
                args.add(j.due.at(now))
                    .map_err(|e| Error::invalid(e.to_string()))?;
            }
            sql.push_str(" ON CONFLICT (org, id) DO NOTHING");
            self.counted(1);
            sqlx::query_with(&sql, args)
                .persistent(false)
                .execute(&mut *tx)
                .await?;
            start = end;
        }
        let lanes = jobs.lanes();
        for (org, lane) in &lanes {
            let Some(max_depth) = lane.max_depth else {
                continue;
            };
            self.counted(1);
            let depth: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM gnl_jobs WHERE org = ?1 AND state = 'pending'",
            )
            .bind(*org)
            .fetch_one(&mut *tx)
            .await?;
            if depth > max_depth {
                self.counted(1);
                tx.rollback().await?;
                return Err(Error::QueueFull {
                    org: if org.is_empty() {
                        None
                    } else {
                        Some(org.to_string())
                    },
                    depth,
                    max_depth,
                });
            }
        }
        // Each lane's bound is lowered once per call.
        for (org, typ, lane) in jobs.type_lanes() {
            self.lane_due(&mut tx, org, typ, lane.earliest(now)).await?;
        }
        self.commit(tx).await
    }

    async fn claim(&self, finished: &[Outcome], req: &ClaimRequest) -> Result<Vec<ClaimedJob>> {
        let (finished, req) = (finished.to_vec(), req.clone());
        let (reclaims, var_limit) = (self.reclaims.clone(), self.var_limit);
        self.on_raw(move |db, now| claim_db(db, &finished, &req, now, &reclaims, var_limit))
            .await
    }

    fn claim_now(
        &self,
        finished: &[Outcome],
        req: &ClaimRequest,
    ) -> Option<Result<Vec<ClaimedJob>>> {
        let (reclaims, var_limit) = (&self.reclaims, self.var_limit);
        self.on_raw_now(|db, now| claim_db(db, finished, req, now, reclaims, var_limit))
    }

    async fn finish(&self, outcomes: &[Outcome]) -> Result<()> {
        if outcomes.is_empty() {
            return Ok(());
        }
        let outcomes = outcomes.to_vec();
        let var_limit = self.var_limit;
        self.on_raw(move |db, now| {
            let hot = Hot {
                now,
                reclaim: false,
                var_limit,
            };
            db.write(|db| write_outcomes(db, &outcomes, &hot))
        })
        .await
    }

    async fn renew(&self, leases: &[LeaseRef], ttl_ms: i64) -> Result<Vec<RenewStatus>> {
        if leases.is_empty() {
            return Ok(vec![]);
        }
        let _w = self.write.lock().await;
        let mut tx = self.begin_write().await?;
        let now = self.clock_ms();
        let mut status: BTreeMap<i64, RenewStatus> = BTreeMap::new();
        let per_chunk = (self.var_limit / 2).max(1);
        for chunk in leases.chunks(per_chunk) {
            let mut sql = String::from("WITH l(seq, tok) AS (VALUES ");
            let mut args = SqliteArguments::default();
            for (i, l) in chunk.iter().enumerate() {
                if i > 0 {
                    sql.push(',');
                }
                sql.push_str("(?,?)");
                args.add(l.seq).map_err(|e| Error::invalid(e.to_string()))?;
                args.add(l.token)
                    .map_err(|e| Error::invalid(e.to_string()))?;
            }
            sql.push_str(&format!(
                ") UPDATE gnl_jobs SET lease_expires_at = {} FROM l \
                 WHERE gnl_jobs.seq = l.seq AND gnl_jobs.lease_token = l.tok AND gnl_jobs.state = 'running' \
                 RETURNING gnl_jobs.seq, gnl_jobs.cancel_requested",
                now + ttl_ms
            ));
            self.counted(1);
            for r in sqlx::query_with(&sql, args)
                .persistent(false)
                .fetch_all(&mut *tx)
                .await?
            {
                let c: i64 = r.get(1);
                status.insert(
                    r.get(0),
                    if c != 0 {
                        RenewStatus::CancelRequested
                    } else {
                        RenewStatus::Held
                    },
                );
            }
        }
        self.commit(tx).await?;
        Ok(leases
            .iter()
            .map(|l| status.get(&l.seq).copied().unwrap_or(RenewStatus::Lost))
            .collect())
    }

    async fn get_job(&self, org: &str, id: &str) -> Result<Option<JobRow>> {
        self.counted(1);
        let mut r = self.read().await?;
        let row = sqlx::query(&format!(
            "SELECT {JOB_COLS} FROM gnl_jobs WHERE org = ?1 AND id = ?2"
        ))
        .bind(org)
        .bind(id)
        .fetch_optional(&mut *r)
        .await?;
        self.done(r).await?;
        Ok(row.as_ref().map(job_row))
    }

    async fn has_due(&self, types: &[String]) -> Result<bool> {
        if types.is_empty() {
            return Ok(false);
        }
        self.counted(1);
        let mut args = SqliteArguments::default();
        bind_some_due(&mut args, types, self.clock_ms())?;
        Ok(
            sqlx::query_scalar_with(&format!("SELECT {}", some_due(types.len())), args)
                .fetch_one(&self.pool)
                .await?,
        )
    }

    async fn max_seq(&self) -> Result<i64> {
        self.counted(1);
        Ok(
            sqlx::query_scalar("SELECT coalesce(max(seq), 0) FROM gnl_jobs")
                .fetch_one(&self.pool)
                .await?,
        )
    }

    async fn list_jobs(&self, q: &ListQuery) -> Result<Vec<JobRow>> {
        self.counted(1);
        let mut r = self.read().await?;
        let rows = match &q.scope {
            ListScope::Lane { org, state, typ } => {
                let after = q.after.as_ref().map(|a| a.1).unwrap_or(0);
                sqlx::query(&format!(
                    "SELECT {JOB_COLS} FROM gnl_jobs WHERE org = ?1 AND seq > ?2 AND seq <= ?3 \
                       AND (?4 IS NULL OR state = ?4) AND (?5 IS NULL OR type = ?5) \
                     ORDER BY seq LIMIT ?6"
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
                    "SELECT {JOB_COLS} FROM gnl_jobs WHERE (org, seq) > (?1, ?2) AND seq <= ?3 \
                     ORDER BY org, seq LIMIT ?4"
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
        let _w = self.write.lock().await;
        let mut tx = self.begin_write().await?;
        let now = self.clock_ms();
        self.counted(1);
        let row: Option<String> = sqlx::query_scalar(
            "UPDATE gnl_jobs SET state = 'pending', attempts = 0, run_at = ?3, updated_at = ?3, \
               finished_at = NULL, cancel_requested = 0 \
             WHERE org = ?1 AND id = ?2 AND state = 'dead' RETURNING type",
        )
        .bind(org)
        .bind(id)
        .bind(now)
        .fetch_optional(&mut *tx)
        .await?;
        let ok = row.is_some();
        if let Some(typ) = row {
            self.lane_due(&mut tx, org, &typ, now).await?;
        }
        self.commit(tx).await?;
        Ok(ok)
    }

    async fn cancel_job(&self, org: &str, id: &str, reason: Option<&str>) -> Result<bool> {
        let _w = self.write.lock().await;
        let mut tx = self.begin_write().await?;
        let now = self.clock_ms();
        let why = format!("canceled: {}", reason.unwrap_or("cancel_job was called"));
        self.counted(1);
        let n = sqlx::query(
            "UPDATE gnl_jobs SET \
               state = CASE WHEN state = 'pending' THEN 'canceled' ELSE state END, \
               finished_at = CASE WHEN state = 'pending' THEN ?3 ELSE finished_at END, \
               cancel_requested = 1, last_error = ?4, updated_at = ?3 \
             WHERE org = ?1 AND id = ?2 AND state IN ('pending', 'running')",
        )
        .bind(org)
        .bind(id)
        .bind(now)
        .bind(&why)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        self.commit(tx).await?;
        Ok(n > 0)
    }

    async fn list_orgs(&self, after: Option<&str>, limit: i64) -> Result<Vec<String>> {
        self.counted(1);
        let mut r = self.read().await?;
        let orgs = sqlx::query_scalar(
            "SELECT DISTINCT org FROM gnl_lanes WHERE ?1 IS NULL OR org > ?1 ORDER BY org LIMIT ?2",
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
        self.counted(1);
        let mut r = self.read_within(timeout_ms.max(1)).await?;
        let rows: Vec<(String, Option<i64>, i64)> = sqlx::query_as(
            "SELECT state, CASE WHEN finished_at >= ?2 THEN (finished_at - ?2) / 60000 END AS m, \
                    count(*) \
             FROM (SELECT state, finished_at FROM gnl_jobs WHERE org = ?1 \
                   ORDER BY seq DESC LIMIT ?3) GROUP BY state, m",
        )
        .bind(org)
        .bind(since_ms)
        .bind(scan)
        .fetch_all(&mut *r)
        .await?;
        self.done(r).await?;
        Ok(job_counts(rows))
    }
}
