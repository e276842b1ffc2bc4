//! What the MySQL/MariaDB and SQLite backends write and run alike. Their statements differ
//! in placeholders (`?` against `?n`), in how times are stored (`DATETIME(6)` against epoch
//! milliseconds) and in what a write can return, so each backend keeps its own files (see
//! `storage/mod.rs`); what is the same in both is here, once:
//! - [`TableSql`], the table's names, and the SQL both render alike from them (strict
//!   ordering's test of a claim's candidates, the blocked keys behind a dead row);
//! - rows decoded: a message, a topic's stats, times ([`StoredTime`]);
//! - what differs only in its statement and its pool: the pauses read, lease holders, the
//!   delivered count, the purge, an insert's values, generic over [`sqlx::Database`];
//! - the driver failures that mean the database is unavailable (PostgreSQL's errors are
//!   classified by it too), and what the backends' tests share.

use std::collections::BTreeMap;
use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::query::{QueryAs, QueryScalar};
use sqlx::types::Json;
use sqlx::{
    Arguments, ColumnIndex, Database, Decode, Encode, Executor, FromRow, IntoArguments, Row, Type,
};

use super::blocked;
use super::columns::{InsertPayload, InsertRow};
use super::names::Names;
use super::{
    in_batches, LeaseHolder, OutboxMessage, Pauses, StorageResult, TableOptions, TopicStats,
};

/// An outbox table's names as MySQL and SQLite statements write them, and the statements
/// both write alike.
#[derive(Debug)]
pub struct TableSql {
    /// The table unquoted (MySQL: `db.table`), for messages.
    pub display: String,
    /// The table, quoted (MySQL: `` `db`.`table` ``).
    pub quoted: String,
    /// The outbox's pauses table, quoted, beside the table.
    pub pauses: String,
    /// The columns as they appear in SQL.
    pub names: Names,
}

impl TableSql {
    /// A statement from `template` (see [`Names::fill`]) with `{t}` the table, `{pauses}`
    /// its pauses table, and `values`.
    pub fn fill(&self, template: &str, values: &[(&str, &dyn Display)]) -> String {
        let mut all: Vec<(&str, &dyn Display)> =
            vec![("t", &self.quoted), ("pauses", &self.pauses)];
        all.extend_from_slice(values);
        self.names.fill(template, &all)
    }

    /// [`blocked::dead_before`] the row `alias`: whether a dead row of its key comes
    /// before it.
    pub fn dead_before(&self, alias: &str) -> String {
        let (key, id) = (&self.names.key, &self.names.id);
        let (key, id) = (format!("{alias}.{key}"), format!("{alias}.{id}"));
        blocked::dead_before(&self.quoted, &self.names, &key, &id)
    }

    /// Strict ordering's test of a claim's candidate `o`: no earlier pending row `p` of
    /// its key for which `blocked` holds (one this very claim cannot take), nor, with
    /// `dead_holds_key`, an earlier dead row of the key (looked up through an index of
    /// the dead rows by key and id).
    pub fn no_earlier_blocking(&self, blocked: &str, dead_holds_key: bool) -> String {
        let mut filters = self.fill(
            " AND (o.{key} IS NULL OR NOT EXISTS (SELECT 1 FROM {t} p \
             WHERE p.{key} = o.{key} AND p.{id} < o.{id} AND p.{status} = 'pending' \
             AND ({blocked})))",
            &[("blocked", &blocked)],
        );
        if dead_holds_key {
            filters += &self.fill(
                " AND (o.{key} IS NULL OR NOT {dead_before})",
                &[("dead_before", &self.dead_before("o"))],
            );
        }
        filters
    }

    /// With `dead_holds_key`, the blocked keys behind a dead row (see
    /// `storage/blocked.rs`), appended to a backend's statement of leased and retrying
    /// heads `o`, which leaves the heads behind a dead row to this part. `columns` are
    /// that statement's columns for the dead head `d`, `{waiting}` among them the rows
    /// behind it; `after` is the placeholder of the id to start after, `count` the
    /// backend's `count(*)`.
    pub fn blocked_keys_dead(
        &self,
        dead_holds_key: bool,
        columns: &str,
        [after, count]: [&str; 2],
    ) -> String {
        if !dead_holds_key {
            return String::new();
        }
        let (from, waiting) = blocked::dead_heads(&self.quoted, &self.names, after, count);
        self.fill(
            " AND NOT {dead_before} UNION ALL SELECT {columns} {from}",
            &[
                ("dead_before", &self.dead_before("o")),
                ("columns", &self.fill(columns, &[("waiting", &waiting)])),
                ("from", &from),
            ],
        )
    }
}

/// A time as a backend stores it, read back as UTC.
pub trait StoredTime: Send + Unpin {
    fn utc(self) -> Result<DateTime<Utc>, sqlx::Error>;
}

/// MySQL's `DATETIME(6)`, which the relay's sessions read as UTC.
impl StoredTime for DateTime<Utc> {
    fn utc(self) -> Result<DateTime<Utc>, sqlx::Error> {
        Ok(self)
    }
}

/// The outbox's pauses (see [`crate::storage::pauses`]) from its pauses table `pauses`
/// (quoted), whose `paused_at` reads as `T`.
pub async fn read_pauses<'c, DB, T, E>(pauses: &str, executor: E) -> Result<Pauses, sqlx::Error>
where
    DB: Database,
    T: StoredTime,
    E: Executor<'c, Database = DB>,
    for<'r> (String, T): FromRow<'r, DB::Row>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
{
    let statement = format!("SELECT target, paused_at FROM {pauses} ORDER BY target");
    let rows: Vec<(String, T)> = sqlx::query_as(&statement).fetch_all(executor).await?;
    let rows = rows
        .into_iter()
        .map(|(target, since)| Ok((target, since.utc()?)))
        .collect::<Result<Vec<_>, sqlx::Error>>()?;
    Ok(Pauses::from_rows(rows))
}

/// A row of a backend's `stats` statement, whose counts every backend names alike; the
/// topic and the age of the oldest pending row as the backend reads them.
pub fn topic_stats<R: Row>(
    row: &R,
    topic: String,
    oldest_pending_age: Option<Duration>,
) -> Result<TopicStats, sqlx::Error>
where
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
    for<'c> &'c str: ColumnIndex<R>,
{
    let count = |column: &str| row.try_get::<i64, _>(column).map(super::rows::count);
    Ok(TopicStats {
        topic,
        pending: count("pending")?,
        leased: count("leased")?,
        waiting: count("waiting")?,
        dead: count("dead")?,
        oldest_pending_age,
    })
}

/// What a backend decodes its own way of a row of its message columns (see [`message`]).
pub struct MessageParts {
    pub topic: String,
    pub key: Option<String>,
    pub headers: BTreeMap<String, String>,
    pub attempts: u32,
    pub created_at: DateTime<Utc>,
}

/// A message from a row of a backend's message columns (`id, topic, key, payload,
/// headers, attempts, created_at, stored_bytes`) and what the backend decoded of it: a
/// row the database sent without its payload (NULL: over `max_row_bytes`) is too large,
/// by its stored size.
pub fn message<R: Row>(row: &R, parts: MessageParts) -> Result<OutboxMessage, sqlx::Error>
where
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> Option<Vec<u8>>: Decode<'r, R::Database> + Type<R::Database>,
    for<'c> &'c str: ColumnIndex<R>,
{
    let payload: Option<Vec<u8>> = row.try_get("payload")?;
    let stored_bytes: i64 = row.try_get("stored_bytes")?;
    Ok(OutboxMessage {
        id: row.try_get("id")?,
        topic: parts.topic,
        key: parts.key,
        too_large: payload.is_none().then_some(stored_bytes.max(0) as u64),
        payload: payload.unwrap_or_default(),
        headers: parts.headers,
        attempts: parts.attempts,
        created_at: parts.created_at,
    })
}

/// Whether the driver could not reach the database, or the pool gave up waiting for a
/// connection: [`StorageError::Unavailable`](super::StorageError::Unavailable) whatever
/// the backend.
pub fn is_unreachable(err: &sqlx::Error) -> bool {
    matches!(
        err,
        sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed
    )
}

/// The rows of a backend's `lease_holders` statement (`query`, bound): `(owner, rows,
/// earliest expiry)`, the expiry read as `T`.
pub async fn lease_holders<'q, 'c, DB, T, E>(
    query: QueryAs<'q, DB, (String, i64, T), DB::Arguments<'q>>,
    executor: E,
) -> Result<Vec<LeaseHolder>, sqlx::Error>
where
    DB: Database,
    T: StoredTime,
    E: Executor<'c, Database = DB>,
    for<'r> (String, i64, T): FromRow<'r, DB::Row>,
    DB::Arguments<'q>: IntoArguments<'q, DB>,
{
    let rows = query
        .fetch_all(executor)
        .await?
        .into_iter()
        .map(|(owner, rows, until)| Ok((owner, rows, until.utc()?)))
        .collect::<Result<_, sqlx::Error>>()?;
    Ok(LeaseHolder::from_rows(rows))
}

/// Rows delivered lately: the count of a backend's `delivered_within` statement (`query`,
/// bound with the window), or `None` where acks delete the rows they deliver.
pub async fn delivered_count<'q, 'c, DB, E>(
    options: &TableOptions,
    query: QueryScalar<'q, DB, i64, DB::Arguments<'q>>,
    executor: E,
) -> Result<Option<u64>, sqlx::Error>
where
    DB: Database,
    E: Executor<'c, Database = DB>,
    for<'r> (i64,): FromRow<'r, DB::Row>,
    DB::Arguments<'q>: IntoArguments<'q, DB>,
{
    if options.delete_on_ack {
        return Ok(None);
    }
    let delivered = query.fetch_one(executor).await?;
    Ok(Some(super::rows::count(delivered)))
}

/// Purges delivered rows, `batch` deleting one batch at a time (see [`in_batches`]);
/// nothing where acks delete the rows they deliver.
pub async fn purge<F, Fut>(options: &TableOptions, batch: F) -> StorageResult<u64>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = StorageResult<u64>>,
{
    if options.delete_on_ack {
        return Ok(0);
    }
    let purged = in_batches(batch).await?;
    tracing::debug!(purged, "purged delivered rows");
    Ok(purged)
}

/// The values of an insert, in the order of [`Names::inserted`]: topic (with a topic
/// column), key, payload, headers (with a headers column, as JSON).
pub fn insert_arguments<'q, DB>(row: InsertRow) -> Result<DB::Arguments<'q>, sqlx::Error>
where
    DB: Database,
    String: Encode<'q, DB> + Type<DB>,
    Option<String>: Encode<'q, DB> + Type<DB>,
    Vec<u8>: Encode<'q, DB> + Type<DB>,
    Json<BTreeMap<String, String>>: Encode<'q, DB> + Type<DB>,
{
    let mut arguments = DB::Arguments::default();
    if let Some(topic) = row.topic {
        arguments.add(topic).map_err(sqlx::Error::Encode)?;
    }
    arguments.add(row.key).map_err(sqlx::Error::Encode)?;
    match row.payload {
        InsertPayload::Bytes(bytes) => arguments.add(bytes),
        InsertPayload::Text(text) => arguments.add(text),
    }
    .map_err(sqlx::Error::Encode)?;
    if let Some(headers) = row.headers {
        arguments.add(Json(headers)).map_err(sqlx::Error::Encode)?;
    }
    Ok(arguments)
}

/// A team's own `events` table, as the backends' tests map it: the message columns under
/// names of their own (a test maps more, or less, as it needs).
#[cfg(test)]
pub fn events_mapping() -> crate::config::columns::ColumnMapping {
    crate::config::columns::ColumnMapping {
        id: "event_id".into(),
        topic: Some("event_type".into()),
        key: "aggregate_id".into(),
        payload: "body".into(),
        payload_format: crate::config::columns::PayloadFormat::Text,
        headers: "meta".into(),
        ..Default::default()
    }
}

/// That `err`, from a storage given an invalid identifier, names the `option` it came from
/// and says what an identifier may hold.
#[cfg(test)]
pub fn assert_names_invalid_identifier(err: &anyhow::Error, option: &str) {
    let err = err.to_string();
    assert!(err.contains(option), "{err}");
    assert!(
        err.contains("ASCII letters, digits and underscores"),
        "{err}"
    );
}
