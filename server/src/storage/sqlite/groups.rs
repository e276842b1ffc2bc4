//! Subscription groups on SQLite (see [`crate::storage::groups`] and `docs/groups.md`).
//!
//! SQLite has one writer at a time: a transaction that inserts holds the file's write
//! lock until it commits, so rows become visible in id order and log order is the id
//! (`txid` 0). Every committed row is below the frontier. The partition of a row is
//! computed here ([`partition_of`]): reads walk the id range once for all the partitions
//! asked and keep those rows.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::sqlite::SqliteRow;
use sqlx::{Executor, Row};

use super::convert::{classify, datetime, decode_messages, now_ms, Place};
use super::shape::{message, DIALECT};
use super::{SqlitePools, BUSY_TIMEOUT};
use crate::config::GroupStart;
use crate::storage::columns::Columns;
use crate::storage::groups::{
    partition_of, Flush, GroupDead, GroupRow, GroupStats, GroupStore, Heartbeat, PartitionLease,
    PartitionView, Position, Read, SeekOutcome, SeekTarget, StateKind, StateRow,
};
use crate::storage::ident::quote;
use crate::storage::names::Names;
use crate::storage::{BlockedKey, MessageId, StorageError, StorageResult, PURGE_BATCH};

mod admin;

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
        })
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
        sqlx::query_scalar(&format!("SELECT coalesce(max(id), 0) FROM {}", self.table))
            .fetch_one(&self.pools.reader)
            .await
            .map_err(self.error("group position"))
    }

    async fn change_dead(
        &self,
        group: &str,
        ids: &[MessageId],
        limit: u32,
        redrive: bool,
    ) -> StorageResult<Vec<MessageId>> {
        let mut tx = self
            .pools
            .writer
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(self.error("change dead letters"))?;
        let dead: Vec<(i64, i64)> = sqlx::query_as(&format!(
            "SELECT id, partition FROM {} WHERE group_name = ? AND kind = 'dead' ORDER BY id",
            self.messages
        ))
        .bind(group)
        .fetch_all(&mut *tx)
        .await
        .map_err(self.error("change dead letters"))?;
        let chosen: Vec<(i64, i64)> = dead
            .into_iter()
            .filter(|(id, _)| ids.is_empty() || ids.contains(id))
            .take(limit as usize)
            .collect();
        let mut partitions = BTreeSet::new();
        for (id, partition) in &chosen {
            let sql = if redrive {
                format!(
                    "UPDATE {} SET kind = 'retry', attempts = 0, due_at = ?, updated_at = ? \
                     WHERE group_name = ? AND id = ?",
                    self.messages
                )
            } else {
                format!(
                    "DELETE FROM {} WHERE group_name = ? AND id = ?",
                    self.messages
                )
            };
            let query = if redrive {
                sqlx::query(&sql).bind(now_ms()).bind(now_ms())
            } else {
                sqlx::query(&sql)
            };
            query
                .bind(group)
                .bind(id)
                .execute(&mut *tx)
                .await
                .map_err(self.error("change dead letters"))?;
            partitions.insert(*partition);
        }
        for partition in partitions {
            sqlx::query(&format!(
                "UPDATE {} SET owner = NULL, epoch = epoch + 1 WHERE group_name = ? AND partition = ?",
                self.parts
            ))
            .bind(group)
            .bind(partition)
            .execute(&mut *tx)
            .await
            .map_err(self.error("change dead letters"))?;
        }
        tx.commit()
            .await
            .map_err(self.error("change dead letters"))?;
        Ok(chosen.into_iter().map(|(id, _)| id).collect())
    }
}

fn decode_state(row: &SqliteRow) -> Result<StateRow, sqlx::Error> {
    let kind: String = row.try_get("kind")?;
    let id: i64 = row.try_get("id")?;
    Ok(StateRow {
        id,
        partition: row.try_get::<i64, _>("partition")? as u32,
        key: row.try_get("key")?,
        position: pos(id),
        kind: StateKind::parse(&kind).unwrap_or(StateKind::Retry),
        attempts: row.try_get::<i64, _>("attempts")?.max(0) as u32,
        due_at: datetime(row.try_get("due_at")?)?,
        error: row.try_get("error")?,
    })
}

#[async_trait]
impl GroupStore for SqliteGroups {
    fn schema_sql(&self) -> String {
        self.ddl.clone()
    }

    async fn ensure(
        &self,
        groups: &[(String, GroupStart)],
        partitions: u32,
        create: bool,
    ) -> StorageResult<()> {
        if create {
            self.pools
                .writer
                .execute(self.ddl.as_str())
                .await
                .map_err(self.error("create groups"))?;
        }
        let mut tx = self
            .pools
            .writer
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(self.error("create groups"))?;
        let mismatched: Option<(String, i64)> = sqlx::query_as(&format!(
            "SELECT name, partitions FROM {} WHERE partitions <> ? LIMIT 1",
            self.groups
        ))
        .bind(i64::from(partitions))
        .fetch_optional(&mut *tx)
        .await
        .map_err(self.error("check groups"))?;
        if let Some((group, was)) = mismatched {
            return Err(StorageError::MismatchedTable {
                table: self.place.table.clone(),
                problems: vec![format!(
                    "group {group} was created with partitions = {was}, the outbox now says \
                     {partitions}: the partitions of an outbox's groups cannot change; set \
                     partitions = {was} back"
                )],
            });
        }
        for (group, start) in groups {
            let created = sqlx::query(&format!(
                "INSERT INTO {} (name, partitions) VALUES (?, ?) ON CONFLICT DO NOTHING",
                self.groups
            ))
            .bind(group)
            .bind(i64::from(partitions))
            .execute(&mut *tx)
            .await
            .map_err(self.error("create groups"))?
            .rows_affected();
            if created == 0 {
                continue;
            }
            let start_id: i64 = match start {
                GroupStart::Oldest => 0,
                GroupStart::Now => {
                    sqlx::query_scalar(&format!("SELECT coalesce(max(id), 0) FROM {}", self.table))
                        .fetch_one(&mut *tx)
                        .await
                        .map_err(self.error("create groups"))?
                }
            };
            for partition in 0..partitions {
                sqlx::query(&format!(
                    "INSERT INTO {} (group_name, partition, pos_id) VALUES (?, ?, ?) \
                     ON CONFLICT DO NOTHING",
                    self.parts
                ))
                .bind(group)
                .bind(i64::from(partition))
                .bind(start_id)
                .execute(&mut *tx)
                .await
                .map_err(self.error("create groups"))?;
            }
        }
        tx.commit().await.map_err(self.error("create groups"))
    }

    async fn heartbeat(
        &self,
        group: &str,
        member: &str,
        lease: Duration,
    ) -> StorageResult<Heartbeat> {
        let now = now_ms();
        let until = now + ms(lease);
        let mut tx = self
            .pools
            .writer
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(self.error("group heartbeat"))?;
        sqlx::query(&format!(
            "INSERT INTO {} (group_name, member, expires_at) VALUES (?, ?, ?) \
             ON CONFLICT (group_name, member) DO UPDATE SET expires_at = excluded.expires_at",
            self.members
        ))
        .bind(group)
        .bind(member)
        .bind(until)
        .execute(&mut *tx)
        .await
        .map_err(self.error("group heartbeat"))?;
        sqlx::query(&format!(
            "UPDATE {} SET lease_expires_at = ? WHERE group_name = ? AND owner = ? \
               AND lease_expires_at >= ?",
            self.parts
        ))
        .bind(until)
        .bind(group)
        .bind(member)
        .bind(now)
        .execute(&mut *tx)
        .await
        .map_err(self.error("group heartbeat"))?;
        let members: Vec<String> = sqlx::query_scalar(&format!(
            "SELECT member FROM {} WHERE group_name = ? AND expires_at >= ? ORDER BY member",
            self.members
        ))
        .bind(group)
        .bind(now)
        .fetch_all(&mut *tx)
        .await
        .map_err(self.error("group heartbeat"))?;
        tx.commit().await.map_err(self.error("group heartbeat"))?;
        Ok(Heartbeat {
            members,
            partitions: self.partitions_of(group).await?,
        })
    }

    async fn acquire(
        &self,
        group: &str,
        member: &str,
        partition: u32,
        lease: Duration,
    ) -> StorageResult<Option<PartitionLease>> {
        let now = now_ms();
        let row: Option<(i64, i64)> = sqlx::query_as(&format!(
            "UPDATE {} SET owner = ?, epoch = epoch + 1, lease_expires_at = ? \
             WHERE group_name = ? AND partition = ? AND (owner IS NULL OR lease_expires_at < ?) \
             RETURNING epoch, pos_id",
            self.parts
        ))
        .bind(member)
        .bind(now + ms(lease))
        .bind(group)
        .bind(i64::from(partition))
        .bind(now)
        .fetch_optional(&self.pools.writer)
        .await
        .map_err(self.error("take partition"))?;
        Ok(row.map(|(epoch, id)| PartitionLease {
            partition,
            epoch,
            position: pos(id),
        }))
    }

    async fn release(&self, group: &str, member: &str, partitions: &[u32]) -> StorageResult<()> {
        let list = serde_json::to_string(partitions).expect("a list of numbers serialises");
        sqlx::query(&format!(
            "UPDATE {} SET owner = NULL WHERE group_name = ? AND owner = ? \
               AND (json_array_length(?) = 0 OR partition IN (SELECT value FROM json_each(?)))",
            self.parts
        ))
        .bind(group)
        .bind(member)
        .bind(&list)
        .bind(&list)
        .execute(&self.pools.writer)
        .await
        .map_err(self.error("give back partitions"))?;
        Ok(())
    }

    async fn leave(&self, group: &str, member: &str) -> StorageResult<()> {
        self.release(group, member, &[]).await?;
        sqlx::query(&format!(
            "DELETE FROM {} WHERE group_name = ? AND member = ?",
            self.members
        ))
        .bind(group)
        .bind(member)
        .execute(&self.pools.writer)
        .await
        .map_err(self.error("leave group"))?;
        Ok(())
    }

    async fn flush(&self, group: &str, member: &str, flushes: &[Flush]) -> StorageResult<Vec<u32>> {
        let mut lost = Vec::new();
        let mut tx = self
            .pools
            .writer
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(self.error("group flush"))?;
        let now = now_ms();
        for flush in flushes {
            let owned = sqlx::query(&format!(
                "UPDATE {} SET pos_id = coalesce(?, pos_id) \
                 WHERE group_name = ? AND partition = ? AND owner = ? AND epoch = ?",
                self.parts
            ))
            .bind(flush.position.map(|p| p.id))
            .bind(group)
            .bind(i64::from(flush.partition))
            .bind(member)
            .bind(flush.epoch)
            .execute(&mut *tx)
            .await
            .map_err(self.error("group flush"))?
            .rows_affected()
                > 0;
            if !owned {
                lost.push(flush.partition);
                continue;
            }
            for row in &flush.upserts {
                sqlx::query(&format!(
                    "INSERT INTO {m} (group_name, id, partition, key, kind, attempts, due_at, error, updated_at) \
                     VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) \
                     ON CONFLICT (group_name, id) DO UPDATE SET kind = excluded.kind, \
                        attempts = excluded.attempts, due_at = excluded.due_at, \
                        error = coalesce(excluded.error, {m}.error), updated_at = excluded.updated_at",
                    m = self.messages
                ))
                .bind(group)
                .bind(row.id)
                .bind(i64::from(row.partition))
                .bind(&row.key)
                .bind(row.kind.as_str())
                .bind(i64::from(row.attempts))
                .bind(row.due_at.timestamp_millis())
                .bind(&row.error)
                .bind(now)
                .execute(&mut *tx)
                .await
                .map_err(self.error("group flush"))?;
            }
            for id in &flush.deletes {
                sqlx::query(&format!(
                    "DELETE FROM {} WHERE group_name = ? AND id = ?",
                    self.messages
                ))
                .bind(group)
                .bind(id)
                .execute(&mut *tx)
                .await
                .map_err(self.error("group flush"))?;
            }
        }
        tx.commit().await.map_err(self.error("group flush"))?;
        Ok(lost)
    }

    async fn read(&self, cursors: &[(u32, Position)], limit: u32) -> StorageResult<Read> {
        let Some(from) = cursors.iter().map(|(_, c)| c.id).min() else {
            return Ok(Read::default());
        };
        let asked: BTreeMap<u32, i64> = cursors.iter().map(|(p, c)| (*p, c.id)).collect();
        // One walk of the id range for every partition asked.
        let span = i64::from(limit) * i64::try_from(asked.len()).unwrap_or(1);
        let raw = sqlx::query(&format!(
            "SELECT {m} FROM {t} WHERE id > ? ORDER BY id LIMIT ?",
            m = self.message,
            t = self.table
        ))
        .bind(from)
        .bind(span)
        .fetch_all(&self.pools.reader)
        .await
        .map_err(self.error("group read"))?;
        let walked = raw.len() as i64;
        let rows = self.rows(raw, "group read")?;
        let last = rows.last().map(|r| r.position);
        let rows: Vec<GroupRow> = rows
            .into_iter()
            .filter(|row| {
                asked
                    .get(&row.partition)
                    .is_some_and(|cursor| row.position.id > *cursor)
            })
            .collect();
        let more_rows = walked >= span;
        let scanned = match last {
            Some(last) => asked.keys().map(|p| (*p, last)).collect(),
            None => BTreeMap::new(),
        };
        Ok(Read {
            rows,
            scanned,
            more: if more_rows {
                asked.keys().copied().collect()
            } else {
                Vec::new()
            },
        })
    }

    async fn load_state(&self, group: &str, partition: u32) -> StorageResult<Vec<StateRow>> {
        sqlx::query(&format!(
            "SELECT id, partition, key, kind, attempts, due_at, error FROM {} \
             WHERE group_name = ? AND partition = ? ORDER BY id",
            self.messages
        ))
        .bind(group)
        .bind(i64::from(partition))
        .fetch_all(&self.pools.reader)
        .await
        .map_err(self.error("load group state"))?
        .iter()
        .map(decode_state)
        .collect::<Result<Vec<_>, _>>()
        .map_err(self.error("load group state"))
    }

    async fn fetch(&self, ids: &[MessageId]) -> StorageResult<Vec<GroupRow>> {
        let list = serde_json::to_string(ids).expect("a list of ids serialises");
        let raw = sqlx::query(&format!(
            "SELECT {m} FROM {t} WHERE id IN (SELECT value FROM json_each(?)) ORDER BY id",
            m = self.message,
            t = self.table
        ))
        .bind(list)
        .fetch_all(&self.pools.reader)
        .await
        .map_err(self.error("group fetch"))?;
        self.rows(raw, "group fetch")
    }

    async fn seek(
        &self,
        group: &str,
        target: SeekTarget,
        dry_run: bool,
    ) -> StorageResult<SeekOutcome> {
        let known = self.partitions_of(group).await?;
        if known.is_empty() {
            return Err(StorageError::InvalidMessage(format!(
                "group {group} has no partitions yet: start the server with it configured first"
            )));
        }
        let to: i64 = match target {
            SeekTarget::Oldest => 0,
            SeekTarget::Now => self.last_id().await?,
            SeekTarget::Id(id) => id - 1,
            SeekTarget::Time(at) => sqlx::query_scalar(&format!(
                "SELECT coalesce((SELECT min(id) - 1 FROM {t} WHERE created_at >= ?), \
                                 (SELECT coalesce(max(id), 0) FROM {t}))",
                t = self.table
            ))
            .bind(at.timestamp_millis())
            .fetch_one(&self.pools.reader)
            .await
            .map_err(self.error("seek group"))?,
        };
        let rows_ahead: i64 =
            sqlx::query_scalar(&format!("SELECT count(*) FROM {} WHERE id > ?", self.table))
                .bind(to)
                .fetch_one(&self.pools.reader)
                .await
                .map_err(self.error("seek group"))?;
        if !dry_run {
            let mut tx = self
                .pools
                .writer
                .begin_with("BEGIN IMMEDIATE")
                .await
                .map_err(self.error("seek group"))?;
            sqlx::query(&format!(
                "UPDATE {} SET pos_id = ?, owner = NULL, epoch = epoch + 1 WHERE group_name = ?",
                self.parts
            ))
            .bind(to)
            .bind(group)
            .execute(&mut *tx)
            .await
            .map_err(self.error("seek group"))?;
            sqlx::query(&format!(
                "DELETE FROM {} WHERE group_name = ? AND kind <> 'dead'",
                self.messages
            ))
            .bind(group)
            .execute(&mut *tx)
            .await
            .map_err(self.error("seek group"))?;
            tx.commit().await.map_err(self.error("seek group"))?;
        }
        Ok(SeekOutcome {
            rows_ahead: rows_ahead.max(0) as u64,
            partitions: known.len() as u32,
        })
    }

    async fn purge(&self, retention: Duration) -> StorageResult<u64> {
        // Every partition of every group has passed the least position of all.
        let bound: Option<i64> =
            sqlx::query_scalar(&format!("SELECT min(pos_id) FROM {}", self.parts))
                .fetch_one(&self.pools.reader)
                .await
                .map_err(self.error("purge"))?;
        let Some(bound) = bound else { return Ok(0) };
        let cutoff = now_ms() - ms(retention);
        crate::storage::in_batches(|| async move {
            sqlx::query(&format!(
                "DELETE FROM {t} WHERE id IN (SELECT o.id FROM {t} o WHERE o.id <= ? \
                    AND o.created_at < ? \
                    AND NOT EXISTS (SELECT 1 FROM {m} g WHERE g.id = o.id) ORDER BY o.id LIMIT ?)",
                t = self.table,
                m = self.messages
            ))
            .bind(bound)
            .bind(cutoff)
            .bind(PURGE_BATCH)
            .execute(&self.pools.writer)
            .await
            .map(|done| done.rows_affected())
            .map_err(self.error("purge"))
        })
        .await
    }

    async fn stats(&self, group: &str, dead_holds_key: bool) -> StorageResult<GroupStats> {
        let partitions = self.partitions_of(group).await?;
        let mut lag_rows = 0u64;
        let mut oldest: Option<i64> = None;
        // Rows past each partition's position, the partition computed here.
        let from = partitions.iter().map(|p| p.position.id).min().unwrap_or(0);
        let positions: BTreeMap<u32, i64> = partitions
            .iter()
            .map(|p| (p.partition, p.position.id))
            .collect();
        let rows: Vec<(i64, Option<String>, i64)> = sqlx::query_as(&format!(
            "SELECT id, key, created_at FROM {} WHERE id > ? ORDER BY id",
            self.table
        ))
        .bind(from)
        .fetch_all(&self.pools.reader)
        .await
        .map_err(self.error("group stats"))?;
        for (id, key, created_at) in rows {
            let partition = partition_of(key.as_deref(), id, self.partitions);
            if positions.get(&partition).is_some_and(|at| id > *at) {
                lag_rows += 1;
                oldest = Some(oldest.map_or(created_at, |o| o.min(created_at)));
            }
        }
        let (retrying, held, dead, held_keys): (i64, i64, i64, i64) = sqlx::query_as(&format!(
            "SELECT count(CASE WHEN m.kind = 'retry' THEN 1 END), count(CASE WHEN m.kind = 'held' THEN 1 END), \
                    count(CASE WHEN m.kind = 'dead' THEN 1 END), \
                    count(DISTINCT CASE WHEN {holds} THEN m.key END) \
             FROM {m} m WHERE m.group_name = ?1",
            m = self.messages,
            holds = admin::HOLDS_KEY.replace("{m}", &self.messages),
        ))
        .bind(group)
        .bind(dead_holds_key)
        .fetch_one(&self.pools.reader)
        .await
        .map_err(self.error("group stats"))?;
        let members: i64 = sqlx::query_scalar(&format!(
            "SELECT count(*) FROM {} WHERE group_name = ? AND expires_at >= ?",
            self.members
        ))
        .bind(group)
        .bind(now_ms())
        .fetch_one(&self.pools.reader)
        .await
        .map_err(self.error("group stats"))?;
        Ok(GroupStats {
            group: group.to_owned(),
            lag_rows,
            lag: oldest.map(|at| Duration::from_millis((now_ms() - at).max(0) as u64)),
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
        // One writer at a time: a committed row never waits for another transaction.
        Ok(Duration::ZERO)
    }

    async fn list_dead(
        &self,
        group: &str,
        after_id: MessageId,
        limit: u32,
    ) -> StorageResult<Vec<GroupDead>> {
        let dead: Vec<(i64, i64, Option<String>, i64)> = sqlx::query_as(&format!(
            "SELECT id, attempts, error, updated_at FROM {} WHERE group_name = ? AND kind = 'dead' \
               AND id > ? ORDER BY id LIMIT ?",
            self.messages
        ))
        .bind(group)
        .bind(after_id)
        .bind(i64::from(limit))
        .fetch_all(&self.pools.reader)
        .await
        .map_err(self.error("list group dead letters"))?;
        let ids: Vec<i64> = dead.iter().map(|d| d.0).collect();
        let rows = self.fetch(&ids).await?;
        let mut out = Vec::new();
        for (id, attempts, error, at) in dead {
            if let Some(row) = rows.iter().find(|r| r.message.id == id) {
                let mut message = row.message.clone();
                message.attempts = attempts.max(0) as u32;
                out.push(GroupDead {
                    message,
                    error,
                    dead_at: datetime(at).map_err(self.error("list group dead letters"))?,
                });
            }
        }
        Ok(out)
    }

    async fn redrive_dead(
        &self,
        group: &str,
        ids: &[MessageId],
        limit: u32,
    ) -> StorageResult<Vec<MessageId>> {
        self.change_dead(group, ids, limit, true).await
    }

    async fn discard_dead(
        &self,
        group: &str,
        ids: &[MessageId],
        limit: u32,
    ) -> StorageResult<Vec<MessageId>> {
        self.change_dead(group, ids, limit, false).await
    }
}
