//! What `Stats` adds for an operator: rows waiting for a retry, rows delivered in the
//! last minute, answers fenced.

use txoutbox_proto::v1;
use txoutbox_tests::{OutboxDb, Server};

use crate::cli_client::{json, txoutbox};

pub async fn stats_count_retry_waiting_throughput_and_fenced_answers(db: impl OutboxDb) {
    let server = Server::start_serving(&db.config("backoff.jitter = 0.0")).await;
    let a = db.insert("t", None, b"a").await;
    let b = db.insert("t", None, b"b").await;
    let c = db.insert("t", None, b"c").await;
    let mut relay = server.relay().await;
    let claimed = relay
        .claim(v1::ClaimRequest {
            outbox: "orders".into(),
            worker_id: "w1".into(),
            batch_size: 10,
            lease_ms: 0,
            topics: vec![],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(claimed.messages.len(), 3);
    let ack = |worker: &str, id: i64| v1::AckRequest {
        outbox: "orders".into(),
        worker_id: worker.into(),
        ids: vec![id],
        lease_tokens: Default::default(),
    };
    assert_eq!(
        relay.ack(ack("w1", a)).await.unwrap().into_inner().acked,
        [a]
    );
    let nacked = relay
        .nack(v1::NackRequest {
            outbox: "orders".into(),
            worker_id: "w1".into(),
            id: b,
            error: "broker busy".into(),
            retry_delay_ms: Some(60_000),
            lease_token: Default::default(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(nacked.retry_at.is_some());
    let stale = relay.ack(ack("w2", c)).await.unwrap().into_inner();
    assert_eq!(stale.fenced, [c]);

    let stats = server
        .admin()
        .await
        .stats(v1::StatsRequest {
            outbox: "orders".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let total = stats.total.unwrap();
    assert_eq!(
        (total.pending, total.leased, total.retry_waiting),
        (2, 1, 1)
    );
    assert_eq!(stats.delivered_last_minute, Some(1));
    assert_eq!(stats.fenced_answers, 1);

    let printed = json(&txoutbox(&server.url(), &["--format", "json", "stats"]).await);
    assert_eq!(printed["total"]["retry_waiting"], 1);
    assert_eq!(printed["delivered_last_minute"], 1);
    assert_eq!(printed["fenced_answers"], 1);
    db.drop().await;
}
