//! The journal's engine suite (`JournalStore`): a step's first recorded result is kept.

use std::sync::Arc;

use crate::store::Store;

on_every_engine! {
    store: [steps_keep_the_first_result],
    servers: [],
    store_and_url: [],
}

pub async fn steps_keep_the_first_result(s: Arc<dyn Store>) {
    assert_eq!(s.step_get("r", "n").await.unwrap(), None);
    assert_eq!(s.step_put("r", "n", "1").await.unwrap(), "1");
    assert_eq!(s.step_put("r", "n", "2").await.unwrap(), "1");
    assert_eq!(s.step_get("r", "n").await.unwrap().as_deref(), Some("1"));
    // (run_id, name) pairs never collide.
    assert_eq!(s.step_put("r", "n2", "3").await.unwrap(), "3");
    assert_eq!(s.step_put("rn", "2", "4").await.unwrap(), "4");
    assert_eq!(
        s.step_put("r", "u", "{\"a\":\"\\u0000\u{1F600}\"}")
            .await
            .unwrap(),
        "{\"a\":\"\\u0000\u{1F600}\"}"
    );
}
