//! A broker of the test's own, for tests that stop one mid-run: `nats-server` (JetStream)
//! or `redis-server` as a child process on a free port with its own store directory,
//! stopped with SIGTERM by its pid and started again on the same port and directory, so
//! what it stored survives, as when an operator restarts a broker. The machine's shared
//! brokers are never touched; a dropped [`BrokerProcess`] kills its child.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::sync::Mutex;

use crate::pki::TlsFiles;
use crate::{eventually, free_port, DEADLINE};

pub struct BrokerProcess {
    program: &'static str,
    args: Vec<String>,
    pub port: u16,
    /// The store (JetStream's files, Redis' append-only file) and the broker's log.
    dir: tempfile::TempDir,
    /// Behind a lock so that a test's `stop` and `start` closures can share the broker.
    child: Mutex<Option<Child>>,
}

impl BrokerProcess {
    /// `nats-server -js` on 127.0.0.1, its JetStream store in a directory of its own.
    pub async fn nats() -> Self {
        Self::start_new("nats-server", |dir, port| {
            vec![
                "-a".into(),
                "127.0.0.1".into(),
                "-p".into(),
                port.to_string(),
                "-js".into(),
                "-sd".into(),
                dir.join("jetstream").display().to_string(),
                "-l".into(),
                dir.join("nats.log").display().to_string(),
            ]
        })
        .await
    }

    /// `redis-server` on 127.0.0.1 with an append-only file (fsync'd every second, and on
    /// the SIGTERM of [`BrokerProcess::stop`]) in a directory of its own.
    pub async fn redis() -> Self {
        Self::start_new("redis-server", |dir, port| {
            [
                "--bind",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--dir",
                &dir.display().to_string(),
                "--appendonly",
                "yes",
                "--save",
                "",
                "--logfile",
                &dir.join("redis.log").display().to_string(),
            ]
            .map(str::to_owned)
            .to_vec()
        })
        .await
    }

    /// `redis-server` with TLS only, on 127.0.0.1: the server certificate of `tls`,
    /// clients must present a certificate of its CA (`tls-auth-clients yes`), and the
    /// password `password`.
    pub async fn redis_tls(tls: &TlsFiles, password: &str) -> Self {
        let file = |name: &str| tls.path(name).display().to_string();
        let (cert, key, ca) = (file("server.pem"), file("server.key"), file("ca.pem"));
        let password = password.to_owned();
        Self::start_new("redis-server", move |dir, port| {
            [
                "--bind",
                "127.0.0.1",
                "--port",
                "0",
                "--tls-port",
                &port.to_string(),
                "--tls-cert-file",
                &cert,
                "--tls-key-file",
                &key,
                "--tls-ca-cert-file",
                &ca,
                "--tls-auth-clients",
                "yes",
                "--requirepass",
                &password,
                "--dir",
                &dir.display().to_string(),
                "--save",
                "",
                "--logfile",
                &dir.join("redis.log").display().to_string(),
            ]
            .map(str::to_owned)
            .to_vec()
        })
        .await
    }

    /// `nats-server -c FILE` with the configuration `config(dir, port)` returns (it should
    /// listen on 127.0.0.1:port and log to `dir/nats.log`).
    pub async fn nats_configured(config: impl Fn(&Path, u16) -> String) -> Self {
        Self::start_new("nats-server", |dir, port| {
            let file = dir.join("nats.conf");
            std::fs::write(&file, config(dir, port)).unwrap();
            vec!["-c".into(), file.display().to_string()]
        })
        .await
    }

    /// `mosquitto -c FILE` with the configuration `config(port)` returns (it should
    /// have its listener on 127.0.0.1:port).
    pub async fn mosquitto(config: impl Fn(u16) -> String) -> Self {
        Self::start_new("mosquitto", |dir, port| {
            let file = dir.join("mosquitto.conf");
            std::fs::write(&file, config(port)).unwrap();
            vec!["-c".into(), file.display().to_string()]
        })
        .await
    }

    async fn start_new(program: &'static str, args: impl Fn(&Path, u16) -> Vec<String>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let broker = Self {
            program,
            args: args(dir.path(), port),
            port,
            dir,
            child: Mutex::new(None),
        };
        broker.start().await;
        broker
    }

    /// `127.0.0.1:PORT`.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Starts the broker (again) and waits until it accepts connections. Whether it is
    /// ready for more than a connection (JetStream recovering its streams) is for the
    /// client to find out: that is what a restart test is about.
    pub async fn start(&self) {
        self.start_with(&self.args).await;
    }

    /// Starts a NATS broker again without JetStream (no `-js`, no store): a server up
    /// whose streams are not, as while JetStream starts, recovers or has no leader.
    pub async fn start_without_jetstream(&self) {
        assert_eq!(self.program, "nats-server");
        let mut args = Vec::new();
        let mut given = self.args.iter();
        while let Some(arg) = given.next() {
            match arg.as_str() {
                "-js" => {}
                "-sd" => {
                    given.next();
                }
                _ => args.push(arg.clone()),
            }
        }
        self.start_with(&args).await;
    }

    async fn start_with(&self, args: &[String]) {
        let mut running = self.child.lock().await;
        assert!(running.is_none(), "{} already running", self.program);
        let child = Command::new(self.program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "starting {} (scripts/test checks it is installed): {e}",
                    self.program
                )
            });
        *running = Some(child);
        let address = self.address();
        eventually(
            &format!("{} accepting on {address}", self.program),
            DEADLINE,
            || async {
                tokio::net::TcpStream::connect(&address)
                    .await
                    .ok()
                    .map(drop)
            },
        )
        .await;
    }

    /// SIGTERM to the broker (by its pid), then waits until it has exited.
    pub async fn stop(&self) {
        let mut child = self
            .child
            .lock()
            .await
            .take()
            .expect("the broker is running");
        let pid = child.id().expect("not yet waited for").to_string();
        let status = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap();
        assert!(status.success(), "kill -TERM {pid}");
        let exited = tokio::time::timeout(Duration::from_secs(30), child.wait())
            .await
            .unwrap_or_else(|_| panic!("{} did not exit on SIGTERM", self.program));
        assert!(exited.is_ok());
    }

    /// The broker's log so far, for a failed test's message.
    pub fn log(&self) -> String {
        let name = if self.program == "nats-server" {
            "nats.log"
        } else {
            "redis.log"
        };
        std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default()
    }
}
