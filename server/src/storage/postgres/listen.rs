//! Insert wake-ups: LISTEN on the outbox's notify channel and record what was inserted.
//!
//! The listener has a connection of its own (a private pool of one), so a busy main pool
//! never starves it and it never holds one of the claimers' connections. It reconnects
//! by itself; notifications sent while it was away are lost, so it signals an insert of
//! unknown topic after every (re)connect and callers claim and catch up. Polling remains
//! the fallback the whole time.
//!
//! A notification's payload is `topic:` and the topic of the rows inserted (see the
//! trigger in `schema.rs`); any other payload (empty, from the trigger of an earlier
//! version or a statement that inserted too many topics to list) is an insert of unknown
//! topic, which wakes every stream (see [`Inserts`]).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, Context};
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};
use tokio::sync::{watch, Notify};
use tokio::time::{sleep, sleep_until, timeout, Instant};
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::storage::Inserts;

/// What the trigger puts before the topic in a notification's payload.
pub(super) const TOPIC_PREFIX: &str = "topic:";
/// Notifications held back for visibility at most; past this they fold into one of
/// unknown topic, so a flood of distinct topics cannot grow the listener's memory.
const MAX_DEFERRED: usize = 1024;

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
    counter: Arc<watch::Sender<Inserts>>,
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
        let counter = Arc::new(watch::Sender::new(Inserts::default()));
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

    pub fn subscribe(&self) -> watch::Receiver<Inserts> {
        self.counter.subscribe()
    }
}

async fn run(
    pool: PgPool,
    channel: String,
    visibility_delay: Duration,
    counter: Arc<watch::Sender<Inserts>>,
    stop: CancellationToken,
) {
    // With a visibility delay, what was noticed waits here until its rows are visible.
    let deferred = (!visibility_delay.is_zero()).then(Deferred::default);
    tokio::select! {
        _ = stop.cancelled() => {}
        _ = listen(&pool, &channel, deferred.as_ref(), &counter) => {}
        _ = wake_when_visible(deferred.as_ref(), visibility_delay, &counter) => {}
    }
    // The listening connection went back to the pool when `listen` was dropped.
    pool.close().await;
    tracing::debug!(channel, "insert listener stopped");
}

/// The topic a notification announces; `None` for unknown (every topic).
fn topic(payload: &str) -> Option<&str> {
    payload.strip_prefix(TOPIC_PREFIX)
}

/// Notifications noticed and not yet signalled, oldest first, each with when it came.
#[derive(Default)]
struct Deferred {
    noticed: Mutex<VecDeque<(Instant, Option<String>)>>,
    added: Notify,
}

impl Deferred {
    fn push(&self, topic: Option<&str>) {
        let now = Instant::now();
        {
            let mut noticed = self.noticed.lock().expect("deferred lock");
            if noticed.len() >= MAX_DEFERRED {
                // The newest stands for itself and what it replaces: later, and any topic.
                noticed.pop_back();
                noticed.push_back((now, None));
            } else {
                noticed.push_back((now, topic.map(str::to_owned)));
            }
        }
        self.added.notify_one();
    }
}

/// Signals `topic` now, or once its rows are visible when wake-ups are deferred.
fn notice(deferred: Option<&Deferred>, counter: &watch::Sender<Inserts>, topic: Option<&str>) {
    match deferred {
        Some(deferred) => deferred.push(topic),
        None => counter.send_modify(|inserts| inserts.record(topic)),
    }
}

/// Connects, listens, and reconnects with backoff; never returns.
async fn listen(
    pool: &PgPool,
    channel: &str,
    deferred: Option<&Deferred>,
    counter: &watch::Sender<Inserts>,
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
        // Rows of any topic inserted while nobody listened: wake now and, when wake-ups
        // are deferred, again once the latest of them is visible.
        counter.send_modify(|inserts| inserts.record(None));
        if let Some(deferred) = deferred {
            deferred.push(None);
        }

        let error = receive(&mut listener, deferred, counter).await;
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
async fn receive(
    listener: &mut PgListener,
    deferred: Option<&Deferred>,
    counter: &watch::Sender<Inserts>,
) -> anyhow::Error {
    loop {
        // `try_recv` is cancel-safe, so timing it out loses nothing.
        match timeout(KEEPALIVE_IDLE, listener.try_recv()).await {
            Ok(Ok(Some(notification))) => {
                notice(deferred, counter, topic(notification.payload()));
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

/// Signals each deferred notification once the rows it announced are visible; the ones
/// due together go out in one change. Never completes without deferral.
async fn wake_when_visible(
    deferred: Option<&Deferred>,
    visibility_delay: Duration,
    counter: &watch::Sender<Inserts>,
) {
    let Some(deferred) = deferred else {
        return std::future::pending().await;
    };
    let delay = visibility_delay + VISIBILITY_MARGIN;
    loop {
        let oldest = deferred
            .noticed
            .lock()
            .expect("deferred lock")
            .front()
            .map(|(at, _)| *at);
        let Some(oldest) = oldest else {
            deferred.added.notified().await;
            continue;
        };
        sleep_until(oldest + delay).await;
        let now = Instant::now();
        let mut noticed = deferred.noticed.lock().expect("deferred lock");
        let due = noticed
            .iter()
            .take_while(|(at, _)| *at + delay <= now)
            .count();
        counter.send_modify(|inserts| {
            for (_, topic) in noticed.drain(..due) {
                inserts.record(topic.as_deref());
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payload_names_a_topic_only_behind_the_prefix() {
        assert_eq!(topic("topic:orders"), Some("orders"));
        assert_eq!(topic("topic:"), Some(""));
        assert_eq!(topic(""), None, "the trigger of an earlier version");
        assert_eq!(topic("orders"), None);
    }
}
