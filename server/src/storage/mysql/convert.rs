//! Translations between the driver and the storage types: errors, rows, headers; and
//! [`Conn`], the pool every part of the backend runs its transactions on, with the table
//! its errors name and the one retry after a lock conflict.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::anyhow;
use chrono::{DateTime, Utc};
use sqlx::mysql::{
    MySql, MySqlArguments, MySqlConnection, MySqlDatabaseError, MySqlPool, MySqlRow,
};
use sqlx::query::{Query, QueryAs, QueryScalar};
use sqlx::Row;

use super::shape::NOW;
use crate::storage::dead::DeadCountRow;
use crate::storage::rows::{self, attempts, count, headers_from_text};
use crate::storage::sql_common::{self, MessageParts};
use crate::storage::{
    BlockedKey, DeadLetter, HeadState, MessageId, OutboxMessage, StorageError, StorageResult,
    TopicStats,
};

/// The pool and the table its statements run on.
#[derive(Clone)]
pub(super) struct Conn {
    pub pool: MySqlPool,
    /// `db.table` unquoted, for messages.
    pub table: Arc<str>,
}

impl Conn {
    /// Translates a driver error for `action`; see [`classify`].
    pub fn error(&self, action: &'static str) -> impl FnOnce(sqlx::Error) -> StorageError + '_ {
        move |err| classify(err, &self.table, action)
    }

    /// Runs `operation`, once more after a deadlock or lock wait timeout (its transaction
    /// was dropped, hence rolled back, in between), and translates the error.
    pub async fn retrying<T, F, Fut>(
        &self,
        action: &'static str,
        mut operation: F,
    ) -> StorageResult<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, sqlx::Error>>,
    {
        match operation().await {
            Err(err) if is_lock_conflict(&err) => {
                tracing::debug!(table = %self.table, action, error = %err, "lock conflict; retrying once");
                operation().await.map_err(self.error(action))
            }
            result => result.map_err(self.error(action)),
        }
    }
}

/// A query that binds a list of ids one placeholder each (see
/// [`super::shape::placeholders`]): MySQL has no array to bind a list as one value.
pub(super) trait BindIds: Sized {
    fn bind_id(self, id: MessageId) -> Self;

    /// `ids` bound after what is bound already.
    fn bind_ids<'i>(self, ids: impl IntoIterator<Item = &'i MessageId>) -> Self {
        ids.into_iter().fold(self, |query, id| query.bind_id(*id))
    }
}

impl BindIds for Query<'_, MySql, MySqlArguments> {
    fn bind_id(self, id: MessageId) -> Self {
        self.bind(id)
    }
}

impl<O> BindIds for QueryAs<'_, MySql, O, MySqlArguments> {
    fn bind_id(self, id: MessageId) -> Self {
        self.bind(id)
    }
}

impl<O> BindIds for QueryScalar<'_, MySql, O, MySqlArguments> {
    fn bind_id(self, id: MessageId) -> Self {
        self.bind(id)
    }
}

/// The database clock, read inside `conn`'s transaction after its locks were taken.
pub(super) async fn now(conn: &mut MySqlConnection) -> Result<DateTime<Utc>, sqlx::Error> {
    sqlx::query_scalar(NOW).fetch_one(conn).await
}

/// `ER_LOCK_WAIT_TIMEOUT`: a row lock was not granted within `innodb_lock_wait_timeout`.
const LOCK_WAIT_TIMEOUT: u16 = 1205;
/// `ER_LOCK_DEADLOCK`: InnoDB rolled the transaction back to break a deadlock.
const DEADLOCK: u16 = 1213;

/// The server's error number, when the database (not the driver) raised the error.
fn number(err: &sqlx::Error) -> Option<u16> {
    match err {
        sqlx::Error::Database(db) => db
            .try_downcast_ref::<MySqlDatabaseError>()
            .map(MySqlDatabaseError::number),
        _ => None,
    }
}

/// A lock conflict worth one more try: the whole transaction is rolled back first (the
/// caller drops it), and every operation of this backend may simply run again.
pub(super) fn is_lock_conflict(err: &sqlx::Error) -> bool {
    matches!(number(err), Some(LOCK_WAIT_TIMEOUT | DEADLOCK))
}

/// `ER_DUP_FIELDNAME` or `ER_DUP_KEYNAME`: an `ALTER TABLE` adding a column or an index
/// that is there already.
pub(super) fn is_duplicate_column_or_index(err: &sqlx::Error) -> bool {
    matches!(number(err), Some(1060 | 1061))
}

/// The one place driver errors become [`StorageError`]s: by error number, not by message.
/// `table` is what [`StorageError::MissingTable`] names.
pub(super) fn classify(err: sqlx::Error, table: &str, action: &str) -> StorageError {
    let unavailable = |err: &sqlx::Error| StorageError::Unavailable(format!("{action}: {err}"));
    match &err {
        err if sql_common::is_unreachable(err) => unavailable(err),
        sqlx::Error::Database(_) => match number(&err) {
            // 1040 too many connections, 1053 server shutdown in progress, 1927 connection
            // killed; 2002/2003/2006/2013 are the client library's "cannot connect" and
            // "server gone" codes, seen when a proxy passes them on. 1290/1792/1836:
            // read-only server or transaction, a replica answering after a failover,
            // until the pool reaches the new primary. 1205/1213: a lock conflict that
            // persisted after one retry (see `is_lock_conflict`). 1969 (MariaDB) and 3024
            // (MySQL): a statement ended by the session's statement limit (see
            // `lazy_pool_with`): the database is busy or something holds the table.
            Some(
                1040 | 1053 | 1927 | 2002 | 2003 | 2006 | 2013 | 1290 | 1792 | 1836 | 1969 | 3024
                | LOCK_WAIT_TIMEOUT | DEADLOCK,
            ) => unavailable(&err),
            // The server refused the connection: 1045 wrong user or password, 1044 and 1698
            // access denied, 1130 host not allowed, 1049 the URL's database does not exist
            // (a table's missing database is 1146). Fixed outside the relay.
            Some(1045 | 1044 | 1698 | 1130 | 1049) => unavailable(&err),
            // No such table (or no such database in the qualified name).
            Some(1146) => StorageError::MissingTable {
                table: table.to_owned(),
            },
            // A value the table cannot hold: 1406 too long for its column (the key),
            // 1366 not in the column's character set, 3819/4025 a CHECK.
            Some(1406 | 1366 | 3819 | 4025) => StorageError::InvalidMessage(format!(
                "{action}: the database refused the value: {err}"
            )),
            _ => StorageError::Other(anyhow!(err).context(format!("{action} on {table}"))),
        },
        _ => StorageError::Other(anyhow!(err).context(format!("{action} on {table}"))),
    }
}

/// A text column as a `String`. Columns with a binary collation (`utf8mb4_bin`, which the
/// schema uses) carry the BINARY flag, which sqlx refuses to decode as a string; their
/// bytes are UTF-8 all the same.
pub(super) fn text(row: &MySqlRow, column: &str) -> Result<Option<String>, sqlx::Error> {
    let Some(bytes) = row.try_get::<Option<Vec<u8>>, _>(column)? else {
        return Ok(None);
    };
    String::from_utf8(bytes)
        .map(Some)
        .map_err(|err| sqlx::Error::ColumnDecode {
            index: column.to_owned(),
            source: Box::new(err),
        })
}

fn required_text(row: &MySqlRow, column: &str) -> Result<String, sqlx::Error> {
    text(row, column)?.ok_or_else(|| sqlx::Error::ColumnDecode {
        index: column.to_owned(),
        source: "unexpected NULL".into(),
    })
}

/// A candidate row of a claim, as the message it becomes once leased (attempt counted).
pub(super) fn decode_candidate(row: &MySqlRow) -> Result<OutboxMessage, sqlx::Error> {
    let stored_attempts: i64 = row.try_get("attempts")?;
    message(row, attempts(stored_attempts.saturating_add(1)))
}

/// The message columns of `Statements::message`, with `attempts` as the caller counts them.
fn message(row: &MySqlRow, attempts: u32) -> Result<OutboxMessage, sqlx::Error> {
    // MariaDB's JSON is a LONGTEXT, MySQL's a type of its own: both arrive as UTF-8 bytes.
    let headers: Option<Vec<u8>> = row.try_get("headers")?;
    let parts = MessageParts {
        topic: required_text(row, "topic")?,
        key: text(row, "key")?,
        headers: headers_from_text(headers.as_deref()),
        attempts,
        created_at: row.try_get::<DateTime<Utc>, _>("created_at")?,
    };
    sql_common::message(row, parts)
}

/// A row of `Statements::blocked_keys` (`admin.rs`).
pub(super) fn decode_blocked(row: &MySqlRow) -> Result<BlockedKey, sqlx::Error> {
    let owner = text(row, "owner")?;
    let stored_attempts: i64 = row.try_get("attempts")?;
    Ok(BlockedKey {
        key: required_text(row, "key")?,
        head_id: row.try_get("head_id")?,
        state: HeadState::of(row.try_get::<i64, _>("dead")? != 0, owner.as_deref()),
        owner,
        attempts: attempts(stored_attempts),
        last_error: text(row, "last_error")?,
        head_created_at: row.try_get::<DateTime<Utc>, _>("created_at")?,
        until: row.try_get::<DateTime<Utc>, _>("until")?,
        waiting_behind: count(row.try_get("waiting")?),
    })
}

/// A row of the dead-letter list (`admin.rs`).
pub(super) fn decode_dead(row: &MySqlRow) -> Result<DeadLetter, sqlx::Error> {
    let stored_attempts: i64 = row.try_get("attempts")?;
    Ok(DeadLetter {
        message: message(row, attempts(stored_attempts))?,
        last_error: required_text(row, "last_error")?,
        died_at: row.try_get::<Option<DateTime<Utc>>, _>("died_at")?,
    })
}

/// A row of the dead-letter counts (`admin.rs`).
pub(super) fn decode_dead_count(row: &MySqlRow) -> Result<DeadCountRow, sqlx::Error> {
    Ok(DeadCountRow {
        topic: required_text(row, "topic")?,
        error: required_text(row, "error")?,
        count: row.try_get("count")?,
        total: row.try_get("total")?,
    })
}

/// A row of a claim's candidate scan: its id and key.
pub(super) fn decode_scanned(row: &MySqlRow) -> Result<(MessageId, Option<String>), sqlx::Error> {
    Ok((row.try_get("id")?, text(row, "key")?))
}

/// A row of `Statements::stats` (`admin.rs`).
pub(super) fn decode_topic_stats(row: &MySqlRow) -> Result<TopicStats, sqlx::Error> {
    let oldest: Option<i64> = row.try_get("oldest_pending_us")?;
    let oldest = oldest.map(|us| Duration::from_micros(us.max(0) as u64));
    sql_common::topic_stats(row, required_text(row, "topic")?, oldest)
}

/// `now + duration` on the database clock, clamped like every interval sent.
pub(super) fn after(now: DateTime<Utc>, duration: Duration) -> DateTime<Utc> {
    let duration = rows::clamped(duration);
    now + chrono::Duration::from_std(duration).unwrap_or(chrono::Duration::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn far_deadlines_are_clamped() {
        let now = Utc::now();
        let far = after(now, Duration::MAX);
        assert!(far > now && far.format("%Y").to_string().parse::<i32>().unwrap() < 9999);
    }

    #[test]
    fn driver_failures_are_unavailable() {
        let err = classify(sqlx::Error::PoolTimedOut, "t", "claim");
        assert!(matches!(err, StorageError::Unavailable(_)), "{err:?}");
    }
}
