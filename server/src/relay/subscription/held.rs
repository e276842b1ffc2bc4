//! The rows a stream holds, with the local estimate of when each lease runs out, counted
//! in the outbox's `txoutbox_messages_in_flight` while held, and their bytes in the
//! identity's `max_bytes_in_flight` (see [`BytesInFlight`]): a row's bytes go back the
//! moment it stops being held, however that happens.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use prometheus::IntGauge;
use tokio::time::Instant;

use super::super::bytes_in_flight::BytesInFlight;
use crate::storage::MessageId;

pub(super) struct Held {
    /// Each row's deadline and bytes.
    deadlines: HashMap<MessageId, (Instant, usize)>,
    by_deadline: BTreeSet<(Instant, MessageId)>,
    /// Each row's attempt as claimed: what a lease token of a current delivery names.
    attempts: HashMap<MessageId, u32>,
    /// The outbox's in-flight gauge, shared by its streams: each adds what it holds.
    in_flight: IntGauge,
    /// The identity's byte budget, when it has one: the rows' bytes were taken from it
    /// (by the claim's allowance) and go back to it here.
    bytes: Option<Arc<BytesInFlight>>,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.clear();
    }
}

impl Held {
    pub fn new(in_flight: IntGauge, bytes: Option<Arc<BytesInFlight>>) -> Self {
        Self {
            deadlines: HashMap::new(),
            by_deadline: BTreeSet::new(),
            attempts: HashMap::new(),
            in_flight,
            bytes,
        }
    }

    fn release(&self, bytes: usize) {
        if let Some(budget) = &self.bytes {
            budget.release(bytes);
        }
    }

    pub fn len(&self) -> usize {
        self.deadlines.len()
    }

    /// The attempt of the delivery of `id` this stream holds, if it holds one.
    pub fn attempt(&self, id: MessageId) -> Option<u32> {
        self.attempts.get(&id).copied()
    }

    /// Holds a claimed row of `bytes` (already taken from the budget by the claim) at
    /// `attempt`.
    pub fn insert(&mut self, id: MessageId, attempt: u32, deadline: Instant, bytes: usize) {
        self.attempts.insert(id, attempt);
        match self.deadlines.insert(id, (deadline, bytes)) {
            Some((old, old_bytes)) => {
                self.by_deadline.remove(&(old, id));
                self.release(old_bytes);
            }
            None => self.in_flight.inc(),
        }
        self.by_deadline.insert((deadline, id));
    }

    /// Moves a held row's deadline (an extended lease), its bytes still held; a row no
    /// longer held is held again, its bytes unknown here and not counted.
    pub fn extend(&mut self, id: MessageId, deadline: Instant) {
        let bytes = match self.deadlines.get(&id) {
            Some(&(old, bytes)) => {
                self.by_deadline.remove(&(old, id));
                bytes
            }
            None => {
                self.in_flight.inc();
                0
            }
        };
        self.deadlines.insert(id, (deadline, bytes));
        self.by_deadline.insert((deadline, id));
    }

    fn remove(&mut self, id: MessageId) -> usize {
        self.attempts.remove(&id);
        match self.deadlines.remove(&id) {
            Some((deadline, bytes)) => {
                self.by_deadline.remove(&(deadline, id));
                self.in_flight.dec();
                bytes
            }
            None => 0,
        }
    }

    pub fn remove_all(&mut self, ids: &[MessageId]) {
        let bytes = ids.iter().map(|id| self.remove(*id)).sum();
        self.release(bytes);
    }

    pub fn next_deadline(&self) -> Option<Instant> {
        self.by_deadline.first().map(|(deadline, _)| *deadline)
    }

    pub fn take_expired(&mut self, now: Instant) -> Vec<MessageId> {
        let (mut expired, mut bytes) = (Vec::new(), 0);
        while let Some(&(deadline, id)) = self.by_deadline.first() {
            if deadline > now {
                break;
            }
            self.by_deadline.pop_first();
            self.attempts.remove(&id);
            bytes += self.deadlines.remove(&id).map_or(0, |(_, bytes)| bytes);
            expired.push(id);
        }
        self.in_flight.sub(expired.len() as i64);
        self.release(bytes);
        expired
    }

    pub fn ids(&self) -> Vec<MessageId> {
        self.deadlines.keys().copied().collect()
    }

    /// Forgets every row (given back).
    pub fn clear(&mut self) {
        self.in_flight.sub(self.len() as i64);
        self.release(self.deadlines.values().map(|(_, bytes)| bytes).sum());
        self.deadlines.clear();
        self.by_deadline.clear();
        self.attempts.clear();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn held_rows_expire_in_deadline_order() {
        let start = Instant::now();
        let in_flight = IntGauge::new("in_flight", "rows held").unwrap();
        let mut held = Held::new(in_flight.clone(), None);
        held.insert(1, 1, start + Duration::from_secs(2), 10);
        held.insert(2, 1, start + Duration::from_secs(1), 10);
        held.insert(3, 1, start + Duration::from_secs(3), 10);
        held.extend(2, start + Duration::from_secs(5));
        assert_eq!(held.next_deadline(), Some(start + Duration::from_secs(2)));
        assert_eq!(
            held.take_expired(start + Duration::from_secs(3)),
            vec![1, 3]
        );
        assert_eq!(in_flight.get(), 1);
        held.remove_all(&[2]);
        assert_eq!(in_flight.get(), 0);
        assert_eq!(held.len(), 0);
        assert_eq!(held.next_deadline(), None);
    }

    #[test]
    fn rows_give_their_bytes_back_however_they_stop_being_held() {
        let start = Instant::now();
        let budget = BytesInFlight::new("app", 1000);
        let in_flight = IntGauge::new("in_flight", "rows held").unwrap();
        let mut held = Held::new(in_flight, Some(Arc::clone(&budget)));
        let mut stream = budget.open();
        stream.take(300, 1000).expect("room").keep(300);
        held.insert(1, 1, start + Duration::from_secs(1), 100);
        held.insert(2, 1, start + Duration::from_secs(2), 100);
        held.insert(3, 1, start + Duration::from_secs(3), 100);
        held.extend(1, start + Duration::from_secs(4));
        assert_eq!(budget.used(), 300, "an extended row keeps its bytes");
        held.remove_all(&[3]);
        assert_eq!(budget.used(), 200, "answered");
        assert_eq!(held.take_expired(start + Duration::from_secs(2)), vec![2]);
        assert_eq!(budget.used(), 100, "lease ran out");
        drop(held);
        assert_eq!(budget.used(), 0, "given back at the end");
    }
}
