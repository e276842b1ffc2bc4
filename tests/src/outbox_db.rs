//! What the end-to-end suite needs of a test's outbox table, whatever holds it: a
//! configuration naming it, a producer's inserts, and a look at its rows. One trait, so
//! `tests/tests/e2e.rs` runs the same cases on PostgreSQL ([`TestDb`]), SQLite
//! ([`SqliteDb`]), MariaDB ([`MariaDb`]) and a team's own PostgreSQL table mapped in
//! configuration ([`MappedPgDb`]).

use sqlx::Row;

use crate::server::run_to_exit;
use crate::{MariaDb, SqliteDb, TestDb};

/// Rows to insert in one statement: `(key, payload)`.
pub type Rows = [(Option<String>, Vec<u8>)];

/// A database holding one test's outbox `orders`.
#[allow(async_fn_in_trait)] // Used by the tests of this workspace only, never boxed.
pub trait OutboxDb {
    /// A configuration with the one outbox `orders`; `extra` is appended to its table.
    fn config(&self, extra: &str) -> String;
    /// Inserts a row as a producer would, in its own transaction; returns its id.
    async fn insert(&self, topic: &str, key: Option<&str>, payload: &[u8]) -> i64;
    /// Inserts `rows` in one statement, all on `topic`, in order; returns their ids.
    async fn insert_many(&self, topic: &str, rows: &Rows) -> Vec<i64>;
    /// `(status, attempts, last_error)` of a row.
    async fn row(&self, id: i64) -> (String, i32, Option<String>);
    /// How many rows have this status.
    async fn count(&self, status: &str) -> i64;
    /// Removes what the test created.
    async fn drop(self);
}

/// Implements [`OutboxDb`] with the type's own methods of the same names.
macro_rules! outbox_db_by_inherent_methods {
    ($($db:ty),+) => {$(
        impl OutboxDb for $db {
            fn config(&self, extra: &str) -> String {
                <$db>::config(self, extra)
            }
            async fn insert(&self, topic: &str, key: Option<&str>, payload: &[u8]) -> i64 {
                <$db>::insert(self, topic, key, payload).await
            }
            async fn insert_many(&self, topic: &str, rows: &Rows) -> Vec<i64> {
                <$db>::insert_many(self, topic, rows).await
            }
            async fn row(&self, id: i64) -> (String, i32, Option<String>) {
                <$db>::row(self, id).await
            }
            async fn count(&self, status: &str) -> i64 {
                <$db>::count(self, status).await
            }
            async fn drop(self) {
                <$db>::drop(self).await
            }
        }
    )+};
}

outbox_db_by_inherent_methods!(TestDb, SqliteDb, MariaDb);

/// A team's own PostgreSQL table, none of whose columns has the relay's name, with an
/// `integer` id, `varchar` topic and key and `json` headers; mapped in
/// `[outboxes.orders.columns]` and prepared with the DDL `txoutboxd schema` prints.
pub struct MappedPgDb {
    db: TestDb,
}

/// The team's table before the relay: message columns only.
pub const TEAM_TABLE: &str = "CREATE TABLE {schema}.order_events (
    event_id     serial PRIMARY KEY,
    event_type   varchar(200) NOT NULL,
    aggregate_id varchar(200),
    body         bytea NOT NULL,
    meta         json NOT NULL DEFAULT '{}',
    occurred_at  timestamptz NOT NULL DEFAULT now()
)";

/// The outbox keys that map [`TEAM_TABLE`].
pub const TEAM_MAPPING: &str = r#"
table = "order_events"
[outboxes.orders.columns]
id = "event_id"
topic = "event_type"
key = "aggregate_id"
payload = "body"
headers = "meta"
created_at = "occurred_at"
status = "relay_status"
attempts = "relay_attempts"
available_at = "relay_due_at"
leased_by = "relay_owner"
last_error = "relay_error"
processed_at = "relay_done_at"
"#;

impl MappedPgDb {
    /// Creates the team's table, then runs `txoutboxd schema` and its DDL on it.
    pub async fn new() -> Self {
        let mapped = Self::unprepared().await;
        let printed = run_to_exit(&mapped.config(""), &["schema", "orders"]);
        assert!(printed.status.success(), "txoutboxd schema: {printed:?}");
        let ddl = String::from_utf8(printed.stdout).expect("UTF-8 DDL");
        sqlx::raw_sql(&ddl).execute(&mapped.db.pool).await.unwrap();
        mapped
    }

    /// The team's table as it was before the relay: no bookkeeping columns yet.
    pub async fn unprepared() -> Self {
        let db = TestDb::new().await;
        sqlx::query(&TEAM_TABLE.replace("{schema}", &db.schema))
            .execute(&db.pool)
            .await
            .unwrap();
        Self { db }
    }

    /// The PostgreSQL schema holding the table.
    pub fn schema(&self) -> &str {
        &self.db.schema
    }

    pub fn pool(&self) -> &sqlx::PgPool {
        &self.db.pool
    }

    fn table(&self) -> String {
        format!("{}.order_events", self.db.schema)
    }
}

impl OutboxDb for MappedPgDb {
    /// [`TestDb::config`] on the team's table: mapped, and without `create_schema` (the
    /// table is theirs; [`MappedPgDb::new`] prepared it).
    fn config(&self, extra: &str) -> String {
        self.db
            .config(&format!("{extra}\n{TEAM_MAPPING}"))
            .replacen("table = \"outbox\"\n", "", 1)
            .replacen("create_schema = true\n", "", 1)
    }

    async fn insert(&self, topic: &str, key: Option<&str>, payload: &[u8]) -> i64 {
        let id: i32 = sqlx::query_scalar(&format!(
            "INSERT INTO {} (event_type, aggregate_id, body, meta) \
             VALUES ($1, $2, $3, '{{\"source\":\"e2e\"}}') RETURNING event_id",
            self.table()
        ))
        .bind(topic)
        .bind(key)
        .bind(payload)
        .fetch_one(&self.db.pool)
        .await
        .unwrap();
        i64::from(id)
    }

    async fn insert_many(&self, topic: &str, rows: &Rows) -> Vec<i64> {
        let keys: Vec<Option<String>> = rows.iter().map(|(k, _)| k.clone()).collect();
        let payloads: Vec<Vec<u8>> = rows.iter().map(|(_, p)| p.clone()).collect();
        let ids: Vec<i32> = sqlx::query_scalar(&format!(
            "INSERT INTO {} (event_type, aggregate_id, body) \
             SELECT $1, k, p FROM unnest($2::text[], $3::bytea[]) WITH ORDINALITY AS r(k, p, n) \
             ORDER BY n RETURNING event_id",
            self.table()
        ))
        .bind(topic)
        .bind(keys)
        .bind(payloads)
        .fetch_all(&self.db.pool)
        .await
        .unwrap();
        ids.into_iter().map(i64::from).collect()
    }

    async fn row(&self, id: i64) -> (String, i32, Option<String>) {
        let row = sqlx::query(&format!(
            "SELECT relay_status, relay_attempts, relay_error FROM {} WHERE event_id = $1",
            self.table()
        ))
        .bind(id)
        .fetch_one(&self.db.pool)
        .await
        .unwrap();
        (row.get(0), row.get(1), row.get(2))
    }

    async fn count(&self, status: &str) -> i64 {
        sqlx::query_scalar(&format!(
            "SELECT count(*) FROM {} WHERE relay_status = $1",
            self.table()
        ))
        .bind(status)
        .fetch_one(&self.db.pool)
        .await
        .unwrap()
    }

    async fn drop(self) {
        self.db.drop().await
    }
}
