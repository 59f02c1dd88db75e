//! The engine suite: the tests every engine must pass, each run on a fresh SQLite file, a
//! fresh Postgres schema and a fresh MySQL database, to prove the three agree. Here: the
//! harness (fresh databases, `on_every_engine!`) and the helpers the tests share; the tests
//! themselves are split by subsystem as the traits are (`queue.rs`, `journal.rs`). Tests of
//! one engine alone (plans, index use, migrations, version checks) stay in its `tests.rs`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use sqlx::mysql::MySqlPoolOptions;
use sqlx::pool::PoolOptions;
use sqlx::postgres::PgPoolOptions;
use sqlx::Executor;

use crate::model::*;
use crate::store::{latest_version, open, upgrade, Store};

/// Instantiate suite tests, in the calling module, as `sqlite::<name>`, `postgres::<name>` and
/// `mysql::<name>`, each on a fresh store of its engine (`with_store`):
/// * `store: [..]` take the store (`async fn(Arc<dyn Store>)`);
/// * `servers: [..]` too, on Postgres and MySQL only;
/// * `store_and_url: [..]` take its URL as well (they open stores of their own: concurrent
///   claimers, enqueuers), on four worker threads.
macro_rules! on_every_engine {
    (
        store: [$($s:ident),* $(,)?],
        servers: [$($v:ident),* $(,)?],
        store_and_url: [$($u:ident),* $(,)?] $(,)?
    ) => {
        on_every_engine!(@engine sqlite, Sqlite, [$($s),*], [$($u),*]);
        on_every_engine!(@engine postgres, Postgres, [$($s,)* $($v),*], [$($u),*]);
        on_every_engine!(@engine mysql, Mysql, [$($s,)* $($v),*], [$($u),*]);
    };
    (@engine $m:ident, $e:ident, [$($s:ident),* $(,)?], [$($u:ident),* $(,)?]) => {
        mod $m {
            use $crate::store::suite::{with_store, Engine};
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $s() {
                    with_store(Engine::$e, |s, _url| super::$s(s)).await;
                }
            )*
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $u() {
                    with_store(Engine::$e, super::$u).await;
                }
            )*
        }
    };
}

pub(crate) mod events;
pub(crate) mod journal;
mod probe;
pub(crate) mod queue;
pub(crate) mod triggers;
pub(crate) mod views;

/// The engines.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Engine {
    Sqlite,
    Postgres,
    Mysql,
}

impl Engine {
    /// Its `Store::backend` name.
    pub(crate) fn backend(self) -> &'static str {
        match self {
            Engine::Sqlite => "sqlite",
            Engine::Postgres => "postgres",
            Engine::Mysql => "mysql",
        }
    }
}

/// The test server's URL (`GNL_TEST_POSTGRES_URL`, else the local server).
pub(crate) fn postgres_url() -> String {
    std::env::var("GNL_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// The test server's URL (`GNL_TEST_MYSQL_URL`, else the local server).
pub(crate) fn mysql_url() -> String {
    std::env::var("GNL_TEST_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into())
}

/// A MySQL URL `base` with its database replaced by `db`.
pub(crate) fn with_db(base: &str, db: &str) -> String {
    let (main, query) = match base.split_once('?') {
        Some((m, q)) => (m, format!("?{q}")),
        None => (base, String::new()),
    };
    let scheme_end = main.find("://").map_or(0, |i| i + 3);
    let host_part = match main[scheme_end..].find('/') {
        Some(i) => &main[..scheme_end + i],
        None => main,
    };
    format!("{host_part}/{db}{query}")
}

/// An empty database of its own for one test, at `url`; `drop` removes it.
pub(crate) struct Fresh {
    pub url: String,
    place: Place,
}

enum Place {
    /// The temporary directory that holds the SQLite file.
    Dir(std::path::PathBuf),
    /// A Postgres schema (the URL's search_path), and the pool that created it.
    Schema(sqlx::PgPool, String),
    /// A MySQL database, and the pool that created it.
    Database(sqlx::MySqlPool, String),
}

impl Fresh {
    /// A fresh database of `engine`. `None` (with a note) when its server cannot be reached,
    /// except in CI, where that fails.
    pub(crate) async fn new(engine: Engine) -> Option<Fresh> {
        let id = uuid::Uuid::now_v7().simple();
        let name = format!("gnl_t_{id}");
        match engine {
            Engine::Sqlite => {
                let dir = std::env::temp_dir().join(format!("gnl-suite-{id}"));
                std::fs::create_dir_all(&dir).unwrap();
                Some(Fresh {
                    url: format!("sqlite:///{}/gnl.db", dir.display()),
                    place: Place::Dir(dir),
                })
            }
            Engine::Postgres => {
                let base = postgres_url();
                let admin = admin("Postgres", PgPoolOptions::new(), &base).await?;
                admin
                    .execute(format!("CREATE SCHEMA {name}").as_str())
                    .await
                    .unwrap();
                let sep = if base.contains('?') { '&' } else { '?' };
                Some(Fresh {
                    url: format!("{base}{sep}options=-c%20search_path%3D{name}"),
                    place: Place::Schema(admin, name),
                })
            }
            Engine::Mysql => {
                let base = mysql_url();
                let admin = admin("MySQL", MySqlPoolOptions::new(), &base).await?;
                admin
                    .execute(format!("CREATE DATABASE {name}").as_str())
                    .await
                    .unwrap();
                Some(Fresh {
                    url: with_db(&base, &name),
                    place: Place::Database(admin, name),
                })
            }
        }
    }

    /// Remove the database.
    pub(crate) async fn drop(self) {
        match self.place {
            Place::Dir(dir) => {
                let _ = std::fs::remove_dir_all(dir);
            }
            Place::Schema(admin, schema) => {
                admin
                    .execute(format!("DROP SCHEMA {schema} CASCADE").as_str())
                    .await
                    .unwrap();
                admin.close().await;
            }
            Place::Database(admin, db) => {
                admin
                    .execute(format!("DROP DATABASE IF EXISTS {db}").as_str())
                    .await
                    .unwrap();
                admin.close().await;
            }
        }
    }
}

/// A pool of one connection to the server at `base` (`what` names it). `None` (with a note)
/// when the server cannot be reached, except in CI, where that fails.
async fn admin<DB: sqlx::Database>(
    what: &str,
    opts: PoolOptions<DB>,
    base: &str,
) -> Option<sqlx::Pool<DB>> {
    match opts
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(10))
        .connect(base)
        .await
    {
        Ok(p) => Some(p),
        Err(e) => {
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!("{what} at {base} is unreachable in CI: {e}");
            }
            eprintln!("note: {what} at {base} is unreachable ({e}); test skipped");
            None
        }
    }
}

/// Run `f` on a fresh, migrated store of `engine` and its URL; the database is removed
/// afterwards, even on panic.
pub(crate) async fn with_store<F, Fut>(engine: Engine, f: F)
where
    F: FnOnce(Arc<dyn Store>, String) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let Some(db) = Fresh::new(engine).await else {
        return;
    };
    let u = db.url.clone();
    let res = tokio::spawn(async move {
        let s = open(&u, 4, true).await.unwrap();
        f(s.clone(), u).await;
        s.close().await;
    })
    .await;
    db.drop().await;
    if let Err(e) = res {
        std::panic::resume_unwind(e.into_panic());
    }
}

/// Three `upgrade`s of one fresh database at once all succeed and agree on the latest version
/// (the body of each server engine's `concurrent_migrations_agree`).
pub(crate) async fn concurrent_migrations_agree(engine: Engine) {
    let Some(db) = Fresh::new(engine).await else {
        return;
    };
    let runs: Vec<_> = (0..3)
        .map(|_| {
            let u = db.url.clone();
            tokio::spawn(async move { upgrade(&u).await })
        })
        .collect();
    let mut results = vec![];
    for r in runs {
        results.push(r.await.unwrap());
    }
    let s = open(&db.url, 1, false).await;
    let version = match &s {
        Ok(s) => s.schema_version().await.unwrap(),
        Err(_) => None,
    };
    if let Ok(s) = s {
        s.close().await;
    }
    db.drop().await;
    for r in results {
        assert_eq!(r.unwrap(), latest_version(engine.backend()));
    }
    assert_eq!(version, Some(latest_version(engine.backend())));
}

pub(crate) fn job(org: &str, id: &str) -> NewJob {
    NewJob {
        org: org.into(),
        id: id.into(),
        typ: "t".into(),
        payload: "{}".into(),
        run_at: None,
        delay_ms: None,
        max_depth: None,
    }
}

pub(crate) fn req(limit: usize, ttl_ms: i64) -> ClaimRequest {
    ClaimRequest {
        owner: "w".into(),
        limit,
        ttl_ms,
        max_attempts: 2,
        types: vec!["t".into()],
        probe: true,
        per_org: 0,
        wait_lanes: false,
    }
}

pub(crate) fn done(j: &ClaimedJob, result: &str) -> Outcome {
    Outcome::Done {
        seq: j.seq,
        token: j.token,
        org: j.org.clone(),
        result: Some(result.into()),
    }
}

/// The failed outcome of the attempt `j`, retried after `delay_ms`.
pub(crate) fn failed(j: &ClaimedJob, error: &str, delay_ms: i64) -> Outcome {
    Outcome::Failed {
        seq: j.seq,
        token: j.token,
        org: j.org.clone(),
        error: error.into(),
        delay_ms,
    }
}

pub(crate) async fn sleep_ms(ms: u64) {
    tokio::time::sleep(Duration::from_millis(ms)).await;
}
