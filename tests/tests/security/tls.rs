//! Serving other machines (only with TLS and credentials, or when told to), TLS and
//! mutual TLS with certificates made at test time, certificate rotation and `SIGHUP`,
//! health behind a credential, and the Rust subscriber streaming over TLS.

use super::*;

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
    // Logged once the new certificate is in use, so possibly after it served the call.
    server.wait_for_log("TLS certificates reloaded").await;
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
    // The client may give up on a handshake before the server logs it.
    server.wait_for_log("TLS handshake failed").await;
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
    // The watcher's first look at the files may come after the copy and reload them too
    // ("files changed"): the line of the signal's reload is the one waited for.
    server
        .wait_for_log_line("the certificates reloaded on SIGHUP", |line| {
            line.contains("TLS certificates reloaded") && line.contains("\"why\":\"SIGHUP\"")
        })
        .await;
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
    server.wait_for_log("subscription opened").await;
    db.drop().await;
}

/// `client_crls`: a revoked client certificate is refused at the handshake, the others
/// served; a list rewritten on disk (a certificate revoked since) takes effect without a
/// restart.
#[tokio::test]
async fn client_certificates_revoked_by_a_crl_are_refused_and_the_crl_reloads() {
    let db = TestDb::new().await;
    let setup = TlsFiles::new();
    let dir = setup.dir.path();
    let crl = setup.ca.crl(dir, "clients.crl", &[666]);
    let config = tls_config(&db, &setup, true).replace(
        "reload_interval = \"200ms\"\n",
        &format!(
            "reload_interval = \"200ms\"\nclient_crls = [\"{}\"]\n",
            crl.display()
        ),
    );
    assert!(config.contains("client_crls"), "{config}");
    let server = Server::start(&config).await;
    let ca = dir.join("ca.pem");
    let client = |pair: &txoutbox_tests::pki::Pair| {
        Credentials::from_files(Some(&ca), Some(&pair.cert), Some(&pair.key)).unwrap()
    };
    let good = setup
        .ca
        .client_with_serial(dir, "good", "orders-relay.example", 7);
    let revoked = setup
        .ca
        .client_with_serial(dir, "revoked", "orders-relay.example", 666);
    assert_eq!(
        list_over_tls(&server, client(&good)).await.unwrap(),
        ["orders"]
    );
    let refused = list_over_tls(&server, client(&revoked)).await;
    assert!(
        refused.is_err(),
        "a revoked certificate was served: {refused:?}"
    );

    // The CA revokes the good one too; the server reads the new list on its own.
    let pid = server.pid();
    let updated = setup.ca.crl(dir, "updated.crl", &[666, 7]);
    std::fs::copy(&updated, &crl).unwrap();
    eventually("the updated list in use", DEADLINE, || {
        let credentials = client(&good);
        let server = &server;
        async move {
            list_over_tls(server, credentials)
                .await
                .is_err()
                .then_some(())
        }
    })
    .await;
    assert_eq!(server.pid(), pid, "no restart");
    db.drop().await;
}
