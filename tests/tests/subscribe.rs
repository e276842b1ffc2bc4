//! Streaming delivery against a real `txoutboxd` process: receive and ack, retries and
//! dead-lettering, wake-ups on insert, a killed subscriber, and the drain on SIGTERM.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use txoutbox_proto::v1::subscribe_request::Request as Req;
use txoutbox_proto::v1::{self};
use txoutbox_tests::{Server, Subscriber, TestDb, DEADLINE};

#[tokio::test]
async fn subscriber_receives_in_order_and_acks() {
    let db = TestDb::new().await;
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
    let db = TestDb::new().await;
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

#[tokio::test]
async fn nack_holds_back_the_rest_of_the_key_and_releases_it_untried() {
    let db = TestDb::new().await;
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

#[tokio::test]
async fn an_insert_wakes_an_idle_subscriber_without_waiting_for_the_poll() {
    let db = TestDb::new().await;
    // Polling alone would take a minute to notice the row; NOTIFY must do it at once.
    let extra = "poll.min = \"60s\"\npoll.max = \"60s\"";
    let server = Server::start_serving(&db.config(extra)).await;
    let mut sub = Subscriber::open(&server, "e2e", 10, 0).await;
    assert!(sub.nothing_within(Duration::from_millis(300)).await);
    let id = db.insert("t", None, b"wake up").await;
    let got = sub.take_within(1, Duration::from_secs(20)).await;
    assert_eq!(got[0].id, id);
    db.drop().await;
}

#[tokio::test]
async fn a_killed_subscribers_messages_go_to_another_at_once_not_after_the_lease() {
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    // One statement: all three rows are committed before the holder's first claim (rows
    // of one key inserted concurrently could commit after it and then, correctly, wait
    // behind the held ones).
    let rows: Vec<(Option<String>, Vec<u8>)> = (0..3)
        .map(|i| (Some("k".to_owned()), format!("{i}").into_bytes()))
        .collect();
    let ids = db.insert_many("t", &rows).await;

    // A separate process holds the messages under a ten-minute lease, then is killed.
    let mut holder = tokio::process::Command::new(env!("CARGO_BIN_EXE_hold-subscriber"))
        .args([server.url(), "orders".into(), "10".into(), "600000".into()])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(holder.stdout.take().unwrap()).lines();
    let mut held = Vec::new();
    while held.len() < 3 {
        let line = tokio::time::timeout(DEADLINE, lines.next_line())
            .await
            .unwrap()
            .unwrap();
        held.push(line.expect("holder exited early").parse::<i64>().unwrap());
    }
    assert_eq!(held, ids);
    holder.start_kill().unwrap();
    holder.wait().await.unwrap();

    let mut sub = Subscriber::open(&server, "rescuer", 10, 0).await;
    let got = sub.take(3).await;
    assert_eq!(
        got.iter().map(|m| m.id).collect::<Vec<_>>(),
        ids,
        "same order, same key"
    );
    assert!(
        got.iter().all(|m| m.attempts == 2),
        "the killed subscriber's attempt stays counted"
    );
    sub.ack(&ids).await;
    db.drop().await;
}

#[tokio::test]
async fn sigterm_drains_answers_in_flight_and_exits_zero() {
    let db = TestDb::new().await;
    let mut server = Server::start_serving(&db.config("")).await;
    let a = db.insert("t", None, b"a").await;
    let b = db.insert("t", None, b"b").await;
    let mut sub = Subscriber::open(&server, "e2e", 10, 0).await;
    assert_eq!(sub.take(2).await.len(), 2);

    server.terminate();
    while !sub.draining {
        assert!(
            sub.pump().await.unwrap(),
            "stream ended before the draining notice"
        );
    }
    // New messages are not handed out during the drain.
    let late = db.insert("t", None, b"late").await;
    let settled = sub.ack(&[a]).await;
    assert_eq!(settled.acked, [a]);
    sub.answer(Req::Release(v1::ReleaseMessages {
        ids: vec![b],
        retry_delay_ms: None,
    }))
    .await;
    sub.wait_end(DEADLINE).await.unwrap();
    assert!(sub.inbox.is_empty(), "a batch was sent while draining");
    assert!(server.wait_exit(DEADLINE).await.success());

    assert_eq!(db.row(a).await.0, "done");
    assert_eq!(
        db.row(b).await,
        ("pending".into(), 0, None),
        "released untried"
    );
    assert_eq!(db.row(late).await.1, 0, "never claimed");
    db.drop().await;
}

#[tokio::test]
async fn drain_timeout_gives_back_what_a_silent_subscriber_holds() {
    let db = TestDb::new().await;
    let config = db
        .config("")
        .replace("drain_timeout = \"10s\"", "drain_timeout = \"1s\"");
    let mut server = Server::start_serving(&config).await;
    let id = db.insert("t", None, b"held").await;
    let mut sub = Subscriber::open(&server, "silent", 10, 600_000).await;
    assert_eq!(sub.take(1).await[0].id, id);

    server.terminate();
    assert!(server.wait_exit(DEADLINE).await.success());
    // Given back at once (not after the ten-minute lease), attempt kept.
    let second = Server::start_serving(&db.config("")).await;
    let mut rescuer = Subscriber::open(&second, "rescuer", 10, 0).await;
    let got = rescuer.take(1).await;
    assert_eq!((got[0].id, got[0].attempts), (id, 2));
    db.drop().await;
}

#[tokio::test]
async fn acks_sent_back_to_back_are_each_confirmed() {
    let db = TestDb::new().await;
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
        sub.send(Req::Ack(v1::AckMessages { ids: vec![*id] })).await;
    }
    // A stale id among them is reported as fenced, in its own confirmation.
    sub.send(Req::Ack(v1::AckMessages { ids: vec![ids[0]] }))
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

#[tokio::test]
async fn a_zero_window_stops_batches_until_reopened() {
    let db = TestDb::new().await;
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
