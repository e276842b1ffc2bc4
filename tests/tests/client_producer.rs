//! The producer helper writes outbox rows inside the caller's own transaction: rolled
//! back, nothing is delivered; committed, the row arrives as written.

use std::sync::{Arc, Mutex};

use txoutbox_client::producer::{NewMessage, OutboxTable};
use txoutbox_client::{Message, PublishError, Subscriber};
use txoutbox_tests::{eventually, MariaDb, Server, SqliteDb, TestDb, DEADLINE};

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

    let received = receive(&server, 2).await;
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
    assert_eq!(db.count("done").await, 2);
    assert_eq!(db.count("pending").await + db.count("dead").await, 0);
    db.drop().await;
}

/// Relays outbox `orders` of `server` until `expected` messages arrived, then stops.
async fn receive(server: &Server, expected: usize) -> Vec<Message> {
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
    eventually("the committed rows delivered", DEADLINE, || async {
        (received.lock().unwrap().len() >= expected).then_some(())
    })
    .await;
    handle.stop().await.unwrap();
    let received = received.lock().unwrap().clone();
    received
}

/// The same message on every backend: JSON payload, key, a header.
fn order_paid() -> NewMessage {
    NewMessage::json("orders.paid", &serde_json::json!({"order": 7}))
        .unwrap()
        .key("c7")
        .header(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        )
}

fn assert_order_paid(message: &Message) {
    assert_eq!(message.topic, "orders.paid");
    assert_eq!(message.key.as_deref(), Some("c7"));
    assert_eq!(message.payload_str().unwrap(), r#"{"order":7}"#);
    assert_eq!(
        message.headers["traceparent"],
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_rows_commit_and_roll_back_with_the_callers_transaction() {
    let db = SqliteDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let outbox = OutboxTable::new("outbox").unwrap();

    let mut tx = db.pool().begin().await.unwrap();
    outbox
        .insert_sqlite(&mut *tx, &NewMessage::new("orders.paid", "rolled back"))
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    let mut tx = db.pool().begin().await.unwrap();
    let id = outbox.insert_sqlite(&mut *tx, &order_paid()).await.unwrap();
    tx.commit().await.unwrap();

    let received = receive(&server, 1).await;
    assert_eq!(received.len(), 1, "{received:?}");
    assert_eq!(received[0].id, id);
    assert_order_paid(&received[0]);
    assert_eq!(
        db.count("pending").await,
        0,
        "the rolled-back row never existed"
    );
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_rows_commit_and_roll_back_with_the_callers_transaction() {
    let db = MariaDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let outbox = OutboxTable::in_schema(&db.database, "outbox").unwrap();

    let mut tx = db.pool.begin().await.unwrap();
    outbox
        .insert_mysql(&mut *tx, &NewMessage::new("orders.paid", "rolled back"))
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    let mut tx = db.pool.begin().await.unwrap();
    let id = outbox.insert_mysql(&mut *tx, &order_paid()).await.unwrap();
    tx.commit().await.unwrap();

    let received = receive(&server, 1).await;
    assert_eq!(received.len(), 1, "{received:?}");
    assert_eq!(received[0].id, id);
    assert_order_paid(&received[0]);
    assert_eq!(
        db.count("pending").await,
        0,
        "the rolled-back row never existed"
    );
    db.drop().await;
}
