//! The processes of a fault run, each reached through a [`Link`] of the run so a fault
//! can cut it: two `txoutboxd` replicas (subscribers reach each through its client link,
//! it reaches a networked database through its database link), and subscriber processes
//! (the Rust runtime's `fault-subscriber` and the Python example) attached to one replica
//! each. Every process is signalled by its own pid; a killed one is started again.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use tokio::process::{Child, Command};

use super::database::Database;
use super::proxy::Link;
use crate::Server;

/// How long a SIGTERM may take (a replica's drain, a subscriber's stop) before SIGKILL.
const TERMINATE_WAIT: Duration = Duration::from_secs(20);

pub struct Replica {
    pub name: String,
    config: String,
    server: Server,
    /// Subscribers to this replica.
    pub client_link: Link,
    /// This replica to its database; none for SQLite.
    pub db_link: Option<Link>,
    pub restarts: u32,
    /// Every process's log of this replica, appended as each one ends.
    log: PathBuf,
}

impl Replica {
    /// A replica of an outbox declaring `groups` (none: per-row claims), its log kept in
    /// `dir` (`NAME.log`).
    pub async fn start(
        name: &str,
        db: &Database,
        groups: &[String],
        dir: &Path,
    ) -> anyhow::Result<Self> {
        let db_link = match db.server_address()? {
            Some(address) => Some(Link::start(address).await?),
            None => None,
        };
        let config = db.replica_config(name, db_link.as_ref().map(Link::address), groups);
        let server = start_server(&config).await;
        let client_link = Link::start(server.address.parse()?).await?;
        Ok(Self {
            name: name.to_owned(),
            config,
            server,
            client_link,
            db_link,
            restarts: 0,
            log: dir.join(format!("{name}.log")),
        })
    }

    /// Appends the ended process's log to the replica's file.
    fn keep_log(&self) {
        let lines = self.server.log.lock().expect("log lock").join("\n");
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .and_then(|mut file| writeln!(file, "{lines}\n--- process ended ---"));
        if let Err(error) = written {
            eprintln!("[faults] {}: {error}", self.log.display());
        }
    }

    pub fn server(&self) -> &Server {
        &self.server
    }

    /// SIGKILL, then a new process in its place.
    pub async fn kill_and_restart(&mut self) -> anyhow::Result<()> {
        self.server.kill();
        self.server.wait_exit(TERMINATE_WAIT).await;
        self.restart().await
    }

    /// SIGTERM (a graceful drain), SIGKILL if it outlasts [`TERMINATE_WAIT`], then a new
    /// process in its place.
    pub async fn terminate_and_restart(&mut self) -> anyhow::Result<()> {
        self.server.terminate();
        let exited = tokio::time::timeout(TERMINATE_WAIT, self.wait_exit()).await;
        if exited.is_err() {
            eprintln!(
                "[faults] {} did not drain in {TERMINATE_WAIT:?}: SIGKILL",
                self.name
            );
            self.server.kill();
            self.server.wait_exit(TERMINATE_WAIT).await;
        }
        self.restart().await
    }

    async fn wait_exit(&mut self) {
        self.server.wait_exit(TERMINATE_WAIT * 2).await;
    }

    async fn restart(&mut self) -> anyhow::Result<()> {
        self.keep_log();
        self.server = start_server(&self.config).await;
        self.client_link.set_upstream(self.server.address.parse()?);
        self.restarts += 1;
        Ok(())
    }

    /// Stops the process for good (the end of a run): SIGTERM, then SIGKILL.
    pub async fn stop(mut self) {
        self.server.terminate();
        if tokio::time::timeout(TERMINATE_WAIT, self.wait_exit())
            .await
            .is_err()
        {
            self.server.kill();
        }
        self.keep_log();
    }
}

async fn start_server(config: &str) -> Server {
    // `info` keeps the "listening" line the harness waits for; TXOUTBOX_FAULTS_LOG may ask
    // for more (`info,txoutbox_server::relay::groups=debug`) to follow a failure.
    let level = std::env::var("TXOUTBOX_FAULTS_LOG").unwrap_or_else(|_| "info".to_owned());
    let server = Server::start_with_log(config, &level, false).await;
    server.wait_serving("orders").await;
    server
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runtime {
    /// The Rust client runtime (`fault-subscriber`).
    Rust,
    /// The Python example (`client/python/subscribe`).
    Python,
}

/// Where the programs of the subscribers are.
#[derive(Debug, Clone)]
pub struct Programs {
    pub fault_subscriber: PathBuf,
    pub python_subscribe: PathBuf,
}

impl Programs {
    /// The Python wrapper of this repository, and `fault_subscriber` as given.
    pub fn new(fault_subscriber: PathBuf) -> Self {
        let repository = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("tests/ is inside the repository");
        Self {
            fault_subscriber,
            python_subscribe: repository.join("client/python/subscribe"),
        }
    }

    /// Makes the Python example's venv if missing (the first time, from PyPI).
    pub async fn prepare(&self) -> anyhow::Result<()> {
        let status = Command::new(&self.python_subscribe)
            .arg("--prepare")
            .status()
            .await
            .context("running client/python/subscribe --prepare")?;
        anyhow::ensure!(status.success(), "client/python/subscribe --prepare failed");
        Ok(())
    }
}

pub struct SubscriberProcess {
    pub name: String,
    pub runtime: Runtime,
    /// The subscription groups it joins (the Python example: one); empty with per-row
    /// claims.
    pub groups: Vec<String>,
    /// Index of the replica it subscribes to.
    pub replica: usize,
    /// The replica's client link.
    server: SocketAddr,
    pub journal: PathBuf,
    stderr: PathBuf,
    child: Child,
    /// Starts after the first: after a fault, or after it exited by itself.
    pub restarts: u32,
}

/// Lease the subscribers ask for: how long a dead or stopped subscriber's rows wait.
pub const LEASE_MS: u64 = 3000;

impl SubscriberProcess {
    pub fn start(
        programs: &Programs,
        name: &str,
        runtime: Runtime,
        groups: Vec<String>,
        replica: usize,
        server: SocketAddr,
        dir: &Path,
    ) -> anyhow::Result<Self> {
        let journal = dir.join(format!("{name}.journal"));
        let stderr = dir.join(format!("{name}.stderr"));
        let child = spawn(programs, name, runtime, &groups, server, &journal, &stderr)?;
        Ok(Self {
            name: name.to_owned(),
            runtime,
            groups,
            replica,
            server,
            journal,
            stderr,
            child,
            restarts: 0,
        })
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Sends `signal` (`-KILL`, `-TERM`, `-STOP`, `-CONT`) to this process.
    pub fn signal(&self, signal: &str) -> anyhow::Result<()> {
        let pid = self.pid().context("subscriber already reaped")?;
        let status = std::process::Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()?;
        anyhow::ensure!(status.success(), "kill {signal} {pid} failed");
        Ok(())
    }

    /// Waits for it to exit after a signal; SIGKILL if it outlasts [`TERMINATE_WAIT`].
    pub async fn wait_exit(&mut self) -> anyhow::Result<()> {
        if tokio::time::timeout(TERMINATE_WAIT, self.child.wait())
            .await
            .is_err()
        {
            eprintln!(
                "[faults] {} did not stop in {TERMINATE_WAIT:?}: SIGKILL",
                self.name
            );
            self.child.start_kill()?;
            self.child.wait().await?;
        }
        Ok(())
    }

    /// Whether it exited by itself (the Python example ends when its stream fails).
    pub fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// A new process in place of the one that exited.
    pub fn restart(&mut self, programs: &Programs) -> anyhow::Result<()> {
        self.child = spawn(
            programs,
            &self.name,
            self.runtime,
            &self.groups,
            self.server,
            &self.journal,
            &self.stderr,
        )?;
        self.restarts += 1;
        Ok(())
    }

    /// Stops it for good (the end of a run): SIGTERM, then SIGKILL.
    pub async fn stop(mut self) {
        if self.exited() {
            return;
        }
        let _ = self.signal("-TERM");
        let _ = self.wait_exit().await;
    }
}

/// Ends whatever line the previous process of this subscriber left unfinished. A write of
/// one line can be cut by `kill -9` (Linux stops a write between two pages of the file);
/// without this newline the next process's first line would be glued to the torn one, and
/// that whole publish read as torn too: a publish that happened, missing from the history.
pub fn start_journal_line(journal: &Path) -> std::io::Result<()> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(journal)?
        .write_all(b"\n")
}

fn spawn(
    programs: &Programs,
    name: &str,
    runtime: Runtime,
    groups: &[String],
    server: SocketAddr,
    journal: &Path,
    stderr: &Path,
) -> anyhow::Result<Child> {
    let append = |path: &Path| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
    };
    start_journal_line(journal)?;
    let lease = LEASE_MS.to_string();
    let mut command = match runtime {
        Runtime::Rust => {
            let mut command = Command::new(&programs.fault_subscriber);
            command
                .args([&format!("http://{server}"), "orders", name])
                .arg(journal)
                .arg(&lease)
                .args((!groups.is_empty()).then(|| groups.join(",")))
                .stdout(Stdio::null())
                .env("RUST_LOG", "warn");
            command
        }
        Runtime::Python => {
            let mut command = Command::new(&programs.python_subscribe);
            command
                .args(["--server", &server.to_string(), "--outbox", "orders"])
                .args(["--subscriber", name, "--lease-ms", &lease])
                .args(["--max-in-flight", "100", "--timestamps"])
                .args(["--connect-timeout", "60"])
                .stdout(append(journal)?);
            if let Some(group) = groups.first() {
                command.args(["--group", group]);
            }
            command
        }
    };
    command
        .stdin(Stdio::null())
        .stderr(append(stderr)?)
        .kill_on_drop(true);
    command
        .spawn()
        .with_context(|| format!("starting subscriber {name}"))
}
