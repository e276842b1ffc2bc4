//! Prometheus metrics of a subscriber (feature `prometheus`): its [`Counters`] and the
//! latency of its publishes, in the application's own `prometheus` registry, next to
//! its other metrics, labelled by outbox and subscriber name.
//!
//! | metric | meaning |
//! |---|---|
//! | `txoutbox_client_received_total` | messages handed to this subscriber (a redelivery counts again) |
//! | `txoutbox_client_published_total` | publishes the publisher accepted |
//! | `txoutbox_client_acked_total` | messages the server confirmed as delivered |
//! | `txoutbox_client_retried_total` | failed publishes whose retry the server scheduled |
//! | `txoutbox_client_dead_lettered_total` | messages dead-lettered |
//! | `txoutbox_client_blocked_total` | messages given back behind a failed or lost one of their key |
//! | `txoutbox_client_released_total` | messages given back untried on stop or drain |
//! | `txoutbox_client_lease_lost_total` | leases lost before an answer |
//! | `txoutbox_client_lease_extensions_total` | lease extensions granted (per message) |
//! | `txoutbox_client_connects_total` | streams opened (more than one: reconnects) |
//! | `txoutbox_client_disconnects_total` | streams ended or failed to open, other than by a stop |
//! | `txoutbox_client_publish_duration_seconds` | histogram: how long accepted publishes took |
//!
//! The counters are read at scrape time from [`Counters`] (nothing is counted twice);
//! the latency comes from the [`Event::Published`] events, read by a task: if that task
//! falls behind the event channel's capacity, the events it missed are not observed
//! (the counters stay exact).

use std::sync::Arc;

use prometheus::core::{Collector, Desc};
use prometheus::proto::{Counter, LabelPair, Metric, MetricFamily, MetricType};
use prometheus::{Histogram, HistogramOpts, Registry};
use tokio::sync::broadcast::error::RecvError;

use crate::events::{CounterSnapshot, Counters, Event};
use crate::Subscriber;

/// Seconds buckets of a publish: a broker round trip, up to a slow webhook.
const PUBLISH_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// (name without `txoutbox_client_` and `_total`, help, value) of each counter.
fn counters(s: &CounterSnapshot) -> [(&'static str, &'static str, u64); 11] {
    [
        (
            "received",
            "Messages handed to this subscriber (a redelivery counts again).",
            s.received,
        ),
        (
            "published",
            "Publishes the publisher accepted.",
            s.published,
        ),
        (
            "acked",
            "Messages the server confirmed as delivered.",
            s.acked,
        ),
        (
            "retried",
            "Failed publishes whose retry the server scheduled.",
            s.retried,
        ),
        ("dead_lettered", "Messages dead-lettered.", s.dead_lettered),
        (
            "blocked",
            "Messages given back behind a failed or lost message of their key.",
            s.blocked,
        ),
        (
            "released",
            "Messages given back untried on stop or drain.",
            s.released,
        ),
        (
            "lease_lost",
            "Leases lost before an answer (the message is redelivered).",
            s.lease_lost,
        ),
        (
            "lease_extensions",
            "Lease extensions the server granted (per message).",
            s.lease_extensions,
        ),
        (
            "connects",
            "Streams opened (more than one: reconnects).",
            s.connects,
        ),
        (
            "disconnects",
            "Streams ended or failed to open, other than by a requested stop.",
            s.disconnects,
        ),
    ]
}

/// The subscriber's counters, read at every scrape.
struct CounterCollector {
    counters: Arc<Counters>,
    labels: Vec<LabelPair>,
    descs: Vec<Desc>,
}

impl Collector for CounterCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        counters(&self.counters.snapshot())
            .into_iter()
            .map(|(name, help, value)| {
                let mut counter = Counter::default();
                counter.set_value(value as f64);
                let mut metric = Metric::default();
                metric.set_label(self.labels.clone());
                metric.set_counter(counter);
                let mut family = MetricFamily::default();
                family.set_name(format!("txoutbox_client_{name}_total"));
                family.set_help(help.to_owned());
                family.set_field_type(MetricType::COUNTER);
                family.mut_metric().push(metric);
                family
            })
            .collect()
    }
}

/// Registers `subscriber`'s metrics in `registry` and starts the task that observes its
/// publish latency (call inside the tokio runtime, before or after `spawn`; the task
/// ends with the subscriber). Fails when a subscriber of the same outbox and name is
/// registered already.
///
/// ```no_run
/// # async fn demo(subscriber: txoutbox_client::Subscriber) -> prometheus::Result<()> {
/// let registry = prometheus::Registry::new();
/// txoutbox_client::metrics::register(&subscriber, &registry)?;
/// let handle = subscriber.spawn();
/// // Serve `prometheus::TextEncoder::new().encode_to_string(&registry.gather())` on /metrics.
/// # Ok(()) }
/// ```
pub fn register(subscriber: &Subscriber, registry: &Registry) -> prometheus::Result<()> {
    let (outbox, name) = subscriber.labels();
    let const_labels = [("outbox", outbox), ("subscriber", name)]
        .map(|(label, value)| (label.to_owned(), value.to_owned()))
        .into_iter()
        .collect::<std::collections::HashMap<_, _>>();
    let mut labels: Vec<LabelPair> = const_labels
        .iter()
        .map(|(label, value)| {
            let mut pair = LabelPair::default();
            pair.set_name(label.clone());
            pair.set_value(value.clone());
            pair
        })
        .collect();
    labels.sort_by(|a, b| a.name().cmp(b.name()));
    let descs = counters(&CounterSnapshot::default())
        .into_iter()
        .map(|(counter, help, _)| {
            Desc::new(
                format!("txoutbox_client_{counter}_total"),
                help.to_owned(),
                Vec::new(),
                const_labels.clone(),
            )
        })
        .collect::<prometheus::Result<Vec<_>>>()?;
    registry.register(Box::new(CounterCollector {
        counters: subscriber.counters(),
        labels,
        descs,
    }))?;
    let latency = Histogram::with_opts(
        HistogramOpts::new(
            "txoutbox_client_publish_duration_seconds",
            "How long accepted publishes took.",
        )
        .const_labels(const_labels)
        .buckets(PUBLISH_BUCKETS.to_vec()),
    )?;
    registry.register(Box::new(latency.clone()))?;
    let mut events = subscriber.events();
    tokio::spawn(async move {
        loop {
            match events.recv().await {
                Ok(Event::Published { elapsed, .. }) => latency.observe(elapsed.as_secs_f64()),
                Ok(_) | Err(RecvError::Lagged(_)) => {}
                Err(RecvError::Closed) => return,
            }
        }
    });
    Ok(())
}
