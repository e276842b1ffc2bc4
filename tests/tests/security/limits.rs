//! Limits per identity: refused as `RESOURCE_EXHAUSTED`, naming the limit; bytes in
//! flight holding an identity's streams back.

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
    open_filtered(channel, token, window, &[]).await
}

async fn open_filtered(
    channel: Channel,
    token: &str,
    window: u32,
    topics: &[&str],
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
            group: String::new(),
            outbox: "orders".into(),
            subscriber: "limited".into(),
            topics: topics.iter().map(|t| (*t).to_owned()).collect(),
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

/// The outbox's `max_topic_filters` slots were once first come, first
/// served, so one client could hold them all and keep every other client's new filters
/// out. An identity's `max_topic_filters` is its share.
#[tokio::test]
async fn one_identity_cannot_take_every_topic_filter_of_an_outbox() {
    let db = TestDb::new().await;
    let extra = [
        token_identity("greedy", "greedy", r#"{ "*" = ["subscribe"] }"#),
        "limits = { max_topic_filters = 2 }\n".to_owned(),
        token_identity("other", "other", r#"{ orders = ["subscribe"] }"#),
    ]
    .concat();
    let config = format!(
        "{}\n[outboxes.payments]\ndatabase = \"main\"\nschema = \"{}\"\ntable = \"payments\"\n\
         create_schema = true\n{extra}",
        db.config("max_topic_filters = 4"),
        db.schema
    );
    let server = Server::start(&config).await;
    server.wait_serving("orders").await;
    let channel = server.channel().await;
    let open = |token: &'static str, topic: &'static str| {
        let channel = channel.clone();
        async move { open_filtered(channel, token, 10, &[topic]).await }
    };

    let _a = open("greedy", "a").await.unwrap();
    let b = open("greedy", "b").await.unwrap();
    let refused = open("greedy", "c").await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert!(
        refused.message().contains("max_topic_filters = 2"),
        "{}",
        refused.message()
    );
    let _a_again = open("greedy", "a").await.expect("a filter its streams use");
    // The outbox's other slots stay for others.
    let _c = open("other", "c").await.unwrap();
    let _d = open("other", "d").await.unwrap();
    let full = open("other", "e").await.unwrap_err();
    assert!(
        full.message()
            .contains("outboxes.orders.max_topic_filters = 4"),
        "{}",
        full.message()
    );
    // A filter's place is given back when the identity's last stream on it ends.
    drop(b);
    eventually("greedy's second filter given back", DEADLINE, || async {
        open("greedy", "e").await.ok()
    })
    .await;
    db.drop().await;
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

/// A row of the byte-budget test: a 20,000-byte payload weighs 20,070 bytes in
/// `max_bytes_in_flight` (payload, topic `t`, and 64 bytes of envelope).
const BIG_ROW: usize = 20_070;

/// Takes the next batch of any of `streams` (acking it when `ack`), answering `settled`
/// events on the way; returns (stream index, ids).
async fn next_batch(
    streams: &mut [(
        mpsc::Sender<v1::SubscribeRequest>,
        tonic::Streaming<v1::SubscribeResponse>,
    )],
) -> (usize, Vec<i64>) {
    loop {
        let polls = streams
            .iter_mut()
            .enumerate()
            .map(|(i, (_, rx))| Box::pin(async move { (i, rx.message().await) }));
        let ((i, message), _, _) = futures::future::select_all(polls).await;
        let response = message.expect("stream ok").expect("stream open");
        if let Some(v1::subscribe_response::Response::Batch(batch)) = response.response {
            return (i, batch.messages.iter().map(|m| m.id).collect());
        }
    }
}

#[tokio::test]
async fn bytes_in_flight_hold_an_identitys_streams_back_until_answers_free_them() {
    let db = TestDb::new().await;
    // Two responses of 64 KiB: six rows of 20,070 bytes, about two batches of three.
    let budget = 2 * 65_536;
    let extra = [
        token_identity("bulky", "bulky", r#"{ orders = ["subscribe"] }"#),
        format!("limits = {{ max_bytes_in_flight = {budget} }}\n"),
        token_identity("other", "other", r#"{ orders = ["subscribe"] }"#),
    ]
    .concat();
    let text = config(&db, &extra).replace("[server]\n", "[server]\nmax_message_bytes = 65536\n");

    let too_small = text.replace(
        &format!("max_bytes_in_flight = {budget}"),
        "max_bytes_in_flight = 1000",
    );
    let output = run_to_exit(&too_small, &["check-config"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains("server.auth.identities.bulky.limits.max_bytes_in_flight = 1000: must be at least server.max_message_bytes (65536)"),
        "{stderr}"
    );

    let server = Server::start(&text).await;
    server.wait_serving("orders").await;
    let channel = server.channel().await;
    let mut streams = Vec::new();
    for _ in 0..3 {
        streams.push(open_stream(channel.clone(), "bulky", 100).await.unwrap());
    }
    let rows: Vec<(Option<String>, Vec<u8>)> = (0..30).map(|_| (None, vec![7; 20_000])).collect();
    let ids = db.insert_many("t", &rows).await;

    // No answers: the streams stop at the budget, open, holding six rows.
    let fits = budget / BIG_ROW;
    let mut delivered: Vec<i64> = Vec::new();
    let mut by_stream = [Vec::new(), Vec::new(), Vec::new()];
    while delivered.len() < fits {
        let (i, batch) = tokio::time::timeout(DEADLINE, next_batch(&mut streams))
            .await
            .expect("batches up to the budget");
        delivered.extend(&batch);
        by_stream[i].extend(batch);
        assert!(
            delivered.len() <= fits,
            "past the budget: {}",
            delivered.len()
        );
    }
    // The budget is taken: a unary claim of the identity gets RESOURCE_EXHAUSTED.
    let request = v1::ClaimRequest {
        outbox: "orders".into(),
        worker_id: "bulky-unary".into(),
        batch_size: 10,
        lease_ms: 0,
        topics: vec![],
    };
    let refused = match RelayClient::new(channel.clone())
        .claim(with_token(request, Some("bulky")))
        .await
    {
        Ok(served) => panic!(
            "a unary claim past the budget was served {} rows",
            served.into_inner().messages.len()
        ),
        Err(status) => status,
    };
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert!(
        refused.message().contains("max_bytes_in_flight = 131072"),
        "{}",
        refused.message()
    );

    // Another identity is not held back by it.
    let (_other_tx, mut other_rx) = open_stream(channel.clone(), "other", 2).await.unwrap();
    let other = loop {
        let response = tokio::time::timeout(DEADLINE, other_rx.message())
            .await
            .expect("a batch for the other identity")
            .unwrap()
            .unwrap();
        if let Some(v1::subscribe_response::Response::Batch(batch)) = response.response {
            break batch.messages.iter().map(|m| m.id).collect::<Vec<_>>();
        }
    };
    assert!(!other.is_empty());
    // Its stream ends unanswered: those rows go back, to be delivered below.
    drop((_other_tx, other_rx));

    // Answering frees bytes: every stream goes on until every row is delivered once.
    for (i, held) in by_stream.iter().enumerate() {
        if !held.is_empty() {
            ack(&streams[i].0, held.clone()).await;
        }
    }
    while delivered.len() < ids.len() {
        let (i, batch) = tokio::time::timeout(DEADLINE, next_batch(&mut streams))
            .await
            .expect("the streams go on as they answer");
        delivered.extend(&batch);
        by_stream[i].extend(&batch);
        ack(&streams[i].0, batch).await;
    }
    delivered.sort_unstable();
    assert_eq!(delivered, ids, "every row once");
    for (i, rows) in by_stream.iter().enumerate() {
        assert!(!rows.is_empty(), "stream {i} delivered nothing");
    }
    db.drop().await;
}

async fn ack(tx: &mpsc::Sender<v1::SubscribeRequest>, ids: Vec<i64>) {
    tx.send(v1::SubscribeRequest {
        request: Some(Req::Ack(v1::AckMessages {
            ids,
            lease_tokens: Vec::new(),
        })),
    })
    .await
    .unwrap();
}
