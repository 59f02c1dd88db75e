//! The SQLite event log (`EventStore`). Writes run in one `BEGIN IMMEDIATE` transaction behind
//! the process's write lock, so SQLite serialises every emitter and consumer write: an emit
//! reads its topic's counter, numbers its events after it and writes it back before anyone else
//! may write (docs/DECISIONS.md "Events").

use std::collections::HashSet;

use async_trait::async_trait;
use sqlx::Row;

use super::{SqliteStore, Tx};
use crate::error::Result;
use crate::model::JobBatch;
use crate::store::events::*;

/// The due candidates of a fetch past the cursor (`?1` topic, `?2` name, `?3` cursor, `?4`
/// now, `?5` limit) and the handed-back events below it.
// Each arm is limited and ordered on its own (an index walk that stops after `?5` rows): a
// limit only on the union made SQLite sort the whole backlog past the cursor on every fetch.
const CANDIDATES: &str = "SELECT seq, id, org, payload, emitted_at, attempts FROM ( \
       SELECT * FROM (SELECT e.seq, e.id, e.org, e.payload, e.emitted_at, coalesce(m.attempts, 0) AS attempts \
       FROM gnl_events e LEFT JOIN gnl_event_marks m \
         ON m.topic = e.topic AND m.name = ?2 AND m.seq = e.seq \
       WHERE e.topic = ?1 AND e.seq > ?3 AND e.deliver_at <= ?4 \
         AND (m.seq IS NULL OR (m.state = 'wait' AND m.due_at <= ?4)) \
       ORDER BY e.seq LIMIT ?5) \
       UNION ALL \
       SELECT * FROM (SELECT e.seq, e.id, e.org, e.payload, e.emitted_at, m.attempts \
       FROM gnl_event_marks m JOIN gnl_events e ON e.topic = m.topic AND e.seq = m.seq \
       WHERE m.topic = ?1 AND m.name = ?2 AND m.seq <= ?3 AND m.state = 'wait' AND m.due_at <= ?4 \
       ORDER BY m.seq LIMIT ?5)) \
     ORDER BY seq LIMIT ?5";

impl SqliteStore {
    /// Check the fencing token and write the heartbeat; the cursor when `token` holds it.
    async fn hold(
        tx: &mut Tx<'static>,
        topic: &str,
        name: &str,
        token: i64,
        now: i64,
    ) -> Result<Option<i64>> {
        Ok(sqlx::query_scalar(
            "UPDATE gnl_consumers SET heartbeat_at = ?4 \
             WHERE topic = ?1 AND name = ?2 AND token = ?3 RETURNING cursor_seq",
        )
        .bind(topic)
        .bind(name)
        .bind(token)
        .bind(now)
        .fetch_optional(&mut **tx)
        .await?)
    }
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
        let _w = self.write.lock().await;
        let mut tx = self.begin_write().await?;
        // The clock once the write lock is held: every event committed before is due by now.
        let now = self.clock_ms();
        self.counted(1);
        let Some(cursor) = Self::hold(&mut tx, topic, name, token, now).await? else {
            self.counted(1);
            tx.rollback().await?;
            return Ok(None);
        };
        self.counted(1);
        let due: Vec<EventRow> = sqlx::query(CANDIDATES)
            .bind(topic)
            .bind(name)
            .bind(cursor)
            .bind(now)
            .bind(limit.clamp(1, MAX_FETCH))
            .fetch_all(&mut *tx)
            .await?
            .iter()
            .map(|r| EventRow {
                seq: r.get(0),
                id: r.get(1),
                org: r.get(2),
                payload: r.get(3),
                emitted_at: r.get(4),
                attempt: r.get::<i64, _>(5) + 1,
            })
            .collect();
        let out = pick(due);
        if !out.is_empty() {
            let sql = format!(
                "INSERT INTO gnl_event_marks (topic, name, seq, state, attempts, due_at) VALUES {} \
                 ON CONFLICT (topic, name, seq) DO UPDATE SET attempts = excluded.attempts, \
                 state = 'wait', due_at = excluded.due_at",
                vec!["(?, ?, ?, 'wait', ?, ?)"; out.len()].join(", ")
            );
            let mut q = sqlx::query(&sql);
            for e in &out {
                q = q
                    .bind(topic)
                    .bind(name)
                    .bind(e.seq)
                    .bind(e.attempt)
                    .bind(now);
            }
            self.counted(1);
            q.execute(&mut *tx).await?;
        }
        self.commit(tx).await?;
        Ok(Some(out))
    }

    async fn event_settle(
        &self,
        topic: &str,
        name: &str,
        token: i64,
        outcomes: &[EventOutcome],
    ) -> Result<bool> {
        let _w = self.write.lock().await;
        let mut tx = self.begin_write().await?;
        // The clock once the write lock is held: every event committed before is due by now.
        let now = self.clock_ms();
        self.counted(1);
        let Some(cursor) = Self::hold(&mut tx, topic, name, token, now).await? else {
            self.counted(1);
            tx.rollback().await?;
            return Ok(false);
        };
        let accepted = accepted_seqs(outcomes);
        for chunk in accepted.chunks((self.var_limit - 2).max(1)) {
            let list = vec!["?"; chunk.len()].join(", ");
            for sql in [
                format!("UPDATE gnl_event_marks SET state = 'ok', error = NULL WHERE topic = ? AND name = ? AND state = 'wait' AND seq IN ({list})"),
                format!("DELETE FROM gnl_dead_events WHERE topic = ? AND name = ? AND seq IN ({list})"),
            ] {
                let mut q = sqlx::query(&sql).bind(topic).bind(name);
                for s in chunk {
                    q = q.bind(*s);
                }
                self.counted(1);
                q.execute(&mut *tx).await?;
            }
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
            self.counted(1);
            match retry_after_ms {
                Some(d) => {
                    sqlx::query(
                        "UPDATE gnl_event_marks SET due_at = ?4, error = ?5 \
                         WHERE topic = ?1 AND name = ?2 AND seq = ?3 AND state = 'wait'",
                    )
                    .bind(topic)
                    .bind(name)
                    .bind(seq)
                    .bind(now.saturating_add(*d))
                    .bind(error)
                    .execute(&mut *tx)
                    .await?;
                }
                None => {
                    let attempts: Option<i64> = sqlx::query_scalar(
                        "UPDATE gnl_event_marks SET state = 'dead', error = ?4 \
                         WHERE topic = ?1 AND name = ?2 AND seq = ?3 AND state = 'wait' RETURNING attempts",
                    )
                    .bind(topic)
                    .bind(name)
                    .bind(seq)
                    .bind(error)
                    .fetch_optional(&mut *tx)
                    .await?;
                    if let Some(a) = attempts {
                        self.counted(1);
                        sqlx::query(
                            "INSERT INTO gnl_dead_events (topic, name, seq, attempts, error, at, handed_back) \
                             VALUES (?1, ?2, ?3, ?4, ?5, ?6, 0) ON CONFLICT (topic, name, seq) DO UPDATE \
                             SET attempts = excluded.attempts, error = excluded.error, at = excluded.at, \
                             handed_back = 0",
                        )
                        .bind(topic)
                        .bind(name)
                        .bind(seq)
                        .bind(a)
                        .bind(error)
                        .bind(now)
                        .execute(&mut *tx)
                        .await?;
                    }
                }
            }
        }
        self.counted(1);
        let row = sqlx::query(
            "SELECT (SELECT e.seq FROM gnl_events e LEFT JOIN gnl_event_marks m \
                       ON m.topic = e.topic AND m.name = ?2 AND m.seq = e.seq \
                     WHERE e.topic = ?1 AND e.seq > ?3 AND (m.seq IS NULL OR m.state = 'wait') \
                     ORDER BY e.seq LIMIT 1), \
                    (SELECT max(seq) FROM gnl_event_marks \
                     WHERE topic = ?1 AND name = ?2 AND seq > ?3 AND state <> 'wait')",
        )
        .bind(topic)
        .bind(name)
        .bind(cursor)
        .fetch_one(&mut *tx)
        .await?;
        let next = next_cursor(cursor, row.get(0), row.get(1));
        if next > cursor {
            self.counted(1);
            sqlx::query("UPDATE gnl_consumers SET cursor_seq = ?3 WHERE topic = ?1 AND name = ?2")
                .bind(topic)
                .bind(name)
                .bind(next)
                .execute(&mut *tx)
                .await?;
        }
        if next > cursor || outcomes.iter().any(|o| o.seq() <= cursor) {
            self.counted(1);
            sqlx::query(
                "DELETE FROM gnl_event_marks WHERE topic = ?1 AND name = ?2 AND seq <= ?3 AND state <> 'wait'",
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
