//! `server.metrics_listen`: plain HTTP/1.1 on a listener of its own, so a scraper or an
//! orchestrator's probe needs neither the gRPC port's TLS nor its credentials, and the
//! listener can be kept on an address only the monitoring network reaches.
//!
//! - `GET /metrics`: the Prometheus scrape.
//! - `GET /healthz`: 200 while the process answers HTTP at all (a liveness probe: a
//!   database outage must not get the pod restarted, so nothing else is checked).
//! - `GET /readyz`: 200 when every outbox's last health check passed (its database
//!   answers, its table is usable) and the server is not draining; 503 otherwise, with
//!   one line per reason. Answered from the health watch's last results, so a probe costs
//!   no database round trip and is at most `server.health_interval` behind.

use std::future::Future;
use std::sync::Arc;

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;

use super::metrics::Metrics;

/// Why the server is not ready, one line a reason; none when it is (the health watch's
/// last results: `health::Readiness`).
pub type NotReady = Arc<dyn Fn() -> Vec<String> + Send + Sync>;

#[derive(Clone)]
struct Probes {
    metrics: Arc<Metrics>,
    not_ready: NotReady,
}

/// Serves the metrics and the probes on `listener` until `shutdown` completes.
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    not_ready: NotReady,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(scrape))
        .route("/healthz", get(alive))
        .route("/readyz", get(ready))
        .with_state(Probes { metrics, not_ready });
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}

async fn scrape(State(probes): State<Probes>) -> impl IntoResponse {
    // Encoding reads atomics and the pools' counters: no I/O, no database.
    (
        [(CONTENT_TYPE, Metrics::content_type())],
        probes.metrics.encode(),
    )
}

async fn alive() -> &'static str {
    "ok\n"
}

async fn ready(State(probes): State<Probes>) -> (StatusCode, String) {
    let problems = (probes.not_ready)();
    if problems.is_empty() {
        return (StatusCode::OK, "ready\n".to_owned());
    }
    let mut body = String::from("not ready\n");
    for problem in problems {
        body.push_str(&problem);
        body.push('\n');
    }
    (StatusCode::SERVICE_UNAVAILABLE, body)
}
