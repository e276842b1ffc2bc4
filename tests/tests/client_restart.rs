//! The client runtime survives a killed server and a draining one: it reconnects (here
//! to the replacement, on the second of its two addresses), nothing is lost and per-key
//! order holds.

use crate::client_common;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use txoutbox_client::{Event, Message, PublishError, Subscriber};
use txoutbox_tests::{eventually, Server, TestDb, DEADLINE};

use client_common::{config_on_port, free_port, rows, Journal};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_subscriber_reconnects_after_a_server_restart_losing_nothing() {
    let (keys, per_key) = (8, 40);
    let total = keys * per_key as usize;
    let db = TestDb::new().await;
    // A short lease: the killed server cannot give back what its streams held, so those
    // rows come back when their lease runs out.
    let extra = "max_attempts = 1000\nlease = \"2s\"";
    let (port_a, port_b) = (free_port(), free_port());
    let mut first = Server::start_serving(&config_on_port(&db, extra, port_a)).await;
    db.insert_many("t", &rows(keys, per_key)).await;

    let journal = Journal::default();
    let publisher = {
        let journal = journal.clone();
        move |message: Message| {
            let journal = journal.clone();
            async move {
                journal.start(&message);
                tokio::time::sleep(Duration::from_millis(10)).await;
                journal.finish(&message, true);
                Ok::<_, PublishError>(())
            }
        }
    };
    let addresses = [port_a, port_b].map(|port| format!("http://127.0.0.1:{port}"));
    let subscriber = Subscriber::builder(addresses, "orders")
        .max_in_flight(32)
        .concurrency(8)
        .reconnect_backoff(Duration::from_millis(50), Duration::from_millis(500))
        .build(publisher)
        .unwrap();
    let handle = subscriber.spawn();

    eventually("a quarter published", DEADLINE, || async {
        (journal.published() >= total / 4).then_some(())
    })
    .await;
    first.kill();
    first.wait_exit(DEADLINE).await;
    eventually("the client to notice", DEADLINE, || async {
        (handle.counters().snapshot().disconnects >= 1).then_some(())
    })
    .await;
    let published_before = journal.published();
    let second = Server::start_serving(&config_on_port(&db, extra, port_b)).await;

    eventually("every message delivered", DEADLINE * 2, || async {
        (db.count("done").await == total as i64).then_some(())
    })
    .await;
    assert!(
        published_before < total,
        "the restart happened too late to matter"
    );
    let totals = handle.counters().snapshot();
    assert!(totals.connects >= 2, "{totals:?}");
    handle.stop().await.unwrap();
    journal.assert_in_order_at_least_once(keys, per_key);
    drop(second);
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_drain_the_subscriber_finishes_in_flight_gives_back_the_rest_and_moves_on() {
    let db = TestDb::new().await;
    let (port_a, port_b) = (free_port(), free_port());
    let mut first = Server::start_serving(&config_on_port(&db, "", port_a)).await;
    let slow = db.insert("t", Some("k"), b"slow").await;
    let mut untried = vec![db.insert("t", Some("k"), b"k-1").await];
    for i in 0..3 {
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
                }
                Ok::<_, PublishError>(())
            }
        }
    };
    let addresses = [port_a, port_b].map(|port| format!("http://127.0.0.1:{port}"));
    let subscriber = Subscriber::builder(addresses, "orders")
        .concurrency(1)
        .reconnect_backoff(Duration::from_millis(50), Duration::from_millis(500))
        .build(publisher)
        .unwrap();
    let mut events = subscriber.events();
    let handle = subscriber.spawn();
    tokio::time::timeout(DEADLINE, started.notified())
        .await
        .expect("the slow publish did not start");

    first.terminate();
    first.wait_exit(DEADLINE).await;
    assert_eq!(db.row(slow).await, ("done".to_owned(), 1, None));
    for id in &untried {
        assert_eq!(db.row(*id).await, ("pending".to_owned(), 0, None));
    }
    let _second = Server::start_serving(&config_on_port(&db, "", port_b)).await;
    eventually("every message delivered", DEADLINE, || async {
        (db.count("done").await == 5).then_some(())
    })
    .await;
    for id in &untried {
        assert_eq!(
            db.row(*id).await.1,
            1,
            "delivered on the first counted attempt"
        );
    }
    handle.stop().await.unwrap();
    let mut drained = false;
    while let Ok(event) = events.try_recv() {
        drained |= matches!(event, Event::Draining { .. });
    }
    assert!(drained, "no draining event");
    db.drop().await;
}
