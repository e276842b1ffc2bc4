//! The messages one stream holds, grouped by key: which may start now, which wait behind
//! an earlier message of their key, and which leases need extending.
//!
//! Pure bookkeeping, no I/O, so every ordering rule is unit-tested here. The rules:
//! - a key's messages are published one at a time, in the order received (id order);
//! - the next one starts as soon as the previous one's publish returned `Ok` (its ack is
//!   queued, not yet settled), so a hot key costs no round trip per message, and the
//!   server applies the acks that queue up behind one another in one statement. Only
//!   while the lease has margin: when the previous ack is still unsettled near the
//!   lease's end, the next one waits for that ack to settle;
//! - when a message fails or is lost (its ack came back fenced, its lease ran out), every
//!   later message of its key this stream holds is taken out untried, to be given back;
//!   the one publishing at that moment finishes, and is then given back instead of acked
//!   (it becomes [`State::Orphaned`]). Acks already sent cannot be recalled: see
//!   [`Dispatch::fail`].
//! - every held message is extended near its deadline, acking ones included, so a key's
//!   messages keep one lease: an earlier message's lease never runs out while a later
//!   one of its key is still held.

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
    /// The publisher has it, but an earlier message of its key (`behind`) was lost
    /// meanwhile: whatever the outcome, it is given back, not acked.
    Orphaned { behind: i64 },
    /// Published, ack queued or sent, not settled yet.
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
    /// The message the publisher has, which the queue waits for.
    publishing: Option<i64>,
    /// Published messages whose ack is not settled yet, oldest first. All of them come
    /// before `publishing` and the queue.
    acking: VecDeque<i64>,
    /// Whether the group is in `ready`.
    scheduled: bool,
}

impl Group {
    fn is_empty(&self) -> bool {
        self.queue.is_empty() && self.publishing.is_none() && self.acking.is_empty()
    }

    /// Whether its next message could start, lease margin aside.
    fn wants_to_start(&self) -> bool {
        self.publishing.is_none() && !self.queue.is_empty()
    }
}

/// Messages taken out untried behind a failed or lost one.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Blocked {
    /// The later messages of the key, to give back.
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
        self.groups
            .entry(group.clone())
            .or_default()
            .queue
            .push_back(message);
        self.schedule(group);
    }

    /// The next message that may start, marked as publishing. A message behind an
    /// unsettled ack starts only while that message's lease runs beyond `now + margin`
    /// (never with `margin` `None`); otherwise its key waits for the ack to settle.
    pub fn next_ready(&mut self, now: Instant, margin: Option<Duration>) -> Option<Message> {
        while let Some(key) = self.ready.pop_front() {
            let Some(group) = self.groups.get_mut(&key) else {
                continue;
            };
            group.scheduled = false;
            if !group.wants_to_start() {
                if group.is_empty() {
                    self.groups.remove(&key);
                }
                continue;
            }
            if let Some(previous) = group.acking.back() {
                let near_its_end = margin.is_none_or(|margin| {
                    self.held
                        .get(previous)
                        .is_none_or(|held| held.deadline <= now + margin)
                });
                // Rescheduled when that ack settles (`acked`).
                if near_its_end {
                    continue;
                }
            }
            let Some(message) = group.queue.pop_front() else {
                continue;
            };
            group.publishing = Some(message.id);
            if let Some(held) = self.held.get_mut(&message.id) {
                held.state = State::Publishing;
            }
            return Some(message);
        }
        None
    }

    /// The publisher accepted `id`; its ack is on its way, and the next message of its
    /// key may start.
    pub fn published(&mut self, id: i64) {
        let Some(held) = self.held.get_mut(&id) else {
            return;
        };
        if held.state != State::Publishing {
            return;
        }
        held.state = State::Acking;
        let group_key = held.group.clone();
        if let Some(group) = self.groups.get_mut(&group_key) {
            if group.publishing == Some(id) {
                group.publishing = None;
            }
            group.acking.push_back(id);
        }
        self.schedule(group_key);
    }

    /// The server confirmed the ack of `id`.
    pub fn acked(&mut self, id: i64) {
        // Only the answer to an ack we sent counts: the same id may since have been lost
        // and delivered again.
        if self.state(id) != Some(State::Acking) {
            return;
        }
        let Some(held) = self.held.remove(&id) else {
            return;
        };
        if let Some(group) = self.groups.get_mut(&held.group) {
            group.acking.retain(|acking| *acking != id);
        }
        self.schedule(held.group);
    }

    /// `id` failed, or its lease is gone: forget it, and take out every later message of
    /// its key not started yet (they must not overtake it). `None` when `id` is not held.
    ///
    /// When `id` was acking (its ack came back fenced, or its lease ran out before the ack
    /// was applied), a later message of its key may already be publishing: it becomes
    /// [`State::Orphaned`], so it is given back when its publish ends rather than acked.
    /// Later messages whose ack was already sent stay acking: the server settles them
    /// (normally fenced too, as they share the lease). Either way the key comes back from
    /// `id` on, so a consumer may see a run of the key again, in order.
    pub fn fail(&mut self, id: i64) -> Option<Blocked> {
        let held = self.held.remove(&id)?;
        let mut blocked = Blocked {
            ids: Vec::new(),
            key: held.key,
        };
        let Some(group) = self.groups.get_mut(&held.group) else {
            return Some(blocked);
        };
        let later: Vec<Message> = match held.state {
            // A queued message: the ones before it may still go.
            State::Queued => match group.queue.iter().position(|m| m.id == id) {
                Some(position) => {
                    let mut later = group.queue.split_off(position);
                    later.pop_front();
                    later.into()
                }
                None => Vec::new(),
            },
            State::Publishing | State::Orphaned { .. } => {
                if group.publishing == Some(id) {
                    group.publishing = None;
                }
                group.queue.drain(..).collect()
            }
            State::Acking => {
                group.acking.retain(|acking| *acking != id);
                if let Some(publishing) = group.publishing {
                    if let Some(later) = self.held.get_mut(&publishing) {
                        // The first loss is the one it waits behind.
                        if later.state == State::Publishing {
                            later.state = State::Orphaned { behind: id };
                        }
                    }
                }
                group.queue.drain(..).collect()
            }
        };
        for message in later {
            self.held.remove(&message.id);
            blocked.ids.push(message.id);
        }
        if group.is_empty() {
            self.groups.remove(&held.group);
        }
        Some(blocked)
    }

    /// The publish of an orphaned message ended (however it went): forget it. Returns
    /// the message it was orphaned behind and the message itself, to give back; `None`
    /// when `id` is not orphaned.
    pub fn orphan_done(&mut self, id: i64) -> Option<(i64, Blocked)> {
        let State::Orphaned { behind } = self.state(id)? else {
            return None;
        };
        let held = self.held.remove(&id)?;
        if let Some(group) = self.groups.get_mut(&held.group) {
            if group.publishing == Some(id) {
                group.publishing = None;
            }
        }
        self.schedule(held.group);
        let blocked = Blocked {
            ids: vec![id],
            key: held.key,
        };
        Some((behind, blocked))
    }

    /// Takes out every message not started yet (on stop or drain), to give back.
    pub fn take_queued(&mut self) -> Vec<i64> {
        let mut ids = Vec::new();
        self.groups.retain(|_, group| {
            ids.extend(group.queue.drain(..).map(|m| m.id));
            group.scheduled = false;
            !group.is_empty()
        });
        self.ready.clear();
        for id in &ids {
            self.held.remove(id);
        }
        ids.sort_unstable();
        ids
    }

    /// Held messages whose lease runs out within `margin` and may still be extended by
    /// `lease` from `now`. Acking ones too: a later message of the key may be publishing
    /// behind an unsettled ack, and the key's messages must keep one lease.
    pub fn due_for_extension(&self, now: Instant, margin: Duration, lease: Duration) -> Vec<i64> {
        let mut ids: Vec<i64> = self
            .held
            .iter()
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

    /// Puts the group in `ready` if its next message could start, or forgets it when it
    /// holds nothing any more.
    fn schedule(&mut self, key: GroupKey) {
        let Some(group) = self.groups.get_mut(&key) else {
            return;
        };
        if group.is_empty() {
            self.groups.remove(&key);
        } else if group.wants_to_start() && !group.scheduled {
            group.scheduled = true;
            self.ready.push_back(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(60);
    const MARGIN: Duration = Duration::from_secs(30);

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
            dispatch.add(msg(*id, *key), now + LEASE, now + LEASE * 5);
        }
        dispatch
    }

    fn drain_ready(dispatch: &mut Dispatch) -> Vec<i64> {
        let now = Instant::now();
        std::iter::from_fn(|| dispatch.next_ready(now, Some(MARGIN)).map(|m| m.id)).collect()
    }

    #[test]
    fn a_key_publishes_one_at_a_time_and_keyless_ones_all_at_once() {
        let mut d = with(&[
            (1, Some("a")),
            (2, Some("b")),
            (3, Some("a")),
            (4, None),
            (5, None),
        ]);
        assert_eq!(drain_ready(&mut d), [1, 2, 4, 5]);
        assert_eq!(drain_ready(&mut d), Vec::<i64>::new(), "3 waits for 1");
        d.published(1);
        assert_eq!(drain_ready(&mut d), [3], "3 does not wait for 1's ack");
        assert_eq!(d.state(1), Some(State::Acking));
        d.published(3);
        d.acked(3);
        d.acked(1);
        for id in [2, 4, 5] {
            d.published(id);
            d.acked(id);
        }
        assert!(d.is_empty());
        assert!(d.groups.is_empty() && d.ready.is_empty());
    }

    #[test]
    fn a_hot_key_runs_ahead_of_its_acks() {
        let mut d = with(&[(1, Some("a")), (2, Some("a")), (3, Some("a"))]);
        for id in 1..=3 {
            assert_eq!(drain_ready(&mut d), [id]);
            d.published(id);
        }
        assert_eq!(d.groups[&GroupKey::Key("a".into())].acking, [1, 2, 3]);
        for id in 1..=3 {
            d.acked(id);
        }
        assert!(d.is_empty() && d.groups.is_empty());
    }

    #[test]
    fn near_the_end_of_its_lease_a_key_waits_for_its_ack() {
        let mut d = Dispatch::default();
        let now = Instant::now();
        let deadline = now + Duration::from_secs(10);
        for id in [1, 2] {
            d.add(msg(id, Some("a")), deadline, deadline);
        }
        assert_eq!(d.next_ready(now, Some(MARGIN)).unwrap().id, 1);
        d.published(1);
        assert!(
            d.next_ready(now, Some(MARGIN)).is_none(),
            "10s left, 30s margin"
        );
        d.acked(1);
        assert_eq!(d.next_ready(now, Some(MARGIN)).unwrap().id, 2);
    }

    #[test]
    fn without_pipelining_a_key_waits_for_each_ack() {
        let mut d = Dispatch::default();
        let now = Instant::now();
        let deadline = now + LEASE;
        for id in [1, 2] {
            d.add(msg(id, Some("a")), deadline, deadline);
        }
        assert_eq!(d.next_ready(now, None).unwrap().id, 1);
        d.published(1);
        assert!(
            d.next_ready(now, None).is_none(),
            "1's ack is not confirmed yet"
        );
        d.acked(1);
        assert_eq!(d.next_ready(now, None).unwrap().id, 2);
    }

    #[test]
    fn a_message_arriving_for_a_busy_key_waits() {
        let mut d = with(&[(1, Some("a"))]);
        assert_eq!(drain_ready(&mut d), [1]);
        let now = Instant::now();
        d.add(msg(2, Some("a")), now + LEASE, now + LEASE);
        assert_eq!(drain_ready(&mut d), Vec::<i64>::new());
        d.published(1);
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
    fn a_failure_behind_an_unsettled_ack_leaves_that_ack_alone() {
        let mut d = with(&[(1, Some("a")), (2, Some("a")), (3, Some("a"))]);
        drain_ready(&mut d);
        d.published(1);
        assert_eq!(drain_ready(&mut d), [2]);
        assert_eq!(d.fail(2).unwrap().ids, [3]);
        assert_eq!(d.state(1), Some(State::Acking));
        d.acked(1);
        assert!(d.is_empty() && d.groups.is_empty());
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
    fn losing_an_acking_message_orphans_the_one_publishing_behind_it() {
        let mut d = with(&[
            (1, Some("a")),
            (2, Some("a")),
            (3, Some("a")),
            (4, Some("a")),
        ]);
        drain_ready(&mut d);
        d.published(1);
        drain_ready(&mut d);
        d.published(2);
        assert_eq!(drain_ready(&mut d), [3]);
        // 1's ack comes back fenced while 2's is unsettled and 3 publishes.
        assert_eq!(d.fail(1).unwrap().ids, [4]);
        assert_eq!(d.state(2), Some(State::Acking));
        assert_eq!(d.state(3), Some(State::Orphaned { behind: 1 }));
        // The orphan's outcome is not an ack, and nothing else starts meanwhile.
        d.published(3);
        assert_eq!(d.state(3), Some(State::Orphaned { behind: 1 }));
        assert_eq!(drain_ready(&mut d), Vec::<i64>::new());
        // 2's ack is fenced too; 3 is still the first loss's orphan.
        assert_eq!(d.fail(2).unwrap().ids, Vec::<i64>::new());
        let (behind, blocked) = d.orphan_done(3).unwrap();
        assert_eq!(
            (behind, blocked.ids, blocked.key.as_deref()),
            (1, vec![3], Some("a"))
        );
        assert!(d.orphan_done(3).is_none());
        assert!(d.is_empty() && d.groups.is_empty());
    }

    #[test]
    fn a_message_delivered_again_waits_for_the_orphan() {
        let mut d = with(&[(1, Some("a")), (2, Some("a"))]);
        drain_ready(&mut d);
        d.published(1);
        drain_ready(&mut d);
        d.fail(1).unwrap();
        let now = Instant::now();
        d.add(msg(1, Some("a")), now + LEASE, now + LEASE);
        assert_eq!(
            drain_ready(&mut d),
            Vec::<i64>::new(),
            "2 is still publishing"
        );
        d.orphan_done(2).unwrap();
        assert_eq!(drain_ready(&mut d), [1]);
    }

    #[test]
    fn the_settled_ack_of_an_older_delivery_leaves_the_new_one_alone() {
        let mut d = with(&[(1, Some("a")), (2, Some("a"))]);
        drain_ready(&mut d);
        d.published(1);
        assert_eq!(d.fail(1).unwrap().ids, [2]);
        let now = Instant::now();
        d.add(msg(1, Some("a")), now + LEASE, now + LEASE);
        d.acked(1);
        assert_eq!(d.state(1), Some(State::Queued));
        assert_eq!(drain_ready(&mut d), [1]);
    }

    #[test]
    fn take_queued_leaves_the_started_ones() {
        let mut d = with(&[(1, Some("a")), (2, Some("a")), (3, Some("a")), (4, None)]);
        assert_eq!(drain_ready(&mut d), [1, 4]);
        d.published(1);
        assert_eq!(drain_ready(&mut d), [2]);
        assert_eq!(d.take_queued(), [3]);
        assert_eq!(d.len(), 3);
        d.published(2);
        assert_eq!(drain_ready(&mut d), Vec::<i64>::new());
        for id in [1, 2] {
            d.acked(id);
        }
        d.published(4);
        d.acked(4);
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
        // Acking messages are extended too: a later one of their key may be publishing.
        let mut d = with(&[(3, Some("a")), (4, Some("a"))]);
        drain_ready(&mut d);
        d.published(3);
        drain_ready(&mut d);
        assert_eq!(d.due_for_extension(now, LEASE * 2, lease), [3, 4]);
    }
}
