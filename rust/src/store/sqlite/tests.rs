//! SQLite's own engine tests, on an in-memory store (the engine suite, `store::suite`, runs
//! on a file).

use std::sync::Arc;

use crate::error::Error;
use crate::model::*;
use crate::store::suite::{job, req};
use crate::store::{open, Store};

async fn store() -> Arc<dyn Store> {
    open("sqlite::memory:", 1, true).await.unwrap()
}

#[tokio::test]
async fn lanes_are_served_in_turn() {
    let s = store().await;
    let mut jobs: Vec<NewJob> = (0..50).map(|i| job("big", &format!("b{i}"))).collect();
    jobs.push(job("small", "s0"));
    jobs.push(job("", "n0"));
    s.enqueue(&jobs).await.unwrap();
    let mut first = vec![];
    for _ in 0..3 {
        let got = s.claim(&[], &req(1, 60_000)).await.unwrap();
        first.push(got[0].org.clone());
    }
    first.sort();
    assert_eq!(first, vec!["".to_string(), "big".into(), "small".into()]);
}

#[tokio::test]
async fn a_batch_takes_lanes_in_turn_and_each_lane_in_order() {
    let s = store().await;
    let jobs: Vec<NewJob> = (0..6)
        .map(|i| job(["a", "b"][i % 2], &format!("j{i}")))
        .collect();
    s.enqueue(&jobs).await.unwrap();
    let got = s.claim(&[], &req(4, 60_000)).await.unwrap();
    let ids: Vec<&str> = got.iter().map(|j| j.id.as_str()).collect();
    assert_eq!(ids, vec!["j0", "j2", "j1", "j3"]);
}

#[tokio::test]
async fn an_empty_poll_is_one_query() {
    let s = store().await;
    let before = s.query_count();
    assert!(s.claim(&[], &req(10, 1_000)).await.unwrap().is_empty());
    assert_eq!(s.query_count() - before, 1);
}

#[tokio::test]
async fn a_stale_holder_cannot_write_after_a_reclaim() {
    let s = store().await;
    s.enqueue(&[job("", "x")]).await.unwrap();
    let first = s.claim(&[], &req(1, 5)).await.unwrap().remove(0);
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    // The lease expired: another claim reclaims the job with a new fencing token.
    let second = s.claim(&[], &req(1, 60_000)).await.unwrap().remove(0);
    assert_eq!(second.seq, first.seq);
    assert_eq!(second.attempt, 2);
    assert!(second.token > first.token);
    // The stale holder's renewal and outcome change nothing.
    let st = s
        .renew(
            &[LeaseRef {
                seq: first.seq,
                token: first.token,
                org: first.org.clone(),
            }],
            60_000,
        )
        .await
        .unwrap();
    assert_eq!(st, vec![RenewStatus::Lost]);
    s.finish(&[Outcome::Done {
        seq: first.seq,
        token: first.token,
        org: first.org.clone(),
        result: Some("1".into()),
    }])
    .await
    .unwrap();
    assert_eq!(s.get_job("", "x").await.unwrap().unwrap().state, RUNNING);
    s.finish(&[Outcome::Done {
        seq: second.seq,
        token: second.token,
        org: second.org.clone(),
        result: Some("2".into()),
    }])
    .await
    .unwrap();
    let row = s.get_job("", "x").await.unwrap().unwrap();
    assert_eq!(
        (row.state.as_str(), row.result.as_deref()),
        (DONE, Some("2"))
    );
}

#[tokio::test]
async fn a_crash_on_the_last_attempt_dead_letters_the_job() {
    let s = store().await;
    s.enqueue(&[job("", "x")]).await.unwrap();
    for _ in 0..2 {
        assert_eq!(s.claim(&[], &req(1, 1)).await.unwrap().len(), 1);
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert!(s.claim(&[], &req(1, 1)).await.unwrap().is_empty());
    let row = s.get_job("", "x").await.unwrap().unwrap();
    assert_eq!((row.state.as_str(), row.attempts), (DEAD, 2));
    assert!(row.last_error.unwrap().contains("lease expired"));
}

#[tokio::test]
async fn failures_retry_after_the_delay_then_dead_letter() {
    let s = store().await;
    s.enqueue(&[job("", "x")]).await.unwrap();
    let j = s.claim(&[], &req(1, 60_000)).await.unwrap().remove(0);
    let fail = Outcome::Failed {
        seq: j.seq,
        token: j.token,
        org: j.org.clone(),
        error: "boom".into(),
        delay_ms: 60_000,
    };
    assert!(
        s.claim(&[fail], &req(1, 60_000)).await.unwrap().is_empty(),
        "not due before its delay"
    );
    let row = s.get_job("", "x").await.unwrap().unwrap();
    assert_eq!(
        (row.state.as_str(), row.last_error.as_deref()),
        (PENDING, Some("boom"))
    );
}

#[tokio::test]
async fn max_depth_counts_the_calls_own_jobs_and_writes_nothing() {
    let s = store().await;
    let mut jobs: Vec<NewJob> = (0..3).map(|i| job("a", &format!("{i}"))).collect();
    jobs[0].max_depth = Some(2);
    assert!(matches!(
        s.enqueue(&jobs).await,
        Err(Error::QueueFull {
            depth: 3,
            max_depth: 2,
            ..
        })
    ));
    assert_eq!(s.max_seq().await.unwrap(), 0);
}

#[tokio::test]
async fn schema_1_steps_become_steps_numbered_0() {
    let dir = std::env::temp_dir().join(format!("gnl-mig-{}", crate::ids::new_job_id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("s.db");
    let url = format!("sqlite:///{}", path.display());
    {
        use sqlx::Executor;
        let opts = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true);
        let pool = sqlx::SqlitePool::connect_with(opts).await.unwrap();
        let m1 = super::MIGRATOR.iter().find(|m| m.version == 1).unwrap();
        pool.execute(&*m1.sql).await.unwrap();
        pool.execute(
            "CREATE TABLE gnl_schema (id INTEGER PRIMARY KEY, version INTEGER NOT NULL); \
             INSERT INTO gnl_schema VALUES (1, 1); \
             INSERT INTO gnl_steps VALUES ('job:x', 'charge', '42', 5)",
        )
        .await
        .unwrap();
        pool.close().await;
    }
    assert!(matches!(
        open(&url, 2, false).await.err(),
        Some(Error::SchemaOutdated { found: 1, .. })
    ));
    crate::store::upgrade(&url).await.unwrap();
    let s = open(&url, 2, false).await.unwrap();
    let row = s.step_get("job:x", "charge", 0).await.unwrap().unwrap();
    assert_eq!(
        (row.result.as_deref(), row.state.as_str()),
        (Some("42"), "done")
    );
    s.close().await;
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn big_batches_are_split_below_the_variable_limit() {
    let s = store().await;
    let jobs: Vec<NewJob> = (0..20_000).map(|i| job("a", &format!("{i}"))).collect();
    s.enqueue(&jobs).await.unwrap();
    assert_eq!(s.max_seq().await.unwrap(), 20_000);
}

/// Issue 9, finding 9: a claim that skips the empty-poll read (a busy worker's) looks for
/// expired leases at most every 250 ms, measured on the process's monotonic clock: a wall
/// clock that steps back (NTP, a VM restore) does not stop those looks. The store's clock is
/// stepped back an hour through the test seam; leases and due instants use that clock, so a
/// job claimed after the step with a 20 ms lease has expired 300 ms later, and the next busy
/// claim must take it back.
#[tokio::test]
async fn a_wall_clock_stepping_back_does_not_stop_reclaims() {
    use crate::store::sqlite::SqliteStore;
    use crate::store::url::SqliteTarget;
    use crate::store::QueueStore;
    let s = SqliteStore::connect(SqliteTarget::Memory, 1, true)
        .await
        .unwrap();
    s.migrate().await.unwrap();
    let mut busy = req(1, 60_000);
    busy.probe = false;
    // A busy claim now: it looks for expired leases (the first look of this store).
    assert!(s.claim(&[], &busy).await.unwrap().is_empty());
    s.step_clock(-3_600_000);
    s.enqueue(&[job("", "x")]).await.unwrap();
    let first = s.claim(&[], &req(1, 20)).await.unwrap().remove(0);
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let again = s.claim(&[], &busy).await.unwrap();
    assert_eq!(
        again.iter().map(|j| (j.seq, j.attempt)).collect::<Vec<_>>(),
        vec![(first.seq, 2)],
        "the expired lease was not taken back"
    );
}

#[tokio::test]
async fn the_fast_path_records_new_steps_and_leaves_the_rest_to_the_pool() {
    let dir = std::env::temp_dir().join(format!("gnl-now-{}", crate::ids::new_job_id()));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite:///{}", dir.join("s.db").display());
    let s = open(&url, 2, true).await.unwrap();
    assert_eq!(s.step_put_now("r", "a", 0, 0, "1"), Some(()));
    assert_eq!(
        s.step_put_now("r", "a", 0, 0, "2"),
        None,
        "a recorded step: the pool's"
    );
    let kept = s.step_put("r", "a", 0, 0, "2").await.unwrap().unwrap();
    assert_eq!(kept.result.as_deref(), Some("1"));
    assert_eq!(s.step_put_now("r", "a", 1, 1, "\"\u{1F600}\""), Some(()));
    let run = crate::store::journal::RunStart {
        run_id: "r".into(),
        workflow: "wf".into(),
        preset: None,
        input: None,
        scheduled_for: None,
        owner: "o".into(),
        lease_ms: None,
    };
    s.run_start(&run).await.unwrap();
    let st = s.run_start(&run).await.unwrap();
    let got: Vec<_> = st
        .steps
        .to_rows()
        .into_iter()
        .map(|x| (x.n, x.result))
        .collect();
    assert_eq!(
        got,
        vec![(0, Some("1".into())), (1, Some("\"\u{1F600}\"".into()))]
    );
    s.close().await;
    std::fs::remove_dir_all(&dir).unwrap();
    // An in-memory store has no fast path.
    assert_eq!(store().await.step_put_now("r", "a", 0, 0, "1"), None);
}

/// Issue 12: a fetched batch is kept as a span on the consumer row (no mark per event), and a
/// not-yet-due event inside its range was not delivered. When the holder dies and the event
/// becomes due (the store's clock stepped on through the test seam), the next holder gets the
/// batch's events back one at a time, uncharged by the death (attempt 1), and that event with
/// no mark (it was not in the batch: fresh, not a dead batch's `batched` mark).
#[tokio::test]
async fn a_not_yet_due_event_inside_a_dead_holders_batch_keeps_its_first_attempt() {
    use crate::store::events::{EventOutcome, EventStore};
    use crate::store::sqlite::SqliteStore;
    use crate::store::url::SqliteTarget;
    let s = SqliteStore::connect(SqliteTarget::Memory, 1, true)
        .await
        .unwrap();
    s.migrate().await.unwrap();
    let mut b = JobBatch::default();
    b.push("", "now1", "", "1", Due::Now, None);
    b.push("", "later", "", "2", Due::After(3_600_000), None);
    b.push("", "now2", "", "3", Due::Now, None);
    s.emit("t", &b).await.unwrap();
    assert!(s.consumer_open("t", "c", 1).await.unwrap());
    let rows = s.event_fetch("t", "c", 1, 10).await.unwrap().unwrap();
    assert_eq!(rows.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 3]);
    // The holder dies; an hour later the next one takes over.
    s.step_clock(2 * 3_600_000);
    assert!(s.consumer_open("t", "c", 2).await.unwrap());
    let mut got = vec![];
    loop {
        let rows = s.event_fetch("t", "c", 2, 10).await.unwrap().unwrap();
        if rows.is_empty() {
            break;
        }
        if got.is_empty() {
            let marked: Vec<i64> =
                sqlx::query_scalar("SELECT seq FROM gnl_event_marks ORDER BY seq")
                    .fetch_all(&s.pool)
                    .await
                    .unwrap();
            assert_eq!(marked, [1, 3], "only the batch's events are marked");
        }
        got.push(
            rows.iter()
                .map(|e| (e.id.clone(), e.attempt))
                .collect::<Vec<_>>(),
        );
        let outs: Vec<EventOutcome> = rows
            .iter()
            .map(|e| EventOutcome::Accepted { seq: e.seq })
            .collect();
        assert!(s.event_settle("t", "c", 2, &outs).await.unwrap());
    }
    let want = |id: &str, a| vec![(id.to_string(), a)];
    assert_eq!(got, [want("now1", 1), want("later", 1), want("now2", 1)]);
    let lag = s.consumer_lag("t", "c").await.unwrap().unwrap();
    assert_eq!((lag.cursor, lag.behind), (3, 0));
}

/// The fast path starts and finishes runs and takes and releases run locks at once, and
/// leaves to the pool (answering `None`, writing nothing) what it cannot do at once: a run
/// another workflow's, a finish already recorded, a lock held, and every write while another
/// connection holds the file's write lock (here the same thread's: a wait would never end). A finished run is only read, so
/// its result comes back at once even then.
#[tokio::test]
async fn the_fast_path_starts_and_finishes_runs_and_waits_for_nobody() {
    use crate::store::journal::RunStart;
    let dir = std::env::temp_dir().join(format!("gnl-now-{}", crate::ids::new_job_id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("s.db");
    let s = open(&format!("sqlite:///{}", path.display()), 2, true)
        .await
        .unwrap();
    let run = |id: &str, wf: &str| RunStart {
        run_id: id.into(),
        workflow: wf.into(),
        preset: None,
        input: Some("{\"a\":1}".into()),
        scheduled_for: Some(7),
        owner: "o".into(),
        lease_ms: Some(60_000),
    };
    let st = s.run_start_now(&run("r", "wf")).unwrap();
    assert!(st.created && st.steps.is_empty());
    assert_eq!((st.run.state.as_str(), st.run.token), ("running", 1));
    assert!(st.run.lease_expires_at.unwrap() > st.now_ms);
    assert_eq!(s.step_put_now("r", "b", 0, 1, "2"), Some(()));
    assert_eq!(s.step_put_now("r", "a", 0, 0, "1"), Some(()));
    let st = s.run_start_now(&run("r", "wf")).unwrap();
    assert_eq!((st.created, st.run.token), (false, 2));
    let got: Vec<_> = st
        .steps
        .to_rows()
        .into_iter()
        .map(|x| (x.name, x.position))
        .collect();
    assert_eq!(got, vec![("a".to_string(), 0), ("b".to_string(), 1)]);
    assert!(
        s.run_start_now(&run("r", "other")).is_none(),
        "the pool's refusal"
    );
    assert!(matches!(
        s.run_start(&run("r", "other")).await,
        Err(Error::InvalidArgument(_))
    ));
    assert_eq!(
        s.run_get("r").await.unwrap().unwrap().0.token,
        2,
        "nothing written"
    );
    assert_eq!(s.run_finish_now("r", "\"x\""), Some(()));
    assert_eq!(
        s.run_finish_now("r", "\"y\""),
        None,
        "a recorded finish: the pool's"
    );
    assert_eq!(
        s.run_finish("r", "\"y\"").await.unwrap().as_deref(),
        Some("\"x\"")
    );
    let t = s.lock_acquire_now("k", "o", 60_000).unwrap();
    assert_eq!(s.lock_acquire_now("k", "o2", 60_000), None, "held");
    assert_eq!(
        s.lock_release_now("k", t + 1),
        None,
        "not held with that token"
    );
    assert_eq!(s.lock_release_now("k", t), Some(()));
    // Another connection holds the file's write lock.
    let mut other = super::raw::Db::open(path.to_str().unwrap(), None).unwrap();
    other
        .write(|_| {
            let done = s.run_start_now(&run("r", "wf")).unwrap();
            assert_eq!(
                (
                    done.run.state.as_str(),
                    done.run.result.as_deref(),
                    done.run.token
                ),
                ("done", Some("\"x\""), 2)
            );
            assert!(s.run_start_now(&run("new", "wf")).is_none());
            assert!(s.run_finish_now("r2", "1").is_none());
            assert!(s.lock_acquire_now("k", "o", 60_000).is_none());
            assert!(s.step_put_now("r", "c", 0, 2, "3").is_none());
            Ok(())
        })
        .unwrap();
    assert!(s.run_get("new").await.unwrap().is_none(), "nothing written");
    assert_eq!(s.lock_acquire_now("k", "o", 60_000), Some(t + 1));
    s.close().await;
    std::fs::remove_dir_all(&dir).unwrap();
    // An in-memory store has no fast path.
    let m = store().await;
    assert!(m.run_start_now(&run("r", "wf")).is_none());
    assert_eq!(m.lock_acquire_now("k", "o", 60_000), None);
}
