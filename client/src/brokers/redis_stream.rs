//! Publishing to Redis Streams (feature `redis`): [`RedisStreamPublisher`] appends each
//! message with `XADD` and returns once Redis answered with the entry's id.
//!
//! | outbox | Redis stream entry |
//! | --- | --- |
//! | `topic` | the stream's key, through the [`TopicMapping`] (same name, a prefix, or a function); also field `topic` |
//! | `id` | field `id` (decimal): deduplicate on it |
//! | `key` | field `key` (absent for keyless rows) |
//! | `payload` | field `payload`, byte for byte |
//! | `headers` | field `headers`, a JSON object (absent when the row has none) |
//!
//! Entries get Redis' own ids (`*`), in the order the runtime publishes them: one key's
//! messages one after another. [`RedisStreamPublisherBuilder::max_len`] trims the stream
//! (`MAXLEN ~ N`, approximately, as Redis does cheaply). Redis acknowledges a write once
//! it is in memory: whether it survives a restart is Redis' persistence setting
//! (`appendonly yes`, `appendfsync`), not this publisher's.
//!
//! TLS: a `rediss://` URL, with [`RedisStreamPublisherBuilder::tls_ca`] for a private CA
//! and [`RedisStreamPublisherBuilder::tls_client_cert`] for a Redis that requires client
//! certificates (`tls-auth-clients yes`); a password goes in the URL
//! (`rediss://:PASSWORD@host:6380` or `rediss://USER:PASSWORD@...` for an ACL user).
//!
//! Errors (`classify`, the one place they are sorted): a key that holds something other
//! than a stream (`WRONGTYPE`) is permanent; everything else (connection refused or lost,
//! no answer within `response_timeout`, default 5s, `OOM`, a replica that is read-only,
//! loading) is retried. The connection is made by the first publish and made again after
//! it is lost.
//!
//! ```no_run
//! use txoutbox_client::redis_stream::RedisStreamPublisher;
//! use txoutbox_client::Subscriber;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let redis = RedisStreamPublisher::builder("redis://127.0.0.1:6379")
//!     .topic_prefix("outbox:") // orders.paid -> stream outbox:orders.paid
//!     .max_len(1_000_000)
//!     .build()?;
//! Subscriber::builder(["http://127.0.0.1:7411"], "orders")
//!     .build(redis)?
//!     .run_until_signal()
//!     .await?;
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::sync::OnceCell;

use crate::brokers::{Binding, CloudEvents, TlsFiles, TopicMapping};
use crate::{ClientError, Message, PublishError, Publisher};

/// The redis crate itself.
pub use redis;

/// Default wait for Redis' answer: below the subscriber's default `publish_timeout` (10s).
const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Configures a [`RedisStreamPublisher`]; start with [`RedisStreamPublisher::builder`].
#[must_use]
#[derive(Debug, Clone)]
pub struct RedisStreamPublisherBuilder {
    url: String,
    topics: TopicMapping,
    max_len: Option<u64>,
    response_timeout: Duration,
    tls: TlsFiles,
    cloudevents: Option<CloudEvents>,
}

impl RedisStreamPublisherBuilder {
    crate::brokers::topic_mapping_methods!();
    crate::brokers::tls_methods!();
    crate::brokers::cloudevents_method!();

    /// Trims each stream to about `max_len` entries on every append (`MAXLEN ~`).
    pub fn max_len(mut self, max_len: u64) -> Self {
        self.max_len = Some(max_len);
        self
    }

    /// How long a publish waits for Redis' answer (default 5s), and for a connection.
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// Checks the URL. The connection is made by the first publish: an unreachable Redis
    /// means nacked publishes, not an error here.
    pub fn build(self) -> Result<RedisStreamPublisher, ClientError> {
        let invalid = |error: redis::RedisError| {
            ClientError::Config(format!(
                "invalid Redis URL `{}`: {error}; use for example redis://127.0.0.1:6379, or \
                 rediss://127.0.0.1:6380 for TLS",
                self.url
            ))
        };
        let client = if self.tls.is_set() {
            if !self.url.starts_with("rediss://") {
                return Err(ClientError::Config(format!(
                    "TLS files are set but the Redis URL `{}` is not rediss://; use rediss://",
                    self.url
                )));
            }
            let pem = self.tls.read()?;
            let certificates = redis::TlsCertificates {
                client_tls: pem
                    .client
                    .map(|(client_cert, client_key)| redis::ClientTlsConfig {
                        client_cert,
                        client_key,
                    }),
                root_cert: pem.ca,
            };
            redis::Client::build_with_tls(self.url.as_str(), certificates).map_err(invalid)?
        } else {
            redis::Client::open(self.url.as_str()).map_err(invalid)?
        };
        Ok(RedisStreamPublisher {
            client,
            connection: OnceCell::new(),
            topics: self.topics,
            max_len: self.max_len,
            response_timeout: self.response_timeout,
            cloudevents: self.cloudevents,
        })
    }
}

/// Appends outbox messages to Redis streams; see the [module documentation](self) for the
/// entry's fields and the errors.
pub struct RedisStreamPublisher {
    client: redis::Client,
    /// Made by the first publish that reaches Redis; it reconnects by itself after.
    connection: OnceCell<ConnectionManager>,
    topics: TopicMapping,
    max_len: Option<u64>,
    response_timeout: Duration,
    cloudevents: Option<CloudEvents>,
}

impl fmt::Debug for RedisStreamPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStreamPublisher")
            .field("topics", &self.topics)
            .field("max_len", &self.max_len)
            .finish_non_exhaustive()
    }
}

impl RedisStreamPublisher {
    /// Starts configuring a publisher to the Redis at `url` (`redis://host:6379/db`).
    pub fn builder(url: impl Into<String>) -> RedisStreamPublisherBuilder {
        RedisStreamPublisherBuilder {
            url: url.into(),
            topics: TopicMapping::Same,
            max_len: None,
            response_timeout: DEFAULT_RESPONSE_TIMEOUT,
            tls: TlsFiles::default(),
            cloudevents: None,
        }
    }

    /// The `XADD` command for `message` into `stream`.
    pub fn command(&self, stream: &str, message: &Message) -> redis::Cmd {
        let mut command = redis::cmd("XADD");
        command.arg(stream);
        if let Some(max_len) = self.max_len {
            command.arg("MAXLEN").arg("~").arg(max_len);
        }
        command
            .arg("*")
            .arg("id")
            .arg(message.id)
            .arg("topic")
            .arg(&message.topic);
        if let Some(key) = &message.key {
            command.arg("key").arg(key);
        }
        match &self.cloudevents {
            Some(events) => {
                let envelope = events.envelope(message, Binding::Redis);
                command.arg("payload").arg(&envelope.body[..]);
                command.arg("content-type").arg(envelope.content_type);
            }
            None => {
                command.arg("payload").arg(&message.payload[..]);
            }
        }
        if !message.headers.is_empty() {
            let headers = serde_json::to_string(&message.headers).expect("strings serialize");
            command.arg("headers").arg(headers);
        }
        command
    }

    async fn connection(&self) -> Result<ConnectionManager, PublishError> {
        let connection = self
            .connection
            .get_or_try_init(|| async {
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(self.response_timeout)
                    .set_response_timeout(self.response_timeout)
                    .set_number_of_retries(2)
                    .set_max_delay(1_000);
                ConnectionManager::new_with_config(self.client.clone(), config).await
            })
            .await
            .map_err(|error| PublishError::new(format!("redis: connecting: {error}")))?;
        Ok(connection.clone())
    }
}

#[async_trait::async_trait]
impl Publisher for RedisStreamPublisher {
    async fn publish(&self, message: &Message) -> Result<(), PublishError> {
        let stream = self.topics.topic_for(message);
        // The connection manager's response timeout covers one answer, not its wait for a
        // reconnection (retries with backoff while Redis is down): bound the whole publish,
        // so that a stopped Redis comes back as this publisher's error, naming the stream,
        // before the runtime's own publish timeout.
        let appended = tokio::time::timeout(self.response_timeout, async {
            let mut connection = self.connection().await?;
            self.command(&stream, message)
                .query_async::<String>(&mut connection)
                .await
                .map_err(|error| classify(&stream, error))
        })
        .await;
        match appended {
            Ok(Ok(entry)) => {
                tracing::trace!(id = message.id, %stream, %entry, "appended to the redis stream");
                Ok(())
            }
            Ok(Err(error)) => Err(error),
            Err(_) => Err(PublishError::new(format!(
                "redis stream `{stream}`: no answer within {:?} (Redis down or reconnecting)",
                self.response_timeout
            ))),
        }
    }
}

/// The one place Redis errors are sorted into retried and permanent.
fn classify(stream: &str, error: redis::RedisError) -> PublishError {
    let text = format!("redis stream `{stream}`: {error}");
    if error.code() == Some("WRONGTYPE") {
        PublishError::permanent(text)
    } else {
        PublishError::new(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_carries_the_fields_and_the_trim() {
        let publisher = RedisStreamPublisher::builder("redis://127.0.0.1:6379")
            .max_len(1000)
            .build()
            .unwrap();
        let message = Message::new(4, "orders", "p")
            .with_key("k")
            .with_header("traceparent", "00-a");
        let packed =
            String::from_utf8(publisher.command("s", &message).get_packed_command()).unwrap();
        // `*N`, then `$LEN` and the word for each word.
        let words: Vec<&str> = packed.split("\r\n").skip(2).step_by(2).collect();
        assert_eq!(
            words,
            [
                "XADD",
                "s",
                "MAXLEN",
                "~",
                "1000",
                "*",
                "id",
                "4",
                "topic",
                "orders",
                "key",
                "k",
                "payload",
                "p",
                "headers",
                r#"{"traceparent":"00-a"}"#
            ]
        );
    }

    #[test]
    fn a_bad_url_is_a_configuration_error() {
        let error = RedisStreamPublisher::builder("http://x")
            .build()
            .unwrap_err();
        assert!(error.to_string().contains("invalid Redis URL"), "{error}");
    }
}
