//! `txoutbox relay --kafka|--nats|--amqp|--webhook|--redis|--mqtt|--sqs|--sns ...`: the subscriber runtime
//! with one of the client's ready-made publishers, until SIGINT/SIGTERM (graceful:
//! in-flight publishes finish and are acked, the rest is given back untried; a second
//! signal stops at once).
//!
//! The options are here; `publisher.rs` makes the publisher of the chosen broker (each
//! behind its cargo feature).

mod access;
mod publisher;

use std::time::Duration;

use txoutbox_client::Subscriber;

use super::{CliError, Context};
use access::{Access, EventOptions};

const EXAMPLES: &str = "\
Examples:
  txoutbox --outbox orders relay --kafka localhost:9092 --topic-prefix outbox.
  txoutbox --outbox orders relay --kafka b1:9093 -X security.protocol=SSL -X compression.type=zstd
  txoutbox --outbox orders relay --nats nats://127.0.0.1:4222 --topic-prefix outbox.
  txoutbox --outbox orders relay --amqp amqp://guest:guest@127.0.0.1:5672/%2f --exchange events
  txoutbox --outbox orders relay --webhook https://example.com/hooks/orders --webhook-secret \"$SECRET\"
  txoutbox --outbox orders relay --webhook https://example.com/hooks/orders --webhook-batch 16 --webhook-batch-wait 20ms
  txoutbox --outbox orders relay --redis redis://127.0.0.1:6379 --topic-prefix outbox: --max-len 100000
  txoutbox --outbox orders relay --mqtt mqtts://broker:8883 --broker-ca ca.pem --mqtt-user relay --key-in-topic
  txoutbox --outbox orders relay --kafka b1:9093 -X security.protocol=SASL_SSL -X sasl.mechanism=SCRAM-SHA-512 \\
      -X sasl.username=relay -X sasl.password=\"$KAFKA_PASSWORD\" --broker-ca ca.pem
  txoutbox --outbox orders relay --nats tls://nats:4222 --nats-creds relay.creds --cloudevents /shop/orders
  txoutbox --outbox orders relay --sqs https://sqs.eu-west-1.amazonaws.com/123456789012/orders.fifo
  txoutbox --outbox orders relay --sns arn:aws:sns:eu-west-1:123456789012:orders --cloudevents /shop/orders

Each message is acked only once the broker confirmed it: Kafka's delivery report (idempotent
producer, acks=all), JetStream's PubAck, RabbitMQ's publisher confirm (mandatory, persistent),
a 2xx answer, Redis' XADD reply, MQTT's PUBACK (QoS 1), SQS's and SNS's answer for the
message's batch entry. The message id travels as txoutbox-id (Nats-Msg-Id on NATS,
message_id on AMQP, field id on Redis, user property txoutbox-id on MQTT, message
attribute txoutbox-id and, on FIFO queues and topics, MessageDeduplicationId on SQS and
SNS; with --cloudevents, the event's id): deduplicate on it. SQS and SNS take their
credentials from the standard AWS chain (AWS_ACCESS_KEY_ID..., AWS_PROFILE, web
identity, ECS, instance metadata). A message the broker can never take
is dead-lettered; anything else is nacked and retried with the outbox's backoff.";

#[derive(Debug, clap::Args)]
#[command(after_help = EXAMPLES)]
#[command(group(clap::ArgGroup::new("broker").required(true).args(["kafka", "nats", "amqp", "webhook", "redis", "mqtt", "sqs", "sns"])))]
#[command(group(clap::ArgGroup::new("aws").args(["sqs", "sns"])))]
#[command(group(clap::ArgGroup::new("deduplicating").args(["nats", "sqs", "sns"])))]
pub struct Args {
    /// Kafka bootstrap servers, host:port[,host:port...] (feature `kafka`).
    #[arg(long, value_name = "BROKERS", help_heading = "Broker (one of)")]
    kafka: Option<String>,
    /// NATS servers with JetStream, nats://host:4222[,...] (feature `nats`). A stream
    /// must capture the subjects.
    #[arg(long, value_name = "URL", help_heading = "Broker (one of)")]
    nats: Option<String>,
    /// RabbitMQ, amqp://user:password@host:5672/vhost (feature `amqp`); needs --exchange.
    #[arg(
        long,
        value_name = "URI",
        help_heading = "Broker (one of)",
        requires = "exchange"
    )]
    amqp: Option<String>,
    /// An HTTP endpoint to POST each message to (feature `webhook`).
    #[arg(long, value_name = "URL", help_heading = "Broker (one of)")]
    webhook: Option<String>,
    /// Redis, redis://host:6379[/db] or rediss:// for TLS: XADD to a stream per topic
    /// (feature `redis`).
    #[arg(long, value_name = "URL", help_heading = "Broker (one of)")]
    redis: Option<String>,
    /// An MQTT 5 broker, mqtt://host:1883 or mqtts://host:8883: QoS 1 publishes (feature
    /// `mqtt`).
    #[arg(long, value_name = "URL", help_heading = "Broker (one of)")]
    mqtt: Option<String>,
    /// An Amazon SQS queue URL, https://sqs.REGION.amazonaws.com/ACCOUNT/NAME: batches
    /// of up to 10 (feature `sqs`). A .fifo queue gets MessageGroupId = the key.
    #[arg(long, value_name = "QUEUE_URL", help_heading = "Broker (one of)")]
    sqs: Option<String>,
    /// An Amazon SNS topic ARN, arn:aws:sns:REGION:ACCOUNT:NAME: batches of up to 10
    /// (feature `sns`). A .fifo topic gets MessageGroupId = the key.
    #[arg(long, value_name = "TOPIC_ARN", help_heading = "Broker (one of)")]
    sns: Option<String>,

    #[command(flatten)]
    access: Access,
    #[command(flatten)]
    events: EventOptions,

    /// Broker topic = this prefix + the outbox topic: the Kafka topic, NATS subject,
    /// AMQP routing key, Redis stream or MQTT topic (default: the outbox topic as is).
    #[arg(long, value_name = "PREFIX", conflicts_with_all = ["webhook", "sqs", "sns"])]
    topic_prefix: Option<String>,
    /// Only relay these outbox topics (repeatable; default: every topic).
    #[arg(long = "topic", value_name = "TOPIC", conflicts_with = "group")]
    topics: Vec<String>,
    /// Relay as a member of this subscription group of the outbox (required on an
    /// outbox with groups): each group gets every row, so one outbox feeds several
    /// brokers, one `txoutbox relay --group` per destination.
    #[arg(long, value_name = "GROUP")]
    group: Option<String>,
    /// How long the broker may take to confirm one message before the row is nacked and
    /// retried (Kafka's message.timeout.ms, the PubAck, the publisher confirm, the HTTP
    /// request, Redis' answer, an SQS or SNS request).
    #[arg(long, value_name = "DURATION", default_value = "8s", value_parser = humantime::parse_duration)]
    delivery_timeout: Duration,

    /// Kafka: a librdkafka producer property, NAME=VALUE (repeatable), as with kcat.
    #[arg(
        short = 'X',
        long = "kafka-property",
        value_name = "NAME=VALUE",
        requires = "kafka"
    )]
    kafka_properties: Vec<String>,
    /// NATS, SQS and SNS FIFO: put this before the message id in Nats-Msg-Id or
    /// MessageDeduplicationId, when several outboxes share a stream, queue or topic.
    #[arg(long, value_name = "PREFIX", requires = "deduplicating")]
    msg_id_prefix: Option<String>,
    /// AMQP: the exchange to publish to; \"\" is the default exchange (routing key =
    /// queue name).
    #[arg(long, value_name = "NAME", requires = "amqp")]
    exchange: Option<String>,
    /// AMQP: retry a message no queue is bound for, instead of dead-lettering it.
    #[arg(long, requires = "amqp")]
    retry_unroutable: bool,
    /// Webhook: sign requests with this shared secret (header txoutbox-signature:
    /// t=TIMESTAMP,v1=HMAC-SHA256 of \"TIMESTAMP.BODY\").
    #[arg(
        long,
        value_name = "SECRET",
        env = "TXOUTBOX_WEBHOOK_SECRET",
        hide_env_values = true,
        requires = "webhook"
    )]
    webhook_secret: Option<String>,
    /// Webhook: a header sent with every request, NAME=VALUE (repeatable), for example
    /// authorization=Bearer...
    #[arg(
        long = "webhook-header",
        value_name = "NAME=VALUE",
        requires = "webhook"
    )]
    webhook_headers: Vec<String>,
    /// Webhook: retry this 4xx status instead of dead-lettering (repeatable; 408 and 429
    /// are always retried).
    #[arg(long = "retry-status", value_name = "CODE", requires = "webhook")]
    retry_statuses: Vec<u16>,
    /// Webhook: POST the messages published at about the same time as one JSON array of
    /// at most N (one per key; N at most --concurrency); all get that POST's answer.
    #[arg(long, value_name = "N", requires = "webhook")]
    webhook_batch: Option<usize>,
    /// Webhook: send a batch at most this long after its first message, full or not
    /// [default: 20ms].
    #[arg(long, value_name = "DURATION", requires = "webhook_batch", value_parser = humantime::parse_duration)]
    webhook_batch_wait: Option<Duration>,
    /// Redis: trim each stream to about this many entries (XADD MAXLEN ~).
    #[arg(long, value_name = "N", requires = "redis")]
    max_len: Option<u64>,
    /// MQTT: append /KEY to the topic of keyed messages (the key must be a topic level).
    #[arg(long, requires = "mqtt")]
    key_in_topic: bool,
    /// SQS, SNS: the AWS region [default: the queue URL's or topic ARN's, else
    /// AWS_REGION or the profile's].
    #[arg(long, value_name = "REGION", requires = "aws")]
    aws_region: Option<String>,
    /// SQS, SNS: send requests to this endpoint instead of the region's: an emulator
    /// (http://127.0.0.1:4566) or a VPC endpoint.
    #[arg(long, value_name = "URL", requires = "aws")]
    aws_endpoint: Option<String>,

    /// Subscriber name, in the server's logs.
    #[arg(long, default_value = "txoutbox-relay")]
    name: String,
    /// Most publishes at once, each of a different key.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Most messages held at once (flow-control window).
    #[arg(long, default_value_t = 500)]
    max_in_flight: u32,
}

pub async fn run(context: &mut Context, args: Args) -> Result<(), CliError> {
    let (publisher, destination) = publisher::make(&args)?;
    // Room for the broker's own timeout (and a webhook batch's wait) before the runtime
    // gives up on a publish.
    let publish_timeout =
        args.delivery_timeout + publisher::batch_wait(&args) + Duration::from_secs(2);
    let outbox = context.outbox().await?;
    let subscriber = Subscriber::builder(context.servers.clone(), outbox.clone())
        .name(args.name)
        .topics(args.topics)
        .group(args.group.unwrap_or_default())
        .concurrency(args.concurrency)
        .max_in_flight(args.max_in_flight)
        .credentials(context.credentials.clone())
        .publish_timeout(publish_timeout)
        .build_shared(publisher)?;
    let counters = subscriber.counters();
    tracing::info!(%outbox, to = %destination, "relaying; SIGINT or SIGTERM stops gracefully");
    let result = subscriber.run_until_signal().await;
    let totals = counters.snapshot();
    tracing::info!(
        published = totals.published,
        retried = totals.retried,
        dead_lettered = totals.dead_lettered,
        released = totals.released,
        "relay stopped"
    );
    Ok(result?)
}

/// `NAME=VALUE`, or a usage error naming the option.
#[cfg(any(feature = "kafka", feature = "webhook"))]
fn name_value<'a>(
    option: &str,
    given: &'a str,
    example: &str,
) -> Result<(&'a str, &'a str), CliError> {
    given.split_once('=').ok_or_else(|| {
        CliError::Usage(format!(
            "{option} {given}: expected NAME=VALUE, for example {option} {example}"
        ))
    })
}
