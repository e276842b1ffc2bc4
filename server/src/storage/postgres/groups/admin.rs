//! What an operator asks of a group beyond seeks and dead letters: the keys a failed row
//! holds back, and the group's pause.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sqlx::Postgres;

use super::PostgresGroups;
use crate::storage::groups::sql::{unknown_group, GroupDb};
use crate::storage::groups::{Holds, Page};
use crate::storage::{BlockedKey, StorageResult};

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
        holds: Holds<'_>,
        page: Page,
    ) -> StorageResult<Vec<BlockedKey>> {
        let s = &self.sql;
        let holds_key = HOLDS_KEY.replace("{m}", &s.messages);
        let statement = s.fill(
            "SELECT h.key, h.id, h.kind, h.attempts, h.error, h.due_at, h.updated_at, \
                    o.{created_at} AS created_at, \
                    (SELECT count(*) FROM {m} b WHERE b.group_name = $1 AND b.key = h.key \
                       AND b.kind = 'held') AS behind \
             FROM (SELECT m.*, row_number() OVER (PARTITION BY m.key \
                     ORDER BY m.kind = 'retry' DESC, m.pos_txid, m.id) AS nth \
                   FROM {m} m WHERE m.group_name = $1 AND m.key IS NOT NULL AND {holds}) h \
             JOIN {t} o ON o.{id} = h.id \
             WHERE h.nth = 1 AND h.id > $3 ORDER BY h.id LIMIT $4",
            &[("holds", &holds_key)],
        );
        Postgres::blocked_keys(&self.pool, &statement, holds, page)
            .await
            .map_err(self.error("group blocked keys"))
    }

    pub(super) async fn paused_groups(&self) -> StorageResult<BTreeMap<String, DateTime<Utc>>> {
        Postgres::paused(&self.pool, &self.sql.groups)
            .await
            .map_err(self.error("group pauses"))
    }

    /// A pause already in place keeps its time.
    pub(super) async fn set_group_paused(&self, group: &str, paused: bool) -> StorageResult<()> {
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
            return Err(unknown_group(group));
        }
        Ok(())
    }
}
