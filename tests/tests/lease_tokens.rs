//! Lease tokens against a real `txoutboxd` (docs/lease-tokens.md): a token of an earlier
//! delivery is fenced once its lease ran out and the same worker claimed the row again;
//! two identities using one worker name cannot answer for each other, with tokens or
//! without; `require_lease_tokens` refuses answers without them; a stream's messages
//! carry tokens its answers may send back.

use tonic::metadata::MetadataValue;
use tonic::transport::Channel;
use tonic::{Code, Request};
use txoutbox_proto::v1::relay_client::RelayClient;
use txoutbox_proto::v1::subscribe_request::Request as Req;
use txoutbox_proto::v1::{self, NackOutcome};
use txoutbox_tests::pki::token_identity;
use txoutbox_tests::{eventually, Server, Subscriber, TestDb, DEADLINE};

const A_TOKEN: &str = "lease-a-51c2";
const B_TOKEN: &str = "lease-b-9e07";

fn with_token<T>(message: T, token: Option<&str>) -> Request<T> {
    let mut request = Request::new(message);
    if let Some(token) = token {
        let value: MetadataValue<_> = format!("Bearer {token}").parse().unwrap();
        request.metadata_mut().insert("authorization", value);
    }
    request
}

async fn claim(
    relay: &mut RelayClient<Channel>,
    token: Option<&str>,
    worker: &str,
    lease_ms: u64,
) -> Vec<v1::Message> {
    let request = v1::ClaimRequest {
        outbox: "orders".into(),
        worker_id: worker.into(),
        batch_size: 10,
        lease_ms,
        topics: vec![],
    };
    relay
        .claim(with_token(request, token))
        .await
        .unwrap()
        .into_inner()
        .messages
}

fn ack(worker: &str, ids: Vec<i64>, lease_tokens: Vec<String>) -> v1::AckRequest {
    v1::AckRequest {
        outbox: "orders".into(),
        worker_id: worker.into(),
        ids,
        lease_tokens,
    }
}

async fn fenced_answers(server: &Server) -> u64 {
    server
        .admin()
        .await
        .stats(v1::StatsRequest {
            outbox: "orders".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .fenced_answers
}

/// The lease of attempt 1 runs out and the same worker claims the row again (attempt
/// 2): every answer carrying the first delivery's token is fenced and counted, though
/// the worker name still matches; the second delivery's token applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_token_is_fenced_once_the_row_was_claimed_again() {
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let mut relay = server.relay().await;
    let id = db.insert("t", Some("k"), b"p").await;

    let first = claim(&mut relay, None, "w", 200).await;
    assert_eq!((first[0].id, first[0].attempts), (id, 1));
    let stale = first[0].lease_token.clone();
    assert!(!stale.is_empty());
    let second = eventually("the row claimed again", DEADLINE, || {
        let mut relay = relay.clone();
        async move {
            let messages = claim(&mut relay, None, "w", 30_000).await;
            (!messages.is_empty()).then_some(messages)
        }
    })
    .await;
    assert_eq!((second[0].id, second[0].attempts), (id, 2));
    let current = second[0].lease_token.clone();
    assert_ne!(stale, current);

    let before = fenced_answers(&server).await;
    let acked = relay
        .ack(ack("w", vec![], vec![stale.clone()]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((acked.acked, acked.fenced), (vec![], vec![id]));
    let nacked = relay
        .nack(v1::NackRequest {
            outbox: "orders".into(),
            worker_id: "w".into(),
            id,
            error: "late".into(),
            retry_delay_ms: None,
            lease_token: stale.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(nacked.outcome(), NackOutcome::Fenced);
    let released = relay
        .release(v1::ReleaseRequest {
            outbox: "orders".into(),
            worker_id: "w".into(),
            ids: vec![id],
            retry_delay_ms: None,
            lease_tokens: vec![stale.clone()],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(released.fenced, [id]);
    let dead = relay
        .dead_letter(v1::DeadLetterRequest {
            outbox: "orders".into(),
            worker_id: "w".into(),
            id: 0,
            error: "late".into(),
            lease_token: stale.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!dead.dead_lettered);
    let extended = relay
        .extend_lease(v1::ExtendLeaseRequest {
            outbox: "orders".into(),
            worker_id: "w".into(),
            ids: vec![],
            lease_ms: 0,
            lease_tokens: vec![stale.clone()],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(extended.fenced, [id]);
    assert_eq!(db.row(id).await.0, "pending", "no stale answer applied");
    assert!(
        fenced_answers(&server).await >= before + 5,
        "each stale answer counted"
    );

    // A token that names another id than the one beside it, or none the relay made.
    let mixed = relay
        .ack(ack("w", vec![id + 1], vec![current.clone()]))
        .await
        .unwrap_err();
    assert_eq!(mixed.code(), Code::InvalidArgument, "{mixed:?}");
    let forged = relay
        .ack(ack("w", vec![], vec!["not-a-token".into()]))
        .await
        .unwrap_err();
    assert!(forged.message().contains("lease_token"), "{forged:?}");

    let acked = relay
        .ack(ack("w", vec![id], vec![current]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(acked.acked, [id]);
    assert_eq!(db.row(id).await.0, "done");
    db.drop().await;
}

/// Identities `a` and `b` both name their worker `w`: `b` reaches none of `a`'s leases,
/// by id or with `a`'s token, and cannot claim `a`'s row either; `a` acks it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_identities_with_one_worker_name_cannot_answer_for_each_other() {
    let db = TestDb::new().await;
    let identities = [
        token_identity("a", A_TOKEN, r#"{ orders = ["subscribe"] }"#),
        token_identity("b", B_TOKEN, r#"{ orders = ["subscribe"] }"#),
        token_identity("ops", "lease-ops-7f", r#"{ "*" = ["admin", "insert"] }"#),
    ]
    .concat();
    let server = Server::start(&format!("{}{identities}", db.config(""))).await;
    server.wait_serving("orders").await;
    let mut relay = RelayClient::new(server.channel().await);
    let id = db.insert("t", None, b"p").await;

    let claimed = claim(&mut relay, Some(A_TOKEN), "w", 30_000).await;
    assert_eq!(claimed[0].id, id);
    let token = claimed[0].lease_token.clone();
    assert!(claim(&mut relay, Some(B_TOKEN), "w", 30_000)
        .await
        .is_empty());

    for (ids, tokens) in [(vec![id], vec![]), (vec![], vec![token.clone()])] {
        let answer = relay
            .ack(with_token(ack("w", ids, tokens), Some(B_TOKEN)))
            .await
            .unwrap()
            .into_inner();
        assert_eq!((answer.acked, answer.fenced), (vec![], vec![id]));
    }
    let nacked = relay
        .nack(with_token(
            v1::NackRequest {
                outbox: "orders".into(),
                worker_id: "w".into(),
                id,
                error: "not mine".into(),
                retry_delay_ms: None,
                lease_token: String::new(),
            },
            Some(B_TOKEN),
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(nacked.outcome(), NackOutcome::Fenced);
    assert_eq!(db.row(id).await, ("pending".into(), 1, None));

    let acked = relay
        .ack(with_token(ack("w", vec![], vec![token]), Some(A_TOKEN)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(acked.acked, [id]);
    db.drop().await;
}

/// With `require_lease_tokens`, an answer without tokens is refused naming the setting,
/// unary and on a stream; a stream's messages carry tokens, and answers that send them
/// back apply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_lease_tokens_refuses_answers_without_them() {
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("require_lease_tokens = true")).await;
    let mut relay = server.relay().await;
    let id = db.insert("t", Some("k"), b"p").await;

    let claimed = claim(&mut relay, None, "w", 30_000).await;
    let refused = relay.ack(ack("w", vec![id], vec![])).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(
        refused
            .message()
            .contains("outboxes.orders.require_lease_tokens"),
        "{refused:?}"
    );
    let released = relay
        .release(v1::ReleaseRequest {
            outbox: "orders".into(),
            worker_id: "w".into(),
            ids: vec![],
            retry_delay_ms: None,
            lease_tokens: vec![claimed[0].lease_token.clone()],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(released.released, [id]);

    let mut sub = Subscriber::open(&server, "tokens", 10, 0).await;
    let got = sub.take(1).await;
    assert_eq!((got[0].id, got[0].attempts), (id, 1), "released untried");
    let token = got[0].lease_token.clone();
    assert!(!token.is_empty());
    let settled = sub
        .answer(Req::Ack(v1::AckMessages {
            ids: vec![],
            lease_tokens: vec![token],
        }))
        .await;
    assert_eq!(settled.acked, [id]);

    // The same stream answering without a token ends with INVALID_ARGUMENT.
    let other = db.insert("t", Some("k2"), b"q").await;
    let got = sub.take(1).await;
    assert_eq!(got[0].id, other);
    sub.send(Req::Ack(v1::AckMessages {
        ids: vec![other],
        lease_tokens: vec![],
    }))
    .await;
    let ended = sub.wait_end(DEADLINE).await.unwrap_err();
    assert_eq!(ended.code(), Code::InvalidArgument, "{ended:?}");
    assert!(
        ended.message().contains("require_lease_tokens"),
        "{ended:?}"
    );
    db.drop().await;
}

/// A stream lets a lease run out and claims the row again (attempt 2): an ack with the
/// first delivery's token is fenced and counted without touching the row, though the
/// stream is the row's holder; the second token acks it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streams_stale_token_is_fenced_once_it_holds_the_row_again() {
    let db = TestDb::new().await;
    let server = Server::start_serving(&db.config("")).await;
    let id = db.insert("t", Some("k"), b"p").await;
    let mut sub = Subscriber::open(&server, "tokens", 10, 200).await;
    let first = sub.take(1).await.remove(0);
    assert_eq!((first.id, first.attempts), (id, 1));
    let second = sub.take(1).await.remove(0);
    assert_eq!((second.id, second.attempts), (id, 2), "claimed again");
    assert_ne!(first.lease_token, second.lease_token);

    let before = fenced_answers(&server).await;
    let settled = sub
        .answer(Req::Ack(v1::AckMessages {
            ids: vec![],
            lease_tokens: vec![first.lease_token.clone()],
        }))
        .await;
    assert_eq!((settled.acked, settled.fenced), (vec![], vec![id]));
    assert_eq!(db.row(id).await.0, "pending");
    assert!(fenced_answers(&server).await > before);
    let settled = sub
        .answer(Req::Nack(v1::NackMessage {
            id,
            error: "late".into(),
            retry_delay_ms: None,
            lease_token: first.lease_token.clone(),
        }))
        .await;
    assert_eq!(settled.fenced, [id]);
    let settled = sub
        .answer(Req::Ack(v1::AckMessages {
            ids: vec![id],
            lease_tokens: vec![second.lease_token.clone()],
        }))
        .await;
    assert_eq!(settled.acked, [id]);
    assert_eq!(db.row(id).await.0, "done");
    db.drop().await;
}
