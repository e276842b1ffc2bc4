//! `[server.tls]` and `[server.auth]`: who may reach the relay and what each caller may do.
//! The runtime side (handshakes, credentials, scopes, limits) is `crate::security`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::check_duration;

/// TLS on the gRPC port, with rustls. Certificates are PEM files, read again when they
/// change (checked every `reload_interval`) or on SIGHUP, so a rotation needs no restart.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// The server's certificate chain (PEM), leaf first.
    pub cert: PathBuf,
    /// The certificate's private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// Mutual TLS: CA certificates (PEM) that sign the clients' certificates. Clients
    /// without a certificate are refused at the handshake unless `client_cert_optional`.
    #[serde(default)]
    pub client_ca: Option<PathBuf>,
    /// With `client_ca`: also accept clients without a certificate (they then need a
    /// token); a certificate that is presented must still be valid.
    #[serde(default)]
    pub client_cert_optional: bool,
    /// With `client_ca`: certificate revocation lists (PEM) of the client CAs; a client
    /// certificate they revoke is refused at the handshake, and so is one whose issuer
    /// has no list here (its status is unknown). Read again with the other files.
    #[serde(default)]
    pub client_crls: Vec<PathBuf>,
    /// How often the files are checked for a change.
    #[serde(default = "default_reload_interval", with = "humantime_serde")]
    pub reload_interval: Duration,
}

fn default_reload_interval() -> Duration {
    Duration::from_secs(10)
}

/// Callers and their rights. With no identity configured, every caller may do everything
/// (the embedded default, a relay on `127.0.0.1`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// Health checks and reflection answer callers without credentials (probes).
    pub public_health: bool,
    pub identities: BTreeMap<String, IdentityConfig>,
    /// How often the configuration file and the token files are checked for a change
    /// (SIGHUP reads them at once).
    #[serde(with = "humantime_serde")]
    pub reload_interval: Duration,
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            public_health: true,
            identities: BTreeMap::new(),
            reload_interval: Duration::from_secs(10),
        }
    }
}

/// One caller: how it proves who it is, and what it may do on which outbox.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdentityConfig {
    /// SHA-256 of its bearer token, 64 hex digits (`printf %s "$TOKEN" | sha256sum`).
    #[serde(default)]
    pub token_sha256: Option<String>,
    /// A file holding its token (a Kubernetes Secret, a systemd credential).
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// An environment variable holding its token.
    #[serde(default)]
    pub token_env: Option<String>,
    /// Under mutual TLS: a client certificate whose subject common name, DNS name or URI
    /// is one of these is this identity.
    #[serde(default)]
    pub certificate_names: Vec<String>,
    /// Outbox name (or `*` for every outbox) -> scopes on it.
    pub grants: BTreeMap<String, Vec<Scope>>,
    #[serde(default)]
    pub limits: IdentityLimits,
}

/// What a caller may do on an outbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// `Subscribe` and the unary claim and answer calls.
    Subscribe,
    /// `Admin.InsertMessage`.
    Insert,
    /// The `Admin` calls that change nothing: `Stats`, `Schema`, `ListDeadLetters` (which
    /// reads payloads, and is audited), `CountDeadLetters`, `ListBlockedKeys`,
    /// `ListSubscribers`.
    Read,
    /// Every other `Admin` call: `Purge`, re-drive and discard of dead letters, `Pause`,
    /// `Resume`, and any added later (see `security::layer`). Includes `read`.
    Admin,
}

impl Scope {
    /// Whether holding `self` allows a call that needs `needed`: `admin` includes `read`,
    /// so an operator's existing grants keep every call they allowed.
    pub fn allows(self, needed: Scope) -> bool {
        self == needed || (self == Scope::Admin && needed == Scope::Read)
    }

    /// What a refusal adds after the scope's name, so the operator sees both ways in.
    pub fn included_by(self) -> &'static str {
        match self {
            Scope::Read => " (or `admin`, which includes it)",
            _ => "",
        }
    }
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Scope::Subscribe => "subscribe",
            Scope::Insert => "insert",
            Scope::Read => "read",
            Scope::Admin => "admin",
        })
    }
}

/// Bounds on one identity, across all its connections to this server (each replica
/// counts its own). `max_streams` and `max_topic_filters` have defaults no honest
/// deployment reaches, so one identity (a leaked token, a client in a reconnect loop)
/// cannot take the whole server; the others are unbounded unless set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdentityLimits {
    /// `Subscribe` streams open at once.
    #[serde(default = "default_identity_streams")]
    pub max_streams: Option<u32>,
    /// Messages its open streams may hold at once: the sum of their windows
    /// (`max_in_flight`), reserved when each stream opens.
    #[serde(default)]
    pub max_messages_in_flight: Option<u32>,
    /// Bytes (payload, headers, key and topic of each row) leased to its streams and
    /// not yet settled, across all of them. At the bound its streams stop claiming until
    /// answers or lease expiries free bytes; a unary `Claim` gets at most what is left
    /// (RESOURCE_EXHAUSTED when not even one row fits) and is not counted once it
    /// returns. At least `server.max_message_bytes`, so any row that fits a response
    /// fits the budget.
    #[serde(default)]
    pub max_bytes_in_flight: Option<usize>,
    /// Unary calls per second (a burst of as many is allowed).
    #[serde(default)]
    pub max_calls_per_second: Option<u32>,
    /// Distinct topic filters among its open streams, per outbox: its share of the
    /// outbox's `max_topic_filters`, so one identity cannot take every slot.
    #[serde(default = "default_identity_topic_filters")]
    pub max_topic_filters: Option<u32>,
}

/// Default `limits.max_streams`: a fleet of a hundred relays with eight streams each
/// stays under it.
pub const DEFAULT_IDENTITY_STREAMS: u32 = 1_000;
/// Default `limits.max_topic_filters`: a quarter of an outbox's default 64.
pub const DEFAULT_IDENTITY_TOPIC_FILTERS: u32 = 16;

fn default_identity_streams() -> Option<u32> {
    Some(DEFAULT_IDENTITY_STREAMS)
}

fn default_identity_topic_filters() -> Option<u32> {
    Some(DEFAULT_IDENTITY_TOPIC_FILTERS)
}

impl Default for IdentityLimits {
    fn default() -> Self {
        Self {
            max_streams: default_identity_streams(),
            max_messages_in_flight: None,
            max_bytes_in_flight: None,
            max_calls_per_second: None,
            max_topic_filters: default_identity_topic_filters(),
        }
    }
}

/// The outbox name in `grants` that stands for every outbox.
pub const EVERY_OUTBOX: &str = "*";

pub(super) fn validate(
    listen: SocketAddr,
    allow_insecure: bool,
    max_message_bytes: usize,
    tls: Option<&TlsConfig>,
    auth: &AuthConfig,
    outboxes: &[&str],
    problems: &mut Vec<String>,
) {
    if let Some(tls) = tls {
        for (key, path) in [("cert", &tls.cert), ("key", &tls.key)]
            .into_iter()
            .chain(tls.client_ca.as_ref().map(|p| ("client_ca", p)))
        {
            if let Err(error) = std::fs::metadata(path) {
                problems.push(format!(
                    "server.tls.{key} = {}: cannot read it: {error}",
                    path.display()
                ));
            }
        }
        for path in &tls.client_crls {
            if let Err(error) = std::fs::metadata(path) {
                problems.push(format!(
                    "server.tls.client_crls: {}: cannot read it: {error}",
                    path.display()
                ));
            }
        }
        if !tls.client_crls.is_empty() && tls.client_ca.is_none() {
            problems.push(
                "server.tls.client_crls: needs server.tls.client_ca (the CA whose revocations they list)"
                    .to_owned(),
            );
        }
        if tls.client_cert_optional && tls.client_ca.is_none() {
            problems.push(
                "server.tls.client_cert_optional: needs server.tls.client_ca (the CA that signs client certificates)"
                    .to_owned(),
            );
        }
        check_duration(
            problems,
            "server.tls.reload_interval",
            tls.reload_interval,
            Duration::from_millis(100),
            "10s",
        );
    }
    for (name, identity) in &auth.identities {
        identity.validate(name, tls, outboxes, max_message_bytes, problems);
    }
    shared_certificate_names(auth, problems);
    check_duration(
        problems,
        "server.auth.reload_interval",
        auth.reload_interval,
        Duration::from_millis(100),
        "10s",
    );
    let reachable_from_elsewhere = !listen.ip().is_loopback();
    if reachable_from_elsewhere && !allow_insecure && (tls.is_none() || auth.identities.is_empty())
    {
        let missing = match (tls.is_none(), auth.identities.is_empty()) {
            (true, true) => "neither TLS nor credentials",
            (true, false) => "no TLS (tokens would cross the network in clear)",
            _ => "no credentials (anyone who reaches the port may purge every outbox)",
        };
        problems.push(format!(
            "server.listen = {listen} is reachable from other machines with {missing}: \
             configure [server.tls] and [server.auth.identities.NAME] (see docs/security.md), \
             listen on 127.0.0.1, or set server.allow_insecure = true to serve it anyway"
        ));
    }
}

/// A certificate name listed by two identities: a certificate carrying it would name
/// either. (One token on two identities is found once the tokens are read, at start.)
fn shared_certificate_names(auth: &AuthConfig, problems: &mut Vec<String>) {
    let identities: Vec<(&String, &IdentityConfig)> = auth.identities.iter().collect();
    for (i, (first, first_config)) in identities.iter().enumerate() {
        for (second, second_config) in &identities[i + 1..] {
            for name in &first_config.certificate_names {
                if second_config.certificate_names.contains(name) {
                    problems.push(format!(
                        "server.auth.identities.{first}.certificate_names and \
                         server.auth.identities.{second}.certificate_names both list {name:?}: \
                         a certificate carrying it would name either; list each name under \
                         one identity"
                    ));
                }
            }
        }
    }
}

impl IdentityConfig {
    fn validate(
        &self,
        name: &str,
        tls: Option<&TlsConfig>,
        outboxes: &[&str],
        max_message_bytes: usize,
        problems: &mut Vec<String>,
    ) {
        let key = format!("server.auth.identities.{name}");
        let tokens = [
            self.token_sha256.is_some(),
            self.token_file.is_some(),
            self.token_env.is_some(),
        ]
        .into_iter()
        .filter(|set| *set)
        .count();
        if tokens > 1 {
            problems.push(format!(
                "{key}: set one of token_sha256, token_file, token_env, not {tokens}"
            ));
        }
        if tokens == 0 && self.certificate_names.is_empty() {
            problems.push(format!(
                "{key}: no credential: set token_sha256, token_file or token_env, or certificate_names (with server.tls.client_ca)"
            ));
        }
        if let Some(hash) = &self.token_sha256 {
            if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
                problems.push(format!(
                    "{key}.token_sha256: must be 64 hex digits, the SHA-256 of the token (printf %s \"$TOKEN\" | sha256sum)"
                ));
            }
        }
        if let Some(path) = &self.token_file {
            match std::fs::read_to_string(path) {
                Ok(token) if token.trim().is_empty() => {
                    problems.push(format!("{key}.token_file = {}: is empty", path.display()))
                }
                Ok(_) => {}
                Err(error) => problems.push(format!(
                    "{key}.token_file = {}: cannot read it: {error}",
                    path.display()
                )),
            }
        }
        if let Some(variable) = &self.token_env {
            if std::env::var(variable).map_or(true, |v| v.trim().is_empty()) {
                problems.push(format!(
                    "{key}.token_env = {variable:?}: the variable is not set (or empty)"
                ));
            }
        }
        if !self.certificate_names.is_empty()
            && tls.and_then(|tls| tls.client_ca.as_ref()).is_none()
        {
            problems.push(format!(
                "{key}.certificate_names: needs mutual TLS: set server.tls.client_ca"
            ));
        }
        if self.grants.is_empty() {
            problems.push(format!(
                "{key}.grants: empty; for example grants = {{ orders = [\"subscribe\"] }}"
            ));
        }
        for (outbox, scopes) in &self.grants {
            if outbox != EVERY_OUTBOX && !outboxes.contains(&outbox.as_str()) {
                problems.push(format!(
                    "{key}.grants.{outbox}: no such outbox (configured: {}; or \"*\" for every outbox)",
                    outboxes.join(", ")
                ));
            }
            if scopes.is_empty() {
                problems.push(format!(
                    "{key}.grants.{outbox}: no scope; use subscribe, insert, read and/or admin"
                ));
            }
        }
        let limits = &self.limits;
        for (limit, value) in [
            ("max_streams", limits.max_streams),
            ("max_messages_in_flight", limits.max_messages_in_flight),
            ("max_calls_per_second", limits.max_calls_per_second),
            ("max_topic_filters", limits.max_topic_filters),
        ] {
            if value == Some(0) {
                problems.push(format!("{key}.limits.{limit}: must be at least 1"));
            }
        }
        if let Some(bytes) = limits.max_bytes_in_flight {
            if bytes < max_message_bytes {
                problems.push(format!(
                    "{key}.limits.max_bytes_in_flight = {bytes}: must be at least \
                     server.max_message_bytes ({max_message_bytes}), so that a row as large as \
                     one response fits the budget; raise it, or lower server.max_message_bytes"
                ));
            }
        }
    }
}
