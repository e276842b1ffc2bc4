//! What every backend is told about its table, whatever the database.

use std::time::Duration;

use crate::config::columns::Columns;

/// Per-outbox settings of a table, the same on every backend. What only one backend has
/// (PostgreSQL's schema and insert channel, MySQL's database) is an argument of its own
/// constructor.
#[derive(Debug, Clone)]
pub struct TableOptions {
    pub table: String,
    /// Hold a row back while an earlier pending row with the same key is leased or
    /// waiting for its retry.
    pub strict_ordering: bool,
    /// With `strict_ordering`: a dead row also holds back its key's later rows, until an
    /// operator re-drives or discards it (docs/operations.md). Ignored without it.
    pub dead_letter_holds_key: bool,
    /// Delete delivered rows instead of marking them `done`.
    pub delete_on_ack: bool,
    /// Claim only rows at least this old: ids are assigned at insert, not at commit, so a
    /// slow producer transaction can commit a lower id after a higher one was delivered.
    /// Zero disables it.
    pub visibility_delay: Duration,
    /// Column names of the table (see [`Columns`]).
    pub columns: Columns,
    /// Rows whose stored size (payload, headers, topic and key, measured in SQL) is over
    /// this are read without their payload and headers ([`super::OutboxMessage::too_large`]):
    /// `server.max_message_bytes`, since no response holds more.
    pub max_row_bytes: u64,
}

impl TableOptions {
    /// Whether a dead row holds its key's later rows back: the policy, under strict
    /// ordering only.
    pub fn dead_holds_key(&self) -> bool {
        self.strict_ordering && self.dead_letter_holds_key
    }
}

impl Default for TableOptions {
    fn default() -> Self {
        Self {
            table: "outbox".to_owned(),
            strict_ordering: true,
            dead_letter_holds_key: false,
            delete_on_ack: false,
            visibility_delay: Duration::ZERO,
            columns: Columns::default(),
            max_row_bytes: crate::config::DEFAULT_MAX_MESSAGE_BYTES as u64,
        }
    }
}
