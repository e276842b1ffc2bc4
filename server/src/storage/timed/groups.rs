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
    DeadChange, DeadRows, Flush, GroupDead, GroupStats, GroupStore, Heartbeat, PartitionLease,
    Position, Read, SeekOutcome, SeekTarget, StateRow,
};
use crate::storage::{BlockedKey, MessageId, StorageResult};

impl Timed<dyn GroupStore> {
    pub fn groups(inner: Arc<dyn GroupStore>, database: &str, timeouts: super::Timeouts) -> Self {
        Self::around(inner, database, timeouts)
    }
}

#[async_trait]
impl GroupStore for Timed<dyn GroupStore> {
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

    async fn heartbeat(
        &self,
        group: &str,
        member: &str,
        lease: Duration,
    ) -> StorageResult<Heartbeat> {
        let call = self.inner.heartbeat(group, member, lease);
        self.within("group heartbeat", call).await
    }

    async fn acquire(
        &self,
        group: &str,
        member: &str,
        partition: u32,
        lease: Duration,
    ) -> StorageResult<Option<PartitionLease>> {
        let call = self.inner.acquire(group, member, partition, lease);
        self.within("take group partition", call).await
    }

    async fn release(&self, group: &str, member: &str, partitions: &[u32]) -> StorageResult<()> {
        let call = self.inner.release(group, member, partitions);
        self.within("give up group partitions", call).await
    }

    async fn leave(&self, group: &str, member: &str) -> StorageResult<()> {
        self.within("leave group", self.inner.leave(group, member))
            .await
    }

    async fn flush(&self, group: &str, member: &str, flushes: &[Flush]) -> StorageResult<Vec<u32>> {
        let call = self.inner.flush(group, member, flushes);
        self.within("group flush", call).await
    }

    async fn read(&self, cursors: &[(u32, Position)], limit: u32) -> StorageResult<Read> {
        self.within("group read", self.inner.read(cursors, limit))
            .await
    }

    async fn load_state(&self, group: &str, partition: u32) -> StorageResult<Vec<StateRow>> {
        let call = self.inner.load_state(group, partition);
        self.within("group state", call).await
    }

    async fn fetch(
        &self,
        ids: &[MessageId],
    ) -> StorageResult<Vec<crate::storage::groups::GroupRow>> {
        self.within("group fetch", self.inner.fetch(ids)).await
    }

    async fn seek(
        &self,
        group: &str,
        target: SeekTarget,
        dry_run: bool,
    ) -> StorageResult<SeekOutcome> {
        let call = self.inner.seek(group, target, dry_run);
        self.within("seek group", call).await
    }

    /// Bounded like every call: a purge cut short has deleted its first batches, and the
    /// next one goes on from there.
    async fn purge(&self, retention: Duration) -> StorageResult<u64> {
        self.within("purge passed rows", self.inner.purge(retention))
            .await
    }

    async fn stats(&self, group: &str, dead_holds_key: bool) -> StorageResult<GroupStats> {
        let call = self.inner.stats(group, dead_holds_key);
        self.within("group stats", call).await
    }

    async fn blocked_keys(
        &self,
        group: &str,
        dead_holds_key: bool,
        after_id: MessageId,
        limit: u32,
    ) -> StorageResult<Vec<BlockedKey>> {
        let call = self
            .inner
            .blocked_keys(group, dead_holds_key, after_id, limit);
        self.within("group blocked keys", call).await
    }

    async fn paused(&self) -> StorageResult<BTreeMap<String, DateTime<Utc>>> {
        self.within("group pauses", self.inner.paused()).await
    }

    async fn set_paused(
        &self,
        group: &str,
        paused: bool,
    ) -> StorageResult<BTreeMap<String, DateTime<Utc>>> {
        let call = self.inner.set_paused(group, paused);
        self.within("pause group", call).await
    }

    async fn frontier_delay(&self) -> StorageResult<Duration> {
        self.within("frontier delay", self.inner.frontier_delay())
            .await
    }

    async fn list_dead(
        &self,
        group: &str,
        after_id: MessageId,
        limit: u32,
    ) -> StorageResult<Vec<GroupDead>> {
        let call = self.inner.list_dead(group, after_id, limit);
        self.within("list group dead letters", call).await
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
