//! The message a publisher receives: one row of an outbox table.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;

use crate::proto::{prost_types, v1};

/// One outbox row handed to a [`Publisher`](crate::Publisher).
///
/// Delivery is at-least-once: a message may arrive again (after a crash, a lost lease or
/// a server restart), so downstream consumers should deduplicate on [`Message::id`].
///
/// ```
/// use txoutbox_client::Message;
///
/// let message = Message::new(7, "orders.created", r#"{"order":42}"#).with_key("customer-1");
/// assert_eq!(message.payload_str().unwrap(), r#"{"order":42}"#);
/// let value: serde_json::Value = message.payload_json().unwrap();
/// assert_eq!(value["order"], 42);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    /// Identifier of the row, unique within its outbox; insertion order is id order.
    /// Use it as the deduplication key downstream.
    pub id: i64,
    /// Topic the producer chose, for example `orders.created`.
    pub topic: String,
    /// Ordering key: messages sharing a key are published one after another, in id order.
    /// `None` for keyless messages, which are independent of each other.
    pub key: Option<String>,
    /// The payload exactly as the producer wrote it.
    pub payload: Bytes,
    /// Producer-set headers, for example a W3C `traceparent`.
    pub headers: BTreeMap<String, String>,
    /// How many times this message has been claimed, including this delivery (1 at first).
    pub attempts: u32,
    /// When the producer inserted the row (database clock), if the server said.
    pub created_at: Option<SystemTime>,
    /// Names this delivery (row, attempt, lease holder); opaque. The subscriber and the
    /// worker send it back with their answers, so an answer applies to this delivery
    /// only (docs/lease-tokens.md). Empty for a message a server did not deliver.
    pub lease_token: String,
}

impl Message {
    /// A keyless message without headers, on its first attempt: for tests of publishers.
    pub fn new(id: i64, topic: impl Into<String>, payload: impl Into<Bytes>) -> Self {
        Self {
            id,
            topic: topic.into(),
            key: None,
            payload: payload.into(),
            headers: BTreeMap::new(),
            attempts: 1,
            created_at: None,
            lease_token: String::new(),
        }
    }

    /// The same message with an ordering key.
    pub fn with_key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// The same message with one more header.
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(name.into(), value.into());
        self
    }

    /// The payload as UTF-8 text.
    pub fn payload_str(&self) -> Result<&str, std::str::Utf8Error> {
        std::str::from_utf8(&self.payload)
    }

    /// The payload parsed as JSON into `T`.
    pub fn payload_json<T: serde::de::DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_slice(&self.payload)
    }
}

impl From<v1::Message> for Message {
    fn from(message: v1::Message) -> Self {
        Self {
            id: message.id,
            topic: message.topic,
            key: message.key,
            payload: Bytes::from(message.payload),
            headers: message.headers.into_iter().collect(),
            attempts: message.attempts,
            created_at: message.created_at.and_then(system_time),
            lease_token: message.lease_token,
        }
    }
}

/// A protobuf timestamp as a `SystemTime`; `None` before the epoch or when malformed.
pub(crate) fn system_time(timestamp: prost_types::Timestamp) -> Option<SystemTime> {
    let seconds = u64::try_from(timestamp.seconds).ok()?;
    let nanos = u32::try_from(timestamp.nanos).ok()?;
    UNIX_EPOCH.checked_add(Duration::new(seconds, nanos))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts_from_the_wire() {
        let wire = v1::Message {
            id: 3,
            topic: "t".into(),
            key: Some("k".into()),
            payload: b"p".to_vec(),
            headers: [("a".to_owned(), "b".to_owned())].into_iter().collect(),
            attempts: 2,
            created_at: Some(prost_types::Timestamp {
                seconds: 10,
                nanos: 5,
            }),
            lease_token: "v1.3.2.w".into(),
        };
        let message = Message::from(wire);
        assert_eq!(message.key.as_deref(), Some("k"));
        assert_eq!(&message.payload[..], b"p");
        assert_eq!(message.headers["a"], "b");
        assert_eq!(message.attempts, 2);
        assert_eq!(message.created_at, Some(UNIX_EPOCH + Duration::new(10, 5)));
    }
}
