//! `MqttPublisher` against a Mosquitto of the test's own (plain; TLS is in
//! `broker_tls.rs`), the whole path: a real `txoutboxd` on PostgreSQL, the subscriber
//! runtime, and a reader subscribed at QoS 1 before anything is published, which
//! rebuilds each message from its topic and user properties.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use txoutbox_client::mqtt::rumqttc::v5::mqttbytes::v5::{Packet, Publish};
use txoutbox_client::mqtt::rumqttc::v5::mqttbytes::QoS;
use txoutbox_client::mqtt::rumqttc::v5::{AsyncClient, Event, MqttOptions};
use txoutbox_client::mqtt::MqttPublisher;
use txoutbox_tests::broker_process::BrokerProcess;
use txoutbox_tests::brokers::{
    assert_complete_and_in_order, insert_keyed, outage, spawn_subscribers, stop_all, unique_name,
    Cut, Delivered, OUTAGE_PER_KEY, QUICK_RETRIES,
};
use txoutbox_tests::cloudevents_check::read_back;
use txoutbox_tests::relay_cli::{self, relay_until_done};
use txoutbox_tests::{eventually, Server, TcpProxy, TestDb, DEADLINE};

async fn mosquitto() -> BrokerProcess {
    BrokerProcess::mosquitto(|port| {
        format!("user root\nlistener {port} 127.0.0.1\nallow_anonymous true\n")
    })
    .await
}

/// What the reader got, in arrival order.
struct Reader {
    received: Arc<Mutex<Vec<Publish>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Reader {
    /// Subscribed to `PREFIX/#` on the broker at `port`, once it returns.
    async fn subscribe(port: u16, prefix: &str) -> Self {
        let options = MqttOptions::new(unique_name(), "127.0.0.1", port);
        let (client, mut events) = AsyncClient::new(options, 16);
        client
            .subscribe(format!("{prefix}/#"), QoS::AtLeastOnce)
            .await
            .unwrap();
        let received = Arc::new(Mutex::new(Vec::new()));
        let (subscribed, suback) = tokio::sync::oneshot::channel();
        let task = {
            let received = Arc::clone(&received);
            tokio::spawn(async move {
                let _client = client;
                let mut subscribed = Some(subscribed);
                loop {
                    match events.poll().await {
                        Ok(Event::Incoming(Packet::SubAck(_))) => {
                            subscribed.take().map(|s| s.send(()));
                        }
                        Ok(Event::Incoming(Packet::Publish(publish))) => {
                            received.lock().unwrap().push(publish);
                        }
                        Ok(_) => {}
                        Err(error) => panic!("the test's reader lost its broker: {error}"),
                    }
                }
            })
        };
        tokio::time::timeout(DEADLINE, suback)
            .await
            .expect("SUBACK")
            .unwrap();
        Self { received, task }
    }

    fn received(&self) -> Vec<Delivered> {
        self.raw().iter().map(delivered).collect()
    }

    fn raw(&self) -> Vec<Publish> {
        self.received.lock().unwrap().clone()
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A message as the publisher sent it: from its user properties, or from the
/// CloudEvent's attributes in them (binary mode, without a prefix).
fn delivered(publish: &Publish) -> Delivered {
    let mut properties: BTreeMap<String, String> = publish
        .properties
        .as_ref()
        .map(|p| p.user_properties.iter().cloned().collect())
        .unwrap_or_default();
    if properties.contains_key("specversion") {
        properties.insert("txoutbox-id".into(), properties["id"].clone());
        properties.insert("txoutbox-topic".into(), properties["txoutboxtopic"].clone());
        if let Some(key) = properties.get("subject").cloned() {
            properties.insert("txoutbox-key".into(), key);
        }
    }
    let mut headers = BTreeMap::new();
    headers.extend(
        properties
            .get("traceparent")
            .map(|v| ("traceparent".to_owned(), v.clone())),
    );
    Delivered {
        id: properties["txoutbox-id"].parse().unwrap(),
        topic: properties["txoutbox-topic"].clone(),
        key: properties.get("txoutbox-key").cloned(),
        payload: String::from_utf8(publish.payload.to_vec()).unwrap(),
        headers,
    }
}

fn publisher(address: &str, prefix: &str) -> Arc<MqttPublisher> {
    let prefix = prefix.to_owned();
    Arc::new(
        MqttPublisher::builder(format!("mqtt://{address}"))
            .topic_fn(move |m| format!("{prefix}/{}", m.topic.replace('.', "/")))
            .key_in_topic(true)
            .ack_timeout(Duration::from_secs(1))
            .build()
            .unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_subscribers_deliver_keys_headers_and_ids_in_order() {
    let broker = mosquitto().await;
    let prefix = unique_name();
    let reader = Reader::subscribe(broker.port, &prefix).await;
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let ids = insert_keyed(&db, "orders.paid", 5, 8).await;

    let handles = spawn_subscribers(&server, 3, publisher(&broker.address(), &prefix));
    eventually("every row delivered", DEADLINE, || async {
        (db.count("done").await == ids.len() as i64).then_some(())
    })
    .await;
    stop_all(handles).await;

    let delivered = eventually("every message at the reader", DEADLINE, || async {
        let received = reader.received();
        (received.len() >= ids.len()).then_some(received)
    })
    .await;
    assert_complete_and_in_order(&delivered, &ids, 8);
    assert!(delivered.iter().all(|d| d.topic == "orders.paid"));
    db.drop().await;
}

/// Connections reset mid-run: every publish waiting for a PUBACK on the lost connection
/// fails and is retried on the next one, so nothing is lost and no key goes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_outage_loses_nothing_and_keeps_key_order() {
    let broker = mosquitto().await;
    let prefix = unique_name();
    let reader = Reader::subscribe(broker.port, &prefix).await;
    let proxy = TcpProxy::start(&broker.address()).await;
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config(QUICK_RETRIES)).await;

    let ids = outage(
        &db,
        &server,
        &proxy,
        Cut::Reset,
        "orders",
        publisher(&proxy.address(), &prefix),
    )
    .await;
    let delivered = eventually("every message at the reader", DEADLINE, || async {
        let received = reader.received();
        let got: std::collections::BTreeSet<i64> = received.iter().map(|d| d.id).collect();
        (got.len() >= ids.len()).then_some(received)
    })
    .await;
    assert_complete_and_in_order(&delivered, &ids, OUTAGE_PER_KEY);
    db.drop().await;
}

/// `txoutbox relay --mqtt ... --key-in-topic --cloudevents SOURCE`: every row arrives in
/// key order, under TOPIC/KEY, as a CloudEvent the Python SDK reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_mqtt_command_delivers_cloudevents_in_key_order() {
    let broker = mosquitto().await;
    let prefix = unique_name();
    let reader = Reader::subscribe(broker.port, &prefix).await;
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let ids = insert_keyed(&db, "orders.paid", 4, 5).await;

    let url = format!("mqtt://{}", broker.address());
    let topic_prefix = format!("{prefix}/");
    let args = [
        "--mqtt",
        &url,
        "--topic-prefix",
        &topic_prefix,
        "--key-in-topic",
        "--cloudevents",
        "/shop/orders",
    ];
    let status = relay_until_done(&server, &db, ids.len(), &args).await;
    assert_eq!(status.code(), Some(0));

    let raw = eventually("every message at the reader", DEADLINE, || async {
        let raw = reader.raw();
        (raw.len() >= ids.len()).then_some(raw)
    })
    .await;
    let delivered: Vec<Delivered> = raw.iter().map(delivered).collect();
    assert_complete_and_in_order(&delivered, &ids, 5);
    for (publish, message) in raw.iter().zip(&delivered) {
        let key = message.key.as_deref().unwrap();
        assert_eq!(
            publish.topic,
            format!("{prefix}/orders.paid/{key}").as_str()
        );
    }
    let properties = raw[0].properties.clone().unwrap();
    let mut headers = properties.user_properties.clone();
    headers.extend(
        properties
            .content_type
            .map(|t| ("content-type".to_owned(), t)),
    );
    let event = read_back("mqtt", &headers, None, &raw[0].payload);
    assert_eq!(event["attributes"]["source"], "/shop/orders");
    assert_eq!(event["attributes"]["id"], delivered[0].id.to_string());
    assert_eq!(event["attributes"]["type"], "orders.paid");
    db.drop().await;
}

/// `--key-in-topic` with a key that cannot be a topic level (`eu/1`): that row is
/// dead-lettered at once with the reason, and every other row arrives in key order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_mqtt_dead_letters_a_key_that_is_not_a_topic_level() {
    let broker = mosquitto().await;
    let prefix = unique_name();
    let reader = Reader::subscribe(broker.port, &prefix).await;
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let ids = insert_keyed(&db, "orders.paid", 2, 3).await;
    let refused = db.insert("orders.paid", Some("eu/1"), b"{}").await;

    let url = format!("mqtt://{}", broker.address());
    let topic_prefix = format!("{prefix}/");
    let args = [
        "--mqtt",
        &url,
        "--topic-prefix",
        &topic_prefix,
        "--key-in-topic",
    ];
    let relay = relay_cli::spawn(&server, &args);
    eventually("the keyed rows done, the other dead", DEADLINE, || async {
        let settled = db.count("done").await == ids.len() as i64 && db.count("dead").await == 1;
        settled.then_some(())
    })
    .await;
    let status = relay_cli::stop(relay).await;
    assert_eq!(status.code(), Some(0));

    let (status, attempts, error) = db.row(refused).await;
    assert_eq!((status.as_str(), attempts), ("dead", 1));
    let error = error.unwrap();
    assert!(error.contains("key `eu/1` is not a topic level"), "{error}");
    let delivered = eventually("every other message at the reader", DEADLINE, || async {
        let received = reader.received();
        (received.len() >= ids.len()).then_some(received)
    })
    .await;
    assert_complete_and_in_order(&delivered, &ids, 3);
    db.drop().await;
}
