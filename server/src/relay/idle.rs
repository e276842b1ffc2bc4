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
//!   waiting stream is woken through [`PollGroup::found`] (a counter) and claims at once.
//!
//! So the idle cost is one claim per poll interval per group, whatever the number of
//! streams, and a lone stream polls exactly as before: same waits, same resets. A stream
//! that is not waiting (claiming, its window full, a batch not yet taken by the
//! transport, draining) takes no turn; a turn nobody takes stays open for the next stream
//! that waits.
//!
//! Insert signals (NOTIFY) go through the group too: a signal opens a turn at once
//! ([`Turn::Insert`]), so an insert costs one claim per group, however many streams idle
//! (when every stream claimed on every signal, 5,000 idle streams made an insert cost
//! about 2,900 claims). An insert turn whose claim comes back full wakes the waiting
//! streams like a poll's; one that finds nothing leaves the poll schedule alone (another
//! replica may have taken the row). A stream that opens makes the same kind of turn
//! ([`PollGroup::wake`]) rather than a claim of its own.
//!
//! A signal carries the topic inserted (PostgreSQL's trigger puts it in the
//! notification's payload, see [`Inserts`]), and only the groups whose filter names it,
//! and the group without a filter, take a turn. So an insert costs a claim per *matching*
//! group: with honest streams that is one or two, however many distinct filters are open
//! (an outbox whose subscribers each take their own topics, 64 of them, paid 64 claims
//! per insert before). A signal that cannot say its topic (the trigger of an earlier
//! version, whose payload is empty; the listener reconnecting; a statement inserting more
//! than 16 topics) turns every group, as all signals did before. Inserts of a topic
//! between two turns of a group open one turn, not one each: a turn stays open until a
//! stream takes it, and a claim then takes every row that is waiting.
//!
//! Idle polls still cost one claim per *distinct topic filter* among the outbox's open
//! streams per interval, and so do inserts wherever no signal names the topic (MariaDB and
//! SQLite have no insert signal and pay the polls; a hostile client's filters can all name
//! the topics being inserted: `[orders, x1]`, `[orders, x2]`, ...). A client that opens
//! 10,000 idle streams each with a filter of its own would make 10,000 groups, so the
//! groups are bounded: [`IdlePolls::join`] refuses a filter that would make more than
//! `outboxes.NAME.max_topic_filters` groups (the stream gets RESOURCE_EXHAUSTED naming the
//! key); a stream whose filter already has a group always joins it. The bound is the
//! defence against hostile filters; routing by topic is what makes honest deployments
//! with many filters cost O(1) claims per insert. The other way out, one claim for the
//! whole outbox with its rows routed to the streams whose filters match, would claim on
//! behalf of streams with their own windows, leases, owners and byte budgets: a
//! different lease model, not a change to the idle schedule.
//!
//! The bound is per outbox; an identity's share of it is its
//! `server.auth.identities.NAME.limits.max_topic_filters` (distinct filters among its
//! open streams of one outbox, see `security::quotas`), so with that set one client
//! cannot hold every slot and keep the others' new filters out. Without it (or without
//! authentication) a client that holds every slot keeps new filters out (never streams
//! on filters in use) until its streams end.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::{watch, Notify};
use tokio::time::{sleep_until, Instant};
use tokio_util::sync::{CancellationToken, DropGuard};

use super::poller::Poller;
use crate::config::PollConfig;
use crate::storage::Inserts;

/// The poll groups of one outbox, by topic filter.
pub struct IdlePolls {
    config: PollConfig,
    /// `outboxes.NAME.max_topic_filters`: the most groups alive at once.
    max_groups: usize,
    /// The storage's insert signal, if it has one; each group's timer task watches it
    /// for the topics of its filter.
    insert_signal: Option<watch::Receiver<Inserts>>,
    /// Weak: a group ends (and its timer task stops) when its last stream does.
    groups: Mutex<HashMap<Vec<String>, Weak<PollGroup>>>,
}

/// Why a stream got its turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// The group's poll was due.
    Poll,
    /// An insert was signalled.
    Insert,
}

impl IdlePolls {
    pub fn new(
        config: PollConfig,
        max_groups: usize,
        insert_signal: Option<watch::Receiver<Inserts>>,
    ) -> Self {
        Self {
            config,
            max_groups,
            insert_signal,
            groups: Mutex::new(HashMap::new()),
        }
    }

    /// The group of the streams filtering on `topics` (in any order; empty means every
    /// topic), started on first use; `None` when starting it would make more than
    /// `max_groups` groups. Needs a Tokio runtime.
    pub fn join(&self, topics: &[String]) -> Option<Arc<PollGroup>> {
        let filter = filter_key(topics);
        let mut groups = self.groups.lock().expect("poll groups lock");
        groups.retain(|_, group| group.strong_count() > 0);
        if let Some(group) = groups.get(&filter).and_then(Weak::upgrade) {
            return Some(group);
        }
        if groups.len() >= self.max_groups {
            return None;
        }
        let group = Arc::new(PollGroup::start(
            self.config,
            filter.clone(),
            self.insert_signal.clone(),
        ));
        groups.insert(filter, Arc::downgrade(&group));
        Some(group)
    }

    /// `max_groups`, for the refusal's message.
    pub fn max_groups(&self) -> usize {
        self.max_groups
    }
}

/// A topic filter as one group's key: its topics sorted, each once.
pub fn filter_key(topics: &[String]) -> Vec<String> {
    let mut filter = topics.to_vec();
    filter.sort();
    filter.dedup();
    filter
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
    turn_open: Option<Turn>,
    /// When the group last looked: a turn taken, or a claim that found nothing.
    last_look: Option<Instant>,
}

impl PollGroup {
    fn start(
        config: PollConfig,
        filter: Vec<String>,
        insert_signal: Option<watch::Receiver<Inserts>>,
    ) -> Self {
        let mut poller = Poller::new(config);
        let due = Instant::now() + poller.wait_and_back_off();
        let shared = Arc::new(Shared {
            schedule: Mutex::new(Schedule {
                poller,
                due,
                turn_open: None,
                last_look: None,
            }),
            turn: Notify::new(),
            rescheduled: Notify::new(),
            found: watch::Sender::new(0),
        });
        let stop = CancellationToken::new();
        let inserts = insert_signal.map(|signal| InsertsOf::new(signal, filter));
        tokio::spawn(keep_time(Arc::clone(&shared), inserts, stop.clone()));
        Self {
            shared,
            _stop: stop.drop_guard(),
        }
    }

    /// Completes when this stream is to claim for the group: claim, then
    /// [`PollGroup::record`] with the turn. Only a stream that will claim at once should
    /// wait here.
    pub async fn turn(&self) -> Turn {
        loop {
            self.shared.turn.notified().await;
            let mut schedule = self.shared.lock();
            if let Some(turn) = schedule.turn_open.take() {
                schedule.last_look = Some(Instant::now());
                return turn;
            }
        }
    }

    /// Opens a turn now, as an insert signal does: a stream that just opened looks for
    /// work through its group, so opening many streams at once (10,000 reconnecting after
    /// a restart) costs a claim per group, not one per stream, while the first stream to
    /// open still claims at once.
    ///
    /// No turn is opened while one is open, or when the group looked within `poll.min`
    /// (what it found holds for the new stream too: same filter; rows inserted since come
    /// with an insert signal, or with the next poll).
    pub fn wake(&self) {
        {
            let mut schedule = self.shared.lock();
            let looked_lately = schedule
                .last_look
                .is_some_and(|at| Instant::now() < at + schedule.poller.min());
            if schedule.turn_open.is_some() || looked_lately {
                return;
            }
            schedule.turn_open = Some(Turn::Insert);
        }
        self.shared.turn.notify_one();
    }

    /// A counter that moves when a poll found more than one batch; a waiting stream that
    /// sees it move claims at once.
    pub fn found(&self) -> watch::Receiver<u64> {
        self.shared.found.subscribe()
    }

    /// What a claim of a stream of this group found: `got` rows of `asked`, in a turn of
    /// the group or not (`None`: a full batch's follow-up, its own answers).
    pub fn record(&self, turn: Option<Turn>, asked: usize, got: usize) {
        let now = Instant::now();
        {
            let mut schedule = self.shared.lock();
            if got > 0 {
                schedule.poller.busy();
                // A poll turn still open is moot: the next poll comes `poll.min` after
                // this. An insert turn stays: its insert may not be in this claim.
                if schedule.turn_open == Some(Turn::Poll) {
                    schedule.turn_open = None;
                }
            } else {
                schedule.last_look = Some(now);
                if turn != Some(Turn::Poll) {
                    // An empty claim out of the poll schedule does not move it.
                    return;
                }
            }
            schedule.due = now + schedule.poller.wait_and_back_off();
        }
        self.shared.rescheduled.notify_one();
        if turn.is_some() && got > 0 && got >= asked {
            self.shared.found.send_modify(|n| *n = n.wrapping_add(1));
        }
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Schedule> {
        self.schedule.lock().expect("poll schedule lock")
    }
}

/// The storage's insert signal as one group sees it: only inserts its filter matches.
struct InsertsOf {
    signal: watch::Receiver<Inserts>,
    filter: Vec<String>,
    /// [`Inserts::seq`] when the group last looked.
    seen: u64,
}

impl InsertsOf {
    fn new(mut signal: watch::Receiver<Inserts>, filter: Vec<String>) -> Self {
        let seen = signal.borrow_and_update().seq();
        Self {
            signal,
            filter,
            seen,
        }
    }

    /// Completes when an insert the filter matches was signalled since the last time;
    /// false when the signal's sender is gone. Inserts of other topics pass unnoticed.
    async fn matched(&mut self) -> bool {
        loop {
            if self.signal.changed().await.is_err() {
                return false;
            }
            let inserts = self.signal.borrow_and_update();
            let matched = inserts.since(self.seen, &self.filter);
            self.seen = inserts.seq();
            if matched {
                return true;
            }
        }
    }
}

/// Hands out a turn whenever a poll is due or an insert the group's filter matches is
/// signalled. Until a poll turn's claim reports, the next one is due after the same wait:
/// a turn nobody takes, or whose claim fails, is handed out again rather than stalling
/// the group.
async fn keep_time(shared: Arc<Shared>, mut inserts: Option<InsertsOf>, stop: CancellationToken) {
    loop {
        let due = shared.lock().due;
        let turn = tokio::select! {
            _ = stop.cancelled() => return,
            _ = shared.rescheduled.notified() => continue,
            _ = sleep_until(due) => Turn::Poll,
            matched = matched(&mut inserts) => {
                if !matched {
                    inserts = None;
                    continue;
                }
                Turn::Insert
            }
        };
        {
            let mut schedule = shared.lock();
            let now = Instant::now();
            match turn {
                Turn::Poll if schedule.due > now => continue,
                Turn::Poll => schedule.due = now + schedule.poller.wait(),
                Turn::Insert => {}
            }
            // An insert turn outranks a poll turn nobody took yet: it counts as evidence.
            if schedule.turn_open != Some(Turn::Insert) {
                schedule.turn_open = Some(turn);
            }
        }
        shared.turn.notify_one();
    }
}

/// Waits for the next change of a counter; false when its sender is gone. Never completes
/// without one.
pub(super) async fn changed(signal: &mut Option<watch::Receiver<u64>>) -> bool {
    match signal {
        Some(receiver) => receiver.changed().await.is_ok(),
        None => std::future::pending().await,
    }
}

/// [`InsertsOf::matched`]; never completes without a signal.
async fn matched(inserts: &mut Option<InsertsOf>) -> bool {
    match inserts {
        Some(inserts) => inserts.matched().await,
        None => std::future::pending().await,
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
        let polls = IdlePolls::new(config(), 8, None);
        let a = polls.join(&["b".into(), "a".into()]).unwrap();
        let b = polls.join(&["a".into(), "b".into(), "a".into()]).unwrap();
        let other = polls.join(&[]).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &other));
        drop((a, b));
        let again = polls.join(&["a".into(), "b".into()]).unwrap();
        assert_eq!(
            Arc::strong_count(&again),
            1,
            "a new group once the old one ended"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_filter_past_the_bound_is_refused_and_filters_in_use_still_join() {
        let polls = IdlePolls::new(config(), 2, None);
        let a = polls.join(&["a".into()]).unwrap();
        let b = polls.join(&["b".into()]).unwrap();
        assert!(polls.join(&["c".into()]).is_none(), "a third filter");
        assert!(polls.join(&["a".into(), "c".into()]).is_none());
        let a_again = polls.join(&["a".into()]).expect("a filter in use joins");
        assert!(Arc::ptr_eq(&a, &a_again));
        drop(b);
        assert!(
            polls.join(&["c".into()]).is_some(),
            "a slot frees when its group's last stream ends"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn one_turn_per_due_poll_backing_off_while_nothing_is_found() {
        let group = IdlePolls::new(config(), 8, None).join(&[]).unwrap();
        let start = Instant::now();
        let mut turns = Vec::new();
        for _ in 0..7 {
            assert_eq!(group.turn().await, Turn::Poll);
            turns.push((Instant::now() - start).as_millis());
            group.record(Some(Turn::Poll), 10, 0);
        }
        assert_eq!(turns, [50, 150, 350, 750, 1550, 2550, 3550]);
    }

    #[tokio::test(start_paused = true)]
    async fn found_rows_bring_the_schedule_back_and_a_full_turn_wakes_everyone() {
        let group = IdlePolls::new(config(), 8, None).join(&[]).unwrap();
        let mut found = group.found();
        for _ in 0..4 {
            group.turn().await;
            group.record(Some(Turn::Poll), 10, 0);
        }
        // Another stream's claim (not its turn) found rows: the next turn is poll.min away.
        group.record(None, 10, 3);
        let before = Instant::now();
        group.turn().await;
        assert_eq!(Instant::now() - before, Duration::from_millis(50));
        assert!(!found.has_changed().unwrap(), "a short claim wakes nobody");
        group.record(Some(Turn::Poll), 10, 10);
        assert!(
            found.has_changed().unwrap(),
            "a full turn wakes the waiting streams"
        );
        found.mark_unchanged();
        group.record(None, 10, 10);
        assert!(
            !found.has_changed().unwrap(),
            "only a turn's claim wakes the others"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_insert_signal_opens_one_turn_at_once_and_an_empty_one_keeps_the_schedule() {
        let signal = watch::Sender::new(Inserts::default());
        let group = IdlePolls::new(config(), 8, Some(signal.subscribe()))
            .join(&[])
            .unwrap();
        for _ in 0..3 {
            group.turn().await;
            group.record(Some(Turn::Poll), 10, 0);
        }
        // The next poll is 400ms away; an insert brings a turn now.
        let before = Instant::now();
        signal.send_modify(|inserts| inserts.record(Some("t")));
        assert_eq!(group.turn().await, Turn::Insert);
        assert_eq!(Instant::now(), before);
        group.record(Some(Turn::Insert), 10, 0);
        assert_eq!(group.turn().await, Turn::Poll);
        assert_eq!(Instant::now() - before, Duration::from_millis(400));
    }

    fn insert(signal: &watch::Sender<Inserts>, topic: Option<&str>) {
        signal.send_modify(|inserts| inserts.record(topic));
    }

    /// Takes every turn open within `within`, recording each as empty; returns them.
    async fn turns_within(group: &PollGroup, within: Duration) -> Vec<Turn> {
        let mut turns = Vec::new();
        while let Ok(turn) = tokio::time::timeout(within, group.turn()).await {
            group.record(Some(turn), 10, 0);
            turns.push(turn);
        }
        turns
    }

    #[tokio::test(start_paused = true)]
    async fn an_insert_opens_a_turn_only_in_the_groups_whose_filter_matches_its_topic() {
        let signal = watch::Sender::new(Inserts::default());
        let polls = IdlePolls::new(config(), 8, Some(signal.subscribe()));
        let orders = polls.join(&["orders".into()]).unwrap();
        let both = polls.join(&["users".into(), "orders".into()]).unwrap();
        let users = polls.join(&["users".into()]).unwrap();
        let every = polls.join(&[]).unwrap();
        // Each group's first poll turn, at 50 ms; the next ones are 100 ms later, after
        // everything below.
        for group in [&orders, &both, &users, &every] {
            tokio::time::timeout(Duration::from_secs(2), group.turn())
                .await
                .unwrap();
            group.record(Some(Turn::Poll), 10, 0);
        }
        insert(&signal, Some("orders"));
        let soon = Duration::from_millis(10);
        assert_eq!(turns_within(&orders, soon).await, [Turn::Insert]);
        assert_eq!(turns_within(&both, soon).await, [Turn::Insert]);
        assert_eq!(turns_within(&every, soon).await, [Turn::Insert]);
        assert_eq!(turns_within(&users, soon).await, [], "another topic");

        // An insert of unknown topic (an old trigger's empty payload) wakes every group.
        insert(&signal, None);
        for group in [&orders, &both, &users, &every] {
            assert_eq!(turns_within(group, soon).await, [Turn::Insert]);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn many_inserts_of_a_topic_between_two_turns_open_one_turn() {
        let signal = watch::Sender::new(Inserts::default());
        let polls = IdlePolls::new(config(), 8, Some(signal.subscribe()));
        let orders = polls.join(&["orders".into()]).unwrap();
        let users = polls.join(&["users".into()]).unwrap();
        for group in [&orders, &users] {
            tokio::time::timeout(Duration::from_secs(2), group.turn())
                .await
                .unwrap();
            group.record(Some(Turn::Poll), 10, 0);
        }
        for _ in 0..100 {
            insert(&signal, Some("orders"));
            insert(&signal, Some("other"));
            tokio::task::yield_now().await;
        }
        let soon = Duration::from_millis(10);
        assert_eq!(turns_within(&orders, soon).await, [Turn::Insert]);
        assert_eq!(turns_within(&users, soon).await, []);
    }
}
