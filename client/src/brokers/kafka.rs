//! Publishing to Kafka (feature `kafka`): [`KafkaPublisher`], an idempotent rdkafka
//! producer that returns only once the brokers have the message.
//!
//! Each message becomes one Kafka record:
//!
//! | outbox | Kafka |
//! | --- | --- |
//! | `topic` | the record's topic, through the [`TopicMapping`] (same name, a prefix, or a function) |
//! | `key` | the record's key (so one key stays on one partition, in order); keyless rows have none |
//! | `payload` | the record's value, byte for byte |
//! | `headers` | the record's headers, plus `txoutbox-id` (the message id, for consumer-side deduplication) and `txoutbox-topic` (the outbox topic) |
//!
//! The producer is idempotent (`enable.idempotence=true`, `acks=all`): librdkafka's own
//! retries never duplicate or reorder a record. A publish waits for the delivery report,
//! so the [`Subscriber`](crate::Subscriber) acks a row only once Kafka has it, and starts
//! the next message of a key only after that: per-key order holds from the outbox table to
//! the partition. A redelivery after a crash may still repeat a record (at-least-once):
//! consumers deduplicate on `txoutbox-id`.
//!
//! ```no_run
//! use txoutbox_client::kafka::KafkaPublisher;
//! use txoutbox_client::Subscriber;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let kafka = KafkaPublisher::builder("broker-1:9092,broker-2:9092")
//!     .topic_prefix("outbox.") // orders.paid -> outbox.orders.paid
//!     .set("compression.type", "zstd")
//!     .build()?;
//! Subscriber::builder(["http://127.0.0.1:7411"], "orders")
//!     .name("orders-to-kafka")
//!     .build(kafka)?
//!     .run_until_signal()
//!     .await?;
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::sync::RwLock;
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::util::Timeout;

use crate::brokers::{Binding, CloudEvents};
use crate::{ClientError, Message, PublishError, Publisher};

/// rdkafka itself, for [`KafkaPublisher::from_producer`] and the error types.
pub use rdkafka;

pub use crate::brokers::{TopicMapping, ID_HEADER, TOPIC_HEADER};

/// Default `message.timeout.ms`: below the subscriber's default `publish_timeout` (10s),
/// so a broker outage comes back as Kafka's own error rather than a timeout.
const DEFAULT_DELIVERY_TIMEOUT: Duration = Duration::from_secs(8);
/// How long a publish waits for room in librdkafka's local queue.
const DEFAULT_QUEUE_TIMEOUT: Duration = Duration::from_secs(5);

/// Configures a [`KafkaPublisher`]; start with [`KafkaPublisher::builder`].
#[derive(Debug, Clone)]
#[must_use]
pub struct KafkaPublisherBuilder {
    config: ClientConfig,
    topics: TopicMapping,
    queue_timeout: Duration,
    cloudevents: Option<CloudEvents>,
}

impl KafkaPublisherBuilder {
    crate::brokers::topic_mapping_methods!();
    crate::brokers::cloudevents_method!();

    /// How long librdkafka keeps trying to deliver one record (`message.timeout.ms`,
    /// default 8s) before the publish fails and the row is nacked for a later retry.
    /// Keep it below the subscriber's `publish_timeout` (default 10s).
    pub fn delivery_timeout(mut self, timeout: Duration) -> Self {
        self.config
            .set("message.timeout.ms", timeout.as_millis().to_string());
        self
    }

    /// How long a publish waits for room in librdkafka's local queue (default 5s).
    pub fn queue_timeout(mut self, timeout: Duration) -> Self {
        self.queue_timeout = timeout;
        self
    }

    /// Sets any librdkafka producer property (`compression.type`, `security.protocol`,
    /// `sasl.*`, `linger.ms`...). Turning off `enable.idempotence` or lowering `acks`
    /// gives up the guarantees above.
    pub fn set(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.config.set(key, value);
        self
    }

    /// Creates the producer. It connects in the background: an unreachable cluster shows
    /// up as failed publishes (nacked and retried), not here.
    pub fn build(self) -> Result<KafkaPublisher, ClientError> {
        let producer = create(&self.config)?;
        Ok(KafkaPublisher {
            producer: RwLock::new((0, producer)),
            config: Some(self.config),
            topics: self.topics,
            queue_timeout: self.queue_timeout,
            cloudevents: self.cloudevents,
        })
    }
}

fn create(config: &ClientConfig) -> Result<FutureProducer, ClientError> {
    config
        .create()
        .map_err(|error| ClientError::Config(format!("cannot create the Kafka producer: {error}")))
}

/// Publishes outbox messages to Kafka and returns once the brokers acknowledged them.
///
/// Errors become [`PublishError`]s: a record no broker will ever take (too large, invalid,
/// an invalid topic name) is permanent and dead-letters the row; everything else (brokers
/// down, timeouts, leadership changes, missing topics or permissions) is retried by the
/// outbox's backoff. If librdkafka reports a fatal error, the publisher replaces its
/// producer (when it built it) and the failed message is retried.
///
/// ```no_run
/// use std::time::Duration;
/// use txoutbox_client::kafka::KafkaPublisher;
///
/// # fn demo() -> Result<(), txoutbox_client::ClientError> {
/// let kafka = KafkaPublisher::builder("localhost:9092")
///     .topic_fn(|message| format!("events.{}", message.topic.split('.').next().unwrap_or("misc")))
///     .delivery_timeout(Duration::from_secs(5))
///     .build()?;
/// # Ok(())
/// # }
/// ```
pub struct KafkaPublisher {
    /// The producer and its generation: a fatal error replaces it once, however many
    /// publishes saw that error.
    producer: RwLock<(u64, FutureProducer)>,
    /// To rebuild the producer after a fatal error; `None` for a caller's producer.
    config: Option<ClientConfig>,
    topics: TopicMapping,
    queue_timeout: Duration,
    cloudevents: Option<CloudEvents>,
}

impl fmt::Debug for KafkaPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaPublisher")
            .field("topics", &self.topics)
            .field("queue_timeout", &self.queue_timeout)
            .finish_non_exhaustive()
    }
}

impl KafkaPublisher {
    /// Starts configuring a publisher to the cluster at `bootstrap_servers`
    /// (`host:port,host:port`), with `enable.idempotence=true` and `acks=all`.
    pub fn builder(bootstrap_servers: impl Into<String>) -> KafkaPublisherBuilder {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", bootstrap_servers)
            .set("client.id", "txoutbox")
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set(
                "message.timeout.ms",
                DEFAULT_DELIVERY_TIMEOUT.as_millis().to_string(),
            );
        KafkaPublisherBuilder {
            config,
            topics: TopicMapping::Same,
            queue_timeout: DEFAULT_QUEUE_TIMEOUT,
            cloudevents: None,
        }
    }

    /// Wraps a producer you configured yourself (make it idempotent, with `acks=all`).
    pub fn from_producer(producer: FutureProducer, topics: TopicMapping) -> Self {
        Self {
            producer: RwLock::new((0, producer)),
            config: None,
            topics,
            queue_timeout: DEFAULT_QUEUE_TIMEOUT,
            cloudevents: None,
        }
    }

    /// The producer in use, for metrics (`client().statistics`) or a final `flush`.
    pub fn producer(&self) -> FutureProducer {
        self.current().1
    }

    /// The headers of the record for `message`: its own, then [`ID_HEADER`] and
    /// [`TOPIC_HEADER`] (a producer's header of either name is left out).
    pub fn headers(message: &Message) -> OwnedHeaders {
        let id = message.id.to_string();
        let mut headers = OwnedHeaders::new_with_capacity(message.headers.len() + 2);
        for (name, value) in &message.headers {
            if name == ID_HEADER || name == TOPIC_HEADER {
                continue;
            }
            headers = headers.insert(Header {
                key: name,
                value: Some(value.as_bytes()),
            });
        }
        headers
            .insert(Header {
                key: ID_HEADER,
                value: Some(id.as_bytes()),
            })
            .insert(Header {
                key: TOPIC_HEADER,
                value: Some(message.topic.as_bytes()),
            })
    }

    fn current(&self) -> (u64, FutureProducer) {
        let guard = self.producer.read().unwrap_or_else(|e| e.into_inner());
        (guard.0, guard.1.clone())
    }

    /// After a fatal error of the producer of `generation`: replace it, once.
    fn replace(&self, generation: u64) {
        let Some(config) = &self.config else {
            return;
        };
        let mut guard = self.producer.write().unwrap_or_else(|e| e.into_inner());
        if guard.0 != generation {
            return;
        }
        let reason = guard.1.client().fatal_error();
        tracing::error!(
            ?reason,
            "the Kafka producer failed fatally; creating a new one"
        );
        match create(config) {
            Ok(producer) => *guard = (generation + 1, producer),
            Err(error) => tracing::error!(%error, "cannot replace the Kafka producer"),
        }
    }
}

#[async_trait::async_trait]
impl Publisher for KafkaPublisher {
    async fn publish(&self, message: &Message) -> Result<(), PublishError> {
        let topic = self.topics.topic_for(message);
        let envelope = self
            .cloudevents
            .as_ref()
            .map(|events| events.envelope(message, Binding::Kafka));
        let mut headers = match &envelope {
            Some(envelope) if envelope.replaces_headers => OwnedHeaders::new(),
            _ => Self::headers(message),
        };
        if let Some(envelope) = &envelope {
            let content_type = ("content-type", &envelope.content_type);
            for (name, value) in envelope
                .headers
                .iter()
                .map(|(n, v)| (n.as_str(), v))
                .chain([content_type])
            {
                headers = headers.insert(Header {
                    key: name,
                    value: Some(value.as_bytes()),
                });
            }
        }
        let body = envelope.as_ref().map_or(&message.payload, |e| &e.body);
        let mut record = FutureRecord::<str, [u8]>::to(&topic)
            .payload(&body[..])
            .headers(headers);
        if let Some(key) = &message.key {
            record = record.key(key.as_str());
        }
        let (generation, producer) = self.current();
        match producer
            .send(record, Timeout::After(self.queue_timeout))
            .await
        {
            Ok(delivery) => {
                tracing::trace!(id = message.id, %topic, partition = delivery.partition, offset = delivery.offset, "delivered to kafka");
                Ok(())
            }
            Err((error, _)) => {
                if error.rdkafka_error_code() == Some(RDKafkaErrorCode::Fatal) {
                    self.replace(generation);
                }
                Err(publish_error(&topic, error))
            }
        }
    }
}

/// A Kafka error as a publish failure: permanent when the record itself is what no
/// broker accepts, retriable otherwise.
pub(crate) fn publish_error(topic: &str, error: KafkaError) -> PublishError {
    let text = format!("kafka topic `{topic}`: {error}");
    match error.rdkafka_error_code() {
        Some(code) if is_permanent(code) => PublishError::permanent(text),
        _ => PublishError::new(text),
    }
}

/// Failures of the record itself. Configuration, permission and availability problems
/// are not among them: an operator can fix those, and the row is retried meanwhile.
fn is_permanent(code: RDKafkaErrorCode) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        code,
        C::MessageSizeTooLarge
            | C::InvalidMessageSize
            | C::MessageBatchTooLarge
            | C::InvalidMessage
            | C::InvalidRecord
            | C::BadMessage
            | C::InvalidTopic
            | C::KeySerialization
            | C::ValueSerialization
    )
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::mocking::MockCluster;
    use rdkafka::Message as _;
    use rdkafka::{Offset, TopicPartitionList};

    use super::*;

    #[test]
    fn errors_of_the_record_are_permanent_the_rest_retried() {
        let too_large = publish_error("t", KafkaError::MessageProduction(C::MessageSizeTooLarge));
        assert!(too_large.is_permanent(), "{too_large}");
        assert!(too_large.text().starts_with("kafka topic `t`: "));
        for code in [
            C::MessageTimedOut,
            C::AllBrokersDown,
            C::NotEnoughReplicas,
            C::TopicAuthorizationFailed,
            C::UnknownTopic,
            C::QueueFull,
            C::Fatal,
        ] {
            let error = publish_error("t", KafkaError::MessageProduction(code));
            assert!(!error.is_permanent(), "{code:?} should be retried");
        }
    }

    use RDKafkaErrorCode as C;

    #[test]
    fn headers_carry_the_id_and_topic_over_the_producers() {
        let message = Message::new(42, "orders.paid", "{}")
            .with_header("traceparent", "00-abc")
            .with_header(ID_HEADER, "forged");
        let headers = KafkaPublisher::headers(&message);
        let read: Vec<(String, String)> = rdkafka::message::Headers::iter(&headers)
            .map(|h| {
                (
                    h.key.to_owned(),
                    String::from_utf8(h.value.unwrap().to_vec()).unwrap(),
                )
            })
            .collect();
        assert_eq!(
            read,
            [
                ("traceparent".to_owned(), "00-abc".to_owned()),
                (ID_HEADER.to_owned(), "42".to_owned()),
                (TOPIC_HEADER.to_owned(), "orders.paid".to_owned()),
            ]
        );
    }

    /// Reads `count` records of `topic` (all partitions) from the beginning.
    fn consume(bootstrap: &str, topic: &str, partitions: i32, count: usize) -> Vec<Record> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", "unit")
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
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while records.len() < count && std::time::Instant::now() < deadline {
            if let Some(Ok(message)) = consumer.poll(Duration::from_millis(100)) {
                records.push(Record::of(&message));
            }
        }
        records
    }

    struct Record {
        key: Option<String>,
        payload: Vec<u8>,
        headers: BTreeMap<String, String>,
    }

    impl Record {
        fn of(message: &rdkafka::message::BorrowedMessage<'_>) -> Self {
            use rdkafka::message::Headers;
            let headers = message
                .headers()
                .map(|headers| {
                    headers
                        .iter()
                        .map(|h| {
                            (
                                h.key.to_owned(),
                                String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned(),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            Self {
                key: message
                    .key()
                    .map(|k| String::from_utf8_lossy(k).into_owned()),
                payload: message.payload().unwrap_or_default().to_vec(),
                headers,
            }
        }
    }

    #[tokio::test]
    async fn publishes_with_key_headers_and_prefix_and_refuses_a_huge_record_for_good() {
        let cluster = MockCluster::new(1).unwrap();
        cluster.create_topic("prod.orders", 2, 1).unwrap();
        let bootstrap = cluster.bootstrap_servers();
        let kafka = KafkaPublisher::builder(&bootstrap)
            .topic_prefix("prod.")
            .set("message.max.bytes", "10000")
            .build()
            .unwrap();
        let message = Message::new(7, "orders", "hello")
            .with_key("customer-1")
            .with_header("traceparent", "00-abc");
        kafka.publish(&message).await.unwrap();
        kafka
            .publish(&Message::new(8, "orders", "keyless"))
            .await
            .unwrap();

        let huge = Message::new(9, "orders", vec![b'x'; 20_000]);
        let error = kafka.publish(&huge).await.unwrap_err();
        assert!(error.is_permanent(), "{error:?}");

        let mut records = consume(&bootstrap, "prod.orders", 2, 2);
        records.sort_by_key(|r| r.headers[ID_HEADER].clone());
        assert_eq!(records.len(), 2);
        assert_eq!(records[0].key.as_deref(), Some("customer-1"));
        assert_eq!(records[0].payload, b"hello");
        assert_eq!(records[0].headers["traceparent"], "00-abc");
        assert_eq!(records[0].headers[ID_HEADER], "7");
        assert_eq!(records[0].headers[TOPIC_HEADER], "orders");
        assert_eq!(records[1].key, None);
        assert_eq!(records[1].headers[ID_HEADER], "8");
    }
}
