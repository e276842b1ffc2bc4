//! What an operator asks of a group beyond seeks and dead letters: the keys a failed row
//! holds back, and the group's pause.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sqlx::Row;

use super::PostgresGroups;
use crate::storage::{BlockedKey, HeadState, MessageId, StorageError, StorageResult};

/// A state row `m` of `{m}` that holds its key: a retry, or (with `$2`, the group's
/// `dead_letter_holds_key`) a dead row with rows of its key held behind it. `Stats`
/// counts the keys of these rows, `ListBlockedKeys` lists them.
pub(super) const HOLDS_KEY: &str = "(m.kind = 'retry' OR ($2 AND m.kind = 'dead' AND EXISTS (\
    SELECT 1 FROM {m} b WHERE b.group_name = m.group_name AND b.key = m.key \
    AND b.kind = 'held' AND (b.pos_txid, b.id) > (m.pos_txid, m.id))))";

impl PostgresGroups {
    /// Per key, its first holding row (a retry before a dead row), by head id.
    pub(super) async fn blocked_keys_of(
        &self,
        group: &str,
        dead_holds_key: bool,
        after_id: MessageId,
        limit: u32,
    ) -> StorageResult<Vec<BlockedKey>> {
        let s = &self.sql;
        let rows = sqlx::query(&format!(
            "SELECT h.key, h.id, h.kind, h.attempts, h.error, h.due_at, h.updated_at, \
                    {created_at} AS created_at, \
                    (SELECT count(*) FROM {m} b WHERE b.group_name = $1 AND b.key = h.key \
                       AND b.kind = 'held') AS behind \
             FROM (SELECT m.*, row_number() OVER (PARTITION BY m.key \
                     ORDER BY m.kind = 'retry' DESC, m.pos_txid, m.id) AS nth \
                   FROM {m} m WHERE m.group_name = $1 AND m.key IS NOT NULL AND {holds}) h \
             JOIN {t} o ON o.id = h.id \
             WHERE h.nth = 1 AND h.id > $3 ORDER BY h.id LIMIT $4",
            created_at = s.created_at,
            m = s.messages,
            t = s.table,
            holds = HOLDS_KEY.replace("{m}", &s.messages),
        ))
        .bind(group)
        .bind(dead_holds_key)
        .bind(after_id)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(self.error("group blocked keys"))?;
        rows.iter()
            .map(|row| {
                let dead = row.try_get::<String, _>("kind")? == "dead";
                Ok(BlockedKey {
                    key: row.try_get("key")?,
                    head_id: row.try_get("id")?,
                    state: HeadState::of(dead, None),
                    owner: None,
                    attempts: row.try_get::<i32, _>("attempts")?.max(0) as u32,
                    last_error: row.try_get("error")?,
                    head_created_at: row.try_get("created_at")?,
                    until: row.try_get(if dead { "updated_at" } else { "due_at" })?,
                    waiting_behind: row.try_get::<i64, _>("behind")?.max(0) as u64,
                })
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()
            .map_err(self.error("group blocked keys"))
    }

    pub(super) async fn paused_groups(&self) -> StorageResult<BTreeMap<String, DateTime<Utc>>> {
        let rows: Vec<(String, DateTime<Utc>)> = sqlx::query_as(&format!(
            "SELECT name, paused_at FROM {} WHERE paused_at IS NOT NULL",
            self.sql.groups
        ))
        .fetch_all(&self.pool)
        .await
        .map_err(self.error("group pauses"))?;
        Ok(rows.into_iter().collect())
    }

    /// A pause already in place keeps its time.
    pub(super) async fn set_group_paused(
        &self,
        group: &str,
        paused: bool,
    ) -> StorageResult<BTreeMap<String, DateTime<Utc>>> {
        let changed = sqlx::query(&format!(
            "UPDATE {} SET paused_at = CASE WHEN $2 THEN coalesce(paused_at, now()) END \
             WHERE name = $1",
            self.sql.groups
        ))
        .bind(group)
        .bind(paused)
        .execute(&self.pool)
        .await
        .map_err(self.error("pause group"))?;
        if changed.rows_affected() == 0 {
            return Err(StorageError::InvalidMessage(format!(
                "group {group} has no partitions yet: start the server with it configured first"
            )));
        }
        self.paused_groups().await
    }
}
