//! Per-outbox health for `grpc.health.v1`: each outbox is a service named after it,
//! SERVING while its database answers and its table exists, NOT_SERVING otherwise.
//! Each check verifies the table, changing nothing ([`Storage::verify_table`]); with
//! `create_schema = true`, a check that finds the table missing ensures it
//! ([`Storage::ensure_table`]: DDL), and one that finds a mapped table lacking columns
//! does so once, so a server started before its database still comes up on its own.
//!
//! [`Storage::verify_table`]: crate::storage::Storage::verify_table
//! [`Storage::ensure_table`]: crate::storage::Storage::ensure_table

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

use crate::relay::{Outbox, Relay};
use crate::storage::StorageError;

/// Checks every outbox now and then every `interval` until `stop`.
pub async fn watch(
    relay: Arc<Relay>,
    reporter: HealthReporter,
    interval: Duration,
    stop: CancellationToken,
) {
    let mut last: HashMap<String, bool> = HashMap::new();
    // Outboxes whose mismatched table already had the DDL run: running it again every
    // interval would not fix a wrong type, only repeat the trigger and backfill work.
    let mut altered: HashSet<String> = HashSet::new();
    loop {
        for outbox in relay.outboxes() {
            let may_alter = !altered.contains(&outbox.name);
            let result = verify_or_ensure_table(outbox, may_alter).await;
            if matches!(result, Err(StorageError::MismatchedTable { .. })) && may_alter {
                altered.insert(outbox.name.clone());
            }
            let healthy = result.is_ok();
            outbox.metrics().serving.set(i64::from(healthy));
            if last.get(&outbox.name) != Some(&healthy) {
                match &result {
                    Ok(()) => tracing::info!(outbox = %outbox.name, "outbox is serving"),
                    // `{:#}`: the whole chain of causes, not only the outer context.
                    Err(error) => {
                        tracing::warn!(outbox = %outbox.name, error = format!("{error:#}"), "outbox is not serving")
                    }
                }
                last.insert(outbox.name.clone(), healthy);
            }
            let status = if healthy {
                ServingStatus::Serving
            } else {
                ServingStatus::NotServing
            };
            reporter.set_service_status(&outbox.name, status).await;
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
    }
}

/// Verifies the outbox's table (on the health checks' own connection); with
/// `create_schema`, when it is missing, or (when `may_alter`) lacks what its column
/// mapping needs, ensures it and verifies again.
pub async fn verify_or_ensure_table(outbox: &Outbox, may_alter: bool) -> Result<(), StorageError> {
    let result = outbox.health_storage().verify_table().await;
    if result.is_ok() {
        if let Ok(groups) = outbox.groups() {
            groups.ensure().await?;
        }
    }
    let fixable = match result {
        Err(StorageError::MissingTable { .. }) => true,
        Err(StorageError::MismatchedTable { .. }) => may_alter,
        _ => false,
    };
    if !(fixable && outbox.config.create_schema) {
        return result;
    }
    outbox.storage().ensure_table().await?;
    if matches!(result, Err(StorageError::MismatchedTable { .. })) {
        tracing::warn!(
            outbox = %outbox.name,
            "added the relay's columns to an existing table (create_schema): the rows it \
             already held are pending now and will be delivered"
        );
    } else {
        tracing::info!(outbox = %outbox.name, "created the outbox table");
    }
    outbox.health_storage().verify_table().await?;
    if let Ok(groups) = outbox.groups() {
        groups.ensure().await?;
    }
    Ok(())
}

/// Marks every outbox NOT_SERVING, so load balancers stop sending new streams.
pub async fn mark_draining(relay: &Relay, reporter: &HealthReporter) {
    for outbox in relay.outboxes() {
        outbox.metrics().serving.set(0);
        reporter
            .set_service_status(&outbox.name, ServingStatus::NotServing)
            .await;
    }
    reporter
        .set_service_status("", ServingStatus::NotServing)
        .await;
}
