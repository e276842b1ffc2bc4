//! `NatsPublisher` against the machine's NATS server with JetStream (127.0.0.1:4222), the
//! whole path: a real `txoutboxd` on PostgreSQL, the subscriber runtime, a stream of the
//! test's own (memory storage, deleted at the end), read back message by message.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use txoutbox_client::nats::async_nats::jetstream::{self, stream};
use txoutbox_client::nats::NatsPublisher;
use txoutbox_client::producer::{NewMessage, OutboxTable};
use txoutbox_tests::broker_process::BrokerProcess;
use txoutbox_tests::brokers::{
    assert_complete_and_in_order, insert_keyed, outage, relay_outage, spawn_subscribers, stop_all,
    unique_name, Cut, Delivered, OUTAGE_PER_KEY, QUICK_RETRIES,
};
use txoutbox_tests::relay_cli::relay_until_done;
use txoutbox_tests::{eventually, Server, TcpProxy, TestDb, DEADLINE};

const NATS: &str = "127.0.0.1:4222";

/// A stream of the test's own capturing `NAME.>`, small messages only.
struct TestStream {
    name: String,
    jetstream: jetstream::Context,
}

impl TestStream {
    /// On the machine's NATS, in memory.
    async fn create() -> Self {
        Self::create_at(NATS, stream::StorageType::Memory).await
    }

    /// On the NATS server at `address`, with `storage`.
    async fn create_at(address: &str, storage: stream::StorageType) -> Self {
        let client = txoutbox_client::nats::async_nats::connect(address)
            .await
            .unwrap_or_else(|e| panic!("NATS at {address} (scripts/test starts it): {e}"));
        let jetstream = jetstream::new(client);
        let name = unique_name();
        jetstream
            .create_stream(stream::Config {
                name: name.clone(),
                subjects: vec![format!("{name}.>")],
                storage,
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

/// `txoutbox relay --nats` through a proxy whose link is reset mid-run: the rows are
/// nacked with the NATS error, then everything is stored once, in key order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_nats_command_nacks_through_an_outage_then_stores_everything_once() {
    let stream = TestStream::create().await;
    let proxy = TcpProxy::start(NATS).await;
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config(QUICK_RETRIES)).await;

    let servers = format!("nats://{}", proxy.address());
    let prefix = format!("{}.", stream.name);
    let args = [
        "--nats",
        &servers,
        "--topic-prefix",
        &prefix,
        "--delivery-timeout",
        "1s",
    ];
    let cut = async || proxy.reset();
    let restore = async || proxy.restore();
    let error = format!("nats subject `{}.orders`", stream.name);
    let ids = relay_outage(&db, &server, "orders", &args, &error, cut, restore).await;

    let delivered: Vec<Delivered> = stream.read().await.into_iter().map(|(d, _)| d).collect();
    assert_complete_and_in_order(&delivered, &ids, OUTAGE_PER_KEY);
    assert_eq!(delivered.len(), ids.len(), "duplicates in the stream");
    stream.delete().await;
    db.drop().await;
}

/// A NATS server of the test's own, its stream on disk, stopped (SIGTERM) under `txoutbox
/// relay --nats` and started again on the same port and store: publishes meanwhile are
/// nacked, never dead-lettered (not while it shuts down, nor while JetStream recovers
/// its streams: a "no responders" there is not a missing stream), and once it is back
/// every row is stored once, in key order, after the messages stored before the stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_server_restarted_mid_run_nacks_then_everything_is_stored_once() {
    let nats = BrokerProcess::nats().await;
    let stream = TestStream::create_at(&nats.address(), stream::StorageType::File).await;
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config(QUICK_RETRIES)).await;

    let servers = format!("nats://{}", nats.address());
    let prefix = format!("{}.", stream.name);
    let args = [
        "--nats",
        &servers,
        "--topic-prefix",
        &prefix,
        "--delivery-timeout",
        "1s",
    ];
    let cut = async || nats.stop().await;
    let restore = async || nats.start().await;
    let error = format!("nats subject `{}.orders`", stream.name);
    let ids = relay_outage(&db, &server, "orders", &args, &error, cut, restore).await;

    let delivered: Vec<Delivered> = stream.read().await.into_iter().map(|(d, _)| d).collect();
    assert_complete_and_in_order(&delivered, &ids, OUTAGE_PER_KEY);
    assert_eq!(delivered.len(), ids.len(), "duplicates in the stream");
    db.drop().await;
}

/// Publishes in a tight loop from several tasks while a NATS server of the test's own is
/// stopped (until publishes fail) and started again: JetStream shuts down before the
/// server closes its client connections, and recovers its streams on start, so a publish
/// may arrive while no stream answers ("no responders"). None may be taken for a missing
/// stream: every error is retryable, and publishing goes on once the server is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jetstream_restart_under_load_is_never_a_missing_stream() {
    use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
    use std::sync::Mutex;
    use txoutbox_client::{Message, Publisher};

    let nats = BrokerProcess::nats().await;
    let stream = TestStream::create_at(&nats.address(), stream::StorageType::File).await;
    let publisher = publisher(&format!("nats://{}", nats.address()), &stream);
    let next_id = Arc::new(AtomicI64::new(1));
    let stored = Arc::new(AtomicI64::new(0));
    let errors = Arc::new(Mutex::new(Vec::new()));
    let running = Arc::new(AtomicBool::new(true));
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (publisher, next_id, stored, errors, running) = (
                Arc::clone(&publisher),
                Arc::clone(&next_id),
                Arc::clone(&stored),
                Arc::clone(&errors),
                Arc::clone(&running),
            );
            tokio::spawn(async move {
                while running.load(Ordering::Relaxed) {
                    let id = next_id.fetch_add(1, Ordering::Relaxed);
                    match publisher.publish(&Message::new(id, "orders", "x")).await {
                        Ok(()) => stored.fetch_add(1, Ordering::Relaxed),
                        Err(error) => {
                            errors.lock().unwrap().push(error);
                            0
                        }
                    };
                }
            })
        })
        .collect();

    let stored_by = async |count: i64, what: &str| {
        eventually(what, DEADLINE, || async {
            (stored.load(Ordering::Relaxed) >= count).then_some(())
        })
        .await
    };
    stored_by(200, "publishing under way").await;
    nats.stop().await;
    eventually(
        "publishes failing while the server is down",
        DEADLINE,
        || async { (errors.lock().unwrap().len() >= 8).then_some(()) },
    )
    .await;
    let before = stored.load(Ordering::Relaxed);
    nats.start().await;
    stored_by(before + 200, "publishing again after the restart").await;
    running.store(false, Ordering::Relaxed);
    for task in tasks {
        task.await.unwrap();
    }

    let errors = errors.lock().unwrap();
    let permanent: Vec<_> = errors.iter().filter(|e| e.is_permanent()).collect();
    assert!(
        permanent.is_empty(),
        "dead-lettered by a restart: {permanent:?}"
    );
    let mut kinds: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
    kinds.sort();
    kinds.dedup();
    eprintln!(
        "{} errors during the restart, of kinds {kinds:#?}",
        errors.len()
    );
}

/// "No responders" is not always a missing stream: the NATS server of the test's own
/// comes back without JetStream for a while (as while JetStream starts or recovers its
/// streams), so publishes to the stream's subject have no responders. They are nacked,
/// saying that JetStream did not answer, never dead-lettered; once JetStream is back
/// with its store every row is stored. A subject no stream captures still dead-letters
/// (`no_stream_for_the_subject_and_a_rejected_message_are_dead_lettered`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_responders_while_jetstream_is_down_are_retried_not_dead_lettered() {
    let nats = BrokerProcess::nats().await;
    let stream = TestStream::create_at(&nats.address(), stream::StorageType::File).await;
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config(QUICK_RETRIES)).await;

    let servers = format!("nats://{}", nats.address());
    let prefix = format!("{}.", stream.name);
    let args = [
        "--nats",
        &servers,
        "--topic-prefix",
        &prefix,
        "--delivery-timeout",
        "1s",
    ];
    let cut = async || {
        nats.stop().await;
        nats.start_without_jetstream().await;
    };
    let restore = async || {
        nats.stop().await;
        nats.start().await;
    };
    let error = format!(
        "nats subject `{}.orders`: no stream found for given subject (no responders), and the JetStream API did not answer",
        stream.name
    );
    let ids = relay_outage(&db, &server, "orders", &args, &error, cut, restore).await;

    let delivered: Vec<Delivered> = stream.read().await.into_iter().map(|(d, _)| d).collect();
    assert_complete_and_in_order(&delivered, &ids, OUTAGE_PER_KEY);
    assert_eq!(delivered.len(), ids.len(), "duplicates in the stream");
    db.drop().await;
}
