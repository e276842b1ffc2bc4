//! A newcomer's first five minutes, kept true: the commands the server prints at start-up
//! and the README's opening (its two commands, then "Try it"), run as written against a
//! real `txoutboxd` on its embedded default, in a temporary directory. (`scripts/test`,
//! which sets a machine up: `setup_script.rs`.)
//!
//! Commands run through `sh -c` exactly as printed or written, in a process group of their
//! own so that stopping one reaches everything it started. The subscriber is the Python
//! example's wrapper, which makes its venv on first use (from PyPI): hence the long
//! deadline, though `scripts/test` makes the venv before the suite starts.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};
use txoutbox_tests::{eventually, Server, SqliteDb, DEADLINE};

/// A first run of the Python example makes its venv and its stubs; machines are busy.
const SUBSCRIBER_DEADLINE: Duration = Duration::from_secs(300);

/// The address the README's commands use: the server's default `server.listen`.
const README_ADDRESS: &str = "127.0.0.1:7411";

#[tokio::test]
async fn the_commands_printed_at_start_work_as_printed() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_embedded(dir.path()).await;
    server.wait_serving("default").await;
    let fields = announcement(&server);
    let insert = fields["insert"].as_str().expect("an insert command");
    let subscribe = fields["subscribe"].as_str().expect("a subscribe command");
    // The server runs in a directory of its own, not in the clone: the script's path is
    // absolute there (from the repository root it is `client/python/subscribe`).
    let script = repository().join("client/python/subscribe");
    assert_eq!(
        subscribe,
        format!(
            "{} --server {} --outbox default",
            script.display(),
            server.address
        )
    );

    // Both from the server's working directory, where a user who started it is.
    let output = run(insert, dir.path(), DEADLINE).await;
    assert!(output.status.success(), "`{insert}` failed");

    // The printed subscriber runs until stopped: wait for the row, then Ctrl-C it.
    let mut subscriber = Running::start(subscribe, dir.path());
    let line = subscriber
        .next_json_line(SUBSCRIBER_DEADLINE)
        .await
        .unwrap_or_else(|| panic!("`{subscribe}` printed no message"));
    assert_eq!(
        (&line["topic"], &line["payload"], &line["answer"]),
        (&json!("demo"), &json!("hello"), &json!("ack")),
        "{line}"
    );
    let db = SqliteDb::at(&dir.path().join("txoutbox.db"));
    eventually("the row to be done", DEADLINE, || async {
        (db.count("done").await == 1).then_some(())
    })
    .await;
    subscriber.interrupt(DEADLINE).await;
    db.drop().await;
}

/// The line a newcomer reads: text format (the default), the server started from the
/// repository root as the README does, so the subscriber's path is relative. Each command
/// runs from there as it is printed: `insert=` up to ` subscribe=`, `subscribe=` to the
/// end of the line (no colour codes when the log is not a terminal).
#[tokio::test]
async fn the_text_start_up_line_works_as_printed_from_the_repository_root() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("txoutbox.db");
    let root = repository();
    let server = Server::start_embedded_text(&root, &file).await;
    server.wait_serving("default").await;
    let line = {
        let log = server.log.lock().unwrap();
        let lines: Vec<&String> = log
            .iter()
            .filter(|line| line.contains("embedded default"))
            .collect();
        assert_eq!(lines.len(), 1, "{lines:?}");
        lines[0].clone()
    };
    assert!(!line.contains('\x1b'), "colour codes in a pipe: {line:?}");
    assert!(!line.starts_with('{'), "the text format: {line}");
    let (_, commands) = line.split_once(" insert=").expect("insert=");
    let (insert, subscribe) = commands.split_once(" subscribe=").expect("subscribe=");
    assert_eq!(
        subscribe,
        format!(
            "client/python/subscribe --server {} --outbox default",
            server.address
        ),
        "relative to the repository root"
    );

    let output = run(insert, &root, DEADLINE).await;
    assert!(output.status.success(), "`{insert}` failed");
    let mut subscriber = Running::start(subscribe, &root);
    let line = subscriber
        .next_json_line(SUBSCRIBER_DEADLINE)
        .await
        .unwrap_or_else(|| panic!("`{subscribe}` printed no message"));
    assert_eq!(
        (&line["topic"], &line["payload"], &line["answer"]),
        (&json!("demo"), &json!("hello"), &json!("ack")),
        "{line}"
    );
    let db = SqliteDb::at(&file);
    eventually("the row to be done", DEADLINE, || async {
        (db.count("done").await == 1).then_some(())
    })
    .await;
    subscriber.interrupt(DEADLINE).await;
    db.drop().await;
}

#[tokio::test]
async fn the_readme_two_commands_are_the_server_and_the_test_script() {
    let commands = blocks(&readme_section("## Two commands"), "sh");
    assert_eq!(
        commands,
        [
            "cargo run --release -p txoutbox-server --bin txoutboxd",
            "scripts/test"
        ],
        "the README's two commands changed: update this test and what it checks"
    );

    // `-p txoutbox-server --bin txoutboxd` names this workspace's server binary, and no
    // argument follows: the embedded default, which `Server::start_embedded` runs.
    let metadata = std::process::Command::new(env!("CARGO"))
        .args(["metadata", "--no-deps", "--format-version", "1"])
        .current_dir(repository())
        .output()
        .unwrap();
    assert!(metadata.status.success(), "{metadata:?}");
    let metadata: Value = serde_json::from_slice(&metadata.stdout).unwrap();
    let server = metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|package| package["name"] == "txoutbox-server")
        .expect("a package txoutbox-server");
    let binaries: Vec<&Value> = server["targets"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|target| target["kind"] == json!(["bin"]))
        .map(|target| &target["name"])
        .collect();
    assert_eq!(binaries, [&json!("txoutboxd")]);

    // The test command is the script, and CI runs that same script.
    let script = repository().join("scripts/test");
    let mode = std::fs::metadata(&script).unwrap().permissions().mode();
    assert!(mode & 0o111 != 0, "scripts/test is not executable");
    let ci = std::fs::read_to_string(repository().join(".ci/run")).unwrap();
    assert!(
        ci.lines().any(|line| line == "scripts/test"),
        ".ci/run does not run scripts/test:\n{ci}"
    );
}

#[tokio::test]
async fn the_readme_try_it_works_as_written() {
    let section = readme_section("## Try it");
    let commands = blocks(&section, "sh");
    let [insert, subscribe] = commands.as_slice() else {
        panic!("`Try it` should hold two sh blocks, the insert and the subscriber: {commands:#?}");
    };
    let expected = blocks(&section, "json");
    let expected: Value = serde_json::from_str(&expected[0]).expect("the printed JSON line");
    assert!(
        subscribe.contains(&format!("--server {README_ADDRESS}")),
        "{subscribe}"
    );

    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_embedded(dir.path()).await;
    server.wait_serving("default").await;

    // The README's reader is in the clone, where `cargo run` made ./txoutbox.db. Here the
    // file is in the server's directory: the insert runs there, the subscriber (whose
    // path is relative to the clone) from the repository root, against this server's port.
    let output = run(insert, dir.path(), DEADLINE).await;
    assert!(output.status.success(), "the README's insert failed");
    let subscribe = subscribe.replace(README_ADDRESS, &server.address);
    let output = run(&subscribe, &repository(), SUBSCRIBER_DEADLINE).await;
    assert!(output.status.success(), "`{subscribe}` failed");

    let stdout = String::from_utf8(output.stdout).unwrap();
    let lines: Vec<Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect();
    assert_eq!(lines.len(), 1, "{stdout}");
    let line = &lines[0];
    let keys =
        |value: &Value| -> Vec<String> { value.as_object().unwrap().keys().cloned().collect() };
    assert_eq!(keys(line), keys(&expected), "{line}");
    for field in [
        "id", "topic", "key", "payload", "headers", "attempts", "answer",
    ] {
        assert_eq!(line[field], expected[field], "{field} of {line}");
    }
    // "exits once the server confirmed the ack": no waiting needed.
    let db = SqliteDb::at(&dir.path().join("txoutbox.db"));
    assert_eq!(db.count("done").await, 1);
    db.drop().await;
}

/// A command run through `sh -c` in `dir`, in a process group of its own, its stdout
/// read line by line and its stderr echoed to the test's output.
struct Running {
    child: Child,
    stdout: Lines<BufReader<ChildStdout>>,
}

impl Running {
    fn start(command: &str, dir: &Path) -> Self {
        let mut child = Command::new("sh")
            .args(["-c", command])
            .current_dir(dir)
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("starting `{command}`: {e}"));
        tokio::spawn(echo(child.stderr.take().unwrap()));
        let stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        Self { child, stdout }
    }

    /// The next line of stdout, as JSON; `None` when stdout ended.
    async fn next_json_line(&mut self, deadline: Duration) -> Option<Value> {
        let line = tokio::time::timeout(deadline, self.stdout.next_line())
            .await
            .expect("no output within the deadline")
            .unwrap()?;
        Some(serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON: {line:?}: {e}")))
    }

    /// Ctrl-C, as a user stops it: SIGINT to the whole group; waits for the exit.
    async fn interrupt(&mut self, deadline: Duration) -> ExitStatus {
        self.signal_group("-INT");
        tokio::time::timeout(deadline, self.child.wait())
            .await
            .expect("did not exit on SIGINT")
            .unwrap()
    }

    fn signal_group(&self, signal: &str) {
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .args([signal, "--", &format!("-{pid}")])
                .status();
        }
    }
}

impl Drop for Running {
    /// A failed test leaves nothing behind: the whole group goes, not only `sh`. Only
    /// while `sh` is unreaped: after that its id may belong to someone else's group.
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.signal_group("-KILL");
        }
    }
}

/// Runs `command` through `sh -c` in `dir` to completion, within `deadline`.
async fn run(command: &str, dir: &Path, deadline: Duration) -> std::process::Output {
    let mut running = Running::start(command, dir);
    let mut stdout = String::new();
    let read_all = async {
        while let Some(line) = running.stdout.next_line().await.unwrap() {
            stdout.push_str(&line);
            stdout.push('\n');
        }
        running.child.wait().await.unwrap()
    };
    let status = tokio::time::timeout(deadline, read_all)
        .await
        .unwrap_or_else(|_| panic!("`{command}` did not finish within {deadline:?}"));
    std::process::Output {
        status,
        stdout: stdout.into_bytes(),
        stderr: Vec::new(),
    }
}

async fn echo(pipe: impl AsyncRead + Unpin) {
    let mut lines = BufReader::new(pipe).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        eprintln!("[sh] {line}");
    }
}

/// The fields of the server's one start-up line about the embedded default.
fn announcement(server: &Server) -> Value {
    let log = server.log.lock().unwrap();
    let lines: Vec<&String> = log
        .iter()
        .filter(|line| line.contains("embedded default"))
        .collect();
    assert_eq!(lines.len(), 1, "{lines:?}");
    let line: Value = serde_json::from_str(lines[0]).unwrap();
    line["fields"].clone()
}

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// The README's text from `heading` to the next heading of the same level.
fn readme_section(heading: &str) -> String {
    let text = std::fs::read_to_string(repository().join("README.md")).unwrap();
    let section = text
        .split_once(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("README.md has no `{heading}`"))
        .1;
    section.split("\n## ").next().unwrap().to_owned()
}

/// The contents of the ```` ```lang ```` blocks of `text`, in order, without their last
/// newline.
fn blocks(text: &str, lang: &str) -> Vec<String> {
    let fence = format!("```{lang}\n");
    let mut found = Vec::new();
    let mut rest = text;
    while let Some((_, after)) = rest.split_once(&fence) {
        let (block, tail) = after.split_once("```").expect("a closed block");
        found.push(block.trim_end_matches('\n').to_owned());
        rest = tail;
    }
    found
}
