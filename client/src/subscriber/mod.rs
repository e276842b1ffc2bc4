//! The streaming subscriber: keeps one `Subscribe` stream open to one of the servers,
//! publishes what arrives, and reconnects (with exponential backoff and jitter, rotating
//! through the addresses) whenever the stream breaks, the server restarts or drains.
//!
//! Read [`Subscriber`] first; `session.rs` is one stream's life, `dispatch.rs` the per-key
//! bookkeeping inside it.

mod builder;
mod dispatch;
mod handle;
mod session;

use std::future::Future;
use std::sync::Arc;

use backon::{BackoffBuilder, ExponentialBuilder};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

pub use builder::SubscriberBuilder;
pub use handle::SubscriberHandle;

use crate::connect::Servers;
use crate::events::{Count, Counters, Event, Reporter};
use crate::{ClientError, Publisher};
use builder::Config;
use session::{End, Leftovers};

/// Publishes the messages of one outbox, streamed from `txoutboxd`.
///
/// Build it with [`Subscriber::builder`], then run it one of three ways:
/// - [`run`](Self::run) with a future that resolves when your application shuts down;
/// - [`spawn`](Self::spawn) it and keep the [`SubscriberHandle`] to stop it later;
/// - [`run_until_signal`](Self::run_until_signal) in a process of its own (SIGINT/SIGTERM).
///
/// What it guarantees:
/// - messages of one key are published one after another, in order: the next one starts
///   once the previous publish returned `Ok` (its ack is sent without waiting for the
///   server's confirmation, so one busy key does not cost a round trip per message);
///   different keys run concurrently up to `concurrency`;
/// - a failed publish is nacked (the server schedules the retry) and the rest of its key
///   that this client holds is given back untried, never published out of order;
/// - if an ack comes back fenced (the lease was gone), nothing later of that key is acked:
///   what has not started is given back untried, a publish already running is given back
///   once it ends. The server redelivers the key from its first message not acked, so
///   after a lost lease, a lost connection or a server crash a consumer may see a run of
///   a key's messages again, in order; a message is never first published before every
///   earlier one of its key was;
/// - leases are extended while a message waits or publishes (up to
///   `max_lease_extension`), so a slow publish is not redelivered to someone else;
/// - a lost connection, a server restart or a drain only pauses it: it reconnects, and the
///   server redelivers whatever was not acked (at-least-once: consumers deduplicate on
///   [`Message::id`](crate::Message::id));
/// - a graceful stop first closes the flow-control window (`set_window(0)`), so the server
///   claims nothing more for it, then finishes the publishes in flight, acks them, and
///   gives back the untried messages without counting an attempt.
///
/// ```no_run
/// use txoutbox_client::{Message, PublishError, Subscriber};
///
/// # async fn demo() -> Result<(), txoutbox_client::ClientError> {
/// let subscriber = Subscriber::builder(["http://127.0.0.1:7411"], "orders")
///     .build(|message: Message| async move {
///         println!("{}: {:?}", message.topic, message.payload);
///         Ok::<_, PublishError>(())
///     })?;
/// let handle = subscriber.spawn();
/// // ... later, when the application shuts down:
/// handle.stop().await?;
/// # Ok(())
/// # }
/// ```
pub struct Subscriber {
    shared: Arc<Shared>,
    servers: Servers,
}

impl std::fmt::Debug for Subscriber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscriber")
            .field("servers", &self.servers.addresses())
            .field("config", &self.shared.config)
            .finish_non_exhaustive()
    }
}

/// What every stream of one subscriber shares.
pub(crate) struct Shared {
    config: Config,
    publisher: Arc<dyn Publisher>,
    reporter: Reporter,
}

/// The two ways to stop: gracefully, then (after `stop_timeout`, or a second signal) at
/// once.
#[derive(Debug, Clone, Default)]
pub(crate) struct Stop {
    graceful: CancellationToken,
    now: CancellationToken,
}

impl Subscriber {
    /// Starts configuring a subscriber of `outbox` on the servers at `addresses` (URIs
    /// such as `http://127.0.0.1:7411`; replicas serving the same database).
    pub fn builder<I, S>(addresses: I, outbox: impl Into<String>) -> SubscriberBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        SubscriberBuilder::new(
            addresses.into_iter().map(Into::into).collect(),
            outbox.into(),
        )
    }

    /// A receiver of the [`Event`]s from now on.
    pub fn events(&self) -> broadcast::Receiver<Event> {
        self.shared.reporter.subscribe()
    }

    /// The running totals, to read or export at any time.
    pub fn counters(&self) -> Arc<Counters> {
        Arc::clone(self.shared.reporter.counters())
    }

    /// (outbox, subscriber name): the labels of its metrics.
    #[cfg(feature = "prometheus")]
    pub(crate) fn labels(&self) -> (&str, &str) {
        (&self.shared.config.outbox, &self.shared.config.name)
    }

    /// Runs until `shutdown` resolves, then stops gracefully. Returns early only if a
    /// server refuses the subscription for good (unknown outbox, invalid setting).
    ///
    /// ```no_run
    /// # async fn demo(subscriber: txoutbox_client::Subscriber) -> Result<(), txoutbox_client::ClientError> {
    /// let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    /// // hand `stop_tx` to whatever decides to shut down
    /// # drop(stop_tx);
    /// subscriber.run(async { let _ = stop_rx.await; }).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) -> Result<(), ClientError> {
        let stop = Stop::default();
        let trigger = async {
            shutdown.await;
            stop.graceful.cancel();
            std::future::pending::<()>().await
        };
        tokio::select! {
            result = self.serve(&stop) => result,
            _ = trigger => unreachable!("the trigger never completes"),
        }
    }

    /// Runs in the background; the handle stops it.
    pub fn spawn(self) -> SubscriberHandle {
        let stop = Stop::default();
        let shared = Arc::clone(&self.shared);
        let task = {
            let stop = stop.clone();
            tokio::spawn(async move { self.serve(&stop).await })
        };
        SubscriberHandle::new(stop, task, shared)
    }

    /// Runs until SIGINT or SIGTERM, then stops gracefully; a second signal stops at
    /// once. For a process the subscriber owns: this installs signal handlers, which
    /// replace the default ones for the rest of the process. Inside a larger application,
    /// use [`run`](Self::run) or [`spawn`](Self::spawn) and its own shutdown instead.
    pub async fn run_until_signal(self) -> Result<(), ClientError> {
        let mut signals = handle::Signals::install()?;
        let stop = Stop::default();
        let watch = async {
            signals.next().await;
            tracing::info!("signal received: stopping gracefully (send another to stop at once)");
            stop.graceful.cancel();
            signals.next().await;
            tracing::warn!("second signal: stopping at once");
            stop.now.cancel();
            std::future::pending::<()>().await
        };
        tokio::select! {
            result = self.serve(&stop) => result,
            _ = watch => unreachable!("the watch never completes"),
        }
    }

    /// Serves until stopped; a graceful stop becomes an immediate one after `stop_timeout`.
    async fn serve(self, stop: &Stop) -> Result<(), ClientError> {
        let stop_timeout = self.shared.config.stop_timeout;
        let deadline = async {
            stop.graceful.cancelled().await;
            tokio::time::sleep(stop_timeout).await;
            tracing::warn!(
                ?stop_timeout,
                "graceful stop took too long: stopping at once"
            );
            stop.now.cancel();
            std::future::pending::<()>().await
        };
        tokio::select! {
            result = self.reconnect_loop(stop) => result,
            _ = deadline => unreachable!("the deadline never completes"),
        }
    }

    async fn reconnect_loop(mut self, stop: &Stop) -> Result<(), ClientError> {
        let config = &self.shared.config;
        let reporter = &self.shared.reporter;
        let backoff = ExponentialBuilder::default()
            .with_min_delay(config.reconnect_min)
            .with_max_delay(config.reconnect_max)
            .with_factor(2.0)
            .with_jitter()
            .without_max_times();
        let mut delays = backoff.build();
        loop {
            if stop.graceful.is_cancelled() {
                return Ok(());
            }
            let (address, endpoint) = self.servers.rotate();
            let opened = tokio::select! {
                biased;
                _ = stop.graceful.cancelled() => return Ok(()),
                opened = session::open(&self.shared, address.clone(), endpoint, self.servers.token()) => opened,
            };
            let end = match opened {
                Ok((session, mut inbound)) => {
                    delays = backoff.build();
                    tracing::info!(%address, owner = %session.owner, outbox = %config.outbox, "subscribed");
                    reporter.add(Count::Connects, 1);
                    reporter.emit(Event::Connected {
                        address: address.clone(),
                        owner: session.owner.clone(),
                    });
                    let (end, leftovers) = session.run(&mut inbound, stop).await;
                    // Ends the call now, so the server gives back our leases at once.
                    drop(inbound);
                    finish_leftovers(leftovers, stop).await;
                    end
                }
                Err(end) => end,
            };
            match end {
                End::Stopped => return Ok(()),
                End::Refused(status) => {
                    tracing::error!(%address, %status, "subscription refused");
                    return Err(ClientError::Refused { address, status });
                }
                End::Lost(reason) => {
                    tracing::warn!(%address, %reason, "stream lost; reconnecting");
                    reporter.add(Count::Disconnects, 1);
                    reporter.emit(Event::Disconnected { address, reason });
                }
            }
            let delay = delays.next().unwrap_or(config.reconnect_max);
            tokio::select! {
                _ = stop.graceful.cancelled() => return Ok(()),
                _ = tokio::time::sleep(delay) => {}
            }
        }
    }
}

/// Waits for the publishes a lost stream left running (their answers are gone; the server
/// redelivers those messages). Bounded by `publish_timeout`; cut short by an immediate stop.
async fn finish_leftovers(mut leftovers: Leftovers, stop: &Stop) {
    if leftovers.is_empty() {
        return;
    }
    tracing::info!(
        running = leftovers.len(),
        "waiting for the publishes of the lost stream before reconnecting"
    );
    tokio::select! {
        _ = stop.now.cancelled() => leftovers.abort_all(),
        _ = async { while leftovers.join_next().await.is_some() {} } => {}
    }
}
