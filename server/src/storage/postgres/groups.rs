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

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::postgres::{PgPool, PgRow};
use sqlx::{Executor, Row};

use super::convert::{classify, decode_message, interval};
use super::shape::{message, DIALECT};
use crate::config::GroupStart;
use crate::storage::columns::Columns;
use crate::storage::groups::{
    Flush, GroupDead, GroupRow, GroupStats, GroupStore, Heartbeat, PartitionLease, PartitionView,
    Position, Read, SeekOutcome, SeekTarget, StateKind, StateRow,
};
use crate::storage::ident::{quote, Ident};
use crate::storage::names::Names;
use crate::storage::{BlockedKey, MessageId, StorageError, StorageResult, PURGE_BATCH};

mod admin;

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
    /// The creation time of row `o`.
    created_at: String,
    /// The columns of row `o` as a message, then its partition and position.
    row: String,
    ddl: String,
    lock_key: String,
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
            created_at: format!("o.{}", n.created_at),
            lock_key: format!("{}.{table}", schema.unwrap_or("")),
            part,
            table: t,
        };
        let ddl = ddl(&sql, &n, table, schema, partitions);
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

    /// Each partition's position, as `(partition, txid, id)` arrays for `unnest`.
    async fn positions_for(
        &self,
        group: &str,
        target: SeekTarget,
    ) -> StorageResult<Vec<(i32, i64, i64)>> {
        let s = &self.sql;
        let parts: Vec<i32> = (0..self.partitions as i32).collect();
        let rows: Vec<(i32, i64, i64)> = match target {
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
                let txid: Option<i64> = sqlx::query_scalar(&format!(
                    "SELECT o.txid::text::int8 FROM {t} o WHERE o.id = $1",
                    t = s.table
                ))
                .bind(id)
                .fetch_optional(&self.pool)
                .await
                .map_err(self.error("seek group"))?;
                let Some(txid) = txid else {
                    return Err(StorageError::InvalidMessage(format!(
                        "seek to id {id}: the table holds no row with that id (purged, or \
                         never inserted); seek to a time or to the oldest row instead"
                    )));
                };
                parts.iter().map(|p| (*p, txid, id - 1)).collect()
            }
            SeekTarget::Time(at) => {
                // Per partition, just before its first row created at or after `at`; a
                // partition with none is moved to the frontier.
                sqlx::query_as(&format!(
                    "SELECT c.p, coalesce(f.txid, x.xmin - 1), coalesce(f.id - 1, {max}) \
                     FROM unnest($1::int4[]) AS c(p) \
                     CROSS JOIN (SELECT pg_snapshot_xmin(pg_current_snapshot())::text::int8 AS xmin) x \
                     LEFT JOIN LATERAL (SELECT o.txid::text::int8 AS txid, o.id FROM {t} o \
                        WHERE {part} = c.p AND o.created_at >= $2 ORDER BY o.txid, o.id LIMIT 1) f ON true",
                    max = i64::MAX,
                    t = s.table,
                    part = s.part,
                ))
                .bind(&parts)
                .bind(at)
                .fetch_all(&self.pool)
                .await
                .map_err(self.error("seek group"))?
            }
        };
        let _ = group;
        Ok(rows)
    }
}

fn ddl(s: &GroupSql, n: &Names, table: &str, schema: Option<&str>, partitions: u32) -> String {
    let index = match schema {
        Some(_) => quote(&format!("{table}_log_p{partitions}_idx")),
        None => quote(&format!("{table}_log_p{partitions}_idx")),
    };
    // The index expression is the read's, without the alias.
    let part = s.part.replace("o.", "");
    format!(
        "-- Subscription groups: the inserting transaction of each row (log order), an index
-- per partition in that order, and the relay's own tables. Adding the column to a
-- table that has rows rewrites it once.
ALTER TABLE {t} ADD COLUMN IF NOT EXISTS txid xid8 NOT NULL DEFAULT pg_current_xact_id();
CREATE INDEX IF NOT EXISTS {index} ON {t} ({part}, txid, {id});
CREATE TABLE IF NOT EXISTS {groups} (
    name       TEXT        PRIMARY KEY,
    partitions INT4        NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    paused_at  TIMESTAMPTZ
);
ALTER TABLE {groups} ADD COLUMN IF NOT EXISTS paused_at TIMESTAMPTZ;
CREATE TABLE IF NOT EXISTS {parts} (
    group_name       TEXT        NOT NULL,
    partition        INT4        NOT NULL,
    owner            TEXT,
    epoch            INT8        NOT NULL DEFAULT 0,
    lease_expires_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    pos_txid         INT8        NOT NULL,
    pos_id           INT8        NOT NULL,
    PRIMARY KEY (group_name, partition)
);
CREATE TABLE IF NOT EXISTS {members} (
    group_name TEXT        NOT NULL,
    member     TEXT        NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (group_name, member)
);
CREATE TABLE IF NOT EXISTS {messages} (
    group_name TEXT        NOT NULL,
    id         INT8        NOT NULL,
    partition  INT4        NOT NULL,
    key        TEXT,
    pos_txid   INT8        NOT NULL,
    kind       TEXT        NOT NULL CHECK (kind IN ('retry', 'held', 'dead')),
    attempts   INT4        NOT NULL,
    due_at     TIMESTAMPTZ NOT NULL,
    error      TEXT,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (group_name, id)
);
CREATE INDEX IF NOT EXISTS {messages_key_idx} ON {messages} (group_name, key);
",
        t = s.table,
        id = n.id,
        groups = s.groups,
        parts = s.partitions,
        members = s.members,
        messages = s.messages,
        messages_key_idx = quote(&format!("{table}_group_messages_key_idx")),
    )
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

fn decode_state(row: &PgRow) -> Result<StateRow, sqlx::Error> {
    let kind: String = row.try_get("kind")?;
    Ok(StateRow {
        id: row.try_get("id")?,
        partition: row.try_get::<i32, _>("partition")? as u32,
        key: row.try_get("key")?,
        position: position(row.try_get("pos_txid")?, row.try_get("id")?),
        kind: StateKind::parse(&kind).unwrap_or(StateKind::Retry),
        attempts: row.try_get::<i32, _>("attempts")?.max(0) as u32,
        due_at: row.try_get("due_at")?,
        error: row.try_get("error")?,
    })
}

#[async_trait]
impl GroupStore for PostgresGroups {
    fn schema_sql(&self) -> String {
        self.sql.ddl.clone()
    }

    async fn ensure(
        &self,
        groups: &[(String, GroupStart)],
        partitions: u32,
        create: bool,
    ) -> StorageResult<()> {
        let s = &self.sql;
        if create {
            // One simple query, one transaction; servers starting together wait for each
            // other on the advisory lock.
            let run = format!(
                "BEGIN; SET LOCAL statement_timeout = 0; SET LOCAL lock_timeout = 0; \
                 SELECT pg_advisory_xact_lock({LOCK_CLASS_GROUPS}, hashtext({lock})); {ddl} COMMIT;",
                lock = super::shape::literal(&s.lock_key),
                ddl = s.ddl
            );
            self.pool
                .execute(run.as_str())
                .await
                .map_err(self.error("create groups"))?;
        }
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(self.error("create groups"))?;
        sqlx::query("SELECT pg_advisory_xact_lock($1, hashtext($2))")
            .bind(LOCK_CLASS_GROUPS)
            .bind(&s.lock_key)
            .execute(&mut *tx)
            .await
            .map_err(self.error("create groups"))?;
        if !create {
            let present: Option<String> = sqlx::query_scalar("SELECT to_regclass($1)::text")
                .bind(&s.messages)
                .fetch_one(&mut *tx)
                .await
                .map_err(self.error("check groups"))?;
            if present.is_none() {
                return Err(StorageError::MismatchedTable {
                    table: self.display_table.clone(),
                    problems: vec![
                        "the subscription groups' column and tables are missing: run the \
                         output of `txoutboxd schema` or set create_schema = true"
                            .to_owned(),
                    ],
                });
            }
        }
        let mismatched: Vec<(String, i32)> = sqlx::query_as(&format!(
            "SELECT name, partitions FROM {} WHERE partitions <> $1",
            s.groups
        ))
        .bind(partitions as i32)
        .fetch_all(&mut *tx)
        .await
        .map_err(self.error("create groups"))?;
        if let Some((group, was)) = mismatched.first() {
            return Err(StorageError::MismatchedTable {
                table: self.display_table.clone(),
                problems: vec![format!(
                    "group {group} was created with partitions = {was}, the outbox now says \
                     {partitions}: the partitions of an outbox's groups cannot change; set \
                     partitions = {was} back"
                )],
            });
        }
        for (group, start) in groups {
            let created: Option<String> = sqlx::query_scalar(&format!(
                "INSERT INTO {} (name, partitions) VALUES ($1, $2) ON CONFLICT DO NOTHING \
                 RETURNING name",
                s.groups
            ))
            .bind(group)
            .bind(partitions as i32)
            .fetch_optional(&mut *tx)
            .await
            .map_err(self.error("create groups"))?;
            if created.is_none() {
                continue;
            }
            let (txid, id) = match start {
                GroupStart::Oldest => ("0".to_owned(), "0".to_owned()),
                GroupStart::Now => (
                    "pg_snapshot_xmin(pg_current_snapshot())::text::int8 - 1".to_owned(),
                    i64::MAX.to_string(),
                ),
            };
            sqlx::query(&format!(
                "INSERT INTO {} (group_name, partition, pos_txid, pos_id) \
                 SELECT $1, p, {txid}, {id} FROM generate_series(0, $2 - 1) AS p \
                 ON CONFLICT DO NOTHING",
                s.partitions
            ))
            .bind(group)
            .bind(partitions as i32)
            .execute(&mut *tx)
            .await
            .map_err(self.error("create groups"))?;
        }
        tx.commit().await.map_err(self.error("create groups"))
    }

    async fn heartbeat(
        &self,
        group: &str,
        member: &str,
        lease: Duration,
    ) -> StorageResult<Heartbeat> {
        let s = &self.sql;
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(self.error("group heartbeat"))?;
        sqlx::query(&format!(
            "INSERT INTO {m} (group_name, member, expires_at) VALUES ($1, $2, now() + $3) \
             ON CONFLICT (group_name, member) DO UPDATE SET expires_at = EXCLUDED.expires_at",
            m = s.members
        ))
        .bind(group)
        .bind(member)
        .bind(interval(lease))
        .execute(&mut *tx)
        .await
        .map_err(self.error("group heartbeat"))?;
        sqlx::query(&format!(
            "UPDATE {p} SET lease_expires_at = now() + $3 \
             WHERE group_name = $1 AND owner = $2 AND lease_expires_at >= now()",
            p = s.partitions
        ))
        .bind(group)
        .bind(member)
        .bind(interval(lease))
        .execute(&mut *tx)
        .await
        .map_err(self.error("group heartbeat"))?;
        let members: Vec<String> = sqlx::query_scalar(&format!(
            "SELECT member FROM {m} WHERE group_name = $1 AND expires_at >= now() ORDER BY member",
            m = s.members
        ))
        .bind(group)
        .fetch_all(&mut *tx)
        .await
        .map_err(self.error("group heartbeat"))?;
        let partitions = sqlx::query(&format!(
            "SELECT partition, owner, epoch, lease_expires_at < now() AS expired, pos_txid, pos_id \
             FROM {p} WHERE group_name = $1 ORDER BY partition",
            p = s.partitions
        ))
        .bind(group)
        .fetch_all(&mut *tx)
        .await
        .map_err(self.error("group heartbeat"))?
        .iter()
        .map(decode_partition)
        .collect::<Result<Vec<_>, _>>()
        .map_err(self.error("group heartbeat"))?;
        tx.commit().await.map_err(self.error("group heartbeat"))?;
        Ok(Heartbeat {
            members,
            partitions,
        })
    }

    async fn acquire(
        &self,
        group: &str,
        member: &str,
        partition: u32,
        lease: Duration,
    ) -> StorageResult<Option<PartitionLease>> {
        let row: Option<(i64, i64, i64)> = sqlx::query_as(&format!(
            "UPDATE {p} SET owner = $2, epoch = epoch + 1, lease_expires_at = now() + $4 \
             WHERE group_name = $1 AND partition = $3 \
               AND (owner IS NULL OR lease_expires_at < now()) \
             RETURNING epoch, pos_txid, pos_id",
            p = self.sql.partitions
        ))
        .bind(group)
        .bind(member)
        .bind(partition as i32)
        .bind(interval(lease))
        .fetch_optional(&self.pool)
        .await
        .map_err(self.error("take partition"))?;
        Ok(row.map(|(epoch, txid, id)| PartitionLease {
            partition,
            epoch,
            position: position(txid, id),
        }))
    }

    async fn release(&self, group: &str, member: &str, partitions: &[u32]) -> StorageResult<()> {
        let partitions: Vec<i32> = partitions.iter().map(|p| *p as i32).collect();
        sqlx::query(&format!(
            "UPDATE {p} SET owner = NULL WHERE group_name = $1 AND owner = $2 \
               AND (cardinality($3::int4[]) = 0 OR partition = ANY($3))",
            p = self.sql.partitions
        ))
        .bind(group)
        .bind(member)
        .bind(&partitions)
        .execute(&self.pool)
        .await
        .map_err(self.error("give back partitions"))?;
        Ok(())
    }

    async fn leave(&self, group: &str, member: &str) -> StorageResult<()> {
        self.release(group, member, &[]).await?;
        sqlx::query(&format!(
            "DELETE FROM {m} WHERE group_name = $1 AND member = $2",
            m = self.sql.members
        ))
        .bind(group)
        .bind(member)
        .execute(&self.pool)
        .await
        .map_err(self.error("leave group"))?;
        Ok(())
    }

    async fn flush(&self, group: &str, member: &str, flushes: &[Flush]) -> StorageResult<Vec<u32>> {
        let s = &self.sql;
        let parts: Vec<i32> = flushes.iter().map(|f| f.partition as i32).collect();
        let epochs: Vec<i64> = flushes.iter().map(|f| f.epoch).collect();
        let txids: Vec<Option<i64>> = flushes.iter().map(|f| f.position.map(|p| p.txid)).collect();
        let ids: Vec<Option<i64>> = flushes.iter().map(|f| f.position.map(|p| p.id)).collect();
        let mut tx = self.pool.begin().await.map_err(self.error("group flush"))?;
        let owned: Vec<i32> = sqlx::query_scalar(&format!(
            "UPDATE {p} AS p SET pos_txid = coalesce(u.tx, p.pos_txid), pos_id = coalesce(u.i, p.pos_id) \
             FROM unnest($3::int4[], $4::int8[], $5::int8[], $6::int8[]) AS u(part, ep, tx, i) \
             WHERE p.group_name = $1 AND p.partition = u.part AND p.owner = $2 AND p.epoch = u.ep \
             RETURNING p.partition",
            p = s.partitions
        ))
        .bind(group)
        .bind(member)
        .bind(&parts)
        .bind(&epochs)
        .bind(&txids)
        .bind(&ids)
        .fetch_all(&mut *tx)
        .await
        .map_err(self.error("group flush"))?;
        let is_owned = |p: u32| owned.contains(&(p as i32));
        let upserts: Vec<&StateRow> = flushes
            .iter()
            .filter(|f| is_owned(f.partition))
            .flat_map(|f| &f.upserts)
            .collect();
        if !upserts.is_empty() {
            let ids: Vec<i64> = upserts.iter().map(|r| r.id).collect();
            let partitions: Vec<i32> = upserts.iter().map(|r| r.partition as i32).collect();
            let keys: Vec<Option<String>> = upserts.iter().map(|r| r.key.clone()).collect();
            let txids: Vec<i64> = upserts.iter().map(|r| r.position.txid).collect();
            let kinds: Vec<&str> = upserts.iter().map(|r| r.kind.as_str()).collect();
            let attempts: Vec<i32> = upserts.iter().map(|r| r.attempts as i32).collect();
            let due: Vec<DateTime<Utc>> = upserts.iter().map(|r| r.due_at).collect();
            let errors: Vec<Option<String>> = upserts.iter().map(|r| r.error.clone()).collect();
            sqlx::query(&format!(
                "INSERT INTO {m} (group_name, id, partition, key, pos_txid, kind, attempts, due_at, error) \
                 SELECT $1, * FROM unnest($2::int8[], $3::int4[], $4::text[], $5::int8[], $6::text[], \
                    $7::int4[], $8::timestamptz[], $9::text[]) \
                 ON CONFLICT (group_name, id) DO UPDATE SET kind = EXCLUDED.kind, \
                    attempts = EXCLUDED.attempts, due_at = EXCLUDED.due_at, \
                    error = coalesce(EXCLUDED.error, {m}.error), updated_at = now()",
                m = s.messages
            ))
            .bind(group)
            .bind(&ids)
            .bind(&partitions)
            .bind(&keys)
            .bind(&txids)
            .bind(&kinds)
            .bind(&attempts)
            .bind(&due)
            .bind(&errors)
            .execute(&mut *tx)
            .await
            .map_err(self.error("group flush"))?;
        }
        let deletes: Vec<i64> = flushes
            .iter()
            .filter(|f| is_owned(f.partition))
            .flat_map(|f| f.deletes.iter().copied())
            .collect();
        if !deletes.is_empty() {
            sqlx::query(&format!(
                "DELETE FROM {m} WHERE group_name = $1 AND id = ANY($2)",
                m = s.messages
            ))
            .bind(group)
            .bind(&deletes)
            .execute(&mut *tx)
            .await
            .map_err(self.error("group flush"))?;
        }
        tx.commit().await.map_err(self.error("group flush"))?;
        Ok(flushes
            .iter()
            .map(|f| f.partition)
            .filter(|p| !is_owned(*p))
            .collect())
    }

    async fn read(&self, cursors: &[(u32, Position)], limit: u32) -> StorageResult<Read> {
        if cursors.is_empty() {
            return Ok(Read::default());
        }
        let s = &self.sql;
        let parts: Vec<i32> = cursors.iter().map(|(p, _)| *p as i32).collect();
        let txids: Vec<i64> = cursors.iter().map(|(_, c)| c.txid).collect();
        let ids: Vec<i64> = cursors.iter().map(|(_, c)| c.id).collect();
        let rows = sqlx::query(&format!(
            "SELECT r.* FROM unnest($1::int4[], $2::int8[], $3::int8[]) AS c(p, tx, i) \
             CROSS JOIN LATERAL ( \
                SELECT {row} FROM {t} o \
                WHERE {part} = c.p AND (o.txid, o.id) > (c.tx::text::xid8, c.i) \
                  AND o.txid < pg_snapshot_xmin(pg_current_snapshot()) \
                ORDER BY o.txid, o.id LIMIT $4) r",
            row = s.row,
            t = s.table,
            part = s.part,
        ))
        .bind(&parts)
        .bind(&txids)
        .bind(&ids)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(self.error("group read"))?;
        let rows = rows
            .iter()
            .map(decode_group_row)
            .collect::<Result<Vec<_>, _>>()
            .map_err(self.error("group read"))?;
        let mut counts: BTreeMap<u32, u32> = BTreeMap::new();
        let mut scanned = BTreeMap::new();
        for row in &rows {
            *counts.entry(row.partition).or_default() += 1;
            scanned.insert(row.partition, row.position);
        }
        let more = counts
            .into_iter()
            .filter(|(_, count)| *count >= limit)
            .map(|(p, _)| p)
            .collect();
        Ok(Read {
            rows,
            scanned,
            more,
        })
    }

    async fn load_state(&self, group: &str, partition: u32) -> StorageResult<Vec<StateRow>> {
        sqlx::query(&format!(
            "SELECT id, partition, key, pos_txid, kind, attempts, due_at, error FROM {m} \
             WHERE group_name = $1 AND partition = $2 ORDER BY pos_txid, id",
            m = self.sql.messages
        ))
        .bind(group)
        .bind(partition as i32)
        .fetch_all(&self.pool)
        .await
        .map_err(self.error("load group state"))?
        .iter()
        .map(decode_state)
        .collect::<Result<Vec<_>, _>>()
        .map_err(self.error("load group state"))
    }

    async fn fetch(&self, ids: &[MessageId]) -> StorageResult<Vec<GroupRow>> {
        let s = &self.sql;
        sqlx::query(&format!(
            "SELECT {row} FROM {t} o WHERE o.id = ANY($1) ORDER BY o.txid, o.id",
            row = s.row,
            t = s.table
        ))
        .bind(ids)
        .fetch_all(&self.pool)
        .await
        .map_err(self.error("group fetch"))?
        .iter()
        .map(decode_group_row)
        .collect::<Result<Vec<_>, _>>()
        .map_err(self.error("group fetch"))
    }

    async fn seek(
        &self,
        group: &str,
        target: SeekTarget,
        dry_run: bool,
    ) -> StorageResult<SeekOutcome> {
        let s = &self.sql;
        let known: Option<String> =
            sqlx::query_scalar(&format!("SELECT name FROM {} WHERE name = $1", s.groups))
                .bind(group)
                .fetch_optional(&self.pool)
                .await
                .map_err(self.error("seek group"))?;
        if known.is_none() {
            return Err(StorageError::InvalidMessage(format!(
                "group {group} has no partitions yet: start the server with it configured first"
            )));
        }
        let positions = self.positions_for(group, target).await?;
        let parts: Vec<i32> = positions.iter().map(|p| p.0).collect();
        let txids: Vec<i64> = positions.iter().map(|p| p.1).collect();
        let ids: Vec<i64> = positions.iter().map(|p| p.2).collect();
        let rows_ahead: i64 = sqlx::query_scalar(&format!(
            "SELECT coalesce(sum(n), 0)::int8 FROM unnest($1::int4[], $2::int8[], $3::int8[]) AS c(p, tx, i) \
             CROSS JOIN LATERAL (SELECT count(*) AS n FROM {t} o \
                WHERE {part} = c.p AND (o.txid, o.id) > (c.tx::text::xid8, c.i)) r",
            t = s.table,
            part = s.part
        ))
        .bind(&parts)
        .bind(&txids)
        .bind(&ids)
        .fetch_one(&self.pool)
        .await
        .map_err(self.error("seek group"))?;
        if !dry_run {
            let mut tx = self.pool.begin().await.map_err(self.error("seek group"))?;
            sqlx::query(&format!(
                "UPDATE {p} AS p SET pos_txid = u.tx, pos_id = u.i, owner = NULL, epoch = p.epoch + 1 \
                 FROM unnest($2::int4[], $3::int8[], $4::int8[]) AS u(part, tx, i) \
                 WHERE p.group_name = $1 AND p.partition = u.part",
                p = s.partitions
            ))
            .bind(group)
            .bind(&parts)
            .bind(&txids)
            .bind(&ids)
            .execute(&mut *tx)
            .await
            .map_err(self.error("seek group"))?;
            sqlx::query(&format!(
                "DELETE FROM {m} WHERE group_name = $1 AND kind <> 'dead'",
                m = s.messages
            ))
            .bind(group)
            .execute(&mut *tx)
            .await
            .map_err(self.error("seek group"))?;
            tx.commit().await.map_err(self.error("seek group"))?;
        }
        Ok(SeekOutcome {
            rows_ahead: rows_ahead.max(0) as u64,
            partitions: positions.len() as u32,
        })
    }

    async fn purge(&self, retention: Duration) -> StorageResult<u64> {
        let s = &self.sql;
        // Per partition, below the least position of every group: an index range each.
        let bounds: Vec<(i32, i64, i64)> = sqlx::query_as(&format!(
            "SELECT DISTINCT ON (partition) partition, pos_txid, pos_id FROM {p} \
             ORDER BY partition, pos_txid, pos_id",
            p = s.partitions
        ))
        .fetch_all(&self.pool)
        .await
        .map_err(self.error("purge"))?;
        let mut total = 0;
        for (partition, txid, id) in bounds {
            total += crate::storage::in_batches(|| async move {
                sqlx::query(&format!(
                    "DELETE FROM {t} WHERE id IN (SELECT o.id FROM {t} o \
                        WHERE {part} = $1 AND (o.txid, o.id) <= ($2::text::xid8, $3) \
                          AND o.created_at < now() - $4 \
                          AND NOT EXISTS (SELECT 1 FROM {m} g WHERE g.id = o.id) \
                        ORDER BY o.txid, o.id LIMIT $5)",
                    t = s.table,
                    part = s.part,
                    m = s.messages
                ))
                .bind(partition)
                .bind(txid)
                .bind(id)
                .bind(interval(retention))
                .bind(PURGE_BATCH)
                .execute(&self.pool)
                .await
                .map(|done| done.rows_affected())
                .map_err(self.error("purge"))
            })
            .await?;
        }
        Ok(total)
    }

    async fn stats(&self, group: &str, dead_holds_key: bool) -> StorageResult<GroupStats> {
        let s = &self.sql;
        let partitions = sqlx::query(&format!(
            "SELECT partition, owner, epoch, lease_expires_at < now() AS expired, pos_txid, pos_id \
             FROM {p} WHERE group_name = $1 ORDER BY partition",
            p = s.partitions
        ))
        .bind(group)
        .fetch_all(&self.pool)
        .await
        .map_err(self.error("group stats"))?
        .iter()
        .map(decode_partition)
        .collect::<Result<Vec<_>, _>>()
        .map_err(self.error("group stats"))?;
        let parts: Vec<i32> = partitions.iter().map(|p| p.partition as i32).collect();
        let txids: Vec<i64> = partitions.iter().map(|p| p.position.txid).collect();
        let ids: Vec<i64> = partitions.iter().map(|p| p.position.id).collect();
        let (lag_rows, oldest): (i64, Option<f64>) = sqlx::query_as(&format!(
            "SELECT coalesce(sum(r.n), 0)::int8, extract(epoch FROM now() - min(r.oldest))::float8 \
             FROM unnest($1::int4[], $2::int8[], $3::int8[]) AS c(p, tx, i) \
             CROSS JOIN LATERAL (SELECT count(*) AS n, min(o.created_at) AS oldest FROM {t} o \
                WHERE {part} = c.p AND (o.txid, o.id) > (c.tx::text::xid8, c.i) \
                  AND o.txid < pg_snapshot_xmin(pg_current_snapshot())) r",
            t = s.table,
            part = s.part
        ))
        .bind(&parts)
        .bind(&txids)
        .bind(&ids)
        .fetch_one(&self.pool)
        .await
        .map_err(self.error("group stats"))?;
        let (retrying, held, dead, held_keys): (i64, i64, i64, i64) = sqlx::query_as(&format!(
            "SELECT count(*) FILTER (WHERE m.kind = 'retry'), count(*) FILTER (WHERE m.kind = 'held'), \
                    count(*) FILTER (WHERE m.kind = 'dead'), \
                    count(DISTINCT m.key) FILTER (WHERE m.key IS NOT NULL AND {holds}) \
             FROM {m} m WHERE m.group_name = $1",
            m = s.messages,
            holds = admin::HOLDS_KEY.replace("{m}", &s.messages),
        ))
        .bind(group)
        .bind(dead_holds_key)
        .fetch_one(&self.pool)
        .await
        .map_err(self.error("group stats"))?;
        let members: i64 = sqlx::query_scalar(&format!(
            "SELECT count(*) FROM {m} WHERE group_name = $1 AND expires_at >= now()",
            m = s.members
        ))
        .bind(group)
        .fetch_one(&self.pool)
        .await
        .map_err(self.error("group stats"))?;
        Ok(GroupStats {
            group: group.to_owned(),
            lag_rows: lag_rows.max(0) as u64,
            lag: oldest.map(|secs| Duration::from_secs_f64(secs.max(0.0))),
            retrying: retrying as u64,
            held: held as u64,
            dead: dead as u64,
            held_keys: held_keys as u64,
            partitions,
            members: members as u64,
        })
    }

    async fn blocked_keys(
        &self,
        group: &str,
        dead_holds_key: bool,
        after_id: MessageId,
        limit: u32,
    ) -> StorageResult<Vec<BlockedKey>> {
        self.blocked_keys_of(group, dead_holds_key, after_id, limit)
            .await
    }

    async fn paused(&self) -> StorageResult<BTreeMap<String, DateTime<Utc>>> {
        self.paused_groups().await
    }

    async fn set_paused(
        &self,
        group: &str,
        paused: bool,
    ) -> StorageResult<BTreeMap<String, DateTime<Utc>>> {
        self.set_group_paused(group, paused).await
    }

    async fn frontier_delay(&self) -> StorageResult<Duration> {
        let secs: Option<f64> = sqlx::query_scalar(
            "SELECT extract(epoch FROM now() - min(xact_start))::float8 FROM pg_stat_activity \
             WHERE backend_xid IS NOT NULL AND pid <> pg_backend_pid()",
        )
        .fetch_one(&self.pool)
        .await
        .map_err(self.error("frontier delay"))?;
        Ok(Duration::from_secs_f64(secs.unwrap_or(0.0).max(0.0)))
    }

    async fn list_dead(
        &self,
        group: &str,
        after_id: MessageId,
        limit: u32,
    ) -> StorageResult<Vec<GroupDead>> {
        let s = &self.sql;
        sqlx::query(&format!(
            "SELECT {row}, g.error AS group_error, g.updated_at AS dead_at, g.attempts AS group_attempts \
             FROM {m} g JOIN {t} o ON o.id = g.id \
             WHERE g.group_name = $1 AND g.kind = 'dead' AND g.id > $2 ORDER BY g.id LIMIT $3",
            row = s.row,
            m = s.messages,
            t = s.table
        ))
        .bind(group)
        .bind(after_id)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(self.error("list group dead letters"))?
        .iter()
        .map(|row| {
            let mut message = decode_message(row)?;
            message.attempts = row.try_get::<i32, _>("group_attempts")?.max(0) as u32;
            Ok(GroupDead {
                message,
                error: row.try_get("group_error")?,
                dead_at: row.try_get("dead_at")?,
            })
        })
        .collect::<Result<Vec<_>, sqlx::Error>>()
        .map_err(self.error("list group dead letters"))
    }

    async fn redrive_dead(
        &self,
        group: &str,
        ids: &[MessageId],
        limit: u32,
    ) -> StorageResult<Vec<MessageId>> {
        self.change_dead(
            group,
            ids,
            limit,
            "UPDATE {m} SET kind = 'retry', attempts = 0, due_at = now(), updated_at = now() \
             WHERE group_name = $1 AND id IN (SELECT id FROM {m} WHERE group_name = $1 \
                AND kind = 'dead' AND (cardinality($2::int8[]) = 0 OR id = ANY($2)) ORDER BY id LIMIT $3) \
             RETURNING id, partition",
        )
        .await
    }

    async fn discard_dead(
        &self,
        group: &str,
        ids: &[MessageId],
        limit: u32,
    ) -> StorageResult<Vec<MessageId>> {
        self.change_dead(
            group,
            ids,
            limit,
            "DELETE FROM {m} WHERE group_name = $1 AND id IN (SELECT id FROM {m} WHERE group_name = $1 \
                AND kind = 'dead' AND (cardinality($2::int8[]) = 0 OR id = ANY($2)) ORDER BY id LIMIT $3) \
             RETURNING id, partition",
        )
        .await
    }
}

impl PostgresGroups {
    /// Runs a change of dead rows (`{m}` is the group messages table) and takes the
    /// partitions they are in from their owners, which reload their state when they take
    /// them again: the state an owner keeps in memory must not outlive the change.
    async fn change_dead(
        &self,
        group: &str,
        ids: &[MessageId],
        limit: u32,
        statement: &str,
    ) -> StorageResult<Vec<MessageId>> {
        let s = &self.sql;
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(self.error("change dead letters"))?;
        let changed: Vec<(i64, i32)> = sqlx::query_as(&statement.replace("{m}", &s.messages))
            .bind(group)
            .bind(ids)
            .bind(i64::from(limit))
            .fetch_all(&mut *tx)
            .await
            .map_err(self.error("change dead letters"))?;
        let partitions: Vec<i32> = changed.iter().map(|(_, p)| *p).collect();
        sqlx::query(&format!(
            "UPDATE {p} SET owner = NULL, epoch = epoch + 1 \
             WHERE group_name = $1 AND partition = ANY($2)",
            p = s.partitions
        ))
        .bind(group)
        .bind(&partitions)
        .execute(&mut *tx)
        .await
        .map_err(self.error("change dead letters"))?;
        tx.commit()
            .await
            .map_err(self.error("change dead letters"))?;
        let mut ids: Vec<i64> = changed.into_iter().map(|(id, _)| id).collect();
        ids.sort_unstable();
        Ok(ids)
    }
}
