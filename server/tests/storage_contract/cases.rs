//! The contract, case by case. Each takes a fresh backend; see `storage_contract!`.
//! Claims and answers here; errors, insert signals, races and teams' own tables in
//! `edge_cases.rs`, re-exported so the macro finds every case under `cases::`.

use txoutbox_server::storage::{HeldKeys, NackResult, Stats, TopicStats};

use super::*;
pub use crate::edge_cases::*;
pub use crate::keyless::*;
pub use crate::operations::*;

pub async fn empty_claim(backend: &impl Backend) {
    let storage = backend.open(Setup::default()).await;
    let claimed = storage.claim(request("w1")).await.unwrap();
    assert!(claimed.messages.is_empty());
    assert_about_from_now(claimed.lease_expires_at, LEASE);
}

pub async fn claim_returns_insertion_order_with_attempt_one(backend: &impl Backend) {
    let storage = backend.open(Setup::default()).await;
    let before = Utc::now() - chrono::Duration::seconds(5);
    let mut inserted = Vec::new();
    for i in 0..3 {
        inserted.push(insert(&*storage, "t", &format!("p{i}"), Some("k")).await);
    }
    let claimed = storage.claim(request("w1")).await.unwrap();
    let got = &claimed.messages;
    assert_eq!(ids(got), inserted);
    assert_eq!(payloads(got), ["p0", "p1", "p2"]);
    assert!(got.iter().all(|m| m.attempts == 1));
    assert!(got
        .iter()
        .all(|m| m.topic == "t" && m.key.as_deref() == Some("k")));
    assert!(got
        .iter()
        .all(|m| m.created_at > before && m.created_at <= Utc::now()));
    assert_about_from_now(claimed.lease_expires_at, LEASE);
}

pub async fn claim_respects_batch_size(backend: &impl Backend) {
    let storage = backend.open(Setup::default()).await;
    for i in 0..5 {
        insert(&*storage, "t", &format!("p{i}"), None).await;
    }
    let mut sizes = Vec::new();
    for _ in 0..3 {
        sizes.push(claim(&*storage, "w1", 2, LEASE).await.len());
    }
    assert_eq!(sizes, [2, 2, 1]);
}

pub async fn leased_rows_are_invisible_to_other_workers(backend: &impl Backend) {
    let storage = backend.open(Setup::default()).await;
    insert(&*storage, "t", "p", None).await;
    assert_eq!(claim(&*storage, "w1", 10, LEASE).await.len(), 1);
    assert!(claim(&*storage, "w2", 10, LEASE).await.is_empty());
    assert!(claim(&*storage, "w1", 10, LEASE).await.is_empty());
}

pub async fn expired_lease_is_reclaimable_with_the_next_attempt(backend: &impl Backend) {
    let storage = backend.open(Setup::default()).await;
    let id = insert(&*storage, "t", "p", None).await;
    assert_eq!(ids(&claim(&*storage, "w1", 10, SHORT_LEASE).await), [id]);
    assert!(
        claim(&*storage, "w2", 10, LEASE).await.is_empty(),
        "lease not over yet"
    );
    let got = claim_eventually(&*storage, "w2", 10).await;
    assert_eq!(ids(&got), [id]);
    assert_eq!(got[0].attempts, 2);
}

async fn claim_concurrently_without_overlap(backend: &impl Backend, setup: Setup) {
    // Two instances, as if two servers shared the table.
    let servers = [backend.open(setup.clone()).await, backend.open(setup).await];
    for i in 0..20 {
        insert(&*servers[0], "t", &format!("p{i}"), None).await;
    }
    let claimers = (0..4).map(|i| {
        let storage = servers[i % 2].clone();
        tokio::spawn(async move { ids(&claim(&*storage, &format!("w{i}"), 5, LEASE).await) })
    });
    let mut claimed: Vec<MessageId> = Vec::new();
    for claimer in futures::future::join_all(claimers).await {
        claimed.extend(claimer.unwrap());
    }
    let total = claimed.len();
    claimed.sort_unstable();
    claimed.dedup();
    assert_eq!(
        (total, claimed.len()),
        (20, 20),
        "each row claimed exactly once"
    );
}

pub async fn concurrent_claims_do_not_overlap(backend: &impl Backend) {
    claim_concurrently_without_overlap(backend, Setup::default()).await;
}

pub async fn concurrent_claims_do_not_overlap_without_strict_ordering(backend: &impl Backend) {
    let setup = Setup {
        strict_ordering: false,
        ..Setup::default()
    };
    claim_concurrently_without_overlap(backend, setup).await;
}

pub async fn acked_rows_are_never_claimed_again(backend: &impl Backend) {
    let storage = backend.open(Setup::default()).await;
    let id = insert(&*storage, "t", "p", None).await;
    claim(&*storage, "w1", 10, SHORT_LEASE).await;
    assert_eq!(storage.ack(&[id].into(), "w1").await.unwrap(), [id]);
    outlive_short_lease().await;
    assert!(claim(&*storage, "w1", 10, LEASE).await.is_empty());
    assert_eq!(
        storage.ack(&[id].into(), "w1").await.unwrap(),
        [] as [MessageId; 0],
        "twice"
    );
}

pub async fn empty_write_backs_are_noops(backend: &impl Backend) {
    let storage = backend.open(Setup::default()).await;
    assert!(storage.ack(&[].into(), "w1").await.unwrap().is_empty());
    assert!(storage
        .release(&[].into(), "w1", Duration::ZERO)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(storage.return_leases(&[].into(), "w1").await.unwrap(), 0);
    assert!(storage
        .extend_lease(&[].into(), "w1", LEASE)
        .await
        .unwrap()
        .ids
        .is_empty());
}

pub async fn nack_schedules_a_retry(backend: &impl Backend) {
    let storage = backend.open(Setup::default()).await;
    insert(&*storage, "t", "p", None).await;
    let got = claim(&*storage, "w1", 10, LEASE).await;
    let result = storage
        .nack(got[0].id, "w1", "boom", Some(FUTURE), &POLICY)
        .await
        .unwrap();
    let NackResult::Retried { retry_at, released } = result else {
        panic!("expected a retry, got {result:?}");
    };
    assert_about_from_now(retry_at, FUTURE);
    assert!(released.is_empty());
    assert!(claim(&*storage, "w1", 10, LEASE).await.is_empty());
    let stats = storage.stats().await.unwrap();
    assert_eq!((stats.total.pending, stats.total.leased), (1, 0));
}

pub async fn nack_without_delay_is_claimable_now_with_the_next_attempt(backend: &impl Backend) {
    let storage = backend.open(Setup::default()).await;
    let id = insert(&*storage, "t", "p", None).await;
    claim(&*storage, "w1", 10, LEASE).await;
    let result = storage
        .nack(id, "w1", "boom", Some(Duration::ZERO), &POLICY)
        .await
        .unwrap();
    assert!(matches!(result, NackResult::Retried { .. }), "{result:?}");
    let got = claim(&*storage, "w2", 10, LEASE).await;
    assert_eq!(ids(&got), [id]);
    assert_eq!(got[0].attempts, 2);
}

pub async fn release_refunds_the_attempt(backend: &impl Backend) {
    let storage = backend.open(Setup::default()).await;
    let a = insert(&*storage, "t", "a", None).await;
    let b = insert(&*storage, "t", "b", None).await;
    let got = claim(&*storage, "w1", 10, LEASE).await;
    assert!(got.iter().all(|m| m.attempts == 1));
    assert_eq!(
        storage.release(&[a, b].into(), "w1", FUTURE).await.unwrap(),
        [a, b]
    );
    assert!(claim(&*storage, "w2", 10, LEASE).await.is_empty());
    let stats = storage.stats().await.unwrap();
    assert_eq!((stats.total.pending, stats.total.leased), (2, 0));
}

pub async fn release_without_delay_is_claimable_with_the_same_attempt(backend: &impl Backend) {
    let storage = backend.open(Setup::default()).await;
    let a = insert(&*storage, "t", "a", None).await;
    claim(&*storage, "w1", 10, LEASE).await;
    assert_eq!(
        storage
            .release(&[a].into(), "w1", Duration::ZERO)
            .await
            .unwrap(),
        [a]
    );
    let got = claim(&*storage, "w2", 10, LEASE).await;
    assert_eq!(ids(&got), [a]);
    assert_eq!(got[0].attempts, 1);
}

pub async fn dead_letter_is_never_claimed_again(backend: &impl Backend) {
    let storage = backend.open(Setup::default()).await;
    let id = insert(&*storage, "t", "p", None).await;
    claim(&*storage, "w1", 10, SHORT_LEASE).await;
    assert!(storage.dead_letter(id, "w1", "gave up").await.unwrap());
    outlive_short_lease().await;
    assert!(claim(&*storage, "w1", 10, LEASE).await.is_empty());
    let stats = storage.stats().await.unwrap();
    assert_eq!((stats.total.pending, stats.total.dead), (0, 1));
}

/// `w1` claims with a short lease, which runs out; `w2` claims the row again.
async fn stolen_lease(storage: &dyn Storage) -> MessageId {
    let id = insert(storage, "t", "a", None).await;
    claim(storage, "w1", 10, SHORT_LEASE).await;
    assert_eq!(ids(&claim_eventually(storage, "w2", 10).await), [id]);
    id
}

pub async fn stale_ack_is_fenced(backend: &impl Backend) {
    let storage = backend.open(Setup::default()).await;
    let id = stolen_lease(&*storage).await;
    assert!(
        storage.ack(&[id].into(), "w1").await.unwrap().is_empty(),
        "w1 is late"
    );
    assert!(
        claim(&*storage, "w3", 10, LEASE).await.is_empty(),
        "still w2's"
    );
    storage
        .nack(id, "w2", "x", Some(Duration::ZERO), &POLICY)
        .await
        .unwrap();
    assert_eq!(
        ids(&claim(&*storage, "w3", 10, LEASE).await),
        [id],
        "still pending"
    );
}

pub async fn stale_nack_release_and_extension_are_fenced(backend: &impl Backend) {
    let storage = backend.open(Setup::default()).await;
    let id = stolen_lease(&*storage).await;
    let nacked = storage
        .nack(id, "w1", "late", Some(Duration::ZERO), &POLICY)
        .await;
    assert_eq!(nacked.unwrap(), NackResult::Fenced);
    assert!(storage
        .release(&[id].into(), "w1", Duration::ZERO)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(storage.return_leases(&[id].into(), "w1").await.unwrap(), 0);
    assert!(storage
        .extend_lease(&[id].into(), "w1", LEASE)
        .await
        .unwrap()
        .ids
        .is_empty());
    assert!(
        claim(&*storage, "w3", 10, LEASE).await.is_empty(),
        "w2 still holds it"
    );
}

pub async fn stale_dead_letter_is_fenced(backend: &impl Backend) {
    let storage = backend.open(Setup::default()).await;
    let id = stolen_lease(&*storage).await;
    assert!(!storage.dead_letter(id, "w1", "late").await.unwrap());
    storage
        .nack(id, "w2", "x", Some(Duration::ZERO), &POLICY)
        .await
        .unwrap();
    assert_eq!(ids(&claim(&*storage, "w3", 10, LEASE).await), [id]);
}

pub async fn strict_ordering_holds_back_successors_of_a_retrying_message(backend: &impl Backend) {
    let storage = backend.open(Setup::default()).await;
    let first = insert(&*storage, "t", "1", Some("k")).await;
    insert(&*storage, "t", "2", Some("k")).await;
    let other = insert(&*storage, "t", "x", Some("other")).await;
    assert_eq!(ids(&claim(&*storage, "w1", 1, LEASE).await), [first]);
    storage
        .nack(first, "w1", "boom", Some(FUTURE), &POLICY)
        .await
        .unwrap();
    assert_eq!(ids(&claim(&*storage, "w1", 10, LEASE).await), [other]);
}

/// `claim_ahead` may go on past the rows of a key its owner holds (PostgreSQL does; a
/// backend that does not claims as `claim` does), but never past a row another owner
/// holds or one waiting for its retry, never from the middle of a key, and never hands
/// out a row twice. Returns what it claimed, for the backends that must follow.
pub async fn claim_ahead_goes_on_only_past_the_owners_own_rows(
    backend: &impl Backend,
) -> Vec<MessageId> {
    let storage = backend.open(Setup::default()).await;
    let mut k = Vec::new();
    for i in 0..4 {
        k.push(insert(&*storage, "t", &format!("k{i}"), Some("k")).await);
    }
    let held = insert(&*storage, "t", "h0", Some("held")).await;
    let behind_held = insert(&*storage, "t", "h1", Some("held")).await;
    let retrying = insert(&*storage, "t", "r0", Some("retry")).await;
    let behind_retrying = insert(&*storage, "t", "r1", Some("retry")).await;
    let free = insert(&*storage, "t", "f", None).await;
    assert_eq!(ids(&claim(&*storage, "w1", 2, LEASE).await), k[..2]);
    assert_eq!(ids(&claim(&*storage, "w2", 1, LEASE).await), [held]);
    assert_eq!(ids(&claim(&*storage, "w3", 1, LEASE).await), [retrying]);
    storage
        .nack(retrying, "w3", "boom", Some(FUTURE), &POLICY)
        .await
        .unwrap();

    let storage = &*storage;
    let ahead = |owner, key: &str, last| {
        let held = HeldKeys {
            keys: vec![key.to_owned()],
            last_ids: vec![last],
        };
        async move {
            let claimed = storage.claim_ahead(request(owner), &held).await.unwrap();
            ids(&claimed.messages)
        }
    };
    let give_back = |owner, got: Vec<MessageId>| async move {
        storage
            .release(&got.into(), owner, Duration::ZERO)
            .await
            .unwrap();
    };
    // A row of w1 it does not know it holds (k1: as if the claim's answer was lost) is
    // not gone past.
    let got = ahead("w1", "k", k[0]).await;
    assert_eq!(got, [free], "nothing of k past a row w1 does not know of");
    give_back("w1", got).await;
    // w2 may go on past its own row of `held`, never into k.
    let got = ahead("w2", "held", held).await;
    assert!(got == [free] || got == [behind_held, free], "{got:?}");
    give_back("w2", got).await;
    let got = ahead("w1", "k", k[1]).await;
    let keyed: Vec<MessageId> = got.iter().copied().filter(|id| *id != free).collect();
    assert!(
        got.contains(&free) && !got.contains(&behind_retrying),
        "{got:?}"
    );
    assert!(keyed.is_empty() || keyed == k[2..], "{got:?}");
    assert!(
        ahead("w1", "k", k[3]).await.is_empty(),
        "nothing handed out twice"
    );
    got
}

pub async fn strict_ordering_holds_back_successors_of_a_leased_message(backend: &impl Backend) {
    let storage = backend.open(Setup::default()).await;
    insert(&*storage, "t", "1", Some("k")).await;
    insert(&*storage, "t", "2", Some("k")).await;
    let first = claim(&*storage, "w1", 1, LEASE).await;
    assert!(claim(&*storage, "w2", 10, LEASE).await.is_empty());
    storage.ack(&ids(&first).into(), "w1").await.unwrap();
    assert_eq!(payloads(&claim(&*storage, "w2", 10, LEASE).await), ["2"]);
}

/// Claimers on two instances race for one key, round after round: exactly one wins
/// each round, and the key comes out in order.
pub async fn strict_ordering_under_concurrent_claims_of_two_servers(backend: &impl Backend) {
    const ROUNDS: usize = 20;
    let servers = [
        backend.open(Setup::default()).await,
        backend.open(Setup::default()).await,
    ];
    for i in 0..ROUNDS {
        insert(&*servers[0], "t", &i.to_string(), Some("k")).await;
    }
    for round in 0..ROUNDS {
        let claimers = (0..4).map(|i| {
            let storage = servers[i % 2].clone();
            tokio::spawn(async move {
                let owner = format!("w{i}");
                let got = claim(&*storage, &owner, 1, LEASE).await;
                (owner, got)
            })
        });
        let mut winners = Vec::new();
        for claimer in futures::future::join_all(claimers).await {
            let (owner, got) = claimer.unwrap();
            if !got.is_empty() {
                winners.push((owner, got));
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: the key was split");
        let (owner, got) = &winners[0];
        assert_eq!(
            payloads(got),
            [round.to_string()],
            "round {round}: out of order"
        );
        assert_eq!(
            servers[0].ack(&ids(got).into(), owner).await.unwrap(),
            ids(got)
        );
    }
}

/// A claim restricted to some topics must not overtake an earlier row
/// of the same key in another topic.
pub async fn strict_ordering_is_kept_across_topic_filters(backend: &impl Backend) {
    let storage = backend.open(Setup::default()).await;
    let first = insert(&*storage, "t1", "1", Some("k")).await;
    let second = insert(&*storage, "t2", "2", Some("k")).await;
    let (t1, t2) = (["t1".to_owned()], ["t2".to_owned()]);
    assert!(claim_topics(&*storage, "w2", 10, LEASE, &t2)
        .await
        .is_empty());
    assert_eq!(
        ids(&claim_topics(&*storage, "w1", 10, LEASE, &t1).await),
        [first]
    );
    storage.ack(&[first].into(), "w1").await.unwrap();
    assert_eq!(
        ids(&claim_topics(&*storage, "w2", 10, LEASE, &t2).await),
        [second]
    );
}

pub async fn stats_count_per_topic(backend: &impl Backend) {
    let storage = backend.open(Setup::default()).await;
    assert_eq!(storage.stats().await.unwrap(), Stats::default());

    let a = insert(&*storage, "t", "a", None).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    insert(&*storage, "u", "b", None).await;
    let stats = storage.stats().await.unwrap();
    assert_eq!(
        (stats.total.pending, stats.total.leased, stats.total.dead),
        (2, 0, 0)
    );
    assert!(stats.total.oldest_pending_age.unwrap() >= Duration::from_millis(10));
    assert_eq!(
        stats
            .topics
            .iter()
            .map(|t| t.topic.as_str())
            .collect::<Vec<_>>(),
        ["t", "u"]
    );
    assert!(stats.topics[0].oldest_pending_age > stats.topics[1].oldest_pending_age);

    let claimed = claim(&*storage, "w1", 2, LEASE).await;
    assert_eq!(claimed.len(), 2);
    assert_eq!(storage.stats().await.unwrap().total.leased, 2);
    assert!(storage.dead_letter(a, "w1", "x").await.unwrap());
    let stats = storage.stats().await.unwrap();
    assert_eq!(
        (stats.total.pending, stats.total.leased, stats.total.dead),
        (1, 1, 1)
    );
    let t = TopicStats {
        topic: "t".into(),
        dead: 1,
        ..TopicStats::default()
    };
    assert_eq!(stats.topics[0], t);
    assert_eq!((stats.topics[1].pending, stats.topics[1].leased), (1, 1));
    assert!(stats.topics[1].oldest_pending_age.is_some());

    // Given back with a delay: still pending, held by nobody, not due: waiting.
    assert_eq!(stats.total.waiting, 0);
    let u_row = claimed.iter().find(|m| m.topic == "u").unwrap().id;
    assert_eq!(
        storage
            .release(&[u_row].into(), "w1", Duration::from_secs(3600))
            .await
            .unwrap(),
        [u_row]
    );
    let stats = storage.stats().await.unwrap();
    assert_eq!(
        (stats.total.pending, stats.total.leased, stats.total.waiting),
        (1, 0, 1)
    );
}

pub async fn nack_on_the_last_attempt_dead_letters_and_releases_successors(backend: &impl Backend) {
    let storage = backend.open(Setup::default()).await;
    let k1 = insert(&*storage, "t", "k1", Some("k")).await;
    let k2 = insert(&*storage, "t", "k2", Some("k")).await;
    let other = insert(&*storage, "t", "x", Some("other")).await;
    let k3 = insert(&*storage, "t", "k3", Some("k")).await;
    assert_eq!(claim(&*storage, "w1", 10, LEASE).await.len(), 4);

    let last_attempt = TestPolicy { max_attempts: 1 };
    let result = storage
        .nack(k1, "w1", "boom", None, &last_attempt)
        .await
        .unwrap();
    assert_eq!(
        result,
        NackResult::DeadLettered {
            released: vec![k2, k3]
        }
    );

    let got = claim(&*storage, "w2", 10, LEASE).await;
    assert_eq!(
        ids(&got),
        [k2, k3],
        "released now; the other key stays with w1"
    );
    assert!(got.iter().all(|m| m.attempts == 1), "released untried");
    assert_eq!(storage.ack(&[other].into(), "w1").await.unwrap(), [other]);
    assert_eq!(storage.stats().await.unwrap().total.dead, 1);
}

pub async fn nack_releases_successors_with_the_same_retry_time(backend: &impl Backend) {
    let storage = backend.open(Setup::default()).await;
    let k1 = insert(&*storage, "t", "k1", Some("k")).await;
    let k2 = insert(&*storage, "t", "k2", Some("k")).await;
    assert_eq!(claim(&*storage, "w1", 10, LEASE).await.len(), 2);

    let delay = Duration::from_millis(500);
    let result = storage
        .nack(k1, "w1", "boom", Some(delay), &POLICY)
        .await
        .unwrap();
    let NackResult::Retried { released, .. } = result else {
        panic!("expected a retry, got {result:?}");
    };
    assert_eq!(released, [k2]);
    assert!(
        claim(&*storage, "w2", 10, LEASE).await.is_empty(),
        "both wait for the retry"
    );

    let got = claim_eventually(&*storage, "w2", 10).await;
    assert_eq!(ids(&got), [k1, k2], "due together, in order");
    assert_eq!(got.iter().map(|m| m.attempts).collect::<Vec<_>>(), [2, 1]);
}

pub async fn extend_lease_keeps_a_row_leased(backend: &impl Backend) {
    let storage = backend.open(Setup::default()).await;
    let id = insert(&*storage, "t", "p", None).await;
    claim(&*storage, "w1", 10, SHORT_LEASE).await;
    let extended = storage
        .extend_lease(&[id].into(), "w1", LEASE)
        .await
        .unwrap();
    assert_eq!(extended.ids, [id]);
    assert_about_from_now(extended.lease_expires_at, LEASE);
    outlive_short_lease().await;
    assert!(claim(&*storage, "w2", 10, LEASE).await.is_empty());
    assert_eq!(storage.ack(&[id].into(), "w1").await.unwrap(), [id]);
}

pub async fn return_leases_makes_rows_claimable_with_the_attempt_kept(backend: &impl Backend) {
    let storage = backend.open(Setup::default()).await;
    let a = insert(&*storage, "t", "a", Some("k")).await;
    let b = insert(&*storage, "t", "b", Some("k")).await;
    claim(&*storage, "w1", 10, LEASE).await;
    assert_eq!(
        storage.return_leases(&[a, b].into(), "w1").await.unwrap(),
        2
    );
    let got = claim(&*storage, "w2", 10, LEASE).await;
    assert_eq!(ids(&got), [a, b]);
    assert!(
        got.iter().all(|m| m.attempts == 2),
        "the attempt stays burned"
    );
}

pub async fn purge_deletes_only_old_delivered_rows(backend: &impl Backend) {
    let storage = backend.open(Setup::default()).await;
    let mut rows = Vec::new();
    for name in ["a", "b", "c", "d", "e"] {
        rows.push(insert(&*storage, "t", name, None).await);
    }
    let [a, b, c, d, _pending] = rows[..] else {
        unreachable!()
    };
    claim(&*storage, "w1", 4, LEASE).await;
    storage.ack(&[a, b].into(), "w1").await.unwrap();
    assert!(storage.dead_letter(c, "w1", "x").await.unwrap());
    tokio::time::sleep(Duration::from_millis(600)).await;
    storage.ack(&[d].into(), "w1").await.unwrap();

    assert_eq!(storage.purge(FUTURE).await.unwrap(), 0);
    assert_eq!(
        storage.purge(Duration::from_millis(300)).await.unwrap(),
        2,
        "a and b"
    );
    assert_eq!(backend.row_count().await, 3);
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(storage.purge(Duration::ZERO).await.unwrap(), 1, "d");
    assert_eq!(backend.row_count().await, 2, "dead and pending rows stay");
}

pub async fn delete_on_ack_deletes(backend: &impl Backend) {
    let storage = backend
        .open(Setup {
            delete_on_ack: true,
            ..Setup::default()
        })
        .await;
    let a = insert(&*storage, "t", "a", None).await;
    let b = insert(&*storage, "t", "b", None).await;
    claim(&*storage, "w1", 10, LEASE).await;
    assert!(
        storage.ack(&[a].into(), "w2").await.unwrap().is_empty(),
        "fenced"
    );
    assert_eq!(storage.ack(&[a, b].into(), "w1").await.unwrap(), [a, b]);
    assert_eq!(backend.row_count().await, 0);
    assert_eq!(storage.purge(Duration::ZERO).await.unwrap(), 0);
}

pub async fn visibility_delay_hides_fresh_rows(backend: &impl Backend) {
    let delay = Duration::from_millis(600);
    let storage = backend
        .open(Setup {
            visibility_delay: delay,
            ..Setup::default()
        })
        .await;
    let start = Instant::now();
    let id = insert(&*storage, "t", "p", Some("k")).await;
    assert!(claim(&*storage, "w1", 10, LEASE).await.is_empty());
    assert_eq!(ids(&claim_eventually(&*storage, "w1", 10).await), [id]);
    assert!(
        start.elapsed() >= delay - Duration::from_millis(100),
        "{:?}",
        start.elapsed()
    );
}

pub async fn topic_filter(backend: &impl Backend) {
    let storage = backend.open(Setup::default()).await;
    let a = insert(&*storage, "t1", "a", None).await;
    let b = insert(&*storage, "t2", "b", None).await;
    let c = insert(&*storage, "t1", "c", None).await;
    let only_t2 = ["t2".to_owned()];
    assert_eq!(
        ids(&claim_topics(&*storage, "w1", 10, LEASE, &only_t2).await),
        [b]
    );
    let t1_t3 = ["t1".to_owned(), "t3".to_owned()];
    assert_eq!(
        ids(&claim_topics(&*storage, "w1", 10, LEASE, &t1_t3).await),
        [a, c]
    );
}

pub async fn headers_round_trip(backend: &impl Backend) {
    let storage = backend.open(Setup::default()).await;
    let mut message = NewMessage::new("t", vec![0u8, 159, 146, 150]).with_key("k");
    message
        .headers
        .insert("traceparent".into(), "00-abc-def-01".into());
    message
        .headers
        .insert("content-type".into(), "application/octet-stream".into());
    storage.insert(message.clone()).await.unwrap();
    let got = claim(&*storage, "w1", 10, LEASE).await;
    assert_eq!(got[0].payload, message.payload);
    assert_eq!(got[0].headers, message.headers);
}
