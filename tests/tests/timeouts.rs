//! A database that goes silent (a partition: connections open, no byte passing) behind a
//! black-holing proxy: calls answer UNAVAILABLE within `databases.NAME.acquire_timeout +
//! statement_timeout` instead of hanging, the outbox turns NOT_SERVING, an open stream
//! stays open and, once the link heals, gets every row, none lost.

use std::time::{Duration, Instant};

use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use txoutbox_proto::v1;
use txoutbox_tests::db::database_url;
use txoutbox_tests::pg_link::PgLink;
use txoutbox_tests::{eventually, Server, Subscriber, TcpProxy, TestDb, DEADLINE};

/// `acquire_timeout + statement_timeout` of the test's database.
const CALL_DEADLINE: Duration = Duration::from_millis(1500);

/// `host:port` of a `postgres://` URL.
fn upstream_of(url: &str) -> String {
    let rest = url.split_once("://").unwrap().1;
    let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    host.split('/').next().unwrap().to_owned()
}

/// The test database's configuration at `url`, with a call deadline of 1.5s. A claim
/// sent into the silence is cut short by the deadline but reaches the database when the
/// link heals, and leases its rows to a stream that never sees them: they come back when
/// that lease runs out, hence a short one.
fn config_at(db: &TestDb, url: &str) -> String {
    db.config_at(url, "lease = \"2s\"").replace(
        "max_connections = 8\n",
        "max_connections = 8\nacquire_timeout = \"500ms\"\nstatement_timeout = \"1s\"\n",
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_holed_database_answers_unavailable_within_the_timeout_and_loses_nothing() {
    let db = TestDb::new().await;
    let upstream = upstream_of(&database_url());
    let proxy = TcpProxy::start(&upstream).await;
    let config = config_at(&db, &db.url.replace(&upstream, &proxy.address()));
    let mut server = Server::start_serving(&config).await;
    let mut sub = Subscriber::open(&server, "survivor", 100, 0).await;
    let before = db.insert("t", None, b"before").await;
    let first = sub.take(1).await;
    assert_eq!(first[0].id, before);
    assert_eq!(sub.ack(&[before]).await.acked, [before]);

    proxy.black_hole();
    let mut admin = server.admin().await;
    let started = Instant::now();
    let status = admin
        .stats(v1::StatsRequest {
            outbox: "orders".into(),
        })
        .await
        .expect_err("stats while the database is silent");
    let took = started.elapsed();
    // The pool's check of an idle connection on the silent link ends at the acquire
    // timeout; a statement already sent, at the call deadline (the next test).
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(
        took < CALL_DEADLINE + Duration::from_secs(3),
        "answered after {took:?}, the deadline is {CALL_DEADLINE:?}"
    );
    let mut relay = server.relay().await;
    let started = Instant::now();
    let status = relay
        .claim(v1::ClaimRequest {
            outbox: "orders".into(),
            worker_id: "w1".into(),
            batch_size: 10,
            ..Default::default()
        })
        .await
        .expect_err("claim while the database is silent");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(started.elapsed() < CALL_DEADLINE + Duration::from_secs(3));
    txoutbox_tests::eventually("the outbox to be NOT_SERVING", DEADLINE, || async {
        (server.health("orders").await == ServingStatus::NotServing).then_some(())
    })
    .await;

    // Rows committed while the relay cannot reach the database, then the link heals.
    let mut during = Vec::new();
    for payload in [&b"one"[..], b"two", b"six"] {
        during.push(db.insert("t", None, payload).await);
    }
    proxy.restore();
    server.wait_serving("orders").await;
    let got: Vec<i64> = sub
        .take_within(during.len(), DEADLINE)
        .await
        .iter()
        .map(|m| m.id)
        .collect();
    assert_eq!(got, during, "the stream that stayed open gets every row");
    assert_eq!(sub.ack(&during).await.acked, during);
    assert_eq!(db.count("done").await, 4);
    assert_eq!(db.count("pending").await, 0);

    server.terminate();
    assert!(server.wait_exit(DEADLINE).await.success());
    db.drop().await;
}

/// A statement sent, then silence: neither the pool nor the database can end the call,
/// only the relay's own deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_statement_gets_no_answer_ends_at_the_deadline() {
    let db = TestDb::new().await;
    let link = PgLink::start(&upstream_of(&database_url())).await;
    let server = Server::start_serving(&config_at(&db, &link.url(&db.url))).await;
    link.cut_after(|sql| sql.contains("AS oldest_pending_secs"));
    let mut admin = server.admin().await;
    let started = Instant::now();
    let status = admin
        .stats(v1::StatsRequest {
            outbox: "orders".into(),
        })
        .await
        .expect_err("stats with its statement unanswered");
    let took = started.elapsed();
    assert!(link.is_cut(), "the stats statement was never sent");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(
        status.message().contains(
            "stats: no answer from databases.main within 1s 500ms \
             (databases.main.acquire_timeout + statement_timeout)"
        ),
        "{status:?}"
    );
    assert!(
        took >= CALL_DEADLINE && took < CALL_DEADLINE + Duration::from_secs(3),
        "answered after {took:?}, the deadline is {CALL_DEADLINE:?}"
    );
    db.drop().await;
}

/// An outbox with a subscription group on the same silent database: a group's admin call
/// whose statement gets no answer ends at the same deadline, with the same status and
/// settings named, and once the link heals the group's stream, open all along, gets
/// every row committed meanwhile, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_call_whose_statement_gets_no_answer_ends_at_the_deadline_and_the_group_loses_nothing(
) {
    let db = TestDb::new().await;
    let link = PgLink::start(&upstream_of(&database_url())).await;
    let config = format!(
        "{}partitions = 4\n[outboxes.orders.groups.kafka]\nlease = \"2s\"\n",
        config_at(&db, &link.url(&db.url))
    );
    let server = Server::start_serving(&config).await;
    let mut sub = Subscriber::open_with(
        &server,
        v1::OpenSubscription {
            outbox: "orders".into(),
            subscriber: "grouped".into(),
            max_in_flight: 100,
            group: "kafka".into(),
            ..Default::default()
        },
    )
    .await
    .expect("join the group");
    let before = db.insert("t", Some("k"), b"before").await;
    assert_eq!(sub.take(1).await[0].id, before);
    // Settled once its flush committed: nothing of the group waits on the cut below.
    assert_eq!(sub.ack(&[before]).await.acked, [before]);

    // The dry run's count is sent, then every connection of the link goes silent.
    link.cut_after(|sql| sql.starts_with("SELECT coalesce(sum(n), 0)::int8 FROM unnest("));
    let mut admin = server.admin().await;
    let started = Instant::now();
    let status = admin
        .seek_group(v1::SeekGroupRequest {
            outbox: "orders".into(),
            group: "kafka".into(),
            to: Some(v1::seek_group_request::To::ToOldest(true)),
            dry_run: true,
        })
        .await
        .expect_err("a seek whose count gets no answer");
    let took = started.elapsed();
    assert!(link.is_cut(), "the seek's count was never sent");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(
        status.message().contains(
            "seek group: no answer from databases.main within 1s 500ms \
             (databases.main.acquire_timeout + statement_timeout)"
        ),
        "{status:?}"
    );
    assert!(
        took >= CALL_DEADLINE && took < CALL_DEADLINE + Duration::from_secs(3),
        "answered after {took:?}, the deadline is {CALL_DEADLINE:?}"
    );
    let started = Instant::now();
    let status = admin
        .stats(v1::StatsRequest {
            outbox: "orders".into(),
        })
        .await
        .expect_err("stats while the database is silent");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(started.elapsed() < CALL_DEADLINE + Duration::from_secs(3));

    // Rows of two keys committed while the relay hears nothing, then the link heals.
    let mut during = Vec::new();
    for (key, payload) in [("k", &b"one"[..]), ("j", b"two"), ("k", b"six")] {
        during.push(db.insert("t", Some(key), payload).await);
    }
    link.heal();
    let mut got = Vec::new();
    while got.len() < during.len() {
        let batch = sub.take_within(1, DEADLINE).await;
        let ids: Vec<i64> = batch.iter().map(|m| m.id).collect();
        assert_eq!(sub.ack(&ids).await.acked, ids);
        got.extend(ids);
    }
    let of_k: Vec<i64> = got.iter().copied().filter(|id| *id != during[1]).collect();
    assert_eq!(of_k, [during[0], during[2]], "key k in order: {got:?}");
    got.sort_unstable();
    assert_eq!(
        got, during,
        "the stream that stayed open gets every row once"
    );
    let lag = eventually("the group to catch up", DEADLINE, || {
        let mut admin = admin.clone();
        async move {
            let stats = admin
                .stats(v1::StatsRequest {
                    outbox: "orders".into(),
                })
                .await
                .ok()?
                .into_inner();
            (stats.groups[0].lag_rows == 0).then_some(stats.groups[0].clone())
        }
    })
    .await;
    assert_eq!((lag.retrying, lag.held, lag.dead), (0, 0, 0), "{lag:?}");
    db.drop().await;
}
