//! Limits per identity: refused as `RESOURCE_EXHAUSTED`, naming the limit.

use super::*;

async fn open_stream(
    channel: Channel,
    token: &str,
    window: u32,
) -> Result<
    (
        mpsc::Sender<v1::SubscribeRequest>,
        tonic::Streaming<v1::SubscribeResponse>,
    ),
    Status,
> {
    let (tx, rx) = mpsc::channel(4);
    tx.send(v1::SubscribeRequest {
        request: Some(Req::Open(v1::OpenSubscription {
            outbox: "orders".into(),
            subscriber: "limited".into(),
            topics: vec![],
            max_in_flight: window,
            lease_ms: 0,
        })),
    })
    .await
    .unwrap();
    let mut responses = RelayClient::new(channel)
        .subscribe(with_token(ReceiverStream::new(rx), Some(token)))
        .await?
        .into_inner();
    // `subscribed` comes first on a stream that was let in.
    let first = responses.message().await?;
    assert!(first.is_some());
    Ok((tx, responses))
}

#[tokio::test]
async fn limits_per_identity_are_resource_exhausted_naming_the_limit() {
    let db = TestDb::new().await;
    let extra = [
        token_identity("one-stream", "one-stream", r#"{ orders = ["subscribe"] }"#),
        "limits = { max_streams = 1 }\n".to_owned(),
        token_identity(
            "small-window",
            "small-window",
            r#"{ orders = ["subscribe"] }"#,
        ),
        "limits = { max_messages_in_flight = 100 }\n".to_owned(),
        token_identity(
            "slow-caller",
            "slow-caller",
            r#"{ orders = ["subscribe"] }"#,
        ),
        "limits = { max_calls_per_second = 3 }\n".to_owned(),
    ]
    .concat();
    let server = Server::start(&config(&db, &extra)).await;
    server.wait_serving("orders").await;
    let channel = server.channel().await;

    let first = open_stream(channel.clone(), "one-stream", 10)
        .await
        .unwrap();
    let refused = open_stream(channel.clone(), "one-stream", 10)
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert!(
        refused.message().contains("max_streams = 1"),
        "{}",
        refused.message()
    );
    drop(first);
    let again = eventually("the stream's slot given back", DEADLINE, || {
        let channel = channel.clone();
        async move { open_stream(channel, "one-stream", 10).await.ok() }
    })
    .await;
    drop(again);

    let (window_tx, _window_rx) = open_stream(channel.clone(), "small-window", 80)
        .await
        .unwrap();
    let refused = open_stream(channel.clone(), "small-window", 50)
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert!(
        refused.message().contains("max_messages_in_flight = 100"),
        "{}",
        refused.message()
    );
    let fits = open_stream(channel.clone(), "small-window", 20)
        .await
        .unwrap();
    drop(fits);
    // Raising a window past the budget ends that stream with the limit's name.
    let (tx, mut responses) = eventually("the 20 given back", DEADLINE, || {
        let channel = channel.clone();
        async move { open_stream(channel, "small-window", 20).await.ok() }
    })
    .await;
    tx.send(v1::SubscribeRequest {
        request: Some(Req::SetWindow(v1::SetWindow { max_in_flight: 90 })),
    })
    .await
    .unwrap();
    let ended = loop {
        match responses.message().await {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("the stream ended without an error"),
            Err(status) => break status,
        }
    };
    assert_eq!(ended.code(), Code::ResourceExhausted);
    assert!(
        ended.message().contains("max_messages_in_flight"),
        "{}",
        ended.message()
    );
    drop(window_tx);

    let mut relay = RelayClient::new(channel.clone());
    let mut exhausted = None;
    for _ in 0..50 {
        let request = v1::ClaimRequest {
            outbox: "orders".into(),
            worker_id: "w".into(),
            batch_size: 1,
            lease_ms: 0,
            topics: vec![],
        };
        if let Err(status) = relay.claim(with_token(request, Some("slow-caller"))).await {
            exhausted = Some(status);
            break;
        }
    }
    let exhausted = exhausted.expect("50 calls at once within a limit of 3 per second");
    assert_eq!(exhausted.code(), Code::ResourceExhausted);
    assert!(
        exhausted.message().contains("max_calls_per_second = 3"),
        "{}",
        exhausted.message()
    );
    db.drop().await;
}
