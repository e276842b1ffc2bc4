//! The fault-injection suite: two `txoutboxd` replicas on one outbox table,
//! subscribers as separate processes (the Rust client runtime and the Python example, one
//! of each per replica), a producer at a steady rate, and a driver injecting one fault at
//! a time; then a drain, and the [`checker`] over everything recorded.
//!
//! With [`Plan::groups`] the outbox declares subscription groups instead (docs/groups.md):
//! each replica's Rust subscriber joins every group, and a Python one per group joins it,
//! so every group has members of both runtimes on both replicas; the checker judges each
//! group alone.
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
use txoutbox_proto::v1::admin_client::AdminClient;
use txoutbox_proto::v1::StatsRequest;

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
    /// Subscription groups the outbox declares (each ordered by key); none: per-row
    /// claims. PostgreSQL and SQLite only.
    pub groups: Vec<String>,
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
            groups: Vec::new(),
            keep_files: false,
        }
    }

    /// The same run on two subscription groups, `a` and `b`.
    pub fn on_groups(mut self) -> Self {
        self.groups = GROUPS.iter().map(|g| g.to_string()).collect();
        self
    }
}

/// The groups of [`Plan::on_groups`].
pub const GROUPS: [&str; 2] = ["a", "b"];

pub struct Outcome {
    pub plan: Plan,
    pub faults: Vec<Fault>,
    /// One per group; one of no group with per-row claims.
    pub findings: Vec<Findings>,
    pub subscribers: Vec<(String, Runtime, usize, u32)>,
    pub replica_restarts: Vec<u32>,
    pub torn_lines: usize,
    pub elapsed: Duration,
    pub files: Option<PathBuf>,
}

impl Outcome {
    /// What breaks a guarantee: losses, order violations, unexplained duplicates.
    pub fn failures(&self) -> Vec<String> {
        self.findings
            .iter()
            .flat_map(|findings| {
                let failures = self.failures_of(findings);
                let group = findings.group.clone();
                failures.into_iter().map(move |failure| match &group {
                    Some(group) => format!("group {group}: {failure}"),
                    None => failure,
                })
            })
            .collect()
    }

    /// Committed rows, the same for every group.
    pub fn committed(&self) -> usize {
        self.findings.first().map_or(0, |f| f.committed)
    }

    fn failures_of(&self, findings: &Findings) -> Vec<String> {
        let mut failures = losses_and_reorders(findings);
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
}

/// Losses and order violations only.
fn losses_and_reorders(findings: &Findings) -> Vec<String> {
    let mut failures = Vec::new();
    if let Some(unpassed) = &findings.unpassed {
        failures.push(format!(
            "rows not passed at the end of the drain: {unpassed}"
        ));
    }
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
    anyhow::ensure!(
        plan.groups.is_empty() || plan.backend != Backend::Mariadb,
        "subscription groups need PostgreSQL or SQLite"
    );
    let db = Arc::new(Database::create(plan.backend).await);
    eprintln!(
        "[faults] {:?}{}, seed {}, files in {}",
        plan.backend,
        if plan.groups.is_empty() {
            String::new()
        } else {
            format!(" on groups {}", plan.groups.join(", "))
        },
        plan.seed,
        dir.path().display()
    );
    let mut replicas = vec![
        Replica::start("r1", &db, &plan.groups, dir.path()).await?,
        Replica::start("r2", &db, &plan.groups, dir.path()).await?,
    ];
    let mut subscribers = Vec::new();
    for (index, replica) in replicas.iter().enumerate() {
        let n = index + 1;
        let mut cast = vec![(format!("rust-{n}"), Runtime::Rust, plan.groups.clone())];
        if plan.groups.is_empty() {
            cast.push((format!("py-{n}"), Runtime::Python, Vec::new()));
        }
        // The Python example joins one group per process.
        for group in &plan.groups {
            cast.push((
                format!("py-{n}-{group}"),
                Runtime::Python,
                vec![group.clone()],
            ));
        }
        for (name, runtime, groups) in cast {
            let address = replica.client_link.address();
            subscribers.push(SubscriberProcess::start(
                &programs,
                &name,
                runtime,
                groups,
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
    let (unfinished, unpassed) = if plan.groups.is_empty() {
        let unfinished = drain(&db, &committed, plan.drain, &mut cast).await?;
        (unfinished, HashMap::new())
    } else {
        let unpassed = drain_groups(&plan.groups, plan.drain, &mut cast).await;
        (Vec::new(), unpassed)
    };
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
        let group = subscriber.groups.first().cloned();
        subscriber.stop().await;
        if journal.exists() {
            match runtime {
                Runtime::Rust => journals.read_rust(&journal)?,
                Runtime::Python => journals.read_python(&journal, &name, group.as_deref())?,
            }
        }
    }
    for replica in replicas {
        replica.stop().await;
    }
    let journals = journals.sorted();
    let input = Input {
        inserts: &inserts,
        publishes: &journals.publishes,
        faults: &faults,
        unfinished: &unfinished,
        replica_of: &replica_of,
    };
    let findings = if plan.groups.is_empty() {
        vec![checker::check(&input)]
    } else {
        checker::check_groups(&input, &plan.groups, &unpassed)
    };
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

/// Waits (bounded by `deadline`) until every group has passed every row (`Stats`: no
/// lag, nothing retrying, held or dead), keeping the subscribers running. Returns what
/// each group that had not still showed then. The rows of an outbox with groups stay
/// `pending` (groups never write them): their positions are what tells.
async fn drain_groups(
    groups: &[String],
    deadline: Duration,
    cast: &mut Cast<'_>,
) -> HashMap<String, String> {
    let until = Instant::now() + deadline;
    loop {
        let unpassed = match groups_unpassed(groups, cast).await {
            Ok(unpassed) => unpassed,
            Err(error) => groups
                .iter()
                .map(|g| (g.clone(), format!("no Stats: {error:#}")))
                .collect(),
        };
        if unpassed.is_empty() || Instant::now() >= until {
            return unpassed;
        }
        driver::idle(cast, Duration::from_millis(500)).await;
    }
}

/// Each group that has not passed every row, with what its `Stats` shows.
async fn groups_unpassed(
    groups: &[String],
    cast: &Cast<'_>,
) -> anyhow::Result<HashMap<String, String>> {
    let channel = tonic::transport::Endpoint::from_shared(cast.replicas[0].server().url())?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(10))
        .connect()
        .await?;
    let stats = AdminClient::new(channel)
        .stats(StatsRequest {
            outbox: "orders".into(),
        })
        .await?
        .into_inner();
    let mut unpassed = HashMap::new();
    for group in groups {
        let Some(found) = stats.groups.iter().find(|g| &g.group == group) else {
            unpassed.insert(group.clone(), "not in Stats".to_owned());
            continue;
        };
        if found.lag_rows + found.retrying + found.held + found.dead > 0 {
            unpassed.insert(
                group.clone(),
                format!(
                    "{} rows past its positions, {} retrying, {} held, {} dead",
                    found.lag_rows, found.retrying, found.held, found.dead
                ),
            );
        }
    }
    Ok(unpassed)
}
