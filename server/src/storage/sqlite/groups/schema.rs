//! The groups' DDL, run once per outbox by the server that starts first, and the check of
//! what an earlier start created.

use sqlx::Executor;

use super::SqliteGroups;
use crate::config::GroupStart;
use crate::storage::{StorageError, StorageResult};

impl SqliteGroups {
    /// See [`crate::storage::groups::GroupStore::schema_sql`].
    pub(super) fn schema_sql(&self) -> String {
        self.ddl.clone()
    }

    pub(super) async fn ensure(
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
}
