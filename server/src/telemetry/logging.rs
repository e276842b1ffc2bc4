//! Logging: `tracing` to stderr, text or JSON, filtered by `RUST_LOG` (default `info`);
//! with traces on (see [`super::traces`]), the same spans go to the collector.

use std::io::IsTerminal;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use crate::config::LogFormat;

/// The tracing target of the audit trail (`security::audit`): kept at `info` whatever
/// `RUST_LOG` filters, unless `RUST_LOG` names it.
pub const AUDIT_TARGET: &str = "txoutbox::audit";

/// Flushes the spans not exported yet when dropped (at the end of `main`).
#[must_use = "dropping the guard stops the trace export"]
pub struct TelemetryGuard {
    provider: Option<SdkTracerProvider>,
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take() {
            if let Err(error) = provider.shutdown() {
                eprintln!("txoutboxd: flushing the last spans failed: {error}");
            }
        }
    }
}

/// The log filter: `RUST_LOG` (default `info`), with the audit trail kept at `info` unless
/// `RUST_LOG` names its target: a filter meant to quiet the relay (`RUST_LOG=warn`) must
/// not silence who purged or re-drove what.
fn filter(rust_log: Option<&str>) -> EnvFilter {
    let filter = rust_log
        .and_then(|directives| EnvFilter::try_new(directives).ok())
        .unwrap_or_else(|| EnvFilter::new("info"));
    if rust_log.is_some_and(|directives| directives.contains(AUDIT_TARGET)) {
        return filter;
    }
    let audit = format!("{AUDIT_TARGET}=info")
        .parse()
        .expect("a valid directive");
    filter.add_directive(audit)
}

/// Installs the log output and, when `provider` is given, the span export.
pub fn init_with(format: LogFormat, provider: Option<SdkTracerProvider>) -> TelemetryGuard {
    let rust_log = std::env::var(EnvFilter::DEFAULT_ENV).ok();
    let filter = filter(rust_log.as_deref());
    // Colours only for a terminal: a log file or a pipe gets the lines as they read, so
    // the commands the start-up line prints can be copied from it as they are.
    let output = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let output = match format {
        LogFormat::Text => output.boxed(),
        LogFormat::Json => output.json().boxed(),
    };
    let spans = provider
        .as_ref()
        .map(|provider| tracing_opentelemetry::layer().with_tracer(provider.tracer("txoutboxd")));
    // A second init (tests running the server in-process) is harmless: keep the first.
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(output)
        .with(spans)
        .try_init();
    TelemetryGuard { provider }
}

/// Logs only, no spans exported.
pub fn init(format: LogFormat) {
    // Without a provider the guard has nothing to flush.
    drop(init_with(format, None));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_audit_trail_stays_at_info_unless_rust_log_names_it() {
        let shown = |rust_log: Option<&str>| filter(rust_log).to_string();
        assert!(shown(Some("warn")).contains("txoutbox::audit=info"));
        assert!(shown(None).contains("txoutbox::audit=info"));
        assert!(!shown(Some("warn,txoutbox::audit=off")).contains("txoutbox::audit=info"));
    }
}
