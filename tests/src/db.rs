//! A fresh schema in the local PostgreSQL per test, holding that test's outbox table.

use sqlx::postgres::PgPoolOptions;
use sqlx::{PgPool, Row};

/// The local PostgreSQL of the machine; `TXOUTBOX_TEST_DATABASE_URL` overrides it.
pub fn database_url() -> String {
    std::env::var("TXOUTBOX_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

pub struct TestDb {
    pub url: String,
    pub schema: String,
    pub pool: PgPool,
}

impl TestDb {
    /// Creates a uniquely named schema; the server creates the table in it.
    pub async fn new() -> Self {
        Self::with_prefix("e2e").await
    }

    /// [`TestDb::new`] with the schema's name starting `PREFIX_` (tools of this crate
    /// name what they create after themselves).
    pub async fn with_prefix(prefix: &str) -> Self {
        let url = database_url();
        let pool = PgPoolOptions::new()
            .max_connections(4)
            .connect(&url)
            .await
            .unwrap_or_else(|e| panic!("cannot connect to {url} (is PostgreSQL running?): {e}"));
        let schema = format!(
            "{prefix}_{}",
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        );
        sqlx::query(&format!("CREATE SCHEMA {schema}"))
            .execute(&pool)
            .await
            .unwrap();
        Self { url, schema, pool }
    }

    fn table(&self) -> String {
        format!("{}.outbox", self.schema)
    }

    /// A configuration with one outbox `orders` on this schema; `extra` is appended to
    /// the `[outboxes.orders]` table (for example `max_attempts = 3`).
    pub fn config(&self, extra: &str) -> String {
        self.config_at(&self.url, extra)
    }

    /// [`TestDb::config`] reaching the database at `url`, for example through a
    /// [`crate::pg_link::PgLink`].
    pub fn config_at(&self, url: &str, extra: &str) -> String {
        format!(
            r#"
[server]
listen = "127.0.0.1:0"
log_format = "json"
drain_timeout = "10s"
health_interval = "1s"

[databases.main]
url = "{url}"
max_connections = 8

[outboxes.orders]
database = "main"
schema = "{schema}"
table = "outbox"
create_schema = true
notify_channel = "{schema}_wake"
{extra}
"#,
            schema = self.schema,
        )
    }

    /// Inserts a row the way a producer would, in its own transaction.
    pub async fn insert(&self, topic: &str, key: Option<&str>, payload: &[u8]) -> i64 {
        let mut tx = self.pool.begin().await.unwrap();
        let id: i64 = sqlx::query_scalar(&format!(
            "INSERT INTO {} (topic, key, payload, headers) VALUES ($1, $2, $3, '{{\"source\":\"e2e\"}}') RETURNING id",
            self.table()
        ))
        .bind(topic)
        .bind(key)
        .bind(payload)
        .fetch_one(&mut *tx)
        .await
        .unwrap();
        tx.commit().await.unwrap();
        id
    }

    /// Inserts many rows in one statement: `(key, payload)` pairs, all on `topic`.
    pub async fn insert_many(&self, topic: &str, rows: &[(Option<String>, Vec<u8>)]) -> Vec<i64> {
        let keys: Vec<Option<String>> = rows.iter().map(|(k, _)| k.clone()).collect();
        let payloads: Vec<Vec<u8>> = rows.iter().map(|(_, p)| p.clone()).collect();
        sqlx::query_scalar(&format!(
            "INSERT INTO {} (topic, key, payload) SELECT $1, k, p FROM unnest($2::text[], $3::bytea[]) WITH ORDINALITY AS r(k, p, n) ORDER BY n RETURNING id",
            self.table()
        ))
        .bind(topic)
        .bind(keys)
        .bind(payloads)
        .fetch_all(&self.pool)
        .await
        .unwrap()
    }

    /// Whether the server has created the table yet.
    pub async fn table_exists(&self) -> bool {
        sqlx::query_scalar::<_, bool>("SELECT to_regclass($1) IS NOT NULL")
            .bind(self.table())
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    /// `(status, attempts, last_error)` of a row.
    pub async fn row(&self, id: i64) -> (String, i32, Option<String>) {
        let row = sqlx::query(&format!(
            "SELECT status, attempts, last_error FROM {} WHERE id = $1",
            self.table()
        ))
        .bind(id)
        .fetch_one(&self.pool)
        .await
        .unwrap();
        (row.get(0), row.get(1), row.get(2))
    }

    /// How many rows have this status.
    pub async fn count(&self, status: &str) -> i64 {
        sqlx::query_scalar(&format!(
            "SELECT count(*) FROM {} WHERE status = $1",
            self.table()
        ))
        .bind(status)
        .fetch_one(&self.pool)
        .await
        .unwrap()
    }

    /// Drops the schema; call at the end of a test (a failed test leaves it for autopsy).
    pub async fn drop(self) {
        let _ = sqlx::query(&format!("DROP SCHEMA {} CASCADE", self.schema))
            .execute(&self.pool)
            .await;
        self.pool.close().await;
    }
}
