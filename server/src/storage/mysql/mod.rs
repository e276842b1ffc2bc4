//! The MySQL/MariaDB backend: one InnoDB outbox table, claimed with
//! `SELECT ... FOR UPDATE SKIP LOCKED`. Targets MariaDB 10.6+ (tested on 10.11); the SQL
//! also avoids what MySQL 8 lacks (`UPDATE`/`DELETE ... RETURNING`,
//! `CREATE INDEX IF NOT EXISTS`), but MySQL is not tested.
//!
//! Start with [`MySqlStorage::connect`]; the statements live in [`sql`], the transaction
//! of each operation in [`ops`], the table's DDL and the check of a live table against
//! the column mapping in [`table`].
//!
//! How it differs from PostgreSQL, and why:
//! - **No `UPDATE ... RETURNING`.** Every multi-row write-back is a short transaction: lock
//!   the rows the owner holds (`SELECT id ... WHERE leased_by = owner AND status =
//!   'pending' FOR UPDATE`), update exactly those, commit, return their ids. A claim
//!   likewise locks its candidates with `FOR UPDATE SKIP LOCKED`, then leases them by id.
//! - **READ COMMITTED.** Every connection of the pool runs at READ COMMITTED (InnoDB's
//!   default, REPEATABLE READ, would take gap locks on the claim's scan, blocking
//!   producers' inserts until the claim commits, and would read from a snapshot taken
//!   earlier in the transaction).
//! - **A claim locks only what it takes.** Its candidates come from a plain (consistent)
//!   read of the pending index, then are locked by primary key with `FOR UPDATE SKIP
//!   LOCKED` ([`sql::Statements::claim_candidates`] says why: a locking scan of the index
//!   keeps the locks of every row it walks past, rows other replicas hold among them).
//!   Every locking read finds its rows by a range scan of the primary key, the one access
//!   under which InnoDB lets go of the rows that do not match (`sql::locking_by_ids`;
//!   tested in `locks.rs`), so a transaction stopped after it holds no other owner's row. A
//!   round that takes fewer rows than it scanned (locked by another claim, or behind an
//!   earlier row of their key) scans on past them without their keys, a few rounds at
//!   most, so a claim stuck on some keys' heads does not stop the others (issue 9).
//! - **Strict ordering without a lock.** MariaDB has no transaction-scoped advisory locks
//!   (`GET_LOCK` is held by the session: a cancelled claim would leave it on a pooled
//!   connection). Instead, once a claim has locked its candidates, a fresh statement drops
//!   every candidate that has an earlier pending row of its key outside the batch (see
//!   [`sql::claim_successors`]). A row leaves `pending` only through its holder, so a
//!   kept candidate's predecessors are all in this batch and locked by this claim: no
//!   other claimer, on this server or another, can hold them or take a later row of the
//!   key. Claims run concurrently and never wait for each other.
//! - **Times are UTC `DATETIME(6)`**, compared with `UTC_TIMESTAMP(6)` or with one clock
//!   reading taken from the database per operation; the pool's sessions run with
//!   `time_zone = '+00:00'` so the driver's UTC conversions hold.
//! - **No insert signal**: MariaDB has nothing like LISTEN/NOTIFY, so claiming polls
//!   ([`Storage::insert_signal`] is `None`).
//! - **Lock conflicts** (deadlock 1213, lock wait timeout 1205) roll the transaction back
//!   and retry the whole operation once; a second conflict is reported as
//!   [`StorageError::Unavailable`]. Sessions wait at most [`LOCK_WAIT_TIMEOUT_SECS`] for a
//!   row lock: only write-backs ever wait, and only for other short transactions; and a
//!   transaction left idle [`IDLE_TRANSACTION_TIMEOUT_SECS`] (its replica stopped inside
//!   it) is ended by MariaDB, its locks released.
//! - **Known cost**: while the oldest pending row of a key is leased or waiting for its
//!   retry, a strict claim still walks the rows queued behind it (the seed's pitfall #1;
//!   about 10 us per row, against 26 us with MariaDB's subquery cache on). PostgreSQL
//!   avoids it with a key-heads table kept by a statement-level trigger; MariaDB has only
//!   row-level triggers, so that is left for later.

mod convert;
#[cfg(test)]
mod locks;
mod ops;
mod sql;
mod table;

use std::fmt;
use std::future::Future;
use std::str::FromStr;
use std::time::Duration;

use anyhow::{anyhow, Context};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions};
use sqlx::Executor;

use self::convert::{classify, decode_topic_stats};
use self::sql::{Shape, Statements};

use super::columns::{check_live_columns, insert_row, InsertPayload, LiveColumn};
use super::ident::Ident;
use super::timed::Timeouts;
use super::{
    in_batches, BlockedKey, ClaimRequest, Claimed, DeadCounts, DeadFilter, DeadLetter, Extended,
    LeaseHolder, MessageId, NackRequest, NackResult, NewMessage, Pauses, RetryPolicy, SortedIds,
    Stats, Storage, StorageError, StorageResult, TableOptions, PURGE_BATCH,
};

/// `innodb_lock_wait_timeout` of the relay's sessions, in seconds (the server's default
/// is 50; MariaDB counts whole seconds). Only write-backs ever wait for a row lock, and
/// only for other relay transactions, which take milliseconds; a longer wait means a
/// transaction stuck on a stopped or partitioned replica (issue 9). So an ack gives up
/// after this, tries once more, then reports [`StorageError::Unavailable`] for its
/// caller to retry: at most two seconds, where PostgreSQL's relay waits at most its
/// `lock_timeout`.
pub const LOCK_WAIT_TIMEOUT_SECS: u32 = 1;
/// `idle_transaction_timeout` of the relay's sessions, in seconds: MariaDB ends a session
/// whose transaction sat idle this long, rolling it back. A relay transaction never waits
/// for anything outside the database between its statements, so only a replica that
/// stopped inside one (paused, cut from the database) is ended, and the rows it had
/// locked are free again (PostgreSQL's `idle_in_transaction_session_timeout`). MySQL
/// has no such setting and refuses it: ignored there.
pub const IDLE_TRANSACTION_TIMEOUT_SECS: u32 = 5;
/// An outbox table in MySQL or MariaDB.
pub struct MySqlStorage {
    pool: MySqlPool,
    options: TableOptions,
    /// The database (MySQL's "schema") holding the table; `None`: the URL's.
    database: Option<String>,
    sql: Statements,
}

impl fmt::Debug for MySqlStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MySqlStorage")
            .field("table", &self.sql.display_table)
            .field("options", &self.options)
            .field("database", &self.database)
            .finish_non_exhaustive()
    }
}

impl MySqlStorage {
    /// A storage with a pool of its own (see [`lazy_pool`]). Identifiers are checked here;
    /// the database is not contacted until first use (see [`Storage::verify_table`]), so a server
    /// can start while its database is still coming up.
    /// `database` holds the table (MySQL's "schema"); `None`: the one the URL names.
    pub fn connect(
        url: &str,
        max_connections: u32,
        options: TableOptions,
        database: Option<String>,
    ) -> anyhow::Result<Self> {
        Self::from_pool(lazy_pool(url, max_connections)?, options, database)
    }

    /// A storage on a pool made by [`lazy_pool`] (its sessions' settings are what the
    /// backend relies on), for example one shared by the outboxes of a database.
    pub fn from_pool(
        pool: MySqlPool,
        options: TableOptions,
        database: Option<String>,
    ) -> anyhow::Result<Self> {
        let name = |option: &str, value: &str| {
            Ident::new(value).map_err(|err| anyhow!("invalid mysql `{option}`: {err}"))
        };
        let table = name("table", &options.table)?;
        // The configuration key that names the database is the outbox's `schema`.
        let database_name = database.as_deref().map(|d| name("schema", d)).transpose()?;
        let sql = Statements::render(&Shape {
            database: database_name.as_ref(),
            table: &table,
            columns: &options.columns,
            dead_holds_key: options.dead_holds_key(),
            max_row_bytes: options.max_row_bytes,
        });
        Ok(Self {
            pool,
            options,
            database,
            sql,
        })
    }

    /// Translates a driver error for `action`; see [`classify`].
    fn error(&self, action: &'static str) -> impl FnOnce(sqlx::Error) -> StorageError + '_ {
        move |err| classify(err, &self.sql.display_table, action)
    }

    /// Runs `operation`, once more after a deadlock or lock wait timeout (its transaction
    /// was dropped, hence rolled back, in between), and translates the error.
    async fn retrying<T, F, Fut>(&self, action: &'static str, mut operation: F) -> StorageResult<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, sqlx::Error>>,
    {
        match operation().await {
            Err(err) if convert::is_lock_conflict(&err) => {
                tracing::debug!(table = %self.sql.display_table, action, error = %err, "lock conflict; retrying once");
                operation().await.map_err(self.error(action))
            }
            result => result.map_err(self.error(action)),
        }
    }

    /// The live table's columns and index names; none when there is no table.
    async fn live_table(
        &self,
        action: &'static str,
    ) -> StorageResult<(Vec<LiveColumn>, Vec<String>)> {
        let database = self.database.as_deref();
        let columns: Vec<(String, String, i64, i64)> = sqlx::query_as(&self.sql.live_columns)
            .bind(database)
            .bind(&self.options.table)
            .fetch_all(&self.pool)
            .await
            .map_err(self.error(action))?;
        let indexes = sqlx::query_scalar(&self.sql.live_indexes)
            .bind(database)
            .bind(&self.options.table)
            .fetch_all(&self.pool)
            .await
            .map_err(self.error(action))?;
        Ok((
            columns.into_iter().map(table::live_column).collect(),
            indexes,
        ))
    }

    /// What lifts the session's statement limit for one statement: the DDL of
    /// `create_schema` may rebuild a large table, which takes as long as it takes (as on
    /// PostgreSQL). MariaDB's `max_statement_time` ends DDL too; MySQL's
    /// `max_execution_time` only `SELECT`s, and MySQL has no `SET STATEMENT`.
    async fn unlimited_statement_prefix(&self) -> StorageResult<&'static str> {
        let version: String = sqlx::query_scalar("SELECT VERSION()")
            .fetch_one(&self.pool)
            .await
            .map_err(self.error("create schema"))?;
        Ok(if version.contains("MariaDB") {
            "SET STATEMENT max_statement_time = 0 FOR "
        } else {
            ""
        })
    }

    /// Runs one `ALTER TABLE` of `create_schema`. A server starting at the same time may
    /// have added the same columns or indexes first: duplicates are what was wanted.
    async fn alter(&self, statement: &str) -> StorageResult<()> {
        match self.pool.execute(statement).await {
            Err(err) if convert::is_duplicate_column_or_index(&err) => Ok(()),
            result => result.map(drop).map_err(self.error("create schema")),
        }
    }
}

/// A pool that connects on first use, as every pool of this backend must be: sessions at
/// READ COMMITTED with UTC time, a short lock wait and an idle-transaction bound (see the
/// module docs), the default [`Timeouts`] (see [`lazy_pool_with`]).
pub fn lazy_pool(url: &str, max_connections: u32) -> anyhow::Result<MySqlPool> {
    lazy_pool_with(url, max_connections, Timeouts::default())
}

/// [`lazy_pool`] with these timeouts: a short acquire timeout, so a dead database surfaces
/// as [`StorageError::Unavailable`] within seconds instead of hanging callers, and the
/// statement limit as the session's `max_statement_time` (MariaDB: every statement, DDL
/// too, which [`Storage::ensure_table`] lifts for its own statements) or
/// `max_execution_time` (MySQL, which bounds only `SELECT`s).
pub fn lazy_pool_with(
    url: &str,
    max_connections: u32,
    timeouts: Timeouts,
) -> anyhow::Result<MySqlPool> {
    let statement_limit = timeouts.statement;
    Ok(MySqlPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(timeouts.acquire)
        .after_connect(move |conn, _meta| {
            Box::pin(async move {
                conn.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                    .await?;
                conn.execute(
                    format!("SET SESSION innodb_lock_wait_timeout = {LOCK_WAIT_TIMEOUT_SECS}")
                        .as_str(),
                )
                .await?;
                let _ = conn
                    .execute(
                        format!(
                            "SET SESSION idle_transaction_timeout = {IDLE_TRANSACTION_TIMEOUT_SECS}"
                        )
                        .as_str(),
                    )
                    .await;
                // MariaDB counts seconds (a decimal), MySQL milliseconds under another
                // name: each refuses the other's variable.
                let mariadb = format!(
                    "SET SESSION max_statement_time = {:.3}",
                    statement_limit.as_secs_f64()
                );
                if conn.execute(mariadb.as_str()).await.is_err() {
                    let mysql = format!(
                        "SET SESSION max_execution_time = {}",
                        statement_limit.as_millis()
                    );
                    conn.execute(mysql.as_str()).await?;
                }
                // MariaDB caches a correlated subquery's result per outer value; the strict
                // claim's predecessor test never repeats one, and the cache made it four
                // times slower behind a blocked key (26 vs 6.5 us per row). MySQL has no
                // such cache and refuses the setting: ignored there.
                let _ = conn
                    .execute("SET SESSION optimizer_switch = 'subquery_cache=off'")
                    .await;
                Ok(())
            })
        })
        .connect_lazy_with(connect_options(url)?))
}

/// Options from a `mysql://` or `mariadb://` URL, with the session time zone forced to UTC
/// (the driver's date conversions assume it).
pub fn connect_options(url: &str) -> anyhow::Result<MySqlConnectOptions> {
    let url = match url.strip_prefix("mariadb://") {
        Some(rest) => format!("mysql://{rest}"),
        None => url.to_owned(),
    };
    // The url is not echoed: it may carry a password.
    let options = MySqlConnectOptions::from_str(&url).context("invalid mysql url")?;
    Ok(options.timezone(Some("+00:00".to_owned())))
}

#[async_trait]
impl Storage for MySqlStorage {
    fn backend(&self) -> &'static str {
        "mysql"
    }

    #[tracing::instrument(
        name = "storage.claim",
        skip_all,
        fields(table = %self.sql.display_table, owner = request.owner, batch_size = request.batch_size),
    )]
    async fn claim(&self, request: ClaimRequest<'_>) -> StorageResult<Claimed> {
        let claimed = self.retrying("claim", || self.claim_once(&request)).await?;
        tracing::debug!(claimed = claimed.messages.len(), "claimed");
        Ok(claimed)
    }

    async fn held_attempts(
        &self,
        ids: &SortedIds,
        owner: &str,
    ) -> StorageResult<Vec<(MessageId, u32)>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let statement = self.sql.held_attempts(ids.len());
        let mut query = sqlx::query_as(&statement);
        for id in ids {
            query = query.bind(id);
        }
        let rows: Vec<(MessageId, i64)> = query
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
        self.retrying("ack", || self.ack_once(ids, owner)).await
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
        // A transaction per nack: each holds its row and its key's later rows locked,
        // and a batch in one would hold them all until the last.
        let mut results = Vec::with_capacity(nacks.len());
        for nack in nacks {
            let result = self
                .retrying("nack", || {
                    self.nack_once(nack.id, owner, nack.error, nack.requested_delay, policy)
                })
                .await?;
            results.push(result);
        }
        Ok(results)
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
        self.retrying("release", || self.release_once(ids, owner, delay))
            .await
    }

    async fn dead_letter(&self, id: MessageId, owner: &str, error: &str) -> StorageResult<bool> {
        let done = self
            .retrying("dead-letter", || {
                sqlx::query(&self.sql.dead_letter)
                    .bind(error)
                    .bind(id)
                    .bind(owner)
                    .execute(&self.pool)
            })
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn extend_lease(
        &self,
        ids: &SortedIds,
        owner: &str,
        lease: Duration,
    ) -> StorageResult<Extended> {
        self.retrying("extend lease", || self.extend_lease_once(ids, owner, lease))
            .await
    }

    async fn return_leases(&self, ids: &SortedIds, owner: &str) -> StorageResult<u64> {
        if ids.is_empty() {
            return Ok(0);
        }
        self.retrying("return leases", || self.return_leases_once(ids, owner))
            .await
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
            .bind(sql::micros(window))
            .fetch_one(&self.pool)
            .await
            .map_err(self.error("stats"))?;
        Ok(Some(super::rows::count(delivered)))
    }

    #[tracing::instrument(name = "storage.purge", skip_all, fields(table = %self.sql.display_table))]
    async fn purge(&self, older_than: Duration) -> StorageResult<u64> {
        if self.options.delete_on_ack {
            return Ok(0);
        }
        let purged = in_batches(|| async {
            let done = self
                .retrying("purge", || {
                    sqlx::query(&self.sql.purge_batch)
                        .bind(sql::micros(older_than))
                        .bind(PURGE_BATCH)
                        .execute(&self.pool)
                })
                .await?;
            Ok(done.rows_affected())
        })
        .await?;
        tracing::debug!(purged, "purged delivered rows");
        Ok(purged)
    }

    fn schema_sql(&self) -> String {
        self.sql.schema.text()
    }

    /// The database and table if missing, then what a table of the team's own lacks of
    /// the bookkeeping columns and indexes, each kind in one `ALTER TABLE` (see
    /// [`table`]).
    #[tracing::instrument(name = "storage.ensure_table", skip_all, fields(table = %self.sql.display_table))]
    async fn ensure_table(&self) -> StorageResult<()> {
        // `CREATE ... IF NOT EXISTS` is atomic under MariaDB's metadata locks, so servers
        // starting together need no lock of their own. DDL commits implicitly: no
        // transaction around it.
        let schema = &self.sql.schema;
        let unlimited = self.unlimited_statement_prefix().await?;
        for statement in &schema.create {
            self.pool
                .execute(format!("{unlimited}{statement}").as_str())
                .await
                .map_err(self.error("create schema"))?;
        }
        let (live_columns, live_indexes) = self.live_table("create schema").await?;
        let live: Vec<&str> = live_columns.iter().map(|c| c.name.as_str()).collect();
        let columns = table::lacking(&schema.add_columns, &live);
        if !columns.is_empty() {
            tracing::info!(columns = columns.len(), "adding bookkeeping columns");
            let statement = schema.add_columns(columns, false);
            self.alter(&format!("{unlimited}{statement}")).await?;
        }
        let live: Vec<&str> = live_indexes.iter().map(String::as_str).collect();
        let indexes = table::lacking(&schema.indexes, &live);
        if !indexes.is_empty() {
            tracing::info!(indexes = indexes.len(), "adding indexes");
            let statement = schema.add_indexes(indexes, false);
            self.alter(&format!("{unlimited}{statement}")).await?;
        }
        Ok(())
    }

    /// The table answers, its columns are what the mapping needs (the relay's own table
    /// is checked too), and it has the index claims are pinned to.
    async fn verify_table(&self) -> StorageResult<()> {
        sqlx::query(&self.sql.ping)
            .execute(&self.pool)
            .await
            .map_err(self.error("ping"))?;
        let (columns, indexes) = self.live_table("ping").await?;
        let mut problems =
            check_live_columns(&self.options.columns, &columns, true, table::accepts);
        let pending_index = &self.sql.schema.pending_index;
        if !indexes
            .iter()
            .any(|name| name.eq_ignore_ascii_case(pending_index))
        {
            problems.push(format!(
                "index {pending_index:?} is missing: claims are pinned to it; \
                 `txoutboxd schema` prints the statement that adds it"
            ));
        }
        StorageError::unless_problems(&self.sql.display_table, problems)
    }

    async fn list_dead(
        &self,
        filter: &DeadFilter,
        after_id: MessageId,
        limit: u32,
    ) -> StorageResult<Vec<DeadLetter>> {
        self.dead_rows(filter, after_id, limit)
            .await
            .map_err(self.error("list dead letters"))
    }

    async fn count_dead(&self, filter: &DeadFilter) -> StorageResult<DeadCounts> {
        self.dead_counts(filter)
            .await
            .map_err(self.error("count dead letters"))
    }

    #[tracing::instrument(name = "storage.redrive", skip_all, fields(table = %self.sql.display_table, limit))]
    async fn redrive_dead(
        &self,
        filter: &DeadFilter,
        limit: u32,
        delay: Duration,
    ) -> StorageResult<SortedIds> {
        self.retrying("re-drive dead letters", || {
            self.redrive_once(filter, limit, delay)
        })
        .await
    }

    #[tracing::instrument(name = "storage.discard", skip_all, fields(table = %self.sql.display_table, limit))]
    async fn discard_dead(&self, filter: &DeadFilter, limit: u32) -> StorageResult<SortedIds> {
        self.retrying("discard dead letters", || self.discard_once(filter, limit))
            .await
    }

    async fn blocked_keys(
        &self,
        after_id: MessageId,
        limit: u32,
    ) -> StorageResult<Vec<BlockedKey>> {
        let mut query = sqlx::query(&self.sql.blocked_keys).bind(after_id);
        if self.sql.dead_holds_key {
            // The keys behind a dead row start after the same id.
            query = query.bind(after_id);
        }
        let rows = query
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
        // One statement per target, each idempotent: a call cut short is repeated.
        for target in Pauses::targets(topics) {
            sqlx::query(statement)
                .bind(target)
                .execute(&self.pool)
                .await
                .map_err(self.error("pause"))?;
        }
        self.pauses().await
    }

    async fn insert(&self, message: NewMessage) -> StorageResult<MessageId> {
        let row = insert_row(&self.options.columns, message)?;
        let mut query = sqlx::query(&self.sql.insert);
        if let Some(topic) = row.topic {
            query = query.bind(topic);
        }
        query = query.bind(row.key);
        query = match row.payload {
            InsertPayload::Bytes(bytes) => query.bind(bytes),
            InsertPayload::Text(text) => query.bind(text),
        };
        if let Some(headers) = row.headers {
            query = query.bind(sqlx::types::Json(headers));
        }
        let done = query
            .execute(&self.pool)
            .await
            .map_err(self.error("insert"))?;
        Ok(done.last_insert_id() as MessageId)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn identifiers_are_checked_and_named() {
        let url = "mysql://root@127.0.0.1:1/none";
        for (options, database, named) in [
            (
                TableOptions {
                    table: "out-box".into(),
                    ..Default::default()
                },
                None,
                "`table`",
            ),
            (TableOptions::default(), Some("1st".into()), "`schema`"),
        ] {
            let err = MySqlStorage::connect(url, 1, options, database)
                .unwrap_err()
                .to_string();
            assert!(err.contains(named), "{err}");
            assert!(
                err.contains("ASCII letters, digits and underscores"),
                "{err}"
            );
        }
    }

    #[test]
    fn mariadb_urls_are_accepted_and_sessions_run_in_utc() {
        let options = connect_options("mariadb://app:secret@db.internal:3307/shop").unwrap();
        assert_eq!(options.get_host(), "db.internal");
        assert_eq!(options.get_port(), 3307);
        assert_eq!(options.get_database(), Some("shop"));
        let options = connect_options("mysql://root@localhost/test?timezone=%2B02:00").unwrap();
        assert_eq!(options.get_database(), Some("test"));
    }
}
