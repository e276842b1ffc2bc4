//! The subscription loop against an in-memory storage, on a paused clock: which storage
//! calls of one stream overlap, the order of what the subscriber is told, what is given
//! back, and how often idle streams poll.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::storage::StorageError;
use tokio::task::JoinHandle;
use tokio::time::{sleep, Instant};

use super::*;
use crate::config::{OutboxConfig, PollConfig};
use crate::storage::fake::{FakeStorage, Op, WAIT};

/// Polling too slow to matter within a test: only insert signals and answers wake streams.
const NO_POLLING: PollConfig = PollConfig {
    min: Duration::from_secs(3600),
    max: Duration::from_secs(3600),
    factor: 1.0,
};
const BACKOFF: PollConfig = PollConfig {
    min: Duration::from_millis(50),
    max: Duration::from_secs(1),
    factor: 2.0,
};
/// Long enough that no lease runs out during a test.
const LEASE: Duration = Duration::from_secs(3600);

struct Harness {
    storage: Arc<FakeStorage>,
    outbox: Arc<Outbox>,
    drain: Drain,
}

impl Harness {
    fn new(with_signal: bool, poll: PollConfig) -> Self {
        let storage = FakeStorage::new(with_signal);
        let config = OutboxConfig {
            poll,
            ..OutboxConfig::default()
        };
        let outbox = Outbox::new("orders".into(), config, storage.clone(), 1 << 20);
        Self {
            storage,
            outbox: Arc::new(outbox),
            drain: Drain::new(Duration::from_secs(30)),
        }
    }

    /// Opens a stream and takes its `subscribed`.
    async fn open(&self, window: u32) -> Stream {
        self.open_within(window, None).await
    }

    /// Opens a stream and waits until its first claim (of nothing yet) is done.
    async fn open_claimed(&self, window: u32) -> Stream {
        let stream = self.open(window).await;
        self.storage
            .until("the first claim", |s| s.finished(Op::Claim) == 1)
            .await;
        stream
    }

    /// Adds a row (of `key`) and holds the claim its insert starts, the stream's second:
    /// a claim in flight until `let_through(Op::Claim)`.
    async fn claim_held(&self, key: Option<&str>) -> MessageId {
        self.storage.hold(Op::Claim);
        let row = self.storage.add(key);
        self.storage.wake();
        self.storage
            .until("the second claim to start", |s| s.started(Op::Claim) == 2)
            .await;
        row
    }

    /// Opens a stream of an identity with this `max_bytes_in_flight`.
    async fn open_within(&self, window: u32, bytes: Option<Arc<BytesInFlight>>) -> Stream {
        let (answers, answers_rx) = answer_queue();
        let (events_tx, events) = mpsc::channel(64);
        let spec = SubscriptionSpec {
            subscriber: "test".into(),
            topics: Vec::new(),
            max_in_flight: window,
            peer: None,
            identity: None,
            bytes,
            lease: LEASE,
        };
        let idle = self
            .outbox
            .claims
            .idle_poll(&spec.topics)
            .expect("a poll group");
        let task = tokio::spawn(run(
            Arc::clone(&self.outbox),
            spec,
            idle,
            answers_rx,
            events_tx,
            self.drain.clone(),
        ));
        let mut stream = Stream {
            answers,
            events,
            _task: task,
        };
        assert!(matches!(stream.event().await, Event::Subscribed { .. }));
        stream
    }
}

struct Stream {
    answers: AnswerSender,
    events: mpsc::Receiver<RelayResult<Event>>,
    _task: JoinHandle<()>,
}

impl Stream {
    async fn event(&mut self) -> Event {
        match tokio::time::timeout(WAIT, self.events.recv()).await {
            Ok(Some(Ok(event))) => event,
            Ok(Some(Err(error))) => panic!("the stream ended with {error}"),
            Ok(None) => panic!("the stream ended"),
            Err(_) => panic!("no event in time"),
        }
    }

    /// The next event, which must be a batch; its ids.
    async fn batch(&mut self) -> Vec<MessageId> {
        match self.event().await {
            Event::Batch(batch) => batch.claimed.messages.iter().map(|m| m.id).collect(),
            other => panic!("expected a batch, got {other:?}"),
        }
    }

    async fn settled(&mut self) -> Settlement {
        match self.event().await {
            Event::Settled(settlement) => settlement,
            other => panic!("expected `settled`, got {other:?}"),
        }
    }

    async fn answer(&self, answer: Answer) {
        self.answers.send(Ok(answer)).expect("stream open");
    }

    /// True when no event is waiting.
    fn quiet(&mut self) -> bool {
        self.events.try_recv().is_err()
    }
}

#[tokio::test(start_paused = true)]
async fn a_claim_woken_by_an_insert_runs_while_an_ack_is_applied() {
    let h = Harness::new(true, NO_POLLING);
    let a = h.storage.add(None);
    let mut stream = h.open(10).await;
    assert_eq!(stream.batch().await, [a]);

    h.storage.hold(Op::Ack);
    stream.answer(Answer::Ack(vec![a])).await;
    h.storage
        .until("the ack to start", |s| s.started(Op::Ack) == 1)
        .await;
    let b = h.storage.add(None);
    h.storage.wake();
    assert_eq!(stream.batch().await, [b], "claimed while the ack was held");
    assert_eq!(h.storage.finished(Op::Ack), 0);

    h.storage.let_through(Op::Ack);
    assert_eq!(stream.settled().await.acked, [a]);
}

#[tokio::test(start_paused = true)]
async fn acks_are_applied_while_a_claim_runs() {
    let h = Harness::new(true, NO_POLLING);
    let a = h.storage.add(None);
    let c = h.storage.add(None);
    let mut stream = h.open(10).await;
    assert_eq!(stream.batch().await, [a, c]);

    let b = h.claim_held(None).await;
    // Two answers back to back: applied in one call, still confirmed one by one.
    stream.answer(Answer::Ack(vec![a])).await;
    stream.answer(Answer::Ack(vec![c])).await;
    assert_eq!(
        stream.settled().await.acked,
        [a],
        "acked while the claim was held"
    );
    assert_eq!(stream.settled().await.acked, [c]);
    assert_eq!(h.storage.finished(Op::Ack), 1, "one storage call for both");

    h.storage.let_through(Op::Claim);
    assert_eq!(stream.batch().await, [b]);
}

#[tokio::test(start_paused = true)]
async fn a_nack_waits_for_the_claim_in_flight_and_the_key_comes_back_after_its_settlement() {
    let h = Harness::new(true, NO_POLLING);
    let first = h.storage.add(Some("k"));
    let second = h.storage.add(Some("k"));
    let mut stream = h.open(10).await;
    assert_eq!(stream.batch().await, [first, second]);

    let other = h.claim_held(Some("other")).await;
    stream
        .answer(Answer::Nack {
            id: first,
            error: "boom".into(),
            delay: None,
        })
        .await;
    sleep(Duration::from_secs(5)).await;
    assert_eq!(
        h.storage.started(Op::Nack),
        0,
        "the nack overlapped a claim"
    );

    h.storage.let_through(Op::Claim);
    assert_eq!(stream.batch().await, [other]);
    let settled = stream.settled().await;
    assert_eq!(
        (settled.retried, settled.released),
        (vec![first], vec![second])
    );
    // The key is claimable again (the fake retries at once). Nothing but the stream's own
    // answer can trigger this claim: polling is off and no insert was signalled.
    assert_eq!(stream.batch().await, [first, second]);
}

#[tokio::test(start_paused = true)]
async fn no_claim_starts_while_a_release_is_applied() {
    let h = Harness::new(true, NO_POLLING);
    let a = h.storage.add(None);
    let mut stream = h.open(10).await;
    assert_eq!(stream.batch().await, [a]);

    h.storage.hold(Op::Release);
    stream
        .answer(Answer::Release {
            ids: vec![a],
            delay: Duration::ZERO,
        })
        .await;
    h.storage
        .until("the release to start", |s| s.started(Op::Release) == 1)
        .await;
    let b = h.storage.add(None);
    h.storage.wake();
    sleep(Duration::from_secs(5)).await;
    assert_eq!(
        h.storage.started(Op::Claim),
        1,
        "a claim overlapped the release"
    );

    h.storage.let_through(Op::Release);
    assert_eq!(stream.settled().await.released, [a]);
    assert_eq!(
        stream.batch().await,
        [a, b],
        "given back, then claimed again"
    );
}

#[tokio::test(start_paused = true)]
async fn set_window_zero_is_confirmed_after_the_batch_in_flight_and_stops_claims() {
    let h = Harness::new(true, NO_POLLING);
    let mut stream = h.open_claimed(10).await;

    let a = h.claim_held(None).await;
    stream.answer(Answer::SetWindow(0)).await;
    sleep(Duration::from_secs(5)).await;
    assert!(stream.quiet(), "confirmed while a claim was running");

    h.storage.let_through(Op::Claim);
    assert_eq!(stream.batch().await, [a]);
    assert_eq!(stream.settled().await, Settlement::default());
    h.storage.add(None);
    h.storage.wake();
    sleep(Duration::from_secs(5)).await;
    assert_eq!(h.storage.started(Op::Claim), 2, "claimed with window 0");
    assert!(stream.quiet());
}

#[tokio::test(start_paused = true)]
async fn a_stream_that_ends_during_a_claim_gives_back_what_the_claim_leased() {
    let h = Harness::new(true, NO_POLLING);
    let stream = h.open_claimed(10).await;

    let a = h.claim_held(None).await;
    drop(stream);
    h.storage.let_through(Op::Claim);
    h.storage
        .until("the leases to be given back", |s| s.returned() == [a])
        .await;
}

#[tokio::test(start_paused = true)]
async fn a_drain_lets_the_claim_in_flight_finish_before_draining() {
    let h = Harness::new(true, NO_POLLING);
    let mut stream = h.open_claimed(10).await;

    let a = h.claim_held(None).await;
    h.drain.start();
    sleep(Duration::from_secs(1)).await;
    assert!(
        stream.quiet(),
        "draining before the claim in flight was sent"
    );

    h.storage.let_through(Op::Claim);
    assert_eq!(stream.batch().await, [a]);
    assert!(matches!(stream.event().await, Event::Draining { .. }));
    stream.answer(Answer::Ack(vec![a])).await;
    assert_eq!(stream.settled().await.acked, [a]);
    let end = tokio::time::timeout(WAIT, stream.events.recv()).await;
    assert!(matches!(end, Ok(None)), "drained once nothing was held");
    assert_eq!(h.storage.started(Op::Claim), 2);
}

#[tokio::test(start_paused = true)]
async fn back_to_back_nacks_go_in_one_storage_call_and_are_settled_one_by_one() {
    let h = Harness::new(true, NO_POLLING);
    let ids: Vec<MessageId> = (0..5).map(|_| h.storage.add(None)).collect();
    let mut stream = h.open(10).await;
    assert_eq!(stream.batch().await, ids);
    // A claim in flight holds the nacks back, so they queue up behind it.
    let b = h.claim_held(None).await;
    for id in &ids {
        stream
            .answer(Answer::Nack {
                id: *id,
                error: "down".into(),
                delay: None,
            })
            .await;
    }
    h.storage.let_through(Op::Claim);
    assert_eq!(stream.batch().await, [b]);
    for id in &ids {
        assert_eq!(stream.settled().await.retried, [*id]);
    }
    assert_eq!(h.storage.finished(Op::Nack), 1, "one call for five nacks");
}

#[tokio::test(start_paused = true)]
async fn a_bad_answer_is_rejected_alone_and_the_stream_keeps_its_rows() {
    let h = Harness::new(true, NO_POLLING);
    let a = h.storage.add(None);
    let mut stream = h.open(10).await;
    assert_eq!(stream.batch().await, [a]);
    let too_far = crate::config::MAX_DURATION + Duration::from_millis(1);
    stream
        .answer(Answer::Release {
            ids: vec![a],
            delay: too_far,
        })
        .await;
    let rejected = stream.settled().await.rejected.expect("rejected");
    assert_eq!(rejected.ids, [a]);
    stream.answer(Answer::SetWindow(20_000)).await;
    assert!(stream.settled().await.rejected.is_some());
    stream.answer(Answer::Ack(vec![a])).await;
    assert_eq!(
        stream.settled().await.acked,
        [a],
        "still held, still the stream's"
    );
    assert_eq!(h.storage.started(Op::Release), 0);
}

#[tokio::test(start_paused = true)]
async fn a_claim_failing_for_the_callers_reason_ends_the_stream_with_it() {
    let h = Harness::new(true, NO_POLLING);
    h.storage
        .fail_claims(|| StorageError::InvalidMessage("the database refused the value".into()));
    let mut stream = h.open(10).await;
    match tokio::time::timeout(WAIT, stream.events.recv()).await {
        Ok(Some(Err(error))) => assert!(error.is_callers_fault(), "{error}"),
        other => panic!("expected the stream to end with the error, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn claims_failing_for_a_reason_that_heals_are_retried_ever_more_slowly() {
    let h = Harness::new(true, NO_POLLING);
    h.storage
        .fail_claims(|| StorageError::Unavailable("connection refused".into()));
    let mut stream = h.open(10).await;
    h.storage
        .until("six claims", |s| s.started(Op::Claim) >= 6)
        .await;
    h.storage
        .until("seven claims", |s| s.started(Op::Claim) >= 7)
        .await;
    let at = h.storage.claims_at();
    let waits: Vec<u64> = at.windows(2).map(|w| (w[1] - w[0]).as_secs()).collect();
    assert_eq!(waits[..6], [1, 2, 4, 8, 16, 30]);
    assert!(stream.quiet(), "the stream goes on");
}

/// What the fake's rows weigh in `max_bytes_in_flight`: no payload, topic `t`.
fn row_bytes() -> usize {
    message_bytes(&crate::storage::OutboxMessage {
        id: 0,
        topic: "t".into(),
        key: None,
        payload: Vec::new(),
        headers: Default::default(),
        attempts: 0,
        created_at: Utc::now(),
        too_large: None,
    })
}

#[tokio::test(start_paused = true)]
async fn a_stream_at_its_identitys_byte_budget_claims_again_only_when_answers_free_bytes() {
    let h = Harness::new(true, NO_POLLING);
    let rows: Vec<_> = (0..5).map(|_| h.storage.add(None)).collect();
    let budget = BytesInFlight::new("app", 3 * row_bytes());
    let mut stream = h.open_within(10, Some(Arc::clone(&budget))).await;
    assert_eq!(
        stream.batch().await,
        rows[..3],
        "three rows fill the budget"
    );
    assert_eq!(budget.used(), 3 * row_bytes());

    sleep(Duration::from_secs(600)).await;
    assert!(stream.quiet(), "no batch past the budget");
    assert_eq!(h.storage.started(Op::Claim), 1, "waits, does not spin");

    stream.answer(Answer::Ack(vec![rows[0]])).await;
    assert_eq!(stream.settled().await.acked, [rows[0]]);
    assert_eq!(stream.batch().await, [rows[3]], "the freed row's bytes");
    stream.answer(Answer::Ack(rows[1..4].to_vec())).await;
    assert_eq!(stream.settled().await.acked, rows[1..4]);
    assert_eq!(stream.batch().await, [rows[4]]);
    stream.answer(Answer::Ack(vec![rows[4]])).await;
    stream.settled().await;
    h.storage
        .until("every row's bytes back", |_| budget.used() == 0)
        .await;
}

#[tokio::test(start_paused = true)]
async fn streams_of_one_byte_budget_all_deliver_and_a_closed_one_frees_its_bytes() {
    let h = Harness::new(true, BACKOFF);
    let budget = BytesInFlight::new("app", 4 * row_bytes());
    let mut streams = Vec::new();
    for _ in 0..3 {
        streams.push(h.open_within(10, Some(Arc::clone(&budget))).await);
    }
    let rows: Vec<_> = (0..30).map(|_| h.storage.add(None)).collect();
    h.storage.wake();
    let mut delivered: Vec<MessageId> = Vec::new();
    let mut got_some = [false; 3];
    while delivered.len() < rows.len() {
        for (i, stream) in streams.iter_mut().enumerate() {
            if let Ok(Ok(Event::Batch(batch))) = stream.events.try_recv() {
                let ids: Vec<_> = batch.claimed.messages.iter().map(|m| m.id).collect();
                assert!(budget.used() <= 4 * row_bytes(), "never past the budget");
                got_some[i] = true;
                delivered.extend(&ids);
                stream.answer(Answer::Ack(ids)).await;
            }
        }
        sleep(Duration::from_millis(10)).await;
        assert!(
            h.storage.started(Op::Claim) < 1000,
            "claims spin: {} so far",
            h.storage.started(Op::Claim)
        );
    }
    delivered.sort_unstable();
    assert_eq!(delivered, rows, "every row once");
    assert_eq!(got_some, [true; 3], "every stream had a turn");

    // A stream that ends gives its held rows' bytes back, and the others go on.
    let more: Vec<_> = (0..4).map(|_| h.storage.add(None)).collect();
    h.storage.wake();
    h.storage
        .until("rows held", |_| budget.used() >= row_bytes())
        .await;
    drop(streams);
    h.storage
        .until("the bytes given back", |_| budget.used() == 0)
        .await;
    let mut last = h.open_within(10, Some(Arc::clone(&budget))).await;
    let mut again: Vec<MessageId> = Vec::new();
    while again.len() < more.len() {
        again.extend(last.batch().await);
    }
    again.sort_unstable();
    assert_eq!(again, more);
}

mod idle;
