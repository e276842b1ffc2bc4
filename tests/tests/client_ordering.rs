//! The client runtime keeps per-key order under concurrency: three subscribers, each
//! publishing several keys at once, with one publish in five failing.

mod client_common;

use std::time::Duration;

use rand::Rng;
use txoutbox_client::{Message, PublishError, Subscriber};
use txoutbox_tests::{eventually, Server, TestDb, DEADLINE};

use client_common::{rows, Journal};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_key_order_holds_across_subscribers_with_injected_failures() {
    let (keys, per_key) = (12, 20);
    let total = keys * per_key as usize;
    let db = TestDb::new().await;
    let server =
        Server::start_serving(&db.config("max_attempts = 1000\nmax_batch_size = 20")).await;
    db.insert_many("t", &rows(keys, per_key)).await;

    let journal = Journal::default();
    let mut handles = Vec::new();
    for i in 0..3 {
        let journal = journal.clone();
        let publisher = move |message: Message| {
            let journal = journal.clone();
            let (pause, fail) = {
                let mut rng = rand::rng();
                (rng.random_range(0..5), rng.random_bool(0.2))
            };
            async move {
                journal.start(&message);
                tokio::time::sleep(Duration::from_millis(pause)).await;
                journal.finish(&message, !fail);
                if fail {
                    return Err(PublishError::new("injected failure")
                        .retry_after(Duration::from_millis(50)));
                }
                Ok(())
            }
        };
        let subscriber = Subscriber::builder([server.url()], "orders")
            .name(format!("sub{i}"))
            .max_in_flight(16)
            .concurrency(4)
            .build(publisher)
            .unwrap();
        handles.push(subscriber.spawn());
    }

    eventually("every message delivered", DEADLINE * 3, || async {
        (db.count("done").await == total as i64).then_some(())
    })
    .await;
    let mut published = 0;
    let mut retried = 0;
    for handle in handles {
        let totals = handle.counters().snapshot();
        published += totals.published;
        retried += totals.retried;
        assert_eq!(totals.lease_lost, 0);
        handle.stop().await.unwrap();
    }
    journal.assert_exactly_in_order(keys, per_key);
    assert_eq!(published, total as u64);
    assert!(retried > 0, "no failure was injected");
    db.drop().await;
}
