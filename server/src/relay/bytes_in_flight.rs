//! One identity's `max_bytes_in_flight`: the bytes (as [`message_bytes`] counts them:
//! payload, headers, key, topic) of rows leased to its streams and not yet settled,
//! across all its streams on this server.
//!
//! A shared counter, not a semaphore of byte permits: a semaphore hands freed permits to
//! a waiter that may need more than was freed, and streams of one budget then spin
//! without claiming. Here a stream that is about to claim takes an *allowance* under one
//! lock: at most one response's bytes, at most its fair share (the budget over the
//! identity's open streams) and at least the row it needs next; the claim is capped at
//! that many bytes ([`super::Claims::claim_within`]), the stream keeps what the rows
//! used (released row by row as they settle or their leases run out, see
//! `subscription::held`) and gives back the rest at once.
//!
//! A stream that finds too little left waits in line with the bytes it needs (one row:
//! the row its last claim had to leave out, or the outbox's average row) and claims
//! nothing until a release wakes it: no timer, no spinning. The line keeps what its
//! waiters need: a stream may take only what leaves the needs of the streams ahead of it
//! (and a stream not in line, the needs of every waiter), so while the first in line
//! waits, the bytes left only grow until its row fits. That always happens: every held
//! row settles or its lease runs out without any claim, and the budget is at least
//! `server.max_message_bytes` (validated), so any row that fits a response fits the
//! budget. Nothing wedges; a stream with nothing to claim (window full, draining) leaves
//! the line so it holds no one back.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::watch;

#[cfg(doc)]
use super::response_size::message_bytes;

pub struct BytesInFlight {
    identity: String,
    limit: usize,
    state: Mutex<State>,
    /// Bumped (under the lock) whenever bytes are released or a waiter leaves the line:
    /// what a waiting stream may be waiting for.
    freed: watch::Sender<u64>,
}

#[derive(Default)]
struct State {
    /// Bytes held by rows of the identity's streams and by allowances of claims running.
    used: usize,
    /// Open streams: the fair share of one claim is `limit / streams`.
    streams: usize,
    next_stream: u64,
    /// Streams that could not take an allowance, first come first, with what each needs.
    line: VecDeque<(u64, usize)>,
}

impl State {
    /// What the waiters in line ahead of `stream` need (all of them if it is not in line),
    /// and what all the others need.
    fn needs_around(&self, stream: u64) -> (usize, usize) {
        let ahead = self
            .line
            .iter()
            .take_while(|(id, _)| *id != stream)
            .map(|(_, need)| need)
            .sum();
        let others = self
            .line
            .iter()
            .filter(|(id, _)| *id != stream)
            .map(|(_, need)| need)
            .sum();
        (ahead, others)
    }

    fn left(&self, limit: usize) -> usize {
        limit.saturating_sub(self.used)
    }
}

impl BytesInFlight {
    pub fn new(identity: &str, limit: usize) -> Arc<Self> {
        Arc::new(Self {
            identity: identity.to_owned(),
            limit,
            state: Mutex::new(State::default()),
            freed: watch::Sender::new(0),
        })
    }

    /// A new stream's share of the budget; it counts for the fair share until dropped.
    pub fn open(self: &Arc<Self>) -> StreamBytes {
        let mut state = self.lock();
        state.streams += 1;
        let id = state.next_stream;
        state.next_stream += 1;
        StreamBytes {
            shared: Arc::clone(self),
            id,
            freed: self.freed.subscribe(),
            in_line: false,
        }
    }

    /// The bytes a unary claim may use now: what the streams neither hold nor wait for.
    /// Unary claims are not counted once they return (see docs/security.md).
    pub fn unary_room(&self) -> usize {
        let state = self.lock();
        let (_, waiting) = state.needs_around(u64::MAX);
        state.left(self.limit).saturating_sub(waiting)
    }

    pub fn used(&self) -> usize {
        self.lock().used
    }

    /// RESOURCE_EXHAUSTED's message for a unary claim that cannot fit.
    pub fn exhausted(&self, needed: Option<usize>) -> String {
        let used = self.used();
        let needed = needed.map_or(String::new(), |bytes| {
            format!(", and the next row alone needs {bytes} bytes")
        });
        format!(
            "identity `{}` holds {used} bytes of rows in flight across its streams (limit \
             max_bytes_in_flight = {}){needed}: answer held rows first, or retry shortly",
            self.identity, self.limit
        )
    }

    /// Gives back `bytes` and wakes the streams waiting for some.
    pub fn release(&self, bytes: usize) {
        if bytes == 0 {
            return;
        }
        let mut state = self.lock();
        state.used = state.used.saturating_sub(bytes);
        self.freed.send_modify(|n| *n = n.wrapping_add(1));
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("bytes in flight lock")
    }
}

impl std::fmt::Debug for BytesInFlight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BytesInFlight")
            .field("identity", &self.identity)
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

/// One stream's part in its identity's [`BytesInFlight`]: leaves the line and the fair
/// share when dropped (the rows it held give their bytes back through `Held`).
pub struct StreamBytes {
    shared: Arc<BytesInFlight>,
    id: u64,
    freed: watch::Receiver<u64>,
    /// Waiting in the line: saves taking the lock to leave it when not.
    in_line: bool,
}

impl StreamBytes {
    pub fn budget(&self) -> &Arc<BytesInFlight> {
        &self.shared
    }

    /// Whether a claim needing `need` bytes could take its allowance now. If not, the
    /// stream joins the line (or updates what it needs there) and [`Self::freed`]
    /// completes once it is worth asking again.
    pub fn ready(&mut self, need: usize) -> bool {
        let mut state = self.shared.lock();
        let (ahead, _) = state.needs_around(self.id);
        if state.left(self.shared.limit) >= ahead + need {
            return true;
        }
        match state.line.iter_mut().find(|(id, _)| *id == self.id) {
            Some((_, needs)) => *needs = need,
            None => state.line.push_back((self.id, need)),
        }
        self.in_line = true;
        // Only releases after this point wake the stream.
        self.freed.mark_unchanged();
        false
    }

    /// Takes an allowance for one claim of at most `per_claim` bytes that must fit at
    /// least `need`: its fair share of the budget, no less than `need`, leaving what the
    /// streams in line need; `None` (and in line) when there is not enough.
    pub fn take(&mut self, need: usize, per_claim: usize) -> Option<Allowance> {
        if !self.ready(need) {
            return None;
        }
        let mut state = self.shared.lock();
        let (_, others) = state.needs_around(self.id);
        let share = self.shared.limit / state.streams.max(1);
        let bytes = per_claim
            .min(share)
            .min(state.left(self.shared.limit).saturating_sub(others))
            .max(need);
        state.used += bytes;
        state.line.retain(|(id, _)| *id != self.id);
        self.in_line = false;
        Some(Allowance {
            budget: Arc::clone(&self.shared),
            bytes,
        })
    }

    /// Leaves the line: the stream has nothing to claim for now.
    pub fn leave(&mut self) {
        if !std::mem::take(&mut self.in_line) {
            return;
        }
        let mut state = self.shared.lock();
        let before = state.line.len();
        state.line.retain(|(id, _)| *id != self.id);
        if state.line.len() != before {
            // Those behind it may fit now.
            self.shared.freed.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// Completes once bytes were released (or a waiter left the line) since the stream
    /// last found too little; a stream not waiting should not wait here.
    pub async fn freed(&mut self) {
        // The sender lives in `shared`, which this handle keeps alive.
        let _ = self.freed.changed().await;
    }
}

impl Drop for StreamBytes {
    fn drop(&mut self) {
        self.leave();
        self.shared.lock().streams -= 1;
    }
}

/// Bytes taken for one claim; what the claim does not keep goes back when it is dropped.
pub struct Allowance {
    budget: Arc<BytesInFlight>,
    bytes: usize,
}

impl Allowance {
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Keeps `used` bytes (now held by rows, which give them back as they settle) and
    /// gives back the rest.
    pub fn keep(mut self, used: usize) {
        self.bytes = self.bytes.saturating_sub(used);
    }
}

impl Drop for Allowance {
    fn drop(&mut self) {
        self.budget.release(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_allowance_is_the_fair_share_and_gives_back_what_the_claim_did_not_use() {
        let budget = BytesInFlight::new("app", 1000);
        let mut a = budget.open();
        let _b = budget.open();
        let allowance = a.take(10, 800).expect("room");
        assert_eq!(allowance.bytes(), 500, "half the budget: two streams");
        allowance.keep(300);
        assert_eq!(budget.used(), 300);
        let allowance = a.take(10, 800).expect("room");
        assert_eq!(allowance.bytes(), 500);
        drop(allowance);
        assert_eq!(budget.used(), 300);
        budget.release(300);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn the_first_in_line_gets_its_row_before_anyone_takes_more() {
        let budget = BytesInFlight::new("app", 1000);
        let (mut a, mut b, mut c) = (budget.open(), budget.open(), budget.open());
        a.take(900, 900).expect("room").keep(900);
        assert!(b.take(400, 1000).is_none(), "100 left, b needs 400");
        assert!(
            c.take(50, 1000).is_none(),
            "c would fit, but not without eating into what b waits for"
        );
        budget.release(400);
        let allowance = c.take(50, 1000).expect("500 left: b's 400 and c's 50 fit");
        assert_eq!(allowance.bytes(), 100, "all but what b waits for");
        allowance.keep(100);
        let allowance = b.take(400, 1000).expect("b's 400 were kept for it");
        assert_eq!(allowance.bytes(), 400);
    }

    #[test]
    fn a_waiter_that_leaves_the_line_wakes_those_behind() {
        let budget = BytesInFlight::new("app", 1000);
        let (mut a, mut b, mut c) = (budget.open(), budget.open(), budget.open());
        a.take(1000, 1000).expect("room").keep(1000);
        assert!(!b.ready(900));
        assert!(!c.ready(100));
        budget.release(100);
        assert!(!c.ready(100), "b is ahead and needs 900");
        b.leave();
        assert!(c.freed.has_changed().unwrap());
        assert!(c.ready(100));
    }
}
