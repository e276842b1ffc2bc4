//! A RabbitMQ node of the test's own with an AMQPS listener only, beside the machine's
//! shared node (which is never touched): its own node name, AMQPS and distribution ports,
//! configuration, plugins file (none), database and logs, all in a directory of its own.
//! It runs as the user running the tests (the real start script, not Debian's wrapper
//! that switches to the `rabbitmq` user) and is stopped with SIGTERM by its pid when
//! dropped. Booting takes from a few seconds to half a minute on a busy machine.

use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

use crate::pki::TlsFiles;
use crate::{eventually, free_port};

const START_SCRIPT: &str = "/usr/lib/rabbitmq/bin/rabbitmq-server";

pub struct RabbitTlsNode {
    pub port: u16,
    child: Child,
    dir: tempfile::TempDir,
}

impl RabbitTlsNode {
    /// Starts the node with the server certificate of `tls`; clients must present a
    /// certificate of its CA (`verify_peer`, `fail_if_no_peer_cert`).
    pub async fn start(tls: &TlsFiles) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let (port, dist_port) = (free_port(), free_port());
        let file = |name: &str| tls.path(name).display().to_string();
        let config = format!(
            "listeners.tcp = none\nlisteners.ssl.1 = 127.0.0.1:{port}\n\
             ssl_options.cacertfile = {}\nssl_options.certfile = {}\nssl_options.keyfile = {}\n\
             ssl_options.verify = verify_peer\nssl_options.fail_if_no_peer_cert = true\n\
             loopback_users = none\n",
            file("ca.pem"),
            file("server.pem"),
            file("server.key"),
        );
        let path = |name: &str| dir.path().join(name).display().to_string();
        std::fs::write(path("rabbitmq.conf"), config).unwrap();
        std::fs::write(path("enabled_plugins"), "[].\n").unwrap();
        std::fs::write(path("env.conf"), "").unwrap();
        let node = format!("txoutbox-tls-{port}@localhost");
        let child = Command::new(START_SCRIPT)
            .env("RABBITMQ_CONF_ENV_FILE", path("env.conf"))
            .env("RABBITMQ_NODENAME", &node)
            .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_DIST_PORT", dist_port.to_string())
            .env("RABBITMQ_CONFIG_FILE", path("rabbitmq.conf"))
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", path("enabled_plugins"))
            .env("RABBITMQ_MNESIA_BASE", path("mnesia"))
            .env("RABBITMQ_LOG_BASE", path("log"))
            .env("RABBITMQ_PID_FILE", path("pid"))
            .env("ERL_EPMD_ADDRESS", "127.0.0.1")
            .env("HOME", dir.path())
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(path("out.log")).unwrap())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {START_SCRIPT} (scripts/test installs it): {e}"));
        let node = Self { port, child, dir };
        let address = format!("127.0.0.1:{port}");
        eventually(
            &format!("the RabbitMQ TLS node accepting on {address}"),
            Duration::from_secs(180),
            || async {
                tokio::net::TcpStream::connect(&address)
                    .await
                    .ok()
                    .map(drop)
            },
        )
        .await;
        node
    }

    /// The node's output so far, for a failed test's message.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("out.log")).unwrap_or_default()
    }
}

impl Drop for RabbitTlsNode {
    fn drop(&mut self) {
        // SIGTERM to the start script, which stops the Erlang node it runs.
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
        }
    }
}
