//! Operations: what an operator reads about a running server.
//!
//! - [`logging`]: `tracing` to stderr, text or JSON, and to the span exporter;
//! - [`traces`]: OpenTelemetry over OTLP, and the trace context carried per message;
//! - [`metrics`]: the Prometheus metrics, their names and meanings, and the handles the
//!   relay counts on; [`depth`] refreshes the gauges that need the database;
//!   [`http`] serves them on `server.metrics_listen`.

pub mod depth;
pub mod http;
pub mod logging;
pub mod metrics;
pub mod traces;

pub use logging::{init, init_with, TelemetryGuard};
pub use metrics::Metrics;
