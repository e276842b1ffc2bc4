//! What the runtime does when it cannot work: a refusal it cannot fix ends it with the
//! server's reason; an unreachable server is retried until the caller stops.

use crate::client_common;

use std::time::Duration;

use txoutbox_client::{ClientError, Message, PublishError, Subscriber};
use txoutbox_tests::{eventually, Server, TestDb, DEADLINE};

use client_common::free_port;

async fn publish(_: Message) -> Result<(), PublishError> {
    Ok(())
}

#[tokio::test]
async fn an_unknown_outbox_ends_the_subscriber_with_the_servers_reason() {
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let subscriber = Subscriber::builder([server.url()], "invoices")
        .build(publish)
        .unwrap();
    let result = tokio::time::timeout(DEADLINE, subscriber.run(std::future::pending())).await;
    let error = result.expect("the subscriber kept retrying").unwrap_err();
    let ClientError::Refused { status, .. } = &error else {
        panic!("expected a refusal, got {error}");
    };
    assert_eq!(status.code(), tonic::Code::NotFound);
    assert!(error.to_string().contains("invoices"), "{error}");
    db.drop().await;
}

#[tokio::test]
async fn an_unreachable_server_is_retried_until_stopped() {
    let address = format!("http://127.0.0.1:{}", free_port());
    let subscriber = Subscriber::builder([address], "orders")
        .reconnect_backoff(Duration::from_millis(20), Duration::from_millis(100))
        .build(publish)
        .unwrap();
    let handle = subscriber.spawn();
    eventually("a few failed attempts", DEADLINE, || async {
        (handle.counters().snapshot().disconnects >= 3).then_some(())
    })
    .await;
    tokio::time::timeout(Duration::from_secs(2), handle.stop())
        .await
        .expect("stop while disconnected should be prompt")
        .unwrap();
}
