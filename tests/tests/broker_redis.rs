//! `RedisStreamPublisher` against the machine's Redis (127.0.0.1:6379), the whole path: a
//! real `txoutboxd` on PostgreSQL, the subscriber runtime, streams under a key prefix of
//! the test's own (deleted at the end), read back with XRANGE.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use txoutbox_client::redis_stream::redis::streams::StreamRangeReply;
use txoutbox_client::redis_stream::redis::{self, AsyncCommands};
use txoutbox_client::redis_stream::RedisStreamPublisher;
use txoutbox_tests::broker_process::BrokerProcess;
use txoutbox_tests::brokers::{
    assert_complete_and_in_order, insert_keyed, outage, relay_outage, spawn_subscribers, stop_all,
    unique_name, Cut, Delivered, OUTAGE_PER_KEY, QUICK_RETRIES,
};
use txoutbox_tests::relay_cli::relay_until_done;
use txoutbox_tests::{eventually, Server, TcpProxy, TestDb, DEADLINE};

const REDIS: &str = "127.0.0.1:6379";

/// The key prefix of a test, and a connection to read and clean up with.
struct TestKeys {
    prefix: String,
    connection: redis::aio::MultiplexedConnection,
}

impl TestKeys {
    /// On the machine's Redis.
    async fn new() -> Self {
        Self::at(REDIS).await
    }

    /// On the Redis at `address`.
    async fn at(address: &str) -> Self {
        let client = redis::Client::open(format!("redis://{address}")).unwrap();
        let connection = client
            .get_multiplexed_async_connection()
            .await
            .unwrap_or_else(|e| panic!("Redis at {address} (scripts/test starts it): {e}"));
        Self {
            prefix: format!("{}:", unique_name()),
            connection,
        }
    }

    /// Every entry of the stream of `topic`, in its order.
    async fn read(&mut self, topic: &str) -> Vec<Delivered> {
        let stream = format!("{}{topic}", self.prefix);
        let reply: StreamRangeReply = self.connection.xrange_all(&stream).await.unwrap();
        reply
            .ids
            .iter()
            .map(|entry| {
                let field = |name: &str| entry.get::<String>(name);
                let headers: BTreeMap<String, String> =
                    serde_json::from_str(&field("headers").unwrap()).unwrap();
                Delivered {
                    id: field("id").unwrap().parse().unwrap(),
                    topic: field("topic").unwrap(),
                    key: field("key"),
                    payload: field("payload").unwrap(),
                    headers,
                }
            })
            .collect()
    }

    async fn delete(mut self) {
        let keys: Vec<String> = self
            .connection
            .keys(format!("{}*", self.prefix))
            .await
            .unwrap();
        if !keys.is_empty() {
            let _: () = self.connection.del(keys).await.unwrap();
        }
    }
}

fn publisher(address: &str, keys: &TestKeys) -> Arc<RedisStreamPublisher> {
    Arc::new(
        RedisStreamPublisher::builder(format!("redis://{address}"))
            .topic_prefix(keys.prefix.clone())
            .response_timeout(Duration::from_secs(1))
            .build()
            .unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_subscribers_deliver_keys_headers_and_ids_in_order() {
    let mut keys = TestKeys::new().await;
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let ids = insert_keyed(&db, "orders.paid", 5, 8).await;

    let handles = spawn_subscribers(&server, 3, publisher(REDIS, &keys));
    eventually("every row delivered", DEADLINE, || async {
        (db.count("done").await == ids.len() as i64).then_some(())
    })
    .await;
    stop_all(handles).await;

    let delivered = keys.read("orders.paid").await;
    assert_complete_and_in_order(&delivered, &ids, 8);
    assert_eq!(delivered.len(), ids.len(), "duplicates without an outage");
    assert!(delivered.iter().all(|d| d.topic == "orders.paid"));
    keys.delete().await;
    db.drop().await;
}

async fn outage_test(cut: Cut) {
    let mut keys = TestKeys::new().await;
    let proxy = TcpProxy::start(REDIS).await;
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config(QUICK_RETRIES)).await;
    let redis = publisher(&proxy.address(), &keys);

    let ids = outage(&db, &server, &proxy, cut, "orders", redis).await;

    assert_complete_and_in_order(&keys.read("orders").await, &ids, OUTAGE_PER_KEY);
    let mut nacked = 0;
    for id in &ids {
        if let (_, _, Some(error)) = db.row(*id).await {
            assert!(error.starts_with("redis"), "{error}");
            nacked += 1;
        }
    }
    assert!(nacked > 0, "no row records the outage");
    keys.delete().await;
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_reset_mid_run_nacks_then_nothing_is_lost() {
    outage_test(Cut::Reset).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_link_black_holed_mid_run_nacks_then_nothing_is_lost() {
    outage_test(Cut::BlackHole).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_that_is_not_a_stream_dead_letters_and_max_len_trims() {
    let mut keys = TestKeys::new().await;
    let wrong = format!("{}wrongtype", keys.prefix);
    let _: () = keys.connection.set(&wrong, "a string").await.unwrap();
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config(QUICK_RETRIES)).await;
    let fine = db
        .insert_many("trimmed", &vec![(None, b"x".to_vec()); 300])
        .await;
    let bad = db.insert("wrongtype", None, b"nope").await;

    let redis = RedisStreamPublisher::builder(format!("redis://{REDIS}"))
        .topic_prefix(keys.prefix.clone())
        .max_len(10)
        .build()
        .unwrap();
    let handles = spawn_subscribers(&server, 1, Arc::new(redis));
    eventually("every row settled", DEADLINE, || async {
        (db.count("done").await + db.count("dead").await == 301).then_some(())
    })
    .await;
    let (retried, dead) = stop_all(handles).await;
    assert_eq!((retried, dead), (0, 1));
    let (status, attempts, error) = db.row(bad).await;
    assert_eq!((status.as_str(), attempts), ("dead", 1));
    assert!(error.unwrap().contains("WRONGTYPE"));
    // MAXLEN ~ trims whole macro nodes: about 10, never all 300.
    let length: usize = keys
        .connection
        .xlen(format!("{}trimmed", keys.prefix))
        .await
        .unwrap();
    assert!((10..fine.len()).contains(&length), "{length} entries");
    keys.delete().await;
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_redis_command_delivers_in_order_and_stops_on_sigterm() {
    let mut keys = TestKeys::new().await;
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let ids = insert_keyed(&db, "orders.paid", 4, 5).await;

    let url = format!("redis://{REDIS}");
    let args = [
        "--redis",
        &url,
        "--topic-prefix",
        &keys.prefix,
        "--max-len",
        "1000",
    ];
    let status = relay_until_done(&server, &db, ids.len(), &args).await;
    assert_eq!(status.code(), Some(0));

    assert_complete_and_in_order(&keys.read("orders.paid").await, &ids, 5);
    keys.delete().await;
    db.drop().await;
}

/// `txoutbox relay --redis` through a proxy whose link is reset mid-run: the rows are
/// nacked with the Redis error, then every entry is in its stream in key order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_redis_command_nacks_through_an_outage_then_nothing_is_lost() {
    let mut keys = TestKeys::new().await;
    let proxy = TcpProxy::start(REDIS).await;
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config(QUICK_RETRIES)).await;

    let url = format!("redis://{}", proxy.address());
    let prefix = keys.prefix.clone();
    let args = [
        "--redis",
        &url,
        "--topic-prefix",
        &prefix,
        "--delivery-timeout",
        "1s",
    ];
    let cut = async || proxy.reset();
    let restore = async || proxy.restore();
    let ids = relay_outage(&db, &server, "orders", &args, "redis", cut, restore).await;

    assert_complete_and_in_order(&keys.read("orders").await, &ids, OUTAGE_PER_KEY);
    keys.delete().await;
    db.drop().await;
}

/// A Redis of the test's own, with an append-only file, stopped (SIGTERM) under `txoutbox
/// relay --redis` and started again on the same port and directory: publishes meanwhile
/// are nacked with the Redis error, never dead-lettered; once it is back the relay
/// reconnects by itself and the stream holds every row in key order, the entries
/// written before the stop included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_server_restarted_mid_run_nacks_then_nothing_is_lost() {
    let redis = BrokerProcess::redis().await;
    let prefix = TestKeys::at(&redis.address()).await.prefix;
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config(QUICK_RETRIES)).await;

    let url = format!("redis://{}", redis.address());
    let args = [
        "--redis",
        &url,
        "--topic-prefix",
        &prefix,
        "--delivery-timeout",
        "1s",
    ];
    let cut = async || redis.stop().await;
    let restore = async || redis.start().await;
    let ids = relay_outage(&db, &server, "orders", &args, "redis", cut, restore).await;

    let mut keys = TestKeys::at(&redis.address()).await;
    keys.prefix = prefix;
    assert_complete_and_in_order(&keys.read("orders").await, &ids, OUTAGE_PER_KEY);
    db.drop().await;
}
