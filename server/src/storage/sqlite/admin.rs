//! What an operator (and a test) asks of a table besides the relay's claims and answers:
//! stats, the purge of delivered rows, dead letters listed, counted, re-driven and
//! discarded (see `storage/dead.rs`), blocked keys, lease holders, pauses, and the insert
//! of tests and demos. Reads run on the reader pool, writes on the writer.

use std::time::Duration;

use sqlx::sqlite::{Sqlite, SqliteArguments};
use sqlx::{Arguments, Row};

use super::convert::{
    after, before, datetime, decode_blocked, decode_messages, decode_topic_stats, json_list, now_ms,
};
use super::shape::{aliased, message, Statements};
use super::SqliteStorage;
use crate::storage::columns::insert_row;
use crate::storage::dead::{self, FilterDialect, FilterValue};
use crate::storage::sql_common;
use crate::storage::{
    BlockedKey, DeadCounts, DeadFilter, DeadLetter, LeaseHolder, MessageId, NewMessage, Pauses,
    SortedIds, Stats, StorageResult, MAX_LEASE_HOLDERS, PURGE_BATCH,
};

impl Statements {
    /// `?1` now. `status = 'pending' OR status = 'dead'` (not IN) lets the planner use the
    /// two partial indexes instead of scanning the delivered rows. A fixed topic groups by
    /// a constant: one group, or none for no rows.
    pub fn stats(&self) -> String {
        let topic = self.table.names.topic("");
        self.fill(
            "SELECT {topic_column}, \
               sum({status} = 'pending') AS pending, \
               sum({status} = 'pending' AND {leased_by} IS NOT NULL \
                 AND {available_at} > ?1) AS leased, \
               sum({status} = 'pending' AND {leased_by} IS NULL \
                 AND {available_at} > ?1) AS waiting, \
               sum({status} = 'dead') AS dead, \
               min(CASE WHEN {status} = 'pending' THEN {created_at} END) \
                 AS oldest_pending_created_at \
             FROM {t} WHERE {status} = 'pending' OR {status} = 'dead' \
             GROUP BY {topic} ORDER BY {topic}",
            &[
                ("topic_column", &aliased(&topic, "topic")),
                ("topic", &topic),
            ],
        )
    }

    /// `?1` cutoff: rows delivered after it.
    pub fn delivered_within(&self) -> String {
        self.fill(
            "SELECT count(*) FROM {t} WHERE {status} = 'done' AND {processed_at} > ?1",
            &[],
        )
    }

    /// `?1` cutoff, `?2` batch size.
    pub fn purge_batch(&self) -> String {
        self.fill(
            "DELETE FROM {t} WHERE {id} IN (\
               SELECT {id} FROM {t} WHERE {status} = 'done' AND {processed_at} < ?1 \
               LIMIT ?2)",
            &[],
        )
    }

    /// Keys whose head is not due (see `blocked.rs`): `?1` after this head id, `?2` at
    /// most, `?3` now.
    pub fn blocked_keys(&self) -> String {
        let dead = self.table.blocked_keys_dead(
            self.dead_holds_key,
            "d.{key} AS key, d.{id} AS head_id, NULL AS owner, d.{attempts} AS attempts, \
             d.{last_error} AS last_error, d.{created_at} AS created_at, \
             d.{processed_at} AS until, {waiting} AS waiting, 1 AS dead",
            ["?1", "count(*)"],
        );
        self.fill(
            "SELECT o.{key} AS key, o.{id} AS head_id, o.{leased_by} AS owner, \
               o.{attempts} AS attempts, o.{last_error} AS last_error, \
               o.{created_at} AS created_at, o.{available_at} AS until, \
               (SELECT count(*) FROM {t} b WHERE b.{key} = o.{key} \
                 AND b.{status} = 'pending' AND b.{id} > o.{id}) AS waiting, 0 AS dead \
             FROM {t} o WHERE o.{status} = 'pending' AND o.{key} IS NOT NULL \
               AND o.{available_at} > ?3 AND o.{id} > ?1 \
               AND NOT EXISTS (SELECT 1 FROM {t} p WHERE p.{key} = o.{key} \
                 AND p.{status} = 'pending' AND p.{id} < o.{id}){dead} \
             ORDER BY head_id LIMIT ?2",
            &[("dead", &dead)],
        )
    }

    /// `(owner, rows, earliest_expiry)` of the leases live at `?1`, the most rows first.
    pub fn lease_holders(&self) -> String {
        self.fill(
            "SELECT {leased_by}, count(*), min({available_at}) FROM {t} \
             WHERE {status} = 'pending' AND {leased_by} IS NOT NULL AND {available_at} > ?1 \
             GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT {max}",
            &[("max", &MAX_LEASE_HOLDERS)],
        )
    }

    /// Pauses the target `?1` at `?2` (idempotent).
    pub fn pause(&self) -> String {
        self.fill(
            "INSERT OR IGNORE INTO {pauses} (target, paused_at) VALUES (?1, ?2)",
            &[],
        )
    }

    /// Resumes the target `?1`.
    pub fn resume(&self) -> String {
        self.fill("DELETE FROM {pauses} WHERE target = ?1", &[])
    }

    /// Parameters in column order: topic (unless the topic is fixed), key, payload,
    /// headers (if the table has them).
    pub fn insert(&self) -> String {
        let inserted = self.table.names.inserted();
        let params: Vec<String> = (1..=inserted.len()).map(|n| format!("?{n}")).collect();
        self.fill(
            "INSERT INTO {t} ({columns}) VALUES ({values}) RETURNING {id}",
            &[
                ("columns", &inserted.join(", ")),
                ("values", &params.join(", ")),
            ],
        )
    }

    /// Dead rows in id order: `?1` after this id, `?2` at most; the selector's
    /// `conditions` with placeholders from `?3`.
    pub fn dead_list(&self, conditions: &str) -> String {
        self.fill(
            "SELECT {message}, coalesce(o.{last_error}, '') AS last_error, \
               o.{processed_at} AS died_at FROM {t} o \
             WHERE o.{status} = 'dead' AND o.{id} > ?1{conditions} ORDER BY o.{id} LIMIT ?2",
            &[
                ("message", &message(&self.table.names, self.max_row_bytes)),
                ("conditions", &conditions),
            ],
        )
    }

    /// Dead rows by topic and error, largest groups first, `?1` groups at most, each with
    /// the total of every group; `conditions` with placeholders from `?2`.
    pub fn dead_count(&self, conditions: &str) -> String {
        self.fill(
            "SELECT {topic} AS topic, coalesce(o.{last_error}, '') AS error, count(*) AS count, \
               sum(count(*)) OVER () AS total FROM {t} o \
             WHERE o.{status} = 'dead'{conditions} GROUP BY 1, 2 ORDER BY 3 DESC, 1, 2 LIMIT ?1",
            &[
                ("topic", &self.table.names.topic("o.")),
                ("conditions", &conditions),
            ],
        )
    }

    /// Makes the first `?1` selected dead rows pending again, attempts reset, claimable
    /// at `?2`; returns their ids. `conditions` with placeholders from `?3`.
    pub fn dead_redrive(&self, conditions: &str) -> String {
        self.fill(
            "UPDATE {t} SET {status} = 'pending', {attempts} = 0, {available_at} = ?2, \
             {leased_by} = NULL, {processed_at} = NULL WHERE {id} IN ({selected}) \
             RETURNING {id}",
            &[("selected", &self.dead_selected(conditions))],
        )
    }

    /// Deletes the first `?1` selected dead rows; returns their ids. `conditions` with
    /// placeholders from `?2`.
    pub fn dead_discard(&self, conditions: &str) -> String {
        self.fill(
            "DELETE FROM {t} WHERE {id} IN ({selected}) RETURNING {id}",
            &[("selected", &self.dead_selected(conditions))],
        )
    }

    /// The ids of the first `?1` selected dead rows, for a re-drive or a discard.
    fn dead_selected(&self, conditions: &str) -> String {
        self.fill(
            "SELECT o.{id} FROM {t} o WHERE o.{status} = 'dead'{conditions} \
             ORDER BY o.{id} LIMIT ?1",
            &[("conditions", &conditions)],
        )
    }
}

/// How the dead-letter selector is written here: numbered `?n`, ids as a JSON array.
pub(super) const FILTER: FilterDialect = FilterDialect {
    placeholder: |number| format!("?{number}"),
    in_ids: |column, next, _| format!("{column} IN (SELECT value FROM json_each({}))", next()),
    contains: |column, placeholder| format!("instr({column}, {placeholder}) > 0"),
};

impl SqliteStorage {
    pub(super) async fn topic_stats(&self) -> StorageResult<Stats> {
        let now = now_ms();
        let topics = sqlx::query(&self.sql.stats())
            .bind(now)
            .try_map(|row| decode_topic_stats(&row, now))
            .fetch_all(&self.pools.reader)
            .await
            .map_err(self.error("stats"))?;
        Ok(Stats::from_topics(topics))
    }

    pub(super) async fn delivered_count(&self, window: Duration) -> StorageResult<Option<u64>> {
        let statement = self.sql.delivered_within();
        let query = sqlx::query_scalar(&statement).bind(before(now_ms(), window));
        sql_common::delivered_count(&self.options, query, &self.pools.reader)
            .await
            .map_err(self.error("stats"))
    }

    pub(super) async fn purge_delivered(&self, older_than: Duration) -> StorageResult<u64> {
        let purge_batch = self.sql.purge_batch();
        sql_common::purge(&self.options, || async {
            // The writer is given back between batches, so claims interleave.
            let mut conn = self.writer("purge").await?;
            let done = sqlx::query(&purge_batch)
                .bind(before(now_ms(), older_than))
                .bind(PURGE_BATCH)
                .execute(&mut *conn)
                .await
                .map_err(self.error("purge"))?;
            Ok(done.rows_affected())
        })
        .await
    }

    pub(super) async fn blocked_heads(
        &self,
        after_id: MessageId,
        limit: u32,
    ) -> StorageResult<Vec<BlockedKey>> {
        sqlx::query(&self.sql.blocked_keys())
            .bind(after_id)
            .bind(i64::from(limit))
            .bind(now_ms())
            .try_map(|row| decode_blocked(&row))
            .fetch_all(&self.pools.reader)
            .await
            .map_err(self.error("blocked keys"))
    }

    pub(super) async fn holders(&self) -> StorageResult<Vec<LeaseHolder>> {
        let statement = self.sql.lease_holders();
        let query = sqlx::query_as(&statement).bind(now_ms());
        sql_common::lease_holders::<_, i64, _>(query, &self.pools.reader)
            .await
            .map_err(self.error("lease holders"))
    }

    pub(super) async fn read_pauses(&self) -> StorageResult<Pauses> {
        sql_common::read_pauses::<_, i64, _>(&self.sql.table.pauses, &self.pools.reader)
            .await
            .map_err(self.error("read the pauses"))
    }

    pub(super) async fn change_pauses(
        &self,
        topics: &[String],
        paused: bool,
    ) -> StorageResult<Pauses> {
        let (pause, resume) = (self.sql.pause(), self.sql.resume());
        let mut conn = self.writer("pause").await?;
        let now = now_ms();
        for target in Pauses::targets(topics) {
            let query = if paused {
                sqlx::query(&pause).bind(target).bind(now)
            } else {
                sqlx::query(&resume).bind(target)
            };
            query
                .execute(&mut *conn)
                .await
                .map_err(self.error("pause"))?;
        }
        drop(conn);
        self.read_pauses().await
    }

    pub(super) async fn insert_message(&self, message: NewMessage) -> StorageResult<MessageId> {
        let err = || self.error("insert");
        let row = insert_row(&self.options.columns, message)?;
        let arguments = sql_common::insert_arguments::<Sqlite>(row).map_err(err())?;
        let mut conn = self.writer("insert").await?;
        sqlx::query_scalar_with(&self.sql.insert(), arguments)
            .fetch_one(&mut *conn)
            .await
            .map_err(err())
    }
}

/// The arguments of a dead-letter statement: its own first (`leading`: ids, limits, epoch
/// milliseconds, all integers), then the selector's values in the order
/// [`dead::conditions`] rendered them: ids as a JSON array, times in epoch milliseconds
/// (see `sql`).
fn dead_arguments<'q>(
    leading: &[i64],
    values: Vec<FilterValue<'q>>,
) -> Result<SqliteArguments<'q>, sqlx::Error> {
    let mut arguments = SqliteArguments::default();
    for value in leading {
        arguments.add(*value).map_err(sqlx::Error::Encode)?;
    }
    for value in values {
        match value {
            FilterValue::Ids(ids) => arguments.add(json_list(ids)),
            FilterValue::Text(text) => arguments.add(text),
            FilterValue::Time(at) => arguments.add(at.timestamp_millis()),
        }
        .map_err(sqlx::Error::Encode)?;
    }
    Ok(arguments)
}

/// The dead-letter operations (see `dead.rs`): reads on the reader pool, writes one
/// statement each on the writer.
impl SqliteStorage {
    pub(super) async fn dead_rows(
        &self,
        filter: &DeadFilter,
        after_id: MessageId,
        limit: u32,
    ) -> StorageResult<Vec<DeadLetter>> {
        let err = || self.error("list dead letters");
        let (conditions, values) = dead::conditions(filter, &self.sql.table.names, &FILTER, 3);
        let statement = self.sql.dead_list(&conditions);
        let arguments = dead_arguments(&[after_id, i64::from(limit)], values).map_err(err())?;
        let rows = sqlx::query_with(&statement, arguments)
            .fetch_all(&self.pools.reader)
            .await
            .map_err(err())?;
        let died: Vec<Option<i64>> = rows
            .iter()
            .map(|row| row.try_get("died_at"))
            .collect::<Result<_, _>>()
            .map_err(err())?;
        let errors: Vec<String> = rows
            .iter()
            .map(|row| row.try_get("last_error"))
            .collect::<Result<_, _>>()
            .map_err(err())?;
        let messages = decode_messages(rows).map_err(err())?;
        messages
            .into_iter()
            .zip(errors)
            .zip(died)
            .map(|((message, last_error), died_at)| {
                Ok(DeadLetter {
                    message,
                    last_error,
                    died_at: died_at.map(datetime).transpose()?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(err())
    }

    pub(super) async fn dead_counts(&self, filter: &DeadFilter) -> StorageResult<DeadCounts> {
        let err = || self.error("count dead letters");
        let (conditions, values) = dead::conditions(filter, &self.sql.table.names, &FILTER, 2);
        let statement = self.sql.dead_count(&conditions);
        let arguments = dead_arguments(&[dead::MAX_COUNT_GROUPS], values).map_err(err())?;
        let rows = sqlx::query_as_with(&statement, arguments)
            .fetch_all(&self.pools.reader)
            .await
            .map_err(err())?;
        Ok(DeadCounts::from_rows(rows))
    }

    pub(super) async fn redrive_rows(
        &self,
        filter: &DeadFilter,
        limit: u32,
        delay: Duration,
    ) -> StorageResult<SortedIds> {
        let err = || self.error("re-drive dead letters");
        let (conditions, values) = dead::conditions(filter, &self.sql.table.names, &FILTER, 3);
        let statement = self.sql.dead_redrive(&conditions);
        let mut conn = self.writer("re-drive dead letters").await?;
        let arguments =
            dead_arguments(&[i64::from(limit), after(now_ms(), delay)], values).map_err(err())?;
        let ids: Vec<MessageId> = sqlx::query_scalar_with(&statement, arguments)
            .fetch_all(&mut *conn)
            .await
            .map_err(err())?;
        Ok(SortedIds::from(ids))
    }

    pub(super) async fn discard_rows(
        &self,
        filter: &DeadFilter,
        limit: u32,
    ) -> StorageResult<SortedIds> {
        let err = || self.error("discard dead letters");
        let (conditions, values) = dead::conditions(filter, &self.sql.table.names, &FILTER, 2);
        let statement = self.sql.dead_discard(&conditions);
        let mut conn = self.writer("discard dead letters").await?;
        let arguments = dead_arguments(&[i64::from(limit)], values).map_err(err())?;
        let ids: Vec<MessageId> = sqlx::query_scalar_with(&statement, arguments)
            .fetch_all(&mut *conn)
            .await
            .map_err(err())?;
        Ok(SortedIds::from(ids))
    }
}
