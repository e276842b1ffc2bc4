//! The transactions behind each [`Storage`](crate::storage::Storage) operation, one
//! attempt each; `mod.rs` retries them once after a lock conflict and translates errors.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::mysql::{MySqlArguments, MySqlConnection};
use sqlx::{Arguments, Row};

use super::convert::{self, after, decode_candidate, decode_scanned};
use super::sql::{self, ClaimShape};
use super::MySqlStorage;
use crate::storage::dead::{self, FilterValue};
use crate::storage::rows::attempts;
use crate::storage::{
    ClaimRequest, Claimed, DeadCounts, DeadFilter, DeadLetter, Extended, FailureDecision,
    MessageId, NackResult, OutboxMessage, RetryPolicy, SortedIds, TopicFilter,
};

/// Most scan-lock-check rounds of one claim (see `claim_once`): enough to pass the rows
/// of a stuck claim and the keys it holds, few enough that a claim stays a handful of
/// statements.
const CLAIM_ROUNDS: usize = 4;
/// A round scans this many candidates per row it still wants, and locks the first free
/// ones: concurrent claims see each other's rows as candidates until they commit.
const SCAN_FACTOR: usize = 2;

impl MySqlStorage {
    /// The database clock, read inside `conn`'s transaction after its locks were taken.
    pub(super) async fn now(
        &self,
        conn: &mut MySqlConnection,
    ) -> Result<DateTime<Utc>, sqlx::Error> {
        sqlx::query_scalar(&self.sql.now).fetch_one(conn).await
    }

    /// Which of `ids` `owner` holds (with `live`, with a lease that has not run out),
    /// locked until `conn`'s transaction ends.
    async fn held(
        &self,
        conn: &mut MySqlConnection,
        ids: &SortedIds,
        owner: &str,
        live: bool,
    ) -> Result<SortedIds, sqlx::Error> {
        let statement = self.sql.held(ids.len(), live);
        let mut query = sqlx::query_scalar(&statement);
        for id in ids {
            query = query.bind(id);
        }
        let held: Vec<MessageId> = query.bind(owner).fetch_all(conn).await?;
        Ok(ids.only(held))
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

        let Some(filter) = TopicFilter::of(request, &self.options.columns.topic) else {
            tx.commit().await?;
            return Ok(Claimed {
                exhausted: Vec::new(),
                messages: Vec::new(),
                lease_expires_at: after(now, request.lease),
            });
        };
        let (topics, paused): (&[String], &[String]) = match filter {
            TopicFilter::Any => (&[], &[]),
            TopicFilter::Only(topics) => (topics, &[]),
            TopicFilter::Except(paused) => (&[], paused),
        };
        let shape = |excluded_keys: usize| ClaimShape {
            strict_ordering: strict,
            visibility_delay: delay,
            topics: topics.len(),
            paused_topics: paused.len(),
            excluded_keys,
        };

        // Rounds of scan, lock, check: a round that takes less than it scanned (rows
        // another transaction holds locked, or behind an earlier row of their key outside
        // the batch) goes on past what it scanned, without the keys it found taken, so
        // another claim stuck on a few keys' heads does not fill every batch with rows
        // of those keys (issue 9). Bounded by `CLAIM_ROUNDS`.
        let batch_size = request.batch_size as usize;
        let mut messages: Vec<OutboxMessage> = Vec::new();
        let mut exhausted: Vec<MessageId> = Vec::new();
        let mut taken_keys: Vec<String> = Vec::new();
        let mut scanned_to: MessageId = 0;
        for _ in 0..CLAIM_ROUNDS {
            let wanted = batch_size - messages.len();
            let statement = self.sql.claim_candidates(&shape(taken_keys.len()));
            let mut query = sqlx::query(&statement).bind(now).bind(scanned_to);
            if delay {
                query = query.bind(visible_before);
            }
            for topic in topics.iter().chain(paused) {
                query = query.bind(topic);
            }
            for key in &taken_keys {
                query = query.bind(key);
            }
            if strict {
                query = query.bind(now);
                if delay {
                    query = query.bind(visible_before);
                }
                for topic in topics.iter().chain(paused) {
                    query = query.bind(topic);
                }
            }
            let candidates = query
                .bind((wanted * SCAN_FACTOR) as i64)
                .fetch_all(&mut *tx)
                .await?
                .iter()
                .map(decode_scanned)
                .collect::<Result<Vec<_>, _>>()?;
            let Some(&(last, _)) = candidates.last() else {
                break;
            };
            let locked = self
                .lock_candidates(&mut tx, &candidates, now, wanted)
                .await?;
            // Candidates after the last locked one were not looked at when the lock
            // stopped at `wanted`.
            let examined = match locked.last() {
                Some(m) if locked.len() == wanted => m.id,
                _ => last,
            };
            scanned_to = examined;
            let candidates: Vec<_> = candidates
                .into_iter()
                .filter(|(id, _)| *id <= examined)
                .collect();
            // Claimed `max_attempts` times already, never answered: dead, not handed out.
            let (dead, mut fresh): (Vec<_>, Vec<_>) = locked
                .into_iter()
                .partition(|m| m.attempts > request.max_attempts);
            let dead: Vec<MessageId> = dead.iter().map(|m| m.id).collect();
            self.exhaust(&mut tx, &dead, now, request.max_attempts)
                .await?;
            exhausted.extend(dead);

            if strict {
                let held_back = self.held_back(&mut tx, &fresh, &messages).await?;
                fresh.retain(|m| !held_back.contains(&m.id));
            }
            // What was scanned but not kept: its key is taken for this claim. (Without
            // strict ordering a key holds nothing back: only the scan moves on.)
            for (id, key) in candidates.iter().filter(|_| strict) {
                let kept = fresh.iter().any(|m| m.id == *id) || exhausted.contains(id);
                if let (false, Some(key)) = (kept, key) {
                    if !taken_keys.contains(key) {
                        taken_keys.push(key.clone());
                    }
                }
            }
            messages.extend(fresh);
            if messages.len() >= batch_size
                || last == examined && candidates.len() < wanted * SCAN_FACTOR
            {
                break;
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

    /// Locks those of `candidates` still claimable (see [`super::sql::Statements::claim_lock`]).
    async fn lock_candidates(
        &self,
        conn: &mut MySqlConnection,
        candidates: &[(MessageId, Option<String>)],
        now: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<OutboxMessage>, sqlx::Error> {
        let statement = self.sql.claim_lock(candidates.len());
        let mut query = sqlx::query(&statement);
        for (id, _) in candidates {
            query = query.bind(id);
        }
        query
            .bind(now)
            .bind(limit as i64)
            .fetch_all(conn)
            .await?
            .iter()
            .map(decode_candidate)
            .collect()
    }

    /// Dead-letters locked candidates claimed `max_attempts` times already.
    async fn exhaust(
        &self,
        conn: &mut MySqlConnection,
        ids: &[MessageId],
        now: DateTime<Utc>,
        max_attempts: u32,
    ) -> Result<(), sqlx::Error> {
        if ids.is_empty() {
            return Ok(());
        }
        let statement = self.sql.exhaust(ids.len());
        let mut query = sqlx::query(&statement)
            .bind(now)
            .bind(i64::from(max_attempts));
        for id in ids {
            query = query.bind(id);
        }
        query.execute(conn).await?;
        Ok(())
    }

    /// Which of the locked `fresh` rows have an earlier pending row of their key outside
    /// the batch (`kept` plus `fresh`); see [`super::sql::Statements::claim_successors`].
    async fn held_back(
        &self,
        conn: &mut MySqlConnection,
        fresh: &[OutboxMessage],
        kept: &[OutboxMessage],
    ) -> Result<Vec<MessageId>, sqlx::Error> {
        let keyed: Vec<MessageId> = fresh
            .iter()
            .filter(|m| m.key.is_some())
            .map(|m| m.id)
            .collect();
        if keyed.is_empty() {
            return Ok(Vec::new());
        }
        let statement = self
            .sql
            .claim_successors(keyed.len(), kept.len() + fresh.len());
        let mut query = sqlx::query_scalar(&statement);
        for id in &keyed {
            query = query.bind(id);
        }
        for message in kept.iter().chain(fresh) {
            query = query.bind(message.id);
        }
        let held_back: Vec<MessageId> = query.fetch_all(conn).await?;
        if !held_back.is_empty() {
            tracing::debug!(
                held_back = held_back.len(),
                "candidates behind an earlier row of their key"
            );
        }
        Ok(held_back)
    }

    pub(super) async fn ack_once(
        &self,
        ids: &SortedIds,
        owner: &str,
    ) -> Result<SortedIds, sqlx::Error> {
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
        let successors: Vec<MessageId> = match key {
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
        let released = if successors.is_empty() {
            successors
        } else {
            let successors = SortedIds::from(successors);
            self.held(&mut tx, &successors, owner, false)
                .await?
                .into_vec()
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
        ids: &SortedIds,
        owner: &str,
        delay: Duration,
    ) -> Result<SortedIds, sqlx::Error> {
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
        ids: &SortedIds,
        owner: &str,
        lease: Duration,
    ) -> Result<Extended, sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        let held = if ids.is_empty() {
            SortedIds::default()
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
        ids: &SortedIds,
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

/// The arguments of a dead-letter statement: `leading` (an id), the selector's values in
/// the order [`dead::conditions`] rendered them (one `?` per id), then the `limit`.
fn dead_arguments(
    leading: &[i64],
    values: &[FilterValue<'_>],
    limit: i64,
) -> Result<MySqlArguments, sqlx::Error> {
    let mut arguments = MySqlArguments::default();
    for value in leading {
        arguments.add(*value).map_err(sqlx::Error::Encode)?;
    }
    for value in values {
        match value {
            FilterValue::Ids(ids) => {
                for id in *ids {
                    arguments.add(*id).map_err(sqlx::Error::Encode)?;
                }
            }
            FilterValue::Text(text) => arguments.add(*text).map_err(sqlx::Error::Encode)?,
            FilterValue::Time(at) => arguments.add(*at).map_err(sqlx::Error::Encode)?,
        }
    }
    arguments.add(limit).map_err(sqlx::Error::Encode)?;
    Ok(arguments)
}

/// The dead-letter operations (see `dead.rs`), one attempt each.
impl MySqlStorage {
    pub(super) async fn dead_rows(
        &self,
        filter: &DeadFilter,
        after_id: MessageId,
        limit: u32,
    ) -> Result<Vec<DeadLetter>, sqlx::Error> {
        let (conditions, values) = dead::conditions(filter, &self.sql.names, &sql::FILTER, 1);
        let arguments = dead_arguments(&[after_id], &values, i64::from(limit))?;
        let statement = self.sql.dead_list(&conditions);
        let rows = sqlx::query_with(&statement, arguments)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(convert::decode_dead).collect()
    }

    pub(super) async fn dead_counts(&self, filter: &DeadFilter) -> Result<DeadCounts, sqlx::Error> {
        let (conditions, values) = dead::conditions(filter, &self.sql.names, &sql::FILTER, 1);
        let arguments = dead_arguments(&[], &values, dead::MAX_COUNT_GROUPS)?;
        let statement = self.sql.dead_count(&conditions);
        let rows = sqlx::query_with(&statement, arguments)
            .fetch_all(&self.pool)
            .await?;
        let rows = rows
            .iter()
            .map(convert::decode_dead_count)
            .collect::<Result<_, _>>()?;
        Ok(DeadCounts::from_rows(rows))
    }

    /// Locks the first `limit` selected dead rows in `conn`'s transaction.
    async fn lock_dead(
        &self,
        conn: &mut MySqlConnection,
        filter: &DeadFilter,
        limit: u32,
    ) -> Result<Vec<MessageId>, sqlx::Error> {
        let (conditions, values) = dead::conditions(filter, &self.sql.names, &sql::FILTER, 1);
        let arguments = dead_arguments(&[], &values, i64::from(limit))?;
        let statement = self.sql.dead_lock(&conditions);
        sqlx::query_scalar_with(&statement, arguments)
            .fetch_all(conn)
            .await
    }

    pub(super) async fn redrive_once(
        &self,
        filter: &DeadFilter,
        limit: u32,
        delay: Duration,
    ) -> Result<SortedIds, sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        let ids = self.lock_dead(&mut tx, filter, limit).await?;
        if !ids.is_empty() {
            let statement = self.sql.dead_redrive(ids.len());
            let mut query = sqlx::query(&statement).bind(sql::micros(delay));
            for id in &ids {
                query = query.bind(id);
            }
            query.execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(SortedIds::from(ids))
    }

    pub(super) async fn discard_once(
        &self,
        filter: &DeadFilter,
        limit: u32,
    ) -> Result<SortedIds, sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        let ids = self.lock_dead(&mut tx, filter, limit).await?;
        if !ids.is_empty() {
            let statement = self.sql.dead_discard(ids.len());
            let mut query = sqlx::query(&statement);
            for id in &ids {
                query = query.bind(id);
            }
            query.execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(SortedIds::from(ids))
    }
}
