//! Subscription groups on SQLite (see [`crate::storage::groups`] and `docs/groups.md`).
//!
//! SQLite has one writer at a time: a transaction that inserts holds the file's write
//! lock until it commits, so rows become visible in id order and log order is the id
//! (`txid` 0). Every committed row is below the frontier. The partition of a row is
//! computed here ([`partition_of`]): reads walk the id range once for all the partitions
//! asked and keep those rows.
//!
//! The store's calls are in files by concern, each an `impl` of the store: the trait's
//! method calls the inherent one of the same name (Rust picks it before the trait's):
//! `schema.rs` (the DDL and the groups' rows), `members.rs` (heartbeats and partition
//! leases), `read.rs` (the log past each position, failed rows, rows by id),
//! `positions.rs` (flushes, seeks, the purge), `stats.rs`, `dead.rs` (dead letters) and
//! `admin.rs` (blocked keys, pauses).

use std::fmt::Display;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::sqlite::SqliteRow;
use sqlx::{Row, Sqlite};

use super::convert::{classify, datetime, decode_messages, now_ms, Place};
use super::shape::{message, DIALECT};
use super::{SqlitePools, BUSY_TIMEOUT};
use crate::config::columns::Columns;
use crate::config::ident::quote;
use crate::storage::groups::sql::GroupDb;
use crate::storage::groups::{partition_of, GroupRow, PartitionView, Position};
use crate::storage::names::Names;
use crate::storage::{StorageError, StorageResult};

mod admin;
mod dead;
mod members;
mod positions;
mod read;
mod schema;
mod stats;

pub struct SqliteGroups {
    pools: SqlitePools,
    place: Place,
    partitions: u32,
    table: String,
    groups: String,
    parts: String,
    members: String,
    messages: String,
    message: String,
    ddl: String,
    /// The outbox table's columns: a mapped table names them its own way.
    names: Names,
}

fn ms(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

fn pos(id: i64) -> Position {
    Position { txid: 0, id }
}

impl SqliteGroups {
    pub fn new(
        pools: SqlitePools,
        table: &str,
        columns: &Columns,
        partitions: u32,
        max_row_bytes: u64,
    ) -> anyhow::Result<Self> {
        let n = Names::new(columns, &DIALECT);
        let t = quote(table);
        let groups = quote(&format!("{table}_groups"));
        let parts = quote(&format!("{table}_group_partitions"));
        let members = quote(&format!("{table}_group_members"));
        let messages = quote(&format!("{table}_group_messages"));
        let ddl = format!(
            "-- Subscription groups: the relay's own tables. Times: Unix epoch milliseconds.
CREATE TABLE IF NOT EXISTS {groups} (
    name       TEXT    PRIMARY KEY,
    partitions INTEGER NOT NULL,
    paused_at  INTEGER
);
CREATE TABLE IF NOT EXISTS {parts} (
    group_name       TEXT    NOT NULL,
    partition        INTEGER NOT NULL,
    owner            TEXT,
    epoch            INTEGER NOT NULL DEFAULT 0,
    lease_expires_at INTEGER NOT NULL DEFAULT 0,
    pos_id           INTEGER NOT NULL,
    PRIMARY KEY (group_name, partition)
);
CREATE TABLE IF NOT EXISTS {members} (
    group_name TEXT    NOT NULL,
    member     TEXT    NOT NULL,
    expires_at INTEGER NOT NULL,
    PRIMARY KEY (group_name, member)
);
CREATE TABLE IF NOT EXISTS {messages} (
    group_name TEXT    NOT NULL,
    id         INTEGER NOT NULL,
    partition  INTEGER NOT NULL,
    key        TEXT,
    kind       TEXT    NOT NULL CHECK (kind IN ('retry', 'held', 'dead')),
    attempts   INTEGER NOT NULL,
    due_at     INTEGER NOT NULL,
    error      TEXT,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (group_name, id)
);
CREATE INDEX IF NOT EXISTS {messages_key_idx} ON {messages} (group_name, key);
",
            messages_key_idx = quote(&format!("{table}_group_messages_key_idx")),
        );
        let place = Place {
            table: table.to_owned(),
            file: pools.file.display().to_string(),
            busy_timeout: BUSY_TIMEOUT,
        };
        Ok(Self {
            pools,
            place,
            partitions,
            message: message(&n, max_row_bytes),
            table: t,
            groups,
            parts,
            members,
            messages,
            ddl,
            names: n,
        })
    }

    /// A statement on the outbox table from `template` (see [`Names::fill`]): the roles
    /// are the table's columns, `{t}` the table, `{message}` its row as a message, `{m}`
    /// the group messages table; `values` the rest.
    fn fill(&self, template: &str, values: &[(&str, &dyn Display)]) -> String {
        let mut all: Vec<(&str, &dyn Display)> = vec![
            ("t", &self.table),
            ("message", &self.message),
            ("m", &self.messages),
        ];
        all.extend_from_slice(values);
        self.names.fill(template, &all)
    }

    /// The statement of [`Self::last_id`], which `ensure` also runs in its transaction.
    fn last_id_sql(&self) -> String {
        self.fill("SELECT coalesce(max({id}), 0) FROM {t}", &[])
    }

    fn error(&self, action: &'static str) -> impl FnOnce(sqlx::Error) -> StorageError + '_ {
        move |err| classify(err, &self.place, action)
    }

    fn rows(&self, rows: Vec<SqliteRow>, action: &'static str) -> StorageResult<Vec<GroupRow>> {
        let messages = decode_messages(rows).map_err(self.error(action))?;
        Ok(messages
            .into_iter()
            .map(|message| GroupRow {
                partition: partition_of(message.key.as_deref(), message.id, self.partitions),
                position: pos(message.id),
                message,
            })
            .collect())
    }

    async fn partitions_of(&self, group: &str) -> StorageResult<Vec<PartitionView>> {
        let now = now_ms();
        let rows: Vec<(i64, Option<String>, i64, i64, i64)> = sqlx::query_as(&format!(
            "SELECT partition, owner, epoch, lease_expires_at, pos_id FROM {} \
             WHERE group_name = ? ORDER BY partition",
            self.parts
        ))
        .bind(group)
        .fetch_all(&self.pools.reader)
        .await
        .map_err(self.error("group partitions"))?;
        Ok(rows
            .into_iter()
            .map(|(partition, owner, epoch, expires, id)| PartitionView {
                partition: partition as u32,
                owner,
                epoch,
                expired: expires < now,
                position: pos(id),
            })
            .collect())
    }

    /// The last id of the table, or 0.
    async fn last_id(&self) -> StorageResult<i64> {
        sqlx::query_scalar(&self.last_id_sql())
            .fetch_one(&self.pools.reader)
            .await
            .map_err(self.error("group position"))
    }
}

/// SQLite's group tables: `INTEGER` partitions and attempts, times in epoch milliseconds,
/// state rows at their id (log order is id order).
impl GroupDb for Sqlite {
    type Int4 = i64;

    fn int4(value: u32) -> i64 {
        i64::from(value)
    }

    fn time(row: &SqliteRow, column: &str) -> Result<DateTime<Utc>, sqlx::Error> {
        datetime(row.try_get(column)?)
    }

    fn state_position(row: &SqliteRow) -> Result<Position, sqlx::Error> {
        Ok(pos(row.try_get("id")?))
    }
}

crate::storage::groups::group_store_calls!(SqliteGroups);
