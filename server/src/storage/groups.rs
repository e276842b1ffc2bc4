//! What subscription groups keep in the database, behind one trait, [`GroupStore`]: the
//! rules are in `docs/groups.md`, the engine that uses it in `relay::groups`.
//!
//! A group never writes to the outbox table. It reads rows in *log order*, a
//! [`Position`] that is the order in which rows became visible (PostgreSQL: the inserting
//! transaction's id, then the row id; SQLite, one writer at a time: the row id), and only
//! below the *frontier*, past which a transaction still open could commit a row that sorts
//! earlier. Keys map to partitions ([`GroupStore::read`] returns each row's); each
//! partition of a group has one owner at a time, on a lease with a fencing epoch, and a
//! position: every row of the partition up to it is settled for the group. Rows that need
//! more than a position (a retry pending, a row held behind its key's failed one, a dead
//! row) get a [`StateRow`] in a table of the relay's.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::blocked::BlockedKey;
use super::{MessageId, OutboxMessage, StorageResult};
use crate::config::GroupStart;

mod calls;
pub(super) mod sql;

pub(crate) use calls::group_store_calls;

/// Where a row sits in the log: rows are delivered in this order, per partition.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Position {
    /// The inserting transaction (PostgreSQL's `xid8`); 0 where commit order is id order.
    pub txid: i64,
    pub id: MessageId,
}

impl Position {
    pub const START: Position = Position { txid: 0, id: 0 };
}

/// A row read for a group, with the partition its key maps to.
#[derive(Debug, Clone)]
pub struct GroupRow {
    pub message: OutboxMessage,
    pub partition: u32,
    pub position: Position,
}

/// A partition as the table of partitions has it.
#[derive(Debug, Clone, PartialEq)]
pub struct PartitionView {
    pub partition: u32,
    pub owner: Option<String>,
    pub epoch: i64,
    /// The owner's lease ran out: anyone may take the partition.
    pub expired: bool,
    pub position: Position,
}

/// A partition taken by a member: the epoch that fences its writes, and where it resumes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PartitionLease {
    pub partition: u32,
    pub epoch: i64,
    pub position: Position,
}

/// What a heartbeat learnt: the group's live members (sorted), and the partitions the
/// member still owns (its lease renewed), with the table's view of all of them.
#[derive(Debug, Clone, Default)]
pub struct Heartbeat {
    pub members: Vec<String>,
    pub partitions: Vec<PartitionView>,
}

/// Why a row of a group is not simply behind its partition's position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateKind {
    /// Failed or given back; delivered again at `due_at`.
    Retry,
    /// Behind an earlier row of its key that has not succeeded yet.
    Held,
    /// Dead-lettered for this group.
    Dead,
}

impl StateKind {
    pub fn as_str(self) -> &'static str {
        match self {
            StateKind::Retry => "retry",
            StateKind::Held => "held",
            StateKind::Dead => "dead",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "retry" => Some(StateKind::Retry),
            "held" => Some(StateKind::Held),
            "dead" => Some(StateKind::Dead),
            _ => None,
        }
    }
}

/// A row of a group that needs more than its partition's position.
#[derive(Debug, Clone, PartialEq)]
pub struct StateRow {
    pub id: MessageId,
    pub partition: u32,
    pub key: Option<String>,
    pub position: Position,
    pub kind: StateKind,
    /// Deliveries so far.
    pub attempts: u32,
    pub due_at: DateTime<Utc>,
    pub error: Option<String>,
}

/// One partition's writes of a flush, applied only while the member still owns the
/// partition at `epoch`.
#[derive(Debug, Clone, Default)]
pub struct Flush {
    pub partition: u32,
    pub epoch: i64,
    /// The new position, when it moved.
    pub position: Option<Position>,
    pub upserts: Vec<StateRow>,
    pub deletes: Vec<MessageId>,
}

/// Rows read for some partitions.
#[derive(Debug, Clone, Default)]
pub struct Read {
    /// In log order per partition.
    pub rows: Vec<GroupRow>,
    /// Per partition read, how far the read looked: every row of the partition up to it
    /// that is visible now is in `rows`.
    pub scanned: BTreeMap<u32, Position>,
    /// Partitions with more rows past what `rows` holds.
    pub more: Vec<u32>,
}

/// Where a seek moves a group.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SeekTarget {
    /// The oldest row the table holds: everything is delivered again.
    Oldest,
    /// Rows from this id on (log order) are delivered again; earlier ones are skipped.
    Id(MessageId),
    /// Rows created at or after this time are delivered again.
    Time(DateTime<Utc>),
    /// Everything committed so far is skipped.
    Now,
}

/// What a seek did, or would do.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SeekOutcome {
    /// Rows the group will (re)deliver from the new positions.
    pub rows_ahead: u64,
    /// Partitions moved.
    pub partitions: u32,
}

/// Figures of one group.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GroupStats {
    pub group: String,
    /// Visible rows past the group's positions.
    pub lag_rows: u64,
    /// Age of the oldest of them.
    pub lag: Option<Duration>,
    pub retrying: u64,
    pub held: u64,
    pub dead: u64,
    /// Keys held back by a failed row (a retry pending, or a dead row that holds its key):
    /// those [`GroupStore::blocked_keys`] lists.
    pub held_keys: u64,
    pub partitions: Vec<PartitionView>,
    pub members: u64,
}

/// A dead row of a group, with the message.
#[derive(Debug, Clone)]
pub struct GroupDead {
    pub message: OutboxMessage,
    pub error: Option<String>,
    pub dead_at: DateTime<Utc>,
}

/// The groups of one outbox as configured, each with where it starts once created, and
/// the partitions every one of them has.
#[derive(Debug, Clone, Copy)]
pub struct OutboxGroups<'a> {
    pub groups: &'a [(String, GroupStart)],
    pub partitions: u32,
}

/// A member of a group: who owns partitions, and whose writes their epochs fence.
#[derive(Debug, Clone, Copy)]
pub struct Member<'a> {
    pub group: &'a str,
    pub id: &'a str,
}

/// A member's lease: renewed by its heartbeats, and what it takes partitions on.
#[derive(Debug, Clone, Copy)]
pub struct Lease<'a> {
    pub member: Member<'a>,
    pub duration: Duration,
}

/// A group with its `dead_letter_holds_key`, which together say which failed rows hold
/// their keys (what [`GroupStats::held_keys`] counts and [`GroupStore::blocked_keys`] lists).
#[derive(Debug, Clone, Copy)]
pub struct Holds<'a> {
    pub group: &'a str,
    pub dead_holds_key: bool,
}

/// A page of rows in id order: those above `after_id`, at most `limit`.
#[derive(Debug, Clone, Copy)]
pub struct Page {
    pub after_id: MessageId,
    pub limit: u32,
}

/// Dead rows of a group an operator acts on: these `ids`, or all with `ids` empty, at most
/// `limit`.
#[derive(Debug, Clone, Copy)]
pub struct DeadRows<'a> {
    pub group: &'a str,
    pub ids: &'a [MessageId],
    pub limit: u32,
}

/// What an operator does to dead rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadChange {
    /// Made due now, as retries.
    Redrive,
    /// Dropped for good.
    Discard,
}

/// The group tables of one outbox table.
#[async_trait]
pub trait GroupStore: Send + Sync + 'static {
    /// The DDL of the groups (log-order column and index, the relay's tables).
    fn schema_sql(&self) -> String;

    /// Runs [`GroupStore::schema_sql`] (`create`), or checks it ran, and registers the
    /// groups: a new group's partitions start at `start`. Refuses a partition count other
    /// than the one the outbox's groups were created with.
    async fn ensure(
        &self,
        groups: &[(String, GroupStart)],
        partitions: u32,
        create: bool,
    ) -> StorageResult<()>;

    /// Marks `member` alive for `lease`, renews the leases of the partitions it owns, and
    /// says who is alive and who owns what.
    async fn heartbeat(
        &self,
        group: &str,
        member: &str,
        lease: Duration,
    ) -> StorageResult<Heartbeat>;

    /// Takes `partition` for `member` if nobody owns it or its owner's lease ran out.
    async fn acquire(
        &self,
        group: &str,
        member: &str,
        partition: u32,
        lease: Duration,
    ) -> StorageResult<Option<PartitionLease>>;

    /// Gives up the partitions a member owns (all of them with `partitions` empty).
    async fn release(&self, group: &str, member: &str, partitions: &[u32]) -> StorageResult<()>;

    /// The member is gone: its partitions are free at once.
    async fn leave(&self, group: &str, member: &str) -> StorageResult<()>;

    /// Applies the writes of each partition `member` still owns at its epoch, in one
    /// transaction; returns the partitions it no longer owns (nothing applied for them).
    async fn flush(&self, group: &str, member: &str, flushes: &[Flush]) -> StorageResult<Vec<u32>>;

    /// Rows past each cursor, below the frontier, about `limit` per partition: PostgreSQL
    /// reads up to `limit` of each; SQLite walks the id range once, up to `limit` times the
    /// partitions asked in all, which one busy partition may take most of. [`Read`] says
    /// how far each partition was read and which may have more.
    async fn read(&self, cursors: &[(u32, Position)], limit: u32) -> StorageResult<Read>;

    /// The state rows of a partition.
    async fn load_state(&self, group: &str, partition: u32) -> StorageResult<Vec<StateRow>>;

    /// The rows of these ids (those the table still holds), for state rows due.
    async fn fetch(&self, ids: &[MessageId]) -> StorageResult<Vec<GroupRow>>;

    /// Moves every partition of `group` to `target`, takes them from their owners (a new
    /// epoch: an owner's later writes are fenced) and drops the group's retry and held
    /// rows; with `dry_run`, only counts.
    async fn seek(
        &self,
        group: &str,
        target: SeekTarget,
        dry_run: bool,
    ) -> StorageResult<SeekOutcome>;

    /// Deletes rows older than `retention` that every group has passed, in batches.
    async fn purge(&self, retention: Duration) -> StorageResult<u64>;

    /// `dead_holds_key`: the group's `dead_letter_holds_key`, for `held_keys`.
    async fn stats(&self, group: &str, dead_holds_key: bool) -> StorageResult<GroupStats>;

    /// The keys of `group` a failed row holds back, one per key, by head id above
    /// `after_id`: the key's first row waiting for its retry, or else (with
    /// `dead_holds_key`) its first dead row with rows of the key held behind it.
    async fn blocked_keys(
        &self,
        group: &str,
        dead_holds_key: bool,
        after_id: MessageId,
        limit: u32,
    ) -> StorageResult<Vec<BlockedKey>>;

    /// The groups an operator paused, by name, with when.
    async fn paused(&self) -> StorageResult<BTreeMap<String, DateTime<Utc>>>;

    /// Pauses (or resumes) `group` on every replica; returns [`GroupStore::paused`] after.
    async fn set_paused(
        &self,
        group: &str,
        paused: bool,
    ) -> StorageResult<BTreeMap<String, DateTime<Utc>>>;

    /// How long the oldest transaction still open that wrote something has been open:
    /// rows committed after it started wait for it (zero where nothing waits).
    async fn frontier_delay(&self) -> StorageResult<Duration>;

    async fn list_dead(
        &self,
        group: &str,
        after_id: MessageId,
        limit: u32,
    ) -> StorageResult<Vec<GroupDead>>;

    /// Re-drives or discards dead rows; returns their ids. The partitions they are in are
    /// taken from their owners, which reload their state when they take them again: the
    /// state an owner keeps in memory must not outlive the change.
    async fn change_dead(
        &self,
        rows: DeadRows<'_>,
        change: DeadChange,
    ) -> StorageResult<Vec<MessageId>>;

    /// Dead rows of `group` (these ids, or all with `ids` empty, up to `limit`) made due
    /// now, as retries; returns their ids.
    async fn redrive_dead(
        &self,
        group: &str,
        ids: &[MessageId],
        limit: u32,
    ) -> StorageResult<Vec<MessageId>> {
        self.change_dead(DeadRows { group, ids, limit }, DeadChange::Redrive)
            .await
    }

    /// Dead rows of `group` dropped for good; returns their ids.
    async fn discard_dead(
        &self,
        group: &str,
        ids: &[MessageId],
        limit: u32,
    ) -> StorageResult<Vec<MessageId>> {
        self.change_dead(DeadRows { group, ids, limit }, DeadChange::Discard)
            .await
    }
}

/// The partition of a key for backends that compute it in Rust (FNV-1a), keyless rows by
/// id so they spread over all partitions.
pub fn partition_of(key: Option<&str>, id: MessageId, partitions: u32) -> u32 {
    let hash = match key {
        Some(key) => fnv1a(key.as_bytes()),
        None => fnv1a(&id.to_le_bytes()),
    };
    (hash % u64::from(partitions.max(1))) as u32
}

fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in bytes {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_always_maps_to_one_partition_within_range() {
        for partitions in [1, 2, 16, 1024] {
            let first = partition_of(Some("order-42"), 1, partitions);
            assert_eq!(partition_of(Some("order-42"), 99, partitions), first);
            assert!(first < partitions);
        }
    }

    #[test]
    fn keyless_rows_spread_over_partitions() {
        let used: std::collections::BTreeSet<u32> =
            (0..1000).map(|id| partition_of(None, id, 16)).collect();
        assert_eq!(used.len(), 16);
    }

    #[test]
    fn positions_sort_by_transaction_then_id() {
        let a = Position { txid: 5, id: 9 };
        let b = Position { txid: 6, id: 2 };
        assert!(a < b);
        assert!(Position::START < a);
    }
}
