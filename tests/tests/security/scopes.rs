//! Every RPC of the protocol refused without a credential and outside its scope, the
//! refusal naming the scope; `ListOutboxes` shows each identity only its outboxes.

use super::*;

/// Every RPC of the relay and admin services on `outbox` with `token`, by name.
async fn every_rpc(
    channel: Channel,
    outbox: &str,
    token: Option<&str>,
) -> Vec<(&'static str, Code, String)> {
    let mut relay = RelayClient::new(channel.clone());
    let mut admin = AdminClient::new(channel);
    let o = || outbox.to_owned();
    let w = || "w".to_owned();
    let mut results = Vec::new();
    let (tx, rx) = mpsc::channel(1);
    tx.send(v1::SubscribeRequest {
        request: Some(Req::Open(v1::OpenSubscription {
            group: String::new(),
            outbox: o(),
            subscriber: "s".into(),
            topics: vec![],
            max_in_flight: 10,
            lease_ms: 0,
        })),
    })
    .await
    .unwrap();
    let (c, m) = code(
        relay
            .subscribe(with_token(ReceiverStream::new(rx), token))
            .await,
    );
    results.push(("Subscribe", c, m));
    drop(tx);
    macro_rules! call {
        ($name:literal, $client:ident . $method:ident, $message:expr) => {{
            let (c, m) = code($client.$method(with_token($message, token)).await);
            results.push(($name, c, m));
        }};
    }
    call!(
        "Claim",
        relay.claim,
        v1::ClaimRequest {
            outbox: o(),
            worker_id: w(),
            batch_size: 1,
            lease_ms: 0,
            topics: vec![]
        }
    );
    call!(
        "Ack",
        relay.ack,
        v1::AckRequest {
            outbox: o(),
            worker_id: w(),
            ids: vec![1],
            lease_tokens: Default::default(),
        }
    );
    call!(
        "Nack",
        relay.nack,
        v1::NackRequest {
            outbox: o(),
            worker_id: w(),
            id: 1,
            error: "e".into(),
            retry_delay_ms: None,
            lease_token: Default::default(),
        }
    );
    call!(
        "Release",
        relay.release,
        v1::ReleaseRequest {
            outbox: o(),
            worker_id: w(),
            ids: vec![1],
            retry_delay_ms: None,
            lease_tokens: Default::default(),
        }
    );
    call!(
        "DeadLetter",
        relay.dead_letter,
        v1::DeadLetterRequest {
            outbox: o(),
            worker_id: w(),
            id: 1,
            error: "e".into(),
            lease_token: Default::default(),
        }
    );
    call!(
        "ExtendLease",
        relay.extend_lease,
        v1::ExtendLeaseRequest {
            outbox: o(),
            worker_id: w(),
            ids: vec![1],
            lease_ms: 1000,
            lease_tokens: Default::default(),
        }
    );
    call!(
        "ListOutboxes",
        admin.list_outboxes,
        v1::ListOutboxesRequest {}
    );
    call!("Stats", admin.stats, v1::StatsRequest { outbox: o() });
    call!(
        "Purge",
        admin.purge,
        v1::PurgeRequest {
            outbox: o(),
            older_than: Some(prost_types::Duration {
                seconds: 86_400,
                nanos: 0
            })
        }
    );
    call!("Schema", admin.schema, v1::SchemaRequest { outbox: o() });
    call!(
        "SeekGroup",
        admin.seek_group,
        v1::SeekGroupRequest {
            outbox: o(),
            group: "g".into(),
            to: Some(v1::seek_group_request::To::ToNow(true)),
            dry_run: true
        }
    );
    call!(
        "InsertMessage",
        admin.insert_message,
        v1::InsertMessageRequest {
            outbox: o(),
            topic: "t".into(),
            key: None,
            payload: b"p".to_vec(),
            headers: Default::default()
        }
    );
    call!(
        "ListDeadLetters",
        admin.list_dead_letters,
        v1::ListDeadLettersRequest {
            group: String::new(),
            outbox: o(),
            selector: None,
            after_id: 0,
            limit: 0
        }
    );
    call!(
        "CountDeadLetters",
        admin.count_dead_letters,
        v1::CountDeadLettersRequest {
            outbox: o(),
            selector: None
        }
    );
    call!(
        "RedriveDeadLetters",
        admin.redrive_dead_letters,
        v1::RedriveDeadLettersRequest {
            group: String::new(),
            outbox: o(),
            selector: None,
            limit: 0,
            delay: None,
            dry_run: true
        }
    );
    call!(
        "DiscardDeadLetters",
        admin.discard_dead_letters,
        v1::DiscardDeadLettersRequest {
            group: String::new(),
            outbox: o(),
            selector: None,
            limit: 0,
            dry_run: true
        }
    );
    // Resume right after, so a caller allowed to pause leaves the outbox running.
    call!(
        "Pause",
        admin.pause,
        v1::PauseRequest {
            outbox: o(),
            topics: vec![],
            ..Default::default()
        }
    );
    call!(
        "Resume",
        admin.resume,
        v1::ResumeRequest {
            outbox: o(),
            topics: vec![],
            ..Default::default()
        }
    );
    call!(
        "ListSubscribers",
        admin.list_subscribers,
        v1::ListSubscribersRequest { outbox: o() }
    );
    call!(
        "ListBlockedKeys",
        admin.list_blocked_keys,
        v1::ListBlockedKeysRequest {
            outbox: o(),
            after_id: 0,
            limit: 0,
            ..Default::default()
        }
    );
    // These outboxes have no groups: a SeekGroup that passed its scope check is refused
    // after it, for that reason, which counts as allowed here.
    for (rpc, code, message) in &mut results {
        if *rpc == "SeekGroup"
            && *code == Code::FailedPrecondition
            && message.contains("has no subscription groups")
        {
            *code = Code::Ok;
        }
    }
    let called: BTreeSet<&str> = results.iter().map(|(rpc, _, _)| *rpc).collect();
    assert_eq!(
        called,
        protocol_rpcs().iter().map(String::as_str).collect(),
        "every_rpc must call every RPC of the protocol: add the new ones"
    );
    results
}

/// The methods of the Relay and Admin services, read from the protocol's descriptor: an
/// RPC added to the .proto files and not to `every_rpc` fails every test that uses it.
fn protocol_rpcs() -> Vec<String> {
    let set = prost_types::FileDescriptorSet::decode(txoutbox_proto::FILE_DESCRIPTOR_SET)
        .expect("the protocol's descriptor");
    let rpcs: Vec<String> = set
        .file
        .iter()
        .flat_map(|file| &file.service)
        .filter(|service| matches!(service.name(), "Relay" | "Admin"))
        .flat_map(|service| &service.method)
        .map(|method| method.name().to_owned())
        .collect();
    assert!(rpcs.len() >= 19, "{rpcs:?}");
    rpcs
}

/// The scope an RPC needs; `None` for `ListOutboxes`, which any identity may call.
fn scope_of(rpc: &str) -> Option<&'static str> {
    match rpc {
        "ListOutboxes" => None,
        "InsertMessage" => Some("insert"),
        _ if RELAY_RPCS.contains(&rpc) => Some("subscribe"),
        _ if READ_RPCS.contains(&rpc) => Some("read"),
        _ => Some("admin"),
    }
}

/// The admin calls that change nothing: `read` allows them, and so does `admin`.
const READ_RPCS: [&str; 6] = [
    "Stats",
    "Schema",
    "ListDeadLetters",
    "CountDeadLetters",
    "ListBlockedKeys",
    "ListSubscribers",
];

/// Asserts `rpc` was refused for want of its scope, and that the refusal names it.
fn assert_out_of_scope(rpc: &str, code: Code, message: &str, context: &str) {
    let scope = scope_of(rpc).expect("an RPC that needs a scope");
    assert_eq!(code, Code::PermissionDenied, "{rpc} {context}: {message}");
    assert!(
        message.contains(&format!("scope `{scope}`")),
        "{rpc} {context}: {message}"
    );
}

const RELAY_RPCS: [&str; 7] = [
    "Subscribe",
    "Claim",
    "Ack",
    "Nack",
    "Release",
    "DeadLetter",
    "ExtendLease",
];

fn denied(code: Code) -> bool {
    matches!(code, Code::Unauthenticated | Code::PermissionDenied)
}

#[tokio::test]
async fn every_rpc_needs_a_credential_and_its_scope() {
    let db = TestDb::new().await;
    let server = Server::start(&config(&db, &identities())).await;
    // Health stays public for probes (server.auth.public_health, on by default).
    server.wait_serving("orders").await;
    let channel = server.channel().await;

    for token in [None, Some("not-a-token")] {
        for (rpc, code, message) in every_rpc(channel.clone(), "orders", token).await {
            assert_eq!(
                code,
                Code::Unauthenticated,
                "{rpc} with {token:?}: {message}"
            );
        }
    }

    // A subscriber of `orders`: the relay calls there, nothing else.
    for (rpc, code, message) in every_rpc(channel.clone(), "orders", Some(SUBSCRIBER_TOKEN)).await {
        match scope_of(rpc) {
            None => assert_eq!(code, Code::Ok, "{message}"),
            Some("subscribe") => assert!(!denied(code), "{rpc}: {code:?} {message}"),
            Some(_) => assert_out_of_scope(rpc, code, &message, "by a subscriber"),
        }
    }
    for (rpc, code, message) in every_rpc(channel.clone(), "payments", Some(SUBSCRIBER_TOKEN)).await
    {
        if rpc != "ListOutboxes" {
            assert_out_of_scope(rpc, code, &message, "on another outbox");
        }
    }
    // What it may not see does not leak: not in the list, and an outbox that does not
    // exist is refused the same way as one that does.
    assert_eq!(listed(&channel, SUBSCRIBER_TOKEN).await, ["orders"]);
    let unknown = every_rpc(channel.clone(), "no-such-outbox", Some(SUBSCRIBER_TOKEN)).await;
    let (_, code, message) = &unknown[1];
    assert_eq!(*code, Code::PermissionDenied, "{message}");
    assert!(!message.contains("payments"), "{message}");

    // An inserter: InsertMessage on `orders` only.
    for (rpc, code, message) in every_rpc(channel.clone(), "orders", Some(INSERTER_TOKEN)).await {
        match rpc {
            "InsertMessage" | "ListOutboxes" => assert_eq!(code, Code::Ok, "{rpc}: {message}"),
            _ => assert_out_of_scope(rpc, code, &message, "by an inserter"),
        }
    }
    // An operator: every admin call (the reading ones included) on every outbox, and no
    // relay call.
    for outbox in ["orders", "payments"] {
        for (rpc, code, message) in every_rpc(channel.clone(), outbox, Some(OPERATOR_TOKEN)).await {
            match scope_of(rpc) {
                None | Some("admin" | "read") => {
                    assert_eq!(code, Code::Ok, "{rpc} on {outbox}: {message}")
                }
                Some(_) => assert_out_of_scope(rpc, code, &message, &format!("on {outbox}")),
            }
        }
    }
    // `insert` and `admin` on `orders`: everything but the relay there, and nothing on
    // `payments`, where every admin call passes the layer (the identity holds `admin`
    // somewhere) and is refused by the handler's check of the named outbox.
    for (rpc, code, message) in every_rpc(channel.clone(), "orders", Some(ORDERS_ADMIN_TOKEN)).await
    {
        match scope_of(rpc) {
            Some("subscribe") => assert_out_of_scope(rpc, code, &message, "on orders"),
            _ => assert_eq!(code, Code::Ok, "{rpc} on orders: {message}"),
        }
    }
    for (rpc, code, message) in
        every_rpc(channel.clone(), "payments", Some(ORDERS_ADMIN_TOKEN)).await
    {
        if rpc == "ListOutboxes" {
            continue;
        }
        assert_out_of_scope(rpc, code, &message, "on payments");
        if scope_of(rpc) != Some("subscribe") {
            assert!(
                message.contains("on outbox `payments`"),
                "{rpc} refused by the layer, not by the handler's check: {message}"
            );
        }
    }
    assert_eq!(listed(&channel, ORDERS_ADMIN_TOKEN).await, ["orders"]);

    // A watcher with `read` on `orders`: the observing calls there and nothing that
    // changes anything; the refusals of a reading call elsewhere say `admin` would do too.
    for (rpc, code, message) in every_rpc(channel.clone(), "orders", Some(READER_TOKEN)).await {
        match scope_of(rpc) {
            None | Some("read") => assert_eq!(code, Code::Ok, "{rpc} by a watcher: {message}"),
            Some(_) => assert_out_of_scope(rpc, code, &message, "by a watcher"),
        }
    }
    for (rpc, code, message) in every_rpc(channel.clone(), "payments", Some(READER_TOKEN)).await {
        if rpc == "ListOutboxes" {
            continue;
        }
        assert_out_of_scope(rpc, code, &message, "by a watcher on payments");
        if scope_of(rpc) == Some("read") {
            assert!(
                message.contains("(or `admin`, which includes it)"),
                "{rpc}: {message}"
            );
        }
    }
    assert_eq!(listed(&channel, READER_TOKEN).await, ["orders"]);
    db.drop().await;
}
