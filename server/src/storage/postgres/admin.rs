//! What an operator (and a test) asks of a table besides the relay's claims and answers:
//! stats, the purge of delivered rows, dead letters listed, counted, re-driven and
//! discarded (see `storage/dead.rs`), blocked keys, lease holders, pauses, and the insert
//! of tests and demos.

use std::fmt::Display;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::types::Json;
use sqlx::{FromRow, Row};
use tokio::time::Instant;

use super::convert::{decode_blocked, decode_message, decode_topic_stats, interval};
use super::shape::{insert, message, Shape, StrictObjects};
use super::Shared;
use crate::config::columns::Columns;
use crate::storage::columns::{insert_row, InsertPayload};
use crate::storage::dead::{self, DeadCountRow, FilterDialect, FilterValue};
use crate::storage::names::Names;
use crate::storage::{
    blocked, in_batches, BlockedKey, DeadCounts, DeadFilter, DeadLetter, LeaseHolder, MessageId,
    NewMessage, Pauses, SortedIds, Stats, StorageResult, MAX_LEASE_HOLDERS, PURGE_BATCH,
};

/// The operator's statements for one table (those whose dead-letter selector varies are
/// rendered per call).
pub(super) struct Admin {
    shared: Shared,
    /// The table as the statements name it: quoted, with its schema when configured.
    table: String,
    /// The columns as they appear in SQL, for the statements rendered per call.
    names: Names,
    columns: Columns,
    max_row_bytes: u64,
    stats: String,
    /// Rows delivered within `$1` (the processed index of delivered rows); `None` with
    /// `delete_on_ack`, which keeps no delivered rows.
    delivered_within: Option<String>,
    purge_batch: String,
    /// Keys whose head is not due (see `blocked.rs`): `$1` after this head id, `$2` at
    /// most. With strict ordering, through the key-heads table ([`strict_blocked_keys`]).
    blocked_keys: String,
    /// `(owner, rows, earliest_expiry)` of the leases live now, the most rows first.
    lease_holders: String,
    /// The outbox's pauses `(target, paused_at)`; pause the targets `$1` (idempotent);
    /// resume them (see [`crate::storage::pauses`]).
    pauses: String,
    pause: String,
    resume: String,
    insert: String,
}

impl Admin {
    pub fn new(shared: Shared, shape: &Shape<'_>, delete_on_ack: bool) -> Self {
        let t = shape.table_sql();
        let n = shape.names();
        let pauses = shape.pauses_table();
        let table = [("t", &t as &dyn Display)];
        Self {
            // `status = 'pending' OR status = 'dead'` (not IN) lets the planner OR the two
            // partial indexes instead of scanning the delivered rows.
            stats: n.fill(
                "SELECT {topic} AS topic, \
                   count(*) FILTER (WHERE {status} = 'pending') AS pending, \
                   count(*) FILTER (WHERE {status} = 'pending' AND {leased_by} IS NOT NULL \
                     AND {available_at} > statement_timestamp()) AS leased, \
                   count(*) FILTER (WHERE {status} = 'pending' AND {leased_by} IS NULL \
                     AND {available_at} > statement_timestamp()) AS waiting, \
                   count(*) FILTER (WHERE {status} = 'dead') AS dead, \
                   EXTRACT(EPOCH FROM statement_timestamp() \
                     - min({created_at}) FILTER (WHERE {status} = 'pending'))::float8 \
                     AS oldest_pending_secs \
                 FROM {t} o WHERE {status} = 'pending' OR {status} = 'dead' \
                 GROUP BY 1 ORDER BY 1",
                &[("t", &t), ("topic", &n.topic("o."))],
            ),
            delivered_within: (!delete_on_ack).then(|| {
                n.fill(
                    "SELECT count(*) FROM {t} WHERE {status} = 'done' \
                     AND {processed_at} > statement_timestamp() - $1::interval",
                    &table,
                )
            }),
            purge_batch: n.fill(
                "DELETE FROM {t} WHERE {id} IN (\
                   SELECT {id} FROM {t} WHERE {status} = 'done' \
                   AND {processed_at} < statement_timestamp() - $1::interval LIMIT $2)",
                &table,
            ),
            blocked_keys: match shape.options.strict_ordering {
                true => {
                    let heads = StrictObjects::new(shape).heads;
                    strict_blocked_keys(&t, &heads, &n, shape.options.dead_holds_key())
                }
                false => blocked_keys(&t, &n),
            },
            lease_holders: n.fill(
                "SELECT {leased_by}::text, count(*)::int8, min({available_at}) FROM {t} \
                 WHERE {status} = 'pending' AND {leased_by} IS NOT NULL \
                   AND {available_at} > statement_timestamp() \
                 GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT {MAX_LEASE_HOLDERS}",
                &[("t", &t), ("MAX_LEASE_HOLDERS", &MAX_LEASE_HOLDERS)],
            ),
            pauses: format!("SELECT target, paused_at FROM {pauses} ORDER BY target"),
            pause: format!(
                "INSERT INTO {pauses} (target, paused_at) \
                 SELECT t, statement_timestamp() FROM unnest($1::text[]) AS t \
                 ON CONFLICT (target) DO NOTHING"
            ),
            resume: format!("DELETE FROM {pauses} WHERE target = ANY($1::text[])"),
            insert: insert(&n, &t),
            columns: shape.options.columns.clone(),
            max_row_bytes: shape.options.max_row_bytes,
            names: n,
            table: t,
            shared,
        }
    }

    pub async fn stats(&self) -> StorageResult<Stats> {
        let rows = sqlx::query(&self.stats)
            .fetch_all(&self.shared.conn.pool)
            .await
            .map_err(self.shared.conn.error("stats"))?;
        let topics = rows
            .iter()
            .map(decode_topic_stats)
            .collect::<Result<Vec<_>, _>>()
            .map_err(self.shared.conn.error("stats"))?;
        Ok(Stats::from_topics(topics))
    }

    pub async fn delivered_within(&self, window: Duration) -> StorageResult<Option<u64>> {
        let Some(statement) = &self.delivered_within else {
            return Ok(None);
        };
        let delivered: i64 = sqlx::query_scalar(statement)
            .bind(interval(window))
            .fetch_one(&self.shared.conn.pool)
            .await
            .map_err(self.shared.conn.error("stats"))?;
        Ok(Some(crate::storage::rows::count(delivered)))
    }

    /// Delivered rows older than `older_than`, and with strict ordering the heads rows of
    /// drained keys; with `delete_on_ack` there are no delivered rows, only drained heads.
    pub async fn purge(&self, older_than: Duration) -> StorageResult<u64> {
        let purged = if self.delivered_within.is_none() {
            0
        } else {
            in_batches(|| async {
                let done = sqlx::query(&self.purge_batch)
                    .bind(interval(older_than))
                    .bind(PURGE_BATCH)
                    .execute(&self.shared.conn.pool)
                    .await
                    .map_err(self.shared.conn.error("purge"))?;
                Ok(done.rows_affected())
            })
            .await?
        };
        if let Some(strict) = &self.shared.strict {
            strict.purge_drained().await?;
        }
        tracing::debug!(purged, "purged delivered rows");
        Ok(purged)
    }

    pub async fn blocked_keys(
        &self,
        after_id: MessageId,
        limit: u32,
    ) -> StorageResult<Vec<BlockedKey>> {
        let rows = sqlx::query(&self.blocked_keys)
            .bind(after_id)
            .bind(i64::from(limit))
            .fetch_all(&self.shared.conn.pool)
            .await
            .map_err(self.shared.conn.error("blocked keys"))?;
        rows.iter()
            .map(decode_blocked)
            .collect::<Result<_, _>>()
            .map_err(self.shared.conn.error("blocked keys"))
    }

    pub async fn lease_holders(&self) -> StorageResult<Vec<LeaseHolder>> {
        let rows: Vec<(String, i64, DateTime<Utc>)> = sqlx::query_as(&self.lease_holders)
            .fetch_all(&self.shared.conn.pool)
            .await
            .map_err(self.shared.conn.error("lease holders"))?;
        Ok(LeaseHolder::from_rows(rows))
    }

    pub async fn pauses(&self) -> StorageResult<Pauses> {
        let rows: Vec<(String, DateTime<Utc>)> = sqlx::query_as(&self.pauses)
            .fetch_all(&self.shared.conn.pool)
            .await
            .map_err(self.shared.conn.error("read the pauses"))?;
        Ok(Pauses::from_rows(rows))
    }

    pub async fn set_paused(&self, topics: &[String], paused: bool) -> StorageResult<Pauses> {
        let statement = if paused { &self.pause } else { &self.resume };
        sqlx::query(statement)
            .bind(Pauses::targets(topics))
            .execute(&self.shared.conn.pool)
            .await
            .map_err(self.shared.conn.error("pause"))?;
        self.pauses().await
    }

    pub async fn insert(&self, message: NewMessage) -> StorageResult<MessageId> {
        let row = insert_row(&self.columns, message)?;
        let mut query = sqlx::query_scalar(&self.insert);
        if let Some(topic) = row.topic {
            query = query.bind(topic);
        }
        query = query.bind(row.key);
        query = match row.payload {
            InsertPayload::Bytes(bytes) => query.bind(bytes),
            InsertPayload::Text(text) => query.bind(text),
        };
        if let Some(headers) = row.headers {
            query = query.bind(Json(headers));
        }
        query
            .fetch_one(&self.shared.conn.pool)
            .await
            .map_err(self.shared.conn.error("insert"))
    }

    pub async fn list_dead(
        &self,
        filter: &DeadFilter,
        after_id: MessageId,
        limit: u32,
    ) -> StorageResult<Vec<DeadLetter>> {
        let err = || self.shared.conn.error("list dead letters");
        let (conditions, values) = dead::conditions(filter, &self.names, &FILTER, 3);
        let statement = self.dead_list(&conditions);
        let query = sqlx::query(&statement)
            .bind(after_id)
            .bind(i64::from(limit));
        let rows = bind_filter(query, values)
            .fetch_all(&self.shared.conn.pool)
            .await
            .map_err(err())?;
        rows.iter()
            .map(|row| {
                Ok(DeadLetter {
                    message: decode_message(row)?,
                    last_error: row.try_get("last_error")?,
                    died_at: row.try_get("died_at")?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(err())
    }

    pub async fn count_dead(&self, filter: &DeadFilter) -> StorageResult<DeadCounts> {
        let err = || self.shared.conn.error("count dead letters");
        let (conditions, values) = dead::conditions(filter, &self.names, &FILTER, 2);
        let statement = self.dead_count(&conditions);
        let query = sqlx::query(&statement).bind(dead::MAX_COUNT_GROUPS);
        let rows = bind_filter(query, values)
            .fetch_all(&self.shared.conn.pool)
            .await
            .map_err(err())?;
        let rows = rows
            .iter()
            .map(DeadCountRow::from_row)
            .collect::<Result<_, _>>()
            .map_err(err())?;
        Ok(DeadCounts::from_rows(rows))
    }

    pub async fn redrive_dead(
        &self,
        filter: &DeadFilter,
        limit: u32,
        delay: Duration,
    ) -> StorageResult<SortedIds> {
        let (conditions, values) = dead::conditions(filter, &self.names, &FILTER, 3);
        let statement = self.dead_redrive(&conditions);
        let query = sqlx::query(&statement)
            .bind(i64::from(limit))
            .bind(interval(delay));
        let ids = self
            .changed_ids(query, values, "re-drive dead letters")
            .await?;
        if !ids.is_empty() {
            // Pending again, below where claims reached: claimable after the delay.
            self.shared.floor.rescan_at(Instant::now() + delay);
        }
        Ok(SortedIds::from(ids))
    }

    pub async fn discard_dead(&self, filter: &DeadFilter, limit: u32) -> StorageResult<SortedIds> {
        let (conditions, values) = dead::conditions(filter, &self.names, &FILTER, 2);
        let statement = self.dead_discard(&conditions);
        let query = sqlx::query(&statement).bind(i64::from(limit));
        let ids = self
            .changed_ids(query, values, "discard dead letters")
            .await?;
        Ok(SortedIds::from(ids))
    }

    /// The ids a re-drive or discard returns, the selector's `values` bound after the
    /// statement's own parameters.
    async fn changed_ids<'q>(
        &self,
        query: PgQuery<'q>,
        values: Vec<FilterValue<'q>>,
        action: &'static str,
    ) -> StorageResult<Vec<MessageId>> {
        let rows = bind_filter(query, values)
            .fetch_all(&self.shared.conn.pool)
            .await
            .map_err(self.shared.conn.error(action))?;
        rows.iter()
            .map(|row| row.try_get(0))
            .collect::<Result<_, _>>()
            .map_err(self.shared.conn.error(action))
    }

    /// Dead rows in id order: `$1` after this id, `$2` at most; `conditions` from
    /// [`crate::storage::dead::conditions`] with placeholders from `$3`.
    pub fn dead_list(&self, conditions: &str) -> String {
        let n = &self.names;
        n.fill(
            "SELECT {message}, coalesce(o.{last_error}, '') AS last_error, \
             o.{processed_at} AS died_at FROM {t} o \
             WHERE o.{status} = 'dead' AND o.{id} > $1{conditions} ORDER BY o.{id} LIMIT $2",
            &[
                ("message", &message(n, "o", self.max_row_bytes)),
                ("conditions", &conditions),
                ("t", &self.table),
            ],
        )
    }

    /// Dead rows by topic and error, largest groups first, `$1` groups at most, each with
    /// the total of every group; `conditions` with placeholders from `$2`.
    pub fn dead_count(&self, conditions: &str) -> String {
        let n = &self.names;
        n.fill(
            "SELECT {topic} AS topic, coalesce(o.{last_error}, '') AS error, count(*) AS count, \
             (sum(count(*)) OVER ())::int8 AS total FROM {t} o \
             WHERE o.{status} = 'dead'{conditions} GROUP BY 1, 2 ORDER BY 3 DESC, 1, 2 LIMIT $1",
            &[
                ("topic", &n.topic("o.")),
                ("conditions", &conditions),
                ("t", &self.table),
            ],
        )
    }

    /// Makes the first `$1` selected dead rows pending again, attempts reset, claimable
    /// after `$2`; returns their ids. With strict ordering the heads of their keys move
    /// back to the lowest re-driven row (a head may have moved past it, or to NULL, when
    /// it died), so a strict claim finds it before the key's later rows. `conditions`
    /// with placeholders from `$3`.
    pub fn dead_redrive(&self, conditions: &str) -> String {
        let heads = match self.shared.strict.as_ref().map(|strict| &strict.heads) {
            Some(heads) => format!(
                ", heads AS (\
                   INSERT INTO {heads} AS h (key, head_id) \
                   SELECT r.key, min(r.id) FROM redriven r WHERE r.key IS NOT NULL \
                   GROUP BY 1 ORDER BY 1 \
                   ON CONFLICT (key) DO UPDATE SET head_id = least(h.head_id, excluded.head_id))"
            ),
            None => String::new(),
        };
        self.names.fill(
            "WITH chosen AS MATERIALIZED (\
               SELECT o.{id} AS id FROM {t} o WHERE o.{status} = 'dead'{conditions} \
               ORDER BY o.{id} LIMIT $1 FOR UPDATE SKIP LOCKED), \
             redriven AS (\
               UPDATE {t} u SET {status} = 'pending', {attempts} = 0, \
                 {available_at} = statement_timestamp() + $2::interval, {leased_by} = NULL, \
                 {processed_at} = NULL \
               FROM chosen c WHERE u.{id} = c.id AND u.{status} = 'dead' \
               RETURNING u.{id}::int8 AS id, u.{key}::text AS key){heads} \
             SELECT id FROM redriven ORDER BY id",
            &[
                ("t", &self.table),
                ("conditions", &conditions),
                ("heads", &heads),
            ],
        )
    }

    /// Deletes the first `$1` selected dead rows; returns their ids. `conditions` with
    /// placeholders from `$2`.
    pub fn dead_discard(&self, conditions: &str) -> String {
        // The choice in a CTE of its own: a `LIMIT` subquery under `IN` may be run again
        // per row by the plan, and took more rows than the limit.
        self.names.fill(
            "WITH chosen AS MATERIALIZED (\
               SELECT o.{id} AS id FROM {t} o WHERE o.{status} = 'dead'{conditions} \
               ORDER BY o.{id} LIMIT $1 FOR UPDATE SKIP LOCKED) \
             DELETE FROM {t} u USING chosen c WHERE u.{id} = c.id AND u.{status} = 'dead' \
             RETURNING u.{id}::int8",
            &[("t", &self.table), ("conditions", &conditions)],
        )
    }
}

/// Keys whose first pending row is not due, of a table without the heads of strict
/// ordering, in the columns of [`strict_blocked_keys`]: each pending row with a key
/// checked for an earlier pending row of its key.
fn blocked_keys(t: &str, n: &Names) -> String {
    n.fill(
        "SELECT o.{key}::text AS key, o.{id}::int8 AS head_id, o.{leased_by} AS owner, \
         o.{attempts}::int4 AS attempts, o.{last_error} AS last_error, \
         o.{created_at} AS created_at, o.{available_at} AS until, \
         (SELECT count(*) FROM {t} b WHERE b.{key} = o.{key} \
           AND b.{status} = 'pending' AND b.{id} > o.{id}) AS waiting, false AS dead \
         FROM {t} o WHERE o.{status} = 'pending' AND o.{key} IS NOT NULL \
         AND o.{available_at} > statement_timestamp() AND o.{id} > $1 \
         AND NOT EXISTS (SELECT 1 FROM {t} p WHERE p.{key} = o.{key} \
           AND p.{status} = 'pending' AND p.{id} < o.{id}) \
         ORDER BY o.{id} LIMIT $2",
        &[("t", &t)],
    )
}

/// Blocked keys (see `storage/blocked.rs`) of a strict table (see `strict.rs`), `$1` after this head id,
/// `$2` at most: the heads walked in `head_id` order through their partial index, each
/// key's first pending row found from its head through the `(key, id)` index of pending
/// rows, kept when it is not due now. So a page costs one index lookup per key with
/// pending rows before the page's last blocked key (not one per pending row, as the
/// statement of a table without heads does), plus the count of the rows behind each
/// blocked key. Pages follow `head_id`: a head an answer left behind (see the module
/// docs of `strict.rs`; the next claim moves it on) is listed where its old `head_id` puts it. With
/// `dead_holds`, a key behind a dead row is left to [`dead_heads`].
fn strict_blocked_keys(t: &str, heads: &str, n: &Names, dead_holds: bool) -> String {
    let not_behind_dead = match dead_holds {
        true => format!(
            " AND NOT {}",
            blocked::dead_before(t, n, "h.key", &format!("o.{}", n.id))
        ),
        false => String::new(),
    };
    let leased_or_waiting = n.fill(
        "SELECT h.key AS key, o.{id}::int8 AS head_id, o.{leased_by} AS owner, \
           o.{attempts}::int4 AS attempts, o.{last_error} AS last_error, \
           o.{created_at} AS created_at, o.{available_at} AS until, \
           (SELECT count(*) FROM {t} b WHERE b.{key} = h.key \
             AND b.{status} = 'pending' AND b.{id} > o.{id}) AS waiting, false AS dead \
         FROM {heads} h CROSS JOIN LATERAL (\
           SELECT r.* FROM {t} r WHERE r.{key} = h.key AND r.{status} = 'pending' \
             AND r.{id} >= h.head_id ORDER BY r.{id} LIMIT 1) o \
         WHERE h.head_id IS NOT NULL AND h.head_id > $1 \
           AND o.{available_at} > statement_timestamp(){not_behind_dead} \
         ORDER BY h.head_id LIMIT $2",
        &[
            ("t", &t),
            ("heads", &heads),
            ("not_behind_dead", &not_behind_dead),
        ],
    );
    match dead_holds {
        true => format!(
            "SELECT * FROM (({leased_or_waiting}) UNION ALL ({})) k ORDER BY head_id LIMIT $2",
            dead_heads(t, n)
        ),
        false => leased_or_waiting,
    }
}

/// Keys held by a dead row (`dead_letter_holds_key`, see
/// [`crate::storage::blocked::dead_heads`]) in the columns of [`strict_blocked_keys`], `$1` after
/// this id, `$2` at most; `until` is when it died.
fn dead_heads(t: &str, n: &Names) -> String {
    let (from, waiting) = blocked::dead_heads(t, n, "$1", "count(*)");
    n.fill(
        "SELECT d.{key}::text AS key, d.{id}::int8 AS head_id, NULL::text AS owner, \
           d.{attempts}::int4 AS attempts, d.{last_error} AS last_error, \
           d.{created_at} AS created_at, d.{processed_at} AS until, {waiting} AS waiting, \
           true AS dead {from} ORDER BY d.{id} LIMIT $2",
        &[("waiting", &waiting), ("from", &from)],
    )
}

type PgQuery<'q> = sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>;

/// How the dead-letter selector is written here: numbered `$n`, an id array.
pub(super) const FILTER: FilterDialect = FilterDialect {
    placeholder: |number| format!("${number}"),
    in_ids: |column, next, _| format!("{column} = ANY({}::int8[])", next()),
    contains: |column, placeholder| format!("strpos({column}, {placeholder}::text) > 0"),
};

/// `query` with the selector's values bound, in the order [`dead::conditions`] rendered
/// them (after the statement's own parameters).
fn bind_filter<'q>(mut query: PgQuery<'q>, values: Vec<FilterValue<'q>>) -> PgQuery<'q> {
    for value in values {
        query = match value {
            FilterValue::Ids(ids) => query.bind(ids),
            FilterValue::Text(text) => query.bind(text),
            FilterValue::Time(at) => query.bind(at),
        };
    }
    query
}
