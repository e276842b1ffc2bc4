//! Rows a stream claimed ahead of its subscriber: with strict ordering, a stream's claim
//! goes on past the rows of a key the stream itself holds ([`Storage::claim_ahead`]), so a
//! hot key has its next batch claimed while the subscriber publishes the one before. Such
//! a row is *parked* here, held and leased but not sent, until the subscriber has acked
//! every earlier row of its key it was sent; then it goes out.
//!
//! Why parking, rather than sending the rows as claimed: a subscriber may nack row 10 of
//! a key while a claim takes rows 21-40 of it (11-20 being the stream's). The nack gives
//! back 11-40 with it, but a batch with 21-40 sent as claimed can reach the subscriber
//! after it sent the nack and before the nack's `settled`, when it has nothing left of
//! the key to hold them behind: it would publish 21 ahead of 10's retry. No rule in the
//! server closes that once the batch is sent (the nack may be on the wire), and a rule in
//! the client would have to be in every client. Parked, the rows are never sent while an
//! earlier row of their key is unanswered, so what a subscriber sees is what it saw
//! before claims went ahead: no row of a key while it holds an earlier one it has not
//! acked. That is enough because of what an ack-taken row can still do: an ack only
//! settles (the key's head moves on to rows this stream holds), or comes back fenced,
//! which orphans the key below.
//!
//! The rules, each unit-tested below:
//! - a keyed row is sent at once when the stream holds no unacked sent row of its key and
//!   nothing parked of it; otherwise it is parked, after the key's other parked rows;
//! - an ack taken from the subscriber (read off the answer queue, before it is applied)
//!   counts: once every sent row of a key is acked, its parked rows go out, in id order;
//! - a sent row that stops being held otherwise (nacked, released, dead-lettered, its ack
//!   fenced, its lease run out) or a parked row whose lease ran out *orphans* its key:
//!   the key's parked rows, and rows of it that a claim running meanwhile returns, are
//!   never sent but given back (see [`Parked::take_orphans`]; the stream claims nothing
//!   until they are). A nack's own give-back already includes the parked rows (they are
//!   the owner's later rows of the key): they simply stop being held;
//! - `set_window(0)` and the drain orphan every parked row: no batch follows them;
//! - a claim goes on past this stream's rows of a key only up to the last row of it the
//!   stream knows it holds ([`Parked::held_keys`]): a row leased to the stream that it does
//!   not know of (a claim that committed but whose answer was lost with the connection)
//!   will never be answered, so it must hold its key back until its lease runs out;
//! - parked rows keep the lease of their key: an extension of a sent row extends them;
//! - the subscriber never hears of a parked row: settlements and expiries that name one
//!   are stripped of it ([`Parked::unseen`]).
//!
//! Keyless rows and rows of a table without strict ordering are always sent at once.
//!
//! [`Storage::claim_ahead`]: crate::storage::Storage::claim_ahead

use std::collections::{BTreeSet, HashMap, HashSet};

use chrono::{DateTime, Utc};

use crate::storage::{Claimed, HeldKeys, MessageId, OutboxMessage};

#[derive(Debug, Default)]
pub(super) struct Parked {
    /// Strict ordering: without it every row is sent at once.
    enabled: bool,
    /// Keyed rows sent and still held: their key, and whether their ack was taken.
    sent: HashMap<MessageId, (String, bool)>,
    /// Per key, how many of its sent rows are not acked.
    unacked: HashMap<String, usize>,
    /// Per key, its parked rows in id order, with the lease of the claim that took them.
    parked: HashMap<String, Vec<(OutboxMessage, DateTime<Utc>)>>,
    /// The key of each parked row.
    parked_ids: HashMap<MessageId, String>,
    /// Rows to give back untried, never sent.
    orphans: BTreeSet<MessageId>,
    /// Keys whose orphans are not given back yet: what a claim returns of them is too.
    orphaned_keys: HashSet<String>,
}

impl Parked {
    pub fn new(strict_ordering: bool) -> Self {
        Self {
            enabled: strict_ordering,
            ..Self::default()
        }
    }

    /// Takes a claim's rows: returns those to send now (in id order, with the claim's
    /// lease), parks or orphans the rest.
    pub fn sort(&mut self, claimed: Claimed) -> Claimed {
        if !self.enabled {
            return claimed;
        }
        let Claimed {
            messages,
            lease_expires_at,
            exhausted,
        } = claimed;
        let mut send = Vec::with_capacity(messages.len());
        // Whether each key of the claim goes out, decided before any of its rows does: a
        // key's rows of one claim go out together.
        let mut goes_out: HashMap<String, bool> = HashMap::new();
        for message in messages {
            let Some(key) = message.key.clone() else {
                send.push(message);
                continue;
            };
            // Claimed again while still held here (its lease ran out in the database a
            // moment before it does here): this delivery replaces the old one.
            if self.parked_ids.contains_key(&message.id) {
                continue;
            }
            if let Some((old_key, acked)) = self.sent.remove(&message.id) {
                if !acked {
                    self.unacked_dec(&old_key);
                }
            }
            let free = *goes_out.entry(key.clone()).or_insert_with(|| {
                !self.unacked.contains_key(&key) && !self.parked.contains_key(&key)
            });
            if self.orphaned_keys.contains(&key) {
                self.orphans.insert(message.id);
            } else if !free {
                self.parked_ids.insert(message.id, key.clone());
                self.parked
                    .entry(key)
                    .or_default()
                    .push((message, lease_expires_at));
            } else {
                self.sent_now(message.id, key);
                send.push(message);
            }
        }
        Claimed {
            messages: send,
            lease_expires_at,
            exhausted,
        }
    }

    fn sent_now(&mut self, id: MessageId, key: String) {
        *self.unacked.entry(key.clone()).or_default() += 1;
        self.sent.insert(id, (key, false));
    }

    /// Acks taken from the subscriber for `ids`: the parked rows whose key has no unacked
    /// sent row left, to send now (`None` when there are none).
    pub fn acked(&mut self, ids: impl IntoIterator<Item = MessageId>) -> Option<Claimed> {
        let mut freed = Vec::new();
        for id in ids {
            let Some((key, acked)) = self.sent.get_mut(&id) else {
                continue;
            };
            if *acked {
                continue;
            }
            *acked = true;
            let key = key.clone();
            if self.unacked_dec(&key) == 0 && !self.orphaned_keys.contains(&key) {
                freed.push(key);
            }
        }
        let mut rows: Vec<(OutboxMessage, DateTime<Utc>)> = Vec::new();
        for key in freed {
            let Some(parked) = self.parked.remove(&key) else {
                continue;
            };
            for (message, lease) in parked {
                self.parked_ids.remove(&message.id);
                self.sent_now(message.id, key.clone());
                rows.push((message, lease));
            }
        }
        let lease_expires_at = rows.iter().map(|(_, lease)| *lease).min()?;
        let mut messages: Vec<OutboxMessage> = rows.into_iter().map(|(m, _)| m).collect();
        messages.sort_by_key(|m| m.id);
        Some(Claimed {
            messages,
            lease_expires_at,
            exhausted: Vec::new(),
        })
    }

    fn unacked_dec(&mut self, key: &str) -> usize {
        let Some(count) = self.unacked.get_mut(key) else {
            return 0;
        };
        *count = count.saturating_sub(1);
        let left = *count;
        if left == 0 {
            self.unacked.remove(key);
        }
        left
    }

    /// Rows that stopped being held by an applied answer: `fenced` among them were not
    /// the stream's any more. A sent row that goes otherwise than by its ack orphans its
    /// key; a parked row (a nack gave it back with the row before it) is forgotten.
    pub fn finished(&mut self, ids: &[MessageId], fenced: &[MessageId]) {
        for id in ids {
            if let Some((key, acked)) = self.sent.remove(id) {
                if !acked {
                    self.unacked_dec(&key);
                }
                if !acked || fenced.contains(id) {
                    self.orphan(key);
                }
            } else if let Some(key) = self.parked_ids.remove(id) {
                if let Some(rows) = self.parked.get_mut(&key) {
                    rows.retain(|(m, _)| m.id != *id);
                    if rows.is_empty() {
                        self.parked.remove(&key);
                    }
                }
                // Its extension found it gone: the rest of the key must not go out.
                if fenced.contains(id) {
                    self.orphan(key);
                }
            } else {
                self.orphans.remove(id);
            }
        }
    }

    /// Leases that ran out (no longer held): their keys are orphaned.
    pub fn expired(&mut self, ids: &[MessageId]) {
        for id in ids {
            let key = match self.sent.remove(id) {
                Some((key, acked)) => {
                    if !acked {
                        self.unacked_dec(&key);
                    }
                    Some(key)
                }
                None => self.parked_ids.get(id).cloned(),
            };
            if let Some(key) = key {
                self.orphan(key);
            }
        }
        // An expired row is no longer held: not given back.
        for id in ids {
            self.orphans.remove(id);
        }
    }

    /// Stops sending rows of `key`: its parked rows are to be given back.
    fn orphan(&mut self, key: String) {
        if let Some(rows) = self.parked.remove(&key) {
            for (message, _) in rows {
                self.parked_ids.remove(&message.id);
                self.orphans.insert(message.id);
            }
        }
        self.orphaned_keys.insert(key);
    }

    /// Orphans every parked row (`set_window(0)`, the drain).
    pub fn orphan_all(&mut self) {
        let keys: Vec<String> = self.parked.keys().cloned().collect();
        for key in keys {
            self.orphan(key);
        }
    }

    /// Whether rows wait to be given back: no claim starts until they are.
    pub fn has_orphans(&self) -> bool {
        !self.orphans.is_empty()
    }

    /// The rows to give back now. The caller gives them back while no claim runs, and
    /// starts no claim until that is applied.
    pub fn take_orphans(&mut self) -> Vec<MessageId> {
        std::mem::take(&mut self.orphans).into_iter().collect()
    }

    /// A claim starts (never while orphans wait to be given back): it sees the table after
    /// every loss that orphaned a key and after its orphans went back, so what it returns
    /// of those keys follows the rows this stream still holds, and may be sent by the
    /// rules above. Only a claim that was running when a key was orphaned could have
    /// followed rows lost since; its rows of the key are orphaned too.
    pub fn claim_starts(&mut self) {
        debug_assert!(self.orphans.is_empty());
        self.orphaned_keys.clear();
    }

    /// The parked rows of the keys of the sent rows `ids` (to extend with them).
    pub fn behind(&self, ids: &[MessageId]) -> Vec<MessageId> {
        let keys: HashSet<&String> = ids
            .iter()
            .filter_map(|id| self.sent.get(id).map(|(key, _)| key))
            .collect();
        keys.into_iter()
            .filter_map(|key| self.parked.get(key))
            .flatten()
            .map(|(m, _)| m.id)
            .collect()
    }

    /// What the next claim may go on past: each key this stream holds rows of (sent or
    /// parked), with the last of them. Rows of the owner past that are ones the stream
    /// does not know it holds (a claim whose answer was lost after it committed): the
    /// claim stops there. `None` without strict ordering.
    pub fn held_keys(&self) -> Option<HeldKeys> {
        if !self.enabled {
            return None;
        }
        let mut last: HashMap<&str, MessageId> = HashMap::new();
        let sent = self.sent.iter().map(|(id, (key, _))| (id, key));
        for (id, key) in sent.chain(&self.parked_ids) {
            let entry = last.entry(key.as_str()).or_insert(*id);
            *entry = (*entry).max(*id);
        }
        let (keys, last_ids) = last
            .into_iter()
            .map(|(key, id)| (key.to_owned(), id))
            .unzip();
        Some(HeldKeys { keys, last_ids })
    }

    /// Whether the subscriber has never been sent `id`: parked or orphaned.
    pub fn unseen(&self, id: MessageId) -> bool {
        self.parked_ids.contains_key(&id) || self.orphans.contains(&id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: MessageId, key: Option<&str>) -> OutboxMessage {
        OutboxMessage {
            id,
            topic: "t".into(),
            key: key.map(str::to_owned),
            payload: Vec::new(),
            headers: Default::default(),
            attempts: 1,
            created_at: Utc::now(),
            too_large: None,
        }
    }

    fn claimed(rows: &[(MessageId, Option<&str>)]) -> Claimed {
        Claimed {
            messages: rows.iter().map(|(id, key)| row(*id, *key)).collect(),
            lease_expires_at: Utc::now(),
            exhausted: Vec::new(),
        }
    }

    fn ids(claimed: &Claimed) -> Vec<MessageId> {
        claimed.messages.iter().map(|m| m.id).collect()
    }

    #[test]
    fn rows_behind_unacked_rows_of_their_key_wait_for_their_acks() {
        let mut p = Parked::new(true);
        assert_eq!(
            ids(&p.sort(claimed(&[(1, Some("a")), (2, Some("a"))]))),
            [1, 2]
        );
        let sent = p.sort(claimed(&[(3, Some("a")), (4, Some("b")), (5, None)]));
        assert_eq!(ids(&sent), [4, 5], "3 waits behind 1 and 2");
        assert!(p.unseen(3));
        assert!(p.acked([1]).is_none(), "2 is not acked yet");
        assert_eq!(ids(&p.sort(claimed(&[(6, Some("a"))]))), Vec::<i64>::new());
        assert_eq!(ids(&p.acked([2]).expect("3 and 6 go out")), [3, 6]);
        assert!(!p.unseen(3));
        assert_eq!(p.behind(&[3]), Vec::<i64>::new());
        p.finished(&[1, 2], &[]);
        assert!(!p.has_orphans());
    }

    #[test]
    fn a_sent_row_given_back_orphans_what_is_parked_behind_it() {
        let mut p = Parked::new(true);
        p.sort(claimed(&[(1, Some("a")), (2, Some("a"))]));
        p.sort(claimed(&[(3, Some("a")), (4, Some("a"))]));
        assert_eq!(p.behind(&[1]), [3, 4]);
        p.acked([2]);
        // 1 nacked, released with nothing parked given back with it: 3 and 4 go back.
        p.finished(&[1], &[]);
        assert!(p.has_orphans());
        assert!(p.acked([1]).is_none(), "an orphaned key sends nothing");
        assert_eq!(ids(&p.sort(claimed(&[(5, Some("a"))]))), Vec::<i64>::new());
        assert_eq!(p.take_orphans(), [3, 4, 5]);
        assert!(!p.has_orphans());
        p.claim_starts();
        p.finished(&[2], &[]);
        assert_eq!(
            ids(&p.sort(claimed(&[(1, Some("a"))]))),
            [1],
            "the key comes back"
        );
    }

    #[test]
    fn a_nack_that_gives_back_parked_rows_leaves_nothing_to_give_back() {
        let mut p = Parked::new(true);
        p.sort(claimed(&[(1, Some("a")), (2, Some("a"))]));
        p.sort(claimed(&[(3, Some("a"))]));
        // The nack of 1 gave back 2 and 3 with it.
        p.finished(&[1, 2, 3], &[]);
        assert_eq!(p.take_orphans(), Vec::<i64>::new());
    }

    #[test]
    fn a_fenced_ack_or_a_lost_lease_orphans_the_key() {
        let mut p = Parked::new(true);
        p.sort(claimed(&[(1, Some("a")), (2, Some("b"))]));
        p.sort(claimed(&[(3, Some("a")), (4, Some("b"))]));
        p.finished(&[1], &[1]);
        p.expired(&[2]);
        assert!(p.acked([1, 2]).is_none());
        assert_eq!(p.take_orphans(), [3, 4]);
    }

    #[test]
    fn an_expired_parked_row_orphans_the_rest_of_its_key() {
        let mut p = Parked::new(true);
        p.sort(claimed(&[(1, Some("a"))]));
        p.sort(claimed(&[(2, Some("a")), (3, Some("a"))]));
        p.expired(&[2]);
        assert!(p.acked([1]).is_none());
        assert_eq!(p.take_orphans(), [3], "2 is no longer held");
    }

    #[test]
    fn a_closed_window_orphans_every_parked_row() {
        let mut p = Parked::new(true);
        p.sort(claimed(&[(1, Some("a")), (2, Some("b"))]));
        p.sort(claimed(&[(3, Some("a")), (4, Some("b"))]));
        p.orphan_all();
        assert!(p.acked([1, 2]).is_none());
        assert_eq!(p.take_orphans(), [3, 4]);
    }

    #[test]
    fn a_row_claimed_again_while_held_is_counted_once() {
        let mut p = Parked::new(true);
        p.sort(claimed(&[(1, Some("a")), (2, Some("a"))]));
        assert!(p
            .sort(claimed(&[(2, Some("a")), (3, Some("a"))]))
            .messages
            .is_empty());
        assert!(p.sort(claimed(&[(3, Some("a"))])).messages.is_empty());
        assert_eq!(ids(&p.acked([1]).expect("2 and 3 go out")), [2, 3]);
    }

    #[test]
    fn without_strict_ordering_everything_is_sent() {
        let mut p = Parked::new(false);
        p.sort(claimed(&[(1, Some("a"))]));
        assert_eq!(ids(&p.sort(claimed(&[(2, Some("a"))]))), [2]);
    }
}
