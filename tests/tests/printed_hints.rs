//! Every command a hint of the `txoutbox` CLI or of `txoutboxd` prints, run as printed
//! against a real server: the printed line is split into arguments as a shell would
//! (`shlex`), and what it says it does is checked. "add X" hints are run as the command
//! that printed them with X added.

use std::path::Path;
use std::process::Output;

use txoutbox_proto::v1;
use txoutbox_tests::pki::token_identity;
use txoutbox_tests::{Server, TestDb, DEADLINE};

use crate::cli_client;

/// Runs `txoutbox ARGS...` (no implicit `--server`), with only the `TXOUTBOX_*`
/// variables in `env`.
async fn txoutbox(args: &[String], env: &[(&str, &str)]) -> Output {
    let mut command = tokio::process::Command::new(cli_client::binary());
    command
        .args(args)
        .env("RUST_LOG", "warn")
        .kill_on_drop(true);
    without_txoutbox_variables(command.as_std_mut());
    command.envs(env.iter().copied());
    let output = tokio::time::timeout(DEADLINE, command.output())
        .await
        .expect("txoutbox did not exit in time")
        .unwrap();
    eprintln!(
        "$ txoutbox {}\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

fn without_txoutbox_variables(command: &mut std::process::Command) {
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("TXOUTBOX_") {
            command.env_remove(name);
        }
    }
}

fn words(args: &[&str]) -> Vec<String> {
    args.iter().map(|arg| (*arg).to_owned()).collect()
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The `txoutbox` command quoted in `text` after `after`, split as a shell would, without
/// the leading `txoutbox`.
fn printed_command(text: &str, after: &str) -> Vec<String> {
    let (_, rest) = text
        .split_once(after)
        .unwrap_or_else(|| panic!("no `{after}` in {text:?}"));
    let quoted = rest.split('`').nth(1).expect("a command in backquotes");
    let mut words = shlex::split(quoted).unwrap_or_else(|| panic!("not shell words: {quoted}"));
    assert_eq!(words.remove(0), "txoutbox", "{quoted}");
    words
}

/// The value printed after `prefix` on a line of its own ("more: add --after-id 7").
fn printed_after(text: &str, prefix: &str) -> Option<Vec<String>> {
    let line = text.lines().find(|line| line.starts_with(prefix))?;
    Some(shlex::split(&line[prefix.len()..]).expect("shell words"))
}

/// The ids of a `dead list` table, its first column.
fn listed_ids(table: &str) -> Vec<i64> {
    table
        .lines()
        .skip(1)
        .filter_map(|line| line.split_whitespace().next()?.parse().ok())
        .collect()
}

async fn paused(server: &Server) -> bool {
    let listed = server
        .admin()
        .await
        .list_outboxes(v1::ListOutboxesRequest {})
        .await
        .unwrap()
        .into_inner();
    listed.outboxes[0].paused_since.is_some()
}

/// Claims every row as `worker` and dead-letters it; returns the ids.
async fn dead_letter_all(server: &Server, worker: &str) -> Vec<i64> {
    let mut relay = server.relay().await;
    let claimed = relay
        .claim(v1::ClaimRequest {
            outbox: "orders".into(),
            worker_id: worker.into(),
            batch_size: 100,
            lease_ms: 0,
            topics: vec![],
        })
        .await
        .unwrap()
        .into_inner();
    let mut ids = Vec::new();
    for message in claimed.messages {
        let dead = relay
            .dead_letter(v1::DeadLetterRequest {
                outbox: "orders".into(),
                worker_id: worker.into(),
                id: message.id,
                error: "broker down".into(),
                lease_token: Default::default(),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(dead.dead_lettered);
        ids.push(message.id);
    }
    ids
}

#[tokio::test]
async fn the_cli_hints_work_as_printed() {
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let url = server.url();

    // "is txoutboxd running there? Set the address with --server or TXOUTBOX_SERVER"
    let nobody = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let stats = words(&["--outbox", "orders", "stats"]);
    let wrong = [
        words(&["--server", &format!("http://{nobody}")]),
        stats.clone(),
    ]
    .concat();
    let output = txoutbox(&wrong, &[]).await;
    assert_eq!(output.status.code(), Some(3), "{output:?}");
    assert!(
        stderr(&output).contains(
            "hint: is txoutboxd running there? Set the address with --server or TXOUTBOX_SERVER"
        ),
        "{}",
        stderr(&output)
    );
    let with_flag = [wrong, words(&["--server", &url])].concat();
    let output = txoutbox(&with_flag, &[]).await;
    assert!(output.status.success(), "--server added: {output:?}");
    assert!(stdout(&output).contains("outbox orders"), "{output:?}");
    let output = txoutbox(&stats, &[("TXOUTBOX_SERVER", &url)]).await;
    assert!(output.status.success(), "TXOUTBOX_SERVER set: {output:?}");

    // "resume with `txoutbox --server URL --outbox orders resume`": not the default server.
    let output = txoutbox(
        &words(&["--server", &url, "--outbox", "orders", "pause"]),
        &[],
    )
    .await;
    assert!(output.status.success(), "{output:?}");
    assert!(paused(&server).await);
    let resume = printed_command(&stdout(&output), "resume with ");
    assert!(resume.contains(&url), "{resume:?}");
    let output = txoutbox(&resume, &[]).await;
    assert!(output.status.success(), "{output:?}");
    assert_eq!(stdout(&output).trim(), "outbox orders is running");
    assert!(!paused(&server).await, "the printed resume resumed");

    // "more: add --after-id N", page after page (the second page's command then holds
    // two --after-id).
    for i in 0..5 {
        db.insert("orders.paid", Some(&format!("k{i}")), b"{}")
            .await;
    }
    let dead = dead_letter_all(&server, "w").await;
    assert_eq!(dead.len(), 5);
    let mut list = words(&["--server", &url, "dead", "list", "--limit", "2"]);
    let mut pages = Vec::new();
    loop {
        let output = txoutbox(&list, &[]).await;
        assert!(output.status.success(), "{output:?}");
        pages.push(listed_ids(&stdout(&output)));
        match printed_after(&stdout(&output), "more: add ") {
            Some(more) => list.extend(more),
            None => break,
        }
        assert!(pages.len() <= 3, "{pages:?}");
    }
    assert_eq!(pages, [&dead[0..2], &dead[2..4], &dead[4..5]]);

    // "add --yes to apply", then "run the same command again to go on".
    let redrive = words(&["--server", &url, "dead", "redrive", "--limit", "2"]);
    let output = txoutbox(&redrive, &[]).await;
    assert!(output.status.success(), "{output:?}");
    let dry_run = stdout(&output);
    assert!(
        dry_run.contains("dry run: would re-drive 2 rows"),
        "{dry_run}"
    );
    assert_eq!(db.count("dead").await, 5, "a dry run changes nothing");
    let apply = printed_after(&dry_run, "add ").expect("add --yes to apply");
    assert_eq!(apply.last().map(String::as_str), Some("apply"), "{apply:?}");
    let redrive = [redrive, apply[..apply.len() - 2].to_vec()].concat();
    assert_eq!(redrive.last().map(String::as_str), Some("--yes"));
    let mut runs = 0;
    loop {
        let output = txoutbox(&redrive, &[]).await;
        assert!(output.status.success(), "{output:?}");
        runs += 1;
        if !stdout(&output).contains("run the same command again to go on") {
            break;
        }
        assert!(runs < 3, "{runs} runs");
    }
    assert_eq!(runs, 3, "2 + 2 + 1 rows");
    assert_eq!(db.count("dead").await, 0);
    assert_eq!(db.count("pending").await, 5);
    db.drop().await;
}

/// With a token the printed resume names no token: `TOKEN` stands in its place and the
/// line says so; from `TXOUTBOX_TOKEN` it needs none and works in the same shell.
#[tokio::test]
async fn the_resume_hint_never_prints_the_token() {
    const SECRET: &str = "ops-secret-91f2";
    let db = TestDb::new().await;
    let config = db.config("") + &token_identity("ops", SECRET, r#"{ "*" = ["admin"] }"#);
    let server = Server::start_serving(&config).await;
    let url = server.url();

    let pause = words(&[
        "--server", &url, "--token", SECRET, "--outbox", "orders", "pause",
    ]);
    let output = txoutbox(&pause, &[]).await;
    assert!(output.status.success(), "{output:?}");
    let printed = stdout(&output);
    assert!(!printed.contains(SECRET), "{printed}");
    assert!(
        printed.contains("(TOKEN: your token, not printed here)"),
        "{printed}"
    );
    let resume = printed_command(&printed, "resume with ");
    let output = txoutbox(&resume, &[]).await;
    assert!(
        !output.status.success(),
        "a placeholder is no token: {output:?}"
    );
    let resume: Vec<String> = resume
        .into_iter()
        .map(|word| if word == "TOKEN" { SECRET.into() } else { word })
        .collect();
    let output = txoutbox(&resume, &[]).await;
    assert!(output.status.success(), "{output:?}");
    assert_eq!(stdout(&output).trim(), "outbox orders is running");

    let env = [("TXOUTBOX_TOKEN", SECRET)];
    let output = txoutbox(
        &words(&["--server", &url, "--outbox", "orders", "pause"]),
        &env,
    )
    .await;
    assert!(output.status.success(), "{output:?}");
    let printed = stdout(&output);
    assert!(
        !printed.contains(SECRET) && !printed.contains("TOKEN"),
        "{printed}"
    );
    let output = txoutbox(&printed_command(&printed, "resume with "), &env).await;
    assert!(output.status.success(), "{output:?}");
    assert_eq!(stdout(&output).trim(), "outbox orders is running");
    db.drop().await;
}

/// "hint: pass --config FILE; start from --config PATH": the example of the sources,
/// relative from the repository root (where the README runs the server), absolute
/// elsewhere; with it the same command line is valid.
#[test]
fn the_config_hint_of_txoutboxd_works_as_printed() {
    let elsewhere = tempfile::tempdir().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    for (dir, shown) in [
        (root, "deploy/txoutboxd.example.toml".to_owned()),
        (
            elsewhere.path(),
            root.join("deploy/txoutboxd.example.toml")
                .display()
                .to_string(),
        ),
    ] {
        // An outbox declared in the environment only: no configuration file, no database.
        let run = |extra: &[String]| {
            let mut command = std::process::Command::new(txoutbox_tests::server::binary());
            without_txoutbox_variables(&mut command);
            command
                .current_dir(dir)
                .arg("check-config")
                .args(extra)
                .env("TXOUTBOX_OUTBOXES__ORDERS__TABLE", "outbox")
                .output()
                .unwrap()
        };
        let output = run(&[]);
        assert_eq!(output.status.code(), Some(2), "{output:?}");
        let hint = printed_after(&stderr(&output), "hint: pass --config FILE; start from ")
            .unwrap_or_else(|| panic!("no hint: {}", stderr(&output)));
        assert_eq!(hint, ["--config", shown.as_str()], "from {}", dir.display());
        let output = run(&hint);
        assert!(output.status.success(), "{output:?}");
        let printed = stdout(&output);
        assert!(printed.starts_with("configuration is valid"), "{printed}");
    }
}
