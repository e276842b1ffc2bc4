//! One stream's share of a group, without I/O: the partitions it owns, what it read of
//! them, what it delivered, and what must be written at the next flush. The runner
//! (`runner.rs`) does the storage calls and feeds their results in.
//!
//! Rules (each unit-tested below):
//! - A partition's *position* only passes rows that are settled: acked, or written as a
//!   state row (retry, held, dead) in the same flush that moves the position. It never
//!   passes a row still in flight or still queued.
//! - Ordered groups: a row is not sent while its key has a row in flight from an earlier
//!   batch, and a row whose key is blocked (a retry pending or a held row before it, or a
//!   dead row that holds its key) becomes a held state row instead of being sent. A
//!   blocked key's rows go out one key-order step at a time: its first state row, when due.
//! - A nack or an expired lease of an ordered row gives back the later rows of its key in
//!   flight (they become held rows, listed as released).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::time::Instant;

use crate::config::GroupSettings;
use crate::relay::backoff::Backoff;
use crate::relay::subscription::Settlement;
use crate::storage::groups::{GroupRow, PartitionLease, Position, Read, StateKind, StateRow};
use crate::storage::{FailureDecision, MessageId, RetryPolicy};

/// A message in flight to the subscriber.
#[derive(Debug, Clone)]
pub struct Flight {
    pub partition: u32,
    pub position: Position,
    pub key: Option<String>,
    /// Deliveries so far, this one included.
    pub attempts: u32,
    pub deadline: Instant,
    /// Delivered from a state row (a retry or a held row), not from the log.
    pub from_state: bool,
    /// The dispatch that sent it (rows of one key may share a batch).
    pub batch: u64,
}

/// What to send: fresh rows come with their message, state rows need a fetch.
#[derive(Debug, Default)]
pub struct Dispatch {
    pub fresh: Vec<GroupRow>,
    pub from_state: Vec<MessageId>,
}

impl Dispatch {
    pub fn is_empty(&self) -> bool {
        self.fresh.is_empty() && self.from_state.is_empty()
    }
}

#[derive(Debug)]
pub struct Part {
    pub epoch: i64,
    /// As the table has it: moved by [`Member::flushed`] once a flush committed.
    pub committed: Position,
    /// Every row up to here is settled in memory; past `committed` until a flush writes it.
    settled: Position,
    /// Read up to here.
    pub cursor: Position,
    /// The last read found nothing more; reset by a wake-up.
    pub caught_up: bool,
    pub queue: VecDeque<GroupRow>,
    /// Rows taken from the queue and not yet past the position: settled or not.
    open: BTreeMap<Position, bool>,
    /// The state rows of the partition by position.
    state: BTreeMap<Position, StateRow>,
    /// Keys with state rows that block them, each with those rows' positions.
    blocked: HashMap<String, BTreeSet<Position>>,
    /// Rows of state rows settled and deleted before the log brought them (a former owner
    /// wrote them past its position): skipped when the log brings them.
    settled_ahead: BTreeSet<Position>,
    /// Until when the last renewal of its lease that this member saw lets it send the
    /// partition's rows (none: not bounded, as in the unit tests).
    pub lease_until: Option<Instant>,
    /// Handed over to another member once nothing of it is in flight.
    pub leaving: bool,
    /// Writes for the next flush.
    upserts: Vec<StateRow>,
    deletes: Vec<MessageId>,
}

impl Part {
    fn new(lease: PartitionLease, state: Vec<StateRow>, holds_key: bool) -> Self {
        let mut part = Self {
            epoch: lease.epoch,
            committed: lease.position,
            settled: lease.position,
            cursor: lease.position,
            caught_up: false,
            queue: VecDeque::new(),
            open: BTreeMap::new(),
            state: BTreeMap::new(),
            blocked: HashMap::new(),
            settled_ahead: BTreeSet::new(),
            lease_until: None,
            leaving: false,
            upserts: Vec::new(),
            deletes: Vec::new(),
        };
        for row in state {
            part.put_state(row, holds_key, false);
        }
        part
    }

    fn blocks(row: &StateRow, holds_key: bool) -> bool {
        row.kind != StateKind::Dead || holds_key
    }

    /// Records a state row, to be written at the next flush when `write`.
    fn put_state(&mut self, row: StateRow, holds_key: bool, write: bool) {
        if let Some(old) = self.state.remove(&row.position) {
            self.unblock(&old);
        }
        if let (Some(key), true) = (&row.key, Self::blocks(&row, holds_key)) {
            self.blocked
                .entry(key.clone())
                .or_default()
                .insert(row.position);
        }
        if write {
            self.upserts.retain(|r| r.id != row.id);
            self.upserts.push(row.clone());
        }
        self.state.insert(row.position, row);
    }

    fn unblock(&mut self, row: &StateRow) {
        if let Some(key) = &row.key {
            if let Some(positions) = self.blocked.get_mut(key) {
                positions.remove(&row.position);
                if positions.is_empty() {
                    self.blocked.remove(key);
                }
            }
        }
    }

    fn drop_state(&mut self, position: Position) {
        if let Some(row) = self.state.remove(&position) {
            if position > self.settled.max(self.committed) && !self.open.contains_key(&position) {
                self.settled_ahead.insert(position);
            }
            self.unblock(&row);
            self.upserts.retain(|r| r.id != row.id);
            self.deletes.push(row.id);
        }
    }

    /// The position all settled rows at the head of `open` reach, never past a queued row.
    fn settled_position(&mut self) -> Option<Position> {
        let bound = self.queue.front().map(|row| row.position);
        let mut reached = None;
        while let Some((&position, &settled)) = self.open.first_key_value() {
            if !settled || bound.is_some_and(|b| position > b) {
                break;
            }
            self.open.pop_first();
            reached = Some(position);
        }
        reached
    }

    /// Whether [`Part::settled_position`] would move the position: settled rows at the
    /// head of `open` that no flush has written yet.
    fn position_would_move(&self) -> bool {
        let bound = self.queue.front().map(|row| row.position);
        self.settled > self.committed
            || self
                .open
                .first_key_value()
                .is_some_and(|(&position, &settled)| settled && bound.is_none_or(|b| position <= b))
    }

    pub fn state_rows(&self) -> impl Iterator<Item = &StateRow> {
        self.state.values()
    }
}

/// A stream's part of one group.
pub struct Member {
    pub settings: GroupSettings,
    backoff: Backoff,
    pub parts: BTreeMap<u32, Part>,
    pub flights: BTreeMap<MessageId, Flight>,
    /// Flights per key, for "not across batches".
    keys_in_flight: HashMap<String, usize>,
    batches: u64,
    /// Partitions answers touched since the last flush: the flush checks they are still
    /// owned even when it writes nothing for them, so a stale owner's answers are fenced.
    touched: BTreeSet<u32>,
}

/// How a delivery failed.
#[derive(Debug, Clone, PartialEq)]
pub enum Failure {
    /// Retried by the policy (or dead on the last attempt).
    Nack {
        error: String,
        delay: Option<Duration>,
    },
    /// Given back untried: the attempt is not counted.
    Release { delay: Duration },
    /// Dead-lettered at once.
    Dead { error: String },
}

/// What an answer did, before the flush that makes it durable.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Outcome {
    /// What the subscriber is told once the flush is done.
    pub settled: Settlement,
    /// The partition of every id settled, for fencing after the flush.
    pub partitions: HashMap<MessageId, u32>,
}

impl Member {
    pub fn new(settings: GroupSettings) -> Self {
        let backoff = Backoff::new(settings.backoff, settings.max_attempts);
        Self {
            settings,
            backoff,
            parts: BTreeMap::new(),
            flights: BTreeMap::new(),
            keys_in_flight: HashMap::new(),
            batches: 0,
            touched: BTreeSet::new(),
        }
    }

    fn holds_key(&self) -> bool {
        self.settings.dead_letter_holds_key
    }

    pub fn take(&mut self, lease: PartitionLease, state: Vec<StateRow>) {
        let holds = self.holds_key();
        self.parts
            .insert(lease.partition, Part::new(lease, state, holds));
    }

    /// Forgets a partition another member now owns; returns the flights it had (their
    /// answers will be fenced).
    pub fn lose(&mut self, partition: u32) -> Vec<MessageId> {
        self.parts.remove(&partition);
        let lost: Vec<MessageId> = self
            .flights
            .iter()
            .filter(|(_, f)| f.partition == partition)
            .map(|(id, _)| *id)
            .collect();
        for id in &lost {
            self.remove_flight(*id);
        }
        lost
    }

    fn remove_flight(&mut self, id: MessageId) -> Option<Flight> {
        let flight = self.flights.remove(&id)?;
        if let Some(key) = &flight.key {
            if let Some(count) = self.keys_in_flight.get_mut(key) {
                *count -= 1;
                if *count == 0 {
                    self.keys_in_flight.remove(key);
                }
            }
        }
        Some(flight)
    }

    /// Rows queued in partitions not leaving.
    pub fn queued(&self) -> usize {
        self.parts
            .values()
            .filter(|p| !p.leaving)
            .map(|p| p.queue.len())
            .sum()
    }

    /// Where to read next: partitions not caught up with fewer than `low` rows queued.
    pub fn read_cursors(&self, low: usize) -> Vec<(u32, Position)> {
        self.parts
            .iter()
            .filter(|(_, p)| !p.leaving && !p.caught_up && p.queue.len() < low)
            .map(|(n, p)| (*n, p.cursor))
            .collect()
    }

    pub fn add_read(&mut self, asked: &[(u32, Position)], read: Read) {
        for row in read.rows {
            if let Some(part) = self.parts.get_mut(&row.partition) {
                if row.position > part.cursor {
                    part.cursor = row.position;
                    part.queue.push_back(row);
                }
            }
        }
        for (partition, _) in asked {
            if let Some(part) = self.parts.get_mut(partition) {
                if let Some(scanned) = read.scanned.get(partition) {
                    part.cursor = part.cursor.max(*scanned);
                }
                part.caught_up = !read.more.contains(partition);
            }
        }
    }

    pub fn wake(&mut self) {
        for part in self.parts.values_mut() {
            part.caught_up = false;
        }
    }

    pub fn all_caught_up(&self) -> bool {
        self.parts
            .values()
            .all(|p| p.leaving || (p.caught_up && p.queue.is_empty()))
    }

    /// The attempt of the delivery in flight of `id`, if this member holds it.
    pub fn attempts_held(&self, id: MessageId) -> Option<u32> {
        self.flights.get(&id).map(|f| f.attempts)
    }

    /// The attempts of a state row about to be sent (for the message it is sent as).
    pub fn attempts_of(&self, id: MessageId) -> u32 {
        self.flights.get(&id).map_or(1, |f| f.attempts)
    }

    /// A state row sent whose message the table no longer holds: settled as acked.
    pub fn vanished(&mut self, id: MessageId) {
        if let Some(flight) = self.remove_flight(id) {
            if let Some(part) = self.parts.get_mut(&flight.partition) {
                part.drop_state(flight.position);
            }
        }
    }

    pub fn ack(&mut self, ids: &[MessageId], outcome: &mut Outcome) {
        for id in ids {
            let Some(flight) = self.remove_flight(*id) else {
                outcome.settled.fenced.push(*id);
                continue;
            };
            self.touched.insert(flight.partition);
            outcome.partitions.insert(*id, flight.partition);
            let Some(part) = self.parts.get_mut(&flight.partition) else {
                outcome.settled.fenced.push(*id);
                continue;
            };
            if flight.from_state {
                part.drop_state(flight.position);
            } else {
                part.open.insert(flight.position, true);
            }
            outcome.settled.acked.push(*id);
        }
    }

    /// A failed delivery: retried or dead by the policy (`release` keeps the attempt
    /// uncounted and retries after `delay`).
    pub fn fail(
        &mut self,
        id: MessageId,
        failure: Failure,
        now: DateTime<Utc>,
        outcome: &mut Outcome,
    ) {
        let (error, delay, release, dead) = match failure {
            Failure::Nack { error, delay } => (Some(error), delay, false, false),
            Failure::Release { delay } => (None, Some(delay), true, false),
            Failure::Dead { error } => (Some(error), None, false, true),
        };
        let Some(flight) = self.remove_flight(id) else {
            outcome.settled.fenced.push(id);
            return;
        };
        if !self.parts.contains_key(&flight.partition) {
            outcome.settled.fenced.push(id);
            return;
        }
        self.touched.insert(flight.partition);
        outcome.partitions.insert(id, flight.partition);
        let (kind, attempts, due) = if dead {
            (StateKind::Dead, flight.attempts, now)
        } else if release {
            let delay = delay.unwrap_or_default();
            (
                StateKind::Retry,
                flight.attempts.saturating_sub(1),
                now + chrono_of(delay),
            )
        } else {
            match self.backoff.on_failure(flight.attempts, delay) {
                FailureDecision::RetryAfter(delay) => {
                    (StateKind::Retry, flight.attempts, now + chrono_of(delay))
                }
                FailureDecision::DeadLetter => (StateKind::Dead, flight.attempts, now),
            }
        };
        match (release, kind) {
            (true, _) => outcome.settled.released.push(id),
            (false, StateKind::Dead) => outcome.settled.dead_lettered.push(id),
            (false, _) => {
                outcome.settled.retried.push(id);
                outcome.settled.retry_at = Some(due);
            }
        }
        self.settle_as_state(&flight, id, kind, attempts, due, error);
        // The later rows of its key this stream holds go back behind it.
        if self.settings.ordered() && flight.key.is_some() && !release {
            let later: Vec<MessageId> = self
                .flights
                .iter()
                .filter(|(_, f)| {
                    f.partition == flight.partition
                        && f.key == flight.key
                        && f.position > flight.position
                })
                .map(|(id, _)| *id)
                .collect();
            for later_id in later {
                if let Some(later_flight) = self.remove_flight(later_id) {
                    let attempts = later_flight.attempts.saturating_sub(1);
                    self.settle_as_state(
                        &later_flight,
                        later_id,
                        StateKind::Held,
                        attempts,
                        now,
                        None,
                    );
                    outcome.settled.released.push(later_id);
                }
            }
        }
    }

    fn settle_as_state(
        &mut self,
        flight: &Flight,
        id: MessageId,
        kind: StateKind,
        attempts: u32,
        due_at: DateTime<Utc>,
        error: Option<String>,
    ) {
        let holds = self.holds_key();
        let Some(part) = self.parts.get_mut(&flight.partition) else {
            return;
        };
        if !flight.from_state {
            part.open.insert(flight.position, true);
        }
        part.put_state(
            StateRow {
                id,
                partition: flight.partition,
                key: flight.key.clone(),
                position: flight.position,
                kind,
                attempts,
                due_at,
                error,
            },
            holds,
            true,
        );
    }

    pub fn extend(&mut self, ids: &[MessageId], deadline: Instant, outcome: &mut Outcome) {
        for id in ids {
            match self.flights.get_mut(id) {
                Some(flight) => {
                    flight.deadline = deadline;
                    self.touched.insert(flight.partition);
                    outcome.partitions.insert(*id, flight.partition);
                    outcome.settled.extended.push(*id);
                }
                None => outcome.settled.fenced.push(*id),
            }
        }
    }

    /// Flights whose lease ran out: retried at once (their attempt counted: they may have
    /// been published), or dead past the last attempt.
    pub fn expire(&mut self, now: Instant, wall: DateTime<Utc>) -> Vec<MessageId> {
        let expired: Vec<MessageId> = self
            .flights
            .iter()
            .filter(|(_, f)| f.deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        self.give_back(&expired, wall);
        expired
    }

    /// Gives back flights untried-or-not: each becomes a retry due now (dead past the
    /// last attempt), keeping its attempt.
    pub fn give_back(&mut self, ids: &[MessageId], now: DateTime<Utc>) {
        for id in ids {
            let Some(flight) = self.remove_flight(*id) else {
                continue;
            };
            let kind = if flight.attempts >= self.settings.max_attempts {
                StateKind::Dead
            } else {
                StateKind::Retry
            };
            let error =
                (kind == StateKind::Dead).then(|| "lease expired on the last attempt".to_owned());
            self.settle_as_state(&flight, *id, kind, flight.attempts, now, error);
        }
    }

    pub fn next_deadline(&self) -> Option<Instant> {
        self.flights.values().map(|f| f.deadline).min()
    }

    /// When the earliest retry not in flight is due.
    pub fn next_due(&self) -> Option<DateTime<Utc>> {
        self.parts
            .values()
            .filter(|p| !p.leaving)
            .flat_map(|p| p.state.values())
            .filter(|r| r.kind == StateKind::Retry && !self.flights.contains_key(&r.id))
            .map(|r| r.due_at)
            .min()
    }

    pub fn partition_of(&self, id: MessageId) -> Option<u32> {
        self.flights.get(&id).map(|f| f.partition)
    }
}

pub fn chrono_of(duration: Duration) -> chrono::Duration {
    chrono::Duration::from_std(duration).unwrap_or(chrono::Duration::MAX)
}

mod dispatch;
mod flush;

#[cfg(test)]
mod tests;
