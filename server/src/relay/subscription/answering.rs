//! The answering side of a subscription as a state machine: what it waits for, and the
//! one future that completes when the answer applied on its own task finishes.

use tokio::task::{JoinError, JoinHandle};

use super::super::{RelayResult, MAX_IDS};
use super::answers::{Answer, Applied, Nack};
use super::queue::AnswerReceiver;
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
