//! The metrics as an operator's tools see them: a real `txoutboxd` under load, scraped by
//! a real Prometheus (Debian's package) with the repository's rules; every metric, every
//! dashboard query and every recording rule must answer through Prometheus's HTTP API,
//! every alert must evaluate; `promtool check metrics` on a real scrape and `promtool test
//! rules` on `deploy/prometheus`. The depth gauges are checked on every backend.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio_util::sync::CancellationToken;
use txoutbox_client::{Message, PublishError, Subscriber};
use txoutbox_tests::prometheus::{dashboards_dir, get, promtool, rules_dir, Prometheus};
use txoutbox_tests::{eventually, MariaDb, Server, SqliteDb, TestDb, DEADLINE};

/// Every metric family `txoutboxd` exposes; the test fails when one is missing from the
/// scrape or from Prometheus.
const FAMILIES: &[&str] = &[
    "txoutbox_acked_rows_total",
    "txoutbox_answer_duration_seconds",
    "txoutbox_build_info",
    "txoutbox_claim_batch_rows",
    "txoutbox_claim_duration_seconds",
    "txoutbox_claimed_rows_total",
    "txoutbox_commit_to_claim_seconds",
    "txoutbox_db_pool_connections",
    "txoutbox_db_pool_max_connections",
    "txoutbox_dead_lettered_rows_total",
    "txoutbox_draining",
    "txoutbox_empty_claims_total",
    "txoutbox_fenced_answers_total",
    "txoutbox_messages_in_flight",
    "txoutbox_nacked_rows_total",
    "txoutbox_outbox_dead_rows",
    "txoutbox_outbox_leased_rows",
    "txoutbox_outbox_oldest_pending_age_seconds",
    "txoutbox_outbox_pending_rows",
    "txoutbox_outbox_serving",
    "txoutbox_outbox_waiting_rows",
    "txoutbox_released_rows_total",
    "txoutbox_storage_errors_total",
    "txoutbox_streams_open",
    "txoutbox_subscriber_streams",
];

/// Deadline for what needs a few scrapes and rule evaluations (one a second each).
const PROMETHEUS_DEADLINE: Duration = Duration::from_secs(60);

/// `config` with the metrics listener on a port the kernel picks and a 200ms depth
/// refresh.
fn with_metrics(config: String) -> String {
    config.replacen(
        "[server]\n",
        "[server]\nmetrics_listen = \"127.0.0.1:0\"\nmetrics_depth_interval = \"200ms\"\n",
        1,
    )
}

/// The value of the sample `series` (name and labels exactly as scraped), if present.
fn sample(scrape: &str, series: &str) -> Option<f64> {
    scrape
        .lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// The metric families (`# TYPE` lines) of a scrape.
fn families(scrape: &str) -> BTreeSet<String> {
    scrape
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE ")?.split(' ').next())
        .map(str::to_owned)
        .collect()
}

/// Inserts rows until `stop`: on `orders.created` (delivered, retried, or refused for
/// good by the subscriber, by payload) and on `backlog`, which nobody subscribes to, so
/// pending rows and their age stay visible.
async fn produce(db: Arc<TestDb>, stop: CancellationToken) {
    let mut round = 0u64;
    while !stop.is_cancelled() {
        for payload in ["ok", "ok", "ok", "fail", "bad"] {
            let key = format!("k{}", round % 7);
            db.insert("orders.created", Some(&key), payload.as_bytes())
                .await;
        }
        db.insert("backlog", None, b"later").await;
        round += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn publish(message: Message) -> Result<(), PublishError> {
    match &message.payload[..] {
        b"fail" => Err(PublishError::new("the broker said no")),
        b"bad" => Err(PublishError::permanent("not a valid order")),
        _ => Ok(()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_gets_every_metric_and_every_dashboard_and_rule_query_answers() {
    let db = Arc::new(TestDb::new().await);
    let retry_fast =
        "max_attempts = 2\n[outboxes.orders.backoff]\nbase = \"10ms\"\nmaximum = \"20ms\"\n";
    let server = Server::start(&with_metrics(db.config(retry_fast))).await;
    server.wait_serving("orders").await;

    let stop = CancellationToken::new();
    let producer = tokio::spawn(produce(Arc::clone(&db), stop.clone()));
    let subscriber = Subscriber::builder([server.url()], "orders")
        .name("billing")
        .topics(["orders.created"])
        .build(publish)
        .unwrap()
        .spawn();

    // A scrape that has seen each kind of work: acks, retries, both dead-letter reasons
    // the load makes, and the depth gauges.
    let metrics_url = server.metrics_url();
    let scrape = eventually("a scrape showing the load", DEADLINE, || async {
        let scrape = get(&metrics_url).await;
        let moved = |series: &str| sample(&scrape, series).is_some_and(|v| v > 0.0);
        let all = moved(r#"txoutbox_acked_rows_total{outbox="orders"}"#)
            && moved(r#"txoutbox_nacked_rows_total{outbox="orders"}"#)
            && moved(
                r#"txoutbox_dead_lettered_rows_total{outbox="orders",reason="nack_last_attempt"}"#,
            )
            && moved(r#"txoutbox_dead_lettered_rows_total{outbox="orders",reason="permanent"}"#)
            && moved(r#"txoutbox_outbox_pending_rows{outbox="orders",topic="backlog"}"#)
            && moved(r#"txoutbox_outbox_dead_rows{outbox="orders",topic="orders.created"}"#)
            && moved(r#"txoutbox_subscriber_streams{outbox="orders",subscriber="billing"}"#)
            && moved(r#"txoutbox_db_pool_max_connections{database="main"}"#);
        all.then_some(scrape)
    })
    .await;
    let exposed = families(&scrape);
    let expected: BTreeSet<String> = FAMILIES.iter().map(|f| f.to_string()).collect();
    assert_eq!(exposed, expected, "metric families of the scrape");
    let (ok, output) = promtool(&["check", "metrics"], &scrape, &rules_dir());
    assert!(
        ok,
        "promtool check metrics:\n{output}\n--- scrape ---\n{scrape}"
    );

    let prometheus = Prometheus::start(
        &[server.metrics_address()],
        &[rules_dir().join("txoutbox.rules.yml")],
    )
    .await;
    prometheus
        .wait_for_data(r#"up{job="txoutbox"} == 1"#, PROMETHEUS_DEADLINE)
        .await;

    for family in FAMILIES {
        let histogram = scrape.contains(&format!("# TYPE {family} histogram"));
        let series = if histogram {
            format!("{family}_bucket")
        } else {
            family.to_string()
        };
        prometheus.wait_for_data(&series, PROMETHEUS_DEADLINE).await;
    }

    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(dashboards_dir().join("txoutbox.json")).unwrap(),
    )
    .unwrap();
    let queries = dashboard_queries(&dashboard);
    assert!(queries.len() >= 20, "dashboard queries: {queries:?}");
    for query in &queries {
        // Grafana's variables as Grafana fills them: every outbox, a one-minute window.
        let query = query
            .replace("$outbox", ".+")
            .replace("$__rate_interval", "1m");
        prometheus.wait_for_data(&query, PROMETHEUS_DEADLINE).await;
    }

    let groups = prometheus.rule_groups().await;
    let rules: Vec<Value> = groups
        .iter()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .collect();
    let alerts = rules.iter().filter(|r| r["type"] == "alerting").count();
    assert!(alerts >= 6, "alert rules loaded: {alerts}");
    for rule in &rules {
        match rule["type"].as_str() {
            Some("recording") => {
                let record = rule["name"].as_str().unwrap();
                prometheus.wait_for_data(record, PROMETHEUS_DEADLINE).await;
            }
            // An alert's expression must evaluate (its inputs are the recording rules,
            // each checked for data above); it returns series only while it fires.
            _ => {
                prometheus.query(rule["query"].as_str().unwrap()).await;
            }
        }
    }
    // Each rule evaluated without error on the real series.
    eventually(
        "every rule evaluated healthy",
        PROMETHEUS_DEADLINE,
        || async {
            let groups = prometheus.rule_groups().await;
            let unhealthy: Vec<String> = groups
                .iter()
                .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
                .filter(|r| r["health"] != "ok")
                .map(|r| format!("{} {} {}", r["name"], r["health"], r["lastError"]))
                .collect();
            unhealthy.is_empty().then_some(())
        },
    )
    .await;

    stop.cancel();
    producer.await.unwrap();
    subscriber.stop().await.unwrap();
}

/// Every `expr` of the dashboard's panels' targets.
fn dashboard_queries(dashboard: &Value) -> Vec<String> {
    dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|panel| panel["targets"].as_array().cloned().unwrap_or_default())
        .map(|target| target["expr"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn the_alert_rules_pass_their_promtool_unit_tests() {
    let (ok, output) = promtool(&["check", "rules", "txoutbox.rules.yml"], "", &rules_dir());
    assert!(ok, "promtool check rules:\n{output}");
    let (ok, output) = promtool(
        &["test", "rules", "txoutbox.rules.test.yml"],
        "",
        &rules_dir(),
    );
    assert!(ok, "promtool test rules:\n{output}");
}

/// Inserts 3 rows on topic `a` and 1 on `b`, and waits for the depth gauges to say so.
async fn depth_gauges_count(server: &Server) {
    let url = server.metrics_url();
    eventually("the depth gauges to count the rows", DEADLINE, || async {
        let scrape = get(&url).await;
        let pending = |topic: &str| {
            sample(
                &scrape,
                &format!(r#"txoutbox_outbox_pending_rows{{outbox="orders",topic="{topic}"}}"#),
            )
        };
        (pending("a") == Some(3.0) && pending("b") == Some(1.0)).then_some(())
    })
    .await;
    let scrape = get(&url).await;
    let age = sample(
        &scrape,
        r#"txoutbox_outbox_oldest_pending_age_seconds{outbox="orders",topic="a"}"#,
    );
    assert!(age.is_some_and(|age| age >= 0.0), "{scrape}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn depth_gauges_on_postgres() {
    let db = TestDb::new().await;
    let server = Server::start(&with_metrics(db.config(""))).await;
    server.wait_serving("orders").await;
    for topic in ["a", "a", "a", "b"] {
        db.insert(topic, None, b"x").await;
    }
    depth_gauges_count(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn depth_gauges_on_sqlite() {
    let db = SqliteDb::new().await;
    let server = Server::start(&with_metrics(db.config(""))).await;
    server.wait_serving("orders").await;
    for topic in ["a", "a", "a", "b"] {
        db.insert(topic, None, b"x").await;
    }
    depth_gauges_count(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn depth_gauges_on_mariadb() {
    let db = MariaDb::new().await;
    let server = Server::start(&with_metrics(db.config(""))).await;
    server.wait_serving("orders").await;
    for topic in ["a", "a", "a", "b"] {
        db.insert(topic, None, b"x").await;
    }
    depth_gauges_count(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_metrics_listener_unless_configured() {
    let db = SqliteDb::new().await;
    let server = Server::start(&db.config("")).await;
    server.wait_serving("orders").await;
    let log = server.log.lock().unwrap().clone();
    let line = log
        .iter()
        .find(|line| line.contains("txoutboxd listening"))
        .unwrap();
    let fields: Value = serde_json::from_str(line).unwrap();
    assert!(
        fields["fields"]["metrics_address"].is_null(),
        "metrics listener without server.metrics_listen: {line}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscribers_metrics_match_its_counters_and_pass_promtool() {
    let db = SqliteDb::new().await;
    let retry_fast =
        "max_attempts = 2\n[outboxes.orders.backoff]\nbase = \"10ms\"\nmaximum = \"20ms\"\n";
    let server = Server::start(&db.config(retry_fast)).await;
    server.wait_serving("orders").await;
    for payload in ["ok", "ok", "fail", "ok"] {
        db.insert("t", None, payload.as_bytes()).await;
    }
    let subscriber = Subscriber::builder([server.url()], "orders")
        .name("billing")
        .build(publish)
        .unwrap();
    let registry = prometheus::Registry::new();
    txoutbox_client::metrics::register(&subscriber, &registry).unwrap();
    let counters = subscriber.counters();
    let handle = subscriber.spawn();
    eventually("three published, one dead-lettered", DEADLINE, || async {
        let totals = counters.snapshot();
        (totals.acked == 3 && totals.dead_lettered == 1).then_some(())
    })
    .await;
    // The latency task observes the events it was sent: wait for the three publishes.
    let labels = r#"{outbox="orders",subscriber="billing"}"#;
    let scrape = eventually("three publish latencies", DEADLINE, || async {
        let scrape = prometheus::TextEncoder::new()
            .encode_to_string(&registry.gather())
            .unwrap();
        let count = sample(
            &scrape,
            &format!("txoutbox_client_publish_duration_seconds_count{labels}"),
        );
        (count == Some(3.0)).then_some(scrape)
    })
    .await;
    let totals = counters.snapshot();
    for (name, value) in [
        ("published", totals.published),
        ("acked", totals.acked),
        ("retried", totals.retried),
        ("dead_lettered", totals.dead_lettered),
        ("connects", totals.connects),
        ("received", totals.received),
    ] {
        let series = format!("txoutbox_client_{name}_total{labels}");
        assert_eq!(
            sample(&scrape, &series),
            Some(value as f64),
            "{series} in:\n{scrape}"
        );
    }
    assert_eq!((totals.published, totals.retried), (3, 1), "{totals:?}");
    let (ok, output) = promtool(&["check", "metrics"], &scrape, &rules_dir());
    assert!(ok, "promtool check metrics:\n{output}\n{scrape}");
    handle.stop().await.unwrap();
}

/// Two subscription groups, one with a subscriber that acks everything, one with none.
const TWO_GROUPS: &str =
    "partitions = 4\n[outboxes.orders.groups.fed]\n[outboxes.orders.groups.idle]\n";

/// Each group's gauges: the fed group passes every row with its one stream owning every
/// partition; the idle group lags by every row, with no member and no owner.
async fn group_gauges_count(server: &Server, rows: usize) {
    let subscriber = Subscriber::builder([server.url()], "orders")
        .name("feeder")
        .group("fed")
        .build(publish)
        .unwrap()
        .spawn();
    let metrics_url = server.metrics_url();
    let rows = rows as f64;
    eventually("the group gauges", DEADLINE, || async {
        let scrape = get(&metrics_url).await;
        let value = |name: &str, group: &str| {
            sample(
                &scrape,
                &format!(r#"{name}{{group="{group}",outbox="orders"}}"#),
            )
        };
        let counted = value("txoutbox_group_lag_rows", "fed") == Some(0.0)
            && value("txoutbox_group_lag_rows", "idle") == Some(rows)
            && value("txoutbox_group_lag_seconds", "idle").is_some_and(|age| age > 0.0)
            && value("txoutbox_group_members", "fed") == Some(1.0)
            && value("txoutbox_group_members", "idle") == Some(0.0)
            && value("txoutbox_group_owned_partitions", "fed") == Some(4.0)
            && value("txoutbox_group_owned_partitions", "idle") == Some(0.0)
            && value("txoutbox_group_partitions", "idle") == Some(4.0)
            && value("txoutbox_group_dead_rows", "fed") == Some(0.0)
            && value("txoutbox_group_held_keys", "fed") == Some(0.0)
            && sample(
                &scrape,
                r#"txoutbox_group_frontier_delay_seconds{outbox="orders"}"#,
            )
            .is_some();
        counted.then_some(())
    })
    .await;
    subscriber.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_gauges_on_postgres() {
    let db = TestDb::new().await;
    let server = Server::start(&with_metrics(db.config(TWO_GROUPS))).await;
    server.wait_serving("orders").await;
    for n in 0..5 {
        db.insert("t", Some(&format!("k{n}")), b"x").await;
    }
    group_gauges_count(&server, 5).await;
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_gauges_on_sqlite() {
    let db = SqliteDb::new().await;
    let server = Server::start(&with_metrics(db.config(TWO_GROUPS))).await;
    server.wait_serving("orders").await;
    for n in 0..5 {
        db.insert("t", Some(&format!("k{n}")), b"x").await;
    }
    group_gauges_count(&server, 5).await;
}
