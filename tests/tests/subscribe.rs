//! Streaming delivery on PostgreSQL beyond the cases every backend runs (`e2e.rs`):
//! wake-ups on insert (LISTEN/NOTIFY), a killed subscriber, and the drain on SIGTERM.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use txoutbox_proto::v1::subscribe_request::Request as Req;
use txoutbox_proto::v1::{self};
use txoutbox_tests::{Server, Subscriber, TestDb, DEADLINE};

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
        lease_tokens: Default::default(),
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
