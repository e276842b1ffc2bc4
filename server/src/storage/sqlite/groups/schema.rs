//! The groups' DDL, run once per outbox by the server that starts first, and the check of
//! what an earlier start created.

use sqlx::{Executor, Sqlite};

use super::SqliteGroups;
use crate::config::GroupStart;
use crate::storage::groups::sql::{groups_missing, partitions_changed, GroupDb};
use crate::storage::groups::OutboxGroups;
use crate::storage::StorageResult;

impl SqliteGroups {
    /// See [`crate::storage::groups::GroupStore::schema_sql`].
    pub(super) fn schema_sql(&self) -> String {
        self.ddl.clone()
    }

    pub(super) async fn ensure(&self, outbox: OutboxGroups<'_>, create: bool) -> StorageResult<()> {
        let OutboxGroups { groups, partitions } = outbox;
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
        if !create {
            let present: Option<String> = sqlx::query_scalar(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name = ?",
            )
            .bind(format!("{}_group_messages", self.place.table))
            .fetch_optional(&mut *tx)
            .await
            .map_err(self.error("check groups"))?;
            if present.is_none() {
                return Err(groups_missing(&self.place.table, "tables"));
            }
        }
        let mismatched = Sqlite::other_partitions(&mut *tx, &self.groups, partitions)
            .await
            .map_err(self.error("check groups"))?;
        if let Some((group, was)) = mismatched {
            return Err(partitions_changed(
                &self.place.table,
                &group,
                was,
                partitions,
            ));
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
                GroupStart::Now => sqlx::query_scalar(&self.last_id_sql())
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(self.error("create groups"))?,
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
