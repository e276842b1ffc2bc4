//! The PostgreSQL backend of the group contract: a fresh schema per test, the relay's
//! default table or the storage contract's mapped team table; and what only PostgreSQL
//! has, a frontier behind transactions still open.

use std::sync::atomic::{AtomicBool, Ordering};

use sqlx::postgres::PgConnection;
use sqlx::{Connection, Executor};
use txoutbox_server::config::columns::{Columns, TopicSource};
use txoutbox_server::config::{SynchronousCommit, Timeouts};
use txoutbox_server::storage::postgres::groups::PostgresGroups;
use txoutbox_server::storage::postgres::{lazy_pool, PostgresExtras, PostgresStorage};
use txoutbox_server::storage::timed::Timed;
use txoutbox_server::storage::{Storage, TableOptions};

use super::*;
use crate::pg_schema::{fresh_schema, url, DropSchema};
use crate::team_tables;

pub struct PgSchema {
    schema: String,
    table: String,
    /// A team's own table: the DDL of its message columns, run before the relay adds
    /// what the mapping still needs.
    team_table: Option<&'static str>,
    columns: Columns,
    created: AtomicBool,
    _drop: DropSchema,
}

impl PgSchema {
    pub async fn new() -> Self {
        let schema = fresh_schema();
        Self {
            _drop: DropSchema(schema.clone()),
            schema,
            table: "outbox".to_owned(),
            team_table: None,
            columns: Columns::default(),
            created: AtomicBool::new(false),
        }
    }

    /// The storage contract's team table, mapped in configuration.
    pub async fn mapped() -> Self {
        Self {
            table: "order_events".to_owned(),
            team_table: Some(team_tables::POSTGRES_TABLE),
            columns: Columns::from_mapping(&team_tables::postgres_mapping()).unwrap(),
            ..Self::new().await
        }
    }

    /// `schema.table`, quoted.
    fn qualified(&self) -> String {
        format!("\"{}\".\"{}\"", self.schema, self.table)
    }

    /// The outbox table with the relay's columns, as `create_schema` makes it for an
    /// outbox with groups (no strict-ordering trigger).
    async fn create_table(&self) {
        if self.created.swap(true, Ordering::SeqCst) {
            return;
        }
        self.run(&format!("CREATE SCHEMA IF NOT EXISTS \"{}\"", self.schema))
            .await;
        if let Some(team_table) = self.team_table {
            self.run(&team_table.replace("{table}", &self.qualified()))
                .await;
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
        let extras = PostgresExtras {
            schema: Some(self.schema.clone()),
            notify_channel: None,
        };
        let storage = PostgresStorage::connect(&url(), 1, options, extras)
            .await
            .unwrap();
        storage
            .ensure_table()
            .await
            .expect("create the outbox table");
        storage.verify_table().await.expect("the table fits");
    }

    /// The producer's `INSERT` of one row, by the table's own column names; `$1` the
    /// key, `$2` the payload, `$3` minutes ago.
    fn insert_sql(&self, payload: &str) -> String {
        let c = &self.columns;
        let TopicSource::Column(topic) = &c.topic else {
            unreachable!("the contract's tables have a topic column")
        };
        let headers = c.headers.as_ref().expect("the tables have headers");
        format!(
            "INSERT INTO {t} ({topic}, {key}, {payload_column}, {headers}, {created_at}) \
             VALUES ('{TOPIC}', $1, $2, '{{\"trace\": \"{payload}\"}}', \
                     now() - make_interval(mins => $3)) \
             RETURNING {id}::int8",
            t = self.qualified(),
            topic = topic.quoted(),
            key = c.key.quoted(),
            payload_column = c.payload.quoted(),
            headers = headers.quoted(),
            created_at = c.created_at.quoted(),
            id = c.id.quoted(),
        )
    }
}

impl GroupBackend for PgSchema {
    async fn store(&self, partitions: u32) -> Store {
        self.create_table().await;
        let pool = lazy_pool(&url(), 4, SynchronousCommit::default()).unwrap();
        let store = PostgresGroups::new(
            pool,
            Some(&self.schema),
            &self.table,
            &self.columns,
            partitions,
            1 << 22,
        )
        .unwrap();
        Arc::new(Timed::groups(Arc::new(store), "test", Timeouts::default()))
    }

    async fn produce(&self, key: Option<&str>, payload: &str, minutes_ago: u32) -> MessageId {
        self.create_table().await;
        let mut conn = PgConnection::connect(&url()).await.expect("connect");
        sqlx::query_scalar(&self.insert_sql(payload))
            .bind(key)
            .bind(payload.as_bytes())
            .bind(minutes_ago as i32)
            .fetch_one(&mut conn)
            .await
            .expect("produce")
    }

    async fn run(&self, sql: &str) {
        let mut conn = PgConnection::connect(&url()).await.expect("connect");
        conn.execute(sql).await.expect(sql);
    }
}

// -- only PostgreSQL has: a frontier ---------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_transaction_holds_back_later_commits_and_its_row_goes_first() {
    an_open_transaction_holds_back_later_commits_and_its_row_goes_first_on(PgSchema::new().await)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_transaction_holds_back_later_commits_and_its_row_goes_first_on_a_mapped_table() {
    an_open_transaction_holds_back_later_commits_and_its_row_goes_first_on(
        PgSchema::mapped().await,
    )
    .await;
}

/// Docs, rule 1: transaction A takes its id, B commits a row of key k, then A inserts a
/// row of k (a higher id) and stays open. B's row is not readable while A is open, and
/// the frontier delay shows how long A has been open; once A commits, A's row comes
/// first: log order is the transactions' order, not the ids'.
async fn an_open_transaction_holds_back_later_commits_and_its_row_goes_first_on(backend: PgSchema) {
    let store = ready(&backend, &[("g", GroupStart::Oldest)]).await;
    let before = backend.produce(Some("k"), "before", 0).await;
    readable(&store, &every_partition(Position::START), 1).await;

    let mut a = PgConnection::connect(&url()).await.expect("connect");
    a.execute("BEGIN").await.unwrap();
    a.execute("SELECT pg_current_xact_id()").await.unwrap();
    let b = backend.produce(Some("k"), "from b", 0).await;
    let a_row: MessageId = sqlx::query_scalar(&backend.insert_sql("from a"))
        .bind("k")
        .bind(b"from a".as_slice())
        .bind(0)
        .fetch_one(&mut a)
        .await
        .unwrap();
    assert!(a_row > b, "A's row has the higher id");

    let read = read_pages(&store, &every_partition(Position::START), 100).await;
    assert_eq!(ids_of(&read), [before], "B's row was read while A is open");
    let delay = until(
        "a frontier delay while A is open",
        || store.frontier_delay(),
        |delay| delay.as_ref().is_ok_and(|d| *d > Duration::ZERO),
    )
    .await;
    assert!(delay.is_ok());
    let stats = store.stats("g", false).await.unwrap();
    assert_eq!(stats.lag_rows, 1, "rows past the frontier are not lag yet");

    a.execute("COMMIT").await.unwrap();
    let rows = readable(&store, &every_partition(Position::START), 3).await;
    assert_eq!(ids_of(&rows), [before, a_row, b], "log order");
    assert!(rows[1].position < rows[2].position);
}

// -- only PostgreSQL has: an index per partition count -----------------------------------

/// The log index is named for its partition count, so a start with another count would
/// add one; a start refused for that count adds nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_refused_for_its_partition_count_adds_no_index() {
    let backend = PgSchema::new().await;
    ready(&backend, &[("g", GroupStart::Oldest)]).await;
    let more = backend.store(PARTITIONS * 2).await;
    let refused = more
        .ensure(&groups(&[("g", GroupStart::Oldest)]), PARTITIONS * 2, true)
        .await;
    assert!(refused.is_err(), "a changed partition count: {refused:?}");
    let index = |partitions: u32| {
        format!(
            "SELECT to_regclass('\"{}\".\"{}_log_p{partitions}_idx\"')::text",
            backend.schema, backend.table
        )
    };
    let mut conn = PgConnection::connect(&url()).await.expect("connect");
    let kept: Option<String> = sqlx::query_scalar(&index(PARTITIONS))
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert!(kept.is_some(), "the first start's index is there");
    let added: Option<String> = sqlx::query_scalar(&index(PARTITIONS * 2))
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(added, None, "the refused start added its index");
}
