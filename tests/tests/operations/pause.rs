//! Pause and resume: held in the database, obeyed by every replica, kept across a restart.

use std::time::Duration;

use tonic_health::pb::health_check_response::ServingStatus;
use txoutbox_proto::v1;
use txoutbox_tests::{eventually, OutboxDb, Server, Subscriber, DEADLINE};

use crate::cli_client::{json, stdout, txoutbox};

/// A unary claim on `server`: `(ids, paused)`.
async fn claim(server: &Server, worker: &str) -> (Vec<i64>, bool) {
    let claimed = claim_topics(server, worker, &[]).await;
    let ids = claimed.messages.iter().map(|m| m.id).collect();
    (ids, claimed.paused)
}

async fn claim_topics(server: &Server, worker: &str, topics: &[&str]) -> v1::ClaimResponse {
    server
        .relay()
        .await
        .claim(v1::ClaimRequest {
            outbox: "orders".into(),
            worker_id: worker.into(),
            batch_size: 10,
            lease_ms: 0,
            topics: topics.iter().map(|t| t.to_string()).collect(),
        })
        .await
        .unwrap()
        .into_inner()
}

/// The topics `server` lists as paused for the outbox.
async fn listed_paused_topics(server: &Server) -> Vec<String> {
    let listed = server
        .admin()
        .await
        .list_outboxes(v1::ListOutboxesRequest {})
        .await
        .unwrap()
        .into_inner();
    let topics = &listed.outboxes[0].paused_topics;
    topics.iter().map(|t| t.topic.clone()).collect()
}

async fn listed_paused(server: &Server) -> bool {
    let listed = server
        .admin()
        .await
        .list_outboxes(v1::ListOutboxesRequest {})
        .await
        .unwrap()
        .into_inner();
    listed.outboxes[0].paused_since.is_some()
}

/// Replica `b` pauses; replica `a`, whose stream stays open, stops handing out rows; a
/// restarted `b` still sees the pause; resumed through it, `a`'s stream gets the row.
pub async fn a_pause_holds_on_every_replica_and_across_a_restart(db: impl OutboxDb) {
    let config = db.config("");
    let a = Server::start_serving(&config).await;
    let b = Server::start_serving(&config).await;
    let mut stream = Subscriber::open(&a, "stream", 10, 0).await;

    let paused = b
        .admin()
        .await
        .pause(v1::PauseRequest {
            outbox: "orders".into(),
            topics: vec![],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(paused.paused_since.is_some());
    eventually("replica a to see the pause", DEADLINE, || async {
        claim(&a, "w").await.1.then_some(())
    })
    .await;
    let row = db.insert("t", Some("k"), b"held").await;
    assert_eq!(claim(&a, "w").await, (vec![], true));
    assert_eq!(claim(&b, "w").await, (vec![], true));
    assert!(
        stream.nothing_within(Duration::from_secs(2)).await,
        "a paused outbox hands out nothing on an open stream"
    );
    assert!(listed_paused(&a).await);
    assert_eq!(
        a.health("orders").await,
        ServingStatus::Serving,
        "paused is not broken"
    );

    // A restart keeps the pause: it is in the database.
    b.kill();
    drop(b);
    let b = Server::start_serving(&config).await;
    assert!(listed_paused(&b).await);
    assert_eq!(claim(&b, "w").await, (vec![], true));

    // Resumed through the new replica: the open stream on `a` gets the row.
    let resumed = b
        .admin()
        .await
        .resume(v1::ResumeRequest {
            outbox: "orders".into(),
            topics: vec![],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(resumed.paused_since.is_none());
    let got = stream.take(1).await;
    assert_eq!(got[0].id, row);
    stream.ack(&[row]).await;
    assert!(!listed_paused(&a).await);
    assert_eq!(claim(&b, "w").await, (vec![], false));
    db.drop().await;
}

pub async fn the_command_line_pauses_shows_it_and_resumes(db: impl OutboxDb) {
    let server = Server::start_serving(&db.config("")).await;
    let url = server.url();
    let paused = txoutbox(&url, &["pause"]).await;
    assert!(paused.status.success());
    assert!(
        stdout(&paused).contains("outbox orders is paused"),
        "{}",
        stdout(&paused)
    );
    let again = json(&txoutbox(&url, &["--format", "json", "pause"]).await);
    assert!(again["paused_since"].is_string(), "idempotent: {again}");
    let stats = txoutbox(&url, &["stats"]).await;
    assert!(
        stdout(&stats).contains("PAUSED since"),
        "{}",
        stdout(&stats)
    );
    let resumed = txoutbox(&url, &["resume"]).await;
    assert!(stdout(&resumed).contains("outbox orders is running"));
    let stats = json(&txoutbox(&url, &["--format", "json", "stats"]).await);
    assert!(stats["paused_since"].is_null());
    server.wait_for_log("\"action\":\"pause\"").await;
    db.drop().await;
}

/// Replica `b` pauses topic `paused`; replica `a`'s open stream keeps getting the other
/// topics' rows, never the paused topic's, and a key whose next row is of the paused
/// topic waits with it; a unary claim of the paused topic only says paused. A restarted
/// `b` still lists the pause; resumed through it, `a`'s stream gets the held rows in id
/// order.
pub async fn a_topic_pause_holds_on_every_replica_and_across_a_restart(db: impl OutboxDb) {
    let config = db.config("");
    let a = Server::start_serving(&config).await;
    let b = Server::start_serving(&config).await;
    let mut stream = Subscriber::open(&a, "stream", 10, 0).await;
    let paused = b
        .admin()
        .await
        .pause(v1::PauseRequest {
            outbox: "orders".into(),
            topics: vec!["paused".into()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(paused.paused_since.is_none(), "the outbox itself runs");
    assert_eq!(paused.paused_topics[0].topic, "paused");
    eventually("replica a to see the topic pause", DEADLINE, || async {
        claim_topics(&a, "w", &["paused"])
            .await
            .paused
            .then_some(())
    })
    .await;

    let held = db.insert("paused", Some("k"), b"held").await;
    let behind = db.insert("open", Some("k"), b"behind").await;
    let keyless = db.insert("paused", None, b"keyless").await;
    let flows = db.insert("open", Some("j"), b"flows").await;
    let got = stream.take(1).await;
    assert_eq!(got[0].id, flows, "other keys and topics flow");
    stream.ack(&[flows]).await;
    assert!(
        stream.nothing_within(Duration::from_secs(2)).await,
        "the paused topic's rows, and k's row behind one, wait"
    );
    let unary = claim_topics(&b, "w", &["paused"]).await;
    assert!(unary.messages.is_empty() && unary.paused);
    assert_eq!(unary.paused_topics, ["paused"]);
    assert_eq!(listed_paused_topics(&a).await, ["paused"]);
    assert_eq!(a.health("orders").await, ServingStatus::Serving);

    b.kill();
    drop(b);
    let b = Server::start_serving(&config).await;
    assert_eq!(listed_paused_topics(&b).await, ["paused"]);
    assert!(claim_topics(&b, "w", &["paused"]).await.paused);

    let resumed = b
        .admin()
        .await
        .resume(v1::ResumeRequest {
            outbox: "orders".into(),
            topics: vec!["paused".into()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(resumed.paused_topics.is_empty());
    let mut ids = Vec::new();
    while ids.len() < 3 {
        let got = stream.take(1).await;
        stream.ack(&[got[0].id]).await;
        ids.push(got[0].id);
    }
    assert_eq!(ids, [held, behind, keyless], "in id order");
    assert!(listed_paused_topics(&a).await.is_empty());
    db.drop().await;
}

pub async fn the_command_line_pauses_a_topic_and_resumes_it(db: impl OutboxDb) {
    let server = Server::start_serving(&db.config("")).await;
    let url = server.url();
    let paused = txoutbox(&url, &["pause", "--topic", "orders.paid"]).await;
    assert!(paused.status.success());
    assert!(
        stdout(&paused).contains("outbox orders is running")
            && stdout(&paused).contains("topic orders.paid is paused"),
        "{}",
        stdout(&paused)
    );
    let stats = txoutbox(&url, &["stats"]).await;
    assert!(
        stdout(&stats).contains("topic orders.paid is paused"),
        "{}",
        stdout(&stats)
    );
    let stats = json(&txoutbox(&url, &["--format", "json", "stats"]).await);
    assert!(stats["paused_topics"]["orders.paid"].is_string(), "{stats}");
    let resumed = json(
        &txoutbox(
            &url,
            &["--format", "json", "resume", "--topic", "orders.paid"],
        )
        .await,
    );
    assert_eq!(resumed["paused_topics"], serde_json::json!({}), "{resumed}");
    server
        .wait_for_log("\"arguments\":\"topics=`orders.paid`\"")
        .await;
    db.drop().await;
}
