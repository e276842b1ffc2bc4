//! The operator's side of dead letters (`Admin.ListDeadLetters`, `CountDeadLetters`,
//! `RedriveDeadLetters`, `DiscardDeadLetters`): the selector and page size checked as
//! every caller's input is, then one storage call. Every call touches at most
//! [`dead::MAX_PER_CALL`] rows, so an operator's command never holds a long transaction;
//! repeating it goes further, and a repeat of one that applied finds nothing left to do.

use std::time::Duration;

use super::{limits, Admin, RelayError, RelayResult};
use crate::config::MAX_DURATION;
use crate::storage::dead;
use crate::storage::{DeadCounts, DeadFilter, DeadLetter, MessageId};

/// Rows per call when the caller does not say.
pub const DEFAULT_LIMIT: u32 = 100;

/// What a re-drive or discard did (or, dry, would do).
#[derive(Debug, Clone, PartialEq)]
pub struct DeadAction {
    /// The rows, in id order.
    pub ids: Vec<MessageId>,
    /// More dead rows match the selector than this call took.
    pub more: bool,
}

/// `limit` as a count of rows (of any operator's page): 0 means [`DEFAULT_LIMIT`]; above [`dead::MAX_PER_CALL`] is
/// refused, so a caller never believes it acted on more rows than it did.
pub fn limit(limit: u32) -> RelayResult<u32> {
    match limit {
        0 => Ok(DEFAULT_LIMIT),
        n if n > dead::MAX_PER_CALL => Err(RelayError::InvalidArgument(format!(
            "limit {n} is above {}; repeat the call to go further",
            dead::MAX_PER_CALL
        ))),
        n => Ok(n),
    }
}

/// The selector's strings and ids within what every caller may send.
fn check(filter: &DeadFilter) -> RelayResult<()> {
    if filter.ids.len() > dead::MAX_PER_CALL as usize {
        return Err(RelayError::InvalidArgument(format!(
            "{} ids in one selector; at most {}",
            filter.ids.len(),
            dead::MAX_PER_CALL
        )));
    }
    if let Some(topic) = &filter.topic {
        limits::topic(topic)?;
    }
    if let Some(key) = &filter.key {
        limits::key(key)?;
    }
    if let Some(text) = &filter.error_contains {
        limits::text("error_contains", text)?;
        if text.is_empty() {
            return Err(RelayError::InvalidArgument(
                "error_contains is empty; leave it out to select every error".to_owned(),
            ));
        }
    }
    if let (Some(after), Some(before)) = (filter.died_after, filter.died_before) {
        if after >= before {
            return Err(RelayError::InvalidArgument(format!(
                "died_after ({after}) is not before died_before ({before}): nothing can match"
            )));
        }
    }
    Ok(())
}

impl Admin {
    pub async fn list_dead(
        &self,
        filter: &DeadFilter,
        after_id: MessageId,
        page: u32,
    ) -> RelayResult<Vec<DeadLetter>> {
        check(filter)?;
        Ok(self
            .storage
            .list_dead(filter, after_id, limit(page)?)
            .await?)
    }

    pub async fn count_dead(&self, filter: &DeadFilter) -> RelayResult<DeadCounts> {
        check(filter)?;
        Ok(self.storage.count_dead(filter).await?)
    }

    /// Re-drives (with `dry_run`, only lists) the first `limit` selected dead rows.
    pub async fn redrive_dead(
        &self,
        filter: &DeadFilter,
        limit: u32,
        delay: Duration,
        dry_run: bool,
    ) -> RelayResult<DeadAction> {
        check(filter)?;
        if delay > MAX_DURATION {
            return Err(RelayError::InvalidArgument(format!(
                "delay of {} is longer than {}",
                humantime::format_duration(delay),
                humantime::format_duration(MAX_DURATION)
            )));
        }
        let limit = self::limit(limit)?;
        if dry_run {
            return self.would_take(filter, limit).await;
        }
        let ids = self.storage.redrive_dead(filter, limit, delay).await?;
        tracing::info!(outbox = %self.name, rows = ids.len(), "re-drove dead letters");
        self.acted(filter, ids.into_vec()).await
    }

    /// Deletes (with `dry_run`, only lists) the first `limit` selected dead rows.
    pub async fn discard_dead(
        &self,
        filter: &DeadFilter,
        limit: u32,
        dry_run: bool,
    ) -> RelayResult<DeadAction> {
        check(filter)?;
        let limit = self::limit(limit)?;
        if dry_run {
            return self.would_take(filter, limit).await;
        }
        let ids = self.storage.discard_dead(filter, limit).await?;
        tracing::info!(outbox = %self.name, rows = ids.len(), "discarded dead letters");
        self.acted(filter, ids.into_vec()).await
    }

    /// The rows an action of `limit` would take: the first page, and whether there is more.
    async fn would_take(&self, filter: &DeadFilter, limit: u32) -> RelayResult<DeadAction> {
        let mut rows = self.storage.list_dead(filter, 0, limit + 1).await?;
        let more = rows.len() > limit as usize;
        rows.truncate(limit as usize);
        Ok(DeadAction {
            ids: rows.into_iter().map(|row| row.message.id).collect(),
            more,
        })
    }

    /// After an action: whether selected dead rows remain (the ones it took are gone).
    async fn acted(&self, filter: &DeadFilter, ids: Vec<MessageId>) -> RelayResult<DeadAction> {
        let more = !self.storage.list_dead(filter, 0, 1).await?.is_empty();
        Ok(DeadAction { ids, more })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_default_and_refuse_what_a_call_would_not_do() {
        assert_eq!(limit(0).unwrap(), DEFAULT_LIMIT);
        assert_eq!(limit(7).unwrap(), 7);
        let err = limit(dead::MAX_PER_CALL + 1).unwrap_err().to_string();
        assert!(err.contains("repeat the call"), "{err}");
    }

    #[test]
    fn selectors_are_checked_like_every_callers_input() {
        assert!(check(&DeadFilter::default()).is_ok());
        let empty = DeadFilter {
            error_contains: Some(String::new()),
            ..DeadFilter::default()
        };
        assert!(check(&empty).is_err());
        let nul = DeadFilter {
            key: Some("a\0b".into()),
            ..DeadFilter::default()
        };
        assert!(check(&nul).is_err());
        let now = chrono::Utc::now();
        let backwards = DeadFilter {
            died_after: Some(now),
            died_before: Some(now - chrono::Duration::seconds(1)),
            ..DeadFilter::default()
        };
        assert!(check(&backwards)
            .unwrap_err()
            .to_string()
            .contains("died_after"));
        let many = DeadFilter {
            ids: vec![1; dead::MAX_PER_CALL as usize + 1],
            ..DeadFilter::default()
        };
        assert!(check(&many).is_err());
    }
}
