//! The transactions behind each [`Storage`](crate::storage::Storage) operation, one
//! attempt each; `mod.rs` retries them once after a lock conflict and translates errors.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::mysql::MySqlConnection;
use sqlx::Row;

use super::convert::{self, after, decode_candidate};
use super::sql::{self, ClaimShape};
use super::MySqlStorage;
use crate::storage::columns::TopicSource;
use crate::storage::rows::attempts;
use crate::storage::{
    ClaimRequest, Claimed, Extended, FailureDecision, MessageId, NackResult, RetryPolicy,
};

impl MySqlStorage {
    /// The database clock, read inside `conn`'s transaction after its locks were taken.
    async fn now(&self, conn: &mut MySqlConnection) -> Result<DateTime<Utc>, sqlx::Error> {
        sqlx::query_scalar(&self.sql.now).fetch_one(conn).await
    }

    /// Which of `ids` `owner` holds (with `live`, with a lease that has not run out),
    /// locked until `conn`'s transaction ends.
    async fn held(
        &self,
        conn: &mut MySqlConnection,
        ids: &[MessageId],
        owner: &str,
        live: bool,
    ) -> Result<Vec<MessageId>, sqlx::Error> {
        let statement = self.sql.held(ids.len(), live);
        let mut query = sqlx::query_scalar(&statement);
        for id in ids {
            query = query.bind(id);
        }
        query.bind(owner).fetch_all(conn).await
    }

    pub(super) async fn claim_once(
        &self,
        request: &ClaimRequest<'_>,
    ) -> Result<Claimed, sqlx::Error> {
        let strict = self.options.strict_ordering;
        let delay = !self.options.visibility_delay.is_zero();
        let mut tx = self.pool.begin().await?;
        let now = self.now(&mut tx).await?;
        let visible_before = now
            - chrono::Duration::from_std(self.options.visibility_delay)
                .unwrap_or(chrono::Duration::MAX);

        // Every row of a fixed topic has it: a filter takes all of them or none.
        let topics = match &self.options.columns.topic {
            TopicSource::Fixed(fixed) if !request.topics.is_empty() => {
                if !request.topics.contains(fixed) {
                    tx.commit().await?;
                    return Ok(Claimed {
                        exhausted: Vec::new(),
                        messages: Vec::new(),
                        lease_expires_at: after(now, request.lease),
                    });
                }
                &[]
            }
            _ => request.topics,
        };
        let statement = self.sql.claim_candidates(&ClaimShape {
            strict_ordering: strict,
            visibility_delay: delay,
            topics: topics.len(),
        });
        let mut query = sqlx::query(&statement).bind(now);
        if delay {
            query = query.bind(visible_before);
        }
        for topic in topics {
            query = query.bind(topic);
        }
        if strict {
            query = query.bind(now);
            if delay {
                query = query.bind(visible_before);
            }
            for topic in topics {
                query = query.bind(topic);
            }
        }
        let rows = query
            .bind(i64::from(request.batch_size))
            .fetch_all(&mut *tx)
            .await?;
        let mut messages = rows
            .iter()
            .map(decode_candidate)
            .collect::<Result<Vec<_>, _>>()?;

        // Claimed `max_attempts` times already, never answered: dead, not handed out.
        let (exhausted, fresh): (Vec<_>, Vec<_>) = messages
            .into_iter()
            .partition(|m| m.attempts > request.max_attempts);
        messages = fresh;
        let exhausted: Vec<MessageId> = exhausted.iter().map(|m| m.id).collect();
        if !exhausted.is_empty() {
            let statement = self.sql.exhaust(exhausted.len());
            let mut query = sqlx::query(&statement)
                .bind(now)
                .bind(i64::from(request.max_attempts));
            for id in &exhausted {
                query = query.bind(id);
            }
            query.execute(&mut *tx).await?;
        }

        if strict && messages.iter().any(|m| m.key.is_some()) {
            let statement = self.sql.claim_successors(messages.len());
            let mut query = sqlx::query_scalar(&statement);
            for _ in 0..2 {
                for message in &messages {
                    query = query.bind(message.id);
                }
            }
            let held_back: Vec<MessageId> = query.fetch_all(&mut *tx).await?;
            if !held_back.is_empty() {
                tracing::debug!(
                    held_back = held_back.len(),
                    "candidates behind an earlier row of their key"
                );
                messages.retain(|m| !held_back.contains(&m.id));
            }
        }

        let lease_expires_at = after(now, request.lease);
        if !messages.is_empty() {
            let statement = self.sql.claim_update(messages.len());
            let mut query = sqlx::query(&statement)
                .bind(request.owner)
                .bind(lease_expires_at);
            for message in &messages {
                query = query.bind(message.id);
            }
            query.execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(Claimed {
            exhausted,
            messages,
            lease_expires_at,
        })
    }

    pub(super) async fn ack_once(
        &self,
        ids: &[MessageId],
        owner: &str,
    ) -> Result<Vec<MessageId>, sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        let held = self.held(&mut tx, ids, owner, false).await?;
        if !held.is_empty() {
            let statement = if self.options.delete_on_ack {
                self.sql.ack_delete(held.len())
            } else {
                self.sql.ack(held.len())
            };
            let mut query = sqlx::query(&statement);
            for id in &held {
                query = query.bind(id);
            }
            query.execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(held)
    }

    pub(super) async fn nack_once(
        &self,
        id: MessageId,
        owner: &str,
        error: &str,
        requested_delay: Option<Duration>,
        policy: &dyn RetryPolicy,
    ) -> Result<NackResult, sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        let held = sqlx::query(&self.sql.nack_select)
            .bind(id)
            .bind(owner)
            .fetch_optional(&mut *tx)
            .await?;
        let Some(held) = held else {
            return Ok(NackResult::Fenced);
        };
        let stored_attempts: i64 = held.try_get("attempts")?;
        let key = convert::text(&held, "key")?;
        let now = self.now(&mut tx).await?;

        let decision = policy.on_failure(attempts(stored_attempts), requested_delay);
        // When the later rows of the key become claimable: the retry time, or now.
        let successors_at = match decision {
            FailureDecision::RetryAfter(delay) => {
                let retry_at = after(now, delay);
                sqlx::query(&self.sql.nack_retry)
                    .bind(retry_at)
                    .bind(error)
                    .bind(id)
                    .execute(&mut *tx)
                    .await?;
                retry_at
            }
            FailureDecision::DeadLetter => {
                sqlx::query(&self.sql.nack_dead)
                    .bind(now)
                    .bind(error)
                    .bind(id)
                    .execute(&mut *tx)
                    .await?;
                now
            }
        };
        let released: Vec<MessageId> = match key {
            Some(key) => {
                sqlx::query_scalar(&self.sql.successors_select)
                    .bind(key)
                    .bind(id)
                    .bind(owner)
                    .fetch_all(&mut *tx)
                    .await?
            }
            None => Vec::new(),
        };
        if !released.is_empty() {
            let statement = self.sql.release_at(released.len());
            let mut query = sqlx::query(&statement).bind(successors_at);
            for id in &released {
                query = query.bind(id);
            }
            query.execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(NackResult::applied(decision, successors_at, released))
    }

    pub(super) async fn release_once(
        &self,
        ids: &[MessageId],
        owner: &str,
        delay: Duration,
    ) -> Result<Vec<MessageId>, sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        let held = self.held(&mut tx, ids, owner, !delay.is_zero()).await?;
        if !held.is_empty() {
            let statement = self.sql.release_after(held.len());
            let mut query = sqlx::query(&statement).bind(sql::micros(delay));
            for id in &held {
                query = query.bind(id);
            }
            query.execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(held)
    }

    pub(super) async fn extend_lease_once(
        &self,
        ids: &[MessageId],
        owner: &str,
        lease: Duration,
    ) -> Result<Extended, sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        let held = if ids.is_empty() {
            Vec::new()
        } else {
            self.held(&mut tx, ids, owner, true).await?
        };
        let lease_expires_at = after(self.now(&mut tx).await?, lease);
        if !held.is_empty() {
            let statement = self.sql.extend_lease(held.len());
            let mut query = sqlx::query(&statement).bind(lease_expires_at);
            for id in &held {
                query = query.bind(id);
            }
            query.execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(Extended {
            ids: held,
            lease_expires_at,
        })
    }

    pub(super) async fn return_leases_once(
        &self,
        ids: &[MessageId],
        owner: &str,
    ) -> Result<u64, sqlx::Error> {
        let statement = self.sql.return_leases(ids.len());
        let mut query = sqlx::query(&statement);
        for id in ids {
            query = query.bind(id);
        }
        let done = query.bind(owner).execute(&self.pool).await?;
        Ok(done.rows_affected())
    }
}
