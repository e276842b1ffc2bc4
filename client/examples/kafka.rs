use txoutbox_client::{KafkaPublisher, Subscriber};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Idempotent producer, acks=all; orders.paid goes to the Kafka topic outbox.orders.paid.
    let kafka = KafkaPublisher::builder("localhost:9092")
        .topic_prefix("outbox.")
        .build()?;
    Subscriber::builder(["http://127.0.0.1:7411"], "orders")
        .name("orders-to-kafka")
        .build(kafka)?
        .run_until_signal() // SIGINT/SIGTERM: finish in-flight, give back the rest
        .await?;
    Ok(())
}
