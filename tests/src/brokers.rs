//! Helpers of the broker tests (`broker_*`, `cli_relay`): rows of several keys written by
//! the producer helpers, subscribers sharing one publisher, a broker outage under
//! subscribers in-process ([`outage`]) or under `txoutbox relay` ([`relay_outage`]),
//! names unique to a test, and the check that what reached a broker is complete and in
//! order per key.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use txoutbox_client::producer::{NewMessage, OutboxTable};
use txoutbox_client::{Publisher, Subscriber, SubscriberHandle};

use crate::{eventually, relay_cli, Server, TcpProxy, TestDb, DEADLINE};

/// An outbox that retries quickly and long enough that an outage dead-letters nothing.
pub const QUICK_RETRIES: &str = r#"
max_attempts = 100
backoff = { base = "200ms", factor = 1.5, maximum = "1s", jitter = 0.1 }
"#;

/// Keys and messages per key of [`outage`].
pub const OUTAGE_KEYS: usize = 4;
pub const OUTAGE_PER_KEY: u32 = 6;

/// How [`outage`] breaks the link to the broker.
#[derive(Debug, Clone, Copy)]
pub enum Cut {
    /// Connections reset and refused: the broker went down.
    Reset,
    /// Not a byte passes, connections stay open: a partition.
    BlackHole,
}

/// A broker outage in the middle of a run, through `proxy`: two subscribers publish the
/// first half of the rows (topic `topic`); the link is cut; the second half is inserted
/// and nacked (nothing delivered while the link is down); the link comes back and every
/// row is delivered. Returns the ids, for the caller to read the broker back.
pub async fn outage(
    db: &TestDb,
    server: &Server,
    proxy: &TcpProxy,
    cut: Cut,
    topic: &str,
    publisher: Arc<dyn Publisher>,
) -> Vec<i64> {
    let half = OUTAGE_PER_KEY / 2;
    let handles = spawn_subscribers(server, 2, publisher);
    let mut ids = insert_keyed_range(db, topic, OUTAGE_KEYS, 0..half).await;
    eventually("the first half delivered", DEADLINE, || async {
        (db.count("done").await == ids.len() as i64).then_some(())
    })
    .await;

    match cut {
        Cut::Reset => proxy.reset(),
        Cut::BlackHole => proxy.black_hole(),
    }
    let done_before = ids.len() as i64;
    ids.extend(insert_keyed_range(db, topic, OUTAGE_KEYS, half..OUTAGE_PER_KEY).await);
    let retried = || {
        handles
            .iter()
            .map(|h| h.counters().snapshot().retried)
            .sum::<u64>()
    };
    eventually("nacks while the link is cut", DEADLINE, || async {
        (retried() >= 3).then_some(())
    })
    .await;
    assert_eq!(
        db.count("done").await,
        done_before,
        "delivered while the link was cut"
    );

    proxy.restore();
    eventually(
        "every row delivered after the link is back",
        DEADLINE,
        || async { (db.count("done").await == ids.len() as i64).then_some(()) },
    )
    .await;
    let (_, dead) = stop_all(handles).await;
    assert_eq!(dead, 0, "dead-lettered during the outage");
    ids
}

/// The outage of [`outage`] for `txoutbox relay ARGS...` as a process (the command a user
/// runs): the relay publishes the first half of the rows (topic `topic`); `cut` breaks
/// the broker (a proxy's link, or the broker itself stopped); the second half is nacked
/// with the broker's error (`last_error` starting with `broker_error`; the rows stay
/// pending, none dead, nothing delivered); `restore` brings the broker back and every
/// row is done. The relay then stops on SIGTERM with exit code 0. Returns the ids.
pub async fn relay_outage(
    db: &TestDb,
    server: &Server,
    topic: &str,
    args: &[&str],
    broker_error: &str,
    cut: impl AsyncFnOnce(),
    restore: impl AsyncFnOnce(),
) -> Vec<i64> {
    relay_outage_with_env(db, server, topic, args, &[], broker_error, cut, restore).await
}

/// [`relay_outage`] with these environment variables set for the relay.
#[allow(clippy::too_many_arguments)] // relay_outage's, and the environment
pub async fn relay_outage_with_env(
    db: &TestDb,
    server: &Server,
    topic: &str,
    args: &[&str],
    env: &[(&str, &str)],
    broker_error: &str,
    cut: impl AsyncFnOnce(),
    restore: impl AsyncFnOnce(),
) -> Vec<i64> {
    let half = OUTAGE_PER_KEY / 2;
    let relay = relay_cli::spawn_with_env(server, args, env);
    let mut ids = insert_keyed_range(db, topic, OUTAGE_KEYS, 0..half).await;
    eventually("the first half relayed", DEADLINE, || async {
        (db.count("done").await == ids.len() as i64).then_some(())
    })
    .await;

    cut().await;
    let done_before = ids.len() as i64;
    let second = insert_keyed_range(db, topic, OUTAGE_KEYS, half..OUTAGE_PER_KEY).await;
    // Three nacks recorded with the broker's error: the relay keeps retrying, and says why.
    let nacks = eventually("the broker's error on nacked rows", DEADLINE, || async {
        let mut nacks = Vec::new();
        for id in &second {
            let (status, attempts, error) = db.row(*id).await;
            assert_ne!(status, "dead", "row {id} dead-lettered: {error:?}");
            if let Some(error) = error.filter(|_| status == "pending" && attempts > 0) {
                nacks.extend(std::iter::repeat_n(error, attempts as usize));
            }
        }
        (nacks.len() >= 3).then_some(nacks)
    })
    .await;
    for error in &nacks {
        assert!(error.starts_with(broker_error), "{error}");
    }
    assert_eq!(db.count("dead").await, 0, "dead-lettered during the outage");
    assert_eq!(
        db.count("done").await,
        done_before,
        "relayed while the broker was away"
    );
    ids.extend(second);

    restore().await;
    eventually(
        "every row relayed after the broker is back",
        DEADLINE,
        || async { (db.count("done").await == ids.len() as i64).then_some(()) },
    )
    .await;
    assert_eq!(db.count("dead").await, 0, "dead-lettered after the outage");
    let status = relay_cli::stop(relay).await;
    assert_eq!(status.code(), Some(0), "the relay exited with {status}");
    ids
}

/// A name no other test uses, for broker resources (streams, exchanges, queues, keys):
/// `brokers_` and 12 hex digits.
pub fn unique_name() -> String {
    format!(
        "brokers_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

/// `keys` keys with `per_key` messages each, interleaved (k0:0, k1:0, ..., k0:1, ...),
/// inserted in one transaction with the producer helpers; payloads `key:seq`, header
/// `traceparent`. Returns the ids.
pub async fn insert_keyed(db: &TestDb, topic: &str, keys: usize, per_key: u32) -> Vec<i64> {
    insert_keyed_range(db, topic, keys, 0..per_key).await
}

/// Like [`insert_keyed`], for the sequence numbers `seqs` of each key.
pub async fn insert_keyed_range(
    db: &TestDb,
    topic: &str,
    keys: usize,
    seqs: std::ops::Range<u32>,
) -> Vec<i64> {
    let table = OutboxTable::in_schema(&db.schema, "outbox").unwrap();
    let mut tx = db.pool.begin().await.unwrap();
    let mut ids = Vec::new();
    for seq in seqs {
        for k in 0..keys {
            let message = NewMessage::new(topic, format!("k{k}:{seq}"))
                .key(format!("k{k}"))
                .header("traceparent", format!("00-trace-k{k}-{seq}"));
            ids.push(table.insert(&mut *tx, &message).await.unwrap());
        }
    }
    tx.commit().await.unwrap();
    ids
}

/// `count` subscribers of the outbox `orders` of `server`, sharing `publisher`, each
/// running in the background.
pub fn spawn_subscribers(
    server: &Server,
    count: usize,
    publisher: Arc<dyn Publisher>,
) -> Vec<SubscriberHandle> {
    (0..count)
        .map(|n| {
            Subscriber::builder([server.url()], "orders")
                .name(format!("broker-test-{n}"))
                .concurrency(4)
                .build_shared(Arc::clone(&publisher))
                .unwrap()
                .spawn()
        })
        .collect()
}

/// Stops every subscriber; returns how many nacks (retries) and dead-letters they made.
/// Counted after the stop: a row reads dead in the database before its settlement reaches
/// the subscriber's counters, and the stop waits for the settlements.
pub async fn stop_all(handles: Vec<SubscriberHandle>) -> (u64, u64) {
    let (mut retried, mut dead) = (0, 0);
    for handle in handles {
        let counters = handle.counters();
        handle.stop().await.unwrap();
        let totals = counters.snapshot();
        retried += totals.retried;
        dead += totals.dead_lettered;
    }
    (retried, dead)
}

/// One message as a broker holds it, in the broker's order.
#[derive(Debug, Clone)]
pub struct Delivered {
    pub id: i64,
    pub topic: String,
    pub key: Option<String>,
    pub payload: String,
    pub headers: BTreeMap<String, String>,
}

/// Every id of `ids` arrived; the fields match what [`insert_keyed`] wrote; and in the
/// broker's order each key's messages never went back (a redelivery may repeat the
/// message just written, at-least-once; never an earlier one after a later one).
pub fn assert_complete_and_in_order(delivered: &[Delivered], ids: &[i64], per_key: u32) {
    let got: BTreeSet<i64> = delivered.iter().map(|d| d.id).collect();
    let want: BTreeSet<i64> = ids.iter().copied().collect();
    assert_eq!(got, want, "lost or foreign messages");
    let mut by_key: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for message in delivered {
        let (key, seq) = message.payload.rsplit_once(':').expect("payload key:seq");
        assert_eq!(message.key.as_deref(), Some(key), "{message:?}");
        assert_eq!(
            message.headers.get("traceparent").map(String::as_str),
            Some(format!("00-trace-{key}-{seq}").as_str()),
            "{message:?}"
        );
        by_key
            .entry(key.to_owned())
            .or_default()
            .push(seq.parse().unwrap());
    }
    for (key, seqs) in by_key {
        assert!(
            seqs.windows(2).all(|w| w[0] <= w[1]),
            "key {key} went back: {seqs:?}"
        );
        let mut distinct = seqs.clone();
        distinct.dedup();
        assert_eq!(distinct, (0..per_key).collect::<Vec<_>>(), "key {key}");
    }
}
