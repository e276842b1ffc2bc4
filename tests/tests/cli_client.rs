//! The `txoutbox` command line against a real `txoutboxd` on PostgreSQL: what it prints,
//! what it does to the rows, and the exit codes scripts rely on (0 ok, 1 failure, 2 usage,
//! 3 server unreachable, 4 not found). `relay --kafka` runs against librdkafka's mock
//! cluster, which lives in this test process and listens on localhost.

use crate::kafka_common;

use std::path::PathBuf;
use std::process::{Output, Stdio};
use std::time::Duration;

use rdkafka::mocking::MockCluster;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use txoutbox_tests::pki::{token_identity, TlsFiles};
use txoutbox_tests::{eventually, Server, TestDb, DEADLINE};

use kafka_common::{by_key, consume, insert_keyed};

/// The `txoutbox` binary of this build: `TXOUTBOX_BIN`, or the one cargo built next to
/// the test executable (`cargo nextest run --workspace` builds it).
pub(crate) fn binary() -> PathBuf {
    if let Ok(path) = std::env::var("TXOUTBOX_BIN") {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("test executable path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>");
    let binary = profile_dir.join("txoutbox");
    assert!(
        binary.exists(),
        "{} is missing: run the tests with `cargo nextest run --workspace` (or build it with `cargo build -p txoutbox-client --features kafka --bin txoutbox`)",
        binary.display()
    );
    binary
}

/// `txoutbox --server URL ARGS...`, without the caller's `TXOUTBOX_*` variables.
fn command(server: &str, args: &[&str]) -> Command {
    let mut command = Command::new(binary());
    command
        .arg("--server")
        .arg(server)
        .args(args)
        .env_remove("TXOUTBOX_SERVER")
        .env_remove("TXOUTBOX_OUTBOX")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    command
}

pub(crate) async fn txoutbox(server: &str, args: &[&str]) -> Output {
    let output = tokio::time::timeout(DEADLINE, command(server, args).output())
        .await
        .expect("txoutbox did not exit in time")
        .unwrap();
    eprintln!(
        "$ txoutbox {}\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

pub(crate) fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

pub(crate) fn json(output: &Output) -> Value {
    assert!(output.status.success(), "{output:?}");
    serde_json::from_slice(&output.stdout).expect("JSON output")
}

fn json_lines(output: &Output) -> Vec<Value> {
    stdout(output)
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect()
}

/// Sends SIGTERM to a running child.
fn terminate(child: &Child) {
    let pid = child.id().expect("still running").to_string();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(status.success());
}

#[tokio::test]
async fn stats_shows_a_table_and_json() {
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    db.insert("orders.paid", Some("k"), b"1").await;
    db.insert("orders.paid", Some("k"), b"2").await;
    db.insert("orders.shipped", None, b"3").await;

    // The server's only outbox is used when --outbox is left out.
    let output = txoutbox(&server.url(), &["stats"]).await;
    assert!(output.status.success(), "{output:?}");
    let table = stdout(&output);
    assert!(table.contains("outbox orders"), "{table}");
    assert!(
        table.contains("TOPIC           PENDING  LEASED  RETRY WAITING  DEAD  OLDEST PENDING"),
        "{table}"
    );
    let row = |topic: &str| {
        table
            .lines()
            .find(|line| line.starts_with(topic))
            .unwrap_or_else(|| panic!("no row {topic} in\n{table}"))
            .split_whitespace()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    assert_eq!(row("orders.paid")[1..4], ["2", "0", "0"]);
    assert_eq!(row("orders.shipped")[1..4], ["1", "0", "0"]);
    assert_eq!(row("(all topics)")[2..5], ["3", "0", "0"]);

    let stats = json(
        &txoutbox(
            &server.url(),
            &["--outbox", "orders", "stats", "--format", "json"],
        )
        .await,
    );
    assert_eq!(stats["outbox"], "orders");
    assert_eq!(stats["total"]["pending"], 3);
    assert!(stats["total"]["oldest_pending_age_ms"].as_u64().is_some());
    assert_eq!(stats["topics"].as_array().unwrap().len(), 2);
    db.drop().await;
}

#[tokio::test]
async fn insert_then_tail_acks_exactly_count_and_looking_burns_no_attempt() {
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let url = server.url();
    let mut ids = Vec::new();
    for n in 1..=3 {
        let payload = format!("{{\"n\": {n}}}");
        let output = txoutbox(
            &url,
            &[
                "--outbox",
                "orders",
                "insert",
                "--topic",
                "orders.paid",
                "--key",
                "order-1",
                "--header",
                "traceparent=00-abc",
                "--format",
                "json",
                &payload,
            ],
        )
        .await;
        ids.push(json(&output)["id"].as_i64().unwrap());
    }
    let help = txoutbox(&url, &["insert", "--help"]).await;
    assert!(stdout(&help).contains("NOT transactional with your data"));

    // Consume two: printed in order, acked, and nothing else touched.
    let output = txoutbox(
        &url,
        &["--outbox", "orders", "tail", "--ack", "--count", "2"],
    )
    .await;
    assert!(output.status.success(), "{output:?}");
    let lines = json_lines(&output);
    assert_eq!(lines.len(), 2);
    for (line, id) in lines.iter().zip(&ids) {
        assert_eq!(line["id"], *id);
        assert_eq!(line["topic"], "orders.paid");
        assert_eq!(line["key"], "order-1");
        assert_eq!(line["headers"]["traceparent"], "00-abc");
        assert_eq!(line["attempts"], 1);
        assert!(line["created_at"].as_str().unwrap().ends_with('Z'));
    }
    assert_eq!(lines[0]["payload"], "{\"n\": 1}");
    assert_eq!(db.row(ids[0]).await, ("done".to_owned(), 1, None));
    assert_eq!(db.row(ids[1]).await, ("done".to_owned(), 1, None));
    assert_eq!(db.row(ids[2]).await, ("pending".to_owned(), 0, None));

    // Look without acking: printed, then given back untried at exit.
    let output = txoutbox(&url, &["tail", "--count", "1"]).await;
    assert!(output.status.success(), "{output:?}");
    let lines = json_lines(&output);
    assert_eq!(lines[0]["id"], ids[2]);
    assert_eq!(db.row(ids[2]).await, ("pending".to_owned(), 0, None));

    // Without --count it follows until SIGTERM, and still gives back what it holds.
    let mut child = command(&url, &["tail"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(DEADLINE, lines.next_line())
        .await
        .expect("tail printed nothing")
        .unwrap()
        .unwrap();
    assert_eq!(serde_json::from_str::<Value>(&first).unwrap()["id"], ids[2]);
    terminate(&child);
    let status = tokio::time::timeout(DEADLINE, child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(0));
    assert_eq!(db.row(ids[2]).await, ("pending".to_owned(), 0, None));
    db.drop().await;
}

#[tokio::test]
async fn schema_prints_the_ddl() {
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let output = txoutbox(&server.url(), &["schema", "orders"]).await;
    assert!(output.status.success(), "{output:?}");
    let sql = stdout(&output);
    assert!(sql.contains("CREATE TABLE IF NOT EXISTS"), "{sql}");
    assert!(sql.contains(&db.schema), "{sql}");
    let json = json(&txoutbox(&server.url(), &["schema", "orders", "--format", "json"]).await);
    assert_eq!(json["sql"].as_str().unwrap().trim_end(), sql.trim_end());
    db.drop().await;
}

#[tokio::test]
async fn purge_deletes_delivered_rows_only() {
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let url = server.url();
    let delivered = db.insert("t", None, b"delivered").await;
    let output = txoutbox(&url, &["tail", "--ack", "--count", "1"]).await;
    assert!(output.status.success(), "{output:?}");
    let pending = db.insert("t", None, b"pending").await;
    tokio::time::sleep(Duration::from_millis(50)).await;

    let purged = json(&txoutbox(&url, &["purge", "--older-than", "1ms", "--format", "json"]).await);
    assert_eq!(purged["deleted"], 1);
    assert_eq!(db.count("done").await, 0);
    assert_eq!(db.row(pending).await.0, "pending");
    let _ = delivered;

    let output = txoutbox(&url, &["purge", "--older-than", "7d"]).await;
    assert!(output.status.success(), "{output:?}");
    assert!(stdout(&output).contains("deleted 0 delivered rows older than 7days"));
    // A bad argument is a usage error, from clap or from the server.
    assert_eq!(
        txoutbox(&url, &["purge", "--older-than", "soon"])
            .await
            .status
            .code(),
        Some(2)
    );
    assert_eq!(
        txoutbox(&url, &["purge", "--older-than", "0s"])
            .await
            .status
            .code(),
        Some(2)
    );
    assert_eq!(txoutbox(&url, &["purge"]).await.status.code(), Some(2));
    db.drop().await;
}

#[tokio::test]
async fn health_reports_the_server_and_each_outbox() {
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let output = txoutbox(&server.url(), &["health"]).await;
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let table = stdout(&output);
    assert!(table.contains("(server)  SERVING"), "{table}");
    assert!(table.contains("orders    SERVING"), "{table}");
    let health = json(
        &txoutbox(
            &server.url(),
            &["--outbox", "orders", "health", "--format", "json"],
        )
        .await,
    );
    assert_eq!(health["server"], "SERVING");
    assert_eq!(health["outboxes"]["orders"], "SERVING");
    db.drop().await;
}

#[tokio::test]
async fn an_unreachable_server_exits_3() {
    // Nobody listens there: the port was free a moment ago.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    for args in [&["stats"][..], &["--outbox", "orders", "tail"], &["health"]] {
        let output = txoutbox(&url, args).await;
        assert_eq!(output.status.code(), Some(3), "{args:?}: {output:?}");
        assert!(stderr(&output).contains("cannot connect"), "{output:?}");
        assert!(
            stderr(&output).contains("--server"),
            "a hint names the flag"
        );
    }
}

#[tokio::test]
async fn an_unknown_outbox_exits_4_naming_the_configured_ones() {
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    for args in [
        &["--outbox", "nope", "stats"][..],
        &["--outbox", "nope", "tail", "--count", "1"],
        &["--outbox", "nope", "health"],
        &["schema", "nope"],
        &["--outbox", "nope", "insert", "--topic", "t", "x"],
    ] {
        let output = txoutbox(&server.url(), args).await;
        assert_eq!(output.status.code(), Some(4), "{args:?}: {output:?}");
        assert!(
            stderr(&output).contains("outbox `nope` is not configured; configured: orders"),
            "{args:?}: {output:?}"
        );
    }
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_to_kafka_delivers_in_order_and_stops_on_sigterm() {
    let cluster = MockCluster::new(1).unwrap();
    cluster.create_topic("cli.orders.paid", 3, 1).unwrap();
    let bootstrap = cluster.bootstrap_servers();
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let ids = insert_keyed(&db, "orders.paid", 4, 5).await;

    let mut relay = command(
        &server.url(),
        &[
            "--outbox",
            "orders",
            "relay",
            "--kafka",
            &bootstrap,
            "--topic-prefix",
            "cli.",
            "-X",
            "linger.ms=1",
        ],
    )
    .env("RUST_LOG", "info")
    .spawn()
    .unwrap();
    eventually("every row relayed", DEADLINE, || async {
        (db.count("done").await == ids.len() as i64).then_some(())
    })
    .await;
    terminate(&relay);
    let status = tokio::time::timeout(DEADLINE, relay.wait())
        .await
        .expect("the relay did not stop on SIGTERM")
        .unwrap();
    assert_eq!(status.code(), Some(0));

    let records = consume(&bootstrap, "cli.orders.paid", 3, ids.len());
    assert_eq!(records.len(), ids.len());
    for record in &records {
        assert!(ids.contains(&record.id()));
        assert_eq!(record.outbox_topic(), "orders.paid");
    }
    for (key, seqs) in by_key(&records) {
        assert_eq!(seqs, (0..5).collect::<Vec<_>>(), "key {key}");
    }
    db.drop().await;
}

/// `--tls-ca` and `--token` (or `TXOUTBOX_TOKEN`), and `--tls-cert`/`--tls-key`
/// under mutual TLS; addresses default to https:// with any TLS option.
#[tokio::test]
async fn cli_speaks_tls_with_a_token_or_a_client_certificate() {
    let db = TestDb::new().await;
    let files = TlsFiles::new();
    let identity = token_identity("ops", "ops-token", r#"{ "*" = ["admin"] }"#)
        + "certificate_names = [\"ops.example\"]\n";
    let config = format!("{}\n{}\n{identity}", db.config(""), files.config(true))
        .replace("client_ca =", "client_cert_optional = true\nclient_ca =");
    let server = Server::start(&config).await;
    let ca = files.path("ca.pem");
    let ca = ca.to_str().unwrap();
    let address = server.address.as_str();

    let output = txoutbox(
        address,
        &[
            "--tls-ca",
            ca,
            "--token",
            "ops-token",
            "--outbox",
            "orders",
            "stats",
            "--format",
            "json",
        ],
    )
    .await;
    assert!(output.status.success(), "{}", stderr(&output));
    let stats: Value = serde_json::from_str(stdout(&output).trim()).unwrap();
    assert_eq!(stats["outbox"], "orders", "{stats}");

    let output = txoutbox(address, &["--tls-ca", ca, "--outbox", "orders", "stats"]).await;
    assert!(!output.status.success());
    assert!(
        stderr(&output).contains("credential"),
        "{}",
        stderr(&output)
    );

    let client = files.ca.client(files.dir.path(), "ops", "ops.example");
    let (cert, key) = (client.cert.to_str().unwrap(), client.key.to_str().unwrap());
    let output = txoutbox(
        address,
        &[
            "--tls-ca",
            ca,
            "--tls-cert",
            cert,
            "--tls-key",
            key,
            "--outbox",
            "orders",
            "stats",
        ],
    )
    .await;
    assert!(output.status.success(), "{}", stderr(&output));

    // A plain http:// address with TLS options says what to change.
    let plain = format!("http://{address}");
    let output = txoutbox(&plain, &["--tls-ca", ca, "stats"]).await;
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(stderr(&output).contains("https://"), "{}", stderr(&output));
    db.drop().await;
}

/// One outbox, two groups, from the command line: each `tail --group` consumes every
/// row, `stats` shows the groups, `seek` replays (a dry run first), `dead --group` lists.
#[tokio::test]
async fn groups_tail_stats_seek_and_dead_letters() {
    let db = TestDb::new().await;
    let config = db.config(
        "partitions = 2\n[outboxes.orders.groups.kafka]\n[outboxes.orders.groups.search]\n",
    );
    let server = Server::start_serving(&config).await;
    let url = server.url();
    for i in 0..3 {
        db.insert("orders.paid", Some("k"), format!("{i}").as_bytes())
            .await;
    }
    for group in ["kafka", "search"] {
        let output = txoutbox(&url, &["tail", "--group", group, "--ack", "--count", "3"]).await;
        assert!(output.status.success(), "{output:?}");
        let payloads: Vec<Value> = json_lines(&output)
            .iter()
            .map(|line| line["payload"].clone())
            .collect();
        assert_eq!(payloads, ["0", "1", "2"], "group {group} in order");
    }
    let no_group = txoutbox(&url, &["tail", "--count", "1"]).await;
    assert!(!no_group.status.success());
    assert!(
        stderr(&no_group).contains("subscribe with a group"),
        "{no_group:?}"
    );

    let stats = eventually("both groups caught up", DEADLINE, || {
        let url = url.clone();
        async move {
            let stats = json(&txoutbox(&url, &["stats", "--format", "json"]).await);
            let groups = stats["groups"].as_array().cloned().unwrap_or_default();
            (groups.len() == 2 && groups.iter().all(|g| g["lag_rows"] == 0)).then_some(stats)
        }
    })
    .await;
    assert_eq!(stats["groups"][0]["group"], "kafka");
    let table = stdout(&txoutbox(&url, &["stats"]).await);
    assert!(
        table.contains("GROUP") && table.contains("search"),
        "{table}"
    );

    let dry = txoutbox(
        &url,
        &["seek", "--group", "search", "--to", "oldest", "--dry-run"],
    )
    .await;
    assert!(stdout(&dry).contains("would deliver 3 rows"), "{dry:?}");
    let moved = json(
        &txoutbox(
            &url,
            &[
                "seek", "--group", "search", "--to", "oldest", "--format", "json",
            ],
        )
        .await,
    );
    assert_eq!(moved["rows_ahead"], 3);
    let replay = txoutbox(
        &url,
        &["tail", "--group", "search", "--ack", "--count", "3"],
    )
    .await;
    assert_eq!(json_lines(&replay).len(), 3, "{replay:?}");
    let bad = txoutbox(&url, &["seek", "--group", "search", "--to", "yesterday"]).await;
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");

    let dead = json(
        &txoutbox(
            &url,
            &["dead", "list", "--group", "kafka", "--format", "json"],
        )
        .await,
    );
    assert_eq!(
        dead["dead_letters"].as_array().map(Vec::len),
        Some(0),
        "{dead}"
    );
    db.drop().await;
}
