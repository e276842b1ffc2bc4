//! The `txoutbox` binary without a server: help and usage errors. (Being an integration
//! test of this crate also makes `cargo test`/`cargo nextest run --workspace` build the
//! binary that `tests/tests/cli_client.rs` runs against a real server.)

#![cfg(feature = "cli")]

use std::process::Command;

fn txoutbox(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_txoutbox"))
        .args(args)
        .env_remove("TXOUTBOX_SERVER")
        .env_remove("TXOUTBOX_OUTBOX")
        .output()
        .unwrap()
}

#[test]
fn help_lists_commands_examples_and_exit_codes() {
    let output = txoutbox(&["--help"]);
    assert_eq!(output.status.code(), Some(0));
    let help = String::from_utf8_lossy(&output.stdout);
    for needle in [
        "tail",
        "stats",
        "purge",
        "schema",
        "health",
        "insert",
        "relay",
        "Examples:",
        "Exit codes:",
        "TXOUTBOX_SERVER",
    ] {
        assert!(help.contains(needle), "`{needle}` missing from\n{help}");
    }
}

#[test]
fn usage_errors_exit_2() {
    for args in [
        &["frobnicate"][..],
        &["purge", "--older-than", "soon"],
        &["insert", "--header", "novalue", "--topic", "t", "x"],
        &["--format", "yaml", "stats"],
    ] {
        let output = txoutbox(args);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {output:?}");
    }
}
