//! The SQLite backend of the group contract: a fresh database file per test, with the
//! relay's default table or the storage contract's mapped team table.

use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};

use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};
use sqlx::Executor;
use txoutbox_server::config::columns::{Columns, TopicSource};
use txoutbox_server::config::Timeouts;
use txoutbox_server::storage::sqlite::groups::SqliteGroups;
use txoutbox_server::storage::sqlite::{lazy_pools, SqliteStorage};
use txoutbox_server::storage::timed::Timed;
use txoutbox_server::storage::{Storage, TableOptions};

use super::*;
use crate::team_tables::{self, SQLITE_NOW_MS};

/// A fresh database file per test, in a temporary directory removed when the test ends.
pub struct SqliteFile {
    url: String,
    _dir: tempfile::TempDir,
    table: String,
    columns: Columns,
    /// The team's own table, created before the relay adds what it needs.
    own_table: Option<String>,
    created: AtomicBool,
}

impl SqliteFile {
    pub async fn new() -> Self {
        let dir = tempfile::tempdir().expect("temporary directory");
        Self {
            url: format!("sqlite://{}", dir.path().join("outbox.db").display()),
            _dir: dir,
            table: "outbox".to_owned(),
            columns: Columns::default(),
            own_table: None,
            created: AtomicBool::new(false),
        }
    }

    /// The storage contract's team table, mapped in configuration.
    pub async fn mapped() -> Self {
        Self {
            table: "order_events".to_owned(),
            columns: Columns::from_mapping(&team_tables::mariadb_and_sqlite_mapping()).unwrap(),
            own_table: Some(team_tables::sqlite_table()),
            ..Self::new().await
        }
    }

    /// Connections of the producer application: plain sqlx, nothing of the relay's.
    async fn producer(&self) -> SqlitePool {
        let options = SqliteConnectOptions::from_str(&self.url)
            .unwrap()
            .create_if_missing(true)
            .busy_timeout(Duration::from_secs(5));
        SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(options)
            .await
            .expect("producer connects")
    }

    /// The outbox table with the relay's columns, as `create_schema` makes it.
    async fn create_table(&self) {
        if self.created.swap(true, Ordering::SeqCst) {
            return;
        }
        if let Some(own_table) = &self.own_table {
            self.run(own_table).await;
        }
        let options = TableOptions {
            table: self.table.clone(),
            strict_ordering: false,
            dead_letter_holds_key: false,
            delete_on_ack: false,
            visibility_delay: Duration::ZERO,
            columns: self.columns.clone(),
            max_row_bytes: 1 << 22,
        };
        let storage = SqliteStorage::connect(&self.url, 1, options).await.unwrap();
        storage
            .ensure_table()
            .await
            .expect("create the outbox table");
        storage.verify_table().await.expect("the table fits");
    }
}

impl GroupBackend for SqliteFile {
    async fn store(&self, partitions: u32) -> Store {
        self.create_table().await;
        let pools = lazy_pools(&self.url, 4).unwrap();
        let store =
            SqliteGroups::new(pools, &self.table, &self.columns, partitions, 1 << 22).unwrap();
        Arc::new(Timed::groups(Arc::new(store), "test", Timeouts::default()))
    }

    async fn produce(&self, key: Option<&str>, payload: &str, minutes_ago: u32) -> MessageId {
        self.create_table().await;
        let c = &self.columns;
        let TopicSource::Column(topic) = &c.topic else {
            unreachable!("the contract's tables have a topic column")
        };
        let headers = c.headers.as_ref().expect("the tables have headers");
        let sql = format!(
            "INSERT INTO \"{t}\" ({topic}, {key}, {payload}, {headers}, {created_at}) \
             VALUES ('{TOPIC}', ?1, ?2, ?3, {SQLITE_NOW_MS} - ?4 * 60000) RETURNING {id}",
            t = self.table,
            topic = topic.quoted(),
            key = c.key.quoted(),
            payload = c.payload.quoted(),
            headers = headers.quoted(),
            created_at = c.created_at.quoted(),
            id = c.id.quoted(),
        );
        let producer = self.producer().await;
        let id = sqlx::query_scalar(&sql)
            .bind(key)
            .bind(payload.as_bytes())
            .bind(format!("{{\"trace\": \"{payload}\"}}"))
            .bind(i64::from(minutes_ago))
            .fetch_one(&producer)
            .await
            .expect("produce");
        producer.close().await;
        id
    }

    async fn run(&self, sql: &str) {
        let producer = self.producer().await;
        producer.execute(sql).await.expect(sql);
        producer.close().await;
    }
}
