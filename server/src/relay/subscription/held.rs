//! The rows a stream holds, with the local estimate of when each lease runs out, counted
//! in the outbox's `txoutbox_messages_in_flight` while held.

use std::collections::{BTreeSet, HashMap};

use prometheus::IntGauge;
use tokio::time::Instant;

use crate::storage::MessageId;

pub(super) struct Held {
    deadlines: HashMap<MessageId, Instant>,
    by_deadline: BTreeSet<(Instant, MessageId)>,
    /// The outbox's in-flight gauge, shared by its streams: each adds what it holds.
    in_flight: IntGauge,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.in_flight.sub(self.len() as i64);
    }
}

impl Held {
    pub fn new(in_flight: IntGauge) -> Self {
        Self {
            deadlines: HashMap::new(),
            by_deadline: BTreeSet::new(),
            in_flight,
        }
    }

    pub fn len(&self) -> usize {
        self.deadlines.len()
    }

    pub fn insert(&mut self, id: MessageId, deadline: Instant) {
        match self.deadlines.insert(id, deadline) {
            Some(old) => {
                self.by_deadline.remove(&(old, id));
            }
            None => self.in_flight.inc(),
        }
        self.by_deadline.insert((deadline, id));
    }

    pub fn remove(&mut self, id: MessageId) {
        if let Some(deadline) = self.deadlines.remove(&id) {
            self.by_deadline.remove(&(deadline, id));
            self.in_flight.dec();
        }
    }

    pub fn remove_all(&mut self, ids: &[MessageId]) {
        ids.iter().for_each(|id| self.remove(*id));
    }

    pub fn next_deadline(&self) -> Option<Instant> {
        self.by_deadline.first().map(|(deadline, _)| *deadline)
    }

    pub fn take_expired(&mut self, now: Instant) -> Vec<MessageId> {
        let mut expired = Vec::new();
        while let Some(&(deadline, id)) = self.by_deadline.first() {
            if deadline > now {
                break;
            }
            self.by_deadline.pop_first();
            self.deadlines.remove(&id);
            expired.push(id);
        }
        self.in_flight.sub(expired.len() as i64);
        expired
    }

    pub fn ids(&self) -> Vec<MessageId> {
        self.deadlines.keys().copied().collect()
    }

    /// Forgets every row (given back).
    pub fn clear(&mut self) {
        self.in_flight.sub(self.len() as i64);
        self.deadlines.clear();
        self.by_deadline.clear();
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
        let mut held = Held::new(in_flight.clone());
        held.insert(1, start + Duration::from_secs(2));
        held.insert(2, start + Duration::from_secs(1));
        held.insert(3, start + Duration::from_secs(3));
        held.insert(2, start + Duration::from_secs(5)); // extended
        assert_eq!(held.next_deadline(), Some(start + Duration::from_secs(2)));
        assert_eq!(
            held.take_expired(start + Duration::from_secs(3)),
            vec![1, 3]
        );
        assert_eq!(in_flight.get(), 1);
        held.remove(2);
        assert_eq!(in_flight.get(), 0);
        assert_eq!(held.len(), 0);
        assert_eq!(held.next_deadline(), None);
    }
}
