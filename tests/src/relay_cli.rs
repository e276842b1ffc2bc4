//! `txoutbox relay --BROKER ...` as a user runs it: the CLI binary of this build as a
//! child process, stopped with SIGTERM.

use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};

use tokio::process::{Child, Command};

use crate::{eventually, Server, TestDb, DEADLINE};

/// The `txoutbox` binary of this build: `TXOUTBOX_BIN`, or the one cargo built next to
/// the test executable (`cargo nextest run --workspace` builds it, with the features the
/// tests crate turns on).
pub fn binary() -> PathBuf {
    if let Ok(path) = std::env::var("TXOUTBOX_BIN") {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("test executable path");
    let binary = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>")
        .join("txoutbox");
    assert!(
        binary.exists(),
        "{} is missing: run the tests with `cargo nextest run --workspace` (or `cargo build -p txoutbox-client --features kafka,nats,amqp,webhook,redis,mqtt,sqs,sns --bin txoutbox`)",
        binary.display()
    );
    binary
}

/// Runs `txoutbox --server URL --outbox orders relay ARGS...` until every row of `db`
/// is done (`rows` of them), then stops it with SIGTERM and returns how it exited.
pub async fn relay_until_done(
    server: &Server,
    db: &TestDb,
    rows: usize,
    args: &[&str],
) -> ExitStatus {
    relay_until_done_with_env(server, db, rows, args, &[]).await
}

/// [`relay_until_done`] with these environment variables set for the relay.
pub async fn relay_until_done_with_env(
    server: &Server,
    db: &TestDb,
    rows: usize,
    args: &[&str],
    env: &[(&str, &str)],
) -> ExitStatus {
    let relay = spawn_with_env(server, args, env);
    eventually("every row relayed", DEADLINE, || async {
        (db.count("done").await == rows as i64).then_some(())
    })
    .await;
    stop(relay).await
}

/// Starts `txoutbox --server URL --outbox orders relay ARGS...` in the background (killed
/// if dropped; [`stop`] ends it as a user would).
pub fn spawn(server: &Server, args: &[&str]) -> Child {
    spawn_with_env(server, args, &[])
}

/// [`spawn`] with these environment variables set for the relay.
pub fn spawn_with_env(server: &Server, args: &[&str], env: &[(&str, &str)]) -> Child {
    Command::new(binary())
        .args(["--server", &server.url(), "--outbox", "orders", "relay"])
        .args(args)
        .env_remove("TXOUTBOX_SERVER")
        .env_remove("TXOUTBOX_OUTBOX")
        .env("RUST_LOG", "info")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// Sends SIGTERM to a relay of [`spawn`] and returns how it exited.
pub async fn stop(mut relay: Child) -> ExitStatus {
    terminate(&relay);
    tokio::time::timeout(DEADLINE, relay.wait())
        .await
        .expect("the relay did not stop on SIGTERM")
        .unwrap()
}

fn terminate(child: &Child) {
    let pid = child.id().expect("still running").to_string();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(status.success());
}
