//! Drain throughput through `txoutboxd`: a backlog loaded up front, drained by Rust
//! client runtimes ([`Subscriber`]) whose publisher returns at once, through one or two
//! real server processes.

use std::time::{Duration, Instant};

use txoutbox_client::{Message, PublishError, Subscriber, SubscriberHandle};

use super::peers::Durability;
use super::pgcost::{row_ops, Cost, CostMeter, RowOps};
use super::procfs::{self, CpuShare, CpuSnapshot};
use super::workload::{wait_until, BenchSchema, Workload, TABLE};
use super::Plan;
use crate::Server;

/// Name of the outbox in every benchmark server's configuration.
pub const OUTBOX: &str = "bench";

/// What one drain measured.
#[derive(Debug, Clone, Copy)]
pub struct DrainResult {
    /// Messages acked per second, from the subscribers' start to the last ack.
    pub rate: f64,
    /// Highest peak RSS (`VmHWM`) among the servers.
    pub peak_rss_kib: u64,
    pub cpu: CpuShare,
    pub cost: Cost,
    pub ops: RowOps,
}

/// How the benchmark's servers run the outbox: the durability of their sessions, and what
/// an ack does to the row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RelaySettings {
    pub durability: Durability,
    /// `delete_on_ack`: an ack deletes the row, as pgmq's `delete` does, instead of
    /// keeping it `done`.
    pub delete_on_ack: bool,
}

impl RelaySettings {
    /// txoutboxd's defaults: `synchronous_commit = off`, delivered rows kept `done`.
    pub const DEFAULT: Self = Self {
        durability: Durability::Off,
        delete_on_ack: false,
    };

    /// Every combination the benchmark measures, the defaults first; the others only for
    /// the keyless comparison with pgmq (`peers`).
    pub const ALL: [Self; 4] = [
        Self::DEFAULT,
        Self {
            durability: Durability::Default,
            delete_on_ack: false,
        },
        Self {
            durability: Durability::Off,
            delete_on_ack: true,
        },
        Self {
            durability: Durability::Default,
            delete_on_ack: true,
        },
    ];

    /// How a row of the table names these settings, empty for the defaults.
    pub fn describe(self) -> String {
        let mut out = String::new();
        if self.durability == Durability::Default {
            out += ", synchronous_commit = on";
        }
        if self.delete_on_ack {
            out += ", delete_on_ack";
        }
        out
    }
}

/// A `txoutboxd` configuration with one outbox `bench` on `schema.outbox`, with
/// txoutboxd's defaults ([`RelaySettings::DEFAULT`]).
pub fn server_config(
    plan: &Plan,
    schema: &str,
    strict_ordering: bool,
    notify_channel: Option<&str>,
) -> String {
    server_config_with(
        plan,
        schema,
        strict_ordering,
        notify_channel,
        RelaySettings::DEFAULT,
    )
}

/// [`server_config`] with the relay run as `settings` say.
pub fn server_config_with(
    plan: &Plan,
    schema: &str,
    strict_ordering: bool,
    notify_channel: Option<&str>,
    settings: RelaySettings,
) -> String {
    let synchronous_commit = match settings.durability {
        Durability::Off => "off",
        Durability::Default => "on",
    };
    let delete_on_ack = settings.delete_on_ack;
    let notify = notify_channel
        .map(|channel| format!("notify_channel = \"{channel}\"\n"))
        .unwrap_or_default();
    let metrics = if plan.metrics {
        "metrics_listen = \"127.0.0.1:0\"\nmetrics_depth_interval = \"1s\"\n"
    } else {
        ""
    };
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
log_format = "json"
drain_timeout = "5s"
{metrics}
[databases.main]
url = "{url}"
synchronous_commit = "{synchronous_commit}"

[outboxes.{OUTBOX}]
database = "main"
schema = "{schema}"
table = "{TABLE}"
strict_ordering = {strict_ordering}
delete_on_ack = {delete_on_ack}
max_batch_size = {batch}
{notify}"#,
        url = plan.relay_url,
        batch = plan.batch_size,
    )
}

/// Starts a server quietly (`--server-log`, only warnings echoed) and waits until it
/// serves.
pub async fn start_server(plan: &Plan, config: &str) -> Server {
    let server = Server::start_with_log(config, &plan.server_log, false).await;
    server.wait_serving(OUTBOX).await;
    server
}

/// Stops a server with SIGTERM and waits for it, so its connections are gone before the
/// schema is dropped; keeps its log in `--server-log-dir` if asked.
pub async fn stop_server(plan: &Plan, mut server: Server, label: &str) {
    server.terminate();
    let wait = server.wait_exit(Duration::from_secs(20));
    let _ = tokio::time::timeout(Duration::from_secs(20), wait).await;
    if let Some(dir) = &plan.server_log_dir {
        let path = dir.join(format!("{label}-{}.log", server.address.replace(':', "_")));
        let lines = server.log.lock().unwrap().join("\n");
        let written = std::fs::create_dir_all(dir).and_then(|()| std::fs::write(&path, lines));
        if let Err(error) = written {
            eprintln!("[bench] cannot write {}: {error}", path.display());
        }
    }
}

/// A Rust client runtime on `url` whose publisher returns at once.
pub fn noop_subscriber(plan: &Plan, url: String, name: &str) -> anyhow::Result<Subscriber> {
    noop_group_subscriber(plan, url, name, None)
}

/// [`noop_subscriber`] joining the subscription group `group`, if given.
pub fn noop_group_subscriber(
    plan: &Plan,
    url: String,
    name: &str,
    group: Option<&str>,
) -> anyhow::Result<Subscriber> {
    let mut builder = Subscriber::builder([url], OUTBOX)
        .name(name)
        .max_in_flight(plan.window)
        .concurrency(plan.window as usize);
    if let Some(group) = group {
        builder = builder.group(group);
    }
    Ok(builder.build(|_message: Message| async { Ok::<_, PublishError>(()) })?)
}

/// Scrapes every server's `/metrics` once a second, as a Prometheus would, until aborted.
fn scrape_every_second(servers: &[Server]) -> tokio::task::JoinHandle<()> {
    let urls: Vec<String> = servers.iter().map(Server::metrics_url).collect();
    tokio::spawn(async move {
        let client = reqwest::Client::new();
        let mut ticks = tokio::time::interval(Duration::from_secs(1));
        loop {
            ticks.tick().await;
            for url in &urls {
                // A failed scrape is Prometheus's problem, not the drain's: carry on.
                if let Ok(response) = client.get(url).send().await {
                    let _ = response.bytes().await;
                }
            }
        }
    })
}

/// Drains the backlog of `workload` through `servers` servers by `subscribers`
/// subscribers (spread evenly over the servers), the servers run as `settings` say.
pub async fn drain(
    plan: &Plan,
    workload: Workload,
    (servers, subscribers): (usize, usize),
    settings: RelaySettings,
) -> anyhow::Result<DrainResult> {
    let schema = BenchSchema::create(&plan.database_url, "drain").await?;
    let topology = (servers, subscribers);
    let result = drain_in(plan, &schema, workload, topology, settings).await;
    schema.drop().await;
    result
}

async fn drain_in(
    plan: &Plan,
    schema: &BenchSchema,
    workload: Workload,
    (servers, subscribers): (usize, usize),
    settings: RelaySettings,
) -> anyhow::Result<DrainResult> {
    let storage = schema
        .create_outbox(&plan.database_url, workload.strict_ordering(), 1)
        .await?;
    drop(storage);
    schema
        .load(&schema.table(), workload, plan.keys, workload.rows(plan))
        .await?;

    let strict = workload.strict_ordering();
    let config = server_config_with(plan, &schema.name, strict, None, settings);
    let mut running = Vec::new();
    for _ in 0..servers {
        running.push(start_server(plan, &config).await);
    }
    let pids: Vec<u32> = running.iter().filter_map(Server::pid).collect();
    let built = (0..subscribers)
        .map(|i| noop_subscriber(plan, running[i % servers].url(), &format!("bench-{i}")))
        .collect::<anyhow::Result<Vec<_>>>()?;

    let scrapes = plan.metrics.then(|| scrape_every_second(&running));
    let meter = CostMeter::start(&schema.pool).await?;
    let before = CpuSnapshot::take(&pids);
    let started = Instant::now();
    let handles: Vec<SubscriberHandle> = built.into_iter().map(Subscriber::spawn).collect();
    let counters: Vec<_> = handles.iter().map(SubscriberHandle::counters).collect();
    let rows = workload.rows(plan);
    let acked = || counters.iter().map(|c| c.snapshot().acked).sum::<u64>();
    // Generous: even the Python original's slowest workload drains faster than this.
    let deadline = Duration::from_secs(120) + Duration::from_millis(rows * 20);
    let finished = wait_until(
        "the backlog to drain",
        deadline,
        Duration::from_millis(2),
        || {
            let done = acked() >= rows;
            async move { done }
        },
    )
    .await;
    let elapsed = started.elapsed();
    let after = CpuSnapshot::take(&pids);
    let cost = meter.finish(&schema.pool, workload.rows(plan)).await;
    let peak_rss_kib = pids
        .iter()
        .filter_map(|pid| procfs::status_kib(*pid, "VmHWM"))
        .max()
        .unwrap_or(0);
    if let Err(error) = &finished {
        let got = acked();
        eprintln!("[bench] drain stalled at {got} of {rows} acked: {error}");
    }
    for handle in handles {
        let _ = tokio::time::timeout(Duration::from_secs(30), handle.stop()).await;
    }
    if let Some(scrapes) = scrapes {
        scrapes.abort();
    }
    let label = format!("drain-{}-{servers}x{subscribers}", workload.label());
    for server in running {
        stop_server(plan, server, &label).await;
    }
    finished?;
    if settings.delete_on_ack {
        let left = schema.count_all(&schema.table()).await?;
        anyhow::ensure!(
            left == 0,
            "after the drain {left} rows are left, expected none"
        );
    } else {
        let done = schema.count(&schema.table(), "done").await?;
        anyhow::ensure!(
            done as u64 == rows,
            "after the drain {done} rows are done, expected {rows}"
        );
    }
    // The servers stopped: their sessions published the table's statistics.
    let ops = row_ops(&schema.pool, &schema.table(), 2 * rows, rows).await?;
    Ok(DrainResult {
        rate: rows as f64 / elapsed.as_secs_f64(),
        peak_rss_kib,
        cpu: before.share_until(&after),
        cost: cost?,
        ops,
    })
}
