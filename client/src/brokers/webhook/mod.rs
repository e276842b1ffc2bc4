//! Publishing to an HTTP endpoint (feature `webhook`): [`WebhookPublisher`] POSTs each
//! message (or, opt-in, each batch of messages) and returns once the endpoint answered
//! 2xx. reqwest with rustls (ring), no OpenSSL.
//!
//! One message per request (the default):
//!
//! | outbox | HTTP request |
//! | --- | --- |
//! | `payload` | the body, byte for byte (`content-type: application/octet-stream` unless the row has a `content-type` header) |
//! | `id`, `topic`, `key` | headers `txoutbox-id`, `txoutbox-topic`, `txoutbox-key` (absent for keyless rows) |
//! | `headers` | headers of the same names |
//! | (the secret) | `txoutbox-signature: t=TIMESTAMP,v1=HMAC-SHA256(secret, "TIMESTAMP.BODY")` in hex, the Stripe/GitHub convention: see [`signature`] for how a receiver checks it |
//!
//! One batch per request, with [`WebhookPublisherBuilder::batch`] (`txoutbox relay
//! --webhook-batch N`): the messages the runtime publishes at about the same time (one
//! per key, concurrently) go in one POST, and all of them get its answer. A batch leaves
//! when it holds `max_messages`, or `max_wait` after its first message arrived, whichever
//! comes first; per-key order holds, because a batch never holds two messages of one key
//! (the rules are listed in `brokers/batch.rs`).
//!
//! | batch | HTTP request |
//! | --- | --- |
//! | the messages | the body: a JSON array, one object per message in arrival order: `{"id": 7, "topic": "orders.paid", "key": "customer-1" (or null), "headers": {...}, "payload": "..."}`, where `payload` is the payload as text when it is UTF-8, and is replaced by `payload_base64` (standard base64) when it is not |
//! | | `content-type: application/json`, `txoutbox-batch-size: N` |
//! | (the secret) | `txoutbox-signature` over the whole body, as for one message |
//!
//! The `headers` object holds the row's own headers; `txoutbox-id`, `-topic` and `-key`
//! are the fields `id`, `topic` and `key`. Headers given with
//! [`WebhookPublisherBuilder::header`] go on the request.
//!
//! One URL for every message: the endpoint tells topics apart by `txoutbox-topic` (a
//! topic mapping has nothing to choose here). Redirects are not followed: a POST turned
//! into a GET would lose the body.
//!
//! Answers (`classify`, the one place they are sorted):
//!
//! | answer | outcome |
//! | --- | --- |
//! | 2xx | published: the row is acked |
//! | 408, 429, 5xx, no answer within `timeout` (default 8s), no connection | retried, after `Retry-After` (seconds or an HTTP date) when the answer has one |
//! | any other 4xx | permanent: dead-lettered, unless listed with [`WebhookPublisherBuilder::retry_status`] |
//! | 1xx, 3xx | retried (the URL is wrong, not the message) |
//!
//! In a batch, the one answer applies to every message: a 2xx acks them all, a retried
//! answer nacks them all (honouring `Retry-After`), a permanent one dead-letters them all.
//!
//! TLS: an `https://` URL; [`WebhookPublisherBuilder::tls_ca`] trusts a private CA (then
//! only it), [`WebhookPublisherBuilder::tls_client_cert`] presents a client certificate to
//! an endpoint that requires one.
//!
//! The endpoint must be idempotent on `txoutbox-id` (on each element's `id` in a batch):
//! a message whose answer was lost is sent again.
//!
//! ```no_run
//! use txoutbox_client::webhook::WebhookPublisher;
//! use txoutbox_client::Subscriber;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let hook = WebhookPublisher::builder("https://example.com/hooks/orders")
//!     .secret(std::env::var("WEBHOOK_SECRET")?)
//!     .build()?;
//! Subscriber::builder(["http://127.0.0.1:7411"], "orders")
//!     .build(hook)?
//!     .run_until_signal()
//!     .await?;
//! # Ok(())
//! # }
//! ```

mod builder;
pub mod signature;

pub use builder::WebhookPublisherBuilder;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use base64::Engine;
use bytes::Bytes;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use reqwest::{StatusCode, Url};

use crate::brokers::batch::{BatchLimits, Batcher, SendBatch};
use crate::brokers::{carried_headers, is_reserved, Binding, CloudEvents, TlsFiles};
use crate::{Message, PublishError, Publisher};

/// reqwest itself, for [`WebhookPublisher::from_client`].
pub use reqwest;

/// Default wait for an answer: below the subscriber's default `publish_timeout` (10s).
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(8);
/// How much of an error answer's body goes into the row's error text.
const ERROR_BODY_LIMIT: usize = 200;
/// Header of a batch request: how many messages its body holds.
pub const BATCH_SIZE_HEADER: &str = "txoutbox-batch-size";

/// POSTs outbox messages to one URL, signed; see the [module documentation](self) for the
/// request and how answers are sorted.
pub struct WebhookPublisher {
    endpoint: Arc<Endpoint>,
    /// Set when batching is on: gathers concurrent publishes into one POST.
    batcher: Option<Batcher<Message>>,
}

/// Where requests go and how they are made; shared with the batcher's sending tasks.
struct Endpoint {
    url: Url,
    secret: Option<Vec<u8>>,
    headers: HeaderMap,
    retried_statuses: BTreeSet<u16>,
    client: reqwest::Client,
    cloudevents: Option<CloudEvents>,
}

impl fmt::Debug for WebhookPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookPublisher")
            .field("url", &self.endpoint.url.as_str())
            .field("signed", &self.endpoint.secret.is_some())
            .field("batched", &self.batcher.is_some())
            .finish_non_exhaustive()
    }
}

impl WebhookPublisher {
    /// Starts configuring a publisher that POSTs to `url` (`http://` or `https://`).
    pub fn builder(url: impl Into<String>) -> WebhookPublisherBuilder {
        WebhookPublisherBuilder {
            url: url.into(),
            secret: None,
            timeout: DEFAULT_TIMEOUT,
            headers: Vec::new(),
            retried_statuses: BTreeSet::new(),
            client: None,
            batch: None,
            tls: TlsFiles::default(),
            cloudevents: None,
        }
    }

    /// Starts configuring a publisher with an HTTP client you made (proxies, client
    /// certificates...); its own timeout applies, `timeout` does not.
    pub fn from_client(url: impl Into<String>, client: reqwest::Client) -> WebhookPublisherBuilder {
        WebhookPublisherBuilder {
            client: Some(client),
            ..Self::builder(url)
        }
    }

    /// The headers of the request for `message`, signed at `timestamp` (Unix seconds).
    /// A row header that is not a valid HTTP header is a permanent error.
    pub fn headers(&self, message: &Message, timestamp: u64) -> Result<HeaderMap, PublishError> {
        Ok(self.endpoint.request(message, timestamp)?.0)
    }
}

impl Endpoint {
    /// The headers and body of the request for `message`.
    fn request(
        &self,
        message: &Message,
        timestamp: u64,
    ) -> Result<(HeaderMap, Bytes), PublishError> {
        let mut headers = self.headers.clone();
        let envelope = self
            .cloudevents
            .as_ref()
            .map(|events| events.envelope(message, Binding::Http));
        if !envelope.as_ref().is_some_and(|e| e.replaces_headers) {
            for (name, value) in carried_headers(message) {
                let (name, value) = header(name, &value).map_err(PublishError::permanent)?;
                headers.insert(name, value);
            }
        }
        let mut body = message.payload.clone();
        if let Some(envelope) = envelope {
            let content_type = ("content-type".to_owned(), envelope.content_type);
            for (name, value) in envelope.headers.into_iter().chain([content_type]) {
                let (name, value) = header(&name, &value).map_err(PublishError::permanent)?;
                headers.insert(name, value);
            }
            body = envelope.body;
        }
        if !headers.contains_key(CONTENT_TYPE) {
            headers.insert(
                CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            );
        }
        self.sign(&mut headers, timestamp, &body);
        Ok((headers, body))
    }

    fn sign(&self, headers: &mut HeaderMap, timestamp: u64, body: &[u8]) {
        if let Some(secret) = &self.secret {
            let signed = signature::sign(secret, timestamp, body);
            headers.insert(
                signature::SIGNATURE_HEADER,
                HeaderValue::try_from(signed).expect("hex and digits are a valid header value"),
            );
        }
    }

    /// POSTs one message.
    async fn post_one(&self, message: &Message) -> Result<(), PublishError> {
        let (headers, body) = self.request(message, signature::unix_now())?;
        self.post(headers, body, "").await?;
        tracing::trace!(id = message.id, "accepted by the webhook");
        Ok(())
    }

    /// POSTs `messages` as one JSON array.
    async fn post_batch(&self, messages: &[Message]) -> Result<(), PublishError> {
        let body = batch_body(messages);
        let mut headers = self.headers.clone();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(BATCH_SIZE_HEADER, HeaderValue::from(messages.len()));
        self.sign(&mut headers, signature::unix_now(), &body);
        let context = format!(" (a batch of {})", messages.len());
        self.post(headers, body.into(), &context).await?;
        tracing::trace!(messages = messages.len(), "batch accepted by the webhook");
        Ok(())
    }

    /// Sends a request and sorts its answer; `context` ends the error text.
    async fn post(
        &self,
        headers: HeaderMap,
        body: Bytes,
        context: &str,
    ) -> Result<(), PublishError> {
        let sent = self
            .client
            .post(self.url.clone())
            .headers(headers)
            .body(body)
            .send()
            .await;
        let response = match sent {
            Ok(response) => response,
            Err(error) => {
                return Err(PublishError::new(format!(
                    "webhook {}: {error}{context}",
                    self.url
                )))
            }
        };
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        let retry_after = response
            .headers()
            .get(RETRY_AFTER)
            .and_then(|value| retry_after(value, SystemTime::now()));
        let body = response.bytes().await.unwrap_or_default();
        let body = String::from_utf8_lossy(&body[..body.len().min(ERROR_BODY_LIMIT)]);
        let text = format!(
            "webhook {} answered {status}: {}{context}",
            self.url,
            body.trim()
        );
        Err(classify(status, &self.retried_statuses, retry_after, text))
    }
}

#[async_trait::async_trait]
impl Publisher for WebhookPublisher {
    async fn publish(&self, message: &Message) -> Result<(), PublishError> {
        match &self.batcher {
            Some(batcher) => batcher.publish(message.id, message.clone(), 0).await,
            None => self.endpoint.post_one(message).await,
        }
    }
}

/// One element of a batch's JSON array.
#[derive(serde::Serialize)]
struct BatchElement<'m> {
    id: i64,
    topic: &'m str,
    key: Option<&'m str>,
    headers: BTreeMap<&'m str, &'m str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    payload: Option<&'m str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    payload_base64: Option<String>,
}

/// The body of a batch request: a JSON array, one object per message, the payload as
/// text when it is UTF-8 and as base64 otherwise.
fn batch_body(messages: &[Message]) -> Vec<u8> {
    let elements: Vec<BatchElement<'_>> = messages
        .iter()
        .map(|message| {
            let text = std::str::from_utf8(&message.payload).ok();
            BatchElement {
                id: message.id,
                topic: &message.topic,
                key: message.key.as_deref(),
                headers: message
                    .headers
                    .iter()
                    .filter(|(name, _)| !is_reserved(name))
                    .map(|(name, value)| (name.as_str(), value.as_str()))
                    .collect(),
                payload: text,
                payload_base64: text
                    .is_none()
                    .then(|| base64::engine::general_purpose::STANDARD.encode(&message.payload)),
            }
        })
        .collect();
    serde_json::to_vec(&elements).expect("strings and numbers always serialize")
}

/// The one place webhook answers are sorted into retried and permanent (the table of the
/// module documentation).
fn classify(
    status: StatusCode,
    retried_statuses: &BTreeSet<u16>,
    retry_after: Option<Duration>,
    text: String,
) -> PublishError {
    let code = status.as_u16();
    let retried =
        matches!(code, 408 | 429) || !status.is_client_error() || retried_statuses.contains(&code);
    let error = PublishError::new(text);
    match (retried, retry_after) {
        (false, _) => error.into_permanent(),
        (true, Some(delay)) => error.retry_after(delay),
        (true, None) => error,
    }
}

/// A `Retry-After` value: seconds, or an HTTP date (a date in the past is no delay).
fn retry_after(value: &HeaderValue, now: SystemTime) -> Option<Duration> {
    let value = value.to_str().ok()?.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// A header name and value, or what is wrong with them.
fn header(name: &str, value: &str) -> Result<(HeaderName, HeaderValue), String> {
    let name = HeaderName::try_from(name)
        .map_err(|_| format!("header name `{name}` is not a valid HTTP header name"))?;
    let value = HeaderValue::try_from(value)
        .map_err(|_| format!("header `{name}` has a value that is not valid in HTTP"))?;
    Ok((name, value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_sorted_by_status() {
        let none = BTreeSet::new();
        let sort = |code: u16, retried: &BTreeSet<u16>| {
            classify(
                StatusCode::from_u16(code).unwrap(),
                retried,
                None,
                "x".into(),
            )
        };
        for code in [408, 429, 500, 502, 503, 504, 302] {
            assert!(!sort(code, &none).is_permanent(), "{code}");
        }
        for code in [400, 401, 403, 404, 409, 410, 413, 422] {
            assert!(sort(code, &none).is_permanent(), "{code}");
        }
        let retried_404 = BTreeSet::from([404]);
        assert!(!sort(404, &retried_404).is_permanent());
        let later = classify(
            StatusCode::SERVICE_UNAVAILABLE,
            &none,
            Some(Duration::from_secs(7)),
            "x".into(),
        );
        assert_eq!(later.retry_delay(), Some(Duration::from_secs(7)));
    }

    #[test]
    fn retry_after_takes_seconds_and_dates() {
        let now = httpdate::parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").unwrap();
        let seconds = HeaderValue::from_static("120");
        assert_eq!(retry_after(&seconds, now), Some(Duration::from_secs(120)));
        let date = HeaderValue::from_static("Sun, 06 Nov 1994 08:50:07 GMT");
        assert_eq!(retry_after(&date, now), Some(Duration::from_secs(30)));
        let past = HeaderValue::from_static("Sun, 06 Nov 1994 08:00:00 GMT");
        assert_eq!(retry_after(&past, now), Some(Duration::ZERO));
        assert_eq!(retry_after(&HeaderValue::from_static("soon"), now), None);
    }

    #[test]
    fn requests_carry_the_message_and_its_signature() {
        let hook = WebhookPublisher::builder("http://127.0.0.1:1/hook")
            .secret("s3cret")
            .header("authorization", "Bearer t")
            .build()
            .unwrap();
        let message = Message::new(3, "orders.paid", "{}")
            .with_key("customer-1")
            .with_header("content-type", "application/json");
        let headers = hook.headers(&message, 1_700_000_000).unwrap();
        assert_eq!(headers["txoutbox-id"], "3");
        assert_eq!(headers["txoutbox-topic"], "orders.paid");
        assert_eq!(headers["txoutbox-key"], "customer-1");
        assert_eq!(headers["content-type"], "application/json");
        assert_eq!(headers["authorization"], "Bearer t");
        let signed = headers[signature::SIGNATURE_HEADER].to_str().unwrap();
        assert!(signature::verify(b"s3cret", signed, b"{}", 1_700_000_000, 0).is_ok());

        let bad = Message::new(4, "t", "p").with_header("bad header", "x");
        assert!(hook.headers(&bad, 0).unwrap_err().is_permanent());
    }

    #[test]
    fn a_batch_body_is_an_array_with_text_or_base64_payloads() {
        let messages = [
            Message::new(1, "orders.paid", r#"{"order":1}"#)
                .with_key("customer-1")
                .with_header("traceparent", "00-abc")
                .with_header("txoutbox-id", "forged"),
            Message::new(2, "files", vec![0xff, 0x00]),
        ];
        let body: serde_json::Value = serde_json::from_slice(&batch_body(&messages)).unwrap();
        assert_eq!(
            body,
            serde_json::json!([
                {"id": 1, "topic": "orders.paid", "key": "customer-1",
                 "headers": {"traceparent": "00-abc"}, "payload": "{\"order\":1}"},
                {"id": 2, "topic": "files", "key": null, "headers": {}, "payload_base64": "/wA="},
            ])
        );
    }

    #[test]
    fn an_empty_batch_limit_is_a_configuration_error() {
        for (max, wait) in [(0, 20), (10, 0)] {
            let error = WebhookPublisher::builder("http://127.0.0.1:1/hook")
                .batch(max, Duration::from_millis(wait))
                .build()
                .unwrap_err();
            assert!(error.to_string().contains("must be positive"), "{error}");
        }
    }

    #[test]
    fn a_bad_url_is_a_configuration_error() {
        for url in ["", "ftp://x/y", "not a url"] {
            let error = WebhookPublisher::builder(url).build().unwrap_err();
            assert!(error.to_string().contains("invalid webhook URL"), "{error}");
        }
    }
}
