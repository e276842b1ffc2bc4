//! Subscription groups: every group of an outbox receives every row, in key order, with
//! no write to the outbox table per message (see `docs/groups.md` for the rules, and
//! [`crate::storage::groups`] for what is kept in the database).
//!
//! A stream of a group is a *member* ([`member::Member`], pure state) run by
//! [`runner::run`]: it heartbeats, takes the partitions the group's live members assign
//! to it, reads their rows, sends them within its window, applies answers, and writes
//! positions and state rows in fenced flushes.

pub mod member;
pub mod runner;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::drain::Drain;
use super::{limits, RelayError, RelayResult};
use crate::config::{GroupSettings, OutboxConfig};
use crate::storage::groups::GroupStore;
use crate::storage::StorageResult;

/// A `group` argument on an outbox without groups (where it is optional): the caller
/// should drop it, or declare groups.
pub fn no_groups_argument(error: RelayError) -> RelayError {
    match error {
        RelayError::WrongMode(message) => RelayError::InvalidArgument(format!(
            "{message}; or leave `group` empty for the outbox's per-row state"
        )),
        other => other,
    }
}

/// How often the outbox's purge of rows every group has passed runs.
const RETENTION_EVERY: Duration = Duration::from_secs(60);

/// The groups of one outbox.
pub struct Groups {
    outbox: String,
    pub store: Arc<dyn GroupStore>,
    settings: BTreeMap<String, GroupSettings>,
    pub retention: Duration,
    create: bool,
    /// Set once [`Groups::ensure`] succeeded: the DDL runs once per process.
    ready: std::sync::atomic::AtomicBool,
    /// Bumped when a stream of this replica joins or leaves a group, so the other streams
    /// of this replica heartbeat at once and hand partitions over (or take them) without
    /// waiting for their next heartbeat: streams opened together share the partitions
    /// from the start instead of the first one owning them all for a heartbeat period.
    membership: tokio::sync::watch::Sender<u64>,
}

impl Groups {
    pub fn new(outbox: &str, config: &OutboxConfig, store: Arc<dyn GroupStore>) -> Self {
        Self {
            outbox: outbox.to_owned(),
            store,
            settings: config
                .group_settings()
                .into_iter()
                .map(|g| (g.name.clone(), g))
                .collect(),
            retention: config.retention,
            create: config.create_schema,
            ready: Default::default(),
            membership: tokio::sync::watch::Sender::new(0),
        }
    }

    /// Says a stream of this replica joined or left a group (see `membership`).
    pub fn membership_changed(&self) {
        self.membership.send_modify(|generation| *generation += 1);
    }

    /// Wakes on every [`Groups::membership_changed`] after this call.
    pub fn membership(&self) -> tokio::sync::watch::Receiver<u64> {
        self.membership.subscribe()
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.settings.keys().map(String::as_str)
    }

    pub fn settings(&self, group: &str) -> RelayResult<&GroupSettings> {
        self.settings
            .get(group)
            .ok_or_else(|| RelayError::UnknownGroup {
                outbox: self.outbox.clone(),
                name: limits::echo(group),
                configured: self.settings.keys().cloned().collect(),
            })
    }

    /// Creates (or checks) the group tables and registers every group.
    pub async fn ensure(&self) -> StorageResult<()> {
        use std::sync::atomic::Ordering;
        if self.ready.load(Ordering::Acquire) {
            return Ok(());
        }
        let groups: Vec<(String, crate::config::GroupStart)> = self
            .settings
            .values()
            .map(|g| (g.name.clone(), g.start))
            .collect();
        let partitions = self
            .settings
            .values()
            .map(|g| g.partitions)
            .next()
            .unwrap_or(16);
        self.store.ensure(&groups, partitions, self.create).await?;
        self.ready.store(true, Ordering::Release);
        tracing::info!(outbox = %self.outbox, groups = ?self.settings.keys().collect::<Vec<_>>(), "subscription groups ready");
        Ok(())
    }

    /// Purges what every group has passed, every minute, until the drain.
    pub fn spawn_retention(self: &Arc<Self>, drain: &Drain) {
        let groups = Arc::clone(self);
        let drain = drain.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(RETENTION_EVERY);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = drain.started() => return,
                    _ = every.tick() => {}
                }
                match groups.store.purge(groups.retention).await {
                    Ok(0) => {}
                    Ok(purged) => {
                        tracing::info!(outbox = %groups.outbox, purged, "rows every group has passed purged")
                    }
                    Err(error) => {
                        tracing::warn!(outbox = %groups.outbox, %error, "purge of passed rows failed; trying again later")
                    }
                }
            }
        });
    }
}
