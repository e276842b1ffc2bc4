//! Per-key order and exclusive leases under concurrency: several subscribers with random
//! failures, and two server processes sharing one table.

use std::sync::{Arc, Mutex};

use txoutbox_tests::journal::{assert_per_key_order, publish_loop, rows, Journal};
use txoutbox_tests::{Server, Subscriber, TestDb, DEADLINE};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_key_order_holds_with_four_subscribers_and_random_nacks() {
    let (keys, per_key) = (12, 25);
    let db = TestDb::new().await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_server_processes_on_one_table_never_lease_a_row_twice() {
    let (keys, per_key) = (20, 20);
    let db = TestDb::new().await;
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
