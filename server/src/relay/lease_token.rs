//! Lease tokens: the name of one delivery (row, attempt, lease holder) that every message
//! carries and every answer may send back, so an answer applies to that delivery only.
//! The rules, and why a token needs no signature, are in docs/lease-tokens.md: the relay
//! never takes an identity from a token, it compares the token's holder with the one it
//! builds from the answering caller.

use super::{RelayError, RelayResult};
use crate::storage::MessageId;

const VERSION: &str = "v1";

/// One delivery, as a token names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseToken {
    pub id: MessageId,
    pub attempt: u32,
    pub holder: String,
}

impl LeaseToken {
    /// `v1.ID.ATTEMPT.HOLDER`: the holder last, so that whatever it holds (dots
    /// included) reads back. Opaque by contract: clients pass it back, never build one.
    pub fn encode(&self) -> String {
        format!("{VERSION}.{}.{}.{}", self.id, self.attempt, self.holder)
    }

    /// The delivery `token` names, or what is wrong with it.
    pub fn decode(token: &str) -> Result<Self, String> {
        let malformed = || {
            format!(
                "lease token {:?} is not one the relay handed out; send back a message's \
                 `lease_token` unchanged",
                crate::relay::limits::echo(token)
            )
        };
        let mut parts = token.splitn(4, '.');
        let (Some(VERSION), Some(id), Some(attempt), Some(holder)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(malformed());
        };
        let holder = holder.to_owned();
        Ok(Self {
            id: id.parse().map_err(|_| malformed())?,
            attempt: attempt.parse().map_err(|_| malformed())?,
            holder,
        })
    }
}

/// The lease holder written for `worker` (a unary `worker_id`, or a stream's own name)
/// called by `identity`: namespaced, so that no identity reaches another's leases by
/// naming its workers. Without identities (every caller allowed) the name is kept.
pub fn holder(identity: Option<&str>, worker: &str) -> String {
    match identity {
        Some(identity) => format!("{identity}/{worker}"),
        None => worker.to_owned(),
    }
}

/// The ids of an answer, from its `ids` and `lease_tokens`: one token per id in the same
/// order, or tokens alone. Returns the ids and, when tokens came, the deliveries.
pub fn answer_ids(
    ids: &[MessageId],
    tokens: &[String],
) -> Result<(Vec<MessageId>, Option<Vec<LeaseToken>>), String> {
    if tokens.is_empty() {
        return Ok((ids.to_vec(), None));
    }
    let decoded = tokens
        .iter()
        .map(|token| LeaseToken::decode(token))
        .collect::<Result<Vec<_>, _>>()?;
    if !ids.is_empty() {
        if ids.len() != decoded.len() {
            return Err(format!(
                "{} ids and {} lease_tokens: send one token per id, in the same order, or \
                 tokens alone",
                ids.len(),
                decoded.len()
            ));
        }
        if let Some((id, token)) = ids.iter().zip(&decoded).find(|(id, t)| **id != t.id) {
            return Err(format!(
                "id {id} was sent with the lease token of id {}: send one token per id, \
                 in the same order",
                token.id
            ));
        }
    }
    Ok((decoded.iter().map(|t| t.id).collect(), Some(decoded)))
}

/// [`answer_ids`] on an outbox that requires tokens when `required` names it (its
/// `require_lease_tokens`): ids sent without their tokens are refused.
pub fn checked_answer_ids(
    ids: &[MessageId],
    tokens: &[String],
    required: Option<&str>,
) -> RelayResult<(Vec<MessageId>, Option<Vec<LeaseToken>>)> {
    let (ids, tokens) = answer_ids(ids, tokens).map_err(RelayError::InvalidArgument)?;
    match (&tokens, required) {
        (None, Some(outbox)) if !ids.is_empty() => Err(RelayError::InvalidArgument(format!(
            "outbox `{outbox}` requires lease tokens (outboxes.{outbox}.require_lease_tokens): \
             send each message's lease_token back with its answer"
        ))),
        _ => Ok((ids, tokens)),
    }
}

/// The `ids` and `lease_tokens` of a one-message answer (nack, dead-letter), which sends
/// its id, its token, or both.
pub fn one(id: MessageId, token: &str) -> (Vec<MessageId>, Vec<String>) {
    match token.is_empty() {
        true => (vec![id], Vec::new()),
        false if id == 0 => (Vec::new(), vec![token.to_owned()]),
        false => (vec![id], vec![token.to_owned()]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(id: MessageId, attempt: u32, holder: &str) -> LeaseToken {
        LeaseToken {
            id,
            attempt,
            holder: holder.to_owned(),
        }
    }

    #[test]
    fn tokens_round_trip_whatever_the_holder_holds() {
        for holder in ["ops/w", "a.b/c.d:e", "ünï/🦀", ""] {
            let t = token(42, 3, holder);
            assert_eq!(LeaseToken::decode(&t.encode()), Ok(t));
        }
        assert!(token(1, 1, "a/w").encode().starts_with("v1.1.1."));
    }

    #[test]
    fn malformed_tokens_are_refused_saying_what_to_send() {
        for bad in [
            "",
            "v1",
            "v1.1.1",
            "v2.1.1.a/w",
            "v1.x.1.a/w",
            "v1.1.-1.a/w",
        ] {
            let err = LeaseToken::decode(bad).unwrap_err();
            assert!(err.contains("lease_token"), "{bad}: {err}");
        }
    }

    #[test]
    fn holders_are_namespaced_by_identity() {
        assert_eq!(holder(Some("billing"), "w1"), "billing/w1");
        assert_eq!(holder(None, "w1"), "w1");
    }

    #[test]
    fn answers_give_one_token_per_id_or_tokens_alone() {
        let tokens = vec![token(1, 1, "a/w").encode(), token(2, 1, "a/w").encode()];
        assert_eq!(answer_ids(&[1, 2], &[]).unwrap(), (vec![1, 2], None));
        let (ids, decoded) = answer_ids(&[], &tokens).unwrap();
        assert_eq!((ids, decoded.unwrap().len()), (vec![1, 2], 2));
        assert!(answer_ids(&[1, 2], &tokens).is_ok());
        assert!(answer_ids(&[2, 1], &tokens)
            .unwrap_err()
            .contains("same order"));
        assert!(answer_ids(&[1], &tokens)
            .unwrap_err()
            .contains("1 ids and 2"));
    }
}
