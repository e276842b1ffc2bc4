//! Per-outbox health for `grpc.health.v1`: each outbox is a service named after it,
//! SERVING while its database answers and its table exists, NOT_SERVING otherwise.
//! Each check verifies the table, changing nothing ([`Storage::verify_table`]); with
//! `create_schema = true`, a check that finds the table missing ensures it
//! ([`Storage::ensure_table`]: DDL), and one that finds a mapped table lacking columns
//! does so once, so a server started before its database still comes up on its own.
//!
//!
//! The same checks feed [`Readiness`], which the metrics listener's `/readyz` answers
//! from, so an orchestrator's HTTP probe sees what a gRPC health client sees without a
//! client certificate or a token, and without a database round trip per probe.
//!
//! [`Storage::verify_table`]: crate::storage::Storage::verify_table
//! [`Storage::ensure_table`]: crate::storage::Storage::ensure_table

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

use crate::relay::{Outbox, Relay};
use crate::storage::StorageError;

/// Whether the server should be sent work: what `/readyz` answers. Not ready while an
/// outbox has not been checked yet or its last check failed, and for good once the drain
/// has started.
#[derive(Debug)]
pub struct Readiness {
    draining: AtomicBool,
    /// Each outbox's last check: `None` when it passed, else why not.
    outboxes: Mutex<BTreeMap<String, Option<String>>>,
}

impl Readiness {
    /// Every outbox not ready until its first check.
    pub fn new<'a>(outboxes: impl IntoIterator<Item = &'a str>) -> Self {
        let outboxes = outboxes
            .into_iter()
            .map(|name| (name.to_owned(), Some("not checked yet".to_owned())))
            .collect();
        Self {
            draining: AtomicBool::new(false),
            outboxes: Mutex::new(outboxes),
        }
    }

    fn record(&self, outbox: &str, problem: Option<String>) {
        let mut outboxes = self.outboxes.lock().expect("readiness lock");
        outboxes.insert(outbox.to_owned(), problem);
    }

    fn set_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// Why the server is not ready, one line each; empty when it is.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.draining.load(Ordering::SeqCst) {
            problems.push("draining: shutting down, finishing in-flight work".to_owned());
        }
        let outboxes = self.outboxes.lock().expect("readiness lock");
        for (name, problem) in outboxes.iter() {
            if let Some(problem) = problem {
                problems.push(format!("outbox {name} is not serving: {problem}"));
            }
        }
        problems
    }
}

/// Checks every outbox now and then every `interval` until `stop`, which also ends a
/// check under way: once the drain starts nothing may set an outbox SERVING again.
pub async fn watch(
    relay: Arc<Relay>,
    reporter: HealthReporter,
    readiness: Arc<Readiness>,
    interval: Duration,
    stop: CancellationToken,
) {
    let mut last: HashMap<String, bool> = HashMap::new();
    // Outboxes whose mismatched table already had the DDL run: running it again every
    // interval would not fix a wrong type, only repeat the trigger and backfill work.
    let mut altered: HashSet<String> = HashSet::new();
    loop {
        let checks = check_all(&relay, &reporter, &readiness, &mut last, &mut altered);
        tokio::select! {
            _ = stop.cancelled() => return,
            () = checks => {}
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
    }
}

/// One pass of [`watch`] over every outbox.
async fn check_all(
    relay: &Relay,
    reporter: &HealthReporter,
    readiness: &Readiness,
    last: &mut HashMap<String, bool>,
    altered: &mut HashSet<String>,
) {
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
        readiness.record(
            &outbox.name,
            result.as_ref().err().map(|error| format!("{error:#}")),
        );
        let status = if healthy {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        reporter.set_service_status(&outbox.name, status).await;
    }
}

/// Verifies the outbox's table (on the health checks' own connection); with
/// `create_schema`, when it is missing, or (when `may_alter`) lacks what its column
/// mapping needs, ensures it and verifies again.
pub async fn verify_or_ensure_table(outbox: &Outbox, may_alter: bool) -> Result<(), StorageError> {
    let result = outbox.health_storage().verify_table().await;
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
    outbox.health_storage().verify_table().await
}

/// Marks every outbox NOT_SERVING and the server not ready, so load balancers and
/// orchestrators stop sending new streams. Call it once [`watch`] has returned, or its
/// next pass sets the outboxes SERVING again.
pub async fn mark_draining(relay: &Relay, reporter: &HealthReporter, readiness: &Readiness) {
    readiness.set_draining();
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
