//! What a drain costs PostgreSQL per message: CPU time of every `postgres` process (from
//! `/proc`), WAL written (`pg_current_wal_lsn`), and the table's own row operations
//! (`pg_stat_user_tables`: updates, HOT updates, deletes) and index reads (entries read
//! from its indexes, rows fetched through them: what a claim that walks past leased rows
//! or dead index entries pays).
//!
//! The CPU and the WAL are the whole cluster's: whatever else runs against this
//! PostgreSQL during the drain is counted too, so they are exact only on a quiet
//! machine. The row operations are the table's alone, whatever the machine does: the
//! steadiest guide when wall-clock figures are noisy.

use std::time::{Duration, Instant};

use sqlx::PgPool;

use super::procfs;
use super::workload::wait_until;

/// Counters at the start of a drain.
#[derive(Debug, Clone, Copy)]
pub struct CostMeter {
    cpu_seconds: f64,
    wal_bytes: f64,
    at: Instant,
}

/// Per message, over one drain.
#[derive(Debug, Clone, Copy, Default)]
pub struct Cost {
    /// CPU of every `postgres` process, µs per message.
    pub cpu_us: f64,
    /// WAL written by the cluster, bytes per message.
    pub wal_bytes: f64,
}

impl CostMeter {
    pub async fn start(pool: &PgPool) -> anyhow::Result<Self> {
        Ok(Self {
            wal_bytes: wal_position(pool).await?,
            cpu_seconds: procfs::postgres_cpu_seconds(),
            at: Instant::now(),
        })
    }

    /// The cost of `messages` messages since [`start`](Self::start).
    pub async fn finish(&self, pool: &PgPool, messages: u64) -> anyhow::Result<Cost> {
        let cpu = procfs::postgres_cpu_seconds() - self.cpu_seconds;
        let wal = wal_position(pool).await? - self.wal_bytes;
        let messages = messages.max(1) as f64;
        Ok(Cost {
            cpu_us: cpu * 1e6 / messages,
            wal_bytes: wal / messages,
        })
    }

    pub fn elapsed(&self) -> Duration {
        self.at.elapsed()
    }
}

async fn wal_position(pool: &PgPool) -> anyhow::Result<f64> {
    Ok(
        sqlx::query_scalar("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::float8")
            .fetch_one(pool)
            .await?,
    )
}

/// Row operations on one table, per message.
#[derive(Debug, Clone, Copy, Default)]
pub struct RowOps {
    pub updates: f64,
    pub hot_updates: f64,
    pub deletes: f64,
    pub inserts: f64,
    /// Entries index scans read from the table's indexes (`idx_tup_read`, all indexes).
    pub index_entries: f64,
    /// Table rows fetched through them (`idx_tup_fetch`).
    pub index_fetches: f64,
}

/// The row operations of `table` (schema-qualified) since it was created, divided by
/// `messages`, once at least `writes` updates and deletes are published: each backend
/// publishes its counts when it exits, so close the drain's connections first.
pub async fn row_ops(
    pool: &PgPool,
    table: &str,
    writes: u64,
    messages: u64,
) -> anyhow::Result<RowOps> {
    let read = || async {
        sqlx::query_as::<_, (i64, i64, i64, i64, i64, i64)>(
            "SELECT n_tup_upd, n_tup_hot_upd, n_tup_del, n_tup_ins, \
               (SELECT coalesce(sum(i.idx_tup_read), 0)::int8 FROM pg_stat_user_indexes i \
                WHERE i.relid = t.relid), coalesce(idx_tup_fetch, 0) \
             FROM pg_stat_user_tables t WHERE relid = $1::regclass",
        )
        .bind(table)
        .fetch_one(pool)
        .await
    };
    wait_until(
        "the table's statistics",
        Duration::from_secs(15),
        Duration::from_millis(100),
        || async {
            read()
                .await
                .is_ok_and(|(u, _, d, ..)| (u + d) as u64 >= writes)
        },
    )
    .await?;
    let (updates, hot, deletes, inserts, entries, fetches) = read().await?;
    let per = |n: i64| n as f64 / messages.max(1) as f64;
    Ok(RowOps {
        updates: per(updates),
        hot_updates: per(hot),
        deletes: per(deletes),
        inserts: per(inserts),
        index_entries: per(entries),
        index_fetches: per(fetches),
    })
}
