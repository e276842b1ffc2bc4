//! The producer helper writes outbox rows inside the caller's own transaction: rolled
//! back, nothing is delivered; committed, the row arrives as written.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use txoutbox_client::producer::{NewMessage, OutboxTable};
use txoutbox_client::{Message, PublishError, Subscriber};
use txoutbox_tests::{eventually, Server, TestDb, DEADLINE};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_commit_and_roll_back_with_the_callers_transaction() {
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let outbox = OutboxTable::in_schema(&db.schema, "outbox").unwrap();

    let mut tx = db.pool.begin().await.unwrap();
    outbox
        .insert(
            &mut *tx,
            &NewMessage::new("orders.created", "rolled back").key("c1"),
        )
        .await
        .unwrap();
    tx.rollback().await.unwrap();

    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let mut tx = db.pool.begin().await.unwrap();
    let committed = NewMessage::json("orders.created", &serde_json::json!({"order": 1}))
        .unwrap()
        .key("c1")
        .header("traceparent", traceparent);
    let json_id = outbox.insert(&mut *tx, &committed).await.unwrap();
    tx.commit().await.unwrap();

    // A plain connection (no transaction) works too; the payload is raw bytes.
    let mut connection = db.pool.acquire().await.unwrap();
    let bytes_id = outbox
        .insert(
            &mut *connection,
            &NewMessage::new("blobs", vec![0_u8, 159, 146, 150]),
        )
        .await
        .unwrap();
    drop(connection);

    let received: Arc<Mutex<Vec<Message>>> = Arc::default();
    let publisher = {
        let received = Arc::clone(&received);
        move |message: Message| {
            received.lock().unwrap().push(message);
            async { Ok::<_, PublishError>(()) }
        }
    };
    let handle = Subscriber::builder([server.url()], "orders")
        .build(publisher)
        .unwrap()
        .spawn();
    eventually("both committed rows delivered", DEADLINE, || async {
        (db.count("done").await == 2).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    handle.stop().await.unwrap();

    let received = received.lock().unwrap().clone();
    assert_eq!(received.len(), 2, "{received:?}");
    let json = received.iter().find(|m| m.id == json_id).unwrap();
    assert_eq!(json.topic, "orders.created");
    assert_eq!(json.key.as_deref(), Some("c1"));
    assert_eq!(json.payload_str().unwrap(), r#"{"order":1}"#);
    assert_eq!(json.headers["traceparent"], traceparent);
    let bytes = received.iter().find(|m| m.id == bytes_id).unwrap();
    assert_eq!(&bytes.payload[..], &[0, 159, 146, 150]);
    assert_eq!((bytes.key.clone(), bytes.headers.len()), (None, 0));
    // The rolled-back row never existed.
    assert_eq!(db.count("pending").await + db.count("dead").await, 0);
    db.drop().await;
}
