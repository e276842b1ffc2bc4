//! The PostgreSQL backend of the contract, and the cases only PostgreSQL has.

use super::*;
use sqlx::postgres::{PgConnection, PgPoolOptions};
use sqlx::{Connection, Executor};
use txoutbox_server::storage::columns::{ColumnMapping, Columns, PayloadFormat};
use txoutbox_server::storage::postgres::{PostgresExtras, PostgresStorage};
use txoutbox_server::storage::{StorageError, TableOptions};

pub fn url() -> String {
    std::env::var("TXOUTBOX_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// A fresh schema per test, so tests run in parallel without seeing each other.
pub struct PgBackend {
    pub schema: String,
    pub table: String,
    /// A team's own table ([`PgBackend::mapped`]): the DDL of its message columns, run
    /// before the relay's `create_schema` adds what the mapping still needs.
    team_table: Option<&'static str>,
    pub columns: Columns,
    _drop: DropSchema,
}

/// "A team's own table" for the mapped contract run: other names for every column, an
/// `integer` id, `varchar` topic and key, and `json` (not `jsonb`) headers. Text and JSON
/// payloads have cases of their own below (the contract sends binary payloads).
const TEAM_TABLE: &str = "CREATE TABLE IF NOT EXISTS {table} (
    event_id     serial PRIMARY KEY,
    event_type   varchar(200) NOT NULL,
    aggregate_id varchar(200),
    body         bytea NOT NULL,
    meta         json NOT NULL DEFAULT '{}',
    occurred_at  timestamptz NOT NULL DEFAULT now()
)";

/// The mapping of [`TEAM_TABLE`], bookkeeping columns included.
pub fn team_mapping() -> ColumnMapping {
    ColumnMapping {
        id: "event_id".to_owned(),
        topic: Some("event_type".to_owned()),
        key: "aggregate_id".to_owned(),
        payload: "body".to_owned(),
        headers: "meta".to_owned(),
        created_at: "occurred_at".to_owned(),
        status: "relay_status".to_owned(),
        attempts: "relay_attempts".to_owned(),
        available_at: "relay_due_at".to_owned(),
        leased_by: "relay_owner".to_owned(),
        last_error: "relay_error".to_owned(),
        processed_at: "relay_done_at".to_owned(),
        ..ColumnMapping::default()
    }
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
            table: "outbox".to_owned(),
            team_table: None,
            columns: Columns::default(),
        }
    }

    /// The contract on a team's own table, mapped in configuration.
    pub async fn mapped() -> Self {
        Self {
            table: "order_events".to_owned(),
            team_table: Some(TEAM_TABLE),
            columns: Columns::from_mapping(&team_mapping()).unwrap(),
            ..Self::new().await
        }
    }

    /// `schema.table`, quoted.
    pub fn qualified(&self) -> String {
        format!("\"{}\".\"{}\"", self.schema, self.table)
    }

    /// Unique per test: channels are shared by the whole database.
    pub fn channel(&self) -> String {
        format!("{}_inserted", self.schema)
    }

    pub fn options(&self, setup: &Setup) -> TableOptions {
        TableOptions {
            table: self.table.clone(),
            strict_ordering: setup.strict_ordering,
            delete_on_ack: setup.delete_on_ack,
            visibility_delay: setup.visibility_delay,
            columns: self.columns.clone(),
        }
    }

    /// This test's schema, and its insert channel when `setup` asks for one.
    pub fn extras(&self, setup: &Setup) -> PostgresExtras {
        PostgresExtras {
            schema: Some(self.schema.clone()),
            notify_channel: setup.notify.then(|| self.channel()),
        }
    }

    pub async fn row_count_of(&self, table: &str) -> i64 {
        let mut conn = PgConnection::connect(&url()).await.expect("connect");
        sqlx::query_scalar(&format!("SELECT count(*) FROM {table}"))
            .fetch_one(&mut conn)
            .await
            .unwrap()
    }

    pub async fn execute(&self, sql: &str) -> u64 {
        let mut conn = PgConnection::connect(&url()).await.expect("connect");
        conn.execute(sql).await.expect(sql).rows_affected()
    }
}

impl Backend for PgBackend {
    async fn open(&self, setup: Setup) -> Arc<dyn Storage> {
        if let Some(team_table) = self.team_table {
            self.execute(&format!("CREATE SCHEMA IF NOT EXISTS \"{}\"", self.schema))
                .await;
            self.execute(&team_table.replace("{table}", &self.qualified()))
                .await;
        }
        let storage =
            PostgresStorage::connect(&url(), 4, self.options(&setup), self.extras(&setup))
                .await
                .unwrap();
        storage.ensure_table().await.expect("create schema");
        storage
            .verify_table()
            .await
            .expect("the table fits its columns");
        Arc::new(storage)
    }

    async fn row_count(&self) -> u64 {
        let mut conn = PgConnection::connect(&url()).await.expect("connect");
        let sql = format!("SELECT count(*) FROM {}", self.qualified());
        let count: i64 = sqlx::query_scalar(&sql).fetch_one(&mut conn).await.unwrap();
        count as u64
    }

    async fn missing_table(&self) -> Arc<dyn Storage> {
        let options = TableOptions {
            table: "no_such_table".to_owned(),
            ..self.options(&Setup::default())
        };
        let extras = self.extras(&Setup::default());
        Arc::new(
            PostgresStorage::connect(&url(), 1, options, extras)
                .await
                .unwrap(),
        )
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
        let (options, extras) = (
            self.options(&Setup::default()),
            self.extras(&Setup::default()),
        );
        Arc::new(PostgresStorage::from_pool(pool, None, options, extras).unwrap())
    }

    async fn open_late_nack(&self, id: MessageId) -> Box<dyn OpenWrite> {
        let mut conn = PgConnection::connect(&url()).await.expect("connect");
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut conn)
            .await
            .unwrap();
        conn.execute("BEGIN").await.unwrap();
        let c = &self.columns;
        let sql = format!(
            "UPDATE {} SET {} = now() + interval '1 hour', {} = NULL, {} = 'late nack' \
             WHERE {} = $1",
            self.qualified(),
            c.available_at.quoted(),
            c.leased_by.quoted(),
            c.last_error.quoted(),
            c.id.quoted()
        );
        let updated = sqlx::query(&sql).bind(id).execute(&mut conn).await.unwrap();
        assert_eq!(updated.rows_affected(), 1);
        Box::new(PgOpenWrite { conn, pid })
    }

    async fn last_error(&self, id: MessageId) -> Option<String> {
        let mut conn = PgConnection::connect(&url()).await.expect("connect");
        let c = &self.columns;
        let sql = format!(
            "SELECT {} FROM {} WHERE {} = $1",
            c.last_error.quoted(),
            self.qualified(),
            c.id.quoted()
        );
        sqlx::query_scalar(&sql)
            .bind(id)
            .fetch_one(&mut conn)
            .await
            .unwrap()
    }
}

/// See [`Backend::open_late_nack`].
struct PgOpenWrite {
    conn: PgConnection,
    pid: i32,
}

#[async_trait::async_trait]
impl OpenWrite for PgOpenWrite {
    async fn blocks_someone(&self) -> bool {
        let mut conn = PgConnection::connect(&url()).await.expect("connect");
        sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid)))",
        )
        .bind(self.pid)
        .fetch_one(&mut conn)
        .await
        .unwrap()
    }

    async fn commit(mut self: Box<Self>) {
        self.conn.execute("COMMIT").await.unwrap();
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
            PostgresStorage::connect(&url(), 2, backend.options(&setup), backend.extras(&setup))
                .await
                .unwrap(),
        );
    }
    let created = futures::future::join_all(storages.iter().map(|s| s.ensure_table())).await;
    assert!(created.iter().all(Result::is_ok), "{created:?}");
    storages[0].verify_table().await.unwrap();
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

/// An ack skips the head of a key whose producer transaction is open (neither waits for
/// the other), leaving the head behind on a finished row. The next claim looks past it to
/// the key's first pending row, and moves it on, so claims do not keep walking finished
/// rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_left_behind_by_an_ack_is_moved_on_by_the_next_claim() {
    let backend = PgBackend::new().await;
    let storage = backend.open(Setup::default()).await;
    let table = format!("\"{}\".outbox", backend.schema);
    let heads = format!("\"{}\".outbox_heads", backend.schema);
    let head = || async {
        let mut conn = PgConnection::connect(&url()).await.unwrap();
        sqlx::query_scalar::<_, Option<i64>>(&format!(
            "SELECT head_id FROM {heads} WHERE key = 'k'"
        ))
        .fetch_one(&mut conn)
        .await
        .unwrap()
    };
    let first = insert(&*storage, "t", "first", Some("k")).await;
    assert_eq!(ids(&claim(&*storage, "w", 10, LEASE).await), [first]);

    let mut producer = PgConnection::connect(&url()).await.unwrap();
    producer.execute("BEGIN").await.unwrap();
    let second: MessageId = sqlx::query_scalar(&format!(
        "INSERT INTO {table} (topic, key, payload) VALUES ('t', 'k', 'second') RETURNING id"
    ))
    .fetch_one(&mut producer)
    .await
    .unwrap();
    // Does not wait for the producer: the head stays on the acked row.
    assert_eq!(storage.ack(&[first], "w").await.unwrap(), [first]);
    assert_eq!(
        head().await,
        Some(first),
        "the ack skipped the producer's head"
    );
    producer.execute("COMMIT").await.unwrap();

    assert_eq!(ids(&claim(&*storage, "w", 10, LEASE).await), [second]);
    assert_eq!(head().await, Some(second), "the claim moved the head on");
}

/// A relay statement waits at most its session's `lock_timeout` for a lock, then fails as
/// `Unavailable` (retried), whatever holds it: here another session holds the table's
/// claim lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_waiting_past_the_lock_timeout_is_unavailable() {
    let backend = PgBackend::new().await;
    let storage = backend.open(Setup::default()).await;
    insert(&*storage, "t", "p", Some("k")).await;
    let mut holder = PgConnection::connect(&url()).await.unwrap();
    sqlx::query("SELECT pg_advisory_lock($1, hashtext($2))")
        .bind(0x7478_6f62_i32)
        .bind(format!("txoutbox:{}.outbox", backend.schema))
        .execute(&mut holder)
        .await
        .unwrap();
    let err = storage.claim(request("w")).await.unwrap_err();
    assert!(matches!(err, StorageError::Unavailable(_)), "{err:?}");
    assert!(err.to_string().contains("lock timeout"), "{err}");
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

// A team's own table, mapped ("bring your own table"): what the contract run above
// cannot show.

/// A PostgreSQL storage on `table` of the backend's schema, with `mapping`.
async fn mapped_storage(
    backend: &PgBackend,
    table: &str,
    mapping: ColumnMapping,
) -> PostgresStorage {
    let options = TableOptions {
        table: table.to_owned(),
        columns: Columns::from_mapping(&mapping).unwrap(),
        ..backend.options(&Setup::default())
    };
    let extras = backend.extras(&Setup::default());
    PostgresStorage::connect(&url(), 2, options, extras)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_that_does_not_fit_its_columns_is_reported_with_every_problem_at_once() {
    let backend = PgBackend::new().await;
    backend
        .execute(&format!(
            "CREATE SCHEMA \"{schema}\"; CREATE TABLE \"{schema}\".wrong (\
               event_id text PRIMARY KEY, event_type integer, body bytea NOT NULL, \
               occurred_at timestamp NOT NULL DEFAULT now(), relay_status text NOT NULL, \
               relay_owner text NOT NULL)",
            schema = backend.schema
        ))
        .await;
    let storage = mapped_storage(&backend, "wrong", team_mapping()).await;
    let Err(StorageError::MismatchedTable { problems, .. }) = storage.verify_table().await else {
        panic!("a mismatched table must be reported");
    };
    let text = problems.join("\n");
    for needle in [
        "\"event_id\" (columns.id) is text, needs bigint or integer",
        "\"event_type\" (columns.topic) is integer, needs text or character varying",
        "\"aggregate_id\" (columns.key) is missing; map the column",
        "\"meta\" (columns.headers) is missing",
        "\"occurred_at\" (columns.created_at) is timestamp without time zone, needs timestamp with time zone",
        "\"relay_status\" (columns.status) has no default",
        "\"relay_attempts\" (columns.attempts) is missing; `txoutboxd schema` prints",
        "\"relay_owner\" (columns.leased_by) is NOT NULL",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
    assert!(!text.contains("columns.payload"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_topic_json_table_without_headers_relays_what_producers_insert() {
    let backend = PgBackend::new().await;
    let audit = format!("\"{}\".audit", backend.schema);
    backend
        .execute(&format!(
            "CREATE SCHEMA \"{}\"; CREATE TABLE {audit} (\
               id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, aggregate text, \
               doc jsonb NOT NULL, at timestamptz NOT NULL DEFAULT now())",
            backend.schema
        ))
        .await;
    let mapping = ColumnMapping {
        fixed_topic: Some("audit".to_owned()),
        key: "aggregate".to_owned(),
        payload: "doc".to_owned(),
        payload_format: PayloadFormat::Json,
        headers: String::new(),
        created_at: "at".to_owned(),
        ..ColumnMapping::default()
    };
    let storage = mapped_storage(&backend, "audit", mapping).await;
    assert!(matches!(
        storage.verify_table().await,
        Err(StorageError::MismatchedTable { .. })
    ));
    let schema = storage.schema_sql();
    assert!(
        schema.contains("ADD COLUMN IF NOT EXISTS \"status\""),
        "{schema}"
    );
    storage
        .ensure_table()
        .await
        .expect("adds the relay's columns");
    storage
        .verify_table()
        .await
        .expect("fits once the columns are added");

    // A producer that knows nothing of the relay's columns.
    backend
        .execute(&format!(
            "INSERT INTO {audit} (aggregate, doc) VALUES ('order-1', '{{\"a\": 1}}')"
        ))
        .await;
    let id = storage
        .insert(NewMessage::new("audit", r#"{"b":[true]}"#).with_key("order-1"))
        .await
        .unwrap();
    for (message, why) in [
        (NewMessage::new("refunds", "{}"), "columns.fixed_topic"),
        (NewMessage::new("audit", "{"), "not JSON"),
        (
            NewMessage {
                headers: [("h".to_owned(), "v".to_owned())].into(),
                ..NewMessage::new("audit", "{}")
            },
            "no headers column",
        ),
    ] {
        match storage.insert(message).await {
            Err(StorageError::InvalidMessage(error)) => assert!(error.contains(why), "{error}"),
            other => panic!("expected InvalidMessage({why}), got {other:?}"),
        }
    }
    assert_eq!(
        backend.row_count_of(&audit).await,
        2,
        "refused inserts wrote nothing"
    );

    let none = claim_topics(&storage, "w1", 10, LEASE, &["refunds".to_owned()]).await;
    assert!(none.is_empty());
    let got = claim_topics(&storage, "w1", 10, LEASE, &["audit".to_owned()]).await;
    assert_eq!(got.len(), 2);
    assert_eq!(got[1].id, id);
    assert!(got
        .iter()
        .all(|m| m.topic == "audit" && m.headers.is_empty()));
    assert_eq!(got[0].payload, br#"{"a": 1}"#);
    assert_eq!(got[1].payload, br#"{"b": [true]}"#, "jsonb's own spelling");
    let stats = storage.stats().await.unwrap();
    assert_eq!(stats.topics[0].topic, "audit");
    assert_eq!(stats.total.leased, 2);
    let acked = storage.ack(&[got[0].id, got[1].id], "w1").await.unwrap();
    assert_eq!(acked.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_text_payload_is_handed_out_as_its_utf8_bytes() {
    let backend = PgBackend::new().await;
    let notes = format!("\"{}\".notes", backend.schema);
    backend
        .execute(&format!(
            "CREATE SCHEMA \"{}\"; CREATE TABLE {notes} (\
               id serial PRIMARY KEY, topic text NOT NULL, key text, body varchar(100) NOT NULL, \
               created_at timestamptz NOT NULL DEFAULT now())",
            backend.schema
        ))
        .await;
    let mapping = ColumnMapping {
        payload: "body".to_owned(),
        payload_format: PayloadFormat::Text,
        headers: String::new(),
        ..ColumnMapping::default()
    };
    let storage = mapped_storage(&backend, "notes", mapping).await;
    storage.ensure_table().await.unwrap();
    storage.verify_table().await.unwrap();
    storage
        .insert(NewMessage::new("t", "héllo").with_key("k"))
        .await
        .unwrap();
    let refused = storage.insert(NewMessage::new("t", vec![0xff, 0xfe])).await;
    assert!(
        matches!(refused, Err(StorageError::InvalidMessage(_))),
        "{refused:?}"
    );
    let got = claim(&storage, "w1", 10, LEASE).await;
    assert_eq!(got[0].payload, "héllo".as_bytes());
    assert_eq!(got[0].key.as_deref(), Some("k"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_null_in_a_nullable_headers_column_means_no_headers() {
    let backend = PgBackend::new().await;
    let events = format!("\"{}\".events", backend.schema);
    backend
        .execute(&format!(
            "CREATE SCHEMA \"{}\"; CREATE TABLE {events} (\
               id bigserial PRIMARY KEY, topic text NOT NULL, key text, payload bytea NOT NULL, \
               meta jsonb, created_at timestamptz NOT NULL DEFAULT now())",
            backend.schema
        ))
        .await;
    let mapping = ColumnMapping {
        headers: "meta".to_owned(),
        ..ColumnMapping::default()
    };
    let storage = mapped_storage(&backend, "events", mapping).await;
    storage.ensure_table().await.unwrap();
    storage.verify_table().await.unwrap();
    backend
        .execute(&format!(
            "INSERT INTO {events} (topic, payload) VALUES ('t', 'no headers')"
        ))
        .await;
    let got = claim(&storage, "w1", 10, LEASE).await;
    assert_eq!(got.len(), 1);
    assert!(got[0].headers.is_empty());
}
