//! The MySQL/MariaDB backend end to end, beyond the cases every backend runs (`e2e.rs`):
//! a real `txoutboxd` process on the machine's MariaDB (a fresh database per test, named
//! by a `mariadb://` URL) while a producer holds its own transaction open. No notify
//! channel: these outboxes poll.

use std::time::Duration;

use txoutbox_tests::{MariaDb, Server, Subscriber};

/// A producer's open transaction does not block the relay (its uncommitted row is skipped,
/// not waited for), the producer can keep inserting while the relay polls (READ COMMITTED
/// claims take no gap locks), and its rows are delivered once committed.
#[tokio::test]
async fn an_open_producer_transaction_neither_blocks_nor_is_blocked() {
    let db = MariaDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let mut producer = db.pool.begin().await.unwrap();
    let late: u64 = sqlx::query("INSERT INTO outbox (topic, payload) VALUES ('t', 'late')")
        .execute(&mut *producer)
        .await
        .unwrap()
        .last_insert_id();
    let early = db.insert("t", None, b"committed").await;

    let mut sub = Subscriber::open(&server, "e2e", 10, 0).await;
    let got = sub.take(1).await;
    assert_eq!(
        got[0].id, early,
        "the committed row, past the uncommitted one"
    );
    // While claims keep polling, the producer can still write and commit.
    let more: u64 = tokio::time::timeout(
        Duration::from_secs(5),
        sqlx::query("INSERT INTO outbox (topic, payload) VALUES ('t', 'more')")
            .execute(&mut *producer),
    )
    .await
    .expect("the producer's insert waited for the relay")
    .unwrap()
    .last_insert_id();
    producer.commit().await.unwrap();
    let got = sub.take(2).await;
    assert_eq!(
        got.iter().map(|m| m.id).collect::<Vec<_>>(),
        [late as i64, more as i64]
    );
    db.drop().await;
}
