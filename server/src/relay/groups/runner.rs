//! The loop of one group stream: a member of its group for as long as the stream lasts.
//!
//! One task, one loop, storage calls awaited in place, in this order each turn: the
//! heartbeat when due (membership, partitions lost and taken), lease expiries, a read
//! when the window has room and a partition has nothing queued, a batch, then a flush
//! of what answers and dispatch changed (at most one per `FLUSH_EVERY` while the stream
//! is busy), after which the answers' `settled` go out: an ack is confirmed only once the
//! position or state row that records it is committed.
//! Then it waits for an answer, a timer (heartbeat, lease, retry due, idle poll), an
//! insert signal, the drain, or the subscriber going away.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use tokio::sync::mpsc;
use tokio::time::{sleep_until, Instant};

use super::member::{Failure, Member, Outcome};
use super::Groups;
use crate::relay::drain::Drain;
use crate::relay::response_size::message_bytes;
use crate::relay::subscription::{
    Answer, AnswerReceiver, Batch, Event, Rejection, SubscriptionSpec,
};
use crate::relay::{Outbox, RelayResult};
use crate::storage::groups::{GroupRow, Position};
use crate::storage::{Claimed, MessageId, OutboxMessage, StorageError};

/// Longest wait between heartbeats, whatever the lease.
const MAX_HEARTBEAT: Duration = Duration::from_secs(5);
/// Heartbeat while a partition assigned to this member is still owned by another one
/// (handing it over), so the hand-over is quick.
const HANDOVER_HEARTBEAT: Duration = Duration::from_millis(250);
/// A partition's read brings up to this many batches: it is read again only once fewer
/// than a batch are queued, so one statement serves several loop turns (each read costs
/// the database about as much for 100 rows as for a few hundred).
const READ_AHEAD: usize = 4;
/// Least time between two flushes of a busy stream: one flush then writes what several
/// loop turns applied (a position write per turn cost the database as much as reading
/// the rows). An idle stream's answer is flushed at once; a busy one's `settled` waits at
/// most this long.
const FLUSH_EVERY: Duration = Duration::from_millis(5);
/// Pause after a failed storage call before the next.
const STORAGE_ERROR_DELAY: Duration = Duration::from_secs(1);

/// Runs one group stream until the subscriber goes away, the drain completes, or an error
/// ends it; the error (if any) is sent as the last event.
pub async fn run(
    outbox: Arc<Outbox>,
    groups: Arc<Groups>,
    group: String,
    spec: SubscriptionSpec,
    mut answers: AnswerReceiver,
    events: mpsc::Sender<RelayResult<Event>>,
    drain: Drain,
) {
    let settings = match groups.settings(&group) {
        Ok(settings) => settings.clone(),
        Err(error) => {
            let _ = events.send(Err(error)).await;
            return;
        }
    };
    // Namespaced by the identity, as every lease holder (docs/lease-tokens.md).
    let member_id = crate::relay::lease_token::holder(
        spec.identity.as_deref(),
        &format!("{}:{}", spec.subscriber, uuid::Uuid::new_v4().simple()),
    );
    let _open = outbox.metrics().stream_opened(&spec.subscriber);
    let registration = outbox
        .subscribers
        .register(spec.connection(&member_id), spec.max_in_flight);
    let mut runner = Runner {
        insert_signal: outbox.storage().insert_signal(),
        membership: groups.membership(),
        joined: false,
        poll: outbox.config.poll.min,
        next_poll: Instant::now(),
        next_heartbeat: Instant::now(),
        next_flush: Instant::now(),
        window: spec.max_in_flight,
        member: Member::new(settings),
        outbox,
        groups,
        group,
        member_id,
        spec,
        events,
        pending: Vec::new(),
        draining_until: None,
        paused: false,
        info: Arc::clone(&registration.info),
    };
    let result = runner.serve(&mut answers, &drain).await;
    runner.give_back().await;
    drop(registration);
    match result {
        Err(error) => {
            tracing::warn!(outbox = %runner.outbox.name, group = %runner.group, member = %runner.member_id, %error, "group stream ended with an error");
            let _ = runner.events.send(Err(error)).await;
        }
        Ok(()) => {
            tracing::info!(outbox = %runner.outbox.name, group = %runner.group, member = %runner.member_id, "group stream ended")
        }
    }
}

struct Runner {
    outbox: Arc<Outbox>,
    groups: Arc<Groups>,
    group: String,
    member_id: String,
    spec: SubscriptionSpec,
    member: Member,
    events: mpsc::Sender<RelayResult<Event>>,
    window: u32,
    /// Answers applied in memory, waiting for the flush that makes them durable.
    pending: Vec<Outcome>,
    insert_signal: Option<tokio::sync::watch::Receiver<crate::storage::Inserts>>,
    /// Joins and leaves of the other streams of this replica (see `Groups::membership`).
    membership: tokio::sync::watch::Receiver<u64>,
    /// Whether a heartbeat has made this stream a member yet.
    joined: bool,
    /// The idle poll's current wait, growing while reads find nothing.
    poll: Duration,
    next_poll: Instant,
    next_heartbeat: Instant,
    /// The earliest time of the next flush while the stream is busy (see [`FLUSH_EVERY`]).
    next_flush: Instant,
    draining_until: Option<Instant>,
    /// The outbox or the group was paused at the last look: nothing is sent until it is
    /// resumed.
    paused: bool,
    info: Arc<crate::relay::subscribers::StreamInfo>,
}

impl Runner {
    async fn send(&self, event: Event) -> bool {
        self.events.send(Ok(event)).await.is_ok()
    }

    fn partition_lease(&self) -> Duration {
        self.member.settings.lease
    }

    fn heartbeat_every(&self) -> Duration {
        (self.partition_lease() / 3).min(MAX_HEARTBEAT)
    }

    async fn serve(&mut self, answers: &mut AnswerReceiver, drain: &Drain) -> RelayResult<()> {
        tracing::info!(outbox = %self.outbox.name, group = %self.group, member = %self.member_id, window = self.window, "group stream opened");
        self.send(Event::Subscribed {
            owner: self.member_id.clone(),
            lease: self.spec.lease,
            max_in_flight: self.window,
            max_attempts: self.member.settings.max_attempts,
        })
        .await;
        loop {
            if Instant::now() >= self.next_heartbeat {
                match self.heartbeat().await {
                    Ok(()) => {}
                    Err(error) if heals(&error) => {
                        tracing::warn!(group = %self.group, member = %self.member_id, %error, "group heartbeat failed; trying again");
                        self.next_heartbeat = Instant::now() + STORAGE_ERROR_DELAY;
                    }
                    Err(error) => return Err(error.into()),
                }
            }
            let expired = self.member.expire(Instant::now(), Utc::now());
            if !expired.is_empty() {
                tracing::warn!(group = %self.group, member = %self.member_id, count = expired.len(), "leases expired before the subscriber answered");
                self.send(Event::LeasesExpired(expired)).await;
            }
            if self.draining_until.is_none() {
                self.fill().await?;
            }
            if self.flush_due() {
                self.flush().await?;
                match self.release_quiet().await {
                    Ok(()) => {}
                    Err(error) if heals(&error) => {
                        tracing::warn!(group = %self.group, member = %self.member_id, %error, "giving partitions back failed; trying again at the next heartbeat");
                    }
                    Err(error) => return Err(error.into()),
                }
            }
            self.info.set_in_flight(self.member.flights.len());
            if self.draining_until.is_some() && self.member.flights.is_empty() {
                return Ok(());
            }
            let wake = self.next_wake();
            tokio::select! {
                biased;
                answer = answers.recv() => {
                    let Some(answer) = answer else { return Ok(()) };
                    self.apply(answer)?;
                    while let Some(answer) = answers.try_recv() {
                        self.apply(answer)?;
                    }
                }
                _ = self.events.closed() => return Ok(()),
                _ = drain.started(), if self.draining_until.is_none() => {
                    self.draining_until = Some(Instant::now() + drain.timeout());
                    let deadline = Utc::now() + chrono::Duration::from_std(drain.timeout()).unwrap_or_default();
                    self.send(Event::Draining { deadline }).await;
                }
                _ = sleep_until(self.draining_until.unwrap_or_else(Instant::now)), if self.draining_until.is_some() => {
                    tracing::warn!(group = %self.group, member = %self.member_id, held = self.member.flights.len(), "drain timeout; giving back unanswered messages");
                    return Ok(());
                }
                Ok(()) = self.membership.changed() => {
                    self.next_heartbeat = Instant::now();
                }
                changed = wait_insert(&mut self.insert_signal) => {
                    if changed {
                        self.member.wake();
                    } else {
                        self.insert_signal = None;
                    }
                }
                _ = sleep_until(wake) => {
                    if Instant::now() >= self.next_poll {
                        self.member.wake();
                    }
                }
            }
        }
    }

    /// Whether this turn flushes: writes are waiting and none went out within
    /// [`FLUSH_EVERY`], or the stream drains or hands a partition over (the next owner
    /// waits for that flush).
    fn flush_due(&self) -> bool {
        let waiting = !self.pending.is_empty() || self.member.has_writes();
        waiting
            && (Instant::now() >= self.next_flush
                || self.draining_until.is_some()
                || self.member.parts.values().any(|p| p.leaving))
    }

    fn next_wake(&self) -> Instant {
        let mut wake = self.next_heartbeat;
        if !self.pending.is_empty() || self.member.has_writes() {
            wake = wake.min(self.next_flush);
        }
        if let Some(deadline) = self.member.next_deadline() {
            wake = wake.min(deadline);
        }
        if let Some(due) = self.member.next_due() {
            let wait = (due - Utc::now()).to_std().unwrap_or_default();
            wake = wake.min(Instant::now() + wait);
        }
        if self.paused || self.member.all_caught_up() {
            wake = wake.min(self.next_poll);
        }
        wake
    }

    /// Applies one answer in memory; its `settled` goes out after the next flush.
    fn apply(&mut self, answer: RelayResult<Answer>) -> RelayResult<()> {
        // A token of an earlier delivery of a row this stream holds again is fenced.
        let (answer, stale) = answer?.split_stale(|id| self.member.attempts_held(id));
        let now = Utc::now();
        let mut outcome = Outcome::default();
        outcome.settled.fenced = stale;
        match answer {
            None => {}
            // `split_stale` unwraps tokened answers.
            Some(Answer::Tokened { .. }) => {}
            Some(Answer::Ack(ids)) => self.member.ack(&ids, &mut outcome),
            Some(Answer::Nack { id, error, delay }) => {
                self.member
                    .fail(id, Failure::Nack { error, delay }, now, &mut outcome)
            }
            Some(Answer::Release { ids, delay }) => {
                for id in ids {
                    self.member
                        .fail(id, Failure::Release { delay }, now, &mut outcome);
                }
            }
            Some(Answer::DeadLetter { id, error }) => {
                self.member
                    .fail(id, Failure::Dead { error }, now, &mut outcome)
            }
            Some(Answer::ExtendLease { ids, lease }) => {
                let lease = if lease.is_zero() {
                    self.spec.lease
                } else {
                    lease
                };
                if lease > self.member.settings.max_lease {
                    outcome.settled.rejected = Some(Rejection {
                        ids,
                        reason: format!(
                            "lease of {} exceeds the outbox's max_lease of {}",
                            humantime::format_duration(lease),
                            humantime::format_duration(self.member.settings.max_lease)
                        ),
                    });
                } else {
                    self.member
                        .extend(&ids, Instant::now() + lease, &mut outcome);
                    outcome.settled.lease_expires_at = Some(now + super::member::chrono_of(lease));
                }
            }
            Some(Answer::SetWindow(window)) => {
                self.window = window;
                self.info.set_window(window);
            }
        }
        let counted = outcome.settled.acked.len() as u64;
        self.outbox.metrics().acked.inc_by(counted);
        self.pending.push(outcome);
        Ok(())
    }

    /// Reads and sends what the window has room for.
    async fn fill(&mut self) -> RelayResult<()> {
        let room = (self.window as usize).saturating_sub(self.member.flights.len());
        if room == 0 {
            return Ok(());
        }
        // A pause of the whole outbox stops every group, a group's pause this one (a
        // topic's pause does not: a key's order spans topics). Answers still apply.
        let pauses = self.outbox.pauses().await;
        self.paused = pauses.outbox.is_some() || pauses.groups.contains_key(&self.group);
        if self.paused {
            self.next_poll = Instant::now() + crate::relay::pause::PAUSE_REFRESH;
            return Ok(());
        }
        let batch = self.outbox.config.max_batch_size.max(1) as usize;
        let cursors = self.member.read_cursors(batch.min(room).max(1));
        if !cursors.is_empty() {
            match self
                .groups
                .store
                .read(&cursors, (batch * READ_AHEAD).min(1000) as u32)
                .await
            {
                Ok(read) => {
                    let found = !read.rows.is_empty();
                    self.member.add_read(&cursors, read);
                    if found {
                        self.poll = self.outbox.config.poll.min;
                    } else if self.member.all_caught_up() {
                        self.poll = self
                            .poll
                            .mul_f64(self.outbox.config.poll.factor)
                            .min(self.outbox.config.poll.max);
                    }
                    self.next_poll = Instant::now() + self.poll;
                }
                Err(error) if heals(&error) => {
                    tracing::warn!(group = %self.group, %error, "group read failed; trying again");
                    self.next_poll = Instant::now() + STORAGE_ERROR_DELAY;
                    return Ok(());
                }
                Err(error) => return Err(error.into()),
            }
        }
        let deadline = Instant::now() + self.spec.lease;
        let dispatch = self.member.dispatch(room.min(batch), Utc::now(), deadline);
        if dispatch.is_empty() {
            return Ok(());
        }
        let mut messages: Vec<OutboxMessage> = dispatch
            .fresh
            .into_iter()
            .map(|row: GroupRow| row.message)
            .collect();
        if !dispatch.from_state.is_empty() {
            let fetched = match self.groups.store.fetch(&dispatch.from_state).await {
                Ok(rows) => rows,
                Err(error) => {
                    // Nothing was sent: give the rows back as they were.
                    self.member.give_back(&dispatch.from_state, Utc::now());
                    if heals(&error) {
                        return Ok(());
                    }
                    return Err(error.into());
                }
            };
            for id in &dispatch.from_state {
                match fetched.iter().find(|row| row.message.id == *id) {
                    Some(row) => {
                        let mut message = row.message.clone();
                        message.attempts = self.member.attempts_of(*id);
                        messages.push(message);
                    }
                    // Purged by hand meanwhile: nothing left to deliver.
                    None => self.member.vanished(*id),
                }
            }
        }
        self.send_in_order(messages).await;
        Ok(())
    }

    /// Sends `messages` in log order within each partition, one response at most
    /// `max_message_bytes`; a row too large for any response is dead-lettered.
    async fn send_in_order(&mut self, mut messages: Vec<OutboxMessage>) {
        let positions: std::collections::HashMap<MessageId, Position> = self
            .member
            .flights
            .iter()
            .map(|(id, f)| (*id, f.position))
            .collect();
        messages.sort_by_key(|m| positions.get(&m.id).copied().unwrap_or_default());
        let limit = self.outbox.max_message_bytes;
        let lease_expires_at = Utc::now() + super::member::chrono_of(self.spec.lease);
        let mut batch: Vec<OutboxMessage> = Vec::new();
        let mut bytes = 0;
        for message in messages {
            let size = message
                .too_large
                .map_or_else(|| message_bytes(&message), |stored| stored as usize);
            if message.too_large.is_some() || size > limit {
                let mut outcome = Outcome::default();
                let error = format!(
                    "row of {size} bytes exceeds server.max_message_bytes = {limit}; it cannot be delivered in one response"
                );
                self.member.fail(
                    message.id,
                    Failure::Dead { error },
                    Utc::now(),
                    &mut outcome,
                );
                continue;
            }
            if bytes + size > limit && !batch.is_empty() {
                self.send_batch(std::mem::take(&mut batch), lease_expires_at)
                    .await;
                bytes = 0;
            }
            bytes += size;
            batch.push(message);
        }
        if !batch.is_empty() {
            self.send_batch(batch, lease_expires_at).await;
        }
    }

    async fn send_batch(
        &self,
        messages: Vec<OutboxMessage>,
        lease_expires_at: chrono::DateTime<Utc>,
    ) {
        self.outbox.metrics().claimed.inc_by(messages.len() as u64);
        let batch = Batch::from(Claimed {
            messages,
            lease_expires_at,
            exhausted: Vec::new(),
        })
        .with_holder(self.member_id.as_str().into());
        self.send(Event::Batch(batch)).await;
    }

    /// Writes what changed, then sends the settlements it made durable.
    async fn flush(&mut self) -> RelayResult<()> {
        let flushes = self.member.take_flushes();
        let mut lost = Vec::new();
        if !flushes.is_empty() {
            self.next_flush = Instant::now() + FLUSH_EVERY;
            let mut attempt = 0;
            loop {
                match self
                    .groups
                    .store
                    .flush(&self.group, &self.member_id, &flushes)
                    .await
                {
                    Ok(fenced) => {
                        self.member.flushed(&flushes);
                        lost = fenced;
                        break;
                    }
                    Err(error) if heals(&error) && attempt < 5 => {
                        attempt += 1;
                        tracing::warn!(group = %self.group, %error, "group flush failed; trying again");
                        tokio::time::sleep(STORAGE_ERROR_DELAY).await;
                    }
                    Err(error) => {
                        self.member.unflushed(flushes);
                        return Err(error.into());
                    }
                }
            }
        }
        for partition in &lost {
            tracing::warn!(group = %self.group, member = %self.member_id, partition, "partition taken by another member; its answers are fenced");
            let ids = self.member.lose(*partition);
            if !ids.is_empty() {
                self.send(Event::LeasesExpired(ids)).await;
            }
        }
        let fenced_partitions: std::collections::HashSet<u32> = lost.into_iter().collect();
        for Outcome {
            settled: mut settlement,
            partitions,
        } in std::mem::take(&mut self.pending)
        {
            if !fenced_partitions.is_empty() {
                // The partition moved before the write: nothing of it was applied.
                let moved = |id: &MessageId| {
                    partitions
                        .get(id)
                        .is_some_and(|p| fenced_partitions.contains(p))
                };
                for ids in [
                    &mut settlement.acked,
                    &mut settlement.retried,
                    &mut settlement.dead_lettered,
                    &mut settlement.released,
                    &mut settlement.extended,
                ] {
                    let (fenced, kept): (Vec<_>, Vec<_>) = ids.drain(..).partition(moved);
                    *ids = kept;
                    settlement.fenced.extend(fenced);
                }
            }
            self.info.answered([settlement.answered()]);
            self.send(Event::Settled(settlement)).await;
        }
        Ok(())
    }
}

/// Whether a storage error may heal by waiting (the database down or busy).
fn heals(error: &StorageError) -> bool {
    matches!(error, StorageError::Unavailable(_))
}

async fn wait_insert(
    signal: &mut Option<tokio::sync::watch::Receiver<crate::storage::Inserts>>,
) -> bool {
    match signal {
        Some(signal) => signal.changed().await.is_ok(),
        None => std::future::pending().await,
    }
}

mod membership;
