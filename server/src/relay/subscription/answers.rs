//! A subscriber's answers and how they are applied: the storage calls, run on a task of
//! their own, and what each did to the rows the stream holds. The subscription loop
//! (`mod.rs`) decides when an answer runs and applies the outcome to its state.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::super::subscribers::Answered;
use super::super::{limits, Outbox, RelayError, RelayResult};
use crate::config::MAX_WINDOW;
use crate::storage::{MessageId, NackRequest, NackResult};

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
    /// An answer sent with lease tokens, and the `(id, attempt)` of the delivery each
    /// names: the loop fences those of another delivery than the one it holds
    /// ([`Answer::split_stale`], docs/lease-tokens.md).
    Tokened {
        answer: Box<Answer>,
        attempts: Vec<(MessageId, u32)>,
    },
}

impl Answer {
    /// Whether this answer must not overlap a claim of its stream (see the module docs of
    /// `subscription`). A nack (with the later rows of its key it gives back) and a release
    /// make rows this stream holds claimable again, possibly at once: a claim running
    /// alongside could take them back for this stream before the loop knew they were
    /// given back, and its batch could reach the subscriber before the `settled` that gave
    /// them back. A new window must not be confirmed while a claim sized by the old one is
    /// running: after a settled `set_window(0)` no batch may follow. Acks, dead-letters
    /// and lease extensions never make a held row claimable (an ack or a dead-letter moves
    /// the key's head to a later row, which this stream either also holds, so leased, or
    /// never had), so they run alongside claims.
    pub fn waits_for_claims(&self) -> bool {
        match self {
            Answer::Tokened { answer, .. } => answer.waits_for_claims(),
            _ => matches!(
                self,
                Answer::Nack { .. } | Answer::Release { .. } | Answer::SetWindow(_)
            ),
        }
    }

    /// Whether this is an ack, with tokens or without.
    pub fn is_ack(&self) -> bool {
        match self {
            Answer::Tokened { answer, .. } => answer.is_ack(),
            _ => matches!(self, Answer::Ack(_)),
        }
    }

    /// Whether this is a nack, with tokens or without.
    pub fn is_nack(&self) -> bool {
        match self {
            Answer::Tokened { answer, .. } => answer.is_nack(),
            _ => matches!(self, Answer::Nack { .. }),
        }
    }

    /// The answer as applied, and the ids its tokens name at another attempt than
    /// `held_attempt` gives for the row (an earlier delivery of a row this stream holds
    /// again): those are fenced, never applied. A row the stream does not hold is left
    /// to the table's fence. `None` for the answer when nothing of it is left to apply.
    pub fn split_stale(
        self,
        held_attempt: impl Fn(MessageId) -> Option<u32>,
    ) -> (Option<Answer>, Vec<MessageId>) {
        let Answer::Tokened { answer, attempts } = self else {
            return (Some(self), Vec::new());
        };
        let stale: Vec<MessageId> = attempts
            .iter()
            .filter(|(id, attempt)| held_attempt(*id).is_some_and(|held| held != *attempt))
            .map(|(id, _)| *id)
            .collect();
        if stale.is_empty() {
            return (Some(*answer), stale);
        }
        let keep = |ids: Vec<MessageId>| -> Vec<MessageId> {
            ids.into_iter().filter(|id| !stale.contains(id)).collect()
        };
        let left = match *answer {
            Answer::Ack(ids) => Some(Answer::Ack(keep(ids))),
            Answer::Release { ids, delay } => Some(Answer::Release {
                ids: keep(ids),
                delay,
            }),
            Answer::ExtendLease { ids, lease } => Some(Answer::ExtendLease {
                ids: keep(ids),
                lease,
            }),
            _ => None,
        }
        .filter(|answer| !answer.ids().is_empty());
        (left, stale)
    }

    /// The answer kind metrics count a fenced answer as.
    pub fn kind(&self) -> Option<crate::telemetry::metrics::AnswerKind> {
        use crate::telemetry::metrics::AnswerKind;
        match self {
            Answer::Ack(_) => Some(AnswerKind::Ack),
            Answer::Nack { .. } => Some(AnswerKind::Nack),
            Answer::Release { .. } => Some(AnswerKind::Release),
            Answer::DeadLetter { .. } => Some(AnswerKind::DeadLetter),
            Answer::ExtendLease { .. } => Some(AnswerKind::ExtendLease),
            Answer::SetWindow(_) => None,
            Answer::Tokened { answer, .. } => answer.kind(),
        }
    }

    /// The messages the answer names.
    pub fn ids(&self) -> Vec<MessageId> {
        match self {
            Answer::Ack(ids) | Answer::Release { ids, .. } | Answer::ExtendLease { ids, .. } => {
                ids.clone()
            }
            Answer::Nack { id, .. } | Answer::DeadLetter { id, .. } => vec![*id],
            Answer::SetWindow(_) => Vec::new(),
            Answer::Tokened { answer, .. } => answer.ids(),
        }
    }

    /// About what the answer takes in memory, for the bound of the answer queue.
    pub fn bytes(&self) -> usize {
        let text = match self {
            Answer::Nack { error, .. } | Answer::DeadLetter { error, .. } => error.len(),
            Answer::Tokened { answer, attempts } => return answer.bytes() + 12 * attempts.len(),
            _ => 0,
        };
        64 + text + 8 * self.ids().len()
    }
}

/// An answer refused as sent: nothing was applied, the stream goes on.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Rejection {
    pub ids: Vec<MessageId>,
    pub reason: String,
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
    pub rejected: Option<Rejection>,
}

impl Settlement {
    /// What it settled, as the stream's listing counts it.
    pub fn answered(&self) -> Answered {
        Answered {
            acked: self.acked.len(),
            nacked: self.retried.len() + self.dead_lettered.len(),
            fenced: self.fenced.len(),
        }
    }

    /// Every id the settlement names.
    pub(super) fn ids(&self) -> impl Iterator<Item = MessageId> + '_ {
        [
            &self.acked,
            &self.retried,
            &self.dead_lettered,
            &self.released,
            &self.extended,
            &self.fenced,
        ]
        .into_iter()
        .flatten()
        .chain(self.rejected.iter().flat_map(|r| &r.ids))
        .copied()
    }

    /// Leaves out the ids `unseen` names (rows the subscriber was never sent).
    pub(super) fn strip(&mut self, unseen: impl Fn(MessageId) -> bool) {
        for ids in [
            &mut self.acked,
            &mut self.retried,
            &mut self.dead_lettered,
            &mut self.released,
            &mut self.extended,
            &mut self.fenced,
        ] {
            ids.retain(|id| !unseen(*id));
        }
        if let Some(rejection) = &mut self.rejected {
            rejection.ids.retain(|id| !unseen(*id));
        }
    }

    pub fn rejected(ids: Vec<MessageId>, error: &RelayError) -> Self {
        Self {
            rejected: Some(Rejection {
                ids,
                reason: error.to_string(),
            }),
            ..Self::default()
        }
    }
}

/// What applying answers did, for the loop: one settlement per answer, in answer order,
/// and the changes to the held rows.
#[derive(Debug, Default)]
pub(super) struct Applied {
    pub settlements: Vec<Settlement>,
    /// Ids of the first answer fenced before it ran, their token naming an earlier
    /// delivery: added to its settlement once the held rows are accounted for (the stream
    /// still holds the later delivery).
    pub stale: Vec<MessageId>,
    /// Rows the stream no longer holds: answered, given back, or found fenced.
    pub finished: Vec<MessageId>,
    /// Rows whose lease now runs this long from when the loop takes the outcome.
    pub extended: Option<(Vec<MessageId>, Duration)>,
}

/// Applies acks that arrived back to back in one storage call, and still confirms each
/// answer on its own. Each applied id is credited to the first answer that named it; a
/// repeat is stale (fenced).
pub(super) async fn apply_acks(
    outbox: Arc<Outbox>,
    owner: Arc<str>,
    acks: Vec<Vec<MessageId>>,
) -> RelayResult<Applied> {
    let all: Vec<MessageId> = acks.iter().flatten().copied().collect();
    let (acked, _) = outbox.answers.ack(&owner, &all).await?;
    let mut acked: HashSet<MessageId> = acked.into_iter().collect();
    let settlements = acks
        .into_iter()
        .map(|ids| {
            let (acked, fenced) = ids.into_iter().partition(|id| acked.remove(id));
            Settlement {
                acked,
                fenced,
                ..Settlement::default()
            }
        })
        .collect();
    Ok(Applied {
        settlements,
        finished: all,
        ..Applied::default()
    })
}

/// One nack as the subscriber sent it.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Nack {
    pub id: MessageId,
    pub error: String,
    pub delay: Option<Duration>,
}

/// Applies nacks that arrived back to back in one storage call, and still confirms each
/// on its own. A nack the relay refuses (a NUL in its error) is rejected alone.
pub(super) async fn apply_nacks(
    outbox: Arc<Outbox>,
    owner: Arc<str>,
    nacks: Vec<Nack>,
) -> RelayResult<Applied> {
    let checks: Vec<RelayResult<()>> = nacks
        .iter()
        .map(|nack| limits::text("error", &nack.error))
        .collect();
    let requests: Vec<NackRequest<'_>> = nacks
        .iter()
        .zip(&checks)
        .filter(|(_, check)| check.is_ok())
        .map(|(nack, _)| NackRequest {
            id: nack.id,
            error: &nack.error,
            requested_delay: nack.delay,
        })
        .collect();
    let mut results = if requests.is_empty() {
        Vec::new()
    } else {
        outbox.answers.nack_many(&owner, &requests).await?
    }
    .into_iter();
    let mut applied = Applied::default();
    for (nack, check) in nacks.into_iter().zip(checks) {
        if let Err(error) = check {
            applied
                .settlements
                .push(Settlement::rejected(vec![nack.id], &error));
            continue;
        }
        let result = results.next().expect("one outcome per nack");
        let (settlement, finished) = nack_settlement(nack.id, result);
        applied.settlements.push(settlement);
        applied.finished.extend(finished);
    }
    Ok(applied)
}

/// What a nack did, as the subscriber is told, and the rows it finished.
fn nack_settlement(id: MessageId, result: NackResult) -> (Settlement, Vec<MessageId>) {
    let mut settlement = Settlement::default();
    let mut finished = vec![id];
    match result {
        NackResult::Retried { retry_at, released } => {
            finished.extend(&released);
            settlement.retried = vec![id];
            settlement.released = released;
            settlement.retry_at = Some(retry_at);
        }
        NackResult::DeadLettered { released } => {
            finished.extend(&released);
            settlement.dead_lettered = vec![id];
            settlement.released = released;
        }
        NackResult::Fenced => settlement.fenced = vec![id],
    }
    (settlement, finished)
}

/// Applies an answer on its own, one storage call and one settlement: a release, a
/// dead-letter or a lease extension, what is left once the loop has taken acks and nacks
/// (coalesced) and new windows (its own state). An answer refused as sent (the caller's
/// fault: a delay or lease out of bounds) is rejected alone; other errors end the stream.
/// `default_lease` is the stream's lease, for extensions that ask for none.
pub(super) async fn apply(
    outbox: Arc<Outbox>,
    owner: Arc<str>,
    default_lease: Duration,
    answer: Answer,
) -> RelayResult<Applied> {
    let ids = answer.ids();
    match apply_one(outbox, owner, default_lease, answer).await {
        Err(error) if error.is_callers_fault() => Ok(Applied {
            settlements: vec![Settlement::rejected(ids, &error)],
            ..Applied::default()
        }),
        other => other,
    }
}

async fn apply_one(
    outbox: Arc<Outbox>,
    owner: Arc<str>,
    default_lease: Duration,
    answer: Answer,
) -> RelayResult<Applied> {
    let owner = &*owner;
    let mut settlement = Settlement::default();
    let mut finished = Vec::new();
    let mut extended = None;
    match answer {
        Answer::Release { ids, delay } => {
            let (released, fenced) = outbox.answers.release(owner, &ids, delay).await?;
            finished = ids;
            settlement.released = released;
            settlement.fenced = fenced;
        }
        Answer::DeadLetter { id, error } => {
            let applied = outbox.answers.dead_letter(owner, id, &error).await?;
            finished.push(id);
            if applied {
                settlement.dead_lettered = vec![id];
            } else {
                settlement.fenced = vec![id];
            }
        }
        Answer::ExtendLease { ids, lease } => {
            let lease = if lease.is_zero() {
                default_lease
            } else {
                outbox.claims.lease(lease)?
            };
            let (done, fenced) = outbox.answers.extend_lease(owner, &ids, lease).await?;
            finished.clone_from(&fenced);
            extended = Some((done.ids.to_vec(), lease));
            settlement.extended = done.ids.into_vec();
            settlement.lease_expires_at = Some(done.lease_expires_at);
            settlement.fenced = fenced;
        }
        other => unreachable!("the loop applies {other:?} itself"),
    }
    Ok(Applied {
        settlements: vec![settlement],
        finished,
        extended,
        ..Applied::default()
    })
}

pub(super) fn check_window(window: u32) -> RelayResult<()> {
    if window > MAX_WINDOW {
        return Err(RelayError::InvalidArgument(format!(
            "set_window max_in_flight = {window}: must be within 0..={MAX_WINDOW}"
        )));
    }
    Ok(())
}
