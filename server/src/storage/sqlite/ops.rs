//! The operations of more than one statement: a claim (probe, dead-letter the rows that
//! used their attempts, lease) and one nack of a batch (read, decide, write, give back the
//! later rows of its key). `mod.rs` runs them and implements the trait.

use super::convert::{after, before, datetime, decode_messages, json_list, now_ms};
use super::SqliteStorage;
use crate::storage::columns::TopicSource;
use crate::storage::rows::attempts;
use crate::storage::{
    sorted_unique, ClaimRequest, Claimed, FailureDecision, MessageId, NackRequest, NackResult,
    RetryPolicy, StorageResult,
};

impl SqliteStorage {
    /// A claim: a read probe first (no write lock while idle), then the rows that used
    /// their attempts dead-lettered and the rest leased, in one `BEGIN IMMEDIATE`.
    pub(super) async fn claim_rows(&self, request: ClaimRequest<'_>) -> StorageResult<Claimed> {
        let err = || self.error("claim");
        // Every row of a fixed topic has it: a filter takes all of them or none.
        let topics = match &self.options.columns.topic {
            TopicSource::Fixed(fixed) if !request.topics.is_empty() => {
                if !request.topics.contains(fixed) {
                    return Ok(Claimed {
                        exhausted: Vec::new(),
                        messages: Vec::new(),
                        lease_expires_at: datetime(after(now_ms(), request.lease)).map_err(err())?,
                    });
                }
                &[]
            }
            _ => request.topics,
        };
        let (statement, exhaust, probe) = match topics {
            [] => (
                &self.sql.claim_all,
                &self.sql.exhaust_all,
                &self.sql.probe_all,
            ),
            _ => (
                &self.sql.claim_topics,
                &self.sql.exhaust_topics,
                &self.sql.probe_topics,
            ),
        };
        let topics = (!topics.is_empty()).then(|| json_list(topics));
        let delay = self.options.visibility_delay;

        // The common idle case, answered by a read: no write lock taken.
        let now = now_ms();
        let mut query = sqlx::query_scalar(probe).bind(now);
        if let Some(topics) = &topics {
            query = query.bind(topics.as_str());
        }
        if !delay.is_zero() {
            query = query.bind(before(now, delay));
        }
        let claimable: bool = query.fetch_one(&self.pools.reader).await.map_err(err())?;
        if !claimable {
            return Ok(Claimed {
                exhausted: Vec::new(),
                messages: Vec::new(),
                lease_expires_at: datetime(after(now, request.lease)).map_err(err())?,
            });
        }

        let mut tx = self.begin_immediate("claim").await?;
        let now = now_ms();
        let lease_until = after(now, request.lease);
        let max_attempts = i64::from(request.max_attempts);
        let mut query = sqlx::query_scalar(exhaust).bind(now);
        if let Some(topics) = &topics {
            query = query.bind(topics.as_str());
        }
        if !delay.is_zero() {
            query = query.bind(before(now, delay));
        }
        let exhausted: Vec<MessageId> = query
            .bind(i64::from(request.batch_size))
            .bind(max_attempts)
            .fetch_all(&mut *tx)
            .await
            .map_err(err())?;
        let mut query = sqlx::query(statement).bind(now);
        if let Some(topics) = &topics {
            query = query.bind(topics.as_str());
        }
        if !delay.is_zero() {
            query = query.bind(before(now, delay));
        }
        let rows = query
            .bind(request.owner)
            .bind(lease_until)
            .bind(i64::from(request.batch_size))
            .bind(max_attempts)
            .fetch_all(&mut *tx)
            .await
            .map_err(err())?;
        // Decoded before the commit: a row that cannot be decoded fails the claim instead
        // of being leased and lost from sight until its lease runs out.
        let messages = decode_messages(rows).map_err(err())?;
        let lease_expires_at = datetime(lease_until).map_err(err())?;
        tx.commit().await.map_err(err())?;
        if !exhausted.is_empty() {
            tracing::warn!(
                ids = ?exhausted,
                max_attempts = request.max_attempts,
                "dead-lettered rows claimed max_attempts times without an answer"
            );
        }
        tracing::debug!(claimed = messages.len(), "claimed");
        Ok(Claimed {
            exhausted: sorted_unique(exhausted),
            messages,
            lease_expires_at,
        })
    }

    /// One nack of a batch, inside the batch's write transaction.
    pub(super) async fn nack_in(
        &self,
        tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>,
        nack: &NackRequest<'_>,
        owner: &str,
        policy: &dyn RetryPolicy,
    ) -> StorageResult<NackResult> {
        let err = || self.error("nack");
        let now = now_ms();
        let held: Option<(i64, Option<String>)> = sqlx::query_as(&self.sql.nack_select)
            .bind(nack.id)
            .bind(owner)
            .bind(now)
            .fetch_optional(&mut **tx)
            .await
            .map_err(err())?;
        let Some((stored_attempts, key)) = held else {
            return Ok(NackResult::Fenced);
        };

        let decision = policy.on_failure(attempts(stored_attempts), nack.requested_delay);
        // When the later rows of the key become claimable: the retry time, or now.
        let successors_at = match decision {
            FailureDecision::RetryAfter(delay) => {
                let retry_at = after(now, delay);
                sqlx::query(&self.sql.nack_retry)
                    .bind(nack.id)
                    .bind(retry_at)
                    .bind(nack.error)
                    .execute(&mut **tx)
                    .await
                    .map_err(err())?;
                retry_at
            }
            FailureDecision::DeadLetter => {
                sqlx::query(&self.sql.nack_dead)
                    .bind(nack.id)
                    .bind(now)
                    .bind(nack.error)
                    .execute(&mut **tx)
                    .await
                    .map_err(err())?;
                now
            }
        };
        let released = match key {
            Some(key) => sqlx::query_scalar(&self.sql.release_successors)
                .bind(key)
                .bind(nack.id)
                .bind(owner)
                .bind(successors_at)
                .fetch_all(&mut **tx)
                .await
                .map_err(err())?,
            None => Vec::new(),
        };
        let at = datetime(successors_at).map_err(err())?;
        Ok(NackResult::applied(decision, at, sorted_unique(released)))
    }
}
