//! Every publisher with the CloudEvents option, in binary and structured mode, through
//! its real broker (Kafka: librdkafka's mock cluster), read back on the far side and
//! handed to the CloudEvents reference SDK for Python, which must find the same event:
//! `id` = the message id, `source`, `type` = the topic, `subject` = the key, `time`, the
//! sanitised headers as extensions, and the payload as data.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use rdkafka::mocking::MockCluster;
use txoutbox_client::amqp::lapin::options::{BasicGetOptions, QueueDeclareOptions};
use txoutbox_client::amqp::lapin::types::{AMQPValue, FieldTable};
use txoutbox_client::amqp::lapin::{Connection, ConnectionProperties};
use txoutbox_client::amqp::AmqpPublisher;
use txoutbox_client::brokers::CloudEvents;
use txoutbox_client::kafka::KafkaPublisher;
use txoutbox_client::mqtt::rumqttc::v5::mqttbytes::v5::Packet;
use txoutbox_client::mqtt::rumqttc::v5::mqttbytes::QoS;
use txoutbox_client::mqtt::rumqttc::v5::{AsyncClient, Event, MqttOptions};
use txoutbox_client::mqtt::MqttPublisher;
use txoutbox_client::nats::async_nats::jetstream::{self, stream};
use txoutbox_client::nats::NatsPublisher;
use txoutbox_client::redis_stream::redis::streams::StreamRangeReply;
use txoutbox_client::redis_stream::redis::{self, AsyncCommands};
use txoutbox_client::redis_stream::RedisStreamPublisher;
use txoutbox_client::sns::SnsPublisher;
use txoutbox_client::sqs::SqsPublisher;
use txoutbox_client::webhook::WebhookPublisher;
use txoutbox_client::{Message, Publisher};
use txoutbox_tests::broker_process::BrokerProcess;
use txoutbox_tests::brokers::unique_name;
use txoutbox_tests::cloudevents_check::read_back;
use txoutbox_tests::moto::Moto;
use txoutbox_tests::{eventually, DEADLINE};

use crate::kafka_common::first_record;

const SOURCE: &str = "/shop/orders";

fn message(topic: &str) -> Message {
    let mut message = Message::new(42, topic, r#"{"order":42}"#)
        .with_key("customer-1")
        .with_header("traceparent", "00-ce")
        .with_header("X-Tenant", "t1");
    message.created_at = Some(UNIX_EPOCH + Duration::from_millis(1_700_000_000_123));
    message
}

/// Both modes.
fn modes() -> [CloudEvents; 2] {
    [
        CloudEvents::new(SOURCE),
        CloudEvents::new(SOURCE).structured(),
    ]
}

/// The SDK found the event of [`message`].
fn assert_event(read: &serde_json::Value, topic: &str, what: &str) {
    assert_event_without(read, topic, what, &[]);
}

/// [`assert_event`], but the extensions `absent` are not there.
fn assert_event_without(read: &serde_json::Value, topic: &str, what: &str, absent: &[&str]) {
    let attributes = &read["attributes"];
    for name in absent {
        assert!(attributes.get(name).is_none(), "{what}: {name} in {read}");
    }
    let expected = [
        ("specversion", "1.0"),
        ("id", "42"),
        ("source", SOURCE),
        ("type", topic),
        ("subject", "customer-1"),
        ("time", "2023-11-14T22:13:20.123000+00:00"),
        ("datacontenttype", "application/json"),
        ("txoutboxid", "42"),
        ("txoutboxkey", "customer-1"),
        ("traceparent", "00-ce"),
        ("xtenant", "t1"),
    ];
    for (name, value) in expected {
        if absent.contains(&name) {
            continue;
        }
        assert_eq!(attributes[name], value, "{what}: {name} in {read}");
    }
    assert_eq!(
        read["data"],
        serde_json::json!({"order": 42}),
        "{what}: {read}"
    );
}

fn label(events: &CloudEvents) -> &'static str {
    if events.is_structured() {
        "structured"
    } else {
        "binary"
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_events_are_read_by_the_sdk() {
    type Got = Arc<Mutex<Vec<(Vec<(String, String)>, Vec<u8>)>>>;
    let got: Got = Arc::default();
    let handler = {
        let got = Arc::clone(&got);
        move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
            let got = Arc::clone(&got);
            async move {
                let headers = headers
                    .iter()
                    .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_owned()))
                    .collect();
                got.lock().unwrap().push((headers, body.to_vec()));
                axum::http::StatusCode::NO_CONTENT
            }
        }
    };
    let app = axum::Router::new().route("/hook", axum::routing::post(handler));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let server = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    for events in modes() {
        let mode = label(&events);
        let publisher = WebhookPublisher::builder(&url)
            .cloudevents(events)
            .build()
            .unwrap();
        publisher.publish(&message("orders.paid")).await.unwrap();
        let (headers, body) = got.lock().unwrap().pop().unwrap();
        assert_event(
            &read_back("http", &headers, None, &body),
            "orders.paid",
            mode,
        );
    }
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_events_are_read_by_the_sdk() {
    let cluster = MockCluster::new(1).unwrap();
    for (n, events) in modes().into_iter().enumerate() {
        let mode = label(&events);
        let topic = format!("orders.ce{n}");
        cluster.create_topic(&topic, 1, 1).unwrap();
        let publisher = KafkaPublisher::builder(cluster.bootstrap_servers())
            .cloudevents(events)
            .build()
            .unwrap();
        publisher.publish(&message(&topic)).await.unwrap();
        let record = tokio::task::spawn_blocking({
            let (bootstrap, topic) = (cluster.bootstrap_servers(), topic.clone());
            move || first_record(&bootstrap, &topic)
        })
        .await
        .unwrap();
        let headers: Vec<(String, String)> = record.headers.clone().into_iter().collect();
        let mut read = read_back(
            "kafka",
            &headers,
            record.key.as_deref(),
            record.payload.as_bytes(),
        );
        if mode == "structured" {
            // The record carries only the content type the binding requires; the SDK's
            // Kafka binding (1.12) takes that header for `datacontenttype` over the
            // event's own.
            assert_eq!(
                headers,
                [("content-type".into(), "application/cloudevents+json".into())]
            );
            assert_eq!(
                read["attributes"]["datacontenttype"],
                "application/cloudevents+json"
            );
            read["attributes"]["datacontenttype"] = "application/json".into();
            assert_eq!(
                serde_json::from_str::<serde_json::Value>(&record.payload).unwrap()
                    ["datacontenttype"],
                "application/json"
            );
        }
        assert_event(&read, &topic, mode);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_events_are_read_by_the_sdk() {
    let client = txoutbox_client::nats::async_nats::connect("127.0.0.1:4222")
        .await
        .expect("NATS at 127.0.0.1:4222 (scripts/test starts it)");
    let js = jetstream::new(client);
    let name = unique_name();
    js.create_stream(stream::Config {
        name: name.clone(),
        subjects: vec![format!("{name}.>")],
        storage: stream::StorageType::Memory,
        ..Default::default()
    })
    .await
    .unwrap();
    for events in modes() {
        let mode = label(&events);
        let publisher = NatsPublisher::builder("nats://127.0.0.1:4222")
            .topic_prefix(format!("{name}."))
            .msg_id_prefix(mode)
            .cloudevents(events)
            .build()
            .unwrap();
        publisher.publish(&message("orders.paid")).await.unwrap();
        let stored = js
            .get_stream(&name)
            .await
            .unwrap()
            .get_last_raw_message_by_subject(&format!("{name}.orders.paid"))
            .await
            .unwrap();
        let headers: Vec<(String, String)> = stored
            .headers
            .iter()
            .flat_map(|(n, values)| {
                values
                    .iter()
                    .map(move |v| (n.to_string(), v.as_str().to_owned()))
            })
            .collect();
        assert_event(
            &read_back("nats", &headers, None, &stored.payload),
            "orders.paid",
            mode,
        );
    }
    js.delete_stream(&name).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_events_are_read_by_the_sdk() {
    let uri = "amqp://guest:guest@127.0.0.1:5672/%2f";
    let connection = Connection::connect(uri, ConnectionProperties::default())
        .await
        .expect("RabbitMQ at 127.0.0.1:5672 (scripts/test starts it)");
    let channel = connection.create_channel().await.unwrap();
    let queue = unique_name();
    channel
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions {
                auto_delete: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    for events in modes() {
        let mode = label(&events);
        // The default exchange routes by queue name.
        let publisher = AmqpPublisher::builder(uri, "")
            .topic_fn({
                let queue = queue.clone();
                move |_| queue.clone()
            })
            .cloudevents(events)
            .build()
            .unwrap();
        publisher.publish(&message("orders.paid")).await.unwrap();
        let got = eventually("the message in the queue", DEADLINE, || async {
            channel
                .basic_get(queue.as_str().into(), BasicGetOptions { no_ack: true })
                .await
                .unwrap()
        })
        .await;
        let properties = &got.delivery.properties;
        let mut headers: Vec<(String, String)> = properties
            .headers()
            .clone()
            .unwrap_or_default()
            .inner()
            .iter()
            .map(|(n, v)| match v {
                AMQPValue::LongString(s) => (
                    n.to_string(),
                    String::from_utf8_lossy(s.as_bytes()).into_owned(),
                ),
                other => panic!("{n}: {other:?}"),
            })
            .collect();
        let content_type = properties.content_type().clone().unwrap();
        headers.push(("content-type".to_owned(), content_type.to_string()));
        assert_event(
            &read_back("amqp", &headers, None, &got.delivery.data),
            "orders.paid",
            mode,
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt_events_are_read_by_the_sdk() {
    let broker = BrokerProcess::mosquitto(|port| {
        format!("user root\nlistener {port} 127.0.0.1\nallow_anonymous true\n")
    })
    .await;
    let (reader, mut events_in) = AsyncClient::new(
        MqttOptions::new(unique_name(), "127.0.0.1", broker.port),
        16,
    );
    reader
        .subscribe("orders/#", QoS::AtLeastOnce)
        .await
        .unwrap();
    let (received, mut incoming) = tokio::sync::mpsc::unbounded_channel();
    let reading = tokio::spawn(async move {
        loop {
            match events_in.poll().await {
                Ok(Event::Incoming(Packet::SubAck(_))) => received.send(None).unwrap(),
                Ok(Event::Incoming(Packet::Publish(publish))) => {
                    received.send(Some(publish)).unwrap()
                }
                Ok(_) => {}
                Err(error) => panic!("the test's reader lost its broker: {error}"),
            }
        }
    });
    let suback = tokio::time::timeout(DEADLINE, incoming.recv()).await;
    assert!(matches!(suback, Ok(Some(None))), "no SUBACK");

    for events in modes() {
        let mode = label(&events);
        let publisher = MqttPublisher::builder(format!("mqtt://{}", broker.address()))
            .topic_fn(|m| m.topic.replace('.', "/"))
            .cloudevents(events)
            .build()
            .unwrap();
        publisher.publish(&message("orders.paid")).await.unwrap();
        let publish = tokio::time::timeout(DEADLINE, incoming.recv())
            .await
            .expect("the message")
            .unwrap()
            .unwrap();
        let properties = publish.properties.unwrap();
        let mut headers = properties.user_properties.clone();
        headers.extend(
            properties
                .content_type
                .map(|t| ("content-type".to_owned(), t)),
        );
        assert_event(
            &read_back("mqtt", &headers, None, &publish.payload),
            "orders.paid",
            mode,
        );
    }
    reading.abort();
}

/// SQS (moto) has no binding: binary mode in message attributes `ce-...` and
/// `content-type`, without `txoutboxid` and `txoutboxkey` (`id` and `subject` say them,
/// and SQS takes ten attributes); structured mode as the body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_events_are_read_by_the_sdk() {
    let moto = Moto::start().await;
    let queue = moto.queue(&unique_name(), &[]).await;
    for events in modes() {
        let mode = label(&events);
        let structured = events.is_structured();
        let publisher = SqsPublisher::builder(&queue)
            .sdk_config(moto.sdk_config())
            .cloudevents(events)
            .build()
            .unwrap();
        publisher.publish(&message("orders.paid")).await.unwrap();
        let received = moto.receive(&queue, 1).await.remove(0);
        let attributes: Vec<(String, String)> = received.attributes.into_iter().collect();
        let read = read_back("sqs", &attributes, None, received.body.as_bytes());
        if structured {
            assert_eq!(attributes.len(), 1, "only the content type: {attributes:?}");
            assert_event(&read, "orders.paid", mode);
        } else {
            assert_event_without(&read, "orders.paid", mode, &["txoutboxid", "txoutboxkey"]);
        }
    }
}

/// SNS (moto), as SQS: read from a queue subscribed with raw message delivery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sns_events_are_read_by_the_sdk() {
    let moto = Moto::start().await;
    let name = unique_name();
    let queue = moto.queue(&name, &[]).await;
    let topic = moto.topic_to_queue(&name, &queue).await;
    for events in modes() {
        let mode = label(&events);
        let structured = events.is_structured();
        let publisher = SnsPublisher::builder(&topic)
            .sdk_config(moto.sdk_config())
            .cloudevents(events)
            .build()
            .unwrap();
        publisher.publish(&message("orders.paid")).await.unwrap();
        let received = moto.receive(&queue, 1).await.remove(0);
        let attributes: Vec<(String, String)> = received.attributes.into_iter().collect();
        let read = read_back("sqs", &attributes, None, received.body.as_bytes());
        if structured {
            assert_event(&read, "orders.paid", mode);
        } else {
            assert_event_without(&read, "orders.paid", mode, &["txoutboxid", "txoutboxkey"]);
        }
    }
}

/// Redis has no binding: structured whatever the option says, in the `payload` field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_events_are_structured_and_read_by_the_sdk() {
    let prefix = format!("{}:", unique_name());
    let publisher = RedisStreamPublisher::builder("redis://127.0.0.1:6379")
        .topic_prefix(prefix.clone())
        .cloudevents(CloudEvents::new(SOURCE))
        .build()
        .unwrap();
    publisher.publish(&message("orders.paid")).await.unwrap();
    let client = redis::Client::open("redis://127.0.0.1:6379").unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    let stream = format!("{prefix}orders.paid");
    let reply: StreamRangeReply = connection.xrange_all(&stream).await.unwrap();
    let fields: BTreeMap<String, redis::Value> = reply.ids[0].map.clone().into_iter().collect();
    let field = |name: &str| match &fields[name] {
        redis::Value::BulkString(bytes) => bytes.clone(),
        other => panic!("{name}: {other:?}"),
    };
    assert_eq!(field("content-type"), b"application/cloudevents+json");
    assert_eq!(field("id"), b"42", "the entry's own fields stay");
    assert_event(
        &read_back("redis", &[], None, &field("payload")),
        "orders.paid",
        "structured",
    );
    let _: () = connection.del(&stream).await.unwrap();
}
