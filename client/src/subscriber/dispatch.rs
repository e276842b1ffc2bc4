//! The messages one stream holds, grouped by key: which may start now, which wait behind
//! an earlier message of their key, and which leases need extending.
//!
//! Pure bookkeeping, no I/O, so every ordering rule is unit-tested here. The rules:
//! - a key's messages start one at a time, in the order received (id order);
//! - the next one starts only once the previous one's ack is *settled* (the protocol
//!   says so: if that ack were fenced, the previous message comes back, and the next one
//!   must not overtake it);
//! - when a message fails or is lost, every later message of its key this stream holds
//!   is taken out untried, to be given back.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

use crate::Message;

/// The ordering group of a message: its key, or the message alone when it has none.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum GroupKey {
    Key(String),
    Single(i64),
}

impl GroupKey {
    fn of(message: &Message) -> Self {
        match &message.key {
            Some(key) => Self::Key(key.clone()),
            None => Self::Single(message.id),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    /// Waiting for its turn.
    Queued,
    /// The publisher has it.
    Publishing,
    /// Published, ack sent, not settled yet: the rest of its key waits.
    Acking,
}

#[derive(Debug)]
struct Held {
    group: GroupKey,
    key: Option<String>,
    state: State,
    /// Local estimate of when the lease runs out (never later than the server's).
    deadline: Instant,
    /// No extension beyond this.
    limit: Instant,
}

#[derive(Debug, Default)]
struct Group {
    /// Messages not started yet, in order.
    queue: VecDeque<Message>,
    /// The message publishing or acking, which the queue waits for.
    active: Option<i64>,
    /// Whether the group is in `ready`.
    scheduled: bool,
}

/// Messages taken out untried behind a failed or lost one.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Blocked {
    /// The later messages of the key, to give back: (id, key).
    pub ids: Vec<i64>,
    pub key: Option<String>,
}

#[derive(Debug, Default)]
pub(super) struct Dispatch {
    held: HashMap<i64, Held>,
    groups: HashMap<GroupKey, Group>,
    /// Groups whose head may start now, oldest first (fair across keys).
    ready: VecDeque<GroupKey>,
}

impl Dispatch {
    /// Messages held and not yet answered.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.held.len()
    }

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    pub fn state(&self, id: i64) -> Option<State> {
        self.held.get(&id).map(|h| h.state)
    }

    /// Adds a message the server just delivered, leased until `deadline`; its lease may be
    /// extended up to `limit`.
    pub fn add(&mut self, message: Message, deadline: Instant, limit: Instant) {
        let group = GroupKey::of(&message);
        self.held.insert(
            message.id,
            Held {
                group: group.clone(),
                key: message.key.clone(),
                state: State::Queued,
                deadline,
                limit,
            },
        );
        let entry = self.groups.entry(group.clone()).or_default();
        entry.queue.push_back(message);
        if entry.active.is_none() && !entry.scheduled {
            entry.scheduled = true;
            self.ready.push_back(group);
        }
    }

    /// The next message that may start, marked as publishing.
    pub fn next_ready(&mut self) -> Option<Message> {
        while let Some(key) = self.ready.pop_front() {
            let Some(group) = self.groups.get_mut(&key) else {
                continue;
            };
            group.scheduled = false;
            if group.active.is_some() {
                continue;
            }
            let Some(message) = group.queue.pop_front() else {
                self.groups.remove(&key);
                continue;
            };
            group.active = Some(message.id);
            if let Some(held) = self.held.get_mut(&message.id) {
                held.state = State::Publishing;
            }
            return Some(message);
        }
        None
    }

    /// The publisher accepted `id`; its ack is on its way.
    pub fn published(&mut self, id: i64) {
        if let Some(held) = self.held.get_mut(&id) {
            held.state = State::Acking;
        }
    }

    /// The server confirmed the ack of `id`: the next message of its key may start.
    pub fn acked(&mut self, id: i64) {
        // Only the answer to an ack we sent counts: the same id may since have been lost
        // and delivered again.
        if self.state(id) != Some(State::Acking) {
            return;
        }
        let Some(held) = self.held.remove(&id) else {
            return;
        };
        let Some(group) = self.groups.get_mut(&held.group) else {
            return;
        };
        if group.active == Some(id) {
            group.active = None;
        }
        if group.queue.is_empty() && group.active.is_none() {
            self.groups.remove(&held.group);
        } else if group.active.is_none() && !group.scheduled {
            group.scheduled = true;
            self.ready.push_back(held.group);
        }
    }

    /// `id` failed, or its lease is gone: forget it, and take out every later message of
    /// its key (they must not overtake it). `None` when `id` is not held.
    pub fn fail(&mut self, id: i64) -> Option<Blocked> {
        let held = self.held.remove(&id)?;
        let mut blocked = Blocked {
            ids: Vec::new(),
            key: held.key,
        };
        let Some(group) = self.groups.get_mut(&held.group) else {
            return Some(blocked);
        };
        let later: Vec<Message> = match group.queue.iter().position(|m| m.id == id) {
            // A queued message: the ones before it may still go.
            Some(position) => {
                let mut later = group.queue.split_off(position);
                later.pop_front();
                later.into()
            }
            None => {
                if group.active == Some(id) {
                    group.active = None;
                }
                group.queue.drain(..).collect()
            }
        };
        for message in later {
            self.held.remove(&message.id);
            blocked.ids.push(message.id);
        }
        if group.queue.is_empty() && group.active.is_none() {
            self.groups.remove(&held.group);
        }
        Some(blocked)
    }

    /// Takes out every message not started yet (on stop or drain), to give back.
    pub fn take_queued(&mut self) -> Vec<i64> {
        let mut ids = Vec::new();
        self.groups.retain(|_, group| {
            ids.extend(group.queue.drain(..).map(|m| m.id));
            group.scheduled = false;
            group.active.is_some()
        });
        self.ready.clear();
        for id in &ids {
            self.held.remove(id);
        }
        ids.sort_unstable();
        ids
    }

    /// Unanswered messages whose lease runs out within `margin` and may still be extended
    /// by `lease` from `now`.
    pub fn due_for_extension(&self, now: Instant, margin: Duration, lease: Duration) -> Vec<i64> {
        let mut ids: Vec<i64> = self
            .held
            .iter()
            .filter(|(_, h)| h.state != State::Acking)
            .filter(|(_, h)| h.deadline <= now + margin && now + lease <= h.limit)
            .map(|(id, _)| *id)
            .collect();
        ids.sort_unstable();
        ids
    }

    /// The lease of `id` now runs until `deadline`.
    pub fn extended(&mut self, id: i64, deadline: Instant) {
        if let Some(held) = self.held.get_mut(&id) {
            held.deadline = held.deadline.max(deadline);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(id: i64, key: Option<&str>) -> Message {
        let message = Message::new(id, "t", "p");
        match key {
            Some(key) => message.with_key(key),
            None => message,
        }
    }

    fn with(messages: &[(i64, Option<&str>)]) -> Dispatch {
        let mut dispatch = Dispatch::default();
        let now = Instant::now();
        for (id, key) in messages {
            dispatch.add(msg(*id, *key), now, now + Duration::from_secs(60));
        }
        dispatch
    }

    fn drain_ready(dispatch: &mut Dispatch) -> Vec<i64> {
        std::iter::from_fn(|| dispatch.next_ready().map(|m| m.id)).collect()
    }

    #[test]
    fn one_message_per_key_at_a_time_and_keyless_ones_all_at_once() {
        let mut d = with(&[
            (1, Some("a")),
            (2, Some("b")),
            (3, Some("a")),
            (4, None),
            (5, None),
        ]);
        assert_eq!(drain_ready(&mut d), [1, 2, 4, 5]);
        d.published(1);
        assert_eq!(
            drain_ready(&mut d),
            Vec::<i64>::new(),
            "3 waits for 1's ack"
        );
        d.acked(1);
        assert_eq!(drain_ready(&mut d), [3]);
        d.published(3);
        d.acked(3);
        for id in [2, 4, 5] {
            d.published(id);
            d.acked(id);
        }
        assert!(d.is_empty());
        assert!(d.groups.is_empty() && d.ready.is_empty());
    }

    #[test]
    fn a_message_arriving_for_a_busy_key_waits() {
        let mut d = with(&[(1, Some("a"))]);
        assert_eq!(drain_ready(&mut d), [1]);
        let now = Instant::now();
        d.add(msg(2, Some("a")), now, now);
        assert_eq!(drain_ready(&mut d), Vec::<i64>::new());
        d.published(1);
        d.acked(1);
        assert_eq!(drain_ready(&mut d), [2]);
    }

    #[test]
    fn a_failure_blocks_the_rest_of_its_key_only() {
        let mut d = with(&[
            (1, Some("a")),
            (2, Some("a")),
            (3, Some("a")),
            (4, Some("b")),
        ]);
        assert_eq!(drain_ready(&mut d), [1, 4]);
        let blocked = d.fail(1).unwrap();
        assert_eq!(blocked.ids, [2, 3]);
        assert_eq!(blocked.key.as_deref(), Some("a"));
        assert_eq!(drain_ready(&mut d), Vec::<i64>::new());
        assert_eq!(d.len(), 1);
        assert_eq!(d.state(4), Some(State::Publishing));
    }

    #[test]
    fn losing_a_queued_message_blocks_only_the_ones_after_it() {
        let mut d = with(&[(1, Some("a")), (2, Some("a")), (3, Some("a"))]);
        assert_eq!(drain_ready(&mut d), [1]);
        assert_eq!(d.fail(2).unwrap().ids, [3]);
        d.published(1);
        d.acked(1);
        assert!(d.is_empty());
        assert_eq!(drain_ready(&mut d), Vec::<i64>::new());
        assert!(d.fail(99).is_none());
    }

    #[test]
    fn losing_an_acking_message_blocks_the_rest() {
        let mut d = with(&[(1, Some("a")), (2, Some("a"))]);
        drain_ready(&mut d);
        d.published(1);
        assert_eq!(d.fail(1).unwrap().ids, [2]);
        assert!(d.is_empty() && d.groups.is_empty());
    }

    #[test]
    fn the_settled_ack_of_an_older_delivery_leaves_the_new_one_alone() {
        let mut d = with(&[(1, Some("a")), (2, Some("a"))]);
        drain_ready(&mut d);
        d.published(1);
        assert_eq!(d.fail(1).unwrap().ids, [2]);
        let now = Instant::now();
        d.add(msg(1, Some("a")), now, now);
        d.acked(1);
        assert_eq!(d.state(1), Some(State::Queued));
        assert_eq!(drain_ready(&mut d), [1]);
    }

    #[test]
    fn take_queued_leaves_the_active_ones() {
        let mut d = with(&[(1, Some("a")), (2, Some("a")), (3, None), (4, Some("b"))]);
        assert_eq!(d.next_ready().unwrap().id, 1);
        assert_eq!(d.take_queued(), [2, 3, 4]);
        assert_eq!(d.len(), 1);
        assert_eq!(drain_ready(&mut d), Vec::<i64>::new());
        d.published(1);
        d.acked(1);
        assert!(d.is_empty() && d.groups.is_empty());
    }

    #[test]
    fn extension_is_due_near_the_deadline_and_stops_at_the_limit() {
        let mut d = Dispatch::default();
        let now = Instant::now();
        let lease = Duration::from_secs(10);
        d.add(msg(1, None), now + lease, now + Duration::from_secs(25));
        d.add(msg(2, None), now + Duration::from_secs(2), now + lease);
        let margin = Duration::from_secs(5);
        assert_eq!(d.due_for_extension(now, margin, lease), [2]);
        let later = now + Duration::from_secs(6);
        // 2 may not be extended past its limit (10s); 1 may.
        assert_eq!(d.due_for_extension(later, margin, lease), [1]);
        d.extended(1, later + lease);
        assert!(d.due_for_extension(later, margin, lease).is_empty());
        // 1 runs until 16s, its limit is 25s: at 12s a 10s lease would pass the limit.
        let much_later = now + Duration::from_secs(16);
        assert!(d.due_for_extension(much_later, margin, lease).is_empty());
        // Acking messages are not extended.
        let mut d = with(&[(3, None)]);
        drain_ready(&mut d);
        d.published(3);
        assert!(d
            .due_for_extension(now, Duration::from_secs(999), lease)
            .is_empty());
    }
}
