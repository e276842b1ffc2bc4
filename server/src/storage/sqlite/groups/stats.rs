//! What a group's stats count, and how far behind the log's frontier is.

use std::collections::BTreeMap;
use std::time::Duration;

use sqlx::Sqlite;

use super::super::convert::now_ms;
use super::{admin, SqliteGroups};
use crate::storage::groups::sql::GroupDb;
use crate::storage::groups::Holds;
use crate::storage::groups::{partition_of, GroupStats};
use crate::storage::StorageResult;

impl SqliteGroups {
    pub(super) async fn stats(&self, holds: Holds<'_>) -> StorageResult<GroupStats> {
        let group = holds.group;
        let partitions = self.partitions_of(group).await?;
        let mut lag_rows = 0u64;
        let mut oldest: Option<i64> = None;
        // Rows past each partition's position, the partition computed here.
        let from = partitions.iter().map(|p| p.position.id).min().unwrap_or(0);
        let positions: BTreeMap<u32, i64> = partitions
            .iter()
            .map(|p| (p.partition, p.position.id))
            .collect();
        let rows: Vec<(i64, Option<String>, i64)> = sqlx::query_as(&self.fill(
            "SELECT {id}, {key}, {created_at} FROM {t} WHERE {id} > ? ORDER BY {id}",
            &[],
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
        let held_by = admin::HOLDS_KEY.replace("{m}", &self.messages);
        let counts = Sqlite::state_counts(&self.pools.reader, &self.messages, &held_by, holds)
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
            partitions,
            members: members as u64,
            ..counts.into()
        })
    }

    pub(super) async fn frontier_delay(&self) -> StorageResult<Duration> {
        // One writer at a time: a committed row never waits for another transaction.
        Ok(Duration::ZERO)
    }
}
