//! A fresh database in the local MariaDB per test, holding that test's outbox table: the
//! MySQL/MariaDB counterpart of [`crate::TestDb`], with the methods the tests use.

use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions};
use sqlx::Row;

/// The local MariaDB of the machine (a server, not a database: each test makes its own);
/// `TXOUTBOX_TEST_MYSQL_URL` overrides it.
pub fn server_url() -> String {
    std::env::var("TXOUTBOX_TEST_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned())
}

pub struct MariaDb {
    /// `mariadb://` URL of this test's database, as the server's configuration names it.
    pub url: String,
    pub database: String,
    pub pool: MySqlPool,
}

impl MariaDb {
    /// Creates a uniquely named database; the server creates the table in it.
    pub async fn new() -> Self {
        Self::with_prefix("e2e").await
    }

    /// [`MariaDb::new`] with the database's name starting `PREFIX_`.
    pub async fn with_prefix(prefix: &str) -> Self {
        let server = server_url();
        let admin: MySqlConnectOptions = server.parse().expect("mysql url");
        let database = format!(
            "{prefix}_{}",
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        );
        let admin_pool = MySqlPoolOptions::new()
            .max_connections(1)
            .connect_with(admin.clone())
            .await
            .unwrap_or_else(|e| panic!("cannot connect to {server} (is MariaDB running?): {e}"));
        sqlx::query(&format!("CREATE DATABASE `{database}`"))
            .execute(&admin_pool)
            .await
            .unwrap();
        admin_pool.close().await;
        let pool = MySqlPoolOptions::new()
            .max_connections(4)
            .connect_with(admin.database(&database))
            .await
            .unwrap();
        // The same server and credentials, this database, the `mariadb://` spelling.
        let (base, _) = server.rsplit_once('/').expect("url with a database path");
        let url = format!("{}/{database}", base.replacen("mysql://", "mariadb://", 1));
        Self {
            url,
            database,
            pool,
        }
    }

    /// A configuration with one outbox `orders` on this database; `extra` is appended to
    /// the `[outboxes.orders]` table (for example `max_attempts = 3`). No notify channel:
    /// MySQL outboxes poll, here at most every 200ms.
    pub fn config(&self, extra: &str) -> String {
        self.config_at(&self.url, extra)
    }

    /// [`MariaDb::config`] reaching the database at `url` (this database's URL with
    /// another host and port, for example through a link of the fault suite).
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
table = "outbox"
create_schema = true
poll.max = "200ms"
{extra}
"#,
        )
    }

    /// Inserts a row the way a producer would, in its own transaction.
    pub async fn insert(&self, topic: &str, key: Option<&str>, payload: &[u8]) -> i64 {
        let mut tx = self.pool.begin().await.unwrap();
        let done = sqlx::query(
            "INSERT INTO outbox (topic, `key`, payload, headers) \
             VALUES (?, ?, ?, '{\"source\":\"e2e\"}')",
        )
        .bind(topic)
        .bind(key)
        .bind(payload)
        .execute(&mut *tx)
        .await
        .unwrap();
        tx.commit().await.unwrap();
        done.last_insert_id() as i64
    }

    /// Inserts many rows in one statement: `(key, payload)` pairs, all on `topic`, in
    /// order. Their ids are consecutive (InnoDB's auto-increment lock mode 1, the default,
    /// gives a multi-row insert one block).
    pub async fn insert_many(&self, topic: &str, rows: &[(Option<String>, Vec<u8>)]) -> Vec<i64> {
        let values = vec!["(?, ?, ?)"; rows.len()].join(", ");
        let sql = format!("INSERT INTO outbox (topic, `key`, payload) VALUES {values}");
        let mut query = sqlx::query(&sql);
        for (key, payload) in rows {
            query = query.bind(topic).bind(key).bind(payload);
        }
        let first = query.execute(&self.pool).await.unwrap().last_insert_id() as i64;
        (first..first + rows.len() as i64).collect()
    }

    /// `(status, attempts, last_error)` of a row.
    pub async fn row(&self, id: i64) -> (String, i32, Option<String>) {
        let row = sqlx::query("SELECT status, attempts, last_error FROM outbox WHERE id = ?")
            .bind(id)
            .fetch_one(&self.pool)
            .await
            .unwrap();
        (row.get(0), row.get(1), row.get(2))
    }

    /// How many rows have this status.
    pub async fn count(&self, status: &str) -> i64 {
        sqlx::query_scalar("SELECT COUNT(*) FROM outbox WHERE status = ?")
            .bind(status)
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    /// Drops the database; call at the end of a test (a failed test leaves it for autopsy).
    pub async fn drop(self) {
        let _ = sqlx::query(&format!("DROP DATABASE `{}`", self.database))
            .execute(&self.pool)
            .await;
        self.pool.close().await;
    }
}
