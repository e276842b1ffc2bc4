//! The SQLite backend of the contract, and the cases only SQLite has: a producer writing
//! into the same file from connections of its own, the write lock, WAL mode, and tables
//! of a team's own mapped in configuration ("bring your own table").

use std::str::FromStr;

use super::*;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};
use sqlx::Executor;
use txoutbox_server::config::columns::{ColumnMapping, Columns};
use txoutbox_server::storage::sqlite::{SqliteStorage, BUSY_TIMEOUT};
use txoutbox_server::storage::{StorageError, TableOptions};

/// The machine clock in epoch milliseconds, as a team's own table would default it.
const NOW_MS: &str = crate::team_tables::SQLITE_NOW_MS;

/// A fresh database file per test, in a temporary directory removed when the test ends.
pub struct SqliteBackend {
    pub url: String,
    dir: tempfile::TempDir,
    table: String,
    columns: Columns,
    /// The team's own table, created before the storage adds what the relay needs.
    own_table: Option<String>,
}

impl SqliteBackend {
    pub async fn new() -> Self {
        let dir = tempfile::tempdir().expect("temporary directory");
        let url = format!("sqlite://{}", dir.path().join("outbox.db").display());
        Self {
            url,
            dir,
            table: "outbox".to_owned(),
            columns: Columns::default(),
            own_table: None,
        }
    }

    /// A team's own table: the message columns under names of its own (an `INTEGER`
    /// rowid without `AUTOINCREMENT`, a `VARCHAR` topic, headers that may be NULL), and
    /// none of the relay's; `create_schema` adds those, some under mapped names too.
    /// The payload stays binary: the contract round-trips bytes that are not UTF-8.
    pub async fn mapped() -> Self {
        let mapping = crate::team_tables::mariadb_and_sqlite_mapping();
        let own_table = crate::team_tables::sqlite_table();
        Self {
            table: "order_events".to_owned(),
            columns: Columns::from_mapping(&mapping).unwrap(),
            own_table: Some(own_table),
            ..Self::new().await
        }
    }

    pub fn file(&self) -> std::path::PathBuf {
        self.dir.path().join("outbox.db")
    }

    pub fn options(&self, setup: &Setup) -> TableOptions {
        assert!(!setup.notify, "SQLite has no insert notifications");
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

    /// Connections of the producer application: plain sqlx, nothing of the relay's. It
    /// may come first and create the file (a team's own table).
    pub async fn producer(&self) -> SqlitePool {
        let options = SqliteConnectOptions::from_str(&self.url)
            .unwrap()
            .create_if_missing(true);
        SqlitePoolOptions::new()
            .max_connections(2)
            .connect_with(options)
            .await
            .expect("producer connects")
    }
}

impl Backend for SqliteBackend {
    fn team_ddl(&self, table: TeamTable) -> String {
        match table {
            TeamTable::InvoiceEvents => format!(
                "CREATE TABLE invoice_events (
                    id        INTEGER PRIMARY KEY AUTOINCREMENT,
                    invoice   TEXT,
                    document  JSON NOT NULL,
                    logged_at INTEGER NOT NULL DEFAULT ({NOW_MS})
                )"
            ),
            TeamTable::Notes => format!(
                "CREATE TABLE notes (
                    id         INTEGER PRIMARY KEY,
                    topic      TEXT NOT NULL,
                    key        TEXT,
                    note       TEXT NOT NULL,
                    headers    TEXT,
                    created_at INTEGER NOT NULL DEFAULT ({NOW_MS})
                )"
            ),
        }
    }

    async fn produce(&self, sql: &str) {
        let producer = self.producer().await;
        producer
            .execute(sql.replace("{db}.", "").as_str())
            .await
            .unwrap();
        producer.close().await;
    }

    async fn own_table(&self, table: TeamTable, mapping: ColumnMapping) -> Arc<dyn Storage> {
        Arc::new(own_table(self, &self.team_ddl(table), mapping).await)
    }

    async fn open(&self, setup: Setup) -> Arc<dyn Storage> {
        let setup = Setup {
            notify: false,
            ..setup
        };
        if let Some(own_table) = &self.own_table {
            let producer = self.producer().await;
            producer.execute(own_table.as_str()).await.unwrap();
            producer.close().await;
        }
        let storage = SqliteStorage::connect(&self.url, 4, self.options(&setup))
            .await
            .unwrap();
        storage.ensure_table().await.expect("create schema");
        Arc::new(storage)
    }

    async fn row_count(&self) -> u64 {
        let producer = self.producer().await;
        let sql = format!("SELECT count(*) FROM {}", self.table);
        let count: i64 = sqlx::query_scalar(&sql).fetch_one(&producer).await.unwrap();
        producer.close().await;
        count as u64
    }

    async fn missing_table(&self) -> Arc<dyn Storage> {
        let options = TableOptions {
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

    async fn open_late_nack(&self, id: MessageId) -> Box<dyn OpenWrite> {
        let producer = self.producer().await;
        let mut conn = producer.acquire().await.unwrap().detach();
        conn.execute("BEGIN IMMEDIATE").await.unwrap();
        let c = &self.columns;
        let sql = format!(
            "UPDATE \"{}\" SET \"{}\" = {NOW_MS} + 3600000, \"{}\" = NULL, \"{}\" = 'late nack' \
             WHERE \"{}\" = ?1",
            self.table,
            c.available_at.as_str(),
            c.leased_by.as_str(),
            c.last_error.as_str(),
            c.id.as_str()
        );
        let updated = sqlx::query(&sql).bind(id).execute(&mut conn).await.unwrap();
        assert_eq!(updated.rows_affected(), 1);
        Box::new(SqliteOpenWrite { conn })
    }

    async fn last_error(&self, id: MessageId) -> Option<String> {
        let producer = self.producer().await;
        let c = &self.columns;
        let sql = format!(
            "SELECT \"{}\" FROM \"{}\" WHERE \"{}\" = ?1",
            c.last_error.as_str(),
            self.table,
            c.id.as_str()
        );
        let error = sqlx::query_scalar(&sql)
            .bind(id)
            .fetch_one(&producer)
            .await
            .unwrap();
        producer.close().await;
        error
    }
}

/// See [`Backend::open_late_nack`]: the write transaction holds the file's write lock, so
/// a claim waits for it in its busy handler, which SQLite does not show.
struct SqliteOpenWrite {
    conn: sqlx::SqliteConnection,
}

#[async_trait::async_trait]
impl OpenWrite for SqliteOpenWrite {
    async fn blocks_someone(&self) -> bool {
        true
    }

    async fn commit(mut self: Box<Self>) {
        self.conn.execute("COMMIT").await.unwrap();
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
        storage.ack(&ids(&got).into(), "w1").await.unwrap();
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

// Tables of a team's own ("bring your own table"); the mapped contract runs the rest.

/// A storage on `table` (created by `ddl` first) with `mapping`, and its bookkeeping
/// columns added by `create_schema`.
async fn own_table(backend: &SqliteBackend, ddl: &str, mapping: ColumnMapping) -> SqliteStorage {
    let producer = backend.producer().await;
    producer.execute(ddl).await.unwrap();
    producer.close().await;
    let table = ddl
        .split_whitespace()
        .nth(2)
        .expect("CREATE TABLE name")
        .to_owned();
    let options = TableOptions {
        table,
        columns: Columns::from_mapping(&mapping).unwrap(),
        ..backend.options(&Setup::default())
    };
    let storage = SqliteStorage::connect(&backend.url, 2, options)
        .await
        .unwrap();
    storage.ensure_table().await.expect("create schema");
    storage.ensure_table().await.expect("create schema again");
    storage
        .verify_table()
        .await
        .expect("the table fits its mapping");
    storage
}

/// Every problem of a table that does not fit, at once: missing columns, types the
/// backend cannot use, a relay column that must allow NULL, one that needs a default.
#[tokio::test]
async fn ping_lists_every_missing_and_mistyped_column() {
    let backend = SqliteBackend::new().await;
    // The relay's own table passes the same check.
    backend
        .open(Setup::default())
        .await
        .verify_table()
        .await
        .unwrap();

    let producer = backend.producer().await;
    producer
        .execute(
            "CREATE TABLE legacy (
                id         TEXT PRIMARY KEY,
                topic      INTEGER NOT NULL,
                payload    TEXT NOT NULL,
                created_at DATETIME DEFAULT CURRENT_TIMESTAMP,
                status     TEXT NOT NULL,
                attempts   INTEGER NOT NULL DEFAULT 0,
                leased_by  TEXT NOT NULL
            )",
        )
        .await
        .unwrap();
    producer.close().await;
    let options = TableOptions {
        table: "legacy".to_owned(),
        ..backend.options(&Setup::default())
    };
    let storage = SqliteStorage::connect(&backend.url, 1, options)
        .await
        .unwrap();
    let err = storage.verify_table().await.unwrap_err();
    let StorageError::MismatchedTable { table, problems } = &err else {
        panic!("expected a mismatched table, got {err:?}");
    };
    assert_eq!(table, "legacy");
    let expected = [
        "\"id\" (columns.id) is TEXT, needs INTEGER",
        "\"topic\" (columns.topic) is INTEGER, needs TEXT",
        "\"key\" (columns.key) is missing; map",
        "\"payload\" (columns.payload) is TEXT, needs BLOB (for a TEXT column, set \
         payload_format = \"text\")",
        "\"headers\" (columns.headers) is missing",
        "\"created_at\" (columns.created_at) is DATETIME, needs INTEGER (Unix epoch",
        "\"status\" (columns.status) has no default",
        "\"available_at\" (columns.available_at) is missing; `txoutboxd schema`",
        "\"leased_by\" (columns.leased_by) is NOT NULL",
        "\"last_error\" (columns.last_error) is missing",
        "\"processed_at\" (columns.processed_at) is missing",
    ];
    for problem in expected {
        assert!(
            problems.iter().any(|p| p.contains(problem)),
            "{problem} not in {problems:#?}"
        );
    }
    assert_eq!(problems.len(), expected.len(), "{problems:#?}");
    assert!(
        err.to_string().contains("does not fit its columns"),
        "{err}"
    );
}

/// `txoutboxd schema` of a mapped table: runnable as printed on a fresh database, and its
/// commented `ALTER`s are what an existing table needs.
#[tokio::test]
async fn the_printed_schema_creates_a_table_and_its_alters_fit_an_existing_one() {
    let mapping = ColumnMapping {
        id: "event_id".into(),
        status: "state".into(),
        ..ColumnMapping::default()
    };
    let options = |backend: &SqliteBackend| TableOptions {
        columns: Columns::from_mapping(&mapping).unwrap(),
        ..backend.options(&Setup::default())
    };

    let fresh = SqliteBackend::new().await;
    let storage = SqliteStorage::connect(&fresh.url, 1, options(&fresh))
        .await
        .unwrap();
    let schema = storage.schema_sql();
    let producer = fresh.producer().await;
    producer.execute(schema.as_str()).await.unwrap();
    producer.execute(schema.as_str()).await.expect("idempotent");
    producer.close().await;
    storage.verify_table().await.unwrap();

    let existing = SqliteBackend::new().await;
    let producer = existing.producer().await;
    producer
        .execute(
            format!(
                "CREATE TABLE outbox (event_id INTEGER PRIMARY KEY, topic TEXT NOT NULL, \
                 key TEXT, payload BLOB NOT NULL, headers TEXT, \
                 created_at INTEGER NOT NULL DEFAULT ({NOW_MS}), \
                 attempts INTEGER NOT NULL DEFAULT 0); \
                 INSERT INTO outbox (topic, payload) VALUES ('t', 'published long ago')"
            )
            .as_str(),
        )
        .await
        .unwrap();
    let storage = SqliteStorage::connect(&existing.url, 1, options(&existing))
        .await
        .unwrap();
    let err = storage.verify_table().await.unwrap_err().to_string();
    assert!(
        err.contains("\"state\" (columns.status) is missing"),
        "{err}"
    );
    // What the printed text tells the team to run: the ALTERs of the missing columns
    // (all but attempts), the UPDATE that skips old rows, the rest as printed.
    let mut script = String::new();
    for line in schema.lines() {
        match line.strip_prefix("-- ALTER") {
            Some(alter) if !alter.contains(" attempts ") => script += &format!("ALTER{alter}\n"),
            _ => match line.strip_prefix("--   UPDATE") {
                Some(update) => script += &format!("UPDATE{update}\n"),
                None => script += &format!("{line}\n"),
            },
        }
    }
    producer.execute(script.as_str()).await.unwrap();
    producer.close().await;
    storage.verify_table().await.unwrap();
    insert(&storage, "t", "new", None).await;
    assert_eq!(payloads(&claim(&storage, "w1", 10, LEASE).await), ["new"]);
}

/// A file opened read-only (`mode=ro`, as a read-only file or mount would be): the ping
/// says so, and so does a claim that has rows to take, naming the file; nothing changes.
#[tokio::test]
async fn a_read_only_file_is_reported_by_ping_and_writes() {
    let backend = SqliteBackend::new().await;
    let writable = backend.open(Setup::default()).await;
    writable.insert(NewMessage::new("t", "p")).await.unwrap();
    let url = format!("{}?mode=ro", backend.url);
    let options = backend.options(&Setup::default());
    let read_only = SqliteStorage::connect(&url, 1, options).await.unwrap();
    for result in [
        read_only.verify_table().await.map(drop),
        read_only.claim(request("w")).await.map(drop),
    ] {
        let error = result.unwrap_err();
        assert!(matches!(error, StorageError::ReadOnly(_)), "{error:?}");
        assert!(error.to_string().contains("outbox.db"), "{error}");
    }
    assert_eq!(
        claim(&*writable, "w", 10, LEASE).await.len(),
        1,
        "untouched"
    );
}
