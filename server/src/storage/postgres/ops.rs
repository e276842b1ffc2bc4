//! The operations of more than one statement: a claim and the read of its messages, a
//! batch of nacks (read, plan, apply), and moving the heads of finished keys on. Each
//! statement is a transaction of its own (see the module docs of `mod.rs`).

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::types::PgInterval;
use sqlx::{FromRow, Row};
use tokio::time::Instant;

use super::convert::{decode_claim, decode_message, interval};
use super::floor::Start;
use super::sql::FILTER;
use super::PostgresStorage;
use crate::storage::dead::{self, DeadCountRow, FilterValue};
use crate::storage::nack::{plan_nacks, HeldRow};
use crate::storage::rows::attempts;
use crate::storage::{
    ClaimRequest, Claimed, DeadCounts, DeadFilter, DeadLetter, FailureDecision, HeldKeys,
    MessageId, NackRequest, NackResult, RetryPolicy, SortedIds, StorageResult, TopicFilter,
};

impl PostgresStorage {
    /// The claim; with `ahead`, a strict claim follows the owner's own leases of those
    /// keys (see [`crate::storage::Storage::claim_ahead`]), except under
    /// `dead_letter_holds_key`, whose check for a dead row before a key's first row would
    /// have to look behind the owner's rows too.
    pub(super) async fn claim_rows(
        &self,
        request: ClaimRequest<'_>,
        ahead: Option<&HeldKeys>,
    ) -> StorageResult<Claimed> {
        let ahead = ahead.filter(|_| !self.options.dead_holds_key());
        let err = || self.error("claim");
        let max_attempts = i32::try_from(request.max_attempts).unwrap_or(i32::MAX);
        let delay = (!self.options.visibility_delay.is_zero())
            .then(|| interval(self.options.visibility_delay));
        let topics = TopicFilter::requested(&request);
        // Only a non-strict claim of every topic starts at the floor (see `floor.rs`).
        let floored = self.sql.strict.is_none() && topics == TopicFilter::Any;
        let start = match floored {
            true => self.floor.start(Instant::now()),
            false => Start::Bottom,
        };
        let query = match &self.sql.strict {
            Some(strict) => sqlx::query(&strict.claim)
                .bind(request.owner)
                .bind(interval(request.lease))
                .bind(i32::try_from(request.batch_size).unwrap_or(i32::MAX))
                .bind(matches!(topics, TopicFilter::Only(_)).then_some(topics.topics()))
                .bind(delay)
                .bind(max_attempts)
                .bind(matches!(topics, TopicFilter::Except(_)).then_some(topics.topics()))
                .bind(self.options.dead_holds_key())
                .bind(ahead.map(|held| &held.keys[..]))
                .bind(ahead.map(|held| &held.last_ids[..])),
            None => {
                let statement = self.sql.claim(topics.clause(), request.batch_size);
                let mut query = sqlx::query(statement)
                    .bind(request.owner)
                    .bind(interval(request.lease))
                    .bind(i64::from(request.batch_size))
                    .bind(max_attempts)
                    .bind(start.bound());
                if topics != TopicFilter::Any {
                    query = query.bind(topics.topics());
                }
                if let Some(delay) = delay {
                    query = query.bind(delay);
                }
                query
            }
        };
        let rows = query.fetch_all(&self.pool).await.map_err(err())?;
        let outcome = decode_claim(&rows).map_err(err())?;
        let messages = if outcome.leased.is_empty() {
            Vec::new()
        } else if self.sql.strict.is_none() {
            // The non-strict claim returns its messages (see `sql::claim`).
            let mut messages = rows
                .iter()
                .filter(|row| matches!(row.try_get::<Option<bool>, _>("spent"), Ok(Some(false))))
                .map(decode_message)
                .collect::<Result<Vec<_>, _>>()
                .map_err(err())?;
            messages.sort_unstable_by_key(|message| message.id);
            messages
        } else {
            // The strict claim held the table's advisory lock: read once it committed, so
            // no claim waits on how fast this server reads.
            let rows = sqlx::query(&self.sql.fetch)
                .bind(&outcome.leased)
                .fetch_all(&self.pool)
                .await
                .map_err(err())?;
            rows.iter()
                .map(decode_message)
                .collect::<Result<_, _>>()
                .map_err(err())?
        };
        if floored {
            let highest = messages.last().map(|message| message.id);
            self.floor
                .claimed(start, highest.max(outcome.exhausted.iter().copied().max()));
        }
        if !outcome.exhausted.is_empty() {
            tracing::warn!(
                ids = ?outcome.exhausted,
                max_attempts = request.max_attempts,
                "dead-lettered rows claimed max_attempts times without an answer"
            );
        }
        tracing::debug!(claimed = outcome.leased.len(), "claimed");
        Ok(Claimed {
            messages,
            lease_expires_at: outcome.lease_expires_at,
            exhausted: outcome.exhausted,
        })
    }

    /// The nacks of a batch (at least one): the held rows read, the outcomes planned
    /// ([`plan_nacks`]), then applied in one statement.
    pub(super) async fn nack_batch(
        &self,
        nacks: &[NackRequest<'_>],
        owner: &str,
        policy: &dyn RetryPolicy,
    ) -> StorageResult<Vec<NackResult>> {
        let err = || self.error("nack");
        let ids: Vec<MessageId> = nacks.iter().map(|nack| nack.id).collect();
        let held: Vec<(MessageId, i32, Option<String>)> = sqlx::query_as(&self.sql.nack_held)
            .persistent(false)
            .bind(&ids)
            .bind(owner)
            .fetch_all(&self.pool)
            .await
            .map_err(err())?;
        let held: HashMap<MessageId, HeldRow> = held
            .into_iter()
            .map(|(id, stored, key)| {
                let row = HeldRow {
                    attempts: attempts(stored),
                    key,
                };
                (id, row)
            })
            .collect();
        let plan = plan_nacks(nacks, &held, policy);

        let mut apply = NackBatch::default();
        for (nack, decision) in nacks.iter().zip(&plan) {
            let Some(decision) = decision else { continue };
            apply.ids.push(nack.id);
            apply.attempts.push(held[&nack.id].attempts as i32);
            apply.delays.push(match decision {
                FailureDecision::RetryAfter(delay) => Some(interval(*delay)),
                FailureDecision::DeadLetter => None,
            });
            apply.errors.push(nack.error);
        }
        let rows: Vec<NackApplied> = if apply.ids.is_empty() {
            Vec::new()
        } else {
            sqlx::query_as(&self.sql.nack_apply)
                .persistent(false)
                .bind(&apply.ids)
                .bind(&apply.attempts)
                .bind(&apply.delays)
                .bind(&apply.errors)
                .bind(owner)
                .fetch_all(&self.pool)
                .await
                .map_err(err())?
        };
        // Rows back in the pending set: a retry, or a key's later rows given back.
        let due_again = rows
            .iter()
            .filter(|(id, _, cause, dead, _)| id != cause || !*dead)
            .map(|(.., at)| *at)
            .min();
        if let Some(at) = due_again {
            let wait = (at - Utc::now()).to_std().unwrap_or_default();
            self.floor.rescan_at(Instant::now() + wait);
        }
        self.advance_heads(
            rows.iter()
                .filter(|(id, _, cause, dead, _)| id == cause && *dead)
                .filter_map(|(_, key, ..)| key.clone()),
        )
        .await;

        let results = nacks
            .iter()
            .zip(&plan)
            .map(|(nack, decision)| {
                let applied = rows.iter().find(|row| row.0 == nack.id && row.2 == nack.id);
                let (Some(_), Some((_, _, _, dead, at))) = (decision, applied) else {
                    return NackResult::Fenced;
                };
                let released: SortedIds = rows
                    .iter()
                    .filter(|row| row.2 == nack.id && row.0 != nack.id)
                    .map(|row| row.0)
                    .collect();
                let released = released.into_vec();
                if *dead {
                    NackResult::DeadLettered { released }
                } else {
                    NackResult::Retried {
                        retry_at: *at,
                        released,
                    }
                }
            })
            .collect();
        Ok(results)
    }

    /// With strict ordering, after rows of these keys stopped being pending: moves the
    /// keys' heads on (see `heads.rs`). A failure only leaves a head behind, which claims
    /// look past and a later call moves: it is logged, never the answer's error.
    pub(super) async fn advance_heads(&self, keys: impl IntoIterator<Item = String>) {
        let Some(strict) = &self.sql.strict else {
            return;
        };
        let mut keys: Vec<String> = keys.into_iter().collect();
        if keys.is_empty() {
            return;
        }
        keys.sort_unstable();
        keys.dedup();
        if let Err(error) = sqlx::query(&strict.advance)
            .bind(&keys)
            .execute(&self.pool)
            .await
        {
            tracing::warn!(table = %self.sql.display_table, %error, "could not move the heads of finished keys on; claims look past them");
        }
    }
}

/// A row of `sql::nack_apply`: `(id, key, cause, dead, at)`.
type NackApplied = (MessageId, Option<String>, MessageId, bool, DateTime<Utc>);

/// The columns of a batch of nacks to apply (see `sql::nack_apply`).
#[derive(Default)]
struct NackBatch<'a> {
    ids: Vec<MessageId>,
    attempts: Vec<i32>,
    delays: Vec<Option<PgInterval>>,
    errors: Vec<&'a str>,
}

/// `query` with the selector's values bound, in the order [`dead::conditions`] rendered
/// them (after the statement's own parameters).
fn bind_filter<'q>(
    mut query: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    values: Vec<FilterValue<'q>>,
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    for value in values {
        query = match value {
            FilterValue::Ids(ids) => query.bind(ids),
            FilterValue::Text(text) => query.bind(text),
            FilterValue::Time(at) => query.bind(at),
        };
    }
    query
}

/// The dead-letter operations (see `dead.rs`): one statement each.
impl PostgresStorage {
    pub(super) async fn dead_rows(
        &self,
        filter: &DeadFilter,
        after_id: MessageId,
        limit: u32,
    ) -> StorageResult<Vec<DeadLetter>> {
        let err = || self.error("list dead letters");
        let (conditions, values) = dead::conditions(filter, &self.sql.names, &FILTER, 3);
        let statement = self.sql.dead_list(&conditions);
        let query = sqlx::query(&statement)
            .bind(after_id)
            .bind(i64::from(limit));
        let rows = bind_filter(query, values)
            .fetch_all(&self.pool)
            .await
            .map_err(err())?;
        rows.iter()
            .map(|row| {
                Ok(DeadLetter {
                    message: decode_message(row)?,
                    last_error: row.try_get("last_error")?,
                    died_at: row.try_get("died_at")?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(err())
    }

    pub(super) async fn dead_counts(&self, filter: &DeadFilter) -> StorageResult<DeadCounts> {
        let err = || self.error("count dead letters");
        let (conditions, values) = dead::conditions(filter, &self.sql.names, &FILTER, 2);
        let statement = self.sql.dead_count(&conditions);
        let query = sqlx::query(&statement).bind(dead::MAX_COUNT_GROUPS);
        let rows = bind_filter(query, values)
            .fetch_all(&self.pool)
            .await
            .map_err(err())?;
        let rows = rows
            .iter()
            .map(DeadCountRow::from_row)
            .collect::<Result<_, _>>()
            .map_err(err())?;
        Ok(DeadCounts::from_rows(rows))
    }

    pub(super) async fn redrive_rows(
        &self,
        filter: &DeadFilter,
        limit: u32,
        delay: Duration,
    ) -> StorageResult<SortedIds> {
        let (conditions, values) = dead::conditions(filter, &self.sql.names, &FILTER, 3);
        let statement = self.sql.dead_redrive(&conditions);
        let query = sqlx::query_scalar(&statement)
            .bind(i64::from(limit))
            .bind(interval(delay));
        let ids = bind_filter_scalar(query, values)
            .fetch_all(&self.pool)
            .await
            .map_err(self.error("re-drive dead letters"))?;
        if !ids.is_empty() {
            // Pending again, below where claims reached: claimable after the delay.
            self.floor.rescan_at(Instant::now() + delay);
        }
        Ok(SortedIds::from(ids))
    }

    pub(super) async fn discard_rows(
        &self,
        filter: &DeadFilter,
        limit: u32,
    ) -> StorageResult<SortedIds> {
        let (conditions, values) = dead::conditions(filter, &self.sql.names, &FILTER, 2);
        let statement = self.sql.dead_discard(&conditions);
        let query = sqlx::query_scalar(&statement).bind(i64::from(limit));
        let ids = bind_filter_scalar(query, values)
            .fetch_all(&self.pool)
            .await
            .map_err(self.error("discard dead letters"))?;
        Ok(SortedIds::from(ids))
    }
}

/// [`bind_filter`] for a statement returning ids.
fn bind_filter_scalar<'q>(
    mut query: sqlx::query::QueryScalar<'q, sqlx::Postgres, MessageId, sqlx::postgres::PgArguments>,
    values: Vec<FilterValue<'q>>,
) -> sqlx::query::QueryScalar<'q, sqlx::Postgres, MessageId, sqlx::postgres::PgArguments> {
    for value in values {
        query = match value {
            FilterValue::Ids(ids) => query.bind(ids),
            FilterValue::Text(text) => query.bind(text),
            FilterValue::Time(at) => query.bind(at),
        };
    }
    query
}
