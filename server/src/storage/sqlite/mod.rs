//! The SQLite backend: one outbox table in a local database file, shared with the
//! producer application, which inserts rows into the same file in its own transactions.
//!
//! Start with [`SqliteStorage::connect`]. The statements live in [`sql`] (which also says
//! how times are stored: epoch milliseconds), the error mapping and row decoding in
//! [`convert`], the table's DDL and the check of a live table against the column mapping
//! in [`table`].
//!
//! Locking. SQLite has no `SKIP LOCKED` and no row locks; it has something simpler: one
//! writer at a time per file, across every connection and every process on the machine.
//! A claim is one `UPDATE ... RETURNING` inside `BEGIN IMMEDIATE`, which takes that write
//! lock up front, so claims on a file run one at a time and each sees what the previous
//! one committed: rows are never leased twice, and the strict-ordering predicate ("no
//! earlier row of this key is leased") is sound, across servers too. A read probes first
//! whether there is anything to claim, so an idle relay polling the file never takes the
//! lock a producer is waiting for. Each storage writes
//! through a pool of **one** connection (shared by the outboxes of a file), so the writes
//! of one server queue fairly in-process instead of spinning in SQLite's busy handler;
//! the busy timeout ([`BUSY_TIMEOUT`]) only covers other processes (a producer's
//! transaction, another server). Past it, the operation fails as
//! [`StorageError::Unavailable`]. The file is switched to WAL mode, so readers (stats,
//! health pings, the producer's own reads) never wait for a claim, nor a claim for them.
//!
//! No insert signal: SQLite cannot notify another process of a commit, so claiming polls
//! (adaptive, `poll.*` of the outbox). Per-key order, visibility delay, fencing, stats and
//! purge behave as on PostgreSQL. Several servers may share a file **on one machine**
//! (SQLite's locks do not work across network file systems).

mod convert;
mod ops;
mod sql;
mod table;

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use anyhow::{anyhow, Context};
use async_trait::async_trait;
use sqlx::pool::PoolConnection;
use sqlx::sqlite::{
    Sqlite, SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteSynchronous,
};
use sqlx::Executor;

use self::convert::{
    after, before, classify, datetime, decode_topic_stats, json_list, now_ms, Place,
};
use self::sql::{Shape, Statements};

use super::columns::{check_live_columns, insert_row, InsertPayload, LiveColumn};
use super::ident::Ident;
use super::{
    in_batches, BlockedKey, ClaimRequest, Claimed, DeadCounts, DeadFilter, DeadLetter, Extended,
    LeaseHolder, MessageId, NackRequest, NackResult, NewMessage, Pauses, RetryPolicy, SortedIds,
    Stats, Storage, StorageError, StorageResult, TableOptions, PURGE_BATCH,
};

/// How long a statement waits for another process's write lock before giving up.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// How long an operation waits for a pooled connection: longer than the servers'
/// [`ACQUIRE_TIMEOUT`](crate::storage::ACQUIRE_TIMEOUT). The writer pool has a single
/// connection, so writes queue here; past the busy timeout of the write ahead of them,
/// plus a margin, the file counts as unavailable.
const WRITE_QUEUE_TIMEOUT: Duration = Duration::from_secs(10);

/// The connections to one database file: a single writer, and readers for stats and
/// health. Cheap to clone; share it between the outboxes of a file.
#[derive(Debug, Clone)]
pub struct SqlitePools {
    writer: SqlitePool,
    reader: SqlitePool,
    file: PathBuf,
}

impl SqlitePools {
    /// The writer and the reader pool, for their gauges (`txoutbox_db_pool_connections`).
    pub fn each(&self) -> [&SqlitePool; 2] {
        [&self.writer, &self.reader]
    }
}

/// Pools that open the file on first use (creating it unless the URL sets `mode`).
/// `max_connections` (at least 1: configuration checks it) sizes the reader pool; there
/// is always one writer.
pub fn lazy_pools(url: &str, max_connections: u32) -> anyhow::Result<SqlitePools> {
    let file = database_file(url).map_err(|why| anyhow!("invalid sqlite url: {why}"))?;
    let options = SqliteConnectOptions::from_str(url)
        .context("invalid sqlite url")?
        .busy_timeout(BUSY_TIMEOUT)
        // In WAL mode, NORMAL loses no committed data on a crash of the process, only
        // possibly the last commits on a power loss: at worst an ack or a claim is undone,
        // and the row is delivered again (at-least-once). Producers choose for their rows.
        .synchronous(SqliteSynchronous::Normal);
    let options = if has_mode(url) {
        options
    } else {
        options.create_if_missing(true)
    };
    // Only the writer switches the file to WAL (a persistent setting of the file): the
    // switch needs an exclusive lock, and one connection cannot race itself for it.
    let writer = SqlitePoolOptions::new()
        .max_connections(1)
        .acquire_timeout(WRITE_QUEUE_TIMEOUT)
        .connect_lazy_with(options.clone().journal_mode(SqliteJournalMode::Wal));
    let reader = SqlitePoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(WRITE_QUEUE_TIMEOUT)
        .connect_lazy_with(options);
    Ok(SqlitePools {
        writer,
        reader,
        file,
    })
}

/// The file a `sqlite://PATH` (or `sqlite:PATH`) URL names, or why it names none that
/// a relay can use. Relative paths are relative to the working directory.
pub fn database_file(url: &str) -> Result<PathBuf, String> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
        .ok_or_else(|| "expected sqlite://PATH".to_owned())?;
    let path = rest.split_once('?').map_or(rest, |(path, _)| path);
    if path.is_empty() {
        return Err("no file: write sqlite://PATH, for example sqlite://txoutbox.db".to_owned());
    }
    if path == ":memory:" || url.contains("mode=memory") {
        return Err(
            "an in-memory database is private to this process; the relay and your \
                    producers must share a file: write sqlite://PATH"
                .to_owned(),
        );
    }
    let options = SqliteConnectOptions::from_str(url).map_err(|err| err.to_string())?;
    Ok(options.get_filename().to_path_buf())
}

fn has_mode(url: &str) -> bool {
    url.split_once('?')
        .is_some_and(|(_, query)| query.split('&').any(|pair| pair.starts_with("mode=")))
}

/// An outbox table in a SQLite file.
pub struct SqliteStorage {
    pools: SqlitePools,
    options: TableOptions,
    sql: Statements,
    place: Place,
}

impl fmt::Debug for SqliteStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteStorage")
            .field("file", &self.pools.file)
            .field("table", &self.sql.display_table)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl SqliteStorage {
    /// A storage with pools of its own (see [`lazy_pools`]). The table name is checked
    /// here; the file is not opened until first use (see [`Storage::verify_table`]).
    pub async fn connect(
        url: &str,
        max_connections: u32,
        options: TableOptions,
    ) -> anyhow::Result<Self> {
        Self::from_pools(lazy_pools(url, max_connections)?, options)
    }

    /// A storage on existing pools, for example ones shared by the outboxes of a file.
    pub fn from_pools(pools: SqlitePools, options: TableOptions) -> anyhow::Result<Self> {
        let table =
            Ident::new(&options.table).map_err(|err| anyhow!("invalid sqlite `table`: {err}"))?;
        let sql = Statements::render(&Shape {
            table: &table,
            columns: &options.columns,
            strict_ordering: options.strict_ordering,
            dead_holds_key: options.dead_holds_key(),
            visibility_delay: options.visibility_delay,
            max_row_bytes: options.max_row_bytes,
        });
        let place = Place {
            table: sql.display_table.clone(),
            file: pools.file.display().to_string(),
            busy_timeout: BUSY_TIMEOUT,
        };
        Ok(Self {
            pools,
            options,
            sql,
            place,
        })
    }

    /// Translates a driver error for `action`; see [`classify`].
    pub(super) fn error(
        &self,
        action: &'static str,
    ) -> impl FnOnce(sqlx::Error) -> StorageError + '_ {
        move |err| classify(err, &self.place, action)
    }

    /// The writer connection, for one autocommit statement. Take "now" after this: the
    /// wait for the connection is not part of the operation's time.
    pub(super) async fn writer(
        &self,
        action: &'static str,
    ) -> StorageResult<PoolConnection<Sqlite>> {
        self.pools
            .writer
            .acquire()
            .await
            .map_err(self.error(action))
    }

    /// The live table's columns, as `conn` sees them; none when there is no table.
    async fn live_columns(
        &self,
        conn: impl sqlx::SqliteExecutor<'_>,
        action: &'static str,
    ) -> StorageResult<Vec<LiveColumn>> {
        let rows = sqlx::query_as(&self.sql.live_columns)
            .bind(&self.sql.display_table)
            .fetch_all(conn)
            .await
            .map_err(self.error(action))?;
        Ok(rows.into_iter().map(table::live_column).collect())
    }

    /// A write transaction holding the file's write lock from its first statement on.
    pub(super) async fn begin_immediate(
        &self,
        action: &'static str,
    ) -> StorageResult<sqlx::Transaction<'static, Sqlite>> {
        self.pools
            .writer
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(self.error(action))
    }
}

#[async_trait]
impl Storage for SqliteStorage {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    #[tracing::instrument(
        name = "storage.claim",
        skip_all,
        fields(table = %self.sql.display_table, owner = request.owner, batch_size = request.batch_size),
    )]
    async fn claim(&self, request: ClaimRequest<'_>) -> StorageResult<Claimed> {
        self.claim_rows(request).await
    }

    async fn held_attempts(
        &self,
        ids: &SortedIds,
        owner: &str,
    ) -> StorageResult<Vec<(MessageId, u32)>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let rows: Vec<(MessageId, i64)> = sqlx::query_as(&self.sql.held_attempts)
            .bind(json_list(ids.as_slice()))
            .bind(owner)
            .fetch_all(&self.pools.reader)
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
        let mut conn = self.writer("ack").await?;
        let mut query = sqlx::query_scalar(statement)
            .bind(json_list(ids.as_slice()))
            .bind(owner);
        if !self.options.delete_on_ack {
            query = query.bind(now_ms());
        }
        let applied: Vec<MessageId> = query
            .fetch_all(&mut *conn)
            .await
            .map_err(self.error("ack"))?;
        Ok(ids.only(applied))
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
        // One write transaction for the batch; each nack sees what the ones before it did.
        let mut tx = self.begin_immediate("nack").await?;
        let mut results = Vec::with_capacity(nacks.len());
        for nack in nacks {
            results.push(self.nack_in(&mut tx, nack, owner, policy).await?);
        }
        tx.commit().await.map_err(self.error("nack"))?;
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
        let mut conn = self.writer("release").await?;
        let now = now_ms();
        let applied: Vec<MessageId> = sqlx::query_scalar(&self.sql.release)
            .bind(json_list(ids.as_slice()))
            .bind(owner)
            .bind(after(now, delay))
            .bind(now)
            .fetch_all(&mut *conn)
            .await
            .map_err(self.error("release"))?;
        Ok(ids.only(applied))
    }

    async fn dead_letter(&self, id: MessageId, owner: &str, error: &str) -> StorageResult<bool> {
        let mut conn = self.writer("dead-letter").await?;
        let applied: Option<MessageId> = sqlx::query_scalar(&self.sql.dead_letter)
            .bind(id)
            .bind(owner)
            .bind(error)
            .bind(now_ms())
            .fetch_optional(&mut *conn)
            .await
            .map_err(self.error("dead-letter"))?;
        Ok(applied.is_some())
    }

    async fn extend_lease(
        &self,
        ids: &SortedIds,
        owner: &str,
        lease: Duration,
    ) -> StorageResult<Extended> {
        let err = || self.error("extend lease");
        if ids.is_empty() {
            let lease_expires_at = datetime(after(now_ms(), lease)).map_err(err())?;
            return Ok(Extended {
                ids: SortedIds::default(),
                lease_expires_at,
            });
        }
        let mut conn = self.writer("extend lease").await?;
        let now = now_ms();
        let until = after(now, lease);
        let extended: Vec<MessageId> = sqlx::query_scalar(&self.sql.extend_lease)
            .bind(json_list(ids.as_slice()))
            .bind(owner)
            .bind(until)
            .bind(now)
            .fetch_all(&mut *conn)
            .await
            .map_err(err())?;
        Ok(Extended {
            ids: ids.only(extended),
            lease_expires_at: datetime(until).map_err(err())?,
        })
    }

    async fn return_leases(&self, ids: &SortedIds, owner: &str) -> StorageResult<u64> {
        if ids.is_empty() {
            return Ok(0);
        }
        let mut conn = self.writer("return leases").await?;
        let done = sqlx::query(&self.sql.return_leases)
            .bind(json_list(ids.as_slice()))
            .bind(owner)
            .bind(now_ms())
            .execute(&mut *conn)
            .await
            .map_err(self.error("return leases"))?;
        Ok(done.rows_affected())
    }

    async fn stats(&self) -> StorageResult<Stats> {
        let now = now_ms();
        let rows = sqlx::query(&self.sql.stats)
            .bind(now)
            .fetch_all(&self.pools.reader)
            .await
            .map_err(self.error("stats"))?;
        let topics = rows
            .iter()
            .map(|row| decode_topic_stats(row, now))
            .collect::<Result<Vec<_>, _>>()
            .map_err(self.error("stats"))?;
        Ok(Stats::from_topics(topics))
    }

    async fn delivered_within(&self, window: Duration) -> StorageResult<Option<u64>> {
        if self.options.delete_on_ack {
            return Ok(None);
        }
        let delivered: i64 = sqlx::query_scalar(&self.sql.delivered_within)
            .bind(before(now_ms(), window))
            .fetch_one(&self.pools.reader)
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
            // The writer is given back between batches, so claims interleave.
            let mut conn = self.writer("purge").await?;
            let done = sqlx::query(&self.sql.purge_batch)
                .bind(before(now_ms(), older_than))
                .bind(PURGE_BATCH)
                .execute(&mut *conn)
                .await
                .map_err(self.error("purge"))?;
            Ok(done.rows_affected())
        })
        .await?;
        tracing::debug!(purged, "purged delivered rows");
        Ok(purged)
    }

    fn schema_sql(&self) -> String {
        self.sql.schema.text()
    }

    /// The table if missing, the bookkeeping columns a table of the team's own lacks
    /// (see [`table`]: SQLite cannot add a column "if not exists"), then the indexes.
    #[tracing::instrument(name = "storage.ensure_table", skip_all, fields(table = %self.sql.display_table))]
    async fn ensure_table(&self) -> StorageResult<()> {
        let err = || self.error("create schema");
        let schema = &self.sql.schema;
        // Under the write lock, so servers starting together create it once.
        let mut tx = self.begin_immediate("create schema").await?;
        // No bind parameters: every statement of the script runs.
        tx.execute(schema.create_table.as_str())
            .await
            .map_err(err())?;
        let live = self.live_columns(&mut *tx, "create schema").await?;
        for add in &schema.add_columns {
            let name = add.name.as_str();
            if !live.iter().any(|c| c.name.eq_ignore_ascii_case(name)) {
                tracing::info!(column = name, "adding a bookkeeping column");
                tx.execute(add.statement.as_str()).await.map_err(err())?;
            }
        }
        tx.execute(schema.indexes.as_str()).await.map_err(err())?;
        tx.execute(schema.pauses.as_str()).await.map_err(err())?;
        tx.commit().await.map_err(err())
    }

    /// The table answers, its columns are what the mapping needs (the relay's own table
    /// is checked too), and the file takes writes: a write that changes nothing fails on
    /// a read-only file ([`StorageError::ReadOnly`]). The file being locked by another
    /// writer proves nothing either way, and is left to the relay's own writes.
    async fn verify_table(&self) -> StorageResult<()> {
        sqlx::query(&self.sql.ping)
            .execute(&self.pools.reader)
            .await
            .map_err(self.error("ping"))?;
        let live = self.live_columns(&self.pools.reader, "ping").await?;
        let problems = check_live_columns(&self.options.columns, &live, true, table::accepts);
        StorageError::unless_problems(&self.sql.display_table, problems)?;
        let probe = sqlx::query(&self.sql.write_probe)
            .execute(&self.pools.writer)
            .await
            .map_err(self.error("ping"));
        match probe {
            Err(error @ StorageError::ReadOnly(_)) => Err(error),
            _ => Ok(()),
        }
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
            .bind(now_ms())
            .fetch_all(&self.pools.reader)
            .await
            .map_err(self.error("blocked keys"))?;
        rows.iter()
            .map(convert::decode_blocked)
            .collect::<Result<_, _>>()
            .map_err(self.error("blocked keys"))
    }

    async fn lease_holders(&self) -> StorageResult<Vec<LeaseHolder>> {
        let err = || self.error("lease holders");
        let rows: Vec<(String, i64, i64)> = sqlx::query_as(&self.sql.lease_holders)
            .bind(now_ms())
            .fetch_all(&self.pools.reader)
            .await
            .map_err(err())?;
        let rows = rows
            .into_iter()
            .map(|(owner, rows, until)| Ok((owner, rows, datetime(until)?)))
            .collect::<Result<_, sqlx::Error>>()
            .map_err(err())?;
        Ok(LeaseHolder::from_rows(rows))
    }

    async fn pauses(&self) -> StorageResult<Pauses> {
        let err = || self.error("read the pauses");
        let rows: Vec<(String, i64)> = sqlx::query_as(&self.sql.pauses)
            .fetch_all(&self.pools.reader)
            .await
            .map_err(err())?;
        let rows = rows
            .into_iter()
            .map(|(target, since)| Ok((target, datetime(since)?)))
            .collect::<Result<Vec<_>, sqlx::Error>>()
            .map_err(err())?;
        Ok(Pauses::from_rows(rows))
    }

    async fn set_paused(&self, topics: &[String], paused: bool) -> StorageResult<Pauses> {
        let mut conn = self.writer("pause").await?;
        let now = now_ms();
        for target in Pauses::targets(topics) {
            let query = if paused {
                sqlx::query(&self.sql.pause).bind(target).bind(now)
            } else {
                sqlx::query(&self.sql.resume).bind(target)
            };
            query
                .execute(&mut *conn)
                .await
                .map_err(self.error("pause"))?;
        }
        drop(conn);
        self.pauses().await
    }

    async fn insert(&self, message: NewMessage) -> StorageResult<MessageId> {
        let row = insert_row(&self.options.columns, message)?;
        let mut conn = self.writer("insert").await?;
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
            query = query.bind(sqlx::types::Json(headers));
        }
        query
            .fetch_one(&mut *conn)
            .await
            .map_err(self.error("insert"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_a_file() {
        assert_eq!(
            database_file("sqlite://txoutbox.db").unwrap(),
            PathBuf::from("txoutbox.db")
        );
        assert_eq!(
            database_file("sqlite:///var/lib/txoutbox/outbox.db?mode=rwc").unwrap(),
            PathBuf::from("/var/lib/txoutbox/outbox.db")
        );
        assert_eq!(
            database_file("sqlite:data/a%3Fb.db").unwrap(),
            PathBuf::from("data/a?b.db")
        );
        for url in ["sqlite::memory:", "sqlite://x.db?mode=memory"] {
            assert!(
                database_file(url).unwrap_err().contains("in-memory"),
                "{url}"
            );
        }
        assert!(database_file("sqlite://").unwrap_err().contains("no file"));
        assert!(database_file("sqlite://x.db?bogus=1").is_err());
    }

    #[tokio::test]
    async fn the_table_name_is_checked_and_named() {
        let options = TableOptions {
            table: "out-box".into(),
            ..Default::default()
        };
        let err = SqliteStorage::connect("sqlite://x.db", 1, options)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("`table`"), "{err}");
        assert!(
            err.contains("ASCII letters, digits and underscores"),
            "{err}"
        );
    }
}
