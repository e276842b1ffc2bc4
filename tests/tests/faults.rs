//! The fault-injection suite in CI: on each backend, two replicas, four
//! subscriber processes (the Rust runtime and the Python example) and a steady producer
//! while every kind of fault strikes at least twice, one at a time; the run fails on any
//! lost row, per-key order violation or duplicate no fault explains. The report is
//! printed; its timings (recovery, insert latency, the other replica's deliveries) are
//! not asserted here: the soak (`txoutbox-faults`, docs/guarantees.md "Proof") measures them.

use std::time::Duration;

use txoutbox_tests::faults::database::Backend;
use txoutbox_tests::faults::driver::FaultKind;
use txoutbox_tests::faults::{self, report, Plan};

/// A short plan: every kind twice in about a minute, stalls of one to three seconds.
fn plan(backend: Backend, duration: Duration) -> Plan {
    let seed = std::env::var("TXOUTBOX_FAULTS_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("[faults] seed {seed} (rerun with TXOUTBOX_FAULTS_SEED={seed})");
    let mut plan = Plan::new(
        backend,
        seed,
        duration,
        env!("CARGO_BIN_EXE_fault-subscriber").into(),
    );
    plan.workload.rate = 300;
    plan.warm_up = Duration::from_secs(3);
    plan.schedule.min_rounds = 2;
    plan.schedule.hard_stop = duration * 3;
    plan.schedule.gap = (Duration::from_millis(300), Duration::from_millis(1500));
    plan.schedule.stall = (Duration::from_secs(1), Duration::from_secs(3));
    plan.tail = Duration::from_secs(3);
    plan.drain = Duration::from_secs(60);
    plan
}

/// Errors (rather than panics) end the test, so the reason is the last thing it prints,
/// after the report, with no backtrace below it.
async fn run(plan: Plan) -> Result<(), String> {
    let kinds = plan.schedule.kinds.clone();
    let outcome = faults::run(plan)
        .await
        .map_err(|err| format!("the fault run failed: {err:#}"))?;
    eprintln!("{}", report::render(&outcome));
    let mut failures = outcome.failures();
    for kind in kinds {
        let count = outcome.faults.iter().filter(|f| f.kind == kind).count();
        if count < 2 {
            failures.push(format!("{} struck {count} times", kind.label()));
        }
    }
    if outcome.findings.committed <= 1000 {
        failures.push("the producer barely ran".to_owned());
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "backend {:?}, seed {}: {}",
            outcome.plan.backend,
            outcome.plan.seed,
            failures.join("; ")
        ))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_keeps_every_row_in_order_under_faults() -> Result<(), String> {
    run(plan(Backend::Postgres, Duration::from_secs(60))).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_keeps_every_row_in_order_under_faults() -> Result<(), String> {
    run(plan(Backend::Mariadb, Duration::from_secs(60))).await
}

/// Two replicas on one file (SQLite allows it on one machine); no database link nor
/// sessions to cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_keeps_every_row_in_order_under_faults() -> Result<(), String> {
    let kinds = FaultKind::for_backend(Backend::Sqlite);
    assert!(!kinds.contains(&FaultKind::DbLinkReset));
    run(plan(Backend::Sqlite, Duration::from_secs(30))).await
}
