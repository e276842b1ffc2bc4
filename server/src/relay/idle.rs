//! Idle polling shared by the streams of an outbox.
//!
//! Polling is the fallback for rows nobody announced: no `notify_channel`, a notification
//! lost while the listener reconnected, a retry time or a lease that ran out. If every
//! stream polled on its own, the idle cost would grow with the streams: 1,000 idle streams
//! backing off to a 5 s `poll.max` make 200 empty claims a second, each a strict claim
//! serialised on the table's advisory lock.
//!
//! A claim's result does not depend on who claims (a row is claimable or not, whoever
//! asks), so streams with the same topic filter learn the same thing from an empty claim,
//! and one poll can serve all of them. A [`PollGroup`] per (outbox, topic filter) keeps one
//! [`Poller`] schedule; when a poll is due its timer task hands the *turn* to one waiting
//! stream, which claims for itself (nothing is claimed on anyone's behalf) and reports the
//! outcome with [`PollGroup::record`]:
//! - nothing found: the group backs off, as a lone stream did;
//! - rows found (by any claim of any stream of the group): the schedule returns to
//!   `poll.min`;
//! - the turn's claim came back full: there is more than one batch waiting, so every
//!   waiting stream is woken through [`PollGroup::found`] (a counter, like the storage's
//!   insert signal) and claims at once.
//!
//! So the idle cost is one claim per poll interval per group, whatever the number of
//! streams, and a lone stream polls exactly as before: same waits, same resets. The
//! insert signal (NOTIFY) still wakes every stream directly; this only replaces the
//! per-stream timers. A stream that is not waiting (claiming, its window full, draining)
//! takes no turn; a turn nobody takes stays open for the next stream that waits.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::{watch, Notify};
use tokio::time::{sleep_until, Instant};
use tokio_util::sync::{CancellationToken, DropGuard};

use super::poller::Poller;
use crate::config::PollConfig;

/// The poll groups of one outbox, by topic filter.
pub struct IdlePolls {
    config: PollConfig,
    /// Weak: a group ends (and its timer task stops) when its last stream does.
    groups: Mutex<HashMap<Vec<String>, Weak<PollGroup>>>,
}

impl IdlePolls {
    pub fn new(config: PollConfig) -> Self {
        Self {
            config,
            groups: Mutex::new(HashMap::new()),
        }
    }

    /// The group of the streams filtering on `topics` (in any order; empty means every
    /// topic), started on first use. Needs a Tokio runtime.
    pub fn join(&self, topics: &[String]) -> Arc<PollGroup> {
        let mut filter = topics.to_vec();
        filter.sort();
        filter.dedup();
        let mut groups = self.groups.lock().expect("poll groups lock");
        groups.retain(|_, group| group.strong_count() > 0);
        if let Some(group) = groups.get(&filter).and_then(Weak::upgrade) {
            return group;
        }
        let group = Arc::new(PollGroup::start(self.config));
        groups.insert(filter, Arc::downgrade(&group));
        group
    }
}

/// The shared idle schedule of the streams with one topic filter. Each stream holds an
/// `Arc` of it; dropping the last stops its timer task.
pub struct PollGroup {
    shared: Arc<Shared>,
    _stop: DropGuard,
}

struct Shared {
    schedule: Mutex<Schedule>,
    /// Wakes one waiting stream when a poll is due.
    turn: Notify,
    /// Tells the timer task that `schedule.due` moved.
    rescheduled: Notify,
    /// Bumped when a poll found more than a batch: every waiting stream claims.
    found: watch::Sender<u64>,
}

struct Schedule {
    poller: Poller,
    /// When the next poll is due.
    due: Instant,
    /// A turn was handed out and no stream has taken it yet. A stream woken without an open
    /// turn (a stale wake-up, or one for a turn a found row made moot) keeps waiting.
    turn_open: bool,
}

impl PollGroup {
    fn start(config: PollConfig) -> Self {
        let mut poller = Poller::new(config);
        let due = Instant::now() + poller.idle();
        let shared = Arc::new(Shared {
            schedule: Mutex::new(Schedule {
                poller,
                due,
                turn_open: false,
            }),
            turn: Notify::new(),
            rescheduled: Notify::new(),
            found: watch::Sender::new(0),
        });
        let stop = CancellationToken::new();
        tokio::spawn(keep_time(Arc::clone(&shared), stop.clone()));
        Self {
            shared,
            _stop: stop.drop_guard(),
        }
    }

    /// Completes when this stream is to poll: claim, then [`PollGroup::record`] with
    /// `turn` true. Only a stream that will claim at once should wait here.
    pub async fn turn(&self) {
        loop {
            self.shared.turn.notified().await;
            let mut schedule = self.shared.lock();
            if schedule.turn_open {
                schedule.turn_open = false;
                return;
            }
        }
    }

    /// A counter that moves when a poll found more than one batch; a waiting stream that
    /// sees it move claims at once.
    pub fn found(&self) -> watch::Receiver<u64> {
        self.shared.found.subscribe()
    }

    /// What a claim of a stream of this group found: `got` rows of `asked`, in its turn
    /// (`turn`) or not (a full batch's follow-up, an insert signal, its own answers).
    pub fn record(&self, turn: bool, asked: usize, got: usize) {
        let now = Instant::now();
        {
            let mut schedule = self.shared.lock();
            if got > 0 {
                schedule.poller.busy();
                // A turn still open is moot: the next poll comes `poll.min` after this.
                schedule.turn_open = false;
            } else if !turn {
                // Someone else's empty claim (after a wake-up) does not move the schedule.
                return;
            }
            schedule.due = now + schedule.poller.idle();
        }
        self.shared.rescheduled.notify_one();
        if turn && got > 0 && got >= asked {
            self.shared.found.send_modify(|n| *n = n.wrapping_add(1));
        }
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Schedule> {
        self.schedule.lock().expect("poll schedule lock")
    }
}

/// Hands out a turn whenever a poll is due. Until the turn's claim reports, the next one
/// is due after the same wait: a turn nobody takes, or whose claim fails, is handed out
/// again rather than stalling the group.
async fn keep_time(shared: Arc<Shared>, stop: CancellationToken) {
    loop {
        let due = shared.lock().due;
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = shared.rescheduled.notified() => continue,
            _ = sleep_until(due) => {}
        }
        {
            let mut schedule = shared.lock();
            let now = Instant::now();
            if schedule.due > now {
                continue;
            }
            schedule.turn_open = true;
            schedule.due = now + schedule.poller.wait();
        }
        shared.turn.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn config() -> PollConfig {
        PollConfig {
            min: Duration::from_millis(50),
            max: Duration::from_secs(1),
            factor: 2.0,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn streams_with_the_same_filter_share_a_group() {
        let polls = IdlePolls::new(config());
        let a = polls.join(&["b".into(), "a".into()]);
        let b = polls.join(&["a".into(), "b".into(), "a".into()]);
        let other = polls.join(&[]);
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &other));
        drop((a, b));
        let again = polls.join(&["a".into(), "b".into()]);
        assert_eq!(
            Arc::strong_count(&again),
            1,
            "a new group once the old one ended"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn one_turn_per_due_poll_backing_off_while_nothing_is_found() {
        let group = IdlePolls::new(config()).join(&[]);
        let start = Instant::now();
        let mut turns = Vec::new();
        for _ in 0..7 {
            group.turn().await;
            turns.push((Instant::now() - start).as_millis());
            group.record(true, 10, 0);
        }
        assert_eq!(turns, [50, 150, 350, 750, 1550, 2550, 3550]);
    }

    #[tokio::test(start_paused = true)]
    async fn found_rows_bring_the_schedule_back_and_a_full_turn_wakes_everyone() {
        let group = IdlePolls::new(config()).join(&[]);
        let mut found = group.found();
        for _ in 0..4 {
            group.turn().await;
            group.record(true, 10, 0);
        }
        // Another stream's claim (not its turn) found rows: the next turn is poll.min away.
        group.record(false, 10, 3);
        let before = Instant::now();
        group.turn().await;
        assert_eq!(Instant::now() - before, Duration::from_millis(50));
        assert!(!found.has_changed().unwrap(), "a short claim wakes nobody");
        group.record(true, 10, 10);
        assert!(
            found.has_changed().unwrap(),
            "a full turn wakes the waiting streams"
        );
        found.mark_unchanged();
        group.record(false, 10, 10);
        assert!(
            !found.has_changed().unwrap(),
            "only a turn's claim wakes the others"
        );
    }
}
