//! The queue's engine suite (`QueueStore`): fair lanes, claims and the empty poll, leases and
//! fencing, outcomes and retries, dead letters, cancel, `max_depth`, big batches and batches in
//! parts, listings, and claimers and enqueuers running at once.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{done, failed, job, req, sleep_ms};
use crate::error::Error;
use crate::model::*;
use crate::store::{open, Part, Store};

on_every_engine! {
    store: [
        lanes_are_served_in_turn,
        lanes_alternate_however_fast_the_claims,
        a_claim_takes_at_most_per_org_jobs_an_organization,
        a_batch_takes_lanes_in_turn_and_each_lane_in_order,
        a_claim_without_the_probe_claims_the_same,
        an_empty_poll_is_one_query_whatever_the_lanes,
        a_stale_holder_cannot_write_after_a_reclaim,
        an_abandoned_claim_gives_back_only_its_unfinished_jobs,
        a_lease_is_each_jobs_own,
        a_canceled_job_keeps_the_cancels_reason,
        a_crash_on_the_last_attempt_dead_letters_the_job,
        failures_retry_after_the_delay_then_dead_letter,
        max_depth_counts_the_calls_own_jobs_and_writes_nothing,
        ids_are_exact_and_scoped_per_organization,
        listings_cancel_and_renew,
        the_clock_is_the_stores,
        a_batch_in_parts_is_written_whole_or_not_at_all,
        a_batch_over_many_organizations_is_one_call,
        a_big_batch_skips_taken_and_repeated_ids,
        idle_lanes_leave_the_turn_of_due_lanes_as_it_was,
        a_claim_takes_only_the_types_it_asks_for,
        organizations_take_turns_whatever_their_number_of_types,
        a_claim_over_a_hundred_and_fifty_organizations_serves_each_its_share,
        a_claim_serves_organizations_a_quantum_each,
        organizations_of_many_types_each_get_their_share,
    ],
    servers: [a_100k_job_enqueue_is_one_call, big_payloads_are_split_by_size],
    store_and_url: [
        concurrent_claimers_never_take_the_same_job,
        concurrent_claims_serve_the_lanes_in_turn,
        jobs_enqueued_while_claimers_run_are_all_claimed,
        max_depth_is_exact_under_concurrent_enqueues,
    ],
}

/// Every job in the store, counted page by page through the listing.
pub async fn count_jobs(s: &Arc<dyn Store>) -> usize {
    let snapshot = s.max_seq().await.unwrap();
    let (mut n, mut after) = (0, None);
    loop {
        let page = s
            .list_jobs(&ListQuery {
                scope: ListScope::All,
                snapshot,
                after: after.clone(),
                limit: 10_000,
            })
            .await
            .unwrap();
        let Some(last) = page.last() else { break };
        after = Some((last.org.clone(), last.seq));
        n += page.len();
    }
    n
}

pub async fn lanes_are_served_in_turn(s: Arc<dyn Store>) {
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
    // Then the big lane alone, in enqueue order.
    let got = s.claim(&[], &req(3, 60_000)).await.unwrap();
    let ids: Vec<&str> = got.iter().map(|j| j.id.as_str()).collect();
    assert_eq!(ids, vec!["b1", "b2", "b3"]);
}

/// `ClaimRequest::per_org` caps each organization's share of a claim (a worker's claim sent
/// while another is in flight asks 1): the batch is not split among the few lanes left.
pub async fn a_claim_takes_at_most_per_org_jobs_an_organization(s: Arc<dyn Store>) {
    let jobs: Vec<NewJob> = (0..15)
        .map(|i| job(["a", "b", "c"][i % 3], &format!("j{i}")))
        .collect();
    s.enqueue(&jobs).await.unwrap();
    let ask = |per_org| ClaimRequest {
        per_org,
        ..req(10, 60_000)
    };
    let one = s.claim(&[], &ask(1)).await.unwrap();
    assert_eq!(ids(&one), vec!["j0", "j1", "j2"]);
    let two = s.claim(&[], &ask(2)).await.unwrap();
    let per: Vec<usize> = ids_per_org(&two).values().map(Vec::len).collect();
    assert_eq!((two.len(), per), (6, vec![2, 2, 2]));
    // No cap: the whole batch over the lanes (6 jobs were left).
    let rest = s.claim(&[], &ask(0)).await.unwrap();
    assert_eq!(rest.len(), 6);
}

/// Turn tickets strictly increase: claims that fall in one millisecond still alternate.
pub async fn lanes_alternate_however_fast_the_claims(s: Arc<dyn Store>) {
    let jobs: Vec<NewJob> = (0..16)
        .map(|i| job(["a", "b"][i % 2], &format!("j{i}")))
        .collect();
    s.enqueue(&jobs).await.unwrap();
    let mut orgs = String::new();
    for _ in 0..8 {
        let got = s.claim(&[], &req(1, 60_000)).await.unwrap();
        orgs.push_str(&got[0].org);
    }
    assert_eq!(orgs, "abababab");
}

pub async fn a_batch_takes_lanes_in_turn_and_each_lane_in_order(s: Arc<dyn Store>) {
    let jobs: Vec<NewJob> = (0..6)
        .map(|i| job(["a", "b"][i % 2], &format!("j{i}")))
        .collect();
    s.enqueue(&jobs).await.unwrap();
    let got = s.claim(&[], &req(4, 60_000)).await.unwrap();
    let ids: Vec<&str> = got.iter().map(|j| j.id.as_str()).collect();
    assert_eq!(ids, vec!["j0", "j2", "j1", "j3"]);
    // Three lanes, a batch of 5: equal shares, the first lanes in turn get the rest.
    let jobs: Vec<NewJob> = (0..9)
        .map(|i| job(["c", "d", "e"][i % 3], &format!("k{i}")))
        .collect();
    s.enqueue(&jobs).await.unwrap();
    let got = s.claim(&[], &req(100, 60_000)).await.unwrap();
    let ids: Vec<&str> = got.iter().map(|j| j.id.as_str()).collect();
    // a and b were served by the first batch: c, d, e (never served) come first.
    assert_eq!(
        ids,
        vec!["k0", "k3", "k6", "k1", "k4", "k7", "k2", "k5", "k8", "j4", "j5"]
    );
}

/// A claim without the probe (the worker's last claim came back full) claims what is due,
/// lanes in turn, and finds nothing (writing nothing) when nothing is due.
pub async fn a_claim_without_the_probe_claims_the_same(s: Arc<dyn Store>) {
    let mut r = req(10, 60_000);
    r.probe = false;
    assert!(s.claim(&[], &r).await.unwrap().is_empty());
    let jobs: Vec<NewJob> = (0..6)
        .map(|i| job(["a", "b"][i % 2], &format!("j{i}")))
        .collect();
    s.enqueue(&jobs).await.unwrap();
    r.limit = 4;
    let got = s.claim(&[], &r).await.unwrap();
    let ids: Vec<&str> = got.iter().map(|j| j.id.as_str()).collect();
    assert_eq!(ids, vec!["j0", "j2", "j1", "j3"]);
    let finished: Vec<Outcome> = got.iter().map(|j| done(j, "1")).collect();
    let rest = s.claim(&finished, &r).await.unwrap();
    assert_eq!(rest.len(), 2);
    let finished: Vec<Outcome> = rest.iter().map(|j| done(j, "2")).collect();
    assert!(s.claim(&finished, &r).await.unwrap().is_empty());
    assert!(s.claim(&[], &r).await.unwrap().is_empty());
    let row = s.get_job("a", "j4").await.unwrap().unwrap();
    assert_eq!(
        (row.state.as_str(), row.result.as_deref()),
        ("done", Some("2"))
    );
}

/// How many statements an empty poll sends. On Postgres a store may still be running
/// statements of its own that an earlier call set off (it vacuums the lanes in a task beside its
/// calls, at most once a second, after calls that wrote them: `store/postgres/vacuum.rs`), which
/// `query_count` counts too (a look and a vacuum, at most two): there a poll that counts those
/// is polled again, up to five times 200 ms apart, and the last count is returned. An empty
/// poll writes nothing and sets off none. On the other engines nothing runs beside the calls:
/// one poll.
async fn empty_poll_statements(s: &Arc<dyn Store>, r: &ClaimRequest) -> u64 {
    let tries = if s.backend() == "postgres" { 5 } else { 1 };
    let mut seen = vec![];
    for _ in 0..tries {
        let before = s.query_count();
        assert!(s.claim(&[], r).await.unwrap().is_empty());
        seen.push(s.query_count() - before);
        if seen.last() == Some(&1) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    // No poll ever counted more than itself and a look and a vacuum beside it.
    assert!(seen.iter().all(|&n| n <= 3), "{seen:?}");
    *seen.last().unwrap()
}

pub async fn an_empty_poll_is_one_query_whatever_the_lanes(s: Arc<dyn Store>) {
    assert_eq!(empty_poll_statements(&s, &req(10, 60_000)).await, 1);
    // 300 lanes, every job done: an empty poll still costs one query.
    let jobs: Vec<NewJob> = (0..300).map(|i| job(&format!("o{i}"), "x")).collect();
    s.enqueue(&jobs).await.unwrap();
    let mut finished = vec![];
    let mut n = 0;
    loop {
        let got = s.claim(&finished, &req(64, 60_000)).await.unwrap();
        finished = got.iter().map(|j| done(j, "1")).collect();
        n += got.len();
        if got.is_empty() {
            break;
        }
    }
    assert_eq!(n, 300);
    assert_eq!(empty_poll_statements(&s, &req(10, 60_000)).await, 1);
    // A job delayed into the future does not make a poll more than one query either.
    let mut later = job("o1", "later");
    later.delay_ms = Some(60_000);
    s.enqueue(&[later]).await.unwrap();
    assert_eq!(empty_poll_statements(&s, &req(10, 60_000)).await, 1);
}

/// Lanes whose jobs are all due later (a reminder in an hour, per organization) change nothing
/// about which lane a claim serves: due lanes alternate in turn, a lane whose job becomes due
/// joins the turn with the ticket it had (a never-served lane first), and with nothing due the
/// poll is empty. (What the idle lanes cost a claim is `benches/bench_lane_pick.py`'s: the
/// lane pick reads only lanes with a due job.)
pub async fn idle_lanes_leave_the_turn_of_due_lanes_as_it_was(s: Arc<dyn Store>) {
    let idle: Vec<NewJob> = (0..3_000)
        .map(|i| {
            let mut j = job(&format!("idle{i}"), "later");
            j.delay_ms = Some(3_600_000);
            j
        })
        .collect();
    s.enqueue(&idle).await.unwrap();
    let soon_ms = 3_000;
    let mut jobs: Vec<NewJob> = (0..4)
        .flat_map(|i| [job("a", &format!("a{i}")), job("b", &format!("b{i}"))])
        .collect();
    jobs.push(job("m", "m0"));
    let mut m1 = job("m", "m1");
    m1.delay_ms = Some(soon_ms);
    let mut s0 = job("s", "s0");
    s0.delay_ms = Some(soon_ms);
    jobs.extend([m1, s0]);
    let t0 = std::time::Instant::now();
    s.enqueue(&jobs).await.unwrap();
    let first = claim_one_by_one(&s, 5).await;
    assert!(
        t0.elapsed() < Duration::from_millis(soon_ms as u64),
        "the machine is too slow for this test"
    );
    // Due lanes in turn, never-served ones first (org order breaks ties); m's next job is
    // due later, so m waits, as the idle lanes do.
    assert_eq!(first, ["a0", "b0", "m0", "a1", "b1"]);
    tokio::time::sleep(Duration::from_millis(soon_ms as u64 + 100).saturating_sub(t0.elapsed()))
        .await;
    // s (never served) first, then m (served before a and b were last).
    let then = claim_one_by_one(&s, 6).await;
    assert_eq!(then, ["s0", "m1", "a2", "b2", "a3", "b3"]);
    assert_eq!(
        empty_poll_statements(&s, &req(10, 60_000)).await,
        1,
        "the empty poll is one query"
    );
    let mut r = req(10, 60_000);
    r.probe = false;
    assert!(s.claim(&[], &r).await.unwrap().is_empty());
    let row = s.get_job("idle7", "later").await.unwrap().unwrap();
    assert_eq!(row.state, PENDING);
}

/// A job of `typ`.
pub(super) fn typed(org: &str, id: &str, typ: &str) -> NewJob {
    let mut j = job(org, id);
    j.typ = typ.into();
    j
}

/// A claim of up to `limit` jobs of `types`.
fn req_types(limit: usize, types: &[&str]) -> ClaimRequest {
    let mut r = req(limit, 60_000);
    r.types = types.iter().map(|t| t.to_string()).collect();
    r
}

/// The ids of `jobs` per organization, in the order they came.
fn ids_per_org(jobs: &[ClaimedJob]) -> std::collections::BTreeMap<&str, Vec<&str>> {
    let mut per_org: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
    for j in jobs {
        per_org
            .entry(j.org.as_str())
            .or_default()
            .push(j.id.as_str());
    }
    per_org
}

fn ids(jobs: &[ClaimedJob]) -> Vec<&str> {
    jobs.iter().map(|j| j.id.as_str()).collect()
}

/// Issue 15, deliverable 4: a claim takes only jobs of the types its worker has handlers for,
/// lanes in turn among them; a lane whose due jobs are all of other types is not read, so
/// with only such jobs due the poll is empty and one query; a job of a type no claim asks for
/// stays pending (and listed) for a worker that can run it.
pub async fn a_claim_takes_only_the_types_it_asks_for(s: Arc<dyn Store>) {
    // Many lanes whose due jobs are of a type the x-worker cannot run.
    let mut jobs: Vec<NewJob> = (0..500)
        .map(|i| typed(&format!("y{i}"), "j", "y"))
        .collect();
    jobs.extend([
        typed("a", "ay0", "y"),
        typed("a", "ax1", "x"),
        typed("a", "ay2", "y"),
        typed("a", "ax3", "x"),
        typed("c", "cx0", "x"),
        typed("a", "nobody", "z"),
    ]);
    s.enqueue(&jobs).await.unwrap();
    let got = s.claim(&[], &req_types(10, &["x"])).await.unwrap();
    assert_eq!(ids(&got), ["ax1", "ax3", "cx0"]);
    assert!(got.iter().all(|j| j.typ == "x"));
    let finished: Vec<Outcome> = got.iter().map(|j| done(j, "1")).collect();
    assert!(s
        .claim(&finished, &req_types(10, &["x"]))
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        empty_poll_statements(&s, &req_types(10, &["x"])).await,
        1,
        "the empty poll of x is one query"
    );
    assert!(!s.has_due(&["x".into()]).await.unwrap());
    assert!(s.has_due(&["x".into(), "y".into()]).await.unwrap());
    // The y-worker: turns are kept per worker's types (the x claim served a's x lane only),
    // so a's y lane has waited as long as the other never-served ones (org order breaks ties).
    let got = s.claim(&[], &req_types(1_100, &["y"])).await.unwrap();
    assert_eq!(got.len(), 502);
    assert!(got.iter().all(|j| j.typ == "y"));
    assert_eq!(ids(&got[..2]), ["ay0", "ay2"]);
    let finished: Vec<Outcome> = got.iter().map(|j| done(j, "1")).collect();
    assert!(s
        .claim(&finished, &req_types(10, &["x", "y"]))
        .await
        .unwrap()
        .is_empty());
    // The z job waits for a worker that runs z, pending and listed.
    let row = s.get_job("a", "nobody").await.unwrap().unwrap();
    assert_eq!((row.state.as_str(), row.attempts), (PENDING, 0));
    assert_eq!(count_jobs(&s).await, 506);
    let got = s.claim(&[], &req_types(10, &["z"])).await.unwrap();
    assert_eq!(ids(&got), ["nobody"]);
}

/// Organizations take turns, not (organization, type) lanes: an organization with jobs of two
/// types gets no more turns than one with jobs of one type, for a worker that runs both; a
/// job of a type that is new to an organization takes the organization's turn; a retried job
/// comes back in its type's lane.
pub async fn organizations_take_turns_whatever_their_number_of_types(s: Arc<dyn Store>) {
    let mut jobs = vec![];
    for i in 0..3 {
        jobs.push(typed("m", &format!("mx{i}"), "x"));
        jobs.push(typed("m", &format!("my{i}"), "y"));
        jobs.push(typed("n", &format!("nx{i}"), "x"));
    }
    s.enqueue(&jobs).await.unwrap();
    let mut took = vec![];
    for _ in 0..4 {
        let got = s.claim(&[], &req_types(1, &["x", "y"])).await.unwrap();
        took.push(got[0].id.clone());
    }
    assert_eq!(took, ["mx0", "nx0", "my0", "nx1"]);
    // m's new type joins with m's ticket: n (served last) still waits behind m.
    s.enqueue(&[typed("m", "mw0", "w")]).await.unwrap();
    let got = s.claim(&[], &req_types(1, &["x", "y", "w"])).await.unwrap();
    assert_eq!(ids(&got), ["mx1"]);
    let got = s.claim(&[], &req_types(1, &["w"])).await.unwrap();
    assert_eq!(ids(&got), ["mw0"]);
    // A failed attempt is due again in its own type's lane.
    let fail = failed(&got[0], "boom", 1);
    s.finish(&[fail]).await.unwrap();
    sleep_ms(10).await;
    assert!(s
        .claim(&[], &req_types(5, &["x"]))
        .await
        .unwrap()
        .iter()
        .all(|j| j.typ == "x"));
    let got = s.claim(&[], &req_types(1, &["w"])).await.unwrap();
    assert_eq!((ids(&got), got[0].attempt), (vec!["mw0"], 2));
}

/// A claim over more organizations than SQLite's claim takes in one statement (64): each
/// organization its share, oldest first, the organizations in turn; with two types in some.
pub async fn a_claim_over_a_hundred_and_fifty_organizations_serves_each_its_share(
    s: Arc<dyn Store>,
) {
    let mut jobs = vec![];
    for k in 0..3 {
        for o in 0..150 {
            let org = format!("o{o:03}");
            jobs.push(typed(&org, &format!("{org}x{k}"), "x"));
            if o % 10 == 0 {
                jobs.push(typed(&org, &format!("{org}y{k}"), "y"));
            }
        }
    }
    s.enqueue(&jobs).await.unwrap();
    let oldest = |org: &str, n: usize| -> Vec<&str> {
        jobs.iter()
            .filter(|j| j.org == org)
            .take(n)
            .map(|j| j.id.as_str())
            .collect()
    };
    // 200 over 150 organizations, a quantum of 4 (CLAIM_QUANTUM): the first 50 in turn share
    // the batch, 4 jobs each at most (o000, o010, ... have 6, the others 3: 155 jobs); the
    // 45 left go to the next 45 in turn, one each.
    let got = s.claim(&[], &req_types(200, &["x", "y"])).await.unwrap();
    assert_eq!(got.len(), 200);
    let per_org = ids_per_org(&got);
    assert_eq!(per_org.len(), 95);
    for (org, v) in &per_org {
        let o: usize = org[1..].parse().unwrap();
        let want = match o {
            _ if o < 50 && o % 10 == 0 => 4,
            _ if o < 50 => 3,
            _ if o < 95 => 1,
            _ => panic!("{org} is not among the first 95 in turn"),
        };
        // Each organization's oldest jobs, in enqueue order (x0 before y0 before x1).
        assert_eq!(v, &oldest(org, want), "{org}");
    }
    // An organization's jobs come together, the organizations in turn (new ones by name).
    let orgs: Vec<&str> = got.iter().map(|j| j.org.as_str()).collect();
    let mut seen: Vec<&str> = orgs.clone();
    seen.dedup();
    assert_eq!(seen.len(), 95);
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "{seen:?}");
    // Next in turn are the 55 not served yet, then those served in that order: a claim of 100
    // gives the first 25 of those 55 up to 4 (o100 and o110 have 6, the others 3: 77 jobs),
    // the next 23 one each.
    let got = s.claim(&[], &req_types(100, &["x", "y"])).await.unwrap();
    assert_eq!(got.len(), 100);
    let per_org = ids_per_org(&got);
    let mut next: Vec<&str> = got.iter().map(|j| j.org.as_str()).collect();
    next.dedup();
    let want: Vec<String> = (95..143).map(|o| format!("o{o:03}")).collect();
    assert_eq!(next, want);
    for (org, v) in &per_org {
        let o: usize = org[1..].parse().unwrap();
        let n = match o {
            _ if o < 120 && o % 10 == 0 => 4,
            _ if o < 120 => 3,
            _ => 1,
        };
        assert_eq!(v, &oldest(org, n), "{org}");
    }
}

/// A claim of more than 64 jobs over organizations that each hold more than a quantum:
/// `ceil(limit / 4)` of them in turn, four jobs each (`CLAIM_QUANTUM`); a batch of 17 to 64,
/// 16 organizations (`CLAIM_MIN_ORGS`); a batch of up to 16, one job each over as many; fewer
/// organizations in turn than that share the whole batch, as before.
pub async fn a_claim_serves_organizations_a_quantum_each(s: Arc<dyn Store>) {
    let mut jobs = vec![];
    for k in 0..10 {
        for o in 0..40 {
            let org = format!("o{o:02}");
            jobs.push(job(&org, &format!("{org}-{k}")));
        }
    }
    s.enqueue(&jobs).await.unwrap();
    let counts = |got: &[ClaimedJob]| -> Vec<(String, usize)> {
        let mut v: Vec<(String, usize)> = ids_per_org(got)
            .into_iter()
            .map(|(o, ids)| (o.to_string(), ids.len()))
            .collect();
        v.sort();
        v
    };
    let orgs = |r: std::ops::Range<usize>, n: usize| -> Vec<(String, usize)> {
        r.map(|o| (format!("o{o:02}"), n)).collect()
    };
    // 100 jobs: the first 25 organizations in turn, 4 each.
    let got = s.claim(&[], &req(100, 60_000)).await.unwrap();
    assert_eq!(counts(&got), orgs(0..25, 4));
    // 10 jobs: one each of the next 10 in turn.
    let got = s.claim(&[], &req(10, 60_000)).await.unwrap();
    assert_eq!(counts(&got), orgs(25..35, 1));
    // 40 jobs: 16 organizations, the next in turn (o35 to o39, then o00 to o10), 3 each for
    // the first 8, 2 for the others.
    let got = s.claim(&[], &req(40, 60_000)).await.unwrap();
    let mut want = vec![];
    for (i, o) in (35..40).chain(0..11).enumerate() {
        want.push((format!("o{o:02}"), if i < 8 { 3 } else { 2 }));
    }
    want.sort();
    assert_eq!(counts(&got), want);
    // Capped at one an organization: one pass, one job each of the next 30 in turn (o11 to
    // o34, then o35 to o39 and o00).
    let capped = ClaimRequest {
        per_org: 1,
        ..req(30, 60_000)
    };
    let got = s.claim(&[], &capped).await.unwrap();
    let mut want = orgs(11..40, 1);
    want.extend(orgs(0..1, 1));
    want.sort();
    assert_eq!(counts(&got), want);
}

/// Organizations whose lanes have several types each, some more than SQLite keeps in a
/// prepared claim statement (4), beside organizations of one type: each organization its
/// share, its oldest jobs first whatever their type, each job once.
pub async fn organizations_of_many_types_each_get_their_share(s: Arc<dyn Store>) {
    let types = ["a", "b", "c", "d", "e", "f"];
    let mut jobs = vec![];
    for k in 0..2 {
        for o in 0..12 {
            let org = format!("o{o:02}");
            // o00 has all six types, o01 five, ..., the rest one.
            for t in &types[..types.len().saturating_sub(o).max(1)] {
                jobs.push(typed(&org, &format!("{org}{t}{k}"), t));
            }
        }
    }
    s.enqueue(&jobs).await.unwrap();
    // 24 over 12 organizations: two each, the oldest two of each.
    let got = s.claim(&[], &req_types(24, &types)).await.unwrap();
    assert_eq!(got.len(), 24, "{:?}", ids(&got));
    let per_org = ids_per_org(&got);
    assert_eq!(per_org.len(), 12);
    for (org, v) in &per_org {
        let want: Vec<&str> = jobs
            .iter()
            .filter(|j| j.org == *org)
            .take(2)
            .map(|j| j.id.as_str())
            .collect();
        assert_eq!(v, &want, "{org}");
    }
    // The rest, claimed in one go, are every other job, once each.
    let rest = s.claim(&[], &req_types(500, &types)).await.unwrap();
    let mut all: Vec<&str> = got.iter().chain(&rest).map(|j| j.id.as_str()).collect();
    all.sort_unstable();
    let mut want: Vec<&str> = jobs.iter().map(|j| j.id.as_str()).collect();
    want.sort_unstable();
    assert_eq!(all, want);
}

/// The ids of `n` claims of one job each (each must get one).
async fn claim_one_by_one(s: &Arc<dyn Store>, n: usize) -> Vec<String> {
    let mut ids = vec![];
    for _ in 0..n {
        let got = s.claim(&[], &req(1, 60_000)).await.unwrap();
        assert_eq!(got.len(), 1, "after {ids:?}");
        ids.push(got[0].id.clone());
    }
    ids
}

pub async fn a_stale_holder_cannot_write_after_a_reclaim(s: Arc<dyn Store>) {
    s.enqueue(&[job("", "x")]).await.unwrap();
    let first = s.claim(&[], &req(1, 5)).await.unwrap().remove(0);
    assert_eq!((first.attempt, first.id.as_str()), (1, "x"));
    sleep_ms(30).await;
    // The lease expired: another claim reclaims the job with a new fencing token.
    let second = s.claim(&[], &req(1, 60_000)).await.unwrap().remove(0);
    assert_eq!(second.seq, first.seq);
    assert_eq!(second.attempt, 2);
    assert!(second.token > first.token);
    let row = s.get_job("", "x").await.unwrap().unwrap();
    assert!(row.last_error.unwrap().contains("lease expired"));
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
    s.finish(&[done(&first, "1")]).await.unwrap();
    assert_eq!(s.get_job("", "x").await.unwrap().unwrap().state, RUNNING);
    let st = s
        .renew(
            &[LeaseRef {
                seq: second.seq,
                token: second.token,
                org: second.org.clone(),
            }],
            60_000,
        )
        .await
        .unwrap();
    assert_eq!(st, vec![RenewStatus::Held]);
    s.finish(&[done(&second, "2")]).await.unwrap();
    let row = s.get_job("", "x").await.unwrap().unwrap();
    assert_eq!(
        (row.state.as_str(), row.result.as_deref()),
        (DONE, Some("2"))
    );
    assert!(row.finished_at.is_some());
    assert_eq!(row.max_attempts, 2);
}

/// One claim's jobs, some finished (done, failed), the rest abandoned by their holder:
/// after the lease, only the unfinished ones are taken back; each is claimed once more.
pub async fn an_abandoned_claim_gives_back_only_its_unfinished_jobs(s: Arc<dyn Store>) {
    let jobs: Vec<_> = ["a", "b", "c", "d"].iter().map(|i| job("o", i)).collect();
    s.enqueue(&jobs).await.unwrap();
    let got = s.claim(&[], &req(4, 30)).await.unwrap();
    assert_eq!(got.len(), 4);
    s.finish(&[done(&got[0], "1"), failed(&got[1], "boom", 0)])
        .await
        .unwrap();
    sleep_ms(60).await;
    let again = s.claim(&[], &req(10, 60_000)).await.unwrap();
    let mut ids: Vec<(&str, i64)> = again.iter().map(|j| (j.id.as_str(), j.attempt)).collect();
    ids.sort();
    assert_eq!(ids, vec![("b", 2), ("c", 2), ("d", 2)]);
    let a = s.get_job("o", "a").await.unwrap().unwrap();
    assert_eq!((a.state.as_str(), a.result.as_deref()), (DONE, Some("1")));
    assert!(s
        .get_job("o", "c")
        .await
        .unwrap()
        .unwrap()
        .last_error
        .unwrap()
        .contains("lease expired"));
    assert_eq!(
        s.get_job("o", "b")
            .await
            .unwrap()
            .unwrap()
            .last_error
            .as_deref(),
        Some("boom")
    );
    // The first holder's late outcomes change nothing; the new holder's do.
    s.finish(&[done(&got[2], "stale")]).await.unwrap();
    assert_eq!(s.get_job("o", "c").await.unwrap().unwrap().state, RUNNING);
    let outcomes: Vec<Outcome> = again.iter().map(|j| done(j, "2")).collect();
    s.finish(&outcomes).await.unwrap();
    for id in ["b", "c", "d"] {
        let row = s.get_job("o", id).await.unwrap().unwrap();
        assert_eq!(
            (row.state.as_str(), row.result.as_deref()),
            (DONE, Some("2")),
            "{id}"
        );
    }
    assert!(s.claim(&[], &req(10, 60_000)).await.unwrap().is_empty());
}

/// Each job's lease is its own, whatever claim took it: of one claim's jobs, the one its
/// holder stops renewing (as a worker does once its handler returned) is taken back after
/// its lease while the others, renewed, are not; once they are not renewed either, they
/// are taken back too.
pub async fn a_lease_is_each_jobs_own(s: Arc<dyn Store>) {
    let jobs: Vec<_> = ["a", "b", "c"].iter().map(|i| job("o", i)).collect();
    s.enqueue(&jobs).await.unwrap();
    let got = s.claim(&[], &req(3, 400)).await.unwrap();
    assert_eq!(got.len(), 3);
    let lease = |j: &ClaimedJob| LeaseRef {
        seq: j.seq,
        token: j.token,
        org: j.org.clone(),
    };
    let kept: Vec<LeaseRef> = got.iter().filter(|j| j.id != "c").map(lease).collect();
    let mut back = vec![];
    for _ in 0..6 {
        sleep_ms(100).await;
        assert_eq!(
            s.renew(&kept, 400).await.unwrap(),
            vec![RenewStatus::Held, RenewStatus::Held]
        );
        back.extend(s.claim(&[], &req(3, 60_000)).await.unwrap());
    }
    let back: Vec<(&str, i64)> = back.iter().map(|j| (j.id.as_str(), j.attempt)).collect();
    assert_eq!(back, vec![("c", 2)]);
    sleep_ms(500).await;
    let mut late: Vec<String> = s
        .claim(&[], &req(3, 60_000))
        .await
        .unwrap()
        .into_iter()
        .map(|j| j.id)
        .collect();
    late.sort();
    assert_eq!(late, vec!["a", "b"]);
}

/// A running job canceled keeps the cancel's reason as its last error, whether its
/// handler returned or raised (e.g. the revocation its signal raised).
pub async fn a_canceled_job_keeps_the_cancels_reason(s: Arc<dyn Store>) {
    s.enqueue(&[job("o", "r"), job("o", "d")]).await.unwrap();
    let got = s.claim(&[], &req(2, 60_000)).await.unwrap();
    assert_eq!(got.len(), 2);
    for j in &got {
        assert!(s.cancel_job("o", &j.id, Some("user")).await.unwrap());
    }
    let raised = failed(
        &got[0],
        "ExecutionRevokedError: execution revoked: canceled",
        0,
    );
    s.finish(&[raised, done(&got[1], "null")]).await.unwrap();
    for j in &got {
        let row = s.get_job("o", &j.id).await.unwrap().unwrap();
        assert_eq!(row.state, CANCELED, "{}", j.id);
        assert_eq!(
            row.last_error.as_deref(),
            Some("canceled: user"),
            "{}",
            j.id
        );
    }
}

pub async fn a_crash_on_the_last_attempt_dead_letters_the_job(s: Arc<dyn Store>) {
    s.enqueue(&[job("", "x")]).await.unwrap();
    for _ in 0..2 {
        assert_eq!(s.claim(&[], &req(1, 1)).await.unwrap().len(), 1);
        sleep_ms(10).await;
    }
    assert!(s.claim(&[], &req(1, 1)).await.unwrap().is_empty());
    let row = s.get_job("", "x").await.unwrap().unwrap();
    assert_eq!((row.state.as_str(), row.attempts), (DEAD, 2));
    assert!(row.last_error.unwrap().contains("lease expired"));
    assert!(row.finished_at.is_some());
    // retry_job: dead -> pending with attempts 0, due now.
    assert!(s.retry_job("", "x").await.unwrap());
    assert!(!s.retry_job("", "x").await.unwrap());
    let j = s.claim(&[], &req(1, 60_000)).await.unwrap().remove(0);
    assert_eq!(j.attempt, 1);
}

pub async fn failures_retry_after_the_delay_then_dead_letter(s: Arc<dyn Store>) {
    s.enqueue(&[job("", "x")]).await.unwrap();
    let j = s.claim(&[], &req(1, 60_000)).await.unwrap().remove(0);
    let fail = failed(&j, "boom", 60_000);
    assert!(
        s.claim(&[fail], &req(1, 60_000)).await.unwrap().is_empty(),
        "not due before its delay"
    );
    let row = s.get_job("", "x").await.unwrap().unwrap();
    assert_eq!(
        (row.state.as_str(), row.last_error.as_deref()),
        (PENDING, Some("boom"))
    );
    assert!(row.run_at >= row.updated_at + 59_000);
    // A short delay: due again, second attempt; failing it uses the last attempt.
    s.enqueue(&[job("", "y")]).await.unwrap();
    let j = s.claim(&[], &req(1, 60_000)).await.unwrap().remove(0);
    assert_eq!(j.id, "y");
    let fail = failed(&j, "boom 1", 1);
    s.finish(&[fail]).await.unwrap();
    sleep_ms(10).await;
    let j = s.claim(&[], &req(1, 60_000)).await.unwrap().remove(0);
    assert_eq!((j.id.as_str(), j.attempt), ("y", 2));
    let fail = failed(&j, "boom 2 \u{1F600}", 1);
    s.finish(&[fail]).await.unwrap();
    let row = s.get_job("", "y").await.unwrap().unwrap();
    assert_eq!(
        (row.state.as_str(), row.attempts, row.last_error.as_deref()),
        (DEAD, 2, Some("boom 2 \u{1F600}"))
    );
}

pub async fn max_depth_counts_the_calls_own_jobs_and_writes_nothing(s: Arc<dyn Store>) {
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
    assert_eq!(count_jobs(&s).await, 0);
    jobs[0].max_depth = Some(3);
    s.enqueue(&jobs).await.unwrap();
    // Duplicates add nothing; a new job makes 4.
    s.enqueue(&jobs).await.unwrap();
    let mut more = vec![job("a", "0"), job("a", "new")];
    more[1].max_depth = Some(3);
    match s.enqueue(&more).await {
        Err(Error::QueueFull {
            org,
            depth: 4,
            max_depth: 3,
        }) => assert_eq!(org.as_deref(), Some("a")),
        other => panic!("{other:?}"),
    }
    assert!(s.get_job("a", "new").await.unwrap().is_none());
    // Other organizations do not count.
    let mut other = job("b", "0");
    other.max_depth = Some(1);
    s.enqueue(&[other]).await.unwrap();
}

pub async fn a_100k_job_enqueue_is_one_call(s: Arc<dyn Store>) {
    let jobs: Vec<NewJob> = (0..100_000)
        .map(|i| NewJob {
            payload: format!("{{\"row\":{i},\"name\":\"import row number {i}\"}}"),
            ..job(["a", "b", ""][i % 3], &format!("import:{i}"))
        })
        .collect();
    s.enqueue(&jobs).await.unwrap();
    assert_eq!(count_jobs(&s).await, 100_000);
    // Again: every id is already there, nothing is added.
    s.enqueue(&jobs[..30_000]).await.unwrap();
    let n = count_jobs(&s).await;
    assert_eq!(n, 100_000);
    let row = s.get_job("b", "import:99997").await.unwrap().unwrap();
    assert_eq!(
        row.payload,
        "{\"row\":99997,\"name\":\"import row number 99997\"}"
    );
}

/// One call over 20,000 organizations (and one small call over 100) is written whole, and
/// every job is claimable: no per-organization lock or statement limit reaches the caller.
pub async fn a_batch_over_many_organizations_is_one_call(s: Arc<dyn Store>) {
    let big: Vec<NewJob> = (0..20_000).map(|i| job(&format!("org{i}"), "x")).collect();
    s.enqueue(&big).await.unwrap();
    let small: Vec<NewJob> = (0..100).map(|i| job(&format!("s{i}"), "y")).collect();
    s.enqueue(&small).await.unwrap();
    assert_eq!(count_jobs(&s).await, 20_100);
    let mut claimed = 0;
    loop {
        let got = s.claim(&[], &req(2_000, 60_000)).await.unwrap();
        if got.is_empty() {
            break;
        }
        claimed += got.len();
    }
    assert_eq!(claimed, 20_100);
}

/// A batch sent in parts: written whole when it ends, including parts with an organization
/// it did not announce (Postgres then writes it the other way); nothing when the sender
/// goes away before the end.
pub async fn a_batch_in_parts_is_written_whole_or_not_at_all(s: Arc<dyn Store>) {
    let part = |from: usize, org: &str| {
        let jobs: Vec<NewJob> = (from..from + 3_000)
            .map(|i| job(org, &format!("p{i}")))
            .collect();
        JobBatch::from(&jobs[..])
    };
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tx.send(Part::Jobs(Box::new(part(0, "a")))).unwrap();
    tx.send(Part::Jobs(Box::new(part(3_000, "unannounced"))))
        .unwrap();
    tx.send(Part::End).unwrap();
    crate::store::enqueue_parts(s.as_ref(), 6_000, &["a".to_string()], &mut rx)
        .await
        .unwrap();
    assert_eq!(count_jobs(&s).await, 6_000);
    assert!(s.get_job("unannounced", "p5999").await.unwrap().is_some());

    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tx.send(Part::Jobs(Box::new(part(10_000, "a")))).unwrap();
    drop(tx);
    let r = crate::store::enqueue_parts(s.as_ref(), 6_000, &["a".to_string()], &mut rx).await;
    assert!(matches!(r, Err(Error::Abandoned)), "{r:?}");
    assert_eq!(count_jobs(&s).await, 6_000);
}

pub async fn big_payloads_are_split_by_size(s: Arc<dyn Store>) {
    // 40 MB in one call: more than a MySQL packet holds.
    let big = format!("\"{}\"", "x".repeat(1 << 20));
    let jobs: Vec<NewJob> = (0..40)
        .map(|i| NewJob {
            payload: big.clone(),
            ..job("", &format!("big{i}"))
        })
        .collect();
    s.enqueue(&jobs).await.unwrap();
    assert_eq!(count_jobs(&s).await, 40);
    let row = s.get_job("", "big39").await.unwrap().unwrap();
    assert_eq!(row.payload.len(), big.len());
    let got = s.claim(&[], &req(40, 60_000)).await.unwrap();
    assert_eq!(got.len(), 40);
    // Results of different sizes in one write (a small one first).
    let outs: Vec<Outcome> = got
        .iter()
        .map(|j| {
            if j.id == "big0" {
                done(j, "\"s\"")
            } else {
                done(j, &big)
            }
        })
        .collect();
    s.finish(&outs).await.unwrap();
    let row = s.get_job("", "big7").await.unwrap().unwrap();
    assert_eq!(
        (row.state.as_str(), row.result.map(|r| r.len())),
        (DONE, Some(big.len()))
    );
    let row = s.get_job("", "big0").await.unwrap().unwrap();
    assert_eq!(row.result.as_deref(), Some("\"s\""));
    // Errors of different sizes, through a failed attempt each.
    s.enqueue(&[job("", "e1"), job("", "e2")]).await.unwrap();
    let got = s.claim(&[], &req(2, 60_000)).await.unwrap();
    let long_error = "e".repeat(200_000);
    let outs: Vec<Outcome> = got
        .iter()
        .map(|j| Outcome::Failed {
            seq: j.seq,
            token: j.token,
            org: j.org.clone(),
            error: if j.id == "e1" {
                "short".into()
            } else {
                long_error.clone()
            },
            delay_ms: 60_000,
        })
        .collect();
    s.finish(&outs).await.unwrap();
    let e1 = s.get_job("", "e1").await.unwrap().unwrap();
    let e2 = s.get_job("", "e2").await.unwrap().unwrap();
    assert_eq!(e1.last_error.as_deref(), Some("short"));
    assert_eq!(e2.last_error.map(|e| e.len()), Some(long_error.len()));
}

pub async fn ids_are_exact_and_scoped_per_organization(s: Arc<dyn Store>) {
    let long: String = "\u{00E9}".repeat(600);
    let ids = ["a", "A", "a ", " a", "\u{00E9}", "e\u{0301}", long.as_str()];
    let mut jobs: Vec<NewJob> = ids.iter().map(|i| job("", i)).collect();
    jobs.push(job("org", "a"));
    jobs.push(job("Org", "a"));
    jobs.push(job("org ", "a"));
    jobs.push(job("", "a")); // repeated in the call: one job
    s.enqueue(&jobs).await.unwrap();
    assert_eq!(count_jobs(&s).await, 10);
    for i in ids {
        assert_eq!(s.get_job("", i).await.unwrap().unwrap().id, i);
    }
    assert_eq!(s.get_job("org ", "a").await.unwrap().unwrap().org, "org ");
    assert!(s.get_job("", "b").await.unwrap().is_none());
    assert!(s.get_job("ORG", "a").await.unwrap().is_none());
    // list_all_jobs: no organization first, then organizations in byte order.
    let all = s
        .list_jobs(&ListQuery {
            scope: ListScope::All,
            snapshot: 100,
            after: None,
            limit: 100,
        })
        .await
        .unwrap();
    let orgs: Vec<&str> = all.iter().map(|r| r.org.as_str()).collect();
    assert_eq!(orgs, vec!["", "", "", "", "", "", "", "Org", "org", "org "]);
    let seqs: Vec<i64> = all[..7].iter().map(|r| r.seq).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]));
}

pub async fn listings_cancel_and_renew(s: Arc<dyn Store>) {
    let jobs: Vec<NewJob> = (0..5)
        .map(|i| NewJob {
            typ: if i % 2 == 0 { "even" } else { "odd" }.into(),
            ..job("l", &format!("{i}"))
        })
        .collect();
    s.enqueue(&jobs).await.unwrap();
    let snap = s.max_seq().await.unwrap();
    s.enqueue(&[job("l", "late")]).await.unwrap();
    let page = |after: Option<(String, i64)>, state: Option<&str>, typ: Option<&str>| ListQuery {
        scope: ListScope::Lane {
            org: "l".into(),
            state: state.map(String::from),
            typ: typ.map(String::from),
        },
        snapshot: snap,
        after,
        limit: 2,
    };
    let p1 = s.list_jobs(&page(None, None, None)).await.unwrap();
    let ids: Vec<&str> = p1.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, vec!["0", "1"]);
    let p2 = s
        .list_jobs(&page(Some(("l".into(), p1[1].seq)), None, None))
        .await
        .unwrap();
    let ids: Vec<&str> = p2.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, vec!["2", "3"]);
    let p3 = s
        .list_jobs(&page(Some(("l".into(), p2[1].seq)), None, None))
        .await
        .unwrap();
    let ids: Vec<&str> = p3.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(
        ids,
        vec!["4"],
        "the job enqueued after the snapshot is not listed"
    );
    let odd = s.list_jobs(&page(None, None, Some("odd"))).await.unwrap();
    let ids: Vec<&str> = odd.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, vec!["1", "3"]);
    // cancel: pending -> canceled at once.
    assert!(s
        .cancel_job("l", "0", Some("no longer needed"))
        .await
        .unwrap());
    let row = s.get_job("l", "0").await.unwrap().unwrap();
    assert_eq!(row.state, CANCELED);
    assert!(row.finished_at.is_some());
    assert!(row.last_error.unwrap().contains("no longer needed"));
    assert!(!s.cancel_job("l", "0", None).await.unwrap());
    assert!(!s.cancel_job("l", "nope", None).await.unwrap());
    let pend = s
        .list_jobs(&page(None, Some("pending"), None))
        .await
        .unwrap();
    let ids: Vec<&str> = pend.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, vec!["1", "2"]);
    // Running: the renewal reports the cancel, the outcome makes it canceled.
    let j = s
        .claim(&[], &req_types(1, &["t", "odd"]))
        .await
        .unwrap()
        .remove(0);
    assert_eq!(j.id, "1");
    let lease = LeaseRef {
        seq: j.seq,
        token: j.token,
        org: j.org.clone(),
    };
    let other = LeaseRef {
        seq: 999_999,
        token: 1,
        org: String::new(),
    };
    assert_eq!(
        s.renew(&[lease.clone(), other], 60_000).await.unwrap(),
        vec![RenewStatus::Held, RenewStatus::Lost]
    );
    assert!(s.cancel_job("l", "1", None).await.unwrap());
    assert_eq!(s.get_job("l", "1").await.unwrap().unwrap().state, RUNNING);
    assert_eq!(
        s.renew(&[lease], 60_000).await.unwrap(),
        vec![RenewStatus::CancelRequested]
    );
    s.finish(&[done(&j, "null")]).await.unwrap();
    let row = s.get_job("l", "1").await.unwrap().unwrap();
    assert_eq!(row.state, CANCELED);
    assert!(!s.cancel_job("l", "1", None).await.unwrap());
    assert!(!s.retry_job("l", "1").await.unwrap());
    // A delayed job is not claimed before its time; run_at in the past is due at once.
    let mut d = job("m", "delayed");
    d.delay_ms = Some(60_000);
    let mut p = job("m", "past");
    p.run_at = Some(1_000);
    s.enqueue(&[d, p]).await.unwrap();
    let got = s.claim(&[], &req(10, 60_000)).await.unwrap();
    let ids: BTreeSet<&str> = got.iter().map(|j| j.id.as_str()).collect();
    assert!(ids.contains("past") && !ids.contains("delayed"), "{ids:?}");
    let now = s.now_ms().await.unwrap();
    let row = s.get_job("m", "delayed").await.unwrap().unwrap();
    assert!(row.run_at > now + 50_000 && row.created_at <= now);
}

pub async fn the_clock_is_the_stores(s: Arc<dyn Store>) {
    let local = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let now = s.now_ms().await.unwrap();
    assert!((now - local).abs() < 5_000, "{now} vs {local}");
}

/// A big batch (the engines' bulk paths: COPY on Postgres) in which one id is taken and
/// one repeats: every other job is inserted, and the first writer of an id keeps it.
pub async fn a_big_batch_skips_taken_and_repeated_ids(s: Arc<dyn Store>) {
    let mut first = job("a", "taken");
    first.payload = r#"{"v":1}"#.into();
    s.enqueue(&[first]).await.unwrap();
    let mut jobs: Vec<NewJob> = (0..2_500).map(|i| job("a", &format!("j{i}"))).collect();
    jobs[1_800].id = "taken".into();
    jobs[1_800].payload = r#"{"v":2}"#.into();
    jobs[2_000].id = "j5".into();
    jobs[2_000].payload = r#"{"v":3}"#.into();
    jobs[2_400].org = "b".into();
    jobs[2_400].delay_ms = Some(3_600_000);
    s.enqueue(&jobs).await.unwrap();
    // 2,500 - 2 (taken, repeated) new jobs + the first one.
    let all = s
        .list_jobs(&ListQuery {
            scope: ListScope::All,
            snapshot: i64::MAX,
            after: None,
            limit: 10_000,
        })
        .await
        .unwrap();
    assert_eq!(all.len(), 2_499);
    let taken = s.get_job("a", "taken").await.unwrap().unwrap();
    assert_eq!(taken.payload.replace(' ', ""), r#"{"v":1}"#);
    let j5 = s.get_job("a", "j5").await.unwrap().unwrap();
    assert_eq!(j5.payload.replace(' ', ""), "{}");
    let later = s.get_job("b", "j2400").await.unwrap().unwrap();
    assert!(later.run_at - later.created_at >= 3_600_000);
    // Both lanes know their jobs: everything in `a` is claimable, nothing in `b` yet.
    let claimed = s.claim(&[], &req(5_000, 60_000)).await.unwrap();
    assert_eq!(claimed.len(), 2_498);
    assert!(claimed.iter().all(|j| j.org == "a"));
}

/// Eight enqueues at once into one organization with `max_depth` 5: exactly five pass.
pub async fn max_depth_is_exact_under_concurrent_enqueues(s: Arc<dyn Store>, url: String) {
    let mut tasks = vec![];
    for i in 0..8 {
        let url = url.clone();
        tasks.push(tokio::spawn(async move {
            let store = open(&url, 1, false).await.unwrap();
            let mut j = job("deep", &format!("{i}"));
            j.max_depth = Some(5);
            let mut r = store.enqueue(&[j.clone()]).await;
            // A deadlock (MySQL, first rows of a new lane) is transient: the caller retries.
            for _ in 0..5 {
                match &r {
                    Err(e) if e.is_transient() => {
                        eprintln!("transient: {e}");
                        r = store.enqueue(&[j.clone()]).await
                    }
                    _ => break,
                }
            }
            store.close().await;
            r
        }));
    }
    let mut ok = 0;
    let mut full = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(()) => ok += 1,
            Err(Error::QueueFull { max_depth: 5, .. }) => full += 1,
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!((ok, full), (5, 3));
    let snap = s.max_seq().await.unwrap();
    let rows = s
        .list_jobs(&ListQuery {
            scope: ListScope::Lane {
                org: "deep".into(),
                state: None,
                typ: None,
            },
            snapshot: snap,
            after: None,
            limit: 100,
        })
        .await
        .unwrap();
    assert_eq!(rows.len(), 5);
}

/// Every job in the store (up to 100,000), from one listing page.
async fn all_jobs(s: &Arc<dyn Store>) -> Vec<JobRow> {
    let snapshot = s.max_seq().await.unwrap();
    s.list_jobs(&ListQuery {
        scope: ListScope::All,
        snapshot,
        after: None,
        limit: 100_000,
    })
    .await
    .unwrap()
}

/// A claimer on its own connection, as the worker claims: up to `limit` jobs a call, the
/// last batch's outcomes (`outcome` of each job) carried by the next call, a deadlock run
/// again. Stops after `idle` empty claims in a row while `busy()` is false. Odd claimers
/// wait for the lanes other claims hold (`wait_lanes`, Postgres), even ones skip them.
async fn claimer(
    url: &str,
    w: usize,
    limit: usize,
    idle: usize,
    busy: impl Fn() -> bool,
    outcome: impl Fn(&ClaimedJob) -> Outcome,
    mut seen: impl FnMut(&[ClaimedJob]),
) {
    let store = open(url, 2, false).await.unwrap();
    let mut finished: Vec<Outcome> = vec![];
    let mut empty = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while empty < idle || busy() {
        assert!(std::time::Instant::now() < deadline, "claimer {w} too slow");
        let r = ClaimRequest {
            owner: format!("w{w}"),
            limit,
            ttl_ms: 60_000,
            max_attempts: 5,
            types: vec!["t".into()],
            probe: true,
            per_org: 0,
            wait_lanes: w % 2 == 1,
        };
        let got = crate::store::claim(store.as_ref(), &finished, &r)
            .await
            .unwrap();
        finished = got.iter().map(&outcome).collect();
        if got.is_empty() {
            empty += 1;
            sleep_ms(5).await;
        } else {
            empty = 0;
            seen(&got);
        }
    }
    crate::store::finish(store.as_ref(), &finished)
        .await
        .unwrap();
    store.close().await;
}

/// Producers enqueue (batches of 1 to 1,500 jobs, some due later, over 3 or 40 lanes) while
/// claimers drain, failing every 5th job once: every job ends done, claimed once per
/// attempt. A job that a claim passed over while it was being enqueued must still be found.
pub async fn jobs_enqueued_while_claimers_run_are_all_claimed(s: Arc<dyn Store>, url: String) {
    const PRODUCERS: usize = 3;
    const BATCHES: [usize; 6] = [1, 7, 1_500, 40, 1, 300];
    let total: usize = PRODUCERS * BATCHES.iter().sum::<usize>();
    let producing = Arc::new(std::sync::atomic::AtomicUsize::new(PRODUCERS));
    let claims = Arc::new(Mutex::new(Vec::<(String, i64)>::new()));
    let mut tasks = vec![];
    for p in 0..PRODUCERS {
        let url = url.clone();
        let producing = producing.clone();
        tasks.push(tokio::spawn(async move {
            let store = open(&url, 2, false).await.unwrap();
            let mut n = 0;
            for (b, size) in BATCHES.iter().enumerate() {
                let jobs: Vec<NewJob> = (0..*size)
                    .map(|i| {
                        n += 1;
                        // Batch 3 (40 jobs) spans 40 lanes: more than one enqueue
                        // locks lane by lane (LANE_LOCKS_MAX on Postgres).
                        let org = if b == 3 {
                            format!("m{i}")
                        } else {
                            ["a", "b", ""][(i + b) % 3].to_string()
                        };
                        let mut j = job(&org, &format!("p{p}-{n}"));
                        if n % 11 == 0 {
                            j.delay_ms = Some(30);
                        }
                        j
                    })
                    .collect();
                crate::store::enqueue(store.as_ref(), &JobBatch::from(&jobs[..]))
                    .await
                    .unwrap();
                sleep_ms(3).await;
            }
            producing.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            store.close().await;
        }));
    }
    for w in 0..3 {
        let url = url.clone();
        let producing = producing.clone();
        let claims = claims.clone();
        tasks.push(tokio::spawn(async move {
            let busy = move || producing.load(std::sync::atomic::Ordering::SeqCst) > 0;
            let fail_once = |j: &ClaimedJob| {
                let n: usize = j.id.rsplit('-').next().unwrap().parse().unwrap();
                if n % 5 == 0 && j.attempt == 1 {
                    failed(j, "once", 0)
                } else {
                    done(j, "true")
                }
            };
            claimer(&url, w, 25, 40, busy, fail_once, |got| {
                claims
                    .lock()
                    .unwrap()
                    .extend(got.iter().map(|j| (j.id.clone(), j.attempt)))
            })
            .await;
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let mut claims = claims.lock().unwrap().clone();
    claims.sort();
    let before = claims.len();
    claims.dedup();
    assert_eq!(claims.len(), before, "no attempt claimed twice");
    let firsts = claims.iter().filter(|(_, a)| *a == 1).count();
    assert_eq!(firsts, total, "every job claimed");
    let rows = all_jobs(&s).await;
    assert_eq!(rows.len(), total);
    let not_done: Vec<_> = rows.iter().filter(|r| r.state != DONE).collect();
    assert!(
        not_done.is_empty(),
        "not done: {:?}",
        &not_done[..not_done.len().min(3)]
    );
}

/// Three claimers, each with its own pool, take one job a claim from twelve organizations
/// that always have jobs due, 50 rounds' worth in all: each organization is served 50 times,
/// give or take `SLACK`. Concurrent claims are fair in the aggregate, not in every round
/// (DECISIONS "Queue": fairness under concurrent claims): a claim skips the lanes other claims
/// hold, and a lane another claim served after this claim's snapshot may be served again a
/// round early (Postgres, MySQL; seen 49-52 of 50 here); the deviation does not grow with the
/// rounds, which the bound checks.
pub async fn concurrent_claims_serve_the_lanes_in_turn(s: Arc<dyn Store>, url: String) {
    const SLACK: usize = 4;
    const ORGS: usize = 12;
    const ROUNDS: usize = 50;
    let jobs: Vec<NewJob> = (0..ORGS * (ROUNDS + 10))
        // Organization by organization: a claim in enqueue order would serve o0 only.
        .map(|i| job(&format!("o{}", i / (ROUNDS + 10)), &format!("{i}")))
        .collect();
    s.enqueue(&jobs).await.unwrap();
    let budget = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let served = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut tasks = vec![];
    for w in 0..3 {
        let (url, budget, served) = (url.clone(), budget.clone(), served.clone());
        tasks.push(tokio::spawn(async move {
            let store = open(&url, 2, false).await.unwrap();
            let r = ClaimRequest {
                owner: format!("w{w}"),
                ..req(1, 60_000)
            };
            let mut finished: Vec<Outcome> = vec![];
            let deadline = std::time::Instant::now() + Duration::from_secs(120);
            while budget.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < ORGS * ROUNDS {
                // Claims again until it gets its job.
                loop {
                    assert!(std::time::Instant::now() < deadline, "claimer {w} too slow");
                    let got = crate::store::claim(store.as_ref(), &finished, &r)
                        .await
                        .unwrap();
                    assert!(got.len() <= 1);
                    finished = got.iter().map(|j| done(j, "true")).collect();
                    if let Some(j) = got.first() {
                        served.lock().unwrap().push(j.org.clone());
                        break;
                    }
                }
            }
            crate::store::finish(store.as_ref(), &finished)
                .await
                .unwrap();
            store.close().await;
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let served = served.lock().unwrap().clone();
    assert_eq!(served.len(), ORGS * ROUNDS);
    let mut counts = std::collections::BTreeMap::<String, usize>::new();
    for o in &served {
        *counts.entry(o.clone()).or_default() += 1;
    }
    assert!(
        counts.len() == ORGS && counts.values().all(|&n| n.abs_diff(ROUNDS) <= SLACK),
        "jobs served per organization: {counts:?}"
    );
}

/// Four workers, each with its own pool, drain 2,000 jobs at once: every job is claimed
/// exactly once.
pub async fn concurrent_claimers_never_take_the_same_job(s: Arc<dyn Store>, url: String) {
    let jobs: Vec<NewJob> = (0..2_000)
        .map(|i| job(["a", "b", "c", "d", "e", "", "g"][i % 7], &format!("{i}")))
        .collect();
    s.enqueue(&jobs).await.unwrap();
    let seen = Arc::new(Mutex::new(Vec::<i64>::new()));
    let mut tasks = vec![];
    for w in 0..4 {
        let url = url.clone();
        let seen = seen.clone();
        tasks.push(tokio::spawn(async move {
            let all_done = |j: &ClaimedJob| done(j, "true");
            claimer(
                &url,
                w,
                10,
                20,
                || false,
                all_done,
                |got| seen.lock().unwrap().extend(got.iter().map(|j| j.seq)),
            )
            .await;
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let mut seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2_000, "every job claimed once");
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen.len(), 2_000, "no job claimed twice");
    let rows = all_jobs(&s).await;
    assert_eq!(rows.len(), 2_000);
    assert!(rows.iter().all(|r| r.state == DONE && r.attempts == 1));
}
