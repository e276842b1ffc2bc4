//! The columns of an outbox table as every backend writes them into SQL, rendered once
//! from the validated [`Columns`] with the backend's quoting: the one thing the dialects
//! differ in here. PostgreSQL quotes every name (`"id"`); MySQL and SQLite write the
//! relay's own names bare, as their tables always had them, and quote a configured one.

use std::fmt::{Display, Write as _};

use crate::config::columns::{Columns, PayloadFormat, TopicSource};
use crate::config::ident::Ident;

/// How one SQL dialect writes names and strings.
pub struct Dialect {
    /// A column name: its validated [`Ident`] and the relay's own name for the role.
    pub column: fn(&Ident, &'static str) -> String,
    /// A string as a SQL value (the fixed topic).
    pub literal: fn(&str) -> String,
}

/// The columns of one table as they appear in SQL.
#[derive(Debug, Clone)]
pub struct Names {
    pub id: String,
    /// `None`: every row has the fixed topic; the table has no topic column.
    pub topic: Option<String>,
    /// The fixed topic as a SQL value, when there is one.
    fixed_topic: Option<String>,
    pub key: String,
    pub payload: String,
    pub payload_format: PayloadFormat,
    /// `None`: the table has no headers column; messages carry none.
    pub headers: Option<String>,
    pub created_at: String,
    pub status: String,
    pub attempts: String,
    pub available_at: String,
    pub leased_by: String,
    pub last_error: String,
    pub processed_at: String,
}

impl Names {
    pub fn new(columns: &Columns, dialect: &Dialect) -> Self {
        let column = dialect.column;
        let (topic, fixed_topic) = match &columns.topic {
            TopicSource::Column(name) => (Some(column(name, "topic")), None),
            TopicSource::Fixed(fixed) => (None, Some((dialect.literal)(fixed))),
        };
        Self {
            id: column(&columns.id, "id"),
            topic,
            fixed_topic,
            key: column(&columns.key, "key"),
            payload: column(&columns.payload, "payload"),
            payload_format: columns.payload_format,
            headers: columns.headers.as_ref().map(|name| column(name, "headers")),
            created_at: column(&columns.created_at, "created_at"),
            status: column(&columns.status, "status"),
            attempts: column(&columns.attempts, "attempts"),
            available_at: column(&columns.available_at, "available_at"),
            leased_by: column(&columns.leased_by, "leased_by"),
            last_error: column(&columns.last_error, "last_error"),
            processed_at: column(&columns.processed_at, "processed_at"),
        }
    }

    /// The topic as a value: the column after `prefix` (a table alias and its dot, or
    /// nothing), or the fixed topic.
    pub fn topic(&self, prefix: &str) -> String {
        match (&self.topic, &self.fixed_topic) {
            (Some(topic), _) => format!("{prefix}{topic}"),
            (None, Some(fixed)) => fixed.clone(),
            (None, None) => unreachable!("a topic column or a fixed topic"),
        }
    }

    /// The column of a role by the relay's name for it (`status`, `leased_by`, ...): the ten
    /// roles every table has. The topic and the headers may be absent or fixed, so they are
    /// no role here: a statement writes [`Names::topic`] or the optional column itself.
    pub fn role(&self, role: &str) -> Option<&str> {
        Some(match role {
            "id" => &self.id,
            "key" => &self.key,
            "payload" => &self.payload,
            "created_at" => &self.created_at,
            "status" => &self.status,
            "attempts" => &self.attempts,
            "available_at" => &self.available_at,
            "leased_by" => &self.leased_by,
            "last_error" => &self.last_error,
            "processed_at" => &self.processed_at,
            _ => return None,
        })
    }

    /// A statement from `template`, written with the roles' names: each `{role}` (see
    /// [`Names::role`]) becomes this table's column for it and each other `{name}` the value
    /// `values` gives it. A statement reads the same whatever the table calls its columns,
    /// and names only what it uses. A `{` not followed by a name and `}` is SQL's own (an
    /// array literal `'{}'`) and stays.
    ///
    /// # Panics
    /// On a `{name}` neither a role nor in `values`: templates are the relay's own text,
    /// so that is a typo, found by the first test that renders the statement.
    pub fn fill(&self, template: &str, values: &[(&str, &dyn Display)]) -> String {
        let mut sql = String::with_capacity(template.len() * 2);
        let mut rest = template;
        while let Some(open) = rest.find('{') {
            sql.push_str(&rest[..open]);
            let after = &rest[open + 1..];
            let name_len = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            let name = &after[..name_len];
            let closed = after[name_len..].starts_with('}');
            if name.is_empty() || !closed || name.starts_with(|c: char| c.is_ascii_digit()) {
                sql.push('{');
                rest = after;
                continue;
            }
            if let Some(column) = self.role(name) {
                sql.push_str(column);
            } else if let Some((_, value)) = values.iter().find(|(key, _)| *key == name) {
                write!(sql, "{value}").expect("writing to a String");
            } else {
                panic!("statement template names `{{{name}}}`, neither a column role nor a value given: {template}");
            }
            rest = &after[name_len + 1..];
        }
        sql.push_str(rest);
        sql
    }

    /// The columns an insert writes, in the order of its parameters: the topic (only with
    /// a topic column), key, payload, headers (only with a headers column).
    pub fn inserted(&self) -> Vec<&str> {
        let mut inserted = Vec::new();
        inserted.extend(self.topic.as_deref());
        inserted.extend([self.key.as_str(), &self.payload]);
        inserted.extend(self.headers.as_deref());
        inserted
    }
}

/// `table` + `suffix` (an index, a trigger, a function), kept within `max_len`, the
/// database's limit on names. A long table name is cut and tagged with a hash of the full
/// name, so two long tables sharing a prefix, or two suffixes of one table, never truncate
/// to the same name (`IF NOT EXISTS` would then silently skip an index).
pub fn derived_name(table: &str, suffix: &str, max_len: usize) -> String {
    if table.len() + suffix.len() <= max_len {
        return format!("{table}{suffix}");
    }
    let keep = max_len - suffix.len() - 9;
    format!("{}_{:08x}{suffix}", &table[..keep], fnv1a32(table))
}

/// FNV-1a: tiny and stable across Rust releases, unlike `DefaultHasher`.
fn fnv1a32(text: &str) -> u32 {
    text.bytes().fold(0x811c_9dc5, |hash: u32, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    })
}

/// Numbered placeholders (`$5`, `?2`) handed out in order, for statements whose optional
/// filters (a topic list, a visibility cutoff) add parameters after the fixed ones.
pub struct Placeholders {
    sigil: char,
    next: usize,
}

impl Placeholders {
    pub fn starting_at(sigil: char, first: usize) -> Self {
        Self { sigil, next: first }
    }

    /// The next placeholder.
    pub fn take(&mut self) -> String {
        let placeholder = format!("{}{}", self.sigil, self.next);
        self.next += 1;
        placeholder
    }

    /// The number the next placeholder would have.
    pub fn next_number(&self) -> usize {
        self.next
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::columns::ColumnMapping;

    const QUOTED: Dialect = Dialect {
        column: |name, _| format!("\"{name}\""),
        literal: |text| format!("'{text}'"),
    };

    fn mapped() -> Names {
        let mapping = ColumnMapping {
            status: "state".to_owned(),
            ..ColumnMapping::default()
        };
        Names::new(&Columns::from_mapping(&mapping).unwrap(), &QUOTED)
    }

    #[test]
    fn a_template_names_roles_and_values_and_keeps_sqls_own_braces() {
        let sql = mapped().fill(
            "UPDATE {t} SET {status} = 'done' WHERE {id} = ANY('{}') LIMIT {limit}",
            &[("t", &"outbox"), ("limit", &10)],
        );
        assert_eq!(
            sql,
            "UPDATE outbox SET \"state\" = 'done' WHERE \"id\" = ANY('{}') LIMIT 10"
        );
        assert_eq!(mapped().fill("'{1,2}' {", &[]), "'{1,2}' {");
    }

    #[test]
    #[should_panic(expected = "`{stauts}`")]
    fn a_template_naming_nothing_known_is_a_bug_found_at_once() {
        mapped().fill("SELECT {stauts} FROM t", &[]);
    }
}
