//! Helpers of the `kafka_*` tests: rows written by the producer helpers, and a consumer
//! that reads back what reached librdkafka's mock cluster.

#![allow(dead_code)] // each test binary uses a part

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{BorrowedMessage, Headers};
use rdkafka::{ClientConfig, Message as _, Offset, TopicPartitionList};
use txoutbox_client::kafka::{ID_HEADER, TOPIC_HEADER};
use txoutbox_client::producer::{NewMessage, OutboxTable};
use txoutbox_tests::TestDb;

/// One record read back from Kafka.
#[derive(Debug, Clone)]
pub struct Record {
    pub partition: i32,
    pub key: Option<String>,
    pub payload: String,
    pub headers: BTreeMap<String, String>,
}

impl Record {
    fn of(message: &BorrowedMessage<'_>) -> Self {
        let headers = message
            .headers()
            .map(|headers| {
                headers
                    .iter()
                    .map(|h| {
                        let value = String::from_utf8_lossy(h.value.unwrap_or_default());
                        (h.key.to_owned(), value.into_owned())
                    })
                    .collect()
            })
            .unwrap_or_default();
        Self {
            partition: message.partition(),
            key: message
                .key()
                .map(|k| String::from_utf8_lossy(k).into_owned()),
            payload: String::from_utf8_lossy(message.payload().unwrap_or_default()).into_owned(),
            headers,
        }
    }

    /// The outbox message id, from the `txoutbox-id` header.
    pub fn id(&self) -> i64 {
        self.headers[ID_HEADER].parse().unwrap()
    }

    pub fn outbox_topic(&self) -> &str {
        &self.headers[TOPIC_HEADER]
    }
}

/// The first record of partition 0 of `topic`, whatever its headers; 30s at most.
pub fn first_record(bootstrap: &str, topic: &str) -> Record {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "txoutbox-tests")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut assignment = TopicPartitionList::new();
    assignment
        .add_partition_offset(topic, 0, Offset::Beginning)
        .unwrap();
    consumer.assign(&assignment).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(message)) => return Record::of(&message),
            Some(Err(error)) => panic!("consuming {topic}: {error}"),
            None => {}
        }
    }
    panic!("no record in {topic} within 30s")
}

/// Reads every partition of `topic` from the beginning until `distinct` different outbox
/// ids arrived (and a short quiet period after, so duplicates show), or 30s passed.
/// Records come in the order each partition holds them.
pub fn consume(bootstrap: &str, topic: &str, partitions: i32, distinct: usize) -> Vec<Record> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "txoutbox-tests")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut assignment = TopicPartitionList::new();
    for partition in 0..partitions {
        assignment
            .add_partition_offset(topic, partition, Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&assignment).unwrap();
    let mut records = Vec::new();
    let mut ids = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut quiet_until = None;
    while Instant::now() < deadline {
        if quiet_until.is_some_and(|until| Instant::now() > until) {
            break;
        }
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(message)) => {
                let record = Record::of(&message);
                ids.insert(record.id());
                records.push(record);
                if ids.len() >= distinct && quiet_until.is_none() {
                    quiet_until = Some(Instant::now() + Duration::from_millis(500));
                }
            }
            Some(Err(error)) => panic!("consuming {topic}: {error}"),
            None => {}
        }
    }
    records
}

/// `keys` keys with `per_key` messages each, interleaved, inserted in one transaction
/// with the producer helpers; payloads `key:seq`, header `traceparent`. Returns the ids.
pub async fn insert_keyed(db: &TestDb, topic: &str, keys: usize, per_key: u32) -> Vec<i64> {
    let table = OutboxTable::in_schema(&db.schema, "outbox").unwrap();
    let mut tx = db.pool.begin().await.unwrap();
    let mut ids = Vec::new();
    for seq in 0..per_key {
        for k in 0..keys {
            let message = NewMessage::new(topic, format!("k{k}:{seq}"))
                .key(format!("k{k}"))
                .header("traceparent", format!("00-trace-k{k}-{seq}"));
            ids.push(table.insert(&mut *tx, &message).await.unwrap());
        }
    }
    tx.commit().await.unwrap();
    ids
}

/// Payloads `key:seq` of the records, per key, in the order Kafka holds them.
pub fn by_key(records: &[Record]) -> BTreeMap<String, Vec<u32>> {
    let mut by_key: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for record in records {
        let (key, seq) = record.payload.rsplit_once(':').unwrap();
        assert_eq!(record.key.as_deref(), Some(key), "record key");
        by_key
            .entry(key.to_owned())
            .or_default()
            .push(seq.parse().unwrap());
    }
    by_key
}
