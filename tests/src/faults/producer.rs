//! The producer of a fault run: rows at a steady rate over a few hundred keys (a few of
//! them hot) plus keyless rows, each in a transaction of its own, each carrying its key's
//! sequence number in commit order (payload `key:seq`). Several tasks insert at once;
//! each owns its keys, so one key's inserts never overlap and its numbers follow its
//! commits. Every insert's start and commit latency is recorded.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::MissedTickBehavior;

use super::database::Database;
use super::history::{now_us, payload, Insert};

#[derive(Debug, Clone)]
pub struct Workload {
    /// Rows per second, all tasks together.
    pub rate: u32,
    pub keys: usize,
    /// The first `hot_keys` keys take `hot_share` of the keyed rows.
    pub hot_keys: usize,
    pub hot_share: f64,
    pub keyless_share: f64,
    /// Inserting tasks (connections) at once.
    pub tasks: usize,
}

impl Default for Workload {
    fn default() -> Self {
        Self {
            rate: 400,
            keys: 300,
            hot_keys: 5,
            hot_share: 0.3,
            keyless_share: 0.1,
            tasks: 4,
        }
    }
}

/// Inserts until `stop` is set; returns every insert, in no particular order.
pub async fn produce(
    db: Arc<Database>,
    workload: Workload,
    seed: u64,
    stop: Arc<AtomicBool>,
) -> Vec<Insert> {
    let tasks: Vec<_> = (0..workload.tasks)
        .map(|task| {
            let (db, workload, stop) = (Arc::clone(&db), workload.clone(), Arc::clone(&stop));
            tokio::spawn(produce_task(db, workload, seed, task, stop))
        })
        .collect();
    let mut inserts = Vec::new();
    for task in tasks {
        inserts.extend(task.await.expect("producer task"));
    }
    inserts
}

async fn produce_task(
    db: Arc<Database>,
    workload: Workload,
    seed: u64,
    task: usize,
    stop: Arc<AtomicBool>,
) -> Vec<Insert> {
    let mut rng = StdRng::seed_from_u64(seed ^ (0x9e37_79b9 * (task as u64 + 1)));
    // This task's keys: every `tasks`-th, so each task has hot ones when there are
    // at least as many hot keys as tasks.
    let own = |range: std::ops::Range<usize>| -> Vec<usize> {
        range.filter(|k| k % workload.tasks == task).collect()
    };
    let hot = own(0..workload.hot_keys);
    let all = own(0..workload.keys);
    let mut seqs = vec![0_u64; workload.keys];
    let mut keyless = 0_u64;
    let period = Duration::from_secs_f64(workload.tasks as f64 / f64::from(workload.rate));
    let mut ticks = tokio::time::interval(period);
    // A slow insert does not make the next ones burst: the rate drops, and shows it.
    ticks.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let mut inserts = Vec::new();
    loop {
        ticks.tick().await;
        if stop.load(Ordering::Relaxed) {
            return inserts;
        }
        let (key, seq) = if rng.random_bool(workload.keyless_share) || all.is_empty() {
            keyless += 1;
            // Unique across tasks.
            (None, keyless * workload.tasks as u64 + task as u64)
        } else {
            let pool = if !hot.is_empty() && rng.random_bool(workload.hot_share) {
                &hot
            } else {
                &all
            };
            let k = pool[rng.random_range(0..pool.len())];
            let seq = seqs[k];
            seqs[k] += 1;
            (Some(format!("k{k}")), seq)
        };
        let at_us = now_us();
        let result = db
            .insert(key.as_deref(), payload(key.as_deref(), seq).as_bytes())
            .await;
        let latency_us = now_us() - at_us;
        if let Err(error) = &result {
            eprintln!("[faults] producer insert failed: {error}");
        }
        let (id, statement_us) = match result {
            Ok((id, answered)) => (Some(id), answered - at_us),
            Err(_) => (None, latency_us),
        };
        inserts.push(Insert {
            at_us,
            latency_us,
            statement_us,
            key,
            seq,
            id,
        });
    }
}
