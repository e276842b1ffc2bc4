//! The columns of an outbox table as every backend writes them into SQL, rendered once
//! from the validated [`Columns`] with the backend's quoting: the one thing the dialects
//! differ in here. PostgreSQL quotes every name (`"id"`); MySQL and SQLite write the
//! relay's own names bare, as their tables always had them, and quote a configured one.

use super::columns::{Columns, PayloadFormat, TopicSource};
use super::ident::Ident;

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
