//! Audit events of admin actions, with the identity that did them.

use super::*;

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
                group: String::new(),
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
                group: String::new(),
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
                        ..Default::default()
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
                        ..Default::default()
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
                ..Default::default()
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

/// A `read` holder may list dead letters, payloads included, and each page it reads is
/// an audit event naming it, with the selector and how many rows and bytes went out; a
/// subscriber trying the same is refused and audited too.
#[tokio::test]
async fn dead_letter_reads_are_audited() {
    let db = TestDb::new().await;
    let server = Server::start(&config(&db, &identities())).await;
    server.wait_serving("orders").await;
    let channel = server.channel().await;
    let mut admin = AdminClient::new(channel.clone());
    let mut relay = RelayClient::new(channel);
    admin
        .insert_message(with_token(
            v1::InsertMessageRequest {
                outbox: "orders".into(),
                topic: "audit.dead".into(),
                key: None,
                payload: b"card=4111".to_vec(),
                headers: Default::default(),
            },
            Some(INSERTER_TOKEN),
        ))
        .await
        .unwrap();
    let claimed = relay
        .claim(with_token(
            v1::ClaimRequest {
                outbox: "orders".into(),
                worker_id: "w".into(),
                batch_size: 1,
                lease_ms: 0,
                topics: vec![],
            },
            Some(SUBSCRIBER_TOKEN),
        ))
        .await
        .unwrap()
        .into_inner();
    let id = claimed.messages[0].id;
    let dead = v1::DeadLetterRequest {
        outbox: "orders".into(),
        worker_id: "w".into(),
        id,
        error: "poison".into(),
        lease_token: Default::default(),
    };
    relay
        .dead_letter(with_token(dead, Some(SUBSCRIBER_TOKEN)))
        .await
        .unwrap();

    let page = admin
        .list_dead_letters(with_token(
            v1::ListDeadLettersRequest {
                group: String::new(),
                outbox: "orders".into(),
                selector: Some(v1::DeadLetterSelector {
                    topic: Some("audit.dead".into()),
                    ..Default::default()
                }),
                after_id: 0,
                limit: 10,
            },
            Some(READER_TOKEN),
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(page.dead_letters.len(), 1);
    assert_eq!(page.dead_letters[0].payload, b"card=4111");
    let refused = admin
        .list_dead_letters(with_token(
            v1::ListDeadLettersRequest {
                outbox: "orders".into(),
                ..Default::default()
            },
            Some(SUBSCRIBER_TOKEN),
        ))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied);
    assert!(refused.message().contains("scope `read`"), "{refused:?}");

    let field = |line: &serde_json::Value, name: &str| {
        line["fields"][name].as_str().unwrap_or_default().to_owned()
    };
    let reads = eventually("two dead-letter read events", DEADLINE, || async {
        let reads: Vec<serde_json::Value> = server
            .log
            .lock()
            .unwrap()
            .iter()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .filter(|line| line["target"] == "txoutbox::audit")
            .filter(|line| line["fields"]["action"] == "read_dead_letters")
            .collect();
        (reads.len() >= 2).then_some(reads)
    })
    .await;
    let by = |identity: &str| {
        reads
            .iter()
            .find(|l| field(l, "identity") == identity)
            .unwrap_or_else(|| panic!("no read by {identity} in {reads:?}"))
    };
    let read = by("watcher");
    assert_eq!(field(read, "outcome"), "ok", "{read}");
    assert_eq!(field(read, "outbox"), "`orders`", "{read}");
    let arguments = field(read, "arguments");
    for part in [
        "limit=10",
        "topic=`audit.dead`",
        "rows=1",
        "payload_bytes=9",
    ] {
        assert!(arguments.contains(part), "{part} not in {arguments}");
    }
    assert_eq!(field(by("orders-relay"), "outcome"), "refused");
    db.drop().await;
}
