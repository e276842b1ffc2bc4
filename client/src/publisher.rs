//! What publishes a message to a broker: the [`Publisher`] trait, implemented by your
//! type or by any async closure, and the [`PublishError`] it returns.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use crate::Message;

/// Publishes one message to a broker (Kafka, NATS, a webhook...).
///
/// Return `Ok(())` only once the broker has confirmed the message: the runtime then acks
/// it and it is never delivered again. Any error nacks it: the server schedules a retry
/// (or dead-letters it on its last attempt) and the later messages of its key wait.
///
/// Implement it on your own type, or pass an async closure taking a [`Message`]:
///
/// ```no_run
/// use txoutbox_client::{Message, PublishError, Publisher};
///
/// struct Stdout;
///
/// #[async_trait::async_trait]
/// impl Publisher for Stdout {
///     async fn publish(&self, message: &Message) -> Result<(), PublishError> {
///         println!("{} {}", message.topic, message.payload_str()?);
///         Ok(())
///     }
/// }
///
/// // The same as a closure:
/// let publisher = |message: Message| async move {
///     println!("{} {:?}", message.topic, message.payload);
///     Ok::<_, PublishError>(())
/// };
/// # fn takes(_: impl Publisher) {}
/// # takes(Stdout);
/// # takes(publisher);
/// ```
///
/// A publish runs on the Tokio runtime (it must be `Send`) and is cancelled after the
/// configured `publish_timeout`. The same publisher is called concurrently for messages
/// of different keys.
#[async_trait::async_trait]
pub trait Publisher: Send + Sync + 'static {
    /// Publishes `message`; `Ok` only when the broker has it.
    async fn publish(&self, message: &Message) -> Result<(), PublishError>;
}

/// Any `Fn(Message) -> impl Future<Output = Result<(), E>>` is a publisher, for any error
/// that converts into [`PublishError`] (itself, or any `std::error::Error`).
#[async_trait::async_trait]
impl<F, Fut, E> Publisher for F
where
    F: Fn(Message) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), E>> + Send,
    E: Into<PublishError>,
{
    async fn publish(&self, message: &Message) -> Result<(), PublishError> {
        (self)(message.clone()).await.map_err(Into::into)
    }
}

/// Why a publish failed, and what to do about it.
///
/// By default the message is nacked: retried later with the outbox's backoff policy.
/// [`PublishError::retry_after`] asks for a specific delay (for example a broker's
/// `Retry-After`); [`PublishError::permanent`] dead-letters the message at once, for
/// failures no retry can fix (a payload the broker will never accept).
///
/// Every `std::error::Error` converts into it, so `?` works inside a publisher. The text
/// sent to the server (and stored with the row for operators) is the error and its chain
/// of sources.
///
/// ```
/// use std::time::Duration;
/// use txoutbox_client::PublishError;
///
/// let busy = PublishError::new("broker is throttling").retry_after(Duration::from_secs(5));
/// assert_eq!(busy.retry_delay(), Some(Duration::from_secs(5)));
/// let invalid = PublishError::permanent("payload is not valid Avro");
/// assert!(invalid.is_permanent());
/// ```
pub struct PublishError {
    text: String,
    retry_delay: Option<Duration>,
    permanent: bool,
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl PublishError {
    /// A failure worth retrying, described by `text`.
    pub fn new(text: impl fmt::Display) -> Self {
        Self {
            text: text.to_string(),
            retry_delay: None,
            permanent: false,
            source: None,
        }
    }

    /// A failure no retry can fix: the message is dead-lettered at once.
    pub fn permanent(text: impl fmt::Display) -> Self {
        Self {
            permanent: true,
            ..Self::new(text)
        }
    }

    /// Wraps an error, keeping it as the source; its chain becomes the text.
    pub fn from_error(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        let mut text = error.to_string();
        let mut cause = error.source();
        while let Some(inner) = cause {
            text.push_str(": ");
            text.push_str(&inner.to_string());
            cause = inner.source();
        }
        Self {
            source: Some(Box::new(error)),
            ..Self::new(text)
        }
    }

    /// Retry after `delay` instead of the outbox's backoff delay (the server caps it at
    /// the policy's maximum).
    pub fn retry_after(mut self, delay: Duration) -> Self {
        self.retry_delay = Some(delay);
        self
    }

    /// Marks the failure as permanent: dead-letter the message instead of retrying.
    pub fn into_permanent(mut self) -> Self {
        self.permanent = true;
        self
    }

    /// The publish did not finish within `timeout`.
    pub(crate) fn timed_out(timeout: Duration) -> Self {
        Self::new(format!("publish timed out after {}ms", timeout.as_millis()))
    }

    /// The text stored with the row.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The retry delay asked for, if any.
    pub fn retry_delay(&self) -> Option<Duration> {
        self.retry_delay
    }

    /// Whether the message should be dead-lettered rather than retried.
    pub fn is_permanent(&self) -> bool {
        self.permanent
    }

    /// The wrapped error, if this was made from one.
    pub fn source(&self) -> Option<&(dyn std::error::Error + Send + Sync + 'static)> {
        self.source.as_deref()
    }
}

impl fmt::Display for PublishError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl fmt::Debug for PublishError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PublishError")
            .field("text", &self.text)
            .field("retry_delay", &self.retry_delay)
            .field("permanent", &self.permanent)
            .finish()
    }
}

// `PublishError` deliberately does not implement `std::error::Error`, so that this
// blanket conversion (what makes `?` work in publishers) does not overlap `From<T> for T`.
impl<E: std::error::Error + Send + Sync + 'static> From<E> for PublishError {
    fn from(error: E) -> Self {
        Self::from_error(error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn the_text_carries_the_chain_of_sources() {
        let error = PublishError::from(Outer(std::io::Error::other("inner")));
        assert_eq!(error.text(), "outer: inner");
        assert!(error.source().is_some());
        assert!(!error.is_permanent());
    }

    #[tokio::test]
    async fn closures_are_publishers() {
        let publisher = |message: Message| async move {
            if message.id == 1 {
                Ok(())
            } else {
                Err(PublishError::new("nope"))
            }
        };
        assert!(publisher.publish(&Message::new(1, "t", "p")).await.is_ok());
        let error = publisher
            .publish(&Message::new(2, "t", "p"))
            .await
            .unwrap_err();
        assert_eq!(error.text(), "nope");
    }
}
