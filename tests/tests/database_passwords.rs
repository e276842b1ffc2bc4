//! A database URL's password is never shown: not in txoutboxd's log, not by
//! `check-config` or `schema`, not in a gRPC status or an admin answer, not by the CLI,
//! while the database refuses (MariaDB, wrong password; PostgreSQL, missing database) and
//! while it serves (PostgreSQL's trust authentication takes any password).

use tonic::Code;
use txoutbox_proto::v1;
use txoutbox_tests::server::run_to_exit;
use txoutbox_tests::{MariaDb, Server, TestDb};

use crate::cli_client::txoutbox;

const PASSWORD: &str = "s3cret-pw";

fn assert_hidden(what: &str, text: &str) {
    assert!(
        !text.contains(PASSWORD),
        "{what} shows the password: {text}"
    );
}

/// `url` with the password of this test for `user`.
fn with_password(url: &str, user: &str) -> String {
    let url = url.replacen(&format!("//{user}@"), &format!("//{user}:{PASSWORD}@"), 1);
    assert!(url.contains(PASSWORD), "{url}");
    url
}

/// What the commands that only read the configuration say about it.
fn assert_offline_commands_hide_it(config: &str) {
    for args in [&["check-config"][..], &["schema", "orders"]] {
        let output = run_to_exit(config, args);
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        assert_hidden(&format!("txoutboxd {args:?}"), &said);
    }
}

/// Everything a client can get out of `server` about outbox `orders`: statuses and
/// answers of the relay and admin calls, and the CLI's `stats` and `health`; with the
/// claim's status, which says why the database failed, when it did.
async fn assert_answers_hide_it(server: &Server) -> Option<tonic::Status> {
    let mut said = Vec::new();
    let claimed = server
        .relay()
        .await
        .claim(v1::ClaimRequest {
            outbox: "orders".into(),
            worker_id: "w".into(),
            batch_size: 1,
            lease_ms: 0,
            topics: vec![],
        })
        .await;
    said.push(format!("claim: {claimed:?}"));
    let mut admin = server.admin().await;
    let stats = admin
        .stats(v1::StatsRequest {
            outbox: "orders".into(),
        })
        .await;
    said.push(format!("stats: {stats:?}"));
    let listed = admin.list_outboxes(v1::ListOutboxesRequest {}).await;
    said.push(format!("list outboxes: {listed:?}"));
    said.push(format!("health: {:?}", server.health("orders").await));
    for args in [&["--outbox", "orders", "stats"][..], &["health"]] {
        let output = txoutbox(&server.url(), args).await;
        said.push(format!(
            "txoutbox {args:?}: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    for text in &said {
        assert_hidden("an answer", text);
    }
    claimed.err()
}

/// Every line the server logged so far, read once an audited call made after the others
/// is logged: what they logged is in by then, not still on its way.
async fn assert_log_hides_it(server: &Server) {
    let schema = v1::SchemaRequest {
        outbox: "orders".into(),
    };
    server.admin().await.schema(schema).await.unwrap();
    server.wait_for_log("\"action\":\"schema\"").await;
    for line in server.log.lock().unwrap().iter() {
        assert_hidden("the log", line);
    }
}

#[tokio::test]
async fn a_refused_mariadb_password_is_never_shown() {
    let maria = MariaDb::new().await;
    let url = with_password(&maria.url, "root").replacen("mariadb://", "mysql://", 1);
    let config = maria.config("").replace(&maria.url, &url);
    assert_offline_commands_hide_it(&config);
    // A malformed URL is reported without its password too.
    let malformed = config.replace(":3306/", ":99999/");
    assert!(malformed.contains(":99999/"));
    assert_offline_commands_hide_it(&malformed);

    let server = Server::start(&config).await;
    let refused = assert_answers_hide_it(&server).await.expect("refused");
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(refused.message().contains("Access denied"), "{refused:?}");
    server.wait_for_log("Access denied").await;
    assert_log_hides_it(&server).await;
    maria.drop().await;
}

#[tokio::test]
async fn a_postgres_password_is_never_shown_serving_or_refused() {
    let db = TestDb::new().await;
    let url = with_password(&db.url, "postgres");
    let config = db.config("").replace(&db.url, &url);
    assert_offline_commands_hide_it(&config);
    let server = Server::start_serving(&config).await;
    db.insert("orders.paid", None, b"{}").await;
    assert!(assert_answers_hide_it(&server).await.is_none());
    assert_log_hides_it(&server).await;
    drop(server);

    let (base, _) = url.rsplit_once('/').unwrap();
    let missing = config.replace(&url, &format!("{base}/no_such_db_pw"));
    let server = Server::start(&missing).await;
    let refused = assert_answers_hide_it(&server).await.expect("refused");
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(refused.message().contains("no_such_db_pw"), "{refused:?}");
    assert_log_hides_it(&server).await;
    db.drop().await;
}
