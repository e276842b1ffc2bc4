//! The operator's side of one outbox (`txoutbox.v1.Admin`): depth and lag, housekeeping,
//! rows inserted for demos and tests, pauses, dead letters (`dead_letters.rs`), blocked
//! keys (`blocked.rs`) and subscribers (`subscribers.rs`).

use std::sync::Arc;
use std::time::Duration;

use super::pause::{self, PauseView};
use super::subscribers::Subscribers;
use super::{limits, RelayError, RelayResult};
use crate::storage::groups::GroupStore;
use crate::storage::{MessageId, NewMessage, Pauses, Stats, Storage};

/// What an operator does with one outbox.
pub struct Admin {
    pub(super) name: String,
    pub(super) storage: Arc<dyn Storage>,
    /// The pause as this replica last read it, shared with the claims.
    pause: Arc<PauseView>,
    /// The streams of this outbox connected to this replica.
    pub(super) subscribers: Arc<Subscribers>,
    /// The outbox's groups' state, when it declares groups: their pauses are shown too.
    pub(super) groups: Option<Arc<dyn GroupStore>>,
}

impl Admin {
    pub(super) fn new(
        name: &str,
        storage: &Arc<dyn Storage>,
        pause: &Arc<PauseView>,
        subscribers: &Arc<Subscribers>,
    ) -> Self {
        Self {
            name: name.to_owned(),
            storage: Arc::clone(storage),
            pause: Arc::clone(pause),
            subscribers: Arc::clone(subscribers),
            groups: None,
        }
    }

    /// Inserts a row through the relay (`Admin.InsertMessage`: demos and tests), its
    /// strings checked as every caller's are.
    pub async fn insert(&self, message: NewMessage) -> RelayResult<MessageId> {
        limits::topic(&message.topic)?;
        if let Some(key) = &message.key {
            limits::key(key)?;
        }
        limits::headers(&message.headers)?;
        Ok(self.storage.insert(message).await?)
    }

    pub async fn stats(&self) -> RelayResult<Stats> {
        Ok(self.storage.stats().await?)
    }

    /// Rows delivered in the last minute by every replica (see
    /// [`Storage::delivered_within`]).
    pub async fn delivered_last_minute(&self) -> RelayResult<Option<u64>> {
        Ok(self
            .storage
            .delivered_within(Duration::from_secs(60))
            .await?)
    }

    pub async fn purge(&self, older_than: Duration) -> RelayResult<u64> {
        if older_than.is_zero() {
            return Err(RelayError::InvalidArgument(
                "older_than must be positive, for example 7 days".to_owned(),
            ));
        }
        Ok(self.storage.purge(older_than).await?)
    }

    /// The pauses as the database holds them now (for admin output).
    pub async fn pauses_now(&self) -> RelayResult<Pauses> {
        let pauses = pause::current(&*self.storage, self.groups.as_deref()).await?;
        self.pause.remember(pauses.clone());
        Ok(pauses)
    }

    /// Pauses or resumes `topics` (empty: the whole outbox) on every replica; returns the
    /// state after.
    pub async fn set_paused(&self, topics: &[String], paused: bool) -> RelayResult<Pauses> {
        limits::topics(topics)?;
        let mut pauses = self.storage.set_paused(topics, paused).await?;
        if let Some(groups) = &self.groups {
            pauses.groups = groups.paused().await?;
        }
        self.pause.remember(pauses.clone());
        tracing::info!(outbox = %self.name, ?topics, paused, "pause changed");
        Ok(pauses)
    }
}
