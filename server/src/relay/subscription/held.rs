//! The rows a stream holds, with the local estimate of when each lease runs out.

use std::collections::{BTreeSet, HashMap};

use tokio::time::Instant;

use crate::storage::MessageId;

#[derive(Default)]
pub(super) struct Held {
    deadlines: HashMap<MessageId, Instant>,
    by_deadline: BTreeSet<(Instant, MessageId)>,
}

impl Held {
    pub fn len(&self) -> usize {
        self.deadlines.len()
    }

    pub fn insert(&mut self, id: MessageId, deadline: Instant) {
        if let Some(old) = self.deadlines.insert(id, deadline) {
            self.by_deadline.remove(&(old, id));
        }
        self.by_deadline.insert((deadline, id));
    }

    pub fn remove(&mut self, id: MessageId) {
        if let Some(deadline) = self.deadlines.remove(&id) {
            self.by_deadline.remove(&(deadline, id));
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
        expired
    }

    pub fn ids(&self) -> Vec<MessageId> {
        self.deadlines.keys().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn held_rows_expire_in_deadline_order() {
        let start = Instant::now();
        let mut held = Held::default();
        held.insert(1, start + Duration::from_secs(2));
        held.insert(2, start + Duration::from_secs(1));
        held.insert(3, start + Duration::from_secs(3));
        held.insert(2, start + Duration::from_secs(5)); // extended
        assert_eq!(held.next_deadline(), Some(start + Duration::from_secs(2)));
        assert_eq!(
            held.take_expired(start + Duration::from_secs(3)),
            vec![1, 3]
        );
        held.remove(2);
        assert_eq!(held.len(), 0);
        assert_eq!(held.next_deadline(), None);
    }
}
