//! The Node.js package (`client/node`, npm package `txoutbox-client`) against a real
//! `txoutboxd`: its command `txoutbox-subscribe` (acks, nacks with a delay, lease extension
//! during slow publishes, answering what it holds during a server's drain and reconnecting
//! after it, a stop on SIGTERM that finishes the publish in progress and releases the
//! rest), and its API with its TypeScript types from a project of a user's.
//!
//! The command runs through `client/node/subscribe`, as a user of the repository runs it:
//! that wrapper builds the package, packs it with `npm pack` and installs the tarball into
//! a project in a cache outside the repository the first time (`scripts/test` has it do
//! so before the suite starts).

use crate::client_common;

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::{Child, Command};
use txoutbox_tests::pki::{token_identity, TlsFiles};
use txoutbox_tests::{eventually, Server, TestDb, DEADLINE};

use client_common::{
    config_on_port, free_port, insert_one_key, lease_end, signal, spawn_piped, PackageRows,
};

/// Generous: a first run builds the package and installs it, and test machines are busy.
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(300);

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
async fn node_subscriber_receives_and_acks_in_order() {
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config(TOKENS_REQUIRED)).await;
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
    let server =
        Server::start_serving(&db.config(&format!("{fast_retries}\n{TOKENS_REQUIRED}"))).await;
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
    let server = Server::start_serving(&db.config(TOKENS_REQUIRED)).await;
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
    let server = Server::start_serving(&db.config(TOKENS_REQUIRED)).await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_subscribers_of_two_groups_each_receive_every_row() {
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config(TWO_GROUPS)).await;
    let ids = insert_rows(&db).await;

    // Both at once: each group has its own positions, neither waits for the other.
    let a = spawn(&server.address, &["--group", "a", "--count", "5"]);
    let b = spawn(&server.address, &["--group", "b", "--count", "5"]);
    let ((a, _), (b, _)) = tokio::join!(run_to_end(a), run_to_end(b));

    for (group, lines) in [("a", a), ("b", b)] {
        client_common::assert_every_row_once_in_key_order(&lines, &ids, &ROWS, group);
    }
    // A group keeps its positions in its own tables: the rows themselves stay untouched.
    assert_eq!(db.count("pending").await, 5);
    db.drop().await;
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

/// The command over TLS with a bearer token, and under mutual TLS with a client
/// certificate naming its identity; without either, the server's refusal is the exit.
#[tokio::test]
async fn node_subscriber_speaks_tls_with_a_token_or_a_client_certificate() {
    let db = TestDb::new().await;
    let files = TlsFiles::new();
    let identity = token_identity("node", "node-token", r#"{ orders = ["subscribe"] }"#)
        + "certificate_names = [\"node.example\"]\n";
    let config = format!("{}\n{}\n{identity}", db.config(""), files.config(true));
    // Client certificates optional, so the token alone may get in.
    let config = config.replace("client_ca =", "client_cert_optional = true\nclient_ca =");
    let server = Server::start(&config).await;
    eventually("the table created", DEADLINE, || async {
        db.table_exists().await.then_some(())
    })
    .await;
    let ca = files.path("ca.pem");
    let ca = ca.to_str().unwrap();

    insert_rows(&db).await;
    let args = ["--count", "5", "--tls-ca", ca, "--token", "node-token"];
    let (lines, _) = run_to_end(spawn(&server.address, &args)).await;
    assert_eq!(lines.len(), 5);

    let client = files.ca.client(files.dir.path(), "node", "node.example");
    insert_rows(&db).await;
    let (cert, key) = (client.cert.to_str().unwrap(), client.key.to_str().unwrap());
    let args = [
        "--count",
        "5",
        "--tls-ca",
        ca,
        "--tls-cert",
        cert,
        "--tls-key",
        key,
    ];
    let (lines, _) = run_to_end(spawn(&server.address, &args)).await;
    assert_eq!(lines.len(), 5);
    assert_eq!(db.count("done").await, 10);

    let (code, stderr) = run_failing(spawn(&server.address, &["--tls-ca", ca])).await;
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("UNAUTHENTICATED"), "{stderr}");
    db.drop().await;
}

/// A program of a user of the package, in TypeScript (compiled with `--strict` against
/// the package's types): dead-letters a poison payload, nacks the first attempt of key
/// `customer-1` with a short retry, acks the rest, and stops once four rows are settled.
const USER_PROGRAM: &str = r#"
import { DeadLetter, Handler, Message, Nack, Subscriber, SubscriberEvent } from 'txoutbox-client';

const [server, outbox] = process.argv.slice(2);
const acked = new Set<string>();
const dead = new Set<string>();

const handler: Handler = async (message: Message) => {
  const key: string | null = message.key;
  if (message.payload.toString('utf8') === 'poison') {
    throw new DeadLetter('cannot publish a poison payload');
  }
  if (message.attempts === 1 && key === 'customer-1') {
    throw new Nack('broker busy', 100);
  }
  console.log(`published ${message.id} ${message.attempts} ${message.createdAt.toISOString()}`);
};

const subscriber = new Subscriber({
  servers: [server],
  outbox,
  name: 'node-api',
  onEvent: (event: SubscriberEvent) => {
    if (event.kind !== 'settled') return;
    event.acked.forEach((id) => acked.add(id));
    event.deadLettered.forEach((id) => dead.add(id));
    if (acked.size >= 3 && dead.size >= 1) subscriber.stop();
  },
});
subscriber.run(handler).then(() => console.log('done'));
"#;

/// What a user does with the package: the tarball of `npm pack` (made by the wrapper's
/// build, into a directory of this test's), installed into a new project with TypeScript,
/// a program type-checked against the package's types and run, and the package's command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_package_tarball_installs_into_a_project_and_runs_typed() {
    let dir = tempfile::tempdir().unwrap();
    let client = dir.path().join("client");
    let wrapper = Path::new(env!("CARGO_MANIFEST_DIR")).join("../client/node/subscribe");
    let built = wait(spawn_piped(
        Command::new(&wrapper)
            .arg("--prepare")
            .env("TXOUTBOX_NODE_CLIENT", &client),
        dir.path(),
    ))
    .await;
    assert_eq!(built.0, 0, "building the package failed");
    let tarball = client.join(format!("txoutbox-client-{}.tgz", env!("CARGO_PKG_VERSION")));
    assert!(tarball.is_file(), "{} missing", tarball.display());

    let app = dir.path().join("app");
    std::fs::create_dir(&app).unwrap();
    std::fs::write(app.join("package.json"), "{\"private\": true}\n").unwrap();
    std::fs::write(app.join("publisher.ts"), USER_PROGRAM).unwrap();
    let tarball = tarball.to_str().unwrap();
    let npm = [
        "install",
        "--no-audit",
        "--no-fund",
        "--loglevel=error",
        tarball,
        "typescript@~5.9.3",
        "@types/node@^20",
    ];
    run_in(&app, "npm", &npm).await;
    let tsc = app.join("node_modules/.bin/tsc");
    let tsc_args = [
        "--strict",
        "--target",
        "es2022",
        "--module",
        "commonjs",
        "--types",
        "node",
        "publisher.ts",
    ];
    run_in(&app, tsc.to_str().unwrap(), &tsc_args).await;

    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let ids = insert_rows(&db).await;
    let script = app.join("node_modules/.bin/txoutbox-subscribe");
    let args = [
        "--server",
        &server.address,
        "--outbox",
        "orders",
        "--count",
        "5",
    ];
    let (lines, _) = run_to_end(spawn_piped(Command::new(&script).args(args), &app)).await;
    let got: Vec<Value> = lines.iter().map(|l| l["id"].clone()).collect();
    assert_eq!(got, ids.iter().map(|id| json!(id)).collect::<Vec<_>>());

    let rows = PackageRows::insert(&db).await;
    let program = ["publisher.js", &server.address, "orders"];
    let (code, stdout, stderr) = wait(spawn_piped(Command::new("node").args(program), &app)).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.ends_with("done\n"), "{stdout}");
    rows.check(&db, &stdout).await;
    db.drop().await;
}

/// Runs `program ARGS` in `dir` to success (within [`SCRIPT_TIMEOUT`]).
async fn run_in(dir: &Path, program: &str, args: &[&str]) {
    let (code, stdout, _) = wait(spawn_piped(Command::new(program).args(args), dir)).await;
    assert_eq!(code, 0, "`{program} {}` failed: {stdout}", args.join(" "));
}
