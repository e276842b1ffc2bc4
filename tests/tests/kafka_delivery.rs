//! The whole path to Kafka: rows written in a producer's transaction, a real `txoutboxd`
//! on PostgreSQL, the subscriber runtime and `KafkaPublisher`, and librdkafka's mock
//! cluster (no broker needed). Records arrive once each, with their keys, the producer's
//! headers plus `txoutbox-id` and `txoutbox-topic`, and in order per key.

use crate::kafka_common;

use std::collections::BTreeSet;

use rdkafka::mocking::MockCluster;
use txoutbox_client::{KafkaPublisher, Subscriber};
use txoutbox_tests::{eventually, Server, TestDb, DEADLINE};

use kafka_common::{by_key, consume, insert_keyed};

const KEYS: usize = 8;
const PER_KEY: u32 = 15;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_arrive_with_keys_headers_and_per_key_order() {
    let cluster = MockCluster::new(3).unwrap();
    cluster.create_topic("shop.orders.paid", 4, 1).unwrap();
    let bootstrap = cluster.bootstrap_servers();

    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let ids = insert_keyed(&db, "orders.paid", KEYS, PER_KEY).await;
    let total = ids.len();

    let kafka = KafkaPublisher::builder(&bootstrap)
        .topic_prefix("shop.")
        .build()
        .unwrap();
    let handle = Subscriber::builder([server.url()], "orders")
        .name("orders-to-kafka")
        .concurrency(8)
        .build(kafka)
        .unwrap()
        .spawn();
    eventually("every row delivered", DEADLINE, || async {
        (db.count("done").await == total as i64).then_some(())
    })
    .await;
    let totals = handle.counters().snapshot();
    handle.stop().await.unwrap();
    assert_eq!(totals.retried + totals.dead_lettered, 0, "{totals:?}");

    let records = consume(&bootstrap, "shop.orders.paid", 4, total);
    let got: Vec<i64> = records.iter().map(|r| r.id()).collect();
    assert_eq!(records.len(), total, "duplicates or losses: {got:?}");
    assert_eq!(
        got.iter().copied().collect::<BTreeSet<_>>(),
        ids.iter().copied().collect::<BTreeSet<_>>()
    );
    for record in &records {
        let (key, seq) = record.payload.rsplit_once(':').unwrap();
        assert_eq!(record.key.as_deref(), Some(key));
        assert_eq!(record.outbox_topic(), "orders.paid");
        assert_eq!(
            record.headers["traceparent"],
            format!("00-trace-{key}-{seq}")
        );
    }
    // One key, one partition.
    for key in 0..KEYS {
        let partitions: BTreeSet<i32> = records
            .iter()
            .filter(|r| r.key.as_deref() == Some(&format!("k{key}")))
            .map(|r| r.partition)
            .collect();
        assert_eq!(partitions.len(), 1, "key k{key} spread over {partitions:?}");
    }
    let expected: Vec<u32> = (0..PER_KEY).collect();
    for (key, seqs) in by_key(&records) {
        assert_eq!(seqs, expected, "key {key} out of order in Kafka");
    }
    db.drop().await;
}
