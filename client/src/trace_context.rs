//! The publish span: with the `otel` feature, each publish runs in a span
//! `txoutbox.publish`, a child of the message's W3C `traceparent` (the relay's span, which
//! continues the producer's), and the message's `traceparent` / `tracestate` are rewritten
//! to that span before the publisher sees the message. Every publisher copies the
//! message's headers into the broker message, so a consumer's span joins the producer's
//! trace. A message without `traceparent` starts a trace at its publish span. Spans go
//! wherever the application's `tracing-opentelemetry` layer sends them; without such a
//! layer (or without the feature) the headers go out as the relay sent them.

use crate::Message;

#[cfg(feature = "otel")]
mod otel {
    use std::collections::BTreeMap;

    use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
    use opentelemetry::trace::TraceContextExt;
    use opentelemetry_sdk::propagation::TraceContextPropagator;
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    use crate::Message;

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

    pub fn publish_span(message: &mut Message) -> tracing::Span {
        let span = tracing::info_span!(
            "txoutbox.publish",
            "messaging.message.id" = message.id,
            topic = %message.topic,
            attempt = message.attempts,
        );
        let propagator = TraceContextPropagator::new();
        let parent = propagator.extract(&Headers(&mut message.headers));
        if parent.span().span_context().is_valid() {
            // Fails only when no OpenTelemetry layer records the span: headers stay.
            let _ = span.set_parent(parent);
        }
        let context = span.context();
        if context.span().span_context().is_valid() {
            propagator.inject_context(&context, &mut Headers(&mut message.headers));
        }
        span
    }
}

/// The span a publish of `message` runs in, its trace headers rewritten to continue from
/// it (see the module doc); no span without the `otel` feature.
pub(crate) fn publish_span(message: &mut Message) -> tracing::Span {
    #[cfg(feature = "otel")]
    {
        otel::publish_span(message)
    }
    #[cfg(not(feature = "otel"))]
    {
        let _ = message;
        tracing::Span::none()
    }
}
