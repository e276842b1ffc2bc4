//! The relay core: the configured outboxes, the rules around every storage call
//! (argument limits, lease bounds, retry policy, oversized rows), and the subscription
//! loop that claims on behalf of a streaming subscriber within its window.
//!
//! Nothing here knows about protobuf: the gRPC layer translates to and from these types.

pub mod admin;
pub mod answers;
pub mod backoff;
pub mod blocked;
pub mod bytes_in_flight;
pub mod claims;
pub mod dead_letters;
pub mod drain;
pub mod groups;
pub mod idle;
pub mod lease_token;
pub mod limits;
pub mod pause;
pub mod poller;
pub mod response_size;
pub mod subscribers;
pub mod subscription;

use std::collections::BTreeMap;
use std::sync::Arc;

pub use self::admin::Admin;
pub use self::answers::Answers;
pub use self::claims::Claims;
use crate::config::OutboxConfig;
use crate::storage::{Pauses, Storage, StorageError};
use crate::telemetry::metrics::OutboxMetrics;
pub use limits::MAX_IDS;

/// Errors of the relay layer; [`crate::grpc::status`] maps them to gRPC codes.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// `name` is the caller's, already passed through [`limits::echo`].
    #[error("outbox {name} is not configured; configured: {}", configured.join(", "))]
    UnknownOutbox {
        name: String,
        configured: Vec<String>,
    },
    #[error("{0}")]
    InvalidArgument(String),
    /// A group the outbox does not declare; `name` already passed through [`limits::echo`].
    #[error("outbox {outbox} has no group {name}; configured: {}", configured.join(", "))]
    UnknownGroup {
        outbox: String,
        name: String,
        configured: Vec<String>,
    },
    /// A call the outbox's delivery mode does not take: a group-less call on an outbox
    /// with groups, or a group on one without.
    #[error("{0}")]
    WrongMode(String),
    /// A caller went past a per-stream bound (answers waiting to be applied).
    #[error("{0}")]
    ResourceExhausted(String),
    #[error("the server is shutting down; reconnect to another replica or retry shortly")]
    ShuttingDown,
    #[error(transparent)]
    Storage(#[from] StorageError),
}

impl RelayError {
    /// The caller sent something that will never work as sent: retrying it cannot heal.
    pub fn is_callers_fault(&self) -> bool {
        matches!(
            self,
            RelayError::InvalidArgument(_) | RelayError::Storage(StorageError::InvalidMessage(_))
        )
    }
}

pub type RelayResult<T> = Result<T, RelayError>;

/// All configured outboxes by name.
pub struct Relay {
    outboxes: BTreeMap<String, Arc<Outbox>>,
}

impl Relay {
    pub fn new(outboxes: impl IntoIterator<Item = Arc<Outbox>>) -> Self {
        Self {
            outboxes: outboxes.into_iter().map(|o| (o.name.clone(), o)).collect(),
        }
    }

    pub fn outbox(&self, name: &str) -> RelayResult<&Arc<Outbox>> {
        self.outboxes
            .get(name)
            .ok_or_else(|| RelayError::UnknownOutbox {
                name: limits::echo(name),
                configured: self.outboxes.keys().cloned().collect(),
            })
    }

    pub fn outboxes(&self) -> impl Iterator<Item = &Arc<Outbox>> {
        self.outboxes.values()
    }
}

/// One outbox table with its settings, and the parts that serve its callers: the
/// [`Claims`], the [`Answers`] of the rows' holders, and the operator's [`Admin`].
pub struct Outbox {
    pub name: String,
    pub config: OutboxConfig,
    pub claims: Claims,
    pub answers: Answers,
    pub admin: Admin,
    storage: Arc<dyn Storage>,
    /// The same table on connections of the health checks' own, if any (see `app`).
    health_storage: Option<Arc<dyn Storage>>,
    /// The same table on connections of the depth gauges' own, if any (see `app`).
    depth_storage: Option<Arc<dyn Storage>>,
    /// The pause as this replica last read it from the database (see [`pause`]).
    pause: Arc<pause::PauseView>,
    /// The streams of this outbox connected to this replica (see [`subscribers`]).
    subscribers: Arc<subscribers::Subscribers>,
    /// `server.max_message_bytes`: the most bytes of one response (a group's batch too).
    max_message_bytes: usize,
    /// What this outbox counts for Prometheus (unscraped unless [`Outbox::with_metrics`]).
    metrics: OutboxMetrics,
    /// The outbox's subscription groups, when it declares any: then they alone deliver it.
    groups: Option<Arc<groups::Groups>>,
}

impl Outbox {
    pub fn new(
        name: String,
        config: OutboxConfig,
        storage: Arc<dyn Storage>,
        max_message_bytes: usize,
    ) -> Self {
        let pause = Arc::new(pause::PauseView::default());
        let subscribers = Arc::default();
        Self {
            claims: Claims::new(&name, &config, &storage, &pause, max_message_bytes),
            answers: Answers::new(&name, &config, &storage),
            admin: Admin::new(&name, &storage, &pause, &subscribers),
            metrics: OutboxMetrics::unscraped(&name),
            name,
            config,
            storage,
            health_storage: None,
            depth_storage: None,
            pause,
            subscribers,
            max_message_bytes,
            groups: None,
        }
    }

    /// Delivers the outbox through `groups` (see [`groups`]).
    pub fn with_groups(mut self, store: Arc<dyn crate::storage::groups::GroupStore>) -> Self {
        self.admin.groups = Some(Arc::clone(&store));
        self.groups = Some(Arc::new(groups::Groups::new(
            &self.name,
            &self.config,
            store,
        )));
        self
    }

    /// The outbox's groups; refuses an outbox without.
    pub fn groups(&self) -> RelayResult<&Arc<groups::Groups>> {
        self.groups.as_ref().ok_or_else(|| {
            RelayError::WrongMode(format!(
                "outbox {} has no subscription groups: subscribe without a group, or declare \
                 [outboxes.{}.groups.NAME]",
                self.name, self.name
            ))
        })
    }

    pub fn has_groups(&self) -> bool {
        self.groups.is_some()
    }

    /// Refuses a per-row call (unary claims and answers, a group-less stream) on an
    /// outbox delivered by groups: its rows are never claimed, so it would see nothing.
    pub fn per_row(&self) -> RelayResult<()> {
        match &self.groups {
            None => Ok(()),
            Some(groups) => Err(RelayError::WrongMode(format!(
                "outbox {} is delivered by subscription groups ({}): subscribe with a group",
                self.name,
                groups.names().collect::<Vec<_>>().join(", ")
            ))),
        }
    }

    pub fn storage(&self) -> &Arc<dyn Storage> {
        &self.storage
    }

    /// Pings go to `storage`, a storage of the same table on connections of its own, so
    /// the health checks never wait for a connection of the relay's busy pool.
    pub fn with_health_storage(mut self, storage: Arc<dyn Storage>) -> Self {
        self.health_storage = Some(storage);
        self
    }

    /// The depth gauges count on `storage`, a storage of the same table on connections of
    /// its own, so a slow count never delays a health check (nor a claim).
    pub fn with_depth_storage(mut self, storage: Arc<dyn Storage>) -> Self {
        self.depth_storage = Some(storage);
        self
    }

    /// Counts into `metrics`, the series of this outbox in the server's registry.
    pub fn with_metrics(mut self, metrics: OutboxMetrics) -> Self {
        self.claims.metrics = metrics.clone();
        self.answers.metrics = metrics.clone();
        self.metrics = metrics;
        self
    }

    pub fn metrics(&self) -> &OutboxMetrics {
        &self.metrics
    }

    /// The storage the health checks ping.
    pub fn health_storage(&self) -> &Arc<dyn Storage> {
        self.health_storage.as_ref().unwrap_or(&self.storage)
    }

    /// The storage the depth gauges count on: the relay's own when none of its own was
    /// given (the server always gives one when it counts, see `app::build_relay`).
    pub fn depth_storage(&self) -> &Arc<dyn Storage> {
        self.depth_storage.as_ref().unwrap_or(&self.storage)
    }

    /// What is paused, as this replica sees it (see [`pause::PauseView::read`]).
    pub async fn pauses(&self) -> Pauses {
        let groups = self.groups.as_ref().map(|groups| &*groups.store);
        self.pause.read(&*self.storage, groups, &self.name).await
    }
}

pub fn validate_topics(topics: &[String]) -> RelayResult<()> {
    limits::topics(topics)
}

pub fn validate_subscriber(name: &str) -> RelayResult<()> {
    limits::name("subscriber", name)
}
