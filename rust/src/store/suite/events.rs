//! The event log's engine suite (`EventStore`): emit is idempotent by id per topic and numbers
//! events gapless in order; consumers fan out, each with its cursor; a failing event is retried,
//! holds the cursor but not the events behind it, and is quarantined; dead events are listed and
//! handed back once; a stale lease holder is fenced off; a producer transaction held open while
//! later events wait, or rolled back, never makes a consumer skip; concurrent producers.

use std::sync::Arc;

use sqlx::Executor;

use crate::model::{Due, JobBatch};
use crate::store::events::{EventOutcome, EventRow};
use crate::store::{open, Store};

on_every_engine! {
    store: [
        emit_is_idempotent_by_id_per_topic,
        consumers_fan_out_each_with_its_cursor,
        a_failing_event_holds_the_cursor_then_is_quarantined_and_handed_back,
        a_not_yet_due_event_holds_the_cursor_not_the_events_behind_it,
        a_stale_holder_is_fenced_off,
        a_redelivered_event_goes_out_alone,
        the_unsettled_rest_of_a_batch_comes_back_uncharged,
        a_batch_whose_holder_died_is_not_charged_the_event_it_hit_is,
        a_settle_written_again_changes_nothing,
        a_handed_back_event_goes_out_with_fresh_ones,
    ],
    servers: [],
    store_and_url: [
        a_producer_held_open_makes_nothing_skip_and_a_rolled_back_one_lets_the_cursor_on,
        concurrent_producers_number_events_gapless,
    ],
}

fn batch(ids: &[&str]) -> JobBatch {
    let mut b = JobBatch::default();
    for id in ids {
        b.push("", id, "", &format!("{{\"id\":\"{id}\"}}"), Due::Now, None);
    }
    b
}

fn ids(rows: &[EventRow]) -> Vec<String> {
    rows.iter().map(|e| e.id.clone()).collect()
}

fn accept(rows: &[EventRow]) -> Vec<EventOutcome> {
    rows.iter()
        .map(|e| EventOutcome::Accepted { seq: e.seq })
        .collect()
}

/// Nothing is due for consumer `c` of `t` (holding token 1).
async fn nothing_due(s: &Arc<dyn Store>) {
    nothing_due_for(s, 1).await;
}

/// Nothing is due for consumer `c` of `t` holding `token`.
async fn nothing_due_for(s: &Arc<dyn Store>, token: i64) {
    let rows = s.event_fetch("t", "c", token, 100).await.unwrap().unwrap();
    assert!(rows.is_empty(), "due: {:?}", ids(&rows));
}

/// Consumer `c` of `t` has no quarantine record.
async fn no_dead(s: &Arc<dyn Store>) {
    assert!(s
        .dead_events("t", "c", 0, i64::MAX)
        .await
        .unwrap()
        .is_empty());
}

/// Fetch and accept everything due for `(topic, name)` holding `token`; the ids in order.
async fn consume_all(s: &Arc<dyn Store>, topic: &str, name: &str, token: i64) -> Vec<String> {
    let mut got = vec![];
    loop {
        let rows = s
            .event_fetch(topic, name, token, 100)
            .await
            .unwrap()
            .unwrap();
        if rows.is_empty() {
            return got;
        }
        got.extend(ids(&rows));
        assert!(s
            .event_settle(topic, name, token, &accept(&rows))
            .await
            .unwrap());
    }
}

pub async fn emit_is_idempotent_by_id_per_topic(s: Arc<dyn Store>) {
    s.emit("t", &batch(&["a", "b", "a"])).await.unwrap();
    s.emit("t", &batch(&["a", "c"])).await.unwrap();
    s.emit("u", &batch(&["a"])).await.unwrap();
    assert!(s.consumer_open("t", "c1", 1).await.unwrap());
    let rows = s.event_fetch("t", "c1", 1, 100).await.unwrap().unwrap();
    assert_eq!(ids(&rows), ["a", "b", "c"]);
    assert_eq!(rows.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2, 3]);
    assert_eq!(rows[0].payload, "{\"id\":\"a\"}");
    assert!(rows.iter().all(|e| e.attempt == 1));
    assert!(s.consumer_open("u", "c1", 1).await.unwrap());
    assert_eq!(consume_all(&s, "u", "c1", 1).await, ["a"]);
}

pub async fn consumers_fan_out_each_with_its_cursor(s: Arc<dyn Store>) {
    let names: Vec<String> = (0..250).map(|i| format!("e{i}")).collect();
    let refs: Vec<&str> = names.iter().map(|s| s.as_str()).collect();
    s.emit("t", &batch(&refs)).await.unwrap();
    for c in ["one", "two"] {
        assert!(s.consumer_open("t", c, 1).await.unwrap());
    }
    assert_eq!(consume_all(&s, "t", "one", 1).await, names);
    let lag = s.consumer_lag("t", "two").await.unwrap().unwrap();
    assert_eq!((lag.cursor, lag.behind, lag.dead), (0, 250, 0));
    assert!(lag.oldest_unacked_at.is_some() && lag.heartbeat_at.is_some());
    assert_eq!(consume_all(&s, "t", "two", 1).await, names);
    for c in ["one", "two"] {
        let lag = s.consumer_lag("t", c).await.unwrap().unwrap();
        assert_eq!(
            (lag.cursor, lag.behind, lag.oldest_unacked_at),
            (250, 0, None)
        );
    }
    assert!(s.consumer_lag("t", "three").await.unwrap().is_none());
}

pub async fn a_failing_event_holds_the_cursor_then_is_quarantined_and_handed_back(
    s: Arc<dyn Store>,
) {
    s.emit("t", &batch(&["a", "poison", "c"])).await.unwrap();
    assert!(s.consumer_open("t", "c", 1).await.unwrap());
    let rows = s.event_fetch("t", "c", 1, 100).await.unwrap().unwrap();
    let outs = vec![
        EventOutcome::Accepted { seq: 1 },
        fail(2, Some(60_000)),
        EventOutcome::Accepted { seq: 3 },
    ];
    assert_eq!(rows.len(), 3);
    assert!(s.event_settle("t", "c", 1, &outs).await.unwrap());
    // The waiting event holds the cursor; nothing is due.
    let lag = s.consumer_lag("t", "c").await.unwrap().unwrap();
    assert_eq!((lag.cursor, lag.behind), (1, 1));
    nothing_due(&s).await;
    // Due again: delivered alone, attempt 2, then quarantined; the cursor moves on.
    s.emit("t", &batch(&["d"])).await.unwrap();
    // A retry due at once.
    assert!(s
        .event_settle("t", "c", 1, &[fail(2, Some(-60_000))])
        .await
        .unwrap());
    let rows = s.event_fetch("t", "c", 1, 100).await.unwrap().unwrap();
    assert_eq!(
        (ids(&rows), rows[0].attempt),
        (vec!["poison".to_string()], 2)
    );
    assert!(s.event_settle("t", "c", 1, &[fail(2, None)]).await.unwrap());
    let dead = s.dead_events("t", "c", 0, i64::MAX).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(
        (
            dead[0].id.as_str(),
            dead[0].attempts,
            dead[0].error.as_str(),
            dead[0].handed_back
        ),
        ("poison", 2, "boom", false)
    );
    assert_eq!(consume_all(&s, "t", "c", 1).await, ["d"]);
    let lag = s.consumer_lag("t", "c").await.unwrap().unwrap();
    assert_eq!((lag.cursor, lag.behind, lag.dead), (4, 0, 1));
    // Paged: nothing past the record's seq; the consumer is listed with its one record.
    let seq = dead[0].seq;
    assert!(s.dead_events("t", "c", seq, 10).await.unwrap().is_empty());
    assert_eq!(s.dead_events("t", "c", seq - 1, 1).await.unwrap().len(), 1);
    let listed = s.consumers(None, 10).await.unwrap();
    assert_eq!(
        listed
            .iter()
            .map(|c| (c.topic.as_str(), c.name.as_str(), c.dead))
            .collect::<Vec<_>>(),
        [("t", "c", 1)]
    );
    assert!(s.consumers(Some(("t", "c")), 10).await.unwrap().is_empty());
    assert_eq!(s.consumers(Some(("t", "b")), 10).await.unwrap().len(), 1);
    // Handed back once: True, True again while it waits, redelivered once, then gone.
    assert!(!s.dead_retry("t", "c", "nope").await.unwrap());
    assert!(!s.dead_retry("t", "other", "poison").await.unwrap());
    assert!(s.dead_retry("t", "c", "poison").await.unwrap());
    assert!(s.dead_retry("t", "c", "poison").await.unwrap());
    assert!(s.dead_events("t", "c", 0, i64::MAX).await.unwrap()[0].handed_back);
    assert_eq!(s.consumer_lag("t", "c").await.unwrap().unwrap().behind, 1);
    let rows = s.event_fetch("t", "c", 1, 100).await.unwrap().unwrap();
    assert_eq!(
        (ids(&rows), rows[0].attempt),
        (vec!["poison".to_string()], 1)
    );
    assert!(s.event_settle("t", "c", 1, &accept(&rows)).await.unwrap());
    no_dead(&s).await;
    assert!(!s.dead_retry("t", "c", "poison").await.unwrap());
    nothing_due(&s).await;
    let lag = s.consumer_lag("t", "c").await.unwrap().unwrap();
    assert_eq!((lag.cursor, lag.behind, lag.dead), (4, 0, 0));
}

pub async fn a_not_yet_due_event_holds_the_cursor_not_the_events_behind_it(s: Arc<dyn Store>) {
    let mut b = JobBatch::default();
    b.push("", "now1", "", "1", Due::Now, None);
    b.push("acme", "later", "", "2", Due::After(3_600_000), None);
    b.push("", "now2", "", "3", Due::Now, None);
    s.emit("t", &b).await.unwrap();
    assert!(s.consumer_open("t", "c", 1).await.unwrap());
    let rows = s.event_fetch("t", "c", 1, 100).await.unwrap().unwrap();
    assert_eq!(ids(&rows), ["now1", "now2"]);
    assert!(s.event_settle("t", "c", 1, &accept(&rows)).await.unwrap());
    let lag = s.consumer_lag("t", "c").await.unwrap().unwrap();
    assert_eq!((lag.cursor, lag.behind), (1, 1));
    nothing_due(&s).await;
}

pub async fn a_stale_holder_is_fenced_off(s: Arc<dyn Store>) {
    s.emit("t", &batch(&["a", "b"])).await.unwrap();
    assert!(s.consumer_open("t", "c", 1).await.unwrap());
    let rows = s.event_fetch("t", "c", 1, 1).await.unwrap().unwrap();
    assert_eq!(ids(&rows), ["a"]);
    assert!(s.consumer_open("t", "c", 2).await.unwrap());
    assert!(!s.consumer_open("t", "c", 1).await.unwrap());
    // The old holder's ack is refused and writes nothing; the new one gets "a" again, alone
    // (its batch delivery, never settled, was not charged).
    assert!(!s.event_settle("t", "c", 1, &accept(&rows)).await.unwrap());
    assert!(s.event_fetch("t", "c", 1, 10).await.unwrap().is_none());
    let rows = s.event_fetch("t", "c", 2, 10).await.unwrap().unwrap();
    assert_eq!((ids(&rows), rows[0].attempt), (vec!["a".to_string()], 1));
    assert!(s.event_settle("t", "c", 2, &accept(&rows)).await.unwrap());
    assert_eq!(consume_all(&s, "t", "c", 2).await, ["b"]);
}

pub async fn a_redelivered_event_goes_out_alone(s: Arc<dyn Store>) {
    s.emit("t", &batch(&["a", "b", "c"])).await.unwrap();
    assert!(s.consumer_open("t", "c", 1).await.unwrap());
    assert_eq!(
        s.event_fetch("t", "c", 1, 10).await.unwrap().unwrap().len(),
        3
    );
    // The holder died before settling: the next one gets them one at a time, uncharged by
    // the batch delivery.
    assert!(s.consumer_open("t", "c", 2).await.unwrap());
    for id in ["a", "b", "c"] {
        let rows = s.event_fetch("t", "c", 2, 10).await.unwrap().unwrap();
        assert_eq!(tries(&rows), [(id.to_string(), 1)]);
        assert!(s.event_settle("t", "c", 2, &accept(&rows)).await.unwrap());
    }
    nothing_due_for(&s, 2).await;
}

fn fail(seq: i64, retry: Option<i64>) -> EventOutcome {
    EventOutcome::Failed {
        seq,
        error: "boom".into(),
        retry_after_ms: retry,
    }
}

/// `(id, attempt)` of each row.
fn tries(rows: &[EventRow]) -> Vec<(String, i64)> {
    rows.iter().map(|e| (e.id.clone(), e.attempt)).collect()
}

/// A holder that settles part of its batch (its lease ran out mid-batch): the rest were
/// delivered in a batch that was never settled, so that delivery is not charged: they come back
/// one at a time, "b" and "d" as attempt 1; "c", which failed in-process, as attempt 2.
pub async fn the_unsettled_rest_of_a_batch_comes_back_uncharged(s: Arc<dyn Store>) {
    s.emit("t", &batch(&["a", "b", "c", "d"])).await.unwrap();
    assert!(s.consumer_open("t", "c", 1).await.unwrap());
    assert_eq!(
        s.event_fetch("t", "c", 1, 10).await.unwrap().unwrap().len(),
        4
    );
    let part = [EventOutcome::Accepted { seq: 1 }, fail(3, Some(-60_000))];
    assert!(s.event_settle("t", "c", 1, &part).await.unwrap());
    let lag = s.consumer_lag("t", "c").await.unwrap().unwrap();
    assert_eq!((lag.cursor, lag.behind), (1, 3));
    for (id, attempt) in [("b", 1), ("c", 2), ("d", 1)] {
        let rows = s.event_fetch("t", "c", 1, 10).await.unwrap().unwrap();
        assert_eq!(tries(&rows), [(id.to_string(), attempt)]);
        assert!(s.event_settle("t", "c", 1, &accept(&rows)).await.unwrap());
    }
    nothing_due(&s).await;
    let lag = s.consumer_lag("t", "c").await.unwrap().unwrap();
    assert_eq!((lag.cursor, lag.behind), (4, 0));
}

/// A holder dies in a batch (issue 12's repro): the batch is not charged. Its events come back
/// one at a time, each charged before its handler runs; the one that kills the holder again is
/// charged (attempt 2 next) and quarantined, the others flow; fresh events batch again after.
pub async fn a_batch_whose_holder_died_is_not_charged_the_event_it_hit_is(s: Arc<dyn Store>) {
    s.emit("t", &batch(&["a", "b", "c", "d"])).await.unwrap();
    assert!(s.consumer_open("t", "c", 1).await.unwrap());
    let rows = s.event_fetch("t", "c", 1, 10).await.unwrap().unwrap();
    assert_eq!(
        tries(&rows),
        [("a", 1), ("b", 1), ("c", 1), ("d", 1)].map(|(i, a)| (i.to_string(), a))
    );
    // Holder 1 ran "a", died in "b"'s handler; nothing settled.
    assert!(s.consumer_open("t", "c", 2).await.unwrap());
    let rows = s.event_fetch("t", "c", 2, 10).await.unwrap().unwrap();
    assert_eq!(tries(&rows), [("a".to_string(), 1)]);
    assert!(s.event_settle("t", "c", 2, &accept(&rows)).await.unwrap());
    let rows = s.event_fetch("t", "c", 2, 10).await.unwrap().unwrap();
    assert_eq!(tries(&rows), [("b".to_string(), 1)]);
    // Holder 2 died in "b" again: that delivery was charged.
    assert!(s.consumer_open("t", "c", 3).await.unwrap());
    let rows = s.event_fetch("t", "c", 3, 10).await.unwrap().unwrap();
    assert_eq!(tries(&rows), [("b".to_string(), 2)]);
    assert!(s.event_settle("t", "c", 3, &[fail(2, None)]).await.unwrap());
    for id in ["c", "d"] {
        let rows = s.event_fetch("t", "c", 3, 10).await.unwrap().unwrap();
        assert_eq!(tries(&rows), [(id.to_string(), 1)]);
        assert!(s.event_settle("t", "c", 3, &accept(&rows)).await.unwrap());
    }
    nothing_due_for(&s, 3).await;
    let dead = s.dead_events("t", "c", 0, i64::MAX).await.unwrap();
    assert_eq!(
        dead.iter()
            .map(|d| (d.id.as_str(), d.attempts))
            .collect::<Vec<_>>(),
        [("b", 2)]
    );
    let lag = s.consumer_lag("t", "c").await.unwrap().unwrap();
    assert_eq!((lag.cursor, lag.behind, lag.dead), (4, 0, 1));
    s.emit("t", &batch(&["e", "f"])).await.unwrap();
    let rows = s.event_fetch("t", "c", 3, 10).await.unwrap().unwrap();
    assert_eq!(tries(&rows), [("e".to_string(), 1), ("f".to_string(), 1)]);
    assert!(s.event_settle("t", "c", 3, &accept(&rows)).await.unwrap());
    nothing_due_for(&s, 3).await;
}

/// A settle written twice (the retry of a write whose answer was lost) changes nothing the
/// second time: nothing is accepted or quarantined twice.
pub async fn a_settle_written_again_changes_nothing(s: Arc<dyn Store>) {
    s.emit("t", &batch(&["a", "b", "c"])).await.unwrap();
    assert!(s.consumer_open("t", "c", 1).await.unwrap());
    assert_eq!(
        s.event_fetch("t", "c", 1, 10).await.unwrap().unwrap().len(),
        3
    );
    let outs = [
        EventOutcome::Accepted { seq: 1 },
        fail(2, Some(60_000)),
        EventOutcome::Accepted { seq: 3 },
    ];
    for _ in 0..2 {
        assert!(s.event_settle("t", "c", 1, &outs).await.unwrap());
        let lag = s.consumer_lag("t", "c").await.unwrap().unwrap();
        assert_eq!((lag.cursor, lag.behind, lag.dead), (1, 1, 0));
    }
    for _ in 0..2 {
        assert!(s.event_settle("t", "c", 1, &[fail(2, None)]).await.unwrap());
        let lag = s.consumer_lag("t", "c").await.unwrap().unwrap();
        assert_eq!((lag.cursor, lag.behind, lag.dead), (3, 0, 1));
    }
    let dead = s.dead_events("t", "c", 0, i64::MAX).await.unwrap();
    assert_eq!(
        dead.iter().map(|d| (d.seq, d.attempts)).collect::<Vec<_>>(),
        [(2, 1)]
    );
    // The accepted ones again, once passed: nothing.
    assert!(s
        .event_settle("t", "c", 1, &accept_seqs(&[1, 3]))
        .await
        .unwrap());
    s.emit("t", &batch(&["d"])).await.unwrap();
    assert_eq!(consume_all(&s, "t", "c", 1).await, ["d"]);
    let lag = s.consumer_lag("t", "c").await.unwrap().unwrap();
    assert_eq!((lag.cursor, lag.behind, lag.dead), (4, 0, 1));
}

fn accept_seqs(seqs: &[i64]) -> Vec<EventOutcome> {
    seqs.iter()
        .map(|&seq| EventOutcome::Accepted { seq })
        .collect()
}

/// A handed-back event (below the cursor) goes out in one batch with fresh events, each as a
/// first attempt; accepting them removes the quarantine record and passes the cursor on.
pub async fn a_handed_back_event_goes_out_with_fresh_ones(s: Arc<dyn Store>) {
    s.emit("t", &batch(&["a", "b"])).await.unwrap();
    assert!(s.consumer_open("t", "c", 1).await.unwrap());
    assert_eq!(
        s.event_fetch("t", "c", 1, 10).await.unwrap().unwrap().len(),
        2
    );
    let outs = [fail(1, None), EventOutcome::Accepted { seq: 2 }];
    assert!(s.event_settle("t", "c", 1, &outs).await.unwrap());
    assert!(s.dead_retry("t", "c", "a").await.unwrap());
    s.emit("t", &batch(&["c"])).await.unwrap();
    let rows = s.event_fetch("t", "c", 1, 10).await.unwrap().unwrap();
    assert_eq!(tries(&rows), [("a".to_string(), 1), ("c".to_string(), 1)]);
    assert!(s.event_settle("t", "c", 1, &accept(&rows)).await.unwrap());
    no_dead(&s).await;
    let lag = s.consumer_lag("t", "c").await.unwrap().unwrap();
    assert_eq!((lag.cursor, lag.behind, lag.dead), (3, 0, 0));
    nothing_due(&s).await;
}

/// A producer in the middle of an emit, on a connection of its own (`pool`): it holds the
/// topic's counter row as an emit does and has written event `held` numbered from it; another
/// store's emit of `later` waits behind it. Then it ends with `finish` (COMMIT or ROLLBACK).
async fn held_producer<DB: sqlx::Database>(
    s: &Arc<dyn Store>,
    pool: sqlx::Pool<DB>,
    url: &str,
    finish: &str,
) where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
{
    let held = format!("held-{finish}");
    let later = format!("later-{finish}");
    let mut conn = pool.acquire().await.unwrap();
    conn.execute("BEGIN").await.unwrap();
    conn.execute("UPDATE gnl_topics SET last_seq = last_seq + 1 WHERE topic = 't'")
        .await
        .unwrap();
    conn.execute(
        format!(
            "INSERT INTO gnl_events (topic, seq, id, org, payload, deliver_at, emitted_at) \
             SELECT topic, last_seq, '{held}', '', '1', 0, 0 FROM gnl_topics WHERE topic = 't'"
        )
        .as_str(),
    )
    .await
    .unwrap();
    let other = open(url, 2, false).await.unwrap();
    let producer = tokio::spawn({
        let other = other.clone();
        let later = later.clone();
        async move { other.emit("t", &batch(&[&later])).await.unwrap() }
    });
    // While the held producer is open, nothing past the cursor is visible, and the later
    // emit waits for its counter row.
    for _ in 0..5 {
        super::sleep_ms(100).await;
        let rows = s.event_fetch("t", "c", 1, 100).await.unwrap().unwrap();
        assert!(
            rows.is_empty(),
            "{finish}: delivered {:?} past a held producer",
            ids(&rows)
        );
        assert!(s.event_settle("t", "c", 1, &[]).await.unwrap());
    }
    assert!(
        !producer.is_finished(),
        "the later emit waits for the counter row"
    );
    conn.execute(finish).await.unwrap();
    producer.await.unwrap();
    let want: Vec<String> = if finish == "COMMIT" {
        vec![held, later]
    } else {
        vec![later]
    };
    assert_eq!(consume_all(s, "t", "c", 1).await, want, "{finish}");
    drop(conn);
    pool.close().await;
    other.close().await;
}

pub async fn a_producer_held_open_makes_nothing_skip_and_a_rolled_back_one_lets_the_cursor_on(
    s: Arc<dyn Store>,
    url: String,
) {
    if s.backend() == "sqlite" {
        // SQLite has one writer: a write transaction held open holds every emit and fetch.
        return;
    }
    s.emit("t", &batch(&["first"])).await.unwrap();
    assert!(s.consumer_open("t", "c", 1).await.unwrap());
    assert_eq!(consume_all(&s, "t", "c", 1).await, ["first"]);
    for finish in ["COMMIT", "ROLLBACK"] {
        if s.backend() == "postgres" {
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(1)
                .connect(&url)
                .await
                .unwrap();
            held_producer(&s, pool, &url, finish).await;
        } else {
            let pool = sqlx::mysql::MySqlPoolOptions::new()
                .max_connections(1)
                .connect(&url)
                .await
                .unwrap();
            held_producer(&s, pool, &url, finish).await;
        }
    }
    let lag = s.consumer_lag("t", "c").await.unwrap().unwrap();
    assert_eq!(
        (lag.cursor, lag.behind),
        (4, 0),
        "gapless: first, held, later, later"
    );
}

pub async fn concurrent_producers_number_events_gapless(s: Arc<dyn Store>, url: String) {
    let mut stores = vec![s.clone()];
    for _ in 0..2 {
        stores.push(open(&url, 2, false).await.unwrap());
    }
    assert!(s.consumer_open("t", "a", 1).await.unwrap());
    let mut tasks = vec![];
    for (p, st) in stores.iter().enumerate() {
        let st = st.clone();
        tasks.push(tokio::spawn(async move {
            for k in 0..60 {
                let id = format!("p{p}-{k}");
                if k % 10 == 9 {
                    let many: Vec<String> = (0..5).map(|j| format!("{id}-{j}")).collect();
                    let refs: Vec<&str> = many.iter().map(|s| s.as_str()).collect();
                    st.emit("t", &batch(&refs)).await.unwrap();
                } else {
                    st.emit("t", &batch(&[&id])).await.unwrap();
                }
            }
        }));
    }
    // A consumer reads while they write.
    let mut got = vec![];
    while !tasks.iter().all(|t| t.is_finished()) {
        let rows = s.event_fetch("t", "a", 1, 7).await.unwrap().unwrap();
        got.extend(rows.iter().map(|e| (e.seq, e.id.clone())));
        assert!(s.event_settle("t", "a", 1, &accept(&rows)).await.unwrap());
    }
    for t in tasks {
        t.await.unwrap();
    }
    loop {
        let rows = s.event_fetch("t", "a", 1, 100).await.unwrap().unwrap();
        if rows.is_empty() {
            break;
        }
        got.extend(rows.iter().map(|e| (e.seq, e.id.clone())));
        assert!(s.event_settle("t", "a", 1, &accept(&rows)).await.unwrap());
    }
    let n = 3 * (54 + 6 * 5);
    assert_eq!(got.len(), n, "every event exactly once");
    assert!(
        got.iter()
            .enumerate()
            .all(|(i, (seq, _))| *seq == i as i64 + 1),
        "in log order, gapless: {:?}",
        got.iter().map(|g| g.0).collect::<Vec<_>>()
    );
    // Per producer, its events in the order it emitted them.
    for p in 0..3 {
        let mine: Vec<&String> = got
            .iter()
            .map(|(_, id)| id)
            .filter(|id| id.starts_with(&format!("p{p}-")))
            .collect();
        let mut want = vec![];
        for k in 0..60 {
            if k % 10 == 9 {
                want.extend((0..5).map(|j| format!("p{p}-{k}-{j}")));
            } else {
                want.push(format!("p{p}-{k}"));
            }
        }
        assert_eq!(mine, want.iter().collect::<Vec<_>>());
    }
    for st in &stores[1..] {
        st.close().await;
    }
}
