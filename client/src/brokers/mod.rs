//! The ready-made publishers, one module per broker, each behind the feature of its name,
//! and what they share: where a message goes ([`TopicMapping`]) and which headers it
//! carries ([`carried_headers`]).
//!
//! They live beside the [`subscriber`](crate::subscriber) runtime rather than in it: the
//! runtime knows only the [`Publisher`](crate::Publisher) trait, and a publisher knows
//! nothing of the runtime, so an application can bring its own of either.
//!
//! Every publisher of this crate has the same shape:
//!
//! - `XPublisher::builder(ADDRESS)` returns a builder with the same topic mapping methods
//!   (`same_topic`, `topic_prefix`, `topic_fn`, `topics`), a timeout for the broker's
//!   confirmation, and the broker's own settings (SQS and SNS send to the one queue or
//!   topic they were built for: no topic mapping);
//! - `build()` checks the settings and returns the publisher without connecting: an
//!   unreachable broker shows up as failed publishes (nacked, retried with the outbox's
//!   backoff), never as a start-up failure, and a lost connection is made again by the
//!   next publish;
//! - [`Publisher::publish`](crate::Publisher::publish) returns `Ok` only once the broker
//!   confirmed the message (Kafka's delivery report, JetStream's PubAck, RabbitMQ's
//!   publisher confirm, a 2xx answer, Redis' XADD reply, MQTT's PUBACK, SQS's and SNS's
//!   answer for the message's batch entry);
//! - one function per publisher, `classify`, turns the broker's errors into
//!   [`PublishError`](crate::PublishError)s: permanent (dead-letter the row) only for a
//!   message the broker will never take, retried for everything an operator or time can
//!   fix. Its rules are listed in that publisher's module documentation.
//!
//! | broker | feature | module | ordering key | message id |
//! | --- | --- | --- | --- | --- |
//! | Kafka | `kafka` | [`kafka`](crate#kafka-in-a-dozen-lines) | the record key | header `txoutbox-id` |
//! | NATS JetStream | `nats` | `nats` | header `txoutbox-key` | `Nats-Msg-Id` and `txoutbox-id` |
//! | RabbitMQ | `amqp` | `amqp` | header `txoutbox-key` | `message_id` and `txoutbox-id` |
//! | HTTP webhook | `webhook` | `webhook` | header `txoutbox-key` | header `txoutbox-id` |
//! | Redis Streams | `redis` | `redis_stream` | field `key` | field `id` |
//! | MQTT 5 | `mqtt` | `mqtt` | user property `txoutbox-key` (or a topic level) | user property `txoutbox-id` |
//! | Amazon SQS | `sqs` | `sqs` | attribute `txoutbox-key`; FIFO: `MessageGroupId` | attribute `txoutbox-id`; FIFO: `MessageDeduplicationId` |
//! | Amazon SNS | `sns` | `sns` | attribute `txoutbox-key`; FIFO: `MessageGroupId` | attribute `txoutbox-id`; FIFO: `MessageDeduplicationId` |

#[cfg(feature = "amqp")]
pub mod amqp;
#[cfg(any(feature = "sqs", feature = "sns"))]
mod aws;
#[cfg(any(feature = "webhook", feature = "sqs", feature = "sns"))]
mod batch;
#[cfg(feature = "cloudevents")]
pub mod cloudevents;
#[cfg(feature = "kafka")]
pub mod kafka;
#[cfg(feature = "mqtt")]
pub mod mqtt;
#[cfg(feature = "nats")]
pub mod nats;
#[cfg(feature = "redis")]
pub mod redis_stream;
#[cfg(feature = "sns")]
pub mod sns;
#[cfg(feature = "sqs")]
pub mod sqs;
mod tls;
#[cfg(feature = "webhook")]
pub mod webhook;

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use crate::Message;

#[cfg(feature = "cloudevents")]
pub use cloudevents::CloudEvents;
#[cfg(feature = "cloudevents")]
#[allow(unused_imports)] // used by the publishers' modules, each behind its feature
pub(crate) use cloudevents::{cloudevents_method, Binding};
pub use tls::TlsFiles;
#[allow(unused_imports)] // used by the publishers' modules, each behind its feature
pub(crate) use tls::{tls_methods, TlsPem};

/// Header (or field) carrying the outbox message id (decimal): the deduplication key for
/// consumers.
pub const ID_HEADER: &str = "txoutbox-id";
/// Header carrying the outbox topic, which the [`TopicMapping`] may have changed.
pub const TOPIC_HEADER: &str = "txoutbox-topic";
/// Header carrying the outbox key, on brokers whose messages have no key of their own;
/// absent for keyless rows.
pub const KEY_HEADER: &str = "txoutbox-key";

/// Which broker topic (Kafka topic, NATS subject, AMQP routing key, Redis stream, ...) a
/// message goes to.
///
/// ```
/// use txoutbox_client::brokers::TopicMapping;
/// use txoutbox_client::Message;
///
/// let message = Message::new(1, "orders.paid", "{}");
/// assert_eq!(TopicMapping::Same.topic_for(&message), "orders.paid");
/// assert_eq!(TopicMapping::prefix("prod.").topic_for(&message), "prod.orders.paid");
/// let by_type = TopicMapping::function(|m: &Message| m.topic.replace('.', "-"));
/// assert_eq!(by_type.topic_for(&message), "orders-paid");
/// ```
#[derive(Clone, Default)]
pub enum TopicMapping {
    /// The outbox topic, unchanged (the default).
    #[default]
    Same,
    /// The outbox topic behind a prefix.
    Prefix(String),
    /// Any function of the message.
    Function(Arc<dyn Fn(&Message) -> String + Send + Sync>),
}

impl TopicMapping {
    /// The outbox topic behind `prefix`.
    pub fn prefix(prefix: impl Into<String>) -> Self {
        Self::Prefix(prefix.into())
    }

    /// A topic computed from the message.
    pub fn function(f: impl Fn(&Message) -> String + Send + Sync + 'static) -> Self {
        Self::Function(Arc::new(f))
    }

    /// The broker topic of `message`.
    pub fn topic_for<'m>(&self, message: &'m Message) -> Cow<'m, str> {
        match self {
            Self::Same => Cow::Borrowed(&message.topic),
            Self::Prefix(prefix) => Cow::Owned(format!("{prefix}{}", message.topic)),
            Self::Function(f) => Cow::Owned(f(message)),
        }
    }
}

impl fmt::Debug for TopicMapping {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Same => f.write_str("Same"),
            Self::Prefix(prefix) => f.debug_tuple("Prefix").field(prefix).finish(),
            Self::Function(_) => f.write_str("Function(..)"),
        }
    }
}

/// The headers a publisher sends with `message`: the row's own, then [`ID_HEADER`],
/// [`TOPIC_HEADER`] and, for a keyed row, [`KEY_HEADER`]. A producer's header of one of
/// those names is left out, so a consumer can trust them.
///
/// ```
/// use txoutbox_client::brokers::carried_headers;
/// use txoutbox_client::Message;
///
/// let message = Message::new(7, "orders.paid", "{}")
///     .with_key("customer-1")
///     .with_header("traceparent", "00-abc")
///     .with_header("txoutbox-id", "forged");
/// let headers: Vec<_> = carried_headers(&message).collect();
/// assert_eq!(
///     headers,
///     [
///         ("traceparent", "00-abc".into()),
///         ("txoutbox-id", "7".into()),
///         ("txoutbox-topic", "orders.paid".into()),
///         ("txoutbox-key", "customer-1".into()),
///     ]
/// );
/// ```
pub fn carried_headers(message: &Message) -> impl Iterator<Item = (&str, Cow<'_, str>)> {
    let own = message
        .headers
        .iter()
        .filter(|(name, _)| !is_reserved(name))
        .map(|(name, value)| (name.as_str(), Cow::Borrowed(value.as_str())));
    let added = [
        Some((ID_HEADER, Cow::Owned(message.id.to_string()))),
        Some((TOPIC_HEADER, Cow::Borrowed(message.topic.as_str()))),
        message
            .key
            .as_deref()
            .map(|key| (KEY_HEADER, Cow::Borrowed(key))),
    ];
    own.chain(added.into_iter().flatten())
}

/// Whether `name` is one of the headers the publishers set themselves.
pub(crate) fn is_reserved(name: &str) -> bool {
    [ID_HEADER, TOPIC_HEADER, KEY_HEADER]
        .iter()
        .any(|reserved| name.eq_ignore_ascii_case(reserved))
}

/// The topic mapping methods every publisher builder has, on a builder with a
/// `topics: TopicMapping` field.
#[allow(unused_macros)] // used by the publishers' modules, each behind its feature
macro_rules! topic_mapping_methods {
    () => {
        /// Sends every message to the broker topic of its outbox topic's name (the
        /// default).
        pub fn same_topic(mut self) -> Self {
            self.topics = $crate::brokers::TopicMapping::Same;
            self
        }

        /// Sends each message to `prefix` followed by its outbox topic.
        pub fn topic_prefix(mut self, prefix: impl Into<String>) -> Self {
            self.topics = $crate::brokers::TopicMapping::prefix(prefix);
            self
        }

        /// Chooses each message's broker topic with `f`.
        pub fn topic_fn(
            mut self,
            f: impl Fn(&$crate::Message) -> String + Send + Sync + 'static,
        ) -> Self {
            self.topics = $crate::brokers::TopicMapping::function(f);
            self
        }

        /// Sets the topic mapping.
        pub fn topics(mut self, topics: $crate::brokers::TopicMapping) -> Self {
            self.topics = topics;
            self
        }
    };
}
#[allow(unused_imports)] // used by the publishers' modules, each behind its feature
pub(crate) use topic_mapping_methods;
