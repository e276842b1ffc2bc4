//! A fresh SQLite file per test, in a temporary directory: the SQLite twin of
//! [`crate::TestDb`], with the same methods, so a test reads the same on either backend.
//!
//! Its connections are the producer application's: plain sqlx, nothing of the server's,
//! each insert in a transaction of its own, into the file the server claims from.

use std::path::{Path, PathBuf};
use std::str::FromStr;

use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};
use sqlx::Row;

pub struct SqliteDb {
    pub file: PathBuf,
    pool: SqlitePool,
    /// Removed with everything in it when the test ends; `None` for a caller's directory.
    _dir: Option<tempfile::TempDir>,
}

impl SqliteDb {
    /// A file in a new temporary directory; the server creates it and its table.
    pub async fn new() -> Self {
        let dir = tempfile::tempdir().expect("temporary directory");
        let mut db = Self::at(&dir.path().join("outbox.db"));
        db._dir = Some(dir);
        db
    }

    /// The file at `file`, for example the embedded default's `txoutbox.db`. Connects on
    /// first use, so the server may create the file first.
    pub fn at(file: &Path) -> Self {
        let options = SqliteConnectOptions::from_str(&url(file)).expect("sqlite url");
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_lazy_with(options);
        Self {
            file: file.to_owned(),
            pool,
            _dir: None,
        }
    }

    /// The producer's connections, for transactions a test shapes itself.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// A configuration with one outbox `orders` in this file; `extra` is appended to the
    /// `[outboxes.orders]` table (for example `max_attempts = 3`). SQLite has no insert
    /// signal: idle polling is capped at 200ms so the tests do not wait on it.
    pub fn config(&self, extra: &str) -> String {
        format!(
            r#"
[server]
listen = "127.0.0.1:0"
log_format = "json"
drain_timeout = "10s"
health_interval = "1s"

[databases.main]
url = "{url}"

[outboxes.orders]
database = "main"
table = "outbox"
create_schema = true
poll.max = "200ms"
{extra}
"#,
            url = url(&self.file),
        )
    }

    /// Inserts a row the way a producer would, in its own transaction.
    pub async fn insert(&self, topic: &str, key: Option<&str>, payload: &[u8]) -> i64 {
        let mut tx = self.pool.begin().await.unwrap();
        let id = insert_row(&mut tx, topic, key, payload).await;
        tx.commit().await.unwrap();
        id
    }

    /// Inserts many rows in one transaction: `(key, payload)` pairs, all on `topic`.
    pub async fn insert_many(&self, topic: &str, rows: &[(Option<String>, Vec<u8>)]) -> Vec<i64> {
        let mut tx = self.pool.begin().await.unwrap();
        let mut ids = Vec::with_capacity(rows.len());
        for (key, payload) in rows {
            ids.push(insert_row(&mut tx, topic, key.as_deref(), payload).await);
        }
        tx.commit().await.unwrap();
        ids
    }

    /// Whether the server has created the table yet.
    pub async fn table_exists(&self) -> bool {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'outbox'",
        )
        .fetch_one(&self.pool)
        .await
        .unwrap()
            > 0
    }

    /// `(status, attempts, last_error)` of a row.
    pub async fn row(&self, id: i64) -> (String, i32, Option<String>) {
        let row = sqlx::query("SELECT status, attempts, last_error FROM outbox WHERE id = ?1")
            .bind(id)
            .fetch_one(&self.pool)
            .await
            .unwrap();
        (row.get(0), row.get::<i64, _>(1) as i32, row.get(2))
    }

    /// How many rows have this status.
    pub async fn count(&self, status: &str) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM outbox WHERE status = ?1")
            .bind(status)
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    /// Closes the connections; the directory goes when the value is dropped.
    pub async fn drop(self) {
        self.pool.close().await;
    }
}

async fn insert_row(
    tx: &mut sqlx::SqliteConnection,
    topic: &str,
    key: Option<&str>,
    payload: &[u8],
) -> i64 {
    sqlx::query_scalar(
        "INSERT INTO outbox (topic, key, payload, headers) \
         VALUES (?1, ?2, ?3, '{\"source\":\"e2e\"}') RETURNING id",
    )
    .bind(topic)
    .bind(key)
    .bind(payload)
    .fetch_one(tx)
    .await
    .unwrap()
}

fn url(file: &Path) -> String {
    format!("sqlite://{}", file.display())
}
