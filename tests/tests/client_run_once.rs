//! One round over the unary calls, for cron jobs: what `Worker::run_once` claims,
//! publishes, retries, dead-letters and holds back.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use txoutbox_client::{Message, PublishError, Worker};
use txoutbox_tests::{Server, TestDb};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_publishes_in_key_order_and_reports_what_happened() {
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("max_attempts = 5")).await;
    let a0 = db.insert("t", Some("a"), b"a0").await;
    let a1 = db.insert("t", Some("a"), b"a1").await;
    let a2 = db.insert("t", Some("a"), b"a2").await;
    let b0 = db.insert("t", Some("b"), b"b0").await;
    let b1 = db.insert("t", Some("b"), b"b1").await;
    let bad = db.insert("t", None, b"bad").await;
    let free = db.insert("t", None, b"free").await;

    let published: Arc<Mutex<Vec<String>>> = Arc::default();
    let publisher = {
        let published = Arc::clone(&published);
        move |message: Message| {
            let published = Arc::clone(&published);
            async move {
                let payload = message.payload_str().unwrap().to_owned();
                match payload.as_str() {
                    "a1" => {
                        Err(PublishError::new("broker down").retry_after(Duration::from_secs(60)))
                    }
                    "bad" => Err(PublishError::permanent("payload rejected")),
                    _ => {
                        published.lock().unwrap().push(payload);
                        Ok(())
                    }
                }
            }
        }
    };
    let worker = Worker::builder([server.url()], "orders", "cron-1")
        .batch_size(10)
        .concurrency(3)
        .build(publisher)
        .unwrap();

    let round = worker.run_once().await.unwrap();
    assert_eq!(
        (
            round.claimed,
            round.published,
            round.retried,
            round.dead_lettered,
            round.blocked,
            round.lost
        ),
        (7, 4, 1, 1, 1, 0),
        "{round:?}"
    );
    let published = published.lock().unwrap().clone();
    let position = |p: &str| published.iter().position(|x| x == p).unwrap();
    assert!(position("b0") < position("b1"));
    assert!(!published.contains(&"a2".to_owned()));

    assert_eq!(db.row(a0).await, ("done".to_owned(), 1, None));
    assert_eq!(
        db.row(a1).await,
        ("pending".to_owned(), 1, Some("broker down".to_owned()))
    );
    assert_eq!(
        db.row(a2).await,
        ("pending".to_owned(), 0, None),
        "held back untried"
    );
    assert_eq!(
        db.row(bad).await,
        ("dead".to_owned(), 1, Some("payload rejected".to_owned()))
    );
    for id in [b0, b1, free] {
        assert_eq!(db.row(id).await.0, "done");
    }

    // Nothing is due: a1 waits for its retry and a2 behind it.
    let round = worker.run_once().await.unwrap();
    assert_eq!(round.claimed, 0);
    let totals = worker.counters().snapshot();
    assert_eq!(
        (totals.published, totals.retried, totals.dead_lettered),
        (4, 1, 1)
    );
    db.drop().await;
}
