//! The depth gauges (pending, leased, waiting, dead rows and the oldest pending row's
//! age, by outbox and topic) need the database: counting on every scrape would let each
//! Prometheus (and each curious operator) add load on the outbox tables. Instead one task
//! refreshes them every `server.metrics_depth_interval`, so the database cost is fixed by
//! configuration, whoever scrapes how often:
//!
//! - one query per outbox per interval (the storage's `stats`, the same counts as
//!   `Admin.Stats`), the outboxes one after another, never two at once;
//! - on a connection of their own per database, neither the relay's pool nor the health
//!   checks' connection: counting never delays a claim, a claim-starved pool never delays
//!   the counts, and a slow count (a backlog of millions, a count waiting for a table
//!   lock up to the sessions' `lock_timeout`) never holds a health check back, which
//!   could otherwise find no connection within the acquire timeout and turn an outbox
//!   NOT_SERVING;
//! - each query reads the pending and dead rows only (the partial indexes of every
//!   backend, PostgreSQL's status `OR` planned on both), never the delivered history:
//!   its cost grows with the backlog, which is what it measures.
//!
//! An outbox with subscription groups has its groups' figures (lag, retries, held keys,
//! members, owned partitions) and the frontier's delay refreshed in the same round: one
//! query per group and one for the frontier, as `Admin.Stats` makes them.
//!
//! A failed count leaves the gauges at their last value and counts a storage error; the
//! age gauge then grows stale, which `txoutbox_storage_errors_total` explains.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::metrics::{Metrics, OutboxMetrics};
use crate::storage::groups::GroupStore;
use crate::storage::{Storage, StorageResult};

/// One outbox as the depth gauges count it.
pub struct Counted {
    pub outbox: String,
    /// The storage the counts run on: connections of the gauges' own (see the module
    /// doc).
    pub storage: Arc<dyn Storage>,
    /// Where a failed count is counted as a storage error.
    pub metrics: OutboxMetrics,
    /// The outbox's subscription groups, if it declares any.
    pub groups: Option<CountedGroups>,
}

/// The groups of one outbox as the gauges count them.
pub struct CountedGroups {
    pub store: Arc<dyn GroupStore>,
    /// Each group's name and whether a dead row holds its key (which keys count as held).
    pub groups: Vec<(String, bool)>,
}

/// Refreshes the depth gauges of every outbox of `outboxes` every `interval` until `stop`.
pub async fn watch(
    outboxes: Vec<Counted>,
    metrics: Arc<Metrics>,
    interval: Duration,
    stop: CancellationToken,
) {
    let mut ticks = tokio::time::interval(interval);
    // A slow round delays the next instead of firing the missed ones back to back.
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = ticks.tick() => {}
        }
        for counted in &outboxes {
            if let Err(error) = refresh(counted, &metrics).await {
                counted.metrics.storage_error(&error);
                tracing::debug!(outbox = %counted.outbox, %error, "depth gauges not refreshed");
            }
        }
    }
}

/// One outbox's round: its depth, then its groups' figures and frontier.
async fn refresh(counted: &Counted, metrics: &Metrics) -> StorageResult<()> {
    let stats = counted.storage.stats().await?;
    metrics.set_depth(&counted.outbox, &stats);
    let Some(groups) = &counted.groups else {
        return Ok(());
    };
    for (group, holds) in &groups.groups {
        let stats = groups.store.stats(group, *holds).await?;
        metrics.set_group(&counted.outbox, &stats);
    }
    let delay = groups.store.frontier_delay().await?;
    metrics.set_frontier_delay(&counted.outbox, delay);
    Ok(())
}
