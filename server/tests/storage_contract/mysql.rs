//! The MySQL/MariaDB backend of the contract.
//!
//! Every test gets a database of its own (`contract_<uuid>`, MySQL's "schema") on the
//! server at `TXOUTBOX_TEST_MYSQL_URL` (default `mysql://root@127.0.0.1:3306/test`),
//! dropped when the test ends, even when it fails. Storages reach the table through the
//! `schema` option (qualified `db.outbox`), so the qualification is tested too.
//!
//! `MySqlBackend::mapped` runs the contract on a team's own table, mapped in
//! configuration ("bring your own table"); the cases at the bottom cover the rest of it.

use super::*;
use sqlx::mysql::MySqlConnection;
use sqlx::{Connection, Executor};
use txoutbox_server::config::columns::{ColumnMapping, Columns};
use txoutbox_server::storage::mysql::{self, MySqlStorage};
use txoutbox_server::storage::{StorageError, TableOptions};

pub fn url() -> String {
    std::env::var("TXOUTBOX_TEST_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned())
}

async fn connection() -> MySqlConnection {
    let url = url();
    MySqlConnection::connect_with(&mysql::connect_options(&url).unwrap())
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {url} (is MariaDB running?): {e}"))
}

pub struct MySqlBackend {
    pub database: String,
    table: String,
    columns: Columns,
    /// The team's own table (`{db}` stands for the database), created before the storage
    /// adds what the relay needs.
    own_table: Option<&'static str>,
    _drop: DropDatabase,
}

impl MySqlBackend {
    pub async fn new() -> Self {
        let database = format!(
            "contract_{}",
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        );
        connection()
            .await
            .execute(format!("CREATE DATABASE `{database}`").as_str())
            .await
            .expect("create database");
        Self {
            _drop: DropDatabase(database.clone()),
            database,
            table: "outbox".to_owned(),
            columns: Columns::default(),
            own_table: None,
        }
    }

    /// A team's own table: the message columns under names of its own, an `INT UNSIGNED`
    /// id, the server's default (case-insensitive) collation, a `TIMESTAMP(3)` creation
    /// time, headers that may be NULL, and none of the relay's columns or indexes:
    /// `create_schema` adds those, some under mapped names too. The payload stays binary:
    /// the contract round-trips bytes that are not UTF-8.
    pub async fn mapped() -> Self {
        let mapping = crate::team_tables::mariadb_and_sqlite_mapping();
        Self {
            table: "order_events".to_owned(),
            columns: Columns::from_mapping(&mapping).unwrap(),
            own_table: Some(
                "CREATE TABLE IF NOT EXISTS {db}.order_events (
                    event_id     INT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
                    event_type   VARCHAR(100) NOT NULL,
                    aggregate_id VARCHAR(64) NULL,
                    body         MEDIUMBLOB NOT NULL,
                    meta         JSON NULL,
                    occurred_at  TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)
                ) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4",
            ),
            ..Self::new().await
        }
    }

    /// The database holding this test's table.
    pub fn database(&self) -> Option<String> {
        Some(self.database.clone())
    }

    pub fn options(&self, setup: &Setup) -> TableOptions {
        TableOptions {
            table: self.table.clone(),
            strict_ordering: setup.strict_ordering,
            dead_letter_holds_key: setup.dead_letter_holds_key,
            delete_on_ack: setup.delete_on_ack,
            visibility_delay: setup.visibility_delay,
            columns: self.columns.clone(),
            max_row_bytes: setup.max_row_bytes,
        }
    }

    /// Runs `sql` with `{db}` standing for this test's database.
    async fn execute(&self, sql: &str) {
        let sql = sql.replace("{db}", &format!("`{}`", self.database));
        connection()
            .await
            .execute(sql.as_str())
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
}

impl Backend for MySqlBackend {
    fn team_ddl(&self, table: TeamTable) -> String {
        match table {
            TeamTable::InvoiceEvents => {
                "CREATE TABLE {db}.invoice_events (
                id        BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
                invoice   VARCHAR(64),
                document  JSON NOT NULL,
                logged_at DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6))
            )"
            }
            // A text payload in a latin1 column: the server converts it to the
            // connection's UTF-8.
            TeamTable::Notes => {
                "CREATE TABLE {db}.notes (
                id         INT NOT NULL AUTO_INCREMENT PRIMARY KEY,
                topic      VARCHAR(64) NOT NULL,
                `key`      VARCHAR(64),
                note       TEXT CHARACTER SET latin1 NOT NULL,
                headers    LONGTEXT,
                created_at DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6))
            )"
            }
        }
        .to_owned()
    }

    async fn produce(&self, sql: &str) {
        self.execute(sql).await;
    }

    async fn own_table(&self, table: TeamTable, mapping: ColumnMapping) -> Arc<dyn Storage> {
        Arc::new(own_table(self, &self.team_ddl(table), mapping).await)
    }

    async fn open(&self, setup: Setup) -> Arc<dyn Storage> {
        if let Some(own_table) = self.own_table {
            self.execute(own_table).await;
        }
        let storage =
            MySqlStorage::connect(&url(), 4, self.options(&setup), self.database()).unwrap();
        storage.ensure_table().await.expect("create schema");
        Arc::new(storage)
    }

    async fn row_count(&self) -> u64 {
        let sql = format!("SELECT COUNT(*) FROM `{}`.`{}`", self.database, self.table);
        let count: i64 = sqlx::query_scalar(&sql)
            .fetch_one(&mut connection().await)
            .await
            .unwrap();
        count as u64
    }

    async fn missing_table(&self) -> Arc<dyn Storage> {
        let options = TableOptions {
            table: "no_such_table".to_owned(),
            ..self.options(&Setup::default())
        };
        Arc::new(MySqlStorage::connect(&url(), 1, options, self.database()).unwrap())
    }

    async fn unreachable(&self) -> Arc<dyn Storage> {
        // Port 1: nothing listens.
        let options = self.options(&Setup::default());
        Arc::new(
            MySqlStorage::connect("mysql://root@127.0.0.1:1/test", 1, options, self.database())
                .unwrap(),
        )
    }

    async fn until_listening(&self) {
        // No insert signal on MySQL/MariaDB: the cases that would wait for it skip.
    }

    async fn open_late_nack(&self, id: MessageId) -> Box<dyn OpenWrite> {
        let mut conn = connection().await;
        let thread: u64 = sqlx::query_scalar("SELECT CONNECTION_ID()")
            .fetch_one(&mut conn)
            .await
            .unwrap();
        conn.execute("BEGIN").await.unwrap();
        let c = &self.columns;
        let sql = format!(
            "UPDATE `{}`.`{}` SET `{}` = UTC_TIMESTAMP(6) + INTERVAL 1 HOUR, `{}` = NULL, \
             `{}` = 'late nack' WHERE `{}` = ?",
            self.database,
            self.table,
            c.available_at.as_str(),
            c.leased_by.as_str(),
            c.last_error.as_str(),
            c.id.as_str()
        );
        let updated = sqlx::query(&sql).bind(id).execute(&mut conn).await.unwrap();
        assert_eq!(updated.rows_affected(), 1);
        Box::new(MySqlOpenWrite { conn, thread })
    }

    async fn last_error(&self, id: MessageId) -> Option<String> {
        let c = &self.columns;
        let sql = format!(
            "SELECT `{}` FROM `{}`.`{}` WHERE `{}` = ?",
            c.last_error.as_str(),
            self.database,
            self.table,
            c.id.as_str()
        );
        sqlx::query_scalar(&sql)
            .bind(id)
            .fetch_one(&mut connection().await)
            .await
            .unwrap()
    }
}

/// See [`Backend::open_late_nack`].
struct MySqlOpenWrite {
    conn: MySqlConnection,
    thread: u64,
}

#[async_trait::async_trait]
impl OpenWrite for MySqlOpenWrite {
    async fn blocks_someone(&self) -> bool {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM information_schema.INNODB_LOCK_WAITS w \
             JOIN information_schema.INNODB_TRX t ON t.trx_id = w.blocking_trx_id \
             WHERE t.trx_mysql_thread_id = ?",
        )
        .bind(self.thread)
        .fetch_one(&mut connection().await)
        .await
        .unwrap();
        waiting > 0
    }

    async fn commit(mut self: Box<Self>) {
        self.conn.execute("COMMIT").await.unwrap();
    }
}

/// Drops the database when the test ends, pass or fail, on a thread of its own since
/// `Drop` cannot await.
struct DropDatabase(String);

impl Drop for DropDatabase {
    fn drop(&mut self) {
        let sql = format!("DROP DATABASE IF EXISTS `{}`", self.0);
        let dropper = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async {
                if let Ok(mut conn) =
                    MySqlConnection::connect_with(&mysql::connect_options(&url()).unwrap()).await
                {
                    let _ = conn.execute("SET SESSION lock_wait_timeout = 5").await;
                    let _ = conn.execute(sql.as_str()).await;
                }
            });
        });
        let _ = dropper.join();
    }
}

// Cases only MySQL/MariaDB has.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_starting_together_create_the_schema_once() {
    let backend = MySqlBackend::new().await;
    let storages: Vec<MySqlStorage> = (0..3)
        .map(|_| {
            MySqlStorage::connect(
                &url(),
                2,
                backend.options(&Setup::default()),
                backend.database(),
            )
            .unwrap()
        })
        .collect();
    let created = futures::future::join_all(storages.iter().map(|s| s.ensure_table())).await;
    assert!(created.iter().all(Result::is_ok), "{created:?}");
    storages[0].verify_table().await.unwrap();
    let sql = storages[0].schema_sql();
    assert!(
        sql.contains(&format!("`{}`.`outbox`", backend.database)),
        "{sql}"
    );
}

/// The relay's sessions: READ COMMITTED in UTC, a lock wait of a second (an ack stuck
/// behind a stopped replica's transaction becomes UNAVAILABLE for its caller to retry),
/// and a stopped replica's idle transaction ended by the server.
#[tokio::test]
async fn sessions_run_at_read_committed_in_utc_with_short_lock_bounds() {
    let pool = mysql::lazy_pool(&url(), 1).unwrap();
    let (isolation, time_zone): (String, String) =
        sqlx::query_as("SELECT @@SESSION.tx_isolation, @@SESSION.time_zone")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(
        (isolation.as_str(), time_zone.as_str()),
        ("READ-COMMITTED", "+00:00")
    );
    let (lock_wait, idle): (u64, u64) = sqlx::query_as(
        "SELECT @@SESSION.innodb_lock_wait_timeout, @@SESSION.idle_transaction_timeout",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        (lock_wait, idle),
        (
            u64::from(mysql::LOCK_WAIT_TIMEOUT_SECS),
            u64::from(mysql::IDLE_TRANSACTION_TIMEOUT_SECS)
        )
    );
}

/// A producer whose session runs in another time zone still writes UTC defaults, so its
/// rows are due at once and their age is right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_of_a_producer_in_another_time_zone_are_due_at_once() {
    let backend = MySqlBackend::new().await;
    let storage = backend.open(Setup::default()).await;
    let mut producer = connection().await;
    producer.execute("SET time_zone = '+05:00'").await.unwrap();
    producer
        .execute(
            format!(
                "INSERT INTO `{}`.outbox (topic, payload) VALUES ('t', 'p')",
                backend.database
            )
            .as_str(),
        )
        .await
        .unwrap();
    let got = claim(&*storage, "w1", 10, LEASE).await;
    assert_eq!(payloads(&got), ["p"]);
    let age = Utc::now() - got[0].created_at;
    assert!(age.num_seconds().abs() < 5, "created_at is off by {age}");
}

/// MySQL's "schema" is a database: `schema` must name one, and a missing one is reported
/// like a missing table.
#[tokio::test]
async fn missing_database_is_reported_as_a_missing_table() {
    let database = Some("no_such_database_here".to_owned());
    let storage = MySqlStorage::connect(&url(), 1, TableOptions::default(), database).unwrap();
    let err = storage.verify_table().await.unwrap_err();
    assert!(
        matches!(
            err,
            txoutbox_server::storage::StorageError::MissingTable { .. }
        ),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("no_such_database_here.outbox"),
        "{err}"
    );
}

/// Keys (and topics) compare byte for byte, as in PostgreSQL: with MariaDB's default
/// collation `Order-1` and `order-1` would be one key and hold each other back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_that_differ_in_case_are_distinct() {
    let backend = MySqlBackend::new().await;
    let storage = backend.open(Setup::default()).await;
    let upper = insert(&*storage, "t", "1", Some("Order-1")).await;
    let lower = insert(&*storage, "t", "2", Some("order-1")).await;
    assert_eq!(ids(&claim(&*storage, "w1", 1, LEASE).await), [upper]);
    assert_eq!(ids(&claim(&*storage, "w2", 10, LEASE).await), [lower]);
    let only_upper = ["T".to_owned()];
    insert(&*storage, "t", "3", None).await;
    assert!(claim_topics(&*storage, "w3", 10, LEASE, &only_upper)
        .await
        .is_empty());
}

/// With a hot key's head leased, a claim still finds every other key, and nothing of the
/// hot key. It does walk the hot key's backlog (about 6 us per row here): MariaDB has no
/// key-heads table yet, see the module docs of the backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_hot_key_does_not_hide_other_keys() {
    let backend = MySqlBackend::new().await;
    let storage = backend.open(Setup::default()).await;
    let table = format!("`{}`.outbox", backend.database);
    let mut conn = connection().await;
    for sql in [
        format!("INSERT INTO {table} (topic, `key`, payload) SELECT 't', 'hot', 'x' FROM seq_1_to_20000"),
        format!("INSERT INTO {table} (topic, `key`, payload) SELECT 't', CONCAT('k', seq), 'y' FROM seq_1_to_10"),
    ] {
        conn.execute(sql.as_str()).await.unwrap();
    }
    let hot = claim(&*storage, "w1", 5, LEASE).await;
    assert!(hot.iter().all(|m| m.key.as_deref() == Some("hot")));
    let started = Instant::now();
    let others = claim(&*storage, "w2", 100, LEASE).await;
    eprintln!("claim behind 20,000 blocked rows: {:?}", started.elapsed());
    let keys: Vec<&str> = others.iter().filter_map(|m| m.key.as_deref()).collect();
    assert_eq!(keys.len(), 10, "{keys:?}");
    assert!(keys.iter().all(|k| *k != "hot"));
}

/// A claim stuck between its statements (its replica paused, or its database link cut)
/// keeps the rows it locked. Another claim still takes the other keys' rows, and none of
/// the locked keys' later rows (it came back empty until the stuck transaction
/// ended, its candidates all being the later rows of the locked keys).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_stuck_on_some_keys_heads_does_not_stop_another_claim() {
    let backend = MySqlBackend::new().await;
    let storage = backend.open(Setup::default()).await;
    let table = format!("`{}`.outbox", backend.database);
    let mut conn = connection().await;
    for sql in [
        format!("INSERT INTO {table} (topic, `key`, payload) SELECT 't', CONCAT('hot', seq % 5), 'x' FROM seq_0_to_199"),
        format!("INSERT INTO {table} (topic, `key`, payload) SELECT 't', CONCAT('k', seq), 'y' FROM seq_1_to_10"),
    ] {
        conn.execute(sql.as_str()).await.unwrap();
    }
    // The stuck claim: a relay session that locked the first 20 rows (every hot key's
    // head and a few rows behind it), as a claim does before it leases them, and stops.
    let pool = mysql::lazy_pool(&url(), 1).unwrap();
    let mut stuck = pool.begin().await.unwrap();
    let locked: Vec<i64> = sqlx::query_scalar(&format!(
        "SELECT id FROM {table} ORDER BY id LIMIT 20 FOR UPDATE"
    ))
    .fetch_all(&mut *stuck)
    .await
    .unwrap();
    assert_eq!(locked.len(), 20);

    let others = claim(&*storage, "w2", 10, LEASE).await;
    let mut keys: Vec<&str> = others.iter().filter_map(|m| m.key.as_deref()).collect();
    keys.sort_unstable();
    let expected: Vec<String> = (1..=10).map(|n| format!("k{n}")).collect();
    let mut expected: Vec<&str> = expected.iter().map(String::as_str).collect();
    expected.sort_unstable();
    assert_eq!(keys, expected, "{:?}", ids(&others));

    // The hot keys resume at their heads once the stuck transaction ends.
    stuck.rollback().await.unwrap();
    let hot = claim(&*storage, "w3", 10, LEASE).await;
    assert_eq!(ids(&hot), locked[..10]);
}

// Tables of a team's own ("bring your own table"); the mapped contract runs the rest.

/// A storage on the table `ddl` creates (`{db}`: the test's database) with `mapping`,
/// its bookkeeping columns and indexes added by `create_schema`.
async fn own_table(backend: &MySqlBackend, ddl: &str, mapping: ColumnMapping) -> MySqlStorage {
    backend.execute(ddl).await;
    let table = ddl
        .split_whitespace()
        .nth(2)
        .and_then(|name| name.strip_prefix("{db}."))
        .expect("CREATE TABLE {db}.name")
        .to_owned();
    let options = TableOptions {
        table,
        columns: Columns::from_mapping(&mapping).unwrap(),
        ..backend.options(&Setup::default())
    };
    let storage = MySqlStorage::connect(&url(), 2, options, backend.database()).unwrap();
    storage.ensure_table().await.expect("create schema");
    storage.ensure_table().await.expect("create schema again");
    storage
        .verify_table()
        .await
        .expect("the table fits its mapping");
    storage
}

/// Every problem of a table that does not fit, at once: missing columns, types the
/// backend cannot use, a relay column that must allow NULL, one that needs a default,
/// and the missing index claims are pinned to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ping_lists_every_missing_and_mistyped_column() {
    let backend = MySqlBackend::new().await;
    backend
        .execute(
            "CREATE TABLE {db}.outbox (
                id         CHAR(36) NOT NULL PRIMARY KEY,
                topic      TEXT NOT NULL,
                payload    LONGTEXT NOT NULL,
                created_at BIGINT NOT NULL,
                status     VARCHAR(16) NOT NULL,
                attempts   INT UNSIGNED NOT NULL DEFAULT 0,
                available_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
                leased_by  VARCHAR(255) NOT NULL
            )",
        )
        .await;
    let storage = MySqlStorage::connect(
        &url(),
        1,
        backend.options(&Setup::default()),
        backend.database(),
    )
    .unwrap();
    let err = storage.verify_table().await.unwrap_err();
    let StorageError::MismatchedTable { table, problems } = &err else {
        panic!("expected a mismatched table, got {err:?}");
    };
    assert_eq!(table, &format!("{}.outbox", backend.database));
    let expected = [
        "\"id\" (columns.id) is char(36), needs BIGINT or INT",
        "\"topic\" (columns.topic) is text, needs VARCHAR or CHAR",
        "\"key\" (columns.key) is missing; map",
        "\"payload\" (columns.payload) is longtext, needs LONGBLOB",
        "\"headers\" (columns.headers) is missing",
        "\"created_at\" (columns.created_at) is bigint(20), needs DATETIME or TIMESTAMP",
        "\"status\" (columns.status) has no default",
        "\"attempts\" (columns.attempts) is int(10) unsigned, needs a signed INT",
        "\"available_at\" (columns.available_at) is timestamp(6), needs DATETIME(6)",
        "\"leased_by\" (columns.leased_by) is NOT NULL",
        "\"last_error\" (columns.last_error) is missing; `txoutboxd schema`",
        "\"processed_at\" (columns.processed_at) is missing",
        "index \"outbox_pending_idx\" is missing",
    ];
    for problem in expected {
        assert!(
            problems.iter().any(|p| p.contains(problem)),
            "{problem} not in {problems:#?}"
        );
    }
    assert_eq!(problems.len(), expected.len(), "{problems:#?}");
}

/// `txoutboxd schema` of a mapped table runs as printed, on a fresh database and on an
/// existing table that lacks the relay's columns and indexes, and again on both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_printed_schema_fits_a_fresh_and_an_existing_table() {
    let mapping = ColumnMapping {
        id: "event_id".into(),
        status: "state".into(),
        ..ColumnMapping::default()
    };
    let options = |backend: &MySqlBackend| TableOptions {
        columns: Columns::from_mapping(&mapping).unwrap(),
        ..backend.options(&Setup::default())
    };
    let run = |schema: String| async move {
        let mut conn = connection().await;
        // One statement at a time, as a migration tool would send them.
        for statement in schema.split(";\n").filter(|s| !s.trim().is_empty()) {
            let statement: String = statement
                .lines()
                .filter(|line| !line.starts_with("--"))
                .collect::<Vec<_>>()
                .join("\n");
            if !statement.trim().is_empty() {
                conn.execute(statement.as_str()).await.unwrap();
            }
        }
    };

    let fresh = MySqlBackend::new().await;
    let storage = MySqlStorage::connect(&url(), 1, options(&fresh), fresh.database()).unwrap();
    run(storage.schema_sql()).await;
    run(storage.schema_sql()).await;
    storage.verify_table().await.unwrap();

    let existing = MySqlBackend::new().await;
    existing
        .execute(
            "CREATE TABLE {db}.outbox (
                event_id INT NOT NULL AUTO_INCREMENT PRIMARY KEY, topic VARCHAR(64) NOT NULL,
                `key` VARCHAR(64), payload BLOB NOT NULL, headers JSON,
                created_at DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
                attempts INT NOT NULL DEFAULT 0
            )",
        )
        .await;
    let storage =
        MySqlStorage::connect(&url(), 1, options(&existing), existing.database()).unwrap();
    let err = storage.verify_table().await.unwrap_err().to_string();
    assert!(
        err.contains("\"state\" (columns.status) is missing"),
        "{err}"
    );
    run(storage.schema_sql()).await;
    run(storage.schema_sql()).await;
    storage.verify_table().await.unwrap();
    insert(&storage, "t", "new", None).await;
    assert_eq!(payloads(&claim(&storage, "w1", 10, LEASE).await), ["new"]);
}

/// `databases.NAME.statement_timeout` is the sessions' `max_statement_time` (MariaDB; MySQL
/// calls it `max_execution_time`): the database ends a statement past it.
#[tokio::test]
async fn sessions_end_a_statement_past_the_configured_statement_timeout() {
    let timeouts = txoutbox_server::config::Timeouts {
        acquire: Duration::from_secs(3),
        statement: Duration::from_millis(300),
    };
    let pool = mysql::lazy_pool_with(&url(), 1, timeouts).unwrap();
    let limit: f64 = sqlx::query_scalar("SELECT @@SESSION.max_statement_time")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(limit, 0.3);
    let error = sqlx::query("SELECT SLEEP(5)")
        .execute(&pool)
        .await
        .unwrap_err();
    let number = error
        .as_database_error()
        .and_then(|e| e.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>())
        .map(|e| e.number());
    assert_eq!(number, Some(1969), "{error}");
    pool.close().await;
}
