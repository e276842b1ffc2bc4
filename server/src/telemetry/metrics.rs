//! The Prometheus metrics of one server: one [`Metrics`] per `run`, a handle of
//! pre-labelled series per outbox ([`OutboxMetrics`]) that the relay counts on.
//!
//! Crate: `prometheus` (tikv/rust-prometheus, the client TiKV and many others run in
//! production). Chosen over `prometheus-client` because that one writes only the
//! OpenMetrics format, whose `_total` samples under a `# TYPE x counter` family the text
//! parser of `promtool check metrics` (Debian's 2.42) rejects; and over `metrics` +
//! `metrics-exporter-prometheus` because those count into one process-wide recorder,
//! where this crate gives each server a registry of its own (tests run several servers
//! in one process). It writes the classic text format every Prometheus scrapes.
//!
//! The hot path pays one atomic add per counter: every series an outbox counts on is
//! looked up once, when its [`OutboxMetrics`] is made, never per call. The names, their
//! labels and meanings are listed in docs/observability.md; the gauges that need the
//! database are set by [`super::depth`], the pool gauges at scrape time.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

use crate::storage::groups::GroupStats;
use crate::storage::{Stats, StorageError, StorageResult};

/// Seconds buckets of a database round trip: claims and answers.
const DURATION_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// Seconds buckets from a row's commit to its claim: milliseconds when the relay keeps
/// up, up to an hour when it does not.
const AGE_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
];
/// Rows per claim, up to the largest window.
const BATCH_BUCKETS: &[f64] = &[
    1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0,
];

/// Why a row was dead-lettered: the `reason` label of `txoutbox_dead_lettered_rows_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadLetterReason {
    /// A nack on the row's last attempt.
    NackLastAttempt,
    /// Claimed `max_attempts` times without an answer (its holders died).
    MaxClaims,
    /// Larger than any response holds.
    TooLarge,
    /// The subscriber said it never succeeds (`DeadLetter`).
    Permanent,
}

impl DeadLetterReason {
    const ALL: [Self; 4] = [
        Self::NackLastAttempt,
        Self::MaxClaims,
        Self::TooLarge,
        Self::Permanent,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Self::NackLastAttempt => "nack_last_attempt",
            Self::MaxClaims => "max_claims",
            Self::TooLarge => "too_large",
            Self::Permanent => "permanent",
        }
    }
}

/// A subscriber's answer: the `answer` label of the answer metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnswerKind {
    Ack,
    Nack,
    Release,
    DeadLetter,
    ExtendLease,
}

impl AnswerKind {
    const ALL: [Self; 5] = [
        Self::Ack,
        Self::Nack,
        Self::Release,
        Self::DeadLetter,
        Self::ExtendLease,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Self::Ack => "ack",
            Self::Nack => "nack",
            Self::Release => "release",
            Self::DeadLetter => "dead_letter",
            Self::ExtendLease => "extend_lease",
        }
    }
}

/// The `kind` labels of `txoutbox_storage_errors_total`, one per [`StorageError`] variant.
const ERROR_KINDS: [&str; 6] = [
    "unavailable",
    "read_only",
    "missing_table",
    "mismatched_table",
    "invalid_message",
    "other",
];

/// The `kind` label of `txoutbox_storage_errors_total`.
fn error_kind(error: &StorageError) -> &'static str {
    match error {
        StorageError::Unavailable(_) => "unavailable",
        StorageError::ReadOnly(_) => "read_only",
        StorageError::MissingTable { .. } => "missing_table",
        StorageError::MismatchedTable { .. } => "mismatched_table",
        StorageError::InvalidMessage(_) => "invalid_message",
        StorageError::Other(_) => "other",
    }
}

/// A database pool's connections, read at scrape time.
#[derive(Debug, Clone, Copy)]
pub struct PoolUsage {
    /// Connections open, busy or idle.
    pub open: u32,
    pub idle: usize,
    pub max: u32,
}

type PoolProbe = Box<dyn Fn() -> PoolUsage + Send + Sync>;

/// Every metric family of one server, registered in its own registry.
pub struct Metrics {
    registry: Registry,
    claimed: IntCounterVec,
    acked: IntCounterVec,
    nacked: IntCounterVec,
    released: IntCounterVec,
    dead_lettered: IntCounterVec,
    fenced: IntCounterVec,
    empty_claims: IntCounterVec,
    storage_errors: IntCounterVec,
    claim_duration: HistogramVec,
    answer_duration: HistogramVec,
    commit_to_claim: HistogramVec,
    batch_rows: HistogramVec,
    streams_open: IntGaugeVec,
    subscriber_streams: IntGaugeVec,
    in_flight: IntGaugeVec,
    serving: IntGaugeVec,
    depth: DepthGauges,
    groups: GroupGauges,
    pool_connections: IntGaugeVec,
    pool_max: IntGaugeVec,
    pools: Mutex<Vec<(String, PoolProbe)>>,
    draining: IntGauge,
    /// Serializes the subscriber gauge's increments with the removal of a name whose
    /// last stream ended, so a stream opening meanwhile is never lost.
    subscribers_lock: Arc<Mutex<()>>,
}

/// The gauges [`super::depth`] sets from each outbox's counts, by outbox and topic.
struct DepthGauges {
    pending: IntGaugeVec,
    leased: IntGaugeVec,
    waiting: IntGaugeVec,
    dead: IntGaugeVec,
    oldest_pending_age: prometheus::GaugeVec,
    /// The topics each outbox had at its last refresh: a topic gone from the counts has
    /// its series removed, not left at its last value.
    topics: Mutex<BTreeMap<String, BTreeSet<String>>>,
}

/// The gauges [`super::depth`] sets from each subscription group's figures (the same as
/// `Admin.Stats`), by outbox and group; and the frontier's delay, by outbox.
struct GroupGauges {
    lag_rows: IntGaugeVec,
    lag: prometheus::GaugeVec,
    retrying: IntGaugeVec,
    held: IntGaugeVec,
    dead: IntGaugeVec,
    held_keys: IntGaugeVec,
    members: IntGaugeVec,
    /// Partitions with a live owner; the rest wait for a stream.
    owned_partitions: IntGaugeVec,
    partitions: IntGaugeVec,
    frontier_delay: prometheus::GaugeVec,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let families = Families(&registry);
        let counter =
            |name: &str, help: &str, labels: &[&str]| families.counter(name, help, labels);
        let gauge = |name: &str, help: &str, labels: &[&str]| families.gauge(name, help, labels);
        let histogram = |name: &str, help: &str, labels: &[&str], buckets: &[f64]| {
            families.histogram(name, help, labels, buckets)
        };
        let outbox = &["outbox"];
        let by_topic = &["outbox", "topic"];
        let oldest_pending_age = families.float_gauge(
            "txoutbox_outbox_oldest_pending_age_seconds",
            "Age of the oldest pending row (now - created_at, database clock), at the last depth refresh.",
            by_topic,
        );
        let groups = GroupGauges::new(&families);
        let build_info = gauge(
            "txoutbox_build_info",
            "Always 1; the labels say which txoutboxd runs.",
            &["version"],
        );
        build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION")])
            .set(1);
        let draining = families.register(
            IntGauge::new(
                "txoutbox_draining",
                "1 once the server is draining (shutting down), 0 while it serves.",
            )
            .expect("valid metric"),
        );
        Self {
            claimed: counter("txoutbox_claimed_rows_total", "Rows claimed and handed to subscribers.", outbox),
            acked: counter("txoutbox_acked_rows_total", "Rows acked (delivered).", outbox),
            nacked: counter("txoutbox_nacked_rows_total", "Nacks applied: a retry scheduled, or a dead-letter on the last attempt.", outbox),
            released: counter("txoutbox_released_rows_total", "Rows given back untried: releases, and the later rows of a nacked row's key.", outbox),
            dead_lettered: counter("txoutbox_dead_lettered_rows_total", "Rows dead-lettered, by reason.", &["outbox", "reason"]),
            fenced: counter("txoutbox_fenced_answers_total", "Answers about rows the caller no longer held, ignored, by answer.", &["outbox", "answer"]),
            empty_claims: counter("txoutbox_empty_claims_total", "Claims that found no row.", outbox),
            storage_errors: counter("txoutbox_storage_errors_total", "Failed storage calls, by kind of error.", &["outbox", "kind"]),
            claim_duration: histogram("txoutbox_claim_duration_seconds", "Duration of a claim, in the database and back.", outbox, DURATION_BUCKETS),
            answer_duration: histogram("txoutbox_answer_duration_seconds", "Duration of applying an answer (one storage call), by answer.", &["outbox", "answer"], DURATION_BUCKETS),
            commit_to_claim: histogram("txoutbox_commit_to_claim_seconds", "Time from a row's created_at to its claim, both on the database clock.", outbox, AGE_BUCKETS),
            batch_rows: histogram("txoutbox_claim_batch_rows", "Rows per claim that found any.", outbox, BATCH_BUCKETS),
            streams_open: gauge("txoutbox_streams_open", "Subscribe streams open.", outbox),
            subscriber_streams: gauge("txoutbox_subscriber_streams", "Subscribe streams open, by subscriber name.", &["outbox", "subscriber"]),
            in_flight: gauge("txoutbox_messages_in_flight", "Rows held by open streams: sent, not answered yet.", outbox),
            serving: gauge("txoutbox_outbox_serving", "1 while the outbox's health check passes (its grpc.health.v1 status is SERVING), 0 otherwise.", outbox),
            depth: DepthGauges {
                pending: gauge("txoutbox_outbox_pending_rows", "Rows not delivered yet, leased and waiting ones included, at the last depth refresh.", by_topic),
                leased: gauge("txoutbox_outbox_leased_rows", "Pending rows under a live lease, at the last depth refresh.", by_topic),
                waiting: gauge("txoutbox_outbox_waiting_rows", "Pending rows held by nobody and not due yet (retry backoff, release delay, visibility delay), at the last depth refresh.", by_topic),
                dead: gauge("txoutbox_outbox_dead_rows", "Dead-lettered rows, at the last depth refresh.", by_topic),
                oldest_pending_age,
                topics: Mutex::default(),
            },
            groups,
            pool_connections: gauge("txoutbox_db_pool_connections", "Connections of the relay's pool of a database, by state (in_use, idle).", &["database", "state"]),
            pool_max: gauge("txoutbox_db_pool_max_connections", "The most connections the relay's pool of a database opens (databases.NAME.max_connections).", &["database"]),
            pools: Mutex::default(),
            draining,
            subscribers_lock: Arc::default(),
            registry,
        }
    }

    /// The series of outbox `name`, created now so that every counter of a configured
    /// outbox is scraped (at zero) before it first moves.
    pub fn outbox(&self, name: &str) -> OutboxMetrics {
        let one = |family: &IntCounterVec| family.with_label_values(&[name]);
        OutboxMetrics {
            claimed: one(&self.claimed),
            acked: one(&self.acked),
            nacked: one(&self.nacked),
            released: one(&self.released),
            dead_lettered: DeadLetterReason::ALL.map(|reason| {
                self.dead_lettered
                    .with_label_values(&[name, reason.label()])
            }),
            fenced: AnswerKind::ALL
                .map(|kind| self.fenced.with_label_values(&[name, kind.label()])),
            answer_duration: AnswerKind::ALL.map(|kind| {
                self.answer_duration
                    .with_label_values(&[name, kind.label()])
            }),
            empty_claims: one(&self.empty_claims),
            claim_duration: self.claim_duration.with_label_values(&[name]),
            commit_to_claim: self.commit_to_claim.with_label_values(&[name]),
            batch_rows: self.batch_rows.with_label_values(&[name]),
            streams_open: self.streams_open.with_label_values(&[name]),
            in_flight: self.in_flight.with_label_values(&[name]),
            storage_errors: ERROR_KINDS
                .map(|kind| self.storage_errors.with_label_values(&[name, kind])),
            serving: self.serving.with_label_values(&[name]),
            subscriber_streams: self.subscriber_streams.clone(),
            subscribers_lock: Arc::clone(&self.subscribers_lock),
            outbox: name.to_owned(),
        }
    }

    /// Reads `probe` at every scrape for the pool gauges of `database`.
    pub fn watch_pool(
        &self,
        database: &str,
        probe: impl Fn() -> PoolUsage + Send + Sync + 'static,
    ) {
        let mut pools = self.pools.lock().expect("pool probes");
        pools.push((database.to_owned(), Box::new(probe)));
    }

    pub fn set_draining(&self) {
        self.draining.set(1);
    }

    /// Sets the gauges of one subscription group of `outbox` from its figures.
    pub fn set_group(&self, outbox: &str, stats: &GroupStats) {
        let gauges = &self.groups;
        let labels = [outbox, stats.group.as_str()];
        let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        gauges
            .lag_rows
            .with_label_values(&labels)
            .set(count(stats.lag_rows));
        let lag = stats.lag.unwrap_or(Duration::ZERO);
        gauges.lag.with_label_values(&labels).set(lag.as_secs_f64());
        gauges
            .retrying
            .with_label_values(&labels)
            .set(count(stats.retrying));
        gauges
            .held
            .with_label_values(&labels)
            .set(count(stats.held));
        gauges
            .dead
            .with_label_values(&labels)
            .set(count(stats.dead));
        gauges
            .held_keys
            .with_label_values(&labels)
            .set(count(stats.held_keys));
        gauges
            .members
            .with_label_values(&labels)
            .set(count(stats.members));
        let owned = stats
            .partitions
            .iter()
            .filter(|p| p.owner.is_some() && !p.expired);
        gauges
            .owned_partitions
            .with_label_values(&labels)
            .set(count(owned.count() as u64));
        gauges
            .partitions
            .with_label_values(&labels)
            .set(count(stats.partitions.len() as u64));
    }

    /// Sets the frontier's delay of `outbox` (see [`Metrics::set_group`]).
    pub fn set_frontier_delay(&self, outbox: &str, delay: Duration) {
        self.groups
            .frontier_delay
            .with_label_values(&[outbox])
            .set(delay.as_secs_f64());
    }

    /// Sets the depth gauges of `outbox` from its counts; topics without pending or dead
    /// rows any more lose their series.
    pub fn set_depth(&self, outbox: &str, stats: &Stats) {
        let depth = &self.depth;
        let now: BTreeSet<String> = stats.topics.iter().map(|t| t.topic.clone()).collect();
        let mut topics = depth.topics.lock().expect("depth topics");
        for gone in topics
            .get(outbox)
            .into_iter()
            .flatten()
            .filter(|t| !now.contains(*t))
        {
            let labels = [outbox, gone.as_str()];
            for family in [&depth.pending, &depth.leased, &depth.waiting, &depth.dead] {
                let _ = family.remove_label_values(&labels);
            }
            let _ = depth.oldest_pending_age.remove_label_values(&labels);
        }
        for topic in &stats.topics {
            let labels = [outbox, topic.topic.as_str()];
            let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
            depth
                .pending
                .with_label_values(&labels)
                .set(count(topic.pending));
            depth
                .leased
                .with_label_values(&labels)
                .set(count(topic.leased));
            depth
                .waiting
                .with_label_values(&labels)
                .set(count(topic.waiting));
            depth.dead.with_label_values(&labels).set(count(topic.dead));
            let age = topic.oldest_pending_age.unwrap_or(Duration::ZERO);
            depth
                .oldest_pending_age
                .with_label_values(&labels)
                .set(age.as_secs_f64());
        }
        topics.insert(outbox.to_owned(), now);
    }

    /// The text exposition of every metric, pool gauges read now.
    pub fn encode(&self) -> String {
        for (database, probe) in self.pools.lock().expect("pool probes").iter() {
            let usage = probe();
            let in_use = i64::from(usage.open) - usage.idle as i64;
            let state = |state: &str| self.pool_connections.with_label_values(&[database, state]);
            state("in_use").set(in_use.max(0));
            state("idle").set(usage.idle as i64);
            self.pool_max
                .with_label_values(&[database])
                .set(i64::from(usage.max));
        }
        let mut text = String::new();
        TextEncoder::new()
            .encode_utf8(&self.registry.gather(), &mut text)
            .expect("text encoding of gathered metrics");
        text
    }

    /// The content type of [`Self::encode`].
    pub fn content_type() -> &'static str {
        prometheus::TEXT_FORMAT
    }
}

/// The series one outbox counts on, looked up once.
#[derive(Clone)]
pub struct OutboxMetrics {
    outbox: String,
    pub claimed: IntCounter,
    pub acked: IntCounter,
    pub nacked: IntCounter,
    pub released: IntCounter,
    pub empty_claims: IntCounter,
    pub claim_duration: Histogram,
    pub commit_to_claim: Histogram,
    pub batch_rows: Histogram,
    pub streams_open: IntGauge,
    pub in_flight: IntGauge,
    /// Set by the health checks.
    pub serving: IntGauge,
    dead_lettered: [IntCounter; 4],
    fenced: [IntCounter; 5],
    answer_duration: [Histogram; 5],
    storage_errors: [IntCounter; 6],
    subscriber_streams: IntGaugeVec,
    subscribers_lock: Arc<Mutex<()>>,
}

impl OutboxMetrics {
    /// Series in a registry nobody scrapes: an outbox made without metrics (unit tests).
    pub fn unscraped(outbox: &str) -> Self {
        Metrics::new().outbox(outbox)
    }

    pub fn dead_lettered(&self, reason: DeadLetterReason, rows: usize) {
        let index = DeadLetterReason::ALL.iter().position(|r| *r == reason);
        self.dead_lettered[index.expect("every reason listed")].inc_by(rows as u64);
    }

    pub fn fenced(&self, answer: AnswerKind, rows: usize) {
        if rows > 0 {
            self.fenced[answer_index(answer)].inc_by(rows as u64);
        }
    }

    pub fn answer_duration(&self, answer: AnswerKind) -> &Histogram {
        &self.answer_duration[answer_index(answer)]
    }

    /// Counts a failed storage call by its kind of error.
    pub fn counted<T>(&self, result: StorageResult<T>) -> StorageResult<T> {
        result.inspect_err(|error| self.storage_error(error))
    }

    pub fn storage_error(&self, error: &StorageError) {
        let kind = error_kind(error);
        let index = ERROR_KINDS.iter().position(|k| *k == kind);
        self.storage_errors[index.expect("every kind listed")].inc();
    }

    /// Counts a stream of `subscriber` open until the guard drops.
    pub fn stream_opened(&self, subscriber: &str) -> StreamGuard {
        let _lock = self.subscribers_lock.lock().expect("subscriber gauge");
        self.streams_open.inc();
        self.subscriber_streams
            .with_label_values(&[self.outbox.as_str(), subscriber])
            .inc();
        StreamGuard {
            metrics: self.clone(),
            subscriber: subscriber.to_owned(),
        }
    }
}

fn answer_index(answer: AnswerKind) -> usize {
    AnswerKind::ALL
        .iter()
        .position(|a| *a == answer)
        .expect("every answer listed")
}

/// An open stream, counted in `txoutbox_streams_open` and `txoutbox_subscriber_streams`.
pub struct StreamGuard {
    metrics: OutboxMetrics,
    subscriber: String,
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        let metrics = &self.metrics;
        let _lock = metrics.subscribers_lock.lock().expect("subscriber gauge");
        metrics.streams_open.dec();
        let labels = [metrics.outbox.as_str(), self.subscriber.as_str()];
        let streams = metrics.subscriber_streams.with_label_values(&labels);
        streams.dec();
        // A subscriber name whose streams all ended leaves the scrape: names of
        // short-lived subscribers do not pile up.
        if streams.get() <= 0 {
            let _ = metrics.subscriber_streams.remove_label_values(&labels);
        }
    }
}

/// Makes metric families, each registered with one registry.
struct Families<'a>(&'a Registry);

impl Families<'_> {
    fn register<T: prometheus::core::Collector + Clone + 'static>(&self, family: T) -> T {
        self.0
            .register(Box::new(family.clone()))
            .expect("registered once");
        family
    }

    fn counter(&self, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
        self.register(IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric"))
    }

    fn gauge(&self, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
        self.register(IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric"))
    }

    fn float_gauge(&self, name: &str, help: &str, labels: &[&str]) -> prometheus::GaugeVec {
        self.register(
            prometheus::GaugeVec::new(Opts::new(name, help), labels).expect("valid metric"),
        )
    }

    fn histogram(&self, name: &str, help: &str, labels: &[&str], buckets: &[f64]) -> HistogramVec {
        let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
        self.register(HistogramVec::new(opts, labels).expect("valid metric"))
    }
}

impl GroupGauges {
    fn new(families: &Families) -> Self {
        let by_group = &["outbox", "group"];
        let gauge = |name: &str, help: &str| families.gauge(name, help, by_group);
        Self {
            lag_rows: gauge("txoutbox_group_lag_rows", "Visible rows past the group's positions, at the last depth refresh."),
            lag: families.float_gauge("txoutbox_group_lag_seconds", "Age of the oldest row past the group's positions (0 with none), at the last depth refresh.", by_group),
            retrying: gauge("txoutbox_group_retrying_rows", "Rows of the group waiting for a retry, at the last depth refresh."),
            held: gauge("txoutbox_group_held_rows", "Rows of the group held behind an earlier failed row of their key, at the last depth refresh."),
            dead: gauge("txoutbox_group_dead_rows", "Rows dead-lettered for the group, at the last depth refresh."),
            held_keys: gauge("txoutbox_group_held_keys", "Keys the group holds back behind a failed row, at the last depth refresh."),
            members: gauge("txoutbox_group_members", "Streams of the group alive on any replica, at the last depth refresh."),
            owned_partitions: gauge("txoutbox_group_owned_partitions", "Partitions of the group with an owner, at the last depth refresh."),
            partitions: gauge("txoutbox_group_partitions", "Partitions of the group."),
            frontier_delay: families.float_gauge("txoutbox_group_frontier_delay_seconds", "How long the oldest open writing transaction has been open: rows committed after it started wait for it before any group delivers them, at the last depth refresh.", &["outbox"]),
        }
    }
}

#[cfg(test)]
mod tests;
