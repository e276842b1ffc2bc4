//! The contract's cases of errors, insert signals, races with late answers, batches of
//! nacks, answers with repeated and unsorted ids, and teams' own tables; see `cases.rs`.

use txoutbox_server::storage::{NackRequest, NackResult, SortedIds, StorageError};

use super::*;

pub async fn missing_table_is_reported(backend: &impl Backend) {
    let storage = backend.missing_table().await;
    for result in [
        storage.verify_table().await.map(drop),
        storage.claim(request("w")).await.map(drop),
        storage.insert(NewMessage::new("t", "p")).await.map(drop),
    ] {
        let err = result.unwrap_err();
        assert!(matches!(err, StorageError::MissingTable { .. }), "{err:?}");
        assert!(
            err.to_string().contains("no_such_table"),
            "names the table: {err}"
        );
    }
}

pub async fn unreachable_database_is_reported(backend: &impl Backend) {
    let storage = backend.unreachable().await;
    let start = Instant::now();
    for result in [
        storage.verify_table().await.map(drop),
        storage.claim(request("w")).await.map(drop),
        storage.ack(&[1].into(), "w").await.map(drop),
    ] {
        let err = result.unwrap_err();
        assert!(matches!(err, StorageError::Unavailable(_)), "{err:?}");
    }
    assert!(
        start.elapsed() < DEADLINE * 2,
        "reported quickly: {:?}",
        start.elapsed()
    );
}

pub async fn insert_signal_bumps_on_insert(backend: &impl Backend) {
    let storage = backend
        .open(Setup {
            notify: true,
            ..Setup::default()
        })
        .await;
    let settle = Duration::from_millis(100);
    let Some(mut signal) = listening_signal(backend, &*storage, settle).await else {
        return; // The backend cannot tell: callers poll.
    };
    let seen = signal.borrow().seq();
    insert(&*storage, "t", "p", None).await;
    next_signal(&mut signal).await;
    // It says which topic, so only the streams filtering on it claim.
    let inserts = signal.borrow_and_update().clone();
    assert!(inserts.since(seen, &["t".to_owned()]));
    assert!(inserts.since(seen, &[]), "no filter matches every topic");
    assert!(!inserts.since(seen, &["users".to_owned()]), "{inserts:?}");
    // A storage on the same table, without notify, still wakes the listener.
    let quiet = backend.open(Setup::default()).await;
    insert(&*quiet, "t", "p", None).await;
    next_signal(&mut signal).await;
}

pub async fn insert_signal_waits_for_visibility(backend: &impl Backend) {
    let delay = Duration::from_millis(500);
    let setup = Setup {
        notify: true,
        visibility_delay: delay,
        ..Setup::default()
    };
    let storage = backend.open(setup).await;
    // Connecting wakes at once and again when rows inserted meanwhile are visible.
    let Some(mut signal) = listening_signal(backend, &*storage, delay * 2).await else {
        return;
    };

    let start = Instant::now();
    let id = insert(&*storage, "t", "p", None).await;
    next_signal(&mut signal).await;
    assert!(
        start.elapsed() >= delay,
        "woken before visible: {:?}",
        start.elapsed()
    );
    assert_eq!(
        ids(&claim(&*storage, "w1", 10, LEASE).await),
        [id],
        "claimable once woken"
    );
}

pub async fn insert_signal_ends_with_the_storage(backend: &impl Backend) {
    let storage = backend
        .open(Setup {
            notify: true,
            ..Setup::default()
        })
        .await;
    let Some(mut signal) = storage.insert_signal() else {
        return;
    };
    drop(storage);
    let ended = async { while signal.changed().await.is_ok() {} };
    tokio::time::timeout(DEADLINE, ended)
        .await
        .expect("the listener outlived its storage");
}

/// A nack (or an extension) sent just before its lease ran out, applied while another
/// worker's claim runs just after: the claim may see the row claimable, then find it
/// waiting for its retry once it reaches it. It must then hand out none of the key's
/// later rows, or they would be published before the row they follow.
pub async fn a_claim_racing_a_late_nack_hands_out_no_later_row_of_the_key(backend: &impl Backend) {
    let storage = backend.open(Setup::default()).await;
    let other_server = backend.open(Setup::default()).await;
    let first = insert(&*storage, "t", "n", Some("k")).await;
    let second = insert(&*storage, "t", "n+1", Some("k")).await;
    assert_eq!(
        ids(&claim(&*storage, "w1", 10, SHORT_LEASE).await),
        [first, second]
    );
    outlive_short_lease().await;

    let late_nack = backend.open_late_nack(first).await;
    let claiming = tokio::spawn(async move { ids(&claim(&*other_server, "w2", 10, LEASE).await) });
    let start = Instant::now();
    while !claiming.is_finished() && !late_nack.blocks_someone().await {
        assert!(
            start.elapsed() < DEADLINE,
            "the claim neither ended nor waited"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    late_nack.commit().await;
    let got = claiming.await.unwrap();
    assert!(
        !got.contains(&second),
        "row n+1 handed out while row n waits for its retry: {got:?}"
    );
}

/// After its lease ran out, an answer that would keep a row from being claimed (a nack, a
/// lease extension, a release with a delay) is fenced: another claim may be taking the
/// row. An ack, a dead-letter or an immediate release still land: the first two settle
/// the row (it was published, or is given up), the last makes it claimable, as the lapsed
/// lease did already.
pub async fn answers_that_delay_a_row_need_a_live_lease(backend: &impl Backend) {
    let storage = backend.open(Setup::default()).await;
    let mut rows = Vec::new();
    for i in 0..6 {
        rows.push(insert(&*storage, "t", &format!("p{i}"), None).await);
    }
    assert_eq!(ids(&claim(&*storage, "w1", 10, SHORT_LEASE).await), rows);
    outlive_short_lease().await;
    let [nacked, extended, delayed, released, acked, dead] = rows[..] else {
        unreachable!()
    };

    let nack = storage.nack(nacked, "w1", "late", None, &POLICY).await;
    assert_eq!(nack.unwrap(), NackResult::Fenced, "late nack");
    let extension = storage.extend_lease(&[extended].into(), "w1", LEASE).await;
    assert!(extension.unwrap().ids.is_empty(), "late extension");
    let release = storage.release(&[delayed].into(), "w1", FUTURE).await;
    assert!(release.unwrap().is_empty(), "late delayed release");

    let release = storage
        .release(&[released].into(), "w1", Duration::ZERO)
        .await;
    assert_eq!(release.unwrap(), [released], "late immediate release");
    assert_eq!(
        storage.ack(&[acked].into(), "w1").await.unwrap(),
        [acked],
        "late ack"
    );
    assert!(storage.dead_letter(dead, "w1", "late").await.unwrap());

    let again = ids(&claim(&*storage, "w2", 10, LEASE).await);
    assert_eq!(again, [nacked, extended, delayed, released]);
}

/// A row whose holders never answer (they die, or let the lease run out) is claimed at
/// most `max_attempts` times: the claim after that dead-letters it, saying why, and the
/// later rows of its key go on.
pub async fn a_row_claimed_max_attempts_times_is_dead_lettered_by_the_next_claim(
    backend: &impl Backend,
) {
    let storage = backend.open(Setup::default()).await;
    let poison = insert(&*storage, "t", "poison", Some("k")).await;
    let next = insert(&*storage, "t", "next", Some("k")).await;
    for attempt in 1..=POLICY.max_attempts {
        let got = claim(&*storage, "w1", 1, SHORT_LEASE).await;
        assert_eq!(ids(&got), [poison], "attempt {attempt}");
        assert_eq!(got[0].attempts, attempt);
        outlive_short_lease().await;
    }
    let claimed = storage.claim(request("w2")).await.unwrap();
    assert_eq!(ids(&claimed.messages), [next]);
    assert_eq!(claimed.exhausted, [poison]);
    assert_eq!(storage.stats().await.unwrap().total.dead, 1);
    let error = backend.last_error(poison).await.unwrap_or_default();
    assert!(error.contains("max_attempts"), "{error}");
}

/// A batch of nacks in one call has the outcomes of the same nacks sent one by one: a
/// later row of a key already nacked in the batch was given back by that nack (fenced
/// here), an earlier one still applies, a row named twice is nacked once, a row not held
/// is fenced, and the last attempt dead-letters.
pub async fn a_batch_of_nacks_does_what_the_nacks_would_one_by_one(backend: &impl Backend) {
    let storage = backend
        .open(Setup {
            strict_ordering: false,
            ..Setup::default()
        })
        .await;
    // `spent` is claimed (and given back) until its next claim is its last attempt.
    let spent = insert(&*storage, "t", "spent", Some("j")).await;
    for _ in 1..POLICY.max_attempts {
        assert_eq!(ids(&claim(&*storage, "w0", 1, LEASE).await), [spent]);
        assert_eq!(
            storage.return_leases(&[spent].into(), "w0").await.unwrap(),
            1
        );
    }
    let mut k = Vec::new();
    for i in 0..3 {
        k.push(insert(&*storage, "t", &format!("k{i}"), Some("k")).await);
    }
    let lone = insert(&*storage, "t", "lone", None).await;
    assert_eq!(claim(&*storage, "w1", 10, LEASE).await.len(), 5);

    let nack = |id, delay_ms| NackRequest {
        id,
        error: "boom",
        requested_delay: Some(Duration::from_millis(delay_ms)),
    };
    let batch = [
        nack(k[1], 60_000),
        nack(k[2], 60_000),
        nack(k[0], 30_000),
        nack(lone, 60_000),
        nack(lone, 60_000),
        nack(spent, 60_000),
        nack(123_456_789, 60_000),
    ];
    let results = storage.nack_many(&batch, "w1", &POLICY).await.unwrap();
    assert_eq!(results.len(), batch.len());
    let NackResult::Retried { released, .. } = &results[0] else {
        panic!("k1: {:?}", results[0]);
    };
    assert_eq!(released, &[k[2]], "k1 gives back k2");
    assert_eq!(
        results[1],
        NackResult::Fenced,
        "k2 was given back by k1's nack"
    );
    let NackResult::Retried { released, .. } = &results[2] else {
        panic!("k0: {:?}", results[2]);
    };
    assert!(released.is_empty(), "k1 and k2 are no longer held");
    assert!(matches!(results[3], NackResult::Retried { .. }), "lone");
    assert_eq!(results[4], NackResult::Fenced, "lone, twice");
    assert_eq!(
        results[5],
        NackResult::DeadLettered { released: vec![] },
        "spent, on its last attempt"
    );
    assert_eq!(results[6], NackResult::Fenced, "never held");
    let stats = storage.stats().await.unwrap().total;
    assert_eq!((stats.pending, stats.leased, stats.dead), (4, 0, 1));
}

/// A team's own table with one topic for every row, a JSON payload and no headers: what
/// the storage and a producer's own SQL insert is relayed, and what the table cannot hold
/// is refused (see [`fixed_topic_json_table_holds_two_invoices`]).
pub async fn a_fixed_topic_json_table_without_headers_round_trips(backend: &impl Backend) {
    let mapping = ColumnMapping {
        fixed_topic: Some("invoices".into()),
        key: "invoice".into(),
        payload: "document".into(),
        payload_format: PayloadFormat::Json,
        headers: String::new(),
        created_at: "logged_at".into(),
        ..ColumnMapping::default()
    };
    let storage = backend.own_table(TeamTable::InvoiceEvents, mapping).await;
    let schema = storage.schema_sql();
    assert!(
        !schema.contains("topic") && !schema.contains("headers"),
        "{schema}"
    );

    let first = storage
        .insert(NewMessage::new("invoices", r#"{"total": 12}"#).with_key("inv-1"))
        .await
        .unwrap();
    // The producer's own insert: message columns only, the relay's from their defaults.
    backend
        .produce(r#"INSERT INTO {db}.invoice_events (invoice, document) VALUES ('inv-2', '["x"]')"#)
        .await;

    fixed_topic_json_table_holds_two_invoices(&*storage, first).await;
}

/// A text payload is handed out as its UTF-8 bytes; bytes that are not UTF-8 are refused
/// with the key to change.
pub async fn a_text_payload_is_handed_out_as_its_utf8_bytes(backend: &impl Backend) {
    let mapping = ColumnMapping {
        payload: "note".into(),
        payload_format: PayloadFormat::Text,
        ..ColumnMapping::default()
    };
    let storage = backend.own_table(TeamTable::Notes, mapping).await;
    let mut message = NewMessage::new("t", "grüße");
    message.headers.insert("lang".into(), "de".into());
    storage.insert(message.clone()).await.unwrap();
    let got = claim(&*storage, "w1", 10, LEASE).await;
    assert_eq!(got[0].payload, "grüße".as_bytes());
    assert_eq!(got[0].headers, message.headers);
    let err = storage
        .insert(NewMessage::new("t", vec![0xff, 0xfe]))
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("payload_format = \"text\""),
        "{err}"
    );
}

/// A NULL in a nullable headers column (a producer that sets none) means no headers.
pub async fn a_null_in_a_nullable_headers_column_means_no_headers(backend: &impl Backend) {
    let mapping = ColumnMapping {
        payload: "note".into(),
        payload_format: PayloadFormat::Text,
        ..ColumnMapping::default()
    };
    let storage = backend.own_table(TeamTable::Notes, mapping).await;
    backend
        .produce("INSERT INTO {db}.notes (topic, note) VALUES ('t', 'no headers')")
        .await;
    let got = claim(&*storage, "w1", 10, LEASE).await;
    assert_eq!(got.len(), 1);
    assert!(got[0].headers.is_empty());
}

/// Answers may name their ids in any order and more than once (a client's retried
/// batch, answers merged): each row is changed once, and the ids an answer applied come
/// back sorted, each once, whatever the backend.
pub async fn answers_with_repeated_and_unsorted_ids_apply_once_and_reply_sorted(
    backend: &impl Backend,
) {
    let storage = backend.open(Setup::default()).await;
    let mut rows = Vec::new();
    for i in 0..6 {
        rows.push(insert(&*storage, "t", &format!("p{i}"), None).await);
    }
    let [a, b, c, d, e, f] = rows[..] else {
        unreachable!()
    };
    // Claimed twice, so that a release applied twice would refund two attempts.
    assert_eq!(claim(&*storage, "w0", 10, SHORT_LEASE).await.len(), 6);
    let mut held = Vec::new();
    while held.len() < rows.len() {
        held.extend(claim_eventually(&*storage, "w1", 10).await);
    }
    assert_eq!(ids(&held), rows);
    assert!(held.iter().all(|m| m.attempts == 2), "{held:?}");

    let extended = storage
        .extend_lease(&[c, a, c, b, a].into(), "w1", LEASE)
        .await
        .unwrap();
    assert_eq!(extended.ids, [a, b, c], "extend");
    assert_eq!(
        storage.ack(&[b, a, b, a].into(), "w1").await.unwrap(),
        [a, b],
        "ack"
    );
    assert_eq!(
        storage
            .release(&[e, d, e, d].into(), "w1", Duration::ZERO)
            .await
            .unwrap(),
        [d, e],
        "release"
    );
    let nack = |id, error| NackRequest {
        id,
        error,
        requested_delay: Some(FUTURE),
    };
    let results = storage
        .nack_many(
            &[nack(f, "first"), nack(c, "c"), nack(f, "again")],
            "w1",
            &POLICY,
        )
        .await
        .unwrap();
    assert!(
        matches!(&results[0], NackResult::Retried { released, .. } if released.is_empty()),
        "{results:?}"
    );
    assert!(
        matches!(results[1], NackResult::Retried { .. }),
        "{results:?}"
    );
    assert_eq!(results[2], NackResult::Fenced, "f, twice");
    assert_eq!(backend.last_error(f).await.as_deref(), Some("first"));

    // Released once: the attempt refunded once, so this claim is the second again.
    let got = claim(&*storage, "w2", 10, LEASE).await;
    assert_eq!(ids(&got), [d, e], "c and f wait for their retry");
    assert!(got.iter().all(|m| m.attempts == 2), "{got:?}");
    let stats = storage.stats().await.unwrap().total;
    assert_eq!(
        (stats.leased, stats.waiting, stats.dead),
        (2, 2, 0),
        "{stats:?}"
    );
}

/// A row over `max_row_bytes` (payload, headers, topic and key as stored, measured by the
/// database) is claimed and listed without its payload and headers, with its stored size;
/// the rows that fit come whole. The mapped tables measure their text and JSON payloads
/// the same way.
pub async fn a_row_over_max_row_bytes_is_read_without_its_payload(backend: &impl Backend) {
    let storage = backend
        .open(Setup {
            max_row_bytes: 1_000,
            ..Setup::default()
        })
        .await;
    let small = insert(&*storage, "t", "small", Some("k")).await;
    let mut large = NewMessage::new("t", "x".repeat(2_000));
    large.headers.insert("h".into(), "v".into());
    let large = storage.insert(large).await.unwrap();
    let claimed = storage.claim(request("w")).await.unwrap().messages;
    assert_eq!(ids(&claimed), [small, large]);
    assert_eq!(claimed[0].payload, b"small");
    assert_eq!(claimed[0].too_large, None);
    let oversized = &claimed[1];
    assert!(oversized.payload.is_empty() && oversized.headers.is_empty());
    let stored = oversized.too_large.expect("the row's stored size");
    assert!(
        (2_000 + 1..2_100).contains(&stored),
        "payload, headers and topic: {stored}"
    );
    assert_eq!(oversized.attempts, 1);

    assert!(storage.dead_letter(large, "w", "too large").await.unwrap());
    let dead = storage.list_dead(&Default::default(), 0, 10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].message.too_large, Some(stored));
    assert!(dead[0].message.payload.is_empty());
}

/// `held_attempts` names the rows an owner holds with the attempt of its delivery: what
/// answers with lease tokens compare their tokens with. A lease run out still counts as
/// held until someone claims the row again, which moves the attempt on.
pub async fn held_attempts_are_those_of_the_owners_current_deliveries(backend: &impl Backend) {
    let storage = backend.open(Setup::default()).await;
    let a = insert(&*storage, "t", "a", Some("ka")).await;
    let b = insert(&*storage, "t", "b", Some("kb")).await;
    let claimed = claim(&*storage, "w1", 10, SHORT_LEASE).await;
    assert_eq!(ids(&claimed), [a, b]);
    let both: SortedIds = [a, b].into();
    assert_eq!(
        storage.held_attempts(&both, "w1").await.unwrap(),
        [(a, 1), (b, 1)]
    );
    assert!(storage.held_attempts(&both, "w2").await.unwrap().is_empty());
    assert!(storage
        .held_attempts(&SortedIds::default(), "w1")
        .await
        .unwrap()
        .is_empty());
    storage.ack(&[b].into(), "w1").await.unwrap();
    outlive_short_lease().await;
    assert_eq!(
        storage.held_attempts(&both, "w1").await.unwrap(),
        [(a, 1)],
        "an expired lease, not claimed again"
    );
    assert_eq!(ids(&claim(&*storage, "w1", 10, LEASE).await), [a]);
    assert_eq!(storage.held_attempts(&both, "w1").await.unwrap(), [(a, 2)]);
}
