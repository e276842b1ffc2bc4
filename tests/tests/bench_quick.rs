//! The benchmark tool's quick mode, so `txoutbox-bench` cannot rot: it must run every
//! section end to end and print its table. No timing is asserted here: figures from a
//! debug build on a busy test machine mean nothing (see BENCHMARKS.md for the real run).

use std::process::Stdio;
use std::time::Duration;

use tokio::process::Command;

/// Quick mode takes well under a minute on an idle machine; CI machines are busy, and
/// the first run makes the Python venv.
const TIMEOUT: Duration = Duration::from_secs(600);

#[tokio::test]
async fn quick_mode_runs_every_section_and_prints_the_table() {
    let json = tempfile::NamedTempFile::new().unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_txoutbox-bench"))
        .arg("--quick")
        .arg("--json")
        .arg(json.path())
        .env("TXOUTBOXD_BIN", txoutbox_tests::server::binary())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("starting txoutbox-bench");
    let output = tokio::time::timeout(TIMEOUT, child.wait_with_output())
        .await
        .expect("txoutbox-bench --quick did not finish in time")
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprintln!("{stderr}");
    println!("{stdout}");
    assert!(output.status.success(), "txoutbox-bench --quick failed");

    for section in [
        "| drain ",
        "| ceiling ",
        "| latency ",
        "| claim cost ",
        "| memory ",
        "| idle cost ",
        "| pgmq ",
        "| limit ",
        "| pg cost ",
        "synchronous_commit = on",
        "1 subscriber, delete_on_ack",
        "| groups ",
        "group drain, 1,000 keys, ordering key",
        "4 groups on one backlog",
        "commit → receive through a group",
        "into the grouped outbox",
    ] {
        assert!(stdout.contains(section), "no `{section}` row in:\n{stdout}");
    }
    // The Python original is measured whenever its venv can be made; if not, the table
    // says so loudly instead.
    assert!(
        stdout.contains("| python ") || stdout.contains("PYTHON ORIGINAL WAS NOT MEASURED"),
        "neither Python rows nor the note saying why they are missing:\n{stdout}"
    );
    // Every other note is a measurement that failed.
    let failures: Vec<&str> = stdout
        .lines()
        .filter(|line| line.starts_with("NOTE:") && !line.contains("PYTHON ORIGINAL"))
        .collect();
    assert!(failures.is_empty(), "measurements failed: {failures:#?}");
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(json.path()).unwrap()).expect("JSON report");
    assert!(report["rows"]
        .as_array()
        .is_some_and(|rows| !rows.is_empty()));
}
