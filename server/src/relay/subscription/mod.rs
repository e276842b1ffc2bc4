//! One streaming subscriber: claims on its behalf while its window has room, applies its
//! answers, tells it when leases run out, and gives back whatever it still holds when
//! the stream ends for any reason.
//!
//! The loop owns all state of the stream (the held rows and their deadlines, the window),
//! so there is no locking: answers, claims, wake-ups and the drain are events of one
//! `select!`. The claiming side is a state machine of its own ([`claiming`]: `Ready`,
//! `Running`, `InTransit`, and in `Ready` whether the next claim waits for a time or for
//! the group's turn), and so is the answering side (`answering.rs`: `Idle`, `Waiting`,
//! `Running`), so each arm of the `select!` is guarded by the state it belongs to. The
//! storage calls run on tasks of their own, so a claim and an answer of one
//! stream run at the same time: a claim woken by an insert does not wait behind an ack
//! transaction, and acks arriving during a claim do not wait for it. At most one claim and
//! one answer (or one set of coalesced acks) run at a time; their outcomes come back to
//! the loop, which alone changes the held rows and sends events. What keeps that sound:
//!
//! - **Bytes**: a claim starts only once the transport has taken the previous batch (see
//!   [`Batch`]), and a batch is at most one response of `server.max_message_bytes` (see
//!   [`Claims::claim`](super::Claims::claim)): a subscriber that stops reading pins at
//!   most that batch and the one the transport is writing, whatever its window, never
//!   window x row size.
//! - **Window**: a claim asks for at most `window - held` rows, and a row stays held until
//!   its answer is *settled* (applied, and its `settled` sent), so a stream never holds
//!   more than its window, even with acks in flight. The price is that rows being acked
//!   do not make room for the claim running beside them; the next claim sees the room.
//! - **Answers in order**: answers are applied one at a time, in arrival order (acks
//!   waiting back to back go in one storage call, and so do nacks) and each gets its own
//!   `settled`, in order. An answer refused as sent (a delay out of bounds...) gets a
//!   `settled` with `rejected` and changes nothing; the stream goes on.
//! - **Answers that give rows back do not overlap claims**: a nack (with the later rows of
//!   its key it releases) or a release waits for the claim in flight, and no claim starts
//!   until it is settled; so a row given back is never claimed again for this stream
//!   before the loop and the subscriber know it was given back. `set_window` waits the
//!   same way, so once its `settled` is sent no batch claimed under the old window
//!   follows (the client's graceful stop relies on that). See [`Answer::waits_for_claims`].
//!   Per-key order itself is the database's: a strict claim never returns a row while an
//!   earlier row of its key is leased to another owner or waiting for its retry. A
//!   stream's own claim goes on past the rows of a key it holds (so a hot key has its
//!   next batch claimed while the subscriber publishes the one before), and such rows are
//!   *parked*, held but not sent, until the subscriber has acked the key's earlier rows;
//!   any other end of those orphans them, and they are given back before the next claim
//!   starts (see `parked.rs`, which says why that is enough).
//! - **Bytes per identity**: with `max_bytes_in_flight`, a claim starts only with an
//!   allowance taken from the identity's budget, and is capped at it; the rows' bytes
//!   stay taken while they are held (see `held.rs`). A stream that finds too little left
//!   waits in line for a release, as it would for room in its window: it stays open and
//!   takes no group turns meanwhile. See [`super::bytes_in_flight`].
//! - **Drain**: no claim starts once the drain has begun; one already running finishes
//!   and its batch goes out before `draining`.
//! - **End**: however the stream ends, the claim and the answer in flight are awaited, so
//!   whatever they leased is known and given back.
//!
//! Idle polling and insert signals are shared by the outbox's streams (see
//! [`super::idle`]): a stream whose last claim came back short waits for its group's turn
//! (a poll or an insert) or its own answers, instead of a timer of its own, so an insert
//! costs one claim per group, not one per stream.
//!
//! A claim that fails for a reason that heals (the database down, the table missing) is
//! retried, after [`STORAGE_ERROR_DELAY`] doubling up to [`MAX_STORAGE_ERROR_DELAY`]; one
//! that fails for the caller's reason (an argument the database refuses) never heals and
//! ends the stream with its status. The relay checks its callers' strings before any SQL,
//! so what still gets here is what only the table knows: a mapped or altered column too
//! short for the stream's owner name (its subscriber name, a colon and 32 hex digits), as
//! `hostile_input::a_stream_whose_claims_fail_for_its_own_reason_ends_with_that_status`
//! shows end to end.

mod answering;
mod answers;
mod claiming;
mod held;
mod parked;
pub mod queue;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinError;
use tokio::time::{sleep_until, Instant};

use self::answering::{finished, Answering};
pub use self::answers::{Answer, Rejection, Settlement};
use self::claiming::{freed, hold_bytes, progress, Claiming, NextClaim, Progress};
use self::held::Held;
use self::parked::Parked;
pub use self::queue::{answer_queue, AnswerReceiver, AnswerSender};
use super::bytes_in_flight::{BytesInFlight, StreamBytes};
use super::drain::Drain;
use super::idle::{changed, PollGroup};
#[cfg(test)]
use super::response_size::message_bytes;
use super::subscribers::{Connection, StreamInfo};
use super::{Outbox, RelayError, RelayResult};
use crate::storage::{Claimed, MessageId, StorageError};

/// Pause after a failed claim before trying again; it doubles while claims keep failing.
const STORAGE_ERROR_DELAY: Duration = Duration::from_secs(1);
const MAX_STORAGE_ERROR_DELAY: Duration = Duration::from_secs(30);

/// What the subscriber asked for when it opened the stream, already validated.
#[derive(Debug, Clone)]
pub struct SubscriptionSpec {
    pub subscriber: String,
    pub topics: Vec<String>,
    pub max_in_flight: u32,
    pub lease: Duration,
    /// The client's address, when the transport knows it (for `Admin.ListSubscribers`).
    pub peer: Option<String>,
    /// The authenticated identity, when auth is on.
    pub identity: Option<String>,
    /// The identity's `max_bytes_in_flight`, when it has one.
    pub bytes: Option<Arc<BytesInFlight>>,
}

impl SubscriptionSpec {
    /// What the stream connected as, its rows leased to `owner`.
    pub fn connection(&self, owner: &str) -> Connection {
        Connection {
            name: self.subscriber.clone(),
            owner: owner.to_owned(),
            peer: self.peer.clone(),
            identity: self.identity.clone(),
            topics: self.topics.clone(),
            connected_since: Utc::now(),
        }
    }
}

/// What the subscription tells its subscriber.
#[derive(Debug)]
pub enum Event {
    Subscribed {
        owner: String,
        lease: Duration,
        max_in_flight: u32,
        max_attempts: u32,
    },
    Batch(Batch),
    Settled(Settlement),
    LeasesExpired(Vec<MessageId>),
    Draining {
        deadline: DateTime<Utc>,
    },
}

/// Claimed rows on their way to the subscriber. The loop claims again only once the
/// transport has taken this one off the event channel (converting it to protobuf drops
/// it, and with it `taken`): a subscriber that stops reading stops the claims.
#[derive(Debug)]
pub struct Batch {
    pub claimed: Claimed,
    /// The stream's lease holder, which the messages' lease tokens name.
    pub holder: Arc<str>,
    /// Dropped when the batch is taken; the loop waits on the other end.
    _taken: Option<oneshot::Sender<()>>,
}

impl Batch {
    /// The batch's messages carry lease tokens naming `holder`.
    pub fn with_holder(mut self, holder: Arc<str>) -> Self {
        self.holder = holder;
        self
    }
}

impl From<Claimed> for Batch {
    fn from(claimed: Claimed) -> Self {
        Self {
            claimed,
            holder: "".into(),
            _taken: None,
        }
    }
}

/// Runs one subscription until the subscriber goes away, the drain completes, or an
/// error ends it; the error (if any) is sent as the last event. `idle` is the outbox's
/// poll group for the stream's filter ([`Claims::idle_poll`](super::Claims::idle_poll),
/// which may refuse it).
pub async fn run(
    outbox: Arc<Outbox>,
    spec: SubscriptionSpec,
    idle: Arc<PollGroup>,
    mut answers: AnswerReceiver,
    events: mpsc::Sender<RelayResult<Event>>,
    drain: Drain,
) {
    // Unique to the stream, and namespaced by its identity (docs/lease-tokens.md).
    let stream = format!("{}:{}", spec.subscriber, uuid::Uuid::new_v4().simple());
    let owner: Arc<str> =
        crate::relay::lease_token::holder(spec.identity.as_deref(), &stream).into();
    let _open = outbox.metrics().stream_opened(&spec.subscriber);
    let held = Held::new(outbox.metrics().in_flight.clone(), spec.bytes.clone());
    let registration = outbox
        .subscribers
        .register(spec.connection(&owner), spec.max_in_flight);
    let strict = outbox.config.strict_ordering;
    let mut state = Subscription {
        info: Arc::clone(&registration.info),
        found: Some(idle.found()),
        idle,
        topics: spec.topics.clone().into(),
        bytes: spec.bytes.as_ref().map(BytesInFlight::open),
        need: None,
        outbox,
        spec,
        owner,
        held,
        parked: Parked::new(strict),
        events,
        // The first claim goes through the group (see `PollGroup::wake`).
        claiming: Claiming::Ready(NextClaim::Idle {
            short_while_holding: false,
        }),
        answering: Answering::Idle,
        draining_until: None,
        claim_failures: 0,
    };
    state.idle.wake();
    let result = state.serve(&mut answers, &drain).await;
    state.finish_in_flight().await;
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
    /// What `Admin.ListSubscribers` shows of this stream, kept current by the loop.
    info: Arc<StreamInfo>,
    spec: SubscriptionSpec,
    owner: Arc<str>,
    /// `spec.topics`, shared with the claim tasks.
    topics: Arc<[String]>,
    held: Held,
    /// Rows claimed ahead of the subscriber: held, not sent yet (see `parked.rs`).
    parked: Parked,
    events: mpsc::Sender<RelayResult<Event>>,
    /// The outbox's idle-polling group for this stream's topic filter.
    idle: Arc<PollGroup>,
    /// The group's "a poll found more than a batch" counter.
    found: Option<watch::Receiver<u64>>,
    /// What the claiming side waits for.
    claiming: Claiming,
    /// What the answering side waits for.
    answering: Answering,
    /// Once the drain has begun: when the subscriber's time to answer runs out.
    draining_until: Option<Instant>,
    /// Claims failed in a row, for the pause before the next.
    claim_failures: u32,
    /// This stream's part in its identity's `max_bytes_in_flight`, if it has one.
    bytes: Option<StreamBytes>,
    /// The size of the row the last claim left out for its byte allowance: the next
    /// claim needs at least that much.
    need: Option<usize>,
}

impl Subscription {
    /// Runs the stream until the subscriber goes away or the drain completes.
    async fn serve(&mut self, answers: &mut AnswerReceiver, drain: &Drain) -> RelayResult<()> {
        tracing::info!(
            outbox = %self.outbox.name,
            owner = %self.owner,
            window = self.spec.max_in_flight,
            topics = ?self.spec.topics,
            "subscription opened"
        );
        self.send(Event::Subscribed {
            owner: self.owner.to_string(),
            lease: self.spec.lease,
            max_in_flight: self.spec.max_in_flight,
            max_attempts: self.outbox.config.max_attempts,
        })
        .await;
        if drain.is_started() {
            return Err(RelayError::ShuttingDown);
        }
        loop {
            self.info.set_in_flight(self.held.len());
            self.start_next_answer(answers).await?;
            self.start_give_back();
            let quiet = matches!(
                self.claiming,
                Claiming::Ready(_) | Claiming::InTransit { .. }
            ) && self.answering.is_idle();
            if self.draining_until.is_some() && self.held.len() == 0 && quiet {
                return Ok(());
            }
            let mut claim = self.claim_size(drain);
            let waiting_for_bytes = self.waits_for_bytes(claim.is_some());
            if waiting_for_bytes {
                claim = None;
            }
            let claim_at = match claim {
                Some((count, NextClaim::At(at))) => Some((count, at)),
                _ => None,
            };
            let claim_idle = match claim {
                Some((count, NextClaim::Idle { .. })) => Some(count),
                _ => None,
            };
            let claim_running = matches!(self.claiming, Claiming::Running(_));
            let take_answer = self.answering.is_idle();
            let expiry = self.held.next_deadline();
            tokio::select! {
                biased;
                progress = progress(&mut self.claiming) => {
                    if let Progress::Claimed { result, allowance, asked, freed_rows } = progress {
                        self.claimed(result, allowance, asked, freed_rows).await?;
                    }
                }
                result = finished(&mut self.answering) => {
                    self.answered(result.map_err(task_failed)?).await?;
                }
                answer = answers.recv(), if take_answer => {
                    let Some(answer) = answer else { return Ok(()) };
                    // Started at the top of the loop, which also merges the acks behind it.
                    self.answering = Answering::Waiting(answer);
                }
                _ = self.events.closed() => return Ok(()),
                _ = drain.started(), if self.draining_until.is_none() && !claim_running => {
                    self.start_draining(drain).await;
                }
                _ = sleep_until(self.draining_until.unwrap_or_else(Instant::now)), if self.draining_until.is_some() => {
                    tracing::warn!(outbox = %self.outbox.name, owner = %self.owner, held = self.held.len(), "drain timeout; giving back unanswered messages");
                    return Ok(());
                }
                _ = sleep_until(expiry.unwrap_or_else(Instant::now)), if expiry.is_some() => {
                    self.leases_expired().await;
                }
                _ = sleep_until(claim_at.map_or_else(Instant::now, |(_, at)| at)), if claim_at.is_some() => {
                    self.start_claim(claim_at.map_or(0, |(count, _)| count), None);
                }
                turn = self.idle.turn(), if claim_idle.is_some() => {
                    self.start_claim(claim_idle.unwrap_or(0), Some(turn));
                }
                changed = changed(&mut self.found), if claim_idle.is_some() => {
                    if changed {
                        self.start_claim(claim_idle.unwrap_or(0), None);
                    } else {
                        self.found = None;
                    }
                }
                () = freed(&mut self.bytes), if waiting_for_bytes => {}
            }
        }
    }

    /// The drain has begun: no claim starts from now on, and the subscriber is told how
    /// long it has to answer what it holds.
    async fn start_draining(&mut self, drain: &Drain) {
        self.parked.orphan_all();
        self.draining_until = Some(Instant::now() + drain.timeout());
        let wall = Utc::now() + chrono::Duration::from_std(drain.timeout()).unwrap_or_default();
        tracing::info!(outbox = %self.outbox.name, owner = %self.owner, held = self.held.len(), "draining");
        self.send(Event::Draining { deadline: wall }).await;
    }

    /// Forgets the rows whose leases ran out, and tells the subscriber of those it was
    /// sent (parked rows it never saw are dropped silently).
    async fn leases_expired(&mut self) {
        let mut expired = self.held.take_expired(Instant::now());
        let unseen: Vec<bool> = expired.iter().map(|id| self.parked.unseen(*id)).collect();
        self.parked.expired(&expired);
        let mut unseen = unseen.into_iter();
        expired.retain(|_| !unseen.next().unwrap_or(false));
        if !expired.is_empty() {
            tracing::warn!(outbox = %self.outbox.name, owner = %self.owner, count = expired.len(), "leases expired before the subscriber answered");
            self.send(Event::LeasesExpired(expired)).await;
        }
    }

    /// Waits for the claim and the answer in flight when the stream ends, so that what
    /// they leased is held (and given back) and what they answered is not. Their events
    /// are not sent, except the answer's `settled` when there is room for it at once.
    async fn finish_in_flight(&mut self) {
        let idle = Claiming::Ready(NextClaim::Idle {
            short_while_holding: false,
        });
        if let Claiming::Running(run) = std::mem::replace(&mut self.claiming, idle) {
            if let Ok(Ok((claimed, _))) = run.task.await {
                let sizes = hold_bytes(&claimed, run.allowance);
                let deadline = Instant::now() + self.spec.lease;
                for (message, bytes) in claimed.messages.iter().zip(sizes) {
                    self.held
                        .insert(message.id, message.attempts, deadline, bytes);
                }
            }
        }
        if let Answering::Running { run, .. } =
            std::mem::replace(&mut self.answering, Answering::Idle)
        {
            if let Ok(Ok(applied)) = run.task.await {
                self.account(&applied);
                for settlement in applied.settlements {
                    let _ = self.events.try_send(Ok(Event::Settled(settlement)));
                }
            }
        }
    }

    /// Gives back every row still held: claimable by others at once, attempt kept.
    async fn give_back(&mut self) {
        let ids = self.held.ids();
        if ids.is_empty() {
            return;
        }
        match self.outbox.answers.return_leases(&self.owner, &ids).await {
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
        self.held.clear();
    }

    async fn send(&self, event: Event) {
        // A closed channel means the subscriber is gone; the loop notices via `closed()`.
        let _ = self.events.send(Ok(event)).await;
    }
}

/// A storage call's task panicked (or was cancelled): end the stream, as its error would.
fn task_failed(error: JoinError) -> RelayError {
    RelayError::Storage(StorageError::Other(anyhow::anyhow!(
        "a storage call of the subscription failed: {error}"
    )))
}
