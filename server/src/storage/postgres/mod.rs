//! The PostgreSQL backend: one outbox table, claimed with `FOR UPDATE SKIP LOCKED`.
//!
//! Start with [`PostgresStorage::connect`]. The statements live in [`sql`], the insert
//! wake-ups (LISTEN/NOTIFY) in [`listen`]. Every write-back is fenced by
//! `leased_by = owner AND status = 'pending'` and returns the ids it applied to.
//!
//! With `strict_ordering` each claim first takes a transaction-scoped advisory lock on
//! the table, so claims on one table run one at a time across every server sharing the
//! database, and each sees what the previous one committed. That is what makes the
//! "no earlier row of this key is leased" predicate sound; publishing, the slow part,
//! still runs in parallel.

mod convert;
mod heads;
mod listen;
mod sql;

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::types::Json;
use sqlx::{Executor, Row};
use tokio::sync::watch;

use self::convert::{
    accepts, attempts, classify, decode_claim, decode_topic_stats, interval, live_column, sorted,
};
use self::listen::InsertSignal;
use self::sql::{Shape, Statements};
use super::columns::{check_live_columns, insert_row, Columns, InsertPayload};
use super::ident::Ident;
use super::{
    ClaimRequest, Claimed, Extended, FailureDecision, MessageId, NackResult, NewMessage,
    RetryPolicy, Stats, Storage, StorageError, StorageResult,
};

/// How long an operation waits for a pooled connection before the database counts as
/// unreachable. Short, so an outage surfaces as [`StorageError::Unavailable`] quickly.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(3);
/// Rows deleted per statement by `purge`, so it never holds a long transaction.
const PURGE_BATCH: i64 = 10_000;

/// Per-outbox settings of the PostgreSQL backend.
#[derive(Debug, Clone)]
pub struct PostgresOptions {
    /// Schema of the table; `None` uses the connection's `search_path`.
    pub schema: Option<String>,
    pub table: String,
    /// Hold a row back while an earlier pending row with the same key is leased or
    /// waiting for its retry. Serialises claims on the table (see the module docs).
    pub strict_ordering: bool,
    /// Delete delivered rows instead of marking them `done`.
    pub delete_on_ack: bool,
    /// Claim only rows at least this old: ids are assigned at insert, not at commit, so a
    /// slow producer transaction can commit a lower id after a higher one was delivered.
    /// Zero disables it.
    pub visibility_delay: Duration,
    /// Channel the insert trigger notifies; enables [`Storage::insert_signal`].
    pub notify_channel: Option<String>,
    /// Column names of the table (see [`Columns`]).
    pub columns: Columns,
}

impl Default for PostgresOptions {
    fn default() -> Self {
        Self {
            schema: None,
            table: "outbox".to_owned(),
            strict_ordering: true,
            delete_on_ack: false,
            visibility_delay: Duration::ZERO,
            notify_channel: None,
            columns: Columns::default(),
        }
    }
}

/// An outbox table in PostgreSQL. Dropping it stops its insert listener.
pub struct PostgresStorage {
    pool: PgPool,
    options: PostgresOptions,
    sql: Statements,
    /// Present with `notify_channel`.
    signal: Option<InsertSignal>,
}

impl fmt::Debug for PostgresStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStorage")
            .field("table", &self.sql.display_table)
            .field("options", &self.options)
            .field("listening", &self.signal.is_some())
            .finish_non_exhaustive()
    }
}

impl PostgresStorage {
    /// A storage with a pool of its own (see [`lazy_pool`]). Identifiers are checked here;
    /// the database is not contacted until first use (see [`Storage::ping`]), so a server
    /// can start while its database is still coming up.
    pub async fn connect(
        url: &str,
        max_connections: u32,
        options: PostgresOptions,
    ) -> anyhow::Result<Self> {
        let pool = lazy_pool(url, max_connections)?;
        let listener_options = (*pool.connect_options()).clone();
        Self::build(pool, listener_options, options)
    }

    /// A storage on an existing pool, for example one [`lazy_pool`] shared by the outboxes
    /// of a database. `url` is for the insert listener's own connection; without it the
    /// pool's connect options are used. Needs a Tokio runtime when `notify_channel` is set.
    pub fn from_pool(
        pool: PgPool,
        url: Option<String>,
        options: PostgresOptions,
    ) -> anyhow::Result<Self> {
        let listener_options = match url {
            Some(url) => connect_options(&url)?,
            None => (*pool.connect_options()).clone(),
        };
        Self::build(pool, listener_options, options)
    }

    fn build(
        pool: PgPool,
        listener_options: PgConnectOptions,
        options: PostgresOptions,
    ) -> anyhow::Result<Self> {
        let name = |option: &str, value: &str| {
            Ident::new(value).map_err(|err| anyhow!("invalid postgres `{option}`: {err}"))
        };
        let table = name("table", &options.table)?;
        let schema = options
            .schema
            .as_deref()
            .map(|s| name("schema", s))
            .transpose()?;
        let channel = options
            .notify_channel
            .as_deref()
            .map(|c| name("notify_channel", c))
            .transpose()?;
        let sql = Statements::render(&Shape {
            schema: schema.as_ref(),
            table: &table,
            columns: &options.columns,
            strict_ordering: options.strict_ordering,
            visibility_delay: options.visibility_delay,
            notify_channel: channel.as_ref(),
        });
        let signal = channel
            .map(|channel| {
                InsertSignal::spawn(
                    listener_options,
                    channel.to_string(),
                    options.visibility_delay,
                )
            })
            .transpose()?;
        Ok(Self {
            pool,
            options,
            sql,
            signal,
        })
    }

    pub fn options(&self) -> &PostgresOptions {
        &self.options
    }

    /// With strict ordering: `finished` rows stopped being pending in `conn`'s
    /// transaction; moves their keys' heads on (see `heads.rs`).
    async fn move_heads_on(
        &self,
        conn: &mut sqlx::PgConnection,
        finished: &[MessageId],
    ) -> Result<(), sqlx::Error> {
        match &self.sql.heads {
            Some(heads) => {
                heads::move_on(conn, &heads.lock_finished, &heads.advance, finished).await
            }
            None => Ok(()),
        }
    }

    /// Translates a driver error for `action`; see [`classify`].
    fn error(&self, action: &'static str) -> impl FnOnce(sqlx::Error) -> StorageError + '_ {
        move |err| classify(err, &self.sql.display_table, action)
    }
}

/// A pool that connects on first use, as every pool of this backend should be: `jit = off`
/// (JIT-compiling the claim under a large backlog costs more than the claim itself),
/// `synchronous_commit = off` (see `connect_options`), and a short acquire timeout, so a dead database surfaces as [`StorageError::Unavailable`]
/// within seconds instead of hanging callers.
pub fn lazy_pool(url: &str, max_connections: u32) -> anyhow::Result<PgPool> {
    if max_connections == 0 {
        bail!("postgres max_connections must be at least 1");
    }
    Ok(PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .connect_lazy_with(connect_options(url)?))
}

fn connect_options(url: &str) -> anyhow::Result<PgConnectOptions> {
    // The url is not echoed: it may carry a password.
    let options = PgConnectOptions::from_str(url).context("invalid postgres url")?;
    let options = match options.get_application_name() {
        Some(_) => options,
        None => options.application_name("txoutboxd"),
    };
    // `synchronous_commit = off` on the relay's own sessions (producers are untouched): a
    // claim or answer lost in a database crash only means a redelivery, which
    // at-least-once allows, while waiting for a disk flush per claim and per ack was the
    // largest cost of a drain (BENCHMARKS.md).
    Ok(options.options([("jit", "off"), ("synchronous_commit", "off")]))
}

#[async_trait]
impl Storage for PostgresStorage {
    fn backend(&self) -> &'static str {
        "postgres"
    }

    #[tracing::instrument(
        name = "storage.claim",
        skip_all,
        fields(table = %self.sql.display_table, owner = request.owner, batch_size = request.batch_size),
    )]
    async fn claim(&self, request: ClaimRequest<'_>) -> StorageResult<Claimed> {
        let statement = match request.topics {
            [] => &self.sql.claim_all,
            _ => &self.sql.claim_topics,
        };
        let mut query = sqlx::query(statement)
            .bind(request.owner)
            .bind(interval(request.lease))
            .bind(i64::from(request.batch_size));
        if !request.topics.is_empty() {
            query = query.bind(request.topics);
        }
        if !self.options.visibility_delay.is_zero() {
            query = query.bind(interval(self.options.visibility_delay));
        }
        let rows = if self.options.strict_ordering {
            let mut tx = self.pool.begin().await.map_err(self.error("claim"))?;
            sqlx::query(&self.sql.claim_lock)
                .bind(&self.sql.lock_key)
                .execute(&mut *tx)
                .await
                .map_err(self.error("claim"))?;
            let rows = query
                .fetch_all(&mut *tx)
                .await
                .map_err(self.error("claim"))?;
            tx.commit().await.map_err(self.error("claim"))?;
            rows
        } else {
            query
                .fetch_all(&self.pool)
                .await
                .map_err(self.error("claim"))?
        };
        let claimed = decode_claim(rows).map_err(self.error("claim"))?;
        tracing::debug!(claimed = claimed.messages.len(), "claimed");
        Ok(claimed)
    }

    async fn ack(&self, ids: &[MessageId], owner: &str) -> StorageResult<Vec<MessageId>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let statement = if self.options.delete_on_ack {
            &self.sql.ack_delete
        } else {
            &self.sql.ack
        };
        let err = || self.error("ack");
        let mut tx = self.pool.begin().await.map_err(err())?;
        let applied: Vec<MessageId> = sqlx::query_scalar(statement)
            .bind(ids)
            .bind(owner)
            .fetch_all(&mut *tx)
            .await
            .map_err(err())?;
        self.move_heads_on(&mut tx, &applied).await.map_err(err())?;
        tx.commit().await.map_err(err())?;
        Ok(sorted(applied))
    }

    #[tracing::instrument(
        name = "storage.nack",
        skip_all,
        fields(table = %self.sql.display_table, id, owner),
    )]
    async fn nack(
        &self,
        id: MessageId,
        owner: &str,
        error: &str,
        requested_delay: Option<Duration>,
        policy: &dyn RetryPolicy,
    ) -> StorageResult<NackResult> {
        let err = || self.error("nack");
        let mut tx = self.pool.begin().await.map_err(err())?;
        let held = sqlx::query(&self.sql.nack_select)
            .bind(id)
            .bind(owner)
            .fetch_optional(&mut *tx)
            .await
            .map_err(err())?;
        let Some(held) = held else {
            return Ok(NackResult::Fenced);
        };
        let stored_attempts: i32 = held.try_get("attempts").map_err(err())?;
        let key: Option<String> = held.try_get("key").map_err(err())?;

        let decision = policy.on_failure(attempts(stored_attempts), requested_delay);
        // When the later rows of the key become claimable: the retry time, or now.
        let successors_at: DateTime<Utc> = match decision {
            FailureDecision::RetryAfter(delay) => sqlx::query_scalar(&self.sql.nack_retry)
                .bind(id)
                .bind(interval(delay))
                .bind(error)
                .fetch_one(&mut *tx)
                .await
                .map_err(err())?,
            FailureDecision::DeadLetter => sqlx::query_scalar(&self.sql.nack_dead)
                .bind(id)
                .bind(error)
                .fetch_one(&mut *tx)
                .await
                .map_err(err())?,
        };
        if decision == FailureDecision::DeadLetter {
            self.move_heads_on(&mut tx, &[id]).await.map_err(err())?;
        }
        let released = match key {
            Some(key) => sqlx::query_scalar(&self.sql.release_successors)
                .bind(key)
                .bind(id)
                .bind(owner)
                .bind(successors_at)
                .fetch_all(&mut *tx)
                .await
                .map_err(err())?,
            None => Vec::new(),
        };
        tx.commit().await.map_err(err())?;
        let released = sorted(released);
        Ok(match decision {
            FailureDecision::RetryAfter(_) => NackResult::Retried {
                retry_at: successors_at,
                released,
            },
            FailureDecision::DeadLetter => NackResult::DeadLettered { released },
        })
    }

    async fn release(
        &self,
        ids: &[MessageId],
        owner: &str,
        delay: Duration,
    ) -> StorageResult<Vec<MessageId>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let applied = sqlx::query_scalar(&self.sql.release)
            .bind(ids)
            .bind(owner)
            .bind(interval(delay))
            .fetch_all(&self.pool)
            .await
            .map_err(self.error("release"))?;
        Ok(sorted(applied))
    }

    async fn dead_letter(&self, id: MessageId, owner: &str, error: &str) -> StorageResult<bool> {
        let err = || self.error("dead-letter");
        let mut tx = self.pool.begin().await.map_err(err())?;
        let applied: Option<MessageId> = sqlx::query_scalar(&self.sql.dead_letter)
            .bind(id)
            .bind(owner)
            .bind(error)
            .fetch_optional(&mut *tx)
            .await
            .map_err(err())?;
        let finished: Vec<MessageId> = applied.into_iter().collect();
        self.move_heads_on(&mut tx, &finished)
            .await
            .map_err(err())?;
        tx.commit().await.map_err(err())?;
        Ok(!finished.is_empty())
    }

    async fn extend_lease(
        &self,
        ids: &[MessageId],
        owner: &str,
        lease: Duration,
    ) -> StorageResult<Extended> {
        let rows: Vec<(Option<MessageId>, DateTime<Utc>)> = sqlx::query_as(&self.sql.extend_lease)
            .bind(ids)
            .bind(owner)
            .bind(interval(lease))
            .fetch_all(&self.pool)
            .await
            .map_err(self.error("extend lease"))?;
        let lease_expires_at = rows.first().map(|(_, at)| *at).ok_or_else(|| {
            classify(
                sqlx::Error::RowNotFound,
                &self.sql.display_table,
                "extend lease",
            )
        })?;
        let ids = sorted(rows.into_iter().filter_map(|(id, _)| id).collect());
        Ok(Extended {
            ids,
            lease_expires_at,
        })
    }

    async fn return_leases(&self, ids: &[MessageId], owner: &str) -> StorageResult<u64> {
        if ids.is_empty() {
            return Ok(0);
        }
        let done = sqlx::query(&self.sql.return_leases)
            .bind(ids)
            .bind(owner)
            .execute(&self.pool)
            .await
            .map_err(self.error("return leases"))?;
        Ok(done.rows_affected())
    }

    async fn stats(&self) -> StorageResult<Stats> {
        let rows = sqlx::query(&self.sql.stats)
            .fetch_all(&self.pool)
            .await
            .map_err(self.error("stats"))?;
        let topics = rows
            .iter()
            .map(decode_topic_stats)
            .collect::<Result<Vec<_>, _>>()
            .map_err(self.error("stats"))?;
        Ok(Stats::from_topics(topics))
    }

    #[tracing::instrument(name = "storage.purge", skip_all, fields(table = %self.sql.display_table))]
    async fn purge(&self, older_than: Duration) -> StorageResult<u64> {
        let mut purged = 0;
        // With delete_on_ack there are no delivered rows to purge, only drained heads.
        let mut more = !self.options.delete_on_ack;
        while more {
            let done = sqlx::query(&self.sql.purge_batch)
                .bind(interval(older_than))
                .bind(PURGE_BATCH)
                .execute(&self.pool)
                .await
                .map_err(self.error("purge"))?;
            purged += done.rows_affected();
            more = done.rows_affected() == PURGE_BATCH as u64;
        }
        if let Some(heads) = &self.sql.heads {
            // Drained keys' heads rows; a producer about to fill one keeps it (row lock).
            loop {
                let done = sqlx::query(&heads.purge_drained)
                    .bind(PURGE_BATCH)
                    .execute(&self.pool)
                    .await
                    .map_err(self.error("purge"))?;
                if done.rows_affected() < PURGE_BATCH as u64 {
                    break;
                }
            }
        }
        tracing::debug!(purged, "purged delivered rows");
        Ok(purged)
    }

    fn schema_sql(&self) -> String {
        self.sql.schema.clone()
    }

    #[tracing::instrument(name = "storage.create_schema", skip_all, fields(table = %self.sql.display_table))]
    async fn create_schema(&self) -> StorageResult<()> {
        let err = || self.error("create schema");
        // Servers starting together would race on CREATE ... IF NOT EXISTS (tables in one
        // schema share its CREATE SCHEMA, so the lock is global, not per table).
        let mut tx = self.pool.begin().await.map_err(err())?;
        sqlx::query(&self.sql.ddl_lock)
            .execute(&mut *tx)
            .await
            .map_err(err())?;
        // No bind parameters: sent as a simple query, which may hold several statements.
        tx.execute(self.sql.schema.as_str()).await.map_err(err())?;
        tx.commit().await.map_err(err())
    }

    async fn ping(&self) -> StorageResult<()> {
        sqlx::query(&self.sql.ping)
            .execute(&self.pool)
            .await
            .map_err(self.error("ping"))?;
        let live = sqlx::query(&self.sql.live_columns)
            .bind(&self.sql.qualified_table)
            .fetch_all(&self.pool)
            .await
            .map_err(self.error("ping"))?
            .iter()
            .map(live_column)
            .collect::<Result<Vec<_>, _>>()
            .map_err(self.error("ping"))?;
        let problems = check_live_columns(&self.options.columns, &live, false, accepts);
        StorageError::unless_problems(&self.sql.display_table, problems)
    }

    async fn insert(&self, message: NewMessage) -> StorageResult<MessageId> {
        let columns = &self.options.columns;
        let row = insert_row(columns, message)?;
        let mut query = sqlx::query_scalar(&self.sql.insert);
        if let Some(topic) = row.topic {
            query = query.bind(topic);
        }
        query = query.bind(row.key);
        query = match row.payload {
            InsertPayload::Bytes(bytes) => query.bind(bytes),
            InsertPayload::Text(text) => query.bind(text),
        };
        if let Some(headers) = row.headers {
            query = query.bind(Json(headers));
        }
        query
            .fetch_one(&self.pool)
            .await
            .map_err(self.error("insert"))
    }

    fn insert_signal(&self) -> Option<watch::Receiver<u64>> {
        self.signal.as_ref().map(InsertSignal::subscribe)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn identifiers_are_checked_and_named() {
        let url = "postgres://postgres@127.0.0.1:1/none";
        for (options, named) in [
            (
                PostgresOptions {
                    table: "out-box".into(),
                    ..Default::default()
                },
                "`table`",
            ),
            (
                PostgresOptions {
                    schema: Some("1st".into()),
                    ..Default::default()
                },
                "`schema`",
            ),
            (
                PostgresOptions {
                    notify_channel: Some("a b".into()),
                    ..Default::default()
                },
                "`notify_channel`",
            ),
        ] {
            let err = PostgresStorage::connect(url, 1, options)
                .await
                .unwrap_err()
                .to_string();
            assert!(err.contains(named), "{err}");
            assert!(
                err.contains("ASCII letters, digits and underscores"),
                "{err}"
            );
        }
    }
}
