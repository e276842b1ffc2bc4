//! The SQLite backend: one outbox table in a local database file, shared with the
//! producer application, which inserts rows into the same file in its own transactions.
//!
//! Start with [`SqliteStorage::connect`]. Its files are those of every backend (see
//! `storage/mod.rs`): the table's names and what every statement writes alike in
//! `shape.rs` (which also says how times are stored: epoch milliseconds), the DDL and the
//! check of a live table in `schema.rs`, the claim in `claim.rs`, strict ordering's
//! filter in `strict.rs`, the answers in `answers.rs`, the operator's calls in
//! `admin.rs`, errors and rows in [`convert`]. Each file renders its statements
//! (`impl Statements`) and runs them (`impl SqliteStorage`).
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

mod admin;
mod answers;
mod claim;
mod convert;
pub mod groups;
mod schema;
mod shape;
mod strict;
#[cfg(test)]
mod tests;

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

use self::convert::{classify, Place};
use self::shape::{Shape, Statements};
use super::{
    BlockedKey, ClaimRequest, Claimed, DeadCounts, DeadFilter, DeadLetter, Extended, LeaseHolder,
    MessageId, NackRequest, NackResult, NewMessage, Pauses, RetryPolicy, SortedIds, Stats, Storage,
    StorageError, StorageResult, TableOptions,
};
use crate::config::ident::Ident;
use crate::config::sqlite_database_file;

/// How long a statement waits for another process's write lock before giving up.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// How long an operation waits for a pooled connection: longer than the servers'
/// [`DEFAULT_ACQUIRE_TIMEOUT`](crate::config::DEFAULT_ACQUIRE_TIMEOUT). The writer pool
/// has a single connection, so writes queue here; past the busy timeout of the write
/// ahead of them, plus a margin, the file counts as unavailable.
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
    let file = sqlite_database_file(url).map_err(|why| anyhow!("invalid sqlite url: {why}"))?;
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

fn has_mode(url: &str) -> bool {
    url.split_once('?')
        .is_some_and(|(_, query)| query.split('&').any(|pair| pair.starts_with("mode=")))
}

/// An outbox table in a SQLite file.
pub struct SqliteStorage {
    pools: SqlitePools,
    options: TableOptions,
    /// The table's name, checked.
    table: Ident,
    sql: Statements,
    place: Place,
}

impl fmt::Debug for SqliteStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteStorage")
            .field("file", &self.pools.file)
            .field("table", &self.sql.table.display)
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
            options: &options,
        });
        let place = Place {
            table: sql.table.display.clone(),
            file: pools.file.display().to_string(),
            busy_timeout: BUSY_TIMEOUT,
        };
        Ok(Self {
            pools,
            options,
            table,
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

    fn table_name(&self) -> &str {
        &self.sql.table.display
    }

    async fn claim(&self, request: ClaimRequest<'_>) -> StorageResult<Claimed> {
        self.claim_rows(request).await
    }

    async fn held_attempts(
        &self,
        ids: &SortedIds,
        owner: &str,
    ) -> StorageResult<Vec<(MessageId, u32)>> {
        self.held_attempts_of(ids, owner).await
    }

    async fn ack(&self, ids: &SortedIds, owner: &str) -> StorageResult<SortedIds> {
        self.ack_held(ids, owner).await
    }

    async fn nack_many(
        &self,
        nacks: &[NackRequest<'_>],
        owner: &str,
        policy: &dyn RetryPolicy,
    ) -> StorageResult<Vec<NackResult>> {
        self.nack_held(nacks, owner, policy).await
    }

    async fn release(
        &self,
        ids: &SortedIds,
        owner: &str,
        delay: Duration,
    ) -> StorageResult<SortedIds> {
        self.release_held(ids, owner, delay).await
    }

    async fn dead_letter(&self, id: MessageId, owner: &str, error: &str) -> StorageResult<bool> {
        self.dead_letter_held(id, owner, error).await
    }

    async fn extend_lease(
        &self,
        ids: &SortedIds,
        owner: &str,
        lease: Duration,
    ) -> StorageResult<Extended> {
        self.extend_held(ids, owner, lease).await
    }

    async fn return_leases(&self, ids: &SortedIds, owner: &str) -> StorageResult<u64> {
        self.return_held(ids, owner).await
    }

    async fn stats(&self) -> StorageResult<Stats> {
        self.topic_stats().await
    }

    async fn delivered_within(&self, window: Duration) -> StorageResult<Option<u64>> {
        self.delivered_count(window).await
    }

    async fn purge(&self, older_than: Duration) -> StorageResult<u64> {
        self.purge_delivered(older_than).await
    }

    fn schema_sql(&self) -> String {
        self.schema().text()
    }

    async fn ensure_table(&self) -> StorageResult<()> {
        self.create_schema().await
    }

    async fn verify_table(&self) -> StorageResult<()> {
        self.check_table().await
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

    async fn redrive_dead(
        &self,
        filter: &DeadFilter,
        limit: u32,
        delay: Duration,
    ) -> StorageResult<SortedIds> {
        self.redrive_rows(filter, limit, delay).await
    }

    async fn discard_dead(&self, filter: &DeadFilter, limit: u32) -> StorageResult<SortedIds> {
        self.discard_rows(filter, limit).await
    }

    async fn blocked_keys(
        &self,
        after_id: MessageId,
        limit: u32,
    ) -> StorageResult<Vec<BlockedKey>> {
        self.blocked_heads(after_id, limit).await
    }

    async fn lease_holders(&self) -> StorageResult<Vec<LeaseHolder>> {
        self.holders().await
    }

    async fn pauses(&self) -> StorageResult<Pauses> {
        self.read_pauses().await
    }

    async fn set_paused(&self, topics: &[String], paused: bool) -> StorageResult<Pauses> {
        self.change_pauses(topics, paused).await
    }

    async fn insert(&self, message: NewMessage) -> StorageResult<MessageId> {
        self.insert_message(message).await
    }
}

#[cfg(test)]
mod unit {
    use super::*;
    use crate::storage::sql_common::assert_names_invalid_identifier;

    #[tokio::test]
    async fn the_table_name_is_checked_and_named() {
        let options = TableOptions {
            table: "out-box".into(),
            ..Default::default()
        };
        let err = SqliteStorage::connect("sqlite://x.db", 1, options)
            .await
            .unwrap_err();
        assert_names_invalid_identifier(&err, "`table`");
    }
}
