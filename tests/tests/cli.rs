//! The `txoutboxd` command line: `check-config` and `schema`, with exit codes scripts can
//! rely on and errors that name the file and the key.

use txoutbox_tests::server::run_to_exit;

const VALID: &str = r#"
[databases.main]
url = "postgres://postgres@127.0.0.1:5432/test"
[outboxes.orders]
database = "main"
schema = "shop"
notify_channel = "orders_inserted"
"#;

#[test]
fn check_config_accepts_a_valid_file() {
    let output = run_to_exit(VALID, &["check-config"]);
    assert!(output.status.success(), "{output:?}");
    assert!(String::from_utf8_lossy(&output.stdout).contains("outboxes: orders"));
}

#[test]
fn check_config_lists_every_problem_with_its_key_and_exits_2() {
    let config = VALID.replace(
        "database = \"main\"",
        "database = \"other\"\nmax_attempts = 0",
    );
    let output = run_to_exit(&config, &["check-config"]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("outboxes.orders.database = \"other\""),
        "{stderr}"
    );
    assert!(stderr.contains("configured: main"), "{stderr}");
    assert!(stderr.contains("outboxes.orders.max_attempts"), "{stderr}");
}

#[test]
fn a_misspelt_key_is_named() {
    let output = run_to_exit(&format!("{VALID}leese = \"1m\"\n"), &["check-config"]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("leese"), "{stderr}");
}

#[test]
fn an_invalid_identifier_never_reaches_sql() {
    let config = VALID.replace("schema = \"shop\"", "schema = \"shop; DROP TABLE users\"");
    let output = run_to_exit(&config, &["schema", "orders"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        output.stdout.is_empty(),
        "printed SQL for an invalid identifier"
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("outboxes.orders.schema"), "{stderr}");
}

#[test]
fn schema_prints_the_ddl_of_an_outbox() {
    let output = run_to_exit(VALID, &["schema", "orders"]);
    assert!(output.status.success(), "{output:?}");
    let sql = String::from_utf8_lossy(&output.stdout);
    assert!(
        sql.contains("CREATE TABLE IF NOT EXISTS \"shop\".\"outbox\""),
        "{sql}"
    );
    assert!(sql.contains("pg_notify('orders_inserted'"), "{sql}");

    let output = run_to_exit(VALID, &["schema", "billing"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("configured: orders"));
}

#[test]
fn schema_of_the_embedded_default_prints_without_creating_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut command = std::process::Command::new(txoutbox_tests::server::binary());
    command.current_dir(dir.path()).args(["schema", "default"]);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("TXOUTBOX_") {
            command.env_remove(name);
        }
    }
    let output = command.output().unwrap();
    assert!(output.status.success(), "{output:?}");
    assert!(String::from_utf8_lossy(&output.stdout).contains("CREATE TABLE IF NOT EXISTS"));
    assert!(
        !dir.path().join("txoutbox.db").exists(),
        "a command that prints must not create the database file"
    );
}
