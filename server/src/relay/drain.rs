//! Graceful shutdown: the signal that tells every subscription to stop claiming and let
//! its subscriber answer what it holds, and the tracker that tells the server when every
//! subscription has finished.

use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

#[derive(Clone)]
pub struct Drain {
    started: CancellationToken,
    timeout: Duration,
    subscriptions: TaskTracker,
}

impl Drain {
    pub fn new(timeout: Duration) -> Self {
        Self {
            started: CancellationToken::new(),
            timeout,
            subscriptions: TaskTracker::new(),
        }
    }

    /// How long subscribers get to answer once the drain has started.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    pub fn start(&self) {
        self.started.cancel();
    }

    pub fn is_started(&self) -> bool {
        self.started.is_cancelled()
    }

    /// Completes once the drain has started.
    pub async fn started(&self) {
        self.started.cancelled().await
    }

    /// Runs a subscription so that [`Drain::finished`] waits for it.
    pub fn spawn<F>(&self, task: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        self.subscriptions.spawn(task);
    }

    /// Completes when every subscription spawned through [`Drain::spawn`] has ended.
    pub async fn finished(&self) {
        self.subscriptions.close();
        self.subscriptions.wait().await
    }
}
