//! Publishing to RabbitMQ over AMQP 0-9-1 (feature `amqp`): [`AmqpPublisher`] returns only
//! once the broker confirmed the message (publisher confirms) and routed it to a queue.
//!
//! | outbox | AMQP |
//! | --- | --- |
//! | (the publisher's) | the exchange, chosen once: `AmqpPublisher::builder(URI, EXCHANGE)` |
//! | `topic` | the routing key, through the [`TopicMapping`] (same name, a prefix, or a function); also the `type` property |
//! | `id` | the `message_id` property, and header `txoutbox-id` |
//! | `key` | header `txoutbox-key` |
//! | `payload` | the body, byte for byte; delivery mode 2 (persistent) |
//! | `headers` | the headers (strings), plus `txoutbox-id`, `txoutbox-topic`, `txoutbox-key` |
//! | `created_at` | the `timestamp` property (seconds) |
//!
//! Every publish is `mandatory`: a message no queue is bound for comes back from the
//! broker (basic.return) and is a permanent failure, dead-lettered, unless
//! [`AmqpPublisherBuilder::retry_unroutable`] says to retry it (until a queue is bound).
//!
//! **Per-key order downstream.** The runtime publishes the messages of one key one after
//! another, so they enter the exchange in order. To keep them in order to consumers,
//! either give a queue one consumer at a time (`x-single-active-consumer: true` among the
//! queue's arguments), or spread keys over queues with the consistent-hash exchange
//! (`rabbitmq-plugins enable rabbitmq_consistent_hash_exchange`; an exchange of type
//! `x-consistent-hash` with the argument `hash-header: txoutbox-key`, so that one key
//! always goes to one queue) and one single active consumer per queue.
//!
//! Errors (`classify`, the one place they are sorted):
//!
//! | failure | outcome |
//! | --- | --- |
//! | unroutable (returned with NO_ROUTE) | permanent, unless `retry_unroutable(true)` |
//! | the broker refused the message itself (PRECONDITION_FAILED such as a body over `max_message_size`, CONTENT_TOO_LARGE), a routing key over 255 bytes | permanent |
//! | the broker nacked it (could not store it), no confirm within `confirm_timeout` (default 5s) | retried |
//! | connection refused or lost, a missing exchange (NOT_FOUND), a missing permission (ACCESS_REFUSED), anything else | retried |
//!
//! A failed publish drops the connection when it is no longer usable; the next publish
//! connects again. A missing exchange is retried rather than dead-lettered, as Kafka's
//! missing topic is: it is the operator's setting, not the message, that is wrong.
//!
//! TLS: an `amqps://` URI (port 5671 by default), with [`AmqpPublisherBuilder::tls_ca`]
//! for a private CA and [`AmqpPublisherBuilder::tls_client_cert`] for a listener that
//! verifies peers (`ssl_options.verify = verify_peer`, `fail_if_no_peer_cert = true`). The
//! user and password stay in the URI; with RabbitMQ's `rabbitmq_auth_mechanism_ssl`
//! plugin, `?auth_mechanism=external` makes the certificate the identity instead.
//!
//! ```no_run
//! use txoutbox_client::amqp::AmqpPublisher;
//! use txoutbox_client::Subscriber;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let rabbit = AmqpPublisher::builder("amqp://guest:guest@127.0.0.1:5672/%2f", "events")
//!     .build()?;
//! Subscriber::builder(["http://127.0.0.1:7411"], "orders")
//!     .build(rabbit)?
//!     .run_until_signal()
//!     .await?;
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::time::{Duration, UNIX_EPOCH};

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::tcp::{OwnedIdentity, OwnedTLSConfig};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, ErrorKind};
use tokio::sync::Mutex;

use crate::brokers::{carried_headers, Binding, CloudEvents, TlsFiles, TopicMapping};
use crate::{ClientError, Message, PublishError, Publisher};

/// lapin itself, for its error and property types.
pub use lapin;

/// Default wait for the broker's confirm: below the subscriber's default
/// `publish_timeout` (10s).
const DEFAULT_CONFIRM_TIMEOUT: Duration = Duration::from_secs(5);
/// How long making a connection and its channel may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Delivery mode of messages the broker writes to disk (in durable queues).
const PERSISTENT: u8 = 2;

/// Configures an [`AmqpPublisher`]; start with [`AmqpPublisher::builder`].
#[must_use]
#[derive(Debug, Clone)]
pub struct AmqpPublisherBuilder {
    uri: String,
    exchange: String,
    topics: TopicMapping,
    confirm_timeout: Duration,
    retry_unroutable: bool,
    tls: TlsFiles,
    cloudevents: Option<CloudEvents>,
}

impl AmqpPublisherBuilder {
    crate::brokers::topic_mapping_methods!();
    crate::brokers::tls_methods!();
    crate::brokers::cloudevents_method!();

    /// How long a publish waits for the broker's confirm (default 5s) before the row is
    /// nacked and retried. Keep it below the subscriber's `publish_timeout` (default 10s).
    pub fn confirm_timeout(mut self, timeout: Duration) -> Self {
        self.confirm_timeout = timeout;
        self
    }

    /// Retries an unroutable message (no queue bound for its routing key) instead of
    /// dead-lettering it: for setups where queues are bound after the relay starts.
    pub fn retry_unroutable(mut self, retry: bool) -> Self {
        self.retry_unroutable = retry;
        self
    }

    /// Checks the URI. The connection is made by the first publish: an unreachable
    /// broker means nacked publishes, not an error here.
    pub fn build(self) -> Result<AmqpPublisher, ClientError> {
        self.uri.parse::<lapin::uri::AMQPUri>().map_err(|error| {
            ClientError::Config(format!(
                "invalid AMQP URI: {error}; use for example amqp://guest:guest@127.0.0.1:5672/%2f"
            ))
        })?;
        if self.exchange.len() > 255 {
            return Err(ClientError::Config(
                "the AMQP exchange name is longer than 255 bytes".to_owned(),
            ));
        }
        let pem = self.tls.read()?;
        let tls = OwnedTLSConfig {
            identity: pem
                .client
                .map(|(pem, key)| OwnedIdentity::PKCS8 { pem, key }),
            cert_chain: pem.ca.map(|ca| String::from_utf8_lossy(&ca).into_owned()),
        };
        Ok(AmqpPublisher {
            builder: self,
            tls,
            link: Mutex::new(None),
        })
    }
}

/// Publishes outbox messages to a RabbitMQ exchange with publisher confirms; see the
/// [module documentation](self) for the mapping, the ordering setups and the errors.
pub struct AmqpPublisher {
    builder: AmqpPublisherBuilder,
    /// The TLS files, read by `build`, for an `amqps://` URI.
    tls: OwnedTLSConfig,
    /// The connection in use and its generation: a failure replaces only the connection
    /// it happened on, however many publishes saw it.
    link: Mutex<Option<Link>>,
}

struct Link {
    generation: u64,
    /// Kept so the connection stays open as long as its channel is used.
    _connection: Connection,
    channel: Channel,
}

impl fmt::Debug for AmqpPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AmqpPublisher")
            .field("exchange", &self.builder.exchange)
            .field("topics", &self.builder.topics)
            .finish_non_exhaustive()
    }
}

impl AmqpPublisher {
    /// Starts configuring a publisher to `exchange` at the broker of `uri`
    /// (`amqp://user:password@host:5672/vhost`, `amqps://` for TLS). The exchange must
    /// exist; `""` is the default exchange, which routes to the queue named by the
    /// routing key.
    pub fn builder(uri: impl Into<String>, exchange: impl Into<String>) -> AmqpPublisherBuilder {
        AmqpPublisherBuilder {
            uri: uri.into(),
            exchange: exchange.into(),
            topics: TopicMapping::Same,
            confirm_timeout: DEFAULT_CONFIRM_TIMEOUT,
            retry_unroutable: false,
            tls: TlsFiles::default(),
            cloudevents: None,
        }
    }

    /// The properties of the AMQP message for `message`.
    pub fn properties(message: &Message) -> BasicProperties {
        let mut headers = FieldTable::default();
        for (name, value) in carried_headers(message) {
            headers.insert(
                ShortString::from(name),
                AMQPValue::LongString(LongString::from(value.as_bytes())),
            );
        }
        let mut properties = BasicProperties::default()
            .with_delivery_mode(PERSISTENT)
            .with_message_id(ShortString::from(message.id.to_string()))
            .with_type(ShortString::from(message.topic.as_str()))
            .with_app_id(ShortString::from("txoutbox"))
            .with_headers(headers);
        if let Some(created) = message.created_at {
            if let Ok(since_epoch) = created.duration_since(UNIX_EPOCH) {
                properties = properties.with_timestamp(since_epoch.as_secs());
            }
        }
        properties
    }

    /// The channel of the current connection, connecting first when there is none or
    /// it broke.
    async fn channel(&self) -> Result<(u64, Channel), PublishError> {
        let mut link = self.link.lock().await;
        if let Some(current) = link.as_ref() {
            if current.channel.status().connected() {
                return Ok((current.generation, current.channel.clone()));
            }
        }
        let generation = link.as_ref().map_or(0, |l| l.generation + 1);
        let connect = async {
            let connection = Connection::connect_with_config(
                &self.builder.uri,
                ConnectionProperties::default(),
                self.tls.clone(),
                lapin::runtime::default_runtime()?,
            )
            .await?;
            let channel = connection.create_channel().await?;
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await?;
            Ok::<_, lapin::Error>((connection, channel))
        };
        let (connection, channel) = match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
            Ok(Ok(made)) => made,
            Ok(Err(error)) => return Err(PublishError::new(format!("amqp: connecting: {error}"))),
            Err(_) => {
                return Err(PublishError::new(format!(
                    "amqp: connecting took over {}s",
                    CONNECT_TIMEOUT.as_secs()
                )))
            }
        };
        tracing::info!(generation, "connected to the AMQP broker");
        *link = Some(Link {
            generation,
            _connection: connection,
            channel: channel.clone(),
        });
        Ok((generation, channel))
    }

    /// Drops the connection of `generation` (if still the current one), so the next
    /// publish connects again: after a confirm that never came, it may be a dead link.
    async fn drop_link(&self, generation: u64) {
        let mut link = self.link.lock().await;
        if link.as_ref().is_some_and(|l| l.generation == generation) {
            if let Some(old) = link.take() {
                // Closing may wait on a dead link: not in the publish's way.
                tokio::spawn(async move {
                    let close = old._connection.close(0, "txoutbox: reconnecting".into());
                    let _ = tokio::time::timeout(Duration::from_secs(1), close).await;
                });
            }
        }
    }

    async fn publish_on(
        &self,
        channel: &Channel,
        routing_key: &str,
        message: &Message,
    ) -> Result<Confirmation, Failure> {
        let options = BasicPublishOptions {
            mandatory: true,
            immediate: false,
        };
        let mut properties = Self::properties(message);
        let mut body = message.payload.clone();
        if let Some(events) = &self.builder.cloudevents {
            let envelope = events.envelope(message, Binding::Amqp);
            let mut headers = match envelope.replaces_headers {
                true => FieldTable::default(),
                false => properties.headers().clone().unwrap_or_default(),
            };
            for (name, value) in &envelope.headers {
                headers.insert(
                    ShortString::from(name.as_str()),
                    AMQPValue::LongString(LongString::from(value.as_bytes())),
                );
            }
            properties = properties
                .with_headers(headers)
                .with_content_type(ShortString::from(envelope.content_type));
            body = envelope.body;
        }
        let confirm = channel
            .basic_publish(
                ShortString::from(self.builder.exchange.as_str()),
                ShortString::from(routing_key),
                options,
                &body,
                properties,
            )
            .await
            .map_err(Failure::Broker)?;
        match tokio::time::timeout(self.builder.confirm_timeout, confirm).await {
            Ok(confirmation) => confirmation.map_err(Failure::Broker),
            Err(_) => Err(Failure::NoConfirm(self.builder.confirm_timeout)),
        }
    }
}

/// Why a publish did not get a positive confirm.
enum Failure {
    Broker(lapin::Error),
    NoConfirm(Duration),
    Nacked,
    Unroutable { code: u16, text: String },
}

#[async_trait::async_trait]
impl Publisher for AmqpPublisher {
    async fn publish(&self, message: &Message) -> Result<(), PublishError> {
        let routing_key = self.builder.topics.topic_for(message);
        if routing_key.len() > 255 {
            return Err(PublishError::permanent(format!(
                "amqp routing key `{routing_key}` is longer than 255 bytes"
            )));
        }
        let (generation, channel) = self.channel().await?;
        let outcome = match self.publish_on(&channel, &routing_key, message).await {
            Ok(Confirmation::Ack(None) | Confirmation::NotRequested) => Ok(()),
            Ok(Confirmation::Ack(Some(returned))) => Err(Failure::Unroutable {
                code: returned.reply_code,
                text: returned.reply_text.to_string(),
            }),
            Ok(Confirmation::Nack(_)) => Err(Failure::Nacked),
            Err(failure) => Err(failure),
        };
        let Err(failure) = outcome else {
            tracing::trace!(id = message.id, %routing_key, "confirmed by the amqp broker");
            return Ok(());
        };
        if matches!(failure, Failure::NoConfirm(_)) || !channel.status().connected() {
            self.drop_link(generation).await;
        }
        Err(classify(
            &self.builder.exchange,
            &routing_key,
            failure,
            self.builder.retry_unroutable,
        ))
    }
}

/// The one place AMQP failures are sorted into retried and permanent (the table of the
/// module documentation).
fn classify(
    exchange: &str,
    routing_key: &str,
    failure: Failure,
    retry_unroutable: bool,
) -> PublishError {
    let at = format!("amqp exchange `{exchange}` routing key `{routing_key}`");
    match failure {
        Failure::Unroutable { code, text } => {
            let error = PublishError::new(format!(
                "{at}: returned unroutable ({code} {text}): no queue is bound for it"
            ));
            if retry_unroutable {
                error
            } else {
                error.into_permanent()
            }
        }
        Failure::Nacked => PublishError::new(format!("{at}: the broker nacked it")),
        Failure::NoConfirm(timeout) => {
            PublishError::new(format!("{at}: no confirm within {}ms", timeout.as_millis()))
        }
        Failure::Broker(error) => {
            let permanent = matches!(
                error.kind(),
                ErrorKind::ProtocolError(amqp) if matches!(
                    amqp.kind(),
                    AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED | AMQPSoftError::CONTENTTOOLARGE)
                )
            );
            let error = PublishError::new(format!("{at}: {error}"));
            if permanent {
                error.into_permanent()
            } else {
                error
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use lapin::protocol::AMQPError;

    use super::*;

    fn protocol_error(kind: AMQPSoftError) -> Failure {
        let error = AMQPError::new(AMQPErrorKind::Soft(kind), "refused".into());
        Failure::Broker(lapin::Error::from(ErrorKind::ProtocolError(error)))
    }

    #[test]
    fn unroutable_and_refused_messages_are_permanent_the_rest_retried() {
        let unroutable = || Failure::Unroutable {
            code: 312,
            text: "NO_ROUTE".into(),
        };
        let error = classify("x", "k", unroutable(), false);
        assert!(error.is_permanent(), "{error}");
        assert!(
            error
                .text()
                .starts_with("amqp exchange `x` routing key `k`: returned unroutable"),
            "{error}"
        );
        assert!(!classify("x", "k", unroutable(), true).is_permanent());
        assert!(classify(
            "x",
            "k",
            protocol_error(AMQPSoftError::PRECONDITIONFAILED),
            false
        )
        .is_permanent());
        for retried in [
            protocol_error(AMQPSoftError::NOTFOUND),
            protocol_error(AMQPSoftError::ACCESSREFUSED),
            Failure::Nacked,
            Failure::NoConfirm(Duration::from_secs(1)),
        ] {
            assert!(!classify("x", "k", retried, false).is_permanent());
        }
    }

    #[test]
    fn properties_carry_the_id_key_and_headers_persistently() {
        let message = Message::new(5, "orders.paid", "{}")
            .with_key("customer-1")
            .with_header("traceparent", "00-abc");
        let properties = AmqpPublisher::properties(&message);
        assert_eq!(properties.delivery_mode(), &Some(PERSISTENT));
        assert_eq!(properties.message_id().as_ref().unwrap().as_str(), "5");
        let headers = properties.headers().as_ref().unwrap().inner();
        let text = |name: &str| match headers.get(name) {
            Some(AMQPValue::LongString(value)) => {
                String::from_utf8_lossy(value.as_bytes()).into_owned()
            }
            other => panic!("{name}: {other:?}"),
        };
        assert_eq!(text("txoutbox-key"), "customer-1");
        assert_eq!(text("txoutbox-id"), "5");
        assert_eq!(text("traceparent"), "00-abc");
    }

    #[test]
    fn a_bad_uri_is_a_configuration_error() {
        let error = AmqpPublisher::builder("http://nope", "x")
            .build()
            .unwrap_err();
        assert!(error.to_string().contains("invalid AMQP URI"), "{error}");
    }
}
