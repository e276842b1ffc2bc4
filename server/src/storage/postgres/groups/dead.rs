//! A group's dead letters: listed, re-driven, discarded.

use sqlx::Row;

use super::super::convert::decode_message;
use super::PostgresGroups;
use crate::storage::groups::{DeadChange, DeadRows, GroupDead, Page};
use crate::storage::{MessageId, StorageResult};

impl PostgresGroups {
    pub(super) async fn list_dead(&self, group: &str, page: Page) -> StorageResult<Vec<GroupDead>> {
        let s = &self.sql;
        sqlx::query(&s.fill(
            "SELECT {row}, g.error AS group_error, g.updated_at AS dead_at, g.attempts AS group_attempts \
             FROM {m} g JOIN {t} o ON o.{id} = g.id \
             WHERE g.group_name = $1 AND g.kind = 'dead' AND g.id > $2 ORDER BY g.id LIMIT $3",
            &[],
        ))
        .bind(group)
        .bind(page.after_id)
        .bind(i64::from(page.limit))
        .fetch_all(&self.pool)
        .await
        .map_err(self.error("list group dead letters"))?
        .iter()
        .map(|row| {
            let mut message = decode_message(row)?;
            message.attempts = row.try_get::<i32, _>("group_attempts")?.max(0) as u32;
            Ok(GroupDead {
                message,
                error: row.try_get("group_error")?,
                dead_at: row.try_get("dead_at")?,
            })
        })
        .collect::<Result<Vec<_>, sqlx::Error>>()
        .map_err(self.error("list group dead letters"))
    }

    /// Changes dead rows and takes the partitions they are in from their owners (see
    /// [`crate::storage::groups::GroupStore::change_dead`]), in one statement.
    pub(super) async fn change_dead(
        &self,
        rows: DeadRows<'_>,
        change: DeadChange,
    ) -> StorageResult<Vec<MessageId>> {
        let s = &self.sql;
        let m = &s.messages;
        let change = match change {
            DeadChange::Redrive => format!(
                "UPDATE {m} SET kind = 'retry', attempts = 0, due_at = now(), updated_at = now()"
            ),
            DeadChange::Discard => format!("DELETE FROM {m}"),
        };
        sqlx::query_scalar(&format!(
            "WITH changed AS ({change} WHERE group_name = $1 AND id IN (SELECT id FROM {m} \
                WHERE group_name = $1 AND kind = 'dead' \
                  AND (cardinality($2::int8[]) = 0 OR id = ANY($2)) ORDER BY id LIMIT $3) \
                RETURNING id, partition), \
             fenced AS (UPDATE {p} SET owner = NULL, epoch = epoch + 1 \
                WHERE group_name = $1 AND partition IN (SELECT partition FROM changed)) \
             SELECT id FROM changed ORDER BY id",
            p = s.partitions
        ))
        .bind(rows.group)
        .bind(rows.ids)
        .bind(i64::from(rows.limit))
        .fetch_all(&self.pool)
        .await
        .map_err(self.error("change dead letters"))
    }
}
