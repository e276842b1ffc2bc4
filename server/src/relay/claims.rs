//! Claims of one outbox: the lease asked for within its bounds, the batch within the
//! window, the pauses and one response of `server.max_message_bytes`, and the idle-polling
//! groups its streams share (see [`super::idle`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::idle::{IdlePolls, PollGroup};
use super::pause::{self, PauseView};
use super::response_size::{message_bytes, ENVELOPE_BYTES};
use super::{limits, RelayError, RelayResult};
use crate::config::{OutboxConfig, MAX_WINDOW, MIN_LEASE};
use crate::storage::{ClaimRequest, Claimed, HeldKeys, SortedIds, Storage};
use crate::telemetry::metrics::{DeadLetterReason, OutboxMetrics};
use crate::telemetry::traces;

/// What claims rows of one outbox for its callers.
pub struct Claims {
    name: String,
    config: OutboxConfig,
    storage: Arc<dyn Storage>,
    pub(super) metrics: OutboxMetrics,
    /// The pause as this replica last read it from the database (see [`pause`]).
    pause: Arc<PauseView>,
    /// One idle-polling schedule per topic filter, shared by the outbox's streams, which
    /// also hands out the storage's insert signals (see [`super::idle`]).
    idle_polls: IdlePolls,
    /// `server.max_message_bytes`: the most bytes of one response of claimed rows.
    max_message_bytes: usize,
    /// Average encoded size of the rows of the latest claim, 0 before any: sizes the next
    /// claim to what one response holds (see [`Claims::claim`]).
    row_bytes: AtomicUsize,
}

impl Claims {
    pub(super) fn new(
        name: &str,
        config: &OutboxConfig,
        storage: &Arc<dyn Storage>,
        pause: &Arc<PauseView>,
        max_message_bytes: usize,
    ) -> Self {
        let idle_polls = IdlePolls::new(
            config.poll,
            config.max_topic_filters as usize,
            storage.insert_signal(),
        );
        Self {
            name: name.to_owned(),
            config: config.clone(),
            storage: Arc::clone(storage),
            metrics: OutboxMetrics::unscraped(name),
            pause: Arc::clone(pause),
            idle_polls,
            max_message_bytes,
            row_bytes: AtomicUsize::new(0),
        }
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
        // Per-row claims never run on an outbox with groups: no group pauses to read.
        let pauses = self.pause.read(&*self.storage, None, &self.name).await;
        let (topics, paused_topics) = match pause::ClaimScope::of(topics, &pauses) {
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
        let claimed = self.metrics.counted(result)?;
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
            let result = self
                .metrics
                .counted(self.storage.dead_letter(id, owner, &error).await);
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
            let result = self
                .metrics
                .counted(self.storage.release(&rest, owner, Duration::ZERO).await);
            if let Err(error) = result {
                tracing::warn!(outbox = %self.name, count = rest.len(), error = format!("{error:#}"), "could not give back rows that did not fit the response; they come back when their lease runs out");
            }
        }
        claimed.messages = kept;
        (claimed, left_out)
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
}
