//! The unary storage-style calls, the admin service, health, reflection, and the status
//! codes of bad requests, against a real `txoutboxd` process.

use std::time::Duration;

use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use txoutbox_proto::v1::{self, NackOutcome};
use txoutbox_tests::{eventually, Server, Subscriber, TestDb, DEADLINE};

fn claim(worker: &str, batch_size: u32) -> v1::ClaimRequest {
    v1::ClaimRequest {
        outbox: "orders".into(),
        worker_id: worker.into(),
        batch_size,
        lease_ms: 0,
        topics: vec![],
    }
}

#[tokio::test]
async fn unary_calls_follow_the_storage_contract() {
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("backoff.jitter = 0.0")).await;
    let mut relay = server.relay().await;
    let a = db.insert("t", Some("k"), b"a").await;
    let b = db.insert("t", Some("k"), b"b").await;
    let c = db.insert("u", None, b"c").await;

    let claimed = relay.claim(claim("cron-1", 10)).await.unwrap().into_inner();
    let ids: Vec<i64> = claimed.messages.iter().map(|m| m.id).collect();
    assert_eq!(ids, [a, b, c]);
    assert!(claimed.lease_expires_at.is_some());
    // Leased rows are invisible to another worker.
    assert!(relay
        .claim(claim("cron-2", 10))
        .await
        .unwrap()
        .into_inner()
        .messages
        .is_empty());

    // A stale worker's answers are fenced, never applied.
    let stale = relay
        .ack(v1::AckRequest {
            outbox: "orders".into(),
            worker_id: "cron-2".into(),
            ids: vec![c],
            lease_tokens: Default::default(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((stale.acked, stale.fenced), (vec![], vec![c]));

    let acked = relay
        .ack(v1::AckRequest {
            outbox: "orders".into(),
            worker_id: "cron-1".into(),
            ids: vec![c],
            lease_tokens: Default::default(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(acked.acked, [c]);

    let extended = relay
        .extend_lease(v1::ExtendLeaseRequest {
            outbox: "orders".into(),
            worker_id: "cron-1".into(),
            ids: vec![a, b],
            lease_ms: 120_000,
            lease_tokens: Default::default(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(extended.extended, [a, b]);

    let nacked = relay
        .nack(v1::NackRequest {
            outbox: "orders".into(),
            worker_id: "cron-1".into(),
            id: a,
            error: "timeout".into(),
            retry_delay_ms: Some(0),
            lease_token: Default::default(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(nacked.outcome(), NackOutcome::RetryScheduled);
    assert_eq!(
        nacked.released,
        [b],
        "the rest of the key is given back untried"
    );

    let again = relay
        .claim(claim("cron-3", 10))
        .await
        .unwrap()
        .into_inner()
        .messages;
    assert_eq!(
        again.iter().map(|m| (m.id, m.attempts)).collect::<Vec<_>>(),
        [(a, 2), (b, 1)]
    );

    let dead = relay
        .dead_letter(v1::DeadLetterRequest {
            outbox: "orders".into(),
            worker_id: "cron-3".into(),
            id: a,
            error: "malformed".into(),
            lease_token: Default::default(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(dead.dead_lettered);
    let released = relay
        .release(v1::ReleaseRequest {
            outbox: "orders".into(),
            worker_id: "cron-3".into(),
            ids: vec![b],
            retry_delay_ms: None,
            lease_tokens: Default::default(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(released.released, [b]);
    assert_eq!(db.row(a).await.0, "dead");
    assert_eq!(
        db.row(b).await,
        ("pending".into(), 0, None),
        "both claims refunded"
    );
    db.drop().await;
}

#[tokio::test]
async fn admin_lists_outboxes_reports_stats_and_purges() {
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("max_attempts = 7")).await;
    let mut admin = server.admin().await;
    let list = admin
        .list_outboxes(v1::ListOutboxesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(list.outboxes.len(), 1);
    let orders = &list.outboxes[0];
    assert_eq!(
        (orders.name.as_str(), orders.backend.as_str()),
        ("orders", "postgres")
    );
    assert_eq!(
        (orders.schema.as_str(), orders.max_attempts),
        (db.schema.as_str(), 7)
    );

    let delivered = db.insert("a", None, b"1").await;
    db.insert("a", None, b"2").await;
    db.insert("b", None, b"3").await;
    let mut relay = server.relay().await;
    relay.claim(claim("w", 1)).await.unwrap();
    relay
        .ack(v1::AckRequest {
            outbox: "orders".into(),
            worker_id: "w".into(),
            ids: vec![delivered],
            lease_tokens: Default::default(),
        })
        .await
        .unwrap();

    let stats = admin
        .stats(v1::StatsRequest {
            outbox: "orders".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let total = stats.total.unwrap();
    assert_eq!((total.pending, total.leased, total.dead), (2, 0, 0));
    assert!(total.oldest_pending_age.is_some());
    let topics: Vec<(String, u64)> = stats
        .topics
        .iter()
        .map(|t| (t.topic.clone(), t.pending))
        .collect();
    assert_eq!(topics, [("a".to_owned(), 1), ("b".to_owned(), 1)]);

    let purge = |seconds| v1::PurgeRequest {
        outbox: "orders".into(),
        older_than: Some(prost_types::Duration { seconds, nanos: 0 }),
    };
    assert_eq!(
        admin.purge(purge(3600)).await.unwrap().into_inner().deleted,
        0
    );
    let deleted = eventually("the delivered row to age", DEADLINE, || {
        let mut admin = admin.clone();
        async move {
            let deleted = admin.purge(purge(0).clone()).await;
            // A zero duration is rejected: ask for one second and wait for the row to age.
            assert_eq!(deleted.unwrap_err().code(), Code::InvalidArgument);
            let deleted = admin.purge(purge(1)).await.unwrap().into_inner().deleted;
            (deleted > 0).then_some(deleted)
        }
    })
    .await;
    assert_eq!(deleted, 1);
    assert_eq!(db.count("done").await, 0);
    db.drop().await;
}

#[tokio::test]
async fn bad_requests_get_the_right_status_and_a_message_to_act_on() {
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let mut relay = server.relay().await;

    let unknown = relay
        .claim(v1::ClaimRequest {
            outbox: "billing".into(),
            ..claim("w", 10)
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);
    assert!(
        unknown.message().contains("configured: orders"),
        "{}",
        unknown.message()
    );

    let zero = relay.claim(claim("w", 0)).await.unwrap_err();
    assert_eq!(zero.code(), Code::InvalidArgument);
    let nameless = relay.claim(claim("", 10)).await.unwrap_err();
    assert_eq!(nameless.code(), Code::InvalidArgument);
    assert!(nameless.message().contains("worker_id"));
    let long_lease = relay
        .claim(v1::ClaimRequest {
            lease_ms: 24 * 3600 * 1000,
            ..claim("w", 10)
        })
        .await
        .unwrap_err();
    assert_eq!(long_lease.code(), Code::InvalidArgument);
    assert!(
        long_lease.message().contains("max_lease"),
        "{}",
        long_lease.message()
    );

    let open = |outbox: &str, window: u32| v1::OpenSubscription {
        outbox: outbox.into(),
        subscriber: "s".into(),
        topics: vec![],
        max_in_flight: window,
        lease_ms: 0,
    };
    let status = Subscriber::open_with(&server, open("nope", 10))
        .await
        .err()
        .unwrap();
    assert_eq!(status.code(), Code::NotFound);
    let status = Subscriber::open_with(&server, open("orders", 0))
        .await
        .err()
        .unwrap();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("max_in_flight"));

    // A second `open` on a live stream ends it with INVALID_ARGUMENT.
    let mut sub = Subscriber::open(&server, "s", 10, 0).await;
    sub.send(v1::subscribe_request::Request::Open(open("orders", 10)))
        .await;
    let ended = sub.wait_end(DEADLINE).await.unwrap_err();
    assert_eq!(ended.code(), Code::InvalidArgument);
    db.drop().await;
}

#[tokio::test]
async fn an_unreachable_database_makes_its_outbox_not_serving_and_calls_unavailable() {
    let db = TestDb::new().await;
    // Port 1 on loopback: nothing listens there.
    let config = db
        .config("")
        .replace(&db.url, "postgres://postgres@127.0.0.1:1/test");
    let server = Server::start(&config).await;
    eventually("outbox NOT_SERVING", DEADLINE, || async {
        (server.health("orders").await == ServingStatus::NotServing).then_some(())
    })
    .await;
    assert_eq!(
        server.health("").await,
        ServingStatus::Serving,
        "the server itself is up"
    );
    let mut relay = server.relay().await;
    let status = relay.claim(claim("w", 1)).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(
        status.message().contains("database unreachable"),
        "{}",
        status.message()
    );
    db.drop().await;
}

#[tokio::test]
async fn reflection_lists_the_services() {
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1::ServerReflectionRequest;

    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let mut client = ServerReflectionClient::new(server.channel().await);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut responses = client
        .server_reflection_info(futures::stream::iter([request]))
        .await
        .unwrap()
        .into_inner();
    let response = tokio::time::timeout(Duration::from_secs(10), responses.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = response.message_response else {
        panic!("unexpected reflection response");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for expected in [
        "txoutbox.v1.Relay",
        "txoutbox.v1.Admin",
        "grpc.health.v1.Health",
    ] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} missing from {names:?}"
        );
    }
    db.drop().await;
}
