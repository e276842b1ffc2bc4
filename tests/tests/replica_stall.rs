//! A replica cut off from PostgreSQL in the middle of its work (paused, or partitioned)
//! must stop no other replica and hold up no producer (docs/guarantees.md,
//! guarantees 9 and 10).
//!
//! One replica reaches the database through a [`PgLink`] that is cut right after it sent
//! a given statement; the cut lasts until the test ends. Each test then checks that the
//! database did not end the cut-off sessions (a session timeout would also free what they
//! hold, but only after a while; what is checked is that nothing waits for them at all).

use txoutbox_proto::v1::subscribe_request::Request as Req;
use txoutbox_proto::v1::{self, Message};
use txoutbox_tests::pg_link::PgLink;
use txoutbox_tests::{eventually, Server, Subscriber, TestDb, DEADLINE};

const POSTGRES: &str = "127.0.0.1:5432";

/// Whether each backend pid still has a session in the database.
async fn sessions_alive(db: &TestDb, pids: &[i32]) -> bool {
    let alive: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)")
            .bind(pids)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    alive == pids.len() as i64
}

/// A statement of the strict claim: the advisory lock, or the claim function that takes it.
fn claims(sql: &str) -> bool {
    sql.contains("pg_advisory_xact_lock") || sql.contains("_txo_claim_")
}

/// A statement that locks a key's head after an ack: the heads lock of a transaction, or
/// the function that moves heads on.
fn moves_heads(sql: &str) -> bool {
    (sql.contains("_heads") && sql.contains("FOR UPDATE")) || sql.contains("_txo_advance_")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_cut_off_inside_a_claim_stops_no_other_replica() {
    let db = TestDb::new().await;
    let link = PgLink::start(POSTGRES).await;
    let healthy = Server::start_serving(&db.config("")).await;
    let cut_off = Server::start_serving(&db.config_at(&link.url(&db.url), "")).await;
    let mut on_healthy = Subscriber::open(&healthy, "healthy", 1000, 0).await;
    let mut on_cut_off = Subscriber::open(&cut_off, "cut-off", 1000, 0).await;

    link.cut_after(claims);
    let mut inserted = 0;
    eventually("the cut-off replica claims", DEADLINE, || {
        inserted += 1;
        let key = format!("before-{inserted}");
        let (db, link) = (&db, &link);
        async move {
            db.insert("t", Some(&key), b"x").await;
            link.is_cut().then_some(())
        }
    })
    .await;
    let cut_sessions = link.pids();

    let mut fresh = Vec::new();
    for i in 0..20 {
        fresh.push(db.insert("t", Some(&format!("after-{i}")), b"y").await);
    }
    let mut delivered: Vec<Message> = Vec::new();
    while !fresh.iter().all(|id| delivered.iter().any(|m| m.id == *id)) {
        delivered.extend(on_healthy.take(1).await);
    }
    assert!(
        sessions_alive(&db, &cut_sessions).await,
        "the cut-off replica's sessions were ended: the other replica waited for that"
    );
    on_cut_off.close();
    drop((cut_off, link));
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_cut_off_inside_an_ack_holds_up_no_producer() {
    let db = TestDb::new().await;
    let link = PgLink::start(POSTGRES).await;
    let cut_off = Server::start_serving(&db.config_at(&link.url(&db.url), "")).await;
    let mut sub = Subscriber::open(&cut_off, "cut-off", 10, 0).await;
    let first = db.insert("t", Some("k"), b"1").await;
    assert_eq!(sub.take(1).await[0].id, first);

    link.cut_after(moves_heads);
    sub.send(Req::Ack(v1::AckMessages {
        ids: vec![first],
        lease_tokens: Default::default(),
    }))
    .await;
    link.until_cut().await;
    let cut_sessions = link.pids();

    // A producer writing the same key, in its own transaction.
    let second = tokio::time::timeout(DEADLINE, db.insert("t", Some("k"), b"2"))
        .await
        .expect("the producer's insert waited for the cut-off replica");
    assert!(second > first);
    assert!(
        sessions_alive(&db, &cut_sessions).await,
        "the cut-off replica's sessions were ended: the producer waited for that"
    );
    sub.close();
    drop((cut_off, link));
    db.drop().await;
}
