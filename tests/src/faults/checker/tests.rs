//! The checker on small hand-made histories: each finding appears when, and only when,
//! the history holds it.

use std::collections::HashMap;

use super::*;
use crate::faults::driver::FaultKind;

const S: i64 = SECOND;

fn insert(id: i64, key: &str, seq: u64, at_us: i64) -> Insert {
    Insert {
        at_us,
        latency_us: 1000,
        statement_us: 500,
        key: Some(key.to_owned()),
        seq,
        id: Some(id),
    }
}

fn publish(id: i64, key: &str, seq: u64, subscriber: &str, at_us: i64) -> Publish {
    Publish {
        at_us,
        subscriber: subscriber.to_owned(),
        group: None,
        id,
        key: Some(key.to_owned()),
        seq,
        attempt: 1,
    }
}

fn fault(kind: FaultKind, scope: &[&str], start_us: i64, end_us: i64) -> Fault {
    Fault {
        kind,
        target: "r1".into(),
        replica: 0,
        scope: scope.iter().map(|s| s.to_string()).collect(),
        start_us,
        end_us,
        sessions: 0,
    }
}

fn replicas() -> HashMap<String, usize> {
    HashMap::from([("a".to_owned(), 0), ("b".to_owned(), 1)])
}

fn run(
    inserts: &[Insert],
    publishes: &[Publish],
    faults: &[Fault],
    unfinished: &[(i64, String)],
) -> Findings {
    let replica_of = replicas();
    check(&Input {
        inserts,
        publishes,
        faults,
        unfinished,
        replica_of: &replica_of,
    })
}

#[test]
fn a_clean_history_has_no_findings() {
    let inserts = [insert(1, "k", 0, 0), insert(2, "k", 1, 1)];
    let publishes = [publish(1, "k", 0, "a", 10), publish(2, "k", 1, "b", 20)];
    let findings = run(&inserts, &publishes, &[], &[]);
    assert_eq!(findings.lost(), 0);
    assert!(findings.order_violations.is_empty());
    assert_eq!(findings.duplicates_explained, 0);
    assert!(findings.duplicates_unexplained.is_empty());
    assert_eq!((findings.committed, findings.delivered), (2, 2));
}

#[test]
fn rows_never_published_or_not_done_are_lost() {
    let inserts = [insert(1, "k", 0, 0), insert(2, "j", 0, 1)];
    let publishes = [publish(1, "k", 0, "a", 10)];
    let findings = run(&inserts, &publishes, &[], &[(1, "pending".into())]);
    assert_eq!(findings.never_published, [2]);
    assert_eq!(findings.not_done, [(1, "pending".to_owned())]);
    assert_eq!(findings.lost(), 2);
}

#[test]
fn a_later_row_published_before_an_earlier_one_is_a_violation() {
    let inserts = [insert(1, "k", 0, 0), insert(2, "k", 1, 1)];
    let publishes = [publish(2, "k", 1, "b", 10), publish(1, "k", 0, "a", 20)];
    let findings = run(&inserts, &publishes, &[], &[]);
    let [violation] = findings.order_violations.as_slice() else {
        panic!("one violation expected: {:?}", findings.order_violations);
    };
    assert_eq!((violation.published, violation.missing), (1, 0));
}

#[test]
fn a_redelivered_row_after_later_ones_is_a_duplicate_not_a_violation() {
    let inserts = [insert(1, "k", 0, 0), insert(2, "k", 1, 1)];
    let publishes = [
        publish(1, "k", 0, "a", S),
        publish(2, "k", 1, "b", 2 * S),
        publish(1, "k", 0, "b", 3 * S),
    ];
    let findings = run(&inserts, &publishes, &[], &[]);
    assert!(findings.order_violations.is_empty());
    assert_eq!(findings.duplicates_unexplained.len(), 1);
}

#[test]
fn a_duplicate_is_explained_only_by_a_fault_it_was_in_flight_at() {
    let inserts = [insert(1, "k", 0, 0)];
    let publishes = [
        publish(1, "k", 0, "a", 10 * S),
        publish(1, "k", 0, "b", 14 * S),
    ];
    // `a` published just before its replica was killed; `b` published it again.
    let kill = fault(FaultKind::ReplicaKill, &["a"], 11 * S, 12 * S);
    let findings = run(&inserts, &publishes, &[kill], &[]);
    assert_eq!(findings.duplicates_explained, 1);
    assert_eq!(findings.per_fault[0].duplicates, 1);

    // A fault long after the first publish explains nothing.
    let late = fault(
        FaultKind::ReplicaKill,
        &["a"],
        10 * S + IN_FLIGHT_BEFORE + 1,
        14 * S,
    );
    let findings = run(&inserts, &publishes, &[late], &[]);
    assert_eq!(findings.duplicates_unexplained.len(), 1);

    // Nor does a fault that struck neither publisher.
    let elsewhere = fault(FaultKind::SubscriberKill, &["c"], 11 * S, 12 * S);
    let findings = run(&inserts, &publishes, &[elsewhere], &[]);
    assert_eq!(findings.duplicates_unexplained.len(), 1);
}

#[test]
fn recovery_is_the_time_to_reach_ninety_percent_of_the_earlier_rate() {
    // 10 rows/s for 5 s, nothing during a 2 s fault, 10 rows/s again from 1 s after it.
    let mut inserts = Vec::new();
    let mut publishes = Vec::new();
    let mut id = 0;
    let mut at = 0;
    while at < 20 * S {
        let quiet = !(5 * S..8 * S).contains(&at);
        if quiet {
            id += 1;
            inserts.push(insert(id, &format!("k{id}"), 0, at));
            publishes.push(publish(id, &format!("k{id}"), 0, "b", at));
        }
        at += S / 10;
    }
    let stop = fault(FaultKind::ReplicaStop, &["a"], 5 * S, 7 * S);
    let findings = run(&inserts, &publishes, &[stop], &[]);
    let found = &findings.per_fault[0];
    assert!((found.pre_rate - 10.0).abs() < 0.5, "{}", found.pre_rate);
    let Recovery::After(recovery) = found.recovery else {
        panic!("not recovered: {:?}", found.recovery);
    };
    assert!((0.9..=1.1).contains(&recovery), "{recovery}");
    // The healthy replica (`b`'s) delivered nothing for the whole fault.
    let healthy = found.healthy.expect("a replica fault");
    assert_eq!(healthy.rows, 0);
    assert!((healthy.longest_gap_s - 2.0).abs() < 1e-6);
}

#[test]
fn recovery_is_measured_against_the_producers_rate_not_a_backlog_draining() {
    // 10 rows/s committed throughout; from 4 s to 9 s the relay also drains a backlog
    // (an earlier fault's): 20 rows/s delivered. A fault from 9 s to 10 s delivers
    // nothing; from 10 s deliveries keep up with the producer again.
    let mut inserts = Vec::new();
    let mut publishes = Vec::new();
    let mut id = 0;
    let mut at = 0;
    while at < 20 * S {
        id += 1;
        inserts.push(insert(id, &format!("k{id}"), 0, at));
        if !(9 * S..10 * S).contains(&at) {
            publishes.push(publish(id, &format!("k{id}"), 0, "b", at));
        }
        if (4 * S..9 * S).contains(&at) {
            id += 1;
            publishes.push(publish(id, &format!("k{id}"), 0, "b", at));
        }
        at += S / 10;
    }
    let stop = fault(FaultKind::ReplicaStop, &["a"], 9 * S, 10 * S);
    let findings = run(&inserts, &publishes, &[stop], &[]);
    let found = &findings.per_fault[0];
    assert!((found.pre_rate - 10.0).abs() < 0.5, "{}", found.pre_rate);
    assert!(
        matches!(found.recovery, Recovery::After(s) if s < 0.2),
        "{:?}",
        found.recovery
    );
}

#[test]
fn a_fault_after_which_the_producer_stops_is_not_measured() {
    // 10 rows/s until 6 s, a fault from 5 s to 7 s, nothing produced after it.
    let mut inserts = Vec::new();
    let mut publishes = Vec::new();
    let mut id = 0;
    let mut at = 0;
    while at < 6 * S {
        id += 1;
        inserts.push(insert(id, &format!("k{id}"), 0, at));
        publishes.push(publish(id, &format!("k{id}"), 0, "b", at));
        at += S / 10;
    }
    let stop = fault(FaultKind::ReplicaStop, &["a"], 5 * S, 7 * S);
    let findings = run(&inserts, &publishes, std::slice::from_ref(&stop), &[]);
    assert_eq!(findings.per_fault[0].recovery, Recovery::Unmeasured);

    // While the producer goes on, the same silence is a failure to recover.
    while at < 60 * S {
        id += 1;
        inserts.push(insert(id, &format!("k{id}"), 0, at));
        at += S / 10;
    }
    let findings = run(&inserts, &publishes, &[stop], &[]);
    assert_eq!(findings.per_fault[0].recovery, Recovery::NotWithin);
}

fn in_group(group: &str, mut publish: Publish) -> Publish {
    publish.group = Some(group.to_owned());
    publish
}

/// Group `a` gets everything in order; group `b` never gets row 2 and gets `j:1` before
/// `j:0`, and had not passed everything when the drain ended. Only `b` has findings, and
/// a row each group got once is no duplicate.
#[test]
fn each_group_is_judged_alone() {
    let inserts = [
        insert(1, "k", 0, 0),
        insert(2, "k", 1, 1),
        insert(3, "j", 0, 2),
        insert(4, "j", 1, 3),
    ];
    let publishes = [
        in_group("a", publish(1, "k", 0, "a", 10)),
        in_group("b", publish(1, "k", 0, "b", 11)),
        in_group("a", publish(2, "k", 1, "a", 20)),
        in_group("a", publish(3, "j", 0, "a", 30)),
        in_group("b", publish(4, "j", 1, "b", 31)),
        in_group("a", publish(4, "j", 1, "a", 40)),
        in_group("b", publish(3, "j", 0, "b", 41)),
    ];
    let groups = ["a".to_owned(), "b".to_owned()];
    let unpassed = HashMap::from([("b".to_owned(), "1 rows past its positions".to_owned())]);
    let replica_of = replicas();
    let input = Input {
        inserts: &inserts,
        publishes: &publishes,
        faults: &[],
        unfinished: &[],
        replica_of: &replica_of,
    };
    let [a, b] = check_groups(&input, &groups, &unpassed)
        .try_into()
        .expect("one findings per group");
    assert_eq!(a.group.as_deref(), Some("a"));
    assert_eq!((a.lost(), a.delivered, a.publishes), (0, 4, 4));
    assert!(a.order_violations.is_empty());
    assert!(a.duplicates_unexplained.is_empty());
    assert_eq!(a.unpassed, None);

    assert_eq!(b.group.as_deref(), Some("b"));
    assert_eq!(b.never_published, [2]);
    let [violation] = b.order_violations.as_slice() else {
        panic!("one violation expected: {:?}", b.order_violations);
    };
    assert_eq!(
        (
            violation.key.as_str(),
            violation.published,
            violation.missing
        ),
        ("j", 1, 0)
    );
    assert!(b.duplicates_unexplained.is_empty());
    assert!(b.unpassed.is_some());

    // The run fails on `b`'s findings, each named by its group, and on nothing of `a`'s.
    let plan = crate::faults::Plan::new(
        crate::faults::database::Backend::Postgres,
        1,
        std::time::Duration::from_secs(1),
        "fault-subscriber".into(),
    )
    .on_groups();
    let outcome = crate::faults::Outcome {
        plan,
        faults: Vec::new(),
        findings: vec![a, b],
        subscribers: Vec::new(),
        replica_restarts: Vec::new(),
        torn_lines: 0,
        elapsed: std::time::Duration::from_secs(1),
        files: None,
    };
    let failures = outcome.failures();
    assert_eq!(failures.len(), 3, "{failures:?}");
    assert!(
        failures.iter().all(|f| f.starts_with("group b: ")),
        "{failures:?}"
    );
    assert!(
        failures.iter().any(|f| f.contains("1 rows lost")),
        "{failures:?}"
    );
    assert!(
        failures.iter().any(|f| f.contains("order violations")),
        "{failures:?}"
    );
    assert!(
        failures.iter().any(|f| f.contains("not passed")),
        "{failures:?}"
    );
}

/// A row published twice in one group with no fault is a duplicate of that group only.
#[test]
fn a_duplicate_within_one_group_is_found_in_that_group() {
    let inserts = [insert(1, "k", 0, 0)];
    let publishes = [
        in_group("a", publish(1, "k", 0, "a", S)),
        in_group("b", publish(1, "k", 0, "b", 2 * S)),
        in_group("b", publish(1, "k", 0, "a", 3 * S)),
    ];
    let replica_of = replicas();
    let input = Input {
        inserts: &inserts,
        publishes: &publishes,
        faults: &[],
        unfinished: &[],
        replica_of: &replica_of,
    };
    let groups = ["a".to_owned(), "b".to_owned()];
    let findings = check_groups(&input, &groups, &HashMap::new());
    assert!(findings[0].duplicates_unexplained.is_empty());
    assert_eq!(findings[1].duplicates_unexplained.len(), 1);
    assert_eq!(findings[1].lost(), 0);
}
