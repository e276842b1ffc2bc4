//! Refused calls are logged at warn with the peer address and the identity, at most ten a
//! minute per peer address; audit events carry the peer address and survive a `RUST_LOG`
//! that filters `info` out; one credential on two identities stops the server at start.

use super::*;

/// The server's JSON log lines whose message is `message`.
fn lines_with(server: &Server, message: &str) -> Vec<serde_json::Value> {
    server
        .log
        .lock()
        .unwrap()
        .iter()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|line| line["fields"]["message"] == message)
        .collect()
}

#[tokio::test]
async fn refusals_are_logged_at_warn_with_the_peer_and_throttled_per_peer() {
    let db = TestDb::new().await;
    // A filter that keeps only warnings (and the start-up line the harness reads).
    let server = Server::start_with_log(
        &config(&db, &identities()),
        "warn,txoutbox_server::app=info",
        true,
    )
    .await;
    server.wait_serving("orders").await;
    let mut admin = server.admin().await;
    let schema = |token| {
        with_token(
            v1::SchemaRequest {
                outbox: "orders".into(),
            },
            token,
        )
    };
    // An identity without the scope, then an audited action that went through.
    let denied = admin.pause(with_token(
        v1::PauseRequest {
            outbox: "orders".into(),
            topics: vec![],
            ..Default::default()
        },
        Some(SUBSCRIBER_TOKEN),
    ));
    assert_eq!(denied.await.unwrap_err().code(), Code::PermissionDenied);
    admin.schema(schema(Some(OPERATOR_TOKEN))).await.unwrap();

    let refused = eventually("the refusal's log line", DEADLINE, || async {
        lines_with(&server, "call refused").pop()
    })
    .await;
    assert_eq!(refused["level"], "WARN", "{refused}");
    let fields = &refused["fields"];
    assert_eq!(fields["identity"], "orders-relay", "{refused}");
    assert_eq!(fields["path"], "/txoutbox.v1.Admin/Pause", "{refused}");
    let peer = fields["peer"].as_str().unwrap_or_default();
    assert!(peer.starts_with("127.0.0.1:"), "{refused}");

    let audited = eventually("the audit event of schema", DEADLINE, || async {
        lines_with(&server, "admin action")
            .into_iter()
            .find(|line| line["fields"]["action"] == "schema")
    })
    .await;
    assert_eq!(
        audited["level"], "INFO",
        "kept under RUST_LOG=warn: {audited}"
    );
    assert_eq!(audited["target"], "txoutbox::audit");
    assert_eq!(audited["fields"]["identity"], "ops");
    assert_eq!(audited["fields"]["peer"], peer, "{audited}");

    // A client retrying a wrong token in a loop: refused every time, logged ten times a
    // minute at most (the first refusal above counts too).
    for _ in 0..40 {
        let status = admin.schema(schema(Some("not-a-token"))).await.unwrap_err();
        assert_eq!(status.code(), Code::Unauthenticated);
    }
    // A call that goes through after them, its audit event waited for: by then every
    // refusal's line is in, so the count is neither short nor about to grow.
    admin.schema(schema(Some(OPERATOR_TOKEN))).await.unwrap();
    eventually("the audit event of the second schema", DEADLINE, || async {
        let by_ops = lines_with(&server, "admin action")
            .into_iter()
            .filter(|line| line["fields"]["action"] == "schema")
            .filter(|line| line["fields"]["identity"] == "ops")
            .count();
        (by_ops == 2).then_some(())
    })
    .await;
    let logged = lines_with(&server, "call refused");
    assert!(
        (10..=12).contains(&logged.len()),
        "{} refusal lines for 41 refusals from one peer",
        logged.len()
    );
    assert!(logged.iter().all(|line| line["fields"]["peer"]
        .as_str()
        .unwrap_or_default()
        .starts_with("127.0.0.1:")));
    db.drop().await;
}

#[test]
fn one_token_or_certificate_name_on_two_identities_is_refused_at_start() {
    let db_url = "postgres://postgres@127.0.0.1:5432/test";
    let base = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n\n[databases.main]\nurl = \"{db_url}\"\n\n\
         [outboxes.orders]\ndatabase = \"main\"\ntable = \"outbox\"\n"
    );
    let same_token = format!(
        "{base}{}{}",
        token_identity("billing", "shared-secret", r#"{ orders = ["subscribe"] }"#),
        token_identity("ops", "shared-secret", r#"{ "*" = ["admin"] }"#),
    );
    let output = run_to_exit(&same_token, &[]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "server.auth.identities.billing and server.auth.identities.ops have the same token"
        ),
        "{stderr}"
    );

    let same_name = format!(
        "{base}\n[server.auth.identities.a]\ncertificate_names = [\"relay.internal\"]\n\
         grants = {{ orders = [\"subscribe\"] }}\n\
         \n[server.auth.identities.b]\ncertificate_names = [\"ops\", \"relay.internal\"]\n\
         grants = {{ orders = [\"admin\"] }}\n"
    );
    let output = run_to_exit(&same_name, &[]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "server.auth.identities.a.certificate_names and \
             server.auth.identities.b.certificate_names both list \"relay.internal\""
        ),
        "{stderr}"
    );
}
