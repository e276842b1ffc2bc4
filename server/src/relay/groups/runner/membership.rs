//! A stream's membership of its group: heartbeats that renew it and say which partitions
//! are its own, the hand-over of those that are not, and leaving when the stream ends.

use std::sync::Arc;

use chrono::Utc;
use tokio::time::Instant;

use super::{Runner, HANDOVER_HEARTBEAT};
use crate::relay::subscription::Event;
use crate::storage::{MessageId, StorageError};

/// The share of a partition's lease, counted from the start of the call that renewed it,
/// during which its owner sends its rows: a member whose heartbeats fail stops sending
/// before the database lets another member take the partition.
const LEASE_USED: f64 = 0.9;

impl Runner {
    /// Renews membership and partitions, lets go of what is handed over, takes what is
    /// assigned and free.
    pub(super) async fn heartbeat(&mut self) -> Result<(), StorageError> {
        let store = Arc::clone(&self.groups.store);
        let lease = self.partition_lease();
        let sent = Instant::now();
        let beat = store.heartbeat(&self.group, &self.member_id, lease).await?;
        self.next_heartbeat = Instant::now() + self.heartbeat_every();
        if !self.joined {
            // This stream's own wake-up is not marked seen: another stream may have joined
            // while this heartbeat ran, and the extra heartbeat it costs is cheap.
            self.joined = true;
            self.groups.membership_changed();
        }
        // Partitions another member took (our lease ran out, or a seek), or whose lease
        // ran out before this heartbeat could renew it (any member may take them): forget
        // them; one that is still free is taken again below, with a new epoch.
        let owned: Vec<u32> = self.member.parts.keys().copied().collect();
        for partition in owned {
            let still = beat.partitions.iter().any(|v| {
                v.partition == partition
                    && v.owner.as_deref() == Some(self.member_id.as_str())
                    && !v.expired
                    && Some(v.epoch) == self.member.parts.get(&partition).map(|p| p.epoch)
            });
            if !still {
                tracing::warn!(group = %self.group, member = %self.member_id, partition, "partition lost");
                let ids = self.member.lose(partition);
                if !ids.is_empty() {
                    self.send(Event::LeasesExpired(ids)).await;
                }
            }
        }
        for part in self.member.parts.values_mut() {
            part.lease_until = Some(sent + lease.mul_f64(LEASE_USED));
        }
        let members = beat.members;
        let member_id = self.member_id.clone();
        let me = members.iter().position(|m| *m == member_id);
        let assigned = |partition: u32| match me {
            Some(_) => members[partition as usize % members.len()] == member_id,
            None => false,
        };
        for (partition, part) in self.member.parts.iter_mut() {
            let leaving = !assigned(*partition) || self.draining_until.is_some();
            if leaving && !part.leaving {
                tracing::debug!(group = %self.group, member = %self.member_id, partition, "handing the partition over");
            }
            part.leaving = leaving;
        }
        self.release_quiet().await?;
        if self.draining_until.is_some() {
            return Ok(());
        }
        let mut waiting = false;
        for view in &beat.partitions {
            if !assigned(view.partition) || self.member.parts.contains_key(&view.partition) {
                continue;
            }
            if view.owner.is_some() && !view.expired {
                waiting = true;
                continue;
            }
            let sent = Instant::now();
            if let Some(taken) = store
                .acquire(&self.group, &self.member_id, view.partition, lease)
                .await?
            {
                let state = store.load_state(&self.group, view.partition).await?;
                tracing::debug!(group = %self.group, member = %self.member_id, partition = view.partition, epoch = taken.epoch, "partition taken");
                self.member.take(taken, state);
                if let Some(part) = self.member.parts.get_mut(&view.partition) {
                    part.lease_until = Some(sent + lease.mul_f64(LEASE_USED));
                }
            }
        }
        if waiting {
            self.next_heartbeat = Instant::now() + HANDOVER_HEARTBEAT.min(self.heartbeat_every());
        }
        Ok(())
    }

    /// Gives up the partitions being handed over that have gone quiet (nothing in flight,
    /// their last answers flushed), at once rather than at the next heartbeat: their next
    /// owner, which may be waiting with nothing else to do, only waits for that flush.
    /// The streams of this replica are woken to heartbeat, so one of them that is assigned
    /// a released partition takes it now.
    pub(super) async fn release_quiet(&mut self) -> Result<(), StorageError> {
        let quiet = self.member.quiet_leaving();
        if quiet.is_empty() {
            return Ok(());
        }
        self.groups
            .store
            .release(&self.group, &self.member_id, &quiet)
            .await?;
        for partition in quiet {
            self.member.parts.remove(&partition);
        }
        self.groups.membership_changed();
        Ok(())
    }

    /// However the stream ends: what it holds becomes retries due now, the positions are
    /// written, and its partitions are free for the others at once.
    pub(super) async fn give_back(&mut self) {
        let held: Vec<MessageId> = self.member.flights.keys().copied().collect();
        self.member.give_back(&held, Utc::now());
        if let Err(error) = self.flush().await {
            tracing::warn!(group = %self.group, member = %self.member_id, %error, "final group flush failed; the partitions' leases will run out");
        }
        if let Err(error) = self.groups.store.leave(&self.group, &self.member_id).await {
            tracing::warn!(group = %self.group, member = %self.member_id, %error, "leaving the group failed; its partitions free up when their lease runs out");
        }
        self.groups.membership_changed();
    }
}
