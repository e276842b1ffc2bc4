use super::embedded::declares_outboxes;
use super::*;
use crate::config::columns::{ColumnMapping, Columns};

const MINIMAL: &str = r#"
    [databases.main]
    url = "postgres://postgres@127.0.0.1/test"
    [outboxes.orders]
    database = "main"
"#;

#[test]
fn minimal_config_gets_the_seed_defaults() {
    let config = Config::from_toml(MINIMAL).unwrap();
    let orders = &config.outboxes["orders"];
    assert_eq!(orders.table, "outbox");
    assert!(orders.strict_ordering);
    assert_eq!(orders.max_attempts, 10);
    assert_eq!(orders.backoff, BackoffConfig::default());
    assert_eq!(config.server.listen.to_string(), DEFAULT_LISTEN);
}

#[test]
fn durations_are_human_readable() {
    let text = format!(
        "{MINIMAL}\nlease = \"90s\"\nvisibility_delay = \"2s\"\nbackoff.maximum = \"10m\"\n"
    );
    let orders = &Config::from_toml(&text).unwrap().outboxes["orders"];
    assert_eq!(orders.lease, Duration::from_secs(90));
    assert_eq!(orders.visibility_delay, Duration::from_secs(2));
    assert_eq!(orders.backoff.maximum, Duration::from_secs(600));
}

#[test]
fn synchronous_commit_defaults_to_off_and_is_postgres_only() {
    let postgres = |setting: &str| {
        format!(
            "[databases.main]\nurl = \"postgres://app@db/app\"\n{setting}\n\
             [outboxes.orders]\ndatabase = \"main\"\ntable = \"outbox\"\n"
        )
    };
    let config = Config::from_toml(&postgres("")).unwrap();
    let database = &config.databases["main"];
    assert_eq!(database.synchronous_commit, None);
    assert_eq!(
        database.synchronous_commit.unwrap_or_default().as_str(),
        "off"
    );
    let config = Config::from_toml(&postgres("synchronous_commit = \"remote_write\"")).unwrap();
    let setting = config.databases["main"].synchronous_commit.unwrap();
    assert_eq!(setting.as_str(), "remote_write");
    let error = Config::from_toml(&postgres("synchronous_commit = \"sometimes\""))
        .unwrap_err()
        .to_string();
    assert!(error.contains("synchronous_commit"), "{error}");
    let sqlite = "[databases.main]\nurl = \"sqlite://x.db\"\nsynchronous_commit = \"on\"\n\
                  [outboxes.orders]\ndatabase = \"main\"\ntable = \"outbox\"\n";
    let error = Config::from_toml(sqlite).unwrap_err().to_string();
    assert!(
        error.contains("databases.main.synchronous_commit: PostgreSQL only"),
        "{error}"
    );
}

#[test]
fn identities_and_the_server_get_caps_by_default() {
    let config = |limits: &str| {
        format!(
            "[server.auth.identities.relay]\ntoken_sha256 = \"{}\"\n\
             grants = {{ orders = [\"subscribe\"] }}\n{limits}\n\
             [databases.main]\nurl = \"postgres://app@db/app\"\n\
             [outboxes.orders]\ndatabase = \"main\"\ntable = \"outbox\"\n",
            "0".repeat(64)
        )
    };
    let none_set = Config::from_toml(&config("")).unwrap();
    let limits = &none_set.server.auth.identities["relay"].limits;
    assert_eq!(limits.max_streams, Some(1_000));
    assert_eq!(limits.max_topic_filters, Some(16));
    assert_eq!(limits.max_calls_per_second, None);
    // Setting one limit keeps the defaults of the others.
    let one_set = config("limits = { max_calls_per_second = 50 }");
    let one_set = Config::from_toml(&one_set).unwrap();
    let limits = &one_set.server.auth.identities["relay"].limits;
    assert_eq!(limits.max_streams, Some(1_000));
    assert_eq!(limits.max_calls_per_second, Some(50));
    let server = &none_set.server;
    assert_eq!(
        (
            server.max_streams,
            server.max_connections,
            server.max_pending_handshakes
        ),
        (10_000, 10_000, 1_000)
    );
    let zero = format!("[server]\nmax_connections = 0\n{}", config(""));
    let error = Config::from_toml(&zero).unwrap_err().to_string();
    assert!(
        error.contains("server.max_connections: must be at least 1"),
        "{error}"
    );
}

#[test]
fn database_timeouts_have_defaults_and_a_floor() {
    let config = |settings: &str| {
        format!(
            "[databases.main]\nurl = \"postgres://app@db/app\"\n{settings}\n\
             [outboxes.orders]\ndatabase = \"main\"\ntable = \"outbox\"\n"
        )
    };
    let defaults = Config::from_toml(&config("")).unwrap().databases["main"].timeouts();
    assert_eq!(defaults.acquire, Duration::from_secs(3));
    assert_eq!(defaults.statement, Duration::from_secs(30));
    let set = config("acquire_timeout = \"1s\"\nstatement_timeout = \"5s\"");
    let set = Config::from_toml(&set).unwrap().databases["main"].timeouts();
    assert_eq!(set.call_deadline(), Duration::from_secs(6));
    let low = config("statement_timeout = \"10ms\"");
    let error = Config::from_toml(&low).unwrap_err().to_string();
    assert!(
        error.contains("databases.main.statement_timeout = 10ms: must be at least 100ms"),
        "{error}"
    );
}

#[test]
fn dead_letter_holds_key_is_off_by_default_and_needs_strict_ordering() {
    let config = Config::from_toml(MINIMAL).unwrap();
    assert!(!config.outboxes["orders"].dead_letter_holds_key);
    let on = format!("{MINIMAL}\ndead_letter_holds_key = true\n");
    assert!(Config::from_toml(&on).unwrap().outboxes["orders"].dead_letter_holds_key);
    let error = Config::from_toml(&format!("{on}strict_ordering = false\n"))
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("outboxes.orders.dead_letter_holds_key: needs strict_ordering"),
        "{error}"
    );
}

#[test]
fn unknown_keys_are_named() {
    let text = format!("{MINIMAL}\nleese = \"90s\"\n");
    let error = Config::from_toml(&text).unwrap_err().to_string();
    assert!(error.contains("leese"), "{error}");
    assert!(error.contains("outboxes.orders"), "{error}");
}

#[test]
fn every_problem_is_reported_at_once_with_its_key() {
    let text = r#"
        [databases.main]
        url = "redis://localhost/0"
        [outboxes.orders]
        database = "nope"
        table = "outbox; drop table users"
        max_attempts = 0
        backoff.jitter = 2.0
    "#;
    let error = Config::from_toml(text).unwrap_err().to_string();
    for needle in [
        "databases.main.url",
        "outboxes.orders.database = \"nope\": no such database; configured: main",
        "outboxes.orders.table",
        "outboxes.orders.max_attempts",
        "outboxes.orders.backoff.jitter",
    ] {
        assert!(error.contains(needle), "missing {needle:?} in:\n{error}");
    }
}

#[test]
fn a_column_mapping_lists_only_what_differs_and_its_problems_name_their_keys() {
    let text = format!(
        "{MINIMAL}\ntable = \"order_events\"\n[outboxes.orders.columns]\n\
         id = \"event_id\"\nfixed_topic = \"orders\"\npayload = \"body\"\n\
         payload_format = \"json\"\nheaders = \"\"\n"
    );
    let orders = &Config::from_toml(&text).unwrap().outboxes["orders"];
    let columns = Columns::from_mapping(&orders.columns).unwrap();
    assert_eq!(columns.id.as_str(), "event_id");
    assert_eq!(columns.key.as_str(), "key");
    assert!(columns.headers.is_none());

    let text = format!(
        "{MINIMAL}\n[outboxes.orders.columns]\nkey = \"aggregate-id\"\n\
         topic = \"kind\"\nfixed_topic = \"orders\"\npayload_format = \"xml\"\n"
    );
    let error = Config::from_toml(&text).unwrap_err().to_string();
    assert!(error.contains("payload_format"), "{error}");
    let text = format!(
        "{MINIMAL}\n[outboxes.orders.columns]\nkey = \"aggregate-id\"\n\
         topic = \"kind\"\nfixed_topic = \"orders\"\n"
    );
    let error = Config::from_toml(&text).unwrap_err().to_string();
    for needle in [
        "outboxes.orders.columns.key = \"aggregate-id\"",
        "outboxes.orders.columns.topic and columns.fixed_topic",
    ] {
        assert!(error.contains(needle), "missing {needle:?} in:\n{error}");
    }
}

#[test]
fn the_example_file_is_valid_and_spells_out_the_defaults() {
    let text = include_str!("../../../deploy/txoutboxd.example.toml");
    let config = Config::from_toml(text).unwrap();
    let orders = &config.outboxes["orders"];
    assert_eq!(
        orders.columns,
        ColumnMapping {
            topic: Some("topic".to_owned()),
            ..ColumnMapping::default()
        }
    );
}

#[test]
fn metrics_and_traces_are_off_unless_set() {
    let config = Config::from_toml(MINIMAL).unwrap();
    assert_eq!(config.server.metrics_listen, None);
    assert_eq!(config.telemetry.otlp_endpoint, None);
    let text = format!(
        "[server]\nmetrics_listen = \"127.0.0.1:9464\"\nmetrics_depth_interval = \"0s\"\n\
         [telemetry]\notlp_endpoint = \"http://collector:4317\"\n{MINIMAL}"
    );
    let error = Config::from_toml(&text).unwrap_err().to_string();
    assert!(error.contains("server.metrics_depth_interval"), "{error}");
    let text = text.replace("\"0s\"", "\"2s\"");
    let config = Config::from_toml(&text).unwrap();
    assert_eq!(
        config.server.metrics_listen,
        Some("127.0.0.1:9464".parse().unwrap())
    );
    assert_eq!(config.server.metrics_depth_interval, Duration::from_secs(2));
    assert_eq!(
        config.telemetry.otlp_endpoint.as_deref(),
        Some("http://collector:4317")
    );
}

#[test]
fn the_embedded_default_is_one_sqlite_outbox_on_the_documented_port() {
    let config = Config::from_toml(EMBEDDED_DEFAULT).unwrap();
    assert_eq!(config.server.listen.to_string(), "127.0.0.1:7411");
    assert_eq!(config.databases.len(), 1);
    assert_eq!(
        config.databases[EMBEDDED_NAME].url.expose(),
        "sqlite://txoutbox.db"
    );
    let outbox = &config.outboxes[EMBEDDED_NAME];
    assert_eq!(outbox.database, EMBEDDED_NAME);
    assert_eq!(outbox.table, "outbox");
    assert!(outbox.create_schema && outbox.strict_ordering);
    assert_eq!(outbox.poll.max, Duration::from_secs(1));
    assert_eq!(
        sqlite_database_file(config.databases[EMBEDDED_NAME].url.expose()).unwrap(),
        Path::new("txoutbox.db")
    );
}

/// Relies on the test environment not declaring outboxes (`TXOUTBOX_OUTBOXES__*`).
#[test]
fn no_configuration_loads_the_embedded_default_and_db_moves_its_file() {
    let overrides = Overrides {
        db: Some(PathBuf::from("/tmp/odd ?#%.db")),
        ..Overrides::default()
    };
    let config = Config::load(None, &overrides).unwrap();
    assert!(config.embedded_default);
    assert_eq!(config.outboxes.keys().collect::<Vec<_>>(), [EMBEDDED_NAME]);
    let url = config.databases[EMBEDDED_NAME].url.expose();
    assert_eq!(
        sqlite_database_file(url).unwrap(),
        Path::new("/tmp/odd ?#%.db")
    );
}

#[test]
fn db_is_refused_with_a_configuration_file() {
    let file = std::env::temp_dir().join(format!("txoutboxd-{}.toml", std::process::id()));
    std::fs::write(&file, MINIMAL).unwrap();
    let overrides = Overrides {
        db: Some(PathBuf::from("x.db")),
        ..Overrides::default()
    };
    let error = Config::load(Some(&file), &overrides)
        .unwrap_err()
        .to_string();
    std::fs::remove_file(&file).unwrap();
    assert!(error.contains("--db x.db"), "{error}");
    let config = Config::load(Some(&file), &Overrides::default());
    assert!(config.is_err(), "the file is gone");
}

#[test]
fn outboxes_of_the_environment_replace_the_embedded_default() {
    let names = |names: &[&str]| {
        names
            .iter()
            .map(std::ffi::OsString::from)
            .collect::<Vec<_>>()
    };
    assert!(!declares_outboxes(names(&[
        "TXOUTBOX_DATABASES__DEFAULT__URL",
        "TXOUTBOX_OUTBOXES__DEFAULT__TABLE",
        "TXOUTBOX_SERVER__LISTEN",
        "TXOUTBOX_CONFIG",
    ])));
    assert!(declares_outboxes(names(&[
        "TXOUTBOX_OUTBOXES__ORDERS__DATABASE"
    ])));
}

#[test]
fn sqlite_refuses_postgres_only_keys_and_unusable_urls() {
    let text = r#"
        [databases.local]
        url = "sqlite://outbox.db"
        [databases.memory]
        url = "sqlite::memory:"
        [outboxes.orders]
        database = "local"
        schema = "public"
        notify_channel = "outbox_inserted"
    "#;
    let error = Config::from_toml(text).unwrap_err().to_string();
    for needle in [
        "outboxes.orders.schema: not supported on SQLite",
        "outboxes.orders.notify_channel: PostgreSQL only",
        "databases.memory.url = \"sqlite::memory:\": an in-memory database",
    ] {
        assert!(error.contains(needle), "missing {needle:?} in:\n{error}");
    }
    let fine = "[databases.local]\nurl = \"sqlite:data/outbox.db?mode=rwc\"\n\
                [outboxes.orders]\ndatabase = \"local\"\n";
    Config::from_toml(fine).unwrap();
}

#[test]
fn mysql_databases_take_a_schema_but_no_notify_channel() {
    for scheme in ["mysql", "mariadb"] {
        let text = format!(
            "[databases.main]\nurl = \"{scheme}://root@127.0.0.1/test\"\n\
             [outboxes.orders]\ndatabase = \"main\"\nschema = \"shop\"\n"
        );
        let config = Config::from_toml(&text).unwrap();
        assert_eq!(config.outboxes["orders"].schema.as_deref(), Some("shop"));
        let text = format!("{text}notify_channel = \"wake\"\n");
        let error = Config::from_toml(&text).unwrap_err().to_string();
        assert!(
            error.contains("outboxes.orders.notify_channel: PostgreSQL only"),
            "{error}"
        );
    }
    let no_database = "[databases.main]\nurl = \"mysql://root:p%2Fw@127.0.0.1:3306\"\n\
                       [outboxes.orders]\ndatabase = \"main\"\n";
    let error = Config::from_toml(no_database).unwrap_err().to_string();
    assert!(error.contains("outboxes.orders.schema: missing"), "{error}");
    assert!(Config::from_toml(&format!("{no_database}schema = \"shop\"\n")).is_ok());
}
