//! OpenTelemetry traces, exported over OTLP/gRPC to a collector; off by default.
//!
//! On when `[telemetry] otlp_endpoint` or the standard `OTEL_EXPORTER_OTLP_ENDPOINT` /
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set (the exporter reads the other
//! `OTEL_EXPORTER_OTLP_*` variables itself), unless `OTEL_SDK_DISABLED=true`. Every
//! `tracing` span the filter (`RUST_LOG`) lets through becomes a span: the `subscribe`
//! stream, `outbox.claim`, each answer (`outbox.ack`, `outbox.nack`...), the admin calls.
//!
//! **Trace context per message.** A row whose headers carry a W3C `traceparent` (and
//! `tracestate`), written by the producer in its transaction, gets a span `outbox.relay`
//! when it is claimed, a child of the producer's span; the row's `traceparent` handed to
//! the subscriber is rewritten to that span, so the subscriber's publish continues the
//! trace from the relay (the Rust client's `otel` feature does, and every publisher copies
//! the headers into the broker message). A row without `traceparent` gets no relay span
//! and its headers go out untouched; with tracing off, headers are never touched.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context as _;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TraceContextExt;
use opentelemetry_otlp::{SpanExporter, WithExportConfig};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::config::TelemetryConfig;
use crate::storage::OutboxMessage;

/// The W3C header carrying the trace and parent span ids.
pub const TRACEPARENT: &str = "traceparent";

/// Set once an exporter runs: the per-message work is skipped otherwise.
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Whether traces are exported (the per-message relay spans are made only then).
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Whether the configuration or the environment asks for traces.
fn wanted(config: &TelemetryConfig) -> bool {
    let set = |name: &str| std::env::var(name).is_ok_and(|v| !v.trim().is_empty());
    let disabled = std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.eq_ignore_ascii_case("true"));
    !disabled
        && (config.otlp_endpoint.is_some()
            || set("OTEL_EXPORTER_OTLP_ENDPOINT")
            || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
}

/// The tracer provider exporting to the collector, when traces are wanted. Call inside
/// the tokio runtime: the gRPC exporter's channel runs on it.
pub fn provider(config: &TelemetryConfig) -> anyhow::Result<Option<SdkTracerProvider>> {
    if !wanted(config) {
        return Ok(None);
    }
    let mut exporter = SpanExporter::builder().with_tonic();
    if let Some(endpoint) = &config.otlp_endpoint {
        exporter = exporter.with_endpoint(endpoint);
    }
    let exporter = exporter.build().context("telemetry: the OTLP exporter")?;
    // The builder's detectors read `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES`.
    let mut resource = Resource::builder();
    let from_env = std::env::var("OTEL_SERVICE_NAME").is_ok();
    match &config.service_name {
        Some(name) => resource = resource.with_service_name(name.clone()),
        None if !from_env => resource = resource.with_service_name("txoutboxd"),
        None => {}
    }
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build();
    ENABLED.store(true, Ordering::Relaxed);
    Ok(Some(provider))
}

/// Headers as the propagator reads and writes them.
struct Headers<'a>(&'a mut BTreeMap<String, String>);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(String::as_str).collect()
    }
}

impl Injector for Headers<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.insert(key.to_owned(), value);
    }
}

/// Makes the relay's span of `message` (a child of its producer's `traceparent`) and
/// rewrites the message's trace headers to continue from it; nothing without a valid
/// `traceparent` or with tracing off. The span covers the hand-off only: it ends here.
pub fn relay_span(outbox: &str, message: &mut OutboxMessage) {
    if !enabled() || !message.headers.contains_key(TRACEPARENT) {
        return;
    }
    let propagator = TraceContextPropagator::new();
    let parent = propagator.extract(&Headers(&mut message.headers));
    if !parent.span().span_context().is_valid() {
        return;
    }
    let span = tracing::info_span!(
        "outbox.relay",
        outbox,
        "messaging.message.id" = message.id,
        topic = %message.topic,
        attempt = message.attempts,
    );
    if span.set_parent(parent).is_err() {
        return;
    }
    propagator.inject_context(&span.context(), &mut Headers(&mut message.headers));
}
