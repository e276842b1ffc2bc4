//! The [`GroupStore`](super::GroupStore) impl every SQL group store shares (see the
//! macro's doc).

/// The [`GroupStore`](super::GroupStore) impl of a backend's group store whose inherent
/// methods (one file each per concern) do the work: each of the trait's methods calls the
/// inherent one of the same name, which Rust picks before the trait's. The inherent
/// methods take a call's arguments grouped by what they are about (`OutboxGroups`,
/// `Lease`, `Member`, `Holds`, `Page`, `DeadRows`, in `storage/groups.rs`), built here
/// from the trait's. Written once, since every backend's store answers the same calls the
/// same way; so is what the trait promises on top of a backend's answer: a seek with
/// `dry_run` is only planned, a pause returns the pauses after it.
macro_rules! group_store_calls {
    ($store:ty) => {
        // Each call below must find the inherent method: were one missing, it would find
        // the trait's own and call itself forever. Named here by path, where the trait is
        // not in scope, a missing one does not compile.
        const _: () = {
            let _ = (
                <$store>::schema_sql,
                <$store>::ensure,
                <$store>::heartbeat,
                <$store>::acquire,
                <$store>::release,
                <$store>::leave,
                <$store>::flush,
                <$store>::read,
                <$store>::load_state,
                <$store>::fetch,
                <$store>::plan_seek,
                <$store>::move_to,
                <$store>::purge,
                <$store>::stats,
                <$store>::blocked_keys_of,
                <$store>::paused_groups,
                <$store>::set_group_paused,
                <$store>::frontier_delay,
                <$store>::list_dead,
                <$store>::change_dead,
            );
        };
        #[async_trait::async_trait]
        impl $crate::storage::groups::GroupStore for $store {
            fn schema_sql(&self) -> String {
                self.schema_sql()
            }

            async fn ensure(
                &self,
                groups: &[(String, $crate::config::GroupStart)],
                partitions: u32,
                create: bool,
            ) -> $crate::storage::StorageResult<()> {
                let outbox = $crate::storage::groups::OutboxGroups { groups, partitions };
                self.ensure(outbox, create).await
            }

            async fn heartbeat(
                &self,
                group: &str,
                member: &str,
                lease: std::time::Duration,
            ) -> $crate::storage::StorageResult<$crate::storage::groups::Heartbeat> {
                let member = $crate::storage::groups::Member { group, id: member };
                self.heartbeat($crate::storage::groups::Lease {
                    member,
                    duration: lease,
                })
                .await
            }

            async fn acquire(
                &self,
                group: &str,
                member: &str,
                partition: u32,
                lease: std::time::Duration,
            ) -> $crate::storage::StorageResult<Option<$crate::storage::groups::PartitionLease>>
            {
                let member = $crate::storage::groups::Member { group, id: member };
                let lease = $crate::storage::groups::Lease {
                    member,
                    duration: lease,
                };
                self.acquire(lease, partition).await
            }

            async fn release(
                &self,
                group: &str,
                member: &str,
                partitions: &[u32],
            ) -> $crate::storage::StorageResult<()> {
                let member = $crate::storage::groups::Member { group, id: member };
                self.release(member, partitions).await
            }

            async fn leave(&self, group: &str, member: &str) -> $crate::storage::StorageResult<()> {
                self.leave($crate::storage::groups::Member { group, id: member })
                    .await
            }

            async fn flush(
                &self,
                group: &str,
                member: &str,
                flushes: &[$crate::storage::groups::Flush],
            ) -> $crate::storage::StorageResult<Vec<u32>> {
                let member = $crate::storage::groups::Member { group, id: member };
                self.flush(member, flushes).await
            }

            async fn read(
                &self,
                cursors: &[(u32, $crate::storage::groups::Position)],
                limit: u32,
            ) -> $crate::storage::StorageResult<$crate::storage::groups::Read> {
                self.read(cursors, limit).await
            }

            async fn load_state(
                &self,
                group: &str,
                partition: u32,
            ) -> $crate::storage::StorageResult<Vec<$crate::storage::groups::StateRow>> {
                self.load_state(group, partition).await
            }

            async fn fetch(
                &self,
                ids: &[$crate::storage::MessageId],
            ) -> $crate::storage::StorageResult<Vec<$crate::storage::groups::GroupRow>> {
                self.fetch(ids).await
            }

            async fn seek(
                &self,
                group: &str,
                target: $crate::storage::groups::SeekTarget,
                dry_run: bool,
            ) -> $crate::storage::StorageResult<$crate::storage::groups::SeekOutcome> {
                let (outcome, to) = self.plan_seek(group, target).await?;
                if !dry_run {
                    self.move_to(group, to).await?;
                }
                Ok(outcome)
            }

            async fn purge(
                &self,
                retention: std::time::Duration,
            ) -> $crate::storage::StorageResult<u64> {
                self.purge(retention).await
            }

            async fn stats(
                &self,
                group: &str,
                dead_holds_key: bool,
            ) -> $crate::storage::StorageResult<$crate::storage::groups::GroupStats> {
                self.stats($crate::storage::groups::Holds {
                    group,
                    dead_holds_key,
                })
                .await
            }

            async fn blocked_keys(
                &self,
                group: &str,
                dead_holds_key: bool,
                after_id: $crate::storage::MessageId,
                limit: u32,
            ) -> $crate::storage::StorageResult<Vec<$crate::storage::BlockedKey>> {
                let holds = $crate::storage::groups::Holds {
                    group,
                    dead_holds_key,
                };
                let page = $crate::storage::groups::Page { after_id, limit };
                self.blocked_keys_of(holds, page).await
            }

            async fn paused(
                &self,
            ) -> $crate::storage::StorageResult<
                std::collections::BTreeMap<String, chrono::DateTime<chrono::Utc>>,
            > {
                self.paused_groups().await
            }

            async fn set_paused(
                &self,
                group: &str,
                paused: bool,
            ) -> $crate::storage::StorageResult<
                std::collections::BTreeMap<String, chrono::DateTime<chrono::Utc>>,
            > {
                self.set_group_paused(group, paused).await?;
                self.paused_groups().await
            }

            async fn frontier_delay(&self) -> $crate::storage::StorageResult<std::time::Duration> {
                self.frontier_delay().await
            }

            async fn list_dead(
                &self,
                group: &str,
                after_id: $crate::storage::MessageId,
                limit: u32,
            ) -> $crate::storage::StorageResult<Vec<$crate::storage::groups::GroupDead>> {
                self.list_dead(group, $crate::storage::groups::Page { after_id, limit })
                    .await
            }

            async fn change_dead(
                &self,
                rows: $crate::storage::groups::DeadRows<'_>,
                change: $crate::storage::groups::DeadChange,
            ) -> $crate::storage::StorageResult<Vec<$crate::storage::MessageId>> {
                self.change_dead(rows, change).await
            }
        }
    };
}
pub(crate) use group_store_calls;
