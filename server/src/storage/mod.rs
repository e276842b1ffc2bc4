//! Where outbox rows live. One trait, [`Storage`], one module per backend.
//!
//! The trait has the five calls of any outbox relay (claim, ack, nack, release,
//! dead-letter) plus what a server needs: lease extension, giving back the leases of a
//! lost subscriber, stats, purge, the DDL ([`Storage::ensure_table`]) and a check of the
//! live table that changes nothing ([`Storage::verify_table`]), an insert for tests and
//! demos, and insert wake-ups; and an operator's calls: dead letters listed, counted,
//! re-driven and discarded ([`dead`]), blocked keys ([`blocked`]), the outbox's pause,
//! rows delivered lately. Every write-back is fenced: it only touches rows currently leased
//! by the given owner, and reports which ids it applied to so callers can count the rest
//! as fenced. Write-backs take and return [`SortedIds`]: in id order, each once, sorted
//! once by the relay rather than by every backend.
//!
//! All times that matter for leases and retries are taken from the database clock, so
//! several servers (and a skewed application clock) agree on when a lease runs out.
//!
//! # Files
//!
//! Every backend folder (`postgres/`, `mysql/`, `sqlite/`) has the same files, each with
//! the same part of the work, so a difference between backends is plain to see:
//! - `mod.rs`: the backend's storage type, its pools and settings, and its [`Storage`]
//!   impl, each method a call into the file that does the work;
//! - `shape.rs`: the table's shape and names (the table, the objects named after it, the
//!   columns as the backend's SQL writes them) and the SQL every part writes alike (a row
//!   read as a message);
//! - `schema.rs`: the DDL ([`Storage::ensure_table`], [`Storage::schema_sql`]) and the
//!   check of a live table ([`Storage::verify_table`]);
//! - `claim.rs`: the claim;
//! - `strict.rs`: strict per-key ordering: PostgreSQL's key-heads table and claim
//!   function, MariaDB's check of a claim's rows against earlier rows of their key, SQLite's
//!   filter of a claim's candidates;
//! - `answers.rs`: what a lease holder answers: ack, nack, release, dead-letter, lease
//!   extension, leases given back;
//! - `admin.rs`: an operator's calls (stats, purge, dead letters, blocked keys, lease
//!   holders, pauses) and the insert of tests and demos;
//! - `convert.rs`: driver errors classified, rows decoded (and the pool every part runs
//!   on, where a part holds one).
//!
//! Besides these, PostgreSQL has `listen.rs` (insert wake-ups through LISTEN/NOTIFY, which
//! only it has) and `floor.rs` (where its non-strict claims start: the `FOR UPDATE SKIP
//! LOCKED` scan of a table whose low ids are leased needs it, the others' claims do not).
//! A backend's own tests are in its `tests` module (MariaDB's: `tests/`, with what its
//! locking reads keep locked on a real server). `groups.rs` (here and in `postgres/`,
//! `sqlite/`, those two with a `groups/` folder of their parts) holds the subscription
//! groups' tables.
//!
//! What is the same for every backend is written once here: the trait's types, the
//! dead-letter selector ([`dead`]), blocked keys ([`blocked`]), pauses ([`pauses`]), a
//! batch of nacks planned ([`nack`]), row values ([`rows`]), the columns (validated in
//! [`crate::config::columns`]) checked against a live table and an insert shaped for them
//! ([`columns`]), and named in SQL ([`names`]); and [`timed`], which wraps every backend:
//! the deadline of each call and its tracing span, written as one table of the trait's
//! calls. What MySQL and SQLite write and run alike (their placeholders and stored times
//! aside) is in [`sql_common`], generic over [`sqlx::Database`] where it runs; the two
//! group stores' alike in `groups/sql.rs`.
//!
//! Statements are templates written with the columns' roles (`{status}`, `{leased_by}`)
//! and filled by [`names::Names::fill`] with the table's names for them: a mapped table's
//! statements read as the relay's own, and a statement names only what it uses.

pub mod blocked;
pub mod columns;
pub mod dead;
#[cfg(test)]
pub(crate) mod fake;
pub mod groups;
pub mod ids;
pub mod inserts;
pub mod mysql;
pub mod nack;
pub mod names;
pub mod options;
pub mod pauses;
pub mod postgres;
pub mod rows;
pub mod sql_common;
pub mod sqlite;
pub mod timed;

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use tokio::sync::watch;

pub use self::blocked::{BlockedKey, HeadState};
pub use self::dead::{DeadCount, DeadFilter, DeadLetter};
pub use self::ids::SortedIds;
pub use self::inserts::Inserts;
pub use self::nack::{NackRequest, NackResult};
pub use self::options::TableOptions;
pub use self::pauses::{Pauses, TopicClause, TopicFilter};

/// Identifier of an outbox row. Insertion order is id order.
pub type MessageId = i64;

/// Rows deleted per statement by `purge`, so it never holds a long transaction (or, on
/// SQLite, the file's write lock) for long.
pub const PURGE_BATCH: i64 = 10_000;

/// Longest key, in characters, that every backend's own table holds and indexes: MySQL's
/// `VARCHAR(255)`, and well within a PostgreSQL btree entry (2,704 bytes, with the id);
/// the PostgreSQL and SQLite tables check it (`CHECK`), so producers meet it too.
pub const MAX_KEY_CHARS: usize = 255;

/// Longest topic, in characters: what every backend's own table holds and indexes, as
/// for keys; the relay refuses a longer one before any SQL.
pub const MAX_TOPIC_CHARS: usize = 255;

/// One row handed to a publisher.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxMessage {
    pub id: MessageId,
    pub topic: String,
    pub key: Option<String>,
    pub payload: Vec<u8>,
    pub headers: BTreeMap<String, String>,
    /// Claims so far, including the current one.
    pub attempts: u32,
    pub created_at: DateTime<Utc>,
    /// The row's stored size (payload, headers, topic and key), when it is larger than the
    /// table's [`TableOptions::max_row_bytes`]: the database did not send its payload
    /// and headers (empty here), since no response could hold them.
    pub too_large: Option<u64>,
}

/// A row to insert (tests, demos, the CLI; producers insert in their own transaction).
#[derive(Debug, Clone, Default)]
pub struct NewMessage {
    pub topic: String,
    pub key: Option<String>,
    pub payload: Vec<u8>,
    pub headers: BTreeMap<String, String>,
}

impl NewMessage {
    pub fn new(topic: impl Into<String>, payload: impl Into<Vec<u8>>) -> Self {
        Self {
            topic: topic.into(),
            payload: payload.into(),
            ..Self::default()
        }
    }

    pub fn with_key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }
}

/// What to claim, and for whom.
#[derive(Debug, Clone, Copy)]
pub struct ClaimRequest<'a> {
    /// Lease owner: a stream's unique owner id, or a unary caller's worker id.
    pub owner: &'a str,
    pub batch_size: u32,
    pub lease: Duration,
    /// Only these topics; empty means every topic.
    pub topics: &'a [String],
    /// Not these topics (an operator paused them), when `topics` is empty: the relay
    /// takes paused topics out of a filter itself. See [`TopicFilter::of`].
    pub paused_topics: &'a [String],
    /// A due row already claimed this many times (never answered: its holders died or
    /// let the lease run out) is dead-lettered by the claim instead of handed out again.
    pub max_attempts: u32,
}

/// The keys of the rows a claimer holds, each with the last id of it it knows it holds,
/// side by side: what [`Storage::claim_ahead`] may go on past.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HeldKeys {
    pub keys: Vec<String>,
    pub last_ids: Vec<MessageId>,
}

/// Messages claimed, in id order, all leased until `lease_expires_at`.
#[derive(Debug, Clone)]
pub struct Claimed {
    pub messages: Vec<OutboxMessage>,
    pub lease_expires_at: DateTime<Utc>,
    /// Rows the claim dead-lettered instead: claimed `max_attempts` times already.
    pub exhausted: Vec<MessageId>,
}

/// What the retry policy decided for a failed message, given its attempts so far.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FailureDecision {
    RetryAfter(Duration),
    DeadLetter,
}

/// The outbox's retry policy, consulted by [`Storage::nack`] inside its transaction, once
/// the row's attempts are known.
pub trait RetryPolicy: Send + Sync {
    fn on_failure(&self, attempts: u32, requested_delay: Option<Duration>) -> FailureDecision;
}

/// Rows whose lease was extended, and until when.
#[derive(Debug, Clone, PartialEq)]
pub struct Extended {
    pub ids: SortedIds,
    pub lease_expires_at: DateTime<Utc>,
}

/// Counts of one topic, or of the whole outbox (`topic` empty).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TopicStats {
    pub topic: String,
    pub pending: u64,
    pub leased: u64,
    /// Pending rows nobody holds that are not due yet: waiting for a retry after a nack,
    /// the delay of a release, or the outbox's visibility delay.
    pub waiting: u64,
    pub dead: u64,
    pub oldest_pending_age: Option<Duration>,
}

/// An owner holding leases now (see [`Storage::lease_holders`]).
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseHolder {
    /// A stream's owner id (`subscriber:uuid`) or a unary worker id.
    pub owner: String,
    /// Pending rows it holds with a lease that has not run out.
    pub rows: u64,
    /// When the first of its leases runs out.
    pub earliest_expiry: DateTime<Utc>,
}

impl LeaseHolder {
    /// The holders a backend's `lease_holders` statement returned, as
    /// `(owner, rows, earliest_expiry)`.
    pub fn from_rows(rows: Vec<(String, i64, DateTime<Utc>)>) -> Vec<Self> {
        rows.into_iter()
            .map(|(owner, rows, earliest_expiry)| Self {
                owner,
                rows: rows::count(rows),
                earliest_expiry,
            })
            .collect()
    }
}

/// Most owners [`Storage::lease_holders`] returns (the most rows first).
pub const MAX_LEASE_HOLDERS: i64 = 1000;

/// Dead rows by topic and error (see [`Storage::count_dead`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeadCounts {
    pub groups: Vec<DeadCount>,
    /// Every selected dead row, also those of groups past the limit.
    pub total: u64,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stats {
    pub total: TopicStats,
    pub topics: Vec<TopicStats>,
}

impl Stats {
    /// The per-topic counts and their total.
    pub fn from_topics(topics: Vec<TopicStats>) -> Self {
        let total = topics
            .iter()
            .fold(TopicStats::default(), |total, topic| TopicStats {
                topic: String::new(),
                pending: total.pending + topic.pending,
                leased: total.leased + topic.leased,
                waiting: total.waiting + topic.waiting,
                dead: total.dead + topic.dead,
                oldest_pending_age: total.oldest_pending_age.max(topic.oldest_pending_age),
            });
        Self { total, topics }
    }
}

/// Errors of the storage layer. Backends translate driver errors into these by kind, so
/// the layers above can tell "the database is down" from "the table is missing".
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("database unreachable: {0}")]
    Unavailable(String),
    /// The database answers but refuses every write (a read-only SQLite file): it will
    /// not heal by retrying, an operator must make it writable.
    #[error("{0}")]
    ReadOnly(String),
    #[error("outbox table {table} does not exist; create it with `txoutboxd schema <outbox>` or set create_schema = true")]
    MissingTable { table: String },
    /// The table exists but lacks columns the mapping names, or has them with types the
    /// relay cannot use; every problem at once.
    #[error("outbox table {table} does not fit its columns (fix the table or [outboxes.NAME.columns]):\n  - {}", problems.join("\n  - "))]
    MismatchedTable {
        table: String,
        problems: Vec<String>,
    },
    /// A message the table cannot hold as given (for example headers on a table without
    /// a headers column, or a non-JSON payload for a JSON column); nothing was written.
    #[error("{0}")]
    InvalidMessage(String),
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

pub type StorageResult<T> = Result<T, StorageError>;

impl StorageError {
    /// Ok when a table check found no `problems`, [`StorageError::MismatchedTable`] else.
    pub fn unless_problems(table: &str, problems: Vec<String>) -> StorageResult<()> {
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Self::MismatchedTable {
                table: table.to_owned(),
                problems,
            })
        }
    }
}

/// Runs `batch` (which deletes at most [`PURGE_BATCH`] rows and says how many it did)
/// until one deletes fewer, and returns the total: no purge holds one long transaction.
pub async fn in_batches<F, Fut>(mut batch: F) -> StorageResult<u64>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = StorageResult<u64>>,
{
    let mut total = 0;
    loop {
        let deleted = batch().await?;
        total += deleted;
        if deleted < PURGE_BATCH as u64 {
            return Ok(total);
        }
    }
}

/// An outbox table in some database. Implementations are cheap to share (`Arc`).
#[async_trait]
pub trait Storage: Send + Sync + 'static {
    /// Backend name for admin output, for example `postgres`.
    fn backend(&self) -> &'static str;

    /// The table as messages and spans name it (`schema.table` where a schema is set).
    fn table_name(&self) -> &str;

    /// Due, unleased, pending rows in id order, leased to `owner`, attempts counted.
    async fn claim(&self, request: ClaimRequest<'_>) -> StorageResult<Claimed>;

    /// [`Self::claim`], and with strict ordering a key of `held` whose first pending rows
    /// `owner` itself holds (leases not run out, ids up to the one `held` gives) may go on
    /// with the rows after them: what a stream that sends a key's later rows only once its
    /// earlier ones are acked may claim ahead (see `relay/subscription/parked.rs`), so a
    /// hot key has two batches in flight. Rows are still handed out in id order, and never
    /// past a row of the key another owner holds, one that waits for its retry, or one of
    /// the owner's own that `held` does not cover. A backend that does not follow its
    /// owner's leases claims as [`Self::claim`] does (MariaDB, SQLite: the default here);
    /// PostgreSQL follows them, except under `dead_letter_holds_key`.
    async fn claim_ahead(
        &self,
        request: ClaimRequest<'_>,
        held: &HeldKeys,
    ) -> StorageResult<Claimed> {
        let _ = held;
        self.claim(request).await
    }

    /// `(id, attempts)` of the rows among `ids` that `owner` holds (pending, leased by it,
    /// whether or not the lease ran out), in id order: what an answer with lease tokens
    /// checks its tokens' attempts against (docs/lease-tokens.md).
    async fn held_attempts(
        &self,
        ids: &SortedIds,
        owner: &str,
    ) -> StorageResult<Vec<(MessageId, u32)>>;

    /// Marks delivered (or deletes) the rows `owner` holds; returns the ids applied.
    async fn ack(&self, ids: &SortedIds, owner: &str) -> StorageResult<SortedIds>;

    /// Applies `nacks` in order, one outcome each, in the same order: records the error
    /// and schedules a retry or dead-letters, per `policy`, and gives back untried the
    /// later rows of the key that `owner` holds, with the same time. A nack needs a live
    /// lease (see docs/guarantees.md); a nack of a row an earlier nack of the batch gave
    /// back finds it no longer held: [`NackResult::Fenced`], as if sent one by one.
    async fn nack_many(
        &self,
        nacks: &[NackRequest<'_>],
        owner: &str,
        policy: &dyn RetryPolicy,
    ) -> StorageResult<Vec<NackResult>>;

    /// [`Storage::nack_many`] of one nack.
    async fn nack(
        &self,
        id: MessageId,
        owner: &str,
        error: &str,
        requested_delay: Option<Duration>,
        policy: &dyn RetryPolicy,
    ) -> StorageResult<NackResult> {
        let nack = NackRequest {
            id,
            error,
            requested_delay,
        };
        let mut results = self.nack_many(&[nack], owner, policy).await?;
        Ok(results.pop().unwrap_or(NackResult::Fenced))
    }

    /// Gives rows back untried: attempt refunded, no error, claimable after `delay`.
    async fn release(
        &self,
        ids: &SortedIds,
        owner: &str,
        delay: Duration,
    ) -> StorageResult<SortedIds>;

    /// Parks a row for good; false when `owner` does not hold it.
    async fn dead_letter(&self, id: MessageId, owner: &str, error: &str) -> StorageResult<bool>;

    /// Extends the lease of the rows `owner` holds to `lease` from now.
    async fn extend_lease(
        &self,
        ids: &SortedIds,
        owner: &str,
        lease: Duration,
    ) -> StorageResult<Extended>;

    /// Leases of a subscriber that went away: claimable again now, attempts kept (the
    /// messages may have been published). Returns how many rows were given back.
    async fn return_leases(&self, ids: &SortedIds, owner: &str) -> StorageResult<u64>;

    async fn stats(&self) -> StorageResult<Stats>;

    /// Rows delivered within the last `window`, every replica's; `None` when the table
    /// keeps no delivered rows (`delete_on_ack`).
    async fn delivered_within(&self, window: Duration) -> StorageResult<Option<u64>>;

    /// Deletes delivered rows whose delivery is older than `older_than`.
    async fn purge(&self, older_than: Duration) -> StorageResult<u64>;

    /// The DDL of the outbox table (and its triggers), for a migration tool.
    fn schema_sql(&self) -> String;

    /// Makes the table what [`Storage::schema_sql`] describes: creates what is missing
    /// and adds what a mapped table lacks (DDL, possibly `ALTER TABLE`); idempotent. Run
    /// at start and when a check found the table missing, never as a check.
    async fn ensure_table(&self) -> StorageResult<()>;

    /// Checks, changing nothing, that the database answers, the table exists and its
    /// columns (types, defaults, what the backend needs besides: indexes, functions) are
    /// what the outbox's [`Columns`](crate::config::columns::Columns) need
    /// ([`StorageError::MismatchedTable`] otherwise).
    async fn verify_table(&self) -> StorageResult<()>;

    /// Dead rows that `filter` selects with an id above `after_id`, in id order, at most
    /// `limit` (at most [`dead::MAX_PER_CALL`]).
    async fn list_dead(
        &self,
        filter: &DeadFilter,
        after_id: MessageId,
        limit: u32,
    ) -> StorageResult<Vec<DeadLetter>>;

    /// The dead rows `filter` selects, by topic and error, largest groups first (at most
    /// [`dead::MAX_COUNT_GROUPS`]), and their total.
    async fn count_dead(&self, filter: &DeadFilter) -> StorageResult<DeadCounts>;

    /// Makes the first `limit` dead rows that `filter` selects (lowest ids first) pending
    /// again: attempts reset, claimable after `delay`, their error kept. Returns their
    /// ids, in id order; rows no longer dead are left alone (a repeat is harmless).
    async fn redrive_dead(
        &self,
        filter: &DeadFilter,
        limit: u32,
        delay: Duration,
    ) -> StorageResult<SortedIds>;

    /// Deletes the first `limit` dead rows that `filter` selects; returns their ids.
    async fn discard_dead(&self, filter: &DeadFilter, limit: u32) -> StorageResult<SortedIds>;

    /// Keys whose head is leased or waiting for a retry (or, under
    /// `dead_letter_holds_key`, dead), oldest head first, heads with an id above
    /// `after_id`, at most `limit` (see [`blocked`] for the cost).
    async fn blocked_keys(&self, after_id: MessageId, limit: u32)
        -> StorageResult<Vec<BlockedKey>>;

    /// The owners holding leases now, on every replica sharing the table: the most rows
    /// first, at most [`MAX_LEASE_HOLDERS`]. One statement that groups the pending rows
    /// leased now (a pass over the pending rows, like `stats`).
    async fn lease_holders(&self) -> StorageResult<Vec<LeaseHolder>>;

    /// What is paused, and since when: the whole outbox, topics (see [`pauses`]).
    async fn pauses(&self) -> StorageResult<Pauses>;

    /// Pauses (`true`) or resumes `topics`, or the whole outbox when `topics` is empty;
    /// idempotent (a second pause keeps the first time). Returns the state after the
    /// call, as [`Storage::pauses`].
    async fn set_paused(&self, topics: &[String], paused: bool) -> StorageResult<Pauses>;

    /// Inserts one row outside any caller transaction (tests and demos only).
    async fn insert(&self, message: NewMessage) -> StorageResult<MessageId>;

    /// A signal that changes whenever a row was inserted, if the backend can tell
    /// (PostgreSQL LISTEN/NOTIFY), with the topics inserted when it knows them (see
    /// [`Inserts`]). `None`: callers poll.
    ///
    /// Treat a change that [`Inserts::since`] says concerns a filter as "claim now", and
    /// keep polling slowly as well: the signal also moves, for every topic, when inserts
    /// may have been missed (after the backend's listener connected or reconnected), and
    /// wake-ups are lost while it is disconnected. With a visibility delay, a wake-up comes
    /// once the inserted rows are claimable, not at insert time.
    fn insert_signal(&self) -> Option<watch::Receiver<Inserts>> {
        None
    }
}
