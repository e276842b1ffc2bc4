//! The Python example publisher (`client/python/txoutbox_subscriber.py`) against a real
//! `txoutboxd`: proves the protocol is comfortable from generated stubs outside Rust, and
//! keeps the example in step with the protocol.
//!
//! The script runs through `client/python/subscribe`, as a user runs it: that wrapper makes
//! the venv the first time (`scripts/test` has it make the venv before the suite starts).

use crate::client_common;

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::{Child, Command};
use txoutbox_tests::pki::{token_identity, TlsFiles};
use txoutbox_tests::{eventually, Server, TestDb, DEADLINE};

use client_common::{config_on_port, free_port};

/// Generous: a first run makes the venv (from PyPI) and generates the stubs, and test
/// machines are busy.
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(300);

/// Rows of both tests: two keys with two messages each, and a keyless one in between.
const ROWS: [(Option<&str>, &str); 5] = [
    (Some("customer-1"), "order 1 created"),
    (Some("customer-1"), "order 1 paid"),
    (Some("customer-2"), "order 2 created"),
    (None, "newsletter sent"),
    (Some("customer-2"), "order 2 paid"),
];

#[tokio::test]
async fn python_subscriber_receives_and_acks_in_order() {
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let ids = insert_rows(&db).await;

    let lines = run_subscriber(&server, &["--count", "5"]).await;

    assert_eq!(
        field(&lines, "id"),
        ids.iter().map(|id| json!(id)).collect::<Vec<_>>()
    );
    for (line, (key, payload)) in lines.iter().zip(ROWS) {
        assert_eq!(line["topic"], "orders.created", "{line}");
        assert_eq!(line["key"], json!(key), "{line}");
        assert_eq!(line["payload"], payload, "{line}");
        assert_eq!(line["headers"], json!({"source": "e2e"}), "{line}");
        assert_eq!(line["attempts"], 1, "{line}");
        assert_eq!(line["answer"], "ack", "{line}");
    }
    // The script exits only after the server confirmed every ack (`settled`).
    assert_eq!(db.count("done").await, 5);
    db.drop().await;
}

#[tokio::test]
async fn python_subscriber_sees_each_nacked_message_again() {
    let db = TestDb::new().await;
    let fast_retries = "backoff.base = \"100ms\"\nbackoff.jitter = 0.0";
    let server = Server::start_serving(&db.config(fast_retries)).await;
    let ids = insert_rows(&db).await;

    let lines = run_subscriber(&server, &["--count", "5", "--nack-first-attempt"]).await;

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
    // Per key, the messages were published (acked) in id order across the retries.
    for key in ["customer-1", "customer-2"] {
        let acked: Vec<i64> = lines
            .iter()
            .filter(|line| line["key"] == key && line["answer"] == "ack")
            .map(|line| line["id"].as_i64().unwrap())
            .collect();
        assert!(
            acked.is_sorted() && acked.len() == 2,
            "key {key} acked out of order: {acked:?}"
        );
    }
    assert_eq!(db.count("done").await, 5);
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

#[tokio::test]
async fn python_subscriber_explains_a_bad_address_and_an_unknown_outbox() {
    let nobody = ["--server", "127.0.0.1:1", "--connect-timeout", "1"];
    let (code, stderr) = run_failing(&nobody).await;
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("cannot connect to 127.0.0.1:1"), "{stderr}");

    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let (code, stderr) =
        run_failing(&["--server", server.address.as_str(), "--outbox", "nope"]).await;
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("NOT_FOUND") && stderr.contains("`nope`"),
        "{stderr}"
    );
    db.drop().await;
}

/// Issue 10, case 1: rows of 1.5 MiB made batches over the 4 MiB a gRPC client accepts
/// by default, and the example failed on them for ever. Batches now fit its default.
#[tokio::test]
async fn python_subscriber_with_default_options_takes_megabyte_rows() {
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let rows: Vec<_> = (0..4).map(|_| (None, vec![b'x'; 1536 * 1024])).collect();
    let ids = db.insert_many("orders.created", &rows).await;

    let lines = run_subscriber(&server, &["--count", "4"]).await;

    assert_eq!(
        field(&lines, "id"),
        ids.iter().map(|id| json!(id)).collect::<Vec<_>>()
    );
    assert_eq!(db.count("done").await, 4);
    db.drop().await;
}

/// Each publish takes 2.5 times the lease: without extensions the messages waiting behind
/// the first would come back (a second attempt) after their lease ran out.
#[tokio::test]
async fn python_subscriber_extends_leases_while_a_publish_is_slow() {
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let mut ids = Vec::new();
    for n in 0..3 {
        let payload = format!("slow {n}");
        ids.push(
            db.insert("orders.created", Some("one-key"), payload.as_bytes())
                .await,
        );
    }

    let args = [
        "--count",
        "3",
        "--lease-ms",
        "600",
        "--publish-delay-ms",
        "1500",
    ];
    let output = run_script(&with_server(&server.address, &args)).await;
    assert!(output.status.success(), "exited with {}", output.status);

    let lines = json_lines(&output.stdout);
    assert_eq!(lines.len(), 3, "{lines:#?}");
    assert!(
        lines.iter().all(|l| l["attempts"] == 1),
        "redelivered: {lines:#?}"
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("leases ran out"), "{stderr}");
    for id in ids {
        let (status, attempts, _) = db.row(id).await;
        assert_eq!((status.as_str(), attempts), ("done", 1), "row {id}");
    }
    db.drop().await;
}

/// SIGTERM to the server while the script holds a batch of slow publishes: the server
/// drains; the script takes nothing new, publishes and acks what it holds before the
/// server exits (every row done on its first attempt), then reconnects with backoff to
/// the server that comes back at the same address and finishes there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_subscriber_answers_what_it_holds_during_a_drain_then_reconnects() {
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
    let child = spawn_script(&with_server(&first.address, &args));
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
    let output = wait_script(child).await;
    assert!(output.status.success(), "exited with {}", output.status);

    let lines = json_lines(&output.stdout);
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
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("the server is draining") && stderr.contains("reconnecting in"),
        "{stderr}"
    );
    assert_eq!(db.count("done").await, 4);
    db.drop().await;
}

/// The server does not come back: the script gives up after `--max-reconnects`.
#[tokio::test]
async fn python_subscriber_gives_up_after_max_reconnects() {
    let db = TestDb::new().await;
    let mut server = Server::start_serving(&db.config("")).await;
    let args = with_server(&server.address, &["--max-reconnects", "2"]);
    let child = spawn_script(&args);
    db.insert("orders.created", None, b"one").await;
    eventually("subscribed and acked", DEADLINE, || async {
        (db.count("done").await == 1).then_some(())
    })
    .await;
    server.terminate();
    server.wait_exit(DEADLINE).await;
    let output = wait_script(child).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("giving up after 2 reconnections"),
        "{stderr}"
    );
    db.drop().await;
}

/// `--server ADDRESS --outbox orders --subscriber python-e2e ARGS`.
fn with_server<'a>(address: &'a str, args: &[&'a str]) -> Vec<&'a str> {
    let mut all = vec![
        "--server",
        address,
        "--outbox",
        "orders",
        "--subscriber",
        "python-e2e",
    ];
    all.extend_from_slice(args);
    all
}

fn json_lines(stdout: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(stdout)
        .lines()
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON line: {line:?}: {e}"))
        })
        .collect()
}

async fn insert_rows(db: &TestDb) -> Vec<i64> {
    let mut ids = Vec::new();
    for (key, payload) in ROWS {
        ids.push(db.insert("orders.created", key, payload.as_bytes()).await);
    }
    ids
}

fn field(lines: &[Value], name: &str) -> Vec<Value> {
    lines.iter().map(|line| line[name].clone()).collect()
}

/// Runs the script against `server` until it exits; asserts it succeeded and returns
/// its stdout, one JSON value per line.
async fn run_subscriber(server: &Server, args: &[&str]) -> Vec<Value> {
    let mut all_args = vec![
        "--server",
        server.address.as_str(),
        "--outbox",
        "orders",
        "--subscriber",
        "python-e2e",
    ];
    all_args.extend_from_slice(args);
    let output = run_script(&all_args).await;
    assert!(
        output.status.success(),
        "the Python subscriber exited with {}; its stderr is above",
        output.status
    );
    String::from_utf8(output.stdout)
        .expect("UTF-8 stdout")
        .lines()
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON line: {line:?}: {e}"))
        })
        .collect()
}

/// Runs the script expecting a failure; returns its exit code and stderr.
async fn run_failing(args: &[&str]) -> (i32, String) {
    let output = run_script(args).await;
    let code = output
        .status
        .code()
        .expect("exited, not killed by a signal");
    (code, String::from_utf8_lossy(&output.stderr).into_owned())
}

/// Runs `client/python/subscribe ARGS` (the wrapper that runs `txoutbox_subscriber.py` in
/// its venv) with a deadline, echoing its stderr to the test's output.
async fn run_script(args: &[&str]) -> Output {
    wait_script(spawn_script(args)).await
}

/// Starts `client/python/subscribe ARGS`.
fn spawn_script(args: &[&str]) -> Child {
    let script = repository().join("client/python/subscribe");
    Command::new(&script)
        .args(args)
        .env("TXOUTBOX_STUBS_DIR", target_dir().join("python-stubs"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", script.display()))
}

/// Waits for the script to exit (within [`SCRIPT_TIMEOUT`]), echoing its stderr.
async fn wait_script(mut child: Child) -> Output {
    let stdout = tokio::spawn(read_all(child.stdout.take().unwrap()));
    let stderr = tokio::spawn(read_all(child.stderr.take().unwrap()));
    let status = tokio::time::timeout(SCRIPT_TIMEOUT, child.wait()).await;
    if status.is_err() {
        child.kill().await.expect("killing the Python subscriber");
    }
    let stdout = stdout.await.unwrap();
    let stderr = stderr.await.unwrap();
    for line in String::from_utf8_lossy(&stderr).lines() {
        eprintln!("[python] {line}");
    }
    let Ok(status) = status else {
        let stdout = String::from_utf8_lossy(&stdout);
        panic!("the Python subscriber did not exit within {SCRIPT_TIMEOUT:?}; stdout:\n{stdout}");
    };
    Output {
        status: status.expect("waiting for the Python subscriber"),
        stdout,
        stderr,
    }
}

async fn read_all(mut pipe: impl AsyncRead + Unpin) -> Vec<u8> {
    let mut bytes = Vec::new();
    let _ = pipe.read_to_end(&mut bytes).await;
    bytes
}

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// The cargo target directory: the test executable is `target/<profile>/deps/<name>`.
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.ancestors()
        .nth(3)
        .expect("target directory above target/<profile>/deps")
        .to_path_buf()
}

/// Issue 12: the example over TLS with a bearer token, and under mutual TLS with a client
/// certificate naming its identity.
#[tokio::test]
async fn python_subscriber_speaks_tls_with_a_token_or_a_client_certificate() {
    let db = TestDb::new().await;
    let files = TlsFiles::new();
    let identity = token_identity("py", "py-token", r#"{ orders = ["subscribe"] }"#)
        + "certificate_names = [\"python.example\"]\n";
    let config = format!("{}\n{}\n{identity}", db.config(""), files.config(true));
    // TLS with client certificates optional, so the token alone may get in.
    let config = config.replace("client_ca =", "client_cert_optional = true\nclient_ca =");
    let server = Server::start(&config).await;
    txoutbox_tests::eventually("the table created", txoutbox_tests::DEADLINE, || async {
        db.table_exists().await.then_some(())
    })
    .await;
    let ca = files.path("ca.pem");
    let ca = ca.to_str().unwrap();

    insert_rows(&db).await;
    let lines = run_subscriber(
        &server,
        &["--count", "5", "--tls-ca", ca, "--token", "py-token"],
    )
    .await;
    assert_eq!(lines.len(), 5);

    let client = files
        .ca
        .client(files.dir.path(), "python", "python.example");
    insert_rows(&db).await;
    let (cert, key) = (client.cert.to_str().unwrap(), client.key.to_str().unwrap());
    let lines = run_subscriber(
        &server,
        &[
            "--count",
            "5",
            "--tls-ca",
            ca,
            "--tls-cert",
            cert,
            "--tls-key",
            key,
        ],
    )
    .await;
    assert_eq!(lines.len(), 5);
    assert_eq!(db.count("done").await, 10);

    let (code, stderr) = run_failing(&[
        "--server",
        &server.address,
        "--outbox",
        "orders",
        "--tls-ca",
        ca,
    ])
    .await;
    assert_ne!(code, 0);
    assert!(
        stderr.contains("UNAUTHENTICATED") || stderr.contains("credential"),
        "{stderr}"
    );
    db.drop().await;
}
