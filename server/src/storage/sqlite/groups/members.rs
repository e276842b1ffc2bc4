//! Members and partition leases: heartbeats, taking a free partition, giving partitions
//! back, leaving.

use sqlx::Sqlite;

use super::super::convert::now_ms;
use super::{ms, pos, SqliteGroups};
use crate::storage::groups::sql::GroupDb;
use crate::storage::groups::{Heartbeat, Lease, Member, PartitionLease};
use crate::storage::StorageResult;

impl SqliteGroups {
    pub(super) async fn heartbeat(&self, lease: Lease<'_>) -> StorageResult<Heartbeat> {
        let Member { group, id: member } = lease.member;
        let now = now_ms();
        let until = now + ms(lease.duration);
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

    pub(super) async fn acquire(
        &self,
        lease: Lease<'_>,
        partition: u32,
    ) -> StorageResult<Option<PartitionLease>> {
        let now = now_ms();
        let row: Option<(i64, i64)> = sqlx::query_as(&format!(
            "UPDATE {} SET owner = ?, epoch = epoch + 1, lease_expires_at = ? \
             WHERE group_name = ? AND partition = ? AND (owner IS NULL OR lease_expires_at < ?) \
             RETURNING epoch, pos_id",
            self.parts
        ))
        .bind(lease.member.id)
        .bind(now + ms(lease.duration))
        .bind(lease.member.group)
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

    pub(super) async fn release(
        &self,
        member: Member<'_>,
        partitions: &[u32],
    ) -> StorageResult<()> {
        let list = serde_json::to_string(partitions).expect("a list of numbers serialises");
        sqlx::query(&format!(
            "UPDATE {} SET owner = NULL WHERE group_name = ? AND owner = ? \
               AND (json_array_length(?) = 0 OR partition IN (SELECT value FROM json_each(?)))",
            self.parts
        ))
        .bind(member.group)
        .bind(member.id)
        .bind(&list)
        .bind(&list)
        .execute(&self.pools.writer)
        .await
        .map_err(self.error("give back partitions"))?;
        Ok(())
    }

    pub(super) async fn leave(&self, member: Member<'_>) -> StorageResult<()> {
        self.release(member, &[]).await?;
        Sqlite::forget_member(&self.pools.writer, &self.members, member)
            .await
            .map_err(self.error("leave group"))
    }
}
