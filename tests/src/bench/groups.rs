//! Subscription groups (`docs/groups.md`) through real `txoutboxd` processes:
//!
//! - [`drain`]: a backlog loaded up front, drained through a group by Rust client
//!   runtimes ([`Subscriber`] with `.group`) whose publisher returns at once, one or
//!   more groups on the same backlog; what it cost PostgreSQL per delivery. A drain
//!   counts only once every group's positions passed every row, with nothing retrying,
//!   held or dead (`Admin.Stats`), so a drain that lost rows prints no figure;
//! - [`hot_key_producers`]: what producers pay on a hot key: 64 transactions at once
//!   each insert one row of the key `hot`, hold their transaction ~5 ms, and commit,
//!   into a plain table, a grouped outbox being drained, or a per-row outbox with strict
//!   ordering (its heads trigger makes each wait for the one before).
//!
//! Latency through a group is [`super::latency::measure_on`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::postgres::PgPoolOptions;
use txoutbox_client::{Subscriber, SubscriberHandle};
use txoutbox_proto::v1;

use super::drain::{noop_group_subscriber, server_config, start_server, stop_server, OUTBOX};
use super::pgcost::{Cost, CostMeter};
use super::procfs::{self, CpuShare, CpuSnapshot};
use super::stats::percentile;
use super::workload::{wait_until, BenchSchema, Workload, TOPIC};
use super::Plan;
use crate::Server;

/// Partitions of every benchmark outbox with groups (txoutboxd's default).
pub const PARTITIONS: u32 = 16;
/// Groups of the many-groups figure: each drains the same backlog with one subscriber.
pub const MANY: usize = 4;
/// Concurrent producer transactions of the hot-key figure.
pub const PRODUCERS: usize = 64;
/// How long each producer transaction stays open after its insert.
pub const HOLD: Duration = Duration::from_millis(5);

/// What one group drain measured.
#[derive(Debug, Clone, Copy)]
pub struct GroupDrain {
    /// Deliveries acked per second (rows × groups), from the subscribers' start to the
    /// last ack.
    pub rate: f64,
    /// Highest peak RSS (`VmHWM`) among the servers.
    pub peak_rss_kib: u64,
    pub cpu: CpuShare,
    /// Per delivery (rows × groups).
    pub cost: Cost,
}

/// The group's ordering for a backlog: none for the keyless one, by key otherwise.
fn ordering(workload: Workload) -> &'static str {
    match workload {
        Workload::Keyless => "none",
        Workload::Keyed | Workload::HotKey => "key",
    }
}

/// The name of group number `n`.
fn group_name(n: usize) -> String {
    format!("g{n}")
}

/// A `txoutboxd` configuration whose outbox `bench` (on `schema.outbox`, created by the
/// server) declares `groups` groups ordered as `ordering` says.
pub fn group_config(
    plan: &Plan,
    schema: &str,
    groups: usize,
    ordering: &str,
    notify_channel: Option<&str>,
) -> String {
    let mut config = server_config(plan, schema, false, notify_channel);
    config += &format!("create_schema = true\npartitions = {PARTITIONS}\n");
    for n in 0..groups {
        config += &format!(
            "[outboxes.{OUTBOX}.groups.{}]\nordering = \"{ordering}\"\n",
            group_name(n)
        );
    }
    config
}

/// Drains the backlog of `workload` through `groups` groups, each by `subscribers`
/// subscribers spread evenly over `servers` servers.
pub async fn drain(
    plan: &Plan,
    workload: Workload,
    (servers, subscribers): (usize, usize),
    groups: usize,
) -> anyhow::Result<GroupDrain> {
    let schema = BenchSchema::create(&plan.database_url, "groups").await?;
    let result = drain_in(plan, &schema, workload, (servers, subscribers), groups).await;
    schema.drop().await;
    result
}

async fn drain_in(
    plan: &Plan,
    schema: &BenchSchema,
    workload: Workload,
    (servers, subscribers): (usize, usize),
    groups: usize,
) -> anyhow::Result<GroupDrain> {
    let config = group_config(plan, &schema.name, groups, ordering(workload), None);
    let mut running = Vec::new();
    for _ in 0..servers {
        running.push(start_server(plan, &config).await);
    }
    let result = drain_on(plan, schema, workload, &running, subscribers, groups).await;
    let label = format!(
        "groups-{}-{servers}x{subscribers}x{groups}",
        workload.label()
    );
    for server in running {
        stop_server(plan, server, &label).await;
    }
    result
}

async fn drain_on(
    plan: &Plan,
    schema: &BenchSchema,
    workload: Workload,
    servers: &[Server],
    subscribers: usize,
    groups: usize,
) -> anyhow::Result<GroupDrain> {
    // Serving means the server made the table and the groups' tables: the backlog goes
    // in now, with no stream open to read it yet.
    let rows = workload.rows(plan);
    schema
        .load(&schema.table(), workload, plan.keys, rows)
        .await?;
    let pids: Vec<u32> = servers.iter().filter_map(Server::pid).collect();
    let mut built = Vec::new();
    for g in 0..groups {
        for i in 0..subscribers {
            let url = servers[i % servers.len()].url();
            let name = format!("bench-{}-{i}", group_name(g));
            let group = group_name(g);
            built.push((g, noop_group_subscriber(plan, url, &name, Some(&group))?));
        }
    }

    let meter = CostMeter::start(&schema.pool).await?;
    let before = CpuSnapshot::take(&pids);
    let started = Instant::now();
    let handles: Vec<(usize, SubscriberHandle)> = built
        .into_iter()
        .map(|(g, s)| (g, Subscriber::spawn(s)))
        .collect();
    let counters: Vec<_> = handles.iter().map(|(g, h)| (*g, h.counters())).collect();
    let acked = |g: usize| {
        counters
            .iter()
            .filter(|(of, _)| *of == g)
            .map(|(_, c)| c.snapshot().acked)
            .sum::<u64>()
    };
    let deliveries = rows * groups as u64;
    let deadline = Duration::from_secs(120) + Duration::from_millis(rows * 20);
    let finished = wait_until(
        "every group to drain the backlog",
        deadline,
        Duration::from_millis(2),
        || {
            let done = (0..groups).all(|g| acked(g) >= rows);
            async move { done }
        },
    )
    .await;
    let elapsed = started.elapsed();
    let after = CpuSnapshot::take(&pids);
    let cost = meter.finish(&schema.pool, deliveries).await;
    let peak_rss_kib = pids
        .iter()
        .filter_map(|pid| procfs::status_kib(*pid, "VmHWM"))
        .max()
        .unwrap_or(0);
    if let Err(error) = &finished {
        let got: Vec<u64> = (0..groups).map(&acked).collect();
        eprintln!("[bench] group drain stalled at {got:?} of {rows} acked: {error}");
    }
    // Acks counted by the clients are not proof: every group's positions must have
    // passed every row, with none left to retry, held or dead.
    let settled = match &finished {
        Ok(()) => every_group_settled(&servers[0], groups).await,
        Err(_) => Ok(()),
    };
    for (_, handle) in handles {
        let _ = tokio::time::timeout(Duration::from_secs(30), handle.stop()).await;
    }
    finished?;
    settled?;
    Ok(GroupDrain {
        rate: deliveries as f64 / elapsed.as_secs_f64(),
        peak_rss_kib,
        cpu: before.share_until(&after),
        cost: cost?,
    })
}

/// Waits until `Admin.Stats` shows every group with no lag, nothing retrying, held or
/// dead: its flushed positions passed every row of the table.
async fn every_group_settled(server: &Server, groups: usize) -> anyhow::Result<()> {
    let admin = server.admin().await;
    let last = Arc::new(std::sync::Mutex::new(String::new()));
    let seen = Arc::clone(&last);
    let check = move || {
        let (mut admin, seen) = (admin.clone(), Arc::clone(&seen));
        async move {
            let request = v1::StatsRequest {
                outbox: OUTBOX.into(),
            };
            let Ok(stats) = admin.stats(request).await else {
                return false;
            };
            let stats = stats.into_inner();
            let summary: Vec<String> = stats
                .groups
                .iter()
                .map(|g| {
                    format!(
                        "{}: lag {} retrying {} held {} dead {}",
                        g.group, g.lag_rows, g.retrying, g.held, g.dead
                    )
                })
                .collect();
            *seen.lock().unwrap() = summary.join("; ");
            stats.groups.len() == groups
                && stats
                    .groups
                    .iter()
                    .all(|g| g.lag_rows == 0 && g.retrying == 0 && g.held == 0 && g.dead == 0)
        }
    };
    let waited = wait_until(
        "every group's positions to pass every row",
        Duration::from_secs(30),
        Duration::from_millis(50),
        check,
    )
    .await;
    waited.map_err(|error| {
        let last = last.lock().unwrap().clone();
        anyhow::anyhow!("{error}; last Stats: {last}")
    })
}

/// Where the hot key's producers insert.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProducerTable {
    /// A table with the grouped outbox's columns, its primary key only, and no relay.
    Plain,
    /// The outbox with a group, drained meanwhile by txoutboxd and one subscriber.
    Grouped,
    /// The per-row outbox with strict ordering (its heads trigger), drained meanwhile by
    /// txoutboxd and one subscriber.
    Strict,
}

impl ProducerTable {
    pub const ALL: [Self; 3] = [Self::Plain, Self::Grouped, Self::Strict];

    pub fn label(self) -> &'static str {
        match self {
            Self::Plain => "plain",
            Self::Grouped => "grouped",
            Self::Strict => "strict",
        }
    }
}

/// Milliseconds of each producer's `INSERT` and of its whole transaction, sorted.
#[derive(Debug, Clone)]
pub struct ProducerTimes {
    pub insert_ms: Vec<f64>,
    pub transaction_ms: Vec<f64>,
}

impl ProducerTimes {
    /// p50 and p99 of the inserts, p99 of the transactions, and the count.
    pub fn figures(&self) -> [(&'static str, f64); 4] {
        [
            ("insert-p50", percentile(&self.insert_ms, 50.0)),
            ("insert-p99", percentile(&self.insert_ms, 99.0)),
            ("tx-p99", percentile(&self.transaction_ms, 99.0)),
            ("transactions", self.insert_ms.len() as f64),
        ]
    }
}

/// [`PRODUCERS`] producers on the key `hot` into `table` for `--producer-seconds`.
pub async fn hot_key_producers(plan: &Plan, table: ProducerTable) -> anyhow::Result<ProducerTimes> {
    let schema = BenchSchema::create(&plan.database_url, "producers").await?;
    let result = producers_in(plan, &schema, table).await;
    schema.drop().await;
    result
}

async fn producers_in(
    plan: &Plan,
    schema: &BenchSchema,
    table: ProducerTable,
) -> anyhow::Result<ProducerTimes> {
    let config = match table {
        ProducerTable::Strict => {
            let config = server_config(plan, &schema.name, true, None);
            format!("{config}create_schema = true\n")
        }
        // The plain table copies the grouped outbox's columns: a server makes it first.
        ProducerTable::Grouped | ProducerTable::Plain => {
            group_config(plan, &schema.name, 1, "key", None)
        }
    };
    let server = start_server(plan, &config).await;
    let target = if table == ProducerTable::Plain {
        stop_server(plan, server, "producers-plain-setup").await;
        let plain = format!("{}.plain", schema.name);
        sqlx::query(&format!(
            "CREATE TABLE {plain} (LIKE {} INCLUDING DEFAULTS INCLUDING IDENTITY \
             INCLUDING CONSTRAINTS, PRIMARY KEY (id))",
            schema.table()
        ))
        .execute(&schema.pool)
        .await?;
        (plain, None)
    } else {
        let group = (table == ProducerTable::Grouped).then(|| group_name(0));
        let subscriber =
            noop_group_subscriber(plan, server.url(), "bench-producers", group.as_deref())?;
        let handle = subscriber.spawn();
        (schema.table(), Some((server, handle)))
    };
    let (insert_into, relay) = target;
    let measured = produce(plan, &insert_into).await;
    if let Some((server, handle)) = relay {
        let counters = handle.counters();
        // Every row reaches the subscriber: the relay was really draining meanwhile.
        let rows = measured.as_ref().map_or(0, |t| t.insert_ms.len() as u64);
        let delivered = wait_until(
            "the producers' rows to be delivered",
            Duration::from_secs(60) + Duration::from_millis(rows * 5),
            Duration::from_millis(10),
            || {
                let done = counters.snapshot().acked >= rows;
                async move { done }
            },
        )
        .await;
        let _ = tokio::time::timeout(Duration::from_secs(30), handle.stop()).await;
        stop_server(plan, server, &format!("producers-{}", table.label())).await;
        delivered?;
    }
    measured
}

/// Runs the producers against `table` and returns their times.
async fn produce(plan: &Plan, table: &str) -> anyhow::Result<ProducerTimes> {
    let pool = PgPoolOptions::new()
        .max_connections(PRODUCERS as u32)
        .min_connections(PRODUCERS as u32)
        .acquire_timeout(Duration::from_secs(60))
        .connect(&plan.database_url)
        .await?;
    // Every connection open before the clock starts.
    let warm: Vec<_> = futures::future::join_all((0..PRODUCERS).map(|_| pool.acquire()))
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    drop(warm);
    let insert = Arc::new(format!(
        "INSERT INTO {table} (topic, key, payload) VALUES ('{TOPIC}', 'hot', $1)"
    ));
    let until = Instant::now() + plan.producer_duration;
    let tasks: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let (pool, insert) = (pool.clone(), Arc::clone(&insert));
            tokio::spawn(async move {
                let mut times = Vec::new();
                let mut n = 0u64;
                while Instant::now() < until {
                    let started = Instant::now();
                    let mut tx = pool.begin().await?;
                    let inserting = Instant::now();
                    sqlx::query(&insert)
                        .bind(format!("{{\"producer\":{p},\"n\":{n}}}").into_bytes())
                        .execute(&mut *tx)
                        .await?;
                    let inserted = inserting.elapsed();
                    tokio::time::sleep(HOLD).await;
                    tx.commit().await?;
                    times.push((inserted, started.elapsed()));
                    n += 1;
                }
                Ok::<_, sqlx::Error>(times)
            })
        })
        .collect();
    let mut insert_ms = Vec::new();
    let mut transaction_ms = Vec::new();
    for task in tasks {
        for (inserted, whole) in task.await?? {
            insert_ms.push(inserted.as_secs_f64() * 1000.0);
            transaction_ms.push(whole.as_secs_f64() * 1000.0);
        }
    }
    pool.close().await;
    anyhow::ensure!(!insert_ms.is_empty(), "no producer transaction finished");
    insert_ms.sort_by(f64::total_cmp);
    transaction_ms.sort_by(f64::total_cmp);
    Ok(ProducerTimes {
        insert_ms,
        transaction_ms,
    })
}
