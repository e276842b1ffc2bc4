//! The MySQL/MariaDB backend end to end: a real `txoutboxd` process on the machine's
//! MariaDB (a fresh database per test, named by a `mariadb://` URL), producers writing in
//! transactions of their own, several subscribers and two server processes on one table.
//! No notify channel: these outboxes poll.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use txoutbox_tests::journal::{assert_per_key_order, publish_loop, rows, Journal};
use txoutbox_tests::{MariaDb, Server, Subscriber, DEADLINE};

#[tokio::test]
async fn subscriber_receives_in_order_and_acks() {
    let db = MariaDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let a = db.insert("orders.created", Some("order-1"), b"first").await;
    let b = db
        .insert("orders.created", Some("order-1"), b"second")
        .await;
    let c = db.insert("orders.paid", None, b"third").await;

    let mut sub = Subscriber::open(&server, "e2e", 10, 0).await;
    let got = sub.take(3).await;
    assert_eq!(got.iter().map(|m| m.id).collect::<Vec<_>>(), [a, b, c]);
    assert_eq!(got[0].payload, b"first");
    assert_eq!(got[0].key.as_deref(), Some("order-1"));
    assert_eq!(got[2].key, None);
    assert_eq!(
        got[0].headers.get("source").map(String::as_str),
        Some("e2e")
    );
    assert!(got
        .iter()
        .all(|m| m.attempts == 1 && m.created_at.is_some()));

    let settled = sub.ack(&[a, b, c]).await;
    assert_eq!(settled.acked, [a, b, c]);
    assert!(settled.fenced.is_empty());
    assert_eq!(db.count("done").await, 3);
    db.drop().await;
}

#[tokio::test]
async fn nack_retries_with_backoff_then_dead_letters_at_max_attempts() {
    let db = MariaDb::new().await;
    let extra = "max_attempts = 3\nbackoff.base = \"200ms\"\nbackoff.jitter = 0.0";
    let server = Server::start_serving(&db.config(extra)).await;
    let id = db.insert("t", Some("k"), b"poison").await;
    let mut sub = Subscriber::open(&server, "e2e", 10, 0).await;

    for attempt in 1..=2u32 {
        let message = sub.take(1).await.remove(0);
        assert_eq!((message.id, message.attempts), (id, attempt));
        let settled = sub
            .nack(id, &format!("broker said no #{attempt}"), None)
            .await;
        assert_eq!(settled.retried, [id]);
        assert!(settled.retry_at.is_some());
    }
    let message = sub.take(1).await.remove(0);
    assert_eq!(message.attempts, 3);
    let settled = sub.nack(id, "broker said no #3", None).await;
    assert_eq!(settled.dead_lettered, [id]);
    let (status, attempts, error) = db.row(id).await;
    assert_eq!((status.as_str(), attempts), ("dead", 3));
    assert_eq!(error.as_deref(), Some("broker said no #3"));
    assert!(
        sub.nothing_within(Duration::from_millis(600)).await,
        "a dead row was delivered"
    );
    db.drop().await;
}

/// A producer's open transaction does not block the relay (its uncommitted row is skipped,
/// not waited for), the producer can keep inserting while the relay polls (READ COMMITTED
/// claims take no gap locks), and its rows are delivered once committed.
#[tokio::test]
async fn an_open_producer_transaction_neither_blocks_nor_is_blocked() {
    let db = MariaDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let mut producer = db.pool.begin().await.unwrap();
    let late: u64 = sqlx::query("INSERT INTO outbox (topic, payload) VALUES ('t', 'late')")
        .execute(&mut *producer)
        .await
        .unwrap()
        .last_insert_id();
    let early = db.insert("t", None, b"committed").await;

    let mut sub = Subscriber::open(&server, "e2e", 10, 0).await;
    let got = sub.take(1).await;
    assert_eq!(
        got[0].id, early,
        "the committed row, past the uncommitted one"
    );
    // While claims keep polling, the producer can still write and commit.
    let more: u64 = tokio::time::timeout(
        Duration::from_secs(5),
        sqlx::query("INSERT INTO outbox (topic, payload) VALUES ('t', 'more')")
            .execute(&mut *producer),
    )
    .await
    .expect("the producer's insert waited for the relay")
    .unwrap()
    .last_insert_id();
    producer.commit().await.unwrap();
    let got = sub.take(2).await;
    assert_eq!(
        got.iter().map(|m| m.id).collect::<Vec<_>>(),
        [late as i64, more as i64]
    );
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_key_order_holds_with_four_subscribers_and_random_nacks() {
    let (keys, per_key) = (12, 25);
    let db = MariaDb::new().await;
    let server =
        Server::start_serving(&db.config("max_attempts = 1000\nmax_batch_size = 20")).await;
    db.insert_many("t", &rows(keys, per_key)).await;
    let total = keys * per_key as usize;

    let journal = Arc::new(Mutex::new(Journal::default()));
    let mut tasks = Vec::new();
    for i in 0..4 {
        let sub = Subscriber::open(&server, &format!("sub{i}"), 16, 0).await;
        tasks.push(tokio::spawn(publish_loop(
            sub,
            Arc::clone(&journal),
            0.2,
            total,
        )));
    }
    let all = futures::future::join_all(tasks);
    tokio::time::timeout(DEADLINE * 4, all)
        .await
        .expect("drain did not finish in time");
    assert_per_key_order(&journal.lock().unwrap(), keys, per_key);
    assert_eq!(db.count("done").await, total as i64);
    db.drop().await;
}

/// Two server processes claim from one table at once, with no lock between them: rows
/// locked `SKIP LOCKED` and the predecessor check after locking keep leases exclusive
/// and keys in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_server_processes_on_one_table_never_lease_a_row_twice() {
    let (keys, per_key) = (20, 20);
    let db = MariaDb::new().await;
    let config = db.config("max_batch_size = 10");
    let first = Server::start_serving(&config).await;
    let second = Server::start_serving(&config).await;
    db.insert_many("t", &rows(keys, per_key)).await;
    let total = keys * per_key as usize;

    let journal = Arc::new(Mutex::new(Journal::default()));
    let mut tasks = Vec::new();
    for (i, server) in [&first, &second, &first, &second].into_iter().enumerate() {
        let sub = Subscriber::open(server, &format!("sub{i}"), 10, 0).await;
        tasks.push(tokio::spawn(publish_loop(
            sub,
            Arc::clone(&journal),
            0.1,
            total,
        )));
    }
    let all = futures::future::join_all(tasks);
    tokio::time::timeout(DEADLINE * 4, all)
        .await
        .expect("drain did not finish in time");
    assert_per_key_order(&journal.lock().unwrap(), keys, per_key);
    assert_eq!(db.count("done").await, total as i64);
    db.drop().await;
}
