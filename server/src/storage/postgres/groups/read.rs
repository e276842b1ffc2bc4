//! Reading the log: rows past each partition's position, a partition's failed rows, rows by
//! id.

use std::collections::BTreeMap;

use sqlx::Postgres;

use super::{decode_group_row, Positions, PostgresGroups};
use crate::storage::groups::sql::GroupDb;
use crate::storage::groups::{GroupRow, Position, Read, StateRow};
use crate::storage::{MessageId, StorageResult};

impl PostgresGroups {
    pub(super) async fn read(
        &self,
        cursors: &[(u32, Position)],
        limit: u32,
    ) -> StorageResult<Read> {
        if cursors.is_empty() {
            return Ok(Read::default());
        }
        let s = &self.sql;
        let positions: Positions = cursors.iter().map(|(p, at)| (*p, at)).collect();
        let rows = sqlx::query_with(
            &s.fill(
                "SELECT r.* FROM unnest($1::int4[], $2::int8[], $3::int8[]) AS c(p, tx, i) \
             CROSS JOIN LATERAL ( \
                SELECT {row} FROM {t} o \
                WHERE {part} = c.p AND (o.txid, o.{id}) > (c.tx::text::xid8, c.i) \
                  AND o.txid < pg_snapshot_xmin(pg_current_snapshot()) \
                ORDER BY o.txid, o.{id} LIMIT $4) r",
                &[],
            ),
            positions.arguments(),
        )
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(self.error("group read"))?;
        let rows = rows
            .iter()
            .map(decode_group_row)
            .collect::<Result<Vec<_>, _>>()
            .map_err(self.error("group read"))?;
        let mut counts: BTreeMap<u32, u32> = BTreeMap::new();
        let mut scanned = BTreeMap::new();
        for row in &rows {
            *counts.entry(row.partition).or_default() += 1;
            scanned.insert(row.partition, row.position);
        }
        let more = counts
            .into_iter()
            .filter(|(_, count)| *count >= limit)
            .map(|(p, _)| p)
            .collect();
        Ok(Read {
            rows,
            scanned,
            more,
        })
    }

    pub(super) async fn load_state(
        &self,
        group: &str,
        partition: u32,
    ) -> StorageResult<Vec<StateRow>> {
        let statement = format!(
            "SELECT id, partition, key, pos_txid, kind, attempts, due_at, error FROM {m} \
             WHERE group_name = $1 AND partition = $2 ORDER BY pos_txid, id",
            m = self.sql.messages
        );
        Postgres::load_state(&self.pool, &statement, group, partition)
            .await
            .map_err(self.error("load group state"))
    }

    pub(super) async fn fetch(&self, ids: &[MessageId]) -> StorageResult<Vec<GroupRow>> {
        let s = &self.sql;
        sqlx::query(&s.fill(
            "SELECT {row} FROM {t} o WHERE o.{id} = ANY($1) ORDER BY o.txid, o.{id}",
            &[],
        ))
        .bind(ids)
        .fetch_all(&self.pool)
        .await
        .map_err(self.error("group fetch"))?
        .iter()
        .map(decode_group_row)
        .collect::<Result<Vec<_>, _>>()
        .map_err(self.error("group fetch"))
    }
}
