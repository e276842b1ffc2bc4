//! Translations between the driver and the storage types: errors, times, rows.

use std::time::Duration;

use anyhow::anyhow;
use chrono::{DateTime, Utc};
use sqlx::sqlite::SqliteRow;
use sqlx::Row;

use crate::storage::rows::{self, attempts, count, headers_from_text};
use crate::storage::sql_common::{self, MessageParts, StoredTime};
use crate::storage::{BlockedKey, HeadState, OutboxMessage, StorageError, TopicStats};

// Primary result codes (the low byte of an extended code), from sqlite3.h.
const SQLITE_ERROR: i32 = 1;
const SQLITE_PERM: i32 = 3;
const SQLITE_BUSY: i32 = 5;
const SQLITE_LOCKED: i32 = 6;
const SQLITE_READONLY: i32 = 8;
const SQLITE_IOERR: i32 = 10;
const SQLITE_FULL: i32 = 13;
const SQLITE_CANTOPEN: i32 = 14;
const SQLITE_CONSTRAINT: i32 = 19;
const SQLITE_AUTH: i32 = 23;

/// What [`classify`] needs to say where the failure happened.
#[derive(Debug, Clone)]
pub(super) struct Place {
    pub table: String,
    /// The database file, for messages.
    pub file: String,
    pub busy_timeout: Duration,
}

/// The one place driver errors become [`StorageError`]s: by result code.
pub(super) fn classify(err: sqlx::Error, place: &Place, action: &str) -> StorageError {
    let Place {
        table,
        file,
        busy_timeout,
    } = place;
    let other = |err: sqlx::Error| {
        StorageError::Other(anyhow!(err).context(format!("{action} on {table}")))
    };
    match &err {
        err if sql_common::is_unreachable(err) => {
            StorageError::Unavailable(format!("{action}: {err}"))
        }
        sqlx::Error::Database(db) => {
            let code = db.code().and_then(|code| code.parse::<i32>().ok());
            match code.map(|code| code & 0xff) {
                // Another connection (a producer, another server) held the write lock for
                // longer than the busy timeout.
                Some(SQLITE_BUSY | SQLITE_LOCKED) => StorageError::Unavailable(format!(
                    "{action}: the SQLite file {file} stayed locked by another connection \
                     for more than {busy_timeout:?} ({err})"
                )),
                Some(SQLITE_CANTOPEN) => StorageError::Unavailable(format!(
                    "{action}: cannot open the SQLite file {file}: check that its directory \
                     exists and is writable ({err})"
                )),
                Some(SQLITE_IOERR | SQLITE_FULL | SQLITE_PERM | SQLITE_AUTH) => {
                    StorageError::Unavailable(format!(
                        "{action}: the SQLite file {file} cannot be read or written ({err})"
                    ))
                }
                // Opened read-only (`mode=ro`, a read-only file, directory or mount): every
                // write fails until an operator changes that; retrying cannot heal it.
                Some(SQLITE_READONLY) => StorageError::ReadOnly(format!(
                    "{action}: the SQLite file {file} is read-only: make it (and its directory, \
                     for the -wal and -shm files) writable, or drop `mode=ro` from the \
                     database's url ({err})"
                )),
                // A CHECK of the table (the key length) refused a row to insert.
                Some(SQLITE_CONSTRAINT) => StorageError::InvalidMessage(format!(
                    "{action}: the database refused the value: {err}"
                )),
                // SQLite has no code of its own for a missing table (PostgreSQL's 42P01):
                // it is a plain SQLITE_ERROR, told apart by its long-stable message.
                Some(SQLITE_ERROR) if db.message().starts_with("no such table") => {
                    StorageError::MissingTable {
                        table: table.clone(),
                    }
                }
                _ => other(err),
            }
        }
        _ => other(err),
    }
}

/// The machine clock in epoch milliseconds: the "now" of every statement (see `sql`).
pub(super) fn now_ms() -> i64 {
    Utc::now().timestamp_millis()
}

/// `at` plus `delay`, clamped to [`MAX_DELAY`].
pub(super) fn after(at: i64, delay: Duration) -> i64 {
    at.saturating_add(millis(delay))
}

/// `at` minus `delay`.
pub(super) fn before(at: i64, delay: Duration) -> i64 {
    at.saturating_sub(millis(delay))
}

fn millis(duration: Duration) -> i64 {
    rows::clamped(duration).as_millis() as i64
}

pub(super) fn datetime(ms: i64) -> Result<DateTime<Utc>, sqlx::Error> {
    DateTime::from_timestamp_millis(ms)
        .ok_or_else(|| sqlx::Error::Decode(format!("time out of range: {ms} ms").into()))
}

/// This backend's times: epoch milliseconds (see `shape.rs`).
impl StoredTime for i64 {
    fn utc(self) -> Result<DateTime<Utc>, sqlx::Error> {
        datetime(self)
    }
}

/// Ids (or topics) as the JSON array the statements read with `json_each`.
pub(super) fn json_list<T: serde::Serialize>(items: &[T]) -> String {
    serde_json::to_string(items).expect("a list of ids or strings serialises")
}

/// Rows returned by a claim, in id order (`RETURNING` has no order of its own).
pub(super) fn decode_messages(rows: Vec<SqliteRow>) -> Result<Vec<OutboxMessage>, sqlx::Error> {
    let mut messages = rows
        .iter()
        .map(|row| {
            let parts = MessageParts {
                topic: row.try_get("topic")?,
                key: row.try_get("key")?,
                // A table of the team's own may leave its headers column NULL.
                headers: row
                    .try_get::<Option<String>, _>("headers")?
                    .map(|text| headers_from_text(Some(text.as_bytes())))
                    .unwrap_or_default(),
                attempts: attempts(row.try_get::<i64, _>("attempts")?),
                created_at: datetime(row.try_get("created_at")?)?,
            };
            sql_common::message(row, parts)
        })
        .collect::<Result<Vec<_>, sqlx::Error>>()?;
    messages.sort_unstable_by_key(|m| m.id);
    Ok(messages)
}

/// A row of `Statements::blocked_keys` (`admin.rs`).
pub(super) fn decode_blocked(row: &SqliteRow) -> Result<BlockedKey, sqlx::Error> {
    let owner: Option<String> = row.try_get("owner")?;
    Ok(BlockedKey {
        key: row.try_get("key")?,
        head_id: row.try_get("head_id")?,
        state: HeadState::of(row.try_get::<i64, _>("dead")? != 0, owner.as_deref()),
        owner,
        attempts: attempts(row.try_get::<i64, _>("attempts")?),
        last_error: row.try_get("last_error")?,
        head_created_at: datetime(row.try_get("created_at")?)?,
        until: datetime(row.try_get("until")?)?,
        waiting_behind: count(row.try_get("waiting")?),
    })
}

/// A row of `Statements::stats` (`admin.rs`), read at `now`.
pub(super) fn decode_topic_stats(row: &SqliteRow, now: i64) -> Result<TopicStats, sqlx::Error> {
    let oldest: Option<i64> = row.try_get("oldest_pending_created_at")?;
    let oldest =
        oldest.map(|created| Duration::from_millis(now.saturating_sub(created).max(0) as u64));
    sql_common::topic_stats(row, row.try_get("topic")?, oldest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_are_clamped() {
        assert_eq!(after(1_000, Duration::from_millis(1500)), 2_500);
        assert_eq!(before(1_000, Duration::from_millis(1500)), -500);
        assert_eq!(after(0, Duration::MAX), rows::MAX_DELAY.as_millis() as i64);
    }

    #[test]
    fn lists_are_json_arrays() {
        assert_eq!(json_list(&[1i64, 2]), "[1,2]");
        assert_eq!(json_list(&["a\"b".to_owned()]), r#"["a\"b"]"#);
    }
}
