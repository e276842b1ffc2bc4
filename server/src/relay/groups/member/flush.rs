//! What a member writes at a flush, what it does when the write commits or fails, and
//! when a partition handed over is quiet enough to give up.

use super::{Member, Part};
use crate::storage::groups::{Flush, StateRow};
use crate::storage::MessageId;

impl Member {
    /// Whether the next flush has anything to write or check.
    pub fn has_writes(&self) -> bool {
        !self.touched.is_empty()
            || self
                .parts
                .values()
                .any(|p| !p.upserts.is_empty() || !p.deletes.is_empty() || p.position_would_move())
    }

    /// The writes of every partition with something to write; clears them.
    pub fn take_flushes(&mut self) -> Vec<Flush> {
        let mut flushes = Vec::new();
        let touched = std::mem::take(&mut self.touched);
        for (partition, part) in &mut self.parts {
            if let Some(settled) = part.settled_position() {
                part.settled = part.settled.max(settled);
                let passed = part.settled;
                part.settled_ahead.retain(|p| *p > passed);
            }
            let position = (part.settled > part.committed).then_some(part.settled);
            if position.is_none()
                && part.upserts.is_empty()
                && part.deletes.is_empty()
                && !touched.contains(partition)
            {
                continue;
            }
            flushes.push(Flush {
                partition: *partition,
                epoch: part.epoch,
                position,
                upserts: std::mem::take(&mut part.upserts),
                deletes: std::mem::take(&mut part.deletes),
            });
        }
        flushes
    }

    /// Records what a flush committed (the partitions it found moved are lost already).
    pub fn flushed(&mut self, flushes: &[Flush]) {
        for flush in flushes {
            if let (Some(part), Some(position)) =
                (self.parts.get_mut(&flush.partition), flush.position)
            {
                if part.epoch == flush.epoch {
                    part.committed = part.committed.max(position);
                }
            }
        }
    }

    /// Takes back the writes of a flush that failed, so the next one (the stream's last,
    /// if the failure ends it) carries them again: a position moved in memory only would
    /// let the partition's next owner read from the old one and deliver acked rows again.
    /// Writes made since for the same row win.
    pub fn unflushed(&mut self, flushes: Vec<Flush>) {
        for flush in flushes {
            let Some(part) = self.parts.get_mut(&flush.partition) else {
                continue;
            };
            if part.epoch != flush.epoch {
                continue;
            }
            let newer = |id: MessageId, part: &Part| {
                part.upserts.iter().any(|r| r.id == id) || part.deletes.contains(&id)
            };
            let mut upserts: Vec<StateRow> = flush
                .upserts
                .into_iter()
                .filter(|r| !newer(r.id, part))
                .collect();
            let mut deletes: Vec<MessageId> = flush
                .deletes
                .into_iter()
                .filter(|id| !newer(*id, part))
                .collect();
            upserts.append(&mut part.upserts);
            deletes.append(&mut part.deletes);
            part.upserts = upserts;
            part.deletes = deletes;
            self.touched.insert(flush.partition);
        }
    }

    /// Partitions marked leaving with nothing in flight and nothing to write, whose
    /// written position passed every row taken from their queue. An ack applied since the
    /// last flush moved the position in memory only, and a row still queued before an
    /// acked one holds the position before both: released so, the partition's next owner
    /// would read from the old position and deliver the acked rows again.
    pub fn quiet_leaving(&self) -> Vec<u32> {
        self.parts
            .iter()
            .filter(|(n, p)| {
                p.leaving
                    && p.upserts.is_empty()
                    && p.deletes.is_empty()
                    && p.open.is_empty()
                    && !p.position_would_move()
                    && !self.flights.values().any(|f| f.partition == **n)
            })
            .map(|(n, _)| *n)
            .collect()
    }
}
