//! Identities reload without a restart: a token file rewritten on disk takes effect (the
//! old token is refused from then on), on its own or on SIGHUP; a token file that no
//! longer loads is refused with why, and the previous identities keep working.

use super::*;

/// A configuration whose identity `ops` reads its token from `token_file`, the files
/// checked every `interval`.
fn reloading_config(db: &TestDb, token_file: &Path, interval: &str) -> String {
    config(
        db,
        &format!(
            "[server.auth]\nreload_interval = \"{interval}\"\n\n\
             [server.auth.identities.ops]\ntoken_file = \"{}\"\ngrants = {{ \"*\" = [\"admin\"] }}\n",
            token_file.display()
        ),
    )
}

/// The answer to `ListOutboxes` with `token`: its code.
async fn listing(server: &Server, token: &str) -> Code {
    let mut admin = AdminClient::new(server.channel().await);
    code(
        admin
            .list_outboxes(with_token(v1::ListOutboxesRequest {}, Some(token)))
            .await,
    )
    .0
}

#[tokio::test]
async fn a_rewritten_token_file_takes_effect_and_an_invalid_one_keeps_the_old_set() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("ops");
    std::fs::write(&token_file, "first-token\n").unwrap();
    let server = Server::start(&reloading_config(&db, &token_file, "200ms")).await;
    let pid = server.pid();
    assert_eq!(listing(&server, "first-token").await, Code::Ok);

    std::fs::write(&token_file, "second-token-of-ops\n").unwrap();
    eventually("the rewritten token accepted", DEADLINE, || async {
        (listing(&server, "second-token-of-ops").await == Code::Ok).then_some(())
    })
    .await;
    assert_eq!(listing(&server, "first-token").await, Code::Unauthenticated);
    // Logged once the new identities are in use, so possibly after they answered.
    server.wait_for_log("identities reloaded").await;

    // An empty file would let in `Bearer ` with nothing after it: refused, the previous
    // token keeps working.
    std::fs::write(&token_file, "\n").unwrap();
    let refused = server
        .wait_for_log("identities not reloaded; the previous ones stay in use")
        .await;
    assert!(
        refused.contains("is empty"),
        "the reason is logged: {refused}"
    );
    assert_eq!(listing(&server, "second-token-of-ops").await, Code::Ok);
    assert_eq!(server.pid(), pid, "no restart");
    db.drop().await;
}

#[tokio::test]
async fn sighup_reads_the_token_files_again() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("ops");
    std::fs::write(&token_file, "before-the-signal").unwrap();
    // Checked once an hour: only the signal reloads within the test.
    let server = Server::start(&reloading_config(&db, &token_file, "1h")).await;
    assert_eq!(listing(&server, "before-the-signal").await, Code::Ok);

    std::fs::write(&token_file, "after-the-signal").unwrap();
    server.hangup();
    eventually("the token read on SIGHUP", DEADLINE, || async {
        (listing(&server, "after-the-signal").await == Code::Ok).then_some(())
    })
    .await;
    assert_eq!(
        listing(&server, "before-the-signal").await,
        Code::Unauthenticated
    );
    db.drop().await;
}
