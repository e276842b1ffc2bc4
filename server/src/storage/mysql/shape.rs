//! The shape of one MySQL/MariaDB outbox table: its names (the table, its database, the
//! columns as SQL writes them, the index claims are pinned to) in [`Statements`], whose
//! statements the other files render, each for its part, per call; and what every part
//! writes alike: quoting, placeholders, the locking read by ids, a row as a message.
//!
//! Times: every column holds UTC in a `DATETIME(6)` (no time-zone conversion, range to the
//! year 9999, unlike `TIMESTAMP`'s 2038). Defaults are `UTC_TIMESTAMP(6)`, so a producer
//! inserting with any session `time_zone` still writes UTC, and the relay compares with
//! `UTC_TIMESTAMP(6)` or with a clock reading it took from the database (`now`).
//!
//! Column meanings are PostgreSQL's: `available_at` is when the row may next be claimed (a
//! claim sets it to the lease deadline, a nack to the retry time, a release to now plus
//! the delay); a pending row is *leased* while `leased_by` is set and `available_at` is in
//! the future.
//!
//! Id lists are bound one placeholder per id (`IN (?, ?, ...)`), so statements are
//! rendered per call (a few hundred bytes formatted: nothing next to the round trip).

use std::fmt::Display;
use std::time::Duration;

use crate::config::ident::Ident;
use crate::storage::names::{self, Dialect, Names};
use crate::storage::rows;
use crate::storage::sql_common::TableSql;
use crate::storage::TableOptions;

/// The names every statement of one outbox table is rendered from.
#[derive(Debug)]
pub(super) struct Statements {
    /// The table (in its database), its pauses table and its columns.
    pub table: TableSql,
    /// `` `table_pending_idx` ``, which the claim's scan is pinned to.
    pub pending_index: String,
    /// See [`Shape::dead_holds_key`]. The `(key, status, id)` index serves its lookups.
    pub dead_holds_key: bool,
    /// See [`Shape::max_row_bytes`].
    pub max_row_bytes: u64,
}

/// The database clock, read inside a transaction after its locks were taken.
pub(super) const NOW: &str = "SELECT UTC_TIMESTAMP(6)";

/// What shapes the statements besides the table name.
pub(super) struct Shape<'a> {
    /// The database (MySQL's "schema") holding the table; `None`: the connection's.
    pub database: Option<&'a Ident>,
    pub table: &'a Ident,
    /// Its columns, and the ordering and size rules its statements follow (with
    /// `dead_letter_holds_key`, [`Statements::claim_candidates`] keeps a key behind its
    /// dead row).
    pub options: &'a TableOptions,
}

/// How MySQL writes names: the relay's own bare, as its tables always had them (but
/// `` `key` ``, a reserved word), a configured one quoted; and the fixed topic as a value
/// that reads the same under every `sql_mode`.
pub(super) const DIALECT: Dialect = Dialect {
    column,
    literal: string_literal,
};

/// `name` as SQL: bare when it is the relay's own name `own` (but `` `key` ``), quoted
/// otherwise.
fn column(name: &Ident, own: &str) -> String {
    if name.as_str() == own && own != "key" {
        own.to_owned()
    } else {
        quote(name.as_str())
    }
}

/// A string as a MySQL value that reads the same under every `sql_mode`: hex bytes
/// reinterpreted as UTF-8 (a quoted literal's backslashes mean different things with and
/// without `NO_BACKSLASH_ESCAPES`).
fn string_literal(text: &str) -> String {
    let hex: String = text.bytes().map(|byte| format!("{byte:02x}")).collect();
    format!("CONVERT(X'{hex}' USING utf8mb4)")
}

impl Statements {
    pub fn render(shape: &Shape<'_>) -> Self {
        let in_database = |name: String| match shape.database {
            Some(database) => format!("{}.{name}", quote(database.as_str())),
            None => name,
        };
        Self {
            table: TableSql {
                display: match shape.database {
                    Some(database) => format!("{database}.{}", shape.table),
                    None => shape.table.to_string(),
                },
                quoted: in_database(quote(shape.table.as_str())),
                pauses: pauses_table(shape),
                names: Names::new(&shape.options.columns, &DIALECT),
            },
            pending_index: quote(&derived_name(shape.table.as_str(), PENDING_INDEX)),
            dead_holds_key: shape.options.dead_holds_key(),
            max_row_bytes: shape.options.max_row_bytes,
        }
    }

    /// A statement from `template` (see [`TableSql::fill`]).
    pub fn fill(&self, template: &str, values: &[(&str, &dyn Display)]) -> String {
        self.table.fill(template, values)
    }

    /// The columns of row `o` as a message (what [`super::convert`] decodes): `id, topic,
    /// key, payload, headers, attempts, created_at, stored_bytes`. A row whose stored size
    /// (payload, headers, topic and key) is over `max_row_bytes` comes without its payload
    /// (NULL) and headers, so the server never sends what no response could hold.
    pub fn message(&self) -> String {
        let c = &self.table.names;
        let headers = c
            .headers
            .as_ref()
            .map_or_else(|| "'{}'".to_owned(), |headers| format!("o.{headers}"));
        let topic = c.topic("o.");
        let size = self.fill(
            "(OCTET_LENGTH(o.{payload}) + COALESCE(OCTET_LENGTH({headers}), 0) \
             + OCTET_LENGTH({topic}) + COALESCE(OCTET_LENGTH(o.{key}), 0))",
            &[("headers", &headers), ("topic", &topic)],
        );
        let fits = format!("{size} <= {}", self.max_row_bytes);
        self.fill(
            "CAST(o.{id} AS SIGNED) AS id, {topic} AS topic, o.{key} AS `key`, \
               CASE WHEN {fits} THEN o.{payload} END AS payload, \
               CASE WHEN {fits} THEN {headers} END AS headers, \
               CAST(o.{attempts} AS SIGNED) AS attempts, o.{created_at} AS created_at, \
               CAST({size} AS SIGNED) AS stored_bytes",
            &[
                ("topic", &topic),
                ("fits", &fits),
                ("headers", &headers),
                ("size", &size),
            ],
        )
    }
}

/// The outbox's pauses table, quoted, in the table's database.
pub(super) fn pauses_table(shape: &Shape<'_>) -> String {
    let name = quote(&derived_name(shape.table.as_str(), "_pauses"));
    match shape.database {
        Some(database) => format!("{}.{name}", quote(database.as_str())),
        None => name,
    }
}

/// Backtick-quotes an identifier, doubling embedded backticks. Validated identifiers have
/// none, but quoting stays correct for any input. (`"` quotes strings in MySQL unless
/// `ANSI_QUOTES` is set, so [`Ident::quoted`] does not fit.)
pub(super) fn quote(ident: &str) -> String {
    format!("`{}`", ident.replace('`', "``"))
}

/// `?, ?, ...`: `n` placeholders (at least one; callers skip empty lists).
pub(super) fn placeholders(n: usize) -> String {
    vec!["?"; n.max(1)].join(", ")
}

/// `FORCE INDEX (PRIMARY) WHERE id IN (NULL, ?...)` with `n` ids: how every locking read
/// of this backend finds its rows, so that it keeps locked only the rows that match the
/// rest of its `WHERE`. Under READ COMMITTED, InnoDB releases the lock of a
/// row that does not match only when it was read by a range scan of the primary key
/// (tested on MariaDB 10.11, `pending_rows_of_others_stay_unlocked` in the contract
/// suite): a scan of a secondary index (which the optimizer picks for `status =
/// 'pending'`) or a single-row lookup (`id = ?`, or `IN` of one id) keeps it until the
/// transaction ends. A transaction stopped there (its replica paused, its database link
/// cut) would then hold rows another replica has leased, and that replica's acks would
/// wait on it. The `NULL` matches nothing and keeps even one id a range scan.
pub(super) fn locking_by_ids(id: &str, n: usize) -> String {
    format!(
        "FORCE INDEX (PRIMARY) WHERE {id} IN (NULL, {})",
        placeholders(n)
    )
}

/// Suffix of the claim's index, which [`Statements::claim_candidates`] names.
pub(super) const PENDING_INDEX: &str = "_pending_idx";

/// `table` + `suffix`, kept within MySQL's 64 characters (see [`names::derived_name`]).
pub(super) fn derived_name(table: &str, suffix: &str) -> String {
    names::derived_name(table, suffix, 64)
}

/// Microseconds for `INTERVAL ? MICROSECOND`, clamped (see [`rows::clamped`]).
pub(super) fn micros(duration: Duration) -> i64 {
    rows::clamped(duration).as_micros() as i64
}
