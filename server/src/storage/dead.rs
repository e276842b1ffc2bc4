//! Dead letters as an operator sees them: which rows died and why, and the two ways out
//! (re-drive, discard). Shared by every backend: the selector, what a listed row holds,
//! and the `WHERE` conditions a selector renders to, in each backend's placeholders.
//!
//! Re-drive keeps per-key order without anything special: it makes rows pending again
//! with their original ids, and every backend's strict claim hands out a key's pending
//! rows in id order (PostgreSQL also moves the key's head back to the lowest re-driven
//! row, see its re-drive in `postgres/admin.rs`). A re-driven row that is older than a row of its key
//! already leased cannot overtake that one; it goes before every later pending row.

use chrono::{DateTime, Utc};

use super::names::Names;
use super::rows::count;
use super::{MessageId, OutboxMessage};

/// Most rows one list, re-drive or discard touches: an operator's command never holds a
/// long transaction, and repeats to go further.
pub const MAX_PER_CALL: u32 = 1000;
/// Most groups a count returns (largest first).
pub const MAX_COUNT_GROUPS: i64 = 1000;

/// Which dead rows an operation selects; every set field must match.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeadFilter {
    /// Only these ids; empty: any.
    pub ids: Vec<MessageId>,
    pub topic: Option<String>,
    pub key: Option<String>,
    /// The last error contains this text.
    pub error_contains: Option<String>,
    /// Died at or after this time.
    pub died_after: Option<DateTime<Utc>>,
    /// Died before this time.
    pub died_before: Option<DateTime<Utc>>,
}

/// A dead row.
#[derive(Debug, Clone, PartialEq)]
pub struct DeadLetter {
    pub message: OutboxMessage,
    pub last_error: String,
    /// When it was dead-lettered (`processed_at`).
    pub died_at: Option<DateTime<Utc>>,
}

/// Dead rows of one topic with one error.
#[derive(Debug, Clone, PartialEq)]
pub struct DeadCount {
    pub topic: String,
    pub error: String,
    pub count: u64,
}

/// A row of a backend's `dead_count` statement: one group, and the total of every group
/// (the same on each row). PostgreSQL and SQLite decode it by column name
/// (`sqlx::FromRow`); MySQL's text columns need decoding by hand (its `convert::text`).
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct DeadCountRow {
    pub topic: String,
    pub error: String,
    pub count: i64,
    pub total: i64,
}

impl super::DeadCounts {
    /// The counts a backend's `dead_count` statement returned.
    pub fn from_rows(rows: Vec<DeadCountRow>) -> Self {
        let total = rows.first().map_or(0, |row| count(row.total));
        let groups = rows
            .into_iter()
            .map(|row| DeadCount {
                topic: row.topic,
                error: row.error,
                count: count(row.count),
            })
            .collect();
        Self { groups, total }
    }
}

/// A value a rendered condition binds, in order. Each backend binds it its own way (an
/// array, a JSON list, one placeholder per id; a timestamp or epoch milliseconds).
#[derive(Debug, Clone, PartialEq)]
pub enum FilterValue<'a> {
    Ids(&'a [MessageId]),
    Text(&'a str),
    Time(DateTime<Utc>),
}

/// How a backend writes what the conditions need.
pub struct FilterDialect {
    /// The next placeholder, given how many came before (`$3`, `?3`, `?`).
    pub placeholder: fn(usize) -> String,
    /// `column` is one of the ids bound to the placeholder(s); `count` ids.
    pub in_ids: fn(column: &str, next: &mut dyn FnMut() -> String, count: usize) -> String,
    /// `column` contains the text bound to `placeholder`.
    pub contains: fn(column: &str, placeholder: &str) -> String,
}

/// Renders the conditions of `filter` on the row alias `o` as ` AND ...` clauses, with
/// placeholders numbered from `first`; returns them with the values to bind, in order.
pub fn conditions<'a>(
    filter: &'a DeadFilter,
    n: &Names,
    dialect: &FilterDialect,
    first: usize,
) -> (String, Vec<FilterValue<'a>>) {
    let mut number = first;
    let mut next = || {
        let placeholder = (dialect.placeholder)(number);
        number += 1;
        placeholder
    };
    let mut sql = String::new();
    let mut values = Vec::new();
    if !filter.ids.is_empty() {
        let column = format!("o.{}", n.id);
        sql += &format!(
            " AND {}",
            (dialect.in_ids)(&column, &mut next, filter.ids.len())
        );
        values.push(FilterValue::Ids(&filter.ids));
    }
    if let Some(topic) = &filter.topic {
        sql += &format!(" AND {} = {}", n.topic("o."), next());
        values.push(FilterValue::Text(topic));
    }
    if let Some(key) = &filter.key {
        sql += &format!(" AND o.{} = {}", n.key, next());
        values.push(FilterValue::Text(key));
    }
    if let Some(text) = &filter.error_contains {
        let column = format!("o.{}", n.last_error);
        sql += &format!(" AND {}", (dialect.contains)(&column, &next()));
        values.push(FilterValue::Text(text));
    }
    if let Some(after) = filter.died_after {
        sql += &format!(" AND o.{} >= {}", n.processed_at, next());
        values.push(FilterValue::Time(after));
    }
    if let Some(before) = filter.died_before {
        sql += &format!(" AND o.{} < {}", n.processed_at, next());
        values.push(FilterValue::Time(before));
    }
    (sql, values)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::columns::Columns;
    use crate::storage::names::Dialect;

    const PLAIN: Dialect = Dialect {
        column: |name, _| name.to_string(),
        literal: |text| format!("'{text}'"),
    };

    fn numbered(number: usize) -> String {
        format!("${number}")
    }

    fn expanded(column: &str, next: &mut dyn FnMut() -> String, count: usize) -> String {
        let list: Vec<String> = (0..count).map(|_| next()).collect();
        format!("{column} IN ({})", list.join(", "))
    }

    #[test]
    fn only_the_set_fields_become_conditions_numbered_in_order() {
        let n = Names::new(&Columns::default(), &PLAIN);
        let dialect = FilterDialect {
            placeholder: numbered,
            in_ids: expanded,
            contains: |column, p| format!("strpos({column}, {p}) > 0"),
        };
        let none = DeadFilter::default();
        let (sql, values) = conditions(&none, &n, &dialect, 1);
        assert!(sql.is_empty() && values.is_empty());
        let filter = DeadFilter {
            ids: vec![4, 9],
            key: Some("k".into()),
            error_contains: Some("timeout".into()),
            ..DeadFilter::default()
        };
        let (sql, values) = conditions(&filter, &n, &dialect, 3);
        assert_eq!(
            sql,
            " AND o.id IN ($3, $4) AND o.key = $5 AND strpos(o.last_error, $6) > 0"
        );
        assert_eq!(
            values,
            [
                FilterValue::Ids(&[4, 9]),
                FilterValue::Text("k"),
                FilterValue::Text("timeout")
            ]
        );
    }
}
