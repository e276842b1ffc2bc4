//! A publish that runs longer than the lease keeps its lease (the runtime extends it), so
//! no other subscriber gets the message; with extension turned off it is redelivered.
use std::sync::{Arc, Mutex};
use std::time::Duration;

use txoutbox_client::{Message, PublishError, Subscriber, SubscriberHandle};
use txoutbox_tests::{eventually, Server, TestDb, DEADLINE};

/// (subscriber, message id, attempts) of every publish started.
type Deliveries = Arc<Mutex<Vec<(&'static str, i64, u32)>>>;

/// A subscriber named `name` with a 1s lease, whose first publish of a `slow` payload
/// takes 3s.
fn spawn(
    server: &Server,
    name: &'static str,
    deliveries: &Deliveries,
    extend: bool,
) -> SubscriberHandle {
    let deliveries = Arc::clone(deliveries);
    let publisher = move |message: Message| {
        let deliveries = Arc::clone(&deliveries);
        async move {
            deliveries
                .lock()
                .unwrap()
                .push((name, message.id, message.attempts));
            if &message.payload[..] == b"slow" && message.attempts == 1 {
                tokio::time::sleep(Duration::from_secs(3)).await;
            }
            Ok::<_, PublishError>(())
        }
    };
    let mut builder = Subscriber::builder([server.url()], "orders")
        .name(name)
        .lease(Duration::from_secs(1))
        .publish_timeout(Duration::from_secs(10));
    if !extend {
        builder = builder.max_lease_extension(Duration::ZERO);
    }
    builder.build(publisher).unwrap().spawn()
}

async fn wait_delivered(deliveries: &Deliveries, id: i64) {
    eventually("the slow publish to start", DEADLINE, || async {
        deliveries
            .lock()
            .unwrap()
            .iter()
            .any(|(_, delivered, _)| *delivered == id)
            .then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_publish_keeps_its_lease_and_is_not_redelivered() {
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let slow = db.insert("t", Some("k"), b"slow").await;
    let next = db.insert("t", Some("k"), b"next").await;
    let deliveries: Deliveries = Arc::default();

    let first = spawn(&server, "first", &deliveries, true);
    wait_delivered(&deliveries, slow).await;
    // A second subscriber, hungry for work, while the slow publish outlives its lease.
    let second = spawn(&server, "second", &deliveries, true);

    eventually("both messages delivered", DEADLINE, || async {
        (db.count("done").await == 2).then_some(())
    })
    .await;
    // Leave time for a wrong redelivery to show up.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let seen = deliveries.lock().unwrap().clone();
    assert_eq!(seen, [("first", slow, 1), ("first", next, 1)]);
    assert_eq!(db.row(slow).await.1, 1, "one attempt only");
    let totals = first.counters().snapshot();
    assert!(totals.lease_extensions >= 2, "{totals:?}");
    assert_eq!(totals.lease_lost, 0);
    first.stop().await.unwrap();
    second.stop().await.unwrap();
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_extension_the_lease_runs_out_and_the_message_is_redelivered() {
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let slow = db.insert("t", Some("k"), b"slow").await;
    let deliveries: Deliveries = Arc::default();

    let first = spawn(&server, "first", &deliveries, false);
    wait_delivered(&deliveries, slow).await;
    let second = spawn(&server, "second", &deliveries, true);

    // Either subscriber may claim it again once the lease has run out.
    eventually("the redelivery", DEADLINE, || async {
        deliveries
            .lock()
            .unwrap()
            .iter()
            .any(|(_, id, attempts)| (*id, *attempts) == (slow, 2))
            .then_some(())
    })
    .await;
    eventually("the message delivered", DEADLINE, || async {
        (db.count("done").await == 1).then_some(())
    })
    .await;
    assert_eq!(first.counters().snapshot().lease_lost, 1);
    first.stop().await.unwrap();
    second.stop().await.unwrap();
    db.drop().await;
}
