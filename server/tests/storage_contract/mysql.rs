//! The MySQL/MariaDB backend of the contract.
//!
//! Every test gets a database of its own (`contract_<uuid>`, MySQL's "schema") on the
//! server at `TXOUTBOX_TEST_MYSQL_URL` (default `mysql://root@127.0.0.1:3306/test`),
//! dropped when the test ends, even when it fails. Storages reach the table through the
//! `schema` option (qualified `db.outbox`), so the qualification is tested too.

use super::*;
use sqlx::mysql::MySqlConnection;
use sqlx::{Connection, Executor};
use txoutbox_server::storage::mysql::{self, MySqlOptions, MySqlStorage};

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
        }
    }

    pub fn options(&self, setup: &Setup) -> MySqlOptions {
        MySqlOptions {
            database: Some(self.database.clone()),
            table: "outbox".to_owned(),
            strict_ordering: setup.strict_ordering,
            delete_on_ack: setup.delete_on_ack,
            visibility_delay: setup.visibility_delay,
            columns: Default::default(),
        }
    }
}

impl Backend for MySqlBackend {
    async fn open(&self, setup: Setup) -> Arc<dyn Storage> {
        let storage = MySqlStorage::connect(&url(), 4, self.options(&setup)).unwrap();
        storage.create_schema().await.expect("create schema");
        Arc::new(storage)
    }

    async fn row_count(&self) -> u64 {
        let sql = format!("SELECT COUNT(*) FROM `{}`.outbox", self.database);
        let count: i64 = sqlx::query_scalar(&sql)
            .fetch_one(&mut connection().await)
            .await
            .unwrap();
        count as u64
    }

    async fn missing_table(&self) -> Arc<dyn Storage> {
        let options = MySqlOptions {
            table: "no_such_table".to_owned(),
            ..self.options(&Setup::default())
        };
        Arc::new(MySqlStorage::connect(&url(), 1, options).unwrap())
    }

    async fn unreachable(&self) -> Arc<dyn Storage> {
        // Port 1: nothing listens.
        let options = self.options(&Setup::default());
        Arc::new(MySqlStorage::connect("mysql://root@127.0.0.1:1/test", 1, options).unwrap())
    }

    async fn until_listening(&self) {
        // No insert signal on MySQL/MariaDB: the cases that would wait for it skip.
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
        .map(|_| MySqlStorage::connect(&url(), 2, backend.options(&Setup::default())).unwrap())
        .collect();
    let created = futures::future::join_all(storages.iter().map(|s| s.create_schema())).await;
    assert!(created.iter().all(Result::is_ok), "{created:?}");
    storages[0].ping().await.unwrap();
    let sql = storages[0].schema_sql();
    assert!(
        sql.contains(&format!("`{}`.`outbox`", backend.database)),
        "{sql}"
    );
}

#[tokio::test]
async fn sessions_run_at_read_committed_in_utc() {
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
    let options = MySqlOptions {
        database: Some("no_such_database_here".to_owned()),
        ..MySqlOptions::default()
    };
    let storage = MySqlStorage::connect(&url(), 1, options).unwrap();
    let err = storage.ping().await.unwrap_err();
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
