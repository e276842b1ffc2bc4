//! The publisher of the broker `relay` was given, built from its options. A broker whose
//! cargo feature this binary lacks is a usage error that says how to rebuild.

use std::sync::Arc;
use std::time::Duration;

use txoutbox_client::Publisher;

#[cfg(any(feature = "kafka", feature = "webhook"))]
use super::name_value;
use super::Args;
use crate::exit::CliError;

/// The publisher, and where it publishes (for the log).
pub(super) fn make(args: &Args) -> Result<(Arc<dyn Publisher>, String), CliError> {
    if let Some(brokers) = &args.kafka {
        return Ok((kafka(brokers, args)?, format!("kafka {brokers}")));
    }
    if let Some(servers) = &args.nats {
        return Ok((nats(servers, args)?, format!("nats {servers}")));
    }
    if let Some(uri) = &args.amqp {
        return Ok((amqp(uri, args)?, "amqp".to_owned()));
    }
    if let Some(url) = &args.webhook {
        return Ok((webhook(url, args)?, format!("webhook {url}")));
    }
    if let Some(url) = &args.redis {
        return Ok((redis(url, args)?, "redis".to_owned()));
    }
    if let Some(url) = &args.mqtt {
        return Ok((mqtt(url, args)?, format!("mqtt {url}")));
    }
    if let Some(url) = &args.sqs {
        return Ok((sqs(url, args)?, format!("sqs {url}")));
    }
    if let Some(arn) = &args.sns {
        return Ok((sns(arn, args)?, format!("sns {arn}")));
    }
    unreachable!("clap requires one broker")
}

/// The TLS files (`--broker-ca`, `--broker-cert`, `--broker-key`) and the CloudEvents
/// option, which every builder but Kafka's takes alike.
#[cfg(any(
    feature = "nats",
    feature = "amqp",
    feature = "webhook",
    feature = "redis",
    feature = "mqtt"
))]
macro_rules! with_tls_and_events {
    ($builder:expr, $args:expr) => {{
        let files = txoutbox_client::brokers::TlsFiles {
            ca: $args.access.broker_ca.clone(),
            client: $args
                .access
                .broker_cert
                .clone()
                .zip($args.access.broker_key.clone()),
        };
        let builder = $builder.tls(files);
        match cloudevents($args) {
            Some(events) => builder.cloudevents(events),
            None => builder,
        }
    }};
}

/// `--cloudevents` and its options.
#[cfg(feature = "cloudevents")]
fn cloudevents(args: &Args) -> Option<txoutbox_client::brokers::CloudEvents> {
    let mut events = txoutbox_client::brokers::CloudEvents::new(args.events.cloudevents.clone()?);
    if let Some(event_type) = &args.events.cloudevents_type {
        events = events.event_type(event_type.clone());
    }
    if args.events.cloudevents_structured {
        events = events.structured();
    }
    Some(events)
}

/// How long a webhook batch waits for more messages, when batching is on.
const DEFAULT_BATCH_WAIT: Duration = Duration::from_millis(20);

/// How long an SQS or SNS batch waits for more messages (up to 10).
const AWS_BATCH_WAIT: Duration = Duration::from_millis(10);

/// How long a publish may wait for its batch to leave (zero without batching).
pub(super) fn batch_wait(args: &Args) -> Duration {
    if args.sqs.is_some() || args.sns.is_some() {
        return AWS_BATCH_WAIT;
    }
    match args.webhook_batch {
        Some(_) => args.webhook_batch_wait.unwrap_or(DEFAULT_BATCH_WAIT),
        None => Duration::ZERO,
    }
}

#[cfg(not(all(
    feature = "kafka",
    feature = "nats",
    feature = "amqp",
    feature = "webhook",
    feature = "redis",
    feature = "mqtt",
    feature = "sqs",
    feature = "sns"
)))]
fn missing(feature: &str) -> CliError {
    CliError::Usage(format!(
        "this txoutbox was built without the `{feature}` feature; rebuild it with it: \
         cargo install --path client --features {feature}"
    ))
}

#[cfg(feature = "kafka")]
fn kafka(brokers: &str, args: &Args) -> Result<Arc<dyn Publisher>, CliError> {
    let mut kafka =
        txoutbox_client::KafkaPublisher::builder(brokers).delivery_timeout(args.delivery_timeout);
    if let Some(prefix) = &args.topic_prefix {
        kafka = kafka.topic_prefix(prefix.clone());
    }
    // librdkafka's own names for the TLS files; -X given after them wins.
    let files = [
        ("ssl.ca.location", &args.access.broker_ca),
        ("ssl.certificate.location", &args.access.broker_cert),
        ("ssl.key.location", &args.access.broker_key),
    ];
    for (name, path) in files {
        if let Some(path) = path {
            kafka = kafka.set(name, path.display().to_string());
        }
    }
    for property in &args.kafka_properties {
        let (name, value) = name_value("-X", property, "compression.type=zstd")?;
        kafka = kafka.set(name, value);
    }
    if let Some(events) = cloudevents(args) {
        kafka = kafka.cloudevents(events);
    }
    Ok(Arc::new(kafka.build()?))
}

#[cfg(not(feature = "kafka"))]
fn kafka(_: &str, _: &Args) -> Result<Arc<dyn Publisher>, CliError> {
    Err(missing("kafka"))
}

#[cfg(feature = "nats")]
fn nats(servers: &str, args: &Args) -> Result<Arc<dyn Publisher>, CliError> {
    let mut nats = txoutbox_client::NatsPublisher::builder(servers)
        .ack_timeout(args.delivery_timeout)
        .name(args.name.clone());
    if let Some(prefix) = &args.topic_prefix {
        nats = nats.topic_prefix(prefix.clone());
    }
    if let Some(prefix) = &args.msg_id_prefix {
        nats = nats.msg_id_prefix(prefix.clone());
    }
    if let Some(creds) = &args.access.nats_creds {
        nats = nats.credentials_file(creds.clone());
    }
    if let Some(seed) = &args.access.nats_nkey {
        nats = nats.nkey(seed.clone());
    }
    Ok(Arc::new(with_tls_and_events!(nats, args).build()?))
}

#[cfg(not(feature = "nats"))]
fn nats(_: &str, _: &Args) -> Result<Arc<dyn Publisher>, CliError> {
    Err(missing("nats"))
}

#[cfg(feature = "amqp")]
fn amqp(uri: &str, args: &Args) -> Result<Arc<dyn Publisher>, CliError> {
    let exchange = args.exchange.clone().unwrap_or_default();
    let mut amqp = txoutbox_client::AmqpPublisher::builder(uri, exchange)
        .confirm_timeout(args.delivery_timeout)
        .retry_unroutable(args.retry_unroutable);
    if let Some(prefix) = &args.topic_prefix {
        amqp = amqp.topic_prefix(prefix.clone());
    }
    Ok(Arc::new(with_tls_and_events!(amqp, args).build()?))
}

#[cfg(not(feature = "amqp"))]
fn amqp(_: &str, _: &Args) -> Result<Arc<dyn Publisher>, CliError> {
    Err(missing("amqp"))
}

#[cfg(feature = "webhook")]
fn webhook(url: &str, args: &Args) -> Result<Arc<dyn Publisher>, CliError> {
    let mut hook = txoutbox_client::WebhookPublisher::builder(url).timeout(args.delivery_timeout);
    if let Some(secret) = &args.webhook_secret {
        hook = hook.secret(secret.as_bytes());
    }
    for header in &args.webhook_headers {
        let (name, value) = name_value("--webhook-header", header, "authorization=Bearer...")?;
        hook = hook.header(name, value);
    }
    for status in &args.retry_statuses {
        hook = hook.retry_status(*status);
    }
    if let Some(max_messages) = args.webhook_batch {
        if max_messages == 0 || max_messages > args.concurrency {
            return Err(CliError::Usage(format!(
                "--webhook-batch {max_messages}: a batch holds 1 to --concurrency ({}) \
                 messages, one per key published at once; raise --concurrency or lower \
                 --webhook-batch",
                args.concurrency
            )));
        }
        hook = hook.batch(max_messages, batch_wait(args));
    }
    Ok(Arc::new(with_tls_and_events!(hook, args).build()?))
}

#[cfg(not(feature = "webhook"))]
fn webhook(_: &str, _: &Args) -> Result<Arc<dyn Publisher>, CliError> {
    Err(missing("webhook"))
}

#[cfg(feature = "redis")]
fn redis(url: &str, args: &Args) -> Result<Arc<dyn Publisher>, CliError> {
    let mut redis =
        txoutbox_client::RedisStreamPublisher::builder(url).response_timeout(args.delivery_timeout);
    if let Some(prefix) = &args.topic_prefix {
        redis = redis.topic_prefix(prefix.clone());
    }
    if let Some(max_len) = args.max_len {
        redis = redis.max_len(max_len);
    }
    Ok(Arc::new(with_tls_and_events!(redis, args).build()?))
}

#[cfg(not(feature = "redis"))]
fn redis(_: &str, _: &Args) -> Result<Arc<dyn Publisher>, CliError> {
    Err(missing("redis"))
}

#[cfg(feature = "mqtt")]
fn mqtt(url: &str, args: &Args) -> Result<Arc<dyn Publisher>, CliError> {
    let mut mqtt = txoutbox_client::MqttPublisher::builder(url)
        .ack_timeout(args.delivery_timeout)
        .key_in_topic(args.key_in_topic);
    if let Some(prefix) = &args.topic_prefix {
        mqtt = mqtt.topic_prefix(prefix.clone());
    }
    if let (Some(user), password) = (&args.access.mqtt_user, &args.access.mqtt_password) {
        mqtt = mqtt.credentials(user.clone(), password.clone().unwrap_or_default());
    }
    Ok(Arc::new(with_tls_and_events!(mqtt, args).build()?))
}

#[cfg(not(feature = "mqtt"))]
fn mqtt(_: &str, _: &Args) -> Result<Arc<dyn Publisher>, CliError> {
    Err(missing("mqtt"))
}

/// The options SQS and SNS share: region, endpoint, timeout, batches of up to 10 (one
/// per key published at once, so never more than --concurrency), CloudEvents.
#[cfg(any(feature = "sqs", feature = "sns"))]
macro_rules! with_aws_options {
    ($builder:expr, $args:expr) => {{
        let mut builder = $builder
            .timeout($args.delivery_timeout)
            .batch($args.concurrency.clamp(1, 10), AWS_BATCH_WAIT);
        if let Some(region) = &$args.aws_region {
            builder = builder.region(region.clone());
        }
        if let Some(endpoint) = &$args.aws_endpoint {
            builder = builder.endpoint_url(endpoint.clone());
        }
        if let Some(prefix) = &$args.msg_id_prefix {
            builder = builder.deduplication_id_prefix(prefix.clone());
        }
        if let Some(events) = cloudevents($args) {
            builder = builder.cloudevents(events);
        }
        builder
    }};
}

#[cfg(feature = "sqs")]
fn sqs(url: &str, args: &Args) -> Result<Arc<dyn Publisher>, CliError> {
    let sqs = txoutbox_client::SqsPublisher::builder(url);
    Ok(Arc::new(with_aws_options!(sqs, args).build()?))
}

#[cfg(not(feature = "sqs"))]
fn sqs(_: &str, _: &Args) -> Result<Arc<dyn Publisher>, CliError> {
    Err(missing("sqs"))
}

#[cfg(feature = "sns")]
fn sns(arn: &str, args: &Args) -> Result<Arc<dyn Publisher>, CliError> {
    let sns = txoutbox_client::SnsPublisher::builder(arn);
    Ok(Arc::new(with_aws_options!(sns, args).build()?))
}

#[cfg(not(feature = "sns"))]
fn sns(_: &str, _: &Args) -> Result<Arc<dyn Publisher>, CliError> {
    Err(missing("sns"))
}
