//! Kafka failures turn into nacks and later successful retries, nothing lost and per-key
//! order kept: a broker that is down, and produce requests the broker refuses. The whole
//! path runs: a real `txoutboxd` on PostgreSQL, the subscriber runtime, `KafkaPublisher`,
//! librdkafka's mock cluster.

use crate::kafka_common;

use std::collections::BTreeSet;
use std::time::Duration;

use rdkafka::mocking::MockCluster;
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use txoutbox_client::{KafkaPublisher, Subscriber, SubscriberHandle};
use txoutbox_tests::{eventually, Server, TestDb, DEADLINE};

use kafka_common::{by_key, consume, insert_keyed};

const KEYS: usize = 4;
const PER_KEY: u32 = 6;
/// Quick retries, and enough attempts that nothing is dead-lettered.
const OUTBOX: &str = r#"
max_attempts = 100
backoff = { base = "200ms", factor = 1.5, maximum = "1s", jitter = 0.1 }
"#;

fn start(server: &Server, bootstrap: &str) -> SubscriberHandle {
    // Deliveries give up after a second, so a broker outage comes back as nacks quickly.
    let kafka = KafkaPublisher::builder(bootstrap)
        .delivery_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    Subscriber::builder([server.url()], "orders")
        .concurrency(4)
        .build(kafka)
        .unwrap()
        .spawn()
}

/// Every id arrived, and each key's records never went back (a redelivery may repeat the
/// record just written, at-least-once; never an earlier one after a later one).
fn assert_nothing_lost_and_in_order(records: &[kafka_common::Record], ids: &[i64]) {
    let got: BTreeSet<i64> = records.iter().map(|r| r.id()).collect();
    assert_eq!(
        got,
        ids.iter().copied().collect::<BTreeSet<_>>(),
        "lost records"
    );
    for (key, seqs) in by_key(records) {
        assert!(
            seqs.windows(2).all(|w| w[0] <= w[1]),
            "key {key} went back: {seqs:?}"
        );
        let mut distinct = seqs.clone();
        distinct.dedup();
        assert_eq!(distinct, (0..PER_KEY).collect::<Vec<_>>(), "key {key}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_down_means_nacks_then_retries_that_succeed() {
    let cluster = MockCluster::new(1).unwrap();
    cluster.create_topic("orders", 2, 1).unwrap();
    let bootstrap = cluster.bootstrap_servers();
    cluster.broker_down(-1).unwrap();

    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config(OUTBOX)).await;
    let ids = insert_keyed(&db, "orders", KEYS, PER_KEY).await;
    let handle = start(&server, &bootstrap);

    let counters = handle.counters();
    eventually("nacks while the broker is down", DEADLINE, || async {
        (counters.snapshot().retried >= 4).then_some(())
    })
    .await;
    assert_eq!(db.count("done").await, 0, "delivered with the broker down");
    cluster.broker_up(-1).unwrap();

    eventually("every row delivered", DEADLINE, || async {
        (db.count("done").await == ids.len() as i64).then_some(())
    })
    .await;
    handle.stop().await.unwrap();
    let totals = counters.snapshot();
    assert_eq!(totals.dead_lettered, 0);
    let (_, attempts, error) = db.row(ids[0]).await;
    assert!(attempts > 1, "the first row was delivered at once");
    assert!(
        error.is_some_and(|e| e.contains("kafka topic `orders`")),
        "the last error names Kafka"
    );

    let records = consume(&bootstrap, "orders", 2, ids.len());
    assert_nothing_lost_and_in_order(&records, &ids);
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_produce_requests_are_nacked_and_retried() {
    let cluster = MockCluster::new(1).unwrap();
    cluster.create_topic("orders", 2, 1).unwrap();
    let bootstrap = cluster.bootstrap_servers();
    // The next produce requests fail with an error librdkafka does not retry itself.
    cluster.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED; 5],
    );

    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config(OUTBOX)).await;
    let ids = insert_keyed(&db, "orders", KEYS, PER_KEY).await;
    let handle = start(&server, &bootstrap);

    eventually("every row delivered", DEADLINE, || async {
        (db.count("done").await == ids.len() as i64).then_some(())
    })
    .await;
    let totals = handle.counters().snapshot();
    handle.stop().await.unwrap();
    assert!(totals.retried >= 1, "no nack: {totals:?}");
    assert_eq!(totals.dead_lettered, 0);
    let mut refused = 0;
    for id in &ids {
        if let (_, _, Some(error)) = db.row(*id).await {
            assert!(error.contains("kafka topic `orders`"), "{error}");
            refused += usize::from(error.contains("Authorization"));
        }
    }
    assert!(refused >= 1, "no row records the broker's refusal");

    let records = consume(&bootstrap, "orders", 2, ids.len());
    assert_nothing_lost_and_in_order(&records, &ids);
    db.drop().await;
}
