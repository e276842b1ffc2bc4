//! What a group's stats count, and how far behind the log's frontier is.

use std::time::Duration;

use sqlx::Postgres;

use super::{admin, decode_partition, Positions, PostgresGroups};
use crate::storage::groups::sql::GroupDb;
use crate::storage::groups::GroupStats;
use crate::storage::groups::Holds;
use crate::storage::StorageResult;

impl PostgresGroups {
    pub(super) async fn stats(&self, holds: Holds<'_>) -> StorageResult<GroupStats> {
        let group = holds.group;
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
        let positions: Positions = partitions
            .iter()
            .map(|p| (p.partition, &p.position))
            .collect();
        let (lag_rows, oldest): (i64, Option<f64>) = sqlx::query_as_with(
            &s.fill(
            "SELECT coalesce(sum(r.n), 0)::int8, extract(epoch FROM now() - min(r.oldest))::float8 \
             FROM unnest($1::int4[], $2::int8[], $3::int8[]) AS c(p, tx, i) \
             CROSS JOIN LATERAL (SELECT count(*) AS n, min(o.{created_at}) AS oldest FROM {t} o \
                WHERE {part} = c.p AND (o.txid, o.{id}) > (c.tx::text::xid8, c.i) \
                  AND o.txid < pg_snapshot_xmin(pg_current_snapshot())) r",
            &[],
        ),
            positions.arguments(),
        )
        .fetch_one(&self.pool)
        .await
        .map_err(self.error("group stats"))?;
        let held_by = admin::HOLDS_KEY.replace("{m}", &s.messages);
        let counts = Postgres::state_counts(&self.pool, &s.messages, &held_by, holds)
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
            partitions,
            members: members as u64,
            ..counts.into()
        })
    }

    pub(super) async fn frontier_delay(&self) -> StorageResult<Duration> {
        let secs: Option<f64> = sqlx::query_scalar(
            "SELECT extract(epoch FROM now() - min(xact_start))::float8 FROM pg_stat_activity \
             WHERE backend_xid IS NOT NULL AND pid <> pg_backend_pid()",
        )
        .fetch_one(&self.pool)
        .await
        .map_err(self.error("frontier delay"))?;
        Ok(Duration::from_secs_f64(secs.unwrap_or(0.0).max(0.0)))
    }
}
