//! Answers about claimed rows (ack, nack, release, dead-letter, extend a lease) by their
//! holder: checked as every caller's input is, applied in one storage call each, and
//! counted; an answer about a row the caller no longer holds is fenced (ignored and
//! counted), never an error.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::backoff::Backoff;
use super::{lease_token, limits, RelayResult};
use crate::config::OutboxConfig;
use crate::storage::{
    Extended, MessageId, NackRequest, NackResult, SortedIds, Storage, StorageResult,
};
use crate::telemetry::metrics::{AnswerKind, DeadLetterReason, OutboxMetrics};

/// What applies the answers of one outbox's callers.
pub struct Answers {
    name: String,
    storage: Arc<dyn Storage>,
    pub(super) metrics: OutboxMetrics,
    backoff: Backoff,
    /// Answers ignored since start because the caller no longer held the row.
    fenced: AtomicU64,
}

impl Answers {
    pub(super) fn new(name: &str, config: &OutboxConfig, storage: &Arc<dyn Storage>) -> Self {
        Self {
            name: name.to_owned(),
            storage: Arc::clone(storage),
            metrics: OutboxMetrics::unscraped(name),
            backoff: Backoff::new(config.backoff, config.max_attempts),
            fenced: AtomicU64::new(0),
        }
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
        if nacks.is_empty() {
            return Ok(Vec::new());
        }
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
            .metrics
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
        Ok(self
            .metrics
            .counted(self.storage.return_leases(&sorted, owner).await)?)
    }

    /// Answers this replica ignored since it started because the caller no longer held
    /// the row.
    pub fn fenced_count(&self) -> u64 {
        self.fenced.load(Ordering::Relaxed)
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
        self.metrics.counted(result)
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

    /// Counts answers about rows the caller no longer held, which were ignored: in the
    /// total `Admin.Stats` reports and in the metrics, by answer.
    fn count_fenced(&self, kind: AnswerKind, n: usize) {
        self.fenced.fetch_add(n as u64, Ordering::Relaxed);
        self.metrics.fenced(kind, n);
        if n > 0 {
            tracing::debug!(outbox = %self.name, fenced = n, "stale answers ignored");
        }
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
