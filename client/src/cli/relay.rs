//! `txoutbox relay --kafka BROKERS`: the subscriber runtime with `KafkaPublisher`, until
//! SIGINT/SIGTERM (graceful: in-flight publishes finish and are acked, the rest is given
//! back untried; a second signal stops at once).

use std::time::Duration;

use super::{CliError, Context};

const EXAMPLES: &str = "\
Examples:
  txoutbox --outbox orders relay --kafka localhost:9092
  txoutbox --outbox orders relay --kafka b1:9092,b2:9092 --topic-prefix outbox. --concurrency 32
  txoutbox --outbox orders relay --kafka b1:9093 -X security.protocol=SSL -X compression.type=zstd

Records: the outbox key is the Kafka key, the row's headers are carried over with
txoutbox-id (the message id, for deduplication) and txoutbox-topic added; the producer is
idempotent (acks=all) and each row is acked only once Kafka confirmed it.";

#[derive(Debug, clap::Args)]
#[command(after_help = EXAMPLES)]
pub struct Args {
    /// Kafka bootstrap servers, host:port[,host:port...].
    #[arg(long, value_name = "BROKERS")]
    kafka: String,
    /// Kafka topic = this prefix + the outbox topic (default: the outbox topic as is).
    #[arg(long, value_name = "PREFIX")]
    topic_prefix: Option<String>,
    /// Only relay these outbox topics (repeatable; default: every topic).
    #[arg(long = "topic", value_name = "TOPIC")]
    topics: Vec<String>,
    /// A librdkafka producer property, NAME=VALUE (repeatable), as with kcat.
    #[arg(short = 'X', long = "kafka-property", value_name = "NAME=VALUE")]
    properties: Vec<String>,
    /// Subscriber name, in the server's logs.
    #[arg(long, default_value = "txoutbox-relay")]
    name: String,
    /// Most publishes at once, each of a different key.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Most messages held at once (flow-control window).
    #[arg(long, default_value_t = 500)]
    max_in_flight: u32,
    /// How long Kafka may take to confirm one record before the row is nacked and retried.
    #[arg(long, value_name = "DURATION", default_value = "8s", value_parser = humantime::parse_duration)]
    delivery_timeout: Duration,
}

#[cfg(not(feature = "kafka"))]
pub async fn run(_context: &mut Context, _args: Args) -> Result<(), CliError> {
    Err(CliError::Usage(
        "this txoutbox was built without Kafka support; rebuild it with the `kafka` feature: \
         cargo install --path client --features kafka"
            .to_owned(),
    ))
}

#[cfg(feature = "kafka")]
pub async fn run(context: &mut Context, args: Args) -> Result<(), CliError> {
    use txoutbox_client::{KafkaPublisher, Subscriber};

    let outbox = context.outbox().await?;
    let mut kafka = KafkaPublisher::builder(&args.kafka).delivery_timeout(args.delivery_timeout);
    if let Some(prefix) = &args.topic_prefix {
        kafka = kafka.topic_prefix(prefix.clone());
    }
    for property in &args.properties {
        let Some((name, value)) = property.split_once('=') else {
            return Err(CliError::Usage(format!(
                "-X {property}: expected NAME=VALUE, for example -X compression.type=zstd"
            )));
        };
        kafka = kafka.set(name, value);
    }
    let kafka = kafka.build()?;
    let subscriber = Subscriber::builder(context.servers.clone(), outbox.clone())
        .name(args.name)
        .topics(args.topics)
        .concurrency(args.concurrency)
        .max_in_flight(args.max_in_flight)
        .credentials(context.credentials.clone())
        // Room for Kafka's own delivery timeout before the runtime gives up on a publish.
        .publish_timeout(args.delivery_timeout + Duration::from_secs(2))
        .build(kafka)?;
    let counters = subscriber.counters();
    tracing::info!(%outbox, kafka = %args.kafka, "relaying to kafka; SIGINT or SIGTERM stops gracefully");
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
