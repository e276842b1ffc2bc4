//! `txoutbox relay` with the TLS, credential and CloudEvents options a user gives for a
//! production broker, end to end: a real `txoutboxd`, the relay as a process, and a
//! broker of the test's own with TLS on and authentication required. The publishers
//! behind these options are tested one by one in `broker_tls.rs`; here it is the flags
//! that must reach them.

use std::time::Duration;

use txoutbox_client::mqtt::rumqttc::v5::mqttbytes::v5::{Packet, Publish};
use txoutbox_client::mqtt::rumqttc::v5::mqttbytes::QoS;
use txoutbox_client::mqtt::rumqttc::v5::{AsyncClient, Event, MqttOptions};
use txoutbox_client::mqtt::rumqttc::{TlsConfiguration, Transport};
use txoutbox_client::nats::async_nats::jetstream::{self, stream};
use txoutbox_client::nats::async_nats::ConnectOptions;
use txoutbox_tests::broker_process::BrokerProcess;
use txoutbox_tests::brokers::insert_keyed;
use txoutbox_tests::cloudevents_check::read_back;
use txoutbox_tests::nats_jwt::Operator;
use txoutbox_tests::pki::{Pair, TlsFiles};
use txoutbox_tests::relay_cli::relay_until_done_with_env;
use txoutbox_tests::{eventually, Server, TestDb, DEADLINE};

/// The test's CA and server certificate (`localhost`), and a client certificate it signed.
fn certificates() -> (TlsFiles, Pair) {
    let files = TlsFiles::new();
    let client = files.ca.client(files.dir.path(), "relay", "relay");
    (files, client)
}

fn path(files: &TlsFiles, name: &str) -> String {
    files.path(name).display().to_string()
}

/// `--nats tls://... --broker-ca --nats-creds` to a server in operator mode over TLS, with
/// `--cloudevents SOURCE --cloudevents-type TYPE --cloudevents-structured`: every row is
/// stored, as a structured event of that type the Python SDK reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_nats_with_tls_a_credentials_file_and_structured_cloudevents() {
    let (files, _) = certificates();
    let operator = Operator::new();
    let (cert, key) = (path(&files, "server.pem"), path(&files, "server.key"));
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
    let url = format!("tls://localhost:{}", nats.port);
    let creds = operator.user_creds(files.dir.path(), "relay", true);
    let client = ConnectOptions::with_credentials_file(&creds)
        .await
        .unwrap()
        .add_root_certificates(files.path("ca.pem"))
        .require_tls(true)
        .connect(url.as_str())
        .await
        .unwrap_or_else(|e| panic!("the test's own connection: {e}\n{}", nats.log()));
    let js = jetstream::new(client);
    let mut orders = js
        .create_stream(stream::Config {
            name: "ORDERS".into(),
            subjects: vec!["orders.>".into()],
            storage: stream::StorageType::Memory,
            ..Default::default()
        })
        .await
        .unwrap();

    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let ids = insert_keyed(&db, "orders.paid", 2, 2).await;
    let (ca, creds) = (path(&files, "ca.pem"), creds.display().to_string());
    let args = [
        "--nats",
        &url,
        "--broker-ca",
        &ca,
        "--nats-creds",
        &creds,
        "--cloudevents",
        "/shop/orders",
        "--cloudevents-type",
        "shop.order",
        "--cloudevents-structured",
    ];
    let status = relay_until_done_with_env(&server, &db, ids.len(), &args, &[]).await;
    assert_eq!(status.code(), Some(0));

    let stored = orders.info().await.unwrap().state.messages;
    assert_eq!(stored, ids.len() as u64);
    let last = js
        .get_stream("ORDERS")
        .await
        .unwrap()
        .get_last_raw_message_by_subject("orders.paid")
        .await
        .unwrap();
    let content_type = last
        .headers
        .get("content-type")
        .unwrap()
        .as_str()
        .to_owned();
    let headers = [("content-type".to_owned(), content_type)];
    let event = read_back("nats", &headers, None, &last.payload);
    assert_eq!(event["attributes"]["type"], "shop.order", "{event}");
    assert_eq!(event["attributes"]["source"], "/shop/orders", "{event}");
    // Keys are published in parallel: the last stored is the last of either key.
    let id: i64 = event["attributes"]["id"].as_str().unwrap().parse().unwrap();
    assert!(ids.contains(&id), "{event}");
    db.drop().await;
}

/// `--mqtt mqtts://... --broker-ca --broker-cert --broker-key --mqtt-user` (the password
/// from `TXOUTBOX_MQTT_PASSWORD`) to a Mosquitto that requires a client certificate and a
/// password: every row arrives under its key's topic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_mqtt_with_a_client_certificate_and_a_password() {
    let (files, client) = certificates();
    let passwords = files.path("mosquitto.passwd");
    let made = std::process::Command::new("mosquitto_passwd")
        .args(["-c", "-b"])
        .arg(&passwords)
        .args(["relay", "mqtt-secret"])
        .status()
        .unwrap();
    assert!(made.success(), "mosquitto_passwd");
    let (cert, key, ca) = (
        path(&files, "server.pem"),
        path(&files, "server.key"),
        path(&files, "ca.pem"),
    );
    let passwords = passwords.display().to_string();
    let mosquitto = BrokerProcess::mosquitto(|port| {
        format!(
            "user root\nper_listener_settings true\nlistener {port} 127.0.0.1\n\
             cafile {ca}\ncertfile {cert}\nkeyfile {key}\nrequire_certificate true\n\
             allow_anonymous false\npassword_file {passwords}\n"
        )
    })
    .await;

    let mut options = MqttOptions::new("txoutbox-relay-reader", "localhost", mosquitto.port);
    options.set_credentials("relay", "mqtt-secret");
    options.set_transport(Transport::Tls(TlsConfiguration::Simple {
        ca: std::fs::read(&ca).unwrap(),
        alpn: None,
        client_auth: Some((
            std::fs::read(&client.cert).unwrap(),
            std::fs::read(&client.key).unwrap(),
        )),
    }));
    let (reader, mut events) = AsyncClient::new(options, 16);
    reader
        .subscribe("orders/#", QoS::AtLeastOnce)
        .await
        .unwrap();
    let received = std::sync::Arc::new(std::sync::Mutex::new(Vec::<Publish>::new()));
    let (subscribed, suback) = tokio::sync::oneshot::channel();
    let reading = tokio::spawn({
        let received = std::sync::Arc::clone(&received);
        async move {
            let mut subscribed = Some(subscribed);
            loop {
                match events.poll().await {
                    Ok(Event::Incoming(Packet::SubAck(_))) => {
                        subscribed.take().map(|s| s.send(()));
                    }
                    Ok(Event::Incoming(Packet::Publish(publish))) => {
                        received.lock().unwrap().push(publish)
                    }
                    Ok(_) => {}
                    Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                }
            }
        }
    });
    tokio::time::timeout(DEADLINE, suback)
        .await
        .expect("SUBACK")
        .unwrap();

    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let ids = insert_keyed(&db, "orders", 2, 3).await;
    let url = format!("mqtts://localhost:{}", mosquitto.port);
    let (client_cert, client_key) = (
        client.cert.display().to_string(),
        client.key.display().to_string(),
    );
    let args = [
        "--mqtt",
        &url,
        "--broker-ca",
        &ca,
        "--broker-cert",
        &client_cert,
        "--broker-key",
        &client_key,
        "--mqtt-user",
        "relay",
        "--key-in-topic",
    ];
    let env = [("TXOUTBOX_MQTT_PASSWORD", "mqtt-secret")];
    let status = relay_until_done_with_env(&server, &db, ids.len(), &args, &env).await;
    assert_eq!(status.code(), Some(0));

    let topics = eventually("every message at the reader", DEADLINE, || async {
        let received = received.lock().unwrap();
        let topics: Vec<String> = received
            .iter()
            .map(|p| String::from_utf8_lossy(&p.topic).into_owned())
            .collect();
        (topics.len() >= ids.len()).then_some(topics)
    })
    .await;
    for key in ["k0", "k1"] {
        let topic = format!("orders/{key}");
        assert_eq!(
            topics.iter().filter(|t| **t == topic).count(),
            3,
            "{topics:?}"
        );
    }
    reading.abort();
    db.drop().await;
}
