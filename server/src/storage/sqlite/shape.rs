//! The shape of one SQLite outbox table: its names (the table, the columns as SQL writes
//! them) in [`Statements`], whose statements the other files render, each for its part;
//! and what every part writes alike: the fence of a write-back, a row as a message.
//!
//! Times are integers: Unix epoch milliseconds (UTC). Integers compare and add exactly,
//! and a producer's plain `INSERT` gets them from the column defaults, which read the
//! same machine clock the server reads (SQLite has no server: the database clock *is*
//! the machine's clock). "Now" is taken once per operation in Rust
//! ([`super::convert::now_ms`]) and bound as a parameter, after the write lock is held,
//! so a claim that waited for the lock does not hand out a lease shortened by that wait.
//!
//! Column meanings are PostgreSQL's: `available_at` is when the row may next be claimed
//! (a claim sets it to the lease deadline, a nack to the retry time, a release to now plus
//! the delay); a pending row is *leased* while `leased_by` is set and `available_at` is in
//! the future.
//!
//! Id lists and topic filters are bound as one JSON array and read with `json_each`, so
//! every statement has a fixed text (and a cached prepared statement) for any list length:
//! rendered per call, it is the same text each time.

use std::fmt::Display;

use crate::config::ident::{self, Ident};
use crate::storage::names::{Dialect, Names};
use crate::storage::sql_common::TableSql;
use crate::storage::TableOptions;

/// The machine clock in epoch milliseconds, as SQL, for column defaults. Truncated like
/// [`super::convert::now_ms`], so a row inserted "now" is never ahead of the server's now.
/// `julianday` rather than `unixepoch('subsec')`, which needs SQLite 3.42: producers
/// (and the `sqlite3` shell) may link an older library.
pub(super) const NOW_MS: &str = "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)";

/// The names every statement of one outbox table is rendered from, and what shapes them.
#[derive(Debug)]
pub(super) struct Statements {
    /// The table, its pauses table and its columns.
    pub table: TableSql,
    /// Fence of every write-back: `?1` ids (a JSON array), `?2` owner.
    pub held: String,
    /// See [`Shape::max_row_bytes`].
    pub max_row_bytes: u64,
    pub strict_ordering: bool,
    /// See [`Shape::dead_holds_key`].
    pub dead_holds_key: bool,
    /// Whether the table has a visibility delay (a parameter of the claim).
    pub delayed: bool,
}

impl Statements {
    pub fn render(shape: &Shape<'_>) -> Self {
        let names = Names::new(&shape.options.columns, &DIALECT);
        Self {
            held: names.fill(
                "WHERE {id} IN (SELECT value FROM json_each(?1)) AND {leased_by} = ?2 \
                 AND {status} = 'pending'",
                &[],
            ),
            table: TableSql {
                display: shape.table.to_string(),
                quoted: shape.table.quoted(),
                pauses: pauses_table(shape.table),
                names,
            },
            max_row_bytes: shape.options.max_row_bytes,
            strict_ordering: shape.options.strict_ordering,
            dead_holds_key: shape.options.dead_holds_key(),
            delayed: !shape.options.visibility_delay.is_zero(),
        }
    }

    /// A statement from `template` (see [`TableSql::fill`]), `{held}` in it the fence of
    /// a write-back.
    pub fn fill(&self, template: &str, values: &[(&str, &dyn Display)]) -> String {
        let mut all: Vec<(&str, &dyn Display)> = vec![("held", &self.held)];
        all.extend_from_slice(values);
        self.table.fill(template, &all)
    }
}

/// What shapes the statements besides the table name.
pub(super) struct Shape<'a> {
    pub table: &'a Ident,
    /// Its columns, and the ordering, delay and size rules its statements follow (with
    /// `dead_letter_holds_key`, a dead row holds back its key's later rows: `claim.rs`).
    pub options: &'a TableOptions,
}

/// How SQLite writes names: the relay's own bare, as its tables always had them (none is
/// a word SQLite reserves), a configured one quoted; and the fixed topic as a literal.
pub(super) const DIALECT: Dialect = Dialect {
    column,
    literal: string_literal,
};

/// `name` as SQL: bare when it is the relay's own name `own`, quoted otherwise.
fn column(name: &Ident, own: &str) -> String {
    if name.as_str() == own {
        own.to_owned()
    } else {
        name.quoted()
    }
}

/// A string as an SQLite literal. SQLite has no backslash escapes: doubling the quote is
/// all there is to it.
fn string_literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// `expr AS name`, or just `name` when the expression is that column already.
pub(super) fn aliased(expr: &str, name: &str) -> String {
    if expr == name {
        name.to_owned()
    } else {
        format!("{expr} AS {name}")
    }
}

/// The message columns under the relay's own names (what [`super::convert`] decodes),
/// payload as bytes whatever a producer stored (`'hello'` from the `sqlite3` shell is TEXT
/// in a BLOB column; a TEXT or JSON payload column gives its UTF-8 text), and the row's
/// stored size in bytes (payload, headers, topic and key). A row over `max_row_bytes`
/// comes without its payload (NULL) and headers: no response could hold them.
pub(super) fn message(c: &Names, max_row_bytes: u64) -> String {
    let headers = c.headers.as_deref().unwrap_or("'{}'");
    let bytes = |value: &str| format!("coalesce(length(CAST({value} AS BLOB)), 0)");
    let size = format!(
        "({} + {} + {} + {})",
        bytes(&c.payload),
        bytes(headers),
        bytes(&c.topic("")),
        bytes(&c.key)
    );
    let fits = format!("{size} <= {max_row_bytes}");
    [
        aliased(&c.id, "id"),
        aliased(&c.topic(""), "topic"),
        aliased(&c.key, "key"),
        format!(
            "CASE WHEN {fits} THEN CAST({} AS BLOB) END AS payload",
            c.payload
        ),
        format!("CASE WHEN {fits} THEN {headers} END AS headers"),
        aliased(&c.attempts, "attempts"),
        aliased(&c.created_at, "created_at"),
        format!("{size} AS stored_bytes"),
    ]
    .join(", ")
}

/// The outbox's pauses table, quoted.
pub(super) fn pauses_table(table: &Ident) -> String {
    ident::quote(&format!("{table}_pauses"))
}
