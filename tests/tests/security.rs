//! Security against a real `txoutboxd` (issue 12): every RPC refused without a credential
//! and outside its scope, TLS and mutual TLS with certificates made at test time (an
//! untrusted and an expired one refused), a rotated certificate picked up without a
//! restart, limits per identity, audit events, and the refusal to serve other machines
//! without TLS and credentials.

use std::collections::BTreeSet;
use std::path::Path;

use prost::Message as _;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;
use tonic::{Code, Request, Status};
use txoutbox_client::{Connection, Credentials, Message, PublishError, Subscriber};
use txoutbox_proto::v1::admin_client::AdminClient;
use txoutbox_proto::v1::relay_client::RelayClient;
use txoutbox_proto::v1::subscribe_request::Request as Req;
use txoutbox_proto::v1::{self};
use txoutbox_tests::pki::{token_identity, Ca, TlsFiles};
use txoutbox_tests::server::run_to_exit;
use txoutbox_tests::{eventually, Server, TestDb, DEADLINE};

const SUBSCRIBER_TOKEN: &str = "sub-3f9a1c";
const INSERTER_TOKEN: &str = "ins-77b2e0";
const OPERATOR_TOKEN: &str = "ops-c41d9a";
const ORDERS_ADMIN_TOKEN: &str = "orders-ops-5e0b27";

/// Two outboxes, `orders` and `payments`, and `server_extra` appended (TOML tables).
fn config(db: &TestDb, server_extra: &str) -> String {
    format!(
        r#"{base}
[outboxes.payments]
database = "main"
schema = "{schema}"
table = "payments"
create_schema = true

{server_extra}
"#,
        base = db.config(""),
        schema = db.schema,
    )
}

/// Four identities by token: a subscriber of `orders`, an inserter into `orders`, an
/// operator with `admin` on every outbox, and one with `insert` and `admin` on `orders`.
fn identities() -> String {
    [
        token_identity(
            "orders-relay",
            SUBSCRIBER_TOKEN,
            r#"{ orders = ["subscribe"] }"#,
        ),
        token_identity("checkout", INSERTER_TOKEN, r#"{ orders = ["insert"] }"#),
        token_identity("ops", OPERATOR_TOKEN, r#"{ "*" = ["admin"] }"#),
        token_identity(
            "orders-ops",
            ORDERS_ADMIN_TOKEN,
            r#"{ orders = ["insert", "admin"] }"#,
        ),
    ]
    .concat()
}

fn with_token<T>(message: T, token: Option<&str>) -> Request<T> {
    let mut request = Request::new(message);
    if let Some(token) = token {
        let value: MetadataValue<_> = format!("Bearer {token}").parse().unwrap();
        request.metadata_mut().insert("authorization", value);
    }
    request
}

fn code<T>(result: Result<T, Status>) -> (Code, String) {
    match result {
        Ok(_) => (Code::Ok, String::new()),
        Err(status) => (status.code(), status.message().to_owned()),
    }
}

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
            ids: vec![1]
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
            retry_delay_ms: None
        }
    );
    call!(
        "Release",
        relay.release,
        v1::ReleaseRequest {
            outbox: o(),
            worker_id: w(),
            ids: vec![1],
            retry_delay_ms: None
        }
    );
    call!(
        "DeadLetter",
        relay.dead_letter,
        v1::DeadLetterRequest {
            outbox: o(),
            worker_id: w(),
            id: 1,
            error: "e".into()
        }
    );
    call!(
        "ExtendLease",
        relay.extend_lease,
        v1::ExtendLeaseRequest {
            outbox: o(),
            worker_id: w(),
            ids: vec![1],
            lease_ms: 1000
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
            topics: vec![]
        }
    );
    call!(
        "Resume",
        admin.resume,
        v1::ResumeRequest {
            outbox: o(),
            topics: vec![]
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
            limit: 0
        }
    );
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
        _ => Some("admin"),
    }
}

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

/// The outboxes `ListOutboxes` shows to the holder of `token`.
async fn listed(channel: &Channel, token: &str) -> Vec<String> {
    AdminClient::new(channel.clone())
        .list_outboxes(with_token(v1::ListOutboxesRequest {}, Some(token)))
        .await
        .unwrap()
        .into_inner()
        .outboxes
        .into_iter()
        .map(|o| o.name)
        .collect()
}

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
    // An operator: every admin call on every outbox, and no relay call.
    for outbox in ["orders", "payments"] {
        for (rpc, code, message) in every_rpc(channel.clone(), outbox, Some(OPERATOR_TOKEN)).await {
            match scope_of(rpc) {
                None | Some("admin") => {
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
    db.drop().await;
}

#[tokio::test]
async fn admin_actions_are_audited_with_the_identity() {
    let db = TestDb::new().await;
    let extra = identities()
        + &token_identity(
            "ops-insert",
            "ops-insert-token",
            r#"{ orders = ["insert", "admin"] }"#,
        );
    let server = Server::start(&config(&db, &extra)).await;
    server.wait_serving("orders").await;
    let mut admin = server.admin().await;
    let token = Some("ops-insert-token");
    admin
        .insert_message(with_token(
            v1::InsertMessageRequest {
                outbox: "orders".into(),
                topic: "audit.t".into(),
                key: Some("k-1".into()),
                payload: b"{}".to_vec(),
                headers: Default::default(),
            },
            token,
        ))
        .await
        .unwrap();
    admin
        .purge(with_token(
            v1::PurgeRequest {
                outbox: "orders".into(),
                older_than: Some(prost_types::Duration {
                    seconds: 3600,
                    nanos: 0,
                }),
            },
            token,
        ))
        .await
        .unwrap();
    admin
        .schema(with_token(
            v1::SchemaRequest {
                outbox: "orders".into(),
            },
            token,
        ))
        .await
        .unwrap();
    admin
        .redrive_dead_letters(with_token(
            v1::RedriveDeadLettersRequest {
                outbox: "orders".into(),
                selector: None,
                limit: 5,
                delay: None,
                dry_run: false,
            },
            token,
        ))
        .await
        .unwrap();
    admin
        .discard_dead_letters(with_token(
            v1::DiscardDeadLettersRequest {
                outbox: "orders".into(),
                selector: None,
                limit: 7,
                dry_run: true,
            },
            token,
        ))
        .await
        .unwrap();
    for pause in [true, false] {
        let outbox = "orders".to_owned();
        let result = if pause {
            admin
                .pause(with_token(
                    v1::PauseRequest {
                        outbox,
                        topics: vec![],
                    },
                    token,
                ))
                .await
        } else {
            admin
                .resume(with_token(
                    v1::ResumeRequest {
                        outbox,
                        topics: vec![],
                    },
                    token,
                ))
                .await
        };
        result.unwrap();
    }
    // Refused in the handler (no scope on `payments`): audited as refused.
    let refused = admin
        .purge(with_token(
            v1::PurgeRequest {
                outbox: "payments".into(),
                older_than: None,
            },
            token,
        ))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied);

    let audit_lines = || -> Vec<serde_json::Value> {
        server
            .log
            .lock()
            .unwrap()
            .iter()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .filter(|line| line["target"] == "txoutbox::audit")
            .collect()
    };
    // Refused before any handler: a subscriber's token has no `admin` scope anywhere (the
    // identity is known, and named), and a call without a credential (no one to name).
    let refused = admin
        .pause(with_token(
            v1::PauseRequest {
                outbox: "orders".into(),
                topics: vec![],
            },
            Some(SUBSCRIBER_TOKEN),
        ))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied);
    let refused = admin
        .purge(with_token(
            v1::PurgeRequest {
                outbox: "orders".into(),
                older_than: None,
            },
            None,
        ))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated);

    let lines = eventually("ten audit events", DEADLINE, || async {
        let lines = audit_lines();
        (lines.len() >= 10).then_some(lines)
    })
    .await;
    let field = |line: &serde_json::Value, name: &str| {
        line["fields"][name].as_str().unwrap_or_default().to_owned()
    };
    let summary: Vec<(String, String, String, String)> = lines
        .iter()
        .map(|l| {
            (
                field(l, "action"),
                field(l, "identity"),
                field(l, "outbox"),
                field(l, "outcome"),
            )
        })
        .collect();
    let expect = |action: &str, outbox: &str, outcome: &str| {
        assert!(
            summary.contains(&(
                action.into(),
                "ops-insert".into(),
                format!("`{outbox}`"),
                outcome.into()
            )),
            "{action} on {outbox} ({outcome}) not in {summary:?}"
        )
    };
    expect("insert", "orders", "ok");
    expect("purge", "orders", "ok");
    expect("schema", "orders", "ok");
    expect("redrive", "orders", "ok");
    expect("discard", "orders", "ok");
    expect("pause", "orders", "ok");
    expect("resume", "orders", "ok");
    expect("purge", "payments", "refused");
    let refused_by_layer = |action: &str, identity: &str| {
        assert!(
            summary.contains(&(action.into(), identity.into(), "?".into(), "refused".into())),
            "{action} by {identity} refused by the layer is not in {summary:?}"
        )
    };
    refused_by_layer("pause", "orders-relay");
    refused_by_layer("purge", "?");
    let insert = lines
        .iter()
        .find(|l| field(l, "action") == "insert")
        .unwrap();
    assert!(
        field(insert, "arguments").contains("topic=`audit.t`"),
        "{insert}"
    );
    let purge = lines
        .iter()
        .find(|l| field(l, "action") == "purge")
        .unwrap();
    assert_eq!(field(purge, "arguments"), "older_than=3600s");
    let arguments = |action: &str| {
        let line = lines.iter().find(|l| field(l, "action") == action).unwrap();
        field(line, "arguments")
    };
    assert!(
        arguments("redrive").starts_with("limit=5 dry_run=false"),
        "{}",
        arguments("redrive")
    );
    assert!(
        arguments("discard").starts_with("limit=7 dry_run=true"),
        "{}",
        arguments("discard")
    );
    db.drop().await;
}

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

/// Issue 10, case 5: the outbox's `max_topic_filters` slots were first come, first
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

#[tokio::test]
async fn other_machines_are_served_only_with_tls_and_credentials_or_when_told_to() {
    let db = TestDb::new().await;
    let open = db
        .config("")
        .replace("listen = \"127.0.0.1:0\"", "listen = \"0.0.0.0:0\"");
    let output = run_to_exit(&open, &["check-config"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("neither TLS nor credentials"), "{stderr}");
    assert!(stderr.contains("server.allow_insecure = true"), "{stderr}");

    let allowed = open.replace("[server]", "[server]\nallow_insecure = true");
    let output = run_to_exit(&allowed, &["check-config"]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    db.drop().await;
}

/// A TLS server's configuration: `files`, the token identities, and under mutual TLS the
/// identity `orders-relay` also by the certificate name `orders-relay.example`.
fn tls_config(db: &TestDb, files: &TlsFiles, mutual: bool) -> String {
    let mut identities = identities();
    if mutual {
        identities = identities.replace(
            "grants = { orders = [\"subscribe\"] }",
            "certificate_names = [\"orders-relay.example\"]\ngrants = { orders = [\"subscribe\"] }",
        );
    }
    config(db, &format!("{}\n{identities}", files.config(mutual)))
}

/// Lists the outboxes over `https://` with these credentials: the names, or why not
/// (a refused handshake shows as a connection or call error).
async fn list_over_tls(server: &Server, credentials: Credentials) -> Result<Vec<String>, String> {
    let url = format!("https://{}", server.address);
    let connection: Connection = txoutbox_client::connect_with([url], credentials)
        .await
        .map_err(|e| e.to_string())?;
    let listed = AdminClient::new(connection)
        .list_outboxes(v1::ListOutboxesRequest {})
        .await
        .map_err(|status| format!("{:?}: {}", status.code(), status.message()))?;
    Ok(listed
        .into_inner()
        .outboxes
        .into_iter()
        .map(|o| o.name)
        .collect())
}

fn trusting(ca: &Path) -> Credentials {
    Credentials::from_files(Some(ca), None, None).unwrap()
}

#[tokio::test]
async fn tls_serves_only_tls_and_a_rotated_certificate_needs_no_restart() {
    let db = TestDb::new().await;
    let setup = TlsFiles::new();
    let server = Server::start(&tls_config(&db, &setup, false)).await;
    let ca = setup.dir.path().join("ca.pem");

    let listed = list_over_tls(&server, trusting(&ca).bearer_token(OPERATOR_TOKEN).unwrap())
        .await
        .unwrap();
    assert_eq!(listed, ["orders", "payments"]);
    // The token still decides what the caller may do.
    let refused = list_over_tls(&server, trusting(&ca)).await.unwrap_err();
    assert!(refused.contains("Unauthenticated"), "{refused}");
    // Plain HTTP/2 gets no answer from a TLS port.
    let plain = AdminClient::new(server.channel().await)
        .list_outboxes(with_token(v1::ListOutboxesRequest {}, Some(OPERATOR_TOKEN)))
        .await;
    assert!(plain.is_err(), "plain HTTP/2 was answered: {plain:?}");
    // A server certificate from a CA the client does not trust is refused by the client.
    let other = Ca::new("another CA");
    let other_ca = other.write(setup.dir.path(), "other-ca");
    let untrusted = list_over_tls(
        &server,
        trusting(&other_ca).bearer_token(OPERATOR_TOKEN).unwrap(),
    )
    .await;
    assert!(untrusted.is_err(), "{untrusted:?}");

    // Rotation: the files are replaced by a certificate of the other CA; the running
    // server picks it up (same process), and the clients trusting the other CA get in.
    let pid = server.pid();
    let rotated = other.server(setup.dir.path(), "rotated");
    std::fs::copy(&rotated.key, setup.path("server.key")).unwrap();
    std::fs::copy(&rotated.cert, setup.path("server.pem")).unwrap();
    let listed = eventually("the rotated certificate in use", DEADLINE, || {
        let credentials = trusting(&other_ca).bearer_token(OPERATOR_TOKEN).unwrap();
        let server = &server;
        async move { list_over_tls(server, credentials).await.ok() }
    })
    .await;
    assert_eq!(listed, ["orders", "payments"]);
    assert_eq!(server.pid(), pid, "no restart");
    assert!(server.log_contains("TLS certificates reloaded"));
    let old = list_over_tls(&server, trusting(&ca).bearer_token(OPERATOR_TOKEN).unwrap()).await;
    assert!(old.is_err(), "the old certificate is still served: {old:?}");
    db.drop().await;
}

#[tokio::test]
async fn mutual_tls_names_the_identity_and_refuses_bad_client_certificates() {
    let db = TestDb::new().await;
    let setup = TlsFiles::new();
    let server = Server::start(&tls_config(&db, &setup, true)).await;
    let dir = setup.dir.path();
    let ca = dir.join("ca.pem");
    let client = |pair: &txoutbox_tests::pki::Pair| {
        Credentials::from_files(Some(&ca), Some(&pair.cert), Some(&pair.key)).unwrap()
    };

    // The certificate names the identity: `orders-relay` sees `orders` only.
    let relay_cert = setup.ca.client(dir, "relay", "orders-relay.example");
    assert_eq!(
        list_over_tls(&server, client(&relay_cert)).await.unwrap(),
        ["orders"]
    );
    // A valid certificate of no identity, without a token: unauthenticated.
    let stranger = setup.ca.client(dir, "stranger", "someone-else.example");
    let refused = list_over_tls(&server, client(&stranger)).await.unwrap_err();
    assert!(
        refused.contains("Unauthenticated") && refused.contains("someone-else.example"),
        "{refused}"
    );
    // ... which a token of an identity overrides.
    let with_token = client(&stranger).bearer_token(OPERATOR_TOKEN).unwrap();
    assert_eq!(
        list_over_tls(&server, with_token).await.unwrap(),
        ["orders", "payments"]
    );
    // Refused at the handshake: no certificate, an expired one, one of an untrusted CA.
    let none = list_over_tls(&server, trusting(&ca).bearer_token(OPERATOR_TOKEN).unwrap()).await;
    assert!(
        none.is_err(),
        "no client certificate was accepted: {none:?}"
    );
    let expired = setup
        .ca
        .expired_client(dir, "expired", "orders-relay.example");
    let refused = list_over_tls(&server, client(&expired)).await;
    assert!(
        refused.is_err(),
        "an expired certificate was accepted: {refused:?}"
    );
    let other = Ca::new("untrusted CA");
    let untrusted = other.client(dir, "untrusted", "orders-relay.example");
    let refused = list_over_tls(&server, client(&untrusted)).await;
    assert!(
        refused.is_err(),
        "a certificate of an untrusted CA was accepted: {refused:?}"
    );
    assert!(server.log_contains("TLS handshake failed"));
    db.drop().await;
}

#[tokio::test]
async fn sighup_reloads_the_certificates_at_once() {
    let db = TestDb::new().await;
    let files = TlsFiles::new();
    // Files are checked only hourly: the reload below is SIGHUP's doing.
    let config = tls_config(&db, &files, false)
        .replace("reload_interval = \"200ms\"", "reload_interval = \"1h\"");
    let server = Server::start(&config).await;
    let other = Ca::new("next CA");
    let other_ca = other.write(files.dir.path(), "next-ca");
    let rotated = other.server(files.dir.path(), "rotated");
    std::fs::copy(&rotated.key, files.path("server.key")).unwrap();
    std::fs::copy(&rotated.cert, files.path("server.pem")).unwrap();
    server.hangup();
    let listed = eventually("the certificate reloaded on SIGHUP", DEADLINE, || {
        let credentials = trusting(&other_ca).bearer_token(OPERATOR_TOKEN).unwrap();
        let server = &server;
        async move { list_over_tls(server, credentials).await.ok() }
    })
    .await;
    assert_eq!(listed, ["orders", "payments"]);
    assert!(server.log_contains("SIGHUP"));
    db.drop().await;
}

#[tokio::test]
async fn health_needs_a_credential_when_it_is_not_public() {
    let db = TestDb::new().await;
    let extra = format!("[server.auth]\npublic_health = false\n{}", identities());
    let server = Server::start(&config(&db, &extra)).await;
    let mut health = tonic_health::pb::health_client::HealthClient::new(server.channel().await);
    let check = |token| {
        with_token(
            tonic_health::pb::HealthCheckRequest {
                service: "orders".into(),
            },
            token,
        )
    };
    let refused = health.check(check(None)).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated);
    eventually("orders SERVING to an identity", DEADLINE, || {
        let mut health = health.clone();
        async move {
            let status = health
                .check(check(Some(SUBSCRIBER_TOKEN)))
                .await
                .ok()?
                .into_inner()
                .status();
            (status == tonic_health::pb::health_check_response::ServingStatus::Serving)
                .then_some(())
        }
    })
    .await;
    db.drop().await;
}

/// The Rust `Subscriber` streams over TLS, not only unary calls: once authenticated by a
/// bearer token (no client certificate, which `client_cert_optional` allows), once by its
/// client certificate alone; each delivers its rows and acks them.
#[tokio::test]
async fn rust_subscriber_streams_over_tls_with_a_token_or_a_client_certificate() {
    let db = TestDb::new().await;
    let setup = TlsFiles::new();
    let config = tls_config(&db, &setup, true)
        .replace("client_ca = ", "client_cert_optional = true\nclient_ca = ");
    let server = Server::start(&config).await;
    // Health over plain HTTP/2 gets no answer from a TLS port: wait for the table itself.
    eventually("the outbox table created", DEADLINE, || async {
        db.table_exists().await.then_some(())
    })
    .await;
    let dir = setup.dir.path();
    let ca = dir.join("ca.pem");
    let relay_cert = setup.ca.client(dir, "relay", "orders-relay.example");
    let by_token = trusting(&ca).bearer_token(SUBSCRIBER_TOKEN).unwrap();
    let by_certificate =
        Credentials::from_files(Some(&ca), Some(&relay_cert.cert), Some(&relay_cert.key)).unwrap();

    let mut done = 0;
    for (how, credentials) in [("token", by_token), ("certificate", by_certificate)] {
        let rows: Vec<_> = (0..3)
            .map(|i| {
                (
                    Some(format!("{how}-{i}")),
                    format!("{how} {i}").into_bytes(),
                )
            })
            .collect();
        let mut expected = db.insert_many("tls.t", &rows).await;
        let (tx, mut published) = mpsc::unbounded_channel();
        let subscriber = Subscriber::builder([format!("https://{}", server.address)], "orders")
            .name(format!("tls-{how}"))
            .credentials(credentials)
            .build(move |message: Message| {
                let tx = tx.clone();
                async move {
                    let _ = tx.send(message.id);
                    Ok::<_, PublishError>(())
                }
            })
            .unwrap();
        let handle = subscriber.spawn();
        let mut seen = Vec::new();
        while seen.len() < expected.len() {
            let id = tokio::time::timeout(DEADLINE, published.recv())
                .await
                .unwrap_or_else(|_| panic!("over TLS by {how}: published only {seen:?}"))
                .unwrap();
            seen.push(id);
        }
        seen.sort();
        expected.sort();
        assert_eq!(seen, expected, "by {how}");
        done += expected.len() as i64;
        eventually(
            &format!("the rows acked over TLS by {how}"),
            DEADLINE,
            || async { (db.count("done").await == done).then_some(()) },
        )
        .await;
        handle.stop().await.unwrap();
    }
    assert!(server.log_contains("subscription opened"));
    db.drop().await;
}
