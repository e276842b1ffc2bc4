//! Gathering concurrent publishes into one request: the webhook's opt-in batches
//! ([`WebhookPublisherBuilder::batch`]), SQS's `SendMessageBatch` and SNS's `PublishBatch`.
//!
//! The subscriber runtime calls `publish` once per message, concurrently for different
//! keys. With batching on, each call puts its message into the open batch and waits for
//! its own outcome in that batch's answer. The rules:
//!
//! 1. a batch leaves when it holds `max_messages`, or `max_wait` after its first message
//!    arrived, whichever comes first: no message waits longer than `max_wait` before its
//!    request starts;
//! 2. a message whose size would take the open batch over `max_bytes` sends the open batch
//!    at once and starts the next one (a message over `max_bytes` on its own is the
//!    publisher's to refuse before it gets here);
//! 3. the request answers each message of the batch: a webhook's one answer goes to all of
//!    them ([`same_outcome`]); SQS and SNS answer per entry;
//! 4. a publish cancelled before its batch left (the runtime's `publish_timeout`, an
//!    immediate stop) takes its message out of the batch; once the request started, it
//!    goes on without the caller, who has already nacked the message;
//! 5. the request runs on a task of its own, so one caller's cancellation never cancels
//!    it for the others.
//!
//! A batch never holds two messages of one key: the runtime starts a key's next publish
//! only after the previous one returned, so per-key order holds across batches. A batch
//! holds at most as many messages as the runtime runs publishes at once (`concurrency`,
//! summed over subscribers sharing the publisher).
//!
//! [`Batcher`] only gathers and fans out; sending is a function it is given, so its rules
//! are unit-tested below on a paused clock without a broker.
//!
//! [`WebhookPublisherBuilder::batch`]: crate::webhook::WebhookPublisherBuilder::batch

// Each feature uses part of it (the webhook no size limit, SQS and SNS no shared outcome).
#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::oneshot;
use tokio::task::AbortHandle;

use crate::PublishError;

/// Sends one batch (in arrival order) and returns each item's outcome, in that order.
pub(crate) type SendBatch<T> =
    Arc<dyn Fn(Vec<T>) -> BoxFuture<'static, Vec<Result<(), PublishError>>> + Send + Sync>;

/// When a batch leaves: at `max_messages`, before `max_bytes`, or `max_wait` after its
/// first message.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BatchLimits {
    pub max_messages: usize,
    pub max_bytes: usize,
    pub max_wait: Duration,
}

/// Gathers items into batches and hands each caller its item's outcome.
pub(crate) struct Batcher<T> {
    shared: Arc<Shared<T>>,
}

struct Shared<T> {
    limits: BatchLimits,
    send: SendBatch<T>,
    state: Mutex<State<T>>,
}

struct State<T> {
    /// Tells batches apart, so that a timer or a cancelled caller never touches a batch
    /// other than its own.
    next_generation: u64,
    open: Option<OpenBatch<T>>,
}

struct OpenBatch<T> {
    generation: u64,
    /// The items with the message id each stands for, and their sizes' sum.
    items: Vec<(i64, T)>,
    bytes: usize,
    waiters: Vec<oneshot::Sender<Result<(), PublishError>>>,
    /// The task that sends the batch at `max_wait`; aborted when it leaves earlier.
    timer: Option<AbortHandle>,
}

/// Takes a cancelled caller's item out of its batch if that batch has not left.
struct Seat<'b, T> {
    shared: &'b Shared<T>,
    generation: u64,
    id: i64,
}

impl<T> Drop for Seat<'_, T> {
    fn drop(&mut self) {
        let mut state = self.shared.state.lock().expect("batch state poisoned");
        let Some(open) = state.open.as_mut() else {
            return;
        };
        if open.generation != self.generation {
            return; // the batch left: nothing to take back
        }
        if let Some(index) = open.items.iter().position(|(id, _)| *id == self.id) {
            open.items.remove(index);
            open.waiters.remove(index);
        }
    }
}

impl<T: Send + 'static> Batcher<T> {
    pub(crate) fn new(limits: BatchLimits, send: SendBatch<T>) -> Self {
        Self {
            shared: Arc::new(Shared {
                limits,
                send,
                state: Mutex::new(State {
                    next_generation: 0,
                    open: None,
                }),
            }),
        }
    }

    /// Puts `item` (message `id`, `size` bytes) into the open batch and returns its
    /// outcome.
    pub(crate) async fn publish(&self, id: i64, item: T, size: usize) -> Result<(), PublishError> {
        let (answer, outcome) = oneshot::channel();
        let limits = self.shared.limits;
        let (generation, leaving) = {
            let mut state = self.shared.state.lock().expect("batch state poisoned");
            let mut leaving = Vec::new();
            let over = state
                .open
                .as_ref()
                .is_some_and(|open| !open.items.is_empty() && open.bytes + size > limits.max_bytes);
            if over {
                leaving.extend(state.open.take());
            }
            if state.open.is_none() {
                let generation = state.next_generation;
                state.next_generation += 1;
                let timer = tokio::spawn(send_when_due(Arc::clone(&self.shared), generation));
                state.open = Some(OpenBatch {
                    generation,
                    items: Vec::new(),
                    bytes: 0,
                    waiters: Vec::new(),
                    timer: Some(timer.abort_handle()),
                });
            }
            let open = state.open.as_mut().expect("opened above");
            open.items.push((id, item));
            open.bytes += size;
            open.waiters.push(answer);
            let generation = open.generation;
            if open.items.len() >= limits.max_messages {
                leaving.extend(state.open.take());
            }
            (generation, leaving)
        };
        let _seat = Seat {
            shared: &self.shared,
            generation,
            id,
        };
        for mut batch in leaving {
            if let Some(timer) = batch.timer.take() {
                timer.abort();
            }
            tokio::spawn(send(Arc::clone(&self.shared), batch));
        }
        match outcome.await {
            Ok(result) => result,
            // Only if the sending task panicked or the runtime is shutting down.
            Err(_) => Err(PublishError::new("the batch was not sent")),
        }
    }
}

/// Sends batch `generation` at `max_wait`, unless it already left.
async fn send_when_due<T: Send + 'static>(shared: Arc<Shared<T>>, generation: u64) {
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

/// Sends `batch` and gives every waiter its outcome.
async fn send<T: Send + 'static>(shared: Arc<Shared<T>>, batch: OpenBatch<T>) {
    if batch.items.is_empty() {
        return; // every caller was cancelled
    }
    let count = batch.items.len();
    let items = batch.items.into_iter().map(|(_, item)| item).collect();
    let mut results = (shared.send)(items).await.into_iter();
    for waiter in batch.waiters {
        let result = results.next().unwrap_or_else(|| {
            Err(PublishError::new(format!(
                "the batch of {count} had no outcome for this message"
            )))
        });
        // A caller that is gone was cancelled after the request started: nothing to tell.
        let _ = waiter.send(result);
    }
}

/// One outcome for each of `count` messages: what a request that answers for the whole
/// batch (a webhook's POST) gives each of them.
pub(crate) fn same_outcome(
    result: &Result<(), PublishError>,
    count: usize,
) -> Vec<Result<(), PublishError>> {
    (0..count).map(|_| copy(result)).collect()
}

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
    fn recorder(answer: fn() -> Result<(), PublishError>) -> (SendBatch<i64>, Sent) {
        let sent = Arc::new(Mutex::new(Vec::new()));
        let send: SendBatch<i64> = {
            let sent = Arc::clone(&sent);
            Arc::new(move |ids: Vec<i64>| {
                let count = ids.len();
                sent.lock().unwrap().push((ids, Instant::now()));
                Box::pin(async move { same_outcome(&answer(), count) })
            })
        };
        (send, sent)
    }

    fn batcher_of(
        max_messages: usize,
        max_bytes: usize,
        send: SendBatch<i64>,
    ) -> Arc<Batcher<i64>> {
        let limits = BatchLimits {
            max_messages,
            max_bytes,
            max_wait: Duration::from_millis(50),
        };
        Arc::new(Batcher::new(limits, send))
    }

    fn batcher(max_messages: usize, send: SendBatch<i64>) -> Arc<Batcher<i64>> {
        batcher_of(max_messages, usize::MAX, send)
    }

    /// Publishes each id (of `size` bytes) from a task of its own, in order.
    fn publish_sized(
        batcher: &Arc<Batcher<i64>>,
        ids: std::ops::Range<i64>,
        size: usize,
    ) -> Vec<tokio::task::JoinHandle<Result<(), PublishError>>> {
        ids.map(|id| {
            let batcher = Arc::clone(batcher);
            tokio::spawn(async move { batcher.publish(id, id, size).await })
        })
        .collect()
    }

    fn publish_all(
        batcher: &Arc<Batcher<i64>>,
        ids: std::ops::Range<i64>,
    ) -> Vec<tokio::task::JoinHandle<Result<(), PublishError>>> {
        publish_sized(batcher, ids, 1)
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
        let cancelled =
            tokio::time::timeout(Duration::from_millis(10), batcher.publish(1, 1, 1)).await;
        assert!(cancelled.is_err(), "the batch left early");
        kept.into_iter().next().unwrap().await.unwrap().unwrap();
        assert_eq!(sent.lock().unwrap()[0].0, [0]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_whose_callers_all_left_is_not_sent() {
        let (send, sent) = recorder(|| Ok(()));
        let batcher = batcher(10, send);
        let gone = tokio::time::timeout(Duration::from_millis(10), batcher.publish(1, 1, 1)).await;
        assert!(gone.is_err());
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(sent.lock().unwrap().is_empty());
    }
}

#[cfg(test)]
mod size_and_entry_tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_message_that_would_overflow_the_bytes_sends_the_open_batch_first() {
        let sent: Arc<Mutex<Vec<Vec<i64>>>> = Arc::default();
        let send: SendBatch<i64> = {
            let sent = Arc::clone(&sent);
            Arc::new(move |ids: Vec<i64>| {
                let count = ids.len();
                sent.lock().unwrap().push(ids);
                Box::pin(async move { same_outcome(&Ok(()), count) })
            })
        };
        let limits = BatchLimits {
            max_messages: 10,
            max_bytes: 100,
            max_wait: Duration::from_millis(50),
        };
        let batcher = Arc::new(Batcher::new(limits, send));
        let mut handles = Vec::new();
        for id in 0..5 {
            let batcher = Arc::clone(&batcher);
            handles.push(tokio::spawn(
                async move { batcher.publish(id, id, 40).await },
            ));
            tokio::task::yield_now().await;
        }
        for handle in handles {
            handle.await.unwrap().unwrap();
        }
        assert_eq!(*sent.lock().unwrap(), [vec![0, 1], vec![2, 3], vec![4]]);
    }

    #[tokio::test(start_paused = true)]
    async fn each_message_gets_its_own_entry_outcome() {
        let send: SendBatch<i64> = Arc::new(|ids: Vec<i64>| {
            Box::pin(async move {
                ids.iter()
                    .map(|id| match id % 2 {
                        0 => Ok(()),
                        _ => Err(PublishError::permanent(format!("entry {id} refused"))),
                    })
                    .collect()
            })
        });
        let limits = BatchLimits {
            max_messages: 4,
            max_bytes: usize::MAX,
            max_wait: Duration::from_millis(50),
        };
        let batcher = Arc::new(Batcher::new(limits, send));
        let handles: Vec<_> = (0..4)
            .map(|id| {
                let batcher = Arc::clone(&batcher);
                tokio::spawn(async move { batcher.publish(id, id, 1).await })
            })
            .collect();
        for (id, handle) in handles.into_iter().enumerate() {
            let result = handle.await.unwrap();
            match id % 2 {
                0 => assert!(result.is_ok()),
                _ => assert_eq!(result.unwrap_err().text(), format!("entry {id} refused")),
            }
        }
    }
}
