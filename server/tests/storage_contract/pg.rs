//! The PostgreSQL backend of the contract, and the cases only PostgreSQL has.

use super::*;
use sqlx::postgres::{PgConnection, PgPoolOptions};
use sqlx::{Connection, Executor};
use txoutbox_server::storage::postgres::{PostgresOptions, PostgresStorage};

pub fn url() -> String {
    std::env::var("TXOUTBOX_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// A fresh schema per test, so tests run in parallel without seeing each other.
pub struct PgBackend {
    pub schema: String,
    _drop: DropSchema,
}

impl PgBackend {
    pub async fn new() -> Self {
        let schema = format!(
            "contract_{}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        Self {
            _drop: DropSchema(schema.clone()),
            schema,
        }
    }

    /// Unique per test: channels are shared by the whole database.
    pub fn channel(&self) -> String {
        format!("{}_inserted", self.schema)
    }

    pub fn options(&self, setup: &Setup) -> PostgresOptions {
        PostgresOptions {
            schema: Some(self.schema.clone()),
            table: "outbox".to_owned(),
            strict_ordering: setup.strict_ordering,
            delete_on_ack: setup.delete_on_ack,
            visibility_delay: setup.visibility_delay,
            notify_channel: setup.notify.then(|| self.channel()),
            columns: Default::default(),
        }
    }

    pub async fn execute(&self, sql: &str) -> u64 {
        let mut conn = PgConnection::connect(&url()).await.expect("connect");
        conn.execute(sql).await.expect(sql).rows_affected()
    }
}

impl Backend for PgBackend {
    async fn open(&self, setup: Setup) -> Arc<dyn Storage> {
        let storage = PostgresStorage::connect(&url(), 4, self.options(&setup))
            .await
            .unwrap();
        storage.create_schema().await.expect("create schema");
        Arc::new(storage)
    }

    async fn row_count(&self) -> u64 {
        let mut conn = PgConnection::connect(&url()).await.expect("connect");
        let sql = format!("SELECT count(*) FROM \"{}\".outbox", self.schema);
        let count: i64 = sqlx::query_scalar(&sql).fetch_one(&mut conn).await.unwrap();
        count as u64
    }

    async fn missing_table(&self) -> Arc<dyn Storage> {
        let options = PostgresOptions {
            table: "no_such_table".to_owned(),
            ..self.options(&Setup::default())
        };
        Arc::new(PostgresStorage::connect(&url(), 1, options).await.unwrap())
    }

    async fn until_listening(&self) {
        let sql = format!(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = \
             'txoutboxd-listener' AND state = 'idle' AND query = 'LISTEN \"{}\"'",
            self.channel()
        );
        let mut conn = PgConnection::connect(&url()).await.expect("connect");
        let start = Instant::now();
        loop {
            let listening: i64 = sqlx::query_scalar(&sql).fetch_one(&mut conn).await.unwrap();
            if listening > 0 {
                return;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "the insert listener never listened"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn unreachable(&self) -> Arc<dyn Storage> {
        // Port 1: nothing listens. A short acquire timeout keeps the test quick.
        let pool = PgPoolOptions::new()
            .acquire_timeout(Duration::from_secs(1))
            .connect_lazy("postgres://postgres@127.0.0.1:1/test")
            .unwrap();
        let options = self.options(&Setup::default());
        Arc::new(PostgresStorage::from_pool(pool, None, options).unwrap())
    }
}

/// Drops the schema when the test ends, pass or fail, on a thread of its own since
/// `Drop` cannot await.
struct DropSchema(String);

impl Drop for DropSchema {
    fn drop(&mut self) {
        let sql = format!(
            "SET lock_timeout = '5s'; DROP SCHEMA IF EXISTS \"{}\" CASCADE",
            self.0
        );
        let dropper = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async {
                if let Ok(mut conn) = PgConnection::connect(&url()).await {
                    let _ = conn.execute(sql.as_str()).await;
                }
            });
        });
        let _ = dropper.join();
    }
}

// Cases only PostgreSQL has.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listener_reconnects_after_its_connection_is_killed() {
    let backend = PgBackend::new().await;
    let storage = backend
        .open(Setup {
            notify: true,
            ..Setup::default()
        })
        .await;
    let settle = Duration::from_millis(100);
    let mut signal = listening_signal(&backend, &*storage, settle)
        .await
        .expect("notify");

    let killed = backend
        .execute(&format!(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE application_name = 'txoutboxd-listener' AND query LIKE '%{}%'",
            backend.channel()
        ))
        .await;
    assert_eq!(killed, 1, "one listener connection");
    next_signal(&mut signal).await; // reconnected: callers catch up

    insert(&*storage, "t", "p", None).await;
    next_signal(&mut signal).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_starting_together_create_the_schema_once() {
    let backend = PgBackend::new().await;
    let setup = Setup {
        notify: true,
        ..Setup::default()
    };
    let mut storages = Vec::new();
    for _ in 0..3 {
        storages.push(
            PostgresStorage::connect(&url(), 2, backend.options(&setup))
                .await
                .unwrap(),
        );
    }
    let created = futures::future::join_all(storages.iter().map(|s| s.create_schema())).await;
    assert!(created.iter().all(Result::is_ok), "{created:?}");
    storages[0].ping().await.unwrap();
    let sql = storages[0].schema_sql();
    assert!(
        sql.contains(&format!("\"{}\".\"outbox\"", backend.schema)),
        "{sql}"
    );
}

#[tokio::test]
async fn pools_run_without_jit() {
    let pool = txoutbox_server::storage::postgres::lazy_pool(&url(), 1).unwrap();
    let jit: String = sqlx::query_scalar("SHOW jit")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(jit, "off");
}

/// The race the key-heads locks exist for: a producer inserts a row of a key inside a
/// transaction that is still open while the relay acks the key's last pending row. The
/// relay must not declare the key empty behind the producer's back, or the new row would
/// never be claimed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_inserted_while_its_key_drains_is_still_claimed() {
    let backend = PgBackend::new().await;
    let storage = backend.open(Setup::default()).await;
    let table = format!("\"{}\".outbox", backend.schema);
    for round in 0..10 {
        let first = insert(&*storage, "t", "first", Some("k")).await;
        assert_eq!(
            ids(&claim(&*storage, "w", 10, LEASE).await),
            [first],
            "round {round}"
        );

        let mut producer = PgConnection::connect(&url()).await.unwrap();
        producer.execute("BEGIN").await.unwrap();
        let second: MessageId = sqlx::query_scalar(&format!(
            "INSERT INTO {table} (topic, key, payload) VALUES ('t', 'k', 'second') RETURNING id"
        ))
        .fetch_one(&mut producer)
        .await
        .unwrap();
        // The ack runs while the producer's transaction is open; it may wait for it.
        let acking = {
            let storage = Arc::clone(&storage);
            tokio::spawn(async move { storage.ack(&[first], "w").await.unwrap() })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        producer.execute("COMMIT").await.unwrap();
        assert_eq!(acking.await.unwrap(), [first]);

        let got = claim_eventually(&*storage, "w", 1).await;
        assert_eq!(
            ids(&got),
            [second],
            "round {round}: the new row was orphaned"
        );
        storage.ack(&[second], "w").await.unwrap();
    }
}

/// With a hot key's head leased, a claim still finds every other key's head (through the
/// key-heads table) and nothing of the hot key. What it costs is the benchmark's business.
#[tokio::test]
async fn a_blocked_hot_key_does_not_hide_other_keys() {
    let backend = PgBackend::new().await;
    let storage = backend.open(Setup::default()).await;
    let table = format!("\"{}\".outbox", backend.schema);
    backend
        .execute(&format!(
            "INSERT INTO {table} (topic, key, payload) SELECT 't', 'hot', 'x' FROM generate_series(1, 20000); \
             INSERT INTO {table} (topic, key, payload) SELECT 't', 'k' || g, 'y' FROM generate_series(1, 10) g"
        ))
        .await;
    let hot = claim(&*storage, "w1", 5, LEASE).await;
    assert!(hot.iter().all(|m| m.key.as_deref() == Some("hot")));
    let others = claim(&*storage, "w2", 100, LEASE).await;
    let keys: Vec<&str> = others.iter().filter_map(|m| m.key.as_deref()).collect();
    assert_eq!(keys.len(), 10, "{keys:?}");
    assert!(keys.iter().all(|k| *k != "hot"));
}
