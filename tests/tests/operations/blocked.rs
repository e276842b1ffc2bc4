//! Blocked keys: a key stuck behind a row a subscriber holds, found with its holder.

use txoutbox_proto::v1;
use txoutbox_tests::{OutboxDb, Server, Subscriber};

use crate::cli_client::{json, txoutbox};

/// The first page of the blocked keys of `orders`.
pub async fn first_page(server: &Server) -> v1::ListBlockedKeysResponse {
    server
        .admin()
        .await
        .list_blocked_keys(v1::ListBlockedKeysRequest {
            outbox: "orders".into(),
            after_id: 0,
            limit: 0,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
}

pub async fn a_stuck_key_is_found_with_its_holder(db: impl OutboxDb) {
    let server = Server::start_serving(&db.config("")).await;
    let head = db.insert("t", Some("stuck"), b"1").await;
    db.insert("t", Some("stuck"), b"2").await;
    db.insert("t", Some("stuck"), b"3").await;
    // Window 1: the stream holds the head, the rows behind it wait.
    let mut sub = Subscriber::open(&server, "slow-consumer", 1, 0).await;
    assert_eq!(sub.take(1).await[0].id, head);
    let owner = sub.subscribed.owner.clone();

    let listed = first_page(&server).await;
    assert_eq!(listed.keys.len(), 1);
    let key = &listed.keys[0];
    assert_eq!(
        (key.key.as_str(), key.head_id, key.state.as_str()),
        ("stuck", head, "leased")
    );
    assert_eq!(key.owner.as_deref(), Some(owner.as_str()));
    assert_eq!((key.attempts, key.waiting_behind), (1, 2));
    assert_eq!(listed.next_after_id, 0);

    let printed = json(&txoutbox(&server.url(), &["--format", "json", "blocked"]).await);
    assert_eq!(printed["keys"][0]["key"], "stuck");
    assert_eq!(printed["keys"][0]["owner"], owner.as_str());
    assert_eq!(printed["keys"][0]["waiting_behind"], 2);

    sub.ack(&[head]).await;
    let next = sub.take(1).await;
    assert_eq!(next[0].key.as_deref(), Some("stuck"));
    db.drop().await;
}
