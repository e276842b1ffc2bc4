//! The command line and the plan it resolves to (`--quick` shrinks every default).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};

use super::workload::Workload;

/// Sections of the benchmark, for `--only`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Section {
    /// Drain throughput through txoutboxd with the Rust client runtime.
    Drain,
    /// The same drain by the claim and ack SQL alone, in-process.
    Ceiling,
    /// The same drain by the Python original (txoutbox 0.2.2).
    Python,
    /// Commit-to-receive latency at a steady insert rate.
    Latency,
    /// One claim's time against the backlog's size and shape.
    ClaimCost,
    /// txoutboxd's RSS with idle subscriber streams open.
    Memory,
    /// What idle streams cost a subscriber with work: latency, transactions per insert.
    IdleCost,
    /// pgmq and the physical limit on the keyless backlog (and txoutboxd's keyless drain
    /// with `synchronous_commit = on`, beside pgmq at its default).
    Peers,
    /// Subscription groups: keyless, keyed and hot-key group drains beside pgmq, their
    /// PostgreSQL CPU per delivery, four groups on one backlog, commit-to-receive latency,
    /// and what a hot key's producers wait with groups, a plain table and strict ordering.
    Groups,
}

/// Measures txoutboxd against the SQL-only ceiling and the Python original, in one run
/// on this machine, and prints one table.
#[derive(Debug, Clone, Parser)]
#[command(name = "txoutbox-bench", version)]
pub struct Options {
    /// PostgreSQL to measure against (each measurement uses schemas of its own).
    #[arg(
        long,
        env = "TXOUTBOX_TEST_DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/test"
    )]
    pub database_url: String,
    /// A PostgreSQL setting (KEY=VALUE, repeatable) for the relay's own sessions only:
    /// txoutboxd's, the ceiling's and the claim-cost storage's, not the producers' nor
    /// the Python original's. For experiments, for example `synchronous_commit=off`.
    #[arg(long = "relay-pg-setting", value_name = "KEY=VALUE")]
    pub relay_pg_settings: Vec<String>,
    /// A PostgreSQL setting (KEY=VALUE, repeatable) for the Python original's sessions
    /// only (asyncpg server settings), for example `synchronous_commit=off` to compare
    /// both relays at the same durability: txoutboxd's sessions run with it always.
    #[arg(long = "python-pg-setting", value_name = "KEY=VALUE")]
    pub python_pg_settings: Vec<String>,
    /// Everything tiny (2,000 rows, 1 run, claim cost at 1k/10k, 50 idle streams), for
    /// the test suite: proves the tool works, measures nothing worth quoting.
    #[arg(long)]
    pub quick: bool,
    /// Only these sections (comma-separated); default all.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub only: Vec<Section>,
    /// Only these backlogs for the drain, ceiling, python and groups sections (comma-separated);
    /// default all. `--only drain,ceiling,python,peers --workloads keyless --rows 20000
    /// --runs 1` is the keyless comparison in about a minute, for a busy machine.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub workloads: Vec<Workload>,
    /// Runs of every figure; each figure is their median, with the spread.
    #[arg(long)]
    pub runs: Option<usize>,
    /// Rows of each drain backlog.
    #[arg(long)]
    pub rows: Option<u64>,
    /// Rows of the hot-key backlog (default: a fifth of `--rows`): one key drains one
    /// message after another, at a few hundred per second here, for the Python original
    /// as for a per-key-ordered client, so the full backlog would take most of an hour.
    #[arg(long)]
    pub hot_key_rows: Option<u64>,
    /// Distinct keys of the keyed workload.
    #[arg(long, default_value_t = 1000)]
    pub keys: u64,
    /// Batch size: txoutboxd's max_batch_size, the ceiling's and the Python relay's.
    #[arg(long, default_value_t = 100)]
    pub batch_size: u32,
    /// Each subscriber's window (max_in_flight); default twice the batch size, so a full
    /// batch can be claimed while the previous one is being answered.
    #[arg(long)]
    pub window: Option<u32>,
    /// Insert rate of the latency producer, rows per second.
    #[arg(long, default_value_t = 1000)]
    pub latency_rate: u32,
    /// How long the latency producer inserts, seconds.
    #[arg(long)]
    pub latency_seconds: Option<f64>,
    /// Pending rows at which one claim is timed (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub claim_sizes: Vec<u64>,
    /// Claims timed per claim-cost cell (the figure is their median).
    #[arg(long)]
    pub claim_samples: Option<usize>,
    /// Idle subscriber streams held open for the memory figure.
    #[arg(long)]
    pub idle_streams: Option<usize>,
    /// How long each of the 64 hot-key producers runs per table in the groups section,
    /// seconds (default 8; quick 1).
    #[arg(long)]
    pub producer_seconds: Option<f64>,
    /// Idle streams beside the one subscriber with work, for the idle-cost figures
    /// (comma-separated; default 0,1000,10000).
    #[arg(long, value_delimiter = ',')]
    pub idle_cost_streams: Vec<usize>,
    /// Idle streams spread over 63 topic filters of their own (every slot of
    /// `max_topic_filters` the subscriber with work leaves), for the idle-cost figures
    /// (comma-separated; default 1000,10000; quick 100).
    #[arg(long, value_delimiter = ',')]
    pub idle_cost_distinct: Vec<usize>,
    /// `RUST_LOG` of the txoutboxd processes (keep `info`: the harness waits for the
    /// "listening" line). For profiling, for example `info,sqlx::query=debug` logs
    /// every statement.
    #[arg(long, default_value = "info")]
    pub server_log: String,
    /// Serve each txoutboxd's Prometheus metrics (`server.metrics_listen`, depth gauges
    /// every second) and scrape every server once a second during the drains: what the
    /// metrics cost (BENCHMARKS.md, "Metrics overhead").
    #[arg(long)]
    pub metrics: bool,
    /// Write each txoutboxd's log lines into this directory when it stops.
    #[arg(long)]
    pub server_log_dir: Option<PathBuf>,
    /// Python 3 used to make the venv of the Python original.
    #[arg(long, default_value = "python3")]
    pub python: String,
    /// Where the venv of the Python original lives (default: `<target>/bench-python-venv`).
    #[arg(long)]
    pub venv: Option<PathBuf>,
    /// Also write the table as markdown to this file.
    #[arg(long)]
    pub markdown: Option<PathBuf>,
    /// Also write every measurement as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// The resolved settings of one benchmark run.
#[derive(Debug, Clone)]
pub struct Plan {
    pub database_url: String,
    /// `database_url` plus `--relay-pg-setting`s: what txoutboxd and the in-process
    /// storage connect with.
    pub relay_url: String,
    pub relay_pg_settings: Vec<String>,
    /// `database_url` plus `--python-pg-setting`s: what the Python original connects with.
    pub python_url: String,
    pub python_pg_settings: Vec<String>,
    pub quick: bool,
    pub sections: Vec<Section>,
    pub workloads: Vec<Workload>,
    pub runs: usize,
    pub rows: u64,
    pub hot_key_rows: u64,
    pub keys: u64,
    pub batch_size: u32,
    pub window: u32,
    pub latency_rate: u32,
    pub latency_duration: Duration,
    pub claim_sizes: Vec<u64>,
    pub claim_samples: usize,
    /// How long the hot-key producers of the groups section run per table.
    pub producer_duration: Duration,
    pub idle_streams: usize,
    pub idle_cost_streams: Vec<usize>,
    pub idle_cost_distinct: Vec<usize>,
    pub server_log: String,
    /// `--metrics`: metrics served and scraped during the drains.
    pub metrics: bool,
    pub server_log_dir: Option<PathBuf>,
    pub python: String,
    pub venv: PathBuf,
    pub markdown: Option<PathBuf>,
    pub json: Option<PathBuf>,
}

/// `url` with each `KEY=VALUE` of `settings` appended as the query parameter `param`
/// renders; `flag` names the option in errors.
fn with_settings(
    url: &str,
    flag: &str,
    settings: &[String],
    param: impl Fn(&str, &str) -> String,
) -> anyhow::Result<String> {
    let mut url = url.to_owned();
    for setting in settings {
        let (key, value) = setting
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("{flag} {setting}: expected KEY=VALUE"))?;
        let separator = if url.contains('?') { '&' } else { '?' };
        url = format!("{url}{separator}{}", param(key, value));
    }
    Ok(url)
}

impl Plan {
    pub fn from_options(options: Options) -> anyhow::Result<Self> {
        let quick = options.quick;
        let claim_sizes = if options.claim_sizes.is_empty() {
            pick(quick, vec![10_000, 100_000, 1_000_000], vec![1_000, 10_000])
        } else {
            options.claim_sizes
        };
        let sections = if options.only.is_empty() {
            Section::value_variants().to_vec()
        } else {
            options.only
        };
        let relay_url = with_settings(
            &options.database_url,
            "--relay-pg-setting",
            &options.relay_pg_settings,
            |key, value| format!("options[{key}]={value}"),
        )?;
        // asyncpg passes unknown DSN query parameters on as server settings.
        let python_url = with_settings(
            &options.database_url,
            "--python-pg-setting",
            &options.python_pg_settings,
            |key, value| format!("{key}={value}"),
        )?;
        let rows = options.rows.unwrap_or(pick(quick, 100_000, 2_000));
        let plan = Self {
            database_url: options.database_url,
            relay_url,
            relay_pg_settings: options.relay_pg_settings,
            python_url,
            python_pg_settings: options.python_pg_settings,
            quick,
            sections,
            workloads: if options.workloads.is_empty() {
                Workload::value_variants().to_vec()
            } else {
                options.workloads
            },
            runs: options.runs.unwrap_or(pick(quick, 3, 1)),
            rows,
            hot_key_rows: options.hot_key_rows.unwrap_or((rows / 5).max(1)),
            keys: options.keys,
            batch_size: options.batch_size,
            window: options.window.unwrap_or(options.batch_size * 2),
            latency_rate: options.latency_rate,
            latency_duration: Duration::from_secs_f64(
                options.latency_seconds.unwrap_or(pick(quick, 10.0, 1.0)),
            ),
            claim_sizes,
            claim_samples: options.claim_samples.unwrap_or(pick(quick, 9, 3)),
            producer_duration: Duration::from_secs_f64(
                options.producer_seconds.unwrap_or(pick(quick, 8.0, 1.0)),
            ),
            idle_streams: options.idle_streams.unwrap_or(pick(quick, 1000, 50)),
            idle_cost_streams: if options.idle_cost_streams.is_empty() {
                pick(quick, vec![0, 1000, 10_000], vec![0, 50])
            } else {
                options.idle_cost_streams
            },
            idle_cost_distinct: if options.idle_cost_distinct.is_empty() {
                pick(quick, vec![1000, 10_000], vec![100])
            } else {
                options.idle_cost_distinct
            },
            server_log: options.server_log,
            metrics: options.metrics,
            server_log_dir: options.server_log_dir,
            python: options.python,
            venv: options
                .venv
                .unwrap_or_else(|| target_dir().join("bench-python-venv")),
            markdown: options.markdown,
            json: options.json,
        };
        anyhow::ensure!(plan.runs >= 1, "--runs must be at least 1");
        anyhow::ensure!(
            plan.rows >= 1 && plan.hot_key_rows >= 1,
            "--rows and --hot-key-rows must be at least 1"
        );
        anyhow::ensure!(
            (1..=10_000).contains(&plan.batch_size) && (1..=10_000).contains(&plan.window),
            "--batch-size and --window must be within 1..=10000"
        );
        anyhow::ensure!(plan.latency_rate >= 1, "--latency-rate must be at least 1");
        anyhow::ensure!(
            plan.claim_samples >= 1,
            "--claim-samples must be at least 1"
        );
        Ok(plan)
    }

    pub fn wants(&self, section: Section) -> bool {
        self.sections.contains(&section)
    }
}

/// `small` in quick mode, else `full`.
fn pick<T>(quick: bool, full: T, small: T) -> T {
    if quick {
        small
    } else {
        full
    }
}

/// The cargo target directory: this binary is `target/<profile>/txoutbox-bench`.
fn target_dir() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.ancestors().nth(2).map(PathBuf::from))
        .unwrap_or_else(std::env::temp_dir)
}
