//! Postgres wake-ups: LISTEN/NOTIFY on the channel `gnl_wake` (NOTIFY reaches the sessions of
//! one database).
//!
//! * `send`: after a call of this process commits (an enqueue, a retry, a cancel, an emit),
//!   one `pg_notify` carries what changed, coalesced: the changes of every call that commits
//!   while a notification is in flight go in the next one. The payload is the topics' codes
//!   and this store's nonce (`jc:0123456789abcdef`): a handful of bytes, whatever the batch.
//! * `listen`: one connection per store (its own one-connection pool, application_name
//!   `gnl-listener`) LISTENs and wakes this process's waiters on what other processes changed.
//!   A lost connection is opened again with backoff; after any reconnect every topic is woken
//!   once, for the notifications sent meanwhile. The poll stays the fallback.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};
use tokio::sync::watch;

use crate::store::wake::{until_closed, Outbox, Topic, Wakeups, WATCH_MAX_BACKOFF};

pub(super) const CHANNEL: &str = "gnl_wake";

/// The listener's `application_name` (a test finds its session by it).
pub(super) const LISTENER_NAME: &str = "gnl-listener";

fn payload(bits: u8, nonce: &str) -> String {
    let mut p: String = Outbox::topics(bits).map(Topic::code).collect();
    p.push(':');
    p.push_str(nonce);
    p
}

/// The topics of a notification, unless it came from `nonce` (this store).
fn parse(payload: &str, nonce: &str) -> Option<Vec<Topic>> {
    let (codes, from) = payload.split_once(':').unwrap_or((payload, ""));
    if from == nonce {
        return None;
    }
    Some(codes.chars().filter_map(Topic::from_code).collect())
}

pub(super) async fn send(
    pool: PgPool,
    queries: Arc<AtomicU64>,
    outbox: Arc<Outbox>,
    nonce: String,
    mut closed: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = until_closed(&mut closed) => return,
            _ = outbox.ready() => {}
        }
        let _sending = outbox.sending.lock().await;
        let bits = outbox.take();
        if bits != 0 {
            queries.fetch_add(1, Ordering::Relaxed);
            notify(&pool, bits, &nonce).await;
        }
    }
}

/// Send one notification of `bits`. Not retried: a notification lost is a job found by the
/// next poll.
pub(super) async fn notify(pool: &PgPool, bits: u8, nonce: &str) {
    let _ = sqlx::query("SELECT pg_notify($1, $2)")
        .bind(CHANNEL)
        .bind(payload(bits, nonce))
        .execute(pool)
        .await;
}

pub(super) async fn listen(
    opts: PgConnectOptions,
    wake: Weak<Wakeups>,
    mut closed: watch::Receiver<bool>,
) {
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .min_connections(0)
        .acquire_timeout(Duration::from_secs(5))
        .connect_lazy_with(opts.application_name(LISTENER_NAME));
    let mut backoff = Duration::from_millis(100);
    'connect: loop {
        let connected = tokio::select! {
            _ = until_closed(&mut closed) => break,
            l = connect(&pool) => l,
        };
        let mut listener = match connected {
            Ok(l) => l,
            Err(_) => {
                tokio::select! {
                    _ = until_closed(&mut closed) => break,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(WATCH_MAX_BACKOFF);
                continue;
            }
        };
        backoff = Duration::from_millis(100);
        // Changes made while no listener was connected wake everyone once.
        match wake.upgrade() {
            Some(w) => w.bump_remote(None),
            None => break,
        }
        loop {
            let got = tokio::select! {
                _ = until_closed(&mut closed) => break 'connect,
                r = listener.try_recv() => r,
            };
            let Some(w) = wake.upgrade() else {
                break 'connect;
            };
            match got {
                Ok(Some(n)) => {
                    if let Some(topics) = parse(n.payload(), w.nonce()) {
                        topics.into_iter().for_each(|t| w.bump_remote(Some(t)));
                    }
                }
                // The connection was lost and opened again: notifications may be lost.
                Ok(None) => w.bump_remote(None),
                Err(_) => continue 'connect,
            }
        }
    }
    pool.close().await;
}

async fn connect(pool: &PgPool) -> sqlx::Result<PgListener> {
    let mut l = PgListener::connect_with(pool).await?;
    l.listen(CHANNEL).await?;
    Ok(l)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payload_names_its_topics_and_its_sender() {
        let p = payload(0b011, "ab");
        assert_eq!(p, "jc:ab");
        assert_eq!(parse(&p, "ab"), None);
        assert_eq!(parse(&p, "cd"), Some(vec![Topic::Jobs, Topic::Cancels]));
        assert_eq!(parse("e", "cd"), Some(vec![Topic::Events]));
    }
}
