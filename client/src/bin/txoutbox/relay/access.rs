//! The broker options every `relay` broker shares: TLS files and credentials, and the
//! CloudEvents envelope.

use std::path::PathBuf;

/// TLS and authentication.
#[derive(Debug, clap::Args)]
#[command(next_help_heading = "Broker TLS and authentication")]
pub(super) struct Access {
    /// TLS: the CA certificate (PEM) that signed the broker's certificate (Kafka:
    /// ssl.ca.location).
    #[arg(long, value_name = "FILE")]
    pub(super) broker_ca: Option<PathBuf>,
    /// TLS: a client certificate (PEM) for brokers that require one, with --broker-key
    /// (Kafka: ssl.certificate.location).
    #[arg(long, value_name = "FILE", requires = "broker_key")]
    pub(super) broker_cert: Option<PathBuf>,
    /// TLS: the client certificate's private key (PEM) (Kafka: ssl.key.location).
    #[arg(long, value_name = "FILE", requires = "broker_cert")]
    pub(super) broker_key: Option<PathBuf>,
    /// NATS: a user's credentials file (JWT and NKey seed, from nsc).
    #[arg(
        long,
        value_name = "FILE",
        requires = "nats",
        conflicts_with = "nats_nkey"
    )]
    pub(super) nats_creds: Option<PathBuf>,
    /// NATS: a user's NKey seed (SU...).
    #[arg(
        long,
        value_name = "SEED",
        env = "TXOUTBOX_NATS_NKEY",
        hide_env_values = true,
        requires = "nats"
    )]
    pub(super) nats_nkey: Option<String>,
    /// MQTT: the user name, with --mqtt-password.
    #[arg(long, value_name = "USER", requires = "mqtt")]
    pub(super) mqtt_user: Option<String>,
    /// MQTT: the password of --mqtt-user.
    #[arg(
        long,
        value_name = "PASSWORD",
        env = "TXOUTBOX_MQTT_PASSWORD",
        hide_env_values = true,
        requires = "mqtt_user"
    )]
    pub(super) mqtt_password: Option<String>,
}

/// CloudEvents.
#[derive(Debug, clap::Args)]
#[command(next_help_heading = "CloudEvents")]
pub(super) struct EventOptions {
    /// Send each message as a CloudEvent from this source (a URI reference, for example
    /// /shop/orders): binary content mode unless --cloudevents-structured; type = the
    /// outbox topic unless --cloudevents-type.
    #[arg(long, value_name = "SOURCE")]
    pub(super) cloudevents: Option<String>,
    /// CloudEvents: every event's type (default: the outbox topic).
    #[arg(long, value_name = "TYPE", requires = "cloudevents")]
    pub(super) cloudevents_type: Option<String>,
    /// CloudEvents: structured content mode (the JSON event as the body).
    #[arg(long, requires = "cloudevents")]
    pub(super) cloudevents_structured: bool,
}
