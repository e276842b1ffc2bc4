//! One streaming subscriber: claims on its behalf while its window has room, applies its
//! answers, tells it when leases run out, and gives back whatever it still holds when
//! the stream ends for any reason.
//!
//! The loop owns all state of the stream (the held rows and their deadlines), so there is
//! no locking: answers, claims, wake-ups and the drain are events of one `select!`.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::{mpsc, watch};
use tokio::time::{sleep_until, Instant};

use super::drain::Drain;
use super::poller::Poller;
use super::{Outbox, RelayError, RelayResult};
use crate::config::MAX_WINDOW;
use crate::storage::{Claimed, MessageId, NackResult, StorageError};

/// Most ids applied in one coalesced ack.
const MAX_COALESCED_ACKS: usize = 1000;
/// Pause after a failed claim before trying again.
const STORAGE_ERROR_DELAY: Duration = Duration::from_secs(1);

/// What the subscriber asked for when it opened the stream, already validated.
#[derive(Debug, Clone)]
pub struct SubscriptionSpec {
    pub subscriber: String,
    pub topics: Vec<String>,
    pub max_in_flight: u32,
    pub lease: Duration,
}

/// An answer of the subscriber.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    Ack(Vec<MessageId>),
    Nack {
        id: MessageId,
        error: String,
        delay: Option<Duration>,
    },
    Release {
        ids: Vec<MessageId>,
        delay: Duration,
    },
    DeadLetter {
        id: MessageId,
        error: String,
    },
    ExtendLease {
        ids: Vec<MessageId>,
        lease: Duration,
    },
    /// A new window; 0 stops new batches until a later non-zero window.
    SetWindow(u32),
}

/// The outcome of one answer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Settlement {
    pub acked: Vec<MessageId>,
    pub retried: Vec<MessageId>,
    pub dead_lettered: Vec<MessageId>,
    pub released: Vec<MessageId>,
    pub extended: Vec<MessageId>,
    pub fenced: Vec<MessageId>,
    pub retry_at: Option<DateTime<Utc>>,
    pub lease_expires_at: Option<DateTime<Utc>>,
}

/// What the subscription tells its subscriber.
#[derive(Debug, Clone)]
pub enum Event {
    Subscribed {
        owner: String,
        lease: Duration,
        max_in_flight: u32,
        max_attempts: u32,
    },
    Batch(Claimed),
    Settled(Settlement),
    LeasesExpired(Vec<MessageId>),
    Draining {
        deadline: DateTime<Utc>,
    },
}

/// The rows a stream holds, with the local estimate of when each lease runs out.
#[derive(Default)]
struct Held {
    deadlines: HashMap<MessageId, Instant>,
    by_deadline: BTreeSet<(Instant, MessageId)>,
}

impl Held {
    fn len(&self) -> usize {
        self.deadlines.len()
    }

    fn insert(&mut self, id: MessageId, deadline: Instant) {
        if let Some(old) = self.deadlines.insert(id, deadline) {
            self.by_deadline.remove(&(old, id));
        }
        self.by_deadline.insert((deadline, id));
    }

    fn remove(&mut self, id: MessageId) {
        if let Some(deadline) = self.deadlines.remove(&id) {
            self.by_deadline.remove(&(deadline, id));
        }
    }

    fn remove_all(&mut self, ids: &[MessageId]) {
        ids.iter().for_each(|id| self.remove(*id));
    }

    fn next_deadline(&self) -> Option<Instant> {
        self.by_deadline.first().map(|(deadline, _)| *deadline)
    }

    fn take_expired(&mut self, now: Instant) -> Vec<MessageId> {
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

    fn ids(&self) -> Vec<MessageId> {
        self.deadlines.keys().copied().collect()
    }
}

/// Runs one subscription until the subscriber goes away, the drain completes, or an
/// error ends it; the error (if any) is sent as the last event.
pub async fn run(
    outbox: Arc<Outbox>,
    spec: SubscriptionSpec,
    mut answers: mpsc::Receiver<RelayResult<Answer>>,
    events: mpsc::Sender<RelayResult<Event>>,
    drain: Drain,
) {
    let owner = format!("{}:{}", spec.subscriber, uuid::Uuid::new_v4().simple());
    let poller = Poller::new(outbox.config.poll);
    let mut state = Subscription {
        outbox,
        spec,
        owner,
        held: Held::default(),
        poller,
        short_while_holding: false,
        events,
    };
    let result = state.serve(&mut answers, &drain).await;
    state.give_back().await;
    if let Err(error) = result {
        tracing::warn!(outbox = %state.outbox.name, owner = %state.owner, %error, "subscription ended with an error");
        let _ = state.events.send(Err(error)).await;
    } else {
        tracing::info!(outbox = %state.outbox.name, owner = %state.owner, "subscription ended");
    }
}

struct Subscription {
    outbox: Arc<Outbox>,
    spec: SubscriptionSpec,
    owner: String,
    held: Held,
    poller: Poller,
    /// The last claim returned fewer rows than asked while the stream held some.
    short_while_holding: bool,
    events: mpsc::Sender<RelayResult<Event>>,
}

/// Why the loop stopped without an error.
enum Stop {
    SubscriberGone,
    Drained,
}

impl Subscription {
    async fn serve(
        &mut self,
        answers: &mut mpsc::Receiver<RelayResult<Answer>>,
        drain: &Drain,
    ) -> RelayResult<()> {
        tracing::info!(
            outbox = %self.outbox.name,
            owner = %self.owner,
            window = self.spec.max_in_flight,
            topics = ?self.spec.topics,
            "subscription opened"
        );
        self.send(Event::Subscribed {
            owner: self.owner.clone(),
            lease: self.spec.lease,
            max_in_flight: self.spec.max_in_flight,
            max_attempts: self.outbox.config.max_attempts,
        })
        .await?;
        if drain.is_started() {
            return Err(RelayError::ShuttingDown);
        }
        match self.event_loop(answers, drain).await? {
            Stop::SubscriberGone | Stop::Drained => Ok(()),
        }
    }

    async fn event_loop(
        &mut self,
        answers: &mut mpsc::Receiver<RelayResult<Answer>>,
        drain: &Drain,
    ) -> RelayResult<Stop> {
        let mut insert_signal: Option<watch::Receiver<u64>> = self.outbox.insert_signal();
        let mut next_claim_at = Instant::now();
        let mut drain_deadline: Option<Instant> = None;
        loop {
            let window = self.spec.max_in_flight as usize;
            let batch_cap = (self.outbox.config.max_batch_size as usize).min(window);
            // Claim in chunks: wait until half a batch of room is free (or nothing is
            // held), so a subscriber acking one at a time still gets full-ish batches.
            let low_water = batch_cap.div_ceil(2).max(1);
            let room = window.saturating_sub(self.held.len());
            let can_claim =
                drain_deadline.is_none() && room > 0 && (room >= low_water || self.held.len() == 0);
            let expiry = self.held.next_deadline();
            tokio::select! {
                biased;
                answer = answers.recv() => {
                    let Some(answer) = answer else { return Ok(Stop::SubscriberGone) };
                    let held_before = self.held.len();
                    self.answer(answer?, answers).await?;
                    // A claim that came back short while this stream held rows may have been
                    // held back by this stream's own keys: answering them can unblock work,
                    // so look again now rather than after the idle backoff.
                    if self.short_while_holding && self.held.len() < held_before {
                        self.short_while_holding = false;
                        self.poller.busy();
                        next_claim_at = Instant::now();
                    }
                }
                _ = self.events.closed() => return Ok(Stop::SubscriberGone),
                _ = drain.started(), if drain_deadline.is_none() => {
                    let deadline = Instant::now() + drain.timeout();
                    drain_deadline = Some(deadline);
                    let wall = Utc::now() + chrono::Duration::from_std(drain.timeout()).unwrap_or_default();
                    tracing::info!(outbox = %self.outbox.name, owner = %self.owner, held = self.held.len(), "draining");
                    self.send(Event::Draining { deadline: wall }).await?;
                }
                _ = sleep_until(drain_deadline.unwrap_or_else(Instant::now)), if drain_deadline.is_some() => {
                    tracing::warn!(outbox = %self.outbox.name, owner = %self.owner, held = self.held.len(), "drain timeout; giving back unanswered messages");
                    return Ok(Stop::Drained);
                }
                _ = sleep_until(expiry.unwrap_or_else(Instant::now)), if expiry.is_some() => {
                    let expired = self.held.take_expired(Instant::now());
                    if !expired.is_empty() {
                        tracing::warn!(outbox = %self.outbox.name, owner = %self.owner, count = expired.len(), "leases expired before the subscriber answered");
                        self.send(Event::LeasesExpired(expired)).await?;
                    }
                }
                changed = wait_changed(&mut insert_signal), if can_claim && insert_signal.is_some() => {
                    if changed {
                        next_claim_at = Instant::now();
                    } else {
                        insert_signal = None;
                    }
                }
                _ = sleep_until(next_claim_at), if can_claim => {
                    next_claim_at = self.claim(room.min(batch_cap)).await?;
                }
            }
            if drain_deadline.is_some() && self.held.len() == 0 {
                return Ok(Stop::Drained);
            }
        }
    }

    /// Claims up to `count` rows and sends them; returns when to claim next.
    async fn claim(&mut self, count: usize) -> RelayResult<Instant> {
        let asked = count as u32;
        let claimed = self
            .outbox
            .claim(&self.owner, asked, self.spec.lease, &self.spec.topics)
            .await;
        let claimed = match claimed {
            Ok(claimed) => claimed,
            Err(RelayError::Storage(error)) => {
                log_claim_error(&self.outbox.name, &error);
                return Ok(Instant::now() + STORAGE_ERROR_DELAY);
            }
            Err(error) => return Err(error),
        };
        let got = claimed.messages.len();
        self.short_while_holding = (got as u32) < asked && self.held.len() > 0;
        if got == 0 {
            return Ok(Instant::now() + self.poller.idle());
        }
        self.poller.busy();
        // The local deadline is measured after the claim returned, so it never runs out
        // before the database's lease does.
        let deadline = Instant::now() + self.spec.lease;
        for message in &claimed.messages {
            self.held.insert(message.id, deadline);
        }
        self.send(Event::Batch(claimed)).await?;
        // A full batch means there is probably more: claim again as soon as there is room.
        Ok(if got as u32 >= asked {
            Instant::now()
        } else {
            Instant::now() + self.poller.idle()
        })
    }

    /// Applies one answer and confirms it. Acks already waiting behind an ack are applied
    /// with it in one storage call (a subscriber acking message by message would otherwise
    /// cost a transaction each), and still confirmed one `settled` per answer.
    async fn answer(
        &mut self,
        answer: Answer,
        answers: &mut mpsc::Receiver<RelayResult<Answer>>,
    ) -> RelayResult<()> {
        let Answer::Ack(ids) = answer else {
            let settlement = self.apply(answer).await?;
            return self.send(Event::Settled(settlement)).await;
        };
        let mut acks = vec![ids];
        let mut behind = None;
        while acks.iter().map(Vec::len).sum::<usize>() < MAX_COALESCED_ACKS {
            match answers.try_recv() {
                Ok(Ok(Answer::Ack(ids))) => acks.push(ids),
                Ok(other) => {
                    behind = Some(other);
                    break;
                }
                Err(_) => break,
            }
        }
        let all: Vec<MessageId> = acks.iter().flatten().copied().collect();
        let (acked, _) = self.outbox.ack(&self.owner, &all).await?;
        self.held.remove_all(&all);
        // Each applied id is credited to the first answer that named it; a repeat is stale.
        let mut acked: HashSet<MessageId> = acked.into_iter().collect();
        for ids in acks {
            let (acked, fenced) = ids.into_iter().partition(|id| acked.remove(id));
            let settlement = Settlement {
                acked,
                fenced,
                ..Settlement::default()
            };
            self.send(Event::Settled(settlement)).await?;
        }
        match behind {
            Some(answer) => {
                let settlement = self.apply(answer?).await?;
                self.send(Event::Settled(settlement)).await
            }
            None => Ok(()),
        }
    }

    async fn apply(&mut self, answer: Answer) -> RelayResult<Settlement> {
        let outbox = Arc::clone(&self.outbox);
        let owner = self.owner.as_str();
        let mut settlement = Settlement::default();
        match answer {
            Answer::Ack(ids) => {
                let (acked, fenced) = outbox.ack(owner, &ids).await?;
                self.held.remove_all(&ids);
                settlement.acked = acked;
                settlement.fenced = fenced;
            }
            Answer::Nack { id, error, delay } => {
                let result = outbox.nack(owner, id, &error, delay).await?;
                self.held.remove(id);
                match result {
                    NackResult::Retried { retry_at, released } => {
                        self.held.remove_all(&released);
                        settlement.retried = vec![id];
                        settlement.released = released;
                        settlement.retry_at = Some(retry_at);
                    }
                    NackResult::DeadLettered { released } => {
                        self.held.remove_all(&released);
                        settlement.dead_lettered = vec![id];
                        settlement.released = released;
                    }
                    NackResult::Fenced => settlement.fenced = vec![id],
                }
            }
            Answer::Release { ids, delay } => {
                let (released, fenced) = outbox.release(owner, &ids, delay).await?;
                self.held.remove_all(&ids);
                settlement.released = released;
                settlement.fenced = fenced;
            }
            Answer::DeadLetter { id, error } => {
                let applied = outbox.dead_letter(owner, id, &error).await?;
                self.held.remove(id);
                if applied {
                    settlement.dead_lettered = vec![id];
                } else {
                    settlement.fenced = vec![id];
                }
            }
            Answer::SetWindow(window) => {
                if window > MAX_WINDOW {
                    return Err(RelayError::InvalidArgument(format!(
                        "set_window max_in_flight = {window}: must be within 0..={MAX_WINDOW}"
                    )));
                }
                tracing::debug!(outbox = %outbox.name, owner, window, "window changed");
                self.spec.max_in_flight = window;
            }
            Answer::ExtendLease { ids, lease } => {
                let lease = if lease.is_zero() {
                    self.spec.lease
                } else {
                    outbox.lease(lease)?
                };
                let (extended, fenced) = outbox.extend_lease(owner, &ids, lease).await?;
                let deadline = Instant::now() + lease;
                for id in &extended.ids {
                    self.held.insert(*id, deadline);
                }
                self.held.remove_all(&fenced);
                settlement.extended = extended.ids;
                settlement.lease_expires_at = Some(extended.lease_expires_at);
                settlement.fenced = fenced;
            }
        }
        Ok(settlement)
    }

    /// Gives back every row still held: claimable by others at once, attempt kept.
    async fn give_back(&mut self) {
        let ids = self.held.ids();
        if ids.is_empty() {
            return;
        }
        match self.outbox.return_leases(&self.owner, &ids).await {
            Ok(returned) => tracing::info!(
                outbox = %self.outbox.name,
                owner = %self.owner,
                returned,
                "gave back the leases of the ended subscription"
            ),
            // The leases still run out on their own: nothing is lost, only delayed.
            Err(error) => tracing::warn!(
                outbox = %self.outbox.name,
                owner = %self.owner,
                %error,
                held = ids.len(),
                "could not give back leases; they become claimable when they expire"
            ),
        }
        self.held = Held::default();
    }

    async fn send(&self, event: Event) -> RelayResult<()> {
        // A closed channel means the subscriber is gone; the loop notices via `closed()`.
        let _ = self.events.send(Ok(event)).await;
        Ok(())
    }
}

/// Waits for the next insert signal; false when the signal's sender is gone.
async fn wait_changed(signal: &mut Option<watch::Receiver<u64>>) -> bool {
    match signal {
        Some(receiver) => receiver.changed().await.is_ok(),
        None => std::future::pending().await,
    }
}

fn log_claim_error(outbox: &str, error: &StorageError) {
    match error {
        StorageError::Unavailable(_)
        | StorageError::MissingTable { .. }
        | StorageError::MismatchedTable { .. } => {
            tracing::warn!(outbox, %error, "claim failed; retrying")
        }
        StorageError::Other(_) | StorageError::InvalidMessage(_) => {
            tracing::error!(outbox, error = ?error, "claim failed; retrying")
        }
    }
}

#[cfg(test)]
mod tests {
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
