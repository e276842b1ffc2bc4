//! What the runtime reports as it works: an [`Event`] stream for hooks and logs, and
//! [`Counters`] a caller reads (and exports as metrics) whenever it likes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::broadcast;

/// Events buffered per receiver; a receiver that falls further behind gets
/// `RecvError::Lagged` and misses the oldest ones (the counters never miss anything).
const EVENT_CAPACITY: usize = 1024;

/// Something that happened to a message or to the connection.
///
/// Receive them with [`Subscriber::events`](crate::Subscriber::events) or
/// [`Worker::events`](crate::Worker::events):
///
/// ```no_run
/// # async fn demo(subscriber: &txoutbox_client::Subscriber) {
/// use txoutbox_client::Event;
///
/// let mut events = subscriber.events();
/// tokio::spawn(async move {
///     while let Ok(event) = events.recv().await {
///         if let Event::DeadLettered { id, error, .. } = event {
///             eprintln!("message {id} is dead: {error}");
///         }
///     }
/// });
/// # }
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Event {
    /// A stream to a server is open.
    Connected {
        /// The server's address.
        address: String,
        /// The lease owner the server uses for this stream (in its logs too).
        owner: String,
    },
    /// A stream ended (or could not be opened); the runtime reconnects.
    Disconnected {
        /// The server's address.
        address: String,
        /// Why, in words.
        reason: String,
    },
    /// The server is shutting down: no new work, what is in flight is finished.
    Draining {
        /// The server's address.
        address: String,
    },
    /// The publisher accepted a message. Its ack follows, unless an earlier message of
    /// its key was lost while it published: then it is given back ([`Event::Blocked`]).
    Published {
        /// Id of the message.
        id: i64,
        /// Its topic.
        topic: String,
        /// Its ordering key.
        key: Option<String>,
        /// Which delivery this was (1 on the first).
        attempts: u32,
        /// How long the publish took.
        elapsed: Duration,
    },
    /// A publish failed and the server scheduled a retry.
    Retried {
        /// Id of the message.
        id: i64,
        /// Its ordering key.
        key: Option<String>,
        /// The publisher's error.
        error: String,
        /// When the retry is due (server clock), if the server said.
        retry_at: Option<SystemTime>,
    },
    /// A message was dead-lettered: by a permanent error, or a failure on its last attempt.
    DeadLettered {
        /// Id of the message.
        id: i64,
        /// Its ordering key.
        key: Option<String>,
        /// The publisher's error.
        error: String,
    },
    /// A message was given back without an ack because an earlier message of its key
    /// failed or was lost: it comes back after that one. Normally untried; a message that
    /// was publishing when the earlier one was lost is given back once its publish ends.
    Blocked {
        /// Id of the held-back message.
        id: i64,
        /// Its ordering key.
        key: Option<String>,
        /// The earlier message of the key that held it back.
        behind: i64,
    },
    /// The client lost the lease of a message before answering (it ran out, or an answer
    /// was fenced): the message will be delivered again, perhaps to another subscriber.
    LeaseLost {
        /// Id of the message.
        id: i64,
    },
}

/// Running totals since the subscriber or worker was built. Cheap to read at any time.
///
/// ```no_run
/// # fn demo(subscriber: &txoutbox_client::Subscriber) {
/// let totals = subscriber.counters().snapshot();
/// println!("published {} retried {}", totals.published, totals.retried);
/// # }
/// ```
#[derive(Debug, Default)]
pub struct Counters {
    received: AtomicU64,
    published: AtomicU64,
    acked: AtomicU64,
    retried: AtomicU64,
    dead_lettered: AtomicU64,
    blocked: AtomicU64,
    released: AtomicU64,
    lease_lost: AtomicU64,
    lease_extensions: AtomicU64,
    connects: AtomicU64,
    disconnects: AtomicU64,
}

/// The values of [`Counters`] at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CounterSnapshot {
    /// Messages handed to this client by the server (a redelivery counts again).
    pub received: u64,
    /// Publishes the publisher accepted.
    pub published: u64,
    /// Messages the server confirmed as delivered.
    pub acked: u64,
    /// Failed publishes whose retry the server scheduled.
    pub retried: u64,
    /// Messages dead-lettered.
    pub dead_lettered: u64,
    /// Messages given back without an ack behind a failed or lost message of their key.
    pub blocked: u64,
    /// Messages given back untried on stop or drain (no attempt counted).
    pub released: u64,
    /// Leases lost before an answer (the message is redelivered).
    pub lease_lost: u64,
    /// Lease extensions the server granted (per message).
    pub lease_extensions: u64,
    /// Streams opened.
    pub connects: u64,
    /// Streams ended or failed to open, other than by a requested stop.
    pub disconnects: u64,
}

macro_rules! counter_methods {
    ($($name:ident),*) => {
        impl Counters {
            /// The current values.
            pub fn snapshot(&self) -> CounterSnapshot {
                CounterSnapshot {
                    $($name: self.$name.load(Ordering::Relaxed),)*
                }
            }
        }
    };
}

counter_methods!(
    received,
    published,
    acked,
    retried,
    dead_lettered,
    blocked,
    released,
    lease_lost,
    lease_extensions,
    connects,
    disconnects
);

/// Which counter to bump.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Count {
    Received,
    Published,
    Acked,
    Retried,
    DeadLettered,
    Blocked,
    Released,
    LeaseLost,
    LeaseExtensions,
    Connects,
    Disconnects,
}

impl Counters {
    fn cell(&self, count: Count) -> &AtomicU64 {
        match count {
            Count::Received => &self.received,
            Count::Published => &self.published,
            Count::Acked => &self.acked,
            Count::Retried => &self.retried,
            Count::DeadLettered => &self.dead_lettered,
            Count::Blocked => &self.blocked,
            Count::Released => &self.released,
            Count::LeaseLost => &self.lease_lost,
            Count::LeaseExtensions => &self.lease_extensions,
            Count::Connects => &self.connects,
            Count::Disconnects => &self.disconnects,
        }
    }
}

/// Where the runtime reports: the event channel and the counters, shared by every clone.
#[derive(Debug, Clone)]
pub(crate) struct Reporter {
    events: broadcast::Sender<Event>,
    counters: Arc<Counters>,
}

impl Default for Reporter {
    fn default() -> Self {
        Self {
            events: broadcast::channel(EVENT_CAPACITY).0,
            counters: Arc::default(),
        }
    }
}

impl Reporter {
    pub fn emit(&self, event: Event) {
        // No receiver is fine: events are optional.
        let _ = self.events.send(event);
    }

    pub fn add(&self, count: Count, n: usize) {
        if n > 0 {
            self.counters
                .cell(count)
                .fetch_add(n as u64, Ordering::Relaxed);
        }
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    pub fn counters(&self) -> &Arc<Counters> {
        &self.counters
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_events_reach_the_caller() {
        let reporter = Reporter::default();
        let mut events = reporter.subscribe();
        reporter.add(Count::Published, 2);
        reporter.add(Count::Retried, 1);
        reporter.emit(Event::LeaseLost { id: 4 });
        let totals = reporter.counters().snapshot();
        assert_eq!((totals.published, totals.retried), (2, 1));
        assert_eq!(events.try_recv().unwrap(), Event::LeaseLost { id: 4 });
    }
}
