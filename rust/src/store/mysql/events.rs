//! The MySQL event log (`EventStore`). An emit takes its topic's counter row with `SELECT … FOR
//! UPDATE` (created first by an upsert), numbers its events after it and writes it back in the
//! same transaction: a concurrent emitter of the topic waits on that row until this one commits
//! or rolls back, so seqs are assigned in commit order and gapless among committed events
//! (docs/DECISIONS.md "Events"). Sessions run at READ COMMITTED, so each statement sees every
//! commit before it. Multi-row statements are sized by `plan` (packet and placeholder limits).
//! A consumer's writes start by updating its cursor row under the fencing token.

use std::collections::HashSet;

use async_trait::async_trait;
use sqlx::mysql::MySqlRow;
use sqlx::Row;

use super::{plan, text, MysqlStore, Sql, Tx};
use crate::error::Result;
use crate::model::JobBatch;
use crate::store::events::*;

fn opt_i64(r: &MySqlRow, i: usize) -> Option<i64> {
    r.try_get_unchecked::<Option<i64>, _>(i).ok().flatten()
}

/// A fetch candidate and whether it goes out alone (`pick`).
fn event_row(r: &MySqlRow) -> (EventRow, bool) {
    let e = EventRow {
        seq: r.get(0),
        id: text(r, 1),
        org: text(r, 2),
        payload: text(r, 3),
        emitted_at: r.get(4),
        attempt: r.get::<i64, _>(5) + 1,
    };
    (e, r.get::<i64, _>(6) != 0)
}

impl MysqlStore {
    /// Check the fencing token and write the heartbeat: `(cursor, now)` when `token` holds it.
    async fn hold(
        &self,
        tx: &mut Tx,
        topic: &str,
        name: &str,
        token: i64,
    ) -> Result<Option<(i64, i64)>> {
        self.counted(2);
        sqlx::query(concat!(
            "UPDATE gnl_consumers SET heartbeat_at = ",
            now_ms!(),
            " WHERE topic = ? AND name = ? AND token = ?"
        ))
        .bind(topic.as_bytes())
        .bind(name.as_bytes())
        .bind(token)
        .execute(&mut **tx)
        .await?;
        // Read back (MySQL reports a row whose heartbeat did not change as not affected).
        let row = sqlx::query(
            "SELECT cursor_seq, heartbeat_at FROM gnl_consumers WHERE topic = ? AND name = ? AND token = ?",
        )
        .bind(topic.as_bytes())
        .bind(name.as_bytes())
        .bind(token)
        .fetch_optional(&mut **tx)
        .await?;
        Ok(row.map(|r| (r.get(0), opt_i64(&r, 1).unwrap_or(0))))
    }

    async fn seqs_statement(
        &self,
        tx: &mut Tx,
        head: &str,
        topic: &str,
        name: &str,
        seqs: &[i64],
    ) -> Result<()> {
        for r in plan(seqs.len(), 1, self.budget, |_| 8) {
            let mut q = Sql::new(head);
            q.bind(topic.as_bytes())?.bind(name.as_bytes())?;
            q.rows = r.len();
            for (k, i) in r.enumerate() {
                q.s(if k == 0 { "?" } else { ",?" });
                q.bind(seqs[i])?;
            }
            q.s(")");
            self.counted(1);
            q.execute(&mut **tx).await?;
        }
        Ok(())
    }
}

#[async_trait]
impl EventStore for MysqlStore {
    async fn emit(&self, topic: &str, events: &JobBatch) -> Result<()> {
        if events.is_empty() {
            return Ok(());
        }
        for (i, e) in events.iter().enumerate() {
            let len = events.text_len(i);
            if len + 4096 > self.max_packet {
                self.check_size(&format!("event {:?}", e.id), len)?;
            }
        }
        let mut tx = self.begin().await?;
        self.counted(2);
        sqlx::query("INSERT INTO gnl_topics (topic, last_seq) VALUES (?, 0) ON DUPLICATE KEY UPDATE last_seq = last_seq")
            .bind(topic.as_bytes())
            .execute(&mut *tx)
            .await?;
        let row = sqlx::query(concat!(
            "SELECT last_seq, ",
            now_ms!(),
            " FROM gnl_topics WHERE topic = ? FOR UPDATE"
        ))
        .bind(topic.as_bytes())
        .fetch_one(&mut *tx)
        .await?;
        let (last, now): (i64, i64) = (row.get(0), row.get(1));
        let mut taken = HashSet::new();
        if last > 0 {
            for r in plan(events.len(), 1, self.budget, |i| events.get(i).id.len() + 8) {
                let mut q = Sql::new("SELECT id FROM gnl_events WHERE topic = ? AND id_key IN (");
                q.bind(topic.as_bytes())?;
                q.rows = r.len();
                for (k, i) in r.enumerate() {
                    q.s(if k == 0 {
                        "UNHEX(SHA2(?, 256))"
                    } else {
                        ",UNHEX(SHA2(?, 256))"
                    });
                    q.bind(events.get(i).id.as_bytes())?;
                }
                q.s(")");
                self.counted(1);
                for row in q.fetch_all(&mut *tx).await? {
                    taken.insert(text(&row, 0));
                }
            }
        }
        let rows = fresh(events, &taken);
        let mut seq = last;
        let tail = format!(",{now})");
        for r in plan(rows.len(), 6, self.budget, |k| {
            events.text_len(rows[k]) + 16
        }) {
            let mut q = Sql::new(
                "INSERT INTO gnl_events (topic, seq, id, org, payload, deliver_at, emitted_at) VALUES ",
            );
            q.rows = r.len();
            for k in r {
                let e = events.get(rows[k]);
                seq += 1;
                q.s(if q.text.ends_with(' ') {
                    "(?,?,?,?,?,?"
                } else {
                    ",(?,?,?,?,?,?"
                })
                .s(&tail);
                q.bind(topic.as_bytes())?
                    .bind(seq)?
                    .bind(e.id.as_bytes())?
                    .bind(e.org.as_bytes())?
                    .bind(e.payload)?
                    .bind(e.due.at(now))?;
            }
            self.counted(1);
            q.execute(&mut *tx).await?;
        }
        if seq > last {
            self.counted(1);
            sqlx::query("UPDATE gnl_topics SET last_seq = ? WHERE topic = ?")
                .bind(seq)
                .bind(topic.as_bytes())
                .execute(&mut *tx)
                .await?;
        }
        self.commit(tx).await
    }

    async fn consumer_open(&self, topic: &str, name: &str, token: i64) -> Result<bool> {
        let mut tx = self.begin().await?;
        self.counted(2);
        sqlx::query(concat!(
            "INSERT INTO gnl_consumers (topic, name, cursor_seq, token, heartbeat_at) \
             VALUES (?, ?, 0, 0, ",
            now_ms!(),
            ") ON DUPLICATE KEY UPDATE token = token"
        ))
        .bind(topic.as_bytes())
        .bind(name.as_bytes())
        .execute(&mut *tx)
        .await?;
        let n = sqlx::query(concat!(
            "UPDATE gnl_consumers SET token = ?, heartbeat_at = ",
            now_ms!(),
            " WHERE topic = ? AND name = ? AND token < ?"
        ))
        .bind(token)
        .bind(topic.as_bytes())
        .bind(name.as_bytes())
        .bind(token)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        self.commit(tx).await?;
        Ok(n == 1)
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
        let limit = limit.clamp(1, MAX_FETCH);
        self.counted(1);
        let mut due: Vec<(EventRow, bool)> = sqlx::query(
            "(SELECT e.seq, e.id, e.org, e.payload, e.emitted_at, coalesce(m.attempts, 0), \
                coalesce(m.attempts > 0 OR m.batched = 1, 0) \
              FROM gnl_events e LEFT JOIN gnl_event_marks m \
                ON m.topic = e.topic AND m.name = ? AND m.seq = e.seq \
              WHERE e.topic = ? AND e.seq > ? AND e.deliver_at <= ? \
                AND (m.seq IS NULL OR (m.state = 'wait' AND m.due_at <= ?)) \
              ORDER BY e.seq LIMIT ?) \
             UNION ALL \
             (SELECT e.seq, e.id, e.org, e.payload, e.emitted_at, m.attempts, \
                m.attempts > 0 OR m.batched = 1 \
              FROM gnl_event_marks m JOIN gnl_events e ON e.topic = m.topic AND e.seq = m.seq \
              WHERE m.topic = ? AND m.name = ? AND m.seq <= ? AND m.state = 'wait' AND m.due_at <= ? \
              ORDER BY m.seq LIMIT ?)",
        )
        .bind(name.as_bytes())
        .bind(topic.as_bytes())
        .bind(cursor)
        .bind(now)
        .bind(now)
        .bind(limit)
        .bind(topic.as_bytes())
        .bind(name.as_bytes())
        .bind(cursor)
        .bind(now)
        .bind(limit)
        .fetch_all(&mut *tx)
        .await?
        .iter()
        .map(event_row)
        .collect();
        due.sort_by_key(|(e, _)| e.seq);
        due.truncate(limit as usize);
        let out = pick(due);
        for r in plan(out.len(), 6, self.budget, |_| 64) {
            let mut q = Sql::new(
                "INSERT INTO gnl_event_marks (topic, name, seq, state, attempts, due_at, batched) VALUES ",
            );
            q.rows = r.len();
            for (k, i) in r.enumerate() {
                q.s(if k == 0 {
                    "(?,?,?,'wait',?,?,?)"
                } else {
                    ",(?,?,?,'wait',?,?,?)"
                });
                let (e, lone) = &out[i];
                let (attempts, batched) = fetch_charge(e, *lone);
                q.bind(topic.as_bytes())?
                    .bind(name.as_bytes())?
                    .bind(e.seq)?
                    .bind(attempts)?
                    .bind(now)?
                    .bind(batched)?;
            }
            q.s(
                " ON DUPLICATE KEY UPDATE attempts = VALUES(attempts), state = 'wait', \
                 due_at = VALUES(due_at), batched = VALUES(batched)",
            );
            self.counted(1);
            q.execute(&mut *tx).await?;
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
        self.seqs_statement(
            &mut tx,
            "UPDATE gnl_event_marks SET state = 'ok', error = NULL \
             WHERE topic = ? AND name = ? AND state = 'wait' AND seq IN (",
            topic,
            name,
            &accepted,
        )
        .await?;
        self.seqs_statement(
            &mut tx,
            "DELETE FROM gnl_dead_events WHERE topic = ? AND name = ? AND seq IN (",
            topic,
            name,
            &accepted,
        )
        .await?;
        for o in outcomes {
            let EventOutcome::Failed {
                seq,
                error,
                retry_after_ms,
            } = o
            else {
                continue;
            };
            match retry_after_ms {
                Some(d) => {
                    self.counted(1);
                    sqlx::query(
                        "UPDATE gnl_event_marks SET due_at = ?, error = ?, \
                         attempts = attempts + batched, batched = 0 \
                         WHERE topic = ? AND name = ? AND seq = ? AND state = 'wait'",
                    )
                    .bind(now.saturating_add(*d))
                    .bind(error.as_str())
                    .bind(topic.as_bytes())
                    .bind(name.as_bytes())
                    .bind(seq)
                    .execute(&mut *tx)
                    .await?;
                }
                None => {
                    self.counted(2);
                    let n = sqlx::query(
                        "UPDATE gnl_event_marks SET state = 'dead', error = ?, \
                         attempts = attempts + batched, batched = 0 \
                         WHERE topic = ? AND name = ? AND seq = ? AND state = 'wait'",
                    )
                    .bind(error.as_str())
                    .bind(topic.as_bytes())
                    .bind(name.as_bytes())
                    .bind(seq)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                    if n == 1 {
                        sqlx::query(
                            "INSERT INTO gnl_dead_events (topic, name, seq, attempts, error, at, handed_back) \
                             SELECT topic, name, seq, attempts, error, ?, 0 FROM gnl_event_marks \
                             WHERE topic = ? AND name = ? AND seq = ? \
                             ON DUPLICATE KEY UPDATE attempts = VALUES(attempts), error = VALUES(error), \
                             at = VALUES(at), handed_back = 0",
                        )
                        .bind(now)
                        .bind(topic.as_bytes())
                        .bind(name.as_bytes())
                        .bind(seq)
                        .execute(&mut *tx)
                        .await?;
                    }
                }
            }
        }
        self.counted(1);
        let row = sqlx::query(
            "SELECT (SELECT e.seq FROM gnl_events e LEFT JOIN gnl_event_marks m \
                       ON m.topic = e.topic AND m.name = ? AND m.seq = e.seq \
                     WHERE e.topic = ? AND e.seq > ? AND (m.seq IS NULL OR m.state = 'wait') \
                     ORDER BY e.seq LIMIT 1), \
                    (SELECT max(seq) FROM gnl_event_marks \
                     WHERE topic = ? AND name = ? AND seq > ? AND state <> 'wait')",
        )
        .bind(name.as_bytes())
        .bind(topic.as_bytes())
        .bind(cursor)
        .bind(topic.as_bytes())
        .bind(name.as_bytes())
        .bind(cursor)
        .fetch_one(&mut *tx)
        .await?;
        let next = next_cursor(cursor, opt_i64(&row, 0), opt_i64(&row, 1));
        if next > cursor {
            self.counted(1);
            sqlx::query("UPDATE gnl_consumers SET cursor_seq = ? WHERE topic = ? AND name = ?")
                .bind(next)
                .bind(topic.as_bytes())
                .bind(name.as_bytes())
                .execute(&mut *tx)
                .await?;
        }
        if next > cursor || outcomes.iter().any(|o| o.seq() <= cursor) {
            self.counted(1);
            sqlx::query(
                "DELETE FROM gnl_event_marks WHERE topic = ? AND name = ? AND seq <= ? AND state <> 'wait'",
            )
            .bind(topic.as_bytes())
            .bind(name.as_bytes())
            .bind(next)
            .execute(&mut *tx)
            .await?;
        }
        self.commit(tx).await?;
        Ok(true)
    }

    async fn consumer_lag(&self, topic: &str, name: &str) -> Result<Option<ConsumerLag>> {
        self.counted(1);
        let row = sqlx::query(&self.read(
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
             FROM gnl_consumers c WHERE c.topic = ? AND c.name = ?"))
        .bind(topic.as_bytes())
        .bind(name.as_bytes())
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|r| {
            lag_of(
                r.get(0),
                opt_i64(&r, 1),
                r.get(2),
                r.get(3),
                opt_i64(&r, 4),
                r.get(5),
                opt_i64(&r, 6),
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
        let rows = sqlx::query(&self.read(
            "SELECT e.id, d.seq, e.org, d.attempts, d.error, d.at, e.payload, d.handed_back \
             FROM gnl_dead_events d JOIN gnl_events e ON e.topic = d.topic AND e.seq = d.seq \
             WHERE d.topic = ? AND d.name = ? AND d.seq > ? ORDER BY d.seq LIMIT ?",
        ))
        .bind(topic.as_bytes())
        .bind(name.as_bytes())
        .bind(after_seq)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .iter()
            .map(|r| DeadEventRow {
                id: text(r, 0),
                seq: r.get(1),
                org: text(r, 2),
                attempts: r.get(3),
                error: text(r, 4),
                at: r.get(5),
                payload: text(r, 6),
                handed_back: r.get::<i8, _>(7) != 0,
            })
            .collect())
    }

    async fn consumers(&self, after: Option<(&str, &str)>, limit: i64) -> Result<Vec<ConsumerRow>> {
        self.counted(1);
        let (t, n) = (after.map(|a| a.0.as_bytes()), after.map(|a| a.1.as_bytes()));
        let rows = sqlx::query(&self.read(
            "SELECT c.topic, c.name, c.heartbeat_at, \
               (SELECT count(*) FROM gnl_dead_events d WHERE d.topic = c.topic AND d.name = c.name) \
             FROM gnl_consumers c WHERE ? IS NULL OR c.topic > ? OR (c.topic = ? AND c.name > ?) \
             ORDER BY c.topic, c.name LIMIT ?"))
        .bind(t)
        .bind(t)
        .bind(t)
        .bind(n)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .iter()
            .map(|r| ConsumerRow {
                topic: text(r, 0),
                name: text(r, 1),
                heartbeat_at: opt_i64(r, 2),
                dead: r.get(3),
            })
            .collect())
    }

    async fn dead_retry(&self, topic: &str, name: &str, id: &str) -> Result<bool> {
        let mut tx = self.begin().await?;
        self.counted(1);
        let row = sqlx::query(
            "SELECT d.seq, d.handed_back FROM gnl_dead_events d \
             JOIN gnl_events e ON e.topic = d.topic AND e.seq = d.seq \
             WHERE d.topic = ? AND d.name = ? AND e.id_key = UNHEX(SHA2(?, 256)) AND e.id = ? \
             FOR UPDATE",
        )
        .bind(topic.as_bytes())
        .bind(name.as_bytes())
        .bind(id.as_bytes())
        .bind(id.as_bytes())
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else {
            self.commit(tx).await?;
            return Ok(false);
        };
        let (seq, back): (i64, i8) = (row.get(0), row.get(1));
        if back == 0 {
            self.counted(2);
            sqlx::query("UPDATE gnl_dead_events SET handed_back = 1 WHERE topic = ? AND name = ? AND seq = ?")
                .bind(topic.as_bytes())
                .bind(name.as_bytes())
                .bind(seq)
                .execute(&mut *tx)
                .await?;
            sqlx::query(concat!(
                "INSERT INTO gnl_event_marks (topic, name, seq, state, attempts, due_at) \
                 VALUES (?, ?, ?, 'wait', 0, ",
                now_ms!(),
                ") ON DUPLICATE KEY UPDATE state = 'wait', attempts = 0, due_at = VALUES(due_at)"
            ))
            .bind(topic.as_bytes())
            .bind(name.as_bytes())
            .bind(seq)
            .execute(&mut *tx)
            .await?;
        }
        self.commit(tx).await?;
        Ok(true)
    }
}
