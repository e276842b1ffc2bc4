//! The subscriber's answers on their way from the connection to the loop.
//!
//! The gRPC layer reads answers off the connection as soon as they arrive, whatever the
//! loop is doing: HTTP/2 counts small DATA frames left unread against a per-connection
//! budget and closes the whole connection (GOAWAY, every stream on it) once it runs out,
//! which a burst of a few thousand nacks did while the loop applied them one by one. So
//! the bound lives here instead, per stream: at most [`MAX_QUEUED_ANSWERS`] answers and
//! [`MAX_QUEUED_BYTES`] bytes wait to be applied, far more than a subscriber holding its
//! whole window (10,000 messages) needs to answer each once. Past it the sender gets
//! [`Full`] and the stream ends with RESOURCE_EXHAUSTED: a client sending answers without
//! ever waiting for `settled` is refused, the connection and its other streams are not.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::mpsc;

use super::answers::Answer;
use crate::config::MAX_WINDOW;
use crate::relay::{RelayError, RelayResult};

/// Most answers waiting to be applied on one stream.
pub const MAX_QUEUED_ANSWERS: usize = 2 * MAX_WINDOW as usize + 1000;
/// Most bytes of answers waiting to be applied on one stream.
pub const MAX_QUEUED_BYTES: usize = 32 * 1024 * 1024;

/// A new answer queue: the sending half for the connection's reader, the receiving half
/// for the subscription loop.
pub fn answer_queue() -> (AnswerSender, AnswerReceiver) {
    let (tx, rx) = mpsc::unbounded_channel();
    let queued = Arc::new(Queued::default());
    (
        AnswerSender {
            tx,
            queued: Arc::clone(&queued),
        },
        AnswerReceiver { rx, queued },
    )
}

#[derive(Default)]
struct Queued {
    answers: AtomicUsize,
    bytes: AtomicUsize,
}

pub struct AnswerSender {
    tx: mpsc::UnboundedSender<(RelayResult<Answer>, usize)>,
    queued: Arc<Queued>,
}

/// Why an answer was not queued.
#[derive(Debug, PartialEq, Eq)]
pub enum SendError {
    /// The subscription has ended.
    Closed,
    /// The queue is at its bound; the error to end the stream with.
    Full,
}

impl AnswerSender {
    /// Queues `answer`, unless the queue is full or the subscription ended. An error (the
    /// last thing the reader sends) is queued whatever the bound.
    pub fn send(&self, answer: RelayResult<Answer>) -> Result<(), SendError> {
        let Ok(bytes) = answer.as_ref().map(Answer::bytes) else {
            return self.push(answer, 0);
        };
        let answers = self.queued.answers.load(Ordering::Relaxed);
        let queued_bytes = self.queued.bytes.load(Ordering::Relaxed);
        if answers >= MAX_QUEUED_ANSWERS || queued_bytes + bytes > MAX_QUEUED_BYTES {
            return Err(SendError::Full);
        }
        self.push(answer, bytes)
    }

    /// Ends the stream with RESOURCE_EXHAUSTED, past the bound (the queue holds it at most
    /// once: the reader stops after it).
    pub fn overflow(&self) {
        let error = RelayError::ResourceExhausted(format!(
            "more than {MAX_QUEUED_ANSWERS} answers or {} MiB of them were waiting to be \
             applied; wait for `settled` before sending more",
            MAX_QUEUED_BYTES / (1024 * 1024)
        ));
        let _ = self.push(Err(error), 0);
    }

    fn push(&self, answer: RelayResult<Answer>, bytes: usize) -> Result<(), SendError> {
        self.queued.answers.fetch_add(1, Ordering::Relaxed);
        self.queued.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.tx.send((answer, bytes)).map_err(|_| SendError::Closed)
    }

    /// Completes when the subscription has ended.
    pub async fn closed(&self) {
        self.tx.closed().await
    }
}

pub struct AnswerReceiver {
    rx: mpsc::UnboundedReceiver<(RelayResult<Answer>, usize)>,
    queued: Arc<Queued>,
}

impl AnswerReceiver {
    /// The next answer; `None` once the reader is gone and the queue is empty.
    pub async fn recv(&mut self) -> Option<RelayResult<Answer>> {
        let next = self.rx.recv().await?;
        Some(self.taken(next))
    }

    /// The next answer if one is waiting.
    pub fn try_recv(&mut self) -> Option<RelayResult<Answer>> {
        let next = self.rx.try_recv().ok()?;
        Some(self.taken(next))
    }

    fn taken(&self, (answer, bytes): (RelayResult<Answer>, usize)) -> RelayResult<Answer> {
        self.queued.answers.fetch_sub(1, Ordering::Relaxed);
        self.queued.bytes.fetch_sub(bytes, Ordering::Relaxed);
        answer
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_refuses_past_its_bound_and_frees_what_the_loop_takes() {
        let (tx, mut rx) = answer_queue();
        for _ in 0..MAX_QUEUED_ANSWERS {
            tx.send(Ok(Answer::SetWindow(1))).unwrap();
        }
        assert_eq!(tx.send(Ok(Answer::SetWindow(1))), Err(SendError::Full));
        assert!(rx.try_recv().is_some());
        tx.send(Ok(Answer::SetWindow(1))).unwrap();
        let big = Answer::Nack {
            id: 1,
            error: "e".repeat(MAX_QUEUED_BYTES),
            delay: None,
        };
        assert_eq!(tx.send(Ok(big)), Err(SendError::Full));
    }
}
