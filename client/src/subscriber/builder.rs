//! The settings of a [`Subscriber`] and the builder that checks them.

use std::sync::Arc;
use std::time::Duration;

use super::{Shared, Subscriber};
use crate::connect::{ConnectOptions, Credentials, Servers};
use crate::events::Reporter;
use crate::{ClientError, Publisher};

/// Largest window the server accepts.
const MAX_WINDOW: u32 = 10_000;
/// Shortest lease the server accepts.
const MIN_LEASE: Duration = Duration::from_millis(100);

/// Everything a subscriber was configured with, checked.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub outbox: String,
    pub name: String,
    pub topics: Vec<String>,
    /// The subscription group to join; empty for an outbox without groups.
    pub group: String,
    pub max_in_flight: u32,
    /// `None`: the outbox's configured lease.
    pub lease: Option<Duration>,
    pub concurrency: usize,
    pub publish_timeout: Duration,
    pub max_lease_extension: Duration,
    pub connect_timeout: Duration,
    pub reconnect_min: Duration,
    pub reconnect_max: Duration,
    pub stop_timeout: Duration,
    /// Start a key's next message once the previous one was published, before its ack
    /// is confirmed.
    pub pipeline_keys: bool,
}

/// Configures a [`Subscriber`]; start with [`Subscriber::builder`].
///
/// ```no_run
/// # fn demo(publisher: impl txoutbox_client::Publisher) -> Result<(), txoutbox_client::ClientError> {
/// use std::time::Duration;
/// use txoutbox_client::Subscriber;
///
/// let subscriber = Subscriber::builder(["http://10.0.0.1:7411", "http://10.0.0.2:7411"], "orders")
///     .name("orders-to-kafka")
///     .topics(["orders.created", "orders.paid"])
///     .max_in_flight(200)
///     .concurrency(16)
///     .lease(Duration::from_secs(30))
///     .publish_timeout(Duration::from_secs(10))
///     .build(publisher)?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct SubscriberBuilder {
    addresses: Vec<String>,
    config: Config,
    credentials: Credentials,
}

impl SubscriberBuilder {
    pub(super) fn new(addresses: Vec<String>, outbox: String) -> Self {
        Self {
            addresses,
            config: Config {
                outbox,
                name: "txoutbox-rust".to_owned(),
                topics: Vec::new(),
                group: String::new(),
                max_in_flight: 100,
                lease: None,
                concurrency: 10,
                publish_timeout: Duration::from_secs(10),
                max_lease_extension: Duration::from_secs(300),
                connect_timeout: Duration::from_secs(5),
                reconnect_min: Duration::from_millis(100),
                reconnect_max: Duration::from_secs(10),
                stop_timeout: Duration::from_secs(30),
                pipeline_keys: true,
            },
            credentials: Credentials::default(),
        }
    }

    /// A bearer token and TLS settings for `https://` servers (default: none).
    pub fn credentials(mut self, credentials: Credentials) -> Self {
        self.credentials = credentials;
        self
    }

    /// Whether a key's next message starts once the previous one was published (`true`,
    /// the default) or only once the server confirmed its ack (`false`). Pipelining is what
    /// makes a hot key fast (one round trip per batch instead of per message); without it,
    /// after a crash or a lost connection at most the last message of each key repeats,
    /// where with it a key resumes from its first unconfirmed message and several may
    /// repeat, in order.
    pub fn pipeline_keys(mut self, pipeline: bool) -> Self {
        self.config.pipeline_keys = pipeline;
        self
    }

    /// A name for this subscriber in the server's logs and stats (default `txoutbox-rust`).
    /// Several subscribers may share a name.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.config.name = name.into();
        self
    }

    /// Only receive messages of these topics (default: every topic).
    pub fn topics<I, S>(mut self, topics: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.config.topics = topics.into_iter().map(Into::into).collect();
        self
    }

    /// Join this subscription group of the outbox (required when the outbox declares
    /// groups): the group receives every row, shared among its subscribers by key, in
    /// key order, each group independently of the others.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let subscriber = txoutbox_client::Subscriber::builder(["http://127.0.0.1:7411"], "orders")
    ///     .group("search-indexer");
    /// # Ok(()) }
    /// ```
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.config.group = group.into();
        self
    }

    /// Flow control: the most messages held unanswered at once, 1 to 10000 (default 100).
    /// Messages of one key wait in this window while an earlier one publishes.
    pub fn max_in_flight(mut self, window: u32) -> Self {
        self.config.max_in_flight = window;
        self
    }

    /// The lease asked for each message (default: the outbox's configured lease). The
    /// runtime extends it while a message waits or publishes, so it can be short: it is
    /// how quickly messages come back after this client dies.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.config.lease = Some(lease);
        self
    }

    /// Most publishes running at once, each of a different key (default 10).
    pub fn concurrency(mut self, concurrency: usize) -> Self {
        self.config.concurrency = concurrency;
        self
    }

    /// A publish still running after this is cancelled and nacked (default 10s).
    pub fn publish_timeout(mut self, timeout: Duration) -> Self {
        self.config.publish_timeout = timeout;
        self
    }

    /// How far beyond its first lease a message's lease may be extended while it waits
    /// or publishes (default 5 minutes). Past it the lease runs out and the server
    /// redelivers the message; zero turns extension off.
    pub fn max_lease_extension(mut self, limit: Duration) -> Self {
        self.config.max_lease_extension = limit;
        self
    }

    /// Timeout of each connection attempt (default 5s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.config.connect_timeout = timeout;
        self
    }

    /// Reconnection delays: exponential from `min` to `max`, with jitter (default 100ms
    /// to 10s).
    pub fn reconnect_backoff(mut self, min: Duration, max: Duration) -> Self {
        self.config.reconnect_min = min;
        self.config.reconnect_max = max;
        self
    }

    /// How long a graceful stop may take (finishing publishes, answering, giving back)
    /// before the stream is dropped (default 30s). What is still held then comes back
    /// from the server with its attempt counted.
    pub fn stop_timeout(mut self, timeout: Duration) -> Self {
        self.config.stop_timeout = timeout;
        self
    }

    /// Checks the settings and builds the subscriber around `publisher`. Nothing is
    /// connected yet: that happens when it runs.
    pub fn build(self, publisher: impl Publisher) -> Result<Subscriber, ClientError> {
        self.build_shared(Arc::new(publisher))
    }

    /// Like [`build`](Self::build), for a publisher shared with other code.
    pub fn build_shared(self, publisher: Arc<dyn Publisher>) -> Result<Subscriber, ClientError> {
        let config = self.config;
        validate(&config)?;
        let options = ConnectOptions {
            connect_timeout: config.connect_timeout,
            credentials: self.credentials,
            ..ConnectOptions::default()
        };
        let servers = Servers::parse(self.addresses, options)?;
        Ok(Subscriber {
            shared: Arc::new(Shared {
                config,
                publisher,
                reporter: Reporter::default(),
            }),
            servers,
        })
    }
}

fn validate(config: &Config) -> Result<(), ClientError> {
    let problem = |text: String| Err(ClientError::Config(text));
    if config.outbox.is_empty() {
        return problem("the outbox name is empty".to_owned());
    }
    if config.name.is_empty() {
        return problem("name: must not be empty".to_owned());
    }
    if config.topics.iter().any(String::is_empty) {
        return problem(
            "topics: holds an empty topic; leave the filter empty to receive every topic"
                .to_owned(),
        );
    }
    if config.max_in_flight == 0 || config.max_in_flight > MAX_WINDOW {
        return problem(format!(
            "max_in_flight = {}: must be within 1..={MAX_WINDOW}",
            config.max_in_flight
        ));
    }
    if config.lease.is_some_and(|lease| lease < MIN_LEASE) {
        return problem("lease: must be at least 100ms".to_owned());
    }
    if config.concurrency == 0 {
        return problem("concurrency: must be at least 1".to_owned());
    }
    if config.publish_timeout.is_zero() {
        return problem("publish_timeout: must be positive".to_owned());
    }
    if config.reconnect_min.is_zero() || config.reconnect_max < config.reconnect_min {
        return problem("reconnect_backoff: need 0 < min <= max".to_owned());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Message, PublishError};

    async fn noop(_: Message) -> Result<(), PublishError> {
        Ok(())
    }

    #[test]
    fn bad_settings_are_named() {
        let builder = || Subscriber::builder(["http://127.0.0.1:1"], "orders");
        let error = builder().max_in_flight(0).build(noop).unwrap_err();
        assert!(error.to_string().contains("max_in_flight"), "{error}");
        let error = builder().concurrency(0).build(noop).unwrap_err();
        assert!(error.to_string().contains("concurrency"), "{error}");
        let error = builder()
            .lease(Duration::from_millis(5))
            .build(noop)
            .unwrap_err();
        assert!(error.to_string().contains("lease"), "{error}");
        let error = Subscriber::builder(["::"], "orders")
            .build(noop)
            .unwrap_err();
        assert!(
            matches!(error, ClientError::InvalidAddress { .. }),
            "{error}"
        );
        assert!(builder().build(noop).is_ok());
    }
}
