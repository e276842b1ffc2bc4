//! A real `txoutboxd` process, listening on a port the kernel picked, its log lines
//! echoed to the test's output.

use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::oneshot;
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use txoutbox_proto::v1::admin_client::AdminClient;
use txoutbox_proto::v1::relay_client::RelayClient;

use crate::{eventually, DEADLINE};

/// The `txoutboxd` binary of this build: `TXOUTBOXD_BIN`, or the one cargo built next to
/// the test executable (`cargo test --workspace` and `cargo nextest run --workspace`
/// build it).
pub fn binary() -> PathBuf {
    if let Ok(path) = std::env::var("TXOUTBOXD_BIN") {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("test executable path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>");
    let binary = profile_dir.join("txoutboxd");
    assert!(
        binary.exists(),
        "{} is missing: run the tests with `cargo nextest run --workspace` (or build it with `cargo build -p txoutbox-server`)",
        binary.display()
    );
    binary
}

/// Runs `txoutboxd --config FILE ARGS...` to completion (`check-config`, `schema`, or a
/// start that must fail), with `config` written to a temporary file.
pub fn run_to_exit(config: &str, args: &[&str]) -> std::process::Output {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    std::io::Write::write_all(&mut file, config.as_bytes()).unwrap();
    std::process::Command::new(binary())
        .arg("--config")
        .arg(file.path())
        .args(args)
        .env_remove("TXOUTBOX_CONFIG")
        .output()
        .unwrap()
}

pub struct Server {
    child: Child,
    pub address: String,
    /// Every log line the server printed so far.
    pub log: Arc<Mutex<Vec<String>>>,
    /// The configuration file, kept while the server runs; none for the embedded default.
    _config: Option<tempfile::NamedTempFile>,
}

impl Server {
    /// Starts `txoutboxd` with this configuration and waits until it listens.
    pub async fn start(config: &str) -> Self {
        Self::start_with_log(config, "info,txoutbox_server=debug", true).await
    }

    /// Like [`Server::start`] with the server's `RUST_LOG` filter chosen by the caller
    /// (it must keep `info` for the "listening" line), and with `echo` false only
    /// warnings and errors echoed: the benchmark must not pay for debug logging.
    pub async fn start_with_log(config: &str, rust_log: &str, echo: bool) -> Self {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        std::io::Write::write_all(&mut file, config.as_bytes()).unwrap();
        let mut command = Command::new(binary());
        command
            .arg("--config")
            .arg(file.path())
            .env("RUST_LOG", rust_log);
        Self::spawn(command, Some(file), echo).await
    }

    /// [`Server::start`] with these environment variables set for the server (the
    /// `OTEL_*` variables of the trace tests).
    pub async fn start_with_env(config: &str, env: &[(&str, &str)]) -> Self {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        std::io::Write::write_all(&mut file, config.as_bytes()).unwrap();
        let mut command = Command::new(binary());
        command
            .arg("--config")
            .arg(file.path())
            .env("RUST_LOG", "info,txoutbox_server=debug")
            .envs(env.iter().copied());
        Self::spawn(command, Some(file), true).await
    }

    /// Starts `txoutboxd` with no configuration at all, in `dir` as its working directory,
    /// so it serves the embedded default (a SQLite outbox `default` in `dir/txoutbox.db`).
    /// Only the port (`--listen`, to run beside other tests) and the log format (JSON, to
    /// read the address) are set; the test's own `TXOUTBOX_*` variables are not passed on.
    pub async fn start_embedded(dir: &std::path::Path) -> Self {
        let mut command = Self::embedded(dir);
        command.env("TXOUTBOX_SERVER__LOG_FORMAT", "json");
        Self::spawn(command, None, true).await
    }

    /// The embedded default as a newcomer sees it: text logs, started in `dir` (the
    /// repository root, as the README does it) with its SQLite file at `db`, out of the
    /// clone.
    pub async fn start_embedded_text(dir: &std::path::Path, db: &std::path::Path) -> Self {
        let mut command = Self::embedded(dir);
        command.arg("--db").arg(db);
        Self::spawn(command, None, true).await
    }

    fn embedded(dir: &std::path::Path) -> Command {
        let mut command = Command::new(binary());
        command
            .current_dir(dir)
            .args(["--listen", "127.0.0.1:0"])
            .env("RUST_LOG", "info,txoutbox_server=debug");
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("TXOUTBOX_") {
                command.env_remove(name);
            }
        }
        command
    }

    async fn spawn(
        mut command: Command,
        config: Option<tempfile::NamedTempFile>,
        echo: bool,
    ) -> Self {
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("starting txoutboxd");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (address_tx, address_rx) = oneshot::channel();
        tokio::spawn(echo_log(stderr, Arc::clone(&log), address_tx, echo));
        let address = tokio::time::timeout(DEADLINE, address_rx)
            .await
            .expect("txoutboxd did not report its address in time")
            .expect("txoutboxd exited before listening; see its log above");
        Self {
            child,
            address,
            log,
            _config: config,
        }
    }

    /// Starts the server and waits until outbox `orders` is SERVING (table created).
    pub async fn start_serving(config: &str) -> Self {
        let server = Self::start(config).await;
        server.wait_serving("orders").await;
        server
    }

    /// Process id, while the server runs (the benchmark reads its `/proc` entries).
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    pub async fn channel(&self) -> Channel {
        Endpoint::from_shared(self.url())
            .unwrap()
            .connect()
            .await
            .expect("connecting to txoutboxd")
    }

    pub async fn relay(&self) -> RelayClient<Channel> {
        RelayClient::new(self.channel().await)
    }

    pub async fn admin(&self) -> AdminClient<Channel> {
        AdminClient::new(self.channel().await)
    }

    pub async fn health(&self, service: &str) -> ServingStatus {
        let mut client = HealthClient::new(self.channel().await);
        let request = HealthCheckRequest {
            service: service.to_owned(),
        };
        match client.check(request).await {
            Ok(response) => response.into_inner().status(),
            Err(_) => ServingStatus::Unknown,
        }
    }

    pub async fn wait_serving(&self, outbox: &str) {
        eventually(
            &format!("outbox {outbox} to be SERVING"),
            DEADLINE,
            || async { (self.health(outbox).await == ServingStatus::Serving).then_some(()) },
        )
        .await
    }

    /// Sends SIGTERM (graceful drain).
    pub fn terminate(&self) {
        self.signal("-TERM");
    }

    /// Sends SIGHUP: the TLS certificates are read again.
    pub fn hangup(&self) {
        self.signal("-HUP");
    }

    /// Sends SIGKILL: no drain, no goodbye.
    pub fn kill(&self) {
        self.signal("-KILL");
    }

    /// Sends SIGSTOP: the process stops where it is, its sockets stay open.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Sends SIGCONT after [`Server::pause`].
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let pid = self.child.id().expect("server still running").to_string();
        let status = std::process::Command::new("kill")
            .args([signal, &pid])
            .status()
            .unwrap();
        assert!(status.success(), "kill {signal} {pid} failed");
    }

    pub async fn wait_exit(&mut self, deadline: Duration) -> ExitStatus {
        tokio::time::timeout(deadline, self.child.wait())
            .await
            .expect("txoutboxd did not exit in time")
            .unwrap()
    }

    /// `http://ADDRESS/metrics`: the metrics listener's address from the "listening" line
    /// (`server.metrics_listen` must be set, and `log_format = "json"`).
    pub fn metrics_url(&self) -> String {
        format!("http://{}/metrics", self.metrics_address())
    }

    /// The `host:port` of the metrics listener.
    pub fn metrics_address(&self) -> String {
        let log = self.log.lock().unwrap();
        let line = log
            .iter()
            .find(|line| line.contains("txoutboxd listening"))
            .expect("the listening line");
        let value: serde_json::Value = serde_json::from_str(line).expect("JSON log line");
        value["fields"]["metrics_address"]
            .as_str()
            .expect("metrics_address in the listening line: is server.metrics_listen set?")
            .to_owned()
    }

    /// How many log lines so far contain `needle`.
    pub fn log_count(&self, needle: &str) -> usize {
        let log = self.log.lock().unwrap();
        log.iter().filter(|line| line.contains(needle)).count()
    }

    /// Whether a line read so far contains `needle`: for a line that must not be there
    /// (read it after waiting for a later line, or it passes before the line could
    /// arrive). A line that must be there is waited for with [`Server::wait_for_log`].
    pub fn log_contains(&self, needle: &str) -> bool {
        self.log
            .lock()
            .unwrap()
            .iter()
            .any(|line| line.contains(needle))
    }

    /// The first log line containing `needle`, waited for. The log comes through a pipe
    /// read by a task of the test, so a line the server wrote before it answered a call
    /// may still be on its way when the answer is in.
    pub async fn wait_for_log(&self, needle: &str) -> String {
        self.wait_for_log_line(&format!("a log line with {needle:?}"), |line| {
            line.contains(needle)
        })
        .await
    }

    /// The first log line that `matches`, waited for as [`Server::wait_for_log`] does;
    /// `what` names it when none comes.
    pub async fn wait_for_log_line(&self, what: &str, matches: impl Fn(&str) -> bool) -> String {
        eventually(what, DEADLINE, || async {
            let log = self.log.lock().unwrap();
            log.iter().find(|line| matches(line)).cloned()
        })
        .await
    }
}

async fn echo_log(
    stderr: tokio::process::ChildStderr,
    log: Arc<Mutex<Vec<String>>>,
    address: oneshot::Sender<String>,
    echo: bool,
) {
    let mut address = Some(address);
    let mut lines = BufReader::new(stderr).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if echo {
            eprintln!("[txoutboxd] {line}");
        } else if line.contains("\"WARN\"") || line.contains("\"ERROR\"") {
            let short: String = line.chars().take(300).collect();
            eprintln!("[txoutboxd] {short}");
        }
        let listening = (address.is_some() && line.contains("txoutboxd listening"))
            .then(|| listening_address(&line));
        // In the log before the address is handed over: a test may read the listening
        // line (and every line before it) as soon as `start` returns.
        log.lock().unwrap().push(line);
        if let Some(said) = listening {
            let sender = address.take().expect("checked above");
            let _ = sender.send(said);
        }
    }
}

/// The `address` field of the "listening" line, in JSON or in text format.
fn listening_address(line: &str) -> String {
    if !line.starts_with('{') {
        let (_, after) = line.split_once(" address=").expect("address field");
        return after.split(' ').next().unwrap().to_owned();
    }
    let value: serde_json::Value = serde_json::from_str(line).expect("JSON log line");
    value["fields"]["address"]
        .as_str()
        .expect("address field")
        .to_owned()
}
