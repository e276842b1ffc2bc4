//! Subscribers: the streams connected to each replica, and every replica's lease holders
//! through the database, with real streams on two replicas.

use txoutbox_proto::v1;
use txoutbox_tests::{eventually, OutboxDb, Server, Subscriber, DEADLINE};

use crate::cli_client::{json, txoutbox};

async fn listed(server: &Server) -> v1::ListSubscribersResponse {
    server
        .admin()
        .await
        .list_subscribers(v1::ListSubscribersRequest {
            outbox: "orders".into(),
        })
        .await
        .unwrap()
        .into_inner()
}

/// A stream of `name` on `server` filtering on `topic`.
async fn open(server: &Server, name: &str, topic: &str) -> Subscriber {
    let open = v1::OpenSubscription {
        group: String::new(),
        outbox: "orders".into(),
        subscriber: name.into(),
        topics: vec![topic.into()],
        max_in_flight: 10,
        lease_ms: 0,
    };
    Subscriber::open_with(server, open)
        .await
        .expect("subscribe")
}

/// `alpha` on replica `a` acks one row, nacks one and holds two; `beta` on `b` holds one
/// (of a topic of its own, so `alpha` cannot take it). Each replica lists its own stream
/// with its counts; both list both lease holders.
pub async fn each_replica_lists_its_streams_and_every_lease_holder(db: impl OutboxDb) {
    let config = db.config("");
    let a = Server::start_serving(&config).await;
    let b = Server::start_serving(&config).await;
    let mut alpha = open(&a, "alpha", "t").await;
    for key in ["k1", "k2", "k3", "k4"] {
        db.insert("t", Some(key), b"p").await;
    }
    let got = alpha.take(4).await;
    alpha.ack(&[got[0].id]).await;
    alpha.nack(got[1].id, "broker busy", Some(60_000)).await;
    let mut beta = open(&b, "beta", "u").await;
    db.insert("u", Some("k5"), b"p").await;
    let held_by_beta = beta.take(1).await;

    let on_a = listed(&a).await;
    assert_eq!(on_a.connected.len(), 1, "only a's own stream: {on_a:?}");
    let stream = &on_a.connected[0];
    assert_eq!(stream.name, "alpha");
    assert_eq!(stream.owner, alpha.subscribed.owner);
    assert!(stream.peer.starts_with("127.0.0.1:"), "{}", stream.peer);
    assert_eq!(stream.identity, None, "auth is off");
    assert_eq!(stream.topics, ["t"]);
    assert_eq!((stream.window, stream.in_flight), (10, 2));
    assert_eq!((stream.acked, stream.nacked, stream.fenced), (1, 1, 0));
    assert!(stream.connected_since.is_some() && stream.last_answer.is_some());
    let on_b = listed(&b).await;
    assert_eq!(on_b.connected.len(), 1);
    assert_eq!(on_b.connected[0].name, "beta");
    assert_eq!(
        (on_b.connected[0].in_flight, on_b.connected[0].acked),
        (1, 0)
    );
    assert!(on_b.connected[0].last_answer.is_none());

    let holders = |listed: &v1::ListSubscribersResponse| -> Vec<(String, u64)> {
        let holders = listed.lease_holders.iter();
        holders.map(|h| (h.owner.clone(), h.rows)).collect()
    };
    let expected = vec![
        (alpha.subscribed.owner.clone(), 2),
        (beta.subscribed.owner.clone(), 1),
    ];
    assert_eq!(
        holders(&on_a),
        expected,
        "every replica's, from the database"
    );
    assert_eq!(holders(&on_b), expected);
    assert!(on_a.lease_holders[0].earliest_expiry.is_some());

    // A stream that ends is no longer listed, and its leases are given back.
    beta.ack(&[held_by_beta[0].id]).await;
    drop(beta);
    eventually("beta to leave b's list", DEADLINE, || async {
        listed(&b).await.connected.is_empty().then_some(())
    })
    .await;
    assert_eq!(holders(&listed(&b).await), expected[..1]);
    drop(alpha);
    db.drop().await;
}

pub async fn the_command_line_lists_subscribers(db: impl OutboxDb) {
    let server = Server::start_serving(&db.config("")).await;
    let mut stream = Subscriber::open(&server, "gamma", 5, 0).await;
    let id = db.insert("t", Some("k"), b"p").await;
    assert_eq!(stream.take(1).await[0].id, id);
    let url = server.url();
    let table = txoutbox(&url, &["subscribers"]).await;
    assert!(table.status.success());
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.contains("gamma") && text.contains(&stream.subscribed.owner),
        "{text}"
    );
    let listed = json(&txoutbox(&url, &["--format", "json", "subscribers"]).await);
    assert_eq!(listed["connected"][0]["name"], "gamma", "{listed}");
    assert_eq!(listed["connected"][0]["in_flight"], 1);
    assert_eq!(
        listed["lease_holders"][0]["owner"],
        stream.subscribed.owner.as_str()
    );
    assert_eq!(listed["lease_holders"][0]["rows"], 1);
    db.drop().await;
}
