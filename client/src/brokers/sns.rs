//! Publishing to Amazon SNS (feature `sns`): [`SnsPublisher`] publishes messages to one
//! topic in `PublishBatch` requests and returns only once SNS confirmed each message's
//! entry.
//!
//! The mapping, the limits and the errors are SQS's (see [`crate::sqs`]): the payload is
//! the `Message` (text), the key, id, topic and headers are string message attributes
//! `txoutbox-key`, `txoutbox-id`, `txoutbox-topic` and the headers' names; at most 10
//! attributes and 262,144 bytes per message and per batch, at most 10 messages per batch.
//! SQS queues subscribed with raw message delivery receive the body and attributes as
//! they were published; without it, SNS's JSON envelope holds them.
//!
//! FIFO topics (ARN ending in `.fifo`, or [`SnsPublisherBuilder::fifo`]):
//! `MessageGroupId` = the outbox key (keyless rows: the message id; a key SNS cannot take
//! as a group id: `sha256-` and its hex SHA-256), `MessageDeduplicationId` = the message
//! id, so the FIFO queues subscribed receive each key's messages in order.
//!
//! Errors: an entry SNS failed as the sender's fault (`InvalidParameter`, ...) is
//! dead-lettered with SNS's code and message; a request refused as a whole for an invalid
//! parameter is sent again one message per request; everything else (throttling, KMS,
//! authorization, a topic not found, the network, the timeout) is retried.
//!
//! Credentials and region: the standard AWS chain, loaded at the first publish, or the
//! application's [`SnsPublisherBuilder::sdk_config`]; the region is the topic ARN's
//! unless set. CloudEvents as with SQS: binary mode in message attributes `ce-...` and
//! `content-type`, structured mode as the JSON `Message`.
//!
//! ```no_run
//! use txoutbox_client::sns::SnsPublisher;
//! use txoutbox_client::Subscriber;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let sns = SnsPublisher::builder("arn:aws:sns:eu-west-1:123456789012:orders").build()?;
//! Subscriber::builder(["http://127.0.0.1:7411"], "orders")
//!     .build(sns)?
//!     .run_until_signal()
//!     .await?;
//! # Ok(())
//! # }
//! ```

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use aws_sdk_sns::types::{MessageAttributeValue, PublishBatchRequestEntry};
use aws_sdk_sns::Client;
use tokio::sync::OnceCell;

use crate::brokers::aws::{
    alone_outcome, aws_methods, batch_limits, batch_outcomes, entry_failure, request_failure,
    AwsOptions, Entry, EntryRules, RequestFailure,
};
use crate::brokers::batch::{same_outcome, Batcher, SendBatch};
use crate::{ClientError, Message, PublishError, Publisher};

pub use crate::brokers::aws::group_id;
/// The AWS SDK's configuration loader, for [`SnsPublisherBuilder::sdk_config`].
pub use aws_config;
/// The AWS SDK for SNS itself.
pub use aws_sdk_sns;

/// Configures an [`SnsPublisher`]; start with [`SnsPublisher::builder`].
#[must_use]
#[derive(Debug, Clone)]
pub struct SnsPublisherBuilder {
    topic_arn: String,
    aws: AwsOptions,
}

impl SnsPublisherBuilder {
    aws_methods!();

    /// Checks the topic ARN and the batch. The AWS configuration is loaded at the first
    /// publish.
    pub fn build(self) -> Result<SnsPublisher, ClientError> {
        let arn = self.topic_arn;
        let parts: Vec<&str> = arn.split(':').collect();
        let ["arn", _, "sns", region, _, name] = parts.as_slice() else {
            return Err(ClientError::Config(format!(
                "invalid SNS topic ARN `{arn}`: use the topic's ARN, for example \
                 arn:aws:sns:eu-west-1:123456789012:orders"
            )));
        };
        let fifo = self.aws.fifo.unwrap_or(name.ends_with(".fifo"));
        let region = Some((*region).to_owned()).filter(|r| !r.is_empty());
        let (max_messages, max_wait) = self.aws.batch;
        let limits = batch_limits("sns", max_messages, max_wait)?;
        let topic = Arc::new(Topic {
            arn: arn.clone(),
            region,
            options: self.aws.clone(),
            client: OnceCell::new(),
        });
        let send: SendBatch<Entry> = {
            let topic = Arc::clone(&topic);
            Arc::new(move |entries| {
                let topic = Arc::clone(&topic);
                Box::pin(async move { topic.send(entries).await })
            })
        };
        Ok(SnsPublisher {
            rules: EntryRules {
                service: "sns",
                fifo,
                deduplication_prefix: self.aws.deduplication_prefix,
                cloudevents: self.aws.cloudevents,
            },
            batcher: Batcher::new(limits, send),
            topic,
        })
    }
}

/// The topic, and the client made at the first publish.
struct Topic {
    arn: String,
    region: Option<String>,
    options: AwsOptions,
    client: OnceCell<Client>,
}

impl Topic {
    async fn client(&self) -> &Client {
        self.client
            .get_or_init(|| async {
                let settings = &self.options.settings;
                let loaded = settings.load(self.region.clone()).await;
                let overrides =
                    settings.overrides(&loaded, self.region.clone(), self.options.timeout);
                let mut config = aws_sdk_sns::config::Builder::from(&loaded)
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

    /// Publishes `entries` in one `PublishBatch`; each entry's outcome, in order.
    async fn send(&self, entries: Vec<Entry>) -> Vec<Result<(), PublishError>> {
        let client = self.client().await;
        let batch = entries
            .iter()
            .enumerate()
            .map(|(index, entry)| batch_entry(index, entry))
            .collect();
        let answer = client
            .publish_batch()
            .topic_arn(&self.arn)
            .set_publish_batch_request_entries(Some(batch))
            .send()
            .await;
        let output = match answer {
            Ok(output) => output,
            Err(error) => {
                return match request_failure("sns", &self.arn, &error) {
                    RequestFailure::SendAlone(text) if entries.len() > 1 => {
                        tracing::debug!(topic = %self.arn, error = %text, "sns batch refused: publishing its messages one by one");
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
                "sns",
                &self.arn,
                failed.sender_fault(),
                failed.code(),
                failed.message(),
            );
            (failed.id(), error)
        });
        let confirmed = output.successful().iter().filter_map(|sent| sent.id());
        batch_outcomes("sns", &self.arn, entries.len(), confirmed, failed)
    }

    /// Publishes one message by itself (`Publish`).
    async fn send_alone(&self, client: &Client, entry: &Entry) -> Result<(), PublishError> {
        let result = client
            .publish()
            .topic_arn(&self.arn)
            .message(&entry.body)
            .set_message_attributes(Some(attributes(entry)))
            .set_message_group_id(entry.group_id.clone())
            .set_message_deduplication_id(entry.deduplication_id.clone())
            .send()
            .await;
        alone_outcome("sns", &self.arn, result)
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
fn batch_entry(index: usize, entry: &Entry) -> PublishBatchRequestEntry {
    PublishBatchRequestEntry::builder()
        .id(index.to_string())
        .message(&entry.body)
        .set_message_attributes(Some(attributes(entry)))
        .set_message_group_id(entry.group_id.clone())
        .set_message_deduplication_id(entry.deduplication_id.clone())
        .build()
        .expect("the id and message are set")
}

/// Publishes outbox messages to an SNS topic in batches, returning once SNS confirmed
/// each; see the [module documentation](self).
pub struct SnsPublisher {
    rules: EntryRules,
    batcher: Batcher<Entry>,
    topic: Arc<Topic>,
}

impl fmt::Debug for SnsPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SnsPublisher")
            .field("topic_arn", &self.topic.arn)
            .field("fifo", &self.rules.fifo)
            .finish_non_exhaustive()
    }
}

impl SnsPublisher {
    /// Starts configuring a publisher to the topic `topic_arn`
    /// (`arn:aws:sns:REGION:ACCOUNT:NAME`).
    pub fn builder(topic_arn: impl Into<String>) -> SnsPublisherBuilder {
        SnsPublisherBuilder {
            topic_arn: topic_arn.into(),
            aws: AwsOptions::default(),
        }
    }

    /// Whether messages go out with a group and deduplication id.
    pub fn is_fifo(&self) -> bool {
        self.rules.fifo
    }
}

#[async_trait::async_trait]
impl Publisher for SnsPublisher {
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
    fn arns_are_checked_and_fifo_follows_the_name() {
        let fifo = SnsPublisher::builder("arn:aws:sns:us-east-1:123456789012:orders.fifo")
            .build()
            .unwrap();
        assert!(fifo.is_fifo());
        assert_eq!(fifo.topic.region.as_deref(), Some("us-east-1"));
        let error = SnsPublisher::builder("orders").build().unwrap_err();
        assert!(
            error.to_string().contains("invalid SNS topic ARN"),
            "{error}"
        );
    }
}
