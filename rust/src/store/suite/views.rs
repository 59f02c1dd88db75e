//! The queue's views for Studio (`QueueStore::list_orgs`, `count_jobs`, `store::scan_jobs`):
//! bounded reads along the keys, the same on every engine.

use std::sync::Arc;

use super::{done, job, req};
use crate::model::*;
use crate::store::{scan_jobs, Store};

on_every_engine! {
    store: [
        organizations_are_listed_in_name_order_a_page_at_a_time,
        counts_cover_the_latest_jobs_of_a_lane_up_to_the_bound,
        a_bounded_scan_lists_each_match_once_whatever_the_bound,
    ],
    servers: [counts_run_under_the_statement_timeout],
    store_and_url: [],
}

pub async fn organizations_are_listed_in_name_order_a_page_at_a_time(s: Arc<dyn Store>) {
    s.enqueue(&[job("b", "1"), job("", "2"), job("a", "3"), job("b", "4")])
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
    // 100,000 rows cannot be counted in 1 ms: the server cuts the query off.
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
