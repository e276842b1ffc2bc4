//! The operator's calls of the contract: dead letters (list, count, re-drive, discard)
//! the outbox's pause, blocked keys.

use txoutbox_server::storage::{
    BlockedKey, DeadCount, DeadFilter, HeadState, LeaseHolder, NackResult, Pauses,
};

use super::*;

/// Inserts a row, claims it alone and dead-letters it with `error`.
async fn dead_row(storage: &dyn Storage, topic: &str, key: Option<&str>, error: &str) -> MessageId {
    let id = insert(storage, topic, "p", key).await;
    let got = claim_topics(storage, "killer", 1, LEASE, &[topic.to_owned()]).await;
    assert_eq!(ids(&got), [id]);
    assert!(storage.dead_letter(id, "killer", error).await.unwrap());
    id
}

fn listed(rows: &[txoutbox_server::storage::DeadLetter]) -> Vec<MessageId> {
    rows.iter().map(|row| row.message.id).collect()
}

pub async fn dead_rows_are_listed_in_id_order_filtered_and_counted(backend: &impl Backend) {
    let storage = backend.open(Setup::default()).await;
    let before = Utc::now() - chrono::Duration::seconds(5);
    let a = dead_row(&*storage, "a", Some("k1"), "timeout after 5s").await;
    let pending = insert(&*storage, "z", "p", None).await;
    let b = dead_row(&*storage, "b", None, "bad payload").await;
    let c = dead_row(&*storage, "a", Some("k2"), "timeout after 5s").await;
    let all = DeadFilter::default();

    let rows = storage.list_dead(&all, 0, 10).await.unwrap();
    assert_eq!(listed(&rows), [a, b, c], "dead rows only, in id order");
    let first = &rows[0];
    assert_eq!(first.last_error, "timeout after 5s");
    assert_eq!(
        (first.message.attempts, first.message.key.as_deref()),
        (1, Some("k1"))
    );
    assert!(first
        .died_at
        .is_some_and(|at| at > before && at <= Utc::now()));
    assert_eq!(listed(&storage.list_dead(&all, a, 1).await.unwrap()), [b]);

    for (filter, expected) in [
        (
            DeadFilter {
                topic: Some("a".into()),
                ..all.clone()
            },
            vec![a, c],
        ),
        (
            DeadFilter {
                key: Some("k2".into()),
                ..all.clone()
            },
            vec![c],
        ),
        (
            DeadFilter {
                error_contains: Some("payload".into()),
                ..all.clone()
            },
            vec![b],
        ),
        (
            DeadFilter {
                ids: vec![c, pending, a],
                ..all.clone()
            },
            vec![a, c],
        ),
        (
            DeadFilter {
                died_after: Some(before),
                ..all.clone()
            },
            vec![a, b, c],
        ),
        (
            DeadFilter {
                died_before: Some(before),
                ..all.clone()
            },
            vec![],
        ),
    ] {
        let rows = storage.list_dead(&filter, 0, 10).await.unwrap();
        assert_eq!(listed(&rows), expected, "{filter:?}");
    }

    let counts = storage.count_dead(&all).await.unwrap();
    assert_eq!(counts.total, 3);
    assert_eq!(
        counts.groups,
        [
            DeadCount {
                topic: "a".into(),
                error: "timeout after 5s".into(),
                count: 2
            },
            DeadCount {
                topic: "b".into(),
                error: "bad payload".into(),
                count: 1
            },
        ]
    );
    let only_b = DeadFilter {
        topic: Some("b".into()),
        ..all
    };
    assert_eq!(storage.count_dead(&only_b).await.unwrap().total, 1);
}

/// Two keys' heads die; a later row of each is inserted while they are dead. Re-driven
/// with a delay, `k`'s head holds its later row back; re-driven now, `j`'s head comes
/// before its later row, attempts reset.
pub async fn a_redriven_row_goes_before_later_rows_of_its_key(backend: &impl Backend) {
    let storage = backend.open(Setup::default()).await;
    let head_k = dead_row(&*storage, "t", Some("k"), "poison").await;
    let head_j = dead_row(&*storage, "t", Some("j"), "poison").await;
    insert(&*storage, "t", "later", Some("k")).await;
    let later_j = insert(&*storage, "t", "later", Some("j")).await;

    let redriven = storage
        .redrive_dead(&only(head_k), 10, FUTURE)
        .await
        .unwrap();
    assert_eq!(redriven, [head_k]);
    let redriven = storage
        .redrive_dead(&only(head_j), 10, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(redriven, [head_j]);
    assert!(storage
        .list_dead(&DeadFilter::default(), 0, 10)
        .await
        .unwrap()
        .is_empty());
    let got = claim(&*storage, "w1", 10, LEASE).await;
    assert_eq!(
        ids(&got),
        [head_j, later_j],
        "in id order; k's later row waits behind its re-driven head"
    );
    assert_eq!(got[0].attempts, 1, "attempts were reset");
}

pub async fn redrive_and_discard_are_bounded_and_idempotent(backend: &impl Backend) {
    let storage = backend.open(Setup::default()).await;
    let mut dead = Vec::new();
    for i in 0..5 {
        dead.push(dead_row(&*storage, "t", Some(&format!("k{i}")), "e").await);
    }
    let pending = insert(&*storage, "t", "p", None).await;
    let all = DeadFilter::default();
    assert_eq!(
        storage.redrive_dead(&all, 2, Duration::ZERO).await.unwrap(),
        dead[..2]
    );
    assert_eq!(storage.discard_dead(&all, 2).await.unwrap(), dead[2..4]);
    let by_id = DeadFilter {
        ids: dead.clone(),
        ..all.clone()
    };
    assert_eq!(storage.discard_dead(&by_id, 10).await.unwrap(), dead[4..]);
    assert!(
        storage.discard_dead(&by_id, 10).await.unwrap().is_empty(),
        "a repeat"
    );
    assert!(storage
        .redrive_dead(&by_id, 10, Duration::ZERO)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        backend.row_count().await,
        3,
        "the re-driven and the pending rows stay"
    );
    let got = claim(&*storage, "w1", 10, LEASE).await;
    assert_eq!(ids(&got), [dead[0], dead[1], pending]);
}

/// The pause is held in the database: another server on the table sees it; pausing twice
/// keeps the first time; resuming twice is harmless.
pub async fn a_pause_is_seen_by_every_server_on_the_table(backend: &impl Backend) {
    let storage = backend.open(Setup::default()).await;
    let other = backend.open(Setup::default()).await;
    assert_eq!(other.pauses().await.unwrap(), Pauses::default());
    let since = storage.set_paused(&[], true).await.unwrap().outbox;
    let since = since.expect("paused");
    assert!((Utc::now() - since).num_seconds().abs() < 5);
    assert_eq!(other.pauses().await.unwrap().outbox, Some(since));
    assert_eq!(
        other.set_paused(&[], true).await.unwrap().outbox,
        Some(since),
        "idempotent"
    );
    assert_eq!(other.set_paused(&[], false).await.unwrap().outbox, None);
    assert_eq!(storage.set_paused(&[], false).await.unwrap().outbox, None);
    assert_eq!(storage.pauses().await.unwrap(), Pauses::default());
}

fn topics(names: &[&str]) -> Vec<String> {
    names.iter().map(|name| name.to_string()).collect()
}

/// Topic pauses are rows of their own: another server sees them, a resume of the whole
/// outbox leaves them, a resume of one topic leaves the others.
pub async fn paused_topics_are_held_in_the_database(backend: &impl Backend) {
    let storage = backend.open(Setup::default()).await;
    let other = backend.open(Setup::default()).await;
    let pauses = storage
        .set_paused(&topics(&["a", "b"]), true)
        .await
        .unwrap();
    assert_eq!(pauses.outbox, None);
    assert_eq!(pauses.topic_names(), ["a", "b"]);
    let seen = other.pauses().await.unwrap();
    assert_eq!(seen, pauses);
    let again = other.set_paused(&topics(&["b"]), true).await.unwrap();
    assert_eq!(again, pauses, "idempotent: the first time is kept");
    storage.set_paused(&[], true).await.unwrap();
    let after = other.set_paused(&[], false).await.unwrap();
    assert_eq!(
        after, pauses,
        "resuming the outbox leaves its topics paused"
    );
    let after = other.set_paused(&topics(&["a"]), false).await.unwrap();
    assert_eq!(after.topic_names(), ["b"]);
    assert_eq!(after.topics["b"], pauses.topics["b"]);
}

/// A claim of every topic but the paused ones.
async fn claim_unpaused(storage: &dyn Storage, owner: &str, paused: &[String]) -> Vec<MessageId> {
    let request = ClaimRequest {
        paused_topics: paused,
        ..super::request(owner)
    };
    ids(&storage.claim(request).await.expect("claim").messages)
}

/// Rows of a paused topic stay; under strict ordering a key whose next row is of a
/// paused topic waits with it, while keyless rows and other keys flow.
pub async fn rows_of_paused_topics_are_not_claimed(backend: &impl Backend) {
    let storage = backend.open(Setup::default()).await;
    let held = insert(&*storage, "paused", "1", Some("k")).await;
    let behind = insert(&*storage, "open", "2", Some("k")).await;
    let keyless = insert(&*storage, "paused", "3", None).await;
    let other = insert(&*storage, "open", "4", Some("j")).await;
    let free = insert(&*storage, "open", "5", None).await;
    let paused = topics(&["paused"]);
    assert_eq!(
        claim_unpaused(&*storage, "w1", &paused).await,
        [other, free],
        "k waits behind its row of the paused topic"
    );
    assert_eq!(
        claim_unpaused(&*storage, "w1", &[]).await,
        [held, behind, keyless],
        "resumed: in id order"
    );
}

pub async fn rows_of_paused_topics_are_not_claimed_without_strict_ordering(backend: &impl Backend) {
    let storage = backend
        .open(Setup {
            strict_ordering: false,
            ..Setup::default()
        })
        .await;
    let held = insert(&*storage, "paused", "1", Some("k")).await;
    let other = insert(&*storage, "open", "2", Some("k")).await;
    let keyless = insert(&*storage, "paused", "3", None).await;
    let paused = topics(&["paused", "also"]);
    assert_eq!(claim_unpaused(&*storage, "w1", &paused).await, [other]);
    assert_eq!(
        claim_unpaused(&*storage, "w1", &topics(&["open"])).await,
        [held, keyless]
    );
}

/// `k`'s head waits for a retry with two rows behind it; `j`'s head is leased with one
/// behind; keyless rows and keys whose head is due are not blocked.
/// Key, head, state, owner and rows behind of each blocked key.
fn heads(blocked: &[BlockedKey]) -> Vec<(&str, MessageId, HeadState, Option<&str>, u64)> {
    blocked
        .iter()
        .map(|b| {
            (
                b.key.as_str(),
                b.head_id,
                b.state,
                b.owner.as_deref(),
                b.waiting_behind,
            )
        })
        .collect()
}

pub async fn blocked_keys_are_listed_oldest_head_first(backend: &impl Backend) {
    let storage = backend.open(Setup::default()).await;
    let a = insert(&*storage, "t", "a", Some("k")).await;
    insert(&*storage, "t", "b", Some("k")).await;
    insert(&*storage, "t", "c", Some("k")).await;
    let d = insert(&*storage, "t", "d", Some("j")).await;
    insert(&*storage, "t", "e", Some("j")).await;
    insert(&*storage, "t", "f", None).await;
    assert_eq!(claim(&*storage, "w1", 10, LEASE).await.len(), 6);
    let nacked = storage
        .nack(a, "w1", "broker busy", Some(FUTURE), &POLICY)
        .await
        .unwrap();
    assert!(matches!(nacked, NackResult::Retried { .. }), "{nacked:?}");
    insert(&*storage, "t", "g", Some("free")).await;

    let blocked = storage.blocked_keys(0, 10).await.unwrap();
    let seen = heads(&blocked);
    assert_eq!(
        seen,
        [
            ("k", a, HeadState::RetryWaiting, None, 2),
            ("j", d, HeadState::Leased, Some("w1"), 1),
        ]
    );
    assert_eq!(blocked[0].last_error.as_deref(), Some("broker busy"));
    assert_eq!(blocked[0].attempts, 1);
    assert_about_from_now(blocked[0].until, FUTURE);
    assert_about_from_now(blocked[1].until, LEASE);
    assert!(blocked[0].head_created_at <= Utc::now());
    let next = storage.blocked_keys(a, 10).await.unwrap();
    assert_eq!(next.iter().map(|b| b.head_id).collect::<Vec<_>>(), [d]);
    assert_eq!(storage.blocked_keys(0, 1).await.unwrap().len(), 1);
}

/// Owners with live leases, the most rows first; a lease given back or run out is not
/// counted.
pub async fn lease_holders_are_the_owners_of_live_leases(backend: &impl Backend) {
    let storage = backend.open(Setup::default()).await;
    let other = backend.open(Setup::default()).await;
    for i in 0..6 {
        insert(&*storage, "t", "p", Some(&format!("k{i}"))).await;
    }
    let w1 = claim(&*storage, "w1", 3, LEASE).await;
    let w2 = claim(&*other, "w2", 2, LEASE).await;
    let short = claim(&*storage, "w3", 1, SHORT_LEASE).await;
    assert_eq!((w1.len(), w2.len(), short.len()), (3, 2, 1));
    storage
        .release(&[w2[0].id].into(), "w2", Duration::ZERO)
        .await
        .unwrap();
    let seen = |holders: &[LeaseHolder]| -> Vec<(String, u64)> {
        holders.iter().map(|h| (h.owner.clone(), h.rows)).collect()
    };
    let expected = [("w1".to_owned(), 3), ("w2".to_owned(), 1)];
    let holders = other.lease_holders().await.unwrap();
    assert!(
        seen(&holders).contains(&("w3".to_owned(), 1)) || seen(&holders) == expected,
        "{holders:?}"
    );
    // w3's lease runs out on the database clock.
    let start = std::time::Instant::now();
    let holders = loop {
        let holders = other.lease_holders().await.unwrap();
        if seen(&holders) == expected || start.elapsed() > DEADLINE {
            break holders;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(seen(&holders), expected, "w3's lease ran out");
    assert_about_from_now(holders[0].earliest_expiry, LEASE);
}

async fn assert_no_dead_heads(storage: &dyn Storage) {
    let blocked = storage.blocked_keys(0, 10).await.unwrap();
    assert!(
        blocked.iter().all(|b| b.state != HeadState::Dead),
        "{blocked:?}"
    );
}

/// Strict ordering with `dead_letter_holds_key`.
fn holding() -> Setup {
    Setup {
        dead_letter_holds_key: true,
        ..Setup::default()
    }
}

/// Dead-letters on the first failure.
const FATAL: TestPolicy = TestPolicy { max_attempts: 1 };

/// `dead_letter_holds_key`: a key's dead row holds back its later rows (never claimed)
/// while other keys flow; re-driven it goes first, then the rest of its key in id order;
/// discarded, the next row of its key is claimable. Listed among the blocked keys.
pub async fn a_dead_row_holds_its_key_until_redriven_or_discarded(backend: &impl Backend) {
    let storage = backend.open(holding()).await;
    let k1 = insert(&*storage, "t", "k1", Some("k")).await;
    let k2 = insert(&*storage, "t", "k2", Some("k")).await;
    let k3 = insert(&*storage, "t", "k3", Some("k")).await;
    let j1 = insert(&*storage, "t", "j1", Some("j")).await;
    let j2 = insert(&*storage, "t", "j2", Some("j")).await;
    let free = insert(&*storage, "t", "free", Some("free")).await;
    assert_eq!(
        ids(&claim(&*storage, "w1", 10, LEASE).await),
        [k1, k2, k3, j1, j2, free]
    );
    for id in [k1, j1] {
        let nacked = storage
            .nack(id, "w1", "poison", None, &FATAL)
            .await
            .unwrap();
        assert!(
            matches!(nacked, NackResult::DeadLettered { .. }),
            "{id}: {nacked:?}"
        );
    }
    assert_eq!(storage.ack(&[free].into(), "w1").await.unwrap(), [free]);

    // The nacks gave k2, k3 and j2 back; they wait behind their dead heads.
    assert!(claim(&*storage, "w2", 10, LEASE).await.is_empty());
    let free2 = insert(&*storage, "t", "free2", Some("free")).await;
    let keyless = insert(&*storage, "t", "keyless", None).await;
    assert_eq!(
        ids(&claim(&*storage, "w2", 10, LEASE).await),
        [free2, keyless],
        "other keys flow"
    );
    assert_eq!(
        storage.ack(&[free2, keyless].into(), "w2").await.unwrap(),
        [free2, keyless]
    );
    let k4 = insert(&*storage, "t", "k4", Some("k")).await;
    assert!(claim(&*storage, "w2", 10, LEASE).await.is_empty());

    let blocked = storage.blocked_keys(0, 10).await.unwrap();
    let seen = heads(&blocked);
    assert_eq!(
        seen,
        [
            ("k", k1, HeadState::Dead, None, 3),
            ("j", j1, HeadState::Dead, None, 1),
        ]
    );
    assert_eq!(blocked[0].last_error.as_deref(), Some("poison"));
    assert_eq!(blocked[0].attempts, 1);
    assert_about_from_now(blocked[0].until, Duration::ZERO);
    let next = storage.blocked_keys(k1, 10).await.unwrap();
    assert_eq!(next.iter().map(|b| b.head_id).collect::<Vec<_>>(), [j1]);
    assert_eq!(storage.blocked_keys(0, 1).await.unwrap().len(), 1);

    assert_eq!(
        storage
            .redrive_dead(&only(k1), 10, Duration::ZERO)
            .await
            .unwrap(),
        [k1]
    );
    let got = claim(&*storage, "w3", 10, LEASE).await;
    assert_eq!(
        ids(&got),
        [k1, k2, k3, k4],
        "the re-driven row first, then the rest of its key in id order"
    );
    assert!(got.iter().all(|m| m.attempts == 1), "{got:?}");

    assert_eq!(storage.discard_dead(&only(j1), 10).await.unwrap(), [j1]);
    assert_eq!(ids(&claim(&*storage, "w3", 10, LEASE).await), [j2]);
    assert_no_dead_heads(&*storage).await;
}

/// `dead_letter_holds_key`: of a key's rows claimed `max_attempts` times without an
/// answer, the next claim dead-letters the first; the rows behind it wait behind it.
pub async fn a_row_used_up_by_claims_holds_the_rows_of_its_key_behind_it(backend: &impl Backend) {
    let storage = backend.open(holding()).await;
    let k1 = insert(&*storage, "t", "k1", Some("k")).await;
    let k2 = insert(&*storage, "t", "k2", Some("k")).await;
    let request = |owner| ClaimRequest {
        owner,
        batch_size: 10,
        lease: SHORT_LEASE,
        topics: &[],
        paused_topics: &[],
        max_attempts: 1,
    };
    let first = storage.claim(request("w1")).await.unwrap();
    assert_eq!(ids(&first.messages), [k1, k2]);
    outlive_short_lease().await;
    let second = storage.claim(request("w2")).await.unwrap();
    assert!(second.messages.is_empty(), "{second:?}");
    assert_eq!(second.exhausted, [k1], "only the key's first row dies");
    let third = storage.claim(request("w2")).await.unwrap();
    assert!(
        third.messages.is_empty() && third.exhausted.is_empty(),
        "{third:?}"
    );
    let blocked = storage.blocked_keys(0, 10).await.unwrap();
    assert_eq!(
        blocked
            .iter()
            .map(|b| (b.head_id, b.state, b.waiting_behind))
            .collect::<Vec<_>>(),
        [(k1, HeadState::Dead, 1)]
    );
}

/// Without the policy (the default), a dead row's later rows are claimable at once.
pub async fn without_the_policy_a_dead_row_holds_nothing_back(backend: &impl Backend) {
    let storage = backend.open(Setup::default()).await;
    let k1 = insert(&*storage, "t", "k1", Some("k")).await;
    let k2 = insert(&*storage, "t", "k2", Some("k")).await;
    assert_eq!(ids(&claim(&*storage, "w1", 10, LEASE).await), [k1, k2]);
    let nacked = storage
        .nack(k1, "w1", "poison", None, &FATAL)
        .await
        .unwrap();
    assert!(
        matches!(nacked, NackResult::DeadLettered { .. }),
        "{nacked:?}"
    );
    assert_eq!(ids(&claim(&*storage, "w2", 10, LEASE).await), [k2]);
    assert_no_dead_heads(&*storage).await;
}

/// `dead_letter_holds_key` turned on over dead rows already there: a re-driven row goes
/// out, but not the key's rows behind a later dead row; discarded, they go too.
pub async fn a_dead_row_holds_the_rows_after_it_behind_a_redriven_one(backend: &impl Backend) {
    let plain = backend.open(Setup::default()).await;
    let k1 = dead_row(&*plain, "t", Some("k"), "poison").await;
    let k2 = dead_row(&*plain, "t", Some("k"), "poison").await;
    let k3 = insert(&*plain, "t", "k3", Some("k")).await;
    let storage = backend.open(holding()).await;
    storage.ensure_table().await.unwrap();
    assert_eq!(
        storage
            .redrive_dead(&only(k1), 10, Duration::ZERO)
            .await
            .unwrap(),
        [k1]
    );
    assert_eq!(ids(&claim(&*storage, "w1", 10, LEASE).await), [k1]);
    assert_eq!(storage.ack(&[k1].into(), "w1").await.unwrap(), [k1]);
    let blocked = storage.blocked_keys(0, 10).await.unwrap();
    assert_eq!(
        blocked
            .iter()
            .map(|b| (b.head_id, b.state, b.waiting_behind))
            .collect::<Vec<_>>(),
        [(k2, HeadState::Dead, 1)]
    );
    assert!(claim(&*storage, "w1", 10, LEASE).await.is_empty());
    assert_eq!(storage.discard_dead(&only(k2), 10).await.unwrap(), [k2]);
    assert_eq!(ids(&claim(&*storage, "w1", 10, LEASE).await), [k3]);
}

/// The dead-letter filter naming one row.
fn only(id: MessageId) -> DeadFilter {
    DeadFilter {
        ids: vec![id],
        ..DeadFilter::default()
    }
}
