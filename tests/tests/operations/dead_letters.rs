//! Dead letters: list, count, re-drive in id order per key, discard; RPCs and CLI.

use std::collections::BTreeMap;

use tonic::Code;
use txoutbox_proto::v1::{self, DeadLetterSelector};
use txoutbox_tests::journal::parse;
use txoutbox_tests::{OutboxDb, Server, Subscriber};

use crate::cli_client::{json, stdout, txoutbox};

/// `max_attempts = 1`: a nack dead-letters at once.
const CONFIG: &str = "max_attempts = 1\nbackoff.jitter = 0.0";

/// Claims every claimable row as `worker` and dead-letters each with `error(id)`; returns
/// the ids in the order they were dead-lettered.
async fn kill_all(server: &Server, worker: &str, error: impl Fn(i64) -> String) -> Vec<i64> {
    let mut relay = server.relay().await;
    let mut killed = Vec::new();
    loop {
        let claimed = relay
            .claim(v1::ClaimRequest {
                outbox: "orders".into(),
                worker_id: worker.into(),
                batch_size: 100,
                lease_ms: 0,
                topics: vec![],
            })
            .await
            .unwrap()
            .into_inner();
        if claimed.messages.is_empty() {
            return killed;
        }
        for message in claimed.messages {
            let dead = relay
                .dead_letter(v1::DeadLetterRequest {
                    outbox: "orders".into(),
                    worker_id: worker.into(),
                    id: message.id,
                    error: error(message.id),
                    lease_token: Default::default(),
                })
                .await
                .unwrap()
                .into_inner();
            assert!(dead.dead_lettered, "row {} held by {worker}", message.id);
            killed.push(message.id);
        }
    }
}

fn select(f: impl FnOnce(&mut DeadLetterSelector)) -> Option<DeadLetterSelector> {
    let mut selector = DeadLetterSelector::default();
    f(&mut selector);
    Some(selector)
}

fn list(
    selector: Option<DeadLetterSelector>,
    after_id: i64,
    limit: u32,
) -> v1::ListDeadLettersRequest {
    v1::ListDeadLettersRequest {
        group: String::new(),
        outbox: "orders".into(),
        selector,
        after_id,
        limit,
    }
}

pub async fn dead_letters_are_listed_counted_and_discarded(db: impl OutboxDb) {
    let server = Server::start_serving(&db.config(CONFIG)).await;
    let a = db.insert("orders.paid", Some("k1"), b"a").await;
    let b = db.insert("orders.paid", Some("k2"), b"b").await;
    let c = db.insert("orders.shipped", None, b"c").await;
    let d = db.insert("orders.paid", Some("k1"), b"d").await;
    let killed = kill_all(&server, "ops", |id| {
        if id == c {
            "schema mismatch: line 1\nline 2".to_owned()
        } else {
            "broker timeout".to_owned()
        }
    })
    .await;
    assert_eq!(killed.len(), 4);
    let mut admin = server.admin().await;

    // Pages by id, each row with what an operator needs.
    let page = admin
        .list_dead_letters(list(None, 0, 3))
        .await
        .unwrap()
        .into_inner();
    let ids: Vec<i64> = page.dead_letters.iter().map(|d| d.id).collect();
    assert_eq!(ids, [a, b, c]);
    assert_eq!(page.next_after_id, c);
    let first = &page.dead_letters[0];
    assert_eq!(
        (
            first.topic.as_str(),
            first.key.as_deref(),
            first.payload.as_slice()
        ),
        ("orders.paid", Some("k1"), &b"a"[..])
    );
    assert_eq!(
        (first.attempts, first.last_error.as_str()),
        (1, "broker timeout")
    );
    assert!(first.died_at.is_some() && first.created_at.is_some());
    let rest = admin
        .list_dead_letters(list(None, c, 3))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        rest.dead_letters.iter().map(|d| d.id).collect::<Vec<_>>(),
        [d]
    );
    assert_eq!(rest.next_after_id, 0, "the last page");

    // Filters: every given field must match.
    let by_key = select(|s| s.key = Some("k1".into()));
    let rows = admin
        .list_dead_letters(list(by_key, 0, 0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        rows.dead_letters.iter().map(|d| d.id).collect::<Vec<_>>(),
        [a, d]
    );
    let by_error = select(|s| {
        s.error_contains = Some("schema".into());
        s.topic = Some("orders.shipped".into());
    });
    let rows = admin
        .list_dead_letters(list(by_error, 0, 0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        rows.dead_letters.iter().map(|d| d.id).collect::<Vec<_>>(),
        [c]
    );
    let future = select(|s| {
        s.died_after = Some(prost_types::Timestamp::from(
            std::time::SystemTime::now() + std::time::Duration::from_secs(3600),
        ))
    });
    let rows = admin
        .list_dead_letters(list(future, 0, 0))
        .await
        .unwrap()
        .into_inner();
    assert!(rows.dead_letters.is_empty(), "nothing died in the future");

    // Counts by topic and error, largest first.
    let counts = admin
        .count_dead_letters(v1::CountDeadLettersRequest {
            outbox: "orders".into(),
            selector: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(counts.total, 4);
    let groups: Vec<(String, String, u64)> = counts
        .counts
        .into_iter()
        .map(|c| (c.topic, c.error, c.count))
        .collect();
    assert_eq!(
        groups,
        [
            ("orders.paid".into(), "broker timeout".into(), 3),
            (
                "orders.shipped".into(),
                "schema mismatch: line 1\nline 2".into(),
                1
            ),
        ]
    );

    // A dry run changes nothing; a discard is bounded, and idempotent.
    let discard = |ids: Vec<i64>, limit: u32, dry_run: bool| v1::DiscardDeadLettersRequest {
        group: String::new(),
        outbox: "orders".into(),
        selector: select(|s| s.ids = ids),
        limit,
        dry_run,
    };
    let dry = admin
        .discard_dead_letters(discard(vec![a, b, c], 2, true))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((dry.ids.as_slice(), dry.more), (&[a, b][..], true));
    assert_eq!(db.count("dead").await, 4);
    let done = admin
        .discard_dead_letters(discard(vec![a, b, c], 2, false))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((done.ids.as_slice(), done.more), (&[a, b][..], true));
    let done = admin
        .discard_dead_letters(discard(vec![a, b, c], 2, false))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((done.ids.as_slice(), done.more), (&[c][..], false));
    let again = admin
        .discard_dead_letters(discard(vec![a, b, c], 2, false))
        .await
        .unwrap()
        .into_inner();
    assert!(
        again.ids.is_empty() && !again.more,
        "a repeat finds nothing to do"
    );
    assert_eq!(db.count("dead").await, 1);

    // A pending row is never discarded nor re-driven, even by id.
    let e = db.insert("orders.paid", Some("k3"), b"e").await;
    let done = admin
        .discard_dead_letters(discard(vec![e], 0, false))
        .await
        .unwrap()
        .into_inner();
    assert!(done.ids.is_empty());
    assert_eq!(db.row(e).await.0, "pending");

    // Bad input names what to change.
    let err = admin
        .discard_dead_letters(discard(vec![], 5000, false))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("limit 5000"), "{}", err.message());
    let err = admin
        .list_dead_letters(list(
            select(|s| s.error_contains = Some(String::new())),
            0,
            0,
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    server.wait_for_log("\"action\":\"discard\"").await;
    db.drop().await;
}

/// Every key's first rows die; later rows of the keys are inserted while they are dead;
/// the dead rows are re-driven in bounded calls (before any subscriber connects); then a
/// real subscriber must receive each key's rows in their original order: the re-driven
/// ones first, in id order, then the later ones.
pub async fn redriven_rows_arrive_in_id_order_per_key(db: impl OutboxDb) {
    const KEYS: usize = 4;
    let server = Server::start_serving(&db.config(CONFIG)).await;
    let rows = |from: u32, to: u32| -> Vec<(Option<String>, Vec<u8>)> {
        (from..to)
            .flat_map(|seq| {
                (0..KEYS).map(move |key| {
                    (
                        Some(format!("key-{key}")),
                        format!("key-{key}:{seq}").into_bytes(),
                    )
                })
            })
            .collect()
    };
    let first = db.insert_many("t", &rows(0, 3)).await;
    let killed = kill_all(&server, "poisoned", |_| "poison".to_owned()).await;
    assert_eq!(killed.len(), first.len());
    db.insert_many("t", &rows(3, 6)).await;

    let mut admin = server.admin().await;
    let redrive = |dry_run: bool| v1::RedriveDeadLettersRequest {
        group: String::new(),
        outbox: "orders".into(),
        selector: None,
        limit: 5,
        delay: None,
        dry_run,
    };
    let dry = admin
        .redrive_dead_letters(redrive(true))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(dry.ids, first[..5], "the lowest ids first");
    assert_eq!(
        db.count("dead").await,
        first.len() as i64,
        "a dry run changes nothing"
    );
    let mut redriven = Vec::new();
    loop {
        let done = admin
            .redrive_dead_letters(redrive(false))
            .await
            .unwrap()
            .into_inner();
        assert!(done.ids.len() <= 5, "bounded per call");
        redriven.extend(done.ids);
        if !done.more {
            break;
        }
    }
    assert_eq!(redriven, first);
    for id in &first {
        let (status, attempts, error) = db.row(*id).await;
        assert_eq!(
            (status.as_str(), attempts),
            ("pending", 0),
            "attempts reset"
        );
        assert_eq!(error.as_deref(), Some("poison"), "the last error is kept");
    }

    let mut sub = Subscriber::open(&server, "checker", 7, 0).await;
    let mut arrived: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for _ in 0..KEYS * 6 {
        let message = sub.take(1).await.remove(0);
        let (key, seq) = parse(&message.payload);
        arrived.entry(key).or_default().push(seq);
        sub.ack(&[message.id]).await;
    }
    for (key, seqs) in &arrived {
        assert_eq!(seqs, &(0..6).collect::<Vec<u32>>(), "order of {key}");
    }
    assert_eq!(arrived.len(), KEYS);
    assert_eq!(db.count("dead").await, 0);
    db.drop().await;
}

pub async fn the_command_line_acts_only_with_yes(db: impl OutboxDb) {
    let server = Server::start_serving(&db.config(CONFIG)).await;
    let url = server.url();
    let a = db.insert("orders.paid", Some("k1"), b"a").await;
    let b = db.insert("orders.paid", Some("k1"), b"b").await;
    kill_all(&server, "cli", |_| "broker down".to_owned()).await;

    let counted = json(&txoutbox(&url, &["--format", "json", "dead", "count"]).await);
    assert_eq!(counted["total"], 2);
    assert_eq!(counted["counts"][0]["error"], "broker down");
    let listed = txoutbox(&url, &["dead", "list", "--key", "k1"]).await;
    assert!(listed.status.success());
    let table = stdout(&listed);
    assert!(
        table.contains("broker down") && table.contains("k1"),
        "{table}"
    );

    let dry = txoutbox(&url, &["dead", "redrive", "--error", "broker"]).await;
    assert!(dry.status.success());
    assert!(
        stdout(&dry).contains("dry run: would re-drive 2 rows"),
        "{}",
        stdout(&dry)
    );
    assert!(stdout(&dry).contains("--yes"));
    assert_eq!(db.row(a).await.0, "dead", "a dry run changes nothing");

    let args = [
        "--format",
        "json",
        "dead",
        "redrive",
        "--ids",
        &a.to_string(),
        "--yes",
    ];
    let done = json(&txoutbox(&url, &args).await);
    assert_eq!(done["ids"], serde_json::json!([a]));
    assert_eq!(db.row(a).await.0, "pending");
    let again = json(&txoutbox(&url, &args).await);
    assert_eq!(again["ids"], serde_json::json!([]), "idempotent");

    let args = [
        "--format", "json", "dead", "discard", "--key", "k1", "--yes",
    ];
    let done = json(&txoutbox(&url, &args).await);
    assert_eq!(done["ids"], serde_json::json!([b]));
    assert_eq!(db.count("dead").await, 0);
    let usage = txoutbox(&url, &["dead", "list", "--died-after", "yesterday"]).await;
    assert_eq!(usage.status.code(), Some(2));
    db.drop().await;
}
