//! `dead_letter_holds_key`: a poison row nacked to `max_attempts` by a real subscriber
//! dies and holds its key's later rows while other keys flow; the blocked keys show it
//! dead; re-driven, it arrives first and the rest of its key after it, in id order;
//! discarded, the later rows of its key arrive.

use std::collections::BTreeMap;

use txoutbox_proto::v1::{self, DeadLetterSelector};
use txoutbox_tests::journal::parse;
use txoutbox_tests::{OutboxDb, Server, Subscriber};

use super::blocked::first_page;
use crate::cli_client::{json, txoutbox};

const CONFIG: &str = "dead_letter_holds_key = true\nmax_attempts = 2\n\
                      backoff.base = \"10ms\"\nbackoff.jitter = 0.0";

/// What a subscriber published, per key, in the order it was acked.
type Arrived = BTreeMap<String, Vec<u32>>;

/// Answers the next message as a client does: a nack for the rows of `poison`, an ack
/// for the others, recording each ack that applied. The later rows of its key that a nack
/// gave back are not published: their copies already received are dropped (a new claim
/// may hand them to this stream again, after them).
async fn answer_next(sub: &mut Subscriber, poison: &[i64], arrived: &mut Arrived) {
    let message = sub.take(1).await.remove(0);
    if poison.contains(&message.id) {
        let settled = sub.nack(message.id, "poison", None).await;
        for id in settled.released {
            if let Some(stale) = sub.inbox.iter().position(|m| m.id == id) {
                sub.inbox.remove(stale);
            }
        }
    } else if sub.ack(&[message.id]).await.acked == [message.id] {
        let (key, seq) = parse(&message.payload);
        arrived.entry(key).or_default().push(seq);
    }
}

async fn deliver_until(
    sub: &mut Subscriber,
    poison: &[i64],
    arrived: &mut Arrived,
    done: impl Fn(&Arrived) -> bool,
) {
    while !done(arrived) {
        answer_next(sub, poison, arrived).await;
    }
}

fn count(arrived: &Arrived, key: &str) -> usize {
    arrived.get(key).map_or(0, Vec::len)
}

fn rows(key: &str, seqs: std::ops::Range<u32>) -> Vec<(Option<String>, Vec<u8>)> {
    seqs.map(|seq| (Some(key.to_owned()), format!("{key}:{seq}").into_bytes()))
        .collect()
}

pub async fn a_dead_row_holds_its_key_until_redriven_or_discarded(db: impl OutboxDb) {
    let server = Server::start_serving(&db.config(CONFIG)).await;
    let p = db.insert_many("t", &rows("p", 0..3)).await;
    let q = db.insert_many("t", &rows("q", 0..3)).await;
    db.insert_many("t", &rows("ok", 0..4)).await;
    let mut sub = Subscriber::open(&server, "checker", 10, 0).await;
    let mut arrived = Arrived::new();

    // The poison rows die on their second nack; the other key flows.
    let poison = [p[0], q[0]];
    while db.count("dead").await < 2 || count(&arrived, "ok") < 4 {
        answer_next(&mut sub, &poison, &mut arrived).await;
    }
    let later = db.insert_many("t", &rows("p", 3..4)).await;
    db.insert_many("t", &rows("ok", 4..5)).await;
    deliver_until(&mut sub, &poison, &mut arrived, |a| count(a, "ok") == 5).await;
    assert_eq!(arrived["ok"], [0, 1, 2, 3, 4], "other keys flow");
    assert_eq!(
        (count(&arrived, "p"), count(&arrived, "q")),
        (0, 0),
        "{arrived:?}"
    );
    for id in [p[1], p[2], q[1], q[2], later[0]] {
        let (status, attempts, _) = db.row(id).await;
        assert_eq!((status.as_str(), attempts), ("pending", 0), "row {id}");
    }

    let listed = first_page(&server).await;
    let seen: Vec<(&str, i64, &str, u32, u64)> = listed
        .keys
        .iter()
        .map(|k| {
            (
                k.key.as_str(),
                k.head_id,
                k.state.as_str(),
                k.attempts,
                k.waiting_behind,
            )
        })
        .collect();
    assert_eq!(seen, [("p", p[0], "dead", 2, 3), ("q", q[0], "dead", 2, 2)]);
    assert_eq!(listed.keys[0].last_error.as_deref(), Some("poison"));
    assert_eq!(listed.keys[0].owner, None);
    let printed = json(&txoutbox(&server.url(), &["--format", "json", "blocked"]).await);
    assert_eq!(printed["keys"][0]["state"], "dead");
    assert_eq!(printed["keys"][1]["head_id"], q[0]);

    let mut admin = server.admin().await;
    let selector = |id: i64| {
        Some(DeadLetterSelector {
            ids: vec![id],
            ..DeadLetterSelector::default()
        })
    };
    let redriven = admin
        .redrive_dead_letters(v1::RedriveDeadLettersRequest {
            group: String::new(),
            outbox: "orders".into(),
            selector: selector(p[0]),
            limit: 10,
            delay: None,
            dry_run: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(redriven.ids, [p[0]]);
    let poison = [q[0]];
    deliver_until(&mut sub, &poison, &mut arrived, |a| count(a, "p") == 4).await;
    assert_eq!(
        arrived["p"],
        [0, 1, 2, 3],
        "the re-driven row first, then in id order"
    );

    let discarded = admin
        .discard_dead_letters(v1::DiscardDeadLettersRequest {
            group: String::new(),
            outbox: "orders".into(),
            selector: selector(q[0]),
            limit: 10,
            dry_run: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(discarded.ids, [q[0]]);
    deliver_until(&mut sub, &poison, &mut arrived, |a| count(a, "q") == 2).await;
    assert_eq!(arrived["q"], [1, 2]);
    assert_eq!(db.count("dead").await, 0);
    assert_eq!(db.count("pending").await, 0);
    db.drop().await;
}
