//! `MqttPublisher` against a Mosquitto of the test's own (plain; TLS is in
//! `broker_tls.rs`), the whole path: a real `txoutboxd` on PostgreSQL, the subscriber
//! runtime, and a reader subscribed at QoS 1 before anything is published, which
//! rebuilds each message from its topic and user properties.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use txoutbox_client::mqtt::rumqttc::v5::mqttbytes::v5::Packet;
use txoutbox_client::mqtt::rumqttc::v5::mqttbytes::QoS;
use txoutbox_client::mqtt::rumqttc::v5::{AsyncClient, Event, MqttOptions};
use txoutbox_client::mqtt::MqttPublisher;
use txoutbox_tests::broker_process::BrokerProcess;
use txoutbox_tests::brokers::{
    assert_complete_and_in_order, insert_keyed, outage, spawn_subscribers, stop_all, unique_name,
    Cut, Delivered, OUTAGE_PER_KEY, QUICK_RETRIES,
};
use txoutbox_tests::{eventually, Server, TcpProxy, TestDb, DEADLINE};

async fn mosquitto() -> BrokerProcess {
    BrokerProcess::mosquitto(|port| {
        format!("user root\nlistener {port} 127.0.0.1\nallow_anonymous true\n")
    })
    .await
}

/// What the reader got, in arrival order.
struct Reader {
    received: Arc<Mutex<Vec<Delivered>>>,
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
                            received.lock().unwrap().push(delivered(&publish));
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
        self.received.lock().unwrap().clone()
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn delivered(publish: &txoutbox_client::mqtt::rumqttc::v5::mqttbytes::v5::Publish) -> Delivered {
    let properties: BTreeMap<String, String> = publish
        .properties
        .as_ref()
        .map(|p| p.user_properties.iter().cloned().collect())
        .unwrap_or_default();
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
