//! Translations between the driver and the storage types: errors, intervals, rows; and
//! [`Conn`], the pool every part of the backend runs its statements on, with the table
//! its errors name.

use std::sync::Arc;
use std::time::Duration;

use anyhow::anyhow;
use chrono::{DateTime, Utc};
use sqlx::postgres::{types::PgInterval, PgPool, PgRow};
use sqlx::types::Json;
use sqlx::Row;

use crate::storage::rows::{self, attempts, count, headers_from_json};
use crate::storage::sql_common;
use crate::storage::{BlockedKey, HeadState, MessageId, OutboxMessage, StorageError, TopicStats};

/// The pool and the table its statements run on: each part of the backend holds one
/// (a clone shares the pool).
#[derive(Clone)]
pub(super) struct Conn {
    pub pool: PgPool,
    /// `schema.table` unquoted, for messages.
    pub table: Arc<str>,
}

impl Conn {
    /// Translates a driver error for `action`; see [`classify`].
    pub fn error(&self, action: &'static str) -> impl FnOnce(sqlx::Error) -> StorageError + '_ {
        move |err| classify(err, &self.table, action)
    }
}

/// The one place driver errors become [`StorageError`]s: by kind, not by message.
pub(super) fn classify(err: sqlx::Error, table: &str, action: &str) -> StorageError {
    let unavailable = |err: &sqlx::Error| StorageError::Unavailable(format!("{action}: {err}"));
    match &err {
        err if sql_common::is_unreachable(err) => unavailable(err),
        sqlx::Error::Database(db) => match db.code().as_deref() {
            // Class 08: connection exception. 57P01-03: admin/crash shutdown, cannot
            // connect now. 53300: too many connections. 25006: read-only transaction, a
            // standby answering after a failover, until the pool reaches the new primary.
            Some(code)
                if code.starts_with("08")
                    || matches!(code, "57P01" | "57P02" | "57P03" | "53300" | "25006") =>
            {
                unavailable(&err)
            }
            // The server refused the connection: 28P01 wrong password, 28000 no such role
            // or no pg_hba entry, 3D000 no such database, 55000 a database not accepting
            // connections. Fixed outside the relay; the cause is in the message.
            Some("28P01" | "28000" | "3D000" | "55000") => unavailable(&err),
            // The relay sessions' bounds (see `connect_options`): 55P03 a lock not granted
            // within lock_timeout, 57014 a statement cancelled by statement_timeout. The
            // database is busy or something holds the table; the caller tries again.
            Some("55P03" | "57014") => unavailable(&err),
            // A value the table cannot hold: 22021 a NUL or invalid UTF-8, 22P05 a \u0000
            // in jsonb, 22001 too long for its column, 23514 a CHECK (the key length),
            // 54000 too large for an index. The relay checks its callers' values first.
            Some("22021" | "22P05" | "22001" | "23514" | "54000") => StorageError::InvalidMessage(
                format!("{action}: the database refused the value: {err}"),
            ),
            // Undefined table, or undefined schema (part of the qualified name).
            Some("42P01" | "3F000") => StorageError::MissingTable {
                table: table.to_owned(),
            },
            _ => StorageError::Other(anyhow!(err).context(format!("{action} on {table}"))),
        },
        _ => StorageError::Other(anyhow!(err).context(format!("{action} on {table}"))),
    }
}

pub(super) fn interval(duration: Duration) -> PgInterval {
    let microseconds = rows::clamped(duration).as_micros();
    PgInterval {
        months: 0,
        days: 0,
        microseconds: microseconds as i64,
    }
}

/// What a claim statement returned: the ids it leased, the ids it dead-lettered for having
/// used their attempts, and the lease deadline (every claim returns a row carrying it).
pub(super) struct ClaimOutcome {
    pub leased: Vec<MessageId>,
    pub exhausted: Vec<MessageId>,
    pub lease_expires_at: DateTime<Utc>,
}

/// Rows `(id, spent, lease_expires_at)` of a claim statement or function.
pub(super) fn decode_claim(rows: &[PgRow]) -> Result<ClaimOutcome, sqlx::Error> {
    let mut outcome = ClaimOutcome {
        leased: Vec::new(),
        exhausted: Vec::new(),
        lease_expires_at: DateTime::<Utc>::MIN_UTC,
    };
    let mut deadline = None;
    for row in rows {
        deadline = Some(row.try_get::<DateTime<Utc>, _>("lease_expires_at")?);
        let Some(id) = row.try_get::<Option<i64>, _>("id")? else {
            continue;
        };
        if row.try_get::<Option<bool>, _>("spent")?.unwrap_or(false) {
            outcome.exhausted.push(id);
        } else {
            outcome.leased.push(id);
        }
    }
    outcome.lease_expires_at = deadline.ok_or(sqlx::Error::RowNotFound)?;
    outcome.leased.sort_unstable();
    outcome.exhausted.sort_unstable();
    Ok(outcome)
}

/// A row of the statements that read messages (`shape::message`).
pub(super) fn decode_message(row: &PgRow) -> Result<OutboxMessage, sqlx::Error> {
    let payload: Option<Vec<u8>> = row.try_get("payload")?;
    let stored_bytes: i64 = row.try_get("stored_bytes")?;
    Ok(OutboxMessage {
        id: row.try_get("id")?,
        topic: row.try_get("topic")?,
        key: row.try_get("key")?,
        too_large: payload.is_none().then_some(stored_bytes.max(0) as u64),
        payload: payload.unwrap_or_default(),
        headers: headers_from_json(row.try_get::<Json<serde_json::Value>, _>("headers")?.0),
        attempts: attempts(row.try_get::<i32, _>("attempts")?),
        created_at: row.try_get("created_at")?,
    })
}

/// A row of `admin.rs`'s blocked keys.
pub(super) fn decode_blocked(row: &PgRow) -> Result<BlockedKey, sqlx::Error> {
    let owner: Option<String> = row.try_get("owner")?;
    Ok(BlockedKey {
        key: row.try_get("key")?,
        head_id: row.try_get("head_id")?,
        state: HeadState::of(row.try_get("dead")?, owner.as_deref()),
        owner,
        attempts: attempts(row.try_get::<i32, _>("attempts")?),
        last_error: row.try_get("last_error")?,
        head_created_at: row.try_get("created_at")?,
        until: row.try_get("until")?,
        waiting_behind: count(row.try_get("waiting")?),
    })
}

pub(super) fn decode_topic_stats(row: &PgRow) -> Result<TopicStats, sqlx::Error> {
    let count = |column: &str| row.try_get::<i64, _>(column).map(count);
    let oldest: Option<f64> = row.try_get("oldest_pending_secs")?;
    Ok(TopicStats {
        topic: row.try_get("topic")?,
        pending: count("pending")?,
        leased: count("leased")?,
        waiting: count("waiting")?,
        dead: count("dead")?,
        oldest_pending_age: oldest.and_then(|secs| Duration::try_from_secs_f64(secs.max(0.0)).ok()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_are_clamped() {
        assert_eq!(
            interval(Duration::from_millis(1500)).microseconds,
            1_500_000
        );
        assert_eq!(
            interval(Duration::MAX).microseconds,
            rows::MAX_DELAY.as_micros() as i64
        );
    }
}
