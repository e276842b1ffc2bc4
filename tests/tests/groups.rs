//! Subscription groups end to end (docs/groups.md): a real `txoutboxd` on PostgreSQL and
//! SQLite, streams opened with a group, producers writing in transactions of their own.

use std::collections::BTreeMap;
use std::time::Duration;

use tonic::Code;
use txoutbox_proto::v1::{self, seek_group_request::To};
use txoutbox_tests::{eventually, Server, SqliteDb, Subscriber, TestDb, DEADLINE};

#[path = "groups/admin.rs"]
mod admin;
#[path = "groups/mapped.rs"]
mod mapped;

/// Two groups on the outbox `orders`, ordered by key, short leases (handovers are quick).
const GROUPS: &str = r#"
partitions = 4
[outboxes.orders.groups.kafka]
lease = "2s"
[outboxes.orders.groups.search]
lease = "2s"
"#;

fn open(group: &str, name: &str, window: u32) -> v1::OpenSubscription {
    v1::OpenSubscription {
        outbox: "orders".into(),
        subscriber: name.into(),
        topics: vec![],
        max_in_flight: window,
        lease_ms: 0,
        group: group.into(),
    }
}

async fn join(server: &Server, group: &str, name: &str, window: u32) -> Subscriber {
    Subscriber::open_with(server, open(group, name, window))
        .await
        .expect("subscribe to a group")
}

/// Waits until every partition of `group` has an owner and each stream named in
/// `subscribers` owns one.
async fn shared_by(server: &Server, group: &str, subscribers: &[&str]) {
    let admin = server.admin().await;
    eventually("the partitions shared by every stream", DEADLINE, || {
        let mut admin = admin.clone();
        async move {
            let stats = admin
                .stats(v1::StatsRequest {
                    outbox: "orders".into(),
                })
                .await
                .unwrap()
                .into_inner();
            let partitions = &stats.groups.iter().find(|g| g.group == group)?.partitions;
            let owner = |name: &str| {
                partitions
                    .iter()
                    .any(|p| p.owner.split(':').next() == Some(name))
            };
            let shared = partitions.iter().all(|p| !p.owner.is_empty())
                && subscribers.iter().all(|name| owner(name));
            shared.then_some(())
        }
    })
    .await
}

/// Takes `n` messages, acking each batch as it comes, and returns them in arrival order.
async fn drain(sub: &mut Subscriber, n: usize) -> Vec<v1::Message> {
    let mut got = Vec::new();
    tokio::time::timeout(DEADLINE, async {
        while got.len() < n {
            if sub.inbox.is_empty() {
                assert!(sub.pump().await.expect("stream error"), "stream ended");
                continue;
            }
            let batch: Vec<v1::Message> = sub.inbox.drain(..).collect();
            let ids: Vec<i64> = batch.iter().map(|m| m.id).collect();
            let settled = sub.ack(&ids).await;
            assert_eq!(settled.acked, ids, "every ack applies: {settled:?}");
            got.extend(batch);
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out with {} of {n} messages", got.len()));
    got
}

/// Per key, the payloads in the order they arrived.
fn by_key(messages: &[v1::Message]) -> BTreeMap<String, Vec<String>> {
    let mut keys: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for m in messages {
        keys.entry(m.key.clone().unwrap_or_default())
            .or_default()
            .push(String::from_utf8(m.payload.clone()).unwrap());
    }
    keys
}

async fn insert_keyed(db: &TestDb, keys: usize, per_key: usize) -> Vec<i64> {
    let rows: Vec<(Option<String>, Vec<u8>)> = (0..keys * per_key)
        .map(|i| {
            let key = format!("k{}", i % keys);
            (
                Some(key.clone()),
                format!("{key}:{:04}", i / keys).into_bytes(),
            )
        })
        .collect();
    db.insert_many("orders.created", &rows).await
}

fn in_order(keys: &BTreeMap<String, Vec<String>>) {
    for (key, payloads) in keys {
        let mut sorted = payloads.clone();
        sorted.sort();
        assert_eq!(payloads, &sorted, "key {key} out of order");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_groups_each_get_every_row_in_key_order_and_the_rows_are_never_written() {
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config(GROUPS)).await;
    let ids = insert_keyed(&db, 10, 20).await;
    let mut kafka = join(&server, "kafka", "to-kafka", 50).await;
    let mut search = join(&server, "search", "to-search", 7).await;
    let (a, b) = tokio::join!(drain(&mut kafka, ids.len()), drain(&mut search, ids.len()));
    for got in [&a, &b] {
        let mut seen: Vec<i64> = got.iter().map(|m| m.id).collect();
        seen.sort_unstable();
        assert_eq!(seen, ids, "each group gets every row once");
        in_order(&by_key(got));
    }
    // Nothing more comes; the producer's rows were never updated by the relay.
    assert!(kafka.nothing_within(Duration::from_millis(300)).await);
    assert_eq!(db.count("pending").await, ids.len() as i64);
    let untouched: i64 = sqlx::query_scalar(&format!(
        "SELECT count(*) FROM {}.outbox WHERE attempts = 0 AND leased_by IS NULL",
        db.schema
    ))
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(untouched, ids.len() as i64);
    // Both groups' positions are durable: Stats shows no lag.
    let mut admin = server.admin().await;
    let stats = eventually("both groups at the end", DEADLINE, || {
        let mut admin = admin.clone();
        async move {
            let stats = admin
                .stats(v1::StatsRequest {
                    outbox: "orders".into(),
                })
                .await
                .unwrap()
                .into_inner();
            stats
                .groups
                .iter()
                .all(|g| g.lag_rows == 0)
                .then_some(stats)
        }
    })
    .await;
    let names: Vec<&str> = stats.groups.iter().map(|g| g.group.as_str()).collect();
    assert_eq!(names, ["kafka", "search"]);
    assert_eq!(stats.groups[0].partitions.len(), 4);
    let listed = admin
        .list_outboxes(v1::ListOutboxesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.outboxes[0].groups, ["kafka", "search"]);
    db.drop().await;
}

/// Transaction A inserts a row of key k and stays open; B inserts a later row of k and
/// commits at once; A commits later. B did not wait for A, and the group delivers A's
/// row first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_committed_later_by_an_earlier_transaction_is_delivered_first_and_no_producer_waits()
{
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config(GROUPS)).await;
    let mut sub = join(&server, "kafka", "k", 10).await;
    let table = format!("{}.outbox", db.schema);
    let insert = format!("INSERT INTO {table} (topic, key, payload) VALUES ('t', 'k', $1)");
    let mut a = db.pool.begin().await.unwrap();
    sqlx::query(&insert)
        .bind(b"from-a".as_slice())
        .execute(&mut *a)
        .await
        .unwrap();
    let mut b = db.pool.begin().await.unwrap();
    // B's insert and commit must not wait for A: bounded well below A's lifetime.
    tokio::time::timeout(Duration::from_secs(10), async {
        sqlx::query(&insert)
            .bind(b"from-b".as_slice())
            .execute(&mut *b)
            .await
            .unwrap();
        b.commit().await.unwrap();
    })
    .await
    .expect("B's insert and commit did not wait for A");
    // B's row is committed, but an earlier transaction is open: nothing is delivered.
    assert!(sub.nothing_within(Duration::from_millis(1500)).await);
    let mut admin = server.admin().await;
    let stats = admin
        .stats(v1::StatsRequest {
            outbox: "orders".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        stats.frontier_delay.is_some(),
        "the frontier's delay is shown"
    );
    a.commit().await.unwrap();
    let got = drain(&mut sub, 2).await;
    let payloads: Vec<&[u8]> = got.iter().map(|m| m.payload.as_slice()).collect();
    assert_eq!(payloads, [b"from-a".as_slice(), b"from-b".as_slice()]);
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_key_holds_only_itself_and_resumes_in_order_after_its_retry() {
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config(GROUPS)).await;
    let mut sub = join(&server, "kafka", "k", 100).await;
    let first_a = db.insert("t", Some("a"), b"a:0").await;
    let first = sub.take(1).await;
    assert_eq!(first[0].id, first_a);
    let settled = sub.nack(first_a, "broker down", Some(1500)).await;
    assert_eq!(settled.retried, [first_a]);
    db.insert("t", Some("a"), b"a:1").await;
    let b = db.insert("t", Some("b"), b"b:0").await;
    // b flows while a waits for its retry.
    let next = sub.take(1).await;
    assert_eq!(next[0].id, b, "only key b goes on");
    sub.ack(&[b]).await;
    let mut admin = server.admin().await;
    let stats = admin
        .stats(v1::StatsRequest {
            outbox: "orders".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let kafka = &stats.groups[0];
    assert_eq!((kafka.retrying, kafka.held_keys), (1, 1), "{kafka:?}");
    // The retry comes (attempt 2), then a's later row.
    let retry = sub.take(1).await;
    assert_eq!((retry[0].id, retry[0].attempts), (first_a, 2));
    sub.ack(&[first_a]).await;
    let rest = sub.take(1).await;
    assert_eq!(rest[0].payload, b"a:1");
    sub.ack(&[rest[0].id]).await;
    // The other group never saw a failure: all three in order.
    let mut search = join(&server, "search", "s", 100).await;
    let all = drain(&mut search, 3).await;
    let payloads: Vec<&[u8]> = all.iter().map(|m| m.payload.as_slice()).collect();
    assert_eq!(payloads, [b"a:0".as_slice(), b"a:1", b"b:0"]);
    db.drop().await;
}

/// Two streams share a group's partitions; when one ends without answering, the other
/// gets its partitions and every row it held, within the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_ends_hands_its_partitions_and_unanswered_rows_to_the_other() {
    let db = TestDb::new().await;
    // Leases longer than the test: what moves here moves because the stream ended.
    let server = Server::start_serving(&db.config(&GROUPS.replace("2s", "60s"))).await;
    let mut one = join(&server, "kafka", "one", 1000).await;
    let mut two = join(&server, "kafka", "two", 1000).await;
    // Rows inserted while one stream still owned every partition would all go to it.
    shared_by(&server, "kafka", &["one", "two"]).await;
    // Fewer rows per stream than a batch, so each gets all of its own at once.
    let ids = insert_keyed(&db, 40, 2).await;
    // Both get rows (the partitions are shared), none twice.
    let (mut got_one, mut got_two) = (Vec::new(), Vec::new());
    tokio::time::timeout(DEADLINE, async {
        while got_one.len() + got_two.len() < ids.len() {
            tokio::select! {
                r = one.pump() => assert!(r.expect("stream error")),
                r = two.pump() => assert!(r.expect("stream error")),
            }
            got_one.extend(one.inbox.drain(..).map(|m| m.id));
            got_two.extend(two.inbox.drain(..).map(|m| m.id));
        }
    })
    .await
    .expect("every row reaches one of the streams");
    assert!(
        !got_one.is_empty() && !got_two.is_empty(),
        "the partitions are shared"
    );
    assert!(
        got_one.iter().all(|id| !got_two.contains(id)),
        "a row went to both streams"
    );
    // Two acks what it has; one goes away without answering.
    two.ack(&got_two).await;
    one.close();
    drop(one);
    let rest = drain(&mut two, got_one.len()).await;
    let mut again: Vec<i64> = rest.iter().map(|m| m.id).collect();
    again.sort_unstable();
    got_one.sort_unstable();
    assert_eq!(
        again, got_one,
        "every row the first stream held came to the second"
    );
    assert!(
        rest.iter().all(|m| m.attempts == 2),
        "their first delivery counts"
    );
    db.drop().await;
}

/// Pumps until messages come, and returns them unanswered.
async fn received(sub: &mut Subscriber) -> Vec<i64> {
    tokio::time::timeout(DEADLINE, async {
        while sub.inbox.is_empty() {
            assert!(sub.pump().await.expect("stream error"), "stream ended");
        }
    })
    .await
    .expect("messages within the deadline");
    sub.inbox.drain(..).map(|m| m.id).collect()
}

/// A row waits behind its key's row in flight while a row of another key, sent after it,
/// is acked: the written position stays before the waiting row. A partition handed over
/// then must send that row and see it settled first, or its next owner would read from
/// that position and deliver the acked row again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_handed_over_behind_a_waiting_row_delivers_nothing_twice() {
    let db = TestDb::new().await;
    let config = GROUPS
        .replace("2s", "60s")
        .replace("partitions = 4", "partitions = 1");
    let server = Server::start_serving(&db.config(&config)).await;
    // Live members take the partitions in the order of their ids, which start with the
    // subscriber's name: the one partition is first's until second joins.
    let mut first = join(&server, "kafka", "z-first", 100).await;
    shared_by(&server, "kafka", &["z-first"]).await;
    let a1 = db
        .insert_many("orders.created", &[(Some("a".into()), b"a1".to_vec())])
        .await;
    assert_eq!(received(&mut first).await, a1);
    let later = db
        .insert_many(
            "orders.created",
            &[
                (Some("a".into()), b"a2".to_vec()),
                (Some("b".into()), b"b1".to_vec()),
            ],
        )
        .await;
    let (a2, b1) = (later[0], later[1]);
    assert_eq!(received(&mut first).await, vec![b1], "a2 waits behind a1");
    assert_eq!(first.ack(&[b1]).await.acked, vec![b1]);

    let second = join(&server, "kafka", "a-second", 100).await;
    server.wait_for_log("handing the partition over").await;
    assert_eq!(first.ack(&a1).await.acked, a1);
    // From here both streams ack whatever comes, until the second gets a row inserted
    // once it owns the partition.
    let (tx, mut deliveries) = tokio::sync::mpsc::unbounded_channel();
    let streams = [("first", first), ("second", second)].map(|(name, mut sub)| {
        let tx = tx.clone();
        tokio::spawn(async move {
            loop {
                let ids = received(&mut sub).await;
                for id in &ids {
                    let _ = tx.send((name, *id));
                }
                sub.ack(&ids).await;
            }
        })
    });
    shared_by(&server, "kafka", &["a-second"]).await;
    let c1 = db
        .insert_many("orders.created", &[(Some("c".into()), b"c1".to_vec())])
        .await;
    let mut got = Vec::new();
    tokio::time::timeout(DEADLINE, async {
        while !got.contains(&("second", c1[0])) {
            got.push(deliveries.recv().await.expect("the streams run"));
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the second stream never got the new row: {got:?}"));
    for stream in streams {
        stream.abort();
    }
    assert_eq!(
        got,
        vec![("first", a2), ("second", c1[0])],
        "the waiting row went before the hand-over, and nothing came twice"
    );
    db.drop().await;
}

/// A seek takes the partitions from their owner: answers it sends afterwards for rows
/// it held are fenced, and the group delivers again from the new place, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seek_fences_the_owner_and_replays_in_order() {
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config(GROUPS)).await;
    let ids = insert_keyed(&db, 3, 4).await;
    let mut sub = join(&server, "kafka", "k", 100).await;
    let held = sub.take(ids.len()).await;
    let mut admin = server.admin().await;
    let seek = |dry_run: bool| v1::SeekGroupRequest {
        outbox: "orders".into(),
        group: "kafka".into(),
        to: Some(To::ToOldest(true)),
        dry_run,
    };
    let dry = admin.seek_group(seek(true)).await.unwrap().into_inner();
    assert_eq!(dry.rows_ahead, ids.len() as u64);
    admin.seek_group(seek(false)).await.unwrap();
    // The stream learns it lost its partitions at its next write or heartbeat; an ack
    // of what it held then is fenced, never applied.
    let held_ids: Vec<i64> = held.iter().map(|m| m.id).collect();
    let settled = sub.ack(&held_ids).await;
    assert!(
        settled.acked.is_empty(),
        "a stale owner's ack applied: {settled:?}"
    );
    // Everything again, in key order.
    let replay = drain(&mut sub, ids.len()).await;
    let mut seen: Vec<i64> = replay.iter().map(|m| m.id).collect();
    seen.sort_unstable();
    assert_eq!(seen, ids);
    in_order(&by_key(&replay));
    // Seek to now skips; unknown group and bad target are refused.
    let skipped = admin
        .seek_group(v1::SeekGroupRequest {
            to: Some(To::ToNow(true)),
            ..seek(false)
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(skipped.rows_ahead, 0);
    let unknown = admin
        .seek_group(v1::SeekGroupRequest {
            group: "nope".into(),
            ..seek(true)
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);
    let no_target = admin
        .seek_group(v1::SeekGroupRequest {
            to: None,
            ..seek(true)
        })
        .await
        .unwrap_err();
    assert_eq!(no_target.code(), Code::InvalidArgument);
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_removes_only_rows_every_group_has_passed() {
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config(GROUPS)).await;
    let ids = insert_keyed(&db, 1, 10).await;
    let mut kafka = join(&server, "kafka", "k", 100).await;
    drain(&mut kafka, 10).await;
    let mut search = join(&server, "search", "s", 4).await;
    // search takes and acks the first four only.
    let first = search.take(4).await;
    let first_ids: Vec<i64> = first.iter().map(|m| m.id).collect();
    search.ack(&first_ids).await;
    let admin = server.admin().await;
    let purged = eventually("the purge of what both groups passed", DEADLINE, || {
        let mut admin = admin.clone();
        async move {
            let deleted = admin
                .purge(v1::PurgeRequest {
                    outbox: "orders".into(),
                    older_than: Some(prost_types::Duration::default()),
                })
                .await
                .unwrap()
                .into_inner()
                .deleted;
            (deleted > 0).then_some(deleted)
        }
    })
    .await;
    assert_eq!(purged, 4);
    let left: Vec<i64> =
        sqlx::query_scalar(&format!("SELECT id FROM {}.outbox ORDER BY id", db.schema))
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(left, ids[4..]);
    // What search still needs is still delivered.
    let rest = drain(&mut search, 6).await;
    assert_eq!(rest.iter().map(|m| m.id).collect::<Vec<_>>(), ids[4..]);
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_row_calls_and_unknown_groups_are_refused_with_what_to_do() {
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config(GROUPS)).await;
    let no_group = Subscriber::open_with(&server, open("", "x", 10))
        .await
        .err()
        .unwrap();
    assert_eq!(no_group.code(), Code::FailedPrecondition);
    assert!(
        no_group.message().contains("subscribe with a group"),
        "{no_group:?}"
    );
    let unknown = Subscriber::open_with(&server, open("nope", "x", 10))
        .await
        .err()
        .unwrap();
    assert_eq!(unknown.code(), Code::NotFound);
    assert!(unknown.message().contains("kafka, search"), "{unknown:?}");
    let filtered = Subscriber::open_with(
        &server,
        v1::OpenSubscription {
            topics: vec!["t".into()],
            ..open("kafka", "x", 10)
        },
    )
    .await
    .err()
    .unwrap();
    assert_eq!(filtered.code(), Code::InvalidArgument);
    let mut relay = server.relay().await;
    let claim = relay
        .claim(v1::ClaimRequest {
            outbox: "orders".into(),
            worker_id: "w".into(),
            batch_size: 1,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(claim.code(), Code::FailedPrecondition);
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nack_to_the_last_attempt_dead_letters_for_the_group_then_redrive() {
    let db = TestDb::new().await;
    let config = db.config(
        "partitions = 2\n[outboxes.orders.groups.kafka]\nmax_attempts = 2\nbackoff.base = \"10ms\"\nbackoff.maximum = \"10ms\"\n",
    );
    let server = Server::start_serving(&config).await;
    let mut sub = join(&server, "kafka", "k", 10).await;
    let id = db.insert("t", Some("a"), b"poison").await;
    sub.take(1).await;
    sub.nack(id, "bad", None).await;
    sub.take(1).await;
    let settled = sub.nack(id, "still bad", None).await;
    assert_eq!(settled.dead_lettered, [id]);
    let mut admin = server.admin().await;
    let list = admin
        .list_dead_letters(v1::ListDeadLettersRequest {
            outbox: "orders".into(),
            group: "kafka".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(list.dead_letters.len(), 1);
    assert_eq!(list.dead_letters[0].last_error, "still bad");
    let redriven = admin
        .redrive_dead_letters(v1::RedriveDeadLettersRequest {
            outbox: "orders".into(),
            group: "kafka".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(redriven.ids, [id]);
    // Delivered again after the stream takes its partition back.
    let again = sub.take(1).await;
    assert_eq!(again[0].id, id);
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_two_groups_each_get_every_row_in_order() {
    let db = SqliteDb::new().await;
    let server = Server::start_serving(&db.config(GROUPS)).await;
    for i in 0..30 {
        sqlx::query("INSERT INTO outbox (topic, key, payload) VALUES ('t', ?1, ?2)")
            .bind(format!("k{}", i % 3))
            .bind(format!("k{}:{:03}", i % 3, i / 3).into_bytes())
            .execute(db.pool())
            .await
            .unwrap();
    }
    let mut kafka = join(&server, "kafka", "a", 8).await;
    let mut search = join(&server, "search", "b", 8).await;
    let (a, b) = tokio::join!(drain(&mut kafka, 30), drain(&mut search, 30));
    for got in [&a, &b] {
        in_order(&by_key(got));
        assert_eq!(got.len(), 30);
    }
}
