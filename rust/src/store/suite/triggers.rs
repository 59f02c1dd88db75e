//! The scheduler's engine suite (`TriggerStore`): a registration keeps the first definition,
//! the due poll reads pending due triggers in `(next_run_at, id)` order page by page, state
//! writes are compare-and-sets on the version (and, fenced, on the fire lock's token), also
//! under concurrent writers.

use std::sync::Arc;

use crate::store::triggers::{TriggerDef, TriggerState};
use crate::store::{open, Store};

on_every_engine! {
    store: [
        a_registration_keeps_the_first_definition,
        the_due_poll_reads_pending_due_triggers_in_order,
        state_writes_are_compare_and_sets_fenced_by_the_fire_lock,
        triggers_are_listed_and_deleted,
    ],
    servers: [],
    store_and_url: [concurrent_state_writers_have_one_winner],
}

pub(crate) fn def(id: &str, spec: &str) -> TriggerDef {
    TriggerDef {
        id: id.into(),
        name: "wf".into(),
        kind: "cron".into(),
        spec: spec.into(),
        anchor_ms: 1_000,
        misfire: "latest".into(),
        max_catchup: None,
        misfire_grace_ms: 60_000,
        input: Some("{\"a\":\"\u{1F600}\"}".into()),
        max_attempts: 5,
        definition: format!("{{\"id\":{id:?},\"cron\":{spec:?}}}"),
    }
}

pub(crate) fn pending(at: i64) -> TriggerState {
    TriggerState {
        state: "pending".into(),
        next_run_at: Some(at),
        owed_slot: Some(at),
        ..Default::default()
    }
}

pub async fn a_registration_keeps_the_first_definition(s: Arc<dyn Store>) {
    let d = def("t1", "* * * * *");
    let (created, row) = s.trigger_register(&d, &pending(60_000)).await.unwrap();
    assert!(created);
    assert_eq!(row.def, d);
    assert_eq!(row.state, pending(60_000));
    assert_eq!(row.version, 1);
    assert!(row.created_at > 0 && row.updated_at == row.created_at);
    // A second registration changes nothing and answers the stored one.
    let other = def("t1", "0 3 * * *");
    let (created, row) = s.trigger_register(&other, &pending(5)).await.unwrap();
    assert!(!created);
    assert_eq!(row.def, d);
    assert_eq!(row.state.next_run_at, Some(60_000));
    assert_eq!(s.trigger_get("t1").await.unwrap().unwrap().def, d);
    assert_eq!(s.trigger_get("nope").await.unwrap(), None);
}

pub async fn the_due_poll_reads_pending_due_triggers_in_order(s: Arc<dyn Store>) {
    for (id, at) in [("b", 200), ("a", 200), ("c", 100), ("d", 900)] {
        s.trigger_register(&def(id, "* * * * *"), &pending(at))
            .await
            .unwrap();
    }
    let done = TriggerState {
        state: "done".into(),
        ..pending(50)
    };
    s.trigger_register(&def("e", "* * * * *"), &done)
        .await
        .unwrap();
    let due = s.triggers_due(Some(500), None, 10).await.unwrap();
    assert_eq!(due.now_ms, 500);
    let ids: Vec<_> = due.rows.iter().map(|r| r.def.id.as_str()).collect();
    assert_eq!(ids, ["c", "a", "b"]);
    // The last page tells when the next pending trigger is due ("d"; "e" is done).
    assert_eq!(due.next_due_ms, Some(900));
    // Keyset pages: a full page does not (the next page may hold due ones).
    let p1 = s.triggers_due(Some(500), None, 2).await.unwrap();
    assert_eq!(p1.rows.len(), 2);
    assert_eq!(p1.next_due_ms, None);
    let last = p1.rows.last().unwrap();
    let after = (last.state.next_run_at.unwrap(), last.def.id.clone());
    let p2 = s.triggers_due(Some(500), Some(after), 2).await.unwrap();
    let ids: Vec<_> = p2.rows.iter().map(|r| r.def.id.as_str()).collect();
    assert_eq!(ids, ["b"]);
    assert_eq!(p2.next_due_ms, Some(900));
    // A page filled by the due ones exactly: the next page is empty and tells.
    let p1 = s.triggers_due(Some(500), None, 3).await.unwrap();
    assert_eq!((p1.rows.len(), p1.next_due_ms), (3, None));
    let last = p1.rows.last().unwrap();
    let after = (last.state.next_run_at.unwrap(), last.def.id.clone());
    let p2 = s.triggers_due(Some(500), Some(after), 3).await.unwrap();
    assert_eq!((p2.rows.len(), p2.next_due_ms), (0, Some(900)));
    // Nothing pending after now: no next instant.
    let late = s.triggers_due(Some(1_000), None, 10).await.unwrap();
    assert_eq!((late.rows.len(), late.next_due_ms), (4, None));
    // The store's clock: everything registered at small instants is due.
    let due = s.triggers_due(None, None, 10).await.unwrap();
    assert!(due.now_ms > 1_600_000_000_000);
    assert_eq!(due.rows.len(), 4);
    assert_eq!(due.next_due_ms, None);
}

pub async fn state_writes_are_compare_and_sets_fenced_by_the_fire_lock(s: Arc<dyn Store>) {
    s.trigger_register(&def("t", "* * * * *"), &pending(100))
        .await
        .unwrap();
    let next = TriggerState {
        fire_count: 1,
        next_run_at: Some(160),
        owed_slot: Some(160),
        last_fired_at: Some(101),
        last_scheduled_for: Some(100),
        last_error: Some("e\u{1F600}".into()),
        missed: 2,
        deferrals: 1,
        last_deferral_at: Some(99),
        attempts: 3,
        retry_slot: Some(100),
        ..pending(100)
    };
    assert!(!s.trigger_update("t", 2, &next, None).await.unwrap());
    assert!(s.trigger_update("t", 1, &next, None).await.unwrap());
    let row = s.trigger_get("t").await.unwrap().unwrap();
    assert_eq!((row.version, &row.state), (2, &next));
    // The version moved: a write against the old one changes nothing.
    assert!(!s.trigger_update("t", 1, &pending(5), None).await.unwrap());
    // Fenced: only while the lock is held with the token.
    let tok = s
        .lock_acquire("k:fire", "me", 60_000)
        .await
        .unwrap()
        .unwrap();
    assert!(!s
        .trigger_update("t", 2, &pending(7), Some(("k:fire", tok + 1)))
        .await
        .unwrap());
    assert!(!s
        .trigger_update("t", 2, &pending(7), Some(("other:fire", tok)))
        .await
        .unwrap());
    assert!(s
        .trigger_update("t", 2, &pending(7), Some(("k:fire", tok)))
        .await
        .unwrap());
    // A failed trigger is not due.
    let failed = TriggerState {
        state: "failed".into(),
        ..pending(7)
    };
    assert!(s.trigger_update("t", 3, &failed, None).await.unwrap());
    assert!(s
        .triggers_due(Some(1_000), None, 10)
        .await
        .unwrap()
        .rows
        .is_empty());
}

pub async fn triggers_are_listed_and_deleted(s: Arc<dyn Store>) {
    for id in ["z", "a", "m"] {
        s.trigger_register(&def(id, "* * * * *"), &pending(1))
            .await
            .unwrap();
    }
    let ids = |rows: Vec<crate::store::triggers::TriggerRow>| -> Vec<String> {
        rows.into_iter().map(|r| r.def.id).collect()
    };
    assert_eq!(
        ids(s.list_triggers(None, 100).await.unwrap()),
        ["a", "m", "z"]
    );
    // A page at a time, after the last id of the page before.
    assert_eq!(ids(s.list_triggers(None, 2).await.unwrap()), ["a", "m"]);
    assert_eq!(ids(s.list_triggers(Some("m"), 2).await.unwrap()), ["z"]);
    assert_eq!(ids(s.list_triggers(Some("b"), 1).await.unwrap()), ["m"]);
    assert!(s.list_triggers(Some("z"), 2).await.unwrap().is_empty());
    assert_eq!(s.list_triggers(None, i64::MAX).await.unwrap().len(), 3);
    assert!(s.trigger_delete("m").await.unwrap());
    assert!(!s.trigger_delete("m").await.unwrap());
    assert_eq!(s.list_triggers(None, 100).await.unwrap().len(), 2);
    // Deleted, the id is free for another definition.
    let (created, row) = s
        .trigger_register(&def("m", "0 3 * * *"), &pending(1))
        .await
        .unwrap();
    assert!(created && row.def.spec == "0 3 * * *");
}

pub async fn concurrent_state_writers_have_one_winner(s: Arc<dyn Store>, url: String) {
    s.trigger_register(&def("t", "* * * * *"), &pending(100))
        .await
        .unwrap();
    let other = open(&url, 4, false).await.unwrap();
    let mut tasks = vec![];
    for w in 0..8i64 {
        let st = if w % 2 == 0 { s.clone() } else { other.clone() };
        tasks.push(tokio::spawn(async move {
            let next = TriggerState {
                fire_count: w,
                ..pending(100 + w)
            };
            st.trigger_update("t", 1, &next, None).await.unwrap()
        }));
    }
    let mut won = 0;
    for t in tasks {
        won += t.await.unwrap() as i32;
    }
    assert_eq!(won, 1);
    let row = s.trigger_get("t").await.unwrap().unwrap();
    assert_eq!(row.version, 2);
    assert_eq!(row.state.next_run_at, Some(100 + row.state.fire_count));
}
