//! Where a non-strict claim starts its walk of the pending rows, so a drain does not pay
//! for the rows it already handed out.
//!
//! The non-strict claim walks the pending index (`(id) WHERE status = 'pending'`) in id
//! order. Without a starting point every claim begins at the lowest pending id and passes
//! (a) every row still leased, fetching each from the heap to see that its `available_at`
//! is in the future (window 200 × 4 streams: 800 rows per claim of 100), and (b) the index
//! entries the acks left behind: an ack changes `status`, so it is not a HOT update, and
//! the old entry stays in the pending index until a vacuum; PostgreSQL marks it dead on
//! the first visit, and every later claim still reads the leaf pages they fill. `EXPLAIN
//! (ANALYZE, BUFFERS)` of one claim of 100 in such a table (BENCHMARKS.md):
//! 800 rows removed by the filter and 135 buffers in the index scan, against 0 and 11
//! from the floor.
//!
//! So a claim first takes the rows above the floor, the highest id this server's claims
//! reached, and only when fewer than its batch are free there, the rows below it, in the
//! same statement (`claim.rs`). Every id is in one part or the other, so a claimable row
//! is never missed while the batch has room; what the floor changes is only which rows
//! come first while rows above it fill every batch. A row can become due below the floor
//! (a release or a nack's retry, a lease that ran out, another server's rows, a producer
//! whose lower id commits after a higher one was claimed): it is taken by the first claim
//! that starts at the bottom, which is
//! - the next claim after this server gave rows back (release, nack, a stream's end, an
//!   operator's re-drive of dead rows), or once their retry or release delay is over
//!   ([`ClaimFloor::rescan_at`]);
//! - any claim that finds fewer free rows above the floor than its batch;
//! - at the latest, the first claim [`FULL_SCAN_INTERVAL`] after the last one that started
//!   at the bottom.
//!
//! A row due below the floor waits at most that interval longer than it would without
//! one; that is the only ordering given up (docs/guarantees.md, point 1). Claims with a topic
//! filter (or with paused topics) start at the bottom: the rows another filter claimed
//! say nothing about theirs.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::storage::MessageId;

/// The longest a claim without a topic filter goes on starting at the floor: rows that
/// became due below it are claimed at most this much later than without it. One claim in
/// this interval walks the leased rows again, a few hundred microseconds.
pub(super) const FULL_SCAN_INTERVAL: Duration = Duration::from_secs(1);

/// The floor of one table on this server (see the module docs); shared by its streams.
#[derive(Debug)]
pub(super) struct ClaimFloor(Mutex<Floor>);

#[derive(Debug)]
struct Floor {
    /// The highest id a claim reached; `None` until a claim took a row.
    id: Option<MessageId>,
    /// When a claim starts at the bottom again.
    full_scan_at: Instant,
}

/// Where one claim starts; hand it back to [`ClaimFloor::claimed`] with what it took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Start {
    /// At the lowest pending id (every row in id order, as without a floor).
    Bottom,
    /// Rows above this id first, then the ones at or below it.
    Above(MessageId),
}

impl Start {
    /// The claim's `$5`: rows above it are taken first. At the bottom, every id is above.
    pub fn bound(self) -> MessageId {
        match self {
            Self::Bottom => MessageId::MIN,
            Self::Above(id) => id,
        }
    }
}

impl ClaimFloor {
    /// A floor whose first claim starts at the bottom.
    pub fn new(now: Instant) -> Self {
        Self(Mutex::new(Floor {
            id: None,
            full_scan_at: now,
        }))
    }

    /// Where a claim starting `now` begins: at the bottom when no claim reached anywhere
    /// yet or a scan from the bottom is due (the next one is then due an interval later).
    pub fn start(&self, now: Instant) -> Start {
        let mut floor = self.lock();
        match floor.id {
            Some(id) if now < floor.full_scan_at => Start::Above(id),
            _ => {
                floor.full_scan_at = now + FULL_SCAN_INTERVAL;
                Start::Bottom
            }
        }
    }

    /// A claim that began at `start` took rows up to `highest` (`None`: no row). From
    /// the bottom, it saw every free row, so its highest is where the next one begins;
    /// from the floor, the floor only rises (a concurrent claim may have raised it).
    pub fn claimed(&self, start: Start, highest: Option<MessageId>) {
        let Some(highest) = highest else { return };
        let mut floor = self.lock();
        floor.id = match (start, floor.id) {
            (Start::Above(_), Some(id)) => Some(id.max(highest)),
            _ => Some(highest),
        };
    }

    /// Rows this server gave back become claimable at `at`: the first claim from then on
    /// starts at the bottom, so they are not passed by newer rows.
    pub fn rescan_at(&self, at: Instant) {
        let mut floor = self.lock();
        floor.full_scan_at = floor.full_scan_at.min(at);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Floor> {
        // The state is two plain values, valid after any panic between writes.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    #[test]
    fn the_first_claim_starts_at_the_bottom_and_the_next_above_what_it_took() {
        let now = Instant::now();
        let floor = ClaimFloor::new(now);
        assert_eq!(floor.start(now), Start::Bottom);
        floor.claimed(Start::Bottom, Some(100));
        assert_eq!(floor.start(now), Start::Above(100));
    }

    #[test]
    fn a_claim_that_took_nothing_leaves_the_floor_where_it_was() {
        let now = Instant::now();
        let floor = ClaimFloor::new(now);
        assert_eq!(floor.start(now), Start::Bottom);
        floor.claimed(Start::Bottom, None);
        assert_eq!(floor.start(now), Start::Bottom, "no row reached yet");
        floor.claimed(Start::Bottom, Some(7));
        floor.claimed(Start::Above(7), None);
        assert_eq!(floor.start(now), Start::Above(7));
    }

    #[test]
    fn claims_from_the_floor_only_raise_it() {
        let now = Instant::now();
        let floor = ClaimFloor::new(now);
        floor.start(now);
        floor.claimed(Start::Bottom, Some(100));
        // Two claims began at 100; the one that took 101-200 finished first.
        floor.claimed(Start::Above(100), Some(200));
        floor.claimed(Start::Above(100), Some(150));
        assert_eq!(floor.start(now), Start::Above(200));
        // One that took only rows given back below the floor does not lower it.
        floor.claimed(Start::Above(200), Some(3));
        assert_eq!(floor.start(now), Start::Above(200));
    }

    #[test]
    fn a_claim_from_the_bottom_sets_the_floor_to_what_it_reached() {
        let now = Instant::now();
        let floor = ClaimFloor::new(now);
        floor.start(now);
        floor.claimed(Start::Bottom, Some(500));
        floor.rescan_at(now);
        assert_eq!(floor.start(now), Start::Bottom);
        // Rows given back low down: the walk goes on from there, over the leased rows once.
        floor.claimed(Start::Bottom, Some(40));
        assert_eq!(floor.start(now), Start::Above(40));
    }

    #[test]
    fn claims_start_at_the_bottom_again_once_an_interval_passed() {
        let now = Instant::now();
        let floor = ClaimFloor::new(now);
        assert_eq!(floor.start(now), Start::Bottom);
        floor.claimed(Start::Bottom, Some(100));
        let almost = now + FULL_SCAN_INTERVAL - Duration::from_millis(1);
        assert_eq!(floor.start(almost), Start::Above(100));
        let due = now + FULL_SCAN_INTERVAL;
        assert_eq!(floor.start(due), Start::Bottom);
        assert_eq!(
            floor.start(due),
            Start::Above(100),
            "one claim from the bottom"
        );
        assert_eq!(floor.start(due + FULL_SCAN_INTERVAL), Start::Bottom);
    }

    #[test]
    fn rows_given_back_bring_the_next_scan_from_the_bottom_forward_never_back() {
        let now = Instant::now();
        let floor = ClaimFloor::new(now);
        floor.start(now);
        floor.claimed(Start::Bottom, Some(100));
        // A nack whose retry is due in 300 ms.
        floor.rescan_at(now + SECOND * 3 / 10);
        assert_eq!(floor.start(now + SECOND / 10), Start::Above(100));
        assert_eq!(floor.start(now + SECOND * 3 / 10), Start::Bottom);
        // A later time than the scan already due does not postpone it.
        floor.rescan_at(now + SECOND * 3 / 10 + FULL_SCAN_INTERVAL * 5);
        let next = now + SECOND * 3 / 10 + FULL_SCAN_INTERVAL;
        assert_eq!(floor.start(next), Start::Bottom);
        // A release without delay: the very next claim.
        floor.rescan_at(next);
        assert_eq!(floor.start(next), Start::Bottom);
    }

    #[test]
    fn the_bound_of_the_bottom_is_below_every_id() {
        assert_eq!(Start::Bottom.bound(), MessageId::MIN);
        assert_eq!(Start::Above(42).bound(), 42);
    }
}
