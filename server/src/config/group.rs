//! `[outboxes.NAME.groups.GROUP]`: a subscription group, one consumer of every row of the
//! outbox (see `docs/groups.md`). What a group leaves unset it takes from its outbox.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::backoff::BackoffConfig;
use super::ident;
use super::{check_duration, Backend, MIN_LEASE};

/// Most partitions an outbox's groups may spread keys over: each is a row of position and
/// a lateral read per poll.
pub const MAX_PARTITIONS: u32 = 1024;

/// Where a group added to an outbox starts reading.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GroupStart {
    /// The oldest row the table still holds: a new group catches up on the backlog.
    #[default]
    Oldest,
    /// Rows committed after the group was created only.
    Now,
}

/// Which rows of a group hold each other back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GroupOrdering {
    /// Rows of one key in order, one key's failure holding back only that key.
    #[default]
    Key,
    /// No order: rows of a key may be in flight together and a failure holds nothing.
    None,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GroupConfig {
    pub start: GroupStart,
    pub ordering: GroupOrdering,
    /// Lease of a delivered message and of a partition held by a stream; the outbox's
    /// `lease` when unset.
    #[serde(with = "humantime_serde::option")]
    pub lease: Option<Duration>,
    /// The outbox's `max_attempts` when unset.
    pub max_attempts: Option<u32>,
    /// The outbox's `backoff` when unset.
    pub backoff: Option<BackoffConfig>,
    /// The outbox's `dead_letter_holds_key` when unset.
    pub dead_letter_holds_key: Option<bool>,
}

/// A group's settings with the outbox's filled in.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupSettings {
    pub name: String,
    pub start: GroupStart,
    pub ordering: GroupOrdering,
    pub lease: Duration,
    pub max_lease: Duration,
    pub max_attempts: u32,
    pub backoff: BackoffConfig,
    pub dead_letter_holds_key: bool,
    pub partitions: u32,
}

impl GroupSettings {
    pub fn ordered(&self) -> bool {
        self.ordering == GroupOrdering::Key
    }
}

impl super::OutboxConfig {
    /// Every group of the outbox with what it inherits filled in.
    pub fn group_settings(&self) -> Vec<GroupSettings> {
        self.groups
            .iter()
            .map(|(name, group)| GroupSettings {
                name: name.clone(),
                start: group.start,
                ordering: group.ordering,
                lease: group.lease.unwrap_or(self.lease),
                max_lease: self.max_lease,
                max_attempts: group.max_attempts.unwrap_or(self.max_attempts),
                backoff: group.backoff.unwrap_or(self.backoff),
                dead_letter_holds_key: group
                    .dead_letter_holds_key
                    .unwrap_or(self.dead_letter_holds_key),
                partitions: self.partitions,
            })
            .collect()
    }

    pub fn has_groups(&self) -> bool {
        !self.groups.is_empty()
    }
}

/// The problems of an outbox's groups, for [`super::OutboxConfig::validate`].
pub(super) fn validate(
    key: &str,
    groups: &BTreeMap<String, GroupConfig>,
    partitions: u32,
    retention: Duration,
    backend: Option<Backend>,
    problems: &mut Vec<String>,
) {
    if !(1..=MAX_PARTITIONS).contains(&partitions) {
        problems.push(format!(
            "{key}.partitions = {partitions}: must be within 1..={MAX_PARTITIONS} (default 16)"
        ));
    }
    check_duration(
        problems,
        &format!("{key}.retention"),
        retention,
        Duration::from_secs(1),
        "24h",
    );
    if groups.is_empty() {
        return;
    }
    if backend == Some(Backend::MySql) {
        problems.push(format!(
            "{key}.groups: subscription groups need PostgreSQL or SQLite; on MySQL/MariaDB a \
             reader cannot tell which transactions could still commit an earlier row, so \
             exact order is not possible there. Remove the groups or use per-row claims"
        ));
    }
    for (name, group) in groups {
        let group_key = format!("{key}.groups.{name}");
        if let Err(why) = ident::validate(name) {
            problems.push(format!("{group_key}: group name {why}"));
        }
        if let Some(lease) = group.lease {
            check_duration(
                problems,
                &format!("{group_key}.lease"),
                lease,
                MIN_LEASE,
                "30s",
            );
        }
        if group.max_attempts == Some(0) {
            problems.push(format!("{group_key}.max_attempts: must be at least 1"));
        }
        if let Some(backoff) = group.backoff {
            backoff.check(&group_key, problems);
        }
    }
}
