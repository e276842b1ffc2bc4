//! `backoff`: the retry delays of an outbox, or of one of its groups.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Largest growth factor (`poll.factor`, `backoff.factor`): past it the second delay is
/// already the maximum.
pub(super) const MAX_FACTOR: f64 = 100.0;

/// Retry delay for attempt `n` is `min(base * factor^(n-1), maximum)`, multiplied by a
/// random factor in `[1 - jitter, 1 + jitter]`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BackoffConfig {
    #[serde(with = "humantime_serde")]
    pub base: Duration,
    pub factor: f64,
    #[serde(with = "humantime_serde")]
    pub maximum: Duration,
    pub jitter: f64,
}

impl Default for BackoffConfig {
    fn default() -> Self {
        Self {
            base: Duration::from_secs(1),
            factor: 2.0,
            maximum: Duration::from_secs(5 * 60),
            jitter: 0.25,
        }
    }
}

impl BackoffConfig {
    /// The problems of the factor, maximum and jitter; `key` names the table holding
    /// `backoff` (`outboxes.NAME` or a group's).
    pub(super) fn check(&self, key: &str, problems: &mut Vec<String>) {
        if !(1.0..=MAX_FACTOR).contains(&self.factor) {
            problems.push(format!(
                "{key}.backoff.factor = {}: must be within 1..={MAX_FACTOR}",
                self.factor
            ));
        }
        if self.maximum < self.base {
            problems.push(format!(
                "{key}.backoff.maximum: must be at least backoff.base"
            ));
        }
        if !(0.0..=1.0).contains(&self.jitter) {
            problems.push(format!(
                "{key}.backoff.jitter = {}: must be within 0..=1",
                self.jitter
            ));
        }
    }
}
