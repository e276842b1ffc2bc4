//! The rows of the subscription groups section, with their targets.

use super::*;
use crate::bench::groups::{ProducerTable, HOLD, MANY, PRODUCERS};
use crate::bench::peers::{Durability, PgmqAck};
use crate::bench::topologies;

/// A keyless group drain against pgmq (`delete`, at the relay's durability) with as many
/// consumers as it has subscribers.
const VS_PGMQ: f64 = 1.5;
/// The 1,000-keys group drain against the keyless one of the same topology.
const KEYED_VS_KEYLESS: f64 = 0.9;
/// The 1,000-keys group drain against the Python original with as many relays.
const KEYED_VS_PYTHON: f64 = 4.0;
/// The hot key's group drain against the keyless one.
const HOT_VS_KEYLESS: f64 = 0.7;
/// PostgreSQL CPU per delivered message, µs.
const PG_US: f64 = 5.0;
/// PostgreSQL CPU per delivery with four groups against one group's.
const MANY_VS_ONE: f64 = 1.2;
/// Commit-to-receive through a group with NOTIFY, ms.
const LATENCY_P50_MS: f64 = 1.0;
const LATENCY_P99_MS: f64 = 5.0;
/// A hot key's insert p99 into the grouped outbox against the plain table's.
const PRODUCER_VS_PLAIN: f64 = 1.5;

fn describe(workload: Workload, plan: &Plan) -> String {
    match workload {
        Workload::Keyless => "keyless, ordering none".to_owned(),
        Workload::Keyed => format!("{} keys, ordering key", count(plan.keys as f64)),
        Workload::HotKey => format!(
            "one hot key, ordering key, {} rows",
            count(plan.hot_key_rows as f64)
        ),
    }
}

fn topology(servers: usize, subscribers: usize) -> String {
    format!(
        "{servers} server{} + {subscribers} subscriber{}",
        plural(servers),
        plural(subscribers)
    )
}

/// `a / b` of the same runs, or "not measured" when either is missing.
fn ratio_cell(r: Option<Figure>) -> String {
    r.map(times).unwrap_or_else(|| "not measured".to_owned())
}

pub(super) fn group_rows(plan: &Plan, m: &Measurements, rows: &mut Vec<Row>) {
    if !plan.wants(Section::Groups) {
        return;
    }
    for &workload in &plan.workloads {
        for &(servers, subscribers) in topologies(workload) {
            if let Some(row) = drain_row(plan, m, workload, servers, subscribers) {
                rows.push(row);
            }
        }
        if workload != Workload::HotKey {
            let two = group_key(workload, 2, 4, 1);
            let one = group_key(workload, 1, 4, 1);
            if let Some(r) = m.ratio(&two, &one) {
                rows.push(Row {
                    section: "groups",
                    measurement: format!(
                        "group drain, {}: 2 servers / 1 server (4 subscribers)",
                        describe(workload, plan)
                    ),
                    median: times(r),
                    spread: spread(&r, |v| format!("{v:.2}×")),
                    target: "≥ 1× (a second replica never lowers it)".to_owned(),
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
    }
    for &workload in &plan.workloads {
        for &(servers, subscribers) in topologies(workload) {
            let key = group_key(workload, servers, subscribers, 1);
            let Some(f) = m.figure(&format!("{key}/pg-us")) else {
                continue;
            };
            rows.push(pg_cost_row(
                format!(
                    "PostgreSQL CPU per delivered message, group drain, {}, {}",
                    describe(workload, plan),
                    topology(servers, subscribers)
                ),
                f,
                &key,
                m,
            ));
        }
    }
    many_groups_rows(plan, m, rows);
    latency_rows(plan, m, rows);
    producer_rows(m, rows);
}

/// One group drain, with its ratios to pgmq, the keyless group drain and Python.
fn drain_row(
    plan: &Plan,
    m: &Measurements,
    workload: Workload,
    servers: usize,
    subscribers: usize,
) -> Option<Row> {
    let key = group_key(workload, servers, subscribers, 1);
    let rate = m.figure(&key)?;
    let mut row = Row {
        section: "groups",
        measurement: format!(
            "group drain, {}, {}",
            describe(workload, plan),
            topology(servers, subscribers)
        ),
        median: format!("{} msg/s", count(rate.median)),
        spread: spread(&rate, count),
        ..Row::default()
    };
    let mut targets = Vec::new();
    let mut verdicts = Vec::new();
    let mut notes = Vec::new();
    match workload {
        Workload::Keyless => {
            let pgmq = pgmq_key(PgmqAck::Delete, Durability::Off, subscribers);
            let vs = m.ratio(&key, &pgmq);
            row.vs_pgmq = ratio_cell(vs);
            targets.push(format!(
                "≥ {VS_PGMQ}× pgmq (delete, synchronous_commit = off)"
            ));
            verdicts.extend(vs.map(|r| r.median >= VS_PGMQ));
        }
        Workload::Keyed | Workload::HotKey => {
            // The hot key is measured with one subscriber: against the keyless 1 + 1.
            let keyless = group_key(Workload::Keyless, servers, subscribers, 1);
            let vs = m.ratio(&key, &keyless);
            let least = if workload == Workload::Keyed {
                KEYED_VS_KEYLESS
            } else {
                HOT_VS_KEYLESS
            };
            targets.push(format!("≥ {:.0}% keyless group", least * 100.0));
            verdicts.extend(vs.map(|r| r.median >= least));
            notes.push(match vs {
                Some(r) => format!("{} of the keyless group drain", percent(r)),
                None => "keyless group drain not measured".to_owned(),
            });
            if workload == Workload::Keyed {
                let vs = m.ratio(&key, &python_key(workload, subscribers));
                row.vs_python = ratio_cell(vs);
                targets.push(format!("≥ {KEYED_VS_PYTHON}× Python"));
                verdicts.extend(vs.map(|r| r.median >= KEYED_VS_PYTHON));
            }
        }
    }
    let cpu = |what: &str| {
        m.figure(&format!("{key}/cpu-{what}"))
            .map_or(0.0, |f| f.median)
    };
    notes.push(format!(
        "CPU cores: server {:.2}, postgres {:.2}, client {:.2}; {}",
        cpu("server"),
        cpu("postgres"),
        cpu("client"),
        costs_per_delivery(m, &key)
    ));
    row.target = targets.join(", ");
    row.verdict = verdict(&verdicts);
    row.notes = notes.join("; ");
    Some(row)
}

fn costs_per_delivery(m: &Measurements, key: &str) -> String {
    let median = |what: &str| m.figure(&format!("{key}/{what}")).map(|f| f.median);
    match (median("pg-us"), median("wal")) {
        (Some(cpu), Some(wal)) => format!("postgres {cpu:.1} µs/delivery, WAL {wal:.0} B/delivery"),
        _ => String::new(),
    }
}

fn pg_cost_row(measurement: String, f: Figure, key: &str, m: &Measurements) -> Row {
    let wal = m.figure(&format!("{key}/wal")).map_or(String::new(), |w| {
        format!("; WAL {:.0} B/delivery", w.median)
    });
    Row {
        section: "groups",
        measurement,
        median: format!("{:.1} µs", f.median),
        spread: spread(&f, |v| format!("{v:.1} µs")),
        target: format!("≤ {PG_US} µs"),
        verdict: verdict(&[f.median <= PG_US]),
        notes: format!(
            "every postgres process's utime + stime over the drain ÷ deliveries (the whole cluster's: exact only on a quiet machine){wal}"
        ),
        ..Row::default()
    }
}

/// Four groups draining one keyless backlog, each with one subscriber.
fn many_groups_rows(plan: &Plan, m: &Measurements, rows: &mut Vec<Row>) {
    let many = group_key(Workload::Keyless, 1, 1, MANY);
    let one = group_key(Workload::Keyless, 1, 1, 1);
    let what = format!(
        "{MANY} groups on one backlog ({}), 1 server + 1 subscriber per group",
        describe(Workload::Keyless, plan)
    );
    if let Some(rate) = m.figure(&many) {
        rows.push(Row {
            section: "groups",
            measurement: format!("group drain, {what}"),
            median: format!("{} deliveries/s", count(rate.median)),
            spread: spread(&rate, count),
            notes: format!(
                "rows × groups ÷ time to the last group's last ack; {}",
                costs_per_delivery(m, &many)
            ),
            ..Row::default()
        });
    }
    if let Some(f) = m.figure(&format!("{many}/pg-us")) {
        let vs = m.ratio(&format!("{many}/pg-us"), &format!("{one}/pg-us"));
        rows.push(Row {
            section: "groups",
            measurement: format!("PostgreSQL CPU per delivery, {what}"),
            median: format!("{:.1} µs", f.median),
            spread: spread(&f, |v| format!("{v:.1} µs")),
            target: format!("≤ {MANY_VS_ONE}× one group's (1 + 1)"),
            verdict: vs
                .map(|r| verdict(&[r.median <= MANY_VS_ONE]))
                .unwrap_or_default(),
            notes: format!(
                "total postgres CPU ÷ (rows × {MANY}); {} one group's",
                ratio_cell(vs)
            ),
            ..Row::default()
        });
    }
}

fn latency_rows(plan: &Plan, m: &Measurements, rows: &mut Vec<Row>) {
    for name in ["p50", "p90", "p99", "max"] {
        let Some(f) = m.figure(&group_latency_key(name)) else {
            continue;
        };
        let limit = match name {
            "p50" => Some(LATENCY_P50_MS),
            "p99" => Some(LATENCY_P99_MS),
            _ => None,
        };
        rows.push(Row {
            section: "groups",
            measurement: format!(
                "commit → receive through a group (ordering key, {} keys), LISTEN/NOTIFY, {} rows/s, {name}",
                count(plan.keys as f64),
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

fn producer_rows(m: &Measurements, rows: &mut Vec<Row>) {
    let plain = producer_key(ProducerTable::Plain, "insert-p99");
    for table in ProducerTable::ALL {
        let key = |figure: &str| producer_key(table, figure);
        let Some(f) = m.figure(&key("insert-p99")) else {
            continue;
        };
        let what = match table {
            ProducerTable::Plain => "a plain table (the same columns, no relay)",
            ProducerTable::Grouped => "the grouped outbox, drained by txoutboxd meanwhile",
            ProducerTable::Strict => {
                "the per-row outbox with strict_ordering (heads trigger), drained by txoutboxd meanwhile"
            }
        };
        let median = |figure: &str| m.figure(&key(figure)).map_or(f64::NAN, |f| f.median);
        let mut row = Row {
            section: "groups",
            measurement: format!(
                "insert of one row of a hot key, {PRODUCERS} producer transactions each held {} ms, into {what}, p99",
                HOLD.as_millis()
            ),
            median: ms(f.median),
            spread: spread(&f, ms),
            notes: format!(
                "insert p50 {}; whole transaction p99 {}; {} transactions",
                ms(median("insert-p50")),
                ms(median("tx-p99")),
                count(median("transactions"))
            ),
            ..Row::default()
        };
        if table != ProducerTable::Plain {
            let vs = m.ratio(&key("insert-p99"), &plain);
            row.notes += &format!("; {} the plain table's p99", ratio_cell(vs));
            if table == ProducerTable::Grouped {
                row.target = format!("≤ {PRODUCER_VS_PLAIN}× the plain table's");
                row.verdict = vs
                    .map(|r| verdict(&[r.median <= PRODUCER_VS_PLAIN]))
                    .unwrap_or_default();
            }
        }
        rows.push(row);
    }
}
