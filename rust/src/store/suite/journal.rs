//! The journal's engine suite (`JournalStore`): steps keyed `(run_id, name, n)` keep their first
//! result (also under concurrent writers), at-most-once intents and their resolution, runs
//! (start, resume, finish, fail, suspend, listing), the waker's claim of due runs (once across
//! concurrent wakers) and leased locks with fencing tokens.

use std::collections::HashMap;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::store::journal::{RunQuery, RunStart, RunStarted};
use crate::store::{open, Store};

on_every_engine! {
    store: [
        steps_keep_the_first_result,
        intents_are_finished_once_and_resolved_by_an_operator,
        runs_start_resume_and_finish,
        runs_start_resume_and_finish_at_once,
        suspended_and_abandoned_runs_are_due_to_the_waker,
        runs_are_listed_and_read_back,
        locks_are_leased_with_fresh_fencing_tokens,
        locks_are_leased_with_fresh_fencing_tokens_at_once,
    ],
    servers: [],
    store_and_url: [
        concurrent_step_writers_have_one_winner,
        concurrent_wakers_claim_each_run_once,
    ],
}

/// The journal's calls as `gnl.durable` makes them: with `now`, the at-once variant first
/// (`*_now`, SQLite's fast path) and the async one when it answers `None`.
struct Calls {
    s: Arc<dyn Store>,
    now: bool,
}

impl Calls {
    async fn run_start(&self, st: &RunStart) -> Result<RunStarted> {
        if let Some(got) = self.now.then(|| self.s.run_start_now(st)).flatten() {
            return Ok(got);
        }
        self.s.run_start(st).await
    }

    async fn run_finish(&self, run_id: &str, result: &str) -> Result<Option<String>> {
        if self.now && self.s.run_finish_now(run_id, result).is_some() {
            return Ok(None);
        }
        self.s.run_finish(run_id, result).await
    }

    async fn lock_acquire(&self, key: &str, owner: &str, ttl_ms: i64) -> Result<Option<i64>> {
        if let Some(t) = self
            .now
            .then(|| self.s.lock_acquire_now(key, owner, ttl_ms))
            .flatten()
        {
            return Ok(Some(t));
        }
        self.s.lock_acquire(key, owner, ttl_ms).await
    }

    async fn lock_release(&self, key: &str, token: i64) -> Result<bool> {
        if self.now && self.s.lock_release_now(key, token).is_some() {
            return Ok(true);
        }
        self.s.lock_release(key, token).await
    }
}

pub(crate) fn start(run_id: &str, workflow: &str, lease_ms: Option<i64>) -> RunStart {
    RunStart {
        run_id: run_id.into(),
        workflow: workflow.into(),
        preset: None,
        input: Some("{\"a\":1}".into()),
        scheduled_for: Some(7),
        owner: "me".into(),
        lease_ms,
    }
}

pub async fn steps_keep_the_first_result(s: Arc<dyn Store>) {
    assert_eq!(s.step_get("r", "n", 0).await.unwrap(), None);
    assert_eq!(s.step_put("r", "n", 0, 0, "1").await.unwrap(), None);
    let kept = s.step_put("r", "n", 0, 0, "2").await.unwrap().unwrap();
    assert_eq!(kept.result.as_deref(), Some("1"));
    assert_eq!(kept.state, "done");
    let got = s.step_get("r", "n", 0).await.unwrap().unwrap();
    assert_eq!((got.name.as_str(), got.n, got.position), ("n", 0, 0));
    assert_eq!(got.result.as_deref(), Some("1"));
    // n counts calls of one name: a loop records one result per iteration.
    assert_eq!(s.step_put("r", "n", 1, 1, "11").await.unwrap(), None);
    assert_eq!(
        s.step_get("r", "n", 1)
            .await
            .unwrap()
            .unwrap()
            .result
            .as_deref(),
        Some("11")
    );
    // (run_id, name) pairs never collide.
    assert_eq!(s.step_put("r", "n2", 0, 2, "3").await.unwrap(), None);
    assert_eq!(s.step_put("rn", "2", 0, 0, "4").await.unwrap(), None);
    let odd = "{\"a\":\"\\u0000\u{1F600}\"}";
    assert_eq!(s.step_put("r", "u", 0, 3, odd).await.unwrap(), None);
    assert_eq!(
        s.step_get("r", "u", 0)
            .await
            .unwrap()
            .unwrap()
            .result
            .as_deref(),
        Some(odd)
    );
}

pub async fn intents_are_finished_once_and_resolved_by_an_operator(s: Arc<dyn Store>) {
    assert_eq!(s.step_intent("r", "pay", 0, 0, 41).await.unwrap(), None);
    // A second executor finds the intent, not a result.
    let found = s.step_intent("r", "pay", 0, 0, 42).await.unwrap().unwrap();
    assert_eq!((found.state.as_str(), found.result), ("intent", None));
    assert!(found.started_at > 0);
    let plain = s.step_put("r", "pay", 0, 0, "9").await.unwrap().unwrap();
    assert_eq!(plain.state, "intent");
    // Only the intent's writer finishes it, once.
    assert!(!s.step_finish("r", "pay", 0, 42, "1").await.unwrap());
    assert!(s.step_finish("r", "pay", 0, 41, "1").await.unwrap());
    assert!(!s.step_finish("r", "pay", 0, 41, "2").await.unwrap());
    let done = s.step_get("r", "pay", 0).await.unwrap().unwrap();
    assert_eq!(
        (done.state.as_str(), done.result.as_deref()),
        ("done", Some("1"))
    );
    assert!(done.finished_at.is_some());
    // A done step is not an operator's to resolve.
    assert!(!s.step_resolve("r", "pay", 0, Some("5")).await.unwrap());
    assert!(!s.step_resolve("r", "nope", 0, None).await.unwrap());
    // An intent without result: marked done with a value ...
    assert_eq!(s.step_intent("r", "pay", 1, 1, 7).await.unwrap(), None);
    assert!(s.step_resolve("r", "pay", 1, Some("5")).await.unwrap());
    assert_eq!(
        s.step_get("r", "pay", 1)
            .await
            .unwrap()
            .unwrap()
            .result
            .as_deref(),
        Some("5")
    );
    // ... or removed, so that a later execution runs the step again.
    assert_eq!(s.step_intent("r", "pay", 2, 2, 8).await.unwrap(), None);
    assert!(s.step_resolve("r", "pay", 2, None).await.unwrap());
    assert_eq!(s.step_get("r", "pay", 2).await.unwrap(), None);
    assert!(!s.step_finish("r", "pay", 2, 8, "1").await.unwrap());
    assert_eq!(s.step_intent("r", "pay", 2, 2, 9).await.unwrap(), None);
}

pub async fn runs_start_resume_and_finish(s: Arc<dyn Store>) {
    runs_lifecycle(Calls { s, now: false }).await;
}

/// The same through the at-once calls first (SQLite's fast path), as `gnl.durable` makes them.
pub async fn runs_start_resume_and_finish_at_once(s: Arc<dyn Store>) {
    runs_lifecycle(Calls { s, now: true }).await;
}

async fn runs_lifecycle(c: Calls) {
    let st = c.run_start(&start("r1", "wf", None)).await.unwrap();
    assert!(st.created);
    assert!(st.steps.is_empty());
    assert!(st.now_ms > 0);
    let r = &st.run;
    assert_eq!((r.run_id.as_str(), r.workflow.as_str()), ("r1", "wf"));
    assert_eq!((r.state.as_str(), r.token), ("running", 1));
    assert_eq!(r.input.as_deref(), Some("{\"a\":1}"));
    assert_eq!(r.scheduled_for, Some(7));
    assert_eq!(r.lease_owner.as_deref(), Some("me"));
    assert_eq!(r.lease_expires_at, None);
    // Steps come back in position order.
    c.s.step_put("r1", "b", 0, 1, "2").await.unwrap();
    c.s.step_put("r1", "a", 0, 0, "1").await.unwrap();
    c.s.step_put("r1", "b", 1, 2, "3").await.unwrap();
    let mut again = start("r1", "wf", Some(60_000));
    again.input = Some("{\"other\":2}".into());
    let st = c.run_start(&again).await.unwrap();
    assert!(!st.created);
    assert_eq!(st.run.token, 2);
    assert_eq!(
        st.run.input.as_deref(),
        Some("{\"a\":1}"),
        "a resumed run keeps its input"
    );
    let keys: Vec<(String, i64, i64)> = st
        .steps
        .to_rows()
        .into_iter()
        .map(|x| (x.name, x.n, x.position))
        .collect();
    assert_eq!(
        keys,
        vec![("a".into(), 0, 0), ("b".into(), 0, 1), ("b".into(), 1, 2)]
    );
    assert!(st.run.lease_expires_at.unwrap() > st.now_ms);
    // Another workflow under the same run id is refused and changes nothing.
    match c.run_start(&start("r1", "other", None)).await {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("\"wf\""), "{m}"),
        other => panic!("{other:?}"),
    }
    let (run, _) = c.s.run_get("r1").await.unwrap().unwrap();
    assert_eq!((run.workflow.as_str(), run.token), ("wf", 2));
    // The first finish is kept.
    assert_eq!(c.run_finish("r1", "\"x\"").await.unwrap(), None);
    assert_eq!(
        c.run_finish("r1", "\"y\"").await.unwrap().as_deref(),
        Some("\"x\"")
    );
    assert!(!c.s.run_fail("r1", "boom").await.unwrap());
    let st = c.run_start(&start("r1", "wf", None)).await.unwrap();
    assert_eq!(st.run.state, "done");
    assert_eq!(st.run.result.as_deref(), Some("\"x\""));
    assert!(!st.created);
    // A failed run is started again by its next execution.
    c.run_start(&start("r2", "wf", None)).await.unwrap();
    assert!(c.s.run_fail("r2", "boom\0").await.unwrap());
    let (run, _) = c.s.run_get("r2").await.unwrap().unwrap();
    assert_eq!(run.state, "failed");
    assert!(run.error.unwrap().starts_with("boom"));
    let st = c.run_start(&start("r2", "wf", None)).await.unwrap();
    assert_eq!((st.run.state.as_str(), st.run.error), ("running", None));
    // Another owner is refused while the run's lease is live, and nothing changes; its own
    // owner (the waker's claim) takes it; once the lease lapsed anyone does.
    let other = |run_id: &str, lease_ms: Option<i64>| RunStart {
        owner: "other".into(),
        ..start(run_id, "wf", lease_ms)
    };
    let live = c
        .run_start(&start("live", "wf", Some(60_000)))
        .await
        .unwrap()
        .run;
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    match c.run_start(&other("live", Some(90_000))).await {
        Err(Error::RunBusy(m)) => assert!(
            m.starts_with("run 'live' is being executed elsewhere (by me, "),
            "{m}"
        ),
        got => panic!("{got:?}"),
    }
    let (run, _) = c.s.run_get("live").await.unwrap().unwrap();
    assert_eq!(run, live, "a refused start changes nothing");
    let st = c
        .run_start(&start("live", "wf", Some(60_000)))
        .await
        .unwrap();
    assert_eq!(
        (st.run.lease_owner.as_deref(), st.run.token),
        (Some("me"), 2)
    );
    c.run_start(&start("lapsed", "wf", Some(-1))).await.unwrap();
    let st = c.run_start(&other("lapsed", Some(60_000))).await.unwrap();
    assert_eq!(
        (st.run.lease_owner.as_deref(), st.run.token),
        (Some("other"), 2)
    );
    // A job's run has no lease of its own (the job's covers it): never refused here.
    let st = c.run_start(&other("r2", None)).await.unwrap();
    assert_eq!(st.run.lease_owner.as_deref(), Some("other"));
}

pub async fn suspended_and_abandoned_runs_are_due_to_the_waker(s: Arc<dyn Store>) {
    let wf = vec!["wf".to_string()];
    s.run_start(&start("live", "wf", Some(60_000)))
        .await
        .unwrap();
    s.run_start(&start("job", "wf", None)).await.unwrap();
    assert!(s.runs_due(&wf, "w", 1000, 10).await.unwrap().is_empty());
    assert!(s.run_renew("live", "me", 60_000).await.unwrap());
    assert!(
        !s.run_renew("live", "other", 60_000).await.unwrap(),
        "only its owner renews a lease"
    );
    assert!(
        !s.run_renew("job", "me", 60_000).await.unwrap(),
        "a job's run has no lease"
    );
    // A sleeping run is due once its wake-up passed, to wakers that know its workflow.
    s.run_start(&start("sleepy", "wf", Some(60_000)))
        .await
        .unwrap();
    let now = s.now_ms().await.unwrap();
    assert!(s.run_suspend("sleepy", now + 3_600_000).await.unwrap());
    assert!(s.runs_due(&wf, "w", 1000, 10).await.unwrap().is_empty());
    s.run_start(&start("sleepy", "wf", Some(60_000)))
        .await
        .unwrap();
    assert!(s.run_suspend("sleepy", now - 1).await.unwrap());
    let (run, _) = s.run_get("sleepy").await.unwrap().unwrap();
    assert_eq!(
        (run.state.as_str(), run.wake_at),
        ("suspended", Some(now - 1))
    );
    assert!(
        !s.run_suspend("sleepy", now).await.unwrap(),
        "only a running run suspends"
    );
    assert!(s
        .runs_due(&["other".to_string()], "w", 1000, 10)
        .await
        .unwrap()
        .is_empty());
    let due = s.runs_due(&wf, "w1", 60_000, 10).await.unwrap();
    assert_eq!(due.len(), 1);
    assert_eq!(due[0].run_id, "sleepy");
    assert_eq!(due[0].state, "running");
    assert_eq!(due[0].lease_owner.as_deref(), Some("w1"));
    assert!(due[0].lease_expires_at.unwrap() > now);
    // A run claimed from its sleep keeps its wake-up time; one claimed because its lease
    // lapsed has none (the waker tells the two apart by it: the second is logged), even when
    // it had slept before.
    assert_eq!(due[0].wake_at, Some(now - 1));
    assert!(s.runs_due(&wf, "w2", 60_000, 10).await.unwrap().is_empty());
    s.run_start(&start("woke", "wf", Some(60_000)))
        .await
        .unwrap();
    assert!(s.run_suspend("woke", now - 1).await.unwrap());
    let due = s.runs_due(&wf, "w1", -1, 10).await.unwrap();
    assert_eq!(
        due.iter()
            .map(|r| (r.run_id.as_str(), r.wake_at))
            .collect::<Vec<_>>(),
        vec![("woke", Some(now - 1))]
    );
    let due = s.runs_due(&wf, "w2", 60_000, 10).await.unwrap();
    assert_eq!(
        due.iter()
            .map(|r| (r.run_id.as_str(), r.wake_at))
            .collect::<Vec<_>>(),
        vec![("woke", None)]
    );
    // A running run whose lease ran out (its process died) is due too; done ones never.
    s.run_start(&start("dead", "wf", Some(-1))).await.unwrap();
    s.run_start(&start("done", "wf", Some(-1))).await.unwrap();
    s.run_finish("done", "1").await.unwrap();
    s.run_start(&start("failed", "wf", Some(-1))).await.unwrap();
    s.run_fail("failed", "x").await.unwrap();
    let due = s.runs_due(&wf, "w2", 60_000, 10).await.unwrap();
    assert_eq!(
        due.iter()
            .map(|r| (r.run_id.as_str(), r.wake_at))
            .collect::<Vec<_>>(),
        vec![("dead", None)]
    );
    // A failed run handed to the waker (`resume_run`) is due at once, its error cleared; a
    // run that is not failed is left alone.
    assert!(!s.run_wake("dead").await.unwrap());
    assert!(!s.run_wake("done").await.unwrap());
    assert!(!s.run_wake("nope").await.unwrap());
    assert!(s.run_wake("failed").await.unwrap());
    assert!(!s.run_wake("failed").await.unwrap());
    let (run, _) = s.run_get("failed").await.unwrap().unwrap();
    assert_eq!((run.state.as_str(), run.error), ("suspended", None));
    let due = s.runs_due(&wf, "w2", 60_000, 10).await.unwrap();
    assert_eq!(
        due.iter().map(|r| r.run_id.as_str()).collect::<Vec<_>>(),
        vec!["failed"]
    );
    // In bounded batches, oldest due first.
    for i in 0..5 {
        s.run_start(&start(&format!("b{i}"), "wf", Some(-100 + i)))
            .await
            .unwrap();
    }
    let first = s.runs_due(&wf, "w", 60_000, 3).await.unwrap();
    assert_eq!(first.len(), 3);
    assert_eq!(s.runs_due(&wf, "w", 60_000, 3).await.unwrap().len(), 2);
}

pub async fn runs_are_listed_and_read_back(s: Arc<dyn Store>) {
    assert!(s.run_get("none").await.unwrap().is_none());
    s.run_start(&start("a", "wf", None)).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(3)).await;
    s.run_start(&start("b", "wf2", None)).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(3)).await;
    s.run_start(&start("c", "wf", None)).await.unwrap();
    s.run_finish("c", "3").await.unwrap();
    s.step_put("a", "s", 0, 0, "1").await.unwrap();
    let q = |state: Option<&str>, workflow: Option<&str>, limit| RunQuery {
        state: state.map(String::from),
        workflow: workflow.map(String::from),
        limit,
        before: None,
        scan: None,
    };
    let ids = |rows: Vec<crate::store::journal::RunRow>| {
        rows.into_iter().map(|r| r.run_id).collect::<Vec<_>>()
    };
    assert_eq!(
        ids(s.list_runs(&q(None, None, 10)).await.unwrap()),
        ["c", "b", "a"]
    );
    assert_eq!(
        ids(s.list_runs(&q(None, None, 2)).await.unwrap()),
        ["c", "b"]
    );
    assert_eq!(
        ids(s.list_runs(&q(Some("running"), None, 10)).await.unwrap()),
        ["b", "a"]
    );
    assert_eq!(
        ids(s.list_runs(&q(None, Some("wf"), 10)).await.unwrap()),
        ["c", "a"]
    );
    assert_eq!(
        ids(s
            .list_runs(&q(Some("done"), Some("wf2"), 10))
            .await
            .unwrap()),
        Vec::<String>::new()
    );
    // Paging by the last run of the previous page walks every run once, newest first.
    let mut walked = vec![];
    let mut before = None;
    loop {
        let page = s
            .list_runs(&RunQuery {
                limit: 1,
                before: before.clone(),
                ..Default::default()
            })
            .await
            .unwrap();
        let Some(last) = page.last() else { break };
        before = Some((last.created_at, last.run_id.clone()));
        walked.extend(ids(page));
    }
    assert_eq!(walked, ["c", "b", "a"]);
    // A bounded scan: of the 2 newest runs (c, b) only b is running; the scan ends at b.
    let scanned = s
        .list_runs(&RunQuery {
            state: Some("running".into()),
            limit: 10,
            scan: Some(2),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(ids(scanned), ["b"]);
    let edge = s.runs_edge(None, 2).await.unwrap().unwrap();
    assert_eq!(edge.1, "b");
    let rest = s
        .list_runs(&RunQuery {
            state: Some("running".into()),
            limit: 10,
            scan: Some(2),
            before: Some(edge.clone()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(ids(rest), ["a"]);
    assert_eq!(s.runs_edge(Some((edge.0, &edge.1)), 2).await.unwrap(), None);
    let (run, steps) = s.run_get("a").await.unwrap().unwrap();
    assert_eq!(run.state, "running");
    assert_eq!(steps.len(), 1);
    assert_eq!(steps[0].result.as_deref(), Some("1"));
}

pub async fn locks_are_leased_with_fresh_fencing_tokens(s: Arc<dyn Store>) {
    locks(Calls { s, now: false }).await;
}

/// The same through the at-once calls first (SQLite's fast path).
pub async fn locks_are_leased_with_fresh_fencing_tokens_at_once(s: Arc<dyn Store>) {
    locks(Calls { s, now: true }).await;
}

async fn locks(c: Calls) {
    let t1 = c.lock_acquire("r", "o1", 60_000).await.unwrap().unwrap();
    assert_eq!(c.lock_acquire("r", "o2", 60_000).await.unwrap(), None);
    assert!(c.s.lock_renew("r", t1, 60_000).await.unwrap());
    assert!(!c.lock_release("r", t1 + 1).await.unwrap());
    assert!(c.lock_release("r", t1).await.unwrap());
    let t2 = c.lock_acquire("r", "o2", 60_000).await.unwrap().unwrap();
    assert!(t2 > t1, "a fresh token after a release: {t2} > {t1}");
    assert!(
        !c.s.lock_renew("r", t1, 60_000).await.unwrap(),
        "a stale holder renews nothing"
    );
    // An expired lock is taken over, with a fresh token; its old holder's renewal fails.
    let t3 = c.lock_acquire("x", "o1", -1).await.unwrap().unwrap();
    let t4 = c.lock_acquire("x", "o2", 60_000).await.unwrap().unwrap();
    assert!(t4 > t3);
    assert!(!c.s.lock_renew("x", t3, 60_000).await.unwrap());
    assert!(!c.lock_release("x", t3).await.unwrap());
    // Keys never collide.
    assert!(c
        .lock_acquire("r:fire", "o3", 60_000)
        .await
        .unwrap()
        .is_some());
}

pub async fn concurrent_step_writers_have_one_winner(s: Arc<dyn Store>, url: String) {
    let other = open(&url, 4, false).await.unwrap();
    let stores = [s.clone(), other.clone()];
    let mut tasks = vec![];
    for (w, st) in stores.iter().enumerate() {
        for k in 0..20i64 {
            let st = st.clone();
            tasks.push(tokio::spawn(async move {
                let mine = format!("{w}");
                let got = st.step_put("race", "s", k, k, &mine).await.unwrap();
                (k, got.map(|r| r.result.unwrap()).unwrap_or(mine))
            }));
        }
    }
    let mut kept: HashMap<i64, Vec<String>> = HashMap::new();
    for t in tasks {
        let (k, v) = t.await.unwrap();
        kept.entry(k).or_default().push(v);
    }
    for k in 0..20 {
        let recorded = s
            .step_get("race", "s", k)
            .await
            .unwrap()
            .unwrap()
            .result
            .unwrap();
        assert_eq!(kept[&k], vec![recorded.clone(), recorded], "step {k}");
    }
    other.close().await;
}

pub async fn concurrent_wakers_claim_each_run_once(s: Arc<dyn Store>, url: String) {
    let wf = vec!["wf".to_string()];
    for i in 0..30 {
        s.run_start(&start(&format!("r{i}"), "wf", Some(-1)))
            .await
            .unwrap();
    }
    let other = open(&url, 4, false).await.unwrap();
    let mut tasks = vec![];
    for (w, st) in [s.clone(), other.clone(), s.clone(), other.clone()]
        .into_iter()
        .enumerate()
    {
        let wf = wf.clone();
        tasks.push(tokio::spawn(async move {
            let mut got = vec![];
            loop {
                let batch = st.runs_due(&wf, &format!("w{w}"), 60_000, 4).await.unwrap();
                if batch.is_empty() {
                    break;
                }
                got.extend(batch.into_iter().map(|r| r.run_id));
            }
            got
        }));
    }
    let mut all = vec![];
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all.sort();
    let mut want: Vec<String> = (0..30).map(|i| format!("r{i}")).collect();
    want.sort();
    assert_eq!(all, want, "every due run claimed exactly once");
    other.close().await;
}
