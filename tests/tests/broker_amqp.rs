//! `AmqpPublisher` against the machine's RabbitMQ (127.0.0.1:5672, guest/guest), the
//! whole path: a real `txoutboxd` on PostgreSQL, the subscriber runtime, an exchange and
//! a queue of the test's own (deleted at the end), read back with basic.get.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use txoutbox_client::amqp::lapin::options::{
    BasicGetOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use txoutbox_client::amqp::lapin::types::{AMQPValue, FieldTable};
use txoutbox_client::amqp::lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};
use txoutbox_client::amqp::AmqpPublisher;
use txoutbox_tests::brokers::{
    assert_complete_and_in_order, insert_keyed, outage, relay_outage, spawn_subscribers, stop_all,
    unique_name, Cut, Delivered, OUTAGE_PER_KEY, QUICK_RETRIES,
};
use txoutbox_tests::relay_cli::relay_until_done;
use txoutbox_tests::{eventually, Server, TcpProxy, TestDb, DEADLINE};

const RABBIT: &str = "127.0.0.1:5672";

fn uri(address: &str) -> String {
    format!("amqp://guest:guest@{address}/%2f")
}

/// A topic exchange and one queue bound to it for `orders.#`, of the test's own.
struct TestExchange {
    name: String,
    _connection: Connection,
    channel: Channel,
}

impl TestExchange {
    async fn create() -> Self {
        let connection = Connection::connect(&uri(RABBIT), ConnectionProperties::default())
            .await
            .unwrap_or_else(|e| panic!("RabbitMQ at {RABBIT} (scripts/test starts it): {e}"));
        let channel = connection.create_channel().await.unwrap();
        let name = unique_name();
        channel
            .exchange_declare(
                name.as_str().into(),
                ExchangeKind::Topic,
                ExchangeDeclareOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        channel
            .queue_declare(
                name.as_str().into(),
                QueueDeclareOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        channel
            .queue_bind(
                name.as_str().into(),
                name.as_str().into(),
                "orders.#".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        Self {
            name,
            _connection: connection,
            channel,
        }
    }

    /// Every message in the queue, in its order (taken off the queue).
    async fn read(&self) -> Vec<Delivered> {
        let mut read = Vec::new();
        while let Some(got) = self
            .channel
            .basic_get(self.name.as_str().into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
        {
            let properties = &got.delivery.properties;
            let headers: BTreeMap<String, String> = properties
                .headers()
                .as_ref()
                .unwrap()
                .inner()
                .iter()
                .map(|(name, value)| match value {
                    AMQPValue::LongString(text) => (
                        name.to_string(),
                        String::from_utf8_lossy(text.as_bytes()).into_owned(),
                    ),
                    other => panic!("header {name}: {other:?}"),
                })
                .collect();
            let id: i64 = properties
                .message_id()
                .as_ref()
                .unwrap()
                .as_str()
                .parse()
                .unwrap();
            assert_eq!(headers["txoutbox-id"], id.to_string());
            assert_eq!(properties.delivery_mode(), &Some(2), "persistent");
            assert_eq!(got.delivery.routing_key.as_str(), headers["txoutbox-topic"]);
            read.push(Delivered {
                id,
                topic: headers["txoutbox-topic"].clone(),
                key: headers.get("txoutbox-key").cloned(),
                payload: String::from_utf8(got.delivery.data.clone()).unwrap(),
                headers,
            });
        }
        read
    }

    async fn delete(self) {
        let name = self.name.as_str();
        self.channel
            .queue_delete(name.into(), QueueDeleteOptions::default())
            .await
            .unwrap();
        self.channel
            .exchange_delete(name.into(), ExchangeDeleteOptions::default())
            .await
            .unwrap();
    }
}

fn publisher(address: &str, exchange: &TestExchange) -> Arc<AmqpPublisher> {
    Arc::new(
        AmqpPublisher::builder(uri(address), exchange.name.clone())
            .confirm_timeout(Duration::from_secs(1))
            .build()
            .unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_subscribers_deliver_keys_headers_and_ids_in_order() {
    let exchange = TestExchange::create().await;
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let ids = insert_keyed(&db, "orders.paid", 5, 8).await;

    let handles = spawn_subscribers(&server, 3, publisher(RABBIT, &exchange));
    eventually("every row delivered", DEADLINE, || async {
        (db.count("done").await == ids.len() as i64).then_some(())
    })
    .await;
    stop_all(handles).await;

    let delivered = exchange.read().await;
    assert_complete_and_in_order(&delivered, &ids, 8);
    assert_eq!(delivered.len(), ids.len(), "duplicates without an outage");
    exchange.delete().await;
    db.drop().await;
}

async fn outage_test(cut: Cut) {
    let exchange = TestExchange::create().await;
    let proxy = TcpProxy::start(RABBIT).await;
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config(QUICK_RETRIES)).await;
    let rabbit = publisher(&proxy.address(), &exchange);

    let ids = outage(&db, &server, &proxy, cut, "orders.paid", rabbit).await;

    assert_complete_and_in_order(&exchange.read().await, &ids, OUTAGE_PER_KEY);
    let mut nacked = 0;
    for id in &ids {
        if let (_, _, Some(error)) = db.row(*id).await {
            assert!(error.starts_with("amqp"), "{error}");
            nacked += 1;
        }
    }
    assert!(nacked > 0, "no row records the outage");
    exchange.delete().await;
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_reset_mid_run_nacks_then_nothing_is_lost() {
    outage_test(Cut::Reset).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_link_black_holed_mid_run_nacks_then_nothing_is_lost() {
    outage_test(Cut::BlackHole).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unroutable_message_is_dead_lettered_unless_retrying_is_asked_for() {
    let exchange = TestExchange::create().await;
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config(QUICK_RETRIES)).await;
    let routed = db.insert("orders.paid", None, b"routed").await;
    let unroutable = db.insert("invoices.sent", None, b"nowhere").await;

    let handles = spawn_subscribers(&server, 1, publisher(RABBIT, &exchange));
    eventually("both rows settled", DEADLINE, || async {
        (db.count("done").await + db.count("dead").await == 2).then_some(())
    })
    .await;
    let (retried, dead) = stop_all(handles).await;
    assert_eq!((retried, dead), (0, 1));
    assert_eq!(db.row(routed).await.0, "done");
    let (status, attempts, error) = db.row(unroutable).await;
    assert_eq!((status.as_str(), attempts), ("dead", 1));
    let error = error.unwrap();
    assert!(
        error.contains("routing key `invoices.sent`") && error.contains("NO_ROUTE"),
        "{error}"
    );

    // With retry_unroutable, the same message is nacked until a queue is bound for it.
    let again = db.insert("invoices.sent", None, b"later").await;
    let retrying = AmqpPublisher::builder(uri(RABBIT), exchange.name.clone())
        .retry_unroutable(true)
        .build()
        .unwrap();
    let handles = spawn_subscribers(&server, 1, Arc::new(retrying));
    eventually("a nack of the unroutable message", DEADLINE, || async {
        (handles[0].counters().snapshot().retried >= 1).then_some(())
    })
    .await;
    exchange
        .channel
        .queue_bind(
            exchange.name.as_str().into(),
            exchange.name.as_str().into(),
            "invoices.#".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    eventually("delivered once a queue is bound", DEADLINE, || async {
        (db.row(again).await.0 == "done").then_some(())
    })
    .await;
    stop_all(handles).await;
    let read = exchange.read().await;
    assert_eq!(read.last().unwrap().payload, "later");
    exchange.delete().await;
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_amqp_command_delivers_in_order_and_stops_on_sigterm() {
    let exchange = TestExchange::create().await;
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let ids = insert_keyed(&db, "orders.paid", 4, 5).await;

    let uri = uri(RABBIT);
    let args = ["--amqp", &uri, "--exchange", &exchange.name];
    let status = relay_until_done(&server, &db, ids.len(), &args).await;
    assert_eq!(status.code(), Some(0));

    assert_complete_and_in_order(&exchange.read().await, &ids, 5);
    exchange.delete().await;
    db.drop().await;
}

/// `txoutbox relay --amqp` through a proxy whose link is reset mid-run: the rows are
/// nacked with the AMQP error, then everything reaches the queue in key order. (The
/// RabbitMQ node itself is not restarted: a second node of the test's own is too heavy
/// to boot per test; the reset is what its clients see of a restart.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_amqp_command_nacks_through_an_outage_then_nothing_is_lost() {
    let exchange = TestExchange::create().await;
    let proxy = TcpProxy::start(RABBIT).await;
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config(QUICK_RETRIES)).await;

    let uri = uri(&proxy.address());
    let args = [
        "--amqp",
        &uri,
        "--exchange",
        &exchange.name,
        "--delivery-timeout",
        "1s",
    ];
    let cut = async || proxy.reset();
    let restore = async || proxy.restore();
    let ids = relay_outage(&db, &server, "orders.paid", &args, "amqp", cut, restore).await;

    assert_complete_and_in_order(&exchange.read().await, &ids, OUTAGE_PER_KEY);
    exchange.delete().await;
    db.drop().await;
}
