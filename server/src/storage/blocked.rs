//! Blocked keys: keys whose oldest pending row (their head) is leased or waiting for a
//! retry, so their later rows wait; and, under `dead_letter_holds_key`, keys whose later
//! rows wait behind a dead row (its oldest dead row is then the head, listed once a
//! pending row waits behind it). What an operator looks at when "a key is stuck".
//!
//! Cost. A strict PostgreSQL table answers through its key-heads table: heads in
//! `head_id` order, each key's first pending row looked up through the `(key, id)` index
//! of pending rows, so a page costs one lookup per key before its last blocked key, not
//! one per pending row (`strict_blocked_keys` in `postgres/admin.rs`; BENCHMARKS.md,
//! "Blocked keys", has the measurement and its command). Every other table answers with one statement
//! that visits the pending rows not due now (leased, or waiting for a retry), checks each
//! is its key's head through the `(key, id)` index of pending rows, and counts the rows
//! behind it through the same index. The pending rows not due now are found by a pass
//! over the pending rows (MySQL/MariaDB: a range of its `(status, available_at)` index):
//! there is deliberately no index on `available_at` elsewhere, since every claim moves it
//! and such an index would tax every claim for an operator's occasional look.
//! docs/operations.md has the measured cost on a million pending rows. Keys held by a dead row
//! are found by a second walk, over the dead rows in id order, each checked through the
//! `(key, id)` indexes of dead and pending rows: its cost follows the dead rows.

use chrono::{DateTime, Utc};

use super::names::Names;
use super::MessageId;

/// Why a key's head is not claimable now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadState {
    /// Leased to `owner` until `until`.
    Leased,
    /// Waiting for its retry (or a delayed release) at `until`.
    RetryWaiting,
    /// Dead since `until`, holding the key (`dead_letter_holds_key`) until an operator
    /// re-drives or discards it.
    Dead,
}

impl HeadState {
    /// A dead head (listed under `dead_letter_holds_key`) is dead; one with a lease owner
    /// is leased; one without waits for its retry.
    pub fn of(dead: bool, owner: Option<&str>) -> Self {
        if dead {
            Self::Dead
        } else if owner.is_some() {
            Self::Leased
        } else {
            Self::RetryWaiting
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Leased => "leased",
            Self::RetryWaiting => "retry_waiting",
            Self::Dead => "dead",
        }
    }
}

/// A key whose head holds its later rows back.
#[derive(Debug, Clone, PartialEq)]
pub struct BlockedKey {
    pub key: String,
    pub head_id: MessageId,
    pub state: HeadState,
    /// The lease owner, when leased.
    pub owner: Option<String>,
    pub attempts: u32,
    pub last_error: Option<String>,
    /// When the head was inserted: how long the key has been waiting at most.
    pub head_created_at: DateTime<Utc>,
    /// When the lease runs out, or the retry is due; when a dead head died.
    pub until: DateTime<Utc>,
    /// Pending rows of the key behind the head.
    pub waiting_behind: u64,
}

/// `EXISTS` a dead row of the key `key` (an SQL expression) before the id `id`: what
/// holds a row back under `dead_letter_holds_key`, in every backend's claim and blocked
/// keys, looked up through an index of the dead rows by key and id. Alias `x`.
pub fn dead_before(t: &str, n: &Names, key: &str, id: &str) -> String {
    format!(
        "EXISTS (SELECT 1 FROM {t} x WHERE x.{k} = {key} AND x.{status} = 'dead' \
         AND x.{i} < {id})",
        k = n.key,
        status = n.status,
        i = n.id,
    )
}

/// The keys a dead row holds (`dead_letter_holds_key`), as `FROM ... WHERE ...` of the
/// dead row `d` with an id above `after` (a placeholder): each key's oldest dead row, when
/// a pending row of the key waits behind it (a dead row with nothing behind holds nothing
/// yet; the dead-letter list has it). A walk over the dead rows in id order, each checked
/// through the indexes by key and id of dead and of pending rows: its cost follows the
/// dead rows, which an operator keeps few. `waiting` counts the rows behind (`count` is
/// the backend's `count(*)`, cast as it needs).
pub fn dead_heads(t: &str, n: &Names, after: &str, count: &str) -> (String, String) {
    let behind = |what: &str| {
        n.fill(
            "(SELECT {what} FROM {t} b WHERE b.{key} = d.{key} AND b.{status} = 'pending' \
             AND b.{id} > d.{id})",
            &[("t", &t), ("what", &what)],
        )
    };
    let from = n.fill(
        "FROM {t} d WHERE d.{status} = 'dead' AND d.{key} IS NOT NULL AND d.{id} > {after} \
         AND NOT {dead_before} AND EXISTS {behind}",
        &[
            ("t", &t),
            ("after", &after),
            (
                "dead_before",
                &dead_before(t, n, &format!("d.{}", n.key), &format!("d.{}", n.id)),
            ),
            ("behind", &behind("1")),
        ],
    );
    (from, behind(count))
}
