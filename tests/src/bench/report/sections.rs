//! The rows of the table, one function per section: drains (with pgmq's and the limit's
//! rows), latency, claim costs, memory, idle streams.

use super::*;
use crate::bench::claim_cost::{self, HeadState, Shape};
use crate::bench::drain::RelaySettings;
use crate::bench::idle_cost;
use crate::bench::peers::{Durability, PgmqAck, PGMQ_VERSION};
use crate::bench::{topologies, worker_counts};

/// PostgreSQL CPU per keyless message (claim + ack), at most this many µs: a relay should
/// cost the database little more than a bare queue's read and delete of the same row.
const PG_US_TARGET: f64 = 15.0;

pub(super) fn drain_rows(plan: &Plan, m: &Measurements, rows: &mut Vec<Row>) {
    for &workload in &plan.workloads {
        let desc = workload.describe(plan.keys);
        let topologies = topologies(workload);
        let python_target = if workload == Workload::HotKey {
            20.0
        } else {
            3.0
        };
        for &(servers, subscribers) in topologies {
            for settings in RelaySettings::ALL {
                let key = drain_key_at(workload, servers, subscribers, settings);
                let Some(rate) = m.figure(&key) else { continue };
                rows.push(drain_row(
                    plan,
                    m,
                    workload,
                    (servers, subscribers),
                    settings,
                    &key,
                    rate,
                    python_target,
                ));
            }
        }
        if workload != Workload::HotKey {
            let two = drain_key(workload, 2, 4);
            let one = drain_key(workload, 1, 4);
            if let Some(r) = m.ratio(&two, &one) {
                rows.push(Row {
                    section: "drain",
                    measurement: format!("txoutboxd, {desc}: 2 servers / 1 server (4 subscribers)"),
                    median: times(r),
                    spread: spread(&r, |v| format!("{v:.2}×")),
                    target: "≥ 1× (a second server never lowers it)".to_owned(),
                    verdict: if r.median >= 1.0 {
                        "met".to_owned()
                    } else if r.median >= 0.95 {
                        "met (within noise)".to_owned()
                    } else {
                        "MISSED".to_owned()
                    },
                    ..Row::default()
                });
            }
        }
        if workload == Workload::Keyless {
            let at_our_durability = RelaySettings::ALL
                .into_iter()
                .filter(|s| s.durability == Durability::Off);
            for settings in at_our_durability {
                for &(servers, subscribers) in topologies {
                    let key = drain_key_at(workload, servers, subscribers, settings);
                    let Some(f) = m.figure(&format!("{key}/pg-us")) else {
                        continue;
                    };
                    rows.push(pg_cost_row(servers, subscribers, settings, f));
                }
            }
        }
        let workers = worker_counts(workload);
        for &n in &workers {
            let key = ceiling_key(workload, n);
            if let Some(rate) = m.figure(&key) {
                rows.push(Row {
                    section: "ceiling",
                    measurement: format!(
                        "claim + ack SQL in-process, {desc}, {n} worker{}",
                        plural(n)
                    ),
                    median: format!("{} msg/s", count(rate.median)),
                    spread: spread(&rate, count),
                    notes: costs(m, &key),
                    ..Row::default()
                });
            }
        }
        for &n in &workers {
            if let Some(rate) = m.figure(&python_key(workload, n)) {
                rows.push(Row {
                    section: "python",
                    measurement: format!(
                        "txoutbox 0.2.2 Relay, {desc}, {n} relay process{}",
                        if n == 1 { "" } else { "es" }
                    ),
                    median: format!("{} msg/s", count(rate.median)),
                    spread: spread(&rate, count),
                    ..Row::default()
                });
            }
        }
        if workload == Workload::Keyless {
            peer_rows(m, &workers, rows);
        }
    }
}

/// What PostgreSQL spent per keyless message of one drain, against [`PG_US_TARGET`].
fn pg_cost_row(servers: usize, subscribers: usize, settings: RelaySettings, f: Figure) -> Row {
    Row {
        section: "pg cost",
        measurement: format!(
            "PostgreSQL CPU per keyless message (claim + ack), txoutboxd {servers}+{subscribers}{}",
            settings.describe()
        ),
        median: format!("{:.1} µs", f.median),
        spread: spread(&f, |v| format!("{v:.1} µs")),
        target: format!("≤ {PG_US_TARGET} µs"),
        verdict: verdict(&[f.median <= PG_US_TARGET]),
        notes: "every postgres process's utime + stime over the drain ÷ rows (the whole cluster's: exact only on a quiet machine)".to_owned(),
        ..Row::default()
    }
}

/// One drain through txoutboxd, with its ratios to the others of the same run.
#[allow(clippy::too_many_arguments)]
fn drain_row(
    plan: &Plan,
    m: &Measurements,
    workload: Workload,
    (servers, subscribers): (usize, usize),
    settings: RelaySettings,
    key: &str,
    rate: Figure,
    python_target: f64,
) -> Row {
    let desc = workload.describe(plan.keys);
    // Python and the ceiling ran at their own settings (BENCHMARKS.md): compared with
    // txoutboxd's defaults only.
    let default = settings == RelaySettings::DEFAULT;
    let durability = settings.durability;
    let vs_python = m
        .ratio(key, &python_key(workload, subscribers))
        .filter(|_| default);
    let vs_ceiling = m
        .ratio(key, &ceiling_key(workload, subscribers))
        .filter(|_| default);
    let vs_pgmq = m.ratio(key, &pgmq_key(PgmqAck::Delete, durability, subscribers));
    let vs_limit = m
        .ratio(key, &limit_key(subscribers))
        .filter(|_| durability == Durability::Off);
    let mut verdicts = Vec::new();
    let mut targets = Vec::new();
    if default {
        targets.push(format!("≥ {python_target}× Python"));
        if let Some(r) = vs_python {
            verdicts.push(r.median >= python_target);
        }
    }
    match workload {
        Workload::Keyless => {
            targets.push("≥ 1.2× pgmq".to_owned());
            if let Some(r) = vs_pgmq {
                verdicts.push(r.median >= 1.2);
            }
            // The limit runs with `synchronous_commit = off`.
            if durability == Durability::Off {
                targets.push("≥ 70% limit".to_owned());
                if let Some(r) = vs_limit {
                    verdicts.push(r.median >= 0.7);
                }
            }
        }
        Workload::Keyed if subscribers == 4 && default => {
            targets.push("≥ 1× pgmq keyless".to_owned());
            if let Some(r) = vs_pgmq {
                verdicts.push(r.median >= 1.0);
            }
        }
        _ => {}
    }
    if default {
        targets.push("≥ 70% ceiling".to_owned());
        if let Some(r) = vs_ceiling {
            verdicts.push(r.median >= 0.7);
        }
    }
    let cpu = |what: &str| {
        m.figure(&format!("{key}/cpu-{what}"))
            .map_or(0.0, |f| f.median)
    };
    let rss = m
        .figure(&format!("{key}/peak-rss-mib"))
        .map_or(0.0, |f| f.median);
    let sync = settings.describe();
    Row {
        section: "drain",
        measurement: format!(
            "txoutboxd, {desc}, {servers} server{} + {subscribers} subscriber{}{sync}",
            plural(servers),
            plural(subscribers)
        ),
        median: format!("{} msg/s", count(rate.median)),
        spread: spread(&rate, count),
        vs_python: vs_python.map(times).unwrap_or_default(),
        vs_pgmq: vs_pgmq.map(times).unwrap_or_default(),
        vs_limit: vs_limit.map(percent).unwrap_or_default(),
        vs_ceiling: vs_ceiling.map(percent).unwrap_or_default(),
        target: targets.join(", "),
        verdict: verdict(&verdicts),
        notes: format!(
            "CPU cores: server {:.2}, postgres {:.2}, client {:.2}; server peak RSS {rss:.1} MiB; {}",
            cpu("server"),
            cpu("postgres"),
            cpu("client"),
            costs(m, key),
        ),
    }
}

/// pgmq's and the physical limit's rows.
pub(super) fn peer_rows(m: &Measurements, workers: &[usize], rows: &mut Vec<Row>) {
    for &n in workers {
        let consumers = format!("{n} consumer{}", plural(n));
        for durability in [Durability::Off, Durability::Default] {
            for ack in [PgmqAck::Delete, PgmqAck::Archive] {
                let key = pgmq_key(ack, durability, n);
                let Some(rate) = m.figure(&key) else { continue };
                let ack = match ack {
                    PgmqAck::Delete => "delete",
                    PgmqAck::Archive => "archive",
                };
                let sync = match durability {
                    Durability::Off => "synchronous_commit = off",
                    Durability::Default => "synchronous_commit = on (its default)",
                };
                rows.push(Row {
                    section: "pgmq",
                    measurement: format!(
                        "pgmq {PGMQ_VERSION} (SQL-only), keyless, read 100 + {ack}, {consumers}, {sync}"
                    ),
                    median: format!("{} msg/s", count(rate.median)),
                    spread: spread(&rate, count),
                    notes: costs(m, &key),
                    ..Row::default()
                });
            }
        }
        let key = limit_key(n);
        if let Some(rate) = m.figure(&key) {
            rows.push(Row {
                section: "limit",
                measurement: format!(
                    "physical limit: UPDATE ... RETURNING of 100 (SKIP LOCKED) + DELETE by id, {n} worker{}, synchronous_commit = off",
                    plural(n)
                ),
                median: format!("{} msg/s", count(rate.median)),
                spread: spread(&rate, count),
                notes: costs(m, &key),
                ..Row::default()
            });
        }
    }
}

/// What a drain cost PostgreSQL per message, for the notes column.
fn costs(m: &Measurements, key: &str) -> String {
    let median = |what: &str| m.figure(&format!("{key}/{what}")).map(|f| f.median);
    let (Some(cpu), Some(wal)) = (median("pg-us"), median("wal")) else {
        return String::new();
    };
    let mut out = format!("postgres {cpu:.1} µs/msg, WAL {wal:.0} B/msg");
    if let (Some(upd), Some(hot), Some(del)) = (median("upd"), median("hot"), median("del")) {
        out += &format!("; per msg {upd:.2} updates ({hot:.2} HOT), {del:.2} deletes");
    }
    if let (Some(entries), Some(fetches)) = (median("idx"), median("fetch")) {
        out += &format!(", {entries:.1} index entries read, {fetches:.1} rows fetched by index");
    }
    out
}

pub(super) fn latency_rows(plan: &Plan, m: &Measurements, rows: &mut Vec<Row>) {
    for notify in [true, false] {
        let how = if notify {
            "LISTEN/NOTIFY"
        } else {
            "polling only"
        };
        for name in ["p50", "p90", "p99", "max"] {
            let Some(f) = m.figure(&latency_key(notify, name)) else {
                continue;
            };
            let limit = match (notify, name) {
                (true, "p50") => Some(2.0),
                (true, "p99") => Some(10.0),
                _ => None,
            };
            rows.push(Row {
                section: "latency",
                measurement: format!(
                    "commit → receive, {how}, {} rows/s, {name}",
                    count(f64::from(plan.latency_rate))
                ),
                median: ms(f.median),
                spread: spread(&f, ms),
                target: limit.map(|l| format!("< {l} ms")).unwrap_or_default(),
                verdict: limit.map(|l| verdict(&[f.median < l])).unwrap_or_default(),
                ..Row::default()
            });
        }
    }
}

/// Targets of the idle-streams figures: an idle stream must not cost the busy ones.
pub(super) fn idle_cost_rows(plan: &Plan, m: &Measurements, rows: &mut Vec<Row>) {
    let alone = m.figure(&idle_cost_key(0, "p99")).map(|f| f.median);
    for &idle in &plan.idle_cost_streams {
        let what = format!("{} idle streams", count(idle as f64));
        let key = |figure: &str| idle_cost_key(idle, figure);
        idle_figure_rows(m, key, &what, alone.filter(|_| idle > 0), rows);
    }
}

/// Idle streams spread over every filter slot the subscriber
/// with work leaves (63 of `max_topic_filters`, 64), none of them a topic inserted: an
/// insert wakes only the groups whose filter names its topic.
pub(super) fn idle_distinct_rows(plan: &Plan, m: &Measurements, rows: &mut Vec<Row>) {
    let alone = m.figure(&idle_cost_key(0, "p99")).map(|f| f.median);
    for &idle in &plan.idle_cost_distinct {
        let open = m
            .figure(&idle_distinct_key(idle, "open"))
            .map_or(f64::NAN, |f| f.median);
        let what = format!(
            "{} idle streams on {} distinct filters ({open:.0} open)",
            count(idle as f64),
            idle_cost::DISTINCT_FILTERS.min(idle)
        );
        let key = |figure: &str| idle_distinct_key(idle, figure);
        idle_figure_rows(m, key, &what, alone, rows);
    }
}

/// One idle-cost measurement's rows (`key` names its figures): the subscriber's p99,
/// within 2x of `alone` (its p99 with no idle stream) when given; database transactions
/// and claims per insert, a few: an idle stream must not cost the busy ones.
fn idle_figure_rows(
    m: &Measurements,
    key: impl Fn(&str) -> String,
    what: &str,
    alone: Option<f64>,
    rows: &mut Vec<Row>,
) {
    if let Some(f) = m.figure(&key("p99")) {
        let p50 = m.figure(&key("p50")).map_or(f64::NAN, |f| f.median);
        let limit = alone.map(|p99| (2.0 * p99).max(1.0));
        rows.push(Row {
            section: "idle cost",
            measurement: format!("insert → batch, one subscriber, {what}, p99"),
            median: ms(f.median),
            spread: spread(&f, ms),
            target: limit
                .map(|l| format!("< {} (2x with none)", ms(l)))
                .unwrap_or_default(),
            verdict: limit.map(|l| verdict(&[f.median < l])).unwrap_or_default(),
            notes: format!("p50 {}", ms(p50)),
            ..Row::default()
        });
    }
    let per_insert = [
        (
            "tx-per-insert",
            "database transactions",
            6.0,
            "the insert, its claim(s), its ack, and the background",
        ),
        (
            "claims-per-insert",
            "claims",
            4.0,
            "empty claims (server metrics) + batches received, idle polls included",
        ),
    ];
    for (figure, counted, below, notes) in per_insert {
        if let Some(f) = m.figure(&key(figure)) {
            rows.push(Row {
                section: "idle cost",
                measurement: format!("{counted} per insert, {what}"),
                median: format!("{:.2}", f.median),
                spread: spread(&f, |v| format!("{v:.2}")),
                target: format!("a few (< {below})"),
                verdict: verdict(&[f.median < below]),
                notes: notes.to_owned(),
                ..Row::default()
            });
        }
    }
}

pub(super) fn claim_rows(plan: &Plan, m: &Measurements, rows: &mut Vec<Row>) {
    if !plan.wants(Section::ClaimCost) {
        return;
    }
    let (Some(&smallest), Some(&largest)) =
        (plan.claim_sizes.iter().min(), plan.claim_sizes.iter().max())
    else {
        return;
    };
    for shape in Shape::ALL {
        for &state in shape.states() {
            let base = m.figure(&claim_cost::key(shape, state, smallest));
            for &size in &plan.claim_sizes {
                let Some(f) = m.figure(&claim_cost::key(shape, state, size)) else {
                    continue;
                };
                let mut row = Row {
                    section: "claim cost",
                    measurement: format!(
                        "claim of {}, {} pending, {}, {}",
                        plan.batch_size,
                        count(size as f64),
                        shape.describe(plan.keys),
                        state_label(state)
                    ),
                    median: ms(f.median),
                    spread: spread(&f, ms),
                    ..Row::default()
                };
                if size == largest && largest != smallest {
                    if let Some(base) = base {
                        let growth = f.median / base.median;
                        row.target = format!("≤ 2× the cost at {}", count(smallest as f64));
                        row.verdict = verdict(&[growth <= 2.0]);
                        row.notes = format!("{growth:.2}× the cost at {}", count(smallest as f64));
                    }
                }
                rows.push(row);
            }
        }
    }
}

fn state_label(state: HeadState) -> &'static str {
    match state {
        HeadState::Free => "head free",
        HeadState::Leased => "hot key's head leased elsewhere",
        HeadState::Retrying => "hot key's head waiting for its retry",
    }
}

pub(super) fn memory_rows(plan: &Plan, m: &Measurements, rows: &mut Vec<Row>) {
    let peaks: Vec<(String, Figure)> = m
        .names()
        .filter(|k| k.ends_with("/peak-rss-mib"))
        .filter_map(|k| Some((k.to_owned(), m.figure(k)?)))
        .collect();
    if let Some((key, f)) = peaks
        .iter()
        .max_by(|a, b| a.1.median.total_cmp(&b.1.median))
    {
        rows.push(Row {
            section: "memory",
            measurement: "txoutboxd peak RSS (VmHWM) during a drain, the highest".to_owned(),
            median: mib(f.median),
            spread: spread(f, mib),
            notes: format!("in {}", key.trim_end_matches("/peak-rss-mib")),
            ..Row::default()
        });
    }
    if let Some(f) = m.figure("memory/idle/rss-mib") {
        let baseline = m
            .figure("memory/idle/baseline-mib")
            .map_or(0.0, |b| b.median);
        let peak = m.figure("memory/idle/peak-mib").map_or(0.0, |b| b.median);
        rows.push(Row {
            section: "memory",
            measurement: format!(
                "txoutboxd RSS with {} idle subscriber streams",
                count(plan.idle_streams as f64)
            ),
            median: mib(f.median),
            spread: spread(&f, mib),
            target: "< 64 MiB (with 1,000 streams)".to_owned(),
            verdict: verdict(&[f.median < 64.0]),
            notes: format!(
                "{baseline:.1} MiB before the streams opened; peak {peak:.1} MiB while opening"
            ),
            ..Row::default()
        });
    }
}
