//! What the two SQL group stores (PostgreSQL, SQLite) share, written once over
//! [`sqlx::Database`]: the decoding of their rows and the statements that read the same on
//! both. A backend says only how it stores what differs ([`GroupDb`]: times, its small
//! integers, a state row's place in its log order); statements use `$n` placeholders,
//! which SQLite takes as it takes `?n`.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sqlx::{ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Row, Type};

use super::{GroupStats, Holds, Member, Page, Position, StateKind, StateRow};
use crate::storage::rows::count;
use crate::storage::{BlockedKey, HeadState, StorageError};

/// The row counts of a group's state table that [`GroupStats`] reports, by kind; read by
/// [`GroupDb::state_counts`].
pub(crate) struct StateCounts {
    retrying: i64,
    held: i64,
    dead: i64,
    held_keys: i64,
}

/// The counts of the state rows; the rest of the stats is the backend's.
impl From<StateCounts> for GroupStats {
    fn from(counts: StateCounts) -> Self {
        GroupStats {
            retrying: count(counts.retrying),
            held: count(counts.held),
            dead: count(counts.dead),
            held_keys: count(counts.held_keys),
            ..GroupStats::default()
        }
    }
}

/// The error of a call about a group that has no rows yet.
pub(crate) fn unknown_group(group: &str) -> StorageError {
    StorageError::InvalidMessage(format!(
        "group {group} has no partitions yet: start the server with it configured first"
    ))
}

/// The error of a start without `create_schema` on a table whose groups' `objects` (what
/// the backend's schema adds) were never created.
pub(crate) fn groups_missing(table: &str, objects: &str) -> StorageError {
    StorageError::MismatchedTable {
        table: table.to_owned(),
        problems: vec![format!(
            "the subscription groups' {objects} are missing: run the output of `txoutboxd \
             schema` or set create_schema = true"
        )],
    }
}

/// The error of a seek to an id the table does not hold: no place in the log to move to,
/// and a guess past the last row would skip the rows inserted until the ids reach it.
pub(crate) fn no_row_to_seek(id: i64) -> StorageError {
    StorageError::InvalidMessage(format!(
        "seek to id {id}: the table holds no row with that id (purged, or never inserted); \
         seek to a time or to the oldest row instead"
    ))
}

/// The error of a start whose partition count is not the one `group` was created with.
pub(crate) fn partitions_changed(
    table: &str,
    group: &str,
    was: i64,
    partitions: u32,
) -> StorageError {
    StorageError::MismatchedTable {
        table: table.to_owned(),
        problems: vec![format!(
            "group {group} was created with partitions = {was}, the outbox now says \
             {partitions}: the partitions of an outbox's groups cannot change; set \
             partitions = {was} back"
        )],
    }
}

/// A SQL backend of the group stores. The bounds are what the shared code asks of sqlx;
/// the required items, what the backends store differently.
pub(crate) trait GroupDb: Database
where
    for<'c> &'c mut Self::Connection: Executor<'c, Database = Self>,
    for<'q> Self::Arguments<'q>: IntoArguments<'q, Self>,
    for<'r> &'r str: ColumnIndex<Self::Row> + Encode<'r, Self> + Type<Self>,
    for<'r> String: Decode<'r, Self> + Type<Self>,
    for<'r> i64: Decode<'r, Self> + Encode<'r, Self> + Type<Self>,
    for<'r> bool: Encode<'r, Self> + Type<Self>,
{
    /// The relay's small integers (partitions, attempts): PostgreSQL's `INT4`, SQLite's
    /// `INTEGER`.
    type Int4: for<'r> Decode<'r, Self>
        + for<'q> Encode<'q, Self>
        + Type<Self>
        + Into<i64>
        + Send
        + 'static;

    /// A partition number or count as the backend binds it.
    fn int4(value: u32) -> Self::Int4;

    /// A time column: PostgreSQL's `TIMESTAMPTZ`, SQLite's epoch milliseconds.
    fn time(row: &Self::Row, column: &str) -> Result<DateTime<Utc>, sqlx::Error>;

    /// Where a state row sits in log order (SQLite's is its id alone).
    fn state_position(row: &Self::Row) -> Result<Position, sqlx::Error>;

    /// An integer column of [`GroupDb::Int4`] as an `i64`.
    fn get_int4(row: &Self::Row, column: &str) -> Result<i64, sqlx::Error> {
        Ok(row.try_get::<Self::Int4, _>(column)?.into())
    }

    /// A row of the group messages table (`id, partition, key, kind, attempts, due_at,
    /// error` and the backend's position columns).
    fn decode_state(row: &Self::Row) -> Result<StateRow, sqlx::Error> {
        let kind: String = row.try_get("kind")?;
        Ok(StateRow {
            id: row.try_get("id")?,
            partition: Self::get_int4(row, "partition")? as u32,
            key: row.try_get("key")?,
            position: Self::state_position(row)?,
            kind: StateKind::parse(&kind).unwrap_or(StateKind::Retry),
            attempts: Self::get_int4(row, "attempts")?.max(0) as u32,
            due_at: Self::time(row, "due_at")?,
            error: row.try_get("error")?,
        })
    }

    /// The state rows of a partition, by `statement` (the backend's order) of `$1` the
    /// group and `$2` the partition.
    async fn load_state<'e>(
        executor: impl Executor<'e, Database = Self>,
        statement: &str,
        group: &str,
        partition: u32,
    ) -> Result<Vec<StateRow>, sqlx::Error> {
        sqlx::query(statement)
            .bind(group)
            .bind(Self::int4(partition))
            .fetch_all(executor)
            .await?
            .iter()
            .map(Self::decode_state)
            .collect()
    }

    /// The blocked keys `statement` lists, of `$1` the group, `$2` its
    /// `dead_letter_holds_key`, above id `$3`, at most `$4`.
    async fn blocked_keys<'e>(
        executor: impl Executor<'e, Database = Self>,
        statement: &str,
        holds: Holds<'_>,
        page: Page,
    ) -> Result<Vec<BlockedKey>, sqlx::Error> {
        sqlx::query(statement)
            .bind(holds.group)
            .bind(holds.dead_holds_key)
            .bind(page.after_id)
            .bind(i64::from(page.limit))
            .fetch_all(executor)
            .await?
            .iter()
            .map(|row| {
                let dead = row.try_get::<String, _>("kind")? == "dead";
                Ok(BlockedKey {
                    key: row.try_get("key")?,
                    head_id: row.try_get("id")?,
                    state: HeadState::of(dead, None),
                    owner: None,
                    attempts: Self::get_int4(row, "attempts")?.max(0) as u32,
                    last_error: row.try_get("error")?,
                    head_created_at: Self::time(row, "created_at")?,
                    until: Self::time(row, if dead { "updated_at" } else { "due_at" })?,
                    waiting_behind: count(row.try_get("behind")?),
                })
            })
            .collect()
    }

    /// The paused groups of the groups table `groups`, with when.
    async fn paused<'e>(
        executor: impl Executor<'e, Database = Self>,
        groups: &str,
    ) -> Result<BTreeMap<String, DateTime<Utc>>, sqlx::Error> {
        sqlx::query(&format!(
            "SELECT name, paused_at FROM {groups} WHERE paused_at IS NOT NULL"
        ))
        .fetch_all(executor)
        .await?
        .iter()
        .map(|row| Ok((row.try_get("name")?, Self::time(row, "paused_at")?)))
        .collect()
    }

    /// A group of the groups table `groups` created with other than `partitions`, and the
    /// count it was created with.
    async fn other_partitions<'e>(
        executor: impl Executor<'e, Database = Self>,
        groups: &str,
        partitions: u32,
    ) -> Result<Option<(String, i64)>, sqlx::Error> {
        let row = sqlx::query(&format!(
            "SELECT name, partitions FROM {groups} WHERE partitions <> $1 LIMIT 1"
        ))
        .bind(Self::int4(partitions))
        .fetch_optional(executor)
        .await?;
        row.map(|row| Ok((row.try_get("name")?, Self::get_int4(&row, "partitions")?)))
            .transpose()
    }

    /// The counts of the group's state rows in the messages table `messages`; `held_by` is
    /// the backend's condition that a row `m` holds its key, of `$2` the group's
    /// `dead_letter_holds_key`.
    async fn state_counts<'e>(
        executor: impl Executor<'e, Database = Self>,
        messages: &str,
        held_by: &str,
        holds: Holds<'_>,
    ) -> Result<StateCounts, sqlx::Error> {
        let row = sqlx::query(&format!(
            "SELECT count(CASE WHEN m.kind = 'retry' THEN 1 END) AS retrying, \
                    count(CASE WHEN m.kind = 'held' THEN 1 END) AS held, \
                    count(CASE WHEN m.kind = 'dead' THEN 1 END) AS dead, \
                    count(DISTINCT CASE WHEN {held_by} THEN m.key END) AS held_keys \
             FROM {messages} m WHERE m.group_name = $1",
        ))
        .bind(holds.group)
        .bind(holds.dead_holds_key)
        .fetch_one(executor)
        .await?;
        Ok(StateCounts {
            retrying: row.try_get("retrying")?,
            held: row.try_get("held")?,
            dead: row.try_get("dead")?,
            held_keys: row.try_get("held_keys")?,
        })
    }

    /// Forgets `member` in the members table `members`.
    async fn forget_member<'e>(
        executor: impl Executor<'e, Database = Self>,
        members: &str,
        member: Member<'_>,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(&format!(
            "DELETE FROM {members} WHERE group_name = $1 AND member = $2"
        ))
        .bind(member.group)
        .bind(member.id)
        .execute(executor)
        .await?;
        Ok(())
    }
}
