//! The SQLite backend of the contract, and the cases only SQLite has: a producer writing
//! into the same file from connections of its own, the write lock, WAL mode.

use std::str::FromStr;

use super::*;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};
use txoutbox_server::storage::sqlite::{SqliteOptions, SqliteStorage, BUSY_TIMEOUT};
use txoutbox_server::storage::StorageError;

/// A fresh database file per test, in a temporary directory removed when the test ends.
pub struct SqliteBackend {
    pub url: String,
    dir: tempfile::TempDir,
}

impl SqliteBackend {
    pub async fn new() -> Self {
        let dir = tempfile::tempdir().expect("temporary directory");
        let url = format!("sqlite://{}", dir.path().join("outbox.db").display());
        Self { url, dir }
    }

    pub fn file(&self) -> std::path::PathBuf {
        self.dir.path().join("outbox.db")
    }

    pub fn options(&self, setup: &Setup) -> SqliteOptions {
        assert!(!setup.notify, "SQLite has no insert notifications");
        SqliteOptions {
            table: "outbox".to_owned(),
            strict_ordering: setup.strict_ordering,
            delete_on_ack: setup.delete_on_ack,
            visibility_delay: setup.visibility_delay,
            columns: Default::default(),
        }
    }

    /// Connections of the producer application: plain sqlx, nothing of the relay's.
    pub async fn producer(&self) -> SqlitePool {
        let options = SqliteConnectOptions::from_str(&self.url).unwrap();
        SqlitePoolOptions::new()
            .max_connections(2)
            .connect_with(options)
            .await
            .expect("producer connects")
    }
}

impl Backend for SqliteBackend {
    async fn open(&self, setup: Setup) -> Arc<dyn Storage> {
        let setup = Setup {
            notify: false,
            ..setup
        };
        let storage = SqliteStorage::connect(&self.url, 4, self.options(&setup))
            .await
            .unwrap();
        storage.create_schema().await.expect("create schema");
        Arc::new(storage)
    }

    async fn row_count(&self) -> u64 {
        let producer = self.producer().await;
        let count: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox")
            .fetch_one(&producer)
            .await
            .unwrap();
        producer.close().await;
        count as u64
    }

    async fn missing_table(&self) -> Arc<dyn Storage> {
        let options = SqliteOptions {
            table: "no_such_table".to_owned(),
            ..self.options(&Setup::default())
        };
        Arc::new(SqliteStorage::connect(&self.url, 1, options).await.unwrap())
    }

    async fn unreachable(&self) -> Arc<dyn Storage> {
        // A file in a directory that does not exist cannot be opened, let alone created.
        let url = format!(
            "sqlite://{}",
            self.dir.path().join("no-such-dir/outbox.db").display()
        );
        let options = self.options(&Setup::default());
        Arc::new(SqliteStorage::connect(&url, 1, options).await.unwrap())
    }

    async fn until_listening(&self) {
        unreachable!("SQLite has no insert signal; its signal cases are skipped")
    }
}

// Cases only SQLite has.

/// Inserts a row the way an application does: its own connection, its own transaction.
async fn produce(tx: &mut sqlx::SqliteConnection, payload: &str, key: &str) -> MessageId {
    sqlx::query_scalar(
        "INSERT INTO outbox (topic, key, payload, headers) VALUES ('t', ?1, ?2, '{}') \
         RETURNING id",
    )
    .bind(key)
    .bind(payload.as_bytes())
    .fetch_one(tx)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_transaction_is_claimed_once_committed_and_never_before() {
    let backend = SqliteBackend::new().await;
    let storage = backend.open(Setup::default()).await;
    let producer = backend.producer().await;
    let quickly = Duration::from_secs(1);

    let mut tx = producer.begin().await.unwrap();
    let a = produce(&mut tx, "a", "k").await;
    let b = produce(&mut tx, "b", "k").await;
    // WAL: reads never wait for the producer's open write transaction, and neither does
    // a claim with nothing committed to take (it only reads).
    let stats = tokio::time::timeout(quickly, storage.stats())
        .await
        .expect("stats waited for the producer")
        .unwrap();
    assert_eq!(stats.total.pending, 0, "uncommitted rows are invisible");
    let got = tokio::time::timeout(quickly, claim(&*storage, "w1", 10, LEASE))
        .await
        .expect("an idle claim waited for the producer");
    assert!(got.is_empty(), "uncommitted rows are not claimed");
    tx.commit().await.unwrap();
    assert_eq!(ids(&claim(&*storage, "w1", 10, LEASE).await), [a, b]);

    // With something to claim, a claim needs the write lock: it waits for the producer's
    // commit, then takes what the producer committed as well.
    let mut tx = producer.begin().await.unwrap();
    let c = produce(&mut tx, "c", "k2").await;
    tx.commit().await.unwrap();
    let mut tx = producer.begin().await.unwrap();
    let d = produce(&mut tx, "d", "k3").await;
    let claimer = {
        let storage = Arc::clone(&storage);
        tokio::spawn(async move { claim(&*storage, "w2", 10, LEASE).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!claimer.is_finished(), "claimed under the producer's lock");
    tx.commit().await.unwrap();
    let got = tokio::time::timeout(DEADLINE, claimer)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(ids(&got), [c, d]);

    // A rolled-back transaction leaves nothing behind.
    let mut tx = producer.begin().await.unwrap();
    produce(&mut tx, "never", "other").await;
    tx.rollback().await.unwrap();
    assert!(claim(&*storage, "w3", 10, LEASE).await.is_empty());
    producer.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_lock_held_past_the_busy_timeout_is_unavailable() {
    let backend = SqliteBackend::new().await;
    let storage = backend.open(Setup::default()).await;
    insert(&*storage, "t", "p", None).await;
    let producer = backend.producer().await;
    let mut holder = producer.acquire().await.unwrap();
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut *holder)
        .await
        .unwrap();

    let start = Instant::now();
    let err = storage.claim(request("w1")).await.unwrap_err();
    assert!(matches!(err, StorageError::Unavailable(_)), "{err:?}");
    assert!(err.to_string().contains("locked"), "{err}");
    assert!(start.elapsed() >= BUSY_TIMEOUT - Duration::from_millis(100));

    sqlx::query("ROLLBACK").execute(&mut *holder).await.unwrap();
    drop(holder);
    assert_eq!(claim(&*storage, "w1", 10, LEASE).await.len(), 1);
    producer.close().await;
}

#[tokio::test]
async fn the_file_is_switched_to_wal_mode() {
    let backend = SqliteBackend::new().await;
    let _storage = backend.open(Setup::default()).await;
    let producer = backend.producer().await;
    let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(&producer)
        .await
        .unwrap();
    assert_eq!(mode, "wal");
    producer.close().await;
}

/// The README's demo: a row from the `sqlite3` shell, with every default from the schema,
/// claimable at once (the column defaults and the server agree on the clock).
#[tokio::test]
async fn a_row_from_the_sqlite3_shell_is_claimable_at_once() {
    let Ok(shell) = which_sqlite3() else {
        eprintln!("skipped: the `sqlite3` shell is not installed");
        return;
    };
    let backend = SqliteBackend::new().await;
    let storage = backend.open(Setup::default()).await;
    for _ in 0..20 {
        let status = std::process::Command::new(&shell)
            .arg(backend.file())
            .arg("INSERT INTO outbox (topic, payload) VALUES ('demo', 'hello')")
            .status()
            .unwrap();
        assert!(status.success());
        let got = claim(&*storage, "w1", 10, LEASE).await;
        assert_eq!(
            payloads(&got),
            ["hello"],
            "claimable the moment it is committed"
        );
        assert!(got[0].headers.is_empty() && got[0].key.is_none());
        let age = Utc::now() - got[0].created_at;
        assert!(age >= chrono::Duration::zero() && age < chrono::Duration::seconds(5));
        storage.ack(&ids(&got), "w1").await.unwrap();
    }
}

fn which_sqlite3() -> Result<std::path::PathBuf, ()> {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("sqlite3"))
        .find(|path| path.is_file())
        .ok_or(())
}

#[tokio::test]
async fn empty_payloads_and_text_payloads_read_as_bytes() {
    let backend = SqliteBackend::new().await;
    let storage = backend.open(Setup::default()).await;
    let producer = backend.producer().await;
    sqlx::query("INSERT INTO outbox (topic, payload) VALUES ('t', ''), ('t', X''), ('t', 42)")
        .execute(&producer)
        .await
        .unwrap();
    insert(&*storage, "t", "", None).await;
    let got = claim(&*storage, "w1", 10, LEASE).await;
    assert_eq!(payloads(&got), ["", "", "42", ""]);
    producer.close().await;
}
