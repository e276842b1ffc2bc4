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
use crate::config::Timeouts;
use crate::storage::blocked::BlockedKey;

mod groups;

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

/// The [`Storage`] impl of [`Timed`], written as a table, since every call is bounded the
/// same way: each `name(arguments) -> T, "action";` runs the inner storage's call of that
/// name within the deadline, a timeout naming `action`. `[span "storage.x", fields]` above
/// a call opens a span of that name around it, with the table's name and those fields.
/// The calls bounded otherwise, or not at all, come first, in braces, as written.
macro_rules! timed_storage {
    (
        { $($other:item)* }
        $(
            $([span $span:literal $($field:tt)*])?
            $name:ident($($arg:ident: $ty:ty),*) -> $out:ty, $action:literal;
        )*
    ) => {
        #[async_trait]
        impl Storage for Timed {
            $($other)*
            $(
                $(#[tracing::instrument(
                    name = $span,
                    skip_all,
                    fields(table = self.inner.table_name() $($field)*),
                )])?
                async fn $name(&self, $($arg: $ty),*) -> StorageResult<$out> {
                    self.within($action, self.inner.$name($($arg),*)).await
                }
            )*
        }
    };
}

timed_storage! {
    {
        fn backend(&self) -> &'static str {
            self.inner.backend()
        }

        fn table_name(&self) -> &str {
            self.inner.table_name()
        }

        fn schema_sql(&self) -> String {
            self.inner.schema_sql()
        }

        #[tracing::instrument(
            name = "storage.ensure_table",
            skip_all,
            fields(table = self.inner.table_name()),
        )]
        async fn ensure_table(&self) -> StorageResult<()> {
            self.within_ddl(self.inner.ensure_table()).await
        }

        fn insert_signal(&self) -> Option<watch::Receiver<Inserts>> {
            self.inner.insert_signal()
        }
    }
    [span "storage.claim", owner = request.owner, batch_size = request.batch_size]
    claim(request: ClaimRequest<'_>) -> Claimed, "claim";
    [span "storage.claim_ahead", owner = request.owner, batch_size = request.batch_size]
    claim_ahead(request: ClaimRequest<'_>, held: &HeldKeys) -> Claimed, "claim";
    held_attempts(ids: &SortedIds, owner: &str) -> Vec<(MessageId, u32)>, "held_attempts";
    ack(ids: &SortedIds, owner: &str) -> SortedIds, "ack";
    [span "storage.nack", owner, nacks = nacks.len()]
    nack_many(nacks: &[NackRequest<'_>], owner: &str, policy: &dyn RetryPolicy)
        -> Vec<NackResult>, "nack";
    release(ids: &SortedIds, owner: &str, delay: Duration) -> SortedIds, "release";
    dead_letter(id: MessageId, owner: &str, error: &str) -> bool, "dead-letter";
    extend_lease(ids: &SortedIds, owner: &str, lease: Duration) -> Extended, "extend lease";
    return_leases(ids: &SortedIds, owner: &str) -> u64, "return leases";
    stats() -> Stats, "stats";
    delivered_within(window: Duration) -> Option<u64>, "delivered rows";
    // Bounded like every call: a purge of a long history that reaches the deadline has
    // deleted its first batches, and the next purge goes on from there.
    [span "storage.purge"]
    purge(older_than: Duration) -> u64, "purge";
    verify_table() -> (), "check table";
    list_dead(filter: &DeadFilter, after_id: MessageId, limit: u32)
        -> Vec<DeadLetter>, "list dead letters";
    count_dead(filter: &DeadFilter) -> DeadCounts, "count dead letters";
    [span "storage.redrive", limit]
    redrive_dead(filter: &DeadFilter, limit: u32, delay: Duration)
        -> SortedIds, "re-drive dead letters";
    [span "storage.discard", limit]
    discard_dead(filter: &DeadFilter, limit: u32) -> SortedIds, "discard dead letters";
    blocked_keys(after_id: MessageId, limit: u32) -> Vec<BlockedKey>, "blocked keys";
    lease_holders() -> Vec<LeaseHolder>, "lease holders";
    pauses() -> Pauses, "pauses";
    set_paused(topics: &[String], paused: bool) -> Pauses, "pause";
    insert(message: NewMessage) -> MessageId, "insert";
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
