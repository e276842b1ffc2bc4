//! A graceful stop finishes the publish in flight, acks it, and gives back the untried
//! messages without counting an attempt: the runtime closes the window (`set_window(0)`)
//! first, so no batch is claimed for it while it gives back and closes.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use txoutbox_client::{Message, PublishError, Subscriber};
use txoutbox_tests::{eventually, Server, TestDb, DEADLINE};

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

/// A stop while publishes keep finishing and freeing room in a small window: the server
/// would claim a new batch for every freed slot. Whatever was claimed is either published
/// (and acked) or given back untried: no row is left with a burned attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_under_load_burns_no_attempt() {
    let db = TestDb::new().await;
    // Batches of up to 4: each ack frees room the server fills at once.
    let server = Server::start_serving(&db.config("max_batch_size = 4")).await;
    let rows: Vec<(Option<String>, Vec<u8>)> = (0..200)
        .map(|i| (Some(format!("k{}", i % 7)), format!("m{i}").into_bytes()))
        .collect();
    let ids = db.insert_many("t", &rows).await;

    let published = Arc::new(AtomicUsize::new(0));
    let publisher = {
        let published = Arc::clone(&published);
        move |_: Message| {
            let published = Arc::clone(&published);
            async move {
                tokio::time::sleep(Duration::from_millis(5)).await;
                published.fetch_add(1, Ordering::SeqCst);
                Ok::<_, PublishError>(())
            }
        }
    };
    let subscriber = Subscriber::builder([server.url()], "orders")
        .concurrency(4)
        .max_in_flight(8)
        .build(publisher)
        .unwrap();
    let handle = subscriber.spawn();
    let counters = handle.counters();
    eventually("some publishes", DEADLINE, || async {
        (published.load(Ordering::SeqCst) >= 30).then_some(())
    })
    .await;
    tokio::time::timeout(Duration::from_secs(10), handle.stop())
        .await
        .expect("stop took too long")
        .unwrap();

    let mut done = 0;
    for id in ids {
        match db.row(id).await {
            (status, 1, None) if status == "done" => done += 1,
            (status, 0, None) if status == "pending" => {}
            other => panic!("message {id} is {other:?}: claimed by the stopping subscriber and neither published nor given back untried"),
        }
    }
    let totals = counters.snapshot();
    assert_eq!(done, totals.acked as usize);
    assert_eq!(totals.published, totals.acked);
    assert!(done < 200, "everything was published before the stop");
    assert_eq!(
        totals.received,
        totals.acked + totals.released,
        "every message received was acked or given back: {totals:?}"
    );
    assert_eq!(totals.retried + totals.lease_lost + totals.dead_lettered, 0);
    db.drop().await;
}
