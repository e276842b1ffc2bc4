//! `txoutbox relay --sqs` and `--sns` against moto (an AWS emulator from PyPI, one server
//! per test, `txoutbox_tests::moto`), the whole path: a real `txoutboxd` on PostgreSQL,
//! the relay as a user runs it with its credentials from the standard AWS chain (the
//! environment), and the test reading the queue back as a consumer would.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;

use txoutbox_client::sqs::aws_sdk_sqs::types::QueueAttributeName;
use txoutbox_client::sqs::SqsPublisher;
use txoutbox_client::{Message, Publisher};
use txoutbox_tests::brokers::{
    assert_complete_and_in_order, insert_keyed, relay_outage_with_env, unique_name, Delivered,
    OUTAGE_KEYS, OUTAGE_PER_KEY, QUICK_RETRIES,
};
use txoutbox_tests::cloudevents_check::read_back;
use txoutbox_tests::moto::{Moto, Received, REGION};
use txoutbox_tests::relay_cli::{self, relay_until_done_with_env};
use txoutbox_tests::{eventually, Server, TestDb, DEADLINE};

/// A message as the relay sent it, from its attributes (or, in CloudEvents binary mode,
/// from the event's attributes).
fn delivered(message: &Received) -> Delivered {
    let attributes = &message.attributes;
    let get = |plain: &str, event: &str| {
        attributes
            .get(plain)
            .or_else(|| attributes.get(event))
            .cloned()
    };
    let mut headers = BTreeMap::new();
    headers.extend(get("traceparent", "ce-traceparent").map(|v| ("traceparent".to_owned(), v)));
    Delivered {
        id: get("txoutbox-id", "ce-id").expect("an id").parse().unwrap(),
        topic: get("txoutbox-topic", "ce-txoutboxtopic").expect("a topic"),
        key: get("txoutbox-key", "ce-subject"),
        payload: message.body.clone(),
        headers,
    }
}

fn env() -> Vec<(&'static str, &'static str)> {
    Moto::env()
}

/// A FIFO queue: every row arrives; each key's messages in order, in the key's message
/// group; the message id (behind `--msg-id-prefix`) is the deduplication id; keyless rows
/// each in a group of their own (the message id).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_sqs_fifo_keeps_key_order_in_groups_deduplicated_by_id() {
    let moto = Moto::start().await;
    let queue = moto.queue(&format!("{}.fifo", unique_name()), &[]).await;
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let ids = insert_keyed(&db, "orders.paid", 4, 5).await;
    let keyless = [
        db.insert("orders.paid", None, b"keyless one").await,
        db.insert("orders.paid", None, b"keyless two").await,
    ];

    let endpoint = moto.endpoint();
    let args = [
        "--sqs",
        &queue,
        "--aws-endpoint",
        &endpoint,
        "--msg-id-prefix",
        "orders-",
    ];
    let total = ids.len() + keyless.len();
    let status = relay_until_done_with_env(&server, &db, total, &args, &env()).await;
    assert_eq!(status.code(), Some(0));

    let received = moto.receive(&queue, total).await;
    let mut keyed = Vec::new();
    for message in &received {
        let sent = delivered(message);
        assert_eq!(
            message.deduplication_id,
            Some(format!("orders-{}", sent.id)),
            "{message:?}"
        );
        match &sent.key {
            Some(key) => {
                assert_eq!(message.group_id.as_ref(), Some(key), "{message:?}");
                keyed.push(sent);
            }
            None => {
                assert!(keyless.contains(&sent.id), "{message:?}");
                assert_eq!(message.group_id, Some(sent.id.to_string()), "{message:?}");
            }
        }
    }
    assert_complete_and_in_order(&keyed, &ids, 5);
    db.drop().await;
}

/// A standard queue that takes at most 1,024 bytes: the rows that fit arrive with their
/// attributes; the one SQS refuses is dead-lettered with SQS's reason, and nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_sqs_dead_letters_the_message_sqs_refuses() {
    let moto = Moto::start().await;
    let queue = moto
        .queue(
            &unique_name(),
            &[(QueueAttributeName::MaximumMessageSize, "1024")],
        )
        .await;
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let ids = insert_keyed(&db, "orders.paid", 3, 3).await;
    let refused = db.insert("orders.paid", Some("k9"), &[b'x'; 2000]).await;

    let endpoint = moto.endpoint();
    let args = [
        "--sqs",
        &queue,
        "--aws-endpoint",
        &endpoint,
        "--aws-region",
        REGION,
    ];
    let relay = relay_cli::spawn_with_env(&server, &args, &env());
    eventually(
        "the rows that fit done, the other dead",
        DEADLINE,
        || async {
            let settled = db.count("done").await == ids.len() as i64 && db.count("dead").await == 1;
            settled.then_some(())
        },
    )
    .await;
    let status = relay_cli::stop(relay).await;
    assert_eq!(status.code(), Some(0));

    let (status, attempts, error) = db.row(refused).await;
    assert_eq!((status.as_str(), attempts), ("dead", 1));
    let error = error.unwrap();
    assert!(
        error.starts_with(&format!("sqs {queue}: InvalidParameterValue"))
            && error.contains("shorter than 1024 bytes"),
        "{error}"
    );

    let mut delivered: Vec<Delivered> = moto
        .receive(&queue, ids.len())
        .await
        .iter()
        .map(delivered)
        .collect();
    // A standard queue does not promise an order: what arrived, and with what.
    delivered.sort_by_key(|message| message.id);
    assert_complete_and_in_order(&delivered, &ids, 3);
    assert!(delivered
        .iter()
        .all(|message| message.topic == "orders.paid"));
    db.drop().await;
}

/// An SNS FIFO topic with a FIFO queue subscribed (raw delivery): every row reaches the
/// queue in key order, as a CloudEvent (binary mode, in message attributes) that the
/// Python SDK reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_sns_reaches_a_subscribed_queue_as_cloudevents_in_key_order() {
    let moto = Moto::start().await;
    let name = unique_name();
    let queue = moto.queue(&format!("{name}.fifo"), &[]).await;
    let topic = moto.topic_to_queue(&format!("{name}.fifo"), &queue).await;
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let ids = insert_keyed(&db, "orders.paid", 3, 4).await;

    let endpoint = moto.endpoint();
    let args = [
        "--sns",
        &topic,
        "--aws-endpoint",
        &endpoint,
        "--cloudevents",
        "/shop/orders",
    ];
    let status = relay_until_done_with_env(&server, &db, ids.len(), &args, &env()).await;
    assert_eq!(status.code(), Some(0));

    let received = moto.receive(&queue, ids.len()).await;
    let delivered: Vec<Delivered> = received.iter().map(delivered).collect();
    assert_complete_and_in_order(&delivered, &ids, 4);
    for (message, sent) in received.iter().zip(&delivered) {
        assert_eq!(message.group_id, sent.key, "{message:?}");
    }
    let first = &received[0];
    let attributes: Vec<(String, String)> = first.attributes.clone().into_iter().collect();
    let event = read_back("sqs", &attributes, None, first.body.as_bytes());
    assert_eq!(event["attributes"]["source"], "/shop/orders");
    assert_eq!(event["attributes"]["id"], delivered[0].id.to_string());
    assert_eq!(event["attributes"]["type"], "orders.paid");
    assert_eq!(
        event["attributes"]["subject"],
        delivered[0].key.clone().unwrap()
    );
    // The payloads (`k0:0`) are not JSON: application/octet-stream, data in base64.
    assert_eq!(
        event["data_base64"],
        base64::engine::general_purpose::STANDARD.encode(&delivered[0].payload)
    );
    db.drop().await;
}

/// moto stopped under `txoutbox relay --sqs` (SIGTERM), then started again empty, and the
/// FIFO queue made again once a row was nacked for its absence: the rows published
/// meanwhile are nacked with the SDK's error (the endpoint refusing connections, then a
/// queue that does not exist), never dead-lettered, and once the queue is back they all
/// arrive, each key in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_sqs_nacks_while_sqs_is_away_then_delivers_in_key_order() {
    let moto = Moto::start().await;
    let name = format!("{}.fifo", unique_name());
    let queue = moto.queue(&name, &[]).await;
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config(QUICK_RETRIES)).await;

    let endpoint = moto.endpoint();
    let args = [
        "--sqs",
        &queue,
        "--aws-endpoint",
        &endpoint,
        "--delivery-timeout",
        "1s",
    ];
    let cut = async || moto.stop().await;
    let restore = async || {
        moto.start_again().await;
        // Until the queue is made again, SQS says it does not exist: retried, not dead.
        let missing = format!(
            "SELECT count(*) FROM {}.outbox WHERE status = 'pending' \
             AND last_error LIKE '%queue does not exist%'",
            db.schema
        );
        eventually("a nack for the missing queue", DEADLINE, || async {
            let count: i64 = sqlx::query_scalar(&missing)
                .fetch_one(&db.pool)
                .await
                .unwrap();
            (count > 0).then_some(())
        })
        .await;
        let made = moto.queue(&name, &[]).await;
        assert_eq!(made, queue, "moto gave the queue another URL");
    };
    let error = format!("sqs {queue}");
    let ids =
        relay_outage_with_env(&db, &server, "orders", &args, &env(), &error, cut, restore).await;

    // moto kept nothing across its restart: what arrives is the second half, in order.
    let first_half = OUTAGE_KEYS * (OUTAGE_PER_KEY / 2) as usize;
    let second = &ids[first_half..];
    let delivered: Vec<Delivered> = moto
        .receive(&queue, second.len())
        .await
        .iter()
        .map(delivered)
        .collect();
    let got: std::collections::BTreeSet<i64> = delivered.iter().map(|d| d.id).collect();
    assert_eq!(got, second.iter().copied().collect(), "{delivered:#?}");
    let mut by_key: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for message in &delivered {
        by_key
            .entry(message.key.clone().unwrap())
            .or_default()
            .push(message.id);
    }
    for (key, ids) in by_key {
        assert!(
            ids.windows(2).all(|w| w[0] < w[1]),
            "key {key} out of order: {ids:?}"
        );
    }
    db.drop().await;
}

/// Ten publishes at once (ten keys, as the runtime makes them) are one `SendMessageBatch`
/// request, and each is confirmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_publishes_share_one_send_message_batch() {
    let moto = Moto::start().await;
    let queue = moto.queue(&unique_name(), &[]).await;
    let publisher = Arc::new(
        SqsPublisher::builder(&queue)
            .sdk_config(moto.sdk_config())
            .batch(10, Duration::from_millis(500))
            .build()
            .unwrap(),
    );
    let before = moto.requests();
    let publishes: Vec<_> = (1..=10)
        .map(|id| {
            let publisher = Arc::clone(&publisher);
            let message =
                Message::new(id, "orders.paid", format!("m{id}")).with_key(format!("k{id}"));
            tokio::spawn(async move { publisher.publish(&message).await })
        })
        .collect();
    for publish in publishes {
        publish.await.unwrap().unwrap();
    }
    assert_eq!(moto.requests() - before, 1, "{}", moto.log());
    let received = moto.receive(&queue, 10).await;
    let mut ids: Vec<i64> = received.iter().map(|m| delivered(m).id).collect();
    ids.sort();
    assert_eq!(ids, (1..=10).collect::<Vec<_>>());
}
