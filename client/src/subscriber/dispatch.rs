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
mod tests;
