//! The cases of the group-store contract, each generic over the backend (see the crate's
//! docs). Every case stands alone on a fresh table.

use txoutbox_server::storage::groups::{SeekOutcome, SeekTarget};
use txoutbox_server::storage::{HeadState, StorageError};

use super::*;

use GroupStart::{Now, Oldest};

/// A partition's view without its lease's expiry, which time changes.
fn placed(view: &PartitionView) -> (u32, Option<String>, i64, Position) {
    (
        view.partition,
        view.owner.clone(),
        view.epoch,
        view.position,
    )
}

async fn placed_all(store: &Store, group: &str) -> Vec<(u32, Option<String>, i64, Position)> {
    views(store, group).await.iter().map(placed).collect()
}

fn minutes(n: i64) -> chrono::Duration {
    chrono::Duration::minutes(n)
}

// -- ensure ------------------------------------------------------------------------------

pub async fn a_group_starts_at_its_start_and_ensuring_again_changes_nothing(
    backend: &impl GroupBackend,
) {
    let ids = produce_keys(backend, &["a", "b", "c"]).await;
    let store = ready(backend, &[("g", Oldest)]).await;
    assert_eq!(
        placed_all(&store, "g").await,
        (0..PARTITIONS)
            .map(|p| (p, None, 0, Position::START))
            .collect::<Vec<_>>(),
        "a new group's partitions: free, epoch 0, at the start"
    );
    let rows = readable(&store, &every_partition(Position::START), 3).await;
    assert_eq!(sorted(ids_of(&rows)), ids);

    // A member settles the first row of its partition.
    let first = rows.iter().find(|r| r.message.id == ids[0]).unwrap();
    let lease = take(&store, "g", "m", first.partition).await;
    let lost = store
        .flush(
            "g",
            "m",
            &[Flush {
                position: Some(first.position),
                ..flush(&lease)
            }],
        )
        .await
        .unwrap();
    assert!(lost.is_empty());
    let settled = placed_all(&store, "g").await;

    // The server starts again, and another replica with it: nothing moves.
    store
        .ensure(&groups(&[("g", Oldest)]), PARTITIONS, true)
        .await
        .unwrap();
    let replica = backend.store(PARTITIONS).await;
    replica
        .ensure(&groups(&[("g", Now)]), PARTITIONS, true)
        .await
        .unwrap();
    assert_eq!(placed_all(&replica, "g").await, settled);
    assert_eq!(ahead(&replica, "g", 2).await, ids[1..]);
}

pub async fn a_group_added_later_starts_at_its_own_start(backend: &impl GroupBackend) {
    let store = ready(backend, &[("first", Oldest)]).await;
    let old = produce_keys(backend, &["a", "b", "c"]).await;
    // Committed and past the frontier before the new groups are created.
    readable(&store, &every_partition(Position::START), 3).await;

    let restarted = backend.store(PARTITIONS).await;
    restarted
        .ensure(
            &groups(&[("first", Oldest), ("tail", Now), ("replay", Oldest)]),
            PARTITIONS,
            true,
        )
        .await
        .unwrap();
    assert!(
        ahead(&restarted, "tail", 0).await.is_empty(),
        "start = now skips what was committed"
    );
    assert_eq!(ahead(&restarted, "replay", 3).await, old);

    let new = backend.produce(Some("a"), "new", 0).await;
    assert_eq!(ahead(&restarted, "tail", 1).await, [new]);
    let mut all = old.clone();
    all.push(new);
    assert_eq!(ahead(&restarted, "first", 4).await, all);
    assert_eq!(ahead(&restarted, "replay", 4).await, all);
}

pub async fn a_partition_count_other_than_the_groups_were_created_with_is_refused(
    backend: &impl GroupBackend,
) {
    let store = ready(backend, &[("g", Oldest)]).await;
    let more = backend.store(PARTITIONS * 2).await;
    for names in [&[("g", Oldest)][..], &[("g", Oldest), ("new", Oldest)][..]] {
        match more.ensure(&groups(names), PARTITIONS * 2, true).await {
            Err(StorageError::MismatchedTable { problems, .. }) => {
                let text = problems.join("\n");
                assert!(
                    text.contains(&format!("partitions = {PARTITIONS}")),
                    "{text}"
                );
            }
            other => panic!("a changed partition count must be refused: {other:?}"),
        }
    }
    assert!(
        store.seek("new", SeekTarget::Oldest, true).await.is_err(),
        "a refused start created a group"
    );
    assert_eq!(views(&store, "g").await.len(), PARTITIONS as usize);
}

pub async fn without_create_ensure_needs_the_printed_schema(backend: &impl GroupBackend) {
    let store = backend.store(PARTITIONS).await;
    let missing = store
        .ensure(&groups(&[("g", Oldest)]), PARTITIONS, false)
        .await;
    match &missing {
        Err(StorageError::MismatchedTable { problems, .. }) => {
            let text = problems.join("\n");
            assert!(text.contains("txoutboxd schema"), "{text}");
        }
        other => panic!("missing group tables must be reported as such: {other:?}"),
    }

    // What `txoutboxd schema` prints, run by an operator, is what ensure checks for.
    backend.run(&store.schema_sql()).await;
    store
        .ensure(&groups(&[("g", Oldest)]), PARTITIONS, false)
        .await
        .expect("the printed schema is enough");
    let id = backend.produce(Some("a"), "after", 0).await;
    assert_eq!(ahead(&store, "g", 1).await, [id]);
}

// -- membership and leases ---------------------------------------------------------------

pub async fn heartbeats_list_the_live_members_sorted_and_every_partition(
    backend: &impl GroupBackend,
) {
    let store = ready(backend, &[("g", Oldest), ("h", Oldest)]).await;
    let beat = store.heartbeat("g", "m2", LEASE).await.unwrap();
    assert_eq!(beat.members, ["m2"]);
    let beat = store.heartbeat("g", "m1", LEASE).await.unwrap();
    assert_eq!(beat.members, ["m1", "m2"]);
    assert_eq!(
        beat.partitions.iter().map(placed).collect::<Vec<_>>(),
        (0..PARTITIONS)
            .map(|p| (p, None, 0, Position::START))
            .collect::<Vec<_>>()
    );

    let lease = take(&store, "g", "m1", 2).await;
    let replica = backend.store(PARTITIONS).await;
    let beat = replica.heartbeat("g", "m2", LEASE).await.unwrap();
    let two = &beat.partitions[2];
    assert_eq!(
        (two.owner.as_deref(), two.epoch, two.expired),
        (Some("m1"), lease.epoch, false)
    );
    assert_eq!(store.stats("g", false).await.unwrap().members, 2);

    // Groups are apart.
    assert_eq!(
        store.heartbeat("h", "x", LEASE).await.unwrap().members,
        ["x"]
    );
    assert!(views(&store, "h").await.iter().all(|v| v.owner.is_none()));
}

pub async fn a_member_whose_heartbeat_ran_out_is_no_longer_listed(backend: &impl GroupBackend) {
    let store = ready(backend, &[("g", Oldest)]).await;
    store.heartbeat("g", "gone", BRIEF_LEASE).await.unwrap();
    let beat = store.heartbeat("g", "stays", LEASE).await.unwrap();
    assert_eq!(beat.members, ["gone", "stays"]);
    until(
        "the lapsed member left the list",
        || store.heartbeat("g", "stays", LEASE),
        |beat| beat.as_ref().unwrap().members == ["stays"],
    )
    .await
    .unwrap();
    assert_eq!(store.stats("g", false).await.unwrap().members, 1);
    let beat = store.heartbeat("g", "gone", LEASE).await.unwrap();
    assert_eq!(
        beat.members,
        ["gone", "stays"],
        "a heartbeat brings it back"
    );
}

pub async fn a_free_partition_is_taken_once_with_a_new_epoch(backend: &impl GroupBackend) {
    let store = ready(backend, &[("g", Oldest), ("h", Oldest)]).await;
    let replica = backend.store(PARTITIONS).await;
    let lease = take(&store, "g", "a", 1).await;
    assert_eq!(
        lease,
        PartitionLease {
            partition: 1,
            epoch: 1,
            position: Position::START
        }
    );
    for (store, member) in [(&store, "b"), (&replica, "b"), (&replica, "a")] {
        let again = store.acquire("g", member, 1, LEASE).await.unwrap();
        assert_eq!(again, None, "{member} took a partition owned by a");
    }
    let one = view(&store, "g", 1).await;
    assert_eq!(
        (one.owner.as_deref(), one.epoch, one.expired),
        (Some("a"), 1, false)
    );
    // Epochs are per partition and per group.
    assert_eq!(take(&replica, "g", "b", 2).await.epoch, 1);
    assert_eq!(take(&replica, "h", "b", 1).await.epoch, 1);
}

pub async fn a_partition_whose_lease_ran_out_is_taken_again_and_its_old_epoch_fenced(
    backend: &impl GroupBackend,
) {
    let store = ready(backend, &[("g", Oldest)]).await;
    produce_keys(backend, &["a", "a"]).await;
    let rows = readable(&store, &every_partition(Position::START), 2).await;
    let (p, rows) = fullest_partition(&rows);

    let old = store
        .acquire("g", "a", p, SHORT_LEASE)
        .await
        .unwrap()
        .unwrap();
    until(
        "the lease ran out",
        || view(&store, "g", p),
        |view| view.expired,
    )
    .await;
    store.heartbeat("g", "a", LEASE).await.unwrap();
    assert!(
        view(&store, "g", p).await.expired,
        "a heartbeat renewed a lease that had run out"
    );
    let new = take(&store, "g", "b", p).await;
    assert_eq!(new.epoch, old.epoch + 1);

    let stale = Flush {
        position: Some(rows[0].position),
        upserts: vec![state(&rows[0], StateKind::Retry)],
        ..flush(&old)
    };
    let lost = store
        .flush("g", "a", std::slice::from_ref(&stale))
        .await
        .unwrap();
    assert_eq!(lost, [p]);
    assert_eq!(view(&store, "g", p).await.position, Position::START);
    assert!(store.load_state("g", p).await.unwrap().is_empty());

    // Taken back by its old owner, the old epoch stays fenced.
    store.release("g", "b", &[p]).await.unwrap();
    let again = take(&store, "g", "a", p).await;
    assert_eq!(again.epoch, old.epoch + 2);
    assert_eq!(store.flush("g", "a", &[stale]).await.unwrap(), [p]);
    assert_eq!(view(&store, "g", p).await.position, Position::START);
}

pub async fn heartbeats_renew_the_leases_of_the_members_own_partitions(
    backend: &impl GroupBackend,
) {
    let store = ready(backend, &[("g", Oldest)]).await;
    // b's lease runs out after a's would have.
    store
        .acquire("g", "a", 0, BRIEF_LEASE)
        .await
        .unwrap()
        .unwrap();
    store
        .acquire("g", "b", 1, BRIEF_LEASE)
        .await
        .unwrap()
        .unwrap();
    let beat = store.heartbeat("g", "a", LEASE).await.unwrap();
    assert!(!beat.partitions[0].expired);
    until(
        "b's lease ran out",
        || view(&store, "g", 1),
        |view| view.expired,
    )
    .await;
    let zero = view(&store, "g", 0).await;
    assert_eq!((zero.owner.as_deref(), zero.expired), (Some("a"), false));
    assert_eq!(store.acquire("g", "c", 0, LEASE).await.unwrap(), None);
    assert!(store.acquire("g", "c", 1, LEASE).await.unwrap().is_some());
}

pub async fn release_gives_back_only_the_named_partitions_of_that_member(
    backend: &impl GroupBackend,
) {
    let store = ready(backend, &[("g", Oldest)]).await;
    let mut leases = Vec::new();
    for partition in 0..3 {
        leases.push(take(&store, "g", "a", partition).await);
    }
    take(&store, "g", "b", 3).await;
    let owners = |views: Vec<PartitionView>| -> Vec<Option<String>> {
        views.into_iter().map(|v| v.owner).collect()
    };
    let (a, b) = (Some("a".to_owned()), Some("b".to_owned()));

    store.release("g", "b", &[0, 1]).await.unwrap();
    assert_eq!(
        owners(views(&store, "g").await),
        [a.clone(), a.clone(), a.clone(), b.clone()]
    );
    store.release("g", "a", &[1]).await.unwrap();
    assert_eq!(
        owners(views(&store, "g").await),
        [a.clone(), None, a.clone(), b.clone()]
    );
    let given_back = Flush {
        position: Some(Position { txid: 0, id: 1 }),
        ..flush(&leases[1])
    };
    assert_eq!(store.flush("g", "a", &[given_back]).await.unwrap(), [1]);
    assert_eq!(view(&store, "g", 1).await.position, Position::START);
    assert_eq!(take(&store, "g", "c", 1).await.epoch, leases[1].epoch + 1);

    store.release("g", "a", &[]).await.unwrap();
    assert_eq!(
        owners(views(&store, "g").await),
        [None, Some("c".to_owned()), None, b]
    );
}

pub async fn leave_frees_the_members_partitions_at_once_and_forgets_it(
    backend: &impl GroupBackend,
) {
    let store = ready(backend, &[("g", Oldest)]).await;
    store.heartbeat("g", "a", LEASE).await.unwrap();
    store.heartbeat("g", "b", LEASE).await.unwrap();
    let zero = take(&store, "g", "a", 0).await;
    take(&store, "g", "a", 1).await;
    take(&store, "g", "b", 2).await;

    store.leave("g", "a").await.unwrap();
    let beat = store.heartbeat("g", "b", LEASE).await.unwrap();
    assert_eq!(beat.members, ["b"]);
    let owners: Vec<Option<&str>> = beat.partitions.iter().map(|v| v.owner.as_deref()).collect();
    assert_eq!(owners, [None, None, Some("b"), None]);
    assert_eq!(store.stats("g", false).await.unwrap().members, 1);
    // At once, although a's lease would still run.
    assert_eq!(take(&store, "g", "b", 0).await.epoch, zero.epoch + 1);
}

// -- flushes and fencing -----------------------------------------------------------------

pub async fn a_flush_writes_the_position_and_state_rows_of_an_owned_partition(
    backend: &impl GroupBackend,
) {
    let store = ready(backend, &[("g", Oldest), ("h", Oldest)]).await;
    let ids = produce_keys(backend, &["a", "b", "c", "d", "a", "b", "c", "d", "a", "b"]).await;
    let rows = readable(&store, &every_partition(Position::START), ids.len()).await;
    let (p, part) = fullest_partition(&rows);
    assert!(part.len() >= 3);

    let lease = take(&store, "g", "m", p).await;
    assert_eq!(lease.position, Position::START);
    let retry = state(&part[1], StateKind::Retry);
    let held = StateRow {
        attempts: 0,
        error: None,
        ..state(&part[2], StateKind::Held)
    };
    let lost = store
        .flush(
            "g",
            "m",
            &[Flush {
                position: Some(part[2].position),
                upserts: vec![held.clone(), retry.clone()],
                ..flush(&lease)
            }],
        )
        .await
        .unwrap();
    assert!(lost.is_empty());
    assert_eq!(view(&store, "g", p).await.position, part[2].position);
    assert_eq!(
        store.load_state("g", p).await.unwrap(),
        [retry.clone(), held.clone()],
        "in log order"
    );
    assert!(store.load_state("h", p).await.unwrap().is_empty());
    assert_eq!(all_state(&store, "g").await.len(), 2);
    let settled: Vec<MessageId> = ids_of(&part[..3]);
    let rest: Vec<MessageId> = ids
        .iter()
        .copied()
        .filter(|id| !settled.contains(id))
        .collect();
    assert_eq!(ahead(&store, "g", rest.len()).await, rest);

    // A flush without a position keeps it; a state row changes kind, another goes.
    let dead = StateRow {
        kind: StateKind::Dead,
        attempts: 3,
        error: Some("gave up".to_owned()),
        ..retry.clone()
    };
    let lost = store
        .flush(
            "g",
            "m",
            &[Flush {
                upserts: vec![dead.clone()],
                deletes: vec![held.id],
                ..flush(&lease)
            }],
        )
        .await
        .unwrap();
    assert!(lost.is_empty());
    assert_eq!(store.load_state("g", p).await.unwrap(), [dead]);
    assert_eq!(view(&store, "g", p).await.position, part[2].position);

    // The next owner resumes where the last one got to.
    store.release("g", "m", &[]).await.unwrap();
    assert_eq!(take(&store, "g", "n", p).await.position, part[2].position);
    assert_eq!(view(&store, "h", p).await.position, Position::START);
}

pub async fn a_stale_members_writes_are_refused_and_the_rest_of_its_flush_applies(
    backend: &impl GroupBackend,
) {
    let store = ready(backend, &[("g", Oldest)]).await;
    let keys = ["a", "b", "c", "d", "e", "f", "g", "h"];
    produce_keys(backend, &keys).await;
    let rows = readable(&store, &every_partition(Position::START), keys.len()).await;
    let first_of = |partition: u32| rows.iter().find(|r| r.partition == partition).unwrap();
    let (p, _) = fullest_partition(&rows);
    let q = rows
        .iter()
        .map(|r| r.partition)
        .find(|q| *q != p)
        .expect("rows in two partitions");
    let (p_row, q_row) = (first_of(p), first_of(q));

    let old_p = take(&store, "g", "a", p).await;
    let lease_q = take(&store, "g", "a", q).await;
    // p is taken from a: given back (its member thinks it still holds it) and taken.
    store.release("g", "a", &[p]).await.unwrap();
    let new_p = take(&store, "g", "b", p).await;

    let q_dead = state(q_row, StateKind::Dead);
    let writes = [
        Flush {
            position: Some(p_row.position),
            upserts: vec![state(p_row, StateKind::Retry)],
            ..flush(&old_p)
        },
        Flush {
            position: Some(q_row.position),
            upserts: vec![q_dead.clone()],
            ..flush(&lease_q)
        },
    ];
    assert_eq!(store.flush("g", "a", &writes).await.unwrap(), [p]);
    assert_eq!(view(&store, "g", p).await.position, Position::START);
    assert!(store.load_state("g", p).await.unwrap().is_empty());
    assert_eq!(view(&store, "g", q).await.position, q_row.position);
    assert_eq!(store.load_state("g", q).await.unwrap(), [q_dead]);

    // The owner at another epoch, or another member at the owner's, is fenced too.
    let moved = |lease: &PartitionLease| Flush {
        position: Some(p_row.position),
        ..flush(lease)
    };
    assert_eq!(store.flush("g", "b", &[moved(&old_p)]).await.unwrap(), [p]);
    assert_eq!(store.flush("g", "a", &[moved(&new_p)]).await.unwrap(), [p]);
    assert_eq!(view(&store, "g", p).await.position, Position::START);
    assert!(store
        .flush("g", "b", &[moved(&new_p)])
        .await
        .unwrap()
        .is_empty());
    assert_eq!(view(&store, "g", p).await.position, p_row.position);
}

// -- reads -------------------------------------------------------------------------------

pub async fn a_read_returns_each_partitions_rows_past_its_cursor_in_log_order(
    backend: &impl GroupBackend,
) {
    let store = ready(backend, &[("g", Oldest)]).await;
    let nothing = store.read(&[], 10).await.unwrap();
    assert!(nothing.rows.is_empty() && nothing.more.is_empty());
    let empty = store
        .read(&every_partition(Position::START), 10)
        .await
        .unwrap();
    assert!(empty.rows.is_empty() && empty.more.is_empty(), "{empty:?}");

    let keys = ["a", "b", "c", "d", "e", "f"];
    let mut payloads = BTreeMap::new();
    for round in 0..3 {
        for key in keys {
            let payload = format!("{key}{round}");
            payloads.insert(backend.produce(Some(key), &payload, 0).await, payload);
        }
    }
    for n in 0..8 {
        let payload = format!("keyless{n}");
        payloads.insert(backend.produce(None, &payload, 0).await, payload);
    }
    let total = payloads.len();
    readable(&store, &every_partition(Position::START), total).await;

    let read = store
        .read(&every_partition(Position::START), 100)
        .await
        .unwrap();
    assert_eq!(read.rows.len(), total);
    assert!(read.more.is_empty(), "{:?}", read.more);
    let mut last: BTreeMap<u32, Position> = BTreeMap::new();
    let mut partition_of_key: BTreeMap<Option<String>, u32> = BTreeMap::new();
    let mut keyless_partitions = std::collections::BTreeSet::new();
    for row in &read.rows {
        let m = &row.message;
        assert!(row.partition < PARTITIONS);
        assert_eq!(row.position.id, m.id);
        let previous = last.insert(row.partition, row.position);
        assert!(
            previous.is_none_or(|p| p < row.position),
            "partition {} out of log order at {}",
            row.partition,
            m.id
        );
        assert_eq!(m.topic, TOPIC);
        assert_eq!(m.payload, payloads[&m.id].as_bytes());
        let trace = [("trace".to_owned(), payloads[&m.id].clone())].into();
        assert_eq!(m.headers, trace);
        match &m.key {
            Some(_) => {
                let partition = *partition_of_key
                    .entry(m.key.clone())
                    .or_insert(row.partition);
                assert_eq!(partition, row.partition, "a key's rows in two partitions");
            }
            None => {
                keyless_partitions.insert(row.partition);
            }
        }
    }
    assert!(
        keyless_partitions.len() > 1,
        "keyless rows spread over the partitions"
    );

    // Only the partitions asked, and only past their cursors.
    let (p, part) = fullest_partition(&read.rows);
    let only = store.read(&[(p, Position::START)], 100).await.unwrap();
    assert_eq!(ids_of(&only.rows), ids_of(&part));
    let past = store.read(&[(p, part[1].position)], 100).await.unwrap();
    assert_eq!(ids_of(&past.rows), ids_of(&part[2..]));
    let at_end = store
        .read(&[(p, part.last().unwrap().position)], 100)
        .await
        .unwrap();
    assert!(at_end.rows.is_empty() && at_end.more.is_empty());
}

pub async fn reading_page_by_page_brings_every_row_once_in_order(backend: &impl GroupBackend) {
    let store = ready(backend, &[("g", Oldest)]).await;
    let mut ids = Vec::new();
    for n in 0..30 {
        let key = format!("k{}", n % 5);
        ids.push(backend.produce(Some(&key), &format!("{n}"), 0).await);
    }
    for n in 0..5 {
        ids.push(backend.produce(None, &format!("keyless{n}"), 0).await);
    }
    let all = readable(&store, &every_partition(Position::START), ids.len()).await;
    for limit in [1, 2, 3, 7] {
        let rows = read_pages(&store, &every_partition(Position::START), limit).await;
        assert_eq!(sorted(ids_of(&rows)), ids, "pages of {limit}");
    }

    // A partition with more rows than the limit says so, and what came is its first.
    let (p, part) = fullest_partition(&all);
    let read = store.read(&[(p, Position::START)], 2).await.unwrap();
    assert!(read.more.contains(&p), "{read:?}");
    assert!(read.rows.len() <= 2);
    assert_eq!(ids_of(&read.rows), ids_of(&part[..read.rows.len()]));
}

pub async fn fetch_returns_the_rows_the_table_still_holds(backend: &impl GroupBackend) {
    let store = ready(backend, &[("g", Oldest)]).await;
    let ids = produce_keys(backend, &["a", "b", "a", "c"]).await;
    let rows = readable(&store, &every_partition(Position::START), 4).await;
    assert!(store.fetch(&[]).await.unwrap().is_empty());
    let got = store.fetch(&[ids[2], ids[0], ids[3] + 1000]).await.unwrap();
    assert_eq!(
        ids_of(&got),
        [ids[0], ids[2]],
        "in log order, the missing one left out"
    );
    for row in got {
        let read = rows
            .iter()
            .find(|r| r.message.id == row.message.id)
            .unwrap();
        assert_eq!(
            (row.partition, row.position),
            (read.partition, read.position)
        );
        assert_eq!(
            (&row.message.topic, &row.message.key, &row.message.payload),
            (
                &read.message.topic,
                &read.message.key,
                &read.message.payload
            )
        );
        assert_eq!(row.message.headers, read.message.headers);
    }
}

// -- failed rows hold their keys ---------------------------------------------------------

pub async fn a_retry_holds_back_only_its_key(backend: &impl GroupBackend) {
    let store = ready(backend, &[("g", Oldest), ("h", Oldest)]).await;
    let ids = produce_keys(backend, &["k1", "k2", "k3", "k1", "k3", "k1"]).await;
    let rows = readable(&store, &every_partition(Position::START), ids.len()).await;
    let (k1, k3) = (of_key(&rows, "k1"), of_key(&rows, "k3"));
    let retry = state(k1[0], StateKind::Retry);
    let held = |row: &GroupRow| StateRow {
        attempts: 0,
        error: None,
        ..state(row, StateKind::Held)
    };
    write_state(
        &store,
        "g",
        &[
            retry.clone(),
            held(k1[1]),
            held(k1[2]),
            state(k3[0], StateKind::Retry),
        ],
    )
    .await;

    let stats = store.stats("g", false).await.unwrap();
    assert_eq!(
        (stats.retrying, stats.held, stats.dead, stats.held_keys),
        (2, 2, 0, 2)
    );
    let blocked = store.blocked_keys("g", false, 0, 10).await.unwrap();
    let listed: Vec<(&str, MessageId, u64)> = blocked
        .iter()
        .map(|b| (b.key.as_str(), b.head_id, b.waiting_behind))
        .collect();
    assert_eq!(listed, [("k1", ids[0], 2), ("k3", ids[2], 0)], "k2 flows");
    let head = &blocked[0];
    assert_eq!(head.state, HeadState::RetryWaiting);
    assert_eq!(head.owner, None);
    assert_eq!(head.attempts, retry.attempts);
    assert_eq!(head.last_error, retry.error);
    assert_eq!(head.until, retry.due_at);
    assert!(about_now(head.head_created_at), "{head:?}");
    assert_eq!(
        store.blocked_keys("g", true, 0, 10).await.unwrap(),
        blocked,
        "dead_letter_holds_key changes nothing without dead rows"
    );

    // A page at a time, by head id.
    let first = store.blocked_keys("g", false, 0, 1).await.unwrap();
    assert_eq!(first, blocked[..1]);
    let next = store.blocked_keys("g", false, ids[0], 1).await.unwrap();
    assert_eq!(next, blocked[1..]);
    assert!(store
        .blocked_keys("g", false, ids[2], 10)
        .await
        .unwrap()
        .is_empty());

    // Another group holds nothing.
    let other = store.stats("h", false).await.unwrap();
    assert_eq!(
        (other.retrying, other.held, other.dead, other.held_keys),
        (0, 0, 0, 0)
    );
    assert!(store
        .blocked_keys("h", false, 0, 10)
        .await
        .unwrap()
        .is_empty());
}

pub async fn a_dead_row_holds_its_key_only_with_dead_letter_holds_key(backend: &impl GroupBackend) {
    let store = ready(backend, &[("g", Oldest)]).await;
    let ids = produce_keys(backend, &["d1", "d1", "d2", "d3", "d3"]).await;
    let rows = readable(&store, &every_partition(Position::START), ids.len()).await;
    let (d1, d2, d3) = (
        of_key(&rows, "d1"),
        of_key(&rows, "d2"),
        of_key(&rows, "d3"),
    );
    let held = StateRow {
        attempts: 0,
        error: None,
        ..state(d1[1], StateKind::Held)
    };
    let d3_retry = state(d3[1], StateKind::Retry);
    write_state(
        &store,
        "g",
        &[
            state(d1[0], StateKind::Dead),
            held,
            state(d2[0], StateKind::Dead),
            state(d3[0], StateKind::Dead),
            d3_retry.clone(),
        ],
    )
    .await;

    let stats = store.stats("g", false).await.unwrap();
    assert_eq!(
        (stats.retrying, stats.held, stats.dead, stats.held_keys),
        (1, 1, 3, 1)
    );
    let heads = |blocked: Vec<txoutbox_server::storage::BlockedKey>| -> Vec<(String, MessageId, HeadState, u64)> {
        blocked
            .into_iter()
            .map(|b| (b.key, b.head_id, b.state, b.waiting_behind))
            .collect()
    };
    assert_eq!(
        heads(store.blocked_keys("g", false, 0, 10).await.unwrap()),
        [("d3".to_owned(), ids[4], HeadState::RetryWaiting, 0)]
    );

    assert_eq!(store.stats("g", true).await.unwrap().held_keys, 2);
    let blocked = store.blocked_keys("g", true, 0, 10).await.unwrap();
    assert_eq!(
        heads(blocked.clone()),
        [
            ("d1".to_owned(), ids[0], HeadState::Dead, 1),
            // A retry is its key's head before an earlier dead row.
            ("d3".to_owned(), ids[4], HeadState::RetryWaiting, 0),
        ],
        "d2's dead row holds nothing behind it"
    );
    assert!(
        about_now(blocked[0].until),
        "a dead head's until is when it died"
    );
    assert_eq!(blocked[1].until, d3_retry.due_at);
}

// -- dead rows ---------------------------------------------------------------------------

pub async fn dead_rows_are_listed_in_id_order_with_the_groups_attempts_and_error(
    backend: &impl GroupBackend,
) {
    let store = ready(backend, &[("g", Oldest), ("h", Oldest)]).await;
    let ids = produce_keys(backend, &["a", "b", "c", "d", "e"]).await;
    let rows = readable(&store, &every_partition(Position::START), ids.len()).await;
    let row = |id: MessageId| rows.iter().find(|r| r.message.id == id).unwrap();
    let dead = |id: MessageId| StateRow {
        attempts: 7,
        ..state(row(id), StateKind::Dead)
    };
    write_state(
        &store,
        "g",
        &[
            dead(ids[3]),
            state(row(ids[1]), StateKind::Retry),
            dead(ids[2]),
            dead(ids[0]),
        ],
    )
    .await;
    write_state(&store, "h", &[dead(ids[4])]).await;

    let listed = store.list_dead("g", 0, 10).await.unwrap();
    let listed_ids: Vec<MessageId> = listed.iter().map(|d| d.message.id).collect();
    assert_eq!(listed_ids, [ids[0], ids[2], ids[3]]);
    for dead in &listed {
        let read = row(dead.message.id);
        assert_eq!(dead.message.attempts, 7, "the group's attempts");
        assert_eq!(dead.error, Some(format!("failed {}", dead.message.id)));
        assert!(about_now(dead.dead_at), "{dead:?}");
        assert_eq!(
            (
                &dead.message.topic,
                &dead.message.key,
                &dead.message.payload
            ),
            (
                &read.message.topic,
                &read.message.key,
                &read.message.payload
            )
        );
        assert_eq!(dead.message.headers, read.message.headers);
    }
    let page = store.list_dead("g", ids[0], 1).await.unwrap();
    assert_eq!(
        page.iter().map(|d| d.message.id).collect::<Vec<_>>(),
        [ids[2]]
    );
    assert!(store.list_dead("g", ids[3], 10).await.unwrap().is_empty());
    let other: Vec<MessageId> = store
        .list_dead("h", 0, 10)
        .await
        .unwrap()
        .iter()
        .map(|d| d.message.id)
        .collect();
    assert_eq!(other, [ids[4]]);
    assert_eq!(store.stats("g", false).await.unwrap().dead, 3);
}

/// Three dead rows of `g`, the first two in different partitions, owned by member `m`;
/// and the first dead in `h` too. Returns the rows and `m`'s leases of their partitions.
async fn three_dead_rows(
    backend: &impl GroupBackend,
    store: &Store,
) -> (Vec<GroupRow>, BTreeMap<u32, PartitionLease>) {
    let keys = ["a", "b", "c", "d", "e", "f", "g", "h"];
    produce_keys(backend, &keys).await;
    let rows = readable(store, &every_partition(Position::START), keys.len()).await;
    let first = rows[0].clone();
    let second = rows
        .iter()
        .find(|r| r.partition != first.partition)
        .expect("rows in two partitions")
        .clone();
    let third = rows
        .iter()
        .find(|r| r.message.id != first.message.id && r.message.id != second.message.id)
        .unwrap()
        .clone();
    let dead = vec![first, second, third];
    write_state(store, "h", &[state(&dead[0], StateKind::Dead)]).await;
    let mut leases = BTreeMap::new();
    for row in &dead {
        if let std::collections::btree_map::Entry::Vacant(entry) = leases.entry(row.partition) {
            entry.insert(take(store, "g", "m", row.partition).await);
        }
    }
    let flushes: Vec<Flush> = leases
        .values()
        .map(|lease| Flush {
            upserts: dead
                .iter()
                .filter(|r| r.partition == lease.partition)
                .map(|r| state(r, StateKind::Dead))
                .collect(),
            ..flush(lease)
        })
        .collect();
    assert!(store.flush("g", "m", &flushes).await.unwrap().is_empty());
    (dead, leases)
}

pub async fn redrive_makes_dead_rows_due_retries_and_fences_their_partitions(
    backend: &impl GroupBackend,
) {
    let store = ready(backend, &[("g", Oldest), ("h", Oldest)]).await;
    let (dead, leases) = three_dead_rows(backend, &store).await;
    let (x, y) = (&dead[0], &dead[1]);

    assert_eq!(
        store.redrive_dead("g", &[x.message.id], 10).await.unwrap(),
        [x.message.id]
    );
    let redriven = store
        .load_state("g", x.partition)
        .await
        .unwrap()
        .into_iter()
        .find(|s| s.id == x.message.id)
        .unwrap();
    assert_eq!((redriven.kind, redriven.attempts), (StateKind::Retry, 0));
    assert!(about_now(redriven.due_at), "due now: {redriven:?}");
    assert!(redriven.due_at <= Utc::now());
    let still_dead: Vec<MessageId> = store
        .list_dead("g", 0, 10)
        .await
        .unwrap()
        .iter()
        .map(|d| d.message.id)
        .collect();
    assert!(!still_dead.contains(&x.message.id) && still_dead.len() == 2);

    // The partition is taken from its owner: it reloads its state when it takes it again.
    let x_view = view(&store, "g", x.partition).await;
    assert_eq!(
        (x_view.owner, x_view.epoch),
        (None, leases[&x.partition].epoch + 1)
    );
    let at_old_epoch = Flush {
        position: Some(x.position),
        ..flush(&leases[&x.partition])
    };
    assert_eq!(
        store.flush("g", "m", &[at_old_epoch]).await.unwrap(),
        [x.partition]
    );
    let y_view = view(&store, "g", y.partition).await;
    assert_eq!(
        y_view.owner.as_deref(),
        Some("m"),
        "untouched partitions stay"
    );

    assert!(
        store
            .redrive_dead("g", &[x.message.id], 10)
            .await
            .unwrap()
            .is_empty(),
        "no longer dead"
    );
    assert!(store
        .redrive_dead("g", &[y.message.id + 1000], 10)
        .await
        .unwrap()
        .is_empty());
    let mut rest = still_dead.clone();
    rest.sort_unstable();
    assert_eq!(store.redrive_dead("g", &[], 1).await.unwrap(), rest[..1]);
    assert_eq!(store.redrive_dead("g", &[], 10).await.unwrap(), rest[1..]);
    assert!(store.list_dead("g", 0, 10).await.unwrap().is_empty());
    assert_eq!(store.stats("g", false).await.unwrap().retrying, 3);
    assert_eq!(
        store.list_dead("h", 0, 10).await.unwrap()[0].message.id,
        x.message.id,
        "another group's dead row stays"
    );
}

pub async fn discard_drops_dead_rows_for_good_and_fences_their_partitions(
    backend: &impl GroupBackend,
) {
    let store = ready(backend, &[("g", Oldest), ("h", Oldest)]).await;
    let (dead, leases) = three_dead_rows(backend, &store).await;
    let x = &dead[0];

    assert_eq!(
        store.discard_dead("g", &[x.message.id], 10).await.unwrap(),
        [x.message.id]
    );
    assert!(store
        .load_state("g", x.partition)
        .await
        .unwrap()
        .iter()
        .all(|s| s.id != x.message.id));
    assert_eq!(store.list_dead("g", 0, 10).await.unwrap().len(), 2);
    assert_eq!(
        ids_of(&store.fetch(&[x.message.id]).await.unwrap()),
        [x.message.id],
        "the outbox row stays"
    );
    let x_view = view(&store, "g", x.partition).await;
    assert_eq!(
        (x_view.owner, x_view.epoch),
        (None, leases[&x.partition].epoch + 1)
    );
    assert_eq!(
        store
            .flush("g", "m", &[flush(&leases[&x.partition])])
            .await
            .unwrap(),
        [x.partition]
    );

    assert!(store
        .discard_dead("g", &[x.message.id], 10)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(store.discard_dead("g", &[], 10).await.unwrap().len(), 2);
    assert!(store.discard_dead("g", &[], 10).await.unwrap().is_empty());
    let stats = store.stats("g", false).await.unwrap();
    assert_eq!((stats.dead, stats.retrying), (0, 0));
    assert_eq!(store.list_dead("h", 0, 10).await.unwrap().len(), 1);
}

// -- seeks -------------------------------------------------------------------------------

pub async fn a_seek_to_the_oldest_row_replays_everything_and_fences_the_owners(
    backend: &impl GroupBackend,
) {
    let store = ready(backend, &[("g", Oldest), ("h", Oldest)]).await;
    let ids = produce_keys(backend, &["a", "b", "c", "d", "e", "f"]).await;
    let rows = readable(&store, &every_partition(Position::START), ids.len()).await;
    store.seek("h", SeekTarget::Now, false).await.unwrap();
    let h_before = placed_all(&store, "h").await;

    // A member owns every partition, is past every row, with a retry, a held and a dead row.
    let mut leases = Vec::new();
    for partition in 0..PARTITIONS {
        leases.push(take(&store, "g", "m", partition).await);
    }
    let flushes: Vec<Flush> = leases
        .iter()
        .map(|lease| Flush {
            position: rows
                .iter()
                .filter(|r| r.partition == lease.partition)
                .map(|r| r.position)
                .max(),
            upserts: [
                (0, StateKind::Retry),
                (1, StateKind::Held),
                (2, StateKind::Dead),
            ]
            .iter()
            .filter(|(n, _)| rows[*n].partition == lease.partition)
            .map(|(n, kind)| state(&rows[*n], *kind))
            .collect(),
            ..flush(lease)
        })
        .collect();
    assert!(store.flush("g", "m", &flushes).await.unwrap().is_empty());
    assert!(ahead(&store, "g", 0).await.is_empty());
    let before = placed_all(&store, "g").await;
    let state_before = all_state(&store, "g").await;

    let expected = SeekOutcome {
        rows_ahead: ids.len() as u64,
        partitions: PARTITIONS,
    };
    let dry = store.seek("g", SeekTarget::Oldest, true).await.unwrap();
    assert_eq!(dry, expected);
    assert_eq!(
        placed_all(&store, "g").await,
        before,
        "a dry run moved something"
    );
    assert_eq!(all_state(&store, "g").await, state_before);

    assert_eq!(
        store.seek("g", SeekTarget::Oldest, false).await.unwrap(),
        expected
    );
    let after: Vec<_> = before
        .iter()
        .map(|(p, _, epoch, _)| (*p, None, epoch + 1, Position::START))
        .collect();
    assert_eq!(placed_all(&store, "g").await, after);
    let kept: Vec<StateKind> = all_state(&store, "g")
        .await
        .iter()
        .map(|s| s.kind)
        .collect();
    assert_eq!(
        kept,
        [StateKind::Dead],
        "retry and held rows dropped, dead kept"
    );
    let lost = store.flush("g", "m", &flushes).await.unwrap();
    assert_eq!(
        lost,
        (0..PARTITIONS).collect::<Vec<_>>(),
        "the owner is fenced"
    );
    assert_eq!(ahead(&store, "g", ids.len()).await, ids);
    assert_eq!(
        placed_all(&store, "h").await,
        h_before,
        "another group moved"
    );

    for dry_run in [true, false] {
        assert!(store
            .seek("nope", SeekTarget::Oldest, dry_run)
            .await
            .is_err());
    }
}

pub async fn a_seek_to_an_id_replays_from_that_row_on(backend: &impl GroupBackend) {
    let store = ready(backend, &[("g", Oldest)]).await;
    let ids = produce_keys(backend, &["a", "b", "c", "d", "a", "b", "c", "d"]).await;
    readable(&store, &every_partition(Position::START), ids.len()).await;
    let before = placed_all(&store, "g").await;

    let expected = SeekOutcome {
        rows_ahead: 3,
        partitions: PARTITIONS,
    };
    assert_eq!(
        store.seek("g", SeekTarget::Id(ids[5]), true).await.unwrap(),
        expected
    );
    assert_eq!(placed_all(&store, "g").await, before);
    assert_eq!(
        store
            .seek("g", SeekTarget::Id(ids[5]), false)
            .await
            .unwrap(),
        expected
    );
    assert_eq!(ahead(&store, "g", 3).await, ids[5..]);

    let back = store
        .seek("g", SeekTarget::Id(ids[1]), false)
        .await
        .unwrap();
    assert_eq!(back.rows_ahead, 7);
    assert_eq!(ahead(&store, "g", 7).await, ids[1..]);
}

pub async fn a_seek_to_an_id_the_table_does_not_hold_is_refused_and_moves_nothing(
    backend: &impl GroupBackend,
) {
    let store = ready(backend, &[("g", Oldest)]).await;
    let ids = produce_keys(backend, &["a", "b", "c"]).await;
    readable(&store, &every_partition(Position::START), ids.len()).await;
    store
        .seek("g", SeekTarget::Id(ids[1]), false)
        .await
        .unwrap();
    let before = placed_all(&store, "g").await;

    for dry_run in [true, false] {
        let refused = store
            .seek("g", SeekTarget::Id(ids[2] + 1000), dry_run)
            .await;
        assert!(
            matches!(refused, Err(StorageError::InvalidMessage(_))),
            "a seek to a row that is not there: {refused:?}"
        );
    }
    assert_eq!(placed_all(&store, "g").await, before);
    let later = backend.produce(Some("a"), "later", 0).await;
    assert_eq!(ahead(&store, "g", 3).await, [ids[1], ids[2], later]);
}

pub async fn a_seek_to_a_time_replays_the_rows_created_from_then_on(backend: &impl GroupBackend) {
    let store = ready(backend, &[("g", Oldest)]).await;
    let mut old = Vec::new();
    for key in ["a", "b", "c"] {
        old.push(backend.produce(Some(key), &format!("old {key}"), 60).await);
    }
    let new = produce_keys(backend, &["a", "b", "c"]).await;
    readable(&store, &every_partition(Position::START), 6).await;
    let before = placed_all(&store, "g").await;

    let half_an_hour_ago = SeekTarget::Time(Utc::now() - minutes(30));
    let expected = SeekOutcome {
        rows_ahead: 3,
        partitions: PARTITIONS,
    };
    assert_eq!(
        store.seek("g", half_an_hour_ago, true).await.unwrap(),
        expected
    );
    assert_eq!(placed_all(&store, "g").await, before);
    assert_eq!(
        store.seek("g", half_an_hour_ago, false).await.unwrap(),
        expected
    );
    assert_eq!(ahead(&store, "g", 3).await, new);

    let earlier = SeekTarget::Time(Utc::now() - minutes(90));
    assert_eq!(store.seek("g", earlier, false).await.unwrap().rows_ahead, 6);
    let mut all = old.clone();
    all.extend(&new);
    assert_eq!(ahead(&store, "g", 6).await, all);

    // Past every row: nothing now, and what comes later is read.
    let later = SeekTarget::Time(Utc::now() + minutes(60));
    assert_eq!(store.seek("g", later, false).await.unwrap().rows_ahead, 0);
    assert!(ahead(&store, "g", 0).await.is_empty());
    let next = backend.produce(Some("a"), "next", 0).await;
    assert_eq!(ahead(&store, "g", 1).await, [next]);
}

pub async fn a_seek_to_now_skips_everything_committed_so_far(backend: &impl GroupBackend) {
    let store = ready(backend, &[("g", Oldest), ("h", Oldest)]).await;
    let ids = produce_keys(backend, &["a", "b", "c", "d"]).await;
    let rows = readable(&store, &every_partition(Position::START), ids.len()).await;
    let lease = take(&store, "g", "m", rows[0].partition).await;
    let retry = Flush {
        upserts: vec![state(&rows[0], StateKind::Retry)],
        ..flush(&lease)
    };
    assert!(store
        .flush("g", "m", std::slice::from_ref(&retry))
        .await
        .unwrap()
        .is_empty());

    let expected = SeekOutcome {
        rows_ahead: 0,
        partitions: PARTITIONS,
    };
    assert_eq!(
        store.seek("g", SeekTarget::Now, true).await.unwrap(),
        expected
    );
    assert_eq!(
        all_state(&store, "g").await.len(),
        1,
        "a dry run dropped state"
    );
    assert_eq!(
        store.seek("g", SeekTarget::Now, false).await.unwrap(),
        expected
    );
    assert!(ahead(&store, "g", 0).await.is_empty());
    assert!(all_state(&store, "g").await.is_empty());
    assert_eq!(
        store.flush("g", "m", &[retry]).await.unwrap(),
        [lease.partition]
    );

    let new = backend.produce(Some("a"), "new", 0).await;
    assert_eq!(ahead(&store, "g", 1).await, [new]);
    let mut all = ids.clone();
    all.push(new);
    assert_eq!(ahead(&store, "h", 5).await, all);
}

// -- stats -------------------------------------------------------------------------------

pub async fn stats_count_the_rows_past_the_positions_and_their_age(backend: &impl GroupBackend) {
    let store = ready(backend, &[("g", Oldest)]).await;
    for key in ["a", "b", "c"] {
        backend.produce(Some(key), "old", 60).await;
    }
    let new = produce_keys(backend, &["a", "d"]).await;
    let stats = until(
        "every row counted",
        || store.stats("g", false),
        |stats| stats.as_ref().unwrap().lag_rows == 5,
    )
    .await
    .unwrap();
    assert_eq!(stats.group, "g");
    let lag = stats.lag.expect("a lag");
    assert!(
        lag >= Duration::from_secs(59 * 60) && lag <= Duration::from_secs(65 * 60),
        "the oldest row is an hour old: {lag:?}"
    );
    assert_eq!(
        (
            stats.retrying,
            stats.held,
            stats.dead,
            stats.held_keys,
            stats.members
        ),
        (0, 0, 0, 0, 0)
    );

    store
        .seek("g", SeekTarget::Id(new[0]), false)
        .await
        .unwrap();
    let stats = store.stats("g", false).await.unwrap();
    assert_eq!(stats.lag_rows, 2);
    assert!(
        stats.lag.unwrap() < Duration::from_secs(5 * 60),
        "{stats:?}"
    );

    store.heartbeat("g", "a", LEASE).await.unwrap();
    let beat = store.heartbeat("g", "b", LEASE).await.unwrap();
    store.seek("g", SeekTarget::Now, false).await.unwrap();
    let stats = store.stats("g", false).await.unwrap();
    assert_eq!((stats.lag_rows, stats.lag, stats.members), (0, None, 2));
    assert_eq!(stats.partitions.len(), beat.partitions.len());
}

// -- purge -------------------------------------------------------------------------------

pub async fn purge_deletes_only_old_rows_every_group_has_passed_and_none_keeps(
    backend: &impl GroupBackend,
) {
    let store = ready(backend, &[("g", Oldest), ("h", Oldest)]).await;
    let mut old = Vec::new();
    for key in ["a", "b", "c", "d", "e"] {
        old.push(backend.produce(Some(key), "old", 60).await);
    }
    let new = produce_keys(backend, &["a", "b"]).await;
    let rows = readable(&store, &every_partition(Position::START), 7).await;
    let retention = Duration::from_secs(30 * 60);
    let held = |store: &Store| {
        let store = Arc::clone(store);
        let ids: Vec<MessageId> = old.iter().chain(&new).copied().collect();
        async move { sorted(ids_of(&store.fetch(&ids).await.unwrap())) }
    };
    assert_eq!(
        store.purge(retention).await.unwrap(),
        0,
        "no group passed a row"
    );

    // g is past everything but keeps the first row as dead; h is past the first three.
    store.seek("g", SeekTarget::Now, false).await.unwrap();
    let first = rows.iter().find(|r| r.message.id == old[0]).unwrap();
    write_state(&store, "g", &[state(first, StateKind::Dead)]).await;
    store
        .seek("h", SeekTarget::Id(old[3]), false)
        .await
        .unwrap();
    assert_eq!(store.purge(retention).await.unwrap(), 2);
    assert_eq!(held(&store).await, [old[0], old[3], old[4], new[0], new[1]]);
    assert_eq!(store.purge(retention).await.unwrap(), 0);

    // h passes everything: the old rows go, the new ones are younger than the retention.
    store.seek("h", SeekTarget::Now, false).await.unwrap();
    assert_eq!(store.purge(retention).await.unwrap(), 2);
    assert_eq!(held(&store).await, [old[0], new[0], new[1]]);

    store.discard_dead("g", &[old[0]], 10).await.unwrap();
    assert_eq!(store.purge(retention).await.unwrap(), 1);
    assert_eq!(held(&store).await, new);
    assert_eq!(store.stats("g", false).await.unwrap().lag_rows, 0);
}

/// A purge may take every row a group passed, the newest too; the rows inserted after
/// it must still come after the group's positions (SQLite gives a rowid table without
/// `AUTOINCREMENT`, the mapped one, the largest id left plus one).
pub async fn rows_inserted_after_a_purge_of_every_passed_row_are_read(backend: &impl GroupBackend) {
    let store = ready(backend, &[("g", Oldest)]).await;
    let mut ids = Vec::new();
    for key in ["a", "b", "c"] {
        ids.push(backend.produce(Some(key), "old", 1).await);
    }
    readable(&store, &every_partition(Position::START), ids.len()).await;
    store.seek("g", SeekTarget::Now, false).await.unwrap();
    assert!(store.purge(Duration::ZERO).await.unwrap() >= 2);
    assert!(store.fetch(&ids[..2]).await.unwrap().is_empty());

    let new = produce_keys(backend, &["a", "d"]).await;
    assert_eq!(ahead(&store, "g", 2).await, new, "the rows after the purge");
}

// -- pauses ------------------------------------------------------------------------------

pub async fn a_pause_is_per_group_kept_and_seen_by_every_replica(backend: &impl GroupBackend) {
    let store = ready(backend, &[("g", Oldest), ("h", Oldest)]).await;
    let replica = backend.store(PARTITIONS).await;
    assert!(store.paused().await.unwrap().is_empty());

    let paused = store.set_paused("g", true).await.unwrap();
    assert_eq!(paused.keys().collect::<Vec<_>>(), ["g"]);
    let since = paused["g"];
    assert!(about_now(since), "{since}");
    assert_eq!(replica.paused().await.unwrap(), paused);
    assert_eq!(
        replica.set_paused("g", true).await.unwrap(),
        paused,
        "a pause in place keeps its time"
    );
    replica
        .ensure(&groups(&[("g", Oldest), ("h", Oldest)]), PARTITIONS, true)
        .await
        .unwrap();
    assert_eq!(store.paused().await.unwrap(), paused, "a restart keeps it");

    assert!(store.set_paused("nope", true).await.is_err());
    assert_eq!(store.paused().await.unwrap(), paused);

    let both = store.set_paused("h", true).await.unwrap();
    assert_eq!(both.keys().collect::<Vec<_>>(), ["g", "h"]);
    let resumed = replica.set_paused("g", false).await.unwrap();
    assert_eq!(resumed.keys().collect::<Vec<_>>(), ["h"]);
    assert_eq!(store.paused().await.unwrap(), resumed);
    assert_eq!(store.set_paused("g", false).await.unwrap(), resumed);
}
