//! Nacks: what one asks for ([`NackRequest`]), what it did ([`NackResult`]), and what each
//! nack of a batch does, decided once, before any of it is written ([`plan_nacks`]): for a
//! backend that applies a whole batch in one statement and must give the outcomes that
//! nacks sent one by one would have had.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{FailureDecision, MessageId, RetryPolicy};

/// One nack of a batch handed to [`Storage::nack_many`](super::Storage::nack_many).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NackRequest<'a> {
    pub id: MessageId,
    pub error: &'a str,
    pub requested_delay: Option<Duration>,
}

/// What a nack did.
#[derive(Debug, Clone, PartialEq)]
pub enum NackResult {
    /// Retry scheduled; `released` are the later rows of the same key the owner held,
    /// given back untried with the same retry time.
    Retried {
        retry_at: DateTime<Utc>,
        released: Vec<MessageId>,
    },
    /// The row used its last attempt and is dead-lettered; `released` as above, claimable now.
    DeadLettered { released: Vec<MessageId> },
    /// The owner does not hold the row: nothing changed.
    Fenced,
}

impl NackResult {
    /// What an applied nack did: per `decision`, retried at `at` or dead-lettered, with
    /// the later rows of its key it gave back.
    pub fn applied(decision: FailureDecision, at: DateTime<Utc>, released: Vec<MessageId>) -> Self {
        match decision {
            FailureDecision::RetryAfter(_) => Self::Retried {
                retry_at: at,
                released,
            },
            FailureDecision::DeadLetter => Self::DeadLettered { released },
        }
    }
}

/// A row a batch names, as the backend read it: held by the nacking owner, lease live.
#[derive(Debug, Clone, PartialEq)]
pub struct HeldRow {
    pub attempts: u32,
    pub key: Option<String>,
}

/// One decision per nack, in order: `None` when the nack is fenced, else what the policy
/// decided for the row's attempts. A nack is fenced when its row is not held, when an
/// earlier nack of the batch named the same row, or when an earlier nack of the batch
/// named an earlier row of the same key: that one gives this row back untried, after which
/// it is no longer held.
pub fn plan_nacks(
    nacks: &[NackRequest<'_>],
    held: &HashMap<MessageId, HeldRow>,
    policy: &dyn RetryPolicy,
) -> Vec<Option<FailureDecision>> {
    let mut nacked: HashSet<MessageId> = HashSet::new();
    // Per key, the lowest id nacked so far: it gives back every later row of its key.
    let mut lowest: HashMap<&str, MessageId> = HashMap::new();
    nacks
        .iter()
        .map(|nack| {
            let row = held.get(&nack.id)?;
            if !nacked.insert(nack.id) {
                return None;
            }
            if let Some(key) = row.key.as_deref() {
                let first = lowest.entry(key).or_insert(nack.id);
                if *first < nack.id {
                    return None;
                }
                *first = nack.id;
            }
            Some(policy.on_failure(row.attempts, nack.requested_delay))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    struct RetryTwice;

    impl RetryPolicy for RetryTwice {
        fn on_failure(&self, attempts: u32, delay: Option<Duration>) -> FailureDecision {
            if attempts >= 2 {
                FailureDecision::DeadLetter
            } else {
                FailureDecision::RetryAfter(delay.unwrap_or(Duration::from_secs(1)))
            }
        }
    }

    fn nack(id: MessageId) -> NackRequest<'static> {
        NackRequest {
            id,
            error: "e",
            requested_delay: None,
        }
    }

    fn held(rows: &[(MessageId, u32, Option<&str>)]) -> HashMap<MessageId, HeldRow> {
        rows.iter()
            .map(|(id, attempts, key)| {
                let row = HeldRow {
                    attempts: *attempts,
                    key: key.map(str::to_owned),
                };
                (*id, row)
            })
            .collect()
    }

    const RETRY: Option<FailureDecision> =
        Some(FailureDecision::RetryAfter(Duration::from_secs(1)));

    #[test]
    fn rows_not_held_and_repeated_ids_are_fenced() {
        let held = held(&[(1, 1, None)]);
        let plan = plan_nacks(&[nack(1), nack(2), nack(1)], &held, &RetryTwice);
        assert_eq!(plan, [RETRY, None, None]);
    }

    #[test]
    fn the_policy_decides_from_the_attempts_read() {
        let held = held(&[(1, 1, None), (2, 2, None)]);
        let plan = plan_nacks(&[nack(1), nack(2)], &held, &RetryTwice);
        assert_eq!(plan, [RETRY, Some(FailureDecision::DeadLetter)]);
    }

    #[test]
    fn a_later_row_of_a_key_already_nacked_was_given_back() {
        let held = held(&[(1, 1, Some("k")), (2, 1, Some("k")), (3, 1, Some("j"))]);
        let plan = plan_nacks(&[nack(1), nack(2), nack(3)], &held, &RetryTwice);
        assert_eq!(plan, [RETRY, None, RETRY]);
    }

    #[test]
    fn an_earlier_row_of_a_key_nacked_after_a_later_one_still_applies() {
        let held = held(&[(1, 1, Some("k")), (2, 1, Some("k")), (3, 1, Some("k"))]);
        let plan = plan_nacks(&[nack(2), nack(1), nack(3)], &held, &RetryTwice);
        assert_eq!(plan, [RETRY, RETRY, None]);
    }
}
