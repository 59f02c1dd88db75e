//! A probe, not a proof: where a durable step's time goes inside sqlx on Postgres and MySQL
//! (issue 10's 1.5x bar), with no Python and no asyncio bridge. Ignored by default; run it
//! with `cargo test --release --quiet probe_ -- --ignored --nocapture --test-threads=1` on a
//! quiet machine.
//!
//! Each round times N calls of: the store's `step_put` (new steps of one run: what a workflow's
//! step sends), the same plain single-row insert the raw-driver anchor sends (autocommit),
//! through a pool (a pool acquire, and sqlx's ping on release, per statement) and on one
//! held connection, and a bare ping (one round trip, no statement) on a held connection.
//! Rounds alternate the contenders; medians per call are printed.

use std::time::{Duration, Instant};

use sqlx::{Connection, Executor};

use crate::store::suite::{with_store, Engine};

const N: i64 = 1_000;
const ROUNDS: usize = 5;

fn median(mut xs: Vec<Duration>) -> f64 {
    xs.sort();
    xs[xs.len() / 2].as_secs_f64() * 1e6 / N as f64
}

macro_rules! probe {
    ($name:ident, $engine:ident, $pool:ty, $ph:literal) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        #[ignore = "a probe of timings; run with --ignored --nocapture"]
        async fn $name() {
            with_store(Engine::$engine, |s, url| async move {
                // GNL_PROBE_ASYNC_COMMIT=1: Postgres sessions (the store's and the anchor's)
                // commit without waiting for the flush, to see the rest on a busy disk.
                let url = match std::env::var("GNL_PROBE_ASYNC_COMMIT").as_deref() {
                    Ok("1") => url.replacen(
                        "options=-c%20",
                        "options=-c%20synchronous_commit%3Doff%20-c%20",
                        1,
                    ),
                    _ => url,
                };
                let s = if url.contains("synchronous_commit") {
                    crate::store::open(&url, 4, true).await.unwrap()
                } else {
                    s
                };
                let pool = <$pool>::connect(&url).await.unwrap();
                pool.execute(
                    "CREATE TABLE plain_steps (run_id varchar(200), name varchar(200), n int, \
                     result text, PRIMARY KEY (run_id, name, n))",
                )
                .await
                .unwrap();
                let mut held = pool.acquire().await.unwrap().detach();
                let sql = concat!("INSERT INTO plain_steps VALUES (", $ph, ")");
                let mut t: [Vec<Duration>; 4] = Default::default();
                for r in 0..=ROUNDS {
                    let run = format!("r{r}");
                    let mut times = [Duration::ZERO; 4];
                    let at = Instant::now();
                    for i in 0..N {
                        let v = i.to_string();
                        assert!(s.step_put(&run, "noop", i, i, &v).await.unwrap().is_none());
                    }
                    times[0] = at.elapsed();
                    let at = Instant::now();
                    for i in 0..N {
                        let q = sqlx::query(sql).bind(format!("p{r}")).bind("noop");
                        q.bind(i as i32)
                            .bind(i.to_string())
                            .execute(&pool)
                            .await
                            .unwrap();
                    }
                    times[1] = at.elapsed();
                    let at = Instant::now();
                    for i in 0..N {
                        let q = sqlx::query(sql).bind(format!("h{r}")).bind("noop");
                        q.bind(i as i32)
                            .bind(i.to_string())
                            .execute(&mut held)
                            .await
                            .unwrap();
                    }
                    times[2] = at.elapsed();
                    let at = Instant::now();
                    for _ in 0..N {
                        held.ping().await.unwrap();
                    }
                    times[3] = at.elapsed();
                    if r > 0 {
                        for (k, d) in times.into_iter().enumerate() {
                            t[k].push(d);
                        }
                    }
                }
                let [put, pooled, held_t, ping] = t.map(median);
                println!(
                    "{} sqlx alone, us a call (median of {ROUNDS}): store step_put {put:.1}; \
                     plain insert through the pool {pooled:.1}, on a held connection \
                     {held_t:.1}; a ping {ping:.1}",
                    stringify!($engine)
                );
                held.close().await.unwrap();
                pool.close().await;
            })
            .await;
        }
    };
}

probe!(
    probe_postgres_step,
    Postgres,
    sqlx::PgPool,
    "$1, $2, $3, $4"
);
probe!(probe_mysql_step, Mysql, sqlx::MySqlPool, "?, ?, ?, ?");
