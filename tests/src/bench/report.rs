//! The one table: every figure with its spread, the ratios of the same runs, the target
//! it answers to, and whether it is met. Printed as a markdown table (readable
//! as plain text too), optionally written as markdown and JSON.

mod groups;
mod sections;

use std::fmt::Write as _;
use std::time::Duration;

use serde_json::json;

use self::groups::group_rows;
use self::sections::{
    claim_rows, drain_rows, idle_cost_rows, idle_distinct_rows, latency_rows, memory_rows,
};
use super::drain::RelaySettings;
use super::groups::ProducerTable;
use super::peers::{Durability, PgmqAck};
use super::stats::{Figure, Measurements};
use super::workload::Workload;
use super::{Plan, Section};

pub fn drain_key(workload: Workload, servers: usize, subscribers: usize) -> String {
    format!("drain/{}/{servers}x{subscribers}", workload.label())
}

/// [`drain_key`] of a drain whose relay ran as `settings` say.
pub fn drain_key_at(
    workload: Workload,
    servers: usize,
    subscribers: usize,
    settings: RelaySettings,
) -> String {
    let mut key = drain_key(workload, servers, subscribers);
    if settings.durability == Durability::Default {
        key = format!("{key}/{}", settings.durability.label());
    }
    if settings.delete_on_ack {
        key += "/delete-on-ack";
    }
    key
}

pub fn pgmq_key(ack: PgmqAck, durability: Durability, consumers: usize) -> String {
    let ack = match ack {
        PgmqAck::Delete => "delete",
        PgmqAck::Archive => "archive",
    };
    format!("pgmq/{ack}/{}/{consumers}", durability.label())
}

pub fn limit_key(workers: usize) -> String {
    format!("limit/{workers}")
}

pub fn ceiling_key(workload: Workload, workers: usize) -> String {
    format!("ceiling/{}/{workers}", workload.label())
}

pub fn python_key(workload: Workload, relays: usize) -> String {
    format!("python/{}/{relays}", workload.label())
}

pub fn idle_cost_key(idle: usize, figure: &str) -> String {
    format!("idle-cost/{idle}/{figure}")
}

/// The idle-cost figures with a topic filter per idle stream.
pub fn idle_distinct_key(idle: usize, figure: &str) -> String {
    format!("idle-cost-distinct/{idle}/{figure}")
}

/// A drain through `groups` subscription groups, each with `subscribers` subscribers.
pub fn group_key(workload: Workload, servers: usize, subscribers: usize, groups: usize) -> String {
    let mut key = format!("groups/{}/{servers}x{subscribers}", workload.label());
    if groups > 1 {
        key += &format!("/{groups}-groups");
    }
    key
}

pub fn group_latency_key(percentile: &str) -> String {
    format!("groups/latency/notify/{percentile}")
}

pub fn producer_key(table: ProducerTable, figure: &str) -> String {
    format!("groups/producers/{}/{figure}", table.label())
}

pub fn latency_key(notify: bool, percentile: &str) -> String {
    let how = if notify { "notify" } else { "polling" };
    format!("latency/{how}/{percentile}")
}

/// One line of the table.
#[derive(Debug, Clone, Default)]
pub struct Row {
    pub section: &'static str,
    pub measurement: String,
    pub median: String,
    pub spread: String,
    pub vs_python: String,
    pub vs_pgmq: String,
    pub vs_limit: String,
    pub vs_ceiling: String,
    pub target: String,
    pub verdict: String,
    pub notes: String,
}

const HEADER: [&str; 11] = [
    "section",
    "measurement",
    "median",
    "spread (min–max)",
    "ours / Python",
    "ours / pgmq",
    "ours / limit",
    "ours / ceiling",
    "target",
    "verdict",
    "notes",
];

impl Row {
    fn cells(&self) -> [&str; 11] {
        [
            self.section,
            &self.measurement,
            &self.median,
            &self.spread,
            &self.vs_python,
            &self.vs_pgmq,
            &self.vs_limit,
            &self.vs_ceiling,
            &self.target,
            &self.verdict,
            &self.notes,
        ]
    }
}

pub struct Report {
    pub rows: Vec<Row>,
    /// Cores, memory, PostgreSQL version, load average at the start and the end.
    pub machine: String,
    pub notes: Vec<String>,
    pub settings: String,
    pub measurements: Measurements,
    pub elapsed: Duration,
}

impl Report {
    pub fn build(plan: &Plan, m: Measurements, machine: String, elapsed: Duration) -> Self {
        let mut rows = Vec::new();
        drain_rows(plan, &m, &mut rows);
        group_rows(plan, &m, &mut rows);
        latency_rows(plan, &m, &mut rows);
        claim_rows(plan, &m, &mut rows);
        memory_rows(plan, &m, &mut rows);
        idle_cost_rows(plan, &m, &mut rows);
        idle_distinct_rows(plan, &m, &mut rows);
        let settings = format!(
            "{rows} rows per drain ({hot} for the hot key), batch {batch}, window {window}, {keys} keys, {runs} run(s) per figure; \
             latency at {rate} rows/s for {secs:.0}s; claim cost at {sizes} pending rows, {samples} claims per cell; \
             {streams} idle streams{groups}{relay}{python}{quick}",
            rows = plan.rows,
            hot = plan.hot_key_rows,
            batch = plan.batch_size,
            window = plan.window,
            keys = plan.keys,
            runs = plan.runs,
            rate = plan.latency_rate,
            secs = plan.latency_duration.as_secs_f64(),
            sizes = plan.claim_sizes.iter().map(|s| count(*s as f64)).collect::<Vec<_>>().join(" / "),
            samples = plan.claim_samples,
            streams = plan.idle_streams,
            groups = if plan.wants(Section::Groups) {
                format!(
                    "; groups: {} partitions, hot-key producers for {:.0}s per table",
                    super::groups::PARTITIONS,
                    plan.producer_duration.as_secs_f64()
                )
            } else {
                String::new()
            },
            relay = if plan.relay_pg_settings.is_empty() {
                String::new()
            } else {
                format!("; relay sessions with {}", plan.relay_pg_settings.join(", "))
            },
            python = if plan.python_pg_settings.is_empty() {
                String::new()
            } else {
                format!("; Python sessions with {}", plan.python_pg_settings.join(", "))
            },
            quick = if plan.quick { " (QUICK MODE: tiny sizes, figures not meaningful)" } else { "" },
        );
        Self {
            rows,
            machine,
            notes: m.notes().to_vec(),
            settings,
            measurements: m,
            elapsed,
        }
    }

    /// The table as markdown, column-aligned so it also reads as plain text.
    pub fn table(&self) -> String {
        let mut widths = HEADER.map(|h| h.chars().count());
        for row in &self.rows {
            for (width, cell) in widths.iter_mut().zip(row.cells()) {
                *width = (*width).max(cell.chars().count());
            }
        }
        let line = |cells: [&str; 11]| {
            let mut out = String::from("|");
            for (cell, width) in cells.iter().zip(widths) {
                let pad = width - cell.chars().count();
                let _ = write!(out, " {cell}{} |", " ".repeat(pad));
            }
            out.push('\n');
            out
        };
        let separator: String = widths
            .iter()
            .map(|w| format!(" {} |", "-".repeat(*w)))
            .collect();
        let mut out = format!("{}|{separator}\n", line(HEADER));
        for row in &self.rows {
            out += &line(row.cells());
        }
        out
    }

    /// Settings, the table and the notes, as printed and as written to `--markdown`.
    pub fn render(&self) -> String {
        let mut out = format!(
            "txoutbox-bench: {}\nmachine: {}\n\n",
            self.settings, self.machine
        );
        out += &self.table();
        for note in &self.notes {
            let _ = write!(out, "\nNOTE: {note}");
        }
        let _ = writeln!(out, "\n(benchmark took {:.0}s)", self.elapsed.as_secs_f64());
        out
    }

    pub fn json(&self) -> serde_json::Value {
        let rows: Vec<_> = self
            .rows
            .iter()
            .map(|row| {
                let cells = row.cells();
                serde_json::Value::Object(
                    HEADER
                        .iter()
                        .zip(cells)
                        .map(|(h, c)| ((*h).to_owned(), json!(c)))
                        .collect(),
                )
            })
            .collect();
        json!({
            "settings": self.settings,
            "machine": self.machine,
            "elapsed_seconds": self.elapsed.as_secs_f64(),
            "notes": self.notes,
            "rows": rows,
            "measurements": self.measurements.all(),
        })
    }
}

fn verdict(checks: &[bool]) -> String {
    match checks {
        [] => String::new(),
        _ if checks.iter().all(|c| *c) => "met".to_owned(),
        _ => "MISSED".to_owned(),
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

fn spread(f: &Figure, show: impl Fn(f64) -> String) -> String {
    if f.samples < 2 {
        return format!("{} (1 sample)", show(f.median));
    }
    format!("{} – {}", show(f.min), show(f.max))
}

fn times(f: Figure) -> String {
    if f.samples < 2 {
        return format!("{:.2}×", f.median);
    }
    format!("{:.2}× ({:.2}–{:.2})", f.median, f.min, f.max)
}

fn percent(f: Figure) -> String {
    if f.samples < 2 {
        return format!("{:.0}%", f.median * 100.0);
    }
    format!(
        "{:.0}% ({:.0}–{:.0})",
        f.median * 100.0,
        f.min * 100.0,
        f.max * 100.0
    )
}

fn ms(v: f64) -> String {
    if v < 10.0 {
        format!("{v:.2} ms")
    } else {
        format!("{v:.1} ms")
    }
}

fn mib(v: f64) -> String {
    format!("{v:.1} MiB")
}

/// A count with thousands separators: 12345.6 -> "12,346".
pub fn count(v: f64) -> String {
    let digits = format!("{:.0}", v.max(0.0));
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_have_separators() {
        assert_eq!(count(1234567.4), "1,234,567");
        assert_eq!(count(999.0), "999");
        assert_eq!(count(1000.0), "1,000");
    }
}
