//! Publishing to Amazon SQS (feature `sqs`): [`SqsPublisher`] sends messages to one queue
//! in `SendMessageBatch` requests and returns only once SQS confirmed each message's
//! entry.
//!
//! | outbox | SQS message |
//! | --- | --- |
//! | `payload` | the body, as text (a payload that is not UTF-8 is dead-lettered; CloudEvents structured mode carries any payload) |
//! | `key` | attribute `txoutbox-key` (absent for keyless rows); on a FIFO queue also `MessageGroupId` |
//! | `id` | attribute `txoutbox-id`; on a FIFO queue also `MessageDeduplicationId` |
//! | `topic` | attribute `txoutbox-topic` |
//! | `headers` | string attributes of the same names (one with an empty value is left out: SQS refuses those) |
//!
//! All messages go to the one queue: to send topics to queues of their own, run one
//! publisher per queue (`txoutbox relay --sqs URL --topic T`).
//!
//! FIFO queues (URL ending in `.fifo`, or [`SqsPublisherBuilder::fifo`]):
//! `MessageGroupId` is the outbox key, so SQS hands a key's messages to consumers in the
//! order the outbox publishes them; a key SQS cannot take as a group id (over 128
//! characters, or not printable ASCII) is `sha256-` and its hex SHA-256 ([`group_id`]).
//! A keyless row's group is its message id: keyless rows are independent, so none waits
//! for another. `MessageDeduplicationId` is the message id (behind
//! [`SqsPublisherBuilder::deduplication_id_prefix`]): a message published again within
//! SQS's five-minute window, after a confirmation was lost, is dropped by SQS.
//!
//! Limits (checked before sending, the message dead-lettered with the reason): 262,144
//! bytes per message, body and attributes counted as SQS counts them; at most 10 message
//! attributes, so at most 7 headers of the row's own (CloudEvents binary mode: 2).
//! A batch holds at most 10 messages and 262,144 bytes.
//!
//! Errors (`aws.rs` sorts them, for SQS and SNS alike): an entry SQS failed as the
//! sender's fault (`SenderFault`: an invalid parameter, contents or attribute) is
//! dead-lettered with SQS's code and message; one failed on SQS's side is retried. A
//! request refused as a whole for an invalid parameter is sent again one message per
//! request, so that only the message at fault is dead-lettered. Everything else is
//! retried with the outbox's backoff: throttling, KMS, access denied, a queue that does
//! not exist (yet), an unreachable endpoint, no answer within the timeout (default 5s).
//! The SDK's own retries are off: the outbox's take their place.
//!
//! Credentials and region: the standard AWS chain (environment, shared profile with SSO
//! or `credential_process`, web identity, ECS, instance metadata), loaded at the first
//! publish, or the application's [`SqsPublisherBuilder::sdk_config`]. The region is the
//! queue URL's (`sqs.REGION.amazonaws.com`) unless set. HTTPS with rustls and ring.
//!
//! CloudEvents (no SQS binding exists): binary mode carries the attributes as message
//! attributes `ce-specversion`, `ce-id`, `ce-source`, `ce-type`, `ce-subject`,
//! `ce-time`, the headers as `ce-` extensions (without `txoutboxid` and `txoutboxkey`,
//! which `ce-id` and `ce-subject` say) and `datacontenttype` as `content-type`;
//! structured mode sends the JSON event as the body with `content-type:
//! application/cloudevents+json` and no other attribute.
//!
//! ```no_run
//! use txoutbox_client::sqs::SqsPublisher;
//! use txoutbox_client::Subscriber;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let sqs = SqsPublisher::builder(
//!     "https://sqs.eu-west-1.amazonaws.com/123456789012/orders.fifo",
//! )
//! .build()?;
//! Subscriber::builder(["http://127.0.0.1:7411"], "orders")
//!     .concurrency(16) // up to 16 keys at once: batches of 10
//!     .build(sqs)?
//!     .run_until_signal()
//!     .await?;
//! # Ok(())
//! # }
//! ```

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use aws_sdk_sqs::types::{MessageAttributeValue, SendMessageBatchRequestEntry};
use aws_sdk_sqs::Client;
use tokio::sync::OnceCell;

use crate::brokers::aws::{
    alone_outcome, aws_methods, batch_limits, batch_outcomes, entry_failure, request_failure,
    AwsOptions, Entry, EntryRules, RequestFailure,
};
use crate::brokers::batch::{same_outcome, Batcher, SendBatch};
use crate::{ClientError, Message, PublishError, Publisher};

pub use crate::brokers::aws::group_id;
/// The AWS SDK's configuration loader, for [`SqsPublisherBuilder::sdk_config`].
pub use aws_config;
/// The AWS SDK for SQS itself.
pub use aws_sdk_sqs;

/// Configures an [`SqsPublisher`]; start with [`SqsPublisher::builder`].
#[must_use]
#[derive(Debug, Clone)]
pub struct SqsPublisherBuilder {
    queue_url: String,
    aws: AwsOptions,
}

impl SqsPublisherBuilder {
    aws_methods!();

    /// Checks the queue URL and the batch. The AWS configuration is loaded at the first
    /// publish: missing credentials or an unreachable endpoint mean nacked publishes,
    /// not an error here.
    pub fn build(self) -> Result<SqsPublisher, ClientError> {
        let url = self.queue_url;
        let path = url
            .strip_prefix("https://")
            .or_else(|| url.strip_prefix("http://"))
            .and_then(|rest| rest.split_once('/'))
            .map(|(_, path)| path.trim_end_matches('/'));
        let Some(name) = path
            .and_then(|p| p.rsplit('/').next())
            .filter(|n| !n.is_empty())
        else {
            return Err(ClientError::Config(format!(
                "invalid SQS queue URL `{url}`: use the queue's URL, for example \
                 https://sqs.eu-west-1.amazonaws.com/123456789012/orders.fifo"
            )));
        };
        let fifo = self.aws.fifo.unwrap_or(name.ends_with(".fifo"));
        let (max_messages, max_wait) = self.aws.batch;
        let limits = batch_limits("sqs", max_messages, max_wait)?;
        let queue = Arc::new(Queue {
            region: region_of(&url),
            url,
            options: self.aws.clone(),
            client: OnceCell::new(),
        });
        let send: SendBatch<Entry> = {
            let queue = Arc::clone(&queue);
            Arc::new(move |entries| {
                let queue = Arc::clone(&queue);
                Box::pin(async move { queue.send(entries).await })
            })
        };
        Ok(SqsPublisher {
            rules: EntryRules {
                service: "sqs",
                fifo,
                deduplication_prefix: self.aws.deduplication_prefix,
                cloudevents: self.aws.cloudevents,
            },
            batcher: Batcher::new(limits, send),
            queue,
        })
    }
}

/// The region in an SQS endpoint's host name (`sqs.REGION.amazonaws.com`, or the legacy
/// `REGION.queue.amazonaws.com`).
fn region_of(url: &str) -> Option<String> {
    let host = url.split("://").nth(1)?.split(['/', ':']).next()?;
    let parts: Vec<&str> = host.split('.').collect();
    match parts.as_slice() {
        ["sqs", region, ..] if host.contains(".amazonaws.") => Some((*region).to_owned()),
        [region, "queue", ..] if host.contains(".amazonaws.") => Some((*region).to_owned()),
        _ => None,
    }
}

/// The queue, and the client made at the first publish.
struct Queue {
    url: String,
    region: Option<String>,
    options: AwsOptions,
    client: OnceCell<Client>,
}

impl Queue {
    async fn client(&self) -> &Client {
        self.client
            .get_or_init(|| async {
                let settings = &self.options.settings;
                let loaded = settings.load(self.region.clone()).await;
                let overrides =
                    settings.overrides(&loaded, self.region.clone(), self.options.timeout);
                let mut config = aws_sdk_sqs::config::Builder::from(&loaded)
                    .timeout_config(overrides.timeout)
                    .retry_config(overrides.retry);
                if let Some(region) = overrides.region {
                    config = config.region(region);
                }
                if let Some(endpoint) = overrides.endpoint {
                    config = config.endpoint_url(endpoint);
                }
                Client::from_conf(config.build())
            })
            .await
    }

    /// Sends `entries` in one `SendMessageBatch`; each entry's outcome, in order.
    async fn send(&self, entries: Vec<Entry>) -> Vec<Result<(), PublishError>> {
        let client = self.client().await;
        let batch = entries
            .iter()
            .enumerate()
            .map(|(index, entry)| batch_entry(index, entry))
            .collect();
        let answer = client
            .send_message_batch()
            .queue_url(&self.url)
            .set_entries(Some(batch))
            .send()
            .await;
        let output = match answer {
            Ok(output) => output,
            Err(error) => {
                return match request_failure("sqs", &self.url, &error) {
                    RequestFailure::SendAlone(text) if entries.len() > 1 => {
                        tracing::debug!(queue = %self.url, error = %text, "sqs batch refused: sending its messages one by one");
                        let alone = entries.iter().map(|entry| self.send_alone(client, entry));
                        futures::future::join_all(alone).await
                    }
                    RequestFailure::SendAlone(text) => vec![Err(PublishError::permanent(format!(
                        "{text} (the service refused this message)"
                    )))],
                    RequestFailure::Retry(error) => same_outcome(&Err(error), entries.len()),
                };
            }
        };
        let failed = output.failed().iter().map(|failed| {
            let error = entry_failure(
                "sqs",
                &self.url,
                failed.sender_fault(),
                failed.code(),
                failed.message(),
            );
            (failed.id(), error)
        });
        let confirmed = output.successful().iter().map(|sent| sent.id());
        batch_outcomes("sqs", &self.url, entries.len(), confirmed, failed)
    }

    /// Sends one message by itself (`SendMessage`).
    async fn send_alone(&self, client: &Client, entry: &Entry) -> Result<(), PublishError> {
        let result = client
            .send_message()
            .queue_url(&self.url)
            .message_body(&entry.body)
            .set_message_attributes(Some(attributes(entry)))
            .set_message_group_id(entry.group_id.clone())
            .set_message_deduplication_id(entry.deduplication_id.clone())
            .send()
            .await;
        alone_outcome("sqs", &self.url, result)
    }
}

fn attributes(entry: &Entry) -> HashMap<String, MessageAttributeValue> {
    entry
        .attributes
        .iter()
        .map(|(name, value)| {
            let value = MessageAttributeValue::builder()
                .data_type("String")
                .string_value(value)
                .build()
                .expect("the data type is set");
            (name.clone(), value)
        })
        .collect()
}

/// The entry's id is its position: unique within the batch whatever the messages are.
fn batch_entry(index: usize, entry: &Entry) -> SendMessageBatchRequestEntry {
    SendMessageBatchRequestEntry::builder()
        .id(index.to_string())
        .message_body(&entry.body)
        .set_message_attributes(Some(attributes(entry)))
        .set_message_group_id(entry.group_id.clone())
        .set_message_deduplication_id(entry.deduplication_id.clone())
        .build()
        .expect("the id and body are set")
}

/// Publishes outbox messages to an SQS queue in batches, returning once SQS confirmed
/// each; see the [module documentation](self) for the mapping and the errors.
pub struct SqsPublisher {
    rules: EntryRules,
    batcher: Batcher<Entry>,
    queue: Arc<Queue>,
}

impl fmt::Debug for SqsPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqsPublisher")
            .field("queue_url", &self.queue.url)
            .field("fifo", &self.rules.fifo)
            .finish_non_exhaustive()
    }
}

impl SqsPublisher {
    /// Starts configuring a publisher to the queue at `queue_url`
    /// (`https://sqs.REGION.amazonaws.com/ACCOUNT/NAME`).
    pub fn builder(queue_url: impl Into<String>) -> SqsPublisherBuilder {
        SqsPublisherBuilder {
            queue_url: queue_url.into(),
            aws: AwsOptions::default(),
        }
    }

    /// Whether messages go out with a group and deduplication id.
    pub fn is_fifo(&self) -> bool {
        self.rules.fifo
    }
}

#[async_trait::async_trait]
impl Publisher for SqsPublisher {
    async fn publish(&self, message: &Message) -> Result<(), PublishError> {
        let entry = self.rules.entry(message)?;
        let size = entry.size;
        self.batcher.publish(message.id, entry, size).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_region_comes_from_an_aws_queue_url() {
        let url = "https://sqs.eu-west-1.amazonaws.com/123456789012/orders.fifo";
        assert_eq!(region_of(url).as_deref(), Some("eu-west-1"));
        let legacy = "https://us-east-2.queue.amazonaws.com/123456789012/orders";
        assert_eq!(region_of(legacy).as_deref(), Some("us-east-2"));
        assert_eq!(region_of("http://127.0.0.1:5000/123456789012/orders"), None);
    }

    #[tokio::test]
    async fn fifo_follows_the_queue_name_and_urls_are_checked() {
        let fifo = SqsPublisher::builder("http://127.0.0.1:1/000000000000/orders.fifo")
            .build()
            .unwrap();
        assert!(fifo.is_fifo());
        let standard = SqsPublisher::builder("http://127.0.0.1:1/000000000000/orders")
            .build()
            .unwrap();
        assert!(!standard.is_fifo());
        let error = SqsPublisher::builder("orders").build().unwrap_err();
        assert!(
            error.to_string().contains("invalid SQS queue URL"),
            "{error}"
        );
        let error = SqsPublisher::builder("http://127.0.0.1:1/0/orders")
            .batch(11, std::time::Duration::from_millis(5))
            .build()
            .unwrap_err();
        assert!(error.to_string().contains("1 to 10"), "{error}");
    }
}
