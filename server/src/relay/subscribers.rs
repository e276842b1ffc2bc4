//! `Admin.ListSubscribers`: the streams connected to this replica, and, through the
//! database, which owners hold leases on every replica.
//!
//! Each subscription registers itself with its outbox's [`Subscribers`] when it starts and
//! is removed when it ends (its [`Registration`] is dropped, however the stream ends). The
//! loop of the stream keeps its [`StreamInfo`] current: counters and times only, written
//! with atomics or a short lock, never awaited, so a look by an operator costs a stream
//! nothing. What other replicas' streams hold is read from the table: the lease owners of
//! the pending rows leased now (see [`crate::storage::Storage::lease_holders`]).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};

use super::{Admin, RelayResult};
use crate::storage::LeaseHolder;

/// The streams of one outbox connected to this replica.
#[derive(Debug, Default)]
pub struct Subscribers {
    next: AtomicU64,
    streams: Mutex<BTreeMap<u64, Arc<StreamInfo>>>,
}

/// What a stream connected as: fixed for its life.
#[derive(Debug, Clone, PartialEq)]
pub struct Connection {
    pub name: String,
    /// The lease owner of its rows (`name:uuid`).
    pub owner: String,
    /// The client's address, when the transport knows it.
    pub peer: Option<String>,
    /// The authenticated identity, when auth is on.
    pub identity: Option<String>,
    pub topics: Vec<String>,
    pub connected_since: DateTime<Utc>,
}

/// What answers settled, as a stream's listing counts them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Answered {
    pub acked: usize,
    /// Retried or dead-lettered by a nack, or dead-lettered by the subscriber.
    pub nacked: usize,
    /// About rows the stream no longer held.
    pub fenced: usize,
}

/// One connected stream, as its loop keeps it.
#[derive(Debug)]
pub struct StreamInfo {
    connection: Connection,
    window: AtomicU32,
    in_flight: AtomicUsize,
    acked: AtomicU64,
    nacked: AtomicU64,
    fenced: AtomicU64,
    last_answer: Mutex<Option<DateTime<Utc>>>,
}

/// A stream's state at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamView {
    pub connection: Connection,
    pub window: u32,
    /// Rows it holds now: handed out, not settled.
    pub in_flight: usize,
    pub acked: u64,
    /// Nacked (retried or dead-lettered by the nack) or dead-lettered by the subscriber.
    pub nacked: u64,
    /// Answers about rows it no longer held.
    pub fenced: u64,
    pub last_answer: Option<DateTime<Utc>>,
}

/// Removes its stream from the list when dropped.
pub struct Registration {
    id: u64,
    subscribers: Arc<Subscribers>,
    pub info: Arc<StreamInfo>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.subscribers.streams.lock().unwrap().remove(&self.id);
    }
}

impl Subscribers {
    /// Lists the stream that connected as `connection`, with `window` rows at most in
    /// flight, until the registration is dropped.
    pub fn register(self: &Arc<Self>, connection: Connection, window: u32) -> Registration {
        let info = Arc::new(StreamInfo {
            connection,
            window: AtomicU32::new(window),
            in_flight: AtomicUsize::new(0),
            acked: AtomicU64::new(0),
            nacked: AtomicU64::new(0),
            fenced: AtomicU64::new(0),
            last_answer: Mutex::new(None),
        });
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.streams.lock().unwrap().insert(id, Arc::clone(&info));
        Registration {
            id,
            subscribers: Arc::clone(self),
            info,
        }
    }

    /// Every connected stream, oldest connection first.
    pub fn list(&self) -> Vec<StreamView> {
        let streams = self.streams.lock().unwrap();
        streams.values().map(|info| info.view()).collect()
    }
}

impl StreamInfo {
    fn view(&self) -> StreamView {
        StreamView {
            connection: self.connection.clone(),
            window: self.window.load(Ordering::Relaxed),
            in_flight: self.in_flight.load(Ordering::Relaxed),
            acked: self.acked.load(Ordering::Relaxed),
            nacked: self.nacked.load(Ordering::Relaxed),
            fenced: self.fenced.load(Ordering::Relaxed),
            last_answer: *self.last_answer.lock().unwrap(),
        }
    }

    pub fn set_window(&self, window: u32) {
        self.window.store(window, Ordering::Relaxed);
    }

    pub fn set_in_flight(&self, rows: usize) {
        self.in_flight.store(rows, Ordering::Relaxed);
    }

    /// Counts the outcomes of answers just settled; an empty round is no answer.
    pub fn answered(&self, rounds: impl IntoIterator<Item = Answered>) {
        let mut any = false;
        for round in rounds {
            any = true;
            self.acked.fetch_add(round.acked as u64, Ordering::Relaxed);
            self.nacked
                .fetch_add(round.nacked as u64, Ordering::Relaxed);
            self.fenced
                .fetch_add(round.fenced as u64, Ordering::Relaxed);
        }
        if any {
            *self.last_answer.lock().unwrap() = Some(Utc::now());
        }
    }
}

impl Admin {
    /// The streams of this outbox connected to this replica.
    pub fn connected(&self) -> Vec<StreamView> {
        self.subscribers.list()
    }

    /// The owners that hold leases now, on every replica (from the table).
    pub async fn lease_holders(&self) -> RelayResult<Vec<LeaseHolder>> {
        Ok(self.storage.lease_holders().await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn connection(name: &str, owner: &str) -> Connection {
        Connection {
            name: name.to_owned(),
            owner: owner.to_owned(),
            peer: Some("127.0.0.1:5000".to_owned()),
            identity: None,
            topics: vec!["t".to_owned()],
            connected_since: Utc::now(),
        }
    }

    #[test]
    fn a_stream_is_listed_with_its_counts_until_its_registration_drops() {
        let subscribers = Arc::new(Subscribers::default());
        let first = subscribers.register(connection("a", "a:1"), 8);
        let second = subscribers.register(connection("b", "b:2"), 8);
        first.info.set_in_flight(3);
        first.info.set_window(4);
        first.info.answered([
            Answered {
                acked: 2,
                fenced: 1,
                ..Answered::default()
            },
            Answered {
                nacked: 2,
                ..Answered::default()
            },
        ]);
        second.info.answered([]);
        let listed = subscribers.list();
        assert_eq!(listed.len(), 2);
        let a = &listed[0];
        let connection = &a.connection;
        assert_eq!(
            (connection.name.as_str(), connection.owner.as_str()),
            ("a", "a:1")
        );
        assert_eq!((a.window, a.in_flight), (4, 3));
        assert_eq!((a.acked, a.nacked, a.fenced), (2, 2, 1));
        assert!(a.last_answer.is_some() && listed[1].last_answer.is_none());
        drop(first);
        let listed = subscribers.list();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].connection.name, "b");
        drop(second);
        assert!(subscribers.list().is_empty());
    }
}
