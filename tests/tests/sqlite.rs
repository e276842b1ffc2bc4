//! The SQLite backend end to end: a real `txoutboxd` process on a SQLite file that test
//! code writes into from connections of its own, as a producer application would. Also
//! the embedded default: `txoutboxd` with no configuration at all.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use txoutbox_proto::v1::OpenSubscription;
use txoutbox_tests::journal::{publish_loop, Journal};
use txoutbox_tests::{eventually, Server, SqliteDb, Subscriber, DEADLINE};

/// The producer application writes into the file while the server claims from it: each of
/// its transactions holds the write lock for a while (several inserts and a pause), and
/// the relay waits for it, then delivers every committed row, per key in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_writing_in_its_own_transactions_while_the_server_claims() {
    let (transactions, per_transaction) = (20, 5);
    let db = SqliteDb::new().await;
    let server = Server::start_serving(&db.config("max_batch_size = 10")).await;
    let journal = Arc::new(Mutex::new(Journal::default()));
    let total = transactions * per_transaction;
    let mut subscribers = Vec::new();
    for i in 0..2 {
        let sub = Subscriber::open(&server, &format!("sub{i}"), 8, 0).await;
        subscribers.push(tokio::spawn(publish_loop(
            sub,
            Arc::clone(&journal),
            0.1,
            total,
        )));
    }

    for t in 0..transactions {
        let mut tx = db.pool().begin().await.unwrap();
        for i in 0..per_transaction {
            let seq = t * per_transaction + i;
            let key = format!("k{}", seq % 3);
            sqlx::query("INSERT INTO outbox (topic, key, payload) VALUES ('t', ?1, ?2)")
                .bind(&key)
                .bind(format!("{key}:{}", seq / 3).into_bytes())
                .execute(&mut *tx)
                .await
                .unwrap();
        }
        // Hold the write lock while the subscribers' claims wait for it.
        tokio::time::sleep(Duration::from_millis(20)).await;
        if t % 7 == 3 {
            tx.rollback().await.unwrap(); // never delivered
        } else {
            tx.commit().await.unwrap();
        }
    }
    let committed = total - (0..transactions).filter(|t| t % 7 == 3).count() * per_transaction;

    tokio::time::timeout(DEADLINE * 2, async {
        while journal.lock().unwrap().published.len() < committed {
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    })
    .await
    .expect("every committed row delivered");
    // A publish is journalled before its ack is sent: the subscribers keep running until
    // the last acks are applied.
    eventually("every delivered row acked", DEADLINE, || async {
        (db.count("done").await == committed as i64).then_some(())
    })
    .await;
    for subscriber in &subscribers {
        subscriber.abort();
    }
    check_committed_rows_in_order(&journal.lock().unwrap(), total, per_transaction);
    assert_eq!(db.count("done").await, committed as i64);
    db.drop().await;
}

/// Per key, the committed sequence numbers in order, each once; nothing leased twice.
/// Row `seq` is `k{seq % 3}:{seq / 3}`; transactions `t % 7 == 3` were rolled back.
fn check_committed_rows_in_order(journal: &Journal, total: usize, per_transaction: usize) {
    assert!(
        journal.double_leases.is_empty(),
        "{:?}",
        journal.double_leases
    );
    for k in 0..3 {
        let key = format!("k{k}");
        let published: Vec<u32> = journal
            .published
            .iter()
            .filter(|(k, _)| *k == key)
            .map(|(_, seq)| *seq)
            .collect();
        let expected: Vec<u32> = (0..total)
            .filter(|seq| seq % 3 == k && (seq / per_transaction) % 7 != 3)
            .map(|seq| (seq / 3) as u32)
            .collect();
        assert_eq!(published, expected, "key {key}");
    }
}

/// `txoutboxd` with no configuration at all, in an empty directory: it serves the embedded
/// default, creates `./txoutbox.db`, says so in one line with how to try it, and delivers
/// a row that another connection inserted.
#[tokio::test]
async fn with_no_configuration_it_serves_a_sqlite_outbox_in_the_working_directory() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("txoutbox.db");
    let server = Server::start_embedded(dir.path()).await;
    server.wait_serving("default").await;
    assert!(file.exists(), "the file is created on first start");

    let announcements: Vec<String> = server
        .log
        .lock()
        .unwrap()
        .iter()
        .filter(|line| line.contains("embedded default"))
        .cloned()
        .collect();
    assert_eq!(announcements.len(), 1, "{announcements:?}");
    let line: serde_json::Value = serde_json::from_str(&announcements[0]).unwrap();
    assert_eq!(line["level"], "INFO");
    let fields = &line["fields"];
    assert_eq!(fields["file"], "txoutbox.db");
    assert_eq!(fields["created"], true);
    assert_eq!(
        fields["insert"],
        r#"sqlite3 txoutbox.db "INSERT INTO outbox (topic, payload) VALUES ('demo', 'hello')""#
    );
    let subscribe = fields["subscribe"].as_str().unwrap();
    assert!(
        subscribe.contains(&format!("--server {} --outbox default", server.address)),
        "{subscribe}"
    );

    // The producer: another connection, its own transaction.
    let db = SqliteDb::at(&file);
    let id = db.insert("demo", None, b"hello").await;
    let mut sub = Subscriber::open_with(
        &server,
        OpenSubscription {
            group: String::new(),
            outbox: "default".into(),
            subscriber: "newcomer".into(),
            topics: vec![],
            max_in_flight: 10,
            lease_ms: 0,
        },
    )
    .await
    .expect("subscribe to the default outbox");
    let got = sub.take(1).await;
    assert_eq!((got[0].id, got[0].payload.as_slice()), (id, &b"hello"[..]));
    assert_eq!(sub.ack(&[id]).await.acked, [id]);
    assert_eq!(db.row(id).await.0, "done");
    db.drop().await;
}
