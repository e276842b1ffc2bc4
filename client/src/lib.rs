//! Rust client for `txoutboxd`, the transactional-outbox relay.
//!
//! The server owns the outbox tables: it claims rows, leases them, keeps per-key order,
//! schedules retries and dead-letters. This crate is the other half:
//!
//! - [`Subscriber`]: the streaming runtime. It holds a `Subscribe` stream open to one of
//!   your servers and hands each message to your [`Publisher`]: messages of one key one
//!   after another, different keys concurrently; failures nacked and the rest of their key
//!   held back; slow publishes kept leased; reconnection with backoff; graceful stop.
//! - [`Worker`]: one round at a time over the unary calls ([`Worker::run_once`]), for
//!   cron jobs.
//! - [`producer`] (features `postgres`, `mysql` and `sqlite`): insert outbox
//!   rows inside your own sqlx transaction, so they commit with your data.
//! - [`brokers`]: the ready-made publishers. `brokers::kafka` (feature `kafka`):
//!   `KafkaPublisher`, an idempotent rdkafka producer that confirms delivery before the
//!   row is acked; likewise `nats` (`NatsPublisher`, JetStream), `amqp` (`AmqpPublisher`,
//!   RabbitMQ), `webhook` (`WebhookPublisher`, signed HTTP POSTs) and `redis_stream`
//!   (`RedisStreamPublisher`), `mqtt` (`MqttPublisher`, MQTT 5 at QoS 1), `sqs`
//!   (`SqsPublisher`) and `sns` (`SnsPublisher`), each behind the feature of its name
//!   (`redis` for Redis).
//!   The publishers and their modules are also at the crate's root
//!   (`txoutbox_client::KafkaPublisher`, `txoutbox_client::kafka`).
//! - [`Event`]s and [`Counters`] to watch and export what happens; [`connect`] and
//!   [`proto`] for the admin calls and the raw protocol.
//!
//! # A publisher in a dozen lines
//!
//! ```no_run
//! use txoutbox_client::{Message, PublishError, Subscriber};
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let subscriber = Subscriber::builder(["http://127.0.0.1:7411"], "orders")
//!         .name("orders-printer")
//!         .concurrency(8)
//!         .build(|message: Message| async move {
//!             // Publish to your broker here; return Ok only once it has the message.
//!             println!("{} {:?} {}", message.topic, message.key, message.payload_str()?);
//!             Ok::<_, PublishError>(())
//!         })?;
//!     subscriber.run_until_signal().await?; // Ctrl-C: finish in-flight, give back the rest
//!     Ok(())
//! }
//! ```
//!
//! Implement [`Publisher`] on a type instead of a closure when the publisher holds a
//! client (a Kafka producer, an HTTP client); return [`PublishError::permanent`] for a
//! message no retry can fix, and [`PublishError::retry_after`] to choose the delay.
//!
//! # Kafka in a dozen lines
//!
//! With the `kafka` feature (librdkafka is built from source: it needs `cmake` and a C++
//! compiler):
//!
//! ```no_run
//! # #[cfg(feature = "kafka")] mod demo {
//! use txoutbox_client::{KafkaPublisher, Subscriber};
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let kafka = KafkaPublisher::builder("localhost:9092") // idempotent, acks=all
//!         .topic_prefix("outbox.") // orders.paid -> outbox.orders.paid
//!         .build()?;
//!     Subscriber::builder(["http://127.0.0.1:7411"], "orders")
//!         .name("orders-to-kafka")
//!         .build(kafka)?
//!         .run_until_signal()
//!         .await?;
//!     Ok(())
//! }
//! # }
//! # fn main() {}
//! ```
//!
//! The outbox key becomes the Kafka key, the row's headers are carried over with
//! `txoutbox-id` (the message id, for consumer-side deduplication) and `txoutbox-topic`
//! added; see the `kafka` module. The `txoutbox` command line (feature `cli`) runs the same relay as `txoutbox relay --kafka BROKERS`.
//!
//! # Delivery
//!
//! At-least-once: a message is acked only after the publisher returned `Ok`, and one whose
//! answer was lost (a crash, a cut connection) is delivered again. Downstream consumers
//! deduplicate on [`Message::id`].
//!
//! Start reading at [`subscriber`]; [`publisher`] and [`message`] are the types your code
//! touches.
//!
//! # Features
//!
//! None is on by default: `postgres`, `mysql`, `sqlite` (producer helpers), `kafka`,
//! `nats`, `amqp`, `webhook`, `redis` (publishers), `otel` (a publish span continuing the
//! message's trace), `prometheus` (the subscriber's metrics in a registry) and `cli` (the
//! `txoutbox` command line). The crate's README lists what each adds.

#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod brokers;
mod connect;
mod error;
pub mod events;
pub mod message;
#[cfg(feature = "prometheus")]
pub mod metrics;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub mod producer;
pub mod publisher;
pub mod subscriber;
mod trace_context;
pub mod worker;

// The publishers' modules and types where they were before `brokers/` gathered them.
pub use brokers as broker;
#[cfg(feature = "amqp")]
pub use brokers::amqp::{self, AmqpPublisher};
#[cfg(feature = "kafka")]
pub use brokers::kafka::{self, KafkaPublisher};
#[cfg(feature = "mqtt")]
pub use brokers::mqtt::{self, MqttPublisher};
#[cfg(feature = "nats")]
pub use brokers::nats::{self, NatsPublisher};
#[cfg(feature = "redis")]
pub use brokers::redis_stream::{self, RedisStreamPublisher};
#[cfg(feature = "sns")]
pub use brokers::sns::{self, SnsPublisher};
#[cfg(feature = "sqs")]
pub use brokers::sqs::{self, SqsPublisher};
#[cfg(feature = "webhook")]
pub use brokers::webhook::{self, WebhookPublisher};
pub use connect::{connect, connect_with, BearerToken, Connection, Credentials};
pub use error::ClientError;
pub use events::{CounterSnapshot, Counters, Event};
pub use message::Message;
pub use publisher::{PublishError, Publisher};
pub use subscriber::{Subscriber, SubscriberBuilder, SubscriberHandle};
pub use worker::{default_worker_id, RoundResult, Worker, WorkerBuilder};

/// The generated protocol stubs (`txoutbox.v1`), for the admin calls and anything the
/// runtime does not cover.
pub use txoutbox_proto as proto;

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send<T: Send>(_: T) {}

    /// The runtime's futures can be spawned on a multi-threaded runtime.
    #[allow(dead_code)]
    fn futures_are_send(subscriber: Subscriber, worker: &Worker) {
        assert_send(subscriber.run(async {}));
        assert_send(worker.run_once());
    }
}
