//! Commit-to-receive latency: a producer inserts rows at a steady rate, each in its own
//! transaction on its own connection (not through txoutboxd); a Rust client runtime
//! subscribed through `txoutboxd` records when its publisher receives each one.
//!
//! The stamp is taken by the producer just after its `COMMIT` returned: that is the
//! moment an application knows its transaction committed. The true commit lies at
//! most one insert round trip earlier (a fraction of a millisecond here), so the figures
//! are slightly optimistic by that much; a row received before its producer saw the
//! commit return counts as zero. Both stamps come from the same monotonic clock in
//! this process. Rows are spread over `--keys` keys with strict ordering on, the
//! default configuration, or delivered through a subscription group ordered by key
//! ([`measure_on`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::postgres::PgPoolOptions;
use txoutbox_client::{Message, PublishError, Subscriber};

use super::drain::{server_config, start_server, stop_server, OUTBOX};
use super::stats::percentile;
use super::workload::{wait_until, BenchSchema, TOPIC};
use super::Plan;

/// Latencies of one measurement, in milliseconds, sorted.
#[derive(Debug, Clone)]
pub struct Latencies {
    pub sorted_ms: Vec<f64>,
}

impl Latencies {
    /// p50, p90, p99 and max.
    pub fn percentiles(&self) -> [(&'static str, f64); 4] {
        let s = &self.sorted_ms;
        [
            ("p50", percentile(s, 50.0)),
            ("p90", percentile(s, 90.0)),
            ("p99", percentile(s, 99.0)),
            ("max", s.last().copied().unwrap_or(f64::NAN)),
        ]
    }
}

/// One latency measurement, with LISTEN/NOTIFY wake-ups (`notify`) or polling only.
pub async fn measure(plan: &Plan, notify: bool) -> anyhow::Result<Latencies> {
    measure_on(plan, notify, None).await
}

/// [`measure`] on an outbox that declares the subscription group `group` (ordered by
/// key), which the subscriber joins; per-row claims with strict ordering without one.
pub async fn measure_on(
    plan: &Plan,
    notify: bool,
    group: Option<&str>,
) -> anyhow::Result<Latencies> {
    let schema = BenchSchema::create(&plan.database_url, "latency").await?;
    let result = measure_in(plan, &schema, notify, group).await;
    schema.drop().await;
    result
}

async fn measure_in(
    plan: &Plan,
    schema: &BenchSchema,
    notify: bool,
    group: Option<&str>,
) -> anyhow::Result<Latencies> {
    let channel = notify.then(|| format!("{}_wake", schema.name));
    let config = server_config(plan, &schema.name, group.is_none(), channel.as_deref());
    // The server creates the table, its key heads (or the groups' tables) and the notify
    // trigger.
    let mut config = format!("{config}create_schema = true\n");
    if let Some(group) = group {
        config += &format!("[outboxes.{OUTBOX}.groups.{group}]\n");
    }
    let server = start_server(plan, &config).await;

    let arrivals: Arc<Mutex<HashMap<i64, Instant>>> = Arc::default();
    let recorded = Arc::clone(&arrivals);
    let mut builder = Subscriber::builder([server.url()], OUTBOX)
        .name("bench-latency")
        .max_in_flight(plan.window)
        .concurrency(plan.window as usize);
    if let Some(group) = group {
        builder = builder.group(group);
    }
    let subscriber = builder.build(move |message: Message| {
        recorded.lock().unwrap().insert(message.id, Instant::now());
        async { Ok::<_, PublishError>(()) }
    })?;
    let mut events = subscriber.events();
    let handle = subscriber.spawn();
    // Wait until the stream is open, so the first rows do not measure the connection.
    tokio::time::timeout(Duration::from_secs(30), async {
        while let Ok(event) = events.recv().await {
            if matches!(event, txoutbox_client::Event::Connected { .. }) {
                break;
            }
        }
    })
    .await?;
    if group.is_some() {
        // A member reads only the partitions it owns: every one taken first.
        let free = format!(
            "SELECT count(*) FROM {}_group_partitions WHERE owner IS NULL",
            schema.table()
        );
        wait_until(
            "the group's stream to own every partition",
            Duration::from_secs(30),
            Duration::from_millis(20),
            || async {
                sqlx::query_scalar::<_, i64>(&free)
                    .fetch_one(&schema.pool)
                    .await
                    .is_ok_and(|n| n == 0)
            },
        )
        .await?;
    }
    // Let the first (empty) claims and the poller settle into their idle rhythm.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let commits = produce(plan, schema).await?;
    let total = commits.len();
    let outcome = wait_until(
        "every produced row to arrive",
        Duration::from_secs(60),
        Duration::from_millis(10),
        || {
            let have = arrivals.lock().unwrap().len();
            async move { have >= total }
        },
    )
    .await;
    let _ = tokio::time::timeout(Duration::from_secs(30), handle.stop()).await;
    let label = if group.is_some() {
        "latency-group"
    } else {
        "latency"
    };
    stop_server(plan, server, label).await;
    outcome?;

    let arrivals = arrivals.lock().unwrap();
    let mut sorted_ms: Vec<f64> = commits
        .iter()
        .filter_map(|(id, committed)| {
            let arrived = arrivals.get(id)?;
            Some(arrived.saturating_duration_since(*committed).as_secs_f64() * 1000.0)
        })
        .collect();
    sorted_ms.sort_by(f64::total_cmp);
    Ok(Latencies { sorted_ms })
}

/// Inserts `rate` rows per second for the configured duration, each an autocommit
/// `INSERT` on a pool of its own; returns (id, when its commit returned).
async fn produce(plan: &Plan, schema: &BenchSchema) -> anyhow::Result<Vec<(i64, Instant)>> {
    // Enough connections that a slow commit (an fsync stall on a busy disk) does not
    // hold back the rows after it, and a patient acquire, so a stall is measured rather
    // than aborting the run.
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .min_connections(8)
        .acquire_timeout(Duration::from_secs(300))
        .connect(&plan.database_url)
        .await?;
    let insert = format!(
        "INSERT INTO {} (topic, key, payload) VALUES ('{TOPIC}', $1, $2) RETURNING id",
        schema.table()
    );
    let count = (plan.latency_duration.as_secs_f64() * f64::from(plan.latency_rate)).ceil() as u64;
    let period = Duration::from_secs_f64(1.0 / f64::from(plan.latency_rate));
    let start = tokio::time::Instant::now();
    let mut inserts = tokio::task::JoinSet::new();
    for n in 0..count {
        tokio::time::sleep_until(start + period.mul_f64(n as f64)).await;
        let (pool, insert) = (pool.clone(), insert.clone());
        let key = format!("k{}", n % plan.keys.max(1));
        inserts.spawn(async move {
            let id: i64 = sqlx::query_scalar(&insert)
                .bind(key)
                .bind(format!("{{\"n\":{n}}}").into_bytes())
                .fetch_one(&pool)
                .await?;
            Ok::<_, sqlx::Error>((id, Instant::now()))
        });
    }
    let mut commits = Vec::with_capacity(count as usize);
    while let Some(joined) = inserts.join_next().await {
        commits.push(joined??);
    }
    pool.close().await;
    Ok(commits)
}
