//! Configuration: one TOML file, overridden by `TXOUTBOX_*` environment variables and
//! command-line flags, validated once at start.
//!
//! Databases are declared once under `[databases.NAME]` and outboxes reference them by
//! name under `[outboxes.NAME]`. Every per-outbox knob has a home here.
//! Unknown keys are errors (a typo must not silently fall back to a default), and every
//! validation problem is reported at once, each naming the key and what is allowed.
//!
//! Environment overrides use `__` between levels, for example
//! `TXOUTBOX_SERVER__LISTEN=0.0.0.0:7411` or `TXOUTBOX_DATABASES__MAIN__URL=postgres://...`.
//!
//! With no configuration file, [`EMBEDDED_DEFAULT`] is the bottom layer: one SQLite outbox,
//! so `txoutboxd` with no arguments serves something a newcomer can try at once.

mod backoff;
pub mod columns;
mod database;
mod embedded;
pub mod group;
pub mod ident;
mod outbox;
mod url;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};

pub use self::backoff::BackoffConfig;
pub use self::database::{
    DatabaseConfig, SynchronousCommit, Timeouts, DEFAULT_ACQUIRE_TIMEOUT, DEFAULT_STATEMENT_TIMEOUT,
};
use self::embedded::{environment_declares_outboxes, sqlite_url};
pub use self::embedded::{EMBEDDED_DEFAULT, EMBEDDED_NAME};
pub use self::group::{GroupConfig, GroupOrdering, GroupSettings, GroupStart};
pub use self::outbox::{OutboxConfig, PollConfig};
pub use self::url::{mysql_connect_options, redact, sqlite_database_file, Backend, DatabaseUrl};

mod security;
pub use security::{AuthConfig, IdentityConfig, IdentityLimits, Scope, TlsConfig, EVERY_OUTBOX};

/// Where `txoutboxd` listens when nothing says otherwise.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7411";

/// Largest batch or window a caller may ask for.
pub const MAX_WINDOW: u32 = 10_000;

/// Longest duration anywhere: every duration key, a release's delay. Past it a lease or
/// a delay means "practically never", and `Instant + Duration` would be one overflow
/// away; a message to park for longer is dead-lettered instead.
pub const MAX_DURATION: Duration = Duration::from_secs(7 * 24 * 3600);

/// Shortest lease: below it a lease runs out while its batch crosses the network.
pub const MIN_LEASE: Duration = Duration::from_millis(100);

/// Shortest health interval: the checks query every outbox's database.
const MIN_HEALTH_INTERVAL: Duration = Duration::from_millis(100);

/// Shortest depth-gauge interval: each refresh counts every outbox's pending and dead rows.
const MIN_DEPTH_INTERVAL: Duration = Duration::from_millis(100);

/// What gRPC clients accept by default, in every language: the default response cap.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;
/// Bounds of `server.max_message_bytes`: room for a row of real size; at most two
/// responses of this size wait per stream, so it bounds a stream's memory too.
const MESSAGE_BYTES_RANGE: std::ops::RangeInclusive<usize> = 64 * 1024..=64 * 1024 * 1024;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub server: ServerConfig,
    #[serde(default)]
    pub databases: BTreeMap<String, DatabaseConfig>,
    #[serde(default)]
    pub outboxes: BTreeMap<String, OutboxConfig>,
    #[serde(default)]
    pub telemetry: TelemetryConfig,
    /// Built on [`EMBEDDED_DEFAULT`] (not a key: set by [`Config::load`]), so the server
    /// says so at start with how to try it.
    #[serde(skip)]
    pub embedded_default: bool,
    /// The file it was read from, if any (not a key: set by [`Config::load`]), read again
    /// when the identities reload.
    #[serde(skip)]
    pub file: Option<PathBuf>,
    /// The flags it was read with, applied again with the file.
    #[serde(skip)]
    pub overrides: Overrides,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// gRPC listen address.
    pub listen: SocketAddr,
    /// On SIGTERM/SIGINT, how long subscribers get to answer what they hold.
    #[serde(with = "humantime_serde")]
    pub drain_timeout: Duration,
    /// `text` or `json` log lines.
    pub log_format: LogFormat,
    /// How often each outbox's database is pinged for the health service.
    #[serde(with = "humantime_serde")]
    pub health_interval: Duration,
    /// Largest response sent, in bytes on the wire: a batch on `Subscribe`, a unary
    /// `Claim`. A claim keeps the id-ordered prefix of its rows that fits and gives the
    /// rest back untried; a row that fits no response alone is dead-lettered with an
    /// error saying so. The default is what gRPC clients accept unless told otherwise.
    pub max_message_bytes: usize,
    /// HTTP/2 streams one client connection may have open at once (its
    /// `SETTINGS_MAX_CONCURRENT_STREAMS`); a client opening more waits for one to end.
    pub max_streams_per_connection: u32,
    /// Streaming calls (`Subscribe`, health `Watch`, reflection) open at once on this
    /// server, every caller together, anonymous ones included; one more is
    /// RESOURCE_EXHAUSTED naming this key.
    pub max_streams: u32,
    /// Client connections open at once; past it the server accepts no more until one
    /// closes (they wait in the kernel's listen backlog).
    pub max_connections: u32,
    /// TLS handshakes in progress at once (each has 10 s to finish); a connection past it
    /// is closed at once, before its handshake.
    pub max_pending_handshakes: u32,
    /// TLS (and mutual TLS) on the gRPC port; plain HTTP/2 when absent.
    pub tls: Option<TlsConfig>,
    /// Identities, their credentials, scopes and limits.
    pub auth: AuthConfig,
    /// Serve a non-loopback address without TLS or without credentials. Refused otherwise.
    pub allow_insecure: bool,
    /// Prometheus metrics (`GET /metrics`) on this address, plain HTTP on a listener of
    /// its own; none when absent (see [`crate::telemetry::metrics`]).
    pub metrics_listen: Option<SocketAddr>,
    /// How often the depth gauges (pending, leased, waiting, dead, oldest pending age)
    /// are refreshed: one count query per outbox per interval, on the health checks'
    /// connection. Only with `metrics_listen`.
    #[serde(with = "humantime_serde")]
    pub metrics_depth_interval: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: DEFAULT_LISTEN.parse().expect("valid default address"),
            drain_timeout: Duration::from_secs(30),
            log_format: LogFormat::Text,
            health_interval: Duration::from_secs(5),
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            max_streams_per_connection: 1000,
            max_streams: 10_000,
            max_connections: 10_000,
            max_pending_handshakes: 1_000,
            tls: None,
            auth: AuthConfig::default(),
            allow_insecure: false,
            metrics_listen: None,
            metrics_depth_interval: Duration::from_secs(15),
        }
    }
}

/// `[telemetry]`: OpenTelemetry traces over OTLP/gRPC (see [`crate::telemetry::traces`]).
/// Off unless `otlp_endpoint` or the standard `OTEL_EXPORTER_OTLP_ENDPOINT` /
/// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set; `OTEL_SDK_DISABLED=true` turns it off.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// The collector's OTLP/gRPC endpoint, for example `http://127.0.0.1:4317`; the
    /// `OTEL_EXPORTER_OTLP_*` variables set it too (and its timeout, headers...).
    pub otlp_endpoint: Option<String>,
    /// `service.name` of the spans; else `OTEL_SERVICE_NAME`, else `txoutboxd`.
    pub service_name: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

/// A configuration that could not be loaded; the message names the file and the key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{0}")]
    Parse(String),
    #[error("invalid configuration{source_note}:\n{}", problems.iter().map(|p| format!("  - {p}")).collect::<Vec<_>>().join("\n"))]
    Invalid {
        source_note: String,
        problems: Vec<String>,
    },
}

/// Flag values that override the file and the environment.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Overrides {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<SocketAddr>,
    /// `--db PATH`: the SQLite file of the embedded default (not a `server` key).
    #[serde(skip)]
    pub db: Option<PathBuf>,
}

impl Config {
    /// Loads `path` (if given; else the [`EMBEDDED_DEFAULT`] when it applies), then
    /// `TXOUTBOX_*` variables, then flag overrides.
    pub fn load(path: Option<&Path>, overrides: &Overrides) -> Result<Self, ConfigError> {
        let mut figment = Figment::new();
        let embedded_default = path.is_none() && !environment_declares_outboxes();
        if let (Some(db), false) = (&overrides.db, embedded_default) {
            return Err(ConfigError::Parse(format!(
                "--db {}: only for the embedded default (no configuration file); set \
                 databases.NAME.url in the configuration instead",
                db.display()
            )));
        }
        if embedded_default {
            figment = figment.merge(Toml::string(EMBEDDED_DEFAULT));
        }
        if let Some(path) = path {
            if !path.exists() {
                return Err(ConfigError::Parse(format!(
                    "configuration file {} does not exist",
                    path.display()
                )));
            }
            figment = figment.merge(Toml::file_exact(path));
        }
        figment = figment.merge(
            Env::prefixed("TXOUTBOX_")
                .filter(|key| key.as_str().contains("__"))
                .split("__"),
        );
        figment = figment.merge(Serialized::default("server", overrides));
        if let Some(db) = &overrides.db {
            let url = sqlite_url(db);
            let databases = BTreeMap::from([(EMBEDDED_NAME, BTreeMap::from([("url", url)]))]);
            figment = figment.merge(Serialized::default("databases", databases));
        }
        let mut config: Config = figment.extract().map_err(|error| {
            let origin = path
                .map(|p| format!(" in {}", p.display()))
                .unwrap_or_default();
            ConfigError::Parse(format!("configuration error{origin}: {}", describe(error)))
        })?;
        let source_note = path
            .map(|p| format!(" in {}", p.display()))
            .unwrap_or_default();
        config.validate().map_err(|problems| ConfigError::Invalid {
            source_note,
            problems,
        })?;
        config.embedded_default = embedded_default;
        config.file = path.map(Path::to_path_buf);
        config.overrides = overrides.clone();
        Ok(config)
    }

    /// Parses a TOML document (tests and embedded defaults); no environment.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let config: Config = Figment::from(Toml::string(text))
            .extract()
            .map_err(|error| {
                ConfigError::Parse(format!("configuration error: {}", describe(error)))
            })?;
        config.validate().map_err(|problems| ConfigError::Invalid {
            source_note: String::new(),
            problems,
        })?;
        Ok(config)
    }

    /// Every problem at once, each naming its key.
    pub fn validate(&self) -> Result<(), Vec<String>> {
        let mut problems = Vec::new();
        if self.outboxes.is_empty() {
            problems.push("no outbox is configured: add an [outboxes.NAME] table".to_owned());
        }
        for (name, database) in &self.databases {
            database.validate(name, &mut problems);
        }
        for (name, outbox) in &self.outboxes {
            outbox.validate(name, &self.databases, &mut problems);
        }
        let server = &self.server;
        check_duration(
            &mut problems,
            "server.drain_timeout",
            server.drain_timeout,
            Duration::from_millis(1),
            "30s",
        );
        check_duration(
            &mut problems,
            "server.health_interval",
            server.health_interval,
            MIN_HEALTH_INTERVAL,
            "5s",
        );
        check_duration(
            &mut problems,
            "server.metrics_depth_interval",
            server.metrics_depth_interval,
            MIN_DEPTH_INTERVAL,
            "15s",
        );
        if !MESSAGE_BYTES_RANGE.contains(&server.max_message_bytes) {
            problems.push(format!(
                "server.max_message_bytes = {}: must be within {}..={} (default {DEFAULT_MAX_MESSAGE_BYTES}, \
                 what gRPC clients accept by default; raise it only with every client's receive limit)",
                server.max_message_bytes,
                MESSAGE_BYTES_RANGE.start(),
                MESSAGE_BYTES_RANGE.end()
            ));
        }
        for (key, value) in [
            (
                "max_streams_per_connection",
                server.max_streams_per_connection,
            ),
            ("max_streams", server.max_streams),
            ("max_connections", server.max_connections),
            ("max_pending_handshakes", server.max_pending_handshakes),
        ] {
            if value == 0 {
                problems.push(format!("server.{key}: must be at least 1"));
            }
        }
        let outboxes: Vec<&str> = self.outboxes.keys().map(String::as_str).collect();
        security::validate(
            server.listen,
            server.allow_insecure,
            server.max_message_bytes,
            server.tls.as_ref(),
            &server.auth,
            &outboxes,
            &mut problems,
        );
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }
}

/// Problems of a duration key: below `min` (zero means a positive duration is needed) or
/// above [`MAX_DURATION`].
pub(crate) fn check_duration(
    problems: &mut Vec<String>,
    key: &str,
    value: Duration,
    min: Duration,
    example: &str,
) {
    let text = |d: Duration| humantime::format_duration(d).to_string();
    if value < min {
        problems.push(format!(
            "{key} = {}: must be at least {}, for example \"{example}\"",
            text(value),
            text(min.max(Duration::from_nanos(1)))
        ));
    } else if value > MAX_DURATION {
        problems.push(format!(
            "{key} = {}: must be at most {} (7 days)",
            text(value),
            text(MAX_DURATION)
        ));
    }
}

/// A figment error with its key path, without the noise of the provider chain.
fn describe(error: figment::Error) -> String {
    error
        .into_iter()
        .map(|e| {
            let path = e.path.join(".");
            let mut kind = e.kind.to_string();
            if kind.contains("unknown field") {
                kind.push_str(" (check the spelling; see deploy/txoutboxd.example.toml)");
            }
            if path.is_empty() {
                kind
            } else {
                format!("{path}: {kind}")
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests;
