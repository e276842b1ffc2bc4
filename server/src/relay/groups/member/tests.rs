use std::collections::BTreeMap;
use std::time::Duration;

use chrono::Utc;
use tokio::time::Instant;

use super::*;
use crate::config::{BackoffConfig, GroupOrdering, GroupStart};
use crate::storage::OutboxMessage;

fn settings(ordering: GroupOrdering) -> GroupSettings {
    GroupSettings {
        name: "g".into(),
        start: GroupStart::Oldest,
        ordering,
        lease: Duration::from_secs(30),
        max_lease: Duration::from_secs(60),
        max_attempts: 3,
        backoff: BackoffConfig {
            base: Duration::from_secs(1),
            factor: 2.0,
            maximum: Duration::from_secs(10),
            jitter: 0.0,
        },
        dead_letter_holds_key: false,
        partitions: 1,
    }
}

fn row(id: i64, key: Option<&str>) -> GroupRow {
    GroupRow {
        message: OutboxMessage {
            id,
            topic: "t".into(),
            key: key.map(str::to_owned),
            payload: vec![],
            headers: BTreeMap::new(),
            attempts: 0,
            created_at: Utc::now(),
            too_large: None,
        },
        partition: 0,
        position: Position { txid: 0, id },
    }
}

/// A member owning partition 0 with `rows` read.
fn member(ordering: GroupOrdering, rows: &[(i64, Option<&str>)]) -> Member {
    let mut member = Member::new(settings(ordering));
    member.take(
        PartitionLease {
            partition: 0,
            epoch: 1,
            position: Position::START,
        },
        Vec::new(),
    );
    let read = Read {
        rows: rows.iter().map(|(id, key)| row(*id, *key)).collect(),
        ..Read::default()
    };
    member.add_read(&[(0, Position::START)], read);
    member
}

/// The log brings `rows` to partition 0, read after the row `after`.
fn read_after(m: &mut Member, after: i64, rows: &[(i64, Option<&str>)]) {
    m.add_read(
        &[(0, Position { txid: 0, id: after })],
        Read {
            rows: rows.iter().map(|(id, key)| row(*id, *key)).collect(),
            ..Read::default()
        },
    );
}

fn sent(dispatch: &Dispatch) -> Vec<i64> {
    dispatch
        .fresh
        .iter()
        .map(|r| r.message.id)
        .chain(dispatch.from_state.iter().copied())
        .collect()
}

fn nack(error: &str, delay: Option<Duration>) -> Failure {
    Failure::Nack {
        error: error.into(),
        delay,
    }
}

fn later() -> Instant {
    Instant::now() + Duration::from_secs(30)
}

#[test]
fn the_position_passes_only_settled_rows() {
    let mut m = member(
        GroupOrdering::Key,
        &[(1, Some("a")), (2, Some("b")), (3, Some("c"))],
    );
    let d = m.dispatch(10, Utc::now(), later());
    assert_eq!(sent(&d), vec![1, 2, 3]);
    let mut outcome = Outcome::default();
    m.ack(&[2], &mut outcome);
    // The partition is checked at the flush (fencing), but its position stays: row 1
    // is still in flight.
    let flushes = m.take_flushes();
    assert!(flushes.iter().all(|f| f.position.is_none()), "{flushes:?}");
    m.ack(&[1], &mut outcome);
    let flushes = m.take_flushes();
    assert_eq!(flushes[0].position, Some(Position { txid: 0, id: 2 }));
    assert_eq!(outcome.settled.acked, vec![2, 1]);
}

#[test]
fn a_failed_flush_is_written_again_by_the_next() {
    let mut m = member(GroupOrdering::Key, &[(1, Some("a")), (2, Some("b"))]);
    m.dispatch(10, Utc::now(), later());
    let mut outcome = Outcome::default();
    m.ack(&[1], &mut outcome);
    m.fail(2, nack("down", None), Utc::now(), &mut outcome);
    let failed = m.take_flushes();
    assert_eq!(failed[0].position, Some(Position { txid: 0, id: 2 }));
    // Not written: the partition is not quiet, and the next flush carries it all again.
    m.unflushed(failed);
    m.parts.get_mut(&0).unwrap().leaving = true;
    assert!(m.quiet_leaving().is_empty());
    let again = m.take_flushes();
    assert_eq!(again[0].position, Some(Position { txid: 0, id: 2 }));
    assert_eq!(
        again[0].upserts.iter().map(|r| r.id).collect::<Vec<_>>(),
        vec![2]
    );
    // Once written, nothing is left to write and the partition can go.
    m.flushed(&again);
    assert!(m.take_flushes().is_empty());
    assert_eq!(
        m.quiet_leaving(),
        vec![0],
        "row 2's retry is written: the next owner has it"
    );
}

#[test]
fn the_position_never_passes_a_queued_row() {
    // Key a's second row waits for its first: rows of other keys go ahead of it, and
    // the position stops before it.
    let mut m = member(GroupOrdering::Key, &[(1, Some("a"))]);
    assert_eq!(sent(&m.dispatch(10, Utc::now(), later())), vec![1]);
    read_after(&mut m, 1, &[(2, Some("a")), (3, Some("b"))]);
    assert_eq!(sent(&m.dispatch(10, Utc::now(), later())), vec![3]);
    let mut outcome = Outcome::default();
    m.ack(&[3], &mut outcome);
    m.ack(&[1], &mut outcome);
    let flushes = m.take_flushes();
    assert_eq!(flushes[0].position, Some(Position { txid: 0, id: 1 }));
    assert_eq!(sent(&m.dispatch(10, Utc::now(), later())), vec![2]);
}

/// A row held back behind its key's earlier row keeps the position before the rows of
/// other keys sent after it: a partition handed over then sends it first, so the next
/// owner starts past every row this one sent.
#[test]
fn a_leaving_partition_sends_what_it_held_back_before_it_is_quiet() {
    let mut m = member(GroupOrdering::Key, &[(1, Some("a"))]);
    assert_eq!(sent(&m.dispatch(10, Utc::now(), later())), vec![1]);
    read_after(&mut m, 1, &[(2, Some("a")), (3, Some("b"))]);
    assert_eq!(sent(&m.dispatch(10, Utc::now(), later())), vec![3]);
    let mut outcome = Outcome::default();
    m.ack(&[1, 3], &mut outcome);
    read_after(&mut m, 3, &[(4, Some("c"))]);
    m.parts.get_mut(&0).expect("partition 0").leaving = true;
    let flushes = m.take_flushes();
    assert_eq!(flushes[0].position, Some(Position { txid: 0, id: 1 }));
    m.flushed(&flushes);
    assert!(m.quiet_leaving().is_empty(), "row 3 is acked past row 2");
    // Row 2 goes; row 4, after the last row sent, is left to the next owner.
    assert_eq!(sent(&m.dispatch(10, Utc::now(), later())), vec![2]);
    m.ack(&[2], &mut outcome);
    let flushes = m.take_flushes();
    assert_eq!(flushes[0].position, Some(Position { txid: 0, id: 3 }));
    m.flushed(&flushes);
    assert_eq!(m.quiet_leaving(), vec![0]);
    assert!(m.dispatch(10, Utc::now(), later()).is_empty());
}

/// A former owner wrote a retry past its position (a row waited before it): delivered
/// and acked from its state row before the log brings the row, it is not sent again.
#[test]
fn a_retry_settled_before_the_log_brings_its_row_is_not_sent_again() {
    let mut m = Member::new(settings(GroupOrdering::Key));
    let retry = StateRow {
        id: 3,
        partition: 0,
        key: Some("c".into()),
        position: Position { txid: 0, id: 3 },
        kind: StateKind::Retry,
        attempts: 1,
        due_at: Utc::now(),
        error: None,
    };
    m.take(
        PartitionLease {
            partition: 0,
            epoch: 2,
            position: Position::START,
        },
        vec![retry],
    );
    assert_eq!(sent(&m.dispatch(10, Utc::now(), later())), vec![3]);
    let mut outcome = Outcome::default();
    m.ack(&[3], &mut outcome);
    m.add_read(
        &[(0, Position::START)],
        Read {
            rows: vec![row(1, Some("a")), row(2, Some("b")), row(3, Some("c"))],
            ..Read::default()
        },
    );
    assert_eq!(sent(&m.dispatch(10, Utc::now(), later())), vec![1, 2]);
    m.ack(&[1, 2], &mut outcome);
    let flushes = m.take_flushes();
    assert_eq!(flushes[0].position, Some(Position { txid: 0, id: 3 }));
}

/// A partition whose lease ran out by this member's clock (its heartbeats failed) sends
/// nothing: another member may own it in the database by now.
#[test]
fn a_partition_past_its_lease_sends_nothing_until_renewed() {
    let mut m = member(GroupOrdering::Key, &[(1, Some("a"))]);
    m.parts.get_mut(&0).expect("partition 0").lease_until = Some(Instant::now());
    assert!(m.dispatch(10, Utc::now(), later()).is_empty());
    m.parts.get_mut(&0).expect("partition 0").lease_until = Some(later());
    assert_eq!(sent(&m.dispatch(10, Utc::now(), later())), vec![1]);
}

#[test]
fn a_failed_key_holds_only_itself() {
    let mut m = member(GroupOrdering::Key, &[(1, Some("a")), (2, Some("b"))]);
    m.dispatch(10, Utc::now(), later());
    let mut outcome = Outcome::default();
    m.fail(1, nack("down", None), Utc::now(), &mut outcome);
    assert_eq!(outcome.settled.retried, vec![1]);
    read_after(&mut m, 2, &[(3, Some("a")), (4, Some("b"))]);
    m.ack(&[2], &mut outcome);
    // b goes on; a's next row becomes a held state row instead of being sent.
    let d = m.dispatch(10, Utc::now(), later());
    assert_eq!(sent(&d), vec![4]);
    let flushes = m.take_flushes();
    let kinds: Vec<(i64, StateKind)> = flushes[0].upserts.iter().map(|r| (r.id, r.kind)).collect();
    assert_eq!(kinds, vec![(1, StateKind::Retry), (3, StateKind::Held)]);
    // Both are written with the position that passes them.
    assert_eq!(flushes[0].position, Some(Position { txid: 0, id: 3 }));
}

#[test]
fn a_due_retry_goes_first_then_its_held_rows_in_order() {
    let mut m = member(GroupOrdering::Key, &[(1, Some("a")), (2, Some("a"))]);
    assert_eq!(sent(&m.dispatch(10, Utc::now(), later())), vec![1, 2]);
    let mut outcome = Outcome::default();
    m.fail(
        1,
        nack("down", Some(Duration::ZERO)),
        Utc::now(),
        &mut outcome,
    );
    // The later row of the key this stream held went back behind it.
    assert_eq!(outcome.settled.released, vec![2]);
    let d = m.dispatch(10, Utc::now() + chrono::Duration::seconds(1), later());
    assert_eq!(sent(&d), vec![1], "only the key's first row");
    assert_eq!(m.attempts_of(1), 2);
    m.ack(&[1], &mut outcome);
    let d = m.dispatch(10, Utc::now(), later());
    assert_eq!(sent(&d), vec![2]);
    m.ack(&[2], &mut outcome);
    let deletes: Vec<i64> = m
        .take_flushes()
        .into_iter()
        .flat_map(|f| f.deletes)
        .collect();
    assert!(deletes.contains(&1) && deletes.contains(&2));
}

#[test]
fn a_key_in_flight_from_an_earlier_batch_waits() {
    let mut m = member(GroupOrdering::Key, &[(1, Some("a"))]);
    assert_eq!(sent(&m.dispatch(10, Utc::now(), later())), vec![1]);
    read_after(&mut m, 1, &[(2, Some("a"))]);
    assert!(m.dispatch(10, Utc::now(), later()).is_empty());
    let mut outcome = Outcome::default();
    m.ack(&[1], &mut outcome);
    assert_eq!(sent(&m.dispatch(10, Utc::now(), later())), vec![2]);
}

#[test]
fn without_ordering_nothing_is_held() {
    let mut m = member(GroupOrdering::None, &[(1, Some("a")), (2, Some("a"))]);
    m.dispatch(1, Utc::now(), later());
    let mut outcome = Outcome::default();
    m.fail(1, nack("x", None), Utc::now(), &mut outcome);
    assert!(outcome.settled.released.is_empty());
    assert_eq!(sent(&m.dispatch(10, Utc::now(), later())), vec![2]);
}

#[test]
fn the_last_attempt_dead_letters_and_answers_after_a_loss_are_fenced() {
    let mut m = member(GroupOrdering::Key, &[(1, Some("a"))]);
    let mut outcome = Outcome::default();
    let mut now = Utc::now();
    for _ in 0..3 {
        m.dispatch(10, now, later());
        m.fail(1, nack("down", Some(Duration::ZERO)), now, &mut outcome);
        now += chrono::Duration::seconds(1);
    }
    assert_eq!(outcome.settled.dead_lettered, vec![1]);
    assert!(m.dispatch(10, now, later()).is_empty());
    let mut m = member(GroupOrdering::Key, &[(5, None)]);
    m.dispatch(10, Utc::now(), later());
    assert_eq!(m.lose(0), vec![5]);
    let mut outcome = Outcome::default();
    m.ack(&[5], &mut outcome);
    assert_eq!(outcome.settled.fenced, vec![5]);
}

#[test]
fn an_expired_lease_retries_at_once_keeping_the_attempt() {
    let mut m = member(GroupOrdering::Key, &[(1, Some("a"))]);
    m.dispatch(10, Utc::now(), Instant::now());
    let expired = m.expire(Instant::now() + Duration::from_millis(1), Utc::now());
    assert_eq!(expired, vec![1]);
    let d = m.dispatch(10, Utc::now(), later());
    assert_eq!(sent(&d), vec![1]);
    assert_eq!(m.attempts_of(1), 2);
}

/// A partition handed over right after an ack, before the flush that writes its
/// position, would have its next owner deliver the acked row again: it is quiet only
/// once the flush that writes that position committed.
#[test]
fn a_leaving_partition_is_quiet_only_once_its_acks_are_flushed() {
    let mut m = member(GroupOrdering::Key, &[(1, Some("a")), (2, Some("b"))]);
    assert_eq!(sent(&m.dispatch(10, Utc::now(), later())), vec![1, 2]);
    m.parts.get_mut(&0).expect("partition 0").leaving = true;
    assert!(m.quiet_leaving().is_empty(), "rows in flight");
    let mut outcome = Outcome::default();
    m.ack(&[1, 2], &mut outcome);
    assert!(m.quiet_leaving().is_empty(), "acked, not flushed");
    let flushes = m.take_flushes();
    assert_eq!(flushes[0].position, Some(Position { txid: 0, id: 2 }));
    assert!(
        m.quiet_leaving().is_empty(),
        "taken for a flush, not written yet"
    );
    m.flushed(&flushes);
    assert_eq!(m.quiet_leaving(), vec![0]);
}
