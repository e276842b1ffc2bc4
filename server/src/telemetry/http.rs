//! `GET /metrics` on `server.metrics_listen`: plain HTTP/1.1 on a listener of its own, so
//! a scraper needs neither the gRPC port's TLS nor its credentials, and the metrics can
//! be kept on an address only the monitoring network reaches.

use std::future::Future;
use std::sync::Arc;

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;

use super::metrics::Metrics;

/// Serves the metrics on `listener` until `shutdown` completes.
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(scrape))
        .with_state(metrics);
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}

async fn scrape(State(metrics): State<Arc<Metrics>>) -> impl IntoResponse {
    // Encoding reads atomics and the pools' counters: no I/O, no database.
    ([(CONTENT_TYPE, Metrics::content_type())], metrics.encode())
}
