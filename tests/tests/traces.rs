//! One event's trace, end to end: a producer's W3C `traceparent` in the row's headers,
//! the relay's span in `txoutboxd` (exported over OTLP to a receiver in this test), the
//! Rust client's publish span (the `otel` feature, exported from this process to the same
//! receiver), and the `traceparent` header of the record on librdkafka's mock cluster.
//! Each link must name the one before as its parent, in one trace.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use rdkafka::mocking::MockCluster;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use txoutbox_client::producer::{NewMessage, OutboxTable};
use txoutbox_client::{KafkaPublisher, Subscriber};
use txoutbox_tests::otlp_receiver::{OtlpReceiver, ReceivedSpan};
use txoutbox_tests::{eventually, Server, TestDb, DEADLINE};

use crate::kafka_common::consume;

/// This process's spans (the client's) go to `receiver`, as an application's would go
/// to its collector. nextest runs each test in a process of its own, so the global
/// subscriber is this test's.
fn export_client_spans(receiver: &OtlpReceiver) -> SdkTracerProvider {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(&receiver.endpoint)
        .build()
        .unwrap();
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(Resource::builder().with_service_name("publisher").build())
        .build();
    tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("publisher")))
        .init();
    provider
}

/// The `traceparent`'s (trace id, parent span id).
fn ids(traceparent: &str) -> (String, String) {
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(parts.len(), 4, "traceparent {traceparent}");
    (parts[1].to_owned(), parts[2].to_owned())
}

fn find<'a>(
    spans: &'a [ReceivedSpan],
    service: &str,
    name: &str,
    trace: &str,
) -> Option<&'a ReceivedSpan> {
    spans
        .iter()
        .find(|s| s.service == service && s.name == name && s.trace_id == trace)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producers_trace_runs_through_the_relay_and_the_publish_into_the_kafka_record() {
    let receiver = OtlpReceiver::start().await;
    let provider = export_client_spans(&receiver);
    let cluster = MockCluster::new(1).unwrap();
    cluster.create_topic("shop.orders.paid", 1, 1).unwrap();
    let bootstrap = cluster.bootstrap_servers();

    let db = TestDb::new().await;
    let server = Server::start_with_env(
        &db.config(""),
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint.as_str()),
            ("OTEL_SERVICE_NAME", "txoutboxd"),
            // Export every 100ms instead of every 5s: the test waits less.
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    )
    .await;
    server.wait_serving("orders").await;

    // The producer's span, as its own tracing would have written it in the transaction.
    let trace = hex(16);
    let producer_span = hex(8);
    let table = OutboxTable::in_schema(&db.schema, "outbox").unwrap();
    let mut tx = db.pool.begin().await.unwrap();
    let message = NewMessage::new("orders.paid", "order 7 paid")
        .key("7")
        .header("traceparent", format!("00-{trace}-{producer_span}-01"));
    table.insert(&mut *tx, &message).await.unwrap();
    // A row without trace context: its headers must go out untouched by the relay.
    let untraced = NewMessage::new("orders.paid", "order 8 paid").key("8");
    table.insert(&mut *tx, &untraced).await.unwrap();
    tx.commit().await.unwrap();

    let kafka = KafkaPublisher::builder(&bootstrap)
        .topic_prefix("shop.")
        .build()
        .unwrap();
    let handle = Subscriber::builder([server.url()], "orders")
        .name("orders-to-kafka")
        .build(kafka)
        .unwrap()
        .spawn();
    eventually("both rows delivered", DEADLINE, || async {
        (db.count("done").await == 2).then_some(())
    })
    .await;
    handle.stop().await.unwrap();
    provider.force_flush().unwrap();

    let records = consume(&bootstrap, "shop.orders.paid", 1, 2);
    let record = records
        .iter()
        .find(|r| r.payload == "order 7 paid")
        .expect("the traced record");
    let (record_trace, record_parent) = ids(&record.headers["traceparent"]);
    assert_eq!(
        record_trace, trace,
        "the record carries the producer's trace"
    );

    let (relay, publish) = eventually("the relay's and the publish's spans", DEADLINE, || async {
        let spans = receiver.spans();
        let relay = find(&spans, "txoutboxd", "outbox.relay", &trace)?.clone();
        let publish = find(&spans, "publisher", "txoutbox.publish", &trace)?.clone();
        Some((relay, publish))
    })
    .await;
    assert_eq!(
        relay.parent_span_id, producer_span,
        "relay <- producer: {relay:?}"
    );
    assert_eq!(
        publish.parent_span_id, relay.span_id,
        "publish <- relay: {publish:?}"
    );
    assert_eq!(record_parent, publish.span_id, "record header <- publish");

    // The server's own work is traced too: claims and acks.
    eventually("the claim and ack spans of txoutboxd", DEADLINE, || async {
        let spans = receiver.spans();
        let has = |name: &str| {
            spans
                .iter()
                .any(|s| s.service == "txoutboxd" && s.name == name)
        };
        (has("outbox.claim") && has("outbox.ack")).then_some(())
    })
    .await;

    // Without a producer's trace context the relay makes no span; the publish span
    // starts a trace of its own and the record carries that.
    let plain = records
        .iter()
        .find(|r| r.payload == "order 8 paid")
        .expect("the untraced record");
    let (plain_trace, plain_parent) = ids(&plain.headers["traceparent"]);
    let spans = receiver.spans();
    assert!(find(&spans, "txoutboxd", "outbox.relay", &plain_trace).is_none());
    let own = find(&spans, "publisher", "txoutbox.publish", &plain_trace)
        .unwrap_or_else(|| panic!("the publish span of trace {plain_trace}: {spans:?}"));
    assert_eq!(own.span_id, plain_parent);
    assert!(own.parent_span_id.is_empty(), "a root span: {own:?}");
    provider.shutdown().unwrap();
}

/// `bytes` random bytes in lowercase hex, never all zero (an invalid W3C id).
fn hex(bytes: usize) -> String {
    loop {
        let id: Vec<u8> = (0..bytes).map(|_| rand::random::<u8>()).collect();
        if id.iter().any(|b| *b != 0) {
            return ::hex::encode(id);
        }
    }
}
