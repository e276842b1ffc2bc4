//! The history checker: what the producer committed, what the subscribers published and
//! when each fault struck, set against each other.
//!
//! - **Lost**: a committed row never published, or not `done` at the end of the drain.
//! - **Order violation**: a publish of `(k, n)` while some committed `(k, m < n)` had not
//!   been published before it. A row published again after later ones of its key (a
//!   redelivery) is a duplicate, not a violation: every earlier row was published.
//! - **Duplicates**: every publish of an id after its first. One is *explained* by a fault
//!   when the first publish was in flight at the fault (from [`IN_FLIGHT_BEFORE`] before it
//!   began to [`AFTER_END`] after it ended), the repeat came after the fault began, and one
//!   of the two publishers was in the fault's scope; the rest are *unexplained*.
//! - Per fault: the time from its end until deliveries (first publishes) run at 90% of
//!   the steady rate in the [`BEFORE`] before it began: the delivery rate, but no more than
//!   the producer's commit rate then. Deliveries above the producer's rate were a backlog
//!   (an earlier fault's) draining, not a rate the relay could keep up once caught up. A
//!   fault after which the producer stopped before deliveries got there is not measured.
//!   Also the producer's insert latency while it lasted (at least [`LATENCY_WINDOW`]);
//!   and for a fault that strikes a replica, the new rows the other replica's subscribers
//!   received meanwhile and their longest gap.
//!
//! With subscription groups every group receives every row, so [`check_groups`] judges
//! each group alone, by the same rules, on the publishes of its members: a row is lost
//! for a group its members never published or that the group had not passed at the end
//! of the drain, and a duplicate is a second publish within the group.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::driver::Fault;
use super::history::{Insert, Publish};
use super::processes::LEASE_MS;

const SECOND: i64 = 1_000_000;
/// How long before a fault a publish may have been waiting for its ack: a lease.
pub const IN_FLIGHT_BEFORE: i64 = LEASE_MS as i64 * 1000 + 2 * SECOND;
/// How long after a fault's end its consequences (reconnections) may still show.
pub const AFTER_END: i64 = 2 * SECOND;
/// The throughput a fault's recovery is measured against: this long before it.
pub const BEFORE: i64 = 5 * SECOND;
/// A fault shorter than this is measured for insert latency over this long.
pub const LATENCY_WINDOW: i64 = SECOND;
/// Recovery is looked for this long after a fault's end.
const RECOVERY_HORIZON: i64 = 30 * SECOND;
const RECOVERY_STEP: i64 = SECOND / 10;

pub struct Input<'a> {
    pub inserts: &'a [Insert],
    /// In time order.
    pub publishes: &'a [Publish],
    pub faults: &'a [Fault],
    /// `(id, status)` of the rows not `done` after the drain.
    pub unfinished: &'a [(i64, String)],
    /// The replica each subscriber uses.
    pub replica_of: &'a HashMap<String, usize>,
}

#[derive(Debug, Clone, Copy, Default)]
pub struct Latency {
    pub count: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl Latency {
    fn of(mut micros: Vec<i64>) -> Self {
        if micros.is_empty() {
            return Self::default();
        }
        micros.sort_unstable();
        let at = |q: f64| micros[((micros.len() - 1) as f64 * q).round() as usize] as f64 / 1e3;
        Self {
            count: micros.len(),
            p50_ms: at(0.5),
            p99_ms: at(0.99),
            max_ms: at(1.0),
        }
    }
}

/// A publish of a row published before, with no fault to explain it: both publishes.
#[derive(Debug, Clone)]
pub struct UnexplainedDuplicate {
    pub id: i64,
    /// `(subscriber, time, attempt)` of the first publish and of the repeat.
    pub first: (String, i64, u32),
    pub repeat: (String, i64, u32),
}

#[derive(Debug, Clone)]
pub struct OrderViolation {
    pub key: String,
    pub published: u64,
    pub missing: u64,
    pub subscriber: String,
    pub at_us: i64,
}

/// Deliveries of the replica a fault did not strike, while it lasted.
#[derive(Debug, Clone, Copy)]
pub struct HealthyDelivery {
    pub rows: usize,
    pub longest_gap_s: f64,
}

/// How throughput came back after a fault's end.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Recovery {
    /// Back to 90% of the steady rate this many seconds after the end.
    After(f64),
    /// Not back within the horizon while the producer kept producing.
    NotWithin,
    /// Nothing to measure against: no deliveries before the fault, or the producer
    /// stopped before deliveries could come back.
    Unmeasured,
}

impl Recovery {
    /// Seconds to recover, infinite when it did not; `None` when unmeasured.
    pub fn seconds(self) -> Option<f64> {
        match self {
            Recovery::After(s) => Some(s),
            Recovery::NotWithin => Some(f64::INFINITY),
            Recovery::Unmeasured => None,
        }
    }
}

#[derive(Debug, Clone)]
pub struct FaultFindings {
    pub recovery: Recovery,
    /// The steady rate before the fault (rows/s) that recovery is measured against.
    pub pre_rate: f64,
    pub inserts: Latency,
    /// The same inserts' statements, before their commits (see [`Insert::statement_us`]).
    pub statements: Latency,
    pub healthy: Option<HealthyDelivery>,
    pub duplicates: usize,
}

#[derive(Debug, Default)]
pub struct Findings {
    /// The subscription group judged; `None` with per-row claims.
    pub group: Option<String>,
    /// With groups: what the group had not passed when the drain ended (its `Stats`),
    /// `None` when it had passed every row.
    pub unpassed: Option<String>,
    pub committed: usize,
    pub inserts_failed: usize,
    pub publishes: usize,
    pub delivered: usize,
    pub never_published: Vec<i64>,
    pub not_done: Vec<(i64, String)>,
    /// Published ids the producer does not know as committed (a failed insert that did
    /// commit); not counted against anything else.
    pub unknown_published: usize,
    pub order_violations: Vec<OrderViolation>,
    pub duplicates_explained: usize,
    pub duplicates_unexplained: Vec<UnexplainedDuplicate>,
    pub per_fault: Vec<FaultFindings>,
    /// Inserts outside every fault's window.
    pub inserts_quiet: Latency,
    /// Inserts inside the windows of faults that strike a replica.
    pub inserts_relay_faults: Latency,
    /// The statements of those inserts, before their commits.
    pub statements_quiet: Latency,
    pub statements_relay_faults: Latency,
}

impl Findings {
    /// Rows lost by id; a group's [`Findings::unpassed`] is counted apart.
    pub fn lost(&self) -> usize {
        let mut lost: HashSet<i64> = self.never_published.iter().copied().collect();
        lost.extend(self.not_done.iter().map(|(id, _)| *id));
        lost.len()
    }
}

pub fn check(input: &Input<'_>) -> Findings {
    let committed: HashMap<i64, &Insert> = input
        .inserts
        .iter()
        .filter_map(|insert| insert.id.map(|id| (id, insert)))
        .collect();
    let mut findings = Findings {
        committed: committed.len(),
        inserts_failed: input.inserts.len() - committed.len(),
        publishes: input.publishes.len(),
        ..Findings::default()
    };
    let mut first: HashMap<i64, &Publish> = HashMap::new();
    for publish in input.publishes {
        if !committed.contains_key(&publish.id) {
            findings.unknown_published += 1;
        }
        first.entry(publish.id).or_insert(publish);
    }
    findings.delivered = first.len();
    findings.never_published = committed
        .keys()
        .filter(|id| !first.contains_key(id))
        .copied()
        .collect();
    findings.never_published.sort_unstable();
    let committed_ids: HashSet<i64> = committed.keys().copied().collect();
    findings.not_done = input
        .unfinished
        .iter()
        .filter(|(id, _)| committed_ids.contains(id))
        .cloned()
        .collect();
    findings.order_violations = order_violations(input);
    let (explained, unexplained, by_fault) = duplicates(input, &first);
    findings.duplicates_explained = explained;
    findings.duplicates_unexplained = unexplained;

    let mut firsts: Vec<&Publish> = first.values().copied().collect();
    firsts.sort_by_key(|p| p.at_us);
    let first_times: Vec<i64> = firsts.iter().map(|p| p.at_us).collect();
    let mut commit_times: Vec<i64> = committed.values().map(|i| i.at_us + i.latency_us).collect();
    commit_times.sort_unstable();
    for (index, fault) in input.faults.iter().enumerate() {
        let (recovery, pre_rate) = recovery(&first_times, &commit_times, fault);
        let window_end = fault.end_us.max(fault.start_us + LATENCY_WINDOW);
        let during: Vec<&Insert> = input
            .inserts
            .iter()
            .filter(|i| (fault.start_us..=window_end).contains(&i.at_us))
            .collect();
        let inserts = Latency::of(during.iter().map(|i| i.latency_us).collect());
        let statements = Latency::of(during.iter().map(|i| i.statement_us).collect());
        let healthy = fault
            .kind
            .strikes_replica()
            .then(|| healthy_delivery(&firsts, fault, input.replica_of));
        findings.per_fault.push(FaultFindings {
            recovery,
            pre_rate,
            inserts,
            statements,
            healthy,
            duplicates: by_fault[index],
        });
    }
    let in_window = |fault: &Fault, at: i64| {
        (fault.start_us..=fault.end_us.max(fault.start_us + LATENCY_WINDOW)).contains(&at)
    };
    let (mut quiet, mut relay) = (Vec::new(), Vec::new());
    for insert in input.inserts {
        let faults: Vec<&Fault> = input
            .faults
            .iter()
            .filter(|f| in_window(f, insert.at_us))
            .collect();
        if faults.is_empty() {
            quiet.push(insert);
        } else if faults.iter().any(|f| f.kind.strikes_replica()) {
            relay.push(insert);
        }
    }
    let of = |inserts: &[&Insert], field: fn(&Insert) -> i64| {
        Latency::of(inserts.iter().map(|i| field(i)).collect())
    };
    findings.inserts_quiet = of(&quiet, |i| i.latency_us);
    findings.inserts_relay_faults = of(&relay, |i| i.latency_us);
    findings.statements_quiet = of(&quiet, |i| i.statement_us);
    findings.statements_relay_faults = of(&relay, |i| i.statement_us);
    findings
}

/// Judges each of `groups` on its members' publishes alone; `unpassed` is what each group
/// had not passed at the end of the drain, by group (absent: everything passed).
pub fn check_groups(
    input: &Input<'_>,
    groups: &[String],
    unpassed: &HashMap<String, String>,
) -> Vec<Findings> {
    groups
        .iter()
        .map(|group| {
            let publishes: Vec<Publish> = input
                .publishes
                .iter()
                .filter(|p| p.group.as_ref() == Some(group))
                .cloned()
                .collect();
            let mut findings = check(&Input {
                publishes: &publishes,
                unfinished: &[],
                ..*input
            });
            findings.group = Some(group.clone());
            findings.unpassed = unpassed.get(group).cloned();
            findings
        })
        .collect()
}

fn order_violations(input: &Input<'_>) -> Vec<OrderViolation> {
    // Per key: its committed sequence numbers in order, and how many of them (from the
    // start) were all published.
    let mut committed: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for insert in input.inserts.iter().filter(|i| i.id.is_some()) {
        if let Some(key) = &insert.key {
            committed.entry(key).or_default().push(insert.seq);
        }
    }
    for seqs in committed.values_mut() {
        seqs.sort_unstable();
    }
    let mut published: HashMap<&str, HashSet<u64>> = HashMap::new();
    let mut frontier: HashMap<&str, usize> = HashMap::new();
    let mut violations = Vec::new();
    for publish in input.publishes {
        let Some(key) = publish.key.as_deref() else {
            continue;
        };
        let Some(seqs) = committed.get(key) else {
            continue;
        };
        if seqs.binary_search(&publish.seq).is_err() {
            continue; // not a committed row of the key (a failed insert)
        }
        let done = published.entry(key).or_default();
        let next = frontier.entry(key).or_default();
        if let Some(&missing) = seqs.get(*next) {
            if missing < publish.seq {
                violations.push(OrderViolation {
                    key: key.to_owned(),
                    published: publish.seq,
                    missing,
                    subscriber: publish.subscriber.clone(),
                    at_us: publish.at_us,
                });
            }
        }
        done.insert(publish.seq);
        while seqs.get(*next).is_some_and(|seq| done.contains(seq)) {
            *next += 1;
        }
    }
    violations
}

type Duplicates = (usize, Vec<UnexplainedDuplicate>, Vec<usize>);

fn duplicates(input: &Input<'_>, first: &HashMap<i64, &Publish>) -> Duplicates {
    let mut seen: HashSet<i64> = HashSet::new();
    let (mut explained, mut unexplained) = (0, Vec::new());
    let mut by_fault = vec![0; input.faults.len()];
    for publish in input.publishes {
        if seen.insert(publish.id) {
            continue;
        }
        let original = first[&publish.id];
        let cause = input.faults.iter().rposition(|fault| {
            let in_flight = (fault.start_us - IN_FLIGHT_BEFORE..=fault.end_us + AFTER_END)
                .contains(&original.at_us);
            let in_scope = fault.scope.contains(&original.subscriber)
                || fault.scope.contains(&publish.subscriber);
            in_flight && publish.at_us >= fault.start_us && in_scope
        });
        match cause {
            Some(index) => {
                explained += 1;
                by_fault[index] += 1;
            }
            None => unexplained.push(UnexplainedDuplicate {
                id: publish.id,
                first: (
                    original.subscriber.clone(),
                    original.at_us,
                    original.attempt,
                ),
                repeat: (publish.subscriber.clone(), publish.at_us, publish.attempt),
            }),
        }
    }
    (explained, unexplained, by_fault)
}

fn count_between(times: &[i64], from: i64, to: i64) -> usize {
    times.partition_point(|t| *t < to) - times.partition_point(|t| *t < from)
}

fn recovery(first_times: &[i64], commit_times: &[i64], fault: &Fault) -> (Recovery, f64) {
    let rate = |times: &[i64]| {
        count_between(times, fault.start_us - BEFORE, fault.start_us) as f64 * 1e6 / BEFORE as f64
    };
    let pre_rate = rate(first_times).min(rate(commit_times));
    if pre_rate < 1.0 {
        return (Recovery::Unmeasured, pre_rate);
    }
    let target = 0.9 * pre_rate;
    // The last second the producer was still producing at the steady rate.
    let producing_until = commit_times.last().map_or(0, |last| last - SECOND);
    let mut at = fault.end_us;
    while at <= fault.end_us + RECOVERY_HORIZON {
        if at > producing_until {
            return (Recovery::Unmeasured, pre_rate);
        }
        if count_between(first_times, at, at + SECOND) as f64 >= target {
            return (Recovery::After((at - fault.end_us) as f64 / 1e6), pre_rate);
        }
        at += RECOVERY_STEP;
    }
    (Recovery::NotWithin, pre_rate)
}

fn healthy_delivery(
    firsts: &[&Publish],
    fault: &Fault,
    replica_of: &HashMap<String, usize>,
) -> HealthyDelivery {
    let mut last = fault.start_us;
    let mut longest = 0;
    let mut rows = 0;
    for publish in firsts {
        if publish.at_us < fault.start_us {
            continue;
        }
        if publish.at_us > fault.end_us {
            break;
        }
        if replica_of.get(&publish.subscriber) == Some(&fault.replica) {
            continue;
        }
        rows += 1;
        longest = longest.max(publish.at_us - last);
        last = publish.at_us;
    }
    longest = longest.max(fault.end_us - last);
    HealthyDelivery {
        rows,
        longest_gap_s: longest as f64 / 1e6,
    }
}

#[cfg(test)]
mod tests;
