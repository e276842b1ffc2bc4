//! The PostgreSQL backend: one outbox table, claimed with `FOR UPDATE SKIP LOCKED`.
//!
//! Start with [`PostgresStorage::connect`]. Its files are those of every backend (see
//! `storage/mod.rs`): the table's names in `shape.rs`, its DDL and check in `schema.rs`,
//! the claim in `claim.rs`, strict ordering (key heads and the claim function) in
//! `strict.rs`, the answers in `answers.rs`, the operator's calls in `admin.rs`, errors
//! and rows in `convert.rs`; and two of its own: the insert wake-ups (LISTEN/NOTIFY) in
//! `listen.rs`, where non-strict claims start in `floor.rs`. Every write-back is fenced
//! by `leased_by = owner AND status = 'pending'` and returns the ids it applied to; a
//! nack, an extension and a delayed release also need a lease that has not run out.
//!
//! Times come from `statement_timestamp()`, not `now()`: `now()` is the start of the
//! transaction, and a strict claim first waits for the table's advisory lock, so `now()`
//! would be stale by that wait (shorter leases, rows due a moment too late). Within one
//! statement `statement_timestamp()` is stable, like `now()`, so every row of a claim gets
//! the same lease deadline.
//!
//! Column meanings: `available_at` is when the row may next be claimed. A claim sets it to
//! the lease deadline (an expired lease is simply due again), a nack to the retry time, a
//! release to now plus the delay. A pending row is *leased* while `leased_by` is set and
//! `available_at` is in the future.
//!
//! Every operation is one statement (or one function call) in a transaction of its own:
//! no transaction of the relay waits for a round trip to this server, so a paused or
//! partitioned server holds no lock another server or a producer needs. What
//! spans several statements (a claim and the read of its messages, an ack and the move of
//! its keys' heads) is correct after any one of them alone.
//!
//! With `strict_ordering` each claim takes a transaction-scoped advisory lock on the
//! table inside the claim function, so claims on one table run one at a time across every
//! server sharing the database, and each sees what the previous one committed. That is
//! what makes the "no earlier row of this key is leased" predicate sound; publishing, the
//! slow part, still runs in parallel.

mod admin;
mod answers;
mod claim;
mod convert;
mod floor;
pub mod groups;
mod listen;
mod schema;
mod shape;
mod strict;

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context};
use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use tokio::sync::watch;
use tokio::time::Instant;

use self::admin::Admin;
use self::answers::Answers;
use self::claim::Claims;
use self::convert::Conn;
use self::floor::ClaimFloor;
use self::listen::InsertSignal;
use self::schema::Schema;
use self::shape::{Shape, StrictObjects};
use self::strict::Strict;
use super::{
    BlockedKey, ClaimRequest, Claimed, DeadCounts, DeadFilter, DeadLetter, Extended, HeldKeys,
    Inserts, LeaseHolder, MessageId, NackRequest, NackResult, NewMessage, Pauses, RetryPolicy,
    SortedIds, Stats, Storage, StorageResult, TableOptions,
};
use crate::config::ident::Ident;
use crate::config::{SynchronousCommit, Timeouts};

/// Longest wait of a relay statement for a lock; then the call fails and is retried.
const LOCK_TIMEOUT: &str = "10s";
/// The relay opens no transaction that waits on it; this ends one if that ever changes.
const IDLE_IN_TRANSACTION_TIMEOUT: &str = "10s";

/// What only a PostgreSQL table has, besides its [`TableOptions`].
#[derive(Debug, Clone, Default)]
pub struct PostgresExtras {
    /// Schema of the table; `None` uses the connection's `search_path`.
    pub schema: Option<String>,
    /// Channel the insert trigger notifies; enables [`Storage::insert_signal`].
    pub notify_channel: Option<String>,
}

/// What the claims, answers and admin statements of one table share: the pool, with
/// strict ordering the key heads (see `strict.rs`), and the floor of non-strict claims
/// (see `floor.rs`), which an answer making a row claimable again moves back.
#[derive(Clone)]
struct Shared {
    conn: Conn,
    strict: Option<Arc<Strict>>,
    floor: Arc<ClaimFloor>,
}

/// An outbox table in PostgreSQL. Dropping it stops its insert listener.
pub struct PostgresStorage {
    /// `schema.table` unquoted, for messages.
    table: Arc<str>,
    options: TableOptions,
    extras: PostgresExtras,
    claims: Claims,
    answers: Answers,
    admin: Admin,
    schema: Schema,
    /// Present with `notify_channel`.
    signal: Option<InsertSignal>,
}

impl fmt::Debug for PostgresStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStorage")
            .field("table", &self.table)
            .field("options", &self.options)
            .field("extras", &self.extras)
            .field("listening", &self.signal.is_some())
            .finish_non_exhaustive()
    }
}

impl PostgresStorage {
    /// A storage with a pool of its own (see [`lazy_pool`]). Identifiers are checked here;
    /// the database is not contacted until first use (see [`Storage::verify_table`]), so a server
    /// can start while its database is still coming up.
    pub async fn connect(
        url: &str,
        max_connections: u32,
        options: TableOptions,
        extras: PostgresExtras,
    ) -> anyhow::Result<Self> {
        let pool = lazy_pool(url, max_connections, SynchronousCommit::default())?;
        let listener_options = (*pool.connect_options()).clone();
        Self::build(pool, listener_options, options, extras)
    }

    /// A storage on an existing pool, for example one [`lazy_pool`] shared by the outboxes
    /// of a database. `url` is for the insert listener's own connection; without it the
    /// pool's connect options are used. Needs a Tokio runtime when `notify_channel` is set.
    pub fn from_pool(
        pool: PgPool,
        url: Option<&str>,
        options: TableOptions,
        extras: PostgresExtras,
    ) -> anyhow::Result<Self> {
        let listener_options = match url {
            Some(url) => connect_options(
                url,
                SynchronousCommit::default(),
                Timeouts::default().statement,
            )?,
            None => (*pool.connect_options()).clone(),
        };
        Self::build(pool, listener_options, options, extras)
    }

    fn build(
        pool: PgPool,
        listener_options: PgConnectOptions,
        options: TableOptions,
        extras: PostgresExtras,
    ) -> anyhow::Result<Self> {
        let name = |option: &str, value: &str| {
            Ident::new(value).map_err(|err| anyhow!("invalid postgres `{option}`: {err}"))
        };
        let table = name("table", &options.table)?;
        let schema = extras
            .schema
            .as_deref()
            .map(|s| name("schema", s))
            .transpose()?;
        let channel = extras
            .notify_channel
            .as_deref()
            .map(|c| name("notify_channel", c))
            .transpose()?;
        let shape = Shape {
            schema: schema.as_ref(),
            table: &table,
            options: &options,
            notify_channel: channel.as_ref(),
        };
        let conn = Conn {
            pool,
            table: shape.display_table().into(),
        };
        let objects = StrictObjects::new(&shape);
        let strict = shape
            .options
            .strict_ordering
            .then(|| Arc::new(Strict::new(conn.clone(), &objects)));
        // Where this server's non-strict claims start (see `floor.rs`).
        let floor = Arc::new(ClaimFloor::new(Instant::now()));
        let delete_on_ack = options.delete_on_ack;
        let shared = Shared {
            conn: conn.clone(),
            strict,
            floor,
        };
        let storage = Self {
            table: conn.table.clone(),
            claims: Claims::new(shared.clone(), &shape),
            answers: Answers::new(shared.clone(), &shape, delete_on_ack),
            admin: Admin::new(shared, &shape, delete_on_ack),
            schema: Schema::new(conn, &shape, &objects),
            signal: channel
                .map(|channel| {
                    InsertSignal::spawn(
                        listener_options,
                        channel.to_string(),
                        options.visibility_delay,
                    )
                })
                .transpose()?,
            options,
            extras,
        };
        Ok(storage)
    }
}

/// A pool that connects on first use, as every pool of this backend should be: `jit = off`
/// (JIT-compiling the claim under a large backlog costs more than the claim itself),
/// `enable_seqscan = off` (see `connect_options`), the configured `synchronous_commit`
/// (see [`SynchronousCommit`]), and the default [`Timeouts`] (see [`lazy_pool_with`]).
/// `max_connections` is at least 1 (configuration checks it).
pub fn lazy_pool(
    url: &str,
    max_connections: u32,
    synchronous_commit: SynchronousCommit,
) -> anyhow::Result<PgPool> {
    lazy_pool_with(
        url,
        max_connections,
        synchronous_commit,
        Timeouts::default(),
    )
}

/// [`lazy_pool`] with these timeouts: a short acquire timeout, so a dead database surfaces
/// as [`StorageError::Unavailable`] within seconds instead of hanging callers, and the
/// statement limit as the sessions' `statement_timeout` (the DDL of `create_schema` is
/// exempt).
pub fn lazy_pool_with(
    url: &str,
    max_connections: u32,
    synchronous_commit: SynchronousCommit,
    timeouts: Timeouts,
) -> anyhow::Result<PgPool> {
    Ok(PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(timeouts.acquire)
        .connect_lazy_with(connect_options(
            url,
            synchronous_commit,
            timeouts.statement,
        )?))
}

fn connect_options(
    url: &str,
    synchronous_commit: SynchronousCommit,
    statement_timeout: Duration,
) -> anyhow::Result<PgConnectOptions> {
    // The url is not echoed: it may carry a password.
    let options = PgConnectOptions::from_str(url).context("invalid postgres url")?;
    let options = match options.get_application_name() {
        Some(_) => options,
        None => options.application_name("txoutboxd"),
    };
    // `synchronous_commit` is set on the relay's own sessions only (producers are
    // untouched); `off` unless configured, see `SynchronousCommit`.
    //
    // The timeouts bound what one statement of the relay can hold or wait for, whatever
    // happens to this server: no relay transaction spans a round trip, so these are a
    // second line (a statement stuck behind a lock, a migration holding the table).
    //
    // No sequential scans: every statement of the relay reaches its rows through an index
    // (ids, the pending and key indexes, the heads), and its cached plans outlive the
    // table size they were made for. A plan made while the table was small (new, or not
    // analyzed since: autovacuum off, or the first minute) scans it whole when that is
    // cheaper than an index, and keeps doing so as the table grows: locking and reading a
    // claim's 5 rows cost 0.3 ms each at 6,600 rows, and grow with every delivered row
    // kept. Off, PostgreSQL still scans a table whole where no index applies.
    let statement_timeout = format!("{}ms", statement_timeout.as_millis().max(1));
    Ok(options.options([
        ("jit", "off"),
        ("enable_seqscan", "off"),
        ("synchronous_commit", synchronous_commit.as_str()),
        ("statement_timeout", statement_timeout.as_str()),
        ("lock_timeout", LOCK_TIMEOUT),
        (
            "idle_in_transaction_session_timeout",
            IDLE_IN_TRANSACTION_TIMEOUT,
        ),
    ]))
}

#[async_trait]
impl Storage for PostgresStorage {
    fn backend(&self) -> &'static str {
        "postgres"
    }

    fn table_name(&self) -> &str {
        &self.table
    }

    async fn claim(&self, request: ClaimRequest<'_>) -> StorageResult<Claimed> {
        self.claims.claim(request, None).await
    }

    async fn claim_ahead(
        &self,
        request: ClaimRequest<'_>,
        held: &HeldKeys,
    ) -> StorageResult<Claimed> {
        self.claims.claim(request, Some(held)).await
    }

    async fn held_attempts(
        &self,
        ids: &SortedIds,
        owner: &str,
    ) -> StorageResult<Vec<(MessageId, u32)>> {
        self.answers.held_attempts(ids, owner).await
    }

    async fn ack(&self, ids: &SortedIds, owner: &str) -> StorageResult<SortedIds> {
        self.answers.ack(ids, owner).await
    }

    async fn nack_many(
        &self,
        nacks: &[NackRequest<'_>],
        owner: &str,
        policy: &dyn RetryPolicy,
    ) -> StorageResult<Vec<NackResult>> {
        self.answers.nack_many(nacks, owner, policy).await
    }

    async fn release(
        &self,
        ids: &SortedIds,
        owner: &str,
        delay: Duration,
    ) -> StorageResult<SortedIds> {
        self.answers.release(ids, owner, delay).await
    }

    async fn dead_letter(&self, id: MessageId, owner: &str, error: &str) -> StorageResult<bool> {
        self.answers.dead_letter(id, owner, error).await
    }

    async fn extend_lease(
        &self,
        ids: &SortedIds,
        owner: &str,
        lease: Duration,
    ) -> StorageResult<Extended> {
        self.answers.extend_lease(ids, owner, lease).await
    }

    async fn return_leases(&self, ids: &SortedIds, owner: &str) -> StorageResult<u64> {
        self.answers.return_leases(ids, owner).await
    }

    async fn stats(&self) -> StorageResult<Stats> {
        self.admin.stats().await
    }

    async fn delivered_within(&self, window: Duration) -> StorageResult<Option<u64>> {
        self.admin.delivered_within(window).await
    }

    async fn purge(&self, older_than: Duration) -> StorageResult<u64> {
        self.admin.purge(older_than).await
    }

    fn schema_sql(&self) -> String {
        self.schema.ddl.clone()
    }

    async fn ensure_table(&self) -> StorageResult<()> {
        self.schema.ensure().await
    }

    async fn verify_table(&self) -> StorageResult<()> {
        self.schema.verify().await
    }

    async fn list_dead(
        &self,
        filter: &DeadFilter,
        after_id: MessageId,
        limit: u32,
    ) -> StorageResult<Vec<DeadLetter>> {
        self.admin.list_dead(filter, after_id, limit).await
    }

    async fn count_dead(&self, filter: &DeadFilter) -> StorageResult<DeadCounts> {
        self.admin.count_dead(filter).await
    }

    async fn redrive_dead(
        &self,
        filter: &DeadFilter,
        limit: u32,
        delay: Duration,
    ) -> StorageResult<SortedIds> {
        self.admin.redrive_dead(filter, limit, delay).await
    }

    async fn discard_dead(&self, filter: &DeadFilter, limit: u32) -> StorageResult<SortedIds> {
        self.admin.discard_dead(filter, limit).await
    }

    async fn blocked_keys(
        &self,
        after_id: MessageId,
        limit: u32,
    ) -> StorageResult<Vec<BlockedKey>> {
        self.admin.blocked_keys(after_id, limit).await
    }

    async fn lease_holders(&self) -> StorageResult<Vec<LeaseHolder>> {
        self.admin.lease_holders().await
    }

    async fn pauses(&self) -> StorageResult<Pauses> {
        self.admin.pauses().await
    }

    async fn set_paused(&self, topics: &[String], paused: bool) -> StorageResult<Pauses> {
        self.admin.set_paused(topics, paused).await
    }

    async fn insert(&self, message: NewMessage) -> StorageResult<MessageId> {
        self.admin.insert(message).await
    }

    fn insert_signal(&self) -> Option<watch::Receiver<Inserts>> {
        self.signal.as_ref().map(InsertSignal::subscribe)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn identifiers_are_checked_and_named() {
        let url = "postgres://postgres@127.0.0.1:1/none";
        for (options, extras, named) in [
            (
                TableOptions {
                    table: "out-box".into(),
                    ..Default::default()
                },
                PostgresExtras::default(),
                "`table`",
            ),
            (
                TableOptions::default(),
                PostgresExtras {
                    schema: Some("1st".into()),
                    ..Default::default()
                },
                "`schema`",
            ),
            (
                TableOptions::default(),
                PostgresExtras {
                    notify_channel: Some("a b".into()),
                    ..Default::default()
                },
                "`notify_channel`",
            ),
        ] {
            let err = PostgresStorage::connect(url, 1, options, extras)
                .await
                .unwrap_err()
                .to_string();
            assert!(err.contains(named), "{err}");
            assert!(
                err.contains("ASCII letters, digits and underscores"),
                "{err}"
            );
        }
    }
}
