//! Insert wake-ups: LISTEN on the outbox's notify channel and bump a counter.
//!
//! The listener has a connection of its own (a private pool of one), so a busy main pool
//! never starves it and it never holds one of the claimers' connections. It reconnects
//! by itself; notifications sent while it was away are lost, so it bumps the counter
//! after every (re)connect and callers claim and catch up. Polling remains the fallback
//! the whole time.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context};
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};
use tokio::sync::watch;
use tokio::time::{sleep, sleep_until, timeout, Instant};
use tokio_util::sync::{CancellationToken, DropGuard};

/// Reconnect backoff: starts here and doubles up to `MAX_BACKOFF`.
const INITIAL_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// After this long without a notification, a `SELECT 1` checks that the connection is
/// alive: a cut network gives no error on a socket that only reads.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(30);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Added to the visibility delay before waking, for clock-rate differences between this
/// process and the database.
const VISIBILITY_MARGIN: Duration = Duration::from_millis(20);

/// A running listener. Dropping it stops the task.
#[derive(Debug)]
pub(super) struct InsertSignal {
    counter: Arc<watch::Sender<u64>>,
    _stop: DropGuard,
}

impl InsertSignal {
    /// Starts listening on `channel`. With a `visibility_delay`, wake-ups are deferred by
    /// it, since the row that triggered one is not claimable before. Needs a Tokio runtime.
    pub fn spawn(
        connect_options: PgConnectOptions,
        channel: String,
        visibility_delay: Duration,
    ) -> anyhow::Result<Self> {
        let runtime = tokio::runtime::Handle::try_current()
            .context("the insert listener (notify_channel) needs a Tokio runtime")?;
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(CONNECT_TIMEOUT)
            .idle_timeout(None)
            .max_lifetime(None)
            .connect_lazy_with(connect_options.application_name("txoutboxd-listener"));
        let counter = Arc::new(watch::Sender::new(0));
        let stop = CancellationToken::new();
        runtime.spawn(run(
            pool,
            channel,
            visibility_delay,
            counter.clone(),
            stop.clone(),
        ));
        Ok(Self {
            counter,
            _stop: stop.drop_guard(),
        })
    }

    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.counter.subscribe()
    }
}

async fn run(
    pool: PgPool,
    channel: String,
    visibility_delay: Duration,
    counter: Arc<watch::Sender<u64>>,
    stop: CancellationToken,
) {
    // When the last notification arrived; the deferring half wakes callers once the
    // rows it announced are visible.
    let (noticed_tx, noticed_rx) = watch::channel(Instant::now());
    tokio::select! {
        _ = stop.cancelled() => {}
        _ = listen(&pool, &channel, &noticed_tx, &counter, !visibility_delay.is_zero()) => {}
        _ = wake_when_visible(noticed_rx, visibility_delay, &counter) => {}
    }
    // The listening connection went back to the pool when `listen` was dropped.
    pool.close().await;
    tracing::debug!(channel, "insert listener stopped");
}

fn bump(counter: &watch::Sender<u64>) {
    counter.send_modify(|n| *n = n.wrapping_add(1));
}

/// Connects, listens, and reconnects with backoff; never returns.
async fn listen(
    pool: &PgPool,
    channel: &str,
    noticed: &watch::Sender<Instant>,
    counter: &watch::Sender<u64>,
    deferred: bool,
) {
    let mut backoff = INITIAL_BACKOFF;
    // Whether a warning went out for the current outage: one per outage, not per attempt.
    let mut in_outage = false;
    loop {
        let mut listener = match connect(pool, channel).await {
            Ok(listener) => listener,
            Err(error) => {
                if !in_outage {
                    tracing::warn!(
                        channel,
                        error = format!("{error:#}"),
                        "insert listener cannot connect; claiming falls back to polling"
                    );
                    in_outage = true;
                }
                sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
        };
        if in_outage {
            tracing::info!(channel, "insert listener reconnected");
        }
        backoff = INITIAL_BACKOFF;
        // Rows inserted while nobody listened: wake now and, when wake-ups are deferred,
        // again once the latest of them is visible.
        bump(counter);
        if deferred {
            noticed.send_replace(Instant::now());
        }

        let error = receive(&mut listener, noticed).await;
        tracing::warn!(
            channel,
            error = format!("{error:#}"),
            "insert listener lost its connection; reconnecting"
        );
        // The outage starts now; its warning is out.
        in_outage = true;
    }
}

async fn connect(pool: &PgPool, channel: &str) -> anyhow::Result<PgListener> {
    let mut listener = PgListener::connect_with(pool).await?;
    // A lost connection ends `receive`; `listen` reconnects with backoff and logging.
    listener.eager_reconnect(false);
    timeout(CONNECT_TIMEOUT, listener.listen(channel))
        .await
        .map_err(|_| anyhow!("LISTEN timed out"))??;
    Ok(listener)
}

/// Records notifications until the connection fails; returns why.
async fn receive(listener: &mut PgListener, noticed: &watch::Sender<Instant>) -> anyhow::Error {
    loop {
        // `try_recv` is cancel-safe, so timing it out loses nothing.
        match timeout(KEEPALIVE_IDLE, listener.try_recv()).await {
            Ok(Ok(Some(_notification))) => {
                noticed.send_replace(Instant::now());
            }
            Ok(Ok(None)) => return anyhow!("connection closed"),
            Ok(Err(error)) => return error.into(),
            Err(_idle) => {
                let ping = sqlx::query("SELECT 1").execute(&mut *listener);
                match timeout(KEEPALIVE_TIMEOUT, ping).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(error)) => return error.into(),
                    Err(_) => return anyhow!("keepalive query timed out"),
                }
            }
        }
    }
}

/// Bumps the counter once the rows announced by the latest notification are visible.
/// Notifications arriving while it waits fold into one later wake-up.
async fn wake_when_visible(
    mut noticed: watch::Receiver<Instant>,
    visibility_delay: Duration,
    counter: &watch::Sender<u64>,
) {
    let delay = if visibility_delay.is_zero() {
        Duration::ZERO
    } else {
        visibility_delay + VISIBILITY_MARGIN
    };
    while noticed.changed().await.is_ok() {
        let at = *noticed.borrow_and_update() + delay;
        sleep_until(at).await;
        bump(counter);
    }
}
