//! The PostgreSQL backend: one outbox table, claimed with `FOR UPDATE SKIP LOCKED`.
//!
//! Start with [`PostgresStorage::connect`]. The statements live in [`sql`], the strict
//! ordering (key heads and the claim function) in [`heads`], the insert wake-ups
//! (LISTEN/NOTIFY) in [`listen`]. Every write-back is fenced by
//! `leased_by = owner AND status = 'pending'` and returns the ids it applied to; a nack,
//! an extension and a delayed release also need a lease that has not run out.
//!
//! Every operation is one statement (or one function call) in a transaction of its own:
//! no transaction of the relay waits for a round trip to this server, so a paused or
//! partitioned server holds no lock another server or a producer needs (issue 9). What
//! spans several statements (a claim and the read of its messages, an ack and the move of
//! its keys' heads) is correct after any one of them alone.
//!
//! With `strict_ordering` each claim takes a transaction-scoped advisory lock on the
//! table inside the claim function, so claims on one table run one at a time across every
//! server sharing the database, and each sees what the previous one committed. That is
//! what makes the "no earlier row of this key is leased" predicate sound; publishing, the
//! slow part, still runs in parallel.

mod convert;
mod floor;
mod heads;
mod listen;
mod ops;
mod sql;
mod table;

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use anyhow::{anyhow, Context};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::types::Json;
use sqlx::Executor;
use tokio::sync::watch;
use tokio::time::Instant;

use self::convert::{classify, decode_topic_stats, interval};
use self::floor::ClaimFloor;
use self::listen::InsertSignal;
use self::sql::{Shape, Statements};
use self::table::{accepts, live_column};
use super::columns::{check_live_columns, insert_row, InsertPayload};
use super::ident::Ident;
use super::{
    in_batches, BlockedKey, ClaimRequest, Claimed, DeadCounts, DeadFilter, DeadLetter, Extended,
    HeldKeys, Inserts, LeaseHolder, MessageId, NackRequest, NackResult, NewMessage, Pauses,
    RetryPolicy, SortedIds, Stats, Storage, StorageError, StorageResult, TableOptions, PURGE_BATCH,
};
use crate::storage::timed::Timeouts;

/// Longest wait of a relay statement for a lock; then the call fails and is retried.
const LOCK_TIMEOUT: &str = "10s";
/// The relay opens no transaction that waits on it; this ends one if that ever changes.
const IDLE_IN_TRANSACTION_TIMEOUT: &str = "10s";

/// PostgreSQL's `synchronous_commit` for the relay's sessions. The default, `off`, lets a
/// claim or an answer return before its commit record reaches the disk: a database crash
/// may then lose the last few hundred milliseconds of claims and acks, which only means
/// redeliveries (at-least-once allows them), while a flush per claim and per ack was the
/// largest cost of a drain (BENCHMARKS.md). `on` (or a replication level) makes every
/// ack durable before it is answered, for a team whose consumers cannot tolerate the
/// redeliveries of a crash. Configured per database: `databases.NAME.synchronous_commit`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SynchronousCommit {
    #[default]
    Off,
    Local,
    On,
    RemoteWrite,
    RemoteApply,
}

impl SynchronousCommit {
    /// The setting as PostgreSQL spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Local => "local",
            Self::On => "on",
            Self::RemoteWrite => "remote_write",
            Self::RemoteApply => "remote_apply",
        }
    }
}

/// What only a PostgreSQL table has, besides its [`TableOptions`].
#[derive(Debug, Clone, Default)]
pub struct PostgresExtras {
    /// Schema of the table; `None` uses the connection's `search_path`.
    pub schema: Option<String>,
    /// Channel the insert trigger notifies; enables [`Storage::insert_signal`].
    pub notify_channel: Option<String>,
}

/// An outbox table in PostgreSQL. Dropping it stops its insert listener.
pub struct PostgresStorage {
    pool: PgPool,
    options: TableOptions,
    extras: PostgresExtras,
    sql: Statements,
    /// Present with `notify_channel`.
    signal: Option<InsertSignal>,
    /// Where this server's non-strict claims start (see `floor.rs`).
    floor: ClaimFloor,
}

impl fmt::Debug for PostgresStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStorage")
            .field("table", &self.sql.display_table)
            .field("options", &self.options)
            .field("extras", &self.extras)
            .field("listening", &self.signal.is_some())
            .finish_non_exhaustive()
    }
}

impl PostgresStorage {
    /// A storage with a pool of its own (see [`lazy_pool`]). Identifiers are checked here;
    /// the database is not contacted until first use (see [`Storage::verify_table`]), so a server
    /// can start while its database is still coming up.
    pub async fn connect(
        url: &str,
        max_connections: u32,
        options: TableOptions,
        extras: PostgresExtras,
    ) -> anyhow::Result<Self> {
        let pool = lazy_pool(url, max_connections, SynchronousCommit::default())?;
        let listener_options = (*pool.connect_options()).clone();
        Self::build(pool, listener_options, options, extras)
    }

    /// A storage on an existing pool, for example one [`lazy_pool`] shared by the outboxes
    /// of a database. `url` is for the insert listener's own connection; without it the
    /// pool's connect options are used. Needs a Tokio runtime when `notify_channel` is set.
    pub fn from_pool(
        pool: PgPool,
        url: Option<&str>,
        options: TableOptions,
        extras: PostgresExtras,
    ) -> anyhow::Result<Self> {
        let listener_options = match url {
            Some(url) => connect_options(
                url,
                SynchronousCommit::default(),
                Timeouts::default().statement,
            )?,
            None => (*pool.connect_options()).clone(),
        };
        Self::build(pool, listener_options, options, extras)
    }

    fn build(
        pool: PgPool,
        listener_options: PgConnectOptions,
        options: TableOptions,
        extras: PostgresExtras,
    ) -> anyhow::Result<Self> {
        let name = |option: &str, value: &str| {
            Ident::new(value).map_err(|err| anyhow!("invalid postgres `{option}`: {err}"))
        };
        let table = name("table", &options.table)?;
        let schema = extras
            .schema
            .as_deref()
            .map(|s| name("schema", s))
            .transpose()?;
        let channel = extras
            .notify_channel
            .as_deref()
            .map(|c| name("notify_channel", c))
            .transpose()?;
        let sql = Statements::render(&Shape {
            schema: schema.as_ref(),
            table: &table,
            columns: &options.columns,
            strict_ordering: options.strict_ordering,
            dead_holds_key: options.dead_holds_key(),
            visibility_delay: options.visibility_delay,
            notify_channel: channel.as_ref(),
            max_row_bytes: options.max_row_bytes,
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
            extras,
            sql,
            signal,
            floor: ClaimFloor::new(Instant::now()),
        })
    }

    /// Translates a driver error for `action`; see [`classify`].
    pub(super) fn error(
        &self,
        action: &'static str,
    ) -> impl FnOnce(sqlx::Error) -> StorageError + '_ {
        move |err| classify(err, &self.sql.display_table, action)
    }

    /// Whether this version's DDL already ran on the live table (see
    /// [`table::SchemaCheck`]); catalog reads only, so it waits for no lock.
    async fn schema_is_current(&self) -> StorageResult<bool> {
        let check = &self.sql.schema_check;
        sqlx::query_scalar(table::SCHEMA_CURRENT)
            .bind(&check.relations)
            .bind(&self.sql.qualified_table)
            .bind(&check.triggers)
            .bind(&check.marker_on)
            .bind(&check.marker)
            .fetch_one(&self.pool)
            .await
            .map_err(self.error("create schema"))
    }
}

/// A pool that connects on first use, as every pool of this backend should be: `jit = off`
/// (JIT-compiling the claim under a large backlog costs more than the claim itself),
/// `enable_seqscan = off` (see `connect_options`), the configured `synchronous_commit`
/// (see [`SynchronousCommit`]), and the default [`Timeouts`] (see [`lazy_pool_with`]).
/// `max_connections` is at least 1 (configuration checks it).
pub fn lazy_pool(
    url: &str,
    max_connections: u32,
    synchronous_commit: SynchronousCommit,
) -> anyhow::Result<PgPool> {
    lazy_pool_with(
        url,
        max_connections,
        synchronous_commit,
        Timeouts::default(),
    )
}

/// [`lazy_pool`] with these timeouts: a short acquire timeout, so a dead database surfaces
/// as [`StorageError::Unavailable`] within seconds instead of hanging callers, and the
/// statement limit as the sessions' `statement_timeout` (the DDL of `create_schema` is
/// exempt).
pub fn lazy_pool_with(
    url: &str,
    max_connections: u32,
    synchronous_commit: SynchronousCommit,
    timeouts: Timeouts,
) -> anyhow::Result<PgPool> {
    Ok(PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(timeouts.acquire)
        .connect_lazy_with(connect_options(
            url,
            synchronous_commit,
            timeouts.statement,
        )?))
}

fn connect_options(
    url: &str,
    synchronous_commit: SynchronousCommit,
    statement_timeout: Duration,
) -> anyhow::Result<PgConnectOptions> {
    // The url is not echoed: it may carry a password.
    let options = PgConnectOptions::from_str(url).context("invalid postgres url")?;
    let options = match options.get_application_name() {
        Some(_) => options,
        None => options.application_name("txoutboxd"),
    };
    // `synchronous_commit` is set on the relay's own sessions only (producers are
    // untouched); `off` unless configured, see `SynchronousCommit`.
    //
    // The timeouts bound what one statement of the relay can hold or wait for, whatever
    // happens to this server: no relay transaction spans a round trip, so these are a
    // second line (a statement stuck behind a lock, a migration holding the table).
    //
    // No sequential scans: every statement of the relay reaches its rows through an index
    // (ids, the pending and key indexes, the heads), and its cached plans outlive the
    // table size they were made for. A plan made while the table was small (new, or not
    // analyzed since: autovacuum off, or the first minute) scans it whole when that is
    // cheaper than an index, and keeps doing so as the table grows: locking and reading a
    // claim's 5 rows cost 0.3 ms each at 6,600 rows, and grow with every delivered row
    // kept (issue 16). Off, PostgreSQL still scans a table whole where no index applies.
    let statement_timeout = format!("{}ms", statement_timeout.as_millis().max(1));
    Ok(options.options([
        ("jit", "off"),
        ("enable_seqscan", "off"),
        ("synchronous_commit", synchronous_commit.as_str()),
        ("statement_timeout", statement_timeout.as_str()),
        ("lock_timeout", LOCK_TIMEOUT),
        (
            "idle_in_transaction_session_timeout",
            IDLE_IN_TRANSACTION_TIMEOUT,
        ),
    ]))
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
        self.claim_rows(request, None).await
    }

    #[tracing::instrument(
        name = "storage.claim_ahead",
        skip_all,
        fields(table = %self.sql.display_table, owner = request.owner, batch_size = request.batch_size),
    )]
    async fn claim_ahead(
        &self,
        request: ClaimRequest<'_>,
        held: &HeldKeys,
    ) -> StorageResult<Claimed> {
        self.claim_rows(request, Some(held)).await
    }

    async fn held_attempts(
        &self,
        ids: &SortedIds,
        owner: &str,
    ) -> StorageResult<Vec<(MessageId, u32)>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let rows: Vec<(MessageId, i32)> = sqlx::query_as(&self.sql.held_attempts)
            .persistent(false)
            .bind(ids.as_slice())
            .bind(owner)
            .fetch_all(&self.pool)
            .await
            .map_err(self.error("held_attempts"))?;
        Ok(rows
            .into_iter()
            .map(|(id, attempts)| (id, crate::storage::rows::attempts(attempts)))
            .collect())
    }

    async fn ack(&self, ids: &SortedIds, owner: &str) -> StorageResult<SortedIds> {
        if ids.is_empty() {
            return Ok(SortedIds::default());
        }
        let statement = if self.options.delete_on_ack {
            &self.sql.ack_delete
        } else {
            &self.sql.ack
        };
        let applied: Vec<(MessageId, Option<String>)> = sqlx::query_as(statement)
            .persistent(false)
            .bind(ids.as_slice())
            .bind(owner)
            .fetch_all(&self.pool)
            .await
            .map_err(self.error("ack"))?;
        self.advance_heads(applied.iter().filter_map(|(_, key)| key.clone()))
            .await;
        Ok(ids.only(applied.into_iter().map(|(id, _)| id)))
    }

    #[tracing::instrument(
        name = "storage.nack",
        skip_all,
        fields(table = %self.sql.display_table, owner, nacks = nacks.len()),
    )]
    async fn nack_many(
        &self,
        nacks: &[NackRequest<'_>],
        owner: &str,
        policy: &dyn RetryPolicy,
    ) -> StorageResult<Vec<NackResult>> {
        if nacks.is_empty() {
            return Ok(Vec::new());
        }
        self.nack_batch(nacks, owner, policy).await
    }

    async fn release(
        &self,
        ids: &SortedIds,
        owner: &str,
        delay: Duration,
    ) -> StorageResult<SortedIds> {
        if ids.is_empty() {
            return Ok(SortedIds::default());
        }
        let applied: Vec<MessageId> = sqlx::query_scalar(&self.sql.release)
            .persistent(false)
            .bind(ids.as_slice())
            .bind(owner)
            .bind(interval(delay))
            .fetch_all(&self.pool)
            .await
            .map_err(self.error("release"))?;
        if !applied.is_empty() {
            self.floor.rescan_at(Instant::now() + delay);
        }
        Ok(ids.only(applied))
    }

    async fn dead_letter(&self, id: MessageId, owner: &str, error: &str) -> StorageResult<bool> {
        let applied: Option<(MessageId, Option<String>)> = sqlx::query_as(&self.sql.dead_letter)
            .persistent(false)
            .bind(id)
            .bind(owner)
            .bind(error)
            .fetch_optional(&self.pool)
            .await
            .map_err(self.error("dead-letter"))?;
        let Some((_, key)) = applied else {
            return Ok(false);
        };
        self.advance_heads(key).await;
        Ok(true)
    }

    async fn extend_lease(
        &self,
        ids: &SortedIds,
        owner: &str,
        lease: Duration,
    ) -> StorageResult<Extended> {
        let rows: Vec<(Option<MessageId>, DateTime<Utc>)> = sqlx::query_as(&self.sql.extend_lease)
            .persistent(false)
            .bind(ids.as_slice())
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
        let ids = ids.only(rows.into_iter().filter_map(|(id, _)| id));
        Ok(Extended {
            ids,
            lease_expires_at,
        })
    }

    async fn return_leases(&self, ids: &SortedIds, owner: &str) -> StorageResult<u64> {
        if ids.is_empty() {
            return Ok(0);
        }
        let done = sqlx::query(&self.sql.return_leases)
            .persistent(false)
            .bind(ids.as_slice())
            .bind(owner)
            .execute(&self.pool)
            .await
            .map_err(self.error("return leases"))?;
        if done.rows_affected() > 0 {
            self.floor.rescan_at(Instant::now());
        }
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

    async fn delivered_within(&self, window: Duration) -> StorageResult<Option<u64>> {
        if self.options.delete_on_ack {
            return Ok(None);
        }
        let delivered: i64 = sqlx::query_scalar(&self.sql.delivered_within)
            .bind(interval(window))
            .fetch_one(&self.pool)
            .await
            .map_err(self.error("stats"))?;
        Ok(Some(super::rows::count(delivered)))
    }

    #[tracing::instrument(name = "storage.purge", skip_all, fields(table = %self.sql.display_table))]
    async fn purge(&self, older_than: Duration) -> StorageResult<u64> {
        // With delete_on_ack there are no delivered rows to purge, only drained heads.
        let purged = if self.options.delete_on_ack {
            0
        } else {
            in_batches(|| async {
                let done = sqlx::query(&self.sql.purge_batch)
                    .bind(interval(older_than))
                    .bind(PURGE_BATCH)
                    .execute(&self.pool)
                    .await
                    .map_err(self.error("purge"))?;
                Ok(done.rows_affected())
            })
            .await?
        };
        if let Some(strict) = &self.sql.strict {
            // Drained keys' heads rows; a producer about to fill one keeps it (row lock).
            in_batches(|| async {
                let done = sqlx::query(&strict.purge_drained)
                    .bind(PURGE_BATCH)
                    .execute(&self.pool)
                    .await
                    .map_err(self.error("purge"))?;
                Ok(done.rows_affected())
            })
            .await?;
        }
        tracing::debug!(purged, "purged delivered rows");
        Ok(purged)
    }

    fn schema_sql(&self) -> String {
        self.sql.schema.clone()
    }

    #[tracing::instrument(name = "storage.ensure_table", skip_all, fields(table = %self.sql.display_table))]
    async fn ensure_table(&self) -> StorageResult<()> {
        if self.schema_is_current().await? {
            return Ok(());
        }
        // One simple query: one transaction, sent at once (see `Statements::schema_run`).
        // Servers starting together serialise on its advisory lock (tables in one schema
        // share its CREATE SCHEMA, so the lock is global, not per table).
        self.pool
            .execute(self.sql.schema_run.as_str())
            .await
            .map_err(self.error("create schema"))?;
        Ok(())
    }

    async fn verify_table(&self) -> StorageResult<()> {
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
        let mut problems = check_live_columns(&self.options.columns, &live, false, accepts);
        if !self.sql.functions.is_empty() {
            let present: i64 = sqlx::query_scalar(&self.sql.functions_present)
                .bind(&self.sql.functions)
                .fetch_one(&self.pool)
                .await
                .map_err(self.error("ping"))?;
            if present < self.sql.functions.len() as i64 {
                problems.push(format!(
                    "the functions of strict ordering ({}) are missing or of another version: \
                     run the DDL of `txoutboxd schema <outbox>`, or set create_schema = true",
                    self.sql.functions.join(", ")
                ));
            }
        }
        StorageError::unless_problems(&self.sql.display_table, problems)
    }

    async fn list_dead(
        &self,
        filter: &DeadFilter,
        after_id: MessageId,
        limit: u32,
    ) -> StorageResult<Vec<DeadLetter>> {
        self.dead_rows(filter, after_id, limit).await
    }

    async fn count_dead(&self, filter: &DeadFilter) -> StorageResult<DeadCounts> {
        self.dead_counts(filter).await
    }

    #[tracing::instrument(name = "storage.redrive", skip_all, fields(table = %self.sql.display_table, limit))]
    async fn redrive_dead(
        &self,
        filter: &DeadFilter,
        limit: u32,
        delay: Duration,
    ) -> StorageResult<SortedIds> {
        self.redrive_rows(filter, limit, delay).await
    }

    #[tracing::instrument(name = "storage.discard", skip_all, fields(table = %self.sql.display_table, limit))]
    async fn discard_dead(&self, filter: &DeadFilter, limit: u32) -> StorageResult<SortedIds> {
        self.discard_rows(filter, limit).await
    }

    async fn blocked_keys(
        &self,
        after_id: MessageId,
        limit: u32,
    ) -> StorageResult<Vec<BlockedKey>> {
        let rows = sqlx::query(&self.sql.blocked_keys)
            .bind(after_id)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await
            .map_err(self.error("blocked keys"))?;
        rows.iter()
            .map(convert::decode_blocked)
            .collect::<Result<_, _>>()
            .map_err(self.error("blocked keys"))
    }

    async fn lease_holders(&self) -> StorageResult<Vec<LeaseHolder>> {
        let rows: Vec<(String, i64, DateTime<Utc>)> = sqlx::query_as(&self.sql.lease_holders)
            .fetch_all(&self.pool)
            .await
            .map_err(self.error("lease holders"))?;
        Ok(LeaseHolder::from_rows(rows))
    }

    async fn pauses(&self) -> StorageResult<Pauses> {
        let rows: Vec<(String, DateTime<Utc>)> = sqlx::query_as(&self.sql.pauses)
            .fetch_all(&self.pool)
            .await
            .map_err(self.error("read the pauses"))?;
        Ok(Pauses::from_rows(rows))
    }

    async fn set_paused(&self, topics: &[String], paused: bool) -> StorageResult<Pauses> {
        let statement = if paused {
            &self.sql.pause
        } else {
            &self.sql.resume
        };
        sqlx::query(statement)
            .bind(Pauses::targets(topics))
            .execute(&self.pool)
            .await
            .map_err(self.error("pause"))?;
        self.pauses().await
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

    fn insert_signal(&self) -> Option<watch::Receiver<Inserts>> {
        self.signal.as_ref().map(InsertSignal::subscribe)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn identifiers_are_checked_and_named() {
        let url = "postgres://postgres@127.0.0.1:1/none";
        for (options, extras, named) in [
            (
                TableOptions {
                    table: "out-box".into(),
                    ..Default::default()
                },
                PostgresExtras::default(),
                "`table`",
            ),
            (
                TableOptions::default(),
                PostgresExtras {
                    schema: Some("1st".into()),
                    ..Default::default()
                },
                "`schema`",
            ),
            (
                TableOptions::default(),
                PostgresExtras {
                    notify_channel: Some("a b".into()),
                    ..Default::default()
                },
                "`notify_channel`",
            ),
        ] {
            let err = PostgresStorage::connect(url, 1, options, extras)
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
