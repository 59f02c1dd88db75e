//! Postgres's own engine tests: the empty poll's plan, lease records, HOT claims, claims that
//! never wait, migrations, an empty schema, an unreachable server (the engine suite is in
//! `store::suite`).

use sqlx::postgres::PgPoolOptions;
use sqlx::Executor;

use crate::error::Error;
use crate::store::open;
use crate::store::suite::{self, with_store, Engine, Fresh};

/// A connection of its own to the store at `url` (for reads and locks beside the store's).
async fn side_pool(url: &str) -> sqlx::PgPool {
    PgPoolOptions::new()
        .max_connections(1)
        .connect(url)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_poll_is_one_claim_statement_plan() {
    // The empty poll's two reads are index seeks (no scan of the lanes or the jobs).
    with_store(Engine::Postgres, |s, url| async move {
        let jobs: Vec<_> = (0..2_000)
            .map(|i| suite::job(&format!("o{i}"), "x"))
            .collect();
        s.enqueue(&jobs).await.unwrap();
        let pool = side_pool(&url).await;
        pool.execute("ANALYZE gnl_lanes; ANALYZE gnl_jobs")
            .await
            .unwrap();
        let precheck = super::queue::PRECHECK.replace("$1::text[]", "'{t}'::text[]");
        let plan: Vec<String> = sqlx::query_scalar(&format!("EXPLAIN {precheck}"))
            .fetch_all(&pool)
            .await
            .unwrap();
        let plan = plan.join("\n");
        assert!(!plan.contains("Seq Scan"), "{plan}");
        pool.close().await;
    })
    .await;
}

/// An enqueue reads its organizations' other lanes (their turn ticket, their highest head) by
/// the key. After a bulk enqueue into thousands of lanes, with the statistics not gathered yet,
/// the planner made `max(served_at) … WHERE org = …` a backward walk of the turn tickets'
/// index (`gnl_lanes_served`) filtered by organization: a walk over every lane for each lane
/// of the enqueue (minutes for 1,000,000 jobs over 10,000 organizations).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enqueue_reads_its_organizations_lanes_by_the_key() {
    with_store(Engine::Postgres, |s, url| async move {
        for id in ["x", "y"] {
            let jobs: Vec<_> = (0..2_000)
                .map(|i| suite::job(&format!("o{i}"), id))
                .collect();
            s.enqueue(&jobs).await.unwrap();
        }
        let pool = side_pool(&url).await;
        let statements = [
            super::queue::ENQUEUE_LANES,
            super::queue::ENQUEUE_ONE[0],
            super::queue::ENQUEUE_ONE[1],
        ];
        for sql in statements {
            let sql = sql
                .replace("$1::text[]", "'{o1,o2}'::text[]")
                .replace("$2::text[]", "'{a,b}'::text[]")
                .replace("$3::text[]", "'{t,t}'::text[]")
                .replace("$4::text[]", "'{1,2}'::text[]")
                .replace("$3::bigint[]", "'{1,2}'::bigint[]")
                .replace("$5::bigint[]", "'{NULL,NULL}'::bigint[]")
                .replace("$6::bigint[]", "'{0,0}'::bigint[]");
            let plan: Vec<String> = sqlx::query_scalar(&format!("EXPLAIN {sql}"))
                .fetch_all(&pool)
                .await
                .unwrap();
            let plan = plan.join("\n");
            assert!(!plan.contains("gnl_lanes_served"), "{plan}");
            assert!(!plan.contains("Seq Scan on gnl_lanes"), "{plan}");
        }
        pool.close().await;
    })
    .await;
}

/// The claim function is never compiled by the JIT: over a big table (1,000,000 jobs) its
/// generic plans' estimates pass `jit_above_cost`, and compiling them took ~100-130 ms a call,
/// for a claim whose work is a few milliseconds (auto_explain, 10,000 organizations).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_claim_function_is_never_jit_compiled() {
    with_store(Engine::Postgres, |_s, url| async move {
        let pool = side_pool(&url).await;
        let config: Vec<String> = sqlx::query_scalar(
            "SELECT unnest(proconfig) FROM pg_proc \
             WHERE proname = 'gnl_claim' AND pronamespace = current_schema()::regnamespace",
        )
        .fetch_all(&pool)
        .await
        .unwrap();
        assert!(config.iter().any(|c| c == "jit=off"), "{config:?}");
        pool.close().await;
    })
    .await;
}

/// A claim writes one lease record for its jobs; outcomes count them off and the last one
/// deletes it; a reclaim deletes an expired record once none of its jobs runs under it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_records_live_as_long_as_their_running_jobs() {
    with_store(Engine::Postgres, |s, url| async move {
        let pool = side_pool(&url).await;
        let records = |pool: sqlx::PgPool| async move {
            let r: Vec<(i64, i64)> = sqlx::query_as(
                "SELECT remaining, cardinality(seqs)::bigint FROM gnl_leases ORDER BY id",
            )
            .fetch_all(&pool)
            .await
            .unwrap();
            r
        };
        let jobs: Vec<_> = (0..5).map(|i| suite::job("o", &format!("{i}"))).collect();
        s.enqueue(&jobs).await.unwrap();
        let got = s.claim(&[], &suite::req(5, 60_000)).await.unwrap();
        assert_eq!(records(pool.clone()).await, vec![(5, 5)]);
        let done = |j| suite::done(j, "null");
        s.finish(&[done(&got[0]), done(&got[1])]).await.unwrap();
        assert_eq!(records(pool.clone()).await, vec![(3, 5)]);
        // A stale outcome (a wrong token) counts nothing.
        let mut stale = got[2].clone();
        stale.token += 7;
        s.finish(&[done(&stale)]).await.unwrap();
        assert_eq!(records(pool.clone()).await, vec![(3, 5)]);
        let failed = suite::failed(&got[2], "e", 60_000);
        s.claim(&[failed, done(&got[3])], &suite::req(0, 60_000))
            .await
            .unwrap();
        assert_eq!(records(pool.clone()).await, vec![(1, 5)]);
        s.finish(&[done(&got[4])]).await.unwrap();
        assert_eq!(records(pool.clone()).await, vec![]);
        // Abandoned: taken back after the lease, the record with it.
        s.enqueue(&[suite::job("p", "x"), suite::job("p", "y")])
            .await
            .unwrap();
        let got = s.claim(&[], &suite::req(2, 10)).await.unwrap();
        assert_eq!(got.len(), 2);
        s.finish(&[done(&got[0])]).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(30)).await;
        let again = s.claim(&[], &suite::req(5, 60_000)).await.unwrap();
        assert_eq!(again.len(), 1);
        assert_eq!(
            (again[0].id.as_str(), again[0].attempt),
            (got[1].id.as_str(), 2)
        );
        assert_eq!(records(pool.clone()).await, vec![(1, 1)]);
        pool.close().await;
    })
    .await;
}

/// Claims add no index entries (they are HOT updates): a drain's claims leave the size of
/// every index of gnl_jobs as the enqueue left it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_write_no_index_entries() {
    with_store(Engine::Postgres, |s, url| async move {
        let jobs: Vec<_> = (0..3_000)
            .map(|i| suite::job(["a", "b", "c"][i % 3], &format!("job:{i}")))
            .collect();
        s.enqueue(&jobs).await.unwrap();
        let pool = side_pool(&url).await;
        let sizes = |pool: sqlx::PgPool| async move {
            let r: Vec<(String, i64)> = sqlx::query_as(
                "SELECT indexrelid::regclass::text, pg_relation_size(indexrelid) FROM pg_index \
                 WHERE indrelid = 'gnl_jobs'::regclass ORDER BY 1",
            )
            .fetch_all(&pool)
            .await
            .unwrap();
            r
        };
        let before = sizes(pool.clone()).await;
        assert_eq!(before.len(), 3, "{before:?}");
        let mut claimed = 0;
        loop {
            let got = s.claim(&[], &suite::req(100, 60_000)).await.unwrap();
            if got.is_empty() {
                break;
            }
            claimed += got.len();
        }
        assert_eq!(claimed, 3_000);
        assert_eq!(sizes(pool.clone()).await, before);
        pool.close().await;
    })
    .await;
}

/// A claim never waits for another transaction: not for an enqueue still open in the lane
/// it serves, nor for a lane or an expired job row another transaction holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_never_waits_on_open_transactions() {
    with_store(Engine::Postgres, |s, url| async move {
        s.enqueue(&[suite::job("x", "expired")]).await.unwrap();
        let got = s.claim(&[], &suite::req(1, 1)).await.unwrap();
        assert_eq!(got[0].id, "expired");
        let expired = got[0].seq;
        let jobs: Vec<_> = (0..3).map(|i| suite::job("o", &format!("{i}"))).collect();
        s.enqueue(&jobs).await.unwrap();
        s.enqueue(&[suite::job("busy", "b")]).await.unwrap();
        let pool = side_pool(&url).await;
        let mut tx = pool.begin().await.unwrap();
        tx.execute(
            "INSERT INTO gnl_jobs (org, id, type, payload, run_at, state, created_at, updated_at) \
             VALUES ('o', 'open', 't', '{}', 0, 'pending', 0, 0)",
        )
        .await
        .unwrap();
        tx.execute("SELECT org FROM gnl_lanes WHERE org = 'busy' FOR UPDATE")
            .await
            .unwrap();
        sqlx::query("SELECT seq FROM gnl_jobs WHERE seq = $1 FOR UPDATE")
            .bind(expired)
            .execute(&mut *tx)
            .await
            .unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        let ten = suite::req(10, 60_000);
        let got = tokio::time::timeout(std::time::Duration::from_secs(5), s.claim(&[], &ten))
            .await
            .expect("the claim waited on another transaction")
            .unwrap();
        let mut ids: Vec<&str> = got.iter().map(|j| j.id.as_str()).collect();
        ids.sort();
        assert_eq!(ids, vec!["0", "1", "2"]);
        tx.commit().await.unwrap();
        pool.close().await;
        let got = s.claim(&[], &suite::req(10, 60_000)).await.unwrap();
        let ids: Vec<&str> = got.iter().map(|j| j.id.as_str()).collect();
        assert!(ids.contains(&"b"), "{ids:?}");
    })
    .await;
}

/// A claim that waits for its lanes (`wait_lanes`, migration 0011) waits where a claim skips:
/// behind a transaction that holds the lane, then it takes the lane's next jobs in order; two
/// at once over one lane take consecutive batches; one that finds the lane emptied by the
/// claim it waited for takes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_waits_for_its_lane_takes_the_next_jobs() {
    use crate::model::{ClaimRequest, ClaimedJob};
    with_store(Engine::Postgres, |s, url| async move {
        let jobs: Vec<_> = (0..40)
            .map(|i| suite::job("o", &format!("{i:02}")))
            .collect();
        s.enqueue(&jobs).await.unwrap();
        let skip = suite::req(10, 60_000);
        let wait = ClaimRequest {
            wait_lanes: true,
            ..skip.clone()
        };
        let ids =
            |got: &[ClaimedJob]| -> Vec<String> { got.iter().map(|j| j.id.clone()).collect() };
        let upto =
            |a: usize, b: usize| -> Vec<String> { (a..b).map(|i| format!("{i:02}")).collect() };
        // The first claim puts the new lane in the turn (a lane another transaction holds
        // would stay out of it until a claim can lock it).
        assert_eq!(ids(&s.claim(&[], &wait).await.unwrap()), upto(0, 10));
        let pool = side_pool(&url).await;
        let mut tx = pool.begin().await.unwrap();
        tx.execute("SELECT org FROM gnl_lanes WHERE org = 'o' FOR UPDATE")
            .await
            .unwrap();
        // A claim skips the held lane; a waiting one is still waiting 300 ms on.
        assert!(s.claim(&[], &skip).await.unwrap().is_empty());
        let waiting = {
            let s = s.clone();
            let wait = wait.clone();
            tokio::spawn(async move { s.claim(&[], &wait).await })
        };
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        assert!(
            !waiting.is_finished(),
            "the claim did not wait for the lane"
        );
        // One that holds a lane already (a failed outcome puts its job's lane back in the
        // turn first) skips instead: waiting while holding a lane could deadlock.
        s.enqueue(&[suite::job("a", "x")]).await.unwrap();
        let x = s.claim(&[], &skip).await.unwrap();
        assert_eq!(ids(&x), ["x"]);
        let retry = [suite::failed(&x[0], "once", 60_000)];
        let held = tokio::time::timeout(std::time::Duration::from_secs(5), s.claim(&retry, &wait))
            .await
            .expect("a claim holding a lane waited for another");
        assert!(held.unwrap().is_empty());
        assert!(
            !waiting.is_finished(),
            "the claim did not wait for the lane"
        );
        tx.commit().await.unwrap();
        assert_eq!(ids(&waiting.await.unwrap().unwrap()), upto(10, 20));
        // Two at once: one waits for the other, and they take the next two batches.
        let (a, b) = tokio::join!(s.claim(&[], &wait), s.claim(&[], &wait));
        let mut both = [ids(&a.unwrap()), ids(&b.unwrap())];
        both.sort();
        assert_eq!(both, [upto(20, 30), upto(30, 40)]);
        assert!(s.claim(&[], &wait).await.unwrap().is_empty());
        // Five jobs, two waiting claims of ten: one takes them, the other finds the lane no
        // longer due (or not yet in the turn) and takes nothing.
        let few: Vec<_> = (0..5).map(|i| suite::job("p", &format!("{i}"))).collect();
        s.enqueue(&few).await.unwrap();
        let (a, b) = tokio::join!(s.claim(&[], &wait), s.claim(&[], &wait));
        let mut sizes = [a.unwrap().len(), b.unwrap().len()];
        sizes.sort();
        assert_eq!(sizes, [0, 5]);
        pool.close().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_migrations_agree() {
    suite::concurrent_migrations_agree(Engine::Postgres).await;
}

#[tokio::test]
async fn an_empty_schema_is_refused_without_create() {
    let Some(db) = Fresh::new(Engine::Postgres).await else {
        return;
    };
    let r = open(&db.url, 1, false).await.map(|_| ());
    db.drop().await;
    assert!(
        matches!(r, Err(Error::SchemaOutdated { found: 0, .. })),
        "{r:?}"
    );
}

#[tokio::test]
async fn an_unreachable_server_is_unavailable() {
    let r = open("postgres://postgres@127.0.0.1:1/test", 1, true)
        .await
        .map(|_| ());
    match r {
        Err(Error::StoreUnavailable { reason, .. }) => {
            assert!(reason.to_lowercase().contains("refused"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
}

crate::store::held::held_connection_tests!(
    Postgres,
    super::PostgresStore,
    "SELECT pg_backend_pid()::bigint",
    "SELECT pg_terminate_backend({})"
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outcomes_in_completion_order_do_not_deadlock_with_the_renewal() {
    // A worker writes outcomes in the order its handlers finished while its renewal locks the
    // same jobs by seq: the write must lock them by seq too (`store::in_lock_order`), or the
    // two wait for each other until Postgres breaks the deadlock a second later, aborting one
    // (here the renewal, which waited first). A side transaction holding the middle job makes
    // the interleaving certain: the write takes its first job and waits there, the renewal
    // comes and waits, then the side lets go.
    with_store(Engine::Postgres, |s, url| async move {
        let jobs: Vec<_> = (0..3).map(|i| suite::job("o", &format!("{i}"))).collect();
        s.enqueue(&jobs).await.unwrap();
        let mut got = s.claim(&[], &suite::req(3, 60_000)).await.unwrap();
        got.sort_by_key(|j| j.seq);
        let side = side_pool(&url).await;
        let mut hold = side.begin().await.unwrap();
        sqlx::query("SELECT 1 FROM gnl_jobs WHERE seq = $1 FOR UPDATE")
            .bind(got[1].seq)
            .execute(&mut *hold)
            .await
            .unwrap();
        // Finished last job first.
        let outcomes: Vec<_> = got.iter().rev().map(|j| suite::done(j, "null")).collect();
        let leases: Vec<_> = got
            .iter()
            .map(|j| crate::model::LeaseRef {
                seq: j.seq,
                token: j.token,
                org: j.org.clone(),
            })
            .collect();
        let w = {
            let s = s.clone();
            tokio::spawn(async move { crate::store::finish(s.as_ref(), &outcomes).await })
        };
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let r = {
            let s = s.clone();
            // The engine's renewal itself, not run again on a deadlock: it must not meet one.
            tokio::spawn(async move { s.renew(&leases, 60_000).await })
        };
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        hold.commit().await.unwrap();
        w.await.unwrap().unwrap();
        let status = r.await.unwrap();
        assert!(status.is_ok(), "the renewal failed: {status:?}");
        side.close().await;
    })
    .await;
}

/// Claims over 20 organizations until the queue is empty, each carrying the last one's jobs
/// as done; returns how many jobs they took.
async fn drain_claims(store: &super::PostgresStore) -> usize {
    use crate::store::QueueStore as _;
    let req = suite::req(5, 60_000);
    let (mut last, mut taken) = (vec![], 0);
    loop {
        let done: Vec<_> = last.iter().map(|j| suite::done(j, "null")).collect();
        last = store.claim(&done, &req).await.unwrap();
        if last.is_empty() {
            return taken;
        }
        taken += last.len();
    }
}

/// The lanes and lease records that claims churn are vacuumed by the store that claims
/// (`postgres::vacuum`): the server counts vacuums of both tables, none of them the store's
/// own calls waited for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_vacuum_the_lanes_and_lease_records() {
    with_store(Engine::Postgres, |s, url| async move {
        let jobs: Vec<_> = (0..100)
            .map(|i| suite::job(&format!("o{}", i % 20), &format!("j{i}")))
            .collect();
        s.enqueue(&jobs).await.unwrap();
        let mut store = super::PostgresStore::connect(&url, 2).await.unwrap();
        store.vacuum = super::vacuum::Vacuum::new(std::time::Duration::ZERO);
        assert_eq!(drain_claims(&store).await, 100);
        let side = side_pool(&url).await;
        let counts = || async {
            sqlx::query_as::<_, (i64, i64)>(
                "SELECT sum(vacuum_count) FILTER (WHERE relname = 'gnl_lanes')::bigint, \
                        sum(vacuum_count) FILTER (WHERE relname = 'gnl_leases')::bigint \
                 FROM pg_stat_user_tables WHERE schemaname = current_schema()",
            )
            .fetch_one(&side)
            .await
            .unwrap()
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while store.vacuum.ran() == 0 || counts().await.0 == 0 || counts().await.1 == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "no vacuum: ran {}, server counts {:?}",
                store.vacuum.ran(),
                counts().await
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        assert!(!store.vacuum.may_not());
        side.close().await;
        store.close().await;
    })
    .await;
}

/// A store whose role may not vacuum the tables (not their owner) claims as before, never
/// vacuums, and stops looking after its first look.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_that_may_not_vacuum_claims_all_the_same() {
    with_store(Engine::Postgres, |s, url| async move {
        let jobs: Vec<_> = (0..40)
            .map(|i| suite::job(&format!("o{}", i % 20), &format!("j{i}")))
            .collect();
        s.enqueue(&jobs).await.unwrap();
        let side = side_pool(&url).await;
        let role = format!("gnl_vac_{}", uuid::Uuid::now_v7().simple());
        let schema: String = sqlx::query_scalar("SELECT current_schema()")
            .fetch_one(&side)
            .await
            .unwrap();
        side.execute(
            format!(
                "CREATE ROLE {role} NOLOGIN; GRANT USAGE ON SCHEMA {schema} TO {role}; \
                 GRANT ALL ON ALL TABLES IN SCHEMA {schema} TO {role}; \
                 GRANT ALL ON ALL SEQUENCES IN SCHEMA {schema} TO {role}"
            )
            .as_str(),
        )
        .await
        .unwrap();
        // The suite's URL ends with its search_path option: the session takes the role too.
        let as_role = format!("{url}%20-c%20role%3D{role}");
        let mut store = super::PostgresStore::connect(&as_role, 2).await.unwrap();
        store.vacuum = super::vacuum::Vacuum::new(std::time::Duration::ZERO);
        let taken = drain_claims(&store).await;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !store.vacuum.may_not() {
            assert!(std::time::Instant::now() < deadline, "no look");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        assert_eq!(taken, 40);
        assert_eq!(store.vacuum.ran(), 0);
        store.close().await;
        side.execute(format!("DROP OWNED BY {role}; DROP ROLE {role}").as_str())
            .await
            .unwrap();
        side.close().await;
    })
    .await;
}
