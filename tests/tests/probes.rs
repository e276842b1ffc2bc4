//! The HTTP probes on the metrics listener as an orchestrator uses them: `/healthz` while
//! the process answers, `/readyz` following each outbox's database and the drain, and
//! gRPC health agreeing with it for the whole drain; the Kubernetes manifest wired to
//! them.

use std::time::Duration;

use tonic_health::pb::health_check_response::ServingStatus;
use txoutbox_tests::db::database_url;
use txoutbox_tests::{eventually, Server, Subscriber, TcpProxy, TestDb, DEADLINE};

/// `config` with the metrics listener on a port the kernel picks and a health check
/// every 100ms, so a change shows within a few probes.
fn with_probes(config: String) -> String {
    config
        .replacen(
            "[server]\n",
            "[server]\nmetrics_listen = \"127.0.0.1:0\"\n",
            1,
        )
        .replace("health_interval = \"1s\"", "health_interval = \"100ms\"")
}

/// Status and body of `GET http://METRICS_ADDRESS/PATH`.
async fn probe(server: &Server, path: &str) -> (u16, String) {
    let url = format!("http://{}{path}", server.metrics_address());
    let response = reqwest::get(&url)
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    let status = response.status().as_u16();
    (status, response.text().await.unwrap())
}

/// The test database's URL through `proxy`.
fn through(proxy: &TcpProxy, url: &str) -> String {
    let upstream = upstream_of(url);
    url.replace(&upstream, &proxy.address())
}

/// `host:port` of a `postgres://` URL.
fn upstream_of(url: &str) -> String {
    let rest = url.split_once("://").unwrap().1;
    let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    host.split('/').next().unwrap().to_owned()
}

#[tokio::test]
async fn readyz_is_not_ready_while_the_database_is_down_and_ready_again_after() {
    let db = TestDb::new().await;
    let proxy = TcpProxy::start(&upstream_of(&database_url())).await;
    let config = with_probes(db.config_at(&through(&proxy, &db.url), ""));
    let server = Server::start_serving(&config).await;
    eventually("/readyz to answer 200", DEADLINE, || async {
        (probe(&server, "/readyz").await == (200, "ready\n".into())).then_some(())
    })
    .await;
    assert_eq!(probe(&server, "/healthz").await, (200, "ok\n".into()));

    proxy.reset();
    let body = eventually("/readyz to answer 503", DEADLINE, || async {
        let (status, body) = probe(&server, "/readyz").await;
        (status == 503).then_some(body)
    })
    .await;
    assert!(
        body.contains("outbox orders is not serving: database unreachable"),
        "{body}"
    );
    assert_eq!(server.health("orders").await, ServingStatus::NotServing);
    assert_eq!(
        probe(&server, "/healthz").await,
        (200, "ok\n".into()),
        "alive while the database is down"
    );

    proxy.restore();
    eventually("/readyz to answer 200 again", DEADLINE, || async {
        (probe(&server, "/readyz").await.0 == 200).then_some(())
    })
    .await;
    db.drop().await;
}

#[tokio::test]
async fn the_drain_keeps_readyz_and_grpc_health_not_serving_until_the_process_exits() {
    let db = TestDb::new().await;
    let mut server = Server::start_serving(&with_probes(db.config(""))).await;
    let id = db.insert("t", None, b"held").await;
    let mut sub = Subscriber::open(&server, "holder", 10, 600_000).await;
    assert_eq!(sub.take(1).await[0].id, id);

    server.terminate();
    while !sub.draining {
        assert!(
            sub.pump().await.unwrap(),
            "stream ended before the draining notice"
        );
    }
    // The drain waits for the held row's answer; health checks (every 100ms) go on
    // meanwhile and must not set anything SERVING or ready again.
    let watched = tokio::time::Instant::now();
    while watched.elapsed() < Duration::from_millis(1500) {
        let (status, body) = probe(&server, "/readyz").await;
        assert_eq!(status, 503, "ready again during the drain: {body}");
        assert!(body.contains("draining"), "{body}");
        assert_eq!(server.health("orders").await, ServingStatus::NotServing);
        assert_eq!(server.health("").await, ServingStatus::NotServing);
        assert_eq!(probe(&server, "/healthz").await.0, 200);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    assert_eq!(sub.ack(&[id]).await.acked, [id]);
    sub.wait_end(DEADLINE).await.unwrap();
    assert!(server.wait_exit(DEADLINE).await.success());
    assert_eq!(db.row(id).await.0, "done");
    db.drop().await;
}

/// The manifest's probes and scrape annotations name the port its configuration gives
/// the metrics listener, and a PodDisruptionBudget selects its pods.
#[test]
fn the_kubernetes_manifest_probes_and_scrapes_the_metrics_listener() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/kubernetes/txoutboxd.yaml"
    );
    let manifest = std::fs::read_to_string(path).unwrap();
    for expected in [
        "metrics_listen = \"0.0.0.0:9464\"",
        "- name: metrics\n              containerPort: 9464",
        "readinessProbe:\n            httpGet:\n              path: /readyz\n              port: metrics",
        "livenessProbe:\n            httpGet:\n              path: /healthz\n              port: metrics",
        "prometheus.io/scrape: \"true\"",
        "prometheus.io/port: \"9464\"",
        "prometheus.io/path: /metrics",
        "kind: PodDisruptionBudget",
    ] {
        assert!(
            manifest.contains(expected),
            "deploy/kubernetes/txoutboxd.yaml lacks {expected:?}"
        );
    }
    assert!(!manifest.contains("tcpSocket"), "TCP probes left over");
}
