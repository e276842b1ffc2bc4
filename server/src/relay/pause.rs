//! Pause and resume of an outbox (`Admin.Pause`, `Admin.Resume`): while paused no claim
//! hands out rows, on any replica: streams stay open and their answers are still applied,
//! unary claims come back empty saying why. The pause is held in the database (see
//! [`Storage::paused_since`](crate::storage::Storage::paused_since)), so every replica
//! obeys it and it survives restarts; health stays SERVING, since paused is not broken.
//!
//! Each replica reads the pause at most once per [`PAUSE_REFRESH`] per outbox, on the
//! claim path: one small query a second, not one per claim. A pause made through this
//! replica applies at once; one made through another within [`PAUSE_REFRESH`].

use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::time::Instant;

use super::{Outbox, RelayResult};

/// How stale a replica's view of the pause may be.
pub const PAUSE_REFRESH: Duration = Duration::from_secs(1);

/// The pause as this replica last read it.
#[derive(Debug, Default)]
pub struct PauseView {
    state: Mutex<Option<Seen>>,
}

#[derive(Debug, Clone, Copy)]
struct Seen {
    at: Instant,
    since: Option<DateTime<Utc>>,
}

impl PauseView {
    fn fresh(&self) -> Option<Option<DateTime<Utc>>> {
        let seen = (*self.state.lock().unwrap())?;
        (seen.at.elapsed() < PAUSE_REFRESH).then_some(seen.since)
    }

    fn remember(&self, since: Option<DateTime<Utc>>) {
        *self.state.lock().unwrap() = Some(Seen {
            at: Instant::now(),
            since,
        });
    }

    /// The last value read, however old.
    fn last(&self) -> Option<DateTime<Utc>> {
        self.state.lock().unwrap().and_then(|seen| seen.since)
    }
}

impl Outbox {
    /// When the outbox was paused, if it is, as this replica sees it (at most
    /// [`PAUSE_REFRESH`] old). A database that cannot be read keeps the last view: the
    /// claim that follows meets the same database and reports the outage itself.
    pub async fn paused_since(&self) -> Option<DateTime<Utc>> {
        if let Some(since) = self.pause.fresh() {
            return since;
        }
        match self.storage.paused_since().await {
            Ok(since) => {
                self.pause.remember(since);
                since
            }
            Err(error) => {
                tracing::debug!(outbox = %self.name, %error, "could not read the pause; keeping the last view");
                let last = self.pause.last();
                self.pause.remember(last);
                last
            }
        }
    }

    /// The pause as the database holds it now (for admin output).
    pub async fn paused_since_now(&self) -> RelayResult<Option<DateTime<Utc>>> {
        let since = self.storage.paused_since().await?;
        self.pause.remember(since);
        Ok(since)
    }

    /// Pauses or resumes the outbox on every replica; returns the state after.
    pub async fn set_paused(&self, paused: bool) -> RelayResult<Option<DateTime<Utc>>> {
        let since = self.storage.set_paused(paused).await?;
        self.pause.remember(since);
        tracing::info!(outbox = %self.name, paused = since.is_some(), "pause changed");
        Ok(since)
    }
}
