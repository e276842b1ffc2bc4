//! Pause and resume of an outbox, or of some of its topics (`Admin.Pause`,
//! `Admin.Resume`): while paused no claim hands out rows of what is paused, on any
//! replica: streams stay open and their answers are still applied, unary claims come back
//! empty saying why. The pauses are held in the database (see
//! [`Storage::pauses`](crate::storage::Storage::pauses)), so every replica obeys them and
//! they survive restarts; health stays SERVING, since paused is not broken.
//!
//! Each replica reads the pauses at most once per [`PAUSE_REFRESH`] per outbox, on the
//! claim path: one small query a second, not one per claim. A pause made through this
//! replica applies at once; one made through another within [`PAUSE_REFRESH`].

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::groups::no_groups_argument;
use super::{Outbox, RelayResult};
use crate::storage::groups::GroupStore;
use crate::storage::{Pauses, Storage, StorageResult};

/// How stale a replica's view of the pauses may be.
pub const PAUSE_REFRESH: Duration = Duration::from_secs(1);

/// The pauses as this replica last read them.
#[derive(Debug, Default)]
pub struct PauseView {
    state: Mutex<Option<Seen>>,
}

#[derive(Debug, Clone)]
struct Seen {
    at: Instant,
    pauses: Pauses,
}

impl PauseView {
    /// What is paused, as this replica sees it (at most [`PAUSE_REFRESH`] old). A
    /// database that cannot be read keeps the last view: the claim that follows meets the
    /// same database and reports the outage itself.
    pub async fn read(
        &self,
        storage: &dyn Storage,
        groups: Option<&dyn GroupStore>,
        outbox: &str,
    ) -> Pauses {
        if let Some(pauses) = self.fresh() {
            return pauses;
        }
        match current(storage, groups).await {
            Ok(pauses) => {
                self.remember(pauses.clone());
                pauses
            }
            Err(error) => {
                tracing::debug!(outbox, %error, "could not read the pauses; keeping the last view");
                let last = self.last();
                self.remember(last.clone());
                last
            }
        }
    }

    fn fresh(&self) -> Option<Pauses> {
        let state = self.state.lock().unwrap();
        let seen = state.as_ref()?;
        (seen.at.elapsed() < PAUSE_REFRESH).then(|| seen.pauses.clone())
    }

    pub(super) fn remember(&self, pauses: Pauses) {
        *self.state.lock().unwrap() = Some(Seen {
            at: Instant::now(),
            pauses,
        });
    }

    /// The last value read, however old.
    fn last(&self) -> Pauses {
        self.state
            .lock()
            .unwrap()
            .as_ref()
            .map(|seen| seen.pauses.clone())
            .unwrap_or_default()
    }
}

/// The outbox's and its topics' pauses as the database holds them, and its groups' when
/// it has any.
pub async fn current(
    storage: &dyn Storage,
    groups: Option<&dyn GroupStore>,
) -> StorageResult<Pauses> {
    let mut pauses = storage.pauses().await?;
    if let Some(groups) = groups {
        pauses.groups = groups.paused().await?;
    }
    Ok(pauses)
}

impl Outbox {
    /// Pauses or resumes one subscription group on every replica: its streams are handed
    /// nothing (answers still apply, positions stay) while the other groups go on.
    /// Returns the state after.
    pub async fn set_group_paused(&self, group: &str, paused: bool) -> RelayResult<Pauses> {
        let groups = self.groups().map_err(no_groups_argument)?;
        groups.settings(group)?;
        let paused_groups = groups.store.set_paused(group, paused).await?;
        let pauses = Pauses {
            groups: paused_groups,
            ..self.storage.pauses().await?
        };
        self.pause.remember(pauses.clone());
        tracing::info!(outbox = %self.name, group, paused, "group pause changed");
        Ok(pauses)
    }
}

/// What a claim may take given the pauses.
#[derive(Debug, Clone, PartialEq)]
pub enum ClaimScope {
    /// Nothing: the outbox, or every topic of the claim's filter, is paused.
    Paused,
    /// `topics` (the filter without its paused topics; empty: every topic) except
    /// `paused_topics`.
    Topics {
        topics: Vec<String>,
        paused_topics: Vec<String>,
    },
}

impl ClaimScope {
    /// The scope of a claim filtering on `topics` (empty: every topic) under `pauses`.
    pub fn of(topics: &[String], pauses: &Pauses) -> Self {
        if pauses.outbox.is_some() {
            return Self::Paused;
        }
        if topics.is_empty() {
            return Self::Topics {
                topics: Vec::new(),
                paused_topics: pauses.topic_names(),
            };
        }
        let kept: Vec<String> = topics
            .iter()
            .filter(|topic| !pauses.topics.contains_key(*topic))
            .cloned()
            .collect();
        if kept.is_empty() {
            return Self::Paused;
        }
        Self::Topics {
            topics: kept,
            paused_topics: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use chrono::Utc;

    use super::*;

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn paused_topics_leave_a_filter_or_are_excluded_from_every_topic() {
        let now = Utc::now();
        let pauses = Pauses::from_rows([("b".to_owned(), now)]);
        assert_eq!(
            ClaimScope::of(&[], &pauses),
            ClaimScope::Topics {
                topics: vec![],
                paused_topics: strings(&["b"])
            }
        );
        assert_eq!(
            ClaimScope::of(&strings(&["a", "b"]), &pauses),
            ClaimScope::Topics {
                topics: strings(&["a"]),
                paused_topics: vec![]
            }
        );
        assert_eq!(
            ClaimScope::of(&strings(&["b"]), &pauses),
            ClaimScope::Paused
        );
        let whole = Pauses::from_rows([("".to_owned(), now)]);
        assert_eq!(ClaimScope::of(&strings(&["a"]), &whole), ClaimScope::Paused);
        assert_eq!(
            ClaimScope::of(&[], &Pauses::default()),
            ClaimScope::Topics {
                topics: vec![],
                paused_topics: vec![]
            }
        );
    }
}
