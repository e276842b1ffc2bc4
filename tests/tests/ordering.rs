//! Per-key order and exclusive leases under concurrency: several subscribers with random
//! failures, and two server processes sharing one table.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};

use rand::Rng;
use txoutbox_tests::{Server, Subscriber, TestDb, DEADLINE};

/// What a publisher saw, in the order things happened (across every subscriber).
#[derive(Default)]
struct Journal {
    /// (key, sequence number within the key) of each successful publish.
    published: Vec<(String, u32)>,
    /// Ids handed to some subscriber and not yet answered: must never hold an id twice.
    outstanding: HashSet<i64>,
    double_leases: Vec<i64>,
}

/// Payloads are `key:seq`.
fn parse(payload: &[u8]) -> (String, u32) {
    let text = std::str::from_utf8(payload).unwrap();
    let (key, seq) = text.rsplit_once(':').unwrap();
    (key.to_owned(), seq.parse().unwrap())
}

/// Publishes sequentially what arrives, failing at random; stops once `done` reaches
/// `total` successful publishes across all subscribers.
async fn publish_loop(
    mut sub: Subscriber,
    journal: Arc<Mutex<Journal>>,
    failure_rate: f64,
    total: usize,
) {
    let mut released: HashSet<i64> = HashSet::new();
    loop {
        if journal.lock().unwrap().published.len() >= total {
            return;
        }
        let Ok(batch) =
            tokio::time::timeout(std::time::Duration::from_millis(200), sub.take(1)).await
        else {
            continue;
        };
        for message in batch {
            {
                let mut journal = journal.lock().unwrap();
                if !journal.outstanding.insert(message.id) {
                    journal.double_leases.push(message.id);
                }
            }
            if released.remove(&message.id) {
                journal.lock().unwrap().outstanding.remove(&message.id);
                continue;
            }
            let fail = rand::rng().random_bool(failure_rate);
            if fail {
                let settled = sub.nack(message.id, "injected failure", Some(300)).await;
                let mut journal = journal.lock().unwrap();
                journal.outstanding.remove(&message.id);
                for id in settled.released {
                    journal.outstanding.remove(&id);
                    released.insert(id);
                }
            } else {
                let (key, seq) = parse(&message.payload);
                // Record before acking: the publish happened before the answer.
                journal.lock().unwrap().published.push((key, seq));
                let settled = sub.ack(&[message.id]).await;
                assert_eq!(settled.acked, [message.id], "ack fenced: lease was lost");
                journal.lock().unwrap().outstanding.remove(&message.id);
            }
        }
    }
}

fn assert_per_key_order(journal: &Journal, keys: usize, per_key: u32) {
    assert!(
        journal.double_leases.is_empty(),
        "leased twice at once: {:?}",
        journal.double_leases
    );
    let mut by_key: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
    for (key, seq) in &journal.published {
        by_key.entry(key).or_default().push(*seq);
    }
    assert_eq!(by_key.len(), keys);
    for (key, seqs) in by_key {
        let expected: Vec<u32> = (0..per_key).collect();
        assert_eq!(seqs, expected, "key {key} published out of order or twice");
    }
}

fn rows(keys: usize, per_key: u32) -> Vec<(Option<String>, Vec<u8>)> {
    // Interleaved: k0:0, k1:0, ..., k0:1, k1:1, ...
    (0..per_key)
        .flat_map(|seq| {
            (0..keys).map(move |k| (Some(format!("k{k}")), format!("k{k}:{seq}").into_bytes()))
        })
        .collect()
}

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
