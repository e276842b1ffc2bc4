//! `[outboxes.NAME]`: one outbox table, its leases, retries and polling.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::backoff::{BackoffConfig, MAX_FACTOR};
use super::group::{self, GroupConfig};
use super::ident;
use super::{check_duration, DatabaseConfig, MAX_WINDOW, MIN_LEASE};
use crate::config::columns::{ColumnMapping, Columns};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OutboxConfig {
    /// Name of a `[databases.NAME]` entry.
    pub database: String,
    /// Schema of the table; empty uses the connection's search path. On MySQL/MariaDB,
    /// the database holding the table; empty uses the URL's.
    pub schema: Option<String>,
    pub table: String,
    /// Hold back a row while an earlier pending row of its key is leased or retrying.
    pub strict_ordering: bool,
    /// A dead-lettered row holds its key's later rows back (never claimed) until an
    /// operator re-drives or discards it; needs `strict_ordering`.
    pub dead_letter_holds_key: bool,
    /// Delete delivered rows instead of marking them done.
    pub delete_on_ack: bool,
    /// Refuse answers that carry no lease token (docs/lease-tokens.md): on once every
    /// client sends them back; off, a tokenless answer is fenced by its holder alone.
    pub require_lease_tokens: bool,
    /// Only claim rows older than this: guards against commit-order races.
    #[serde(with = "humantime_serde")]
    pub visibility_delay: Duration,
    /// PostgreSQL LISTEN/NOTIFY channel that wakes claiming on insert.
    pub notify_channel: Option<String>,
    /// Default lease per message when a subscriber does not ask for one.
    #[serde(with = "humantime_serde")]
    pub lease: Duration,
    /// Longest lease a subscriber may ask for or extend to.
    #[serde(with = "humantime_serde")]
    pub max_lease: Duration,
    /// A message that fails on this attempt is dead-lettered.
    pub max_attempts: u32,
    /// Most rows claimed at once for one subscriber.
    pub max_batch_size: u32,
    /// Most distinct topic filters among the outbox's open streams: each costs a claim per
    /// insert and per idle poll (see `relay::idle`); a stream with a new filter past it is
    /// refused with RESOURCE_EXHAUSTED.
    pub max_topic_filters: u32,
    pub backoff: BackoffConfig,
    pub poll: PollConfig,
    /// Create the table (and trigger) at start if missing; on an existing table mapped in
    /// `columns`, add the bookkeeping columns it lacks, which makes the rows it already
    /// holds pending (they will be delivered).
    pub create_schema: bool,
    /// Column names of an existing table ("bring your own table"); each defaults to the
    /// relay's own name. See [`ColumnMapping`].
    pub columns: ColumnMapping,
    /// Subscription groups: each receives every row (see `docs/groups.md`). An outbox with
    /// groups is delivered by them only; per-row claims refuse it.
    pub groups: BTreeMap<String, GroupConfig>,
    /// How many partitions the groups spread keys over; fixed once groups exist (the
    /// read index is built for it).
    pub partitions: u32,
    /// With groups: a row every group has passed is purged once it is this old.
    #[serde(with = "humantime_serde")]
    pub retention: Duration,
}

impl Default for OutboxConfig {
    fn default() -> Self {
        Self {
            database: String::new(),
            schema: None,
            table: "outbox".to_owned(),
            strict_ordering: true,
            dead_letter_holds_key: false,
            delete_on_ack: false,
            require_lease_tokens: false,
            visibility_delay: Duration::ZERO,
            notify_channel: None,
            lease: Duration::from_secs(30),
            max_lease: Duration::from_secs(15 * 60),
            max_attempts: 10,
            max_batch_size: 100,
            max_topic_filters: 64,
            backoff: BackoffConfig::default(),
            poll: PollConfig::default(),
            create_schema: false,
            columns: ColumnMapping::default(),
            groups: BTreeMap::new(),
            partitions: 16,
            retention: Duration::from_secs(24 * 60 * 60),
        }
    }
}

/// Idle polling, the fallback when no insert notification arrives: the wait between
/// empty claims grows from `min` by `factor` up to `max`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PollConfig {
    #[serde(with = "humantime_serde")]
    pub min: Duration,
    #[serde(with = "humantime_serde")]
    pub max: Duration,
    pub factor: f64,
}

impl Default for PollConfig {
    fn default() -> Self {
        Self {
            min: Duration::from_millis(50),
            max: Duration::from_secs(5),
            factor: 2.0,
        }
    }
}

impl OutboxConfig {
    pub(super) fn validate(
        &self,
        name: &str,
        databases: &BTreeMap<String, DatabaseConfig>,
        problems: &mut Vec<String>,
    ) {
        let key = format!("outboxes.{name}");
        if let Err(why) = ident::validate(name) {
            problems.push(format!("{key}: outbox name {why}"));
        }
        self.check_database(&key, databases, problems);
        let identifiers = [
            ("table", Some(&self.table)),
            ("schema", self.schema.as_ref()),
            ("notify_channel", self.notify_channel.as_ref()),
        ];
        for (field, value) in identifiers {
            if let Some(value) = value {
                if let Err(why) = ident::validate(value) {
                    problems.push(format!("{key}.{field} = {value:?}: {why}"));
                }
            }
        }
        if let Err(mapping_problems) = Columns::from_mapping(&self.columns) {
            problems.extend(mapping_problems.into_iter().map(|p| format!("{key}.{p}")));
        }
        let backend = databases
            .get(&self.database)
            .and_then(|database| database.url.backend_if_known());
        group::validate(
            &key,
            &self.groups,
            self.partitions,
            self.retention,
            backend,
            problems,
        );
        // Keys that mean something else, or nothing, on the database's backend.
        if let Some(database) = databases.get(&self.database) {
            if let Some(backend) = database.url.backend_if_known() {
                backend.check_outbox(&key, self, &self.database, &database.url, problems);
            }
        }
        self.check_durations(&key, problems);
        self.check_bounds(&key, problems);
    }

    /// The problems of `database`: missing, or no such `[databases.NAME]`.
    fn check_database(
        &self,
        key: &str,
        databases: &BTreeMap<String, DatabaseConfig>,
        problems: &mut Vec<String>,
    ) {
        if self.database.is_empty() {
            problems.push(format!(
                "{key}.database: missing; name one of the [databases.*] entries"
            ));
        } else if !databases.contains_key(&self.database) {
            let known: Vec<&str> = databases.keys().map(String::as_str).collect();
            problems.push(format!(
                "{key}.database = {:?}: no such database; configured: {}",
                self.database,
                if known.is_empty() {
                    "none (add a [databases.NAME] table)".to_owned()
                } else {
                    known.join(", ")
                }
            ));
        }
    }

    /// The problems of every duration key, each against its own lower bound.
    fn check_durations(&self, key: &str, problems: &mut Vec<String>) {
        let durations = [
            ("lease", self.lease, MIN_LEASE, "30s"),
            ("max_lease", self.max_lease, MIN_LEASE, "15m"),
            (
                "visibility_delay",
                self.visibility_delay,
                Duration::ZERO,
                "1s",
            ),
            (
                "backoff.base",
                self.backoff.base,
                Duration::from_millis(1),
                "1s",
            ),
            (
                "backoff.maximum",
                self.backoff.maximum,
                Duration::from_millis(1),
                "5m",
            ),
            ("poll.min", self.poll.min, Duration::from_millis(1), "50ms"),
            ("poll.max", self.poll.max, Duration::from_millis(1), "5s"),
        ];
        for (field, value, min, example) in durations {
            check_duration(problems, &format!("{key}.{field}"), value, min, example);
        }
    }

    /// The problems of the counts, of keys that need each other, of `backoff` and `poll`.
    fn check_bounds(&self, key: &str, problems: &mut Vec<String>) {
        if self.dead_letter_holds_key && !self.strict_ordering {
            problems.push(format!(
                "{key}.dead_letter_holds_key: needs strict_ordering = true (without per-key \
                 order a dead row has no later rows to hold back)"
            ));
        }
        if self.max_lease < self.lease {
            problems.push(format!(
                "{key}.max_lease: must be at least lease ({})",
                humantime::format_duration(self.lease)
            ));
        }
        if self.max_attempts == 0 {
            problems.push(format!("{key}.max_attempts: must be at least 1"));
        }
        if self.max_batch_size == 0 || self.max_batch_size > MAX_WINDOW {
            problems.push(format!(
                "{key}.max_batch_size = {}: must be within 1..={MAX_WINDOW}",
                self.max_batch_size
            ));
        }
        if self.max_topic_filters == 0 {
            problems.push(format!(
                "{key}.max_topic_filters: must be at least 1 (default 64)"
            ));
        }
        self.backoff.check(key, problems);
        let poll = &self.poll;
        if poll.min.is_zero() || poll.max < poll.min {
            problems.push(format!("{key}.poll: need 0 < poll.min <= poll.max"));
        }
        if !(1.0..=MAX_FACTOR).contains(&poll.factor) {
            problems.push(format!(
                "{key}.poll.factor = {}: must be within 1..={MAX_FACTOR}",
                poll.factor
            ));
        }
    }
}
