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
//!
//! `entry.rs` turns a message into an entry; `refusals.rs` sorts what the services answer.

mod entry;
mod refusals;

pub use entry::group_id;
pub(crate) use entry::{Entry, EntryRules};
pub(crate) use refusals::{
    alone_outcome, batch_outcomes, entry_failure, request_failure, RequestFailure,
};

use std::fmt;
use std::time::Duration;

use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_config::{BehaviorVersion, Region, SdkConfig};
use aws_smithy_http_client::tls::{rustls_provider::CryptoMode, Provider};

use crate::brokers::CloudEvents;

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
