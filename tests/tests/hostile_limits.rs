//! Careless and hostile clients against a real `txoutboxd`:
//! responses a default gRPC client can take, a silent client that cannot pin the
//! server's memory, a burst of answers that leaves the connection alone, idle streams
//! that cost nothing per insert, health checks that need no pool connection, and a
//! bound on the streams of one connection.

use std::time::Duration;

use tonic_health::pb::health_check_response::ServingStatus;
use txoutbox_proto::v1::subscribe_request::Request as Req;
use txoutbox_proto::v1::{self};
use txoutbox_tests::bench::procfs;
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

fn open(name: &str, topics: &[&str], window: u32) -> v1::OpenSubscription {
    v1::OpenSubscription {
        group: String::new(),
        outbox: "orders".into(),
        subscriber: name.into(),
        topics: topics.iter().map(|t| (*t).to_owned()).collect(),
        max_in_flight: window,
        lease_ms: 0,
    }
}

async fn leased(server: &Server) -> u64 {
    let stats = server
        .admin()
        .await
        .stats(v1::StatsRequest {
            outbox: "orders".into(),
        })
        .await
        .unwrap()
        .into_inner();
    stats.total.unwrap().leased
}

/// Case 1: eight rows of 1 MiB made an 8 MiB response that a default client (4 MiB)
/// refuses, with the rows leased and an attempt burned, on unary calls and streams alike.
#[tokio::test]
async fn every_response_fits_a_default_grpc_client() {
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let rows: Vec<_> = (0..8).map(|_| (None, vec![b'x'; 1 << 20])).collect();
    let ids = db.insert_many("t", &rows).await;

    // Default client options: at most 4 MiB per response.
    let mut relay = server.relay().await;
    let first = relay.claim(claim("w", 10)).await.unwrap().into_inner();
    let n = first.messages.len();
    assert!((1..=3).contains(&n), "{n} rows of 1 MiB in one response");
    assert_eq!(first.messages[0].id, ids[0], "an id-ordered prefix");
    for id in &ids[n..] {
        assert_eq!(db.row(*id).await, ("pending".into(), 0, None), "untried");
    }
    let release = v1::ReleaseRequest {
        outbox: "orders".into(),
        worker_id: "w".into(),
        ids: ids[..n].to_vec(),
        retry_delay_ms: None,
        lease_tokens: Vec::new(),
    };
    relay.release(release).await.unwrap();

    let mut sub = Subscriber::open(&server, "s", 10, 0).await;
    let got: Vec<i64> = sub.take(8).await.iter().map(|m| m.id).collect();
    assert_eq!(got, ids);
    assert_eq!(sub.ack(&ids).await.acked, ids);
    db.drop().await;
}

/// Case 1: a row that fits no response is dead-lettered with the reason, whatever makes
/// it large (here its headers), and the rows around it are delivered.
#[tokio::test]
async fn a_row_too_large_for_any_response_is_dead_lettered_with_the_reason() {
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let before = db.insert("t", None, b"before").await;
    let headers = serde_json::json!({ "big": "h".repeat(100 * 1024) });
    let large: i64 = sqlx::query_scalar(&format!(
        "INSERT INTO {}.outbox (topic, payload, headers) VALUES ('t', $1, $2) RETURNING id",
        db.schema
    ))
    .bind(vec![b'x'; 4 * 1024 * 1024 - 64 * 1024])
    .bind(sqlx::types::Json(headers))
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let after = db.insert("t", None, b"after").await;

    let mut sub = Subscriber::open(&server, "s", 10, 0).await;
    let got: Vec<i64> = sub.take(2).await.iter().map(|m| m.id).collect();
    assert_eq!(got, [before, after]);
    let (status, attempts, error) = db.row(large).await;
    assert_eq!((status.as_str(), attempts), ("dead", 1));
    let error = error.unwrap();
    assert!(error.contains("server.max_message_bytes"), "{error}");
    db.drop().await;
}

/// Case 3: a stream with a window of 10,000 that never reads made the server claim and
/// buffer thousands of rows (window x row size).
#[tokio::test]
async fn a_silent_subscriber_pins_a_bounded_number_of_rows_and_bytes() {
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let row = vec![b'x'; 64 * 1024];
    let mut ids = Vec::new();
    for _ in 0..10 {
        let rows: Vec<_> = (0..200).map(|_| (None, row.clone())).collect();
        ids.extend(db.insert_many("t", &rows).await);
    }
    let pid = server.pid().unwrap();
    let rss_before = procfs::status_kib(pid, "VmRSS").unwrap();

    let mut sub = Subscriber::open(&server, "silent", 10_000, 0).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let held = leased(&server).await;
    let grown_mib = procfs::status_kib(pid, "VmRSS")
        .unwrap()
        .saturating_sub(rss_before)
        / 1024;
    assert!(held <= 600, "a silent stream holds {held} rows of 64 KiB");
    assert!(grown_mib < 96, "the server grew by {grown_mib} MiB");

    // Nothing is lost once it reads.
    let got = sub.take(ids.len()).await;
    assert_eq!(got.len(), ids.len());
    for chunk in ids.chunks(1000) {
        assert_eq!(sub.ack(chunk).await.acked.len(), chunk.len());
    }
    assert_eq!(db.count("done").await, ids.len() as i64);
    db.drop().await;
}

/// Case 4: a subscriber nacking thousands of rows back to back got its connection cut
/// (HTTP/2 GOAWAY), and another stream on that connection died too.
#[tokio::test]
async fn ten_thousand_nacks_in_a_burst_leave_the_connection_and_its_other_streams_alone() {
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("max_batch_size = 1000")).await;
    let mut ids = Vec::new();
    for _ in 0..5 {
        let rows: Vec<_> = (0..2000).map(|_| (None, b"m".to_vec())).collect();
        ids.extend(db.insert_many("a", &rows).await);
    }
    let other = db.insert("b", None, b"other").await;
    let channel = server.channel().await;
    let mut burst = Subscriber::open_on(channel.clone(), open("burst", &["a"], 10_000))
        .await
        .unwrap();
    let mut bystander = Subscriber::open_on(channel, open("bystander", &["b"], 10))
        .await
        .unwrap();
    assert_eq!(burst.take(ids.len()).await.len(), ids.len());
    assert_eq!(bystander.take(1).await[0].id, other);

    for id in &ids {
        burst
            .send(Req::Nack(v1::NackMessage {
                id: *id,
                error: "broker down".into(),
                retry_delay_ms: Some(3_600_000),
                lease_token: Default::default(),
            }))
            .await;
        // One answer per DATA frame, as a client answering message by message sends.
        tokio::task::yield_now().await;
    }
    assert_eq!(bystander.ack(&[other]).await.acked, [other]);
    let settled = tokio::time::timeout(Duration::from_secs(300), async {
        while burst.settled.len() < ids.len() {
            assert!(burst.pump().await.expect("the burst's stream"), "ended");
        }
    })
    .await;
    assert!(
        settled.is_ok(),
        "{} of {} settled",
        burst.settled.len(),
        ids.len()
    );
    assert!(burst.settled.iter().all(|s| s.retried.len() == 1));
    assert_eq!(leased(&server).await, 0);
    assert_eq!(db.row(ids[0]).await.1, 1);
    db.drop().await;
}

/// Case 5: every idle stream claimed on every insert signal, whatever its topic filter.
#[tokio::test]
async fn an_insert_costs_a_few_claims_however_many_streams_are_idle() {
    let db = TestDb::new().await;
    let quiet = "poll.min = \"60s\"\npoll.max = \"60s\"";
    let server = Server::start_serving(&db.config(quiet)).await;
    let claims = || server.log_count("\"message\":\"claimed\"");
    let channel = server.channel().await;
    let mut idle = Vec::new();
    for i in 0..300 {
        let name = format!("idle-{i}");
        idle.push(
            Subscriber::open_on(channel.clone(), open(&name, &["idle"], 10))
                .await
                .unwrap(),
        );
    }
    let mut legit = Subscriber::open(&server, "legit", 10, 0).await;
    // Opening the streams claims through their group too: a few claims, not 301.
    eventually("the first claims", DEADLINE, || async {
        (claims() >= 1).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = claims();
    assert!(before <= 10, "opening 301 streams made {before} claims");
    let id = db.insert("t", None, b"wake").await;
    assert_eq!(legit.take(1).await[0].id, id);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let cost = claims() - before;
    assert!(
        cost <= 3,
        "one insert made {cost} claims with 300 idle streams"
    );
    db.drop().await;
}

/// Case 5: an insert cost one claim per distinct topic filter among the idle streams, so
/// 1,000 idle streams each with a filter of its own made one insert cost about 1,000
/// claims, and once the filters were bounded (`max_topic_filters`, 64 by default), still
/// 64. The streams past the bound are refused; an insert wakes only the groups whose
/// filter names its topic (the trigger's notification carries it), so it costs a few
/// claims whatever the filters of the idle streams.
#[tokio::test]
async fn an_insert_costs_a_few_claims_however_many_filters_the_idle_streams_have() {
    const LIMIT: usize = 64;
    let db = TestDb::new().await;
    let quiet = "poll.min = \"60s\"\npoll.max = \"60s\"";
    let server = Server::start_serving(&db.config(quiet)).await;
    let claims = || server.log_count("\"message\":\"claimed\"");
    // No filter is a filter too: the legitimate stream takes the first slot.
    let mut legit = Subscriber::open(&server, "legit", 10, 0).await;
    let channel = server.channel().await;
    let mut idle = Vec::new();
    let mut refused = Vec::new();
    for i in 0..1000 {
        let name = format!("idle-{i}");
        let topic = format!("idle-{i}");
        match Subscriber::open_on(channel.clone(), open(&name, &[&topic], 10)).await {
            Ok(stream) => idle.push(stream),
            Err(status) => refused.push(status),
        }
    }
    assert_eq!(idle.len(), LIMIT - 1, "streams with filters of their own");
    assert_eq!(refused.len(), 1000 - (LIMIT - 1));
    let status = &refused[0];
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(
        status
            .message()
            .contains("outboxes.orders.max_topic_filters = 64"),
        "{status:?}"
    );
    // A filter in use still opens, however many were refused.
    idle.push(
        Subscriber::open_on(channel.clone(), open("again", &["idle-1"], 10))
            .await
            .expect("a filter in use"),
    );
    // Each group's first stream claims once when it opens; wait for them all.
    eventually("the opening claims", DEADLINE, || async {
        (claims() >= LIMIT).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = claims();
    assert!(
        before <= LIMIT + 10,
        "opening {} streams made {before} claims",
        idle.len() + 1
    );
    // A topic no idle stream filters on: the legitimate stream's group claims.
    let id = db.insert("t", None, b"wake").await;
    assert_eq!(legit.take(1).await[0].id, id);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let cost = claims() - before;
    assert!(
        cost <= 3,
        "one insert made {cost} claims with {} filters among the idle streams",
        LIMIT - 1
    );
    // A topic one idle group filters on: that group and the legitimate one claim (either
    // may get the row).
    let before = claims();
    let id = db.insert("idle-7", None, b"wake").await;
    eventually("the row claimed", DEADLINE, || async {
        (db.row(id).await.1 == 1).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let cost = claims() - before;
    assert!(
        cost <= 4,
        "one insert of a filtered topic made {cost} claims"
    );
    db.drop().await;
}

/// The depth gauges once counted on the health checks' only connection,
/// so a count waiting for a table lock (up to `lock_timeout`, 10 s) held it, and the health
/// check of another outbox of the database found no connection within the acquire timeout
/// (3 s) and turned it NOT_SERVING.
#[tokio::test]
async fn a_depth_count_waiting_for_a_lock_never_delays_a_health_check() {
    let db = TestDb::new().await;
    let spare = format!(
        "\n[outboxes.spare]\ndatabase = \"main\"\nschema = \"{}\"\ntable = \"spare\"\ncreate_schema = true\n",
        db.schema
    );
    let config = db.config(&spare).replace(
        "[server]\n",
        "[server]\nmetrics_listen = \"127.0.0.1:0\"\nmetrics_depth_interval = \"100ms\"\n",
    );
    let server = Server::start_serving(&config).await;
    eventually("spare serving", DEADLINE, || async {
        (server.health("spare").await == ServingStatus::Serving).then_some(())
    })
    .await;
    let mut lock = db.pool.begin().await.unwrap();
    sqlx::query(&format!(
        "LOCK TABLE {}.outbox IN ACCESS EXCLUSIVE MODE",
        db.schema
    ))
    .execute(&mut *lock)
    .await
    .unwrap();
    // The setup holds: a depth count of `orders` waits for the lock.
    eventually("a depth count waiting for the lock", DEADLINE, || async {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE wait_event_type = 'Lock' AND query LIKE '%AS oldest_pending_secs%'",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap();
        (waiting > 0).then_some(())
    })
    .await;
    for _ in 0..48 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert_eq!(
            server.health("spare").await,
            ServingStatus::Serving,
            "the other outbox's health check waited behind a depth count"
        );
    }
    lock.commit().await.unwrap();
    db.drop().await;
}

/// Case 5: with every pool connection busy, the health checks found no connection and
/// turned every outbox of the database NOT_SERVING.
#[tokio::test]
async fn health_checks_do_not_wait_for_a_pool_connection() {
    let db = TestDb::new().await;
    let config = db
        .config("")
        .replace("max_connections = 8", "max_connections = 1");
    let server = Server::start_serving(&config).await;
    // Hold the claim lock of the table (see postgres/sql.rs), so the stream's claim waits
    // for it on the pool's only connection.
    let mut lock = db.pool.begin().await.unwrap();
    sqlx::query("SELECT pg_advisory_xact_lock(1954049890, hashtext($1))")
        .bind(format!("txoutbox:{}.outbox", db.schema))
        .execute(&mut *lock)
        .await
        .unwrap();
    let id = db.insert("t", None, b"x").await;
    let mut sub = Subscriber::open(&server, "s", 10, 0).await;
    for _ in 0..12 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(server.health("orders").await, ServingStatus::Serving);
    }
    lock.commit().await.unwrap();
    assert_eq!(sub.take(1).await[0].id, id);
    db.drop().await;
}

/// Case 5: one connection could carry any number of streams.
#[tokio::test]
async fn a_connection_carries_at_most_max_streams_per_connection_streams() {
    let db = TestDb::new().await;
    let config = db
        .config("")
        .replace("[server]\n", "[server]\nmax_streams_per_connection = 3\n");
    let server = Server::start_serving(&config).await;
    let channel = server.channel().await;
    let mut open_streams = Vec::new();
    for i in 0..3 {
        let name = format!("s{i}");
        open_streams.push(
            Subscriber::open_on(channel.clone(), open(&name, &[], 10))
                .await
                .unwrap(),
        );
    }
    let fourth = Subscriber::open_on(channel.clone(), open("s3", &[], 10));
    tokio::pin!(fourth);
    let waited = tokio::time::timeout(Duration::from_secs(1), &mut fourth).await;
    assert!(waited.is_err(), "a fourth stream opened on the connection");
    drop(open_streams.pop());
    let opened = tokio::time::timeout(DEADLINE, fourth)
        .await
        .expect("in time");
    assert!(opened.is_ok());
    db.drop().await;
}

/// Case 2: rows whose subscribers die or never answer were claimed a twelfth time with
/// `max_attempts = 10`. The claim after the last attempt's lease ran out dead-letters the
/// row with the reason instead of handing it out again.
#[tokio::test]
async fn a_row_claimed_max_attempts_times_without_an_answer_is_dead_lettered() {
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("max_attempts = 3")).await;
    let id = db.insert("t", Some("k"), b"never answered").await;
    let mut relay = server.relay().await;
    let short_lease = |worker: &str| v1::ClaimRequest {
        lease_ms: 100,
        ..claim(worker, 10)
    };

    for attempt in 1..=3u32 {
        // Each worker claims and goes silent; the next one gets the row once the lease ran out.
        let worker = format!("silent-{attempt}");
        let message = eventually("the row handed out again", DEADLINE, || {
            let mut relay = relay.clone();
            let request = short_lease(&worker);
            async move {
                let batch = relay.claim(request).await.unwrap().into_inner();
                batch.messages.into_iter().next()
            }
        })
        .await;
        assert_eq!((message.id, message.attempts), (id, attempt));
    }

    let (status, attempts, error) = eventually("the row dead-lettered", DEADLINE, || {
        let mut relay = relay.clone();
        let db = &db;
        async move {
            let batch = relay.claim(short_lease("late")).await.unwrap().into_inner();
            assert!(
                batch.messages.is_empty(),
                "claimed past max_attempts: {batch:?}"
            );
            let row = db.row(id).await;
            (row.0 == "dead").then_some(row)
        }
    })
    .await;
    assert_eq!((status.as_str(), attempts), ("dead", 3));
    let error = error.unwrap();
    assert!(
        error.contains("claimed 3 times without an answer"),
        "{error}"
    );
    assert!(relay
        .claim(short_lease("after"))
        .await
        .unwrap()
        .into_inner()
        .messages
        .is_empty());
    db.drop().await;
}
