//! The end-to-end cases every backend runs (see `e2e.rs`): each takes the test's fresh
//! database and runs a real `txoutboxd` on it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use txoutbox_proto::v1::subscribe_request::Request as Req;
use txoutbox_proto::v1::{self};
use txoutbox_tests::journal::{assert_per_key_order, publish_loop, rows, Journal};
use txoutbox_tests::{OutboxDb, Server, Subscriber, DEADLINE};

pub async fn subscriber_receives_in_order_and_acks(db: impl OutboxDb) {
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

pub async fn nack_retries_with_backoff_then_dead_letters_at_max_attempts(db: impl OutboxDb) {
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

pub async fn nack_holds_back_the_rest_of_the_key_and_releases_it_untried(db: impl OutboxDb) {
    let server = Server::start_serving(&db.config("backoff.jitter = 0.0")).await;
    let first = db.insert("t", Some("k"), b"1").await;
    let second = db.insert("t", Some("k"), b"2").await;
    let other = db.insert("t", Some("other"), b"x").await;
    let mut sub = Subscriber::open(&server, "e2e", 10, 0).await;
    assert_eq!(sub.take(3).await.len(), 3);

    let settled = sub.nack(first, "boom", Some(60_000)).await;
    assert_eq!(settled.retried, [first]);
    assert_eq!(
        settled.released,
        [second],
        "the later message of the key is given back"
    );
    sub.ack(&[other]).await;
    let (_, attempts, error) = db.row(second).await;
    assert_eq!(
        (attempts, error),
        (0, None),
        "released untried: attempt refunded, no error"
    );
    // Neither message of key `k` may come back before the retry time.
    assert!(sub.nothing_within(Duration::from_millis(500)).await);
    db.drop().await;
}

pub async fn acks_sent_back_to_back_are_each_confirmed(db: impl OutboxDb) {
    let server = Server::start_serving(&db.config("")).await;
    let rows: Vec<(Option<String>, Vec<u8>)> = (0..50)
        .map(|i| (Some(format!("k{}", i % 5)), vec![i as u8]))
        .collect();
    let ids = db.insert_many("t", &rows).await;
    let mut sub = Subscriber::open(&server, "e2e", 50, 0).await;
    let got = sub.take(50).await;
    assert_eq!(got.iter().map(|m| m.id).collect::<Vec<_>>(), ids);
    // One answer per message without waiting: the server may apply them together, but
    // confirms each answer on its own, in order.
    for id in &ids {
        sub.send(Req::Ack(v1::AckMessages {
            ids: vec![*id],
            lease_tokens: Default::default(),
        }))
        .await;
    }
    // A stale id among them is reported as fenced, in its own confirmation.
    sub.send(Req::Ack(v1::AckMessages {
        ids: vec![ids[0]],
        lease_tokens: Default::default(),
    }))
    .await;
    let settled = tokio::time::timeout(DEADLINE, async {
        while sub.settled.len() < ids.len() + 1 {
            assert!(sub.pump().await.unwrap(), "stream ended");
        }
        sub.settled.drain(..).collect::<Vec<_>>()
    })
    .await
    .expect("confirmations in time");
    for (settled, id) in settled.iter().zip(&ids) {
        assert_eq!(settled.acked, [*id]);
    }
    assert_eq!(settled.last().unwrap().fenced, [ids[0]]);
    assert_eq!(db.count("done").await, 50);
    db.drop().await;
}

pub async fn a_zero_window_stops_batches_until_reopened(db: impl OutboxDb) {
    let server = Server::start_serving(&db.config("")).await;
    let mut sub = Subscriber::open(&server, "e2e", 10, 0).await;
    let settled = sub
        .answer(Req::SetWindow(v1::SetWindow { max_in_flight: 0 }))
        .await;
    assert_eq!(settled, v1::Settled::default());
    let id = db.insert("t", None, b"held back").await;
    assert!(
        sub.nothing_within(Duration::from_millis(500)).await,
        "a batch despite window 0"
    );
    sub.answer(Req::SetWindow(v1::SetWindow { max_in_flight: 10 }))
        .await;
    assert_eq!(sub.take(1).await[0].id, id);
    db.drop().await;
}

pub async fn per_key_order_holds_with_four_subscribers_and_random_nacks(db: impl OutboxDb) {
    let server =
        Server::start_serving(&db.config("max_attempts = 1000\nmax_batch_size = 20")).await;
    drain_in_key_order(db, [&server; 4], 16, 0.2).await;
}

pub async fn two_server_processes_on_one_table_never_lease_a_row_twice(db: impl OutboxDb) {
    let config = db.config("max_batch_size = 10");
    let first = Server::start_serving(&config).await;
    let second = Server::start_serving(&config).await;
    drain_in_key_order(db, [&first, &second, &first, &second], 10, 0.1).await;
}

/// Inserts 12 keys × 25 rows, drains them through one subscriber per entry of `servers`
/// (window `window`, failing a `nack_rate` share of attempts at random), and checks that
/// each key was published in order and every row ended `done`.
async fn drain_in_key_order(db: impl OutboxDb, servers: [&Server; 4], window: u32, nack_rate: f64) {
    let (keys, per_key) = (12, 25);
    db.insert_many("t", &rows(keys, per_key)).await;
    let total = keys * per_key as usize;

    let journal = Arc::new(Mutex::new(Journal::default()));
    let mut tasks = Vec::new();
    for (i, server) in servers.into_iter().enumerate() {
        let sub = Subscriber::open(server, &format!("sub{i}"), window, 0).await;
        tasks.push(tokio::spawn(publish_loop(
            sub,
            Arc::clone(&journal),
            nack_rate,
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

/// With `server.max_message_bytes` at its least (64 KiB): a row larger than that is not
/// handed out but dead-lettered, read by the claim without its payload (the database
/// measured it); a dead-letter page ends early when the next row would not fit, says so
/// and continues from `next_after_id`; the oversized row is listed without its payload,
/// with its stored size.
pub async fn rows_and_dead_letter_pages_stay_within_max_message_bytes(db: impl OutboxDb) {
    let config = db.config("max_attempts = 1");
    let config = config.replacen("[server]\n", "[server]\nmax_message_bytes = 65536\n", 1);
    assert!(config.contains("max_message_bytes"), "{config}");
    let server = Server::start_serving(&config).await;
    let huge = db.insert("t", None, &vec![b'h'; 100_000]).await;
    let mut rows = Vec::new();
    for n in 0..3u8 {
        rows.push(db.insert("t", None, &vec![b'a' + n; 30_000]).await);
    }
    let mut sub = Subscriber::open(&server, "e2e", 10, 0).await;
    let got = sub.take(3).await;
    assert_eq!(got.iter().map(|m| m.id).collect::<Vec<_>>(), rows);
    for id in &rows {
        assert!(!sub
            .nack(*id, "into the dead letters", None)
            .await
            .dead_lettered
            .is_empty());
    }
    let (status, _, error) = db.row(huge).await;
    assert_eq!(status, "dead");
    assert!(
        error
            .as_deref()
            .unwrap_or_default()
            .contains("max_message_bytes"),
        "{error:?}"
    );

    let admin = server.admin().await;
    let list = |after_id| {
        let request = v1::ListDeadLettersRequest {
            outbox: "orders".into(),
            selector: None,
            after_id,
            limit: 10,
        };
        let mut admin = admin.clone();
        async move { admin.list_dead_letters(request).await.unwrap().into_inner() }
    };
    let first = list(0).await;
    let ids: Vec<i64> = first.dead_letters.iter().map(|d| d.id).collect();
    assert_eq!(ids, [huge, rows[0], rows[1]], "the third does not fit");
    assert!(first.truncated);
    assert_eq!(first.next_after_id, rows[1]);
    let omitted = &first.dead_letters[0];
    assert!(omitted.payload_omitted && omitted.payload.is_empty());
    assert!(
        (100_000..100_200).contains(&omitted.stored_bytes),
        "{}",
        omitted.stored_bytes
    );
    assert_eq!(first.dead_letters[1].payload, vec![b'a'; 30_000]);
    assert!(!first.dead_letters[1].payload_omitted);
    let second = list(first.next_after_id).await;
    assert_eq!(
        second.dead_letters.iter().map(|d| d.id).collect::<Vec<_>>(),
        [rows[2]]
    );
    assert!(!second.truncated);
    assert_eq!(second.next_after_id, 0);
    db.drop().await;
}
