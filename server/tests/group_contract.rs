//! The group-store contract: what every backend's [`GroupStore`] must do (the trait's docs
//! and `docs/groups.md`), written once.
//!
//! `group_contract!(name, factory)` expands to one `#[tokio::test]` per case in [`cases`]
//! (`group_contract/cases.rs`), each with a fresh [`GroupBackend`] from `factory` (an
//! expression that may `.await`): an outbox table of its own, the relay's default one or
//! a team's own table mapped in configuration (the mapped tables of the storage contract,
//! `shared/team_tables.rs`, whose columns have none of the relay's names). The stores are
//! built as the server builds them, behind [`Timed`].
//!
//! PostgreSQL: every test gets a uniquely named schema in the database at
//! `TXOUTBOX_TEST_POSTGRES_URL` (default `postgres://postgres@127.0.0.1:5432/test`),
//! dropped when the test ends, even when it fails. Its frontier is the whole server's
//! (`pg_snapshot_xmin`): a transaction another test holds open delays when rows become
//! readable, so the cases wait for rows to be readable before they count on it.
//!
//! SQLite: every test gets a fresh database file in a temporary directory, removed when
//! the test ends.

#[path = "group_contract/cases.rs"]
mod cases;
#[path = "group_contract/pg.rs"]
mod pg;
#[path = "shared/pg_schema.rs"]
mod pg_schema;
#[path = "group_contract/sqlite_file.rs"]
mod sqlite_file;
#[path = "shared/team_tables.rs"]
mod team_tables;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use txoutbox_server::config::GroupStart;
use txoutbox_server::storage::groups::{
    Flush, GroupRow, GroupStore, PartitionLease, PartitionView, Position, StateKind, StateRow,
};
use txoutbox_server::storage::MessageId;

type Store = Arc<dyn GroupStore>;

/// The partitions of every group of the contract's outboxes.
const PARTITIONS: u32 = 4;
/// A lease that does not run out during a test.
const LEASE: Duration = Duration::from_secs(30);
/// A lease that runs out during a test; real time, since the database keeps the clock.
const SHORT_LEASE: Duration = Duration::from_millis(300);
/// A lease that runs out during a test, but not before the next few statements on a
/// busy machine.
const BRIEF_LEASE: Duration = Duration::from_secs(1);
/// Longest wait for something that should happen.
const DEADLINE: Duration = Duration::from_secs(10);
/// The topic of every produced row.
const TOPIC: &str = "orders.created";

/// What a backend provides to the contract: one fresh outbox table per test.
trait GroupBackend {
    /// A group store on this test's outbox table, the table created (with the relay's
    /// columns) the first time. Every call is a separate instance with connections of its
    /// own, like another replica on the same database.
    async fn store(&self, partitions: u32) -> Store;
    /// Inserts a row the way a producer does: its own connection and SQL, the table's own
    /// column names, created `minutes_ago`, with the headers `{"trace": payload}` (the
    /// table created first if need be).
    async fn produce(&self, key: Option<&str>, payload: &str, minutes_ago: u32) -> MessageId;
    /// Runs `sql` (several statements) on this test's database, as an operator would run
    /// the printed schema.
    async fn run(&self, sql: &str);
}

/// `group_contract!(name, factory)` runs every case.
macro_rules! group_contract {
    ($backend:ident, $factory:expr) => {
        mod $backend {
            use super::*;

            group_contract!(@cases $factory;
                a_group_starts_at_its_start_and_ensuring_again_changes_nothing,
                a_group_added_later_starts_at_its_own_start,
                a_partition_count_other_than_the_groups_were_created_with_is_refused,
                without_create_ensure_needs_the_printed_schema,
                heartbeats_list_the_live_members_sorted_and_every_partition,
                a_member_whose_heartbeat_ran_out_is_no_longer_listed,
                a_free_partition_is_taken_once_with_a_new_epoch,
                a_partition_whose_lease_ran_out_is_taken_again_and_its_old_epoch_fenced,
                heartbeats_renew_the_leases_of_the_members_own_partitions,
                release_gives_back_only_the_named_partitions_of_that_member,
                leave_frees_the_members_partitions_at_once_and_forgets_it,
                a_flush_writes_the_position_and_state_rows_of_an_owned_partition,
                a_stale_members_writes_are_refused_and_the_rest_of_its_flush_applies,
                a_read_returns_each_partitions_rows_past_its_cursor_in_log_order,
                reading_page_by_page_brings_every_row_once_in_order,
                fetch_returns_the_rows_the_table_still_holds,
                a_retry_holds_back_only_its_key,
                a_dead_row_holds_its_key_only_with_dead_letter_holds_key,
                dead_rows_are_listed_in_id_order_with_the_groups_attempts_and_error,
                redrive_makes_dead_rows_due_retries_and_fences_their_partitions,
                discard_drops_dead_rows_for_good_and_fences_their_partitions,
                a_seek_to_the_oldest_row_replays_everything_and_fences_the_owners,
                a_seek_to_an_id_replays_from_that_row_on,
                a_seek_to_an_id_the_table_does_not_hold_is_refused_and_moves_nothing,
                a_seek_to_a_time_replays_the_rows_created_from_then_on,
                a_seek_to_now_skips_everything_committed_so_far,
                stats_count_the_rows_past_the_positions_and_their_age,
                purge_deletes_only_old_rows_every_group_has_passed_and_none_keeps,
                rows_inserted_after_a_purge_of_every_passed_row_are_read,
                a_pause_is_per_group_kept_and_seen_by_every_replica,
            );
        }
    };
    (@cases $factory:expr; $($case:ident),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let backend = $factory;
                cases::$case(&backend).await;
            }
        )+
    };
}

group_contract!(postgres, pg::PgSchema::new().await);
group_contract!(postgres_mapped, pg::PgSchema::mapped().await);
group_contract!(sqlite, sqlite_file::SqliteFile::new().await);
group_contract!(sqlite_mapped, sqlite_file::SqliteFile::mapped().await);

// -- helpers ---------------------------------------------------------------------------

/// The groups of an outbox as `ensure` takes them.
fn groups(groups: &[(&str, GroupStart)]) -> Vec<(String, GroupStart)> {
    groups
        .iter()
        .map(|(name, start)| ((*name).to_owned(), *start))
        .collect()
}

/// A store whose outbox has these groups, created (`create_schema`).
async fn ready(backend: &impl GroupBackend, names: &[(&str, GroupStart)]) -> Store {
    let store = backend.store(PARTITIONS).await;
    store
        .ensure(&groups(names), PARTITIONS, true)
        .await
        .expect("ensure the groups");
    store
}

/// Every partition, at `at`.
fn every_partition(at: Position) -> Vec<(u32, Position)> {
    (0..PARTITIONS).map(|p| (p, at)).collect()
}

/// The positions of `group`, per partition.
async fn positions(store: &Store, group: &str) -> Vec<(u32, Position)> {
    views(store, group)
        .await
        .into_iter()
        .map(|v| (v.partition, v.position))
        .collect()
}

/// The partitions of `group` as the table has them (by its stats: a heartbeat would join).
async fn views(store: &Store, group: &str) -> Vec<PartitionView> {
    store.stats(group, false).await.expect("stats").partitions
}

async fn view(store: &Store, group: &str, partition: u32) -> PartitionView {
    views(store, group)
        .await
        .into_iter()
        .find(|v| v.partition == partition)
        .expect("the partition is listed")
}

/// Reads the way a member does: each partition from its cursor, a `limit` at a time,
/// moving the cursor past what came and what was scanned, until no partition has more.
/// Panics when a row comes twice or out of order, or the reads never end.
async fn read_pages(store: &Store, from: &[(u32, Position)], limit: u32) -> Vec<GroupRow> {
    let mut cursors: BTreeMap<u32, Position> = from.iter().copied().collect();
    let mut pending: Vec<u32> = cursors.keys().copied().collect();
    let mut rows: Vec<GroupRow> = Vec::new();
    for _ in 0..1000 {
        if pending.is_empty() {
            return rows;
        }
        let asked: Vec<(u32, Position)> = pending.iter().map(|p| (*p, cursors[p])).collect();
        let read = store.read(&asked, limit).await.expect("read");
        for row in read.rows {
            assert!(
                asked.iter().any(|(p, _)| *p == row.partition),
                "a row of a partition not asked: {row:?}"
            );
            let cursor = cursors.get_mut(&row.partition).unwrap();
            assert!(
                row.position > *cursor,
                "row {} read again, or out of order, in partition {}",
                row.message.id,
                row.partition
            );
            *cursor = row.position;
            rows.push(row);
        }
        for (partition, _) in &asked {
            if let Some(scanned) = read.scanned.get(partition) {
                let cursor = cursors.get_mut(partition).unwrap();
                *cursor = (*cursor).max(*scanned);
            }
        }
        pending = asked
            .iter()
            .map(|(p, _)| *p)
            .filter(|p| read.more.contains(p))
            .collect();
    }
    panic!("the reads never caught up");
}

/// Waits until reading `from` brings `expected` rows (the frontier may lag behind
/// commits), and returns them.
async fn readable(store: &Store, from: &[(u32, Position)], expected: usize) -> Vec<GroupRow> {
    let start = Instant::now();
    loop {
        let rows = read_pages(store, from, 1000).await;
        if rows.len() == expected {
            return rows;
        }
        assert!(
            rows.len() < expected && start.elapsed() < DEADLINE,
            "expected {expected} rows readable, got {:?}",
            ids_of(&rows)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The rows of `group` past its positions, once `expected` of them are readable.
async fn ahead(store: &Store, group: &str, expected: usize) -> Vec<MessageId> {
    let from = positions(store, group).await;
    sorted(ids_of(&readable(store, &from, expected).await))
}

/// Waits until `check` holds of what `probe` gives; panics with the last value at the
/// deadline.
async fn until<T: std::fmt::Debug, F: Future<Output = T>>(
    what: &str,
    mut probe: impl FnMut() -> F,
    check: impl Fn(&T) -> bool,
) -> T {
    let start = Instant::now();
    loop {
        let value = probe().await;
        if check(&value) {
            return value;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "never {what}; last seen: {value:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Produces rows of these keys, in order, created now; returns their ids.
async fn produce_keys(backend: &impl GroupBackend, keys: &[&str]) -> Vec<MessageId> {
    let mut ids = Vec::new();
    for (n, key) in keys.iter().enumerate() {
        ids.push(backend.produce(Some(key), &format!("{key}-{n}"), 0).await);
    }
    ids
}

fn ids_of(rows: &[GroupRow]) -> Vec<MessageId> {
    rows.iter().map(|r| r.message.id).collect()
}

fn sorted(mut ids: Vec<MessageId>) -> Vec<MessageId> {
    ids.sort_unstable();
    ids
}

/// Takes `partition` of `group` for `member`, which must be free.
async fn take(store: &Store, group: &str, member: &str, partition: u32) -> PartitionLease {
    store
        .acquire(group, member, partition, LEASE)
        .await
        .expect("acquire")
        .unwrap_or_else(|| panic!("partition {partition} of {group} is not free"))
}

/// One partition's flush at `lease`'s epoch.
fn flush(lease: &PartitionLease) -> Flush {
    Flush {
        partition: lease.partition,
        epoch: lease.epoch,
        ..Flush::default()
    }
}

/// A state row of `kind` for a row read, as a member writes it: due in an hour, its
/// second attempt, an error of its own.
fn state(row: &GroupRow, kind: StateKind) -> StateRow {
    StateRow {
        id: row.message.id,
        partition: row.partition,
        key: row.message.key.clone(),
        position: row.position,
        kind,
        attempts: 2,
        due_at: millis(Utc::now() + chrono::Duration::hours(1)),
        error: Some(format!("failed {}", row.message.id)),
    }
}

/// `at` to the millisecond, what every backend keeps of a time.
fn millis(at: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(at.timestamp_millis()).unwrap()
}

/// Whether `at` is within a few seconds of now: the database's clock, not the test's.
fn about_now(at: DateTime<Utc>) -> bool {
    (Utc::now() - at).num_seconds().abs() <= 5
}

/// The rows read of the partition with the most of them, in log order.
fn fullest_partition(rows: &[GroupRow]) -> (u32, Vec<GroupRow>) {
    let mut by_partition: BTreeMap<u32, Vec<GroupRow>> = BTreeMap::new();
    for row in rows {
        by_partition
            .entry(row.partition)
            .or_default()
            .push(row.clone());
    }
    by_partition
        .into_iter()
        .max_by_key(|(p, rows)| (rows.len(), std::cmp::Reverse(*p)))
        .expect("some rows")
}

/// Writes these state rows of `group` as a member does, each partition taken, flushed
/// (its position kept) and given back.
async fn write_state(store: &Store, group: &str, rows: &[StateRow]) {
    let mut by_partition: BTreeMap<u32, Vec<StateRow>> = BTreeMap::new();
    for row in rows {
        by_partition
            .entry(row.partition)
            .or_default()
            .push(row.clone());
    }
    for (partition, upserts) in by_partition {
        let lease = take(store, group, "writer", partition).await;
        let lost = store
            .flush(
                group,
                "writer",
                &[Flush {
                    upserts,
                    ..flush(&lease)
                }],
            )
            .await
            .expect("flush");
        assert!(lost.is_empty(), "the writer owns partition {partition}");
        store
            .release(group, "writer", &[partition])
            .await
            .expect("release");
    }
}

/// The state rows of `group` in every partition.
async fn all_state(store: &Store, group: &str) -> Vec<StateRow> {
    let mut rows = Vec::new();
    for partition in 0..PARTITIONS {
        rows.extend(
            store
                .load_state(group, partition)
                .await
                .expect("load state"),
        );
    }
    rows.sort_by_key(|r| r.id);
    rows
}

/// The rows read of `key`, in log order.
fn of_key<'a>(rows: &'a [GroupRow], key: &str) -> Vec<&'a GroupRow> {
    let mut of_key: Vec<&GroupRow> = rows
        .iter()
        .filter(|r| r.message.key.as_deref() == Some(key))
        .collect();
    of_key.sort_by_key(|r| r.position);
    of_key
}
