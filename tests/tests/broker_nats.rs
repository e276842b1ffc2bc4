//! `NatsPublisher` against the machine's NATS server with JetStream (127.0.0.1:4222), the
//! whole path: a real `txoutboxd` on PostgreSQL, the subscriber runtime, a stream of the
//! test's own (memory storage, deleted at the end), read back message by message.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use txoutbox_client::nats::async_nats::jetstream::{self, stream};
use txoutbox_client::nats::NatsPublisher;
use txoutbox_client::producer::{NewMessage, OutboxTable};
use txoutbox_tests::brokers::{
    assert_complete_and_in_order, insert_keyed, outage, spawn_subscribers, stop_all, unique_name,
    Cut, Delivered, OUTAGE_PER_KEY, QUICK_RETRIES,
};
use txoutbox_tests::relay_cli::relay_until_done;
use txoutbox_tests::{eventually, Server, TcpProxy, TestDb, DEADLINE};

const NATS: &str = "127.0.0.1:4222";

/// A stream of the test's own capturing `NAME.>`, in memory, small messages only.
struct TestStream {
    name: String,
    jetstream: jetstream::Context,
}

impl TestStream {
    async fn create() -> Self {
        let client = txoutbox_client::nats::async_nats::connect(NATS)
            .await
            .unwrap_or_else(|e| panic!("NATS at {NATS} (scripts/test starts it): {e}"));
        let jetstream = jetstream::new(client);
        let name = unique_name();
        jetstream
            .create_stream(stream::Config {
                name: name.clone(),
                subjects: vec![format!("{name}.>")],
                storage: stream::StorageType::Memory,
                max_message_size: 1024,
                ..Default::default()
            })
            .await
            .unwrap();
        Self { name, jetstream }
    }

    /// Every message of the stream, in its order, with the Nats-Msg-Id of each.
    async fn read(&self) -> Vec<(Delivered, String)> {
        let mut stream = self.jetstream.get_stream(&self.name).await.unwrap();
        let last = stream.info().await.unwrap().state.last_sequence;
        let mut read = Vec::new();
        for sequence in 1..=last {
            let message = stream.get_raw_message(sequence).await.unwrap();
            let header = |name: &str| message.headers.get(name).map(|v| v.as_str().to_owned());
            let mut headers = BTreeMap::new();
            headers.extend(header("traceparent").map(|v| ("traceparent".to_owned(), v)));
            let delivered = Delivered {
                id: header("txoutbox-id").unwrap().parse().unwrap(),
                topic: header("txoutbox-topic").unwrap(),
                key: header("txoutbox-key"),
                payload: String::from_utf8(message.payload.to_vec()).unwrap(),
                headers,
            };
            assert_eq!(
                message.subject.as_str(),
                format!("{}.{}", self.name, delivered.topic)
            );
            read.push((delivered, header("Nats-Msg-Id").unwrap()));
        }
        read
    }

    async fn delete(self) {
        self.jetstream.delete_stream(&self.name).await.unwrap();
    }
}

fn publisher(servers: &str, stream: &TestStream) -> Arc<NatsPublisher> {
    Arc::new(
        NatsPublisher::builder(servers)
            .topic_prefix(format!("{}.", stream.name))
            .ack_timeout(Duration::from_secs(1))
            .build()
            .unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_subscribers_deliver_keys_headers_and_ids_in_order() {
    let stream = TestStream::create().await;
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let ids = insert_keyed(&db, "orders.paid", 5, 8).await;

    let handles = spawn_subscribers(&server, 3, publisher(&format!("nats://{NATS}"), &stream));
    eventually("every row delivered", DEADLINE, || async {
        (db.count("done").await == ids.len() as i64).then_some(())
    })
    .await;
    stop_all(handles).await;

    let read = stream.read().await;
    let delivered: Vec<Delivered> = read.iter().map(|(d, _)| d.clone()).collect();
    assert_complete_and_in_order(&delivered, &ids, 8);
    for (message, msg_id) in &read {
        assert_eq!(
            msg_id,
            &message.id.to_string(),
            "Nats-Msg-Id is the outbox id"
        );
        assert_eq!(message.topic, "orders.paid");
    }
    stream.delete().await;
    db.drop().await;
}

async fn outage_test(cut: Cut) {
    let stream = TestStream::create().await;
    let proxy = TcpProxy::start(NATS).await;
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config(QUICK_RETRIES)).await;
    let nats = publisher(&format!("nats://{}", proxy.address()), &stream);

    let ids = outage(&db, &server, &proxy, cut, "orders", nats).await;

    let read = stream.read().await;
    let delivered: Vec<Delivered> = read.into_iter().map(|(d, _)| d).collect();
    assert_complete_and_in_order(&delivered, &ids, OUTAGE_PER_KEY);
    // JetStream deduplicates on Nats-Msg-Id: a retry whose PubAck was lost is stored once.
    assert_eq!(delivered.len(), ids.len(), "duplicates in the stream");
    let mut nacked = 0;
    for id in &ids {
        if let (_, _, Some(error)) = db.row(*id).await {
            assert!(
                error.starts_with(&format!("nats subject `{}.orders`", stream.name)),
                "{error}"
            );
            nacked += 1;
        }
    }
    assert!(nacked > 0, "no row records the outage");
    stream.delete().await;
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_reset_mid_run_nacks_then_everything_is_stored_once() {
    outage_test(Cut::Reset).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_link_black_holed_mid_run_nacks_then_everything_is_stored_once() {
    outage_test(Cut::BlackHole).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_stream_for_the_subject_and_a_rejected_message_are_dead_lettered() {
    let stream = TestStream::create().await;
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config(QUICK_RETRIES)).await;
    let table = OutboxTable::in_schema(&db.schema, "outbox").unwrap();
    let mut tx = db.pool.begin().await.unwrap();
    let mut ids = BTreeMap::new();
    for (topic, size) in [("fits", 10), ("too-big", 4096), ("nowhere", 10)] {
        let message = NewMessage::new(topic, vec![b'x'; size]);
        ids.insert(topic, table.insert(&mut *tx, &message).await.unwrap());
    }
    tx.commit().await.unwrap();

    // `nowhere` goes to a subject no stream captures; the others to the test's stream,
    // which takes messages of at most 1 KiB.
    let name = stream.name.clone();
    let nats = NatsPublisher::builder(format!("nats://{NATS}"))
        .topic_fn(move |m| match m.topic.as_str() {
            "nowhere" => format!("{name}_none.nowhere"),
            topic => format!("{name}.{topic}"),
        })
        .build()
        .unwrap();
    let handles = spawn_subscribers(&server, 1, Arc::new(nats));
    eventually("every row settled", DEADLINE, || async {
        (db.count("done").await + db.count("dead").await == 3).then_some(())
    })
    .await;
    let (retried, dead) = stop_all(handles).await;
    assert_eq!((retried, dead), (0, 2));

    assert_eq!(db.row(ids["fits"]).await.0, "done");
    let (status, attempts, error) = db.row(ids["too-big"]).await;
    assert_eq!((status.as_str(), attempts), ("dead", 1));
    assert!(
        error.unwrap().contains("message size exceeds maximum"),
        "too-big"
    );
    let (status, attempts, error) = db.row(ids["nowhere"]).await;
    assert_eq!((status.as_str(), attempts), ("dead", 1));
    assert!(error.unwrap().contains("no stream found"), "nowhere");
    stream.delete().await;
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_nats_command_delivers_in_order_and_stops_on_sigterm() {
    let stream = TestStream::create().await;
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let ids = insert_keyed(&db, "orders.paid", 4, 5).await;

    let prefix = format!("{}.", stream.name);
    let servers = format!("nats://{NATS}");
    let args = [
        "--nats",
        &servers,
        "--topic-prefix",
        &prefix,
        "--msg-id-prefix",
        "cli-",
    ];
    let status = relay_until_done(&server, &db, ids.len(), &args).await;
    assert_eq!(status.code(), Some(0));

    let read = stream.read().await;
    let delivered: Vec<Delivered> = read.iter().map(|(d, _)| d.clone()).collect();
    assert_complete_and_in_order(&delivered, &ids, 5);
    assert!(read
        .iter()
        .all(|(d, msg_id)| *msg_id == format!("cli-{}", d.id)));
    stream.delete().await;
    db.drop().await;
}
