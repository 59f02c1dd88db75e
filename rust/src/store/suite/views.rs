//! The queue's views for Studio (`QueueStore::list_orgs`, `count_jobs`, `store::scan_jobs`):
//! bounded reads along the keys, the same on every engine.

use std::sync::Arc;

use super::journal::start;
use super::queue::typed;
use super::triggers::{def, pending};
use super::{done, job, req};
use crate::model::*;
use crate::store::events::EventOutcome;
use crate::store::journal::RunQuery;
use crate::store::{scan_jobs, Store};

on_every_engine! {
    store: [
        organizations_are_listed_in_name_order_a_page_at_a_time,
        counts_cover_the_latest_jobs_of_a_lane_up_to_the_bound,
        a_bounded_scan_lists_each_match_once_whatever_the_bound,
        counts_run_under_the_statement_timeout,
        dashboard_reads_run_under_the_read_timeout,
    ],
    servers: [],
    store_and_url: [],
}

/// Each organization once (whatever its number of job types: a lane is an organization and
/// a type), in name order, a page at a time.
pub async fn organizations_are_listed_in_name_order_a_page_at_a_time(s: Arc<dyn Store>) {
    s.enqueue(&[
        job("b", "1"),
        job("", "2"),
        job("a", "3"),
        job("b", "4"),
        typed("a", "5", "u"),
        typed("a", "6", "v"),
        typed("", "7", "u"),
    ])
    .await
    .unwrap();
    assert_eq!(s.list_orgs(None, 10).await.unwrap(), vec!["", "a", "b"]);
    assert_eq!(s.list_orgs(None, 2).await.unwrap(), vec!["", "a"]);
    assert_eq!(s.list_orgs(Some(""), 10).await.unwrap(), vec!["a", "b"]);
    assert_eq!(s.list_orgs(Some("a"), 10).await.unwrap(), vec!["b"]);
    assert!(s.list_orgs(Some("b"), 10).await.unwrap().is_empty());
}

pub async fn counts_cover_the_latest_jobs_of_a_lane_up_to_the_bound(s: Arc<dyn Store>) {
    let jobs: Vec<NewJob> = (0..5).map(|i| job("c", &format!("{i}"))).collect();
    s.enqueue(&jobs).await.unwrap();
    // Lane c's two oldest jobs are claimed and done.
    for _ in 0..2 {
        let got = s.claim(&[], &req(1, 30_000)).await.unwrap();
        assert_eq!(got.len(), 1);
        s.finish(&[done(&got[0], "1")]).await.unwrap();
    }
    s.enqueue(&[job("other", "x")]).await.unwrap();
    let now = s.now_ms().await.unwrap();
    let c = s.count_jobs("c", 100, now - 120_000, 5_000).await.unwrap();
    assert_eq!(c.scanned, 5);
    assert_eq!(
        c.states,
        vec![("done".to_string(), 2), ("pending".to_string(), 3)]
    );
    let fin: i64 = c.finished.iter().map(|(_, _, n)| n).sum();
    assert_eq!(
        fin, 2,
        "both done jobs finished in the window: {:?}",
        c.finished
    );
    assert!(c
        .finished
        .iter()
        .all(|(m, st, _)| (0..=2).contains(m) && st == "done"));
    // Finished before the window: not in it.
    let c = s.count_jobs("c", 100, now + 60_000, 5_000).await.unwrap();
    assert!(c.finished.is_empty());
    // The bound: only the 3 latest jobs (the oldest two are claimed first, so done).
    let c = s.count_jobs("c", 3, 0, 5_000).await.unwrap();
    assert_eq!(c.scanned, 3);
    assert_eq!(c.states, vec![("pending".to_string(), 3)]);
    let c = s.count_jobs("nobody", 100, 0, 5_000).await.unwrap();
    assert_eq!(c, JobCounts::default());
    // Many at once: the same counts, in the order asked.
    let orgs: Vec<String> = ["other", "nobody", "c", ""].map(String::from).to_vec();
    for scan in [3, 100] {
        let many = s
            .count_jobs_of(&orgs, scan, now - 120_000, 5_000)
            .await
            .unwrap();
        assert_eq!(many.len(), 4);
        for (org, got) in orgs.iter().zip(&many) {
            let one = s.count_jobs(org, scan, now - 120_000, 5_000).await.unwrap();
            assert_eq!(got, &one, "{org:?} scan {scan}");
        }
    }
}

pub async fn a_bounded_scan_lists_each_match_once_whatever_the_bound(s: Arc<dyn Store>) {
    let mk = |org: &str, i: usize| NewJob {
        typ: if i % 3 == 0 { "u" } else { "t" }.into(),
        ..job(org, &format!("{i}"))
    };
    let jobs: Vec<NewJob> = (0..10).flat_map(|i| [mk("a", i), mk("b", i)]).collect();
    s.enqueue(&jobs).await.unwrap();
    let snap = s.max_seq().await.unwrap();
    s.enqueue(&[mk("a", 99)]).await.unwrap();
    for lane in [None, Some("a")] {
        for (bound, limit) in [(1, 10), (3, 1), (4, 2), (7, 50), (100, 100)] {
            let mut seen = Vec::new();
            let mut after = None;
            let mut pages = 0;
            loop {
                let (rows, next) =
                    scan_jobs(s.as_ref(), lane, None, Some("u"), snap, after, bound, limit)
                        .await
                        .unwrap();
                assert!(rows.len() <= limit);
                seen.extend(rows.iter().map(|r| format!("{}/{}", r.org, r.id)));
                pages += 1;
                assert!(pages < 100, "the scan ends");
                match next {
                    Some(p) => after = Some(p),
                    None => break,
                }
            }
            let mut want: Vec<String> = ["a", "b"]
                .iter()
                .filter(|o| lane.is_none_or(|l| l == **o))
                .flat_map(|o| [0, 3, 6, 9].map(|i| format!("{o}/{i}")))
                .collect();
            want.sort();
            let mut got = seen.clone();
            got.sort();
            assert_eq!(
                got, want,
                "lane {lane:?}, bound {bound}, limit {limit}: {seen:?}"
            );
        }
    }
    // A page with no match but more to scan says where to go on.
    let (rows, next) = scan_jobs(s.as_ref(), Some("a"), Some("dead"), None, snap, None, 4, 10)
        .await
        .unwrap();
    assert!(rows.is_empty());
    assert!(next.is_some());
}

pub async fn counts_run_under_the_statement_timeout(s: Arc<dyn Store>) {
    let jobs: Vec<NewJob> = (0..100_000).map(|i| job("big", &format!("{i}"))).collect();
    s.enqueue(&jobs).await.unwrap();
    // 100,000 rows cannot be counted in 1 ms: the engine cuts the query off.
    let err = s.count_jobs("big", 100_000, 0, 1).await;
    assert!(err.is_err(), "not cut off: {err:?}");
    let err = s.count_jobs_of(&["big".into()], 100_000, 0, 1).await;
    assert!(err.is_err(), "not cut off: {err:?}");
    // The timeout stays with its query: the pool's connections count as before.
    for _ in 0..12 {
        let c = s.count_jobs("big", 100_000, 0, 60_000).await.unwrap();
        assert_eq!(c.scanned, 100_000);
    }
}

/// The reads Studio's pages make, one by one, each over its whole table: true when it ran to
/// its end, false when it was cut off. Not here: the key look-ups (`get_job`, `run_get`) and
/// `runs_edge` (one step along the listing index, which SQLite may take within 1 ms even
/// over every run): they run under the timeout too, but no table here is big enough that
/// they cannot end within it.
async fn dashboard_reads(s: &Arc<dyn Store>, n: i64) -> Vec<(&'static str, bool)> {
    let snapshot = s.max_seq().await.unwrap();
    let runs = RunQuery {
        state: Some("failed".into()),
        workflow: None,
        limit: n,
        before: None,
        scan: Some(n),
    };
    let jobs = ListQuery {
        scope: ListScope::All,
        snapshot,
        after: None,
        limit: n,
    };
    vec![
        ("list_orgs", s.list_orgs(None, n).await.is_ok()),
        ("list_jobs", s.list_jobs(&jobs).await.is_ok()),
        ("list_runs", s.list_runs(&runs).await.is_ok()),
        ("list_triggers", s.list_triggers(None, n).await.is_ok()),
        ("consumers", s.consumers(None, n).await.is_ok()),
        ("dead_events", s.dead_events("t", "c", 0, n).await.is_ok()),
        ("consumer_lag", s.consumer_lag("t", "c").await.is_ok()),
    ]
}

pub async fn dashboard_reads_run_under_the_read_timeout(s: Arc<dyn Store>) {
    // Enough rows that none of the reads below ends in 1 ms on any engine.
    const N: usize = 40_000;
    let jobs: Vec<NewJob> = (0..N).map(|i| job(&format!("o{i:06}"), "1")).collect();
    s.enqueue(&jobs).await.unwrap();
    // A consumer with N quarantined events, and N events behind its cursor.
    let events = |from: usize| {
        let mut b = JobBatch::default();
        for i in from..from + N {
            b.push("", &format!("e{i}"), "", "{}", Due::Now, None);
        }
        b
    };
    s.emit("t", &events(0)).await.unwrap();
    assert!(s.consumer_open("t", "c", 1).await.unwrap());
    let mut quarantined = 0;
    loop {
        let got = s.event_fetch("t", "c", 1, N as i64).await.unwrap().unwrap();
        if got.is_empty() {
            break;
        }
        quarantined += got.len();
        let dead: Vec<EventOutcome> = got
            .iter()
            .map(|e| EventOutcome::Failed {
                seq: e.seq,
                error: "boom".into(),
                retry_after_ms: None,
            })
            .collect();
        assert!(s.event_settle("t", "c", 1, &dead).await.unwrap());
    }
    assert_eq!(quarantined, N);
    s.emit("t", &events(N)).await.unwrap();
    // Triggers and runs, written by 8 tasks at once.
    const M: usize = 20_000;
    let mut tasks = Vec::new();
    for w in 0..8 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            for i in (w..M).step_by(8) {
                s.trigger_register(&def(&format!("t{i:06}"), "* * * * *"), &pending(1))
                    .await
                    .unwrap();
                s.run_start(&start(&format!("r{i:06}"), "wf", None))
                    .await
                    .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let all = |ok: bool, reads: Vec<(&'static str, bool)>| {
        let wrong: Vec<_> = reads.iter().filter(|r| r.1 != ok).map(|r| r.0).collect();
        assert!(wrong.is_empty(), "expected ok={ok}: {wrong:?}");
    };
    let n = (N as i64) * 2;
    // No timeout (the default): every read runs to its end.
    all(true, dashboard_reads(&s, n).await);
    // 1 ms: each is cut off. The engines kill a statement from a timer, and on a loaded
    // machine that timer can run late enough for a read of a few ms to end first (seen on
    // MariaDB's `list_orgs`): each read must be cut off in one of five rounds, so a read that
    // ignores the timeout still fails here.
    s.read_timeout().set(1);
    let mut ended: Vec<&'static str> = Vec::new();
    for round in 0..5 {
        let reads = dashboard_reads(&s, n).await;
        if round == 0 {
            ended = reads.iter().map(|r| r.0).collect();
        }
        ended.retain(|name| reads.iter().any(|r| r.0 == *name && r.1));
        if ended.is_empty() {
            break;
        }
    }
    assert!(
        ended.is_empty(),
        "never cut off in 5 rounds at 1 ms: {ended:?}"
    );
    // A minute: each ends, and a cut-off left nothing behind on the pool's connections.
    s.read_timeout().set(60_000);
    for _ in 0..3 {
        all(true, dashboard_reads(&s, n).await);
        assert!(s.runs_edge(None, M as i64).await.unwrap().is_some());
        assert!(s.get_job("o000001", "1").await.unwrap().is_some());
        assert!(s.run_get("r000001").await.unwrap().is_some());
    }
    s.read_timeout().set(0);
    all(true, dashboard_reads(&s, n).await);
    let jobs = s.count_jobs("o000001", 10, 0, 60_000).await.unwrap();
    assert_eq!(jobs.scanned, 1);
}
