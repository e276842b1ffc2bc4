//! The Python package (`client/python`, distribution `txoutbox-client`) against a real
//! `txoutboxd`: its console script `txoutbox-subscribe` through `client/python/subscribe`,
//! as the README and the server's start-up line run it (that wrapper installs the package
//! into a venv of its own the first time; `scripts/test` has it do so before the suite
//! starts), and the wheel built from the directory, installed into a fresh venv, with its
//! API used from Python (sync and asyncio).

use crate::client_common;

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::{Child, Command};
use txoutbox_tests::pki::{token_identity, TlsFiles};
use txoutbox_tests::{eventually, Server, TestDb, DEADLINE};

use client_common::{
    config_on_port, free_port, insert_one_key, lease_end, signal, spawn_piped, PackageRows,
};

/// Generous: a first run makes the venv (from PyPI) and builds the package, and test
/// machines are busy.
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(300);

/// Building the wheel fetches its build requirements (hatchling, grpcio-tools) from PyPI
/// and generates the stubs; installing it fetches grpcio and protobuf.
const WHEEL_TIMEOUT: Duration = Duration::from_secs(600);

/// Rows of both tests: two keys with two messages each, and a keyless one in between.
const ROWS: [(Option<&str>, &str); 5] = [
    (Some("customer-1"), "order 1 created"),
    (Some("customer-1"), "order 1 paid"),
    (Some("customer-2"), "order 2 created"),
    (None, "newsletter sent"),
    (Some("customer-2"), "order 2 paid"),
];
/// Answers without lease tokens are refused: the client must send each message's
/// token back (docs/lease-tokens.md).
const TOKENS_REQUIRED: &str = "require_lease_tokens = true";
/// Two subscription groups on the outbox (docs/groups.md).
const TWO_GROUPS: &str = "[outboxes.orders.groups.a]\n[outboxes.orders.groups.b]";

#[tokio::test]
async fn python_subscriber_receives_and_acks_in_order() {
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config(TOKENS_REQUIRED)).await;
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
    let server =
        Server::start_serving(&db.config(&format!("{fast_retries}\n{TOKENS_REQUIRED}"))).await;
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

/// Rows of 1.5 MiB once made batches over the 4 MiB a gRPC client accepts
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
    let server = Server::start_serving(&db.config(TOKENS_REQUIRED)).await;
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

/// SIGTERM to the command while it holds three messages of a slow publish: the publish in
/// progress finishes and is acked, the two others are released untried (their attempt
/// refunded, no error recorded), and it exits with 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_subscriber_on_sigterm_acks_the_publish_in_progress_and_releases_the_rest() {
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config(TOKENS_REQUIRED)).await;
    let ids = insert_one_key(&db, 3).await;
    let args = ["--publish-delay-ms", "3000", "--lease-ms", "900"];
    let child = spawn_script(&with_server(&server.address, &args));
    // Claimed is not yet received: the command holds the batch once a lease was extended.
    eventually("the command holding all three", SCRIPT_TIMEOUT, || async {
        let mut held = 0;
        for id in &ids {
            held += i32::from(db.row(*id).await.1 == 1);
        }
        (held == 3).then_some(())
    })
    .await;
    let claimed_until = lease_end(&db, ids[0]).await;
    eventually("a lease extended by the command", DEADLINE, || async {
        (lease_end(&db, ids[0]).await > claimed_until).then_some(())
    })
    .await;
    signal(&child.id().expect("running").to_string(), "-TERM");
    let output = wait_script(child).await;

    assert!(output.status.success(), "exited with {}", output.status);
    let lines = json_lines(&output.stdout);
    assert_eq!(field(&lines, "id"), [json!(ids[0])], "{lines:#?}");
    assert_eq!(lines[0]["answer"], "ack");
    let stderr = String::from_utf8_lossy(&output.stderr);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_subscribers_of_two_groups_each_receive_every_row() {
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config(TWO_GROUPS)).await;
    let ids = insert_rows(&db).await;

    // Both at once: each group has its own positions, neither waits for the other.
    let a = spawn_script(&with_server(
        &server.address,
        &["--group", "a", "--count", "5"],
    ));
    let b = spawn_script(&with_server(
        &server.address,
        &["--group", "b", "--count", "5"],
    ));
    let (a, b) = tokio::join!(wait_script(a), wait_script(b));

    for (group, output) in [("a", a), ("b", b)] {
        assert!(
            output.status.success(),
            "group {group}: exited with {}",
            output.status
        );
        client_common::assert_every_row_once_in_key_order(
            &json_lines(&output.stdout),
            &ids,
            &ROWS,
            group,
        );
    }
    // A group keeps its positions in its own tables: the rows themselves stay untouched.
    assert_eq!(db.count("pending").await, 5);
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

/// Runs `client/python/subscribe ARGS` (the wrapper that runs the package's
/// `txoutbox-subscribe` from its venv) with a deadline, echoing its stderr to the test's
/// output.
async fn run_script(args: &[&str]) -> Output {
    wait_script(spawn_script(args)).await
}

/// Starts `client/python/subscribe ARGS`.
fn spawn_script(args: &[&str]) -> Child {
    let script = repository().join("client/python/subscribe");
    Command::new(&script)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", script.display()))
}

/// Waits for the script to exit (within [`SCRIPT_TIMEOUT`]), echoing its stderr.
async fn wait_script(child: Child) -> Output {
    wait_with(child, SCRIPT_TIMEOUT).await
}

/// Waits for `child` to exit within `deadline`, echoing its stderr.
async fn wait_with(mut child: Child, deadline: Duration) -> Output {
    let stdout = tokio::spawn(read_all(child.stdout.take().unwrap()));
    let stderr = tokio::spawn(read_all(child.stderr.take().unwrap()));
    let status = tokio::time::timeout(deadline, child.wait()).await;
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
        panic!("the Python program did not exit within {deadline:?}; stdout:\n{stdout}");
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

/// The command over TLS with a bearer token, and under mutual TLS with a client
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

/// A program of a user of the package: a sync subscriber whose handler dead-letters a
/// poison payload, nacks the first attempt of key `customer-1` with a short retry, gives
/// back the rows meant for the asyncio subscriber (`later ...`, with a delay) and acks the
/// rest; then an asyncio one that acks those. Each stops once what it waits for is settled;
/// `done` at the end.
const USER_PROGRAM: &str = r#"
import asyncio, sys
from txoutbox_client import (AsyncSubscriber, DeadLetter, Message, Nack, Release, Settled,
                             Subscriber)

server, outbox = sys.argv[1], sys.argv[2]

def handle(message: Message) -> None:
    if message.payload == b"poison":
        raise DeadLetter("cannot publish a poison payload")
    if message.payload.startswith(b"later"):
        raise Release(delay=1.0)
    if message.attempts == 1 and message.key == "customer-1":
        raise Nack("broker busy", retry_after=0.1)
    print(f"sync {message.id} {message.attempts}", flush=True)

acked, dead = set(), set()

def on_event(event):
    if isinstance(event, Settled):
        acked.update(event.acked)
        dead.update(event.dead_lettered)
        if len(acked) >= 3 and dead:
            sync.stop()

sync = Subscriber(server, outbox, name="python-api", on_event=on_event)
sync.run(handle)

async def main():
    acked = set()

    async def handle(message: Message) -> None:
        await asyncio.sleep(0)
        print(f"async {message.id} {message.attempts} {message.payload_text()}", flush=True)

    def on_event(event):
        if isinstance(event, Settled):
            acked.update(event.acked)
            if len(acked) >= 2:
                subscriber.stop()

    subscriber = AsyncSubscriber([server], outbox, name="python-aio", on_event=on_event)
    await subscriber.run(handle)

asyncio.run(main())
print("done", flush=True)
"#;

/// What a user does with the package: `pip wheel` in `client/python`, the wheel installed
/// into a fresh venv outside the repository (nothing of the clone on its path), its
/// console script and its API run against a real server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_package_wheel_installs_into_a_clean_venv_and_runs() {
    let dir = tempfile::tempdir().unwrap();
    let python = std::env::var("TXOUTBOX_PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let dist = dir.path().join("dist");
    let package = repository().join("client/python");
    let package = package.to_str().unwrap();
    let dist_arg = dist.to_str().unwrap();
    run_python_tool(
        &python,
        &[
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--quiet",
            package,
            "-w",
            dist_arg,
        ],
        dir.path(),
    )
    .await;
    let wheels: Vec<PathBuf> = std::fs::read_dir(&dist)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    let [wheel] = wheels.as_slice() else {
        panic!("one wheel expected in {}: {wheels:?}", dist.display());
    };
    let name = wheel.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        name.starts_with("txoutbox_client-") && name.ends_with("-py3-none-any.whl"),
        "{name}"
    );
    let venv = dir.path().join("venv");
    run_python_tool(&python, &["-m", "venv", venv.to_str().unwrap()], dir.path()).await;
    let venv_python = venv.join("bin/python");
    let venv_python = venv_python.to_str().unwrap();
    run_python_tool(
        venv_python,
        &[
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            wheel.to_str().unwrap(),
        ],
        dir.path(),
    )
    .await;

    // The console script.
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let ids = insert_rows(&db).await;
    let script = venv.join("bin/txoutbox-subscribe");
    let output = wait_script(spawn_piped(
        Command::new(&script).args(with_server(&server.address, &["--count", "5"])),
        dir.path(),
    ))
    .await;
    assert!(output.status.success(), "exited with {}", output.status);
    assert_eq!(
        field(&json_lines(&output.stdout), "id"),
        ids.iter().map(|id| json!(id)).collect::<Vec<_>>()
    );

    // The API, from a program of its own.
    let rows = PackageRows::insert(&db).await;
    let later = [
        db.insert("orders.created", None, b"later 1").await,
        db.insert("orders.created", None, b"later 2").await,
    ];
    let program = dir.path().join("publisher.py");
    std::fs::write(&program, USER_PROGRAM).unwrap();
    let output = wait_script(spawn_piped(
        Command::new(venv_python)
            .arg(&program)
            .args([server.address.as_str(), "orders"]),
        dir.path(),
    ))
    .await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{}: {stdout}", output.status);
    assert!(stdout.ends_with("done\n"), "{stdout}");
    rows.check(&db, &stdout).await;
    for id in later {
        assert!(stdout.contains(&format!("async {id} 1 later")), "{stdout}");
        assert_eq!(
            db.row(id).await,
            ("done".to_owned(), 1, None),
            "released untried"
        );
    }
    db.drop().await;
}

/// Runs `program ARGS` in `dir` to success within [`WHEEL_TIMEOUT`], echoing its output.
async fn run_python_tool(program: &str, args: &[&str], dir: &Path) {
    let output = wait_with(
        spawn_piped(Command::new(program).args(args), dir),
        WHEEL_TIMEOUT,
    )
    .await;
    assert!(
        output.status.success(),
        "`{program} {}` failed ({}): {}",
        args.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stdout)
    );
}
