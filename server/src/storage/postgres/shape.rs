//! The shape of one PostgreSQL outbox table: its names (the table, its schema, the
//! objects named after it, the columns as SQL writes them) and the pieces of SQL that
//! every part of the backend writes alike: a row read as a message, an insert, the error
//! of a row a claim dead-lettered. Rendered once per table; nothing here runs a statement.

#[cfg(test)]
use crate::config::columns::Columns;
use crate::config::columns::PayloadFormat;
use crate::config::ident::{self, Ident};
use crate::storage::names::{self, Dialect, Names};
use crate::storage::TableOptions;

/// First half of the two-key advisory locks, so ours cannot collide with an
/// application's single-key locks. ASCII "txob".
pub(super) const LOCK_CLASS_CLAIM: i32 = 0x7478_6f62;
/// Serialises every `create_schema` of the database (servers starting together).
pub(super) const LOCK_CLASS_DDL: i32 = LOCK_CLASS_CLAIM + 1;

/// What shapes the statements besides the table name.
pub(super) struct Shape<'a> {
    pub schema: Option<&'a Ident>,
    pub table: &'a Ident,
    /// Its columns, and the ordering, delay and size rules its statements follow
    /// (`dead_letter_holds_key` under strict ordering: `strict.rs`).
    pub options: &'a TableOptions,
    pub notify_channel: Option<&'a Ident>,
}

impl Shape<'_> {
    /// `schema.table` unquoted, for messages.
    pub fn display_table(&self) -> String {
        match self.schema {
            Some(schema) => format!("{schema}.{}", self.table),
            None => self.table.to_string(),
        }
    }

    /// The table as the statements name it: quoted, with its schema when configured.
    pub fn table_sql(&self) -> String {
        self.qualified(&self.table.quoted())
    }

    /// `name` (quoted) in the table's schema, when one is configured.
    pub fn qualified(&self, name: &str) -> String {
        match self.schema {
            Some(schema) => format!("{}.{name}", schema.quoted()),
            None => name.to_owned(),
        }
    }

    /// The table's name with `suffix`, quoted: the name of an object made for the table.
    pub fn derived(&self, suffix: &str) -> String {
        ident::quote(&derived_name(self.table.as_str(), suffix))
    }

    /// The columns as this backend's SQL writes them.
    pub fn names(&self) -> Names {
        Names::new(&self.options.columns, &DIALECT)
    }

    /// The outbox's pauses table, quoted and qualified.
    pub fn pauses_table(&self) -> String {
        self.qualified(&self.derived("_pauses"))
    }
}

/// Suffix of the claim function's name, versioned: a server of another version on the
/// same table calls a function of its own (its DDL adds it), so a rolling upgrade works.
/// `v2`: paused topics (a seventh argument) are not claimed. `v3`: with an eighth argument
/// true (`dead_letter_holds_key`), a dead row holds back its key's later rows. `v4`: with
/// a ninth and tenth argument (keys, and an id per key), a key whose first rows the owner
/// itself holds up to that id is extended past them (see `strict.rs`). `v5`: the same
/// arguments and rows, with statements PostgreSQL plans once per session and no hash of the
/// backlog (see `strict.rs`); a new name so a server still on `v4`, restarting during
/// a rolling upgrade, does not put the old body back under this server. `v6`: the same
/// arguments and rows, every statement on a generic plan (and `advance` `v2`), for the
/// same reason a new name.
pub(super) const CLAIM_FUNCTION: &str = "_txo_claim_v6";
/// Suffix of the function that moves heads on (see `strict.rs`), versioned as the claim
/// function is. `v2`: the same, its statements on generic plans.
pub(super) const ADVANCE_FUNCTION: &str = "_txo_advance_v2";
/// The names of a strict table's objects, quoted and qualified.
pub(super) struct StrictObjects {
    /// The outbox table.
    pub table: String,
    pub heads: String,
    /// The insert trigger's function, and the trigger's name.
    pub trigger_function: String,
    pub trigger: String,
    pub heads_index: String,
    pub claim_function: String,
    pub advance_function: String,
    /// Hashed into the advisory lock key: the same for every server on this table.
    pub lock_key: String,
}

impl StrictObjects {
    pub fn new(shape: &Shape<'_>) -> Self {
        Self {
            table: shape.table_sql(),
            heads: shape.qualified(&shape.derived("_heads")),
            trigger_function: shape.qualified(&shape.derived("_heads_on_insert")),
            trigger: shape.derived("_heads_on_insert"),
            heads_index: shape.derived("_heads_idx"),
            claim_function: shape.qualified(&shape.derived(CLAIM_FUNCTION)),
            advance_function: shape.qualified(&shape.derived(ADVANCE_FUNCTION)),
            lock_key: format!("txoutbox:{}", shape.display_table()),
        }
    }
}

/// `table` + `suffix`, kept within PostgreSQL's 63 bytes (see [`names::derived_name`]).
pub(super) fn derived_name(table: &str, suffix: &str) -> String {
    names::derived_name(table, suffix, ident::MAX_LEN)
}

/// How PostgreSQL writes names (every one quoted, so its case is kept) and the fixed
/// topic (a `text` literal).
pub(super) const DIALECT: Dialect = Dialect {
    column: quoted_column,
    literal: text_literal,
};

fn quoted_column(name: &Ident, _own: &str) -> String {
    name.quoted()
}

fn text_literal(text: &str) -> String {
    format!("{}::text", literal(text))
}

/// The columns of row `alias` as a message: `id, topic, key, payload, headers,
/// attempts, created_at, stored_bytes`, named so for decoding whatever the table calls
/// them. A row whose stored size (payload, headers, topic and key as stored) is over
/// `max_row_bytes` comes without its payload (NULL) and headers: the database never sends
/// what no response could hold (see [`crate::storage::OutboxMessage::too_large`]).
pub(super) fn message(n: &Names, alias: &str, max_row_bytes: u64) -> String {
    let payload = format!("{alias}.{}", n.payload);
    let payload = match n.payload_format {
        PayloadFormat::Bytes => payload,
        PayloadFormat::Text => format!("convert_to({payload}, 'UTF8')"),
        PayloadFormat::Json => format!("convert_to({payload}::text, 'UTF8')"),
    };
    let headers = match &n.headers {
        // A team's own table may leave its headers NULL: no headers, as elsewhere.
        Some(headers) => format!("coalesce({alias}.{headers}::jsonb, '{{}}'::jsonb)"),
        None => "'{}'::jsonb".to_owned(),
    };
    let topic = n.topic(&format!("{alias}."));
    let size = format!(
        "(octet_length({payload})::int8 + octet_length({headers}::text) \
         + octet_length({topic}) + coalesce(octet_length({alias}.{key}::text), 0))",
        key = n.key,
    );
    let fits = format!("{size} <= {max_row_bytes}");
    format!(
        "{alias}.{id}::int8 AS id, {topic} AS topic, {alias}.{key}::text AS key, \
         CASE WHEN {fits} THEN {payload} END AS payload, \
         CASE WHEN {fits} THEN {headers} ELSE '{{}}'::jsonb END AS headers, \
         {alias}.{attempts}::int4 AS attempts, {alias}.{created_at} AS created_at, \
         {size} AS stored_bytes",
        id = n.id,
        key = n.key,
        attempts = n.attempts,
        created_at = n.created_at,
    )
}

/// `INSERT` of one message; binds in order: the topic (only with a topic column), key,
/// payload (bytes, or a string for text and JSON), headers (only with a headers column).
pub(super) fn insert(n: &Names, t: &str) -> String {
    let values: Vec<String> = n
        .inserted()
        .iter()
        .enumerate()
        .map(|(i, column)| {
            let cast = if *column == n.payload && n.payload_format == PayloadFormat::Json {
                "::jsonb"
            } else {
                ""
            };
            format!("${}{cast}", i + 1)
        })
        .collect();
    format!(
        "INSERT INTO {t} ({}) VALUES ({}) RETURNING {}::int8",
        n.inserted().join(", "),
        values.join(", "),
        n.id
    )
}

/// `text` as a SQL string literal (standard_conforming_strings, on since PostgreSQL 9.1).
pub(super) fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// The `last_error` of a row (alias `alias`) dead-lettered by a claim because it was
/// claimed `max_attempts` (the SQL expression `max_attempts`) times without an answer.
pub(super) fn exhausted_error(n: &Names, alias: &str, max_attempts: &str) -> String {
    n.fill(
        "format('claimed %s times without an answer (max_attempts = %s)', \
         {alias}.{attempts}, {max_attempts}) \
         || coalesce('; last error: ' || {alias}.{last_error}, '')",
        &[("alias", &alias), ("max_attempts", &max_attempts)],
    )
}

/// A strict table's options with `columns`, for the backend's tests.
#[cfg(test)]
pub(super) fn test_options(columns: &Columns) -> TableOptions {
    TableOptions {
        columns: columns.clone(),
        ..TableOptions::default()
    }
}

/// A table's shape, for the backend's tests.
#[cfg(test)]
pub(super) fn test_shape<'a>(
    table: &'a Ident,
    options: &'a TableOptions,
    channel: Option<&'a Ident>,
) -> Shape<'a> {
    Shape {
        schema: None,
        table,
        options,
        notify_channel: channel,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_names_fit_and_stay_distinct() {
        let long = "t".repeat(63);
        let a = derived_name(&long, "_pending_idx");
        let b = derived_name(&long, "_key_pending_idx");
        assert!(a.len() <= 63 && b.len() <= 63);
        assert_ne!(a, b);
        assert_eq!(derived_name("outbox", "_pending_idx"), "outbox_pending_idx");
    }
}
