//! The ceiling: the backlog drained by the claim and ack statements alone, in-process
//! through the [`Storage`] trait (no gRPC, no server process), with the same batch size.
//! Each worker claims a batch, acks it, and claims again: what one subscription stream
//! does, minus everything between the statements.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use txoutbox_server::storage::postgres::PostgresStorage;
use txoutbox_server::storage::{ClaimRequest, Storage};

use super::peers::PeerResult;
use super::pgcost::{row_ops, CostMeter};
use super::workload::{BenchSchema, Workload};
use super::Plan;

/// Lease of every claim: far longer than any drain, so nothing expires.
const LEASE: Duration = Duration::from_secs(600);

/// Drains the backlog with `workers` concurrent claim-and-ack loops; returns msg/s and
/// what the drain cost PostgreSQL.
pub async fn drain(plan: &Plan, workload: Workload, workers: usize) -> anyhow::Result<PeerResult> {
    let schema = BenchSchema::create(&plan.database_url, "ceiling").await?;
    let result = drain_in(plan, &schema, workload, workers).await;
    schema.drop().await;
    result
}

async fn drain_in(
    plan: &Plan,
    schema: &BenchSchema,
    workload: Workload,
    workers: usize,
) -> anyhow::Result<PeerResult> {
    let storage = schema
        .create_outbox(&plan.relay_url, workload.strict_ordering(), workers as u32)
        .await?;
    schema
        .load(&schema.table(), workload, plan.keys, workload.rows(plan))
        .await?;
    let acked = Arc::new(AtomicU64::new(0));
    let meter = CostMeter::start(&schema.pool).await?;
    let started = Instant::now();
    let tasks: Vec<_> = (0..workers)
        .map(|i| {
            let storage = Arc::clone(&storage);
            let acked = Arc::clone(&acked);
            let (rows, batch) = (workload.rows(plan), plan.batch_size);
            tokio::spawn(async move {
                worker(&storage, &format!("ceiling-{i}"), batch, rows, &acked).await
            })
        })
        .collect();
    for task in tasks {
        task.await??;
    }
    let elapsed = started.elapsed();
    let rows = workload.rows(plan);
    let cost = meter.finish(&schema.pool, rows).await?;
    // Its sessions end, so they publish the table's statistics.
    drop(storage);
    let ops = row_ops(&schema.pool, &schema.table(), 2 * rows, rows).await?;
    Ok(PeerResult {
        rate: rows as f64 / elapsed.as_secs_f64(),
        cost,
        ops,
    })
}

/// Claims and acks until every row is acked (by any worker). An empty claim while rows
/// remain means the others hold them (strict ordering): try again shortly.
async fn worker(
    storage: &PostgresStorage,
    owner: &str,
    batch_size: u32,
    rows: u64,
    acked: &AtomicU64,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(600);
    while acked.load(Ordering::Relaxed) < rows {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the ceiling drain did not finish"
        );
        let claimed = storage
            .claim(ClaimRequest {
                owner,
                batch_size,
                lease: LEASE,
                topics: &[],
                paused_topics: &[],
                max_attempts: u32::MAX,
            })
            .await?;
        if claimed.messages.is_empty() {
            tokio::time::sleep(Duration::from_millis(1)).await;
            continue;
        }
        let ids: Vec<i64> = claimed.messages.iter().map(|m| m.id).collect();
        let done = storage.ack(&ids.into(), owner).await?;
        acked.fetch_add(done.len() as u64, Ordering::Relaxed);
    }
    Ok(())
}
