//! `txoutbox-bench`: how fast `txoutboxd` relays, side by side with the ceiling the
//! database allows and with the Python original (`txoutbox` 0.2.2), in one run.
//!
//! Every measurement makes its own schema(s) in the local PostgreSQL and drops them
//! afterwards. Start at [`run`]; each section lives in its own module:
//! - [`drain`]: a backlog drained through real `txoutboxd` processes by the Rust client
//!   runtime ([`txoutbox_client::Subscriber`]) with a publisher that returns at once;
//! - [`ceiling`]: the same backlog drained by the claim and ack SQL alone, in-process
//!   through the [`Storage`](txoutbox_server::storage::Storage) trait;
//! - [`python`]: the same backlog drained by the Python original's `Relay`;
//! - [`peers`]: the keyless backlog drained by pgmq and by the physical limit (the least
//!   SQL that moves a row from pending to leased to done), with [`pgcost`] telling what
//!   each drain cost PostgreSQL per message;
//! - [`latency`]: commit-to-receive latency at a steady insert rate;
//! - [`claim_cost`]: one claim's time against the size and shape of the backlog;
//! - [`memory`]: `txoutboxd`'s RSS with many idle subscriber streams;
//! - [`idle_cost`]: what idle streams cost a subscriber with work: its insert-to-batch
//!   latency and the database transactions per insert;
//! - [`groups`]: subscription groups: group drains beside pgmq, their cost per delivery,
//!   four groups on one backlog, latency through a group, and what producers of a hot
//!   key wait.
//!
//! [`report`] turns the measurements into the one table. A measurement that fails is
//! left out of the table with a note saying why; the others still run.

pub mod ceiling;
pub mod claim_cost;
pub mod config;
pub mod drain;
pub mod groups;
pub mod idle_cost;
pub mod latency;
pub mod memory;
pub mod peers;
pub mod pgcost;
pub mod procfs;
pub mod python;
pub mod report;
pub mod stats;
pub mod workload;

use std::future::Future;
use std::time::Instant;

pub use config::{Options, Plan, Section};
use drain::RelaySettings;
use idle_cost::Filters::{Distinct, Shared};
use peers::{Durability, PeerResult, PgmqAck};
use report::Report;
use stats::Measurements;
use workload::Workload;

/// The drain topologies: (servers, subscribers).
pub const TOPOLOGIES: [(usize, usize); 3] = [(1, 1), (1, 4), (2, 4)];

/// The topologies measured for a workload: the hot key has one consumer at a time
/// whatever the topology, so it is measured with one server and one subscriber.
pub fn topologies(workload: Workload) -> &'static [(usize, usize)] {
    match workload {
        Workload::HotKey => &TOPOLOGIES[..1],
        _ => &TOPOLOGIES,
    }
}

/// Worker (and Python relay) counts matching the subscriber counts of the topologies.
pub fn worker_counts(workload: Workload) -> Vec<usize> {
    let mut workers: Vec<usize> = topologies(workload).iter().map(|(_, s)| *s).collect();
    workers.dedup();
    workers
}

/// Runs every selected section and returns the report (printing progress to stderr).
pub async fn run(plan: &Plan) -> anyhow::Result<Report> {
    let started = Instant::now();
    let machine_at_start = machine(plan).await;
    let mut m = Measurements::default();
    let python = if plan.wants(Section::Python) {
        match python::prepare(plan).await {
            Ok(python) => Some(python),
            Err(error) => {
                let message = format!("{error:#}");
                eprintln!();
                eprintln!("!!! THE PYTHON ORIGINAL IS NOT MEASURED: {message}");
                eprintln!();
                m.note(format!("THE PYTHON ORIGINAL WAS NOT MEASURED: {message}"));
                None
            }
        }
    } else {
        None
    };

    for run in 1..=plan.runs {
        for &workload in &plan.workloads {
            let label = workload.label();
            if plan.wants(Section::Ceiling) {
                for n in worker_counts(workload) {
                    let what = format!("ceiling, {label}, {n} worker(s)");
                    if let Some(result) =
                        attempt(&mut m, plan, run, &what, ceiling::drain(plan, workload, n)).await
                    {
                        record_peer(&mut m, &report::ceiling_key(workload, n), run, &result);
                    }
                }
            }
            if plan.wants(Section::Drain) {
                for &topology in topologies(workload) {
                    let settings = RelaySettings::DEFAULT;
                    drain_once(&mut m, plan, run, workload, topology, settings).await;
                }
            }
            if let Some(python) = &python {
                for n in worker_counts(workload) {
                    let what = format!("Python original, {label}, {n} relay(s)");
                    let drained = python::drain(plan, python, workload, n);
                    if let Some(rate) = attempt(&mut m, plan, run, &what, drained).await {
                        m.record(report::python_key(workload, n), run, rate);
                    }
                }
            }
            if workload == Workload::Keyless && plan.wants(Section::Peers) {
                peers_once(&mut m, plan, run).await;
            }
        }
        if plan.wants(Section::Groups) {
            groups_once(&mut m, plan, run).await;
        }
        if plan.wants(Section::Latency) {
            for notify in [true, false] {
                let how = if notify { "LISTEN/NOTIFY" } else { "polling" };
                let what = format!("latency, {how}");
                if let Some(latency) =
                    attempt(&mut m, plan, run, &what, latency::measure(plan, notify)).await
                {
                    for (name, value) in latency.percentiles() {
                        m.record(report::latency_key(notify, name), run, value);
                    }
                }
            }
        }
        if plan.wants(Section::Memory) {
            let what = format!("memory, {} idle streams", plan.idle_streams);
            if let Some(memory) =
                attempt(&mut m, plan, run, &what, memory::idle_streams(plan)).await
            {
                m.record("memory/idle/rss-mib", run, memory.rss_kib as f64 / 1024.0);
                m.record("memory/idle/peak-mib", run, memory.peak_kib as f64 / 1024.0);
                m.record(
                    "memory/idle/baseline-mib",
                    run,
                    memory.baseline_kib as f64 / 1024.0,
                );
            }
        }
        if plan.wants(Section::IdleCost) {
            for &idle in &plan.idle_cost_streams {
                let what = format!("idle cost, {idle} idle streams");
                if let Some(cost) = attempt(
                    &mut m,
                    plan,
                    run,
                    &what,
                    idle_cost::measure(plan, idle, Shared),
                )
                .await
                {
                    for (name, value) in cost.latencies.percentiles() {
                        m.record(report::idle_cost_key(idle, name), run, value);
                    }
                    let key = report::idle_cost_key(idle, "tx-per-insert");
                    m.record(key, run, cost.transactions_per_insert);
                    let key = report::idle_cost_key(idle, "claims-per-insert");
                    m.record(key, run, cost.claims_per_insert);
                }
            }
            for &idle in &plan.idle_cost_distinct {
                let what = format!("idle cost, {idle} idle streams on distinct filters");
                let measured = idle_cost::measure(plan, idle, Distinct);
                if let Some(cost) = attempt(&mut m, plan, run, &what, measured).await {
                    for (name, value) in cost.latencies.percentiles() {
                        m.record(report::idle_distinct_key(idle, name), run, value);
                    }
                    let key = report::idle_distinct_key(idle, "tx-per-insert");
                    m.record(key, run, cost.transactions_per_insert);
                    let key = report::idle_distinct_key(idle, "claims-per-insert");
                    m.record(key, run, cost.claims_per_insert);
                    let key = report::idle_distinct_key(idle, "open");
                    m.record(key, run, cost.open as f64);
                }
            }
        }
    }
    if plan.wants(Section::ClaimCost) {
        claim_cost::measure(plan, &mut m).await?;
    }
    let machine = format!(
        "{machine_at_start}; load average at the end: {}",
        load_average()
    );
    Ok(Report::build(plan, m, machine, started.elapsed()))
}

/// One drain through txoutboxd, recorded with its costs.
async fn drain_once(
    m: &mut Measurements,
    plan: &Plan,
    run: usize,
    workload: Workload,
    (servers, subscribers): (usize, usize),
    settings: RelaySettings,
) {
    let what = format!(
        "txoutboxd, {}, {servers} server(s) + {subscribers} subscriber(s){}",
        workload.label(),
        settings.describe()
    );
    let drained = drain::drain(plan, workload, (servers, subscribers), settings);
    let Some(result) = attempt(m, plan, run, &what, drained).await else {
        return;
    };
    let key = report::drain_key_at(workload, servers, subscribers, settings);
    m.record(
        format!("{key}/peak-rss-mib"),
        run,
        result.peak_rss_kib as f64 / 1024.0,
    );
    m.record(format!("{key}/cpu-server"), run, result.cpu.servers);
    m.record(format!("{key}/cpu-postgres"), run, result.cpu.postgres);
    m.record(format!("{key}/cpu-client"), run, result.cpu.bench);
    let peer = PeerResult {
        rate: result.rate,
        cost: result.cost,
        ops: result.ops,
    };
    record_peer(m, &key, run, &peer);
}

/// pgmq (delete and archive, at txoutboxd's durability and at its default), the physical
/// limit, and txoutboxd's keyless drain with `synchronous_commit = on` and with
/// `delete_on_ack` (pgmq's `delete` counterpart), for 1 and 4 consumers: what a keyless
/// message costs here against a queue built for PostgreSQL.
async fn peers_once(m: &mut Measurements, plan: &Plan, run: usize) {
    for n in worker_counts(Workload::Keyless) {
        for durability in [Durability::Off, Durability::Default] {
            for ack in [PgmqAck::Delete, PgmqAck::Archive] {
                let what = format!("pgmq {ack:?}, {n} consumer(s), {}", durability.label());
                let drained = peers::pgmq(plan, ack, durability, n);
                if let Some(result) = attempt(m, plan, run, &what, drained).await {
                    record_peer(m, &report::pgmq_key(ack, durability, n), run, &result);
                }
            }
        }
        let what = format!("physical limit, {n} worker(s)");
        if let Some(result) = attempt(m, plan, run, &what, peers::limit(plan, n)).await {
            record_peer(m, &report::limit_key(n), run, &result);
        }
        if plan.wants(Section::Drain) {
            for settings in RelaySettings::ALL.into_iter().skip(1) {
                drain_once(m, plan, run, Workload::Keyless, (1, n), settings).await;
            }
        }
    }
}

/// The subscription groups section: pgmq beside the keyless group drains (unless `peers`
/// measured it in this run already), the group drains, four groups on one backlog,
/// latency through a group, and the hot key's producers.
async fn groups_once(m: &mut Measurements, plan: &Plan, run: usize) {
    if plan.workloads.contains(&Workload::Keyless) {
        for n in worker_counts(Workload::Keyless) {
            let key = report::pgmq_key(PgmqAck::Delete, Durability::Off, n);
            if m.has(&key, run) {
                continue;
            }
            let what = format!("pgmq Delete, {n} consumer(s), sync-off (beside the groups)");
            let drained = peers::pgmq(plan, PgmqAck::Delete, Durability::Off, n);
            if let Some(result) = attempt(m, plan, run, &what, drained).await {
                record_peer(m, &key, run, &result);
            }
        }
    }
    for &workload in &plan.workloads {
        for &topology in topologies(workload) {
            group_drain_once(m, plan, run, workload, topology, 1).await;
        }
    }
    if plan.workloads.contains(&Workload::Keyless) {
        group_drain_once(m, plan, run, Workload::Keyless, (1, 1), groups::MANY).await;
    }
    let what = "latency through a group, LISTEN/NOTIFY";
    let measured = latency::measure_on(plan, true, Some("g0"));
    if let Some(latency) = attempt(m, plan, run, what, measured).await {
        for (name, value) in latency.percentiles() {
            m.record(report::group_latency_key(name), run, value);
        }
    }
    for table in groups::ProducerTable::ALL {
        let what = format!(
            "{} producers of one hot key, {} table",
            groups::PRODUCERS,
            table.label()
        );
        let measured = groups::hot_key_producers(plan, table);
        if let Some(times) = attempt(m, plan, run, &what, measured).await {
            for (name, value) in times.figures() {
                m.record(report::producer_key(table, name), run, value);
            }
        }
    }
}

/// One drain through `groups` subscription groups, recorded with its costs.
async fn group_drain_once(
    m: &mut Measurements,
    plan: &Plan,
    run: usize,
    workload: Workload,
    (servers, subscribers): (usize, usize),
    groups: usize,
) {
    let what = format!(
        "txoutboxd, {} group(s), {}, {servers} server(s) + {subscribers} subscriber(s) each",
        groups,
        workload.label()
    );
    let drained = groups::drain(plan, workload, (servers, subscribers), groups);
    let Some(result) = attempt(m, plan, run, &what, drained).await else {
        return;
    };
    let key = report::group_key(workload, servers, subscribers, groups);
    m.record(&key, run, result.rate);
    m.record(format!("{key}/pg-us"), run, result.cost.cpu_us);
    m.record(format!("{key}/wal"), run, result.cost.wal_bytes);
    m.record(
        format!("{key}/peak-rss-mib"),
        run,
        result.peak_rss_kib as f64 / 1024.0,
    );
    m.record(format!("{key}/cpu-server"), run, result.cpu.servers);
    m.record(format!("{key}/cpu-postgres"), run, result.cpu.postgres);
    m.record(format!("{key}/cpu-client"), run, result.cpu.bench);
}

/// A drain's rate and what it cost PostgreSQL, under `key`.
fn record_peer(m: &mut Measurements, key: &str, run: usize, result: &PeerResult) {
    m.record(key, run, result.rate);
    m.record(format!("{key}/pg-us"), run, result.cost.cpu_us);
    m.record(format!("{key}/wal"), run, result.cost.wal_bytes);
    m.record(format!("{key}/upd"), run, result.ops.updates);
    m.record(format!("{key}/hot"), run, result.ops.hot_updates);
    m.record(format!("{key}/del"), run, result.ops.deletes);
    m.record(format!("{key}/idx"), run, result.ops.index_entries);
    m.record(format!("{key}/fetch"), run, result.ops.index_fetches);
}

/// Runs one measurement; a failure becomes a note and leaves the figure out.
async fn attempt<T>(
    m: &mut Measurements,
    plan: &Plan,
    run: usize,
    what: &str,
    measurement: impl Future<Output = anyhow::Result<T>>,
) -> Option<T> {
    eprintln!("[bench] run {run}/{}: {what}", plan.runs);
    match measurement.await {
        Ok(value) => Some(value),
        Err(error) => {
            eprintln!("[bench] FAILED: {what}: {error:#}");
            m.note(format!("run {run}: {what} failed: {error:#}"));
            None
        }
    }
}

/// The machine in one line: cores, memory, PostgreSQL version, load average now.
async fn machine(plan: &Plan) -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let memory_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|info| {
            let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
            line.split_whitespace().nth(1)?.parse::<f64>().ok()
        })
        .map_or(0.0, |kib| kib / 1024.0 / 1024.0);
    let version = async {
        let pool = sqlx::PgPool::connect(&plan.database_url).await.ok()?;
        let version: String = sqlx::query_scalar("SHOW server_version")
            .fetch_one(&pool)
            .await
            .ok()?;
        pool.close().await;
        Some(version)
    }
    .await
    .unwrap_or_else(|| "unknown".to_owned());
    format!(
        "{cores} cores, {memory_gib:.1} GiB memory, PostgreSQL {version}; load average at the start: {}",
        load_average()
    )
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}
