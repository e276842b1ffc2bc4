//! The deadline of [`Timed`] on the group tables: a group's reads, heartbeats and flushes
//! and the admin calls of groups meet a silent database like the per-row calls do, with
//! the same [`StorageError::Unavailable`] naming the same settings.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::Timed;
use crate::config::GroupStart;
use crate::storage::groups::{
    DeadChange, DeadRows, Flush, GroupDead, GroupRow, GroupStats, GroupStore, Heartbeat,
    PartitionLease, Position, Read, SeekOutcome, SeekTarget, StateRow,
};
use crate::storage::{BlockedKey, MessageId, StorageResult};

impl Timed<dyn GroupStore> {
    pub fn groups(inner: Arc<dyn GroupStore>, database: &str, timeouts: super::Timeouts) -> Self {
        Self::around(inner, database, timeouts)
    }
}

/// The [`GroupStore`] impl of [`Timed`], written as a table like the per-row store's:
/// each `name(arguments) -> T, "action";` runs the inner store's call of that name within
/// the deadline, a timeout naming `action`. The calls bounded otherwise, or not at all,
/// come first, in braces, as written.
macro_rules! timed_groups {
    (
        { $($other:item)* }
        $( $name:ident($($arg:ident: $ty:ty),*) -> $out:ty, $action:literal; )*
    ) => {
        #[async_trait]
        impl GroupStore for Timed<dyn GroupStore> {
            $($other)*
            $(
                async fn $name(&self, $($arg: $ty),*) -> StorageResult<$out> {
                    self.within($action, self.inner.$name($($arg),*)).await
                }
            )*
        }
    };
}

timed_groups! {
    {
        fn schema_sql(&self) -> String {
            self.inner.schema_sql()
        }

        /// DDL: adding the log-order column and its index may rewrite a large table.
        async fn ensure(
            &self,
            groups: &[(String, GroupStart)],
            partitions: u32,
            create: bool,
        ) -> StorageResult<()> {
            self.within_ddl(self.inner.ensure(groups, partitions, create))
                .await
        }

        async fn change_dead(
            &self,
            rows: DeadRows<'_>,
            change: DeadChange,
        ) -> StorageResult<Vec<MessageId>> {
            let action = match change {
                DeadChange::Redrive => "re-drive group dead letters",
                DeadChange::Discard => "discard group dead letters",
            };
            self.within(action, self.inner.change_dead(rows, change))
                .await
        }
    }
    heartbeat(group: &str, member: &str, lease: Duration) -> Heartbeat, "group heartbeat";
    acquire(group: &str, member: &str, partition: u32, lease: Duration)
        -> Option<PartitionLease>, "take group partition";
    release(group: &str, member: &str, partitions: &[u32]) -> (), "give up group partitions";
    leave(group: &str, member: &str) -> (), "leave group";
    flush(group: &str, member: &str, flushes: &[Flush]) -> Vec<u32>, "group flush";
    read(cursors: &[(u32, Position)], limit: u32) -> Read, "group read";
    load_state(group: &str, partition: u32) -> Vec<StateRow>, "group state";
    fetch(ids: &[MessageId]) -> Vec<GroupRow>, "group fetch";
    seek(group: &str, target: SeekTarget, dry_run: bool) -> SeekOutcome, "seek group";
    // Bounded like every call: a purge cut short has deleted its first batches, and the
    // next one goes on from there.
    purge(retention: Duration) -> u64, "purge passed rows";
    stats(group: &str, dead_holds_key: bool) -> GroupStats, "group stats";
    blocked_keys(group: &str, dead_holds_key: bool, after_id: MessageId, limit: u32)
        -> Vec<BlockedKey>, "group blocked keys";
    paused() -> BTreeMap<String, DateTime<Utc>>, "group pauses";
    set_paused(group: &str, paused: bool) -> BTreeMap<String, DateTime<Utc>>, "pause group";
    frontier_delay() -> Duration, "frontier delay";
    list_dead(group: &str, after_id: MessageId, limit: u32)
        -> Vec<GroupDead>, "list group dead letters";
}
