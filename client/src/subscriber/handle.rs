//! Controlling a running subscriber: the handle of a spawned one, and the signals of a
//! process that owns one.

use std::sync::Arc;

use tokio::sync::broadcast;
use tokio::task::JoinHandle;

use super::{Shared, Stop};
use crate::events::{Counters, Event};
use crate::ClientError;

/// A subscriber running in the background (see [`Subscriber::spawn`](crate::Subscriber::spawn)).
///
/// Dropping the handle does not stop the subscriber; call [`stop`](Self::stop).
///
/// ```no_run
/// # async fn demo(subscriber: txoutbox_client::Subscriber) -> Result<(), txoutbox_client::ClientError> {
/// let handle = subscriber.spawn();
/// println!("published so far: {}", handle.counters().snapshot().published);
/// handle.stop().await?; // finishes what is in flight, gives back the rest
/// # Ok(())
/// # }
/// ```
pub struct SubscriberHandle {
    stop: Stop,
    task: JoinHandle<Result<(), ClientError>>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for SubscriberHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubscriberHandle")
            .field("outbox", &self.shared.config.outbox)
            .field("finished", &self.task.is_finished())
            .finish_non_exhaustive()
    }
}

impl SubscriberHandle {
    pub(super) fn new(
        stop: Stop,
        task: JoinHandle<Result<(), ClientError>>,
        shared: Arc<Shared>,
    ) -> Self {
        Self { stop, task, shared }
    }

    /// Stops gracefully and waits until done: no new publishes start, those in flight
    /// finish and are acked, untried messages are given back without counting an attempt,
    /// and the stream is closed. Returns the subscriber's error if it had already failed.
    pub async fn stop(self) -> Result<(), ClientError> {
        self.stop.graceful.cancel();
        self.join().await
    }

    /// Asks for a graceful stop without waiting; [`join`](Self::join) waits.
    pub fn request_stop(&self) {
        self.stop.graceful.cancel();
    }

    /// Stops at once: publishes in flight are abandoned and the stream dropped; the
    /// server gives back what was held, with the attempt counted.
    pub fn stop_now(&self) {
        self.stop.graceful.cancel();
        self.stop.now.cancel();
    }

    /// Waits until the subscriber ends: after a stop, or when a server refused it.
    pub async fn join(self) -> Result<(), ClientError> {
        match self.task.await {
            Ok(result) => result,
            Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
            // Cancelled: the runtime is shutting down.
            Err(_) => Ok(()),
        }
    }

    /// Whether the subscriber has ended.
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// A receiver of the [`Event`]s from now on.
    pub fn events(&self) -> broadcast::Receiver<Event> {
        self.shared.reporter.subscribe()
    }

    /// The running totals.
    pub fn counters(&self) -> Arc<Counters> {
        Arc::clone(self.shared.reporter.counters())
    }
}

/// SIGINT and SIGTERM (Ctrl-C elsewhere), installed up front so a failure shows at start.
pub(super) struct Signals {
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
}

impl Signals {
    pub fn install() -> Result<Self, ClientError> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let failed = |error: std::io::Error| {
                ClientError::Config(format!("cannot handle signals: {error}"))
            };
            Ok(Self {
                interrupt: signal(SignalKind::interrupt()).map_err(failed)?,
                terminate: signal(SignalKind::terminate()).map_err(failed)?,
            })
        }
        #[cfg(not(unix))]
        Ok(Self {})
    }

    /// The next signal.
    pub async fn next(&mut self) {
        #[cfg(unix)]
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
    }
}
