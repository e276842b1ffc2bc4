//! The Node.js example publisher (`client/node/subscribe.js`) against a real `txoutboxd`:
//! the protocol from @grpc/grpc-js and @grpc/proto-loader, with acks, nacks with a delay,
//! lease extension during slow publishes, answering what it holds during a server's drain
//! and reconnecting after it, and a stop on SIGTERM that finishes the publish in progress
//! and releases the rest.
//!
//! The script runs through `client/node/subscribe`, as a user runs it: that wrapper runs
//! `npm ci` into a cache outside the repository the first time (`scripts/test` has it do
//! so before the suite starts).

use crate::client_common;

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::{Child, Command};
use txoutbox_tests::{eventually, Server, TestDb, DEADLINE};

use client_common::{config_on_port, free_port};

/// Generous: a first run installs the npm packages, and test machines are busy.
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(300);

const ROWS: [(Option<&str>, &str); 5] = [
    (Some("customer-1"), "order 1 created"),
    (Some("customer-1"), "order 1 paid"),
    (Some("customer-2"), "order 2 created"),
    (None, "newsletter sent"),
    (Some("customer-2"), "order 2 paid"),
];

#[tokio::test]
async fn node_subscriber_receives_and_acks_in_order() {
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let ids = insert_rows(&db).await;

    let (lines, _) = run_to_end(spawn(&server.address, &["--count", "5"])).await;

    let got: Vec<Value> = lines.iter().map(|l| l["id"].clone()).collect();
    assert_eq!(got, ids.iter().map(|id| json!(id)).collect::<Vec<_>>());
    for (line, (key, payload)) in lines.iter().zip(ROWS) {
        assert_eq!(line["topic"], "orders.created", "{line}");
        assert_eq!(line["key"], json!(key), "{line}");
        assert_eq!(line["payload"], payload, "{line}");
        assert_eq!(line["headers"], json!({"source": "e2e"}), "{line}");
        assert_eq!(
            (line["attempts"].clone(), line["answer"].clone()),
            (json!(1), json!("ack"))
        );
    }
    assert_eq!(db.count("done").await, 5);
    db.drop().await;
}

#[tokio::test]
async fn node_subscriber_nacks_with_a_delay_and_sees_each_message_again_in_key_order() {
    let db = TestDb::new().await;
    let fast_retries = "backoff.base = \"100ms\"\nbackoff.jitter = 0.0";
    let server = Server::start_serving(&db.config(fast_retries)).await;
    let ids = insert_rows(&db).await;

    let args = ["--count", "5", "--nack-first-attempt"];
    let (lines, _) = run_to_end(spawn(&server.address, &args)).await;

    assert_eq!(lines.len(), 10, "every message twice: {lines:#?}");
    for id in &ids {
        let deliveries: Vec<(Value, Value)> = lines
            .iter()
            .filter(|line| line["id"] == json!(id))
            .map(|line| (line["attempts"].clone(), line["answer"].clone()))
            .collect();
        assert_eq!(
            deliveries,
            [(json!(1), json!("nack")), (json!(2), json!("ack"))],
            "message {id}"
        );
    }
    for key in ["customer-1", "customer-2"] {
        let acked: Vec<i64> = lines
            .iter()
            .filter(|line| line["key"] == key && line["answer"] == "ack")
            .map(|line| line["id"].as_i64().unwrap())
            .collect();
        assert!(
            acked.is_sorted() && acked.len() == 2,
            "key {key}: {acked:?}"
        );
    }
    for id in ids {
        let (status, attempts, error) = db.row(id).await;
        assert_eq!((status.as_str(), attempts), ("done", 2), "row {id}");
        assert!(
            error.unwrap_or_default().contains("nacked on purpose"),
            "row {id}"
        );
    }
    db.drop().await;
}

/// Each publish takes 2.5 times the lease: without extensions every message would come
/// back (a second attempt) after its lease ran out.
#[tokio::test]
async fn node_subscriber_extends_leases_while_a_publish_is_slow() {
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    for n in 0..3 {
        db.insert(
            "orders.created",
            Some("one-key"),
            format!("slow {n}").as_bytes(),
        )
        .await;
    }

    let args = [
        "--count",
        "3",
        "--lease-ms",
        "600",
        "--publish-delay-ms",
        "1500",
    ];
    let (lines, stderr) = run_to_end(spawn(&server.address, &args)).await;

    assert_eq!(lines.len(), 3, "{lines:#?}");
    assert!(
        lines.iter().all(|l| l["attempts"] == 1),
        "redelivered: {lines:#?}"
    );
    assert!(!stderr.contains("leases ran out"), "{stderr}");
    assert_eq!(db.count("done").await, 3);
    db.drop().await;
}

/// The server drains and goes away; another comes up at the same address; the example
/// reconnects with backoff and finishes the job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_subscriber_reconnects_after_a_server_drain() {
    let db = TestDb::new().await;
    let port = free_port();
    let config = config_on_port(&db, "", port);
    let mut first = Server::start_serving(&config).await;
    db.insert("orders.created", Some("k"), b"before").await;

    let child = spawn(&first.address, &["--count", "2"]);
    eventually("the first message delivered", DEADLINE, || async {
        (db.count("done").await == 1).then_some(())
    })
    .await;
    first.terminate();
    first.wait_exit(DEADLINE).await;
    db.insert("orders.created", Some("k"), b"after").await;
    let _second = Server::start_serving(&config).await;

    let (lines, stderr) = run_to_end(child).await;
    let payloads: Vec<&Value> = lines.iter().map(|l| &l["payload"]).collect();
    assert_eq!(payloads, [&json!("before"), &json!("after")]);
    assert!(stderr.contains("reconnecting in"), "{stderr}");
    assert_eq!(db.count("done").await, 2);
    db.drop().await;
}

/// SIGTERM to the server while the script holds a batch of slow publishes: the server
/// drains; the script takes nothing new, publishes and acks what it holds before the
/// server exits (every row done on its first attempt), then reconnects with backoff to
/// the server that comes back at the same address and finishes there. The Node twin of
/// `python_subscriber_answers_what_it_holds_during_a_drain_then_reconnects`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_subscriber_answers_what_it_holds_during_a_drain_then_reconnects() {
    let db = TestDb::new().await;
    let port = free_port();
    let config = config_on_port(&db, "", port);
    let mut first = Server::start_serving(&config).await;
    for n in 0..3 {
        let payload = format!("before {n}");
        db.insert("orders.created", Some("k"), payload.as_bytes())
            .await;
    }

    let args = ["--count", "4", "--publish-delay-ms", "700"];
    let child = spawn(&first.address, &args);
    eventually("the first message delivered", DEADLINE, || async {
        (db.count("done").await == 1).then_some(())
    })
    .await;
    first.terminate();
    let status = first.wait_exit(DEADLINE).await;
    assert!(status.success(), "the first server exited with {status}");
    assert_eq!(
        db.count("done").await,
        3,
        "held messages not answered in the drain"
    );

    db.insert("orders.created", Some("k"), b"after").await;
    let _second = Server::start_serving(&config).await;
    let (lines, stderr) = run_to_end(child).await;

    let payloads: Vec<&Value> = lines.iter().map(|l| &l["payload"]).collect();
    assert_eq!(
        payloads,
        [
            &json!("before 0"),
            &json!("before 1"),
            &json!("before 2"),
            &json!("after")
        ]
    );
    assert!(lines.iter().all(|l| l["attempts"] == 1), "{lines:#?}");
    assert!(
        stderr.contains("the server is draining") && stderr.contains("reconnecting in"),
        "{stderr}"
    );
    assert_eq!(db.count("done").await, 4);
    db.drop().await;
}

/// SIGTERM to the script while it holds three messages of a slow publish: the publish in
/// progress finishes and is acked, the two others are released untried (their attempt
/// refunded, no error recorded), and the script exits with 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_subscriber_on_sigterm_acks_the_publish_in_progress_and_releases_the_rest() {
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let ids = insert_one_key(&db, 3).await;

    // Slow enough that the first publish is still in progress when SIGTERM arrives, on a
    // busy machine too; a short lease, extended every third of it while the script holds
    // messages.
    let args = ["--publish-delay-ms", "3000", "--lease-ms", "900"];
    let child = spawn(&server.address, &args);
    // A claim counts an attempt; an extension then moves the lease on. Claimed is not
    // yet received: the script holds the batch (and has started publishing its first
    // message, in the same turn) once a lease was extended.
    eventually("the script holding all three", SCRIPT_TIMEOUT, || async {
        let mut held = 0;
        for id in &ids {
            held += i32::from(db.row(*id).await.1 == 1);
        }
        (held == 3).then_some(())
    })
    .await;
    let claimed_until = lease_end(&db, ids[0]).await;
    eventually("a lease extended by the script", DEADLINE, || async {
        (lease_end(&db, ids[0]).await > claimed_until).then_some(())
    })
    .await;
    let pid = child.id().expect("running").to_string();
    signal(&pid, "-TERM");
    let (lines, stderr) = run_to_end(child).await;

    assert_eq!(lines.len(), 1, "published after SIGTERM: {lines:#?}");
    assert_eq!(lines[0]["id"], json!(ids[0]));
    assert_eq!(
        (lines[0]["attempts"].clone(), lines[0]["answer"].clone()),
        (json!(1), json!("ack"))
    );
    assert!(
        stderr.contains("SIGTERM: finishing the publish in progress"),
        "{stderr}"
    );
    assert_eq!(db.row(ids[0]).await, ("done".to_owned(), 1, None));
    for id in &ids[1..] {
        assert_eq!(
            db.row(*id).await,
            ("pending".to_owned(), 0, None),
            "row {id}: released with its attempt refunded"
        );
    }
    db.drop().await;
}

/// The stop above when the script is starved of CPU (as under a busy test run): the end of
/// the publish in progress and the next lease extension fall due in the same turn of
/// Node's event loop. The script sends its ack, half-closes the stream, and must then
/// send nothing more: an extension written after the half-close made Node destroy the
/// call with the ack and the half-close still buffered, the script exited (code 0,
/// "stopped"), and the server saw a broken stream and gave the published row back.
///
/// SIGSTOP makes the starvation exact. Extensions run every 4 s (a third of the 12 s
/// lease) from `subscribed`, the publish takes 6 s from the batch: the first extension
/// (seen in the database) proves the script holds the batch; SIGTERM and SIGSTOP follow
/// within the 2 s before the publish ends; SIGCONT comes once the publish and the second
/// extension are both overdue, the publish first (unless the batch came 2 s after
/// `subscribed`). A machine too slow for those margins makes the test pass without
/// reaching the race, never fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_subscriber_starved_while_stopping_still_delivers_its_last_ack() {
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let ids = insert_one_key(&db, 2).await;
    let args = ["--publish-delay-ms", "6000", "--lease-ms", "12000"];
    let child = spawn(&server.address, &args);
    let pid = child.id().expect("running").to_string();
    eventually("the first row claimed", SCRIPT_TIMEOUT, || async {
        (db.row(ids[0]).await.1 == 1).then_some(())
    })
    .await;
    let claimed_until = lease_end(&db, ids[0]).await;
    eventually("the first lease extension", DEADLINE, || async {
        (lease_end(&db, ids[0]).await > claimed_until).then_some(())
    })
    .await;
    let extended = tokio::time::Instant::now();
    signal(&pid, "-TERM");
    eventually("the second row released", DEADLINE, || async {
        (db.row(ids[1]).await == ("pending".to_owned(), 0, None)).then_some(())
    })
    .await;
    signal(&pid, "-STOP");
    // Not a wait for a condition: the time the script spends stopped is the stimulus.
    tokio::time::sleep_until(extended + Duration::from_millis(4500)).await;
    signal(&pid, "-CONT");
    let (lines, stderr) = run_to_end(child).await;

    assert_eq!(lines.len(), 1, "published after SIGTERM: {lines:#?}");
    assert_eq!(lines[0]["id"], json!(ids[0]));
    assert!(stderr.contains("stopped"), "{stderr}");
    assert_eq!(
        db.row(ids[0]).await,
        ("done".to_owned(), 1, None),
        "the ack sent before the script exited was applied"
    );
    assert_eq!(db.row(ids[1]).await, ("pending".to_owned(), 0, None));
    db.drop().await;
}

#[tokio::test]
async fn node_subscriber_explains_a_bad_address_and_an_unknown_outbox() {
    let nobody = ["--connect-timeout", "1"];
    let (code, stderr) = run_failing(spawn("127.0.0.1:1", &nobody)).await;
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("cannot connect to 127.0.0.1:1"), "{stderr}");

    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let (code, stderr) = run_failing(spawn_raw(&server.address, &["--outbox", "nope"])).await;
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("NOT_FOUND") && stderr.contains("`nope`"),
        "{stderr}"
    );
    db.drop().await;
}

/// When the row's lease runs out (or, not leased, when it becomes claimable), in epoch
/// seconds: a lease extension moves it on.
async fn lease_end(db: &TestDb, id: i64) -> f64 {
    let query = format!(
        "SELECT extract(epoch FROM available_at)::float8 FROM {}.outbox WHERE id = $1",
        db.schema
    );
    sqlx::query_scalar(&query)
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

/// `kill SIGNAL PID`, e.g. `-TERM`.
fn signal(pid: &str, signal: &str) {
    let kill = std::process::Command::new("kill")
        .args([signal, pid])
        .status()
        .unwrap();
    assert!(kill.success(), "kill {signal} {pid}");
}

/// `count` rows of key `k`, payloads `held 0`, `held 1`...
async fn insert_one_key(db: &TestDb, count: usize) -> Vec<i64> {
    let mut ids = Vec::new();
    for n in 0..count {
        let payload = format!("held {n}");
        ids.push(
            db.insert("orders.created", Some("k"), payload.as_bytes())
                .await,
        );
    }
    ids
}

async fn insert_rows(db: &TestDb) -> Vec<i64> {
    let mut ids = Vec::new();
    for (key, payload) in ROWS {
        ids.push(db.insert("orders.created", key, payload.as_bytes()).await);
    }
    ids
}

/// `client/node/subscribe --server ADDRESS --outbox orders --subscriber node-e2e ARGS`.
fn spawn(address: &str, args: &[&str]) -> Child {
    let mut all = vec!["--outbox", "orders", "--subscriber", "node-e2e"];
    all.extend_from_slice(args);
    spawn_raw(address, &all)
}

fn spawn_raw(address: &str, args: &[&str]) -> Child {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../client/node/subscribe");
    Command::new(&script)
        .arg("--server")
        .arg(address)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", script.display()))
}

/// Waits for the script to exit successfully; its stdout as JSON lines, and its stderr.
async fn run_to_end(child: Child) -> (Vec<Value>, String) {
    let (code, stdout, stderr) = wait(child).await;
    assert_eq!(code, 0, "the Node subscriber failed; its stderr is above");
    let lines = stdout
        .lines()
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON: {line:?}: {e}"))
        })
        .collect();
    (lines, stderr)
}

async fn run_failing(child: Child) -> (i32, String) {
    let (code, _, stderr) = wait(child).await;
    (code, stderr)
}

async fn wait(mut child: Child) -> (i32, String, String) {
    let stdout = tokio::spawn(read_all(child.stdout.take().unwrap()));
    let stderr = tokio::spawn(read_all(child.stderr.take().unwrap()));
    let status = tokio::time::timeout(SCRIPT_TIMEOUT, child.wait()).await;
    if status.is_err() {
        child.kill().await.expect("killing the Node subscriber");
    }
    let stdout = String::from_utf8_lossy(&stdout.await.unwrap()).into_owned();
    let stderr = String::from_utf8_lossy(&stderr.await.unwrap()).into_owned();
    for line in stderr.lines() {
        eprintln!("[node] {line}");
    }
    let Ok(status) = status else {
        panic!("the Node subscriber did not exit within {SCRIPT_TIMEOUT:?}; stdout:\n{stdout}");
    };
    let code = status
        .unwrap()
        .code()
        .expect("exited, not killed by a signal");
    (code, stdout, stderr)
}

async fn read_all(mut pipe: impl AsyncRead + Unpin) -> Vec<u8> {
    let mut bytes = Vec::new();
    let _ = pipe.read_to_end(&mut bytes).await;
    bytes
}
