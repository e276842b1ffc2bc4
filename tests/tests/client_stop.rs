//! A graceful stop finishes the publish in flight, acks it, and gives back the untried
//! messages without counting an attempt.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use txoutbox_client::{Message, PublishError, Subscriber};
use txoutbox_tests::{Server, TestDb, DEADLINE};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_finishes_in_flight_and_gives_back_the_rest_untried() {
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let slow = db.insert("t", Some("k"), b"slow").await;
    let mut untried = vec![
        db.insert("t", Some("k"), b"k-1").await,
        db.insert("t", Some("k"), b"k-2").await,
    ];
    for i in 0..5 {
        untried.push(db.insert("t", None, format!("x{i}").as_bytes()).await);
    }

    let started = Arc::new(Notify::new());
    let publisher = {
        let started = Arc::clone(&started);
        move |message: Message| {
            let started = Arc::clone(&started);
            async move {
                if &message.payload[..] == b"slow" {
                    started.notify_one();
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    return Ok(());
                }
                Err(PublishError::new("only the slow message may be published"))
            }
        }
    };
    // One publish at a time: the slow one comes first (lowest id), the rest wait.
    let subscriber = Subscriber::builder([server.url()], "orders")
        .concurrency(1)
        .max_in_flight(50)
        .build(publisher)
        .unwrap();
    let handle = subscriber.spawn();
    tokio::time::timeout(DEADLINE, started.notified())
        .await
        .expect("the slow publish did not start");

    let counters = handle.counters();
    tokio::time::timeout(Duration::from_secs(10), handle.stop())
        .await
        .expect("stop took too long")
        .unwrap();

    assert_eq!(db.row(slow).await, ("done".to_owned(), 1, None));
    for id in untried {
        assert_eq!(
            db.row(id).await,
            ("pending".to_owned(), 0, None),
            "message {id} should be back untried, its attempt refunded"
        );
    }
    let totals = counters.snapshot();
    assert_eq!((totals.published, totals.acked, totals.released), (1, 1, 7));
    assert_eq!(totals.retried, 0);
    db.drop().await;
}
