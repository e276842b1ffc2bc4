//! Where each partition stands: positions and failed rows flushed, seeks, the purge of rows
//! every group passed.

use std::time::Duration;

use super::super::convert::now_ms;
use super::{ms, SqliteGroups};
use crate::storage::groups::sql::{no_row_to_seek, unknown_group};
use crate::storage::groups::{Flush, Member, SeekOutcome, SeekTarget};
use crate::storage::rows::count;
use crate::storage::{StorageResult, PURGE_BATCH};

impl SqliteGroups {
    pub(super) async fn flush(
        &self,
        member: Member<'_>,
        flushes: &[Flush],
    ) -> StorageResult<Vec<u32>> {
        let Member { group, id: member } = member;
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

    /// What a seek of `group` to `target` does, and the id it moves the partitions to.
    pub(super) async fn plan_seek(
        &self,
        group: &str,
        target: SeekTarget,
    ) -> StorageResult<(SeekOutcome, i64)> {
        let known = self.partitions_of(group).await?;
        if known.is_empty() {
            return Err(unknown_group(group));
        }
        let to: i64 = match target {
            SeekTarget::Oldest => 0,
            SeekTarget::Now => self.last_id().await?,
            SeekTarget::Id(id) => {
                let held: Option<i64> =
                    sqlx::query_scalar(&self.fill("SELECT {id} FROM {t} WHERE {id} = ?", &[]))
                        .bind(id)
                        .fetch_optional(&self.pools.reader)
                        .await
                        .map_err(self.error("seek group"))?;
                held.ok_or_else(|| no_row_to_seek(id))? - 1
            }
            SeekTarget::Time(at) => sqlx::query_scalar(&self.fill(
                "SELECT coalesce((SELECT min({id}) - 1 FROM {t} WHERE {created_at} >= ?), \
                                 (SELECT coalesce(max({id}), 0) FROM {t}))",
                &[],
            ))
            .bind(at.timestamp_millis())
            .fetch_one(&self.pools.reader)
            .await
            .map_err(self.error("seek group"))?,
        };
        let rows_ahead: i64 =
            sqlx::query_scalar(&self.fill("SELECT count(*) FROM {t} WHERE {id} > ?", &[]))
                .bind(to)
                .fetch_one(&self.pools.reader)
                .await
                .map_err(self.error("seek group"))?;
        let outcome = SeekOutcome {
            rows_ahead: count(rows_ahead),
            partitions: known.len() as u32,
        };
        Ok((outcome, to))
    }

    /// Moves the group's partitions to `to`, takes them from their owners (a new epoch)
    /// and drops its retry and held rows.
    pub(super) async fn move_to(&self, group: &str, to: i64) -> StorageResult<()> {
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
        tx.commit().await.map_err(self.error("seek group"))
    }

    pub(super) async fn purge(&self, retention: Duration) -> StorageResult<u64> {
        // Every partition of every group has passed the least position of all.
        let bound: Option<i64> =
            sqlx::query_scalar(&format!("SELECT min(pos_id) FROM {}", self.parts))
                .fetch_one(&self.pools.reader)
                .await
                .map_err(self.error("purge"))?;
        let Some(bound) = bound else { return Ok(0) };
        // Never the table's last row: a rowid table without AUTOINCREMENT (a team's own
        // table may be one) gives the next row the largest id left plus one, which would
        // sit at or below the positions and never be read.
        let bound = bound.min(self.last_id().await? - 1);
        let cutoff = now_ms() - ms(retention);
        crate::storage::in_batches(|| async move {
            sqlx::query(&self.fill(
                "DELETE FROM {t} WHERE {id} IN (SELECT o.{id} FROM {t} o WHERE o.{id} <= ? \
                    AND o.{created_at} < ? \
                    AND NOT EXISTS (SELECT 1 FROM {m} g WHERE g.id = o.{id}) ORDER BY o.{id} LIMIT ?)",
                &[],
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
}
