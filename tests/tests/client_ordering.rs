//! The client runtime keeps per-key order under concurrency: three subscribers, each
//! publishing several keys at once, with one publish in five failing; a hot key does not
//! wait for each of its acks to be settled; and a fenced ack stops the rest of its key.

use crate::client_common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use tokio::sync::{broadcast, Notify};
use txoutbox_client::{Event, Message, PublishError, Subscriber};
use txoutbox_tests::{eventually, Server, TestDb, DEADLINE};

use client_common::{rows, Journal};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_key_order_holds_across_subscribers_with_injected_failures() {
    let (keys, per_key) = (12, 20);
    let total = keys * per_key as usize;
    let db = TestDb::new().await;
    let server =
        Server::start_serving(&db.config("max_attempts = 1000\nmax_batch_size = 20")).await;
    db.insert_many("t", &rows(keys, per_key)).await;

    let journal = Journal::default();
    let mut handles = Vec::new();
    for i in 0..3 {
        let journal = journal.clone();
        let publisher = move |message: Message| {
            let journal = journal.clone();
            let (pause, fail) = {
                let mut rng = rand::rng();
                (rng.random_range(0..5), rng.random_bool(0.2))
            };
            async move {
                journal.start(&message);
                tokio::time::sleep(Duration::from_millis(pause)).await;
                finish_or_fail(&journal, &message, fail)
            }
        };
        let subscriber = Subscriber::builder([server.url()], "orders")
            .name(format!("sub{i}"))
            .max_in_flight(16)
            .concurrency(4)
            .build(publisher)
            .unwrap();
        handles.push(subscriber.spawn());
    }

    eventually("every message delivered", DEADLINE * 3, || async {
        (db.count("done").await == total as i64).then_some(())
    })
    .await;
    let mut published = 0;
    let mut retried = 0;
    for handle in handles {
        let totals = handle.counters().snapshot();
        published += totals.published;
        retried += totals.retried;
        assert_eq!(totals.lease_lost, 0);
        handle.stop().await.unwrap();
    }
    journal.assert_exactly_in_order(keys, per_key);
    assert_eq!(published, total as u64);
    assert!(retried > 0, "no failure was injected");
    db.drop().await;
}

/// Ends a publish of `message` in the journal; with `fail`, as a failure retried soon.
fn finish_or_fail(journal: &Journal, message: &Message, fail: bool) -> Result<(), PublishError> {
    journal.finish(message, !fail);
    if fail {
        return Err(PublishError::new("injected failure").retry_after(Duration::from_millis(50)));
    }
    Ok(())
}

/// One key, one batch: the first message's ack is held up in the database (the test locks
/// its row before that publish returns), and the rest of the key is still published, in
/// order, while no ack has settled. A runtime that waited for each ack would publish only
/// the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_key_is_published_ahead_of_its_unsettled_acks() {
    let per_key = 20;
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("max_batch_size = 50")).await;
    let ids = db.insert_many("t", &rows(1, per_key)).await;
    let first = ids[0];

    let journal = Journal::default();
    let first_started = Arc::new(Notify::new());
    let row_locked = Arc::new(Notify::new());
    let publisher = {
        let (journal, first_started, row_locked) = (
            journal.clone(),
            Arc::clone(&first_started),
            Arc::clone(&row_locked),
        );
        move |message: Message| {
            let (journal, first_started, row_locked) = (
                journal.clone(),
                Arc::clone(&first_started),
                Arc::clone(&row_locked),
            );
            async move {
                journal.start(&message);
                if message.id == first {
                    first_started.notify_one();
                    row_locked.notified().await;
                }
                journal.finish(&message, true);
                Ok::<_, PublishError>(())
            }
        }
    };
    let subscriber = Subscriber::builder([server.url()], "orders")
        .max_in_flight(50)
        .build(publisher)
        .unwrap();
    let handle = subscriber.spawn();
    tokio::time::timeout(DEADLINE, first_started.notified())
        .await
        .expect("the first publish did not start");
    // The server's ack of the first message waits for this lock.
    let mut lock = db.pool.begin().await.unwrap();
    sqlx::query(&format!(
        "SELECT id FROM {}.outbox WHERE id = $1 FOR UPDATE",
        db.schema
    ))
    .bind(first)
    .execute(&mut *lock)
    .await
    .unwrap();
    row_locked.notify_one();

    eventually(
        "the whole key published while its first ack waits",
        DEADLINE,
        || async { (journal.published() == per_key as usize).then_some(()) },
    )
    .await;
    assert_eq!(handle.counters().snapshot().acked, 0);
    lock.rollback().await.unwrap();
    eventually("every message acked", DEADLINE, || async {
        (db.count("done").await == per_key as i64).then_some(())
    })
    .await;
    let counters = handle.counters();
    handle.stop().await.unwrap();
    let totals = counters.snapshot();
    assert_eq!(
        (
            totals.published,
            totals.acked,
            totals.blocked,
            totals.lease_lost
        ),
        (per_key as u64, per_key as u64, 0, 0),
        "{totals:?}"
    );
    journal.assert_exactly_in_order(1, per_key);
    db.drop().await;
}

/// Publishes of chosen messages that wait for the test: the first publish of each id in
/// the map says it started, then waits for its go.
#[derive(Clone, Default)]
struct Gates(Arc<Mutex<HashMap<i64, Gate>>>);

/// (started, go) of one publish.
type Gate = (Arc<Notify>, Arc<Notify>);

impl Gates {
    /// (started, go) of the first publish of `id`.
    fn add(&self, id: i64) -> Gate {
        let gate = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        self.0.lock().unwrap().insert(id, gate.clone());
        gate
    }

    async fn pass(&self, id: i64) {
        let gate = self.0.lock().unwrap().remove(&id);
        if let Some((started, go)) = gate {
            started.notify_one();
            go.notified().await;
        }
    }
}

/// Waits until every event of `wanted` was received; `seen` keeps what was.
async fn wait_for_events(
    events: &mut broadcast::Receiver<Event>,
    seen: &mut Vec<Event>,
    what: &str,
    wanted: &[Event],
) {
    eventually(what, DEADLINE, || {
        while let Ok(event) = events.try_recv() {
            seen.push(event);
        }
        let all = wanted.iter().all(|event| seen.contains(event));
        async move { all.then_some(()) }
    })
    .await
}

/// The first message's ack comes back fenced (the test hands its lease to another owner
/// while it publishes). The second message, already publishing behind that unsettled ack,
/// is given back once its publish ends, not acked; the rest of the key goes back untried;
/// and the key comes back from the fenced message on: the consumer sees 0, 1, then 0, 1,
/// 2, 3, 4, never a later message acked before an earlier one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_ack_stops_its_key_which_comes_back_from_there() {
    let per_key = 5;
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let ids = db.insert_many("t", &rows(1, per_key)).await;
    let (first, second) = (ids[0], ids[1]);
    let table = format!("{}.outbox", db.schema);

    let journal = Journal::default();
    let gates = Gates::default();
    let (first_started, first_go) = gates.add(first);
    let (second_started, second_go) = gates.add(second);
    let publisher = {
        let (journal, gates) = (journal.clone(), gates.clone());
        move |message: Message| {
            let (journal, gates) = (journal.clone(), gates.clone());
            async move {
                journal.start(&message);
                gates.pass(message.id).await;
                journal.finish(&message, true);
                Ok::<_, PublishError>(())
            }
        }
    };
    // A long lease: no extension runs during the test (it would find the lease gone too).
    let subscriber = Subscriber::builder([server.url()], "orders")
        .lease(Duration::from_secs(120))
        .build(publisher)
        .unwrap();
    let mut events = subscriber.events();
    let handle = subscriber.spawn();
    let counters = handle.counters();

    tokio::time::timeout(DEADLINE, first_started.notified())
        .await
        .expect("the first publish did not start");
    sqlx::query(&format!(
        "UPDATE {table} SET leased_by = 'thief', available_at = now() + interval '1 hour' WHERE id = $1"
    ))
    .bind(first)
    .execute(&db.pool)
    .await
    .unwrap();
    first_go.notify_one();
    tokio::time::timeout(DEADLINE, second_started.notified())
        .await
        .expect("the second publish did not start behind the first's unsettled ack");

    let mut seen = Vec::new();
    let blocked = |id: i64| Event::Blocked {
        id,
        key: Some("k0".to_owned()),
        behind: first,
    };
    let mut fenced = vec![Event::LeaseLost { id: first }];
    fenced.extend(ids[2..].iter().map(|id| blocked(*id)));
    wait_for_events(
        &mut events,
        &mut seen,
        "the fenced ack and the untried rest given back",
        &fenced,
    )
    .await;
    let totals = counters.snapshot();
    assert_eq!((totals.published, totals.acked), (1, 0), "{totals:?}");

    // The second publish ends well, and is given back all the same.
    second_go.notify_one();
    wait_for_events(
        &mut events,
        &mut seen,
        "the second message given back",
        &[blocked(second)],
    )
    .await;
    sqlx::query(&format!(
        "UPDATE {table} SET leased_by = NULL, available_at = now() WHERE id = $1"
    ))
    .bind(first)
    .execute(&db.pool)
    .await
    .unwrap();
    eventually("every message delivered", DEADLINE, || async {
        (db.count("done").await == per_key as i64).then_some(())
    })
    .await;
    handle.stop().await.unwrap();

    assert_eq!(journal.sequence("k0"), [0, 1, 0, 1, 2, 3, 4]);
    journal.assert_in_order_at_least_once(1, per_key);
    let totals = counters.snapshot();
    assert_eq!(
        (
            totals.published,
            totals.acked,
            totals.lease_lost,
            totals.blocked
        ),
        (7, 5, 1, 4),
        "{totals:?}"
    );
    drop(server);
    db.drop().await;
}

/// A stream's claim goes on past the rows of a hot key the stream holds (the test sees it
/// wait on a lock of the key's 11th row while the stream holds the first ten), and a
/// nack still holds the rest of the key back. The race: the first message fails while
/// the claim of rows 11-20 runs; its nack waits for that claim, which gives back 2-10
/// and 11-20 with it. Had the second batch been sent as claimed, it would have reached
/// the client after the nack and before its `settled`, with nothing left to hold it back:
/// row 11 published ahead of the first row's retry. The server parks rows of a key
/// until the stream's earlier rows of it are acked, so the client never sees them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nack_holds_back_the_rows_claimed_ahead_of_it() {
    let per_key = 20;
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("max_batch_size = 10")).await;
    let ids = db.insert_many("t", &rows(1, per_key)).await;
    let (first, ahead) = (ids[0], ids[10]);
    let table = format!("{}.outbox", db.schema);

    // The claim of the second batch waits for this lock.
    let mut lock = db.pool.begin().await.unwrap();
    sqlx::query(&format!("SELECT id FROM {table} WHERE id = $1 FOR UPDATE"))
        .bind(ahead)
        .execute(&mut *lock)
        .await
        .unwrap();

    let journal = Journal::default();
    let gates = Gates::default();
    let (first_started, first_go) = gates.add(first);
    let publisher = {
        let (journal, gates) = (journal.clone(), gates.clone());
        move |message: Message| {
            let (journal, gates) = (journal.clone(), gates.clone());
            async move {
                journal.start(&message);
                gates.pass(message.id).await;
                let fail = message.id == first && message.attempts == 1;
                finish_or_fail(&journal, &message, fail)
            }
        }
    };
    let subscriber = Subscriber::builder([server.url()], "orders")
        .max_in_flight(20)
        .build(publisher)
        .unwrap();
    let mut events = subscriber.events();
    let handle = subscriber.spawn();
    let counters = handle.counters();

    tokio::time::timeout(DEADLINE, first_started.notified())
        .await
        .expect("the first publish did not start");
    let waiting = format!(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
         AND query LIKE '%{}%claim%'",
        db.schema
    );
    eventually(
        "a claim of the key's 11th row while the stream holds the first ten",
        DEADLINE,
        || async {
            let (n,): (i64,) = sqlx::query_as(&waiting).fetch_one(&db.pool).await.unwrap();
            (n == 1).then_some(())
        },
    )
    .await;
    // The first publish fails: the client nacks it and holds back the rest it has.
    first_go.notify_one();
    let blocked: Vec<Event> = ids[1..10]
        .iter()
        .map(|id| Event::Blocked {
            id: *id,
            key: Some("k0".to_owned()),
            behind: first,
        })
        .collect();
    let mut seen = Vec::new();
    wait_for_events(
        &mut events,
        &mut seen,
        "the rest of the key held back",
        &blocked,
    )
    .await;
    // Now the claim ahead completes, with the nack on its way or waiting for it.
    lock.rollback().await.unwrap();

    eventually("every message delivered", DEADLINE, || async {
        (db.count("done").await == per_key as i64).then_some(())
    })
    .await;
    handle.stop().await.unwrap();
    journal.assert_exactly_in_order(1, per_key);
    let totals = counters.snapshot();
    assert_eq!(
        (totals.published, totals.retried, totals.lease_lost),
        (per_key as u64, 1, 0),
        "{totals:?}"
    );
    drop(server);
    db.drop().await;
}
