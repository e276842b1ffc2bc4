//! Harness of the end-to-end tests: a fresh PostgreSQL schema ([`TestDb`]), SQLite file
//! ([`SqliteDb`]) or MariaDB database ([`MariaDb`]) per test, or a team's own mapped
//! PostgreSQL table ([`MappedPgDb`]), all behind [`OutboxDb`], a real `txoutboxd` process
//! on a port of its own, a small streaming subscriber, and the journal of the per-key
//! order tests.
//!
//! Every wait is a condition polled against a generous deadline, never a bare sleep, so
//! the suite stays reliable on a busy two-core machine.
//!
//! [`bench`] is the benchmark tool (`txoutbox-bench`) built on the same harness, and
//! [`faults`] the fault-injection suite (`txoutbox-faults`, `tests/tests/faults.rs`).

pub mod bench;
pub mod binaries;
pub mod broker_process;
pub mod brokers;
pub mod cloudevents_check;
pub mod db;
pub mod faults;
pub mod journal;
pub mod mariadb;
pub mod moto;
pub mod nats_jwt;
pub mod otlp_receiver;
pub mod outbox_db;
pub mod pg_link;
pub mod pki;
pub mod prometheus;
pub mod rabbit_node;
pub mod relay_cli;
pub mod server;
pub mod sqlite_db;
pub mod subscriber;
pub mod tcp_proxy;
pub mod tls_server;
pub mod webhook_receiver;

use std::future::Future;
use std::time::Duration;

pub use db::TestDb;
pub use mariadb::MariaDb;
pub use outbox_db::{MappedPgDb, OutboxDb};
pub use server::Server;
pub use sqlite_db::SqliteDb;
pub use subscriber::Subscriber;
pub use tcp_proxy::TcpProxy;

/// Deadline for conditions that should hold within a second on an idle machine.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// Polls `condition` every 25ms until it returns `Some`, or panics after `deadline`.
pub async fn eventually<T, F, Fut>(what: &str, deadline: Duration, mut condition: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let started = tokio::time::Instant::now();
    loop {
        if let Some(value) = condition().await {
            return value;
        }
        if started.elapsed() > deadline {
            panic!("timed out after {deadline:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// A port nobody listens on right now, for a server started later.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
