//! What an operator (and a test) asks of a table besides the relay's claims and answers:
//! stats, the purge of delivered rows, dead letters listed, counted, re-driven and
//! discarded (see `storage/dead.rs`), blocked keys, lease holders, pauses, and the insert
//! of tests and demos.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::mysql::{MySql, MySqlArguments, MySqlConnection};
use sqlx::Arguments;

use super::convert::{self, decode_blocked, decode_topic_stats, BindIds};
use super::shape::{micros, placeholders, Statements};
use super::MySqlStorage;
use crate::storage::columns::insert_row;
use crate::storage::dead::{self, FilterDialect, FilterValue};
use crate::storage::sql_common;
use crate::storage::{
    BlockedKey, DeadCounts, DeadFilter, DeadLetter, LeaseHolder, MessageId, NewMessage, Pauses,
    SortedIds, Stats, StorageResult, MAX_LEASE_HOLDERS, PURGE_BATCH,
};

impl Statements {
    /// Counts of each topic. SUM of a comparison counts the rows where it holds; SUM
    /// yields DECIMAL. A fixed topic groups by a constant: one group, or none for no rows.
    pub fn stats(&self) -> String {
        self.fill(
            "SELECT {topic} AS topic, \
               CAST(SUM({status} = 'pending') AS SIGNED) AS pending, \
               CAST(SUM({status} = 'pending' AND {leased_by} IS NOT NULL \
                 AND {available_at} > UTC_TIMESTAMP(6)) AS SIGNED) AS leased, \
               CAST(SUM({status} = 'pending' AND {leased_by} IS NULL \
                 AND {available_at} > UTC_TIMESTAMP(6)) AS SIGNED) AS waiting, \
               CAST(SUM({status} = 'dead') AS SIGNED) AS dead, \
               TIMESTAMPDIFF(MICROSECOND, \
                 MIN(CASE WHEN {status} = 'pending' THEN {created_at} END), \
                 UTC_TIMESTAMP(6)) AS oldest_pending_us \
             FROM {t} WHERE {status} IN ('pending', 'dead') \
             GROUP BY {topic} ORDER BY {topic}",
            &[("topic", &self.table.names.topic(""))],
        )
    }

    /// Rows delivered within `?` microseconds.
    pub fn delivered_within(&self) -> String {
        self.fill(
            "SELECT COUNT(*) FROM {t} WHERE {status} = 'done' \
             AND {processed_at} > UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND",
            &[],
        )
    }

    /// Deletes at most `?` rows delivered more than `?` microseconds ago.
    pub fn purge_batch(&self) -> String {
        self.fill(
            "DELETE FROM {t} WHERE {status} = 'done' \
             AND {processed_at} < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND \
             ORDER BY {processed_at} LIMIT ?",
            &[],
        )
    }

    /// Keys whose head is not due (see `blocked.rs`): `?` after this head id (twice with
    /// [`Statements::dead_holds_key`]: for the keys behind a dead row too), `?` at most.
    pub fn blocked_keys(&self) -> String {
        let dead = self.table.blocked_keys_dead(
            self.dead_holds_key,
            "d.{key}, CAST(d.{id} AS SIGNED), NULL, CAST(d.{attempts} AS SIGNED), \
             d.{last_error}, d.{created_at}, d.{processed_at}, {waiting}, CAST(1 AS SIGNED)",
            ["?", "CAST(COUNT(*) AS SIGNED)"],
        );
        self.fill(
            "SELECT o.{key} AS `key`, CAST(o.{id} AS SIGNED) AS head_id, o.{leased_by} AS owner, \
               CAST(o.{attempts} AS SIGNED) AS attempts, o.{last_error} AS last_error, \
               o.{created_at} AS created_at, o.{available_at} AS until, \
               (SELECT CAST(COUNT(*) AS SIGNED) FROM {t} b WHERE b.{key} = o.{key} \
                 AND b.{status} = 'pending' AND b.{id} > o.{id}) AS waiting, \
               CAST(0 AS SIGNED) AS dead \
             FROM {t} o WHERE o.{status} = 'pending' AND o.{key} IS NOT NULL \
               AND o.{available_at} > UTC_TIMESTAMP(6) AND o.{id} > ? \
               AND NOT EXISTS (SELECT 1 FROM {t} p WHERE p.{key} = o.{key} \
                 AND p.{status} = 'pending' AND p.{id} < o.{id}){dead} \
             ORDER BY head_id LIMIT ?",
            &[("dead", &dead)],
        )
    }

    /// `(owner, rows, earliest_expiry)` of the leases live now, the most rows first.
    pub fn lease_holders(&self) -> String {
        self.fill(
            "SELECT CAST({leased_by} AS CHAR), CAST(COUNT(*) AS SIGNED), MIN({available_at}) \
             FROM {t} \
             WHERE {status} = 'pending' AND {leased_by} IS NOT NULL \
               AND {available_at} > UTC_TIMESTAMP(6) \
             GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT {max}",
            &[("max", &MAX_LEASE_HOLDERS)],
        )
    }

    /// Pauses the target `?` (idempotent).
    pub fn pause(&self) -> String {
        self.fill(
            "INSERT IGNORE INTO {pauses} (target, paused_at) VALUES (?, UTC_TIMESTAMP(6))",
            &[],
        )
    }

    /// Resumes the target `?`.
    pub fn resume(&self) -> String {
        self.fill("DELETE FROM {pauses} WHERE target = ?", &[])
    }

    /// Parameters in column order: topic (unless the topic is fixed), key, payload,
    /// headers (if the table has them).
    pub fn insert(&self) -> String {
        let inserted = self.table.names.inserted();
        self.fill(
            "INSERT INTO {t} ({columns}) VALUES ({values})",
            &[
                ("columns", &inserted.join(", ")),
                ("values", &placeholders(inserted.len())),
            ],
        )
    }

    // The dead-letter statements (see `storage/dead.rs`), rendered per call: the
    // selector's `conditions` vary. Placeholders are `?` in the order the statement reads.

    /// Dead rows in id order: `?` after this id, the selector, `?` at most.
    pub fn dead_list(&self, conditions: &str) -> String {
        self.fill(
            "SELECT {message}, \
               COALESCE(o.{last_error}, '') AS last_error, o.{processed_at} AS died_at \
             FROM {t} o WHERE o.{status} = 'dead' AND o.{id} > ?{conditions} \
             ORDER BY o.{id} LIMIT ?",
            &[("message", &self.message()), ("conditions", &conditions)],
        )
    }

    /// Dead rows by topic and error, largest groups first, each with the total of every
    /// group: the selector, then `?` groups at most.
    pub fn dead_count(&self, conditions: &str) -> String {
        self.fill(
            "SELECT {topic} AS topic, COALESCE(o.{last_error}, '') AS error, \
               CAST(COUNT(*) AS SIGNED) AS count, \
               CAST(SUM(COUNT(*)) OVER () AS SIGNED) AS total \
             FROM {t} o WHERE o.{status} = 'dead'{conditions} \
             GROUP BY 1, 2 ORDER BY 3 DESC, 1, 2 LIMIT ?",
            &[
                ("topic", &self.table.names.topic("o.")),
                ("conditions", &conditions),
            ],
        )
    }

    /// Locks the first `?` selected dead rows (the selector first), in id order, for a
    /// re-drive or a discard in the same transaction.
    pub fn dead_lock(&self, conditions: &str) -> String {
        self.fill(
            "SELECT CAST(o.{id} AS SIGNED) FROM {t} o WHERE o.{status} = 'dead'{conditions} \
             ORDER BY o.{id} LIMIT ? FOR UPDATE SKIP LOCKED",
            &[("conditions", &conditions)],
        )
    }

    /// Makes `n` locked dead rows pending again: `?` delay in microseconds, then the ids.
    pub fn dead_redrive(&self, n: usize) -> String {
        self.fill(
            "UPDATE {t} SET {status} = 'pending', {attempts} = 0, \
             {available_at} = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, {leased_by} = NULL, \
             {processed_at} = NULL WHERE {id} IN ({ids})",
            &[("ids", &placeholders(n))],
        )
    }

    /// Deletes `n` locked dead rows.
    pub fn dead_discard(&self, n: usize) -> String {
        self.fill(
            "DELETE FROM {t} WHERE {id} IN ({ids})",
            &[("ids", &placeholders(n))],
        )
    }
}

/// How the dead-letter selector is written here: `?` in reading order, one per id.
pub(crate) const FILTER: FilterDialect = FilterDialect {
    placeholder: |_| "?".to_owned(),
    in_ids: |column, next, count| {
        let list: Vec<String> = (0..count).map(|_| next()).collect();
        format!("{column} IN ({})", list.join(", "))
    },
    contains: |column, placeholder| format!("LOCATE({placeholder}, {column}) > 0"),
};

impl MySqlStorage {
    pub(super) async fn topic_stats(&self) -> StorageResult<Stats> {
        let topics = sqlx::query(&self.sql.stats())
            .try_map(|row| decode_topic_stats(&row))
            .fetch_all(&self.conn.pool)
            .await
            .map_err(self.conn.error("stats"))?;
        Ok(Stats::from_topics(topics))
    }

    pub(super) async fn delivered_count(&self, window: Duration) -> StorageResult<Option<u64>> {
        let statement = self.sql.delivered_within();
        let query = sqlx::query_scalar(&statement).bind(micros(window));
        sql_common::delivered_count(&self.options, query, &self.conn.pool)
            .await
            .map_err(self.conn.error("stats"))
    }

    pub(super) async fn purge_delivered(&self, older_than: Duration) -> StorageResult<u64> {
        let purge_batch = self.sql.purge_batch();
        sql_common::purge(&self.options, || async {
            let done = self
                .conn
                .retrying("purge", || {
                    sqlx::query(&purge_batch)
                        .bind(micros(older_than))
                        .bind(PURGE_BATCH)
                        .execute(&self.conn.pool)
                })
                .await?;
            Ok(done.rows_affected())
        })
        .await
    }

    pub(super) async fn blocked_heads(
        &self,
        after_id: MessageId,
        limit: u32,
    ) -> StorageResult<Vec<BlockedKey>> {
        let statement = self.sql.blocked_keys();
        let mut query = sqlx::query(&statement).bind(after_id);
        if self.sql.dead_holds_key {
            // The keys behind a dead row start after the same id.
            query = query.bind(after_id);
        }
        query
            .bind(i64::from(limit))
            .try_map(|row| decode_blocked(&row))
            .fetch_all(&self.conn.pool)
            .await
            .map_err(self.conn.error("blocked keys"))
    }

    pub(super) async fn holders(&self) -> StorageResult<Vec<LeaseHolder>> {
        let statement = self.sql.lease_holders();
        let query = sqlx::query_as(&statement);
        sql_common::lease_holders::<_, DateTime<Utc>, _>(query, &self.conn.pool)
            .await
            .map_err(self.conn.error("lease holders"))
    }

    pub(super) async fn read_pauses(&self) -> StorageResult<Pauses> {
        sql_common::read_pauses::<_, DateTime<Utc>, _>(&self.sql.table.pauses, &self.conn.pool)
            .await
            .map_err(self.conn.error("read the pauses"))
    }

    pub(super) async fn change_pauses(
        &self,
        topics: &[String],
        paused: bool,
    ) -> StorageResult<Pauses> {
        let statement = if paused {
            self.sql.pause()
        } else {
            self.sql.resume()
        };
        // One statement per target, each idempotent: a call cut short is repeated.
        for target in Pauses::targets(topics) {
            sqlx::query(&statement)
                .bind(target)
                .execute(&self.conn.pool)
                .await
                .map_err(self.conn.error("pause"))?;
        }
        self.read_pauses().await
    }

    pub(super) async fn insert_message(&self, message: NewMessage) -> StorageResult<MessageId> {
        let row = insert_row(&self.options.columns, message)?;
        let err = || self.conn.error("insert");
        let arguments = sql_common::insert_arguments::<MySql>(row).map_err(err())?;
        let done = sqlx::query_with(&self.sql.insert(), arguments)
            .execute(&self.conn.pool)
            .await
            .map_err(err())?;
        Ok(done.last_insert_id() as MessageId)
    }
}

/// The arguments of a dead-letter statement: `leading` (an id), the selector's values in
/// the order [`dead::conditions`] rendered them (one `?` per id), then the `limit`.
fn dead_arguments(
    leading: &[i64],
    values: &[FilterValue<'_>],
    limit: i64,
) -> Result<MySqlArguments, sqlx::Error> {
    let mut arguments = MySqlArguments::default();
    for value in leading {
        arguments.add(*value).map_err(sqlx::Error::Encode)?;
    }
    for value in values {
        match value {
            FilterValue::Ids(ids) => {
                for id in *ids {
                    arguments.add(*id).map_err(sqlx::Error::Encode)?;
                }
            }
            FilterValue::Text(text) => arguments.add(*text).map_err(sqlx::Error::Encode)?,
            FilterValue::Time(at) => arguments.add(*at).map_err(sqlx::Error::Encode)?,
        }
    }
    arguments.add(limit).map_err(sqlx::Error::Encode)?;
    Ok(arguments)
}

/// The dead-letter operations (see `dead.rs`), one attempt each.
impl MySqlStorage {
    pub(super) async fn dead_rows(
        &self,
        filter: &DeadFilter,
        after_id: MessageId,
        limit: u32,
    ) -> Result<Vec<DeadLetter>, sqlx::Error> {
        let (conditions, values) = dead::conditions(filter, &self.sql.table.names, &FILTER, 1);
        let arguments = dead_arguments(&[after_id], &values, i64::from(limit))?;
        let statement = self.sql.dead_list(&conditions);
        let rows = sqlx::query_with(&statement, arguments)
            .fetch_all(&self.conn.pool)
            .await?;
        rows.iter().map(convert::decode_dead).collect()
    }

    pub(super) async fn dead_counts(&self, filter: &DeadFilter) -> Result<DeadCounts, sqlx::Error> {
        let (conditions, values) = dead::conditions(filter, &self.sql.table.names, &FILTER, 1);
        let arguments = dead_arguments(&[], &values, dead::MAX_COUNT_GROUPS)?;
        let statement = self.sql.dead_count(&conditions);
        let rows = sqlx::query_with(&statement, arguments)
            .fetch_all(&self.conn.pool)
            .await?;
        let rows = rows
            .iter()
            .map(convert::decode_dead_count)
            .collect::<Result<_, _>>()?;
        Ok(DeadCounts::from_rows(rows))
    }

    /// Locks the first `limit` selected dead rows in `conn`'s transaction.
    async fn lock_dead(
        &self,
        conn: &mut MySqlConnection,
        filter: &DeadFilter,
        limit: u32,
    ) -> Result<Vec<MessageId>, sqlx::Error> {
        let (conditions, values) = dead::conditions(filter, &self.sql.table.names, &FILTER, 1);
        let arguments = dead_arguments(&[], &values, i64::from(limit))?;
        let statement = self.sql.dead_lock(&conditions);
        sqlx::query_scalar_with(&statement, arguments)
            .fetch_all(conn)
            .await
    }

    pub(super) async fn redrive_once(
        &self,
        filter: &DeadFilter,
        limit: u32,
        delay: Duration,
    ) -> Result<SortedIds, sqlx::Error> {
        let mut tx = self.conn.pool.begin().await?;
        let ids = self.lock_dead(&mut tx, filter, limit).await?;
        if !ids.is_empty() {
            let statement = self.sql.dead_redrive(ids.len());
            sqlx::query(&statement)
                .bind(micros(delay))
                .bind_ids(&ids)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(SortedIds::from(ids))
    }

    pub(super) async fn discard_once(
        &self,
        filter: &DeadFilter,
        limit: u32,
    ) -> Result<SortedIds, sqlx::Error> {
        let mut tx = self.conn.pool.begin().await?;
        let ids = self.lock_dead(&mut tx, filter, limit).await?;
        if !ids.is_empty() {
            let statement = self.sql.dead_discard(ids.len());
            sqlx::query(&statement)
                .bind_ids(&ids)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(SortedIds::from(ids))
    }
}
