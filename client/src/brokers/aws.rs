//! What the SQS and SNS publishers share: the AWS configuration (credentials from the
//! standard chain, HTTPS with rustls and ring, the SDK's own retries off), a message as
//! a batch entry within the services' limits, FIFO group and deduplication ids, and the
//! sorting of the services' refusals into permanent and retried.
//!
//! The rules, which `sqs.rs` and `sns.rs` document for their users:
//!
//! - a message is at most 262,144 bytes (its body, and each attribute's name, type and
//!   value), and so is a batch; a batch holds at most 10 entries;
//! - the body is the payload as text: a payload that is not UTF-8 is dead-lettered
//!   (CloudEvents structured mode carries any payload, as `data_base64`);
//! - at most 10 message attributes, each named with letters, digits, `-`, `_` and `.`
//!   (not `AWS.` or `Amazon.` first, no leading, trailing or doubled `.`): a message
//!   whose headers do not fit is dead-lettered, saying so; a header with an empty value
//!   is left out (both services refuse empty attribute values);
//! - FIFO: `MessageGroupId` = the key (a key that is not 1 to 128 printable ASCII
//!   characters becomes `sha256-` and its hex SHA-256, so it still orders), the message id
//!   for keyless rows (each its own group: keyless rows are independent);
//!   `MessageDeduplicationId` = the message id, behind an optional prefix.

use std::fmt;
use std::time::Duration;

use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_config::{BehaviorVersion, Region, SdkConfig};
use aws_smithy_http_client::tls::{rustls_provider::CryptoMode, Provider};
use sha2::{Digest, Sha256};

use crate::brokers::{carried_headers, Binding, CloudEvents};
use crate::{Message, PublishError};

/// The largest message, and the largest batch, both services take.
pub(crate) const MAX_BYTES: usize = 262_144;
/// The most entries of a `SendMessageBatch` or `PublishBatch`.
pub(crate) const MAX_ENTRIES: usize = 10;
/// The most message attributes of one message.
pub(crate) const MAX_ATTRIBUTES: usize = 10;
/// Default wait for the service's answer: below the subscriber's default
/// `publish_timeout` (10s) with the batch's wait.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// Default wait for more messages before a batch leaves.
pub(crate) const DEFAULT_BATCH_WAIT: Duration = Duration::from_millis(10);
/// The attribute carrying the content type (the CloudEvent's `datacontenttype`).
pub(crate) const CONTENT_TYPE: &str = "content-type";

/// Where the SDK's configuration comes from, as a builder gathered it.
#[derive(Clone, Default)]
pub(crate) struct AwsSettings {
    pub region: Option<String>,
    pub endpoint: Option<String>,
    pub sdk_config: Option<SdkConfig>,
}

impl fmt::Debug for AwsSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AwsSettings")
            .field("region", &self.region)
            .field("endpoint", &self.endpoint)
            .field("sdk_config", &self.sdk_config.is_some())
            .finish()
    }
}

impl AwsSettings {
    /// The configuration to make a service client from: the application's, or the
    /// standard chain's (environment, profile, web identity, ECS, instance metadata).
    /// The region is the one set, else `fallback_region` (the queue URL's or topic ARN's),
    /// else the chain's.
    pub(crate) async fn load(&self, fallback_region: Option<String>) -> SdkConfig {
        if let Some(config) = &self.sdk_config {
            return config.clone();
        }
        let https = aws_smithy_http_client::Builder::new()
            .tls_provider(Provider::Rustls(CryptoMode::Ring))
            .build_https();
        let mut loader = aws_config::defaults(BehaviorVersion::latest()).http_client(https);
        if let Some(region) = self.region.clone().or(fallback_region) {
            loader = loader.region(Region::new(region));
        }
        loader.load().await
    }

    /// What every client of ours sets over `loaded`: the region set (or `fallback`
    /// where `loaded` has none), the endpoint set, a timeout for the whole call, and no
    /// retries of the SDK's own (the outbox retries with its backoff, and a publish
    /// answers within its timeout).
    pub(crate) fn overrides(
        &self,
        loaded: &SdkConfig,
        fallback_region: Option<String>,
        timeout: Duration,
    ) -> Overrides {
        let region = match (&self.region, loaded.region()) {
            (Some(region), _) => Some(region.clone()),
            (None, None) => fallback_region,
            (None, Some(_)) => None,
        };
        Overrides {
            region: region.map(Region::new),
            endpoint: self.endpoint.clone(),
            timeout: TimeoutConfig::builder()
                .operation_timeout(timeout)
                .connect_timeout(timeout.min(Duration::from_secs(3)))
                .build(),
            retry: RetryConfig::disabled(),
        }
    }
}

/// See [`AwsSettings::overrides`].
pub(crate) struct Overrides {
    pub region: Option<Region>,
    pub endpoint: Option<String>,
    pub timeout: TimeoutConfig,
    pub retry: RetryConfig,
}

/// What the SQS and SNS builders share.
#[derive(Debug, Clone)]
pub(crate) struct AwsOptions {
    pub settings: AwsSettings,
    pub timeout: Duration,
    pub batch: (usize, Duration),
    pub fifo: Option<bool>,
    pub deduplication_prefix: String,
    pub cloudevents: Option<CloudEvents>,
}

impl Default for AwsOptions {
    fn default() -> Self {
        Self {
            settings: AwsSettings::default(),
            timeout: DEFAULT_TIMEOUT,
            batch: (MAX_ENTRIES, DEFAULT_BATCH_WAIT),
            fifo: None,
            deduplication_prefix: String::new(),
            cloudevents: None,
        }
    }
}

/// The methods the SQS and SNS builders share, on a builder with an `aws: AwsOptions`
/// field.
macro_rules! aws_methods {
    () => {
        /// The AWS region (default: the one in the queue URL or topic ARN, else the
        /// standard chain's: `AWS_REGION`, the profile).
        pub fn region(mut self, region: impl Into<String>) -> Self {
            self.aws.settings.region = Some(region.into());
            self
        }

        /// Sends requests to this endpoint instead of the region's, for example an
        /// emulator's `http://127.0.0.1:5000` or a VPC endpoint.
        pub fn endpoint_url(mut self, url: impl Into<String>) -> Self {
            self.aws.settings.endpoint = Some(url.into());
            self
        }

        /// Uses the application's AWS configuration (credentials, region, HTTP client)
        /// instead of loading the standard chain's at the first publish.
        pub fn sdk_config(mut self, config: aws_config::SdkConfig) -> Self {
            self.aws.settings.sdk_config = Some(config);
            self
        }

        /// How long one request may take, connecting included (default 5s), before its
        /// messages are nacked and retried. Keep it and the batch's wait below the
        /// subscriber's `publish_timeout` (default 10s).
        pub fn timeout(mut self, timeout: std::time::Duration) -> Self {
            self.aws.timeout = timeout;
            self
        }

        /// Gathers the messages published at about the same time into one request of at
        /// most `max_messages` (1 to 10; default 10), sent `max_wait` (default 10ms) after
        /// its first message at the latest, and before it would exceed 256 KiB. Each
        /// message gets its own entry's outcome. A batch holds one message per key and at
        /// most as many as the subscribers publish at once (their `concurrency`).
        pub fn batch(mut self, max_messages: usize, max_wait: std::time::Duration) -> Self {
            self.aws.batch = (max_messages, max_wait);
            self
        }

        /// Whether the destination is FIFO, setting `MessageGroupId` and
        /// `MessageDeduplicationId` (default: when its name ends with `.fifo`).
        pub fn fifo(mut self, fifo: bool) -> Self {
            self.aws.fifo = Some(fifo);
            self
        }

        /// Puts `prefix` before the message id in `MessageDeduplicationId` (FIFO), when
        /// several outboxes, whose ids overlap, share a destination.
        pub fn deduplication_id_prefix(mut self, prefix: impl Into<String>) -> Self {
            self.aws.deduplication_prefix = prefix.into();
            self
        }

        /// Sends each message as a CloudEvent: in binary mode, its attributes as message
        /// attributes `ce-id`, `ce-source`, ... and `content-type`; in structured mode,
        /// the JSON event as the body. See [`CloudEvents`](crate::brokers::CloudEvents).
        pub fn cloudevents(mut self, events: $crate::brokers::CloudEvents) -> Self {
            self.aws.cloudevents = Some(events);
            self
        }
    };
}
pub(crate) use aws_methods;

/// The batch limits of a builder's `batch(max_messages, max_wait)`, checked.
pub(crate) fn batch_limits(
    service: &str,
    max_messages: usize,
    max_wait: Duration,
) -> Result<crate::brokers::batch::BatchLimits, crate::ClientError> {
    if max_messages == 0 || max_messages > MAX_ENTRIES || max_wait.is_zero() {
        return Err(crate::ClientError::Config(format!(
            "{service} batch of {max_messages} messages within {}ms: a batch holds 1 to \
             {MAX_ENTRIES} messages and the wait must be positive, for example 10 within 10ms",
            max_wait.as_millis()
        )));
    }
    Ok(crate::brokers::batch::BatchLimits {
        max_messages,
        max_bytes: MAX_BYTES,
        max_wait,
    })
}

/// One message as either service takes it.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub body: String,
    /// String attributes, in order.
    pub attributes: Vec<(String, String)>,
    /// FIFO only.
    pub group_id: Option<String>,
    pub deduplication_id: Option<String>,
    /// What the service counts against its limits.
    pub size: usize,
}

/// How a publisher turns messages into entries.
#[derive(Debug, Clone)]
pub(crate) struct EntryRules {
    /// `sqs` or `sns`, in error texts.
    pub service: &'static str,
    pub fifo: bool,
    pub deduplication_prefix: String,
    pub cloudevents: Option<CloudEvents>,
}

impl EntryRules {
    /// `message` as an entry, or why the service could never take it (permanent).
    pub(crate) fn entry(&self, message: &Message) -> Result<Entry, PublishError> {
        let service = self.service;
        let (attributes, body) = match &self.cloudevents {
            Some(events) => {
                let envelope = events.envelope(message, Binding::Aws);
                let mut attributes = envelope.headers;
                attributes.push((CONTENT_TYPE.to_owned(), envelope.content_type));
                (attributes, envelope.body)
            }
            None => {
                let attributes = carried_headers(message)
                    .map(|(name, value)| (name.to_owned(), value.into_owned()))
                    .collect();
                (attributes, message.payload.clone())
            }
        };
        let body = String::from_utf8(body.to_vec()).map_err(|_| {
            PublishError::permanent(format!(
                "{service}: message {} has a payload that is not UTF-8 text, which {service} \
                 bodies must be; encode it at the producer (base64) or use CloudEvents \
                 structured mode (data_base64)",
                message.id
            ))
        })?;
        let mut kept: Vec<(String, String)> = Vec::with_capacity(attributes.len());
        for (name, value) in attributes {
            if value.is_empty() || kept.iter().any(|(taken, _)| *taken == name) {
                continue;
            }
            if let Some(why) = invalid_attribute_name(&name) {
                return Err(PublishError::permanent(format!(
                    "{service}: header `{name}` of message {} cannot be a message attribute \
                     ({why}); rename it at the producer",
                    message.id
                )));
            }
            kept.push((name, value));
        }
        if kept.len() > MAX_ATTRIBUTES {
            let names: Vec<&str> = kept.iter().map(|(name, _)| name.as_str()).collect();
            return Err(PublishError::permanent(format!(
                "{service}: message {} would carry {} message attributes ({}), over the \
                 {MAX_ATTRIBUTES} {service} takes; send fewer headers, or use CloudEvents \
                 structured mode, which carries them in the body",
                message.id,
                kept.len(),
                names.join(", ")
            )));
        }
        let size = body.len()
            + kept
                .iter()
                .map(|(name, value)| name.len() + "String".len() + value.len())
                .sum::<usize>();
        if size > MAX_BYTES {
            return Err(PublishError::permanent(format!(
                "{service}: message {} is {size} bytes with its attributes, over the \
                 {MAX_BYTES} {service} takes; keep large payloads elsewhere (S3) and send a \
                 reference",
                message.id
            )));
        }
        let (group_id, deduplication_id) = if self.fifo {
            let group = match &message.key {
                Some(key) => group_id(key),
                None => message.id.to_string(),
            };
            (
                Some(group),
                Some(format!("{}{}", self.deduplication_prefix, message.id)),
            )
        } else {
            (None, None)
        };
        Ok(Entry {
            body,
            attributes: kept,
            group_id,
            deduplication_id,
            size,
        })
    }
}

/// The FIFO message group of `key`: the key itself when the services take it (1 to 128
/// characters of printable ASCII), else `sha256-` and the key's hex SHA-256.
pub fn group_id(key: &str) -> String {
    let usable = !key.is_empty() && key.len() <= 128 && key.bytes().all(|b| b.is_ascii_graphic());
    if usable {
        return key.to_owned();
    }
    let digest = Sha256::digest(key.as_bytes());
    let hex: String = digest.iter().map(|byte| format!("{byte:02x}")).collect();
    format!("sha256-{hex}")
}

/// Why `name` is not a message attribute name, if it is not one.
fn invalid_attribute_name(name: &str) -> Option<&'static str> {
    let lower = name.to_ascii_lowercase();
    if name.is_empty() || name.len() > 256 {
        Some("a name has 1 to 256 characters")
    } else if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        Some("only letters, digits, -, _ and . are allowed")
    } else if name.starts_with('.') || name.ends_with('.') || name.contains("..") {
        Some("no leading, trailing or doubled .")
    } else if lower.starts_with("aws.") || lower.starts_with("amazon.") {
        Some("AWS. and Amazon. are reserved")
    } else {
        None
    }
}

/// What a refusal of the whole request means for its messages.
pub(crate) enum RequestFailure {
    /// A parameter of some entry was refused: send each message on its own, so that only
    /// the one at fault is dead-lettered.
    SendAlone(String),
    /// Anything else: every message of the request is retried.
    Retry(PublishError),
}

/// The last part of an error code (`AWS.SimpleQueueService.NonExistentQueue` →
/// `NonExistentQueue`).
fn short_code(code: &str) -> &str {
    code.rsplit('.').next().unwrap_or(code)
}

/// Codes that refuse something in the message itself (its body, attributes or ids).
fn is_content_fault(code: &str) -> bool {
    matches!(
        short_code(code),
        "InvalidParameterValue"
            | "InvalidParameter"
            | "ParameterValueInvalid"
            | "InvalidMessageContents"
            | "InvalidAttributeName"
            | "InvalidAttributeValue"
            | "ValidationError"
            | "ValidationException"
    )
}

/// Codes an operator or time fixes, even when the service calls them the sender's fault:
/// throttling, KMS keys, permissions, a missing queue or topic.
fn is_fixable(code: &str) -> bool {
    let code = short_code(code);
    code.contains("Throttl")
        || code.starts_with("KMS")
        || code.starts_with("Kms")
        || code.contains("AccessDenied")
        || code.contains("Authorization")
        || code.contains("NotFound")
        || code.contains("NonExistent")
        || code.contains("DoesNotExist")
        || code == "OverLimit"
}

/// A batch entry the service failed: permanent when the service says it was the sender's
/// fault and nothing an operator does would change it.
pub(crate) fn entry_failure(
    service: &str,
    destination: &str,
    sender_fault: bool,
    code: &str,
    text: Option<&str>,
) -> PublishError {
    let error = PublishError::new(format!(
        "{service} {destination}: refused the message: {code}: {}",
        text.unwrap_or("no message")
    ));
    if sender_fault && !is_fixable(code) {
        error.into_permanent()
    } else {
        error
    }
}

/// A failed request, from the SDK's error: its code and message when the service
/// answered, else the transport's failure.
pub(crate) fn request_failure<E, R>(
    service: &str,
    destination: &str,
    error: &aws_smithy_runtime_api::client::result::SdkError<E, R>,
) -> RequestFailure
where
    E: aws_smithy_types::error::metadata::ProvideErrorMetadata + std::error::Error + 'static,
    R: fmt::Debug,
{
    use aws_smithy_runtime_api::client::result::SdkError;
    match error {
        SdkError::ServiceError(context) => {
            let code = context.err().code().unwrap_or("unknown");
            let message = context.err().message().unwrap_or("no message");
            let text = format!("{service} {destination}: {code}: {message}");
            if is_content_fault(code) {
                RequestFailure::SendAlone(text)
            } else {
                RequestFailure::Retry(PublishError::new(text))
            }
        }
        other => RequestFailure::Retry(PublishError::new(format!(
            "{service} {destination}: {}",
            aws_smithy_types::error::display::DisplayErrorContext(other)
        ))),
    }
}

/// Each entry's outcome from a batch's answer: the ids (positions) it confirmed and
/// those it failed; an entry the answer does not mention is retried.
pub(crate) fn batch_outcomes<'a>(
    service: &str,
    destination: &str,
    count: usize,
    confirmed: impl IntoIterator<Item = &'a str>,
    failed: impl IntoIterator<Item = (&'a str, PublishError)>,
) -> Vec<Result<(), PublishError>> {
    let mut outcomes: Vec<Option<Result<(), PublishError>>> = (0..count).map(|_| None).collect();
    let answers = confirmed
        .into_iter()
        .map(|id| (id, Ok(())))
        .chain(failed.into_iter().map(|(id, error)| (id, Err(error))));
    for (id, outcome) in answers {
        if let Some(slot) = id.parse::<usize>().ok().and_then(|i| outcomes.get_mut(i)) {
            *slot = Some(outcome);
        }
    }
    outcomes
        .into_iter()
        .map(|outcome| {
            outcome.unwrap_or_else(|| {
                Err(PublishError::new(format!(
                    "{service} {destination}: the answer to the batch did not mention this message"
                )))
            })
        })
        .collect()
}

/// The outcome of a message sent alone, from its request's result.
pub(crate) fn alone_outcome<T, E, R>(
    service: &str,
    destination: &str,
    result: Result<T, aws_smithy_runtime_api::client::result::SdkError<E, R>>,
) -> Result<(), PublishError>
where
    E: aws_smithy_types::error::metadata::ProvideErrorMetadata + std::error::Error + 'static,
    R: fmt::Debug,
{
    match result {
        Ok(_) => Ok(()),
        Err(error) => match request_failure(service, destination, &error) {
            RequestFailure::SendAlone(text) => Err(PublishError::permanent(format!(
                "{text} (the service refused this message)"
            ))),
            RequestFailure::Retry(error) => Err(error),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(fifo: bool) -> EntryRules {
        EntryRules {
            service: "sqs",
            fifo,
            deduplication_prefix: String::new(),
            cloudevents: None,
        }
    }

    #[test]
    fn fifo_entries_group_by_key_and_deduplicate_on_the_id() {
        let keyed = Message::new(7, "orders.paid", "{}").with_key("customer-1");
        let entry = rules(true).entry(&keyed).unwrap();
        assert_eq!(entry.group_id.as_deref(), Some("customer-1"));
        assert_eq!(entry.deduplication_id.as_deref(), Some("7"));
        let keyless = Message::new(8, "orders.paid", "{}");
        assert_eq!(
            rules(true).entry(&keyless).unwrap().group_id.as_deref(),
            Some("8")
        );
        let standard = rules(false).entry(&keyed).unwrap();
        assert!(standard.group_id.is_none() && standard.deduplication_id.is_none());
        let prefixed = EntryRules {
            deduplication_prefix: "billing-".into(),
            ..rules(true)
        };
        assert_eq!(
            prefixed.entry(&keyed).unwrap().deduplication_id.as_deref(),
            Some("billing-7")
        );
    }

    #[test]
    fn keys_the_services_refuse_become_a_hash_that_still_orders() {
        assert_eq!(group_id("c-1/eu"), "c-1/eu");
        let spaced = group_id("customer one");
        assert!(
            spaced.starts_with("sha256-") && spaced.len() == 7 + 64,
            "{spaced}"
        );
        assert_eq!(spaced, group_id("customer one"));
        assert!(group_id(&"k".repeat(129)).starts_with("sha256-"));
        assert!(group_id("clé").starts_with("sha256-"));
    }

    #[test]
    fn headers_become_attributes_within_the_limits() {
        let message = Message::new(7, "orders.paid", "{}")
            .with_key("c-1")
            .with_header("traceparent", "00-abc")
            .with_header("empty", "");
        let entry = rules(false).entry(&message).unwrap();
        let names: Vec<&str> = entry.attributes.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "traceparent",
                "txoutbox-id",
                "txoutbox-topic",
                "txoutbox-key"
            ]
        );

        let mut crowded = Message::new(9, "t", "{}");
        for n in 0..9 {
            crowded = crowded.with_header(format!("h{n}"), "v");
        }
        let error = rules(false).entry(&crowded).unwrap_err();
        assert!(error.is_permanent());
        assert!(
            error.text().contains("11 message attributes"),
            "{}",
            error.text()
        );

        let spaced = Message::new(10, "t", "{}").with_header("x tenant", "t1");
        let error = rules(false).entry(&spaced).unwrap_err();
        assert!(error.is_permanent() && error.text().contains("`x tenant`"));
    }

    #[test]
    fn bodies_must_be_text_and_fit() {
        let binary = Message::new(1, "t", vec![0xffu8, 0xfe]);
        assert!(rules(false).entry(&binary).unwrap_err().is_permanent());
        let large = Message::new(2, "t", "x".repeat(MAX_BYTES));
        let error = rules(false).entry(&large).unwrap_err();
        assert!(
            error.is_permanent() && error.text().contains("262144"),
            "{}",
            error.text()
        );
        let fits = Message::new(3, "t", "x".repeat(MAX_BYTES - 200));
        assert!(rules(false).entry(&fits).is_ok());
    }

    #[test]
    fn entry_failures_are_permanent_only_for_the_senders_own_fault() {
        let refused = entry_failure("sqs", "q", true, "InvalidParameterValue", Some("too long"));
        assert!(refused.is_permanent());
        assert_eq!(
            refused.text(),
            "sqs q: refused the message: InvalidParameterValue: too long"
        );
        assert!(!entry_failure("sqs", "q", false, "InternalError", None).is_permanent());
        assert!(!entry_failure("sns", "t", true, "KMSThrottling", None).is_permanent());
        assert!(!entry_failure(
            "sqs",
            "q",
            true,
            "AWS.SimpleQueueService.NonExistentQueue",
            None
        )
        .is_permanent());
    }
}
