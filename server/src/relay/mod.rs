//! The relay core: the configured outboxes, the rules around every storage call
//! (argument limits, lease bounds, retry policy, oversized rows), and the subscription
//! loop that claims on behalf of a streaming subscriber within its window.
//!
//! Nothing here knows about protobuf: the gRPC layer translates to and from these types.

pub mod backoff;
pub mod blocked;
pub mod bytes_in_flight;
pub mod dead_letters;
pub mod drain;
#[cfg(test)]
pub(crate) mod fake;
pub mod idle;
pub mod lease_token;
pub mod limits;
pub mod pause;
pub mod poller;
pub mod response_size;
pub mod subscribers;
pub mod subscription;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::config::{OutboxConfig, MAX_WINDOW, MIN_LEASE};
use crate::storage::{
    ClaimRequest, Claimed, Extended, HeldKeys, MessageId, NackRequest, NackResult, NewMessage,
    SortedIds, Stats, Storage, StorageError, StorageResult,
};
use crate::telemetry::metrics::{AnswerKind, DeadLetterReason, OutboxMetrics};
use crate::telemetry::traces;
use backoff::Backoff;
use idle::{IdlePolls, PollGroup};
pub use limits::MAX_IDS;
use response_size::{message_bytes, ENVELOPE_BYTES};

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

/// One outbox table with its settings and retry policy.
pub struct Outbox {
    pub name: String,
    pub config: OutboxConfig,
    storage: Arc<dyn Storage>,
    /// The same table on connections of the health checks' own, if any (see `app`).
    health_storage: Option<Arc<dyn Storage>>,
    /// The same table on connections of the depth gauges' own, if any (see `app`).
    depth_storage: Option<Arc<dyn Storage>>,
    backoff: Backoff,
    /// One idle-polling schedule per topic filter, shared by the outbox's streams, which
    /// also hands out the storage's insert signals (see [`idle`]).
    idle_polls: IdlePolls,
    /// `server.max_message_bytes`: the most bytes of one response of claimed rows.
    max_message_bytes: usize,
    /// Average encoded size of the rows of the latest claim, 0 before any: sizes the next
    /// claim to what one response holds (see [`Outbox::claim`]).
    row_bytes: AtomicUsize,
    /// The pause as this replica last read it from the database (see [`pause`]).
    pause: pause::PauseView,
    /// Answers ignored since start because the caller no longer held the row.
    fenced: AtomicU64,
    /// The streams of this outbox connected to this replica (see [`subscribers`]).
    subscribers: Arc<subscribers::Subscribers>,
    /// What this outbox counts for Prometheus (unscraped unless [`Outbox::with_metrics`]).
    metrics: OutboxMetrics,
}

impl Outbox {
    pub fn new(
        name: String,
        config: OutboxConfig,
        storage: Arc<dyn Storage>,
        max_message_bytes: usize,
    ) -> Self {
        let backoff = Backoff::new(config.backoff, config.max_attempts);
        let idle_polls = IdlePolls::new(
            config.poll,
            config.max_topic_filters as usize,
            storage.insert_signal(),
        );
        let metrics = OutboxMetrics::unscraped(&name);
        Self {
            metrics,
            name,
            config,
            storage,
            health_storage: None,
            depth_storage: None,
            backoff,
            idle_polls,
            max_message_bytes,
            row_bytes: AtomicUsize::new(0),
            pause: pause::PauseView::default(),
            fenced: AtomicU64::new(0),
            subscribers: Arc::default(),
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
        self.metrics = metrics;
        self
    }

    pub fn metrics(&self) -> &OutboxMetrics {
        &self.metrics
    }

    /// Counts a failed storage call by its kind of error.
    fn counted<T>(&self, result: StorageResult<T>) -> StorageResult<T> {
        result.inspect_err(|error| self.metrics.storage_error(error))
    }

    /// Runs the storage call of an answer, timed and its error counted.
    async fn answer<T>(
        &self,
        kind: AnswerKind,
        call: impl Future<Output = StorageResult<T>>,
    ) -> StorageResult<T> {
        let timer = self.metrics.answer_duration(kind).start_timer();
        let result = call.await;
        timer.observe_duration();
        self.counted(result)
    }

    /// Counts what a nack did.
    fn count_nack(&self, result: &NackResult) {
        match result {
            NackResult::Retried { released, .. } => {
                self.metrics.nacked.inc();
                self.metrics.released.inc_by(released.len() as u64);
            }
            NackResult::DeadLettered { released } => {
                self.metrics.nacked.inc();
                self.metrics
                    .dead_lettered(DeadLetterReason::NackLastAttempt, 1);
                self.metrics.released.inc_by(released.len() as u64);
            }
            NackResult::Fenced => self.count_fenced(AnswerKind::Nack, 1),
        }
    }

    /// Counts a claim's rows: handed out (with their age since commit), or none.
    fn count_claim(&self, claimed: &Claimed, lease: Duration) {
        let metrics = &self.metrics;
        metrics.dead_lettered(DeadLetterReason::MaxClaims, claimed.exhausted.len());
        if claimed.messages.is_empty() {
            metrics.empty_claims.inc();
            return;
        }
        metrics.claimed.inc_by(claimed.messages.len() as u64);
        metrics.batch_rows.observe(claimed.messages.len() as f64);
        // The claim's time on the database clock, the one `created_at` is on: a skewed
        // server clock does not skew the age.
        let lease = chrono::Duration::from_std(lease).unwrap_or(chrono::Duration::MAX);
        let claimed_at = claimed.lease_expires_at - lease;
        for message in &claimed.messages {
            let age = (claimed_at - message.created_at)
                .to_std()
                .unwrap_or_default();
            metrics.commit_to_claim.observe(age.as_secs_f64());
        }
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

    /// The idle-polling group of the streams filtering on `topics` (see [`idle`]); a
    /// filter that would pass `max_topic_filters` is refused.
    pub fn idle_poll(&self, topics: &[String]) -> RelayResult<Arc<PollGroup>> {
        self.idle_polls.join(topics).ok_or_else(|| {
            let limit = self.idle_polls.max_groups();
            RelayError::ResourceExhausted(format!(
                "outbox {} already has {limit} distinct topic filters among its open streams \
                 (limit outboxes.{}.max_topic_filters = {limit}): subscribe with a filter in use, \
                 or wait for streams to end, or raise the limit",
                self.name, self.name
            ))
        })
    }

    /// Counts answers about rows the caller no longer held, which were ignored: in the
    /// total `Admin.Stats` reports and in the metrics, by answer.
    fn count_fenced(&self, kind: AnswerKind, n: usize) {
        self.fenced.fetch_add(n as u64, Ordering::Relaxed);
        self.metrics.fenced(kind, n);
        if n > 0 {
            tracing::debug!(outbox = %self.name, fenced = n, "stale answers ignored");
        }
    }

    /// The lease to use: `requested` (zero means the outbox default), within `max_lease`.
    pub fn lease(&self, requested: Duration) -> RelayResult<Duration> {
        if requested.is_zero() {
            return Ok(self.config.lease);
        }
        if requested > self.config.max_lease {
            return Err(RelayError::InvalidArgument(format!(
                "lease of {} exceeds the outbox's max_lease of {}; ask for less or raise outboxes.{}.max_lease",
                humantime::format_duration(requested),
                humantime::format_duration(self.config.max_lease),
                self.name
            )));
        }
        if requested < MIN_LEASE {
            return Err(RelayError::InvalidArgument(format!(
                "lease of {}ms is too short; ask for at least {}ms",
                requested.as_millis(),
                MIN_LEASE.as_millis()
            )));
        }
        Ok(requested)
    }

    /// Claims up to `batch_size` rows for `owner`, as many as one response holds: the
    /// id-ordered prefix of the claimed rows that fits in `server.max_message_bytes` is
    /// kept, the rest given back untried (attempt refunded), and a row too large for any
    /// response on its own is dead-lettered with an error saying so. The claim asks the
    /// database for no more rows than the latest claim's average row size says fit, so a
    /// claim of large rows neither loads nor gives back many.
    pub async fn claim(
        &self,
        owner: &str,
        batch_size: u32,
        lease: Duration,
        topics: &[String],
    ) -> RelayResult<Claimed> {
        let (claimed, _) = self
            .claim_within(owner, batch_size, lease, topics, usize::MAX, None)
            .await?;
        Ok(claimed)
    }

    /// [`Self::claim`] with the rows kept also within `max_bytes` (an identity's
    /// `max_bytes_in_flight` allowance, see [`bytes_in_flight`]): rows past it are given
    /// back like those past a response. Also returns the size of the first row given back
    /// for `max_bytes` (when it is smaller than a response), which the next claim needs.
    /// With `ahead`, a strict claim may go on past the rows `owner` holds of those keys
    /// ([`Storage::claim_ahead`]): only for a caller that parks such rows until the earlier
    /// ones are acked (a stream, see `subscription/parked.rs`).
    #[tracing::instrument(name = "outbox.claim", skip_all, fields(outbox = %self.name))]
    pub async fn claim_within(
        &self,
        owner: &str,
        batch_size: u32,
        lease: Duration,
        topics: &[String],
        max_bytes: usize,
        ahead: Option<HeldKeys>,
    ) -> RelayResult<(Claimed, Option<usize>)> {
        limits::holder(owner)?;
        limits::topics(topics)?;
        if batch_size == 0 || batch_size > MAX_WINDOW {
            return Err(RelayError::InvalidArgument(format!(
                "batch_size = {batch_size}: must be within 1..={MAX_WINDOW}"
            )));
        }
        let batch_size = batch_size
            .min(self.config.max_batch_size)
            .min(self.rows_within(max_bytes.min(self.response_budget())));
        let (topics, paused_topics) = match pause::ClaimScope::of(topics, &self.pauses().await) {
            pause::ClaimScope::Paused => {
                // Paused: nothing handed out, nothing asked of the table (see `pause`).
                let claimed = Claimed {
                    messages: Vec::new(),
                    lease_expires_at: chrono::Utc::now()
                        + chrono::Duration::from_std(lease).unwrap_or_default(),
                    exhausted: Vec::new(),
                };
                return Ok((claimed, None));
            }
            pause::ClaimScope::Topics {
                topics,
                paused_topics,
            } => (topics, paused_topics),
        };
        let request = ClaimRequest {
            owner,
            batch_size,
            lease,
            topics: &topics,
            paused_topics: &paused_topics,
            max_attempts: self.config.max_attempts,
        };
        let timer = self.metrics.claim_duration.start_timer();
        let result = match &ahead {
            Some(held) => self.storage.claim_ahead(request, held).await,
            None => self.storage.claim(request).await,
        };
        timer.observe_duration();
        let claimed = self.counted(result)?;
        let (mut claimed, left_out) = self.fit_response(owner, claimed, max_bytes).await;
        self.count_claim(&claimed, lease);
        if traces::enabled() {
            for message in &mut claimed.messages {
                traces::relay_span(&self.name, message);
            }
        }
        Ok((claimed, left_out))
    }

    /// Bytes of claimed rows one response holds.
    pub fn response_budget(&self) -> usize {
        self.max_message_bytes - ENVELOPE_BYTES
    }

    /// How many rows of the latest claim's average size one response holds.
    pub fn rows_per_response(&self) -> u32 {
        self.rows_within(self.response_budget())
    }

    /// How many rows of the latest claim's average size `bytes` hold (at least one).
    fn rows_within(&self, bytes: usize) -> u32 {
        match self.row_bytes.load(Ordering::Relaxed) {
            0 => u32::MAX,
            average => u32::try_from(bytes / average).unwrap_or(u32::MAX).max(1),
        }
    }

    /// The latest claim's average row size, in [`message_bytes`] (at least 1).
    pub fn average_row_bytes(&self) -> usize {
        self.row_bytes.load(Ordering::Relaxed).max(1)
    }

    /// Keeps the id-ordered prefix of `claimed` that fits one response and `max_bytes`;
    /// see [`Self::claim_within`]. A failed give-back is logged, not returned: the rows
    /// kept are leased and must go out, and what was not given back comes back when its
    /// lease runs out.
    async fn fit_response(
        &self,
        owner: &str,
        mut claimed: Claimed,
        max_bytes: usize,
    ) -> (Claimed, Option<usize>) {
        let budget = self.response_budget().min(max_bytes);
        let capped = budget < self.response_budget();
        let mut left_out = None;
        let (mut used, mut full) = (0, false);
        let (mut kept, mut rest, mut oversized) = (Vec::new(), Vec::new(), Vec::new());
        let (mut seen_bytes, mut seen) = (0, 0);
        for message in std::mem::take(&mut claimed.messages) {
            // A row the database left unread for its size is as large as it says.
            let bytes = match message.too_large {
                Some(stored) => usize::try_from(stored).unwrap_or(usize::MAX),
                None => message_bytes(&message),
            };
            if message.too_large.is_some() || bytes > self.response_budget() {
                oversized.push((message.id, bytes));
                continue;
            }
            seen_bytes += bytes;
            seen += 1;
            if !full && used + bytes <= budget {
                used += bytes;
                kept.push(message);
            } else {
                if !full && capped {
                    left_out = Some(bytes);
                }
                full = true;
                rest.push(message.id);
            }
        }
        if let Some(average) = seen_bytes.checked_div(seen) {
            self.row_bytes.store(average, Ordering::Relaxed);
        }
        for (id, bytes) in oversized {
            let error = format!(
                "message of {bytes} bytes does not fit in a response of server.max_message_bytes \
                 ({}); shrink it (payload, headers, key) or raise server.max_message_bytes \
                 together with every client's receive limit",
                self.max_message_bytes
            );
            tracing::error!(outbox = %self.name, id, %error, "dead-lettering a row too large to send");
            let result = self.counted(self.storage.dead_letter(id, owner, &error).await);
            if result.as_ref().is_ok_and(|applied| *applied) {
                self.metrics.dead_lettered(DeadLetterReason::TooLarge, 1);
            }
            if let Err(error) = result {
                tracing::warn!(outbox = %self.name, id, error = format!("{error:#}"), "could not dead-letter a row too large to send; it comes back when its lease runs out");
            }
        }
        if !rest.is_empty() {
            tracing::debug!(outbox = %self.name, kept = kept.len(), given_back = rest.len(), "claimed more than one response holds");
            let rest = SortedIds::from(rest);
            let result = self.counted(self.storage.release(&rest, owner, Duration::ZERO).await);
            if let Err(error) = result {
                tracing::warn!(outbox = %self.name, count = rest.len(), error = format!("{error:#}"), "could not give back rows that did not fit the response; they come back when their lease runs out");
            }
        }
        claimed.messages = kept;
        (claimed, left_out)
    }

    /// Returns (acked, fenced).
    #[tracing::instrument(name = "outbox.ack", skip_all, fields(outbox = %self.name))]
    pub async fn ack(
        &self,
        owner: &str,
        ids: &[MessageId],
    ) -> RelayResult<(Vec<MessageId>, Vec<MessageId>)> {
        limits::holder(owner)?;
        limits::ids(ids)?;
        if ids.is_empty() {
            return Ok((Vec::new(), Vec::new()));
        }
        let sorted = SortedIds::from(ids);
        let applied = self
            .answer(AnswerKind::Ack, self.storage.ack(&sorted, owner))
            .await?
            .into_vec();
        self.metrics.acked.inc_by(applied.len() as u64);
        let (applied, fenced) = self.split_fenced(AnswerKind::Ack, ids, applied);
        Ok((applied, fenced))
    }

    #[tracing::instrument(name = "outbox.nack", skip_all, fields(outbox = %self.name))]
    pub async fn nack(
        &self,
        owner: &str,
        id: MessageId,
        error: &str,
        requested_delay: Option<Duration>,
    ) -> RelayResult<NackResult> {
        limits::holder(owner)?;
        limits::text("error", error)?;
        let error = limits::truncate_error(error);
        let call = self
            .storage
            .nack(id, owner, error, requested_delay, &self.backoff);
        let result = self.answer(AnswerKind::Nack, call).await?;
        self.count_nack(&result);
        Ok(result)
    }

    /// [`Self::nack`] for several nacks in one storage call; one outcome per nack, in
    /// order.
    #[tracing::instrument(name = "outbox.nack_many", skip_all, fields(outbox = %self.name))]
    pub async fn nack_many(
        &self,
        owner: &str,
        nacks: &[NackRequest<'_>],
    ) -> RelayResult<Vec<NackResult>> {
        limits::holder(owner)?;
        limits::ids(&nacks.iter().map(|n| n.id).collect::<Vec<_>>())?;
        let mut cut = Vec::with_capacity(nacks.len());
        for nack in nacks {
            limits::text("error", nack.error)?;
            cut.push(NackRequest {
                error: limits::truncate_error(nack.error),
                ..*nack
            });
        }
        let call = self.storage.nack_many(&cut, owner, &self.backoff);
        let results = self.answer(AnswerKind::Nack, call).await?;
        results.iter().for_each(|result| self.count_nack(result));
        Ok(results)
    }

    /// Returns (released, fenced).
    #[tracing::instrument(name = "outbox.release", skip_all, fields(outbox = %self.name))]
    pub async fn release(
        &self,
        owner: &str,
        ids: &[MessageId],
        delay: Duration,
    ) -> RelayResult<(Vec<MessageId>, Vec<MessageId>)> {
        limits::holder(owner)?;
        limits::ids(ids)?;
        limits::release_delay(delay)?;
        if ids.is_empty() {
            return Ok((Vec::new(), Vec::new()));
        }
        let sorted = SortedIds::from(ids);
        let call = self.storage.release(&sorted, owner, delay);
        let applied = self.answer(AnswerKind::Release, call).await?.into_vec();
        self.metrics.released.inc_by(applied.len() as u64);
        let (applied, fenced) = self.split_fenced(AnswerKind::Release, ids, applied);
        Ok((applied, fenced))
    }

    /// True when dead-lettered, false when fenced.
    #[tracing::instrument(name = "outbox.dead_letter", skip_all, fields(outbox = %self.name))]
    pub async fn dead_letter(&self, owner: &str, id: MessageId, error: &str) -> RelayResult<bool> {
        limits::holder(owner)?;
        limits::text("error", error)?;
        let call = self
            .storage
            .dead_letter(id, owner, limits::truncate_error(error));
        let applied = self.answer(AnswerKind::DeadLetter, call).await?;
        if applied {
            self.metrics.dead_lettered(DeadLetterReason::Permanent, 1);
        } else {
            self.count_fenced(AnswerKind::DeadLetter, 1);
        }
        Ok(applied)
    }

    /// Returns the extension and the fenced ids.
    #[tracing::instrument(name = "outbox.extend_lease", skip_all, fields(outbox = %self.name))]
    pub async fn extend_lease(
        &self,
        owner: &str,
        ids: &[MessageId],
        lease: Duration,
    ) -> RelayResult<(Extended, Vec<MessageId>)> {
        limits::holder(owner)?;
        limits::ids(ids)?;
        let sorted = SortedIds::from(ids);
        let call = self.storage.extend_lease(&sorted, owner, lease);
        let extended = self.answer(AnswerKind::ExtendLease, call).await?;
        let applied = extended.ids.to_vec();
        let (_, fenced) = self.split_fenced(AnswerKind::ExtendLease, ids, applied);
        Ok((extended, fenced))
    }

    /// Splits the deliveries `tokens` name into those `owner` still holds at the token's
    /// attempt and the stale ones (another holder's, or an earlier delivery of a row
    /// claimed again since), which are fenced and counted as `kind` answers
    /// (docs/lease-tokens.md). Returns (current ids, stale ids), each in the tokens' order.
    pub async fn current_deliveries(
        &self,
        kind: AnswerKind,
        owner: &str,
        tokens: &[lease_token::LeaseToken],
    ) -> RelayResult<(Vec<MessageId>, Vec<MessageId>)> {
        limits::holder(owner)?;
        let ids: Vec<MessageId> = tokens.iter().map(|t| t.id).collect();
        limits::ids(&ids)?;
        let held: BTreeMap<MessageId, u32> = self
            .counted(
                self.storage
                    .held_attempts(&SortedIds::from(&ids[..]), owner)
                    .await,
            )?
            .into_iter()
            .collect();
        let (current, stale): (Vec<_>, Vec<_>) = tokens
            .iter()
            .partition(|t| t.holder == owner && held.get(&t.id) == Some(&t.attempt));
        self.count_fenced(kind, stale.len());
        Ok((
            current.iter().map(|t| t.id).collect(),
            stale.iter().map(|t| t.id).collect(),
        ))
    }

    /// Counts `n` answers a stream fenced for naming an earlier delivery by its token.
    pub fn count_stale(&self, kind: AnswerKind, n: usize) {
        self.count_fenced(kind, n);
    }

    /// Gives back the leases of a subscriber that went away; attempts stay counted.
    pub async fn return_leases(&self, owner: &str, ids: &[MessageId]) -> RelayResult<u64> {
        if ids.is_empty() {
            return Ok(0);
        }
        let sorted = SortedIds::from(ids);
        Ok(self.counted(self.storage.return_leases(&sorted, owner).await)?)
    }

    /// Inserts a row through the relay (`Admin.InsertMessage`: demos and tests), its
    /// strings checked as every caller's are.
    pub async fn insert(&self, message: NewMessage) -> RelayResult<MessageId> {
        limits::topic(&message.topic)?;
        if let Some(key) = &message.key {
            limits::key(key)?;
        }
        limits::headers(&message.headers)?;
        Ok(self.storage.insert(message).await?)
    }

    pub async fn stats(&self) -> RelayResult<Stats> {
        Ok(self.storage.stats().await?)
    }

    /// Rows delivered in the last minute by every replica (see
    /// [`Storage::delivered_within`]).
    pub async fn delivered_last_minute(&self) -> RelayResult<Option<u64>> {
        Ok(self
            .storage
            .delivered_within(Duration::from_secs(60))
            .await?)
    }

    /// Answers this replica ignored since it started because the caller no longer held
    /// the row.
    pub fn fenced_count(&self) -> u64 {
        self.fenced.load(Ordering::Relaxed)
    }

    pub async fn purge(&self, older_than: Duration) -> RelayResult<u64> {
        if older_than.is_zero() {
            return Err(RelayError::InvalidArgument(
                "older_than must be positive, for example 7 days".to_owned(),
            ));
        }
        Ok(self.storage.purge(older_than).await?)
    }

    /// Splits the requested ids into (applied, fenced), logging the fenced ones.
    fn split_fenced(
        &self,
        kind: AnswerKind,
        requested: &[MessageId],
        applied: Vec<MessageId>,
    ) -> (Vec<MessageId>, Vec<MessageId>) {
        let fenced: Vec<MessageId> = requested
            .iter()
            .copied()
            .filter(|id| !applied.contains(id))
            .collect();
        self.count_fenced(kind, fenced.len());
        (applied, fenced)
    }
}

pub fn validate_topics(topics: &[String]) -> RelayResult<()> {
    limits::topics(topics)
}

pub fn validate_subscriber(name: &str) -> RelayResult<()> {
    limits::name("subscriber", name)
}
