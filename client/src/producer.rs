//! Producer side: write an outbox row in the same transaction as your data, on
//! PostgreSQL ([`OutboxTable::insert`], feature `postgres`), MySQL/MariaDB
//! ([`OutboxTable::insert_mysql`], feature `mysql`) or SQLite
//! ([`OutboxTable::insert_sqlite`], feature `sqlite`).
//!
//! That is the whole point of an outbox: the row commits (and is later published) if and
//! only if your business change commits. The row never goes through `txoutboxd`; the
//! server only reads the table. Columns match the DDL the server creates (and prints with
//! `Admin.Schema`): `topic`, `key`, `payload` (bytes), `headers` (a JSON object). A table
//! of your own mapped with `[outboxes.NAME.columns]` has its own names: insert into it
//! with your own SQL.
//!
//! ```no_run
//! # async fn demo(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! use txoutbox_client::producer::{NewMessage, OutboxTable};
//!
//! let outbox = OutboxTable::in_schema("app", "outbox")?;
//! let mut tx = pool.begin().await?;
//! sqlx::query("UPDATE orders SET status = 'paid' WHERE id = $1")
//!     .bind(42_i64)
//!     .execute(&mut *tx)
//!     .await?;
//! let message = NewMessage::json("orders.paid", &serde_json::json!({"order": 42}))?
//!     .key("customer-7")
//!     .header("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
//! outbox.insert(&mut *tx, &message).await?;
//! tx.commit().await?;
//! # Ok(())
//! # }
//! ```

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;
use sqlx::types::Json;

/// Longest identifier PostgreSQL keeps without truncating.
const MAX_IDENT_LEN: usize = 63;

/// A table or schema name that is not a plain SQL identifier.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "`{value}` is not a valid SQL identifier: use 1 to 63 ASCII letters, digits and \
     underscores, not starting with a digit"
)]
pub struct InvalidIdentifier {
    /// The name as given.
    pub value: String,
}

/// An outbox table: where [`insert`](Self::insert) writes. Build it once and reuse it.
///
/// Names are validated as plain identifiers (`^[A-Za-z_][A-Za-z0-9_]{0,62}$`, the same
/// rule as the server's configuration) and quoted, so the case is kept exactly as given,
/// as the server does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxTable {
    schema: Option<String>,
    table: String,
    display: String,
    insert_sql: String,
}

impl OutboxTable {
    /// The table `table` in the connection's default schema (its `search_path`).
    pub fn new(table: &str) -> Result<Self, InvalidIdentifier> {
        Ok(Self::render(None, validated(table)?))
    }

    /// The table `table` in `schema` (on MySQL/MariaDB: the database `schema`; on SQLite:
    /// the attached database `schema`).
    pub fn in_schema(schema: &str, table: &str) -> Result<Self, InvalidIdentifier> {
        Ok(Self::render(Some(validated(schema)?), validated(table)?))
    }

    fn render(schema: Option<&str>, table: &str) -> Self {
        let (quoted, display) = match schema {
            Some(schema) => (
                format!("{}.{}", quote(schema), quote(table)),
                format!("{schema}.{table}"),
            ),
            None => (quote(table), table.to_owned()),
        };
        Self {
            schema: schema.map(str::to_owned),
            table: table.to_owned(),
            insert_sql: format!(
                "INSERT INTO {quoted} (topic, key, payload, headers) VALUES ($1, $2, $3, $4) \
                 RETURNING id"
            ),
            display,
        }
    }

    /// The table's name for MySQL, quoted with backticks (MySQL's default `sql_mode` reads
    /// double quotes as strings).
    #[cfg(feature = "mysql")]
    fn mysql_name(&self) -> String {
        match &self.schema {
            Some(schema) => format!("`{schema}`.`{}`", self.table),
            None => format!("`{}`", self.table),
        }
    }

    /// Inserts `message` through `executor` (PostgreSQL) and returns the new row's id.
    ///
    /// Pass your open transaction (`&mut *tx`) so the row commits or rolls back with your
    /// other changes; a `&mut PgConnection` or a `&PgPool` work too (but then the insert
    /// is not atomic with anything else).
    #[cfg(feature = "postgres")]
    pub async fn insert<'c, E>(&self, executor: E, message: &NewMessage) -> Result<i64, sqlx::Error>
    where
        E: sqlx::PgExecutor<'c>,
    {
        let payload = message.payload.as_bytes();
        sqlx::query_scalar(&self.insert_sql)
            .bind(&message.topic)
            .bind(message.key.as_deref())
            .bind(payload.as_ref())
            .bind(Json(&message.headers))
            .fetch_one(executor)
            .await
    }

    /// Inserts `message` through `executor` (MySQL or MariaDB) and returns the new row's
    /// id. Pass your open transaction (`&mut *tx`), as with [`insert`](Self::insert).
    #[cfg(feature = "mysql")]
    pub async fn insert_mysql<'c, E>(
        &self,
        executor: E,
        message: &NewMessage,
    ) -> Result<i64, sqlx::Error>
    where
        E: sqlx::MySqlExecutor<'c>,
    {
        let sql = format!(
            "INSERT INTO {} (topic, `key`, payload, headers) VALUES (?, ?, ?, ?)",
            self.mysql_name()
        );
        let done = sqlx::query(&sql)
            .bind(&message.topic)
            .bind(message.key.as_deref())
            .bind(message.payload.as_bytes().as_ref())
            .bind(Json(&message.headers))
            .execute(executor)
            .await?;
        i64::try_from(done.last_insert_id()).map_err(|error| sqlx::Error::Decode(error.into()))
    }

    /// Inserts `message` through `executor` (SQLite) and returns the new row's id. Pass
    /// your open transaction (`&mut *tx`), as with [`insert`](Self::insert); keep it short,
    /// since SQLite has one writer per file and the relay's claims wait for it.
    #[cfg(feature = "sqlite")]
    pub async fn insert_sqlite<'c, E>(
        &self,
        executor: E,
        message: &NewMessage,
    ) -> Result<i64, sqlx::Error>
    where
        E: sqlx::SqliteExecutor<'c>,
    {
        // SQLite takes the PostgreSQL statement as written: double-quoted names,
        // `$n` parameters, `RETURNING`.
        sqlx::query_scalar(&self.insert_sql)
            .bind(&message.topic)
            .bind(message.key.as_deref())
            .bind(message.payload.as_bytes().as_ref())
            .bind(Json(&message.headers))
            .fetch_one(executor)
            .await
    }
}

impl fmt::Display for OutboxTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.display)
    }
}

/// The payload of a new message, stored as bytes whatever its form.
#[derive(Debug, Clone, PartialEq)]
pub enum Payload {
    /// Raw bytes, stored as given.
    Bytes(Vec<u8>),
    /// Text, stored as UTF-8.
    Text(String),
    /// A JSON value, stored as compact JSON text.
    Json(serde_json::Value),
}

impl Payload {
    /// Serializes `value` to JSON.
    pub fn json(value: &impl Serialize) -> Result<Self, serde_json::Error> {
        Ok(Self::Json(serde_json::to_value(value)?))
    }

    /// The bytes written to the `payload` column.
    pub fn as_bytes(&self) -> std::borrow::Cow<'_, [u8]> {
        match self {
            Self::Bytes(bytes) => bytes.as_slice().into(),
            Self::Text(text) => text.as_bytes().into(),
            Self::Json(value) => serde_json::to_vec(value)
                .expect("a serde_json::Value always serializes")
                .into(),
        }
    }
}

impl From<Vec<u8>> for Payload {
    fn from(bytes: Vec<u8>) -> Self {
        Self::Bytes(bytes)
    }
}

impl From<&[u8]> for Payload {
    fn from(bytes: &[u8]) -> Self {
        Self::Bytes(bytes.to_vec())
    }
}

impl From<bytes::Bytes> for Payload {
    fn from(bytes: bytes::Bytes) -> Self {
        Self::Bytes(bytes.to_vec())
    }
}

impl From<String> for Payload {
    fn from(text: String) -> Self {
        Self::Text(text)
    }
}

impl From<&str> for Payload {
    fn from(text: &str) -> Self {
        Self::Text(text.to_owned())
    }
}

impl From<serde_json::Value> for Payload {
    fn from(value: serde_json::Value) -> Self {
        Self::Json(value)
    }
}

/// A row to insert: topic, payload, and optionally an ordering key and headers.
///
/// ```
/// use txoutbox_client::producer::NewMessage;
///
/// let message = NewMessage::new("orders.created", "plain text")
///     .key("customer-7")
///     .header("content-type", "text/plain");
/// assert_eq!(message.key.as_deref(), Some("customer-7"));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct NewMessage {
    /// Topic, for example `orders.created`.
    pub topic: String,
    /// Ordering key: messages sharing a key are published in insertion order.
    pub key: Option<String>,
    /// The payload.
    pub payload: Payload,
    /// Headers, stored as a JSON object of strings (a W3C `traceparent`, a content type).
    pub headers: BTreeMap<String, String>,
}

impl NewMessage {
    /// A keyless message without headers.
    pub fn new(topic: impl Into<String>, payload: impl Into<Payload>) -> Self {
        Self {
            topic: topic.into(),
            key: None,
            payload: payload.into(),
            headers: BTreeMap::new(),
        }
    }

    /// A message whose payload is `value` serialized as JSON.
    pub fn json(
        topic: impl Into<String>,
        value: &impl Serialize,
    ) -> Result<Self, serde_json::Error> {
        Ok(Self::new(topic, Payload::json(value)?))
    }

    /// Sets the ordering key.
    #[must_use]
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Adds a header.
    #[must_use]
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(name.into(), value.into());
        self
    }
}

/// `value` if it is a plain identifier.
fn validated(value: &str) -> Result<&str, InvalidIdentifier> {
    let mut chars = value.chars();
    let starts_well = chars
        .next()
        .is_some_and(|first| first.is_ascii_alphabetic() || first == '_');
    let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if starts_well && rest_ok && value.len() <= MAX_IDENT_LEN {
        Ok(value)
    } else {
        Err(InvalidIdentifier {
            value: value.to_owned(),
        })
    }
}

/// Double-quotes a validated identifier (it holds no quote to escape).
fn quote(ident: &str) -> String {
    format!("\"{ident}\"")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_validated_and_quoted() {
        let table = OutboxTable::in_schema("App", "outbox_1").unwrap();
        assert_eq!(
            table.insert_sql,
            "INSERT INTO \"App\".\"outbox_1\" (topic, key, payload, headers) \
             VALUES ($1, $2, $3, $4) RETURNING id"
        );
        assert_eq!(table.to_string(), "App.outbox_1");
        for bad in [
            "",
            "1outbox",
            "out-box",
            "outbox; DROP TABLE x",
            "a\"b",
            "public.outbox",
            &"x".repeat(64),
        ] {
            assert_eq!(OutboxTable::new(bad).unwrap_err().value, bad);
            assert!(OutboxTable::in_schema(bad, "outbox").is_err());
        }
    }

    #[test]
    fn payloads_become_bytes() {
        assert_eq!(&*Payload::from("hé").as_bytes(), "hé".as_bytes());
        assert_eq!(&*Payload::from(vec![0_u8, 255]).as_bytes(), &[0, 255]);
        let json = Payload::json(&serde_json::json!({"a": [1, 2]})).unwrap();
        assert_eq!(&*json.as_bytes(), br#"{"a":[1,2]}"#);
    }
}
