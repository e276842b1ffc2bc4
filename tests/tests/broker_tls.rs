//! Every publisher over TLS with its broker's own authentication, against servers of the
//! test's own with TLS on (the machine's shared brokers are plain): Redis with client
//! certificates and a password, NATS with client certificates and an NKey user and with a
//! credentials file in operator mode, RabbitMQ
//! with client certificates, an HTTPS endpoint that requires client certificates, MQTT
//! with client certificates and a password, and Kafka's SSL and SASL_SSL (PLAIN,
//! SCRAM-SHA-256, SCRAM-SHA-512) against a TLS listener of the test's own, since
//! librdkafka's mock cluster speaks neither.
//!
//! Each publishes one message straight through `Publisher::publish` (what the runtime
//! calls; the runtime itself is the other broker tests' subject), reads it back from the
//! broker, and checks that the same publisher without its certificate (or credential) is
//! refused with a retried error, never a dead letter: a TLS or credential problem is the
//! operator's to fix, not the message's.

use std::time::Duration;

use txoutbox_client::amqp::lapin::options::{BasicGetOptions, QueueDeclareOptions};
use txoutbox_client::amqp::lapin::tcp::{OwnedIdentity, OwnedTLSConfig};
use txoutbox_client::amqp::lapin::types::FieldTable;
use txoutbox_client::amqp::lapin::{Connection, ConnectionProperties};
use txoutbox_client::amqp::AmqpPublisher;
use txoutbox_client::kafka::KafkaPublisher;
use txoutbox_client::mqtt::rumqttc::v5::mqttbytes::v5::Packet;
use txoutbox_client::mqtt::rumqttc::v5::mqttbytes::QoS;
use txoutbox_client::mqtt::rumqttc::v5::{AsyncClient, Event, MqttOptions};
use txoutbox_client::mqtt::rumqttc::{TlsConfiguration, Transport};
use txoutbox_client::mqtt::MqttPublisher;
use txoutbox_client::nats::async_nats::jetstream::{self, stream};
use txoutbox_client::nats::async_nats::ConnectOptions;
use txoutbox_client::nats::NatsPublisher;
use txoutbox_client::redis_stream::redis::streams::StreamRangeReply;
use txoutbox_client::redis_stream::redis::{self, AsyncCommands};
use txoutbox_client::redis_stream::RedisStreamPublisher;
use txoutbox_client::webhook::WebhookPublisher;
use txoutbox_client::{Message, PublishError, Publisher};
use txoutbox_tests::broker_process::BrokerProcess;
use txoutbox_tests::nats_jwt::Operator;
use txoutbox_tests::pki::{Ca, Pair, TlsFiles};
use txoutbox_tests::rabbit_node::RabbitTlsNode;
use txoutbox_tests::tls_server::{FakeKafka, HttpsReceiver, Seen};
use txoutbox_tests::{eventually, DEADLINE};

/// The test's CA and server certificate, a client certificate `relay` it signed, and one
/// `stranger` of another CA.
struct Certificates {
    files: TlsFiles,
    client: Pair,
    stranger: Pair,
}

impl Certificates {
    fn new() -> Self {
        let files = TlsFiles::new();
        let client = files.ca.client(files.dir.path(), "relay", "relay");
        let stranger = Ca::new("another CA").client(files.dir.path(), "stranger", "stranger");
        Self {
            files,
            client,
            stranger,
        }
    }

    fn ca(&self) -> std::path::PathBuf {
        self.files.path("ca.pem")
    }
}

fn message() -> Message {
    Message::new(42, "orders.paid", r#"{"order":42}"#)
        .with_key("customer-1")
        .with_header("traceparent", "00-tls")
}

/// A refused publish is retried, never dead-lettered.
fn assert_retried(result: Result<(), PublishError>, what: &str) {
    let error = result.expect_err(what);
    assert!(!error.is_permanent(), "{what}: {error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_over_tls_with_a_client_certificate_and_a_password() {
    let certificates = Certificates::new();
    let redis = BrokerProcess::redis_tls(&certificates.files, "redis-secret").await;
    let url = format!("rediss://:redis-secret@localhost:{}", redis.port);
    let builder = || {
        RedisStreamPublisher::builder(&url)
            .tls_ca(certificates.ca())
            .response_timeout(Duration::from_secs(3))
    };
    let publisher = builder()
        .tls_client_cert(&certificates.client.cert, &certificates.client.key)
        .build()
        .unwrap();
    publisher.publish(&message()).await.unwrap_or_else(|e| {
        panic!("publish over TLS: {e}\n{}", redis.log());
    });

    let reader = redis::Client::build_with_tls(
        url.as_str(),
        redis::TlsCertificates {
            client_tls: Some(redis::ClientTlsConfig {
                client_cert: std::fs::read(&certificates.client.cert).unwrap(),
                client_key: std::fs::read(&certificates.client.key).unwrap(),
            }),
            root_cert: Some(std::fs::read(certificates.ca()).unwrap()),
        },
    )
    .unwrap();
    let mut connection = reader.get_multiplexed_async_connection().await.unwrap();
    let entries: StreamRangeReply = connection.xrange_all("orders.paid").await.unwrap();
    assert_eq!(entries.ids.len(), 1);
    assert_eq!(entries.ids[0].get::<String>("id").as_deref(), Some("42"));

    let without_certificate = builder().build().unwrap();
    assert_retried(
        without_certificate.publish(&message()).await,
        "a client without a certificate",
    );
    let stranger = builder()
        .tls_client_cert(&certificates.stranger.cert, &certificates.stranger.key)
        .build()
        .unwrap();
    assert_retried(
        stranger.publish(&message()).await,
        "a certificate of another CA",
    );
    let error = RedisStreamPublisher::builder(format!("redis://localhost:{}", redis.port))
        .tls_ca(certificates.ca())
        .build()
        .unwrap_err();
    assert!(error.to_string().contains("use rediss://"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_over_tls_with_a_client_certificate_and_an_nkey() {
    let certificates = Certificates::new();
    let user = nkeys::KeyPair::new_user();
    let seed = user.seed().unwrap();
    let file = |name: &str| certificates.files.path(name).display().to_string();
    let (cert, key, ca) = (file("server.pem"), file("server.key"), file("ca.pem"));
    let public = user.public_key();
    let nats = BrokerProcess::nats_configured(move |dir, port| {
        let dir = dir.display();
        format!(
            "listen: 127.0.0.1:{port}\nlog_file: \"{dir}/nats.log\"\n\
             jetstream {{ store_dir: \"{dir}/jetstream\" }}\n\
             tls {{ cert_file: \"{cert}\", key_file: \"{key}\", ca_file: \"{ca}\", verify: true }}\n\
             authorization {{ users: [ {{ nkey: {public} }} ] }}\n"
        )
    })
    .await;
    let server = format!("tls://localhost:{}", nats.port);

    let client = ConnectOptions::new()
        .nkey(seed.clone())
        .add_root_certificates(certificates.ca())
        .add_client_certificate(
            certificates.client.cert.clone(),
            certificates.client.key.clone(),
        )
        .require_tls(true)
        .connect(server.as_str())
        .await
        .unwrap_or_else(|e| panic!("the test's own connection: {e}\n{}", nats.log()));
    let js = jetstream::new(client);
    js.create_stream(stream::Config {
        name: "ORDERS".into(),
        subjects: vec!["orders.>".into()],
        storage: stream::StorageType::Memory,
        ..Default::default()
    })
    .await
    .unwrap();

    let builder = || {
        NatsPublisher::builder(&server)
            .tls_ca(certificates.ca())
            .tls_client_cert(&certificates.client.cert, &certificates.client.key)
            .ack_timeout(Duration::from_secs(2))
    };
    let publisher = builder().nkey(seed).build().unwrap();
    publisher.publish(&message()).await.unwrap_or_else(|e| {
        panic!("publish over TLS with an NKey: {e}\n{}", nats.log());
    });
    let stored = js
        .get_stream("ORDERS")
        .await
        .unwrap()
        .get_last_raw_message_by_subject("orders.paid")
        .await
        .unwrap();
    assert_eq!(
        stored.headers.get("txoutbox-id").map(|v| v.as_str()),
        Some("42")
    );

    let other_user = nkeys::KeyPair::new_user().seed().unwrap();
    let unknown = builder().nkey(other_user).build().unwrap();
    assert_retried(
        unknown.publish(&message()).await,
        "an NKey the server does not list",
    );
    let error = NatsPublisher::builder(&server)
        .nkey("not-a-seed")
        .build()
        .unwrap_err();
    assert!(error.to_string().contains("NKey seed"), "{error}");
}

/// A credentials file (`.creds`: a user's JWT signed by its account, and the user's NKey
/// seed, as `nsc generate creds` writes it) against a server in operator mode over TLS:
/// the publish is stored; a user whose JWT another account signed is refused with a
/// retried error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_over_tls_with_a_credentials_file() {
    let certificates = Certificates::new();
    let operator = Operator::new();
    let file = |name: &str| certificates.files.path(name).display().to_string();
    let (cert, key) = (file("server.pem"), file("server.key"));
    let nats = BrokerProcess::nats_configured(|dir, port| {
        let config = operator.server_config(dir);
        let dir = dir.display();
        format!(
            "listen: 127.0.0.1:{port}\nlog_file: \"{dir}/nats.log\"\n\
             jetstream {{ store_dir: \"{dir}/jetstream\" }}\n\
             tls {{ cert_file: \"{cert}\", key_file: \"{key}\" }}\n{config}"
        )
    })
    .await;
    let server = format!("tls://localhost:{}", nats.port);
    let dir = certificates.files.dir.path();
    let creds = operator.user_creds(dir, "relay", true);

    let client = ConnectOptions::with_credentials_file(&creds)
        .await
        .unwrap()
        .add_root_certificates(certificates.ca())
        .require_tls(true)
        .connect(server.as_str())
        .await
        .unwrap_or_else(|e| {
            panic!(
                "the test's own connection (operator {}): {e}\n{}",
                operator.public_key(),
                nats.log()
            )
        });
    let js = jetstream::new(client);
    js.create_stream(stream::Config {
        name: "ORDERS".into(),
        subjects: vec!["orders.>".into()],
        storage: stream::StorageType::Memory,
        ..Default::default()
    })
    .await
    .unwrap_or_else(|e| panic!("JetStream in the operator's account: {e}\n{}", nats.log()));

    let builder = || {
        NatsPublisher::builder(&server)
            .tls_ca(certificates.ca())
            .ack_timeout(Duration::from_secs(2))
    };
    let publisher = builder().credentials_file(&creds).build().unwrap();
    publisher.publish(&message()).await.unwrap_or_else(|e| {
        panic!("publish with a credentials file: {e}\n{}", nats.log());
    });
    let stored = js
        .get_stream("ORDERS")
        .await
        .unwrap()
        .get_last_raw_message_by_subject("orders.paid")
        .await
        .unwrap();
    assert_eq!(
        stored.headers.get("txoutbox-id").map(|v| v.as_str()),
        Some("42")
    );

    let forged = operator.user_creds(dir, "forged", false);
    let refused = builder().credentials_file(&forged).build().unwrap();
    assert_retried(
        refused.publish(&message()).await,
        "a user JWT the operator's account did not sign",
    );
    let error = NatsPublisher::builder(&server)
        .credentials_file(dir.join("missing.creds"))
        .build()
        .unwrap_err();
    assert!(error.to_string().contains("credentials file"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_over_https_with_a_client_certificate_and_a_private_ca() {
    let certificates = Certificates::new();
    let receiver = HttpsReceiver::start(&certificates.files, true).await;
    let builder = || {
        WebhookPublisher::builder(receiver.url())
            .timeout(Duration::from_secs(3))
            .tls_ca(certificates.ca())
    };
    let publisher = builder()
        .tls_client_cert(&certificates.client.cert, &certificates.client.key)
        .build()
        .unwrap();
    publisher.publish(&message()).await.unwrap();
    let seen = receiver.seen();
    assert!(
        seen.contains(&Seen::Handshake {
            client_certificate: true
        }),
        "{seen:?}"
    );
    assert!(
        seen.contains(&Seen::HttpBody(br#"{"order":42}"#.to_vec())),
        "{seen:?}"
    );

    assert_retried(
        builder().build().unwrap().publish(&message()).await,
        "no client certificate",
    );
    let system_roots = WebhookPublisher::builder(receiver.url())
        .tls_client_cert(&certificates.client.cert, &certificates.client.key)
        .build()
        .unwrap();
    assert_retried(
        system_roots.publish(&message()).await,
        "the private CA is not among the system's roots",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_over_tls_with_a_client_certificate() {
    let certificates = Certificates::new();
    let rabbit = RabbitTlsNode::start(&certificates.files).await;
    let uri = format!("amqps://guest:guest@localhost:{}/%2f", rabbit.port);
    let tls = OwnedTLSConfig {
        identity: Some(OwnedIdentity::PKCS8 {
            pem: std::fs::read(&certificates.client.cert).unwrap(),
            key: std::fs::read(&certificates.client.key).unwrap(),
        }),
        cert_chain: Some(std::fs::read_to_string(certificates.ca()).unwrap()),
    };
    let connection = Connection::connect_with_config(
        &uri,
        ConnectionProperties::default(),
        tls,
        txoutbox_client::amqp::lapin::runtime::default_runtime().unwrap(),
    )
    .await
    .unwrap_or_else(|e| panic!("the test's own connection: {e}\n{}", rabbit.log()));
    let channel = connection.create_channel().await.unwrap();
    channel
        .queue_declare(
            "orders.paid".into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();

    // The default exchange routes by queue name.
    let builder = || {
        AmqpPublisher::builder(&uri, "")
            .tls_ca(certificates.ca())
            .confirm_timeout(Duration::from_secs(3))
    };
    let publisher = builder()
        .tls_client_cert(&certificates.client.cert, &certificates.client.key)
        .build()
        .unwrap();
    publisher.publish(&message()).await.unwrap();
    let got = eventually("the message in the queue", DEADLINE, || async {
        channel
            .basic_get("orders.paid".into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
    })
    .await;
    assert_eq!(got.delivery.data, br#"{"order":42}"#);

    assert_retried(
        builder().build().unwrap().publish(&message()).await,
        "no client certificate",
    );
}

/// librdkafka with `security.protocol=SASL_SSL` and each SASL mechanism: through the
/// TLS handshake (verifying the listener's certificate with `ssl.ca.location`) to the
/// SaslHandshake naming the mechanism and the client's first SASL message carrying the
/// user. The listener then closes, as a broker refusing the credential would: the
/// publish is retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_sasl_ssl_starts_plain_and_scram_exchanges_over_tls() {
    let certificates = Certificates::new();
    for mechanism in ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] {
        let kafka = FakeKafka::start(&certificates.files, false).await;
        let publisher = KafkaPublisher::builder(kafka.bootstrap())
            .set("security.protocol", "SASL_SSL")
            .set("ssl.ca.location", certificates.ca().display().to_string())
            .set("sasl.mechanism", mechanism)
            .set("sasl.username", "relay")
            .set("sasl.password", "kafka-secret")
            .delivery_timeout(Duration::from_secs(2))
            .build()
            .unwrap();
        let first = eventually(
            &format!("the first {mechanism} message"),
            DEADLINE,
            || async {
                kafka.seen().into_iter().find_map(|seen| match seen {
                    Seen::SaslFirstMessage(bytes) => Some(bytes),
                    _ => None,
                })
            },
        )
        .await;
        let seen = kafka.seen();
        assert!(
            seen.contains(&Seen::SaslMechanism(mechanism.to_owned())),
            "{seen:?}"
        );
        if mechanism == "PLAIN" {
            assert_eq!(first, b"\0relay\0kafka-secret");
        } else {
            let first = String::from_utf8(first).unwrap();
            assert!(first.starts_with("n,,n=relay,r="), "{first}");
        }
        assert_retried(publisher.publish(&message()).await, "refused credentials");
    }
}

/// `security.protocol=SSL` with a client certificate: the listener, which requires one
/// of its CA, completes the handshake and gets Kafka requests; with a CA that did not
/// sign the listener's certificate, the client gives up in the handshake.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_ssl_presents_the_client_certificate_and_checks_the_broker() {
    let certificates = Certificates::new();
    let kafka = FakeKafka::start(&certificates.files, true).await;
    let ssl = |ca: &std::path::Path| {
        KafkaPublisher::builder(kafka.bootstrap())
            .set("security.protocol", "SSL")
            .set("ssl.ca.location", ca.display().to_string())
            .set(
                "ssl.certificate.location",
                certificates.client.cert.display().to_string(),
            )
            .set(
                "ssl.key.location",
                certificates.client.key.display().to_string(),
            )
            .delivery_timeout(Duration::from_secs(2))
            .build()
            .unwrap()
    };
    let _publisher = ssl(&certificates.ca());
    eventually("a Kafka request over mutual TLS", DEADLINE, || async {
        let seen = kafka.seen();
        let after_handshake = seen.iter().skip_while(|s| {
            **s != Seen::Handshake {
                client_certificate: true,
            }
        });
        after_handshake
            .into_iter()
            .any(|s| *s == Seen::KafkaRequest(18))
            .then_some(())
    })
    .await;

    let other = Ca::new("not the listener's CA");
    let other_ca = other.write(certificates.files.dir.path(), "other-ca");
    let kafka = FakeKafka::start(&certificates.files, true).await;
    let wrong_ca = KafkaPublisher::builder(kafka.bootstrap())
        .set("security.protocol", "SSL")
        .set("ssl.ca.location", other_ca.display().to_string())
        .delivery_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    eventually("a refused handshake", DEADLINE, || async {
        kafka
            .seen()
            .iter()
            .any(|s| matches!(s, Seen::HandshakeFailed(_)))
            .then_some(())
    })
    .await;
    assert!(!kafka.seen().contains(&Seen::KafkaRequest(18)));
    assert_retried(wrong_ca.publish(&message()).await, "an unknown broker");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt_over_tls_with_a_client_certificate_and_a_password() {
    let certificates = Certificates::new();
    let passwords = certificates.files.path("mosquitto.passwd");
    let status = std::process::Command::new("mosquitto_passwd")
        .args(["-c", "-b"])
        .arg(&passwords)
        .args(["relay", "mqtt-secret"])
        .status()
        .unwrap();
    assert!(status.success(), "mosquitto_passwd");
    let file = |name: &str| certificates.files.path(name).display().to_string();
    let (cert, key, ca) = (file("server.pem"), file("server.key"), file("ca.pem"));
    let passwords = passwords.display().to_string();
    let mosquitto = BrokerProcess::mosquitto(move |port| {
        format!(
            "user root\nper_listener_settings true\nlistener {port} 127.0.0.1\n\
             cafile {ca}\ncertfile {cert}\nkeyfile {key}\nrequire_certificate true\n\
             allow_anonymous false\npassword_file {passwords}\n"
        )
    })
    .await;
    let address = format!("mqtts://localhost:{}", mosquitto.port);

    // The test's own subscriber, with the same credentials.
    let mut options = MqttOptions::new("txoutbox-test-reader", "localhost", mosquitto.port);
    options.set_credentials("relay", "mqtt-secret");
    options.set_transport(Transport::Tls(TlsConfiguration::Simple {
        ca: std::fs::read(certificates.ca()).unwrap(),
        alpn: None,
        client_auth: Some((
            std::fs::read(&certificates.client.cert).unwrap(),
            std::fs::read(&certificates.client.key).unwrap(),
        )),
    }));
    let (reader, mut events) = AsyncClient::new(options, 16);
    reader
        .subscribe("orders/#", QoS::AtLeastOnce)
        .await
        .unwrap();
    let (received, mut incoming) = tokio::sync::mpsc::unbounded_channel();
    let reading = tokio::spawn(async move {
        loop {
            match events.poll().await {
                Ok(Event::Incoming(Packet::SubAck(_))) => received.send(None).unwrap(),
                Ok(Event::Incoming(Packet::Publish(publish))) => {
                    received.send(Some(publish)).unwrap()
                }
                Ok(_) => {}
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    });
    let subscribed = tokio::time::timeout(DEADLINE, incoming.recv()).await;
    assert!(matches!(subscribed, Ok(Some(None))), "no SUBACK");

    let builder = || {
        MqttPublisher::builder(&address)
            .tls_ca(certificates.ca())
            .tls_client_cert(&certificates.client.cert, &certificates.client.key)
            .topic_fn(|m| m.topic.replace('.', "/"))
            .key_in_topic(true)
            .ack_timeout(Duration::from_secs(3))
    };
    let publisher = builder()
        .credentials("relay", "mqtt-secret")
        .build()
        .unwrap();
    publisher.publish(&message()).await.unwrap();
    let publish = tokio::time::timeout(DEADLINE, incoming.recv())
        .await
        .expect("the message")
        .unwrap()
        .unwrap();
    assert_eq!(publish.topic, "orders/paid/customer-1");
    assert_eq!(publish.payload, br#"{"order":42}"#.as_slice());
    let properties = publish.properties.unwrap().user_properties;
    assert!(
        properties.contains(&("txoutbox-id".into(), "42".into())),
        "{properties:?}"
    );

    assert_retried(
        builder().build().unwrap().publish(&message()).await,
        "no password",
    );
    reading.abort();
}
