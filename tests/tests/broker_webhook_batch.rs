//! `WebhookPublisher` with batching on (`batch(max_messages, max_wait)`, `relay
//! --webhook-batch`), against the receiver of the webhook tests
//! (`txoutbox_tests::webhook_receiver`), which checks every request's signature: fewer
//! POSTs than messages, each body a JSON array holding at most one message per key, every
//! row delivered once in per-key order, and one answer applied to a whole batch.

use std::collections::BTreeSet;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::StatusCode;
use txoutbox_client::webhook::WebhookPublisher;
use txoutbox_tests::brokers::{
    assert_complete_and_in_order, insert_keyed, spawn_subscribers, stop_all, QUICK_RETRIES,
};
use txoutbox_tests::relay_cli::{binary, relay_until_done};
use txoutbox_tests::webhook_receiver::{always_ok, Answer, Post, Receiver, SECRET};
use txoutbox_tests::{eventually, Server, TestDb, DEADLINE};

/// Every POST was a batch, none held two messages of one key, and there were fewer POSTs
/// than messages (some batch held several).
fn assert_batched(posts: &[Post], messages: usize) {
    assert!(
        posts.iter().all(|post| post.batch),
        "a POST was not a batch"
    );
    for post in posts {
        let keys: BTreeSet<_> = post.messages.iter().map(|m| &m.key).collect();
        assert_eq!(keys.len(), post.messages.len(), "one key twice: {post:?}");
    }
    assert!(
        posts.len() < messages,
        "{} POSTs for {messages} messages: nothing was batched",
        posts.len()
    );
    let sizes: Vec<usize> = posts.iter().map(|post| post.messages.len()).collect();
    eprintln!("{messages} messages in {} POSTs of {sizes:?}", posts.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_are_signed_arrays_delivering_every_row_once_in_key_order() {
    let receiver = Receiver::start(always_ok()).await;
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let ids = insert_keyed(&db, "orders.paid", 8, 5).await;

    let hook = WebhookPublisher::builder(receiver.url())
        .secret(SECRET)
        .batch(8, Duration::from_millis(200))
        .build()
        .unwrap();
    // Two subscribers sharing the publisher, four keys at once each: batches of up to 8.
    let handles = spawn_subscribers(&server, 2, Arc::new(hook));
    eventually("every row delivered", DEADLINE, || async {
        (db.count("done").await == ids.len() as i64).then_some(())
    })
    .await;
    let (retried, dead) = stop_all(handles).await;
    assert_eq!((retried, dead), (0, 0));

    assert_batched(&receiver.posts(), ids.len());
    let accepted = receiver.accepted();
    assert_complete_and_in_order(&accepted, &ids, 5);
    assert_eq!(accepted.len(), ids.len(), "a row delivered twice");
    db.drop().await;
}

/// Rows inserted in one statement, keys `k0`, `k1`, ... so that one subscriber publishes
/// them at once, into one batch; payloads `PREFIX:n`.
async fn insert_together(db: &TestDb, prefix: &str, count: usize) -> Vec<i64> {
    let rows: Vec<_> = (0..count)
        .map(|n| {
            let key = format!("{prefix}-k{n}");
            (Some(key), format!("{prefix}:{n}").into_bytes())
        })
        .collect();
    db.insert_many("orders", &rows).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_503_batch_is_retried_after_retry_after_and_a_400_batch_dead_letters_whole() {
    // A batch holding a `400:` payload is refused; one holding a `503:` payload not seen
    // before is answered 503 with Retry-After: 1; anything else is accepted.
    let seen = Arc::new(Mutex::new(BTreeSet::<i64>::new()));
    let answer: Answer = {
        let seen = Arc::clone(&seen);
        Arc::new(move |messages| {
            let mut seen = seen.lock().unwrap();
            // Every id inserted (no short-circuit): a later POST of them is a retry.
            let new = messages.iter().filter(|m| seen.insert(m.id)).count() > 0;
            if messages.iter().any(|m| m.payload.starts_with("400:")) {
                (StatusCode::BAD_REQUEST, None)
            } else if new && messages.iter().any(|m| m.payload.starts_with("503:")) {
                (StatusCode::SERVICE_UNAVAILABLE, Some("1"))
            } else {
                (StatusCode::OK, None)
            }
        })
    };
    let receiver = Receiver::start(answer).await;
    let db = TestDb::new().await;
    // Retries after 200ms unless the answer says otherwise (at most 1s).
    let server = Server::start_serving(&db.config(QUICK_RETRIES)).await;
    let hook = WebhookPublisher::builder(receiver.url())
        .secret(SECRET)
        .batch(3, Duration::from_millis(300))
        .build()
        .unwrap();
    let handles = spawn_subscribers(&server, 1, Arc::new(hook));

    let unavailable = insert_together(&db, "503", 3).await;
    eventually("the 503 batch delivered", DEADLINE, || async {
        (db.count("done").await == 3).then_some(())
    })
    .await;
    let posts = receiver.posts();
    assert_eq!(posts[0].status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(posts[0].messages.len(), 3, "{posts:?}");
    // Honoured Retry-After: the backoff alone (200ms) plus the batch wait (300ms) would
    // have come back sooner.
    let retried_at = posts[1].at - posts[0].at;
    assert!(
        retried_at >= Duration::from_millis(900),
        "retried after {retried_at:?}"
    );
    for id in &unavailable {
        let (status, attempts, error) = db.row(*id).await;
        assert_eq!((status.as_str(), attempts), ("done", 2), "row {id}");
        let error = error.unwrap();
        assert!(
            error.contains("answered 503 Service Unavailable") && error.contains("a batch of 3"),
            "{error}"
        );
    }

    // One refused payload dead-letters the two good ones that shared its POST.
    let mut refused = insert_together(&db, "ok", 2).await;
    refused.extend(
        db.insert_many("orders", &[(Some("bad".into()), b"400:x".to_vec())])
            .await,
    );
    eventually("the 400 batch dead-lettered", DEADLINE, || async {
        (db.count("dead").await == 3).then_some(())
    })
    .await;
    for id in &refused {
        let (status, attempts, error) = db.row(*id).await;
        assert_eq!((status.as_str(), attempts), ("dead", 1), "row {id}");
        assert!(error.unwrap().contains("answered 400 Bad Request"));
    }
    let (retried, dead) = stop_all(handles).await;
    assert_eq!((retried, dead), (3, 3));
    assert_batched(&receiver.posts(), 6);
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_webhook_batch_command_posts_signed_arrays() {
    let receiver = Receiver::start(always_ok()).await;
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let ids = insert_keyed(&db, "orders.paid", 4, 5).await;

    let url = receiver.url();
    let args = [
        "--webhook",
        &url,
        "--webhook-secret",
        SECRET,
        "--webhook-batch",
        "4",
        "--webhook-batch-wait",
        "100ms",
    ];
    let status = relay_until_done(&server, &db, ids.len(), &args).await;
    assert_eq!(status.code(), Some(0));

    assert_batched(&receiver.posts(), ids.len());
    let accepted = receiver.accepted();
    assert_complete_and_in_order(&accepted, &ids, 5);
    assert_eq!(accepted.len(), ids.len(), "a row delivered twice");
    db.drop().await;
}

#[tokio::test]
async fn relay_refuses_a_batch_larger_than_its_concurrency() {
    let output = tokio::process::Command::new(binary())
        .args([
            "--server",
            "http://127.0.0.1:1",
            "--outbox",
            "orders",
            "relay",
        ])
        .args([
            "--webhook",
            "http://127.0.0.1:1/hook",
            "--webhook-batch",
            "32",
        ])
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--webhook-batch 32") && stderr.contains("raise --concurrency"),
        "{stderr}"
    );
}
