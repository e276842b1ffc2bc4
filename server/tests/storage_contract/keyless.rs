//! Keyless claims (no strict ordering) that walk from where the last claims reached (the
//! PostgreSQL claim's floor, `storage/postgres/floor.rs`): a row that becomes due again
//! below that point is still claimed, promptly when this server gave it back, within the
//! floor's interval otherwise. The other backends meet the same contract by walking from
//! the bottom every time.

use txoutbox_server::storage::NackResult;

use super::*;

fn keyless() -> Setup {
    Setup {
        strict_ordering: false,
        ..Setup::default()
    }
}

/// Rows this server gave back come in the next claim, before newer rows that would fill
/// the batch on their own: a release, a nack for a retry now, a stream's returned leases.
pub async fn keyless_rows_given_back_are_claimed_before_newer_ones(backend: &impl Backend) {
    let storage = backend.open(keyless()).await;
    let mut inserted = Vec::new();
    for i in 0..10 {
        inserted.push(insert(&*storage, "t", &format!("p{i}"), None).await);
    }
    let [first, second, third, fourth, fifth, ..] = inserted[..] else {
        unreachable!()
    };
    let got = claim(&*storage, "w1", 3, LEASE).await;
    assert_eq!(ids(&got), [first, second, third]);

    let released = storage
        .release(&[second].into(), "w1", Duration::ZERO)
        .await;
    assert_eq!(released.unwrap(), [second]);
    let got = claim(&*storage, "w2", 3, LEASE).await;
    assert_eq!(
        ids(&got),
        [second, fourth, fifth],
        "released, then the oldest"
    );

    let nacked = storage.nack(first, "w1", "boom", Some(Duration::ZERO), &POLICY);
    assert!(matches!(nacked.await.unwrap(), NackResult::Retried { .. }));
    let got = claim(&*storage, "w3", 1, LEASE).await;
    assert_eq!(ids(&got), [first], "nacked for a retry now");

    assert_eq!(
        storage.return_leases(&[third].into(), "w1").await.unwrap(),
        1
    );
    let got = claim(&*storage, "w3", 1, LEASE).await;
    assert_eq!(ids(&got), [third], "returned with a stream's end");
}

/// Claims one row at a time from `storage`, inserting a new row before each, so newer
/// rows would fill every batch on their own, until `id` comes back. Fails after
/// [`DEADLINE`].
pub async fn claims_until_claimed(storage: &dyn Storage, id: MessageId) {
    let start = Instant::now();
    for claims in 1.. {
        insert(storage, "t", "newer", None).await;
        let got = claim(storage, "w1", 1, LEASE).await;
        assert_eq!(got.len(), 1, "a newer row is always free");
        if got[0].id == id {
            return;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "row {id} not claimed within {DEADLINE:?} ({claims} claims of newer rows)"
        );
    }
}

/// Another server's row whose lease ran out, below where this server's claims reached,
/// is claimed although newer rows would fill every batch (within the PostgreSQL floor's
/// interval: a second).
pub async fn a_keyless_row_whose_lease_ran_out_is_claimed_while_newer_rows_keep_coming(
    backend: &impl Backend,
) {
    let storage = backend.open(keyless()).await;
    let other = backend.open(keyless()).await;
    let lapsing = insert(&*storage, "t", "lapsing", None).await;
    assert_eq!(ids(&claim(&*other, "w2", 1, SHORT_LEASE).await), [lapsing]);
    for _ in 0..3 {
        insert(&*storage, "t", "newer", None).await;
    }
    // This server's claims now start above the leased row.
    assert_eq!(claim(&*storage, "w1", 3, LEASE).await.len(), 3);
    claims_until_claimed(&*storage, lapsing).await;
}

/// A row due again below where this server's claims reached comes with the very next
/// claim when nothing newer is free: the claim takes the rows below the floor for what
/// the rows above left of its batch.
pub async fn a_keyless_row_whose_lease_ran_out_is_claimed_at_once_when_nothing_newer_is_free(
    backend: &impl Backend,
) {
    let storage = backend.open(keyless()).await;
    let other = backend.open(keyless()).await;
    let lapsing = insert(&*storage, "t", "lapsing", None).await;
    assert_eq!(ids(&claim(&*other, "w2", 1, SHORT_LEASE).await), [lapsing]);
    let newer = insert(&*storage, "t", "newer", None).await;
    assert_eq!(ids(&claim(&*storage, "w1", 10, LEASE).await), [newer]);
    outlive_short_lease().await;
    assert_eq!(ids(&claim(&*storage, "w1", 10, LEASE).await), [lapsing]);
}
