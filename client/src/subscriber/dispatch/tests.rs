//! The ordering rules of `dispatch.rs`, one by one.

use super::*;

const LEASE: Duration = Duration::from_secs(60);
const MARGIN: Duration = Duration::from_secs(30);

fn msg(id: i64, key: Option<&str>) -> Message {
    let message = Message::new(id, "t", "p");
    match key {
        Some(key) => message.with_key(key),
        None => message,
    }
}

fn with(messages: &[(i64, Option<&str>)]) -> Dispatch {
    let mut dispatch = Dispatch::default();
    let now = Instant::now();
    for (id, key) in messages {
        dispatch.add(msg(*id, *key), now + LEASE, now + LEASE * 5);
    }
    dispatch
}

fn drain_ready(dispatch: &mut Dispatch) -> Vec<i64> {
    let now = Instant::now();
    std::iter::from_fn(|| dispatch.next_ready(now, Some(MARGIN)).map(|m| m.id)).collect()
}

#[test]
fn a_key_publishes_one_at_a_time_and_keyless_ones_all_at_once() {
    let mut d = with(&[
        (1, Some("a")),
        (2, Some("b")),
        (3, Some("a")),
        (4, None),
        (5, None),
    ]);
    assert_eq!(drain_ready(&mut d), [1, 2, 4, 5]);
    assert_eq!(drain_ready(&mut d), Vec::<i64>::new(), "3 waits for 1");
    d.published(1);
    assert_eq!(drain_ready(&mut d), [3], "3 does not wait for 1's ack");
    assert_eq!(d.state(1), Some(State::Acking));
    d.published(3);
    d.acked(3);
    d.acked(1);
    for id in [2, 4, 5] {
        d.published(id);
        d.acked(id);
    }
    assert!(d.is_empty());
    assert!(d.groups.is_empty() && d.ready.is_empty());
}

#[test]
fn a_hot_key_runs_ahead_of_its_acks() {
    let mut d = with(&[(1, Some("a")), (2, Some("a")), (3, Some("a"))]);
    for id in 1..=3 {
        assert_eq!(drain_ready(&mut d), [id]);
        d.published(id);
    }
    assert_eq!(d.groups[&GroupKey::Key("a".into())].acking, [1, 2, 3]);
    for id in 1..=3 {
        d.acked(id);
    }
    assert!(d.is_empty() && d.groups.is_empty());
}

#[test]
fn near_the_end_of_its_lease_a_key_waits_for_its_ack() {
    let mut d = Dispatch::default();
    let now = Instant::now();
    let deadline = now + Duration::from_secs(10);
    for id in [1, 2] {
        d.add(msg(id, Some("a")), deadline, deadline);
    }
    assert_eq!(d.next_ready(now, Some(MARGIN)).unwrap().id, 1);
    d.published(1);
    assert!(
        d.next_ready(now, Some(MARGIN)).is_none(),
        "10s left, 30s margin"
    );
    d.acked(1);
    assert_eq!(d.next_ready(now, Some(MARGIN)).unwrap().id, 2);
}

#[test]
fn without_pipelining_a_key_waits_for_each_ack() {
    let mut d = Dispatch::default();
    let now = Instant::now();
    let deadline = now + LEASE;
    for id in [1, 2] {
        d.add(msg(id, Some("a")), deadline, deadline);
    }
    assert_eq!(d.next_ready(now, None).unwrap().id, 1);
    d.published(1);
    assert!(
        d.next_ready(now, None).is_none(),
        "1's ack is not confirmed yet"
    );
    d.acked(1);
    assert_eq!(d.next_ready(now, None).unwrap().id, 2);
}

#[test]
fn a_message_arriving_for_a_busy_key_waits() {
    let mut d = with(&[(1, Some("a"))]);
    assert_eq!(drain_ready(&mut d), [1]);
    let now = Instant::now();
    d.add(msg(2, Some("a")), now + LEASE, now + LEASE);
    assert_eq!(drain_ready(&mut d), Vec::<i64>::new());
    d.published(1);
    assert_eq!(drain_ready(&mut d), [2]);
}

#[test]
fn a_failure_blocks_the_rest_of_its_key_only() {
    let mut d = with(&[
        (1, Some("a")),
        (2, Some("a")),
        (3, Some("a")),
        (4, Some("b")),
    ]);
    assert_eq!(drain_ready(&mut d), [1, 4]);
    let blocked = d.fail(1).unwrap();
    assert_eq!(blocked.ids, [2, 3]);
    assert_eq!(blocked.key.as_deref(), Some("a"));
    assert_eq!(drain_ready(&mut d), Vec::<i64>::new());
    assert_eq!(d.len(), 1);
    assert_eq!(d.state(4), Some(State::Publishing));
}

#[test]
fn a_failure_behind_an_unsettled_ack_leaves_that_ack_alone() {
    let mut d = with(&[(1, Some("a")), (2, Some("a")), (3, Some("a"))]);
    drain_ready(&mut d);
    d.published(1);
    assert_eq!(drain_ready(&mut d), [2]);
    assert_eq!(d.fail(2).unwrap().ids, [3]);
    assert_eq!(d.state(1), Some(State::Acking));
    d.acked(1);
    assert!(d.is_empty() && d.groups.is_empty());
}

#[test]
fn losing_a_queued_message_blocks_only_the_ones_after_it() {
    let mut d = with(&[(1, Some("a")), (2, Some("a")), (3, Some("a"))]);
    assert_eq!(drain_ready(&mut d), [1]);
    assert_eq!(d.fail(2).unwrap().ids, [3]);
    d.published(1);
    d.acked(1);
    assert!(d.is_empty());
    assert_eq!(drain_ready(&mut d), Vec::<i64>::new());
    assert!(d.fail(99).is_none());
}

#[test]
fn losing_an_acking_message_blocks_the_rest() {
    let mut d = with(&[(1, Some("a")), (2, Some("a"))]);
    drain_ready(&mut d);
    d.published(1);
    assert_eq!(d.fail(1).unwrap().ids, [2]);
    assert!(d.is_empty() && d.groups.is_empty());
}

#[test]
fn losing_an_acking_message_orphans_the_one_publishing_behind_it() {
    let mut d = with(&[
        (1, Some("a")),
        (2, Some("a")),
        (3, Some("a")),
        (4, Some("a")),
    ]);
    drain_ready(&mut d);
    d.published(1);
    drain_ready(&mut d);
    d.published(2);
    assert_eq!(drain_ready(&mut d), [3]);
    // 1's ack comes back fenced while 2's is unsettled and 3 publishes.
    assert_eq!(d.fail(1).unwrap().ids, [4]);
    assert_eq!(d.state(2), Some(State::Acking));
    assert_eq!(d.state(3), Some(State::Orphaned { behind: 1 }));
    // The orphan's outcome is not an ack, and nothing else starts meanwhile.
    d.published(3);
    assert_eq!(d.state(3), Some(State::Orphaned { behind: 1 }));
    assert_eq!(drain_ready(&mut d), Vec::<i64>::new());
    // 2's ack is fenced too; 3 is still the first loss's orphan.
    assert_eq!(d.fail(2).unwrap().ids, Vec::<i64>::new());
    let (behind, blocked) = d.orphan_done(3).unwrap();
    assert_eq!(
        (behind, blocked.ids, blocked.key.as_deref()),
        (1, vec![3], Some("a"))
    );
    assert!(d.orphan_done(3).is_none());
    assert!(d.is_empty() && d.groups.is_empty());
}

#[test]
fn a_message_delivered_again_waits_for_the_orphan() {
    let mut d = with(&[(1, Some("a")), (2, Some("a"))]);
    drain_ready(&mut d);
    d.published(1);
    drain_ready(&mut d);
    d.fail(1).unwrap();
    let now = Instant::now();
    d.add(msg(1, Some("a")), now + LEASE, now + LEASE);
    assert_eq!(
        drain_ready(&mut d),
        Vec::<i64>::new(),
        "2 is still publishing"
    );
    d.orphan_done(2).unwrap();
    assert_eq!(drain_ready(&mut d), [1]);
}

#[test]
fn the_settled_ack_of_an_older_delivery_leaves_the_new_one_alone() {
    let mut d = with(&[(1, Some("a")), (2, Some("a"))]);
    drain_ready(&mut d);
    d.published(1);
    assert_eq!(d.fail(1).unwrap().ids, [2]);
    let now = Instant::now();
    d.add(msg(1, Some("a")), now + LEASE, now + LEASE);
    d.acked(1);
    assert_eq!(d.state(1), Some(State::Queued));
    assert_eq!(drain_ready(&mut d), [1]);
}

#[test]
fn take_queued_leaves_the_started_ones() {
    let mut d = with(&[(1, Some("a")), (2, Some("a")), (3, Some("a")), (4, None)]);
    assert_eq!(drain_ready(&mut d), [1, 4]);
    d.published(1);
    assert_eq!(drain_ready(&mut d), [2]);
    assert_eq!(d.take_queued(), [3]);
    assert_eq!(d.len(), 3);
    d.published(2);
    assert_eq!(drain_ready(&mut d), Vec::<i64>::new());
    for id in [1, 2] {
        d.acked(id);
    }
    d.published(4);
    d.acked(4);
    assert!(d.is_empty() && d.groups.is_empty());
}

#[test]
fn extension_is_due_near_the_deadline_and_stops_at_the_limit() {
    let mut d = Dispatch::default();
    let now = Instant::now();
    let lease = Duration::from_secs(10);
    d.add(msg(1, None), now + lease, now + Duration::from_secs(25));
    d.add(msg(2, None), now + Duration::from_secs(2), now + lease);
    let margin = Duration::from_secs(5);
    assert_eq!(d.due_for_extension(now, margin, lease), [2]);
    let later = now + Duration::from_secs(6);
    // 2 may not be extended past its limit (10s); 1 may.
    assert_eq!(d.due_for_extension(later, margin, lease), [1]);
    d.extended(1, later + lease);
    assert!(d.due_for_extension(later, margin, lease).is_empty());
    // 1 runs until 16s, its limit is 25s: at 12s a 10s lease would pass the limit.
    let much_later = now + Duration::from_secs(16);
    assert!(d.due_for_extension(much_later, margin, lease).is_empty());
    // Acking messages are extended too: a later one of their key may be publishing.
    let mut d = with(&[(3, Some("a")), (4, Some("a"))]);
    drain_ready(&mut d);
    d.published(3);
    drain_ready(&mut d);
    assert_eq!(d.due_for_extension(now, LEASE * 2, lease), [3, 4]);
}
