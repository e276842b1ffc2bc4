//! Publishing to an MQTT broker (feature `mqtt`): [`MqttPublisher`] publishes each message
//! at QoS 1 over MQTT 5 and returns only once the broker answered with its PUBACK.
//!
//! | outbox | MQTT 5 PUBLISH |
//! | --- | --- |
//! | `topic` | the topic name, through the [`TopicMapping`] (same name, a prefix, or a function); with [`MqttPublisherBuilder::key_in_topic`], `/KEY` is appended for keyed rows |
//! | `key` | user property `txoutbox-key` (absent for keyless rows) |
//! | `payload` | the payload, byte for byte (`content-type` from the row's header of that name) |
//! | `headers` | user properties of the same names, plus `txoutbox-id` (the message id: deduplicate on it) and `txoutbox-topic` |
//!
//! MQTT topics use `/` as their separator, so an outbox topic `orders.paid` stays one
//! level; map it with `topic_fn` (for example `|m| m.topic.replace('.', "/")`) for
//! subscribers that filter by level. With `key_in_topic`, a subscriber can take one key
//! with `orders/paid/customer-1` or every key with `orders/paid/+`; a key must then be a
//! valid topic level (no `/`, `+`, `#`), and a message whose key is not is dead-lettered.
//!
//! Order: the runtime publishes one message of a key at a time, and an MQTT broker keeps
//! the order of one publisher's QoS 1 messages on a topic, so a key's messages arrive in
//! order. At-least-once: a message whose PUBACK was lost is published again (with the same
//! `txoutbox-id`); QoS 2 would not remove that duplicate, since the retry is a new publish.
//!
//! TLS and authentication: an `mqtts://` address (port 8883 by default);
//! [`MqttPublisherBuilder::tls_ca`] for a private CA (without it, the system's roots),
//! [`MqttPublisherBuilder::tls_client_cert`] for a broker that requires client certificates
//! (give the CA with it); a user name and password with
//! [`MqttPublisherBuilder::credentials`].
//!
//! Errors (`classify`, the one place they are sorted): a PUBACK refusing the topic name
//! or the payload format, a topic the broker cannot take (empty, wildcards, over 65,535
//! bytes) or a key that is not a topic level is permanent; not authorized, quota
//! exceeded, other refusals, a lost connection and no PUBACK within `ack_timeout`
//! (default 5s) are retried. The client reconnects by itself, with a pause of a second.
//!
//! ```no_run
//! use txoutbox_client::mqtt::MqttPublisher;
//! use txoutbox_client::Subscriber;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let mqtt = MqttPublisher::builder("mqtts://broker.example.com:8883")
//!     .credentials("relay", std::env::var("MQTT_PASSWORD")?)
//!     .topic_fn(|m| format!("outbox/{}", m.topic.replace('.', "/")))
//!     .key_in_topic(true) // orders.paid, key c-1 -> outbox/orders/paid/c-1
//!     .build()?;
//! Subscriber::builder(["http://127.0.0.1:7411"], "orders")
//!     .build(mqtt)?
//!     .run_until_signal()
//!     .await?;
//! # Ok(())
//! # }
//! ```

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rumqttc::v5::mqttbytes::v5::{Packet, PubAckReason, PublishProperties};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::{AsyncClient, Event, EventLoop, MqttOptions, Request};
use rumqttc::{Outgoing, TlsConfiguration, Transport};
use tokio::sync::oneshot;

use crate::brokers::{carried_headers, Binding, CloudEvents, TlsFiles, TopicMapping};
use crate::{ClientError, Message, PublishError, Publisher};

/// rumqttc itself.
pub use rumqttc;

/// Default wait for a PUBACK: below the subscriber's default `publish_timeout` (10s).
const DEFAULT_ACK_TIMEOUT: Duration = Duration::from_secs(5);
/// Publishes queued in rumqttc towards the connection at most.
const QUEUE: usize = 1024;
/// The pause before connecting again after the connection failed.
const RECONNECT_PAUSE: Duration = Duration::from_secs(1);

/// Configures an [`MqttPublisher`]; start with [`MqttPublisher::builder`].
#[must_use]
#[derive(Debug, Clone)]
pub struct MqttPublisherBuilder {
    address: String,
    topics: TopicMapping,
    key_in_topic: bool,
    ack_timeout: Duration,
    client_id: String,
    credentials: Option<(String, String)>,
    tls: TlsFiles,
    cloudevents: Option<CloudEvents>,
}

impl MqttPublisherBuilder {
    crate::brokers::topic_mapping_methods!();
    crate::brokers::tls_methods!();
    crate::brokers::cloudevents_method!();

    /// Appends `/KEY` to the topic of keyed messages (default off: the key is only the
    /// user property `txoutbox-key`).
    pub fn key_in_topic(mut self, on: bool) -> Self {
        self.key_in_topic = on;
        self
    }

    /// How long a publish waits for the PUBACK (default 5s) before the row is nacked and
    /// retried. Keep it below the subscriber's `publish_timeout` (default 10s).
    pub fn ack_timeout(mut self, timeout: Duration) -> Self {
        self.ack_timeout = timeout;
        self
    }

    /// The MQTT client identifier (default `txoutbox-` and a random suffix). Two
    /// connections with one identifier take turns: the broker drops the older one.
    pub fn client_id(mut self, id: impl Into<String>) -> Self {
        self.client_id = id.into();
        self
    }

    /// Authenticates with a user name and password.
    pub fn credentials(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.credentials = Some((user.into(), password.into()));
        self
    }

    /// Checks the address and reads the TLS files. The connection is made in the
    /// background (a runtime must be running): an unreachable broker means nacked
    /// publishes, not an error here.
    pub fn build(self) -> Result<MqttPublisher, ClientError> {
        let (tls, host, port) = parse_address(&self.address)?;
        let mut options = MqttOptions::new(self.client_id, host, port);
        options
            .set_clean_start(true)
            .set_keep_alive(Duration::from_secs(10))
            .set_connection_timeout(5);
        if let Some((user, password)) = self.credentials {
            options.set_credentials(user, password);
        }
        if tls {
            options.set_transport(Transport::Tls(tls_configuration(&self.tls)?));
        } else if self.tls.is_set() {
            return Err(ClientError::Config(format!(
                "TLS files are set but the MQTT address `{}` is not mqtts://; use mqtts://",
                self.address
            )));
        }
        let (client, event_loop) = AsyncClient::new(options, QUEUE);
        let waiters = Arc::new(Mutex::new(Waiters::default()));
        let connection = tokio::runtime::Handle::try_current()
            .map_err(|_| ClientError::Config("MqttPublisher::build needs a tokio runtime".into()))?
            .spawn(serve(event_loop, Arc::clone(&waiters)));
        Ok(MqttPublisher {
            client,
            waiters,
            connection,
            topics: self.topics,
            key_in_topic: self.key_in_topic,
            ack_timeout: self.ack_timeout,
            cloudevents: self.cloudevents,
        })
    }
}

/// `mqtt://host:port` or `mqtts://host:port`: whether TLS is on, the host and the port.
fn parse_address(address: &str) -> Result<(bool, String, u16), ClientError> {
    let invalid = || {
        ClientError::Config(format!(
            "invalid MQTT address `{address}`: use for example mqtt://127.0.0.1:1883 or \
             mqtts://broker.example.com:8883"
        ))
    };
    let (tls, rest) = if let Some(rest) = address.strip_prefix("mqtts://") {
        (true, rest)
    } else if let Some(rest) = address.strip_prefix("mqtt://") {
        (false, rest)
    } else {
        return Err(invalid());
    };
    let rest = rest.trim_end_matches('/');
    let (host, port) = match rest.rsplit_once(':') {
        Some((host, port)) => (host, port.parse().map_err(|_| invalid())?),
        None => (rest, if tls { 8883 } else { 1883 }),
    };
    if host.is_empty() || host.contains('/') {
        return Err(invalid());
    }
    Ok((tls, host.to_owned(), port))
}

fn tls_configuration(files: &TlsFiles) -> Result<TlsConfiguration, ClientError> {
    let pem = files.read()?;
    match (pem.ca, pem.client) {
        (None, None) => Ok(TlsConfiguration::default()),
        (Some(ca), client_auth) => Ok(TlsConfiguration::Simple {
            ca,
            alpn: None,
            client_auth,
        }),
        (None, Some(_)) => Err(ClientError::Config(
            "an MQTT client certificate needs the CA of the broker's certificate too \
             (tls_ca)"
                .to_owned(),
        )),
    }
}

type Waiter = oneshot::Sender<Result<(), PublishError>>;

/// The publishes waiting for their PUBACK.
///
/// rumqttc reports a publish's packet id only when it writes it (`Outgoing::Publish`), in
/// the order the publishes were handed to it: `unsent` holds the waiters in that order
/// (a publish hands its message over and queues its waiter under one lock), `unacked`
/// those whose packet id is known.
#[derive(Default)]
struct Waiters {
    unsent: VecDeque<Waiter>,
    unacked: HashMap<u16, Waiter>,
}

/// Publishes outbox messages to an MQTT broker at QoS 1, returning once the broker sent
/// its PUBACK; see the [module documentation](self) for the mapping and the errors.
pub struct MqttPublisher {
    client: AsyncClient,
    waiters: Arc<Mutex<Waiters>>,
    /// The task that owns the connection; stopped with the publisher.
    connection: tokio::task::JoinHandle<()>,
    topics: TopicMapping,
    key_in_topic: bool,
    ack_timeout: Duration,
    cloudevents: Option<CloudEvents>,
}

impl Drop for MqttPublisher {
    fn drop(&mut self) {
        self.connection.abort();
    }
}

impl fmt::Debug for MqttPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MqttPublisher")
            .field("topics", &self.topics)
            .field("key_in_topic", &self.key_in_topic)
            .finish_non_exhaustive()
    }
}

impl MqttPublisher {
    /// Starts configuring a publisher to the broker at `address` (`mqtt://host:1883` or
    /// `mqtts://host:8883`).
    pub fn builder(address: impl Into<String>) -> MqttPublisherBuilder {
        MqttPublisherBuilder {
            address: address.into(),
            topics: TopicMapping::Same,
            key_in_topic: false,
            ack_timeout: DEFAULT_ACK_TIMEOUT,
            client_id: format!(
                "txoutbox-{}",
                &uuid::Uuid::new_v4().simple().to_string()[..12]
            ),
            credentials: None,
            tls: TlsFiles::default(),
            cloudevents: None,
        }
    }

    /// The topic of `message`, or why it cannot have one.
    pub fn topic(&self, message: &Message) -> Result<String, PublishError> {
        let mut topic = self.topics.topic_for(message).into_owned();
        if let (true, Some(key)) = (self.key_in_topic, &message.key) {
            if key.is_empty() || key.contains(['/', '+', '#']) {
                return Err(PublishError::permanent(format!(
                    "mqtt: key `{key}` is not a topic level (it is empty or holds /, + or #); \
                     turn key_in_topic off or use such keys only"
                )));
            }
            topic = format!("{topic}/{key}");
        }
        if topic.is_empty() || topic.contains(['+', '#', '\0']) || topic.len() > 65_535 {
            return Err(PublishError::permanent(format!(
                "mqtt: `{topic}` is not a topic name to publish to (empty, a wildcard + or #, \
                 or over 65,535 bytes)"
            )));
        }
        Ok(topic)
    }

    /// The user properties and content type of `message`, and its payload (the event,
    /// with CloudEvents in structured mode).
    pub fn properties(&self, message: &Message) -> (PublishProperties, bytes::Bytes) {
        let mut properties = PublishProperties::default();
        let envelope = self
            .cloudevents
            .as_ref()
            .map(|events| events.envelope(message, Binding::Mqtt));
        if !envelope.as_ref().is_some_and(|e| e.replaces_headers) {
            for (name, value) in carried_headers(message) {
                if name.eq_ignore_ascii_case("content-type") {
                    properties.content_type = Some(value.clone().into_owned());
                }
                properties
                    .user_properties
                    .push((name.to_owned(), value.into_owned()));
            }
        }
        let Some(envelope) = envelope else {
            return (properties, message.payload.clone());
        };
        properties.user_properties.extend(envelope.headers);
        properties.content_type = Some(envelope.content_type);
        (properties, envelope.body)
    }
}

#[async_trait::async_trait]
impl Publisher for MqttPublisher {
    async fn publish(&self, message: &Message) -> Result<(), PublishError> {
        let topic = self.topic(message)?;
        let (acked, ack) = oneshot::channel();
        let (properties, payload) = self.properties(message);
        {
            let mut waiters = self.waiters.lock().expect("not poisoned");
            self.client
                .try_publish_with_properties(
                    topic.clone(),
                    QoS::AtLeastOnce,
                    false,
                    payload,
                    properties,
                )
                .map_err(|error| PublishError::new(format!("mqtt topic `{topic}`: {error}")))?;
            waiters.unsent.push_back(acked);
        }
        match tokio::time::timeout(self.ack_timeout, ack).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(PublishError::new("mqtt: the connection task has stopped")),
            Err(_) => Err(PublishError::new(format!(
                "mqtt topic `{topic}`: no PUBACK within {:?} (broker down or reconnecting)",
                self.ack_timeout
            ))),
        }
    }
}

/// The connection task: polls rumqttc (which connects, writes the publishes and reads
/// the PUBACKs) and answers the waiting publishes.
///
/// With a clean start, what was not acknowledged when a connection failed is not sent
/// again on the next one (the broker's new session does not have it): rumqttc keeps it in
/// `pending` (the unacknowledged publishes and those it had not written yet, taken from
/// its queue), which this task empties, failing their waiters (the runtime retries them).
/// Publishes handed over after that stay queued for the next connection, their waiters in
/// order behind. A connection attempt that fails takes nothing from the queue: waiters
/// that time out meanwhile stay in line, so each later packet id still finds its own.
async fn serve(mut event_loop: EventLoop, waiters: Arc<Mutex<Waiters>>) {
    loop {
        let event = event_loop.poll().await;
        let lost = event.is_err();
        answer(
            event,
            &mut event_loop,
            &mut waiters.lock().expect("not poisoned"),
        );
        if lost {
            tokio::time::sleep(RECONNECT_PAUSE).await;
        }
    }
}

fn answer(
    event: Result<Event, rumqttc::v5::ConnectionError>,
    event_loop: &mut EventLoop,
    waiters: &mut Waiters,
) {
    match event {
        Ok(Event::Outgoing(Outgoing::Publish(pkid))) => {
            if let Some(waiter) = waiters.unsent.pop_front() {
                waiters.unacked.insert(pkid, waiter);
            }
        }
        Ok(Event::Incoming(Packet::PubAck(ack))) => {
            if let Some(waiter) = waiters.unacked.remove(&ack.pkid) {
                let _ = waiter.send(classify(ack.reason));
            }
        }
        Ok(_) => {}
        Err(error) => {
            tracing::warn!(%error, "mqtt: connection failed; connecting again");
            let failed = format!("mqtt: connection lost before the PUBACK: {error}");
            // The publishes of the lost session are dropped: those written (their
            // packet ids reported, or reported by events still buffered) and those
            // not written yet (no packet id, 0): the oldest waiters, in order.
            let buffered = event_loop
                .state
                .events
                .drain(..)
                .filter(|event| matches!(event, Event::Outgoing(Outgoing::Publish(_))));
            let unwritten = event_loop
                .pending
                .drain(..)
                .filter(|request| matches!(request, Request::Publish(p) if p.pkid == 0));
            let dropped = (buffered.count() + unwritten.count()).min(waiters.unsent.len());
            let unsent = waiters.unsent.drain(..dropped);
            for waiter in unsent.chain(waiters.unacked.drain().map(|(_, waiter)| waiter)) {
                let _ = waiter.send(Err(PublishError::new(failed.clone())));
            }
        }
    }
}

/// The one place a PUBACK's reason is sorted into published, retried and permanent.
fn classify(reason: PubAckReason) -> Result<(), PublishError> {
    match reason {
        PubAckReason::Success | PubAckReason::NoMatchingSubscribers => Ok(()),
        PubAckReason::TopicNameInvalid | PubAckReason::PayloadFormatInvalid => Err(
            PublishError::permanent(format!("mqtt: the broker refused the message: {reason:?}")),
        ),
        other => Err(PublishError::new(format!(
            "mqtt: the broker did not take the message: {other:?}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_choose_tls_and_default_ports() {
        let parsed = |a: &str| parse_address(a).unwrap();
        assert_eq!(parsed("mqtt://h:1"), (false, "h".to_owned(), 1));
        assert_eq!(parsed("mqtt://h"), (false, "h".to_owned(), 1883));
        assert_eq!(parsed("mqtts://h/"), (true, "h".to_owned(), 8883));
        for bad in ["h:1883", "tcp://h:1", "mqtt://:1", "mqtt://h:x"] {
            assert!(parse_address(bad).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn keys_in_topics_are_checked_levels() {
        let publisher = MqttPublisher::builder("mqtt://127.0.0.1:1")
            .topic_fn(|m| m.topic.replace('.', "/"))
            .key_in_topic(true)
            .build()
            .unwrap();
        let keyed = Message::new(1, "orders.paid", "{}").with_key("c-1");
        assert_eq!(publisher.topic(&keyed).unwrap(), "orders/paid/c-1");
        let keyless = Message::new(2, "orders.paid", "{}");
        assert_eq!(publisher.topic(&keyless).unwrap(), "orders/paid");
        let wild = Message::new(3, "orders.paid", "{}").with_key("a/b");
        assert!(publisher.topic(&wild).unwrap_err().is_permanent());
    }

    #[test]
    fn refusals_of_the_message_are_permanent_the_rest_retried() {
        assert!(classify(PubAckReason::NoMatchingSubscribers).is_ok());
        assert!(classify(PubAckReason::TopicNameInvalid)
            .unwrap_err()
            .is_permanent());
        assert!(!classify(PubAckReason::NotAuthorized)
            .unwrap_err()
            .is_permanent());
        assert!(!classify(PubAckReason::QuotaExceeded)
            .unwrap_err()
            .is_permanent());
    }
}
