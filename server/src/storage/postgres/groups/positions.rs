//! Where each partition stands: positions and failed rows flushed, seeks, the purge of rows
//! every group passed.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::super::convert::interval;
use super::{Positions, PostgresGroups};
use crate::storage::groups::sql::unknown_group;
use crate::storage::groups::{Flush, Member, SeekOutcome, SeekTarget, StateRow};
use crate::storage::rows::count;
use crate::storage::{StorageResult, PURGE_BATCH};

impl PostgresGroups {
    pub(super) async fn flush(
        &self,
        member: Member<'_>,
        flushes: &[Flush],
    ) -> StorageResult<Vec<u32>> {
        let s = &self.sql;
        let parts: Vec<i32> = flushes.iter().map(|f| f.partition as i32).collect();
        let epochs: Vec<i64> = flushes.iter().map(|f| f.epoch).collect();
        let txids: Vec<Option<i64>> = flushes.iter().map(|f| f.position.map(|p| p.txid)).collect();
        let ids: Vec<Option<i64>> = flushes.iter().map(|f| f.position.map(|p| p.id)).collect();
        let mut tx = self.pool.begin().await.map_err(self.error("group flush"))?;
        let owned: Vec<i32> = sqlx::query_scalar(&format!(
            "UPDATE {p} AS p SET pos_txid = coalesce(u.tx, p.pos_txid), pos_id = coalesce(u.i, p.pos_id) \
             FROM unnest($3::int4[], $4::int8[], $5::int8[], $6::int8[]) AS u(part, ep, tx, i) \
             WHERE p.group_name = $1 AND p.partition = u.part AND p.owner = $2 AND p.epoch = u.ep \
             RETURNING p.partition",
            p = s.partitions
        ))
        .bind(member.group)
        .bind(member.id)
        .bind(&parts)
        .bind(&epochs)
        .bind(&txids)
        .bind(&ids)
        .fetch_all(&mut *tx)
        .await
        .map_err(self.error("group flush"))?;
        let is_owned = |p: u32| owned.contains(&(p as i32));
        let upserts: Vec<&StateRow> = flushes
            .iter()
            .filter(|f| is_owned(f.partition))
            .flat_map(|f| &f.upserts)
            .collect();
        if !upserts.is_empty() {
            let ids: Vec<i64> = upserts.iter().map(|r| r.id).collect();
            let partitions: Vec<i32> = upserts.iter().map(|r| r.partition as i32).collect();
            let keys: Vec<Option<String>> = upserts.iter().map(|r| r.key.clone()).collect();
            let txids: Vec<i64> = upserts.iter().map(|r| r.position.txid).collect();
            let kinds: Vec<&str> = upserts.iter().map(|r| r.kind.as_str()).collect();
            let attempts: Vec<i32> = upserts.iter().map(|r| r.attempts as i32).collect();
            let due: Vec<DateTime<Utc>> = upserts.iter().map(|r| r.due_at).collect();
            let errors: Vec<Option<String>> = upserts.iter().map(|r| r.error.clone()).collect();
            sqlx::query(&format!(
                "INSERT INTO {m} (group_name, id, partition, key, pos_txid, kind, attempts, due_at, error) \
                 SELECT $1, * FROM unnest($2::int8[], $3::int4[], $4::text[], $5::int8[], $6::text[], \
                    $7::int4[], $8::timestamptz[], $9::text[]) \
                 ON CONFLICT (group_name, id) DO UPDATE SET kind = EXCLUDED.kind, \
                    attempts = EXCLUDED.attempts, due_at = EXCLUDED.due_at, \
                    error = coalesce(EXCLUDED.error, {m}.error), updated_at = now()",
                m = s.messages
            ))
            .bind(member.group)
            .bind(&ids)
            .bind(&partitions)
            .bind(&keys)
            .bind(&txids)
            .bind(&kinds)
            .bind(&attempts)
            .bind(&due)
            .bind(&errors)
            .execute(&mut *tx)
            .await
            .map_err(self.error("group flush"))?;
        }
        let deletes: Vec<i64> = flushes
            .iter()
            .filter(|f| is_owned(f.partition))
            .flat_map(|f| f.deletes.iter().copied())
            .collect();
        if !deletes.is_empty() {
            sqlx::query(&format!(
                "DELETE FROM {m} WHERE group_name = $1 AND id = ANY($2)",
                m = s.messages
            ))
            .bind(member.group)
            .bind(&deletes)
            .execute(&mut *tx)
            .await
            .map_err(self.error("group flush"))?;
        }
        tx.commit().await.map_err(self.error("group flush"))?;
        Ok(flushes
            .iter()
            .map(|f| f.partition)
            .filter(|p| !is_owned(*p))
            .collect())
    }

    /// What a seek of `group` to `target` does, and the positions it moves to.
    pub(super) async fn plan_seek(
        &self,
        group: &str,
        target: SeekTarget,
    ) -> StorageResult<(SeekOutcome, Positions)> {
        let s = &self.sql;
        let known: Option<String> =
            sqlx::query_scalar(&format!("SELECT name FROM {} WHERE name = $1", s.groups))
                .bind(group)
                .fetch_optional(&self.pool)
                .await
                .map_err(self.error("seek group"))?;
        if known.is_none() {
            return Err(unknown_group(group));
        }
        let positions = self.positions_for(target).await?;
        let rows_ahead: i64 = sqlx::query_scalar_with(&s.fill(
            "SELECT coalesce(sum(n), 0)::int8 FROM unnest($1::int4[], $2::int8[], $3::int8[]) AS c(p, tx, i) \
             CROSS JOIN LATERAL (SELECT count(*) AS n FROM {t} o \
                WHERE {part} = c.p AND (o.txid, o.{id}) > (c.tx::text::xid8, c.i)) r",
            &[],
        ), positions.arguments())
        .fetch_one(&self.pool)
        .await
        .map_err(self.error("seek group"))?;
        let outcome = SeekOutcome {
            rows_ahead: count(rows_ahead),
            partitions: positions.len() as u32,
        };
        Ok((outcome, positions))
    }

    /// Moves the group's partitions to `positions`, takes them from their owners (a new
    /// epoch) and drops its retry and held rows, in one statement.
    pub(super) async fn move_to(&self, group: &str, positions: Positions) -> StorageResult<()> {
        let s = &self.sql;
        sqlx::query_with(
            &format!(
                "WITH moved AS (UPDATE {p} AS p \
                SET pos_txid = u.tx, pos_id = u.i, owner = NULL, epoch = p.epoch + 1 \
                FROM unnest($1::int4[], $2::int8[], $3::int8[]) AS u(part, tx, i) \
                WHERE p.group_name = $4 AND p.partition = u.part) \
             DELETE FROM {m} WHERE group_name = $4 AND kind <> 'dead'",
                p = s.partitions,
                m = s.messages
            ),
            positions.arguments(),
        )
        .bind(group)
        .execute(&self.pool)
        .await
        .map_err(self.error("seek group"))?;
        Ok(())
    }

    pub(super) async fn purge(&self, retention: Duration) -> StorageResult<u64> {
        let s = &self.sql;
        // Per partition, below the least position of every group: an index range each.
        let bounds: Vec<(i32, i64, i64)> = sqlx::query_as(&format!(
            "SELECT DISTINCT ON (partition) partition, pos_txid, pos_id FROM {p} \
             ORDER BY partition, pos_txid, pos_id",
            p = s.partitions
        ))
        .fetch_all(&self.pool)
        .await
        .map_err(self.error("purge"))?;
        let mut total = 0;
        for (partition, txid, id) in bounds {
            total += crate::storage::in_batches(|| async move {
                sqlx::query(&s.fill(
                    "DELETE FROM {t} WHERE {id} IN (SELECT o.{id} FROM {t} o \
                        WHERE {part} = $1 AND (o.txid, o.{id}) <= ($2::text::xid8, $3) \
                          AND o.{created_at} < now() - $4 \
                          AND NOT EXISTS (SELECT 1 FROM {m} g WHERE g.id = o.{id}) \
                        ORDER BY o.txid, o.{id} LIMIT $5)",
                    &[],
                ))
                .bind(partition)
                .bind(txid)
                .bind(id)
                .bind(interval(retention))
                .bind(PURGE_BATCH)
                .execute(&self.pool)
                .await
                .map(|done| done.rows_affected())
                .map_err(self.error("purge"))
            })
            .await?;
        }
        Ok(total)
    }
}
