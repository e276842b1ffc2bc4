//! A deadline on every storage call, whatever the backend: [`Timed`] wraps a storage and
//! fails a call that has not finished within its database's budget with
//! [`StorageError::Unavailable`].
//!
//! The databases' own limits (PostgreSQL's `statement_timeout`, MariaDB's
//! `max_statement_time`, MySQL's `max_execution_time`) end a statement that runs too long
//! on a database that still answers; they cannot end a call whose answer never comes: a
//! link that drops packets silently (a partition, a paused host, a firewall's lost state)
//! holds the socket open and the call waits for TCP's retransmissions, a quarter of an
//! hour. The deadline here is the client side of the same bound, so a subscriber's stream
//! sees UNAVAILABLE, and the health checks NOT_SERVING, within seconds.
//!
//! It is also where storage calls are traced, for every backend at once: the calls worth a
//! span of their own (claims, nacks, and the operator's slow ones: purge, DDL, re-drive,
//! discard) open one named `storage.<call>` with the table's name, around the deadline.
//!
//! The call's future is dropped at the deadline: sqlx gives the connection back and rolls
//! an open transaction back (or closes the connection when it cannot tell its state), so
//! a call cut short changes nothing the relay counts on: its leases run out, its
//! answers are fenced or tried again.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;

use super::{
    ClaimRequest, Claimed, DeadCounts, DeadFilter, DeadLetter, Extended, HeldKeys, Inserts,
    LeaseHolder, MessageId, NackRequest, NackResult, NewMessage, Pauses, RetryPolicy, SortedIds,
    Stats, Storage, StorageError, StorageResult,
};
use crate::storage::blocked::BlockedKey;

mod groups;

/// The time bounds of one `[databases.NAME]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// Longest wait for a pooled connection (connecting included).
    pub acquire: Duration,
    /// Longest a statement may run (the database's own session limit), and what a call
    /// may spend waiting for its database's answers.
    pub statement: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            acquire: DEFAULT_ACQUIRE_TIMEOUT,
            statement: DEFAULT_STATEMENT_TIMEOUT,
        }
    }
}

/// Short, so an outage surfaces as [`StorageError::Unavailable`] quickly.
pub const DEFAULT_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(3);

/// Far above any statement of the relay (milliseconds under load), below what a client
/// waits before it gives up on a call.
pub const DEFAULT_STATEMENT_TIMEOUT: Duration = Duration::from_secs(30);

impl Timeouts {
    /// What a whole storage call may take: a connection, then its statements' answers.
    pub fn call_deadline(&self) -> Duration {
        self.acquire + self.statement
    }
}

/// What the DDL of `create_schema` may take: it may add an index to a large table, which
/// the databases run without their statement limit (PostgreSQL's `SET LOCAL
/// statement_timeout = 0`, MariaDB's `SET STATEMENT`); still bounded, as a link can go
/// silent during it too.
pub const DDL_DEADLINE: Duration = Duration::from_secs(600);

/// A storage whose every call ends within `deadline` (see the module docs): the
/// per-row [`Storage`], or the [`GroupStore`](super::groups::GroupStore) of an outbox
/// with groups (in `timed/groups.rs`), on the same database's deadline.
pub struct Timed<S: ?Sized = dyn Storage> {
    inner: Arc<S>,
    deadline: Duration,
    /// `databases.NAME`, named in the error so an operator knows which setting bounds it.
    database: String,
}

impl Timed {
    pub fn new(inner: Arc<dyn Storage>, database: &str, timeouts: Timeouts) -> Self {
        Self::around(inner, database, timeouts)
    }
}

impl<S: ?Sized> Timed<S> {
    pub fn around(inner: Arc<S>, database: &str, timeouts: Timeouts) -> Self {
        Self {
            inner,
            deadline: timeouts.call_deadline(),
            database: database.to_owned(),
        }
    }

    async fn within<T>(
        &self,
        action: &str,
        call: impl Future<Output = StorageResult<T>>,
    ) -> StorageResult<T> {
        match tokio::time::timeout(self.deadline, call).await {
            Ok(result) => result,
            Err(_elapsed) => Err(StorageError::Unavailable(format!(
                "{action}: no answer from databases.{database} within {deadline} \
                 (databases.{database}.acquire_timeout + statement_timeout)",
                database = self.database,
                deadline = humantime::format_duration(self.deadline),
            ))),
        }
    }

    /// [`Timed::within`] [`DDL_DEADLINE`] instead: the database runs DDL without its
    /// statement limit.
    async fn within_ddl<T>(
        &self,
        call: impl Future<Output = StorageResult<T>>,
    ) -> StorageResult<T> {
        match tokio::time::timeout(DDL_DEADLINE.max(self.deadline), call).await {
            Ok(result) => result,
            Err(_elapsed) => Err(StorageError::Unavailable(format!(
                "create schema: no answer from databases.{} within {}",
                self.database,
                humantime::format_duration(DDL_DEADLINE.max(self.deadline)),
            ))),
        }
    }
}

#[async_trait]
impl Storage for Timed {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    fn table_name(&self) -> &str {
        self.inner.table_name()
    }

    #[tracing::instrument(
        name = "storage.claim",
        skip_all,
        fields(table = self.inner.table_name(), owner = request.owner, batch_size = request.batch_size),
    )]
    async fn claim(&self, request: ClaimRequest<'_>) -> StorageResult<Claimed> {
        self.within("claim", self.inner.claim(request)).await
    }

    #[tracing::instrument(
        name = "storage.claim_ahead",
        skip_all,
        fields(table = self.inner.table_name(), owner = request.owner, batch_size = request.batch_size),
    )]
    async fn claim_ahead(
        &self,
        request: ClaimRequest<'_>,
        held: &HeldKeys,
    ) -> StorageResult<Claimed> {
        self.within("claim", self.inner.claim_ahead(request, held))
            .await
    }

    async fn held_attempts(
        &self,
        ids: &SortedIds,
        owner: &str,
    ) -> StorageResult<Vec<(MessageId, u32)>> {
        self.within("held_attempts", self.inner.held_attempts(ids, owner))
            .await
    }

    async fn ack(&self, ids: &SortedIds, owner: &str) -> StorageResult<SortedIds> {
        self.within("ack", self.inner.ack(ids, owner)).await
    }

    #[tracing::instrument(
        name = "storage.nack",
        skip_all,
        fields(table = self.inner.table_name(), owner, nacks = nacks.len()),
    )]
    async fn nack_many(
        &self,
        nacks: &[NackRequest<'_>],
        owner: &str,
        policy: &dyn RetryPolicy,
    ) -> StorageResult<Vec<NackResult>> {
        self.within("nack", self.inner.nack_many(nacks, owner, policy))
            .await
    }

    async fn release(
        &self,
        ids: &SortedIds,
        owner: &str,
        delay: Duration,
    ) -> StorageResult<SortedIds> {
        self.within("release", self.inner.release(ids, owner, delay))
            .await
    }

    async fn dead_letter(&self, id: MessageId, owner: &str, error: &str) -> StorageResult<bool> {
        self.within("dead-letter", self.inner.dead_letter(id, owner, error))
            .await
    }

    async fn extend_lease(
        &self,
        ids: &SortedIds,
        owner: &str,
        lease: Duration,
    ) -> StorageResult<Extended> {
        self.within("extend lease", self.inner.extend_lease(ids, owner, lease))
            .await
    }

    async fn return_leases(&self, ids: &SortedIds, owner: &str) -> StorageResult<u64> {
        self.within("return leases", self.inner.return_leases(ids, owner))
            .await
    }

    async fn stats(&self) -> StorageResult<Stats> {
        self.within("stats", self.inner.stats()).await
    }

    async fn delivered_within(&self, window: Duration) -> StorageResult<Option<u64>> {
        self.within("delivered rows", self.inner.delivered_within(window))
            .await
    }

    /// Bounded like every call: a purge of a long history that reaches the deadline has
    /// deleted its first batches, and the next purge goes on from there.
    #[tracing::instrument(name = "storage.purge", skip_all, fields(table = self.inner.table_name()))]
    async fn purge(&self, older_than: Duration) -> StorageResult<u64> {
        self.within("purge", self.inner.purge(older_than)).await
    }

    fn schema_sql(&self) -> String {
        self.inner.schema_sql()
    }

    #[tracing::instrument(name = "storage.ensure_table", skip_all, fields(table = self.inner.table_name()))]
    async fn ensure_table(&self) -> StorageResult<()> {
        self.within_ddl(self.inner.ensure_table()).await
    }

    async fn verify_table(&self) -> StorageResult<()> {
        self.within("check table", self.inner.verify_table()).await
    }

    async fn list_dead(
        &self,
        filter: &DeadFilter,
        after_id: MessageId,
        limit: u32,
    ) -> StorageResult<Vec<DeadLetter>> {
        let call = self.inner.list_dead(filter, after_id, limit);
        self.within("list dead letters", call).await
    }

    async fn count_dead(&self, filter: &DeadFilter) -> StorageResult<DeadCounts> {
        self.within("count dead letters", self.inner.count_dead(filter))
            .await
    }

    #[tracing::instrument(name = "storage.redrive", skip_all, fields(table = self.inner.table_name(), limit))]
    async fn redrive_dead(
        &self,
        filter: &DeadFilter,
        limit: u32,
        delay: Duration,
    ) -> StorageResult<SortedIds> {
        let call = self.inner.redrive_dead(filter, limit, delay);
        self.within("re-drive dead letters", call).await
    }

    #[tracing::instrument(name = "storage.discard", skip_all, fields(table = self.inner.table_name(), limit))]
    async fn discard_dead(&self, filter: &DeadFilter, limit: u32) -> StorageResult<SortedIds> {
        let call = self.inner.discard_dead(filter, limit);
        self.within("discard dead letters", call).await
    }

    async fn blocked_keys(
        &self,
        after_id: MessageId,
        limit: u32,
    ) -> StorageResult<Vec<BlockedKey>> {
        self.within("blocked keys", self.inner.blocked_keys(after_id, limit))
            .await
    }

    async fn lease_holders(&self) -> StorageResult<Vec<LeaseHolder>> {
        self.within("lease holders", self.inner.lease_holders())
            .await
    }

    async fn pauses(&self) -> StorageResult<Pauses> {
        self.within("pauses", self.inner.pauses()).await
    }

    async fn set_paused(&self, topics: &[String], paused: bool) -> StorageResult<Pauses> {
        self.within("pause", self.inner.set_paused(topics, paused))
            .await
    }

    async fn insert(&self, message: NewMessage) -> StorageResult<MessageId> {
        self.within("insert", self.inner.insert(message)).await
    }

    fn insert_signal(&self) -> Option<watch::Receiver<Inserts>> {
        self.inner.insert_signal()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::fake::{FakeStorage, Op};

    #[tokio::test(start_paused = true)]
    async fn a_call_past_the_deadline_is_unavailable_and_names_the_settings() {
        let fake = FakeStorage::new(false);
        fake.hold(Op::Claim);
        fake.add(None);
        let timeouts = Timeouts {
            acquire: Duration::from_secs(1),
            statement: Duration::from_secs(2),
        };
        let timed = Timed::new(fake, "main", timeouts);
        let started = tokio::time::Instant::now();
        let error = timed.claim(request()).await.unwrap_err();
        assert_eq!(started.elapsed(), Duration::from_secs(3));
        let StorageError::Unavailable(message) = error else {
            panic!("not unavailable: {error}");
        };
        assert!(
            message.contains("claim: no answer from databases.main within 3s")
                && message.contains("databases.main.acquire_timeout + statement_timeout"),
            "{message}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_within_the_deadline_is_the_inner_storage_answer() {
        let fake = FakeStorage::new(false);
        let id = fake.add(None);
        let timed = Timed::new(fake, "main", Timeouts::default());
        let claimed = timed.claim(request()).await.unwrap();
        assert_eq!(claimed.messages[0].id, id);
    }

    fn request() -> ClaimRequest<'static> {
        ClaimRequest {
            owner: "w",
            batch_size: 1,
            lease: Duration::from_secs(30),
            topics: &[],
            paused_topics: &[],
            max_attempts: 5,
        }
    }
}
