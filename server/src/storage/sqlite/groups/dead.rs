//! A group's dead letters: listed, re-driven, discarded.

use std::collections::BTreeSet;

use super::super::convert::{datetime, now_ms};
use super::SqliteGroups;
use crate::storage::groups::{DeadChange, DeadRows, GroupDead, Page};
use crate::storage::{MessageId, StorageResult};

impl SqliteGroups {
    pub(super) async fn list_dead(&self, group: &str, page: Page) -> StorageResult<Vec<GroupDead>> {
        let dead: Vec<(i64, i64, Option<String>, i64)> = sqlx::query_as(&format!(
            "SELECT id, attempts, error, updated_at FROM {} WHERE group_name = ? AND kind = 'dead' \
               AND id > ? ORDER BY id LIMIT ?",
            self.messages
        ))
        .bind(group)
        .bind(page.after_id)
        .bind(i64::from(page.limit))
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

    /// Changes dead rows and takes the partitions they are in from their owners (see
    /// [`crate::storage::groups::GroupStore::change_dead`]), in one transaction.
    pub(super) async fn change_dead(
        &self,
        rows: DeadRows<'_>,
        change: DeadChange,
    ) -> StorageResult<Vec<MessageId>> {
        let DeadRows { group, ids, limit } = rows;
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
            let sql = match change {
                DeadChange::Redrive => format!(
                    "UPDATE {} SET kind = 'retry', attempts = 0, due_at = ?, updated_at = ? \
                     WHERE group_name = ? AND id = ?",
                    self.messages
                ),
                DeadChange::Discard => format!(
                    "DELETE FROM {} WHERE group_name = ? AND id = ?",
                    self.messages
                ),
            };
            let query = match change {
                DeadChange::Redrive => sqlx::query(&sql).bind(now_ms()).bind(now_ms()),
                DeadChange::Discard => sqlx::query(&sql),
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
