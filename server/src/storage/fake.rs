//! An in-memory [`Storage`] for unit tests (the relay's loop, the [`super::timed`]
//! wrapper): rows in id order, write-backs fenced by owner, strict per-key order (a row
//! waits while an earlier row of its key is leased), every call counted, and gates that
//! hold a kind of call until the test lets it through, to see which calls of one stream
//! run at the same time. Leases never run out and retries are due at once: the tests that
//! use it are about the relay's loop, not about the database's clock.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::Utc;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::storage::{
    ClaimRequest, Claimed, DeadCounts, DeadFilter, DeadLetter, Extended, Inserts, MessageId,
    NackRequest, NackResult, NewMessage, OutboxMessage, RetryPolicy, SortedIds, Stats, Storage,
    StorageError, StorageResult,
};

/// The kinds of storage call a test can count and hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    Claim,
    Ack,
    Nack,
    Release,
    ReturnLeases,
}

/// How long a test waits for a condition (virtual time: the tests pause the clock).
pub const WAIT: Duration = Duration::from_secs(60);

pub struct FakeStorage {
    state: Mutex<State>,
    /// The insert signal, when the fake has one.
    signal: Option<watch::Sender<Inserts>>,
    /// Moves on every call's start and end, so tests can wait for a condition.
    progress: watch::Sender<u64>,
    /// Per kind of call: true while calls are held.
    gates: HashMap<Op, watch::Sender<bool>>,
    /// When set, every claim fails with the error this makes.
    failing_claims: Mutex<Option<fn() -> StorageError>>,
}

#[derive(Default)]
struct State {
    rows: BTreeMap<MessageId, Row>,
    next_id: MessageId,
    started: HashMap<Op, usize>,
    finished: HashMap<Op, usize>,
    /// When each claim started.
    claims_at: Vec<Instant>,
    /// Ids given back by `return_leases`.
    returned: Vec<MessageId>,
}

struct Row {
    key: Option<String>,
    leased_by: Option<String>,
    attempts: u32,
    done: bool,
}

impl FakeStorage {
    pub fn new(with_signal: bool) -> Arc<Self> {
        let gates = [Op::Claim, Op::Ack, Op::Nack, Op::Release, Op::ReturnLeases]
            .into_iter()
            .map(|op| (op, watch::Sender::new(false)))
            .collect();
        Arc::new(Self {
            state: Mutex::new(State::default()),
            signal: with_signal.then(|| watch::Sender::new(Inserts::default())),
            progress: watch::Sender::new(0),
            gates,
            failing_claims: Mutex::new(None),
        })
    }

    /// Makes every claim from now on fail with `error()`.
    pub fn fail_claims(&self, error: fn() -> StorageError) {
        *self.failing_claims.lock().expect("fake lock") = Some(error);
    }

    /// Adds a pending row (no signal: see [`FakeStorage::wake`]).
    pub fn add(&self, key: Option<&str>) -> MessageId {
        let mut state = self.lock();
        state.next_id += 1;
        let id = state.next_id;
        let row = Row {
            key: key.map(str::to_owned),
            leased_by: None,
            attempts: 0,
            done: false,
        };
        state.rows.insert(id, row);
        id
    }

    /// Signals an insert of unknown topic, as the listener does on an empty NOTIFY.
    pub fn wake(&self) {
        self.wake_topic(None);
    }

    /// Signals an insert of `topic` (`None`: unknown), as the listener does on NOTIFY.
    pub fn wake_topic(&self, topic: Option<&str>) {
        let signal = self.signal.as_ref().expect("a fake with an insert signal");
        signal.send_modify(|inserts| inserts.record(topic));
    }

    /// Holds calls of this kind (started and counted, not run) until [`Self::let_through`].
    pub fn hold(&self, op: Op) {
        self.gates[&op].send_replace(true);
    }

    pub fn let_through(&self, op: Op) {
        self.gates[&op].send_replace(false);
    }

    pub fn started(&self, op: Op) -> usize {
        self.lock().started.get(&op).copied().unwrap_or(0)
    }

    pub fn finished(&self, op: Op) -> usize {
        self.lock().finished.get(&op).copied().unwrap_or(0)
    }

    pub fn claims_at(&self) -> Vec<Instant> {
        self.lock().claims_at.clone()
    }

    pub fn returned(&self) -> Vec<MessageId> {
        self.lock().returned.clone()
    }

    /// Waits until `condition` holds; panics after [`WAIT`] naming `what`.
    pub async fn until(&self, what: &str, condition: impl Fn(&Self) -> bool) {
        let mut progress = self.progress.subscribe();
        let wait = async {
            while !condition(self) {
                progress.changed().await.expect("the fake lives");
            }
        };
        if tokio::time::timeout(WAIT, wait).await.is_err() {
            panic!("timed out waiting for {what}");
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("fake storage lock")
    }

    /// Counts the call, then waits while its kind is held.
    async fn enter(&self, op: Op) {
        {
            let mut state = self.lock();
            *state.started.entry(op).or_default() += 1;
            if op == Op::Claim {
                state.claims_at.push(Instant::now());
            }
        }
        self.progress.send_modify(|n| *n += 1);
        let mut gate = self.gates[&op].subscribe();
        gate.wait_for(|held| !held).await.expect("the fake lives");
    }

    fn leave(&self, op: Op) {
        *self.lock().finished.entry(op).or_default() += 1;
        self.progress.send_modify(|n| *n += 1);
    }

    /// Applies `change` to each of `ids` that `owner` holds; returns those ids.
    fn held_by(&self, ids: &SortedIds, owner: &str, change: impl Fn(&mut Row)) -> SortedIds {
        let mut state = self.lock();
        let mut applied = Vec::new();
        for id in ids {
            if let Some(row) = state.rows.get_mut(id) {
                if !row.done && row.leased_by.as_deref() == Some(owner) {
                    change(row);
                    applied.push(*id);
                }
            }
        }
        ids.only(applied)
    }
    fn nack_one(&self, id: MessageId, owner: &str) -> NackResult {
        if self
            .held_by(&[id].into(), owner, |row| row.leased_by = None)
            .is_empty()
        {
            NackResult::Fenced
        } else {
            let key = self.lock().rows[&id].key.clone();
            let successors: SortedIds = self
                .lock()
                .rows
                .range(id + 1..)
                .filter(|(_, row)| key.is_some() && row.key == key)
                .map(|(id, _)| *id)
                .collect();
            let released = self.held_by(&successors, owner, |row| {
                row.leased_by = None;
                row.attempts -= 1;
            });
            NackResult::Retried {
                retry_at: Utc::now(),
                released: released.into_vec(),
            }
        }
    }
}

#[async_trait]
impl Storage for FakeStorage {
    fn backend(&self) -> &'static str {
        "fake"
    }

    fn table_name(&self) -> &str {
        "fake"
    }

    async fn claim(&self, request: ClaimRequest<'_>) -> StorageResult<Claimed> {
        self.enter(Op::Claim).await;
        let failing = *self.failing_claims.lock().expect("fake lock");
        if let Some(error) = failing {
            self.leave(Op::Claim);
            return Err(error());
        }
        let mut messages = Vec::new();
        {
            let mut state = self.lock();
            let mut blocked_keys: Vec<String> = Vec::new();
            for (id, row) in state.rows.iter_mut() {
                if messages.len() >= request.batch_size as usize {
                    break;
                }
                if row.done {
                    continue;
                }
                let blocked = row.key.as_ref().is_some_and(|k| blocked_keys.contains(k));
                if row.leased_by.is_some() || blocked {
                    blocked_keys.extend(row.key.clone());
                    continue;
                }
                row.leased_by = Some(request.owner.to_owned());
                row.attempts += 1;
                messages.push(OutboxMessage {
                    id: *id,
                    topic: "t".to_owned(),
                    key: row.key.clone(),
                    payload: Vec::new(),
                    headers: BTreeMap::new(),
                    attempts: row.attempts,
                    created_at: Utc::now(),
                    too_large: None,
                });
            }
        }
        self.leave(Op::Claim);
        Ok(Claimed {
            exhausted: Vec::new(),
            messages,
            lease_expires_at: Utc::now(),
        })
    }

    async fn held_attempts(
        &self,
        ids: &SortedIds,
        owner: &str,
    ) -> StorageResult<Vec<(MessageId, u32)>> {
        let state = self.lock();
        Ok(ids
            .iter()
            .filter_map(|id| state.rows.get(id).map(|row| (*id, row)))
            .filter(|(_, row)| !row.done && row.leased_by.as_deref() == Some(owner))
            .map(|(id, row)| (id, row.attempts))
            .collect())
    }

    async fn ack(&self, ids: &SortedIds, owner: &str) -> StorageResult<SortedIds> {
        self.enter(Op::Ack).await;
        let applied = self.held_by(ids, owner, |row| row.done = true);
        self.leave(Op::Ack);
        Ok(applied)
    }

    /// Retries each at once, releasing the later rows of the key the owner holds.
    async fn nack_many(
        &self,
        nacks: &[NackRequest<'_>],
        owner: &str,
        _policy: &dyn RetryPolicy,
    ) -> StorageResult<Vec<NackResult>> {
        self.enter(Op::Nack).await;
        let results = nacks
            .iter()
            .map(|nack| self.nack_one(nack.id, owner))
            .collect();
        self.leave(Op::Nack);
        Ok(results)
    }

    async fn release(
        &self,
        ids: &SortedIds,
        owner: &str,
        _delay: Duration,
    ) -> StorageResult<SortedIds> {
        self.enter(Op::Release).await;
        let applied = self.held_by(ids, owner, |row| {
            row.leased_by = None;
            row.attempts -= 1;
        });
        self.leave(Op::Release);
        Ok(applied)
    }

    async fn dead_letter(&self, id: MessageId, owner: &str, _error: &str) -> StorageResult<bool> {
        Ok(!self
            .held_by(&[id].into(), owner, |row| row.done = true)
            .is_empty())
    }

    async fn extend_lease(
        &self,
        ids: &SortedIds,
        owner: &str,
        _lease: Duration,
    ) -> StorageResult<Extended> {
        Ok(Extended {
            ids: self.held_by(ids, owner, |_| {}),
            lease_expires_at: Utc::now(),
        })
    }

    async fn return_leases(&self, ids: &SortedIds, owner: &str) -> StorageResult<u64> {
        self.enter(Op::ReturnLeases).await;
        let returned = self.held_by(ids, owner, |row| row.leased_by = None);
        self.lock().returned.extend(&returned);
        self.leave(Op::ReturnLeases);
        Ok(returned.len() as u64)
    }

    async fn stats(&self) -> StorageResult<Stats> {
        Ok(Stats::default())
    }

    async fn delivered_within(&self, _window: Duration) -> StorageResult<Option<u64>> {
        Ok(None)
    }

    async fn purge(&self, _older_than: Duration) -> StorageResult<u64> {
        Ok(0)
    }

    // The fake forgets dead rows (the relay's tests only count dead-letter calls): none
    // to list, re-drive or discard.
    async fn list_dead(
        &self,
        _filter: &DeadFilter,
        _after_id: MessageId,
        _limit: u32,
    ) -> StorageResult<Vec<DeadLetter>> {
        Ok(Vec::new())
    }

    async fn count_dead(&self, _filter: &DeadFilter) -> StorageResult<DeadCounts> {
        Ok(DeadCounts::default())
    }

    async fn redrive_dead(
        &self,
        _filter: &DeadFilter,
        _limit: u32,
        _delay: Duration,
    ) -> StorageResult<SortedIds> {
        Ok(SortedIds::default())
    }

    async fn discard_dead(&self, _filter: &DeadFilter, _limit: u32) -> StorageResult<SortedIds> {
        Ok(SortedIds::default())
    }

    async fn blocked_keys(
        &self,
        _after_id: MessageId,
        _limit: u32,
    ) -> StorageResult<Vec<crate::storage::BlockedKey>> {
        Ok(Vec::new())
    }

    // Never paused: the relay's tests are about its loop.
    async fn lease_holders(&self) -> StorageResult<Vec<crate::storage::LeaseHolder>> {
        Ok(Vec::new())
    }

    async fn pauses(&self) -> StorageResult<crate::storage::Pauses> {
        Ok(crate::storage::Pauses::default())
    }

    async fn set_paused(
        &self,
        _topics: &[String],
        _paused: bool,
    ) -> StorageResult<crate::storage::Pauses> {
        Ok(crate::storage::Pauses::default())
    }

    fn schema_sql(&self) -> String {
        String::new()
    }

    async fn ensure_table(&self) -> StorageResult<()> {
        Ok(())
    }

    async fn verify_table(&self) -> StorageResult<()> {
        Ok(())
    }

    async fn insert(&self, message: NewMessage) -> StorageResult<MessageId> {
        Ok(self.add(message.key.as_deref()))
    }

    fn insert_signal(&self) -> Option<watch::Receiver<Inserts>> {
        self.signal.as_ref().map(watch::Sender::subscribe)
    }
}
