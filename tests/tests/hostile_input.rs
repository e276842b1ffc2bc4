//! Bad input from careless or hostile callers, against a real
//! `txoutboxd`: every bad string, name, request, answer, URL and duration gets the right
//! status with a message that says what to change, before any SQL, and loses nothing.

use std::collections::HashMap;
use std::time::Duration;

use prost::bytes::{Buf, BufMut};
use prost::Message as _;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::{Code, Status};
use tonic_health::pb::health_check_response::ServingStatus;
use txoutbox_proto::v1::subscribe_request::Request as Req;
use txoutbox_proto::v1::{self};
use txoutbox_tests::server::run_to_exit;
use txoutbox_tests::{eventually, MariaDb, Server, SqliteDb, Subscriber, TestDb, DEADLINE};

fn claim(worker: &str, batch_size: u32) -> v1::ClaimRequest {
    v1::ClaimRequest {
        outbox: "orders".into(),
        worker_id: worker.into(),
        batch_size,
        lease_ms: 0,
        topics: vec![],
    }
}

fn insert(topic: &str, key: Option<&str>, headers: &[(&str, &str)]) -> v1::InsertMessageRequest {
    v1::InsertMessageRequest {
        outbox: "orders".into(),
        topic: topic.into(),
        key: key.map(str::to_owned),
        payload: b"{}".to_vec(),
        headers: headers
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect::<HashMap<_, _>>(),
    }
}

fn open(subscriber: &str, topics: &[&str]) -> v1::OpenSubscription {
    v1::OpenSubscription {
        group: String::new(),
        outbox: "orders".into(),
        subscriber: subscriber.into(),
        topics: topics.iter().map(|t| (*t).to_owned()).collect(),
        max_in_flight: 10,
        lease_ms: 0,
    }
}

fn assert_invalid(field: &str, result: Result<impl std::fmt::Debug, Status>) {
    let status = result.expect_err(field);
    assert_eq!(status.code(), Code::InvalidArgument, "{field}: {status:?}");
    assert!(
        status.message().contains(field),
        "{field} not named: {}",
        status.message()
    );
}

/// Case 6: a NUL reached PostgreSQL and came back INTERNAL.
#[tokio::test]
async fn nul_characters_are_invalid_arguments_naming_the_field() {
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let mut relay = server.relay().await;
    let mut admin = server.admin().await;
    let id = db.insert("t", Some("k"), b"x").await;
    let held = relay.claim(claim("w", 10)).await.unwrap().into_inner();
    assert_eq!(held.messages.len(), 1);

    assert_invalid("worker_id", relay.claim(claim("w\0", 1)).await);
    let filter = v1::ClaimRequest {
        topics: vec!["t\0".into()],
        ..claim("w2", 1)
    };
    assert_invalid("topic", relay.claim(filter).await);
    let ack = v1::AckRequest {
        outbox: "orders".into(),
        worker_id: "w\0".into(),
        ids: vec![id],
        lease_tokens: Default::default(),
    };
    assert_invalid("worker_id", relay.ack(ack).await);
    let nack = v1::NackRequest {
        outbox: "orders".into(),
        worker_id: "w".into(),
        id,
        error: "broker said \0".into(),
        retry_delay_ms: None,
        lease_token: Default::default(),
    };
    assert_invalid("error", relay.nack(nack).await);
    let dead = v1::DeadLetterRequest {
        outbox: "orders".into(),
        worker_id: "w".into(),
        id,
        error: "\0".into(),
        lease_token: Default::default(),
    };
    assert_invalid("error", relay.dead_letter(dead).await);
    assert_invalid(
        "topic",
        admin.insert_message(insert("a\0b", None, &[])).await,
    );
    assert_invalid(
        "key",
        admin.insert_message(insert("t", Some("k\0"), &[])).await,
    );
    assert_invalid(
        "header",
        admin
            .insert_message(insert("t", None, &[("a\0", "v")]))
            .await,
    );
    assert_invalid(
        "header",
        admin
            .insert_message(insert("t", None, &[("a", "v\0")]))
            .await,
    );
    let status = Subscriber::open_with(&server, open("s\0", &[])).await;
    assert_invalid("subscriber", status.map(|_| ()));
    let status = Subscriber::open_with(&server, open("s", &["t\0"])).await;
    assert_invalid("topic", status.map(|_| ()));

    // Nothing was lost: the row is still held by `w`, untouched, and nothing was added.
    assert_eq!(db.row(id).await, ("pending".into(), 1, None));
    assert_eq!(db.count("pending").await, 1);
    db.drop().await;
}

/// Case 7: keys over about 2,700 bytes failed inside a btree index, INTERNAL, for
/// producers too.
#[tokio::test]
async fn keys_longer_than_255_characters_are_refused_by_the_relay_and_by_the_table() {
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let mut admin = server.admin().await;
    let longest = "é".repeat(255);
    let id = admin
        .insert_message(insert("t", Some(&longest), &[]))
        .await
        .unwrap()
        .into_inner()
        .id;
    let status = admin
        .insert_message(insert("t", Some(&"k".repeat(256)), &[]))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("255"), "{}", status.message());
    let topic = admin
        .insert_message(insert(&"t".repeat(256), None, &[]))
        .await
        .unwrap_err();
    assert_eq!(topic.code(), Code::InvalidArgument, "{topic:?}");

    // A producer's own INSERT meets the table's CHECK, not the index's limit.
    let error = sqlx::query(&format!(
        "INSERT INTO {}.outbox (topic, key, payload) VALUES ('t', $1, '')",
        db.schema
    ))
    .bind("k".repeat(3000))
    .execute(&db.pool)
    .await
    .unwrap_err();
    let code = error.as_database_error().and_then(|e| e.code());
    assert_eq!(code.as_deref(), Some("23514"), "{error}");

    let mut sub = Subscriber::open(&server, "s", 10, 0).await;
    let got = sub.take(1).await;
    assert_eq!((got[0].id, got[0].key.as_deref()), (id, Some(&*longest)));
    db.drop().await;
}

/// Case 7 on MariaDB and SQLite: the relay checks the same limit before SQL.
#[tokio::test]
async fn keys_over_the_limit_are_invalid_arguments_on_mariadb_and_sqlite() {
    let maria = MariaDb::new().await;
    let sqlite = SqliteDb::new().await;
    for config in [maria.config(""), sqlite.config("")] {
        let server = Server::start_serving(&config).await;
        let mut admin = server.admin().await;
        let status = admin
            .insert_message(insert("t", Some(&"k".repeat(256)), &[]))
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        admin
            .insert_message(insert("t", Some(&"é".repeat(255)), &[]))
            .await
            .unwrap();
    }
    // SQLite's table enforces the limit on producers too.
    let error = sqlx::query("INSERT INTO outbox (topic, key, payload) VALUES ('t', ?, x'')")
        .bind("k".repeat(256))
        .execute(sqlite.pool())
        .await
        .unwrap_err();
    assert!(error.to_string().contains("CHECK"), "{error}");
    maria.drop().await;
    sqlite.drop().await;
}

/// A codec that sends and receives raw bytes, to send what no generated stub would.
#[derive(Debug, Clone, Copy, Default)]
struct Raw;

impl Codec for Raw {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = Raw;
    type Decoder = Raw;
    fn encoder(&mut self) -> Raw {
        Raw
    }
    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl Encoder for Raw {
    type Item = Vec<u8>;
    type Error = Status;
    fn encode(&mut self, item: Vec<u8>, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        buf.put_slice(&item);
        Ok(())
    }
}

impl Decoder for Raw {
    type Item = Vec<u8>;
    type Error = Status;
    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        Ok(Some(buf.copy_to_bytes(buf.remaining()).to_vec()))
    }
}

/// Case 8: undecodable requests were INTERNAL.
#[tokio::test]
async fn undecodable_requests_are_invalid_arguments() {
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let mut grpc = tonic::client::Grpc::new(server.channel().await);
    let claim_path = PathAndQuery::from_static("/txoutbox.v1.Relay/Claim");
    // Field 1 (outbox) holding bytes that are not UTF-8; then plain garbage.
    for body in [vec![0x0a, 0x02, 0xff, 0xfe], vec![0xff; 12]] {
        grpc.ready().await.unwrap();
        let status = grpc
            .unary(tonic::Request::new(body), claim_path.clone(), Raw)
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains("decoded"), "{}", status.message());
    }

    // On Subscribe: a valid `open`, then a nack whose error is not UTF-8.
    let open = v1::SubscribeRequest {
        request: Some(Req::Open(open("s", &[]))),
    }
    .encode_to_vec();
    let bad_nack = vec![0x1a, 0x05, 0x08, 0x01, 0x12, 0x01, 0xff];
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(open).await.unwrap();
    grpc.ready().await.unwrap();
    let subscribe = PathAndQuery::from_static("/txoutbox.v1.Relay/Subscribe");
    let mut responses = grpc
        .streaming(
            tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx)),
            subscribe,
            Raw,
        )
        .await
        .unwrap()
        .into_inner();
    assert!(responses.message().await.unwrap().is_some(), "subscribed");
    tx.send(bad_nack).await.unwrap();
    let end = tokio::time::timeout(DEADLINE, async {
        loop {
            match responses.message().await {
                Ok(Some(_)) => continue,
                Ok(None) => return None,
                Err(status) => return Some(status),
            }
        }
    })
    .await
    .expect("the stream ended");
    let status = end.expect("ended with a status");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    db.drop().await;
}

/// Case 9: a missing role, a missing database, a database not accepting connections were
/// INTERNAL, and the NOT_SERVING log line dropped the cause.
#[tokio::test]
async fn connection_refusals_are_unavailable_with_their_cause() {
    let db = TestDb::new().await;
    let closed = format!("closed_{}", &db.schema[4..]);
    sqlx::query(&format!("CREATE DATABASE {closed}"))
        .execute(&db.pool)
        .await
        .unwrap();
    sqlx::query(&format!("ALTER DATABASE {closed} ALLOW_CONNECTIONS false"))
        .execute(&db.pool)
        .await
        .unwrap();
    let cases = [
        (
            "postgres://no_such_role_9f@127.0.0.1:5432/test".to_owned(),
            "no_such_role_9f",
        ),
        (
            "postgres://postgres@127.0.0.1:5432/no_such_db_9f".to_owned(),
            "no_such_db_9f",
        ),
        (
            format!("postgres://postgres@127.0.0.1:5432/{closed}"),
            "not currently accepting connections",
        ),
    ];
    for (url, cause) in cases {
        let config = db.config("").replace(&db.url, &url);
        let server = Server::start(&config).await;
        eventually("outbox NOT_SERVING", DEADLINE, || async {
            (server.health("orders").await == ServingStatus::NotServing).then_some(())
        })
        .await;
        let status = server.relay().await.claim(claim("w", 1)).await.unwrap_err();
        assert_eq!(status.code(), Code::Unavailable, "{url}: {status:?}");
        assert!(status.message().contains(cause), "{}", status.message());
        let not_serving = server.wait_for_log("outbox is not serving").await;
        assert!(
            not_serving.contains(cause),
            "the NOT_SERVING line names {cause:?}: {not_serving}"
        );
    }
    sqlx::query(&format!("DROP DATABASE {closed}"))
        .execute(&db.pool)
        .await
        .unwrap();
    db.drop().await;
}

/// Case 9: the NOT_SERVING line printed only the outer context of an unexpected error.
#[tokio::test]
async fn the_not_serving_line_carries_the_whole_cause() {
    let db = TestDb::new().await;
    let role = format!("nopriv_{}", &db.schema[4..]);
    sqlx::query(&format!("CREATE ROLE {role} LOGIN"))
        .execute(&db.pool)
        .await
        .unwrap();
    let url = db.url.replacen("postgres@", &format!("{role}@"), 1);
    let server = Server::start(&db.config("").replace(&db.url, &url)).await;
    server
        .wait_for_log_line("a NOT_SERVING line with the cause", |line| {
            line.contains("outbox is not serving") && line.contains("permission denied")
        })
        .await;
    let mut server = server;
    server.kill();
    server.wait_exit(DEADLINE).await;
    sqlx::query(&format!("DROP ROLE {role}"))
        .execute(&db.pool)
        .await
        .unwrap();
    db.drop().await;
}

/// Case 9 on MariaDB: a wrong password and a missing database.
#[tokio::test]
async fn mariadb_refusals_are_unavailable_with_their_cause() {
    let maria = MariaDb::new().await;
    let wrong_password = maria.url.replacen("root@", "root:wrong@", 1);
    let (base, _) = maria.url.rsplit_once('/').unwrap();
    let missing_database = format!("{base}/no_such_db_9f");
    for (url, cause) in [
        (wrong_password, "Access denied"),
        (missing_database, "no_such_db_9f"),
    ] {
        let config = maria.config("").replace(&maria.url, &url);
        let server = Server::start(&config).await;
        let status = server.relay().await.claim(claim("w", 1)).await.unwrap_err();
        assert_eq!(status.code(), Code::Unavailable, "{url}: {status:?}");
        assert!(status.message().contains(cause), "{}", status.message());
    }
    maria.drop().await;
}

/// Case 9: a read-only SQLite file stayed SERVING while every write failed INTERNAL.
#[tokio::test]
async fn a_read_only_sqlite_file_is_not_serving_and_writes_name_the_file() {
    let sqlite = SqliteDb::new().await;
    // A first server creates the table; the second opens the file read-only.
    drop(Server::start_serving(&sqlite.config("")).await);
    let id = sqlite.insert("t", None, b"x").await;
    let config = sqlite.config("").replace(".db\"", ".db?mode=ro\"");
    assert!(config.contains("mode=ro"), "{config}");
    let server = Server::start(&config).await;
    eventually("outbox NOT_SERVING", DEADLINE, || async {
        (server.health("orders").await == ServingStatus::NotServing).then_some(())
    })
    .await;
    let status = server.relay().await.claim(claim("w", 1)).await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert!(status.message().contains(".db"), "{}", status.message());
    assert!(
        status.message().contains("read-only"),
        "{}",
        status.message()
    );
    assert_eq!(sqlite.row(id).await, ("pending".into(), 0, None));
    sqlite.drop().await;
}

/// Case 10: the unknown-outbox message echoed a 1 MB name; names with newlines forged
/// log lines.
#[tokio::test]
async fn echoed_names_are_bounded_and_names_cannot_carry_control_characters() {
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let mut relay = server.relay().await;
    let huge = v1::ClaimRequest {
        outbox: "x".repeat(1 << 20),
        ..claim("w", 1)
    };
    let status = relay.claim(huge).await.unwrap_err();
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    assert!(
        status.message().len() < 300,
        "{} bytes",
        status.message().len()
    );
    assert!(status.message().contains("configured: orders"));

    let forged = "s\n2030-01-01T00:00:00Z ERROR forged line";
    let status = Subscriber::open_with(&server, open(forged, &[])).await;
    assert_invalid("subscriber", status.map(|_| ()));
    assert_invalid("worker_id", relay.claim(claim("w\r\nx", 1)).await);
    // A stream opened after them, and its line waited for: whatever the refused calls
    // logged is in by then, so the absence below is not read too early.
    let _after = Subscriber::open_with(&server, open("after-the-forgeries", &[]))
        .await
        .unwrap();
    server.wait_for_log("after-the-forgeries").await;
    assert!(!server.log_contains("forged line"));
    db.drop().await;
}

/// Case 11: a bad answer ended the whole stream and gave back everything it held.
#[tokio::test]
async fn a_bad_answer_is_rejected_alone_and_the_stream_goes_on() {
    let db = TestDb::new().await;
    // A release of an hour is longer than backoff.maximum (5m): accepted now.
    let server = Server::start_serving(&db.config("")).await;
    let a = db.insert("t", None, b"a").await;
    let b = db.insert("t", None, b"b").await;
    let mut sub = Subscriber::open(&server, "s", 10, 0).await;
    assert_eq!(sub.take(2).await.len(), 2);

    let week = 7 * 24 * 3600 * 1000;
    let too_far = sub
        .answer(Req::Release(v1::ReleaseMessages {
            ids: vec![a],
            retry_delay_ms: Some(week + 1),
            lease_tokens: Default::default(),
        }))
        .await;
    let rejected = too_far.rejected.expect("rejected");
    assert_eq!(rejected.ids, [a]);
    assert!(rejected.reason.contains("7d"), "{}", rejected.reason);
    let too_long = sub
        .answer(Req::ExtendLease(v1::ExtendLeases {
            ids: vec![a, b],
            lease_ms: 24 * 3600 * 1000,
            lease_tokens: Default::default(),
        }))
        .await;
    assert_eq!(too_long.rejected.expect("rejected").ids, [a, b]);
    let window = sub
        .answer(Req::SetWindow(v1::SetWindow {
            max_in_flight: 20_000,
        }))
        .await;
    assert!(window.rejected.expect("rejected").reason.contains("10000"));
    let nul = sub.nack(b, "\0", None).await;
    assert_eq!(nul.rejected.expect("rejected").ids, [b]);

    // The stream goes on, holding both rows.
    assert_eq!(sub.ack(&[b]).await.acked, [b]);
    let hour = sub
        .answer(Req::Release(v1::ReleaseMessages {
            ids: vec![a],
            retry_delay_ms: Some(3600 * 1000),
            lease_tokens: Default::default(),
        }))
        .await;
    assert_eq!((hour.released, hour.rejected), (vec![a], None));
    assert_eq!(db.row(a).await, ("pending".into(), 0, None), "untried");
    assert!(sub.nothing_within(Duration::from_millis(500)).await);
    db.drop().await;
}

/// Case 12: `check-config` passed URLs that `run` refused, zero intervals, and durations
/// that overflow.
/// Case 6: a stream whose claims fail for the caller's reason, which no retry heals,
/// retried them forever. Here the table's `leased_by` is too short for this subscriber's
/// owner name (subscriber, colon, 32 hex digits): its stream ends INVALID_ARGUMENT with
/// the database's reason, while a subscriber with a shorter name gets the row.
#[tokio::test]
async fn a_stream_whose_claims_fail_for_its_own_reason_ends_with_that_status() {
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    // 40 characters: room for a subscriber name of at most 7.
    sqlx::query(&format!(
        "ALTER TABLE {}.outbox ALTER COLUMN leased_by TYPE varchar(40)",
        db.schema
    ))
    .execute(&db.pool)
    .await
    .unwrap();
    let id = db.insert("t", None, b"x").await;
    let mut long = Subscriber::open(&server, "a-subscriber-with-a-long-name", 10, 0).await;
    let ended = tokio::time::timeout(DEADLINE, async {
        loop {
            match long.pump().await {
                Ok(true) => {}
                Ok(false) => panic!("the stream ended without a status"),
                Err(status) => return status,
            }
        }
    })
    .await
    .expect("the stream ends instead of retrying");
    assert_eq!(ended.code(), Code::InvalidArgument, "{ended:?}");
    assert!(ended.message().contains("too long"), "{ended:?}");
    let mut short = Subscriber::open(&server, "short", 10, 0).await;
    assert_eq!(short.take(1).await[0].id, id);
    db.drop().await;
}

#[tokio::test]
async fn check_config_parses_urls_and_bounds_every_duration() {
    let base = |url: &str, server: &str, outbox: &str| {
        format!(
            "[server]\n{server}\n[databases.main]\nurl = \"{url}\"\n\
             [outboxes.orders]\ndatabase = \"main\"\n{outbox}\n"
        )
    };
    let pg = "postgres://postgres@127.0.0.1:5432/test";
    let cases = [
        (
            base("postgres://u@h:notaport/db", "", ""),
            "databases.main.url",
        ),
        (
            base("mysql://root@127.0.0.1:99999/db", "", ""),
            "databases.main.url",
        ),
        (
            base(pg, "health_interval = \"0s\"", ""),
            "server.health_interval",
        ),
        (base(pg, "", "lease = \"3650d\""), "outboxes.orders.lease"),
        (
            base(pg, "", "max_lease = \"100000d\""),
            "outboxes.orders.max_lease",
        ),
        (
            base(pg, "", "poll.max = \"100000000d\""),
            "outboxes.orders.poll",
        ),
        (
            base(pg, "", "visibility_delay = \"30d\""),
            "outboxes.orders.visibility_delay",
        ),
        (base(pg, "", "lease = \"10ms\""), "outboxes.orders.lease"),
        (
            base(pg, "max_message_bytes = 1024", ""),
            "server.max_message_bytes",
        ),
    ];
    for (config, key) in cases {
        let output = run_to_exit(&config, &["check-config"]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{key} accepted:\n{config}");
        assert!(stderr.contains(key), "{key} not named:\n{stderr}");
    }
    let fine = run_to_exit(&base(pg, "", ""), &["check-config"]);
    assert!(fine.status.success(), "{fine:?}");
}
