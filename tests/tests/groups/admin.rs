//! An operator's view and hand on one group: the keys a failed row holds in it
//! (`ListBlockedKeys` with a group), and its pause (`Pause` / `Resume` with a group),
//! through the API and the command line.

use std::process::Output;

use serde_json::Value;
use tonic::Code;
use txoutbox_proto::v1::{self};
use txoutbox_tests::{eventually, Server, TestDb, DEADLINE};

use super::{by_key, drain, in_order, insert_keyed, join, GROUPS};

/// `txoutbox --server URL --outbox orders ARGS...`, the CLI of this build.
async fn txoutbox(server: &Server, args: &[&str]) -> Output {
    let output = tokio::process::Command::new(txoutbox_tests::relay_cli::binary())
        .args(["--server", &server.url(), "--outbox", "orders"])
        .args(args)
        .env_remove("TXOUTBOX_SERVER")
        .env_remove("TXOUTBOX_OUTBOX")
        .env("RUST_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(DEADLINE, output)
        .await
        .expect("txoutbox did not exit in time")
        .unwrap();
    assert!(
        output.status.success(),
        "txoutbox {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

fn json(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout).expect("json output")
}

fn blocked(outbox: &str, group: &str, after_id: i64, limit: u32) -> v1::ListBlockedKeysRequest {
    v1::ListBlockedKeysRequest {
        outbox: outbox.into(),
        after_id,
        limit,
        group: group.into(),
    }
}

async fn stats(server: &Server) -> v1::StatsResponse {
    server
        .admin()
        .await
        .stats(v1::StatsRequest {
            outbox: "orders".into(),
        })
        .await
        .unwrap()
        .into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_groups_blocked_keys_are_its_retrying_and_dead_holding_keys_as_stats_counts_them() {
    let db = TestDb::new().await;
    let plain = format!(
        "\n[outboxes.plain]\ndatabase = \"main\"\nschema = \"{}\"\ntable = \"plain\"\ncreate_schema = true\n",
        db.schema
    );
    let config = db.config(&format!(
        "{}{plain}",
        GROUPS.replace(
            "[outboxes.orders.groups.search]",
            "dead_letter_holds_key = true\n[outboxes.orders.groups.search]"
        )
    ));
    let server = Server::start_serving(&config).await;
    let mut sub = join(&server, "kafka", "k", 100).await;
    // Key a: its first row waits for a retry, its second is held behind it.
    let a0 = db.insert("t", Some("a"), b"a:0").await;
    assert_eq!(sub.take(1).await[0].id, a0);
    assert_eq!(
        sub.nack(a0, "broker down", Some(60_000)).await.retried,
        [a0]
    );
    db.insert("t", Some("a"), b"a:1").await;
    // Key c: its first row dead-lettered, which holds the key in this group.
    let c0 = db.insert("t", Some("c"), b"c:0").await;
    assert_eq!(sub.take(1).await[0].id, c0);
    assert_eq!(sub.dead_letter(c0, "poison").await.dead_lettered, [c0]);
    db.insert("t", Some("c"), b"c:1").await;
    // Key b flows.
    let b0 = db.insert("t", Some("b"), b"b:0").await;
    assert_eq!(sub.take(1).await[0].id, b0);
    sub.ack(&[b0]).await;

    let mut admin = server.admin().await;
    let keys = eventually("a and c held, one row behind each", DEADLINE, || {
        let mut admin = admin.clone();
        async move {
            let keys = admin
                .list_blocked_keys(blocked("orders", "kafka", 0, 0))
                .await
                .unwrap()
                .into_inner()
                .keys;
            (keys.len() == 2 && keys.iter().all(|k| k.waiting_behind == 1)).then_some(keys)
        }
    })
    .await;
    let shape: Vec<(&str, i64, &str, u32)> = keys
        .iter()
        .map(|k| (k.key.as_str(), k.head_id, k.state.as_str(), k.attempts))
        .collect();
    assert_eq!(shape, [("a", a0, "retry_waiting", 1), ("c", c0, "dead", 1)]);
    assert_eq!(keys[0].last_error.as_deref(), Some("broker down"));
    assert_eq!(keys[1].last_error.as_deref(), Some("poison"));
    assert!(keys
        .iter()
        .all(|k| k.owner.is_none() && k.head_created_at.is_some()));
    let due = keys[0].until.unwrap().seconds - keys[0].head_created_at.unwrap().seconds;
    assert!(
        (50..=70).contains(&due),
        "the retry is due in a minute: {due}s"
    );
    // Stats counts the same keys; the other group holds none.
    let kafka = stats(&server).await.groups[0].clone();
    assert_eq!(
        (kafka.group.as_str(), kafka.held_keys),
        ("kafka", 2),
        "{kafka:?}"
    );
    let search = admin
        .list_blocked_keys(blocked("orders", "search", 0, 0))
        .await
        .unwrap()
        .into_inner();
    assert!(search.keys.is_empty(), "{search:?}");
    // A page at a time, by head id.
    let first = admin
        .list_blocked_keys(blocked("orders", "kafka", 0, 1))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((first.keys[0].head_id, first.next_after_id), (a0, a0));
    let second = admin
        .list_blocked_keys(blocked("orders", "kafka", a0, 1))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(second.keys[0].head_id, c0);

    // What is refused says what to change.
    let refused = |request| {
        let mut admin = admin.clone();
        async move { admin.list_blocked_keys(request).await.unwrap_err() }
    };
    let unknown = refused(blocked("orders", "nope", 0, 0)).await;
    assert_eq!(unknown.code(), Code::NotFound);
    assert!(unknown.message().contains("kafka, search"), "{unknown:?}");
    let no_group = refused(blocked("orders", "", 0, 0)).await;
    assert_eq!(no_group.code(), Code::InvalidArgument);
    assert!(no_group.message().contains("--group"), "{no_group:?}");
    let per_row = refused(blocked("plain", "kafka", 0, 0)).await;
    assert_eq!(per_row.code(), Code::InvalidArgument);
    assert!(
        per_row.message().contains("leave `group` empty"),
        "{per_row:?}"
    );
    let printed = json(
        &txoutbox(
            &server,
            &["--format", "json", "blocked", "--group", "kafka"],
        )
        .await,
    );
    assert_eq!(printed["group"], "kafka");
    assert_eq!(printed["keys"][0]["key"], "a");
    assert_eq!(printed["keys"][1]["state"], "dead");
    assert_eq!(printed["keys"][1]["waiting_behind"], 1);
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_group_gets_nothing_while_the_other_flows_and_after_a_restart_resumes_in_order() {
    let db = TestDb::new().await;
    let config = db.config(GROUPS);
    let mut server = Server::start_serving(&config).await;
    let mut kafka = join(&server, "kafka", "k", 100).await;
    let mut search = join(&server, "search", "s", 100).await;
    let mut admin = server.admin().await;
    let paused = admin
        .pause(v1::PauseRequest {
            outbox: "orders".into(),
            group: "kafka".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let groups: Vec<&str> = paused
        .paused_groups
        .iter()
        .map(|g| g.group.as_str())
        .collect();
    assert_eq!(groups, ["kafka"]);
    assert!(paused.paused_since.is_none(), "the outbox itself runs");
    server.wait_for_log("group=`kafka`").await;
    // A topic's pause is per-row only: refused with a group, saying so.
    let topic = admin
        .pause(v1::PauseRequest {
            outbox: "orders".into(),
            topics: vec!["t".into()],
            group: "kafka".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(topic.code(), Code::InvalidArgument);
    assert!(
        topic.message().contains("within a subscription group"),
        "{topic:?}"
    );

    let ids = insert_keyed(&db, 3, 4).await;
    let got = drain(&mut search, ids.len()).await;
    in_order(&by_key(&got));
    // search has every row; kafka's positions did not move and it was handed nothing.
    let kafka_stats = stats(&server).await.groups[0].clone();
    assert_eq!(kafka_stats.group, "kafka");
    assert_eq!(kafka_stats.lag_rows, ids.len() as u64, "{kafka_stats:?}");
    assert!(kafka_stats.partitions.iter().all(|p| p.position_id == 0));
    assert!(kafka_stats.paused_since.is_some());
    assert!(
        kafka.inbox.is_empty()
            && kafka
                .nothing_within(std::time::Duration::from_millis(300))
                .await
    );

    // The pause is in the database: a restarted server keeps it.
    drop(kafka);
    server.terminate();
    assert!(server.wait_exit(DEADLINE).await.success());
    let server = Server::start_serving(&config).await;
    let mut kafka = join(&server, "kafka", "k", 100).await;
    let printed = json(&txoutbox(&server, &["--format", "json", "stats"]).await);
    assert!(
        printed["groups"][0]["paused_since"].is_string(),
        "{printed}"
    );
    assert!(
        kafka
            .nothing_within(std::time::Duration::from_millis(1500))
            .await
    );
    let resumed =
        json(&txoutbox(&server, &["--format", "json", "resume", "--group", "kafka"]).await);
    assert_eq!(resumed["paused_groups"], serde_json::json!({}));
    let got = drain(&mut kafka, ids.len()).await;
    let mut seen: Vec<i64> = got.iter().map(|m| m.id).collect();
    in_order(&by_key(&got));
    seen.sort_unstable();
    assert_eq!(seen, ids, "every row once, from where the group stopped");
    db.drop().await;
}

/// The same calls on SQLite, whose group tables keep times in milliseconds and order
/// rows by id alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_groups_blocked_keys_and_pause() {
    let db = txoutbox_tests::SqliteDb::new().await;
    let server = Server::start_serving(&db.config(GROUPS)).await;
    let mut sub = join(&server, "kafka", "k", 100).await;
    let a0 = db.insert("t", Some("a"), b"a:0").await;
    assert_eq!(sub.take(1).await[0].id, a0);
    assert_eq!(
        sub.nack(a0, "broker down", Some(60_000)).await.retried,
        [a0]
    );
    db.insert("t", Some("a"), b"a:1").await;
    let b0 = db.insert("t", Some("b"), b"b:0").await;
    assert_eq!(sub.take(1).await[0].id, b0);
    sub.ack(&[b0]).await;
    let mut admin = server.admin().await;
    let keys = eventually("a held, one row behind it", DEADLINE, || {
        let mut admin = admin.clone();
        async move {
            let keys = admin
                .list_blocked_keys(blocked("orders", "kafka", 0, 0))
                .await
                .unwrap()
                .into_inner()
                .keys;
            (keys.len() == 1 && keys[0].waiting_behind == 1).then_some(keys)
        }
    })
    .await;
    assert_eq!(
        (
            keys[0].key.as_str(),
            keys[0].head_id,
            keys[0].state.as_str()
        ),
        ("a", a0, "retry_waiting")
    );
    let paused = admin
        .pause(v1::PauseRequest {
            outbox: "orders".into(),
            group: "search".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(paused.paused_groups[0].group, "search");
    let groups = stats(&server).await.groups;
    assert_eq!(groups[0].held_keys, 1);
    assert!(groups[0].paused_since.is_none() && groups[1].paused_since.is_some());
    let mut search = join(&server, "search", "s", 100).await;
    assert!(
        search
            .nothing_within(std::time::Duration::from_millis(1500))
            .await
    );
    admin
        .resume(v1::ResumeRequest {
            outbox: "orders".into(),
            group: "search".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let got = drain(&mut search, 3).await;
    let payloads: Vec<&[u8]> = got.iter().map(|m| m.payload.as_slice()).collect();
    assert_eq!(payloads, [b"a:0".as_slice(), b"a:1", b"b:0"]);
}
