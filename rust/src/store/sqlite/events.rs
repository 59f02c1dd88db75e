//! The SQLite event log (`EventStore`). Writes run in one `BEGIN IMMEDIATE` transaction behind
//! the process's write lock, so SQLite serialises every emitter and consumer write: an emit
//! reads its topic's counter, numbers its events after it and writes it back before anyone else
//! may write (docs/DECISIONS.md "Events").
//!
//! A consumer's fetch and settle are its hot path: each is one transaction on the raw
//! connection (`raw.rs`, one hop; at once on the calling thread when the locks are free), and a
//! fetched batch of fresh events is an in-flight span on the consumer row rather than a mark
//! per event (`Held`; DECISIONS "Events: the in-flight span"), so a batch accepted whole
//! writes no mark.

use std::collections::{HashMap, HashSet};

use async_trait::async_trait;
use sqlx::Row;

use super::raw::{Db, Val};
use super::SqliteStore;
use crate::error::Result;
use crate::model::JobBatch;
use crate::store::events::*;

/// The due candidates of a fetch past the cursor (`?1` topic, `?2` name, `?3` cursor, `?4`
/// now, `?5` limit) and the handed-back events below it; the last column says whether the
/// event goes out alone (`pick`): a mark charged before, or a batch delivery never settled.
// Each arm is limited and ordered on its own (an index walk that stops after `?5` rows): a
// limit only on the union made SQLite sort the whole backlog past the cursor on every fetch.
const CANDIDATES: &str = "SELECT seq, id, org, payload, emitted_at, attempts, marked, lone FROM ( \
       SELECT * FROM (SELECT e.seq, e.id, e.org, e.payload, e.emitted_at, \
         coalesce(m.attempts, 0) AS attempts, m.seq IS NOT NULL AS marked, \
         m.seq IS NOT NULL AND (m.attempts > 0 OR m.batched = 1) AS lone \
       FROM gnl_events e LEFT JOIN gnl_event_marks m \
         ON m.topic = e.topic AND m.name = ?2 AND m.seq = e.seq \
       WHERE e.topic = ?1 AND e.seq > ?3 AND e.deliver_at <= ?4 \
         AND (m.seq IS NULL OR (m.state = 'wait' AND m.due_at <= ?4)) \
       ORDER BY e.seq LIMIT ?5) \
       UNION ALL \
       SELECT * FROM (SELECT e.seq, e.id, e.org, e.payload, e.emitted_at, m.attempts, 1, \
         m.attempts > 0 OR m.batched = 1 \
       FROM gnl_event_marks m JOIN gnl_events e ON e.topic = m.topic AND e.seq = m.seq \
       WHERE m.topic = ?1 AND m.name = ?2 AND m.seq <= ?3 AND m.state = 'wait' AND m.due_at <= ?4 \
       ORDER BY m.seq LIMIT ?5)) \
     ORDER BY seq LIMIT ?5";

/// Check the fencing token (`?3`) and write the heartbeat (`?4`); the consumer's cursor and
/// span when the token holds it.
const HOLD: &str = "UPDATE gnl_consumers SET heartbeat_at = ?4 \
     WHERE topic = ?1 AND name = ?2 AND token = ?3 RETURNING cursor_seq, span_hi, span_at, span_n";

/// Set the span (`?3` last seq, `?4` fetched at, `?5` events) and the cursor (`?6`).
const SET_SPAN: &str = "UPDATE gnl_consumers SET span_hi = ?3, span_at = ?4, span_n = ?5, \
     cursor_seq = ?6 WHERE topic = ?1 AND name = ?2";

/// Turn a span into marks: every event in it that has no mark (`?3` cursor, `?4` last seq,
/// `?5` fetched at) was delivered in a batch and not settled, so that delivery is not charged:
/// a `wait` mark, attempts 0, `batched` (it goes out alone, charged), due at `?6`.
const SPAN_TO_MARKS: &str =
    "INSERT INTO gnl_event_marks (topic, name, seq, state, attempts, due_at, batched) \
     SELECT e.topic, ?2, e.seq, 'wait', 0, ?6, 1 FROM gnl_events e \
     WHERE e.topic = ?1 AND e.seq > ?3 AND e.seq <= ?4 AND e.deliver_at <= ?5 \
       AND NOT EXISTS (SELECT 1 FROM gnl_event_marks m \
         WHERE m.topic = e.topic AND m.name = ?2 AND m.seq = e.seq)";

/// Put a mark (`?3` seq, `?4` state, `?5` attempts, `?6` due at, `?7` error) on an event that
/// has none (a span's event).
const NEW_MARK: &str =
    "INSERT INTO gnl_event_marks (topic, name, seq, state, attempts, due_at, error) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT (topic, name, seq) DO NOTHING";

/// A delivered marked event (`?3`): its attempts `?4` (charged, or not for a batch: `?6`
/// batched); it waits, due at `?5`.
const REDELIVERED: &str = "UPDATE gnl_event_marks \
     SET attempts = ?4, state = 'wait', due_at = ?5, batched = ?6 \
     WHERE topic = ?1 AND name = ?2 AND seq = ?3";

const MARK_OK: &str = "UPDATE gnl_event_marks SET state = 'ok', error = NULL \
     WHERE topic = ?1 AND name = ?2 AND seq = ?3 AND state = 'wait'";

const UNDEAD: &str = "DELETE FROM gnl_dead_events WHERE topic = ?1 AND name = ?2 AND seq = ?3";

/// A failure settled: a batch delivery's attempt is charged now.
const MARK_RETRY: &str = "UPDATE gnl_event_marks \
     SET due_at = ?4, error = ?5, attempts = attempts + batched, batched = 0 \
     WHERE topic = ?1 AND name = ?2 AND seq = ?3 AND state = 'wait'";

const MARK_DEAD: &str = "UPDATE gnl_event_marks \
     SET state = 'dead', error = ?4, attempts = attempts + batched, batched = 0 \
     WHERE topic = ?1 AND name = ?2 AND seq = ?3 AND state = 'wait' RETURNING attempts";

const DEAD_RECORD: &str =
    "INSERT INTO gnl_dead_events (topic, name, seq, attempts, error, at, handed_back) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, 0) ON CONFLICT (topic, name, seq) DO UPDATE \
     SET attempts = excluded.attempts, error = excluded.error, at = excluded.at, handed_back = 0";

/// The marks of seqs `?3..=?4`.
const MARKS_IN: &str = "SELECT seq, state FROM gnl_event_marks \
     WHERE topic = ?1 AND name = ?2 AND seq >= ?3 AND seq <= ?4";

/// The marks past `?3`, in seq order (read until the cursor stops).
const MARKS_PAST: &str = "SELECT seq, state FROM gnl_event_marks \
     WHERE topic = ?1 AND name = ?2 AND seq > ?3 ORDER BY seq";

const PASSED_MARKS: &str = "DELETE FROM gnl_event_marks \
     WHERE topic = ?1 AND name = ?2 AND seq <= ?3 AND state <> 'wait'";

/// A consumer row as its holder reads it (`HOLD`). The span is the fetched batch of fresh
/// events in flight, kept on the row instead of a mark per event: every event in
/// `(cursor, hi]` with no mark and `deliver_at <= at` was delivered in a batch (uncharged) and
/// is not settled (`n` of them; `n = 0`: no span). See docs/DECISIONS.md "Events: the in-flight span".
struct Held {
    cursor: i64,
    hi: i64,
    at: i64,
    n: i64,
}

fn hold(db: &mut Db, topic: &str, name: &str, token: i64, now: i64) -> Result<Option<Held>> {
    let args = [topic.into(), name.into(), token.into(), now.into()];
    Ok(db
        .rows(HOLD, &args, true)?
        .into_iter()
        .next()
        .map(|r| Held {
            cursor: r[0].int(),
            hi: r[1].int(),
            at: r[2].int(),
            n: r[3].int(),
        }))
}

/// Turn a live span into `batched` `wait` marks, uncharged (its holder died, or settled only
/// part of it): they go out alone, each charged at its fetch.
fn span_to_marks(db: &mut Db, topic: &str, name: &str, h: &Held, now: i64) -> Result<()> {
    let args = [
        topic.into(),
        name.into(),
        h.cursor.into(),
        h.hi.into(),
        h.at.into(),
        now.into(),
    ];
    db.exec(SPAN_TO_MARKS, &args, true)?;
    Ok(())
}

fn set_span(db: &mut Db, topic: &str, name: &str, span: [i64; 3], cursor: i64) -> Result<()> {
    let args = [
        topic.into(),
        name.into(),
        span[0].into(),
        span[1].into(),
        span[2].into(),
        cursor.into(),
    ];
    db.exec(SET_SPAN, &args, true)?;
    Ok(())
}

/// A mark on a span's event (which has none): `state` with attempts 1, due at `due`.
fn new_mark(db: &mut Db, key: [Val; 3], state: &str, due: i64, error: Option<&str>) -> Result<()> {
    let [t, n, s] = key;
    let args = [t, n, s, state.into(), Val::Int(1), due.into(), error.into()];
    db.exec(NEW_MARK, &args, true)?;
    Ok(())
}

fn fetch_tx(
    db: &mut Db,
    topic: &str,
    name: &str,
    token: i64,
    limit: i64,
    now: i64,
) -> Result<Option<Vec<EventRow>>> {
    let Some(h) = hold(db, topic, name, token, now)? else {
        return Ok(None);
    };
    if h.n > 0 {
        span_to_marks(db, topic, name, &h, now)?;
    }
    let args = [
        topic.into(),
        name.into(),
        h.cursor.into(),
        now.into(),
        limit.clamp(1, MAX_FETCH).into(),
    ];
    let mut marked = vec![];
    let due: Vec<(EventRow, bool)> = db
        .rows(CANDIDATES, &args, true)?
        .into_iter()
        .map(|r| {
            let mut r = r.into_iter();
            let mut next = || r.next().unwrap_or(Val::Null);
            let (seq, id, org, payload) = (next().int(), next(), next(), next());
            let (emitted_at, attempts) = (next().int(), next().int());
            marked.push(next().int() != 0);
            let lone = next().int() != 0;
            let e = EventRow {
                seq,
                id: id.text().unwrap_or_default(),
                org: org.text().unwrap_or_default(),
                payload: payload.text().unwrap_or_default(),
                emitted_at,
                attempt: attempts + 1,
            };
            (e, lone)
        })
        .collect();
    // `pick` keeps a prefix of the candidates (a lone event alone, or the others up to the
    // first lone one), so every unmarked due event up to the span's last is handed out.
    let out = pick(due);
    let (mut hi, mut n) = (0, 0);
    for ((e, lone), &m) in out.iter().zip(&marked) {
        if m {
            let (attempts, batched) = fetch_charge(e, *lone);
            let args = [
                topic.into(),
                name.into(),
                e.seq.into(),
                attempts.into(),
                now.into(),
                batched.into(),
            ];
            db.exec(REDELIVERED, &args, true)?;
        } else {
            (hi, n) = (e.seq, n + 1);
        }
    }
    if n > 0 || h.n > 0 {
        set_span(db, topic, name, [hi, now, n], h.cursor)?;
    }
    Ok(Some(out.into_iter().map(|(e, _)| e).collect()))
}

/// Write `outcomes` for the holder of `token` and move the cursor (`EventStore::event_settle`).
fn settle_tx(
    db: &mut Db,
    topic: &str,
    name: &str,
    token: i64,
    outcomes: &[EventOutcome],
    now: i64,
) -> Result<bool> {
    let Some(h) = hold(db, topic, name, token, now)? else {
        return Ok(false);
    };
    let key = |seq: i64| -> [Val; 3] { [topic.into(), name.into(), seq.into()] };
    // Which outcomes are of marked events (true: waiting), which of the span's.
    let mut marks: HashMap<i64, bool> = HashMap::new();
    let seqs = || outcomes.iter().map(EventOutcome::seq);
    if let (Some(lo), Some(hi)) = (seqs().min(), seqs().max()) {
        let args = [topic.into(), name.into(), lo.into(), hi.into()];
        for r in db.rows(MARKS_IN, &args, true)? {
            marks.insert(r[0].int(), is_wait(&r[1]));
        }
    }
    let mut accepted = vec![];
    let mut spanned = HashSet::new();
    for o in outcomes {
        let seq = o.seq();
        let waiting = match marks.get(&seq) {
            Some(&w) => w,
            None if h.n > 0 && h.cursor < seq && seq <= h.hi && spanned.insert(seq) => false,
            // Settled before, or never delivered: the compare-and-set writes nothing.
            None => continue,
        };
        let (error, retry) = match o {
            EventOutcome::Accepted { .. } if waiting => {
                db.exec(MARK_OK, &key(seq), true)?;
                db.exec(UNDEAD, &key(seq), true)?;
                continue;
            }
            EventOutcome::Accepted { .. } => {
                accepted.push(seq);
                continue;
            }
            EventOutcome::Failed {
                error,
                retry_after_ms,
                ..
            } => (error.as_str(), *retry_after_ms),
        };
        let [t, nm, sq] = key(seq);
        match retry {
            Some(d) if waiting => {
                let args = [t, nm, sq, now.saturating_add(d).into(), error.into()];
                db.exec(MARK_RETRY, &args, true)?;
            }
            Some(d) => new_mark(db, key(seq), "wait", now.saturating_add(d), Some(error))?,
            None => {
                let attempts = if waiting {
                    let rows = db.rows(MARK_DEAD, &[t, nm, sq, error.into()], true)?;
                    rows.into_iter().next().map(|r| r[0].int())
                } else {
                    new_mark(db, key(seq), "dead", now, Some(error))?;
                    Some(1)
                };
                if let Some(a) = attempts {
                    let [t, nm, sq] = key(seq);
                    let args = [t, nm, sq, a.into(), error.into(), now.into()];
                    db.exec(DEAD_RECORD, &args, true)?;
                }
            }
        }
    }
    if h.n > 0 && (spanned.len() as i64) < h.n {
        // Part of the span was not settled (the holder lost its lease mid-batch): its accepted
        // events get marks, the rest `batched` `wait` marks (that delivery is not charged).
        for &seq in &accepted {
            new_mark(db, key(seq), "ok", now, None)?;
        }
        accepted.clear();
        span_to_marks(db, topic, name, &h, now)?;
    }
    let (cursor, passed_marks) = next_cursor_db(db, topic, name, h.cursor, &mut accepted)?;
    if cursor != h.cursor || h.n > 0 {
        set_span(db, topic, name, [0, 0, 0], cursor)?;
    }
    // Accepted events the cursor could not pass (a retry or a not-yet-due event holds it).
    for &seq in accepted.iter().filter(|&&s| s > cursor) {
        new_mark(db, key(seq), "ok", now, None)?;
    }
    if passed_marks || outcomes.iter().any(|o| o.seq() <= h.cursor) {
        db.exec(
            PASSED_MARKS,
            &[topic.into(), name.into(), cursor.into()],
            true,
        )?;
    }
    Ok(true)
}

fn is_wait(state: &Val) -> bool {
    matches!(state, Val::Text(s) if s == "wait")
}

/// The cursor after a settle, and whether it passed marks: it passes `accepted` (span events
/// with no mark, sorted here) and accepted or quarantined marks, up to the first event that is
/// neither. Seqs are gapless (every seq up to the last visible one is an event), so only the
/// marks past the cursor are read, and only as far as the cursor goes.
fn next_cursor_db(
    db: &mut Db,
    topic: &str,
    name: &str,
    cursor: i64,
    accepted: &mut [i64],
) -> Result<(i64, bool)> {
    accepted.sort_unstable();
    let mut acc = accepted.iter().peekable();
    let mut next = cursor + 1;
    // Pass accepted span events up to `below`; false when one before it is not accepted.
    let mut pass = |next: &mut i64, below: i64| {
        while *next < below {
            while acc.next_if(|&&a| a < *next).is_some() {}
            if acc.next_if(|&&a| a == *next).is_none() {
                return false;
            }
            *next += 1;
        }
        true
    };
    let (mut passed_marks, mut open) = (false, false);
    let args = [topic.into(), name.into(), cursor.into()];
    db.each(MARKS_PAST, &args, true, |r| {
        let seq = r[0].int();
        if !pass(&mut next, seq) || (seq == next && is_wait(&r[1])) {
            open = true;
            return false;
        }
        if seq == next {
            passed_marks = true;
            next += 1;
        }
        true
    })?;
    if !open {
        pass(&mut next, i64::MAX);
    }
    Ok((next - 1, passed_marks))
}

#[async_trait]
impl EventStore for SqliteStore {
    async fn emit(&self, topic: &str, events: &JobBatch) -> Result<()> {
        if events.is_empty() {
            return Ok(());
        }
        let _w = self.write.lock().await;
        let mut tx = self.begin_write().await?;
        // The clock once the write lock is held: every event committed before is due by now.
        let now = self.clock_ms();
        self.counted(1);
        let last: i64 = sqlx::query_scalar("SELECT last_seq FROM gnl_topics WHERE topic = ?1")
            .bind(topic)
            .fetch_optional(&mut *tx)
            .await?
            .unwrap_or(0);
        let mut taken = HashSet::new();
        if last > 0 {
            let per = (self.var_limit - 1).max(1);
            let ids: Vec<&str> = events.iter().map(|e| e.id).collect();
            for chunk in ids.chunks(per) {
                let sql = format!(
                    "SELECT id FROM gnl_events WHERE topic = ? AND id IN ({})",
                    vec!["?"; chunk.len()].join(", ")
                );
                let mut q = sqlx::query_scalar::<_, String>(&sql).bind(topic);
                for id in chunk {
                    q = q.bind(*id);
                }
                self.counted(1);
                taken.extend(q.fetch_all(&mut *tx).await?);
            }
        }
        let rows = fresh(events, &taken);
        let per = (self.var_limit / 7).max(1);
        let mut seq = last;
        for chunk in rows.chunks(per) {
            let sql = format!(
                "INSERT INTO gnl_events (topic, seq, id, org, payload, deliver_at, emitted_at) VALUES {}",
                vec!["(?, ?, ?, ?, ?, ?, ?)"; chunk.len()].join(", ")
            );
            let mut q = sqlx::query(&sql);
            for &i in chunk {
                let e = events.get(i);
                seq += 1;
                q = q
                    .bind(topic)
                    .bind(seq)
                    .bind(e.id)
                    .bind(e.org)
                    .bind(e.payload)
                    .bind(e.due.at(now))
                    .bind(now);
            }
            self.counted(1);
            q.execute(&mut *tx).await?;
        }
        if seq > last {
            self.counted(1);
            sqlx::query(
                "INSERT INTO gnl_topics (topic, last_seq) VALUES (?1, ?2) \
                 ON CONFLICT (topic) DO UPDATE SET last_seq = excluded.last_seq",
            )
            .bind(topic)
            .bind(seq)
            .execute(&mut *tx)
            .await?;
        }
        self.commit(tx).await
    }

    async fn consumer_open(&self, topic: &str, name: &str, token: i64) -> Result<bool> {
        let now = self.clock_ms();
        let _w = self.write.lock().await;
        self.counted(1);
        Ok(sqlx::query(
            "INSERT INTO gnl_consumers (topic, name, cursor_seq, token, heartbeat_at) \
             VALUES (?1, ?2, 0, ?3, ?4) ON CONFLICT (topic, name) DO UPDATE \
             SET token = excluded.token, heartbeat_at = excluded.heartbeat_at \
             WHERE gnl_consumers.token < excluded.token",
        )
        .bind(topic)
        .bind(name)
        .bind(token)
        .bind(now)
        .execute(&self.pool)
        .await?
        .rows_affected()
            == 1)
    }

    async fn event_fetch(
        &self,
        topic: &str,
        name: &str,
        token: i64,
        limit: i64,
    ) -> Result<Option<Vec<EventRow>>> {
        let (topic, name) = (topic.to_string(), name.to_string());
        self.on_raw(move |db, now| db.write(|db| fetch_tx(db, &topic, &name, token, limit, now)))
            .await
    }

    async fn event_settle(
        &self,
        topic: &str,
        name: &str,
        token: i64,
        outcomes: &[EventOutcome],
    ) -> Result<bool> {
        let (topic, name, outcomes) = (topic.to_string(), name.to_string(), outcomes.to_vec());
        self.on_raw(move |db, now| {
            db.write(|db| settle_tx(db, &topic, &name, token, &outcomes, now))
        })
        .await
    }

    fn event_fetch_now(
        &self,
        topic: &str,
        name: &str,
        token: i64,
        limit: i64,
    ) -> Option<Result<Option<Vec<EventRow>>>> {
        self.on_raw_now(|db, now| db.write(|db| fetch_tx(db, topic, name, token, limit, now)))
    }

    fn event_settle_now(
        &self,
        topic: &str,
        name: &str,
        token: i64,
        outcomes: &[EventOutcome],
    ) -> Option<Result<bool>> {
        self.on_raw_now(|db, now| db.write(|db| settle_tx(db, topic, name, token, outcomes, now)))
    }

    async fn consumer_lag(&self, topic: &str, name: &str) -> Result<Option<ConsumerLag>> {
        self.counted(1);
        let mut r = self.read().await?;
        let row = sqlx::query(
            "SELECT c.cursor_seq, c.heartbeat_at, \
               (SELECT count(*) FROM gnl_dead_events d WHERE d.topic = c.topic AND d.name = c.name), \
               (SELECT count(*) FROM gnl_events e WHERE e.topic = c.topic AND e.seq > c.cursor_seq \
                  AND NOT EXISTS (SELECT 1 FROM gnl_event_marks m WHERE m.topic = e.topic \
                    AND m.name = c.name AND m.seq = e.seq AND m.state <> 'wait')), \
               (SELECT min(e.emitted_at) FROM gnl_events e WHERE e.topic = c.topic AND e.seq > c.cursor_seq \
                  AND NOT EXISTS (SELECT 1 FROM gnl_event_marks m WHERE m.topic = e.topic \
                    AND m.name = c.name AND m.seq = e.seq AND m.state <> 'wait')), \
               (SELECT count(*) FROM gnl_event_marks m WHERE m.topic = c.topic AND m.name = c.name \
                  AND m.seq <= c.cursor_seq AND m.state = 'wait'), \
               (SELECT min(e.emitted_at) FROM gnl_event_marks m JOIN gnl_events e \
                  ON e.topic = m.topic AND e.seq = m.seq WHERE m.topic = c.topic AND m.name = c.name \
                  AND m.seq <= c.cursor_seq AND m.state = 'wait') \
             FROM gnl_consumers c WHERE c.topic = ?1 AND c.name = ?2",
        )
        .bind(topic)
        .bind(name)
        .fetch_optional(&mut *r)
        .await?;
        self.done(r).await?;
        Ok(row.map(|r| {
            lag_of(
                r.get(0),
                r.get(1),
                r.get(2),
                r.get(3),
                r.get(4),
                r.get(5),
                r.get(6),
            )
        }))
    }

    async fn dead_events(
        &self,
        topic: &str,
        name: &str,
        after_seq: i64,
        limit: i64,
    ) -> Result<Vec<DeadEventRow>> {
        self.counted(1);
        let mut r = self.read().await?;
        let rows = sqlx::query(
            "SELECT e.id, d.seq, e.org, d.attempts, d.error, d.at, e.payload, d.handed_back \
             FROM gnl_dead_events d JOIN gnl_events e ON e.topic = d.topic AND e.seq = d.seq \
             WHERE d.topic = ?1 AND d.name = ?2 AND d.seq > ?3 ORDER BY d.seq LIMIT ?4",
        )
        .bind(topic)
        .bind(name)
        .bind(after_seq)
        .bind(limit)
        .fetch_all(&mut *r)
        .await?;
        self.done(r).await?;
        Ok(rows
            .iter()
            .map(|r| DeadEventRow {
                id: r.get(0),
                seq: r.get(1),
                org: r.get(2),
                attempts: r.get(3),
                error: r.get(4),
                at: r.get(5),
                payload: r.get(6),
                handed_back: r.get::<i64, _>(7) != 0,
            })
            .collect())
    }

    async fn consumers(&self, after: Option<(&str, &str)>, limit: i64) -> Result<Vec<ConsumerRow>> {
        self.counted(1);
        let mut r = self.read().await?;
        let rows = sqlx::query(
            "SELECT c.topic, c.name, c.heartbeat_at, \
               (SELECT count(*) FROM gnl_dead_events d WHERE d.topic = c.topic AND d.name = c.name) \
             FROM gnl_consumers c WHERE ?1 IS NULL OR (c.topic, c.name) > (?1, ?2) \
             ORDER BY c.topic, c.name LIMIT ?3",
        )
        .bind(after.map(|a| a.0))
        .bind(after.map(|a| a.1))
        .bind(limit)
        .fetch_all(&mut *r)
        .await?;
        self.done(r).await?;
        Ok(rows
            .iter()
            .map(|r| ConsumerRow {
                topic: r.get(0),
                name: r.get(1),
                heartbeat_at: r.get(2),
                dead: r.get(3),
            })
            .collect())
    }

    async fn dead_retry(&self, topic: &str, name: &str, id: &str) -> Result<bool> {
        let _w = self.write.lock().await;
        let mut tx = self.begin_write().await?;
        // The clock once the write lock is held: every event committed before is due by now.
        let now = self.clock_ms();
        self.counted(1);
        let row = sqlx::query(
            "SELECT d.seq, d.handed_back FROM gnl_dead_events d \
             JOIN gnl_events e ON e.topic = d.topic AND e.seq = d.seq \
             WHERE d.topic = ?1 AND d.name = ?2 AND e.id = ?3",
        )
        .bind(topic)
        .bind(name)
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else {
            self.commit(tx).await?;
            return Ok(false);
        };
        let (seq, back): (i64, i64) = (row.get(0), row.get(1));
        if back == 0 {
            self.counted(2);
            sqlx::query("UPDATE gnl_dead_events SET handed_back = 1 WHERE topic = ?1 AND name = ?2 AND seq = ?3")
                .bind(topic)
                .bind(name)
                .bind(seq)
                .execute(&mut *tx)
                .await?;
            sqlx::query(
                "INSERT INTO gnl_event_marks (topic, name, seq, state, attempts, due_at) \
                 VALUES (?1, ?2, ?3, 'wait', 0, ?4) ON CONFLICT (topic, name, seq) DO UPDATE \
                 SET state = 'wait', attempts = 0, due_at = excluded.due_at",
            )
            .bind(topic)
            .bind(name)
            .bind(seq)
            .bind(now)
            .execute(&mut *tx)
            .await?;
        }
        self.commit(tx).await?;
        Ok(true)
    }
}
