//! `WebhookPublisher`, one POST per message, against an HTTP server the test runs
//! (`txoutbox_tests::webhook_receiver`), the whole path: a real `txoutboxd` on PostgreSQL,
//! the subscriber runtime, signed POSTs whose signature the receiver checks with the HMAC
//! crates, as a receiver would. Batches: `broker_webhook_batch.rs`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::StatusCode;
use txoutbox_client::webhook::WebhookPublisher;
use txoutbox_tests::brokers::{
    assert_complete_and_in_order, insert_keyed, outage, relay_outage, spawn_subscribers, stop_all,
    Cut, OUTAGE_PER_KEY, QUICK_RETRIES,
};
use txoutbox_tests::relay_cli::relay_until_done;
use txoutbox_tests::webhook_receiver::{always_ok, Answer, Receiver, SECRET};
use txoutbox_tests::{eventually, Server, TcpProxy, TestDb, DEADLINE};

fn publisher(address: &str) -> WebhookPublisher {
    WebhookPublisher::builder(format!("http://{address}/hook"))
        .secret(SECRET)
        .timeout(Duration::from_secs(1))
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_subscribers_deliver_signed_requests_in_order() {
    let receiver = Receiver::start(always_ok()).await;
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let ids = insert_keyed(&db, "orders.paid", 5, 8).await;

    let handles = spawn_subscribers(&server, 3, Arc::new(publisher(&receiver.address)));
    eventually("every row delivered", DEADLINE, || async {
        (db.count("done").await == ids.len() as i64).then_some(())
    })
    .await;
    stop_all(handles).await;

    let accepted = receiver.accepted();
    assert_complete_and_in_order(&accepted, &ids, 8);
    assert_eq!(accepted.len(), ids.len(), "duplicates without an outage");
    assert!(receiver.posts().iter().all(|post| !post.batch));
    db.drop().await;
}

async fn outage_test(cut: Cut) {
    let receiver = Receiver::start(always_ok()).await;
    let proxy = TcpProxy::start(&receiver.address).await;
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config(QUICK_RETRIES)).await;
    let hook = Arc::new(publisher(&proxy.address()));

    let ids = outage(&db, &server, &proxy, cut, "orders", hook).await;

    assert_complete_and_in_order(&receiver.accepted(), &ids, OUTAGE_PER_KEY);
    let mut nacked = 0;
    for id in &ids {
        if let (_, _, Some(error)) = db.row(*id).await {
            assert!(error.starts_with("webhook http://"), "{error}");
            nacked += 1;
        }
    }
    assert!(nacked > 0, "no row records the outage");
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_reset_mid_run_nacks_then_nothing_is_lost() {
    outage_test(Cut::Reset).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_link_black_holed_mid_run_nacks_then_nothing_is_lost() {
    outage_test(Cut::BlackHole).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_4xx_dead_letters_while_503_429_and_listed_statuses_are_retried() {
    // Payloads name the answer to their first attempt; later attempts get 200.
    let seen = Arc::new(Mutex::new(BTreeMap::<i64, u32>::new()));
    let answer: Answer = {
        let seen = Arc::clone(&seen);
        Arc::new(move |messages| {
            let [message] = messages else {
                panic!("a batch without batching: {messages:?}")
            };
            let mut seen = seen.lock().unwrap();
            let attempt = seen.entry(message.id).or_default();
            *attempt += 1;
            match (message.payload.as_str(), *attempt) {
                ("422", _) => (StatusCode::UNPROCESSABLE_ENTITY, None),
                ("503", 1) => (StatusCode::SERVICE_UNAVAILABLE, Some("1")),
                ("429", 1) => (StatusCode::TOO_MANY_REQUESTS, None),
                ("409", 1) => (StatusCode::CONFLICT, None),
                _ => (StatusCode::OK, None),
            }
        })
    };
    let receiver = Receiver::start(answer).await;
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config(QUICK_RETRIES)).await;
    let mut ids = BTreeMap::new();
    for status in ["422", "503", "429", "409", "200"] {
        ids.insert(status, db.insert("orders", None, status.as_bytes()).await);
    }

    let hook = WebhookPublisher::builder(receiver.url())
        .secret(SECRET)
        .retry_status(409)
        .build()
        .unwrap();
    let handles = spawn_subscribers(&server, 1, Arc::new(hook));
    eventually("every row settled", DEADLINE, || async {
        (db.count("done").await + db.count("dead").await == 5).then_some(())
    })
    .await;
    let (retried, dead) = stop_all(handles).await;
    assert_eq!((retried, dead), (3, 1));

    let (status, attempts, error) = db.row(ids["422"]).await;
    assert_eq!((status.as_str(), attempts), ("dead", 1));
    let error = error.unwrap();
    assert!(
        error.contains("answered 422 Unprocessable Entity: answer from the test"),
        "{error}"
    );
    for retried in ["503", "429", "409"] {
        let (status, attempts, _) = db.row(ids[retried]).await;
        assert_eq!((status.as_str(), attempts), ("done", 2), "{retried}");
    }
    assert_eq!(db.row(ids["200"]).await.0, "done");
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_webhook_command_delivers_signed_requests_and_stops_on_sigterm() {
    let receiver = Receiver::start(always_ok()).await;
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let ids = insert_keyed(&db, "orders.paid", 4, 5).await;

    let url = receiver.url();
    let args = ["--webhook", &url, "--webhook-secret", SECRET];
    let status = relay_until_done(&server, &db, ids.len(), &args).await;
    assert_eq!(status.code(), Some(0));

    assert_complete_and_in_order(&receiver.accepted(), &ids, 5);
    db.drop().await;
}

/// `txoutbox relay --webhook` through a proxy whose link is reset mid-run: the rows are
/// nacked with the HTTP error, then the receiver has every signed request in key order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_webhook_command_nacks_through_an_outage_then_nothing_is_lost() {
    let receiver = Receiver::start(always_ok()).await;
    let proxy = TcpProxy::start(&receiver.address).await;
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config(QUICK_RETRIES)).await;

    let url = format!("http://{}/hook", proxy.address());
    let args = [
        "--webhook",
        &url,
        "--webhook-secret",
        SECRET,
        "--delivery-timeout",
        "1s",
    ];
    let cut = async || proxy.reset();
    let restore = async || proxy.restore();
    let ids = relay_outage(
        &db,
        &server,
        "orders",
        &args,
        "webhook http://",
        cut,
        restore,
    )
    .await;

    assert_complete_and_in_order(&receiver.accepted(), &ids, OUTAGE_PER_KEY);
    db.drop().await;
}
