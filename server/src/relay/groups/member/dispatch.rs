//! Which rows a member sends now: state rows due first, then the log, in key order.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use chrono::{DateTime, Utc};
use tokio::time::Instant;

use super::{Dispatch, Flight, Member, Part};
use crate::storage::groups::{GroupRow, Position, StateKind, StateRow};
use crate::storage::MessageId;

/// What a dispatch turn reads of the member while it changes one partition.
struct Turn<'a> {
    ordered: bool,
    holds: bool,
    now: DateTime<Utc>,
    batch: u64,
    flights: &'a BTreeMap<MessageId, Flight>,
    keys_in_flight: &'a HashMap<String, usize>,
}

impl Member {
    /// Picks up to `room` messages to send now, in key order.
    pub fn dispatch(&mut self, room: usize, now: DateTime<Utc>, deadline: Instant) -> Dispatch {
        let mut out = Dispatch::default();
        if room == 0 {
            return out;
        }
        self.batches += 1;
        let batch = self.batches;
        let partitions: Vec<u32> = self.parts.keys().copied().collect();
        let instant = Instant::now();
        for partition in partitions {
            let (sends, fresh) = {
                let part = self.parts.get_mut(&partition).expect("listed above");
                // Its lease may have run out in the database (heartbeats failed): another
                // member may own it now. Nothing is sent until a heartbeat renews it.
                if part.lease_until.is_some_and(|until| until <= instant) {
                    continue;
                }
                // A partition being handed over sends only the rows queued before the last
                // row it sent (held back behind a key in flight): its position must pass
                // every row it sent before the next owner reads from there, or that owner
                // would deliver them again. Its state rows are written: they wait for it.
                let horizon = match (part.leaving, part.open.last_key_value()) {
                    (false, _) => None,
                    (true, Some((last, _))) => Some(*last),
                    (true, None) => continue,
                };
                let turn = Turn {
                    ordered: self.settings.ordered(),
                    holds: self.settings.dead_letter_holds_key,
                    now,
                    batch,
                    flights: &self.flights,
                    keys_in_flight: &self.keys_in_flight,
                };
                let left = room - out.fresh.len() - out.from_state.len();
                let sends = match horizon {
                    None => due_state_rows(part, left, &turn),
                    Some(_) => Vec::new(),
                };
                let fresh = log_rows(part, partition, left - sends.len(), horizon, &turn);
                (sends, fresh)
            };
            for row in sends {
                self.fly(
                    row.id,
                    partition,
                    row.position,
                    row.key.clone(),
                    row.attempts + 1,
                    deadline,
                    true,
                    batch,
                );
                out.from_state.push(row.id);
            }
            for mut row in fresh {
                self.fly(
                    row.message.id,
                    partition,
                    row.position,
                    row.message.key.clone(),
                    1,
                    deadline,
                    false,
                    batch,
                );
                row.message.attempts = 1;
                out.fresh.push(row);
            }
        }
        out
    }

    #[allow(clippy::too_many_arguments)]
    fn fly(
        &mut self,
        id: MessageId,
        partition: u32,
        position: Position,
        key: Option<String>,
        attempts: u32,
        deadline: Instant,
        from_state: bool,
        batch: u64,
    ) {
        if let Some(key) = &key {
            *self.keys_in_flight.entry(key.clone()).or_default() += 1;
        }
        self.flights.insert(
            id,
            Flight {
                partition,
                position,
                key,
                attempts,
                deadline,
                from_state,
                batch,
            },
        );
    }
}

/// State rows to send, up to `room`: each blocked key's first row when due, and keyless
/// retries when due.
fn due_state_rows(part: &Part, room: usize, turn: &Turn) -> Vec<StateRow> {
    let mut sends = Vec::new();
    let mut seen_keys: BTreeSet<&str> = BTreeSet::new();
    for row in part.state.values() {
        if sends.len() >= room {
            break;
        }
        if turn.flights.contains_key(&row.id) || row.kind == StateKind::Dead {
            if let (true, Some(key)) = (turn.ordered, &row.key) {
                if row.kind != StateKind::Dead || turn.holds {
                    seen_keys.insert(key);
                }
            }
            continue;
        }
        let first_of_key = match (&row.key, turn.ordered) {
            (Some(key), true) => {
                let first = seen_keys.insert(key.as_str());
                first && !turn.keys_in_flight.contains_key(key)
            }
            _ => true,
        };
        let due = row.kind == StateKind::Held || row.due_at <= turn.now;
        if first_of_key && due {
            sends.push(row.clone());
        }
    }
    sends
}

/// Rows of the log to send, up to `room` (none past `horizon`), skipping keys still in
/// flight from an earlier batch; rows of a blocked key become held state rows.
fn log_rows(
    part: &mut Part,
    partition: u32,
    room: usize,
    horizon: Option<Position>,
    turn: &Turn,
) -> Vec<GroupRow> {
    let mut fresh: Vec<GroupRow> = Vec::new();
    let mut kept = VecDeque::new();
    while let Some(row) = part.queue.pop_front() {
        if fresh.len() >= room || horizon.is_some_and(|last| row.position > last) {
            kept.push_back(row);
            continue;
        }
        // Already a state row (a retry a former owner wrote): the state row is what
        // delivers it; the position may pass it.
        if part.state.contains_key(&row.position) || part.settled_ahead.remove(&row.position) {
            part.open.insert(row.position, true);
            continue;
        }
        let key = row.message.key.clone();
        if let (true, Some(key)) = (turn.ordered, &key) {
            if part.blocked.contains_key(key) {
                let held = StateRow {
                    id: row.message.id,
                    partition,
                    key: Some(key.clone()),
                    position: row.position,
                    kind: StateKind::Held,
                    attempts: 0,
                    due_at: turn.now,
                    error: None,
                };
                part.open.insert(row.position, true);
                part.put_state(held, turn.holds, true);
                continue;
            }
            let busy = turn.keys_in_flight.contains_key(key)
                && turn
                    .flights
                    .values()
                    .any(|f| f.key.as_deref() == Some(key) && f.batch != turn.batch);
            if busy
                || kept
                    .iter()
                    .any(|r: &GroupRow| r.message.key.as_deref() == Some(key))
            {
                kept.push_back(row);
                continue;
            }
        }
        part.open.insert(row.position, false);
        fresh.push(row);
    }
    part.queue = kept;
    fresh
}
