//! The report of a fault run: one line per fault, then a summary with the figures the
//! "Proof" of docs/guarantees.md quotes.

use std::collections::BTreeMap;
use std::fmt::Write;

use super::checker::{Latency, Recovery};
use super::processes::Runtime;
use super::Outcome;

/// A healthy replica that delivered nothing for longer than this during another
/// replica's fault is reported as stalled.
pub const HEALTHY_GAP_LIMIT_S: f64 = 2.0;
/// Producer insert p99 during a relay fault at or above this is reported: a relay
/// fault must not hold up a producer's insert.
pub const INSERT_P99_LIMIT_MS: f64 = 50.0;
/// Recovery to 90% later than this after a fault's end is reported: the
/// replicas left must take the work over within seconds.
pub const RECOVERY_LIMIT_S: f64 = 5.0;

pub fn render(outcome: &Outcome) -> String {
    let mut out = String::new();
    let plan = &outcome.plan;
    let findings = &outcome.findings;
    let first = outcome.faults.first().map_or(0, |f| f.start_us);
    let _ = writeln!(
        out,
        "{:>3} {:>7} {:<23} {:<7} {:>6} {:>9} {:>24} {:>17} {:>5}",
        "#",
        "at s",
        "fault",
        "target",
        "lasted",
        "90% after",
        "insert p50/p99/max ms",
        "other replica",
        "dups"
    );
    for (index, (fault, found)) in outcome.faults.iter().zip(&findings.per_fault).enumerate() {
        let recovery = match found.recovery {
            Recovery::After(s) => format!("{s:.1}s"),
            Recovery::NotWithin => ">30s".to_owned(),
            Recovery::Unmeasured => "n/a".to_owned(),
        };
        let healthy = found.healthy.map_or("-".to_owned(), |h| {
            format!("{} rows, gap {:.1}s", h.rows, h.longest_gap_s)
        });
        let _ = writeln!(
            out,
            "{:>3} {:>7.1} {:<23} {:<7} {:>5.1}s {:>9} {:>24} {:>17} {:>5}",
            index + 1,
            (fault.start_us - first) as f64 / 1e6,
            fault.kind.label(),
            fault.target,
            (fault.end_us - fault.start_us) as f64 / 1e6,
            recovery,
            latency(&found.inserts),
            healthy,
            found.duplicates
        );
    }

    let _ = writeln!(out);
    let subscribers: Vec<String> = outcome
        .subscribers
        .iter()
        .map(|(name, runtime, replica, restarts)| {
            let runtime = match runtime {
                Runtime::Rust => "Rust",
                Runtime::Python => "Python",
            };
            format!("{name} ({runtime}, r{}, {restarts} restarts)", replica + 1)
        })
        .collect();
    let _ = writeln!(
        out,
        "backend {:?}, seed {}, {:.0}s in all; producer {} rows/s over {} keys ({} hot) + keyless",
        plan.backend,
        plan.seed,
        outcome.elapsed.as_secs_f64(),
        plan.workload.rate,
        plan.workload.keys,
        plan.workload.hot_keys
    );
    let _ = writeln!(
        out,
        "replicas r1, r2 (restarts {:?}); subscribers {}",
        outcome.replica_restarts,
        subscribers.join(", ")
    );
    let _ = writeln!(
        out,
        "rows committed {} (failed inserts {}), delivered {}, publishes {}, torn journal lines {}",
        findings.committed,
        findings.inserts_failed,
        findings.delivered,
        findings.publishes,
        outcome.torn_lines
    );
    let _ = writeln!(
        out,
        "lost {} (never published {}, not done at the end {}); order violations {}",
        findings.lost(),
        findings.never_published.len(),
        findings.not_done.len(),
        findings.order_violations.len()
    );
    let _ = writeln!(
        out,
        "duplicates {} explained by a fault, {} unexplained",
        findings.duplicates_explained,
        findings.duplicates_unexplained.len()
    );
    let mut kinds: BTreeMap<_, usize> = BTreeMap::new();
    for fault in &outcome.faults {
        *kinds.entry(fault.kind).or_default() += 1;
    }
    let kinds: Vec<String> = kinds
        .iter()
        .map(|(kind, n)| format!("{} x{n}", kind.label()))
        .collect();
    let _ = writeln!(out, "faults {}: {}", outcome.faults.len(), kinds.join(", "));
    let worst_recovery = findings
        .per_fault
        .iter()
        .enumerate()
        .filter_map(|(i, f)| Some((i, f.recovery.seconds()?)))
        .max_by(|a, b| a.1.total_cmp(&b.1));
    if let Some((index, seconds)) = worst_recovery {
        let seconds = if seconds.is_finite() {
            format!("{seconds:.1}s")
        } else {
            "not within 30s".to_owned()
        };
        let _ = writeln!(
            out,
            "worst time to 90% of the earlier throughput: {seconds} (fault #{})",
            index + 1
        );
    }
    let _ = writeln!(
        out,
        "producer inserts: quiet {}; during relay faults {} ms",
        latency(&findings.inserts_quiet),
        latency(&findings.inserts_relay_faults)
    );
    let _ = writeln!(
        out,
        "their statements before the commit (where a wait on the relay would show): \
         quiet {}; during relay faults {} ms",
        latency(&findings.statements_quiet),
        latency(&findings.statements_relay_faults)
    );
    let relay_p99 = findings
        .per_fault
        .iter()
        .enumerate()
        .filter(|(i, _)| outcome.faults[*i].kind.strikes_replica())
        .max_by(|a, b| a.1.inserts.p99_ms.total_cmp(&b.1.inserts.p99_ms));
    if let Some((index, found)) = relay_p99 {
        let _ = writeln!(
            out,
            "worst insert p99 during one relay fault: {:.1} ms, max {:.1} ms (fault #{})",
            found.inserts.p99_ms,
            found.inserts.max_ms,
            index + 1
        );
    }
    let statement_p99 = findings
        .per_fault
        .iter()
        .enumerate()
        .filter(|(i, _)| outcome.faults[*i].kind.strikes_replica())
        .max_by(|a, b| a.1.statements.p99_ms.total_cmp(&b.1.statements.p99_ms));
    if let Some((index, found)) = statement_p99 {
        let _ = writeln!(
            out,
            "worst statement p99 during one relay fault: {:.1} ms, max {:.1} ms (fault #{})",
            found.statements.p99_ms,
            found.statements.max_ms,
            index + 1
        );
    }
    let gaps: Vec<(usize, f64)> = findings
        .per_fault
        .iter()
        .enumerate()
        .filter_map(|(i, f)| f.healthy.map(|h| (i, h.longest_gap_s)))
        .collect();
    if let Some((index, gap)) = gaps.iter().copied().max_by(|a, b| a.1.total_cmp(&b.1)) {
        let kept = gaps.iter().all(|(_, gap)| *gap <= HEALTHY_GAP_LIMIT_S);
        let _ = writeln!(
            out,
            "the other replica kept delivering in every replica fault: {} (longest gap {gap:.1}s, fault #{}; limit {HEALTHY_GAP_LIMIT_S}s)",
            if kept { "yes" } else { "NO" },
            index + 1
        );
    }
    let notes = warnings(outcome);
    for failure in outcome.failures() {
        let _ = writeln!(out, "FAILED: {failure}");
    }
    for note in notes {
        let _ = writeln!(out, "WARNING: {note}");
    }
    if let Some(files) = &outcome.files {
        let _ = writeln!(out, "journals and logs kept in {}", files.display());
    }
    out
}

/// Timing findings against the limits above: reported, never a test failure (the machine's load
/// moves them).
pub fn warnings(outcome: &Outcome) -> Vec<String> {
    let mut notes = Vec::new();
    for (index, (fault, found)) in outcome
        .faults
        .iter()
        .zip(&outcome.findings.per_fault)
        .enumerate()
    {
        let n = index + 1;
        let label = fault.kind.label();
        if let Some(healthy) = found.healthy {
            if healthy.longest_gap_s > HEALTHY_GAP_LIMIT_S {
                notes.push(format!(
                    "fault #{n} ({label} on {}): the other replica delivered nothing for {:.1}s",
                    fault.target, healthy.longest_gap_s
                ));
            }
            if found.inserts.p99_ms >= INSERT_P99_LIMIT_MS {
                notes.push(format!(
                    "fault #{n} ({label} on {}): producer insert p99 {:.1} ms \
                     (its statements before the commit: p99 {:.1} ms)",
                    fault.target, found.inserts.p99_ms, found.statements.p99_ms
                ));
            }
        }
        if found
            .recovery
            .seconds()
            .is_some_and(|s| s > RECOVERY_LIMIT_S)
        {
            notes.push(format!(
                "fault #{n} ({label} on {}): throughput not back to 90% within {RECOVERY_LIMIT_S}s",
                fault.target
            ));
        }
    }
    notes
}

fn latency(latency: &Latency) -> String {
    if latency.count == 0 {
        return "-".to_owned();
    }
    format!(
        "{:.1}/{:.1}/{:.1}",
        latency.p50_ms, latency.p99_ms, latency.max_ms
    )
}
