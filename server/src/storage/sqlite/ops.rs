//! The operations of more than one statement: a claim (probe, dead-letter the rows that
//! used their attempts, lease) and one nack of a batch (read, decide, write, give back the
//! later rows of its key). `mod.rs` runs them and implements the trait.

use std::time::Duration;

use sqlx::sqlite::SqliteArguments;
use sqlx::{Arguments, Row};

use super::convert::{after, before, datetime, decode_messages, json_list, now_ms};
use super::sql::FILTER;
use super::SqliteStorage;
use crate::storage::dead::{self, FilterValue};
use crate::storage::rows::attempts;
use crate::storage::{
    ClaimRequest, Claimed, DeadCounts, DeadFilter, DeadLetter, FailureDecision, MessageId,
    NackRequest, NackResult, RetryPolicy, SortedIds, StorageResult, TopicClause, TopicFilter,
};

impl SqliteStorage {
    /// A claim: a read probe first (no write lock while idle), then the rows that used
    /// their attempts dead-lettered and the rest leased, in one `BEGIN IMMEDIATE`.
    pub(super) async fn claim_rows(&self, request: ClaimRequest<'_>) -> StorageResult<Claimed> {
        let err = || self.error("claim");
        let Some(filter) = TopicFilter::of(&request, &self.options.columns.topic) else {
            return Ok(Claimed {
                exhausted: Vec::new(),
                messages: Vec::new(),
                lease_expires_at: datetime(after(now_ms(), request.lease)).map_err(err())?,
            });
        };
        let sql = &self.sql;
        let (statement, exhaust, probe) = match filter.clause() {
            TopicClause::Any => (&sql.claim_all, &sql.exhaust_all, &sql.probe_all),
            TopicClause::Only => (&sql.claim_topics, &sql.exhaust_topics, &sql.probe_topics),
            TopicClause::Except => (&sql.claim_except, &sql.exhaust_except, &sql.probe_except),
        };
        let topics = filter.topics();
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
            exhausted: SortedIds::from(exhausted).into_vec(),
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
        let released = SortedIds::from(released).into_vec();
        Ok(NackResult::applied(decision, at, released))
    }
}

/// The arguments of a dead-letter statement: its own first (`leading`: ids, limits, epoch
/// milliseconds, all integers), then the selector's values in the order
/// [`dead::conditions`] rendered them: ids as a JSON array, times in epoch milliseconds
/// (see `sql`).
fn dead_arguments<'q>(
    leading: &[i64],
    values: Vec<FilterValue<'q>>,
) -> Result<SqliteArguments<'q>, sqlx::Error> {
    let mut arguments = SqliteArguments::default();
    for value in leading {
        arguments.add(*value).map_err(sqlx::Error::Encode)?;
    }
    for value in values {
        match value {
            FilterValue::Ids(ids) => arguments.add(json_list(ids)),
            FilterValue::Text(text) => arguments.add(text),
            FilterValue::Time(at) => arguments.add(at.timestamp_millis()),
        }
        .map_err(sqlx::Error::Encode)?;
    }
    Ok(arguments)
}

/// The dead-letter operations (see `dead.rs`): reads on the reader pool, writes one
/// statement each on the writer.
impl SqliteStorage {
    pub(super) async fn dead_rows(
        &self,
        filter: &DeadFilter,
        after_id: MessageId,
        limit: u32,
    ) -> StorageResult<Vec<DeadLetter>> {
        let err = || self.error("list dead letters");
        let (conditions, values) = dead::conditions(filter, &self.sql.names, &FILTER, 3);
        let statement = self.sql.dead_list(&conditions);
        let arguments = dead_arguments(&[after_id, i64::from(limit)], values).map_err(err())?;
        let rows = sqlx::query_with(&statement, arguments)
            .fetch_all(&self.pools.reader)
            .await
            .map_err(err())?;
        let died: Vec<Option<i64>> = rows
            .iter()
            .map(|row| row.try_get("died_at"))
            .collect::<Result<_, _>>()
            .map_err(err())?;
        let errors: Vec<String> = rows
            .iter()
            .map(|row| row.try_get("last_error"))
            .collect::<Result<_, _>>()
            .map_err(err())?;
        let messages = decode_messages(rows).map_err(err())?;
        messages
            .into_iter()
            .zip(errors)
            .zip(died)
            .map(|((message, last_error), died_at)| {
                Ok(DeadLetter {
                    message,
                    last_error,
                    died_at: died_at.map(datetime).transpose()?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(err())
    }

    pub(super) async fn dead_counts(&self, filter: &DeadFilter) -> StorageResult<DeadCounts> {
        let err = || self.error("count dead letters");
        let (conditions, values) = dead::conditions(filter, &self.sql.names, &FILTER, 2);
        let statement = self.sql.dead_count(&conditions);
        let arguments = dead_arguments(&[dead::MAX_COUNT_GROUPS], values).map_err(err())?;
        let rows = sqlx::query_as_with(&statement, arguments)
            .fetch_all(&self.pools.reader)
            .await
            .map_err(err())?;
        Ok(DeadCounts::from_rows(rows))
    }

    pub(super) async fn redrive_rows(
        &self,
        filter: &DeadFilter,
        limit: u32,
        delay: Duration,
    ) -> StorageResult<SortedIds> {
        let err = || self.error("re-drive dead letters");
        let (conditions, values) = dead::conditions(filter, &self.sql.names, &FILTER, 3);
        let statement = self.sql.dead_redrive(&conditions);
        let mut conn = self.writer("re-drive dead letters").await?;
        let arguments =
            dead_arguments(&[i64::from(limit), after(now_ms(), delay)], values).map_err(err())?;
        let ids: Vec<MessageId> = sqlx::query_scalar_with(&statement, arguments)
            .fetch_all(&mut *conn)
            .await
            .map_err(err())?;
        Ok(SortedIds::from(ids))
    }

    pub(super) async fn discard_rows(
        &self,
        filter: &DeadFilter,
        limit: u32,
    ) -> StorageResult<SortedIds> {
        let err = || self.error("discard dead letters");
        let (conditions, values) = dead::conditions(filter, &self.sql.names, &FILTER, 2);
        let statement = self.sql.dead_discard(&conditions);
        let mut conn = self.writer("discard dead letters").await?;
        let arguments = dead_arguments(&[i64::from(limit)], values).map_err(err())?;
        let ids: Vec<MessageId> = sqlx::query_scalar_with(&statement, arguments)
            .fetch_all(&mut *conn)
            .await
            .map_err(err())?;
        Ok(SortedIds::from(ids))
    }
}
