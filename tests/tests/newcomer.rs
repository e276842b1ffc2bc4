//! A newcomer's first five minutes, kept true: the commands the server prints at start-up,
//! run as printed against a real `txoutboxd` on its embedded default, in a temporary
//! directory; and `scripts/test`, which sets a machine up, is quick when it is set up.
//!
//! Commands run through `sh -c` exactly as printed or written, in a process group of their
//! own so that stopping one reaches everything it started. The subscriber is the Python
//! example's wrapper, which makes its venv on first use (from PyPI): hence the long
//! deadline, though `scripts/test` makes the venv before the suite starts.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};
use txoutbox_tests::{eventually, Server, SqliteDb, DEADLINE};

/// A first run of the Python example makes its venv and its stubs; machines are busy.
const SUBSCRIBER_DEADLINE: Duration = Duration::from_secs(300);

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

/// `scripts/test --setup-only` on a machine that has everything: it checks, and neither
/// installs nor starts anything. Every command that would change the machine is replaced
/// by one that fails saying what it was asked, so this test changes nothing either; a
/// check that never passes (a misspelt package, a service probed on the wrong port) fails
/// it. The suite runs through `scripts/test`, so here everything is in place.
#[test]
fn scripts_test_on_a_ready_machine_only_checks() {
    let stubs = tempfile::tempdir().unwrap();
    let changers = [
        "apt-get",
        "sudo",
        "cargo",
        "pg_ctlcluster",
        "start-stop-daemon",
        "install",
        "redis-server",
        "rabbitmq-server",
        "mosquitto",
    ];
    for name in changers {
        let path = stubs.path().join(name);
        std::fs::write(
            &path,
            format!("#!/bin/sh\necho \"would run: {name} $*\" >&2\nexit 97\n"),
        )
        .unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let path = format!(
        "{}:{}",
        stubs.path().display(),
        std::env::var("PATH").unwrap()
    );
    let started = Instant::now();
    let output = std::process::Command::new(repository().join("scripts/test"))
        .arg("--setup-only")
        .env("PATH", path)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stderr.is_empty(),
        "scripts/test wanted to change this machine ({}):\n{stderr}",
        output.status
    );
    // "Seconds of overhead": about one on an idle machine.
    eprintln!("scripts/test --setup-only took {took:?}");
    assert!(took < Duration::from_secs(30), "took {took:?}");
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
