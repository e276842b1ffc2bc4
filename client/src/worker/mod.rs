//! One round at a time over the unary calls, for cron jobs and scripts: claim a batch,
//! publish it (per key in order, keys concurrently), answer every message, return what
//! happened: a relay loop's `run_once`, with the server doing the bookkeeping (leases,
//! retries, dead letters), so a cron job needs no state of its own.

mod round;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::broadcast;
use tokio::time::Instant;

use crate::connect::{ConnectOptions, Connection, Credentials, Servers};
use crate::events::{Count, Counters, Event, Reporter};
use crate::proto::v1;
use crate::proto::v1::relay_client::RelayClient;
use crate::{ClientError, Message, Publisher};
use round::{group_by_key, Round, RoundState};

/// What one [`Worker::run_once`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RoundResult {
    /// Messages claimed.
    pub claimed: usize,
    /// Messages published and acked.
    pub published: usize,
    /// Failed publishes whose retry the server scheduled.
    pub retried: usize,
    /// Messages dead-lettered (a permanent error, or a failure on the last attempt).
    pub dead_lettered: usize,
    /// Messages given back untried behind a failed or lost message of their key.
    pub blocked: usize,
    /// Messages whose lease was lost or whose answer could not be delivered: the server
    /// redelivers them once their lease runs out.
    pub lost: usize,
}

impl RoundResult {
    /// Failed publishes: retried plus dead-lettered.
    pub fn failed(&self) -> usize {
        self.retried + self.dead_lettered
    }
}

/// A worker id unique to this process: `host:pid:random`.
pub fn default_worker_id() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "host".to_owned());
    let random = uuid::Uuid::new_v4().simple().to_string();
    format!("{host}:{}:{}", std::process::id(), &random[..8])
}

/// Publishes an outbox one round at a time over the unary calls (`Claim`, `Ack`, `Nack`,
/// `Release`, `DeadLetter`, `ExtendLease`), under a worker id the caller chooses.
///
/// ```no_run
/// use txoutbox_client::{Message, PublishError, Worker};
///
/// # async fn demo() -> Result<(), txoutbox_client::ClientError> {
/// let worker = Worker::builder(["http://127.0.0.1:7411"], "orders", "nightly-cron")
///     .batch_size(500)
///     .build(|message: Message| async move {
///         println!("{}", message.id);
///         Ok::<_, PublishError>(())
///     })?;
/// loop {
///     let round = worker.run_once().await?;
///     if round.claimed == 0 {
///         break;
///     }
///     println!("{round:?}");
/// }
/// # Ok(())
/// # }
/// ```
pub struct Worker {
    config: WorkerConfig,
    servers: Servers,
    /// The connection of earlier rounds; forgotten when a call fails on it.
    channel: Mutex<Option<(String, Connection)>>,
    publisher: Arc<dyn Publisher>,
    reporter: Reporter,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("servers", &self.servers.addresses())
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Clone)]
struct WorkerConfig {
    outbox: String,
    worker_id: String,
    topics: Vec<String>,
    batch_size: u32,
    lease: Duration,
    concurrency: usize,
    publish_timeout: Duration,
    max_lease_extension: Duration,
}

/// Configures a [`Worker`]; start with [`Worker::builder`].
#[derive(Debug, Clone)]
#[must_use]
pub struct WorkerBuilder {
    addresses: Vec<String>,
    config: WorkerConfig,
    connect_timeout: Duration,
    credentials: Credentials,
}

impl WorkerBuilder {
    /// Only claim these topics (default: every topic).
    pub fn topics<I, S>(mut self, topics: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.config.topics = topics.into_iter().map(Into::into).collect();
        self
    }

    /// Most messages claimed per round, 1 to 10000 (default 50; the server may cap it).
    pub fn batch_size(mut self, batch_size: u32) -> Self {
        self.config.batch_size = batch_size;
        self
    }

    /// Lease of each claimed message (default 60s); extended while the round runs, up
    /// to `max_lease_extension`.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.config.lease = lease;
        self
    }

    /// Most keys published at once (default 10).
    pub fn concurrency(mut self, concurrency: usize) -> Self {
        self.config.concurrency = concurrency;
        self
    }

    /// A publish still running after this is cancelled and nacked (default 10s).
    pub fn publish_timeout(mut self, timeout: Duration) -> Self {
        self.config.publish_timeout = timeout;
        self
    }

    /// How far beyond the first lease the round may extend it (default 5 minutes).
    pub fn max_lease_extension(mut self, limit: Duration) -> Self {
        self.config.max_lease_extension = limit;
        self
    }

    /// Timeout of each connection attempt (default 5s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// A bearer token and TLS settings for `https://` servers (default: none).
    pub fn credentials(mut self, credentials: Credentials) -> Self {
        self.credentials = credentials;
        self
    }

    /// Checks the settings and builds the worker. Nothing is connected yet.
    pub fn build(self, publisher: impl Publisher) -> Result<Worker, ClientError> {
        let config = self.config;
        let problem = |text: &str| Err(ClientError::Config(text.to_owned()));
        if config.worker_id.is_empty() {
            return problem("worker_id: must not be empty");
        }
        if config.batch_size == 0 || config.batch_size > 10_000 {
            return problem("batch_size: must be within 1..=10000");
        }
        if config.lease < Duration::from_millis(100) {
            return problem("lease: must be at least 100ms");
        }
        if config.concurrency == 0 {
            return problem("concurrency: must be at least 1");
        }
        if config.publish_timeout.is_zero() {
            return problem("publish_timeout: must be positive");
        }
        let options = ConnectOptions {
            connect_timeout: self.connect_timeout,
            credentials: self.credentials,
            ..ConnectOptions::default()
        };
        Ok(Worker {
            servers: Servers::parse(self.addresses, options)?,
            config,
            channel: Mutex::new(None),
            publisher: Arc::new(publisher),
            reporter: Reporter::default(),
        })
    }
}

impl Worker {
    /// Starts configuring a worker of `outbox` on the servers at `addresses`, owning its
    /// leases as `worker_id` (see [`default_worker_id`]).
    pub fn builder<I, S>(
        addresses: I,
        outbox: impl Into<String>,
        worker_id: impl Into<String>,
    ) -> WorkerBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        WorkerBuilder {
            addresses: addresses.into_iter().map(Into::into).collect(),
            config: WorkerConfig {
                outbox: outbox.into(),
                worker_id: worker_id.into(),
                topics: Vec::new(),
                batch_size: 50,
                lease: Duration::from_secs(60),
                concurrency: 10,
                publish_timeout: Duration::from_secs(10),
                max_lease_extension: Duration::from_secs(300),
            },
            connect_timeout: Duration::from_secs(5),
            credentials: Credentials::default(),
        }
    }

    /// A receiver of the [`Event`]s from now on.
    pub fn events(&self) -> broadcast::Receiver<Event> {
        self.reporter.subscribe()
    }

    /// The running totals over every round.
    pub fn counters(&self) -> Arc<Counters> {
        Arc::clone(self.reporter.counters())
    }

    /// Claims one batch, publishes it and answers every message. Fails only when the
    /// claim fails; trouble answering afterwards is logged and counted as `lost` (those
    /// messages come back when their lease runs out).
    pub async fn run_once(&self) -> Result<RoundResult, ClientError> {
        let (address, client) = self.client().await?;
        let config = &self.config;
        let claim = v1::ClaimRequest {
            outbox: config.outbox.clone(),
            worker_id: config.worker_id.clone(),
            batch_size: config.batch_size,
            lease_ms: config.lease.as_millis() as u64,
            topics: config.topics.clone(),
        };
        let claimed_at = Instant::now();
        let claimed = client.clone().claim(claim).await.map_err(|status| {
            self.forget_channel();
            ClientError::Call {
                address: address.clone(),
                status,
            }
        })?;
        let messages: Vec<Message> = claimed
            .into_inner()
            .messages
            .into_iter()
            .map(Message::from)
            .collect();
        self.reporter.add(Count::Received, messages.len());
        let round = Round {
            worker: self,
            client,
            state: Mutex::new(RoundState {
                result: RoundResult {
                    claimed: messages.len(),
                    ..RoundResult::default()
                },
                unanswered: messages.iter().map(|m| m.id).collect(),
                lease_tokens: messages
                    .iter()
                    .filter(|m| !m.lease_token.is_empty())
                    .map(|m| (m.id, m.lease_token.clone()))
                    .collect(),
                lost: HashSet::new(),
            }),
        };
        if messages.is_empty() {
            return Ok(round.result());
        }
        let publishing = futures::stream::iter(group_by_key(messages))
            .for_each_concurrent(config.concurrency, |group| round.publish_group(group));
        tokio::select! {
            () = publishing => {}
            () = round.extend_leases(claimed_at) => unreachable!("extending never ends"),
        }
        let result = round.result();
        if result.failed() > 0 || result.lost > 0 {
            tracing::warn!(?result, "round finished with failures");
        }
        Ok(result)
    }

    async fn client(&self) -> Result<(String, RelayClient<Connection>), ClientError> {
        let cached = self.channel.lock().unwrap().clone();
        let (address, channel) = match cached {
            Some(cached) => cached,
            None => {
                let connected = self.servers.clone().connect_any().await?;
                *self.channel.lock().unwrap() = Some(connected.clone());
                connected
            }
        };
        Ok((
            address,
            RelayClient::new(channel).max_decoding_message_size(usize::MAX),
        ))
    }

    fn forget_channel(&self) {
        *self.channel.lock().unwrap() = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_ids_are_unique() {
        assert_ne!(default_worker_id(), default_worker_id());
    }
}
