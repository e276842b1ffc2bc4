//! The container image's `docker run` example starts: no Docker engine runs here, so the
//! test does what the image would. It reads `deploy/docker/Dockerfile`: the environment
//! the image sets, the configuration it copies where its entry point reads it, and the
//! `docker run` of its header (`-e` variables, `-v` mounts); it makes the files the
//! example mounts (a certificate and its key) and the token it passes, and starts
//! `txoutboxd` with all of that, as the container would, on a database of its own. The
//! server must serve TLS with the token's identity, and refuse to start without the
//! example's variables (the image alone, listening on 0.0.0.0 without TLS or identities).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use txoutbox_tests::pki::Ca;
use txoutbox_tests::{Server, TestDb};

use crate::cli_client::{stdout, txoutbox};

/// What the Dockerfile says about the server's image.
struct Image {
    /// `ENV` of the final stage.
    env: BTreeMap<String, String>,
    /// The `-e NAME=VALUE` of the header's `docker run`.
    run_env: BTreeMap<String, String>,
    /// The `-v HOST:CONTAINER[:ro]` of the header's `docker run`, as (host, container).
    mounts: Vec<(String, String)>,
}

impl Image {
    fn read() -> Self {
        let text = std::fs::read_to_string(repository().join("deploy/docker/Dockerfile")).unwrap();
        assert!(
            text.contains("COPY deploy/txoutboxd.example.toml /etc/txoutboxd/txoutboxd.toml\n")
                && text.contains(
                    "ENTRYPOINT [\"txoutboxd\", \"--config\", \"/etc/txoutboxd/txoutboxd.toml\"]\n"
                ),
            "the image no longer runs the example configuration: update this test"
        );
        // The last ENV instruction, with its continuation lines.
        let (_, env_text) = text.rsplit_once("\nENV ").expect("an ENV instruction");
        let mut env = BTreeMap::new();
        for line in env_text.lines() {
            let pair = line.trim().trim_end_matches('\\').trim();
            let (name, value) = pair.split_once('=').expect("NAME=VALUE");
            env.insert(name.to_owned(), value.to_owned());
            if !line.ends_with('\\') {
                break;
            }
        }
        // The header's `docker run`: comment lines from it to the first without `\`.
        let mut command = String::new();
        for line in text
            .lines()
            .map(|l| l.trim_start_matches('#').trim())
            .skip_while(|l| !l.starts_with("docker run"))
        {
            command.push_str(line.trim_end_matches('\\'));
            command.push(' ');
            if !line.ends_with('\\') {
                break;
            }
        }
        let words = shlex::split(&command).expect("a shell command");
        let (mut run_env, mut mounts) = (BTreeMap::new(), Vec::new());
        for pair in words.windows(2) {
            match pair[0].as_str() {
                "-e" => {
                    let (name, value) = pair[1].split_once('=').expect("-e NAME=VALUE");
                    run_env.insert(name.to_owned(), value.to_owned());
                }
                "-v" => {
                    let mut parts = pair[1].split(':');
                    let host = parts.next().unwrap().to_owned();
                    mounts.push((host, parts.next().expect("HOST:CONTAINER").to_owned()));
                }
                _ => {}
            }
        }
        assert!(
            !run_env.is_empty(),
            "no `docker run -e` in the header: {command}"
        );
        Self {
            env,
            run_env,
            mounts,
        }
    }
}

#[tokio::test]
async fn the_images_docker_run_example_starts_and_serves_tls_with_its_token() {
    let image = Image::read();
    assert_eq!(image.env["TXOUTBOX_SERVER__LISTEN"], "0.0.0.0:7411");
    let example = repository().join("deploy/txoutboxd.example.toml");
    let config = std::fs::read_to_string(&example).unwrap();

    // The image alone: listening on every interface without TLS or identities, refused.
    let output = std::process::Command::new(txoutbox_tests::server::binary())
        .arg("--config")
        .arg(&example)
        .arg("check-config")
        .env_clear()
        .envs(without_txoutbox_variables())
        .envs(&image.env)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{said}");
    assert!(said.contains("reachable from other machines"), "{said}");

    // The example's mounts, in a directory of the test's: tls/ holds tls.crt and tls.key.
    let host = tempfile::tempdir().unwrap();
    let ca = Ca::new("deploy test CA");
    let ca_file = ca.write(host.path(), "ca");
    let mut env: BTreeMap<String, String> = image.env.clone();
    // Any free port: the address stays one other machines reach.
    env.insert("TXOUTBOX_SERVER__LISTEN".into(), "0.0.0.0:0".into());
    let token = "deploy-test-token";
    for (name, value) in &image.run_env {
        let value = if value.contains("$(") {
            token.to_owned() // `"$(cat relay.token)"`
        } else {
            value.clone()
        };
        env.insert(name.clone(), value);
    }
    for (host_path, container) in &image.mounts {
        let dir = host.path().join(host_path.trim_start_matches("$PWD/"));
        std::fs::create_dir_all(&dir).unwrap();
        let pair = ca.server(&dir, "issued");
        std::fs::rename(&pair.cert, dir.join("tls.crt")).unwrap();
        std::fs::rename(&pair.key, dir.join("tls.key")).unwrap();
        for value in env.values_mut() {
            *value = value.replace(container.as_str(), &dir.display().to_string());
        }
    }
    // The database: this test's own, its table in a schema of its own (the test's one
    // addition to the example).
    let db = TestDb::new().await;
    assert!(env.contains_key("TXOUTBOX_DATABASES__MAIN__URL"));
    env.insert("TXOUTBOX_DATABASES__MAIN__URL".into(), db.url.clone());
    env.insert(
        "TXOUTBOX_OUTBOXES__ORDERS__SCHEMA".into(),
        db.schema.clone(),
    );

    let pairs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let server = Server::start_with_env(&config, &pairs).await;
    let port = server.address.rsplit_once(':').unwrap().1.to_owned();
    assert!(
        server.log_contains("\"tls\":true") && server.log_contains("\"identities\":1"),
        "the listening line"
    );

    // A subscriber with the example's token, over TLS: `tail` subscribes (the identity's
    // scope) and prints the row.
    let url = format!("https://localhost:{port}");
    let ca_file = ca_file.to_str().unwrap();
    txoutbox_tests::eventually("the table created", txoutbox_tests::DEADLINE, || async {
        db.table_exists().await.then_some(())
    })
    .await;
    db.insert("orders.paid", Some("order-42"), b"{}").await;
    let args = [
        "--tls-ca", ca_file, "--token", token, "--outbox", "orders", "tail", "--count", "1",
    ];
    let output = txoutbox(&url, &args).await;
    assert!(output.status.success(), "{output:?}");
    assert!(
        stdout(&output).contains("\"topic\":\"orders.paid\""),
        "{}",
        stdout(&output)
    );
    db.drop().await;
}

/// The test's environment without `TXOUTBOX_*` variables, which would change what the
/// server reads.
fn without_txoutbox_variables() -> Vec<(String, String)> {
    std::env::vars()
        .filter(|(name, _)| !name.starts_with("TXOUTBOX_"))
        .collect()
}

/// The relay's image builds every broker `txoutbox relay` takes, with the Debian packages
/// `scripts/test` installs for librdkafka's build (no Docker engine runs here to build it).
#[test]
fn the_relay_image_builds_every_broker_with_what_librdkafka_needs() {
    let dockerfile =
        std::fs::read_to_string(repository().join("deploy/docker/Dockerfile")).unwrap();
    let (_, relay_stage) = dockerfile
        .split_once(" AS build-relay\n")
        .expect("a build-relay stage");
    let (relay_stage, _) = relay_stage.split_once("\nFROM ").unwrap();
    let features = relay_stage
        .split("--features ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .expect("the relay's --features");
    let features: Vec<&str> = features.split(',').collect();
    let relay =
        std::fs::read_to_string(repository().join("client/src/bin/txoutbox/relay/mod.rs")).unwrap();
    let (_, brokers) = relay
        .split_once(r#"ArgGroup::new("broker").required(true).args(["#)
        .expect("the relay's broker group");
    let (brokers, _) = brokers.split_once(']').unwrap();
    for broker in brokers.split(',').map(|b| b.trim().trim_matches('"')) {
        assert!(
            features.contains(&broker),
            "the relay image lacks the `{broker}` feature: {features:?}"
        );
    }
    let script = std::fs::read_to_string(repository().join("scripts/test")).unwrap();
    for package in [
        "libssl-dev",
        "libcurl4-openssl-dev",
        "cmake",
        "g++",
        "zlib1g-dev",
    ] {
        assert!(
            script.contains(package),
            "scripts/test no longer installs {package}"
        );
        assert!(
            relay_stage.contains(package),
            "the relay image's build lacks {package}, which librdkafka's build needs"
        );
    }
}

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}
