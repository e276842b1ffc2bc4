//! Blocked keys: keys whose oldest pending row (their head) is leased or waiting for a
//! retry, so their later rows wait. What an operator looks at when "a key is stuck".
//!
//! Cost. A strict PostgreSQL table answers through its key-heads table: heads in
//! `head_id` order, each key's first pending row looked up through the `(key, id)` index
//! of pending rows, so a page costs one lookup per key before its last blocked key, not
//! one per pending row (`postgres::heads::blocked_keys`; BENCHMARKS.md, "Blocked keys",
//! has the measurement and its command). Every other table answers with one statement
//! that visits the pending rows not due now (leased, or waiting for a retry), checks each
//! is its key's head through the `(key, id)` index of pending rows, and counts the rows
//! behind it through the same index. The pending rows not due now are found by a pass
//! over the pending rows (MySQL/MariaDB: a range of its `(status, available_at)` index):
//! there is deliberately no index on `available_at` elsewhere, since every claim moves it
//! and such an index would tax every claim for an operator's occasional look. README,
//! Operations, has the measured cost on a million pending rows.

use chrono::{DateTime, Utc};

use super::MessageId;

/// Why a key's head is not claimable now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadState {
    /// Leased to `owner` until `until`.
    Leased,
    /// Waiting for its retry (or a delayed release) at `until`.
    RetryWaiting,
}

impl HeadState {
    /// A head with a lease owner is leased; one without waits for its retry.
    pub fn of(owner: Option<&str>) -> Self {
        if owner.is_some() {
            Self::Leased
        } else {
            Self::RetryWaiting
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Leased => "leased",
            Self::RetryWaiting => "retry_waiting",
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
    /// When the lease runs out, or the retry is due.
    pub until: DateTime<Utc>,
    /// Pending rows of the key behind the head.
    pub waiting_behind: u64,
}
