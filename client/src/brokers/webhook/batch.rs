//! Gathering concurrent publishes into one POST (opt-in, [`WebhookPublisherBuilder::batch`]).
//!
//! The subscriber runtime calls `publish` once per message, concurrently for different
//! keys. With batching on, each call puts its message into the open batch and waits for
//! that batch's answer. The rules:
//!
//! 1. a batch leaves when it holds `max_messages`, or `max_wait` after its first message
//!    arrived, whichever comes first: no message waits longer than `max_wait` before its
//!    POST starts;
//! 2. every message of a batch gets the POST's outcome: 2xx acks them all, a retried
//!    answer nacks them all (with the same `Retry-After`), a permanent one dead-letters
//!    them all;
//! 3. a publish cancelled before its batch left (the runtime's `publish_timeout`, an
//!    immediate stop) takes its message out of the batch; once the POST started, it goes
//!    on without the caller, who has already nacked the message;
//! 4. the POST runs on a task of its own, so one caller's cancellation never cancels it
//!    for the others.
//!
//! A batch never holds two messages of one key: the runtime starts a key's next publish
//! only after the previous one returned, so per-key order holds across batches. A batch
//! holds at most as many messages as the runtime runs publishes at once (`concurrency`,
//! summed over subscribers sharing the publisher).
//!
//! [`Batcher`] only gathers and fans out; sending is a function it is given, so its rules
//! are unit-tested below on a paused clock without HTTP.
//!
//! [`WebhookPublisherBuilder::batch`]: super::WebhookPublisherBuilder::batch

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::oneshot;
use tokio::task::AbortHandle;

use crate::{Message, PublishError};

/// Sends one batch (in arrival order) and returns its outcome.
pub(super) type SendBatch =
    Arc<dyn Fn(Vec<Message>) -> BoxFuture<'static, Result<(), PublishError>> + Send + Sync>;

/// When a batch leaves: at `max_messages`, or `max_wait` after its first message.
#[derive(Debug, Clone, Copy)]
pub(super) struct BatchLimits {
    pub max_messages: usize,
    pub max_wait: Duration,
}

/// Gathers messages into batches and hands each caller its batch's outcome.
pub(super) struct Batcher {
    shared: Arc<Shared>,
}

struct Shared {
    limits: BatchLimits,
    send: SendBatch,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Tells batches apart, so that a timer or a cancelled caller never touches a batch
    /// other than its own.
    next_generation: u64,
    open: Option<OpenBatch>,
}

struct OpenBatch {
    generation: u64,
    messages: Vec<Message>,
    waiters: Vec<oneshot::Sender<Result<(), PublishError>>>,
    /// The task that sends the batch at `max_wait`; aborted when it fills first.
    timer: Option<AbortHandle>,
}

/// Takes a cancelled caller's message out of its batch if that batch has not left.
struct Seat<'b> {
    shared: &'b Shared,
    generation: u64,
    id: i64,
}

impl Drop for Seat<'_> {
    fn drop(&mut self) {
        let mut state = self.shared.state.lock().expect("batch state poisoned");
        let Some(open) = state.open.as_mut() else {
            return;
        };
        if open.generation != self.generation {
            return; // the batch left: nothing to take back
        }
        if let Some(index) = open.messages.iter().position(|m| m.id == self.id) {
            open.messages.remove(index);
            open.waiters.remove(index);
        }
    }
}

impl Batcher {
    pub(super) fn new(limits: BatchLimits, send: SendBatch) -> Self {
        Self {
            shared: Arc::new(Shared {
                limits,
                send,
                state: Mutex::new(State::default()),
            }),
        }
    }

    /// Puts `message` into the open batch and returns that batch's outcome.
    pub(super) async fn publish(&self, message: &Message) -> Result<(), PublishError> {
        let (answer, outcome) = oneshot::channel();
        let (generation, full) = {
            let mut state = self.shared.state.lock().expect("batch state poisoned");
            if state.open.is_none() {
                let generation = state.next_generation;
                state.next_generation += 1;
                let timer = tokio::spawn(send_when_due(Arc::clone(&self.shared), generation));
                state.open = Some(OpenBatch {
                    generation,
                    messages: Vec::new(),
                    waiters: Vec::new(),
                    timer: Some(timer.abort_handle()),
                });
            }
            let open = state.open.as_mut().expect("opened above");
            open.messages.push(message.clone());
            open.waiters.push(answer);
            let generation = open.generation;
            let full = if open.messages.len() >= self.shared.limits.max_messages {
                state.open.take()
            } else {
                None
            };
            (generation, full)
        };
        let _seat = Seat {
            shared: &self.shared,
            generation,
            id: message.id,
        };
        if let Some(mut full) = full {
            if let Some(timer) = full.timer.take() {
                timer.abort();
            }
            tokio::spawn(send(Arc::clone(&self.shared), full));
        }
        match outcome.await {
            Ok(result) => result,
            // Only if the sending task panicked or the runtime is shutting down.
            Err(_) => Err(PublishError::new("webhook batch was not sent")),
        }
    }
}

/// Sends batch `generation` at `max_wait`, unless it already left because it filled.
async fn send_when_due(shared: Arc<Shared>, generation: u64) {
    tokio::time::sleep(shared.limits.max_wait).await;
    let due = {
        let mut state = shared.state.lock().expect("batch state poisoned");
        match &state.open {
            Some(open) if open.generation == generation => state.open.take(),
            _ => None,
        }
    };
    if let Some(batch) = due {
        send(shared, batch).await;
    }
}

/// POSTs `batch` and gives every waiter the outcome.
async fn send(shared: Arc<Shared>, batch: OpenBatch) {
    if batch.messages.is_empty() {
        return; // every caller was cancelled
    }
    let result = (shared.send)(batch.messages).await;
    for waiter in batch.waiters {
        // A caller that is gone was cancelled after the POST started: nothing to tell.
        let _ = waiter.send(copy(&result));
    }
}

/// The same outcome for another message of the batch.
fn copy(result: &Result<(), PublishError>) -> Result<(), PublishError> {
    let Err(error) = result else {
        return Ok(());
    };
    let mut copy = PublishError::new(error.text());
    if let Some(delay) = error.retry_delay() {
        copy = copy.retry_after(delay);
    }
    if error.is_permanent() {
        copy = copy.into_permanent();
    }
    Err(copy)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::Instant;

    /// The ids of each batch sent, and when it left.
    type Sent = Arc<Mutex<Vec<(Vec<i64>, Instant)>>>;

    /// Records each batch's ids and when it left; answers with `answer`.
    fn recorder(answer: fn() -> Result<(), PublishError>) -> (SendBatch, Sent) {
        let sent = Arc::new(Mutex::new(Vec::new()));
        let send: SendBatch = {
            let sent = Arc::clone(&sent);
            Arc::new(move |messages: Vec<Message>| {
                let ids = messages.iter().map(|m| m.id).collect();
                sent.lock().unwrap().push((ids, Instant::now()));
                Box::pin(async move { answer() })
            })
        };
        (send, sent)
    }

    fn batcher(max_messages: usize, send: SendBatch) -> Arc<Batcher> {
        let limits = BatchLimits {
            max_messages,
            max_wait: Duration::from_millis(50),
        };
        Arc::new(Batcher::new(limits, send))
    }

    fn publish_all(
        batcher: &Arc<Batcher>,
        ids: std::ops::Range<i64>,
    ) -> Vec<tokio::task::JoinHandle<Result<(), PublishError>>> {
        ids.map(|id| {
            let batcher = Arc::clone(batcher);
            tokio::spawn(async move { batcher.publish(&Message::new(id, "t", "p")).await })
        })
        .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_batch_leaves_at_once_and_the_rest_after_max_wait() {
        let (send, sent) = recorder(|| Ok(()));
        let batcher = batcher(3, send);
        let start = Instant::now();
        for handle in publish_all(&batcher, 0..5) {
            handle.await.unwrap().unwrap();
        }
        let sent = sent.lock().unwrap().clone();
        assert_eq!(sent.len(), 2, "{sent:?}");
        assert_eq!(sent[0].0, [0, 1, 2]);
        assert_eq!(
            sent[0].1 - start,
            Duration::ZERO,
            "a full batch waits for nothing"
        );
        assert_eq!(sent[1].0, [3, 4]);
        assert_eq!(sent[1].1 - start, Duration::from_millis(50));
    }

    #[tokio::test(start_paused = true)]
    async fn every_message_of_a_batch_gets_its_outcome() {
        let (send, _) =
            recorder(|| Err(PublishError::new("answered 503").retry_after(Duration::from_secs(7))));
        for handle in publish_all(&batcher(2, send), 0..2) {
            let error = handle.await.unwrap().unwrap_err();
            assert_eq!(error.text(), "answered 503");
            assert_eq!(error.retry_delay(), Some(Duration::from_secs(7)));
            assert!(!error.is_permanent());
        }
        let (send, _) = recorder(|| Err(PublishError::permanent("answered 400")));
        for handle in publish_all(&batcher(2, send), 0..2) {
            assert!(handle.await.unwrap().unwrap_err().is_permanent());
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_publish_leaves_its_batch_before_it_is_sent() {
        let (send, sent) = recorder(|| Ok(()));
        let batcher = batcher(10, send);
        let kept = publish_all(&batcher, 0..1);
        let cancelled = tokio::time::timeout(
            Duration::from_millis(10),
            batcher.publish(&Message::new(1, "t", "p")),
        )
        .await;
        assert!(cancelled.is_err(), "the batch left early");
        kept.into_iter().next().unwrap().await.unwrap().unwrap();
        assert_eq!(sent.lock().unwrap()[0].0, [0]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_whose_callers_all_left_is_not_sent() {
        let (send, sent) = recorder(|| Ok(()));
        let batcher = batcher(10, send);
        let gone = tokio::time::timeout(
            Duration::from_millis(10),
            batcher.publish(&Message::new(1, "t", "p")),
        )
        .await;
        assert!(gone.is_err());
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(sent.lock().unwrap().is_empty());
    }
}
