//! Subscription groups on PostgreSQL (see [`crate::storage::groups`] and `docs/groups.md`).
//!
//! Log order is `(txid, id)`: `txid` is an `xid8` column filled by its default,
//! `pg_current_xact_id()`, the inserting transaction's id. A read only returns rows whose
//! `txid` is below `pg_snapshot_xmin(pg_current_snapshot())`: every transaction with a
//! lower id has ended, so no row can still appear before what was read. No trigger, no
//! lock: a producer's insert costs the column's default and two index entries.
//!
//! The partition of a row is `hashtext(key or id) mod partitions`, computed by the
//! database in the read and in an expression index `(partition, txid, id)`, so each
//! partition is read by an index range of its own.
//!
//! The store's calls are in files by concern, each an `impl` of the store: the trait's
//! method calls the inherent one of the same name (Rust picks it before the trait's):
//! `schema.rs` (the DDL and the groups' rows), `members.rs` (heartbeats and partition
//! leases), `read.rs` (the log past each position, failed rows, rows by id),
//! `positions.rs` (flushes, seeks, the purge), `stats.rs`, `dead.rs` (dead letters) and
//! `admin.rs` (blocked keys, pauses).

use std::fmt::Display;

use chrono::{DateTime, Utc};
use sqlx::postgres::{PgArguments, PgPool, PgRow};
use sqlx::{Arguments, Postgres, Row};

use super::convert::{classify, decode_message};
use super::shape::{message, DIALECT};
use crate::config::columns::Columns;
use crate::config::ident::{quote, Ident};
use crate::storage::groups::sql::{no_row_to_seek, GroupDb};
use crate::storage::groups::{GroupRow, PartitionView, Position, SeekTarget};
use crate::storage::names::Names;
use crate::storage::{StorageError, StorageResult};

mod admin;
mod dead;
mod members;
mod positions;
mod read;
mod schema;
mod stats;

/// Serialises the groups' DDL of servers starting together (beside the table's own).
const LOCK_CLASS_GROUPS: i32 = 0x7478_6f62 + 2;

pub struct PostgresGroups {
    pool: PgPool,
    display_table: String,
    sql: GroupSql,
    partitions: u32,
}

struct GroupSql {
    table: String,
    groups: String,
    partitions: String,
    members: String,
    messages: String,
    /// The partition of row `o`.
    part: String,
    /// The columns of row `o` as a message, then its partition and position.
    row: String,
    ddl: String,
    lock_key: String,
    /// The outbox table's columns: a mapped table names them its own way.
    names: Names,
}

impl PostgresGroups {
    pub fn new(
        pool: PgPool,
        schema: Option<&str>,
        table: &str,
        columns: &Columns,
        partitions: u32,
        max_row_bytes: u64,
    ) -> anyhow::Result<Self> {
        let table_ident = Ident::new(table)?;
        let qualify = |name: &str| -> String {
            match schema {
                Some(schema) => format!("{}.{}", quote(schema), quote(name)),
                None => quote(name),
            }
        };
        let n = Names::new(columns, &DIALECT);
        let t = qualify(table_ident.as_str());
        let part = format!(
            "((hashtext(coalesce(o.{key}::text, o.{id}::text)) & 2147483647) % {partitions})",
            key = n.key,
            id = n.id,
        );
        let sql = GroupSql {
            groups: qualify(&format!("{table}_groups")),
            partitions: qualify(&format!("{table}_group_partitions")),
            members: qualify(&format!("{table}_group_members")),
            messages: qualify(&format!("{table}_group_messages")),
            row: format!(
                "{}, {part}::int4 AS partition, o.txid::text::int8 AS txid",
                message(&n, "o", max_row_bytes)
            ),
            ddl: String::new(),
            lock_key: format!("{}.{table}", schema.unwrap_or("")),
            part,
            table: t,
            names: n,
        };
        let ddl = sql.render_ddl(table, partitions);
        Ok(Self {
            pool,
            display_table: match schema {
                Some(schema) => format!("{schema}.{table}"),
                None => table.to_owned(),
            },
            sql: GroupSql { ddl, ..sql },
            partitions,
        })
    }

    fn error(&self, action: &'static str) -> impl FnOnce(sqlx::Error) -> StorageError + '_ {
        move |err| classify(err, &self.display_table, action)
    }

    /// Each partition's position after a seek to `target`.
    async fn positions_for(&self, target: SeekTarget) -> StorageResult<Positions> {
        let s = &self.sql;
        let parts: Vec<i32> = (0..self.partitions as i32).collect();
        let rows: Positions = match target {
            SeekTarget::Oldest => parts.iter().map(|p| (*p, 0, 0)).collect(),
            SeekTarget::Now => {
                let xmin: i64 = sqlx::query_scalar(
                    "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::int8",
                )
                .fetch_one(&self.pool)
                .await
                .map_err(self.error("seek group"))?;
                parts.iter().map(|p| (*p, xmin - 1, i64::MAX)).collect()
            }
            SeekTarget::Id(id) => {
                let txid: Option<i64> = sqlx::query_scalar(&s.fill(
                    "SELECT o.txid::text::int8 FROM {t} o WHERE o.{id} = $1",
                    &[],
                ))
                .bind(id)
                .fetch_optional(&self.pool)
                .await
                .map_err(self.error("seek group"))?;
                let Some(txid) = txid else {
                    return Err(no_row_to_seek(id));
                };
                parts.iter().map(|p| (*p, txid, id - 1)).collect()
            }
            SeekTarget::Time(at) => {
                // Per partition, just before its first row created at or after `at`; a
                // partition with none is moved to the frontier.
                sqlx::query_as::<_, (i32, i64, i64)>(&s.fill(
                    "SELECT c.p, coalesce(f.txid, x.xmin - 1), coalesce(f.id - 1, {max}) \
                     FROM unnest($1::int4[]) AS c(p) \
                     CROSS JOIN (SELECT pg_snapshot_xmin(pg_current_snapshot())::text::int8 AS xmin) x \
                     LEFT JOIN LATERAL (SELECT o.txid::text::int8 AS txid, o.{id}::int8 AS id FROM {t} o \
                        WHERE {part} = c.p AND o.{created_at} >= $2 ORDER BY o.txid, o.{id} LIMIT 1) f ON true",
                    &[("max", &i64::MAX)],
                ))
                .bind(&parts)
                .bind(at)
                .fetch_all(&self.pool)
                .await
                .map_err(self.error("seek group"))?
                .into_iter()
                .collect()
            }
        };
        Ok(rows)
    }
}

impl GroupSql {
    /// A statement on the outbox table from `template` (see [`Names::fill`]): the roles
    /// are the table's columns, `{t}` the table, `{part}` the partition of its row `o`,
    /// `{row}` that row as a message, `{m}` the group messages table; `values` the rest.
    fn fill(&self, template: &str, values: &[(&str, &dyn Display)]) -> String {
        let mut all: Vec<(&str, &dyn Display)> = vec![
            ("t", &self.table),
            ("part", &self.part),
            ("row", &self.row),
            ("m", &self.messages),
        ];
        all.extend_from_slice(values);
        self.names.fill(template, &all)
    }
}

/// Partitions with a position each, as the three arrays a statement takes first and
/// unnests: `unnest($1::int4[], $2::int8[], $3::int8[]) AS c(p, tx, i)`.
struct Positions {
    parts: Vec<i32>,
    txids: Vec<i64>,
    ids: Vec<i64>,
}

impl FromIterator<(i32, i64, i64)> for Positions {
    fn from_iter<I: IntoIterator<Item = (i32, i64, i64)>>(rows: I) -> Self {
        let (mut parts, mut txids, mut ids) = (Vec::new(), Vec::new(), Vec::new());
        for (partition, txid, id) in rows {
            parts.push(partition);
            txids.push(txid);
            ids.push(id);
        }
        Positions { parts, txids, ids }
    }
}

impl<'a> FromIterator<(u32, &'a Position)> for Positions {
    fn from_iter<I: IntoIterator<Item = (u32, &'a Position)>>(rows: I) -> Self {
        rows.into_iter()
            .map(|(partition, at)| (partition as i32, at.txid, at.id))
            .collect()
    }
}

impl Positions {
    fn len(&self) -> usize {
        self.parts.len()
    }

    /// The three arrays as a statement's `$1, $2, $3`; its later arguments are bound after.
    fn arguments(&self) -> PgArguments {
        const ENCODES: &str = "an array of integers encodes";
        let mut arguments = PgArguments::default();
        arguments.add(&self.parts).expect(ENCODES);
        arguments.add(&self.txids).expect(ENCODES);
        arguments.add(&self.ids).expect(ENCODES);
        arguments
    }
}

fn position(txid: i64, id: i64) -> Position {
    Position { txid, id }
}

fn decode_group_row(row: &PgRow) -> Result<GroupRow, sqlx::Error> {
    Ok(GroupRow {
        message: decode_message(row)?,
        partition: row.try_get::<i32, _>("partition")? as u32,
        position: position(row.try_get("txid")?, row.try_get("id")?),
    })
}

fn decode_partition(row: &PgRow) -> Result<PartitionView, sqlx::Error> {
    Ok(PartitionView {
        partition: row.try_get::<i32, _>("partition")? as u32,
        owner: row.try_get("owner")?,
        epoch: row.try_get("epoch")?,
        expired: row.try_get("expired")?,
        position: position(row.try_get("pos_txid")?, row.try_get("pos_id")?),
    })
}

/// PostgreSQL's group tables: `INT4` partitions and attempts, `TIMESTAMPTZ` times, state
/// rows at `(pos_txid, id)`.
impl GroupDb for Postgres {
    type Int4 = i32;

    fn int4(value: u32) -> i32 {
        value as i32
    }

    fn time(row: &PgRow, column: &str) -> Result<DateTime<Utc>, sqlx::Error> {
        row.try_get(column)
    }

    fn state_position(row: &PgRow) -> Result<Position, sqlx::Error> {
        Ok(position(row.try_get("pos_txid")?, row.try_get("id")?))
    }
}

crate::storage::groups::group_store_calls!(PostgresGroups);
