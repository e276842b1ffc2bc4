//! CloudEvents (version 1.0) as an option of every publisher: set [`CloudEvents`] on a
//! builder (`.cloudevents(CloudEvents::new("/shop/orders"))`) and each message goes out as
//! an event, in the content mode and with the attribute names of that transport's
//! binding.
//!
//! | event attribute | from |
//! | --- | --- |
//! | `id` | the message id (decimal): the outbox's deduplication key |
//! | `source` | [`CloudEvents::new`]'s argument (a URI reference naming the producer) |
//! | `type` | the outbox topic (before any topic mapping), or [`CloudEvents::event_type`] |
//! | `subject` | the outbox key (absent for keyless rows) |
//! | `time` | when the producer inserted the row, when the server said |
//! | `datacontenttype` | the row's `content-type` header; else `application/json` when the payload is JSON, else `application/octet-stream` |
//! | extensions | the row's headers and `txoutbox-id`, `-topic`, `-key`, named by the CloudEvents rules (below) |
//! | data | the payload |
//!
//! Extension names: CloudEvents allows only lower-case letters and digits, so a header's
//! name is lower-cased and everything else is left out (`txoutbox-id` becomes
//! `txoutboxid`; `traceparent` and `tracestate` stay, and are then the Distributed Tracing
//! extension). A header whose name comes out empty, or the same as an event attribute
//! (`id`, `type`, ...) or as an earlier header's, is not carried: rename it at the
//! producer. `content-type` becomes `datacontenttype`.
//!
//! Content modes, per binding ([`CloudEvents::structured`] chooses structured where the
//! binding has both; binary is the default):
//!
//! | transport | binary | structured |
//! | --- | --- | --- |
//! | HTTP (webhook) | headers `ce-id`, `ce-source`, ... (values percent-encoded where HTTP needs it), `content-type` = `datacontenttype`, body = payload | body = the JSON event, `content-type: application/cloudevents+json` |
//! | Kafka | headers `ce_id`, `ce_source`, ..., `content-type` = `datacontenttype`; the record key stays the outbox key | value = the JSON event, header `content-type: application/cloudevents+json` |
//! | AMQP (RabbitMQ) | headers `cloudEvents:id`, `cloudEvents:source`, ... (the AMQP binding's application-property names), `content_type` = `datacontenttype` | body = the JSON event, `content_type: application/cloudevents+json` |
//! | NATS | headers `ce-id`, `ce-source`, ..., `content-type` = `datacontenttype` (`Nats-Msg-Id` stays) | payload = the JSON event, header `content-type: application/cloudevents+json` |
//! | MQTT 5 | user properties `id`, `source`, ... (the MQTT binding's names, without a prefix), content type = `datacontenttype` | payload = the JSON event, content type `application/cloudevents+json` |
//! | Redis Streams | — (no binding exists) | field `payload` = the JSON event, field `content-type` = `application/cloudevents+json`; `id`, `topic` and `key` fields stay |
//!
//! In binary mode the usual headers (`txoutbox-id`, the row's own, ...) go too, beside
//! the attributes. In structured mode the event is the whole message: the transport
//! carries only its content type and what the transport itself needs (the Kafka record
//! key, `Nats-Msg-Id`, AMQP's `message_id` and `type` properties; Redis' `id`, `topic`
//! and `key` fields).
//!
//! In the JSON event (structured mode), a JSON payload (by `datacontenttype`) is the
//! `data` member as JSON; any other payload is `data_base64`.

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::time::SystemTime;

use base64::Engine;
use bytes::Bytes;

use crate::brokers::carried_headers;
use crate::Message;

/// The content type of a structured event.
pub const STRUCTURED_CONTENT_TYPE: &str = "application/cloudevents+json";
/// The attributes an extension may not be named after (CloudEvents 1.0's own).
const CONTEXT_ATTRIBUTES: [&str; 10] = [
    "id",
    "source",
    "specversion",
    "type",
    "datacontenttype",
    "dataschema",
    "subject",
    "time",
    "data",
    "data_base64",
];

/// How a publisher wraps each message as a CloudEvent; see the [module
/// documentation](self).
#[derive(Debug, Clone)]
pub struct CloudEvents {
    source: String,
    event_type: Option<String>,
    structured: bool,
}

impl CloudEvents {
    /// Events of `source` (a URI reference naming the producer, for example
    /// `/shop/orders` or `urn:shop:orders`), typed by topic, in binary mode.
    pub fn new(source: impl Into<String>) -> Self {
        Self {
            source: source.into(),
            event_type: None,
            structured: false,
        }
    }

    /// Every event's `type` (default: the message's outbox topic).
    pub fn event_type(mut self, event_type: impl Into<String>) -> Self {
        self.event_type = Some(event_type.into());
        self
    }

    /// Structured content mode: the whole event as JSON in the body (default: binary).
    pub fn structured(mut self) -> Self {
        self.structured = true;
        self
    }

    /// Whether events go out in structured mode.
    pub fn is_structured(&self) -> bool {
        self.structured
    }

    /// The event's attributes for `message`, `specversion` first, then the context
    /// attributes, then the extensions; `datacontenttype` included.
    pub fn attributes(&self, message: &Message) -> Vec<(Cow<'static, str>, String)> {
        let mut attributes: Vec<(Cow<'static, str>, String)> = vec![
            ("specversion".into(), "1.0".to_owned()),
            ("id".into(), message.id.to_string()),
            ("source".into(), self.source.clone()),
            (
                "type".into(),
                self.event_type
                    .clone()
                    .unwrap_or_else(|| message.topic.clone()),
            ),
            ("datacontenttype".into(), content_type(message).into_owned()),
        ];
        if let Some(key) = &message.key {
            attributes.push(("subject".into(), key.clone()));
        }
        if let Some(time) = message.created_at {
            attributes.push(("time".into(), rfc3339(time)));
        }
        let mut taken: BTreeSet<String> = BTreeSet::new();
        for (name, value) in carried_headers(message) {
            if name.eq_ignore_ascii_case("content-type") {
                continue;
            }
            let name = extension_name(name);
            if name.is_empty() || CONTEXT_ATTRIBUTES.contains(&name.as_str()) {
                continue;
            }
            if taken.insert(name.clone()) {
                attributes.push((name.into(), value.into_owned()));
            }
        }
        attributes
    }

    /// The event in structured mode: its JSON.
    pub fn structured_body(&self, message: &Message) -> Bytes {
        let mut event = serde_json::Map::new();
        let mut json_data = false;
        for (name, value) in self.attributes(message) {
            if name == "datacontenttype" {
                json_data = is_json(&value);
            }
            event.insert(name.into_owned(), serde_json::Value::String(value));
        }
        let parsed = json_data
            .then(|| serde_json::from_slice::<serde_json::Value>(&message.payload).ok())
            .flatten();
        match parsed {
            Some(data) => event.insert("data".to_owned(), data),
            None => event.insert(
                "data_base64".to_owned(),
                base64::engine::general_purpose::STANDARD
                    .encode(&message.payload)
                    .into(),
            ),
        };
        Bytes::from(serde_json::to_vec(&event).expect("JSON values serialize"))
    }

    /// The headers of binary mode, each attribute's name behind `prefix` (`ce-`, `ce_`,
    /// `cloudEvents:`, or none), except `datacontenttype`, which is returned apart: each
    /// binding carries it in its content type. `encode` turns a value into what the
    /// transport takes.
    pub fn binary_headers(
        &self,
        message: &Message,
        prefix: &str,
        encode: impl Fn(&str) -> String,
    ) -> (Vec<(String, String)>, String) {
        let mut content_type = String::new();
        let mut headers = Vec::new();
        for (name, value) in self.attributes(message) {
            if name == "datacontenttype" {
                content_type = value;
            } else {
                headers.push((format!("{prefix}{name}"), encode(&value)));
            }
        }
        (headers, content_type)
    }
}

/// The transports, each with its binding's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(dead_code)] // each is used by the publisher of some feature only
pub(crate) enum Binding {
    Http,
    Kafka,
    Amqp,
    Nats,
    Mqtt,
    /// No binding: structured only.
    Redis,
    /// SQS and SNS (no binding exists): message attributes `ce-id`, ... in binary mode,
    /// within the services' 10 attributes.
    Aws,
}

/// What a publisher sends for a message as a CloudEvent, besides its usual headers (which
/// it keeps in binary mode, so consumers that read `txoutbox-id` go on doing so) unless
/// `replaces_headers`.
#[allow(dead_code)] // each field is used by the publishers of some features only
pub(crate) struct Envelope {
    /// The event's attributes as the binding names them (binary mode), or none.
    pub headers: Vec<(String, String)>,
    /// The message's content type: `datacontenttype`, or the structured event's.
    pub content_type: String,
    /// The payload, or the JSON event.
    pub body: Bytes,
    /// In structured mode the event is the whole message: other headers would be read
    /// as attributes by some consumers (the Python SDK's Kafka binding does). MQTT's
    /// binary mode names its attributes without a prefix: the usual user properties would
    /// repeat the extensions under their other names.
    pub replaces_headers: bool,
}

impl CloudEvents {
    #[allow(dead_code)] // used by the publishers' modules, each behind its feature
    pub(crate) fn envelope(&self, message: &Message, binding: Binding) -> Envelope {
        if self.structured || binding == Binding::Redis {
            return Envelope {
                headers: Vec::new(),
                content_type: STRUCTURED_CONTENT_TYPE.to_owned(),
                body: self.structured_body(message),
                replaces_headers: true,
            };
        }
        let (prefix, encode): (&str, fn(&str) -> String) = match binding {
            Binding::Http => ("ce-", percent_encode),
            Binding::Kafka => ("ce_", str::to_owned),
            Binding::Amqp => ("cloudEvents:", str::to_owned),
            Binding::Nats => ("ce-", str::to_owned),
            Binding::Aws => ("ce-", str::to_owned),
            Binding::Mqtt | Binding::Redis => ("", str::to_owned),
        };
        let (mut headers, content_type) = self.binary_headers(message, prefix, encode);
        if binding == Binding::Aws {
            // Ten attributes at most: `id` and `subject` already say these.
            headers.retain(|(name, _)| name != "ce-txoutboxid" && name != "ce-txoutboxkey");
        }
        Envelope {
            headers,
            content_type,
            body: message.payload.clone(),
            replaces_headers: matches!(binding, Binding::Mqtt | Binding::Aws),
        }
    }
}

/// The `cloudevents` method of a publisher builder with a
/// `cloudevents: Option<CloudEvents>` field.
#[allow(unused_macros)] // used by the publishers' modules, each behind its feature
macro_rules! cloudevents_method {
    () => {
        /// Sends each message as a CloudEvent, in the content mode and with the names of
        /// this transport's binding: see [`CloudEvents`](crate::brokers::CloudEvents).
        pub fn cloudevents(mut self, events: $crate::brokers::CloudEvents) -> Self {
            self.cloudevents = Some(events);
            self
        }
    };
}
#[allow(unused_imports)] // used by the publishers' modules, each behind its feature
pub(crate) use cloudevents_method;

/// A header's name as a CloudEvents extension: lower-case ASCII letters and digits only.
pub fn extension_name(header: &str) -> String {
    header
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect()
}

/// The payload's content type: the row's `content-type` header, or a guess.
fn content_type(message: &Message) -> Cow<'_, str> {
    let given = message
        .headers
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case("content-type"));
    match given {
        Some((_, value)) => Cow::Borrowed(value),
        None if serde_json::from_slice::<serde::de::IgnoredAny>(&message.payload).is_ok() => {
            Cow::Borrowed("application/json")
        }
        None => Cow::Borrowed("application/octet-stream"),
    }
}

/// `application/json`, `text/json` or any `+json` type, parameters aside.
fn is_json(content_type: &str) -> bool {
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    essence == "application/json" || essence == "text/json" || essence.ends_with("+json")
}

fn rfc3339(time: SystemTime) -> String {
    humantime::format_rfc3339_millis(time).to_string()
}

/// A value as the HTTP binding writes it in a header: percent-encoded outside printable
/// ASCII, and for space, `"` and `%`.
pub fn percent_encode(value: &str) -> String {
    let mut encoded = String::with_capacity(value.len());
    for byte in value.bytes() {
        if (0x21..=0x7e).contains(&byte) && byte != b'"' && byte != b'%' {
            encoded.push(byte as char);
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    fn message() -> Message {
        let mut message = Message::new(7, "orders.paid", r#"{"order":7}"#)
            .with_key("customer-1")
            .with_header("traceparent", "00-abc")
            .with_header("X-Tenant_Id", "t1")
            .with_header("ID", "forged")
            .with_header("xtenantid", "second of one name");
        message.created_at = Some(UNIX_EPOCH + Duration::from_millis(1_700_000_000_123));
        message
    }

    #[test]
    fn attributes_come_from_the_message_and_headers_are_sanitised_extensions() {
        let attributes = CloudEvents::new("/shop").attributes(&message());
        let get = |name: &str| {
            attributes
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(get("specversion"), Some("1.0"));
        assert_eq!(get("id"), Some("7"));
        assert_eq!(get("source"), Some("/shop"));
        assert_eq!(get("type"), Some("orders.paid"));
        assert_eq!(get("subject"), Some("customer-1"));
        assert_eq!(get("time"), Some("2023-11-14T22:13:20.123Z"));
        assert_eq!(get("datacontenttype"), Some("application/json"));
        assert_eq!(get("traceparent"), Some("00-abc"));
        assert_eq!(get("xtenantid"), Some("t1"), "the first header of the name");
        assert_eq!(get("txoutboxid"), Some("7"));
        assert_eq!(get("txoutboxkey"), Some("customer-1"));
        assert_eq!(
            attributes.iter().filter(|(n, _)| n == "id").count(),
            1,
            "a header named like an attribute is left out"
        );
    }

    #[test]
    fn structured_events_hold_json_as_data_and_anything_else_in_base64() {
        let events = CloudEvents::new("/shop").event_type("shop.order");
        let json: serde_json::Value =
            serde_json::from_slice(&events.structured_body(&message())).unwrap();
        assert_eq!(json["data"]["order"], 7);
        assert_eq!(json["type"], "shop.order");
        let binary = Message::new(8, "blobs", vec![0u8, 159, 146, 150]);
        let json: serde_json::Value =
            serde_json::from_slice(&events.structured_body(&binary)).unwrap();
        assert_eq!(json["datacontenttype"], "application/octet-stream");
        assert_eq!(json["data_base64"], "AJ+Slg==");
        assert!(json.get("subject").is_none());
    }

    #[test]
    fn binary_headers_carry_the_prefix_and_leave_the_content_type_apart() {
        let (headers, content_type) =
            CloudEvents::new("/shop").binary_headers(&message(), "ce_", str::to_owned);
        assert_eq!(content_type, "application/json");
        assert_eq!(headers[0], ("ce_specversion".to_owned(), "1.0".to_owned()));
        assert!(headers.iter().all(|(n, _)| n != "ce_datacontenttype"));
    }

    #[test]
    fn http_header_values_are_percent_encoded() {
        assert_eq!(percent_encode("a b\"%é"), "a%20b%22%25%C3%A9");
    }
}
