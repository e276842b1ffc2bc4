//! The fault driver: one fault at a time, at random moments from a seeded RNG, each kind
//! in turn (every round is a shuffled list of all kinds, so a short run still sees each
//! kind), against each replica or subscriber in turn. Between faults it starts again the
//! subscribers that exited by themselves.

use std::collections::HashMap;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;
use tokio::time::Instant;

use super::database::{Backend, Database};
use super::history::now_us;
use super::processes::{Programs, Replica, SubscriberProcess};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FaultKind {
    ReplicaKill,
    ReplicaTerm,
    ReplicaStop,
    SubscriberKill,
    SubscriberTerm,
    SubscriberStop,
    /// `pg_terminate_backend` (MariaDB: `KILL CONNECTION`) of one replica's sessions.
    DbSessionsTerminated,
    /// Subscribers to one replica: every connection reset, new ones too, for a while.
    ClientLinkReset,
    /// Subscribers to one replica: nothing passes for a while.
    ClientLinkBlackHole,
    DbLinkReset,
    DbLinkBlackHole,
}

impl FaultKind {
    pub const ALL: [FaultKind; 11] = [
        Self::ReplicaKill,
        Self::ReplicaTerm,
        Self::ReplicaStop,
        Self::SubscriberKill,
        Self::SubscriberTerm,
        Self::SubscriberStop,
        Self::DbSessionsTerminated,
        Self::ClientLinkReset,
        Self::ClientLinkBlackHole,
        Self::DbLinkReset,
        Self::DbLinkBlackHole,
    ];

    /// The kinds a backend can take: SQLite has no database link nor sessions.
    pub fn for_backend(backend: Backend) -> Vec<FaultKind> {
        Self::ALL
            .into_iter()
            .filter(|kind| backend.networked() || !kind.needs_network())
            .collect()
    }

    fn needs_network(self) -> bool {
        matches!(
            self,
            Self::DbSessionsTerminated | Self::DbLinkReset | Self::DbLinkBlackHole
        )
    }

    /// Whether it strikes a replica (the other one must keep delivering meanwhile).
    pub fn strikes_replica(self) -> bool {
        !matches!(
            self,
            Self::SubscriberKill | Self::SubscriberTerm | Self::SubscriberStop
        )
    }

    pub fn label(self) -> &'static str {
        match self {
            Self::ReplicaKill => "replica kill -9",
            Self::ReplicaTerm => "replica SIGTERM",
            Self::ReplicaStop => "replica SIGSTOP",
            Self::SubscriberKill => "subscriber kill -9",
            Self::SubscriberTerm => "subscriber SIGTERM",
            Self::SubscriberStop => "subscriber SIGSTOP",
            Self::DbSessionsTerminated => "db sessions terminated",
            Self::ClientLinkReset => "client link reset",
            Self::ClientLinkBlackHole => "client link black hole",
            Self::DbLinkReset => "db link reset",
            Self::DbLinkBlackHole => "db link black hole",
        }
    }
}

/// One fault as it happened.
#[derive(Debug, Clone)]
pub struct Fault {
    pub kind: FaultKind,
    /// The replica or subscriber struck, by name.
    pub target: String,
    /// The replica struck, or the one the struck subscriber uses.
    pub replica: usize,
    /// Subscribers whose work the fault may interrupt (all of a struck replica's).
    pub scope: Vec<String>,
    pub start_us: i64,
    /// When it was over: the stopped process continued, the link healed, the killed
    /// process was running again.
    pub end_us: i64,
    /// Sessions ended, for [`FaultKind::DbSessionsTerminated`].
    pub sessions: usize,
}

#[derive(Debug, Clone)]
pub struct Schedule {
    pub seed: u64,
    pub kinds: Vec<FaultKind>,
    /// Faults are injected until this much time has passed and `min_rounds` rounds of
    /// all kinds are done, but never past `hard_stop`.
    pub duration: Duration,
    pub min_rounds: usize,
    pub hard_stop: Duration,
    /// Quiet time before each fault, drawn from this range.
    pub gap: (Duration, Duration),
    /// How long a stop or a cut lasts, drawn from this range.
    pub stall: (Duration, Duration),
}

pub struct Cast<'a> {
    pub db: &'a Database,
    pub replicas: &'a mut [Replica],
    pub subscribers: &'a mut [SubscriberProcess],
    pub programs: &'a Programs,
}

/// Injects faults by `schedule`; returns them in order.
pub async fn run(schedule: &Schedule, cast: &mut Cast<'_>, rng: &mut StdRng) -> Vec<Fault> {
    let started = Instant::now();
    let mut faults = Vec::new();
    let mut round: Vec<FaultKind> = Vec::new();
    let mut rounds_done = 0;
    // Targets of each kind in turn, from a random start: every replica and subscriber
    // takes each kind of fault as often as the others, give or take one.
    let offset: usize = rng.random_range(0..cast.subscribers.len().max(1));
    let mut struck: HashMap<FaultKind, usize> = HashMap::new();
    loop {
        if round.is_empty() {
            let elapsed = started.elapsed();
            let enough = elapsed >= schedule.duration && rounds_done >= schedule.min_rounds;
            if enough || elapsed >= schedule.hard_stop {
                return faults;
            }
            round = schedule.kinds.clone();
            round.shuffle(rng);
        }
        let kind = round.pop().expect("a round has kinds");
        idle(cast, between(rng, schedule.gap)).await;
        let stall = between(rng, schedule.stall);
        let turn = struck.entry(kind).or_default();
        *turn += 1;
        match inject(kind, stall, offset + *turn, cast).await {
            Ok(fault) => faults.push(fault),
            Err(error) => eprintln!("[faults] {} failed: {error:#}", kind.label()),
        }
        if round.is_empty() {
            rounds_done += 1;
        }
    }
}

fn between(rng: &mut StdRng, (low, high): (Duration, Duration)) -> Duration {
    if high <= low {
        return low;
    }
    Duration::from_secs_f64(rng.random_range(low.as_secs_f64()..high.as_secs_f64()))
}

/// Waits `duration`, starting again every subscriber that exited meanwhile.
pub async fn idle(cast: &mut Cast<'_>, duration: Duration) {
    let until = Instant::now() + duration;
    loop {
        for subscriber in cast.subscribers.iter_mut() {
            if subscriber.exited() {
                if let Err(error) = subscriber.restart(cast.programs) {
                    eprintln!("[faults] restarting {}: {error:#}", subscriber.name);
                }
            }
        }
        let now = Instant::now();
        if now >= until {
            return;
        }
        tokio::time::sleep((until - now).min(Duration::from_millis(100))).await;
    }
}

/// Injects one fault of `kind` on the `turn`-th replica or subscriber (modulo their
/// number), lasting `stall` when it is a stop or a cut.
async fn inject(
    kind: FaultKind,
    stall: Duration,
    turn: usize,
    cast: &mut Cast<'_>,
) -> anyhow::Result<Fault> {
    let (target, replica, scope) = if kind.strikes_replica() {
        let replica = turn % cast.replicas.len();
        let scope = cast
            .subscribers
            .iter()
            .filter(|s| s.replica == replica)
            .map(|s| s.name.clone())
            .collect();
        (cast.replicas[replica].name.clone(), replica, scope)
    } else {
        let subscriber = &cast.subscribers[turn % cast.subscribers.len()];
        let name = subscriber.name.clone();
        (name.clone(), subscriber.replica, vec![name])
    };
    let start_us = now_us();
    let mut sessions = 0;
    match kind {
        FaultKind::ReplicaKill => cast.replicas[replica].kill_and_restart().await?,
        FaultKind::ReplicaTerm => cast.replicas[replica].terminate_and_restart().await?,
        FaultKind::ReplicaStop => {
            let server = cast.replicas[replica].server();
            server.pause();
            idle(cast, stall).await;
            cast.replicas[replica].server().resume();
        }
        FaultKind::SubscriberStop => {
            let index = subscriber_index(cast, &target);
            cast.subscribers[index].signal("-STOP")?;
            idle(cast, stall).await;
            cast.subscribers[index].signal("-CONT")?;
        }
        FaultKind::SubscriberKill | FaultKind::SubscriberTerm => {
            let index = subscriber_index(cast, &target);
            let subscriber = &mut cast.subscribers[index];
            let signal = if kind == FaultKind::SubscriberKill {
                "-KILL"
            } else {
                "-TERM"
            };
            subscriber.signal(signal)?;
            subscriber.wait_exit().await?;
            subscriber.restart(cast.programs)?;
        }
        FaultKind::DbSessionsTerminated => {
            let link = cast.replicas[replica].db_link.as_ref();
            let ports = link.map(|link| link.upstream_ports()).unwrap_or_default();
            sessions = cast.db.terminate_sessions(&ports).await?;
        }
        FaultKind::ClientLinkReset | FaultKind::ClientLinkBlackHole => {
            let link = &cast.replicas[replica].client_link;
            cut(link, kind == FaultKind::ClientLinkReset);
            idle(cast, stall).await;
            cast.replicas[replica].client_link.heal();
        }
        FaultKind::DbLinkReset | FaultKind::DbLinkBlackHole => {
            let Some(link) = cast.replicas[replica].db_link.as_ref() else {
                anyhow::bail!("no database link on this backend");
            };
            cut(link, kind == FaultKind::DbLinkReset);
            idle(cast, stall).await;
            if let Some(link) = cast.replicas[replica].db_link.as_ref() {
                link.heal();
            }
        }
    }
    let end_us = now_us();
    eprintln!(
        "[faults] {} on {target}: {:.1}s",
        kind.label(),
        (end_us - start_us) as f64 / 1e6
    );
    Ok(Fault {
        kind,
        target,
        replica,
        scope,
        start_us,
        end_us,
        sessions,
    })
}

fn subscriber_index(cast: &Cast<'_>, name: &str) -> usize {
    cast.subscribers
        .iter()
        .position(|s| s.name == name)
        .expect("the target is a subscriber")
}

fn cut(link: &super::proxy::Link, reset: bool) {
    if reset {
        link.reset();
    } else {
        link.black_hole();
    }
}

/// Makes sure nothing stays stopped or cut (a run that ends in the middle of a fault).
pub fn heal_all(cast: &mut Cast<'_>) {
    for replica in cast.replicas.iter() {
        replica.server().resume();
        replica.client_link.heal();
        if let Some(link) = &replica.db_link {
            link.heal();
        }
    }
    for subscriber in cast.subscribers.iter() {
        let _ = subscriber.signal("-CONT");
    }
}
