//! The relay core: the configured outboxes, the rules around every storage call
//! (argument limits, lease bounds, retry policy, oversized rows), and the subscription
//! loop that claims on behalf of a streaming subscriber within its window.
//!
//! Nothing here knows about protobuf: the gRPC layer translates to and from these types.

pub mod backoff;
pub mod drain;
#[cfg(test)]
mod fake;
pub mod idle;
pub mod poller;
pub mod subscription;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::config::{OutboxConfig, MAX_WINDOW};
use crate::storage::{
    ClaimRequest, Claimed, Extended, MessageId, NackResult, Stats, Storage, StorageError,
};
use backoff::Backoff;
use idle::{IdlePolls, PollGroup};

/// Longest error text stored with a row; longer texts are cut (on a char boundary).
const MAX_ERROR_BYTES: usize = 8 * 1024;
/// Most ids in one answer.
const MAX_IDS: usize = MAX_WINDOW as usize;
/// Most topics in one filter.
const MAX_TOPICS: usize = 100;
/// Longest worker id or subscriber name.
const MAX_NAME_BYTES: usize = 200;

/// Errors of the relay layer; [`crate::grpc::status`] maps them to gRPC codes.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("outbox `{name}` is not configured; configured: {}", configured.join(", "))]
    UnknownOutbox {
        name: String,
        configured: Vec<String>,
    },
    #[error("{0}")]
    InvalidArgument(String),
    #[error("the server is shutting down; reconnect to another replica or retry shortly")]
    ShuttingDown,
    #[error(transparent)]
    Storage(#[from] StorageError),
}

pub type RelayResult<T> = Result<T, RelayError>;

/// All configured outboxes by name.
pub struct Relay {
    outboxes: BTreeMap<String, Arc<Outbox>>,
}

impl Relay {
    pub fn new(outboxes: impl IntoIterator<Item = Arc<Outbox>>) -> Self {
        Self {
            outboxes: outboxes.into_iter().map(|o| (o.name.clone(), o)).collect(),
        }
    }

    pub fn outbox(&self, name: &str) -> RelayResult<&Arc<Outbox>> {
        self.outboxes
            .get(name)
            .ok_or_else(|| RelayError::UnknownOutbox {
                name: name.to_owned(),
                configured: self.outboxes.keys().cloned().collect(),
            })
    }

    pub fn outboxes(&self) -> impl Iterator<Item = &Arc<Outbox>> {
        self.outboxes.values()
    }
}

/// One outbox table with its settings and retry policy.
pub struct Outbox {
    pub name: String,
    pub config: OutboxConfig,
    storage: Arc<dyn Storage>,
    backoff: Backoff,
    /// Bumped by the storage's insert listener; subscriptions claim when it changes.
    insert_signal: Option<watch::Receiver<u64>>,
    /// One idle-polling schedule per topic filter, shared by the outbox's streams.
    idle_polls: IdlePolls,
    max_message_bytes: usize,
    /// Answers about rows the caller no longer held: ignored, counted here.
    fenced: AtomicU64,
}

impl Outbox {
    pub fn new(
        name: String,
        config: OutboxConfig,
        storage: Arc<dyn Storage>,
        max_message_bytes: usize,
    ) -> Self {
        let backoff = Backoff::new(config.backoff, config.max_attempts);
        let insert_signal = storage.insert_signal();
        let idle_polls = IdlePolls::new(config.poll);
        Self {
            name,
            config,
            storage,
            backoff,
            insert_signal,
            idle_polls,
            max_message_bytes,
            fenced: AtomicU64::new(0),
        }
    }

    pub fn storage(&self) -> &Arc<dyn Storage> {
        &self.storage
    }

    pub fn insert_signal(&self) -> Option<watch::Receiver<u64>> {
        self.insert_signal.clone()
    }

    /// The idle-polling group of the streams filtering on `topics` (see [`idle`]).
    pub fn idle_poll(&self, topics: &[String]) -> Arc<PollGroup> {
        self.idle_polls.join(topics)
    }

    /// Stale answers ignored so far.
    pub fn fenced_count(&self) -> u64 {
        self.fenced.load(Ordering::Relaxed)
    }

    fn count_fenced(&self, n: usize) {
        if n > 0 {
            self.fenced.fetch_add(n as u64, Ordering::Relaxed);
            tracing::debug!(outbox = %self.name, fenced = n, "stale answers ignored");
        }
    }

    /// The lease to use: `requested` (zero means the outbox default), within `max_lease`.
    pub fn lease(&self, requested: Duration) -> RelayResult<Duration> {
        if requested.is_zero() {
            return Ok(self.config.lease);
        }
        if requested > self.config.max_lease {
            return Err(RelayError::InvalidArgument(format!(
                "lease of {} exceeds the outbox's max_lease of {}; ask for less or raise outboxes.{}.max_lease",
                humantime::format_duration(requested),
                humantime::format_duration(self.config.max_lease),
                self.name
            )));
        }
        if requested < Duration::from_millis(100) {
            return Err(RelayError::InvalidArgument(format!(
                "lease of {}ms is too short; ask for at least 100ms",
                requested.as_millis()
            )));
        }
        Ok(requested)
    }

    /// Claims up to `batch_size` rows for `owner`. Rows too large to send are
    /// dead-lettered with an error saying so, and left out.
    pub async fn claim(
        &self,
        owner: &str,
        batch_size: u32,
        lease: Duration,
        topics: &[String],
    ) -> RelayResult<Claimed> {
        validate_name("worker_id", owner)?;
        validate_topics(topics)?;
        if batch_size == 0 || batch_size > MAX_WINDOW {
            return Err(RelayError::InvalidArgument(format!(
                "batch_size = {batch_size}: must be within 1..={MAX_WINDOW}"
            )));
        }
        let batch_size = batch_size.min(self.config.max_batch_size);
        let request = ClaimRequest {
            owner,
            batch_size,
            lease,
            topics,
            max_attempts: self.config.max_attempts,
        };
        let mut claimed = self.storage.claim(request).await?;
        if claimed
            .messages
            .iter()
            .any(|m| self.oversized(m.payload.len()))
        {
            let (fit, oversized): (Vec<_>, Vec<_>) = claimed
                .messages
                .into_iter()
                .partition(|m| !self.oversized(m.payload.len()));
            for message in oversized {
                let error = format!(
                    "payload of {} bytes exceeds server.max_message_bytes ({}); raise it or shrink the message",
                    message.payload.len(),
                    self.max_message_bytes
                );
                tracing::error!(outbox = %self.name, id = message.id, %error, "dead-lettering oversized row");
                self.storage.dead_letter(message.id, owner, &error).await?;
            }
            claimed.messages = fit;
        }
        Ok(claimed)
    }

    fn oversized(&self, payload_bytes: usize) -> bool {
        payload_bytes > self.max_message_bytes
    }

    /// Returns (acked, fenced).
    pub async fn ack(
        &self,
        owner: &str,
        ids: &[MessageId],
    ) -> RelayResult<(Vec<MessageId>, Vec<MessageId>)> {
        validate_name("worker_id", owner)?;
        validate_ids(ids)?;
        if ids.is_empty() {
            return Ok((Vec::new(), Vec::new()));
        }
        let applied = self.storage.ack(ids, owner).await?;
        Ok(self.split_fenced(ids, applied))
    }

    pub async fn nack(
        &self,
        owner: &str,
        id: MessageId,
        error: &str,
        requested_delay: Option<Duration>,
    ) -> RelayResult<NackResult> {
        validate_name("worker_id", owner)?;
        let error = truncate(error, MAX_ERROR_BYTES);
        let result = self
            .storage
            .nack(id, owner, error, requested_delay, &self.backoff)
            .await?;
        if result == NackResult::Fenced {
            self.count_fenced(1);
        }
        Ok(result)
    }

    /// Returns (released, fenced).
    pub async fn release(
        &self,
        owner: &str,
        ids: &[MessageId],
        delay: Duration,
    ) -> RelayResult<(Vec<MessageId>, Vec<MessageId>)> {
        validate_name("worker_id", owner)?;
        validate_ids(ids)?;
        if delay > self.config.backoff.maximum {
            return Err(RelayError::InvalidArgument(format!(
                "retry delay of {} exceeds the outbox's backoff.maximum of {}",
                humantime::format_duration(delay),
                humantime::format_duration(self.config.backoff.maximum)
            )));
        }
        if ids.is_empty() {
            return Ok((Vec::new(), Vec::new()));
        }
        let applied = self.storage.release(ids, owner, delay).await?;
        Ok(self.split_fenced(ids, applied))
    }

    /// True when dead-lettered, false when fenced.
    pub async fn dead_letter(&self, owner: &str, id: MessageId, error: &str) -> RelayResult<bool> {
        validate_name("worker_id", owner)?;
        let applied = self
            .storage
            .dead_letter(id, owner, truncate(error, MAX_ERROR_BYTES))
            .await?;
        if !applied {
            self.count_fenced(1);
        }
        Ok(applied)
    }

    /// Returns the extension and the fenced ids.
    pub async fn extend_lease(
        &self,
        owner: &str,
        ids: &[MessageId],
        lease: Duration,
    ) -> RelayResult<(Extended, Vec<MessageId>)> {
        validate_name("worker_id", owner)?;
        validate_ids(ids)?;
        let extended = self.storage.extend_lease(ids, owner, lease).await?;
        let (_, fenced) = self.split_fenced(ids, extended.ids.clone());
        Ok((extended, fenced))
    }

    /// Gives back the leases of a subscriber that went away; attempts stay counted.
    pub async fn return_leases(&self, owner: &str, ids: &[MessageId]) -> RelayResult<u64> {
        if ids.is_empty() {
            return Ok(0);
        }
        Ok(self.storage.return_leases(ids, owner).await?)
    }

    pub async fn stats(&self) -> RelayResult<Stats> {
        Ok(self.storage.stats().await?)
    }

    pub async fn purge(&self, older_than: Duration) -> RelayResult<u64> {
        if older_than.is_zero() {
            return Err(RelayError::InvalidArgument(
                "older_than must be positive, for example 7 days".to_owned(),
            ));
        }
        Ok(self.storage.purge(older_than).await?)
    }

    /// Splits the requested ids into (applied, fenced), counting the fenced ones.
    fn split_fenced(
        &self,
        requested: &[MessageId],
        applied: Vec<MessageId>,
    ) -> (Vec<MessageId>, Vec<MessageId>) {
        let fenced: Vec<MessageId> = requested
            .iter()
            .copied()
            .filter(|id| !applied.contains(id))
            .collect();
        self.count_fenced(fenced.len());
        (applied, fenced)
    }
}

fn validate_name(field: &str, value: &str) -> RelayResult<()> {
    if value.is_empty() {
        return Err(RelayError::InvalidArgument(format!(
            "{field} must not be empty"
        )));
    }
    if value.len() > MAX_NAME_BYTES {
        return Err(RelayError::InvalidArgument(format!(
            "{field} is {} bytes long; at most {MAX_NAME_BYTES}",
            value.len()
        )));
    }
    Ok(())
}

fn validate_ids(ids: &[MessageId]) -> RelayResult<()> {
    if ids.len() > MAX_IDS {
        return Err(RelayError::InvalidArgument(format!(
            "{} ids in one call; at most {MAX_IDS}",
            ids.len()
        )));
    }
    Ok(())
}

pub fn validate_topics(topics: &[String]) -> RelayResult<()> {
    if topics.len() > MAX_TOPICS {
        return Err(RelayError::InvalidArgument(format!(
            "{} topics in the filter; at most {MAX_TOPICS}",
            topics.len()
        )));
    }
    if topics.iter().any(String::is_empty) {
        return Err(RelayError::InvalidArgument(
            "the topic filter holds an empty topic; leave the filter empty to receive every topic"
                .to_owned(),
        ));
    }
    Ok(())
}

pub fn validate_subscriber(name: &str) -> RelayResult<()> {
    validate_name("subscriber", name)
}

fn truncate(text: &str, max_bytes: usize) -> &str {
    if text.len() <= max_bytes {
        return text;
    }
    let mut end = max_bytes;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::truncate;

    #[test]
    fn truncate_respects_char_boundaries() {
        assert_eq!(truncate("héllo", 2), "h");
        assert_eq!(truncate("héllo", 3), "hé");
        assert_eq!(truncate("abc", 10), "abc");
    }
}
