//! Members and partition leases: heartbeats, taking a free partition, giving partitions
//! back, leaving.

use std::time::Duration;

use super::super::convert::interval;
use super::{decode_partition, position, PostgresGroups};
use crate::storage::groups::{Heartbeat, PartitionLease};
use crate::storage::StorageResult;

impl PostgresGroups {
    pub(super) async fn heartbeat(
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

    pub(super) async fn acquire(
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

    pub(super) async fn release(
        &self,
        group: &str,
        member: &str,
        partitions: &[u32],
    ) -> StorageResult<()> {
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

    pub(super) async fn leave(&self, group: &str, member: &str) -> StorageResult<()> {
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
}
