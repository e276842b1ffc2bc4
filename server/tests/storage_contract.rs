//! The storage contract: what every backend must do, written once.
//!
//! `storage_contract!(name, factory)` expands to one `#[tokio::test]` per case in [`cases`]
//! (`storage_contract/cases.rs`), each with a fresh [`Backend`] from `factory` (an
//! expression that may `.await`). Adding a backend is one line at the bottom of this file
//! plus its [`Backend`] impl, like [`pg_backend`]'s (`storage_contract/pg_backend.rs`). The
//! cases cover the five calls of any outbox relay (claim, ack, nack, release, dead-letter)
//! and what the server relies on besides (nack policy, successors, lease extension, purge,
//! wake-ups, errors).
//!
//! PostgreSQL: every test gets a uniquely named schema in the database at
//! `TXOUTBOX_TEST_POSTGRES_URL` (default `postgres://postgres@127.0.0.1:5432/test`),
//! dropped when the test ends, even when it fails.
//!
//! SQLite: every test gets a fresh database file in a temporary directory, removed when
//! the test ends. It has no insert signal, so its insert-signal cases are skipped with
//! the reason (see `storage_contract!`).
//!
//! MySQL/MariaDB: every test gets a database of its own on the server at
//! `TXOUTBOX_TEST_MYSQL_URL` (default `mysql://root@127.0.0.1:3306/test`), dropped when
//! the test ends (see `storage_contract/mysql.rs`). No insert signal either: skipped.

// The crate root of a test resolves `mod x;` beside itself; these live in a folder.
#[path = "storage_contract/cases.rs"]
mod cases;
#[path = "storage_contract/edge_cases.rs"]
mod edge_cases;
#[path = "storage_contract/keyless.rs"]
mod keyless;
#[path = "storage_contract/mysql.rs"]
mod mysql;
#[path = "storage_contract/operations.rs"]
mod operations;
#[path = "storage_contract/pg.rs"]
mod pg;
#[path = "storage_contract/pg_backend.rs"]
mod pg_backend;
#[path = "storage_contract/pg_mapped.rs"]
mod pg_mapped;
#[path = "shared/pg_schema.rs"]
mod pg_schema;
#[path = "storage_contract/sqlite_file.rs"]
mod sqlite_file;
#[path = "shared/team_tables.rs"]
mod team_tables;

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use txoutbox_server::config::columns::{ColumnMapping, PayloadFormat};
use txoutbox_server::storage::{
    ClaimRequest, FailureDecision, Inserts, MessageId, NewMessage, OutboxMessage, RetryPolicy,
    Storage, StorageError, MAX_KEY_CHARS,
};

/// A lease that does not run out during a test.
const LEASE: Duration = Duration::from_secs(30);
/// A lease that runs out during a test; real time, since the database keeps the clock.
/// Still a second: the statements right after its claim must see it held, and on a busy
/// machine 200 ms ran out before the next claim (the row came back too early).
const SHORT_LEASE: Duration = Duration::from_secs(1);
const FUTURE: Duration = Duration::from_secs(3600);
/// Longest wait for something that should happen.
const DEADLINE: Duration = Duration::from_secs(10);

/// The knobs every backend has.
#[derive(Debug, Clone)]
struct Setup {
    strict_ordering: bool,
    dead_letter_holds_key: bool,
    delete_on_ack: bool,
    visibility_delay: Duration,
    notify: bool,
    max_row_bytes: u64,
}

impl Default for Setup {
    fn default() -> Self {
        Self {
            strict_ordering: true,
            dead_letter_holds_key: false,
            delete_on_ack: false,
            visibility_delay: Duration::ZERO,
            notify: false,
            max_row_bytes: 1 << 22,
        }
    }
}

/// What a backend provides to the contract: one fresh table per test.
trait Backend {
    /// A storage on this test's table, created if needed. Every call is a separate
    /// instance with connections of its own, like another server on the same database.
    async fn open(&self, setup: Setup) -> Arc<dyn Storage>;
    /// Rows in this test's table, whatever their status.
    async fn row_count(&self) -> u64;
    /// A storage whose table does not exist.
    async fn missing_table(&self) -> Arc<dyn Storage>;
    /// A storage whose database cannot be reached.
    async fn unreachable(&self) -> Arc<dyn Storage>;
    /// Waits until the insert listener of a storage opened with `notify` listens.
    async fn until_listening(&self);
    /// Another session's transaction that did to row `id` what a late nack does (a retry
    /// an hour away, no longer leased) and is still open, so a claim can run beside it.
    async fn open_late_nack(&self, id: MessageId) -> Box<dyn OpenWrite>;
    /// The row's `last_error`, as stored.
    async fn last_error(&self, id: MessageId) -> Option<String>;
    /// The DDL of a team's own `table` on this backend, `{db}.` standing for where this
    /// test's tables live (see [`Backend::produce`]).
    fn team_ddl(&self, table: TeamTable) -> String;
    /// Runs a producer's own `sql` on this test's database, with `{db}.` standing for
    /// this test's schema or database (nothing on SQLite).
    async fn produce(&self, sql: &str);
    /// A storage on a team's own `table` (its [`Backend::team_ddl`] run first), mapped
    /// with `mapping`; `ensure_table` adds the bookkeeping columns (twice: idempotent),
    /// then `verify_table` passes.
    async fn own_table(&self, table: TeamTable, mapping: ColumnMapping) -> Arc<dyn Storage>;
}

/// Tables of a team's own that each backend writes in its own DDL, for the cases of a
/// mapped table that are the same everywhere.
#[derive(Debug, Clone, Copy)]
enum TeamTable {
    /// `invoice_events`: key `invoice`, a JSON `document`, `logged_at`; no topic column
    /// and no headers.
    InvoiceEvents,
    /// `notes`: topic, key, a text payload `note`, headers as JSON text, created_at.
    Notes,
}

impl TeamTable {
    fn name(self) -> &'static str {
        match self {
            Self::InvoiceEvents => "invoice_events",
            Self::Notes => "notes",
        }
    }
}

/// Another session's write transaction, still open (see [`Backend::open_late_nack`]).
#[async_trait::async_trait]
trait OpenWrite: Send {
    /// Whether some session waits for this transaction's locks. True where the database
    /// cannot tell: a SQLite writer waits for the file's lock in its busy handler.
    async fn blocks_someone(&self) -> bool;
    async fn commit(self: Box<Self>);
}

/// Retries after the requested delay (a minute by default) until `max_attempts`.
struct TestPolicy {
    max_attempts: u32,
}

impl RetryPolicy for TestPolicy {
    fn on_failure(&self, attempts: u32, requested_delay: Option<Duration>) -> FailureDecision {
        if attempts >= self.max_attempts {
            FailureDecision::DeadLetter
        } else {
            FailureDecision::RetryAfter(requested_delay.unwrap_or(Duration::from_secs(60)))
        }
    }
}

const POLICY: TestPolicy = TestPolicy { max_attempts: 5 };

/// `storage_contract!(name, factory)` runs every case. A backend that cannot wake
/// claimers on insert says so with a reason,
/// `storage_contract!(name, factory, no_insert_signal = "why")`, and the insert-signal
/// cases are generated `#[ignore = "why"]`: listed as skipped, with the reason, never
/// silently passed.
macro_rules! storage_contract {
    ($backend:ident, $factory:expr) => {
        storage_contract!(@backend $backend, $factory, cfg(all()));
    };
    ($backend:ident, $factory:expr, no_insert_signal = $reason:literal) => {
        storage_contract!(@backend $backend, $factory, ignore = $reason);
    };
    // `$signal`: the attribute of the insert-signal cases (`cfg(all())` is a no-op).
    (@backend $backend:ident, $factory:expr, $signal:meta) => {
        mod $backend {
            use super::*;

            storage_contract!(@cases $factory, cfg(all());
                empty_claim,
                claim_returns_insertion_order_with_attempt_one,
                claim_respects_batch_size,
                leased_rows_are_invisible_to_other_workers,
                expired_lease_is_reclaimable_with_the_next_attempt,
                concurrent_claims_do_not_overlap,
                concurrent_claims_do_not_overlap_without_strict_ordering,
                acked_rows_are_never_claimed_again,
                empty_write_backs_are_noops,
                nack_schedules_a_retry,
                nack_without_delay_is_claimable_now_with_the_next_attempt,
                release_refunds_the_attempt,
                release_without_delay_is_claimable_with_the_same_attempt,
                dead_letter_is_never_claimed_again,
                stale_ack_is_fenced,
                stale_nack_release_and_extension_are_fenced,
                stale_dead_letter_is_fenced,
                strict_ordering_holds_back_successors_of_a_retrying_message,
                strict_ordering_holds_back_successors_of_a_leased_message,
                claim_ahead_goes_on_only_past_the_owners_own_rows,
                strict_ordering_under_concurrent_claims_of_two_servers,
                strict_ordering_is_kept_across_topic_filters,
                stats_count_per_topic,
                nack_on_the_last_attempt_dead_letters_and_releases_successors,
                nack_releases_successors_with_the_same_retry_time,
                extend_lease_keeps_a_row_leased,
                return_leases_makes_rows_claimable_with_the_attempt_kept,
                purge_deletes_only_old_delivered_rows,
                delete_on_ack_deletes,
                visibility_delay_hides_fresh_rows,
                topic_filter,
                headers_round_trip,
                missing_table_is_reported,
                unreachable_database_is_reported,
                a_claim_racing_a_late_nack_hands_out_no_later_row_of_the_key,
                answers_that_delay_a_row_need_a_live_lease,
                a_row_claimed_max_attempts_times_is_dead_lettered_by_the_next_claim,
                a_batch_of_nacks_does_what_the_nacks_would_one_by_one,
                answers_with_repeated_and_unsorted_ids_apply_once_and_reply_sorted,
                a_fixed_topic_json_table_without_headers_round_trips,
                a_text_payload_is_handed_out_as_its_utf8_bytes,
                a_null_in_a_nullable_headers_column_means_no_headers,
                a_row_over_max_row_bytes_is_read_without_its_payload,
                held_attempts_are_those_of_the_owners_current_deliveries,
                dead_rows_are_listed_in_id_order_filtered_and_counted,
                a_redriven_row_goes_before_later_rows_of_its_key,
                redrive_and_discard_are_bounded_and_idempotent,
                a_pause_is_seen_by_every_server_on_the_table,
                paused_topics_are_held_in_the_database,
                rows_of_paused_topics_are_not_claimed,
                rows_of_paused_topics_are_not_claimed_without_strict_ordering,
                blocked_keys_are_listed_oldest_head_first,
                a_dead_row_holds_its_key_until_redriven_or_discarded,
                a_row_used_up_by_claims_holds_the_rows_of_its_key_behind_it,
                without_the_policy_a_dead_row_holds_nothing_back,
                a_dead_row_holds_the_rows_after_it_behind_a_redriven_one,
                lease_holders_are_the_owners_of_live_leases,
                keyless_rows_given_back_are_claimed_before_newer_ones,
                a_keyless_row_whose_lease_ran_out_is_claimed_while_newer_rows_keep_coming,
                a_keyless_row_whose_lease_ran_out_is_claimed_at_once_when_nothing_newer_is_free,
            );
            storage_contract!(@cases $factory, $signal;
                insert_signal_bumps_on_insert,
                insert_signal_waits_for_visibility,
                insert_signal_ends_with_the_storage,
            );
        }
    };
    (@cases $factory:expr, $attr:meta; $($case:ident),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            #[$attr]
            async fn $case() {
                let backend = $factory;
                cases::$case(&backend).await;
            }
        )+
    };
}

// -- helpers ---------------------------------------------------------------------------

/// The rest of each backend's fixed-topic JSON case (a table mapped with `fixed_topic =
/// "invoices"`, a JSON payload and no headers), once `first` (`{"total": 12}`, key `inv-1`)
/// was inserted through the storage and `["x"]` (key `inv-2`) by a producer's own SQL:
/// topic filters, stats, the claim, and the inserts the table must refuse.
async fn fixed_topic_json_table_holds_two_invoices(storage: &dyn Storage, first: MessageId) {
    let other = ["billing".to_owned()];
    assert!(claim_topics(storage, "w1", 10, LEASE, &other)
        .await
        .is_empty());
    let stats = storage.stats().await.unwrap();
    assert_eq!(stats.topics.len(), 1);
    assert_eq!(
        (stats.topics[0].topic.as_str(), stats.topics[0].pending),
        ("invoices", 2)
    );

    let wanted = ["billing".to_owned(), "invoices".to_owned()];
    let got = claim_topics(storage, "w1", 10, LEASE, &wanted).await;
    assert_eq!(ids(&got)[0], first);
    assert_eq!(payloads(&got), [r#"{"total": 12}"#, r#"["x"]"#]);
    assert!(got
        .iter()
        .all(|m| m.topic == "invoices" && m.headers.is_empty()));
    assert_eq!(got[1].key.as_deref(), Some("inv-2"));
    assert_eq!(
        storage.ack(&ids(&got).into(), "w1").await.unwrap(),
        ids(&got)
    );
    assert_eq!(storage.stats().await.unwrap(), Default::default());

    for (message, complaint) in [
        (
            NewMessage::new("billing", "{}"),
            "every row has topic \"invoices\"",
        ),
        (NewMessage::new("invoices", "{oops"), "not JSON"),
        (NewMessage::new("invoices", vec![0xc3, 0x28]), "not UTF-8"),
        (
            NewMessage {
                headers: [("trace".to_owned(), "1".to_owned())].into(),
                ..NewMessage::new("invoices", "{}")
            },
            "no headers column",
        ),
    ] {
        let err = storage.insert(message).await.unwrap_err();
        assert!(matches!(err, StorageError::InvalidMessage(_)), "{err:?}");
        assert!(err.to_string().contains(complaint), "{complaint}: {err}");
    }
    assert!(
        claim(storage, "w1", 10, LEASE).await.is_empty(),
        "nothing inserted"
    );
}

async fn insert(storage: &dyn Storage, topic: &str, payload: &str, key: Option<&str>) -> MessageId {
    let mut message = NewMessage::new(topic, payload);
    message.key = key.map(str::to_owned);
    storage.insert(message).await.expect("insert")
}

/// A claim of up to 10 rows for a [`LEASE`], any topic.
fn request(owner: &str) -> ClaimRequest<'_> {
    ClaimRequest {
        owner,
        batch_size: 10,
        lease: LEASE,
        topics: &[],
        paused_topics: &[],
        max_attempts: POLICY.max_attempts,
    }
}

async fn claim_topics(
    storage: &dyn Storage,
    owner: &str,
    batch_size: u32,
    lease: Duration,
    topics: &[String],
) -> Vec<OutboxMessage> {
    let request = ClaimRequest {
        owner,
        batch_size,
        lease,
        topics,
        paused_topics: &[],
        max_attempts: POLICY.max_attempts,
    };
    storage.claim(request).await.expect("claim").messages
}

async fn claim(
    storage: &dyn Storage,
    owner: &str,
    batch_size: u32,
    lease: Duration,
) -> Vec<OutboxMessage> {
    claim_topics(storage, owner, batch_size, lease, &[]).await
}

fn ids(messages: &[OutboxMessage]) -> Vec<MessageId> {
    messages.iter().map(|m| m.id).collect()
}

fn payloads(messages: &[OutboxMessage]) -> Vec<String> {
    messages
        .iter()
        .map(|m| String::from_utf8_lossy(&m.payload).into_owned())
        .collect()
}

/// Claims until something comes back; fails after [`DEADLINE`].
async fn claim_eventually(
    storage: &dyn Storage,
    owner: &str,
    batch_size: u32,
) -> Vec<OutboxMessage> {
    let start = Instant::now();
    loop {
        let got = claim(storage, owner, batch_size, LEASE).await;
        if !got.is_empty() {
            return got;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "nothing became claimable within {DEADLINE:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Long enough for a [`SHORT_LEASE`] to run out; only where nothing can be awaited instead.
async fn outlive_short_lease() {
    tokio::time::sleep(SHORT_LEASE * 2).await;
}

/// `at` is about `expected` from now (database and test share the machine's clock).
fn assert_about_from_now(at: chrono::DateTime<Utc>, expected: Duration) {
    let from_now = (at - Utc::now()).to_std().unwrap_or_default();
    let slack = Duration::from_secs(5);
    assert!(
        from_now + slack >= expected && from_now <= expected + slack,
        "{from_now:?} from now, expected about {expected:?}"
    );
}

/// The storage's insert signal once its listener listens, with every wake-up so far seen;
/// `None` when the backend has no signal.
async fn listening_signal(
    backend: &impl Backend,
    storage: &dyn Storage,
    settle: Duration,
) -> Option<tokio::sync::watch::Receiver<Inserts>> {
    let mut signal = storage.insert_signal()?;
    backend.until_listening().await;
    // The wake-up that follows (re)connecting is about to come: let it pass.
    tokio::time::sleep(settle).await;
    signal.borrow_and_update();
    Some(signal)
}

async fn next_signal(signal: &mut tokio::sync::watch::Receiver<Inserts>) {
    tokio::time::timeout(DEADLINE, signal.changed())
        .await
        .expect("no insert signal within the deadline")
        .expect("insert signal closed");
}

use mysql::MySqlBackend;
use pg_backend::PgBackend;
use sqlite_file::SqliteBackend;

storage_contract!(postgres, PgBackend::new().await);
storage_contract!(postgres_mapped, PgBackend::mapped().await);
storage_contract!(
    sqlite,
    SqliteBackend::new().await,
    no_insert_signal = "SQLite cannot tell another process of a commit: claiming polls"
);
storage_contract!(
    sqlite_mapped,
    SqliteBackend::mapped().await,
    no_insert_signal = "SQLite cannot tell another process of a commit: claiming polls"
);
storage_contract!(
    mariadb,
    MySqlBackend::new().await,
    no_insert_signal = "MySQL and MariaDB have no LISTEN/NOTIFY: claiming polls"
);
storage_contract!(
    mariadb_mapped,
    MySqlBackend::mapped().await,
    no_insert_signal = "MySQL and MariaDB have no LISTEN/NOTIFY: claiming polls"
);

/// The relay's own table on every backend holds keys of [`MAX_KEY_CHARS`] characters
/// (multi-byte ones too) and refuses longer ones as [`StorageError::InvalidMessage`]:
/// the limit the relay checks, enforced by the table for producers too (a PostgreSQL
/// btree used to fail past about 2,700 bytes, as INTERNAL). A team's own table keeps its
/// own column types, so this is not a case of the mapped contracts.
#[tokio::test]
async fn the_relays_own_tables_hold_keys_up_to_the_limit_and_refuse_longer_ones() {
    // The backends drop their schema, file or database when dropped: keep them.
    let (pg, sqlite, mysql) = (
        PgBackend::new().await,
        SqliteBackend::new().await,
        MySqlBackend::new().await,
    );
    let storages: [Arc<dyn Storage>; 3] = [
        pg.open(Setup::default()).await,
        sqlite.open(Setup::default()).await,
        mysql.open(Setup::default()).await,
    ];
    for storage in storages {
        let longest = "é".repeat(MAX_KEY_CHARS);
        storage
            .insert(NewMessage::new("t", "p").with_key(&longest))
            .await
            .unwrap();
        let got = storage.claim(ClaimRequest {
            owner: "w",
            batch_size: 10,
            lease: LEASE,
            topics: &[],
            paused_topics: &[],
            max_attempts: 10,
        });
        let got = got.await.unwrap().messages;
        assert_eq!(got[0].key.as_deref(), Some(longest.as_str()));
        let error = storage
            .insert(NewMessage::new("t", "p").with_key("k".repeat(MAX_KEY_CHARS + 1)))
            .await
            .unwrap_err();
        assert!(
            matches!(error, StorageError::InvalidMessage(_)),
            "{}: {error:?}",
            storage.backend()
        );
    }
}
