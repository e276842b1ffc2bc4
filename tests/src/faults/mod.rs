//! The fault-injection suite: two `txoutboxd` replicas on one outbox table,
//! subscribers as separate processes (the Rust client runtime and the Python example, one
//! of each per replica), a producer at a steady rate, and a driver injecting one fault at
//! a time; then a drain, and the [`checker`] over everything recorded.
//!
//! [`run`] is the whole of it; `tests/tests/faults.rs` runs it briefly on each backend and
//! `txoutbox-faults` (a binary of this crate) for as long as asked, printing the same
//! [`report`]. Every wait is bounded, every process is the run's own and signalled by its
//! pid, every address is on loopback, and the database is dropped at the end.

pub mod checker;
pub mod database;
pub mod driver;
pub mod history;
pub mod processes;
pub mod producer;
pub mod proxy;
pub mod report;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::time::Instant;

use checker::{Findings, Input};
use database::{Backend, Database};
use driver::{Cast, Fault, FaultKind, Schedule};
use history::{now_us, Journals};
use processes::{Programs, Replica, Runtime, SubscriberProcess};
use producer::Workload;

#[derive(Debug, Clone)]
pub struct Plan {
    pub backend: Backend,
    pub seed: u64,
    pub workload: Workload,
    /// Deliveries before the first fault (the first recovery's reference).
    pub warm_up: Duration,
    pub schedule: Schedule,
    /// The producer keeps going this long after the last fault (its recovery).
    pub tail: Duration,
    /// How long every committed row has to be `done` after the producer stops.
    pub drain: Duration,
    /// The `fault-subscriber` binary.
    pub fault_subscriber: PathBuf,
    /// Keep the journals and subscriber logs (their directory is printed).
    pub keep_files: bool,
}

impl Plan {
    /// A run of about `duration` of faults on `backend`.
    pub fn new(backend: Backend, seed: u64, duration: Duration, fault_subscriber: PathBuf) -> Self {
        Self {
            backend,
            seed,
            workload: Workload::default(),
            warm_up: Duration::from_secs(5),
            schedule: Schedule {
                seed,
                kinds: FaultKind::for_backend(backend),
                duration,
                min_rounds: 1,
                hard_stop: duration * 2 + Duration::from_secs(60),
                gap: (Duration::from_secs(3), Duration::from_secs(8)),
                stall: (Duration::from_secs(1), Duration::from_secs(6)),
            },
            tail: Duration::from_secs(8),
            drain: Duration::from_secs(90),
            fault_subscriber,
            keep_files: false,
        }
    }
}

pub struct Outcome {
    pub plan: Plan,
    pub faults: Vec<Fault>,
    pub findings: Findings,
    pub subscribers: Vec<(String, Runtime, usize, u32)>,
    pub replica_restarts: Vec<u32>,
    pub torn_lines: usize,
    pub elapsed: Duration,
    pub files: Option<PathBuf>,
}

impl Outcome {
    /// What breaks a guarantee: losses, order violations, unexplained duplicates.
    pub fn failures(&self) -> Vec<String> {
        let mut failures = self.losses_and_reorders();
        let findings = &self.findings;
        if !findings.duplicates_unexplained.is_empty() {
            // Times in seconds from the first fault, as in the report.
            let origin = self.faults.first().map_or(0, |f| f.start_us);
            let at = |us: i64| (us - origin) as f64 / 1e6;
            let first: Vec<String> = findings
                .duplicates_unexplained
                .iter()
                .take(5)
                .map(|d| {
                    format!(
                        "id {} by {} at {:.1}s (attempt {}), again by {} at {:.1}s (attempt {})",
                        d.id,
                        d.first.0,
                        at(d.first.1),
                        d.first.2,
                        d.repeat.0,
                        at(d.repeat.1),
                        d.repeat.2
                    )
                })
                .collect();
            failures.push(format!(
                "{} duplicates no fault explains, first: {}",
                findings.duplicates_unexplained.len(),
                first.join("; ")
            ));
        }
        failures
    }

    /// Losses and order violations only.
    fn losses_and_reorders(&self) -> Vec<String> {
        let findings = &self.findings;
        let mut failures = Vec::new();
        if findings.lost() > 0 {
            failures.push(format!(
                "{} rows lost (never published: {:?}; not done: {:?})",
                findings.lost(),
                head(&findings.never_published),
                head(&findings.not_done)
            ));
        }
        if !findings.order_violations.is_empty() {
            failures.push(format!(
                "{} per-key order violations, first: {:?}",
                findings.order_violations.len(),
                head(&findings.order_violations)
            ));
        }
        failures
    }
}

fn head<T: Clone>(items: &[T]) -> Vec<T> {
    items.iter().take(5).cloned().collect()
}

/// Runs the whole plan: start, produce, inject, drain, stop, check.
pub async fn run(plan: Plan) -> anyhow::Result<Outcome> {
    let started = Instant::now();
    let programs = Programs::new(plan.fault_subscriber.clone());
    programs.prepare().await?;
    let dir = tempfile::Builder::new()
        .prefix("txoutbox-faults-")
        .tempdir()?;
    let db = Arc::new(Database::create(plan.backend).await);
    eprintln!(
        "[faults] {:?}, seed {}, files in {}",
        plan.backend,
        plan.seed,
        dir.path().display()
    );
    let mut replicas = vec![
        Replica::start("r1", &db).await?,
        Replica::start("r2", &db).await?,
    ];
    let mut subscribers = Vec::new();
    for (index, replica) in replicas.iter().enumerate() {
        let n = index + 1;
        for (name, runtime) in [
            (format!("rust-{n}"), Runtime::Rust),
            (format!("py-{n}"), Runtime::Python),
        ] {
            let address = replica.client_link.address();
            subscribers.push(SubscriberProcess::start(
                &programs,
                &name,
                runtime,
                index,
                address,
                dir.path(),
            )?);
        }
    }

    let stop_producing = Arc::new(AtomicBool::new(false));
    let producer = tokio::spawn(producer::produce(
        Arc::clone(&db),
        plan.workload.clone(),
        plan.seed,
        Arc::clone(&stop_producing),
    ));
    let mut rng = StdRng::seed_from_u64(plan.seed);
    let mut cast = Cast {
        db: &db,
        replicas: &mut replicas,
        subscribers: &mut subscribers,
        programs: &programs,
    };
    driver::idle(&mut cast, plan.warm_up).await;
    let faults = driver::run(&plan.schedule, &mut cast, &mut rng).await;
    driver::heal_all(&mut cast);
    driver::idle(&mut cast, plan.tail).await;
    stop_producing.store(true, Ordering::Relaxed);
    let inserts = producer.await?;

    let committed: Vec<i64> = inserts.iter().filter_map(|i| i.id).collect();
    let unfinished = drain(&db, &committed, plan.drain, &mut cast).await?;
    let subscriber_summary = subscribers
        .iter()
        .map(|s| (s.name.clone(), s.runtime, s.replica, s.restarts))
        .collect();
    let replica_restarts = replicas.iter().map(|r| r.restarts).collect();
    let mut journals = Journals::default();
    let mut replica_of = HashMap::new();
    for subscriber in &subscribers {
        replica_of.insert(subscriber.name.clone(), subscriber.replica);
    }
    for subscriber in subscribers {
        let (journal, name, runtime) = (
            subscriber.journal.clone(),
            subscriber.name.clone(),
            subscriber.runtime,
        );
        subscriber.stop().await;
        if journal.exists() {
            match runtime {
                Runtime::Rust => journals.read_rust(&journal)?,
                Runtime::Python => journals.read_python(&journal, &name)?,
            }
        }
    }
    for replica in replicas {
        replica.stop().await;
    }
    let journals = journals.sorted();
    let findings = checker::check(&Input {
        inserts: &inserts,
        publishes: &journals.publishes,
        faults: &faults,
        unfinished: &unfinished,
        replica_of: &replica_of,
    });
    if let Ok(db) = Arc::try_unwrap(db) {
        db.drop().await;
    }
    let mut outcome = Outcome {
        plan,
        faults,
        findings,
        subscribers: subscriber_summary,
        replica_restarts,
        torn_lines: journals.torn_lines,
        elapsed: started.elapsed(),
        files: None,
    };
    if outcome.plan.keep_files || !outcome.failures().is_empty() {
        outcome.files = Some(dir.keep());
    }
    Ok(outcome)
}

/// Waits (bounded by `deadline`) until every committed row is `done`, keeping the
/// subscribers running; returns the rows still unfinished then.
async fn drain(
    db: &Database,
    committed: &[i64],
    deadline: Duration,
    cast: &mut Cast<'_>,
) -> anyhow::Result<Vec<(i64, String)>> {
    let committed: std::collections::HashSet<i64> = committed.iter().copied().collect();
    let until = now_us() + i64::try_from(deadline.as_micros())?;
    loop {
        let unfinished: Vec<(i64, String)> = db
            .unfinished()
            .await?
            .into_iter()
            .filter(|(id, _)| committed.contains(id))
            .collect();
        if unfinished.is_empty() || now_us() >= until {
            return Ok(unfinished);
        }
        driver::idle(cast, Duration::from_millis(500)).await;
    }
}
