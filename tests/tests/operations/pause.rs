//! Pause and resume: held in the database, obeyed by every replica, kept across a restart.

use std::time::Duration;

use tonic_health::pb::health_check_response::ServingStatus;
use txoutbox_proto::v1;
use txoutbox_tests::{eventually, OutboxDb, Server, Subscriber, DEADLINE};

use crate::cli_client::{json, stdout, txoutbox};

/// A unary claim on `server`: `(ids, paused)`.
async fn claim(server: &Server, worker: &str) -> (Vec<i64>, bool) {
    let claimed = server
        .relay()
        .await
        .claim(v1::ClaimRequest {
            outbox: "orders".into(),
            worker_id: worker.into(),
            batch_size: 10,
            lease_ms: 0,
            topics: vec![],
        })
        .await
        .unwrap()
        .into_inner();
    let ids = claimed.messages.iter().map(|m| m.id).collect();
    (ids, claimed.paused)
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
    eventually("the pause audited", DEADLINE, || async {
        server.log_contains("\"action\":\"pause\"").then_some(())
    })
    .await;
    db.drop().await;
}
