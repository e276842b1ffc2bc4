//! Members and partition leases: heartbeats, taking a free partition, giving partitions
//! back, leaving.

use sqlx::Postgres;

use super::super::convert::interval;
use super::{decode_partition, position, PostgresGroups};
use crate::storage::groups::sql::GroupDb;
use crate::storage::groups::{Heartbeat, Lease, Member, PartitionLease};
use crate::storage::StorageResult;

impl PostgresGroups {
    pub(super) async fn heartbeat(&self, lease: Lease<'_>) -> StorageResult<Heartbeat> {
        let s = &self.sql;
        let group = lease.member.group;
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(self.error("group heartbeat"))?;
        // The member's row and its partitions' leases, in one statement.
        sqlx::query(&format!(
            "WITH alive AS (INSERT INTO {m} (group_name, member, expires_at) \
                VALUES ($1, $2, now() + $3) \
                ON CONFLICT (group_name, member) DO UPDATE SET expires_at = EXCLUDED.expires_at) \
             UPDATE {p} SET lease_expires_at = now() + $3 \
             WHERE group_name = $1 AND owner = $2 AND lease_expires_at >= now()",
            m = s.members,
            p = s.partitions
        ))
        .bind(group)
        .bind(lease.member.id)
        .bind(interval(lease.duration))
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
        lease: Lease<'_>,
        partition: u32,
    ) -> StorageResult<Option<PartitionLease>> {
        let row: Option<(i64, i64, i64)> = sqlx::query_as(&format!(
            "UPDATE {p} SET owner = $2, epoch = epoch + 1, lease_expires_at = now() + $4 \
             WHERE group_name = $1 AND partition = $3 \
               AND (owner IS NULL OR lease_expires_at < now()) \
             RETURNING epoch, pos_txid, pos_id",
            p = self.sql.partitions
        ))
        .bind(lease.member.group)
        .bind(lease.member.id)
        .bind(partition as i32)
        .bind(interval(lease.duration))
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
        member: Member<'_>,
        partitions: &[u32],
    ) -> StorageResult<()> {
        let partitions: Vec<i32> = partitions.iter().map(|p| *p as i32).collect();
        sqlx::query(&format!(
            "UPDATE {p} SET owner = NULL WHERE group_name = $1 AND owner = $2 \
               AND (cardinality($3::int4[]) = 0 OR partition = ANY($3))",
            p = self.sql.partitions
        ))
        .bind(member.group)
        .bind(member.id)
        .bind(&partitions)
        .execute(&self.pool)
        .await
        .map_err(self.error("give back partitions"))?;
        Ok(())
    }

    pub(super) async fn leave(&self, member: Member<'_>) -> StorageResult<()> {
        self.release(member, &[]).await?;
        Postgres::forget_member(&self.pool, &self.sql.members, member)
            .await
            .map_err(self.error("leave group"))
    }
}
