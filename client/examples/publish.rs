use txoutbox_client::{Message, PublishError, Subscriber};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let subscriber = Subscriber::builder(["http://127.0.0.1:7411"], "orders")
        .name("orders-printer")
        .build(|message: Message| async move {
            // Publish to your broker here; return Ok only once it has the message.
            println!("{}: {}", message.topic, message.payload_str()?);
            Ok::<_, PublishError>(())
        })?;
    subscriber.run_until_signal().await?; // Ctrl-C: finish in-flight, give back the rest
    Ok(())
}
