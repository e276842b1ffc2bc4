//! Publishing to NATS JetStream (feature `nats`): [`NatsPublisher`] returns only once the
//! stream that captures the subject acknowledged the message (its PubAck).
//!
//! | outbox | NATS |
//! | --- | --- |
//! | `topic` | the subject, through the [`TopicMapping`] (same name, a prefix, or a function) |
//! | `key` | header `txoutbox-key` (NATS messages have no key: order comes from the runtime publishing one message of a key at a time) |
//! | `payload` | the payload, byte for byte |
//! | `headers` | the headers, plus `txoutbox-id`, `txoutbox-topic`, and `Nats-Msg-Id` = the message id, on which JetStream deduplicates: a retry whose PubAck was lost is stored once |
//!
//! Nothing is stored unless a stream captures the subject: create it first (`nats stream
//! add ORDERS --subjects 'orders.>'`, or `jetstream.create_stream`), with a duplicate
//! window (`--dupe-window`, default two minutes) longer than a retry takes.
//!
//! Errors (`classify`, the one place they are sorted):
//!
//! | failure | outcome |
//! | --- | --- |
//! | no stream captures the subject: the publish had no responders, and the JetStream API confirms that no stream's subjects match | permanent: dead-lettered |
//! | no responders while a stream captures the subject, or while the JetStream API does not answer either (JetStream starting, recovering its streams, disabled, a cluster without a leader) | retried |
//! | the stream rejected the message (too large for `max_msg_size`, other API errors), a payload over the server's `max_payload`, an invalid subject | permanent |
//! | no PubAck within `ack_timeout` (default 5s), a lost connection, too many unacknowledged publishes | retried |
//! | the stream is full (`discard new`) or the server lacks resources, no leader, JetStream disabled | retried |
//!
//! TLS and authentication, as NATS configures them: `tls://` addresses (or any TLS file)
//! require TLS; [`NatsPublisherBuilder::tls_ca`] for a private CA,
//! [`NatsPublisherBuilder::tls_client_cert`] for a server that verifies client
//! certificates (`verify: true`); a user's credentials file (`.creds`, a JWT and its NKey
//! seed, from `nsc`), an NKey seed (`SU...`), a user and password, or a token.
//!
//! The client reconnects on its own (async-nats): publishes during an outage time out,
//! are nacked and retried once the server is back.
//!
//! ```no_run
//! use txoutbox_client::nats::NatsPublisher;
//! use txoutbox_client::Subscriber;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let nats = NatsPublisher::builder("nats://127.0.0.1:4222")
//!     .topic_prefix("outbox.") // orders.paid -> subject outbox.orders.paid
//!     .build()?;
//! Subscriber::builder(["http://127.0.0.1:7411"], "orders")
//!     .build(nats)?
//!     .run_until_signal()
//!     .await?;
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use async_nats::jetstream::context::{
    GetStreamByNameErrorKind, PublishError as JsPublishError, PublishErrorKind,
};
use async_nats::jetstream::{self, ErrorCode};
use async_nats::{ConnectOptions, HeaderMap, ServerAddr};
use tokio::sync::OnceCell;

use crate::brokers::{carried_headers, Binding, CloudEvents, TlsFiles, TopicMapping};
use crate::{ClientError, Message, PublishError, Publisher};

/// async-nats itself, for [`NatsPublisher::from_client`] (TLS, credentials, ...).
pub use async_nats;

/// Header on which JetStream deduplicates.
pub const MSG_ID_HEADER: &str = "Nats-Msg-Id";

/// Default wait for a PubAck: below the subscriber's default `publish_timeout` (10s), so
/// an outage comes back as this publisher's error rather than the runtime's timeout.
const DEFAULT_ACK_TIMEOUT: Duration = Duration::from_secs(5);

/// Configures a [`NatsPublisher`]; start with [`NatsPublisher::builder`].
#[must_use]
pub struct NatsPublisherBuilder {
    servers: String,
    topics: TopicMapping,
    ack_timeout: Duration,
    msg_id_prefix: String,
    name: String,
    tls: TlsFiles,
    auth: Auth,
    cloudevents: Option<CloudEvents>,
}

/// How the connection authenticates.
#[derive(Default)]
enum Auth {
    #[default]
    None,
    CredentialsFile(PathBuf),
    NKey(String),
    UserPassword(String, String),
    Token(String),
}

impl NatsPublisherBuilder {
    crate::brokers::topic_mapping_methods!();
    crate::brokers::tls_methods!();
    crate::brokers::cloudevents_method!();

    /// Authenticates with a user's credentials file (the user's JWT and NKey seed, as
    /// `nsc generate creds` writes it), read by `build()`.
    pub fn credentials_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.auth = Auth::CredentialsFile(path.into());
        self
    }

    /// Authenticates with an NKey: the user's seed (`SU...`); the server lists its public
    /// key (`U...`).
    pub fn nkey(mut self, seed: impl Into<String>) -> Self {
        self.auth = Auth::NKey(seed.into());
        self
    }

    /// Authenticates with a user and password.
    pub fn user_and_password(
        mut self,
        user: impl Into<String>,
        password: impl Into<String>,
    ) -> Self {
        self.auth = Auth::UserPassword(user.into(), password.into());
        self
    }

    /// Authenticates with a token.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.auth = Auth::Token(token.into());
        self
    }

    /// How long a publish waits for the stream's PubAck (default 5s) before the row is
    /// nacked and retried. Keep it below the subscriber's `publish_timeout` (default 10s).
    pub fn ack_timeout(mut self, timeout: Duration) -> Self {
        self.ack_timeout = timeout;
        self
    }

    /// Puts `prefix` before the message id in `Nats-Msg-Id` (default none), for several
    /// outboxes publishing into one stream: their ids would collide in its duplicate
    /// window.
    pub fn msg_id_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.msg_id_prefix = prefix.into();
        self
    }

    /// The connection's name, in the server's monitoring (default `txoutbox`).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Checks the server addresses. The connection is made by the first publish, in the
    /// background: an unreachable server means nacked publishes, not an error here.
    pub fn build(self) -> Result<NatsPublisher, ClientError> {
        let mut addresses = Vec::new();
        for server in self.servers.split(',').map(str::trim) {
            let address: ServerAddr = server.parse().map_err(|error| {
                ClientError::Config(format!(
                    "invalid NATS server `{server}`: {error}; use for example nats://127.0.0.1:4222"
                ))
            })?;
            addresses.push(address);
        }
        let options = ConnectOptions::new()
            .name(self.name)
            .retry_on_initial_connect()
            .connection_timeout(Duration::from_secs(5))
            // A connection that went silent (a dead link) is noticed within seconds.
            .ping_interval(Duration::from_secs(5));
        let options = authenticate(options, self.auth)?;
        let options = with_tls(options, &self.tls, &self.servers)?;
        Ok(NatsPublisher {
            jetstream: OnceCell::new(),
            connect: Some((addresses, options)),
            topics: self.topics,
            ack_timeout: self.ack_timeout,
            msg_id_prefix: self.msg_id_prefix,
            cloudevents: self.cloudevents,
        })
    }
}

fn authenticate(options: ConnectOptions, auth: Auth) -> Result<ConnectOptions, ClientError> {
    Ok(match auth {
        Auth::None => options,
        Auth::CredentialsFile(path) => {
            let creds = std::fs::read_to_string(&path).map_err(|error| {
                ClientError::Config(format!(
                    "cannot read the NATS credentials file {}: {error}",
                    path.display()
                ))
            })?;
            options.credentials(&creds).map_err(|error| {
                ClientError::Config(format!(
                    "the NATS credentials file {} is not a user's JWT and seed: {error}",
                    path.display()
                ))
            })?
        }
        Auth::NKey(seed) => {
            nkeys::KeyPair::from_seed(&seed).map_err(|error| {
                ClientError::Config(format!(
                    "invalid NATS NKey seed: {error}; give the user's seed (SU...), not its public key"
                ))
            })?;
            options.nkey(seed)
        }
        Auth::UserPassword(user, password) => options.user_and_password(user, password),
        Auth::Token(token) => options.token(token),
    })
}

/// TLS is required once any file is set or an address is `tls://`; the files are checked
/// here, and read again by the client each time it connects.
fn with_tls(
    mut options: ConnectOptions,
    tls: &TlsFiles,
    servers: &str,
) -> Result<ConnectOptions, ClientError> {
    tls.read()?;
    if let Some(ca) = &tls.ca {
        options = options.add_root_certificates(ca.clone());
    }
    if let Some((cert, key)) = &tls.client {
        options = options.add_client_certificate(cert.clone(), key.clone());
    }
    let tls_scheme = servers.split(',').any(|s| s.trim().starts_with("tls://"));
    Ok(options.require_tls(tls.is_set() || tls_scheme))
}

/// Publishes outbox messages to NATS JetStream, returning once the stream acknowledged
/// them; see the [module documentation](self) for the mapping and the errors.
pub struct NatsPublisher {
    /// Made by the first publish (connecting needs a runtime; `build` may run outside one).
    jetstream: OnceCell<jetstream::Context>,
    /// What the first publish connects with; `None` for a client given to `from_client`.
    connect: Option<(Vec<ServerAddr>, ConnectOptions)>,
    topics: TopicMapping,
    ack_timeout: Duration,
    msg_id_prefix: String,
    cloudevents: Option<CloudEvents>,
}

impl fmt::Debug for NatsPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsPublisher")
            .field("topics", &self.topics)
            .field("ack_timeout", &self.ack_timeout)
            .finish_non_exhaustive()
    }
}

impl NatsPublisher {
    /// Starts configuring a publisher to the NATS servers at `servers`
    /// (`nats://host:port`, several separated by commas).
    pub fn builder(servers: impl Into<String>) -> NatsPublisherBuilder {
        NatsPublisherBuilder {
            servers: servers.into(),
            topics: TopicMapping::Same,
            ack_timeout: DEFAULT_ACK_TIMEOUT,
            msg_id_prefix: String::new(),
            name: "txoutbox".to_owned(),
            tls: TlsFiles::default(),
            auth: Auth::None,
            cloudevents: None,
        }
    }

    /// Wraps a client you connected yourself (TLS, credentials, ...).
    pub fn from_client(client: async_nats::Client, topics: TopicMapping) -> Self {
        let mut context = jetstream::new(client);
        context.set_timeout(DEFAULT_ACK_TIMEOUT);
        Self {
            jetstream: OnceCell::new_with(Some(context)),
            connect: None,
            topics,
            ack_timeout: DEFAULT_ACK_TIMEOUT,
            msg_id_prefix: String::new(),
            cloudevents: None,
        }
    }

    /// The headers of the NATS message for `message`: [`carried_headers`] and
    /// [`MSG_ID_HEADER`].
    pub fn headers(&self, message: &Message) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in carried_headers(message) {
            headers.insert(name, value.as_ref());
        }
        let msg_id = format!("{}{}", self.msg_id_prefix, message.id);
        headers.insert(MSG_ID_HEADER, msg_id.as_str());
        headers
    }

    async fn jetstream(&self) -> Result<&jetstream::Context, PublishError> {
        self.jetstream
            .get_or_try_init(|| async {
                let Some((addresses, options)) = &self.connect else {
                    unreachable!("a publisher from a client starts connected");
                };
                // Returns at once: the connection is made (and made again) in the
                // background.
                let client = options
                    .clone()
                    .connect(addresses.as_slice())
                    .await
                    .map_err(|error| PublishError::new(format!("nats: {error}")))?;
                let mut context = jetstream::new(client);
                context.set_timeout(self.ack_timeout);
                Ok(context)
            })
            .await
    }
}

#[async_trait::async_trait]
impl Publisher for NatsPublisher {
    async fn publish(&self, message: &Message) -> Result<(), PublishError> {
        let subject = self.topics.topic_for(message);
        if let Err(reason) = check_subject(&subject) {
            return Err(PublishError::permanent(format!(
                "nats subject `{subject}` {reason}"
            )));
        }
        let jetstream = self.jetstream().await?;
        let mut headers = self.headers(message);
        let mut payload = message.payload.clone();
        if let Some(events) = &self.cloudevents {
            let envelope = events.envelope(message, Binding::Nats);
            if envelope.replaces_headers {
                headers = HeaderMap::new();
                let msg_id = format!("{}{}", self.msg_id_prefix, message.id);
                headers.insert(MSG_ID_HEADER, msg_id.as_str());
            }
            for (name, value) in &envelope.headers {
                headers.insert(name.as_str(), value.as_str());
            }
            headers.insert("content-type", envelope.content_type.as_str());
            payload = envelope.body;
        }
        let sent = jetstream
            .publish_with_headers(subject.to_string(), headers, payload)
            .await;
        let ack = match sent {
            Ok(ack) => ack.await,
            Err(error) => Err(error),
        };
        match ack {
            Ok(ack) => {
                tracing::trace!(id = message.id, %subject, stream = %ack.stream, sequence = ack.sequence, duplicate = ack.duplicate, "stored by jetstream");
                Ok(())
            }
            Err(error) => {
                let lookup = match error.kind() {
                    PublishErrorKind::StreamNotFound => lookup_stream(jetstream, &subject).await,
                    _ => StreamLookup::NotAsked,
                };
                Err(classify(&subject, error, lookup))
            }
        }
    }
}

/// What the JetStream API says of a subject whose publish had no responders. "No
/// responders" only means that nothing listened on the subject at that moment: no
/// stream captures it, or the stream that does is not up (a server starting and
/// recovering its streams, JetStream disabled, a cluster electing a leader). Only the
/// first may dead-letter.
#[derive(Debug)]
enum StreamLookup {
    /// The publish failed otherwise; nothing was asked.
    NotAsked,
    /// This stream captures the subject: it exists, it did not answer.
    Captured(String),
    /// The API answered that no stream captures the subject.
    Missing,
    /// The API did not answer either: JetStream is not up.
    Unanswered(String),
}

/// Asks the JetStream API which stream captures `subject`, after a publish to it had no
/// responders.
async fn lookup_stream(jetstream: &jetstream::Context, subject: &str) -> StreamLookup {
    match jetstream.stream_by_subject(subject).await {
        Ok(stream) => StreamLookup::Captured(stream),
        Err(error) if error.kind() == GetStreamByNameErrorKind::NotFound => StreamLookup::Missing,
        Err(error) => StreamLookup::Unanswered(error.to_string()),
    }
}

/// A subject a message can be published to: not empty, no whitespace, no empty token,
/// no wildcard.
fn check_subject(subject: &str) -> Result<(), &'static str> {
    if subject.is_empty() {
        return Err("is empty");
    }
    if subject.chars().any(char::is_whitespace) {
        return Err("contains whitespace");
    }
    if subject.split('.').any(|token| token.is_empty()) {
        return Err("has an empty token");
    }
    if subject.split('.').any(|token| token == "*" || token == ">") {
        return Err("has a wildcard");
    }
    Ok(())
}

/// The one place NATS errors are sorted into retried and permanent (the table of the
/// module documentation). `lookup` is what the JetStream API said after no responders.
fn classify(subject: &str, error: JsPublishError, lookup: StreamLookup) -> PublishError {
    let mut text = format!("nats subject `{subject}`: {error}");
    let permanent = match error.kind() {
        PublishErrorKind::StreamNotFound => {
            match &lookup {
                StreamLookup::Captured(stream) => text.push_str(&format!(
                    " (no responders), yet stream `{stream}` captures it: not up, retrying"
                )),
                StreamLookup::Unanswered(why) => text.push_str(&format!(
                    " (no responders), and the JetStream API did not answer ({why}): JetStream not up, retrying"
                )),
                StreamLookup::Missing | StreamLookup::NotAsked => {}
            }
            matches!(lookup, StreamLookup::Missing)
        }
        PublishErrorKind::MaxPayloadExceeded => true,
        // The stream answered with an API error: it rejected this message, unless the
        // error is about the server's state rather than the message.
        PublishErrorKind::Other => std::error::Error::source(&error)
            .and_then(|source| source.downcast_ref::<jetstream::Error>())
            .is_some_and(|api| !is_transient(api.error_code())),
        PublishErrorKind::TimedOut
        | PublishErrorKind::BrokenPipe
        | PublishErrorKind::MaxAckPending
        | PublishErrorKind::WrongLastMessageId
        | PublishErrorKind::WrongLastSequence => false,
    };
    if permanent {
        PublishError::permanent(text)
    } else {
        PublishError::new(text)
    }
}

/// JetStream API errors that describe the server's state, not the message: worth a retry.
fn is_transient(code: ErrorCode) -> bool {
    [
        ErrorCode::CLUSTER_NOT_AVAILABLE,
        ErrorCode::CLUSTER_NOT_LEADER,
        ErrorCode::CLUSTER_NOT_ACTIVE,
        ErrorCode::CLUSTER_INCOMPLETE,
        ErrorCode::CLUSTER_NO_PEERS,
        ErrorCode::CLUSTER_NOT_ASSIGNED,
        ErrorCode::INSUFFICIENT_RESOURCES,
        ErrorCode::STORAGE_RESOURCES_EXCEEDED,
        ErrorCode::MEMORY_RESOURCES_EXCEEDED,
        ErrorCode::ACCOUNT_RESOURCES_EXCEEDED,
        // Also a full stream with `discard new`: room comes back as consumers catch up.
        ErrorCode::STREAM_STORE_FAILED,
        ErrorCode::JETSTREAM_NOT_ENABLED,
        ErrorCode::JETSTREAM_NOT_ENABLED_FOR_ACCOUNT,
    ]
    .contains(&code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_are_checked_before_publishing() {
        assert!(check_subject("orders.paid").is_ok());
        for bad in [
            "",
            "orders paid",
            "orders..paid",
            "orders.*",
            "orders.>",
            ".x",
        ] {
            assert!(check_subject(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn only_a_stream_the_api_confirms_missing_is_permanent_timeouts_retried() {
        let no_responders = || JsPublishError::new(PublishErrorKind::StreamNotFound);
        let missing = classify("s", no_responders(), StreamLookup::Missing);
        assert!(missing.is_permanent());
        assert_eq!(
            missing.text(),
            "nats subject `s`: no stream found for given subject"
        );
        let down = classify("s", no_responders(), StreamLookup::Captured("S".into()));
        assert!(!down.is_permanent());
        assert!(down.text().contains("stream `S` captures it"), "{down}");
        let starting = classify("s", no_responders(), StreamLookup::Unanswered("x".into()));
        assert!(!starting.is_permanent());
        assert!(starting.text().contains("JetStream not up"), "{starting}");
        for kind in [
            PublishErrorKind::TimedOut,
            PublishErrorKind::BrokenPipe,
            PublishErrorKind::MaxAckPending,
            PublishErrorKind::Other,
        ] {
            let error = classify("s", JsPublishError::new(kind), StreamLookup::NotAsked);
            assert!(!error.is_permanent(), "{kind:?}");
        }
    }

    #[test]
    fn headers_carry_the_message_id_for_deduplication() {
        let publisher = NatsPublisher::builder("nats://127.0.0.1:4222")
            .msg_id_prefix("orders-")
            .build()
            .unwrap();
        let message = Message::new(9, "t", "p").with_key("k");
        let headers = publisher.headers(&message);
        assert_eq!(headers.get(MSG_ID_HEADER).unwrap().as_str(), "orders-9");
        assert_eq!(headers.get("txoutbox-id").unwrap().as_str(), "9");
        assert_eq!(headers.get("txoutbox-key").unwrap().as_str(), "k");
    }

    #[test]
    fn a_bad_address_is_a_configuration_error() {
        let error = NatsPublisher::builder("nats://[::1").build().unwrap_err();
        assert!(error.to_string().contains("invalid NATS server"), "{error}");
    }
}
