//! Reading the log: rows past each partition's position, a partition's failed rows, rows by
//! id.

use std::collections::BTreeMap;

use sqlx::Sqlite;

use super::SqliteGroups;
use crate::storage::groups::sql::GroupDb;
use crate::storage::groups::{GroupRow, Position, Read, StateRow};
use crate::storage::{MessageId, StorageResult};

impl SqliteGroups {
    pub(super) async fn read(
        &self,
        cursors: &[(u32, Position)],
        limit: u32,
    ) -> StorageResult<Read> {
        let Some(from) = cursors.iter().map(|(_, c)| c.id).min() else {
            return Ok(Read::default());
        };
        let asked: BTreeMap<u32, i64> = cursors.iter().map(|(p, c)| (*p, c.id)).collect();
        // One walk of the id range for every partition asked.
        let span = i64::from(limit) * i64::try_from(asked.len()).unwrap_or(1);
        let raw = sqlx::query(&self.fill(
            "SELECT {message} FROM {t} WHERE {id} > ? ORDER BY {id} LIMIT ?",
            &[],
        ))
        .bind(from)
        .bind(span)
        .fetch_all(&self.pools.reader)
        .await
        .map_err(self.error("group read"))?;
        let walked = raw.len() as i64;
        let rows = self.rows(raw, "group read")?;
        let last = rows.last().map(|r| r.position);
        let rows: Vec<GroupRow> = rows
            .into_iter()
            .filter(|row| {
                asked
                    .get(&row.partition)
                    .is_some_and(|cursor| row.position.id > *cursor)
            })
            .collect();
        let more_rows = walked >= span;
        let scanned = match last {
            Some(last) => asked.keys().map(|p| (*p, last)).collect(),
            None => BTreeMap::new(),
        };
        Ok(Read {
            rows,
            scanned,
            more: if more_rows {
                asked.keys().copied().collect()
            } else {
                Vec::new()
            },
        })
    }

    pub(super) async fn load_state(
        &self,
        group: &str,
        partition: u32,
    ) -> StorageResult<Vec<StateRow>> {
        let statement = format!(
            "SELECT id, partition, key, kind, attempts, due_at, error FROM {} \
             WHERE group_name = ? AND partition = ? ORDER BY id",
            self.messages
        );
        Sqlite::load_state(&self.pools.reader, &statement, group, partition)
            .await
            .map_err(self.error("load group state"))
    }

    pub(super) async fn fetch(&self, ids: &[MessageId]) -> StorageResult<Vec<GroupRow>> {
        let list = serde_json::to_string(ids).expect("a list of ids serialises");
        let raw = sqlx::query(&self.fill(
            "SELECT {message} FROM {t} WHERE {id} IN (SELECT value FROM json_each(?)) ORDER BY {id}",
            &[],
        ))
        .bind(list)
        .fetch_all(&self.pools.reader)
        .await
        .map_err(self.error("group fetch"))?;
        self.rows(raw, "group fetch")
    }
}
