//! The answering side of a subscription: a state machine (what it waits for, and the one
//! future that completes when the answer applied on its own task finishes), and the
//! loop's steps that start an answer and take what it applied.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::{JoinError, JoinHandle};
use tokio::time::Instant;
use tracing::Instrument;

use super::super::{RelayResult, MAX_IDS};
use super::answers::{
    apply, apply_acks, apply_nacks, check_window, Answer, Applied, Nack, Settlement,
};
use super::claiming::{Claiming, NextClaim};
use super::queue::AnswerReceiver;
use super::{task_failed, Batch, Event, Subscription};
use crate::storage::MessageId;

/// Acks are merged until they name this many ids (and never more than one storage call
/// takes); nacks until this many.
const MAX_COALESCED: usize = 1000;

/// The answering side of a stream, one state at a time:
///
/// ```text
///          read from the channel             started
///   Idle ────────────────────────▶ Waiting ───────────────▶ Running
///     ▲                              ▲  │ set_window,          │ finished
///     │                              │  │ applied at once      │
///     ├──────────────────────────────┼──┘                      │
///     └──── nothing read behind it ──┴── an answer read behind it
/// ```
///
/// Only `Idle` reads the channel, so answers are applied one at a time, in order. In
/// `Waiting`, an answer that gives rows back waits for the claim in flight (see
/// [`Answer::waits_for_claims`]); everything else starts at the top of the loop.
pub(super) enum Answering {
    /// Nothing applied or waiting: the next answer is read from the channel.
    Idle,
    /// An answer read from the channel that has not started.
    Waiting(RelayResult<Answer>),
    /// An answer (or coalesced acks or nacks) applied on its own task; `next` is the
    /// first other answer read while coalescing, which waits for it.
    Running {
        run: AnswerRun,
        next: Option<RelayResult<Answer>>,
    },
}

pub(super) struct AnswerRun {
    pub task: JoinHandle<RelayResult<Applied>>,
    /// A nack or release: no claim starts until it is settled.
    pub gives_back: bool,
}

impl Answering {
    pub fn is_idle(&self) -> bool {
        matches!(self, Self::Idle)
    }

    /// An answer that gives rows back is running or waiting: no claim may start.
    pub fn gives_back(&self) -> bool {
        let waits = |answer: &RelayResult<Answer>| matches!(answer, Ok(answer) if answer.waits_for_claims());
        match self {
            Self::Idle => false,
            Self::Waiting(next) => waits(next),
            Self::Running { run, next } => run.gives_back || next.as_ref().is_some_and(waits),
        }
    }
}

/// Completes when the answer running finishes, having moved to `Waiting` (with the
/// answer read behind it) or `Idle`; never in another state.
pub(super) async fn finished(answering: &mut Answering) -> Result<RelayResult<Applied>, JoinError> {
    let Answering::Running { run, .. } = answering else {
        return std::future::pending().await;
    };
    let result = (&mut run.task).await;
    *answering = match std::mem::replace(answering, Answering::Idle) {
        Answering::Running {
            next: Some(next), ..
        } => Answering::Waiting(next),
        _ => Answering::Idle,
    };
    result
}

/// `first` and the acks waiting right behind it, to apply in one storage call (a
/// subscriber acking message by message would otherwise cost a transaction each); and
/// the first other answer, kept for after them.
pub(super) fn acks_behind(
    first: Vec<MessageId>,
    answers: &mut AnswerReceiver,
    fresh: impl Fn(&Answer) -> bool,
) -> (Vec<Vec<MessageId>>, Option<RelayResult<Answer>>) {
    let mut total = first.len();
    let mut acks = vec![first];
    while total < MAX_COALESCED {
        match answers.try_recv() {
            // An ack with a stale token is not merged: it goes first, alone, next.
            Some(Ok(answer))
                if answer.is_ack() && total + answer.ids().len() <= MAX_IDS && fresh(&answer) =>
            {
                let ids = answer.ids();
                total += ids.len();
                acks.push(ids);
            }
            Some(other) => return (acks, Some(other)),
            None => break,
        }
    }
    (acks, None)
}

/// `first` and the nacks waiting right behind it, to apply in one storage call (a burst
/// of nacks, a broker outage, would otherwise cost a transaction each while the rest
/// wait); and the first other answer, kept for after them.
pub(super) fn nacks_behind(
    first: Nack,
    answers: &mut AnswerReceiver,
    fresh: impl Fn(&Answer) -> bool,
) -> (Vec<Nack>, Option<RelayResult<Answer>>) {
    let mut nacks = vec![first];
    while nacks.len() < MAX_COALESCED {
        match answers.try_recv() {
            Some(Ok(answer)) if answer.is_nack() && fresh(&answer) => {
                if let (Some(Answer::Nack { id, error, delay }), _) = answer.split_stale(|_| None) {
                    nacks.push(Nack { id, error, delay });
                }
            }
            Some(other) => return (nacks, Some(other)),
            None => break,
        }
    }
    (nacks, None)
}

impl Subscription {
    /// Starts the answer taken from the channel, if nothing keeps it waiting.
    pub(super) async fn start_next_answer(
        &mut self,
        answers: &mut AnswerReceiver,
    ) -> RelayResult<()> {
        let next = match std::mem::replace(&mut self.answering, Answering::Idle) {
            Answering::Waiting(next) => next,
            other => {
                self.answering = other;
                return Ok(());
            }
        };
        let answer = next?;
        if answer.waits_for_claims() && matches!(self.claiming, Claiming::Running(_)) {
            self.answering = Answering::Waiting(Ok(answer));
            return Ok(());
        }
        let outbox = Arc::clone(&self.outbox);
        let owner = Arc::clone(&self.owner);
        let gives_back = answer.waits_for_claims();
        let kind = answer.kind();
        let (answer, stale) = answer.split_stale(|id| self.held.attempt(id));
        if let (false, Some(kind)) = (stale.is_empty(), kind) {
            self.outbox.answers.count_stale(kind, stale.len());
        }
        let Some(answer) = answer else {
            // Nothing left to apply: every token named an earlier delivery.
            let settlement = Settlement {
                fenced: stale,
                ..Settlement::default()
            };
            self.info.answered([settlement.answered()]);
            self.send(Event::Settled(settlement)).await;
            return Ok(());
        };
        let held = &self.held;
        let fresh = |answer: &Answer| {
            let (_, stale) = answer.clone().split_stale(|id| held.attempt(id));
            stale.is_empty()
        };
        let (task, next) = match answer {
            Answer::SetWindow(window) => {
                self.set_window(window).await;
                return Ok(());
            }
            Answer::Ack(ids) => {
                let (acks, next) = acks_behind(ids, answers, fresh);
                if let Some(unparked) = self.parked.acked(acks.iter().flatten().copied()) {
                    let mut batch = Batch::from(unparked);
                    batch.holder = Arc::clone(&self.owner);
                    self.send(Event::Batch(batch)).await;
                }
                let task = tokio::spawn(apply_acks(outbox, owner, acks).in_current_span());
                (task, next)
            }
            Answer::Nack { id, error, delay } => {
                let (nacks, next) = nacks_behind(Nack { id, error, delay }, answers, fresh);
                let task = tokio::spawn(apply_nacks(outbox, owner, nacks).in_current_span());
                (task, next)
            }
            answer @ (Answer::Release { .. } | Answer::DeadLetter { .. }) => {
                (self.apply(answer), None)
            }
            Answer::ExtendLease { mut ids, lease } => {
                // The rows parked behind them keep the lease of their key.
                let behind = self.parked.behind(&ids);
                ids.extend(behind);
                (self.apply(Answer::ExtendLease { ids, lease }), None)
            }
            Answer::Tokened { .. } => unreachable!("split_stale unwraps tokened answers"),
        };
        let task = match stale.is_empty() {
            true => task,
            false => tokio::spawn(async move {
                let mut applied = task.await.map_err(task_failed)??;
                applied.stale = stale;
                Ok(applied)
            }),
        };
        let run = AnswerRun { task, gives_back };
        self.answering = Answering::Running { run, next };
        Ok(())
    }

    /// Gives back the orphaned parked rows (see `parked.rs`), as an answer of the stream's
    /// own: only while no answer and no claim runs, and no claim starts until it is
    /// applied. The subscriber never saw the rows, so it hears nothing of it.
    pub(super) fn start_give_back(&mut self) {
        if !self.parked.has_orphans()
            || !self.answering.is_idle()
            || matches!(self.claiming, Claiming::Running(_))
        {
            return;
        }
        let ids = self.parked.take_orphans();
        let (outbox, owner) = (Arc::clone(&self.outbox), Arc::clone(&self.owner));
        let lease = self.spec.lease;
        let give_back = async move {
            let release = Answer::Release {
                ids,
                delay: Duration::ZERO,
            };
            let mut applied = apply(outbox, owner, lease, release).await?;
            applied.settlements.clear();
            Ok(applied)
        };
        let task = tokio::spawn(give_back.in_current_span());
        self.answering = Answering::Running {
            run: AnswerRun {
                task,
                gives_back: true,
            },
            next: None,
        };
    }

    /// Applies a release, a dead-letter or a lease extension on a task of its own.
    pub(super) fn apply(&self, answer: Answer) -> JoinHandle<RelayResult<Applied>> {
        let (outbox, owner) = (Arc::clone(&self.outbox), Arc::clone(&self.owner));
        tokio::spawn(apply(outbox, owner, self.spec.lease, answer).in_current_span())
    }

    /// Applies a new window (never while a claim runs) and confirms it; a window out of
    /// bounds is rejected and the old one kept.
    pub(super) async fn set_window(&mut self, window: u32) {
        if let Err(error) = check_window(window) {
            self.send(Event::Settled(Settlement::rejected(Vec::new(), &error)))
                .await;
            return;
        }
        tracing::debug!(outbox = %self.outbox.name, owner = %self.owner, window, "window changed");
        if window == 0 {
            // No batch may follow the `settled` of a closed window.
            self.parked.orphan_all();
        }
        if window > self.spec.max_in_flight {
            // More room: look at once rather than at the next poll.
            self.claiming.claim_now();
        }
        self.spec.max_in_flight = window;
        self.info.set_window(window);
        self.send(Event::Settled(Settlement::default())).await;
    }

    /// Takes applied answers: their rows stop (or keep) being held, then each answer is
    /// confirmed, in order.
    pub(super) async fn answered(&mut self, applied: RelayResult<Applied>) -> RelayResult<()> {
        let mut applied = applied?;
        // Rows the subscriber was never sent, named before `account` forgets them.
        let unseen: HashSet<MessageId> = applied
            .settlements
            .iter()
            .flat_map(Settlement::ids)
            .filter(|id| self.parked.unseen(*id))
            .collect();
        let held_before = self.held.len();
        self.account(&applied);
        if let Some(first) = applied.settlements.first_mut() {
            first.fenced.append(&mut applied.stale);
            first.fenced.sort_unstable();
        }
        for settlement in &mut applied.settlements {
            settlement.strip(|id| unseen.contains(&id));
        }
        self.info.set_in_flight(self.held.len());
        self.info
            .answered(applied.settlements.iter().map(Settlement::answered));
        for settlement in applied.settlements {
            self.send(Event::Settled(settlement)).await;
        }
        if self.held.len() < held_before {
            // A claim that came back short while this stream held rows may have been held
            // back by this stream's own keys: answering them can unblock work, so look
            // again now rather than at the next idle poll.
            match &mut self.claiming {
                Claiming::Running(run) => run.freed_rows = true,
                Claiming::InTransit { next, .. } | Claiming::Ready(next) => {
                    if let NextClaim::Idle {
                        short_while_holding: true,
                    } = next
                    {
                        *next = NextClaim::At(Instant::now());
                    }
                }
            }
        }
        Ok(())
    }

    pub(super) fn account(&mut self, applied: &Applied) {
        self.held.remove_all(&applied.finished);
        let fenced: Vec<MessageId> = applied
            .settlements
            .iter()
            .flat_map(|s| s.fenced.iter().copied())
            .collect();
        self.parked.finished(&applied.finished, &fenced);
        if let Some((ids, lease)) = &applied.extended {
            let deadline = Instant::now() + *lease;
            for id in ids {
                self.held.extend(*id, deadline);
            }
        }
    }
}
