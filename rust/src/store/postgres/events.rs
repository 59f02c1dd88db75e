//! The Postgres event log (`EventStore`). An emit locks its topic's counter row with an upsert
//! (`ON CONFLICT … DO UPDATE`), numbers its events after it and writes it back in the same
//! transaction: a concurrent emitter of the topic waits on that row until this one commits or
//! rolls back, so seqs are assigned in commit order and gapless among committed events
//! (docs/DECISIONS.md "Events"). Batches travel as arrays (`unnest`): no bind-parameter limit.
//! A consumer's writes start by updating its cursor row under the fencing token, which also
//! serialises them against a stale holder.

use std::collections::HashSet;

use async_trait::async_trait;
use sqlx::Row;

use super::{pg_text, PostgresStore, Tx};
use crate::error::Result;
use crate::model::JobBatch;
use crate::store::events::*;

/// Rows per `INSERT … SELECT FROM unnest(…)` of an emit.
const EMIT_ROWS: usize = 20_000;

// Each arm is ordered and limited on its own (an index walk that stops after `$5` rows): a
// limit only on the union made Postgres read and sort the whole backlog on every fetch. An
// event's mark is one index probe (a LATERAL with LIMIT 1 is not flattened into a join): as a
// join, the planner sorted or hashed the whole marks table, whose dead rows (a batch's marks
// are written at fetch and deleted at settle) grow until a vacuum.
// The last column says whether the event goes out alone (`pick`).
const CANDIDATES: &str = "SELECT seq, id, org, payload, emitted_at, attempts, lone FROM ( \
       (SELECT e.seq, e.id, e.org, e.payload, e.emitted_at, coalesce(m.attempts, 0) AS attempts, \
         coalesce(m.attempts > 0 OR m.batched = 1, false) AS lone \
       FROM gnl_events e LEFT JOIN LATERAL (SELECT m.attempts, m.state, m.due_at, m.batched \
         FROM gnl_event_marks m WHERE m.topic = e.topic AND m.name = $2 AND m.seq = e.seq \
         LIMIT 1) m ON true \
       WHERE e.topic = $1 AND e.seq > $3 AND e.deliver_at <= $4 \
         AND (m.state IS NULL OR (m.state = 'wait' AND m.due_at <= $4)) \
       ORDER BY e.seq LIMIT $5) \
       UNION ALL \
       (SELECT e.seq, e.id, e.org, e.payload, e.emitted_at, m.attempts, \
         m.attempts > 0 OR m.batched = 1 \
       FROM gnl_event_marks m JOIN gnl_events e ON e.topic = m.topic AND e.seq = m.seq \
       WHERE m.topic = $1 AND m.name = $2 AND m.seq <= $3 AND m.state = 'wait' AND m.due_at <= $4 \
       ORDER BY m.seq LIMIT $5)) c \
     ORDER BY seq LIMIT $5";

impl PostgresStore {
    /// Check the fencing token and write the heartbeat: `(cursor, now)` when `token` holds it.
    async fn hold(
        &self,
        tx: &mut Tx,
        topic: &str,
        name: &str,
        token: i64,
    ) -> Result<Option<(i64, i64)>> {
        self.counted(1);
        let row = sqlx::query(concat!(
            "UPDATE gnl_consumers SET heartbeat_at = ",
            now_ms!(),
            " WHERE topic = $1 AND name = $2 AND token = $3 RETURNING cursor_seq, heartbeat_at"
        ))
        .bind(topic)
        .bind(name)
        .bind(token)
        .fetch_optional(&mut **tx)
        .await?;
        Ok(row.map(|r| (r.get(0), r.get(1))))
    }
}

#[async_trait]
impl EventStore for PostgresStore {
    async fn emit(&self, topic: &str, events: &JobBatch) -> Result<()> {
        if events.is_empty() {
            return Ok(());
        }
        let mut tx = self.begin().await?;
        self.counted(1);
        let row = sqlx::query(concat!(
            "INSERT INTO gnl_topics (topic, last_seq) VALUES ($1, 0) \
             ON CONFLICT (topic) DO UPDATE SET last_seq = gnl_topics.last_seq \
             RETURNING last_seq, ",
            now_ms!()
        ))
        .bind(topic)
        .fetch_one(&mut *tx)
        .await?;
        let (last, now): (i64, i64) = (row.get(0), row.get(1));
        let mut taken = HashSet::new();
        if last > 0 {
            let ids: Vec<&str> = events.iter().map(|e| e.id).collect();
            self.counted(1);
            taken.extend(
                sqlx::query_scalar::<_, String>(
                    "SELECT id FROM gnl_events WHERE topic = $1 AND id = ANY($2::text[])",
                )
                .bind(topic)
                .bind(&ids)
                .fetch_all(&mut *tx)
                .await?,
            );
        }
        let rows = fresh(events, &taken);
        let mut seq = last;
        for chunk in rows.chunks(EMIT_ROWS) {
            let n = chunk.len();
            let (mut seqs, mut ids, mut orgs, mut payloads, mut dues) = (
                Vec::with_capacity(n),
                Vec::with_capacity(n),
                Vec::with_capacity(n),
                Vec::with_capacity(n),
                Vec::with_capacity(n),
            );
            for &i in chunk {
                let e = events.get(i);
                seq += 1;
                seqs.push(seq);
                ids.push(e.id);
                orgs.push(e.org);
                payloads.push(e.payload);
                dues.push(e.due.at(now));
            }
            self.counted(1);
            sqlx::query(
                "INSERT INTO gnl_events (topic, seq, id, org, payload, deliver_at, emitted_at) \
                 SELECT $1, s, i, o, p, d, $7 \
                 FROM unnest($2::bigint[], $3::text[], $4::text[], $5::text[], $6::bigint[]) AS u(s, i, o, p, d)",
            )
            .bind(topic)
            .bind(&seqs)
            .bind(&ids)
            .bind(&orgs)
            .bind(&payloads)
            .bind(&dues)
            .bind(now)
            .execute(&mut *tx)
            .await?;
        }
        if seq > last {
            self.counted(1);
            sqlx::query("UPDATE gnl_topics SET last_seq = $2 WHERE topic = $1")
                .bind(topic)
                .bind(seq)
                .execute(&mut *tx)
                .await?;
        }
        self.commit(tx).await
    }

    async fn consumer_open(&self, topic: &str, name: &str, token: i64) -> Result<bool> {
        self.counted(1);
        Ok(sqlx::query(concat!(
            "INSERT INTO gnl_consumers (topic, name, cursor_seq, token, heartbeat_at) \
             VALUES ($1, $2, 0, $3, ",
            now_ms!(),
            ") ON CONFLICT (topic, name) DO UPDATE \
             SET token = excluded.token, heartbeat_at = excluded.heartbeat_at \
             WHERE gnl_consumers.token < excluded.token"
        ))
        .bind(topic)
        .bind(name)
        .bind(token)
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
        let mut tx = self.begin().await?;
        let Some((cursor, now)) = self.hold(&mut tx, topic, name, token).await? else {
            self.rollback(tx).await?;
            return Ok(None);
        };
        self.counted(1);
        let due: Vec<(EventRow, bool)> = sqlx::query(CANDIDATES)
            .bind(topic)
            .bind(name)
            .bind(cursor)
            .bind(now)
            .bind(limit.clamp(1, MAX_FETCH))
            .fetch_all(&mut *tx)
            .await?
            .iter()
            .map(|r| {
                let e = EventRow {
                    seq: r.get(0),
                    id: r.get(1),
                    org: r.get(2),
                    payload: r.get(3),
                    emitted_at: r.get(4),
                    attempt: r.get::<i64, _>(5) + 1,
                };
                (e, r.get::<bool, _>(6))
            })
            .collect();
        let out = pick(due);
        if !out.is_empty() {
            let seqs: Vec<i64> = out.iter().map(|(e, _)| e.seq).collect();
            let (attempts, batched): (Vec<i64>, Vec<i64>) =
                out.iter().map(|(e, lone)| fetch_charge(e, *lone)).unzip();
            self.counted(1);
            sqlx::query(
                "INSERT INTO gnl_event_marks (topic, name, seq, state, attempts, due_at, batched) \
                 SELECT $1, $2, s, 'wait', a, $5, b \
                 FROM unnest($3::bigint[], $4::bigint[], $6::bigint[]) AS u(s, a, b) \
                 ON CONFLICT (topic, name, seq) DO UPDATE SET attempts = excluded.attempts, \
                 state = 'wait', due_at = excluded.due_at, batched = excluded.batched",
            )
            .bind(topic)
            .bind(name)
            .bind(&seqs)
            .bind(&attempts)
            .bind(now)
            .bind(&batched)
            .execute(&mut *tx)
            .await?;
        }
        self.commit(tx).await?;
        Ok(Some(out.into_iter().map(|(e, _)| e).collect()))
    }

    async fn event_settle(
        &self,
        topic: &str,
        name: &str,
        token: i64,
        outcomes: &[EventOutcome],
    ) -> Result<bool> {
        let mut tx = self.begin().await?;
        let Some((cursor, now)) = self.hold(&mut tx, topic, name, token).await? else {
            self.rollback(tx).await?;
            return Ok(false);
        };
        let accepted = accepted_seqs(outcomes);
        if !accepted.is_empty() {
            self.counted(2);
            sqlx::query(
                "UPDATE gnl_event_marks SET state = 'ok', error = NULL \
                 WHERE topic = $1 AND name = $2 AND state = 'wait' AND seq = ANY($3::bigint[])",
            )
            .bind(topic)
            .bind(name)
            .bind(&accepted)
            .execute(&mut *tx)
            .await?;
            sqlx::query("DELETE FROM gnl_dead_events WHERE topic = $1 AND name = $2 AND seq = ANY($3::bigint[])")
                .bind(topic)
                .bind(name)
                .bind(&accepted)
                .execute(&mut *tx)
                .await?;
        }
        for o in outcomes {
            let EventOutcome::Failed {
                seq,
                error,
                retry_after_ms,
            } = o
            else {
                continue;
            };
            let error = pg_text(error);
            self.counted(1);
            match retry_after_ms {
                Some(d) => {
                    sqlx::query(
                        "UPDATE gnl_event_marks SET due_at = $4, error = $5, \
                         attempts = attempts + batched, batched = 0 \
                         WHERE topic = $1 AND name = $2 AND seq = $3 AND state = 'wait'",
                    )
                    .bind(topic)
                    .bind(name)
                    .bind(seq)
                    .bind(now.saturating_add(*d))
                    .bind(&*error)
                    .execute(&mut *tx)
                    .await?;
                }
                None => {
                    sqlx::query(
                        "WITH m AS (UPDATE gnl_event_marks SET state = 'dead', error = $4, \
                           attempts = attempts + batched, batched = 0 \
                           WHERE topic = $1 AND name = $2 AND seq = $3 AND state = 'wait' RETURNING attempts) \
                         INSERT INTO gnl_dead_events (topic, name, seq, attempts, error, at, handed_back) \
                         SELECT $1, $2, $3, m.attempts, $4, $5, false FROM m \
                         ON CONFLICT (topic, name, seq) DO UPDATE SET attempts = excluded.attempts, \
                         error = excluded.error, at = excluded.at, handed_back = false",
                    )
                    .bind(topic)
                    .bind(name)
                    .bind(seq)
                    .bind(&*error)
                    .bind(now)
                    .execute(&mut *tx)
                    .await?;
                }
            }
        }
        self.counted(1);
        let row = sqlx::query(
            "SELECT (SELECT e.seq FROM gnl_events e LEFT JOIN LATERAL (SELECT m.state \
                       FROM gnl_event_marks m WHERE m.topic = e.topic AND m.name = $2 \
                       AND m.seq = e.seq LIMIT 1) m ON true \
                     WHERE e.topic = $1 AND e.seq > $3 AND (m.state IS NULL OR m.state = 'wait') \
                     ORDER BY e.seq LIMIT 1), \
                    (SELECT max(seq) FROM gnl_event_marks \
                     WHERE topic = $1 AND name = $2 AND seq > $3 AND state <> 'wait')",
        )
        .bind(topic)
        .bind(name)
        .bind(cursor)
        .fetch_one(&mut *tx)
        .await?;
        let next = next_cursor(cursor, row.get(0), row.get(1));
        if next > cursor {
            self.counted(1);
            sqlx::query("UPDATE gnl_consumers SET cursor_seq = $3 WHERE topic = $1 AND name = $2")
                .bind(topic)
                .bind(name)
                .bind(next)
                .execute(&mut *tx)
                .await?;
        }
        if next > cursor || outcomes.iter().any(|o| o.seq() <= cursor) {
            self.counted(1);
            sqlx::query(
                "DELETE FROM gnl_event_marks WHERE topic = $1 AND name = $2 AND seq <= $3 AND state <> 'wait'",
            )
            .bind(topic)
            .bind(name)
            .bind(next)
            .execute(&mut *tx)
            .await?;
        }
        self.commit(tx).await?;
        Ok(true)
    }

    async fn consumer_lag(&self, topic: &str, name: &str) -> Result<Option<ConsumerLag>> {
        self.counted(1);
        let mut r = self.read().await?;
        let row = sqlx::query(
            "SELECT c.cursor_seq, c.heartbeat_at, \
               (SELECT count(*) FROM gnl_dead_events d WHERE d.topic = c.topic AND d.name = c.name), \
               a.n, a.oldest, b.n, b.oldest \
             FROM gnl_consumers c \
             CROSS JOIN LATERAL (SELECT count(*) AS n, min(e.emitted_at) AS oldest FROM gnl_events e \
                WHERE e.topic = c.topic AND e.seq > c.cursor_seq \
                AND NOT EXISTS (SELECT 1 FROM gnl_event_marks m WHERE m.topic = e.topic \
                  AND m.name = c.name AND m.seq = e.seq AND m.state <> 'wait')) a \
             CROSS JOIN LATERAL (SELECT count(*) AS n, min(e.emitted_at) AS oldest \
                FROM gnl_event_marks m JOIN gnl_events e ON e.topic = m.topic AND e.seq = m.seq \
                WHERE m.topic = c.topic AND m.name = c.name AND m.seq <= c.cursor_seq \
                AND m.state = 'wait') b \
             WHERE c.topic = $1 AND c.name = $2",
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
             WHERE d.topic = $1 AND d.name = $2 AND d.seq > $3 ORDER BY d.seq LIMIT $4",
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
                handed_back: r.get(7),
            })
            .collect())
    }

    async fn consumers(&self, after: Option<(&str, &str)>, limit: i64) -> Result<Vec<ConsumerRow>> {
        self.counted(1);
        let mut r = self.read().await?;
        let rows = sqlx::query(
            "SELECT c.topic, c.name, c.heartbeat_at, \
               (SELECT count(*) FROM gnl_dead_events d WHERE d.topic = c.topic AND d.name = c.name) \
             FROM gnl_consumers c WHERE $1::text IS NULL OR (c.topic, c.name) > ($1, $2::text) \
             ORDER BY c.topic, c.name LIMIT $3",
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
        self.counted(1);
        let row = sqlx::query(concat!(
            "WITH d AS (SELECT d.seq, d.handed_back FROM gnl_dead_events d \
               JOIN gnl_events e ON e.topic = d.topic AND e.seq = d.seq \
               WHERE d.topic = $1 AND d.name = $2 AND e.id = $3 FOR UPDATE OF d), \
             u AS (UPDATE gnl_dead_events x SET handed_back = true FROM d \
               WHERE x.topic = $1 AND x.name = $2 AND x.seq = d.seq AND NOT d.handed_back RETURNING x.seq), \
             m AS (INSERT INTO gnl_event_marks (topic, name, seq, state, attempts, due_at) \
               SELECT $1, $2, u.seq, 'wait', 0, ",
            now_ms!(),
            " FROM u ON CONFLICT (topic, name, seq) DO UPDATE \
               SET state = 'wait', attempts = 0, due_at = excluded.due_at RETURNING 1) \
             SELECT (SELECT count(*) FROM d) + 0 * (SELECT count(*) FROM m)"
        ))
        .bind(topic)
        .bind(name)
        .bind(id)
        .fetch_one(&self.pool)
        .await?;
        Ok(row.get::<i64, _>(0) > 0)
    }
}
