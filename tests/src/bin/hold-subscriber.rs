//! A subscriber that receives messages and never answers: the stand-in for a publisher
//! process that gets killed mid-batch. Prints each received id on its own line.
//!
//! Usage: hold-subscriber SERVER_URL OUTBOX WINDOW LEASE_MS

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use txoutbox_proto::v1::relay_client::RelayClient;
use txoutbox_proto::v1::subscribe_request::Request;
use txoutbox_proto::v1::subscribe_response::Response;
use txoutbox_proto::v1::{OpenSubscription, SubscribeRequest};

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, url, outbox, window, lease_ms] = args.as_slice() else {
        anyhow::bail!("usage: hold-subscriber SERVER_URL OUTBOX WINDOW LEASE_MS");
    };
    let mut client = RelayClient::connect(url.clone()).await?;
    let (tx, rx) = mpsc::channel(4);
    let open = OpenSubscription {
        group: String::new(),
        outbox: outbox.clone(),
        subscriber: "hold".into(),
        topics: vec![],
        max_in_flight: window.parse()?,
        lease_ms: lease_ms.parse()?,
    };
    tx.send(SubscribeRequest {
        request: Some(Request::Open(open)),
    })
    .await?;
    let mut responses = client
        .subscribe(ReceiverStream::new(rx))
        .await?
        .into_inner();
    while let Some(response) = responses.message().await? {
        if let Some(Response::Batch(batch)) = response.response {
            for message in batch.messages {
                println!("{}", message.id);
            }
        }
    }
    drop(tx);
    Ok(())
}
