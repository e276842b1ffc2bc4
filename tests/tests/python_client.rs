//! The Python example publisher (`client/python/txoutbox_subscriber.py`) against a real
//! `txoutboxd`: proves the protocol is comfortable from generated stubs outside Rust, and
//! keeps the example in step with the protocol.
//!
//! Python runs in a venv under the cargo target directory (`target/python-venv`), made
//! once with `client/python/requirements.txt` and remade only when that file changes.

use std::fs::{self, File};
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::process::{Command as StdCommand, Output, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::Command;
use txoutbox_tests::{Server, TestDb};

/// Generous: the first run generates the stubs, and test machines are busy.
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(180);

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
    let python = python_venv().await;
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let ids = insert_rows(&db).await;

    let lines = run_subscriber(&python, &server, &["--count", "5"]).await;

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
    let python = python_venv().await;
    let db = TestDb::new().await;
    let fast_retries = "backoff.base = \"100ms\"\nbackoff.jitter = 0.0";
    let server = Server::start_serving(&db.config(fast_retries)).await;
    let ids = insert_rows(&db).await;

    let lines = run_subscriber(&python, &server, &["--count", "5", "--nack-first-attempt"]).await;

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
    let python = python_venv().await;
    let nobody = ["--server", "127.0.0.1:1", "--connect-timeout", "1"];
    let (code, stderr) = run_failing(&python, &nobody).await;
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("cannot connect to 127.0.0.1:1"), "{stderr}");

    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let (code, stderr) = run_failing(
        &python,
        &["--server", server.address.as_str(), "--outbox", "nope"],
    )
    .await;
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("NOT_FOUND") && stderr.contains("`nope`"),
        "{stderr}"
    );
    db.drop().await;
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
async fn run_subscriber(python: &Path, server: &Server, args: &[&str]) -> Vec<Value> {
    let mut all_args = vec![
        "--server",
        server.address.as_str(),
        "--outbox",
        "orders",
        "--subscriber",
        "python-e2e",
    ];
    all_args.extend_from_slice(args);
    let output = run_script(python, &all_args).await;
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
async fn run_failing(python: &Path, args: &[&str]) -> (i32, String) {
    let output = run_script(python, args).await;
    let code = output
        .status
        .code()
        .expect("exited, not killed by a signal");
    (code, String::from_utf8_lossy(&output.stderr).into_owned())
}

/// Runs `txoutbox_subscriber.py` with a deadline, echoing its stderr to the test's output.
async fn run_script(python: &Path, args: &[&str]) -> Output {
    let script = repository().join("client/python/txoutbox_subscriber.py");
    let mut child = Command::new(python)
        .arg(&script)
        .args(args)
        .env("TXOUTBOX_STUBS_DIR", target_dir().join("python-stubs"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {} {}: {e}", python.display(), script.display()));
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

/// The venv's interpreter, with the client's requirements installed.
async fn python_venv() -> PathBuf {
    static VENV: OnceLock<PathBuf> = OnceLock::new();
    match tokio::task::spawn_blocking(|| VENV.get_or_init(prepare_venv).clone()).await {
        Ok(python) => python,
        Err(error) => std::panic::resume_unwind(error.into_panic()),
    }
}

/// Creates or reuses `target/python-venv`. A lock file serializes test processes; a
/// copy of the requirements inside the venv tells whether it is up to date.
fn prepare_venv() -> PathBuf {
    let target = target_dir();
    let venv = target.join("python-venv");
    let python = venv.join("bin").join("python");
    let requirements_path = repository().join("client/python/requirements.txt");
    let requirements = fs::read(&requirements_path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", requirements_path.display()));
    let installed_copy = venv.join("txoutbox-requirements.txt");

    let lock_file =
        File::create(target.join("python-venv.lock")).expect("creating the venv lock file");
    let mut lock = fd_lock::RwLock::new(lock_file);
    let _guard = lock.write().expect("locking the venv");

    let up_to_date = fs::read(&installed_copy).is_ok_and(|copy| copy == requirements)
        && run_quietly(StdCommand::new(&python).args(["-c", "import grpc, grpc_tools"])).is_ok();
    if up_to_date {
        return python;
    }
    let base = base_python();
    eprintln!(
        "creating {} with {}",
        venv.display(),
        requirements_path.display()
    );
    if venv.exists() {
        fs::remove_dir_all(&venv).expect("removing the outdated venv");
    }
    run_quietly(StdCommand::new(&base).args(["-m", "venv"]).arg(&venv)).unwrap_or_else(|output| {
        panic!("`{base} -m venv` failed (on Debian or Ubuntu: apt-get install python3-venv):\n{output}")
    });
    let mut pip = StdCommand::new(&python);
    pip.args([
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        "--quiet",
        "-r",
    ])
    .arg(&requirements_path);
    run_quietly(&mut pip).unwrap_or_else(|output| panic!("pip install failed:\n{output}"));
    fs::write(&installed_copy, &requirements).expect("recording the installed requirements");
    python
}

/// The interpreter that creates the venv: `TXOUTBOX_TEST_PYTHON`, or `python3`.
fn base_python() -> String {
    let python = std::env::var("TXOUTBOX_TEST_PYTHON").unwrap_or_else(|_| "python3".to_owned());
    match StdCommand::new(&python).arg("--version").output() {
        Ok(output) if output.status.success() => python,
        Ok(output) => panic!(
            "`{python} --version` failed: {}",
            String::from_utf8_lossy(&output.stderr)
        ),
        Err(e) if e.kind() == ErrorKind::NotFound => panic!(
            "`{python}` not found: the Python client test needs CPython 3.9 or newer with venv \
             (on Debian or Ubuntu: apt-get install python3 python3-venv), or TXOUTBOX_TEST_PYTHON \
             set to an interpreter"
        ),
        Err(e) => panic!("running `{python}`: {e}"),
    }
}

/// Runs a command to completion; on failure returns its combined output.
fn run_quietly(command: &mut StdCommand) -> Result<(), String> {
    match command.stdin(Stdio::null()).output() {
        Ok(output) if output.status.success() => Ok(()),
        Ok(output) => Err(format!(
            "{}\n{}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )),
        Err(e) => Err(e.to_string()),
    }
}
