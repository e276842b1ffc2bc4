//! `[outboxes.NAME.columns]`: the columns of an outbox table, the relay's own names or a
//! team's existing table mapped in configuration ("bring your own table").
//!
//! A mapping names the message columns the producer writes (id, topic or a fixed topic,
//! key, payload in one of three formats, optional headers, created-at) and the relay's
//! bookkeeping columns. [`Columns::from_mapping`] validates it into [`Columns`], reporting
//! every problem at once; the storage renders its SQL from those and checks them against
//! the live table (`storage::columns`).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::ident::Ident;

/// How the payload column holds the message bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PayloadFormat {
    /// A binary column (`bytea`, `BLOB`, `LONGBLOB`): handed out as stored.
    #[default]
    Bytes,
    /// A text column: handed out as its UTF-8 bytes.
    Text,
    /// A JSON column: handed out as the JSON text's UTF-8 bytes (PostgreSQL's `jsonb`
    /// normalises whitespace and key order).
    Json,
}

impl PayloadFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Bytes => "bytes",
            Self::Text => "text",
            Self::Json => "json",
        }
    }
}

/// `[outboxes.NAME.columns]`: column names as configured. Every field defaults to the
/// relay's own name, so a mapping lists only what differs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ColumnMapping {
    pub id: String,
    /// Column holding each row's topic; `"topic"` unless `fixed_topic` is set.
    pub topic: Option<String>,
    /// Every row of the table has this topic; the table has no topic column.
    pub fixed_topic: Option<String>,
    pub key: String,
    pub payload: String,
    pub payload_format: PayloadFormat,
    /// Column of string headers (a JSON object); empty: the table has none and messages
    /// carry no headers.
    pub headers: String,
    pub created_at: String,
    pub status: String,
    pub attempts: String,
    pub available_at: String,
    pub leased_by: String,
    pub last_error: String,
    pub processed_at: String,
}

impl Default for ColumnMapping {
    fn default() -> Self {
        Self {
            id: "id".to_owned(),
            topic: None,
            fixed_topic: None,
            key: "key".to_owned(),
            payload: "payload".to_owned(),
            payload_format: PayloadFormat::Bytes,
            headers: "headers".to_owned(),
            created_at: "created_at".to_owned(),
            status: "status".to_owned(),
            attempts: "attempts".to_owned(),
            available_at: "available_at".to_owned(),
            leased_by: "leased_by".to_owned(),
            last_error: "last_error".to_owned(),
            processed_at: "processed_at".to_owned(),
        }
    }
}

/// Where a message's topic comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TopicSource {
    Column(Ident),
    /// Every row has this topic.
    Fixed(String),
}

/// Validated column names of one outbox table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Columns {
    pub id: Ident,
    pub topic: TopicSource,
    pub key: Ident,
    pub payload: Ident,
    pub payload_format: PayloadFormat,
    pub headers: Option<Ident>,
    pub created_at: Ident,
    pub status: Ident,
    pub attempts: Ident,
    pub available_at: Ident,
    pub leased_by: Ident,
    pub last_error: Ident,
    pub processed_at: Ident,
}

impl Default for Columns {
    fn default() -> Self {
        Self::from_mapping(&ColumnMapping::default()).expect("the default names are valid")
    }
}

/// What a column is for, which decides the types it may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnKind {
    /// The row id: an integer that grows with insertion order.
    Id,
    /// Topic or key: a string.
    Text,
    Payload(PayloadFormat),
    /// A JSON object of strings.
    Headers,
    /// A point in time.
    Timestamp,
    /// The relay's status (`pending`, `done`, `dead`): a string with a default.
    Status,
    /// The attempts counter: an integer with a default.
    Counter,
    /// A relay column that is empty until the relay sets it: nullable.
    NullableText,
    NullableTimestamp,
    /// When a row may next be claimed: a timestamp with a default.
    DueAt,
}

/// One column the relay needs, with the configuration key that names it.
#[derive(Debug, Clone)]
pub struct Needed<'a> {
    pub key: &'static str,
    pub name: &'a Ident,
    pub kind: ColumnKind,
}

impl Columns {
    /// Every problem of `mapping` at once, each naming its key under `columns.`.
    pub fn from_mapping(mapping: &ColumnMapping) -> Result<Self, Vec<String>> {
        let mut problems = Vec::new();
        let mut name = |key: &str, value: &str| {
            Ident::new(value).unwrap_or_else(|why| {
                problems.push(format!("columns.{key} = {value:?}: {why}"));
                // Stands in for the bad name so that every other name is checked too; the
                // problems are returned, never these columns.
                Ident::new(key).expect("a role's own name is an identifier")
            })
        };
        let columns = Self {
            id: name("id", &mapping.id),
            topic: match (&mapping.topic, &mapping.fixed_topic) {
                (_, Some(fixed)) => TopicSource::Fixed(fixed.clone()),
                (column, None) => {
                    TopicSource::Column(name("topic", column.as_deref().unwrap_or("topic")))
                }
            },
            key: name("key", &mapping.key),
            payload: name("payload", &mapping.payload),
            payload_format: mapping.payload_format,
            headers: (!mapping.headers.is_empty()).then(|| name("headers", &mapping.headers)),
            created_at: name("created_at", &mapping.created_at),
            status: name("status", &mapping.status),
            attempts: name("attempts", &mapping.attempts),
            available_at: name("available_at", &mapping.available_at),
            leased_by: name("leased_by", &mapping.leased_by),
            last_error: name("last_error", &mapping.last_error),
            processed_at: name("processed_at", &mapping.processed_at),
        };
        // Names that are shared mean something only once each is a name of its own.
        let names_valid = problems.is_empty();
        let both_topics = mapping.topic.is_some() && mapping.fixed_topic.is_some();
        if both_topics {
            problems.push(
                "columns.topic and columns.fixed_topic: set one (a topic column, or one \
                 topic for every row)"
                    .to_owned(),
            );
        }
        if let Some(fixed) = &mapping.fixed_topic {
            if fixed.is_empty() || fixed.chars().any(char::is_control) {
                problems.push(format!(
                    "columns.fixed_topic = {fixed:?}: must be a non-empty topic without \
                     control characters"
                ));
            }
        }
        if names_valid && !both_topics {
            problems.extend(columns.duplicates());
        }
        if problems.is_empty() {
            Ok(columns)
        } else {
            Err(problems)
        }
    }

    /// Whether these are the relay's own names and formats (a table the relay created).
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// Every column the relay reads or writes, in table order.
    pub fn needed(&self) -> Vec<Needed<'_>> {
        let mut needed = vec![Needed {
            key: "id",
            name: &self.id,
            kind: ColumnKind::Id,
        }];
        if let TopicSource::Column(topic) = &self.topic {
            needed.push(Needed {
                key: "topic",
                name: topic,
                kind: ColumnKind::Text,
            });
        }
        needed.push(Needed {
            key: "key",
            name: &self.key,
            kind: ColumnKind::Text,
        });
        needed.push(Needed {
            key: "payload",
            name: &self.payload,
            kind: ColumnKind::Payload(self.payload_format),
        });
        if let Some(headers) = &self.headers {
            needed.push(Needed {
                key: "headers",
                name: headers,
                kind: ColumnKind::Headers,
            });
        }
        needed.extend(
            [
                ("created_at", &self.created_at, ColumnKind::Timestamp),
                ("status", &self.status, ColumnKind::Status),
                ("attempts", &self.attempts, ColumnKind::Counter),
                ("available_at", &self.available_at, ColumnKind::DueAt),
                ("leased_by", &self.leased_by, ColumnKind::NullableText),
                ("last_error", &self.last_error, ColumnKind::NullableText),
                (
                    "processed_at",
                    &self.processed_at,
                    ColumnKind::NullableTimestamp,
                ),
            ]
            .map(|(key, name, kind)| Needed { key, name, kind }),
        );
        needed
    }

    /// Whether `kind` is one of the relay's bookkeeping columns, which `txoutboxd schema`
    /// adds to a mapped table that lacks them.
    pub fn is_bookkeeping(kind: ColumnKind) -> bool {
        matches!(
            kind,
            ColumnKind::Status
                | ColumnKind::Counter
                | ColumnKind::DueAt
                | ColumnKind::NullableText
                | ColumnKind::NullableTimestamp
        )
    }

    fn duplicates(&self) -> Vec<String> {
        let mut seen: HashMap<String, &'static str> = HashMap::new();
        let mut problems = Vec::new();
        for needed in self.needed() {
            // Case-insensitively: MySQL and SQLite column names are.
            let folded = needed.name.as_str().to_ascii_lowercase();
            if let Some(first) = seen.insert(folded, needed.key) {
                problems.push(format!(
                    "columns.{} = {:?}: also used by columns.{first}; each role needs its \
                     own column",
                    needed.key,
                    needed.name.as_str()
                ));
            }
        }
        problems
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_mapping_is_the_relays_own_table() {
        let columns = Columns::default();
        assert!(columns.is_default());
        assert_eq!(columns.needed().len(), 12);
    }

    #[test]
    fn every_mapping_problem_is_reported_at_once() {
        let mapping = ColumnMapping {
            id: "event id".to_owned(),
            topic: Some("kind".to_owned()),
            fixed_topic: Some("orders".to_owned()),
            payload: "key".to_owned(),
            ..ColumnMapping::default()
        };
        let problems = Columns::from_mapping(&mapping).unwrap_err();
        let text = problems.join("\n");
        assert!(text.contains("columns.id = \"event id\""), "{text}");
        assert!(text.contains("set one"), "{text}");
        let mapping = ColumnMapping {
            payload: "KEY".to_owned(),
            ..ColumnMapping::default()
        };
        let problems = Columns::from_mapping(&mapping).unwrap_err();
        assert!(
            problems[0].contains("also used by columns.key"),
            "{problems:?}"
        );
    }

    #[test]
    fn a_fixed_topic_replaces_the_topic_column_and_headers_may_be_absent() {
        let mapping = ColumnMapping {
            fixed_topic: Some("orders".to_owned()),
            headers: String::new(),
            ..ColumnMapping::default()
        };
        let columns = Columns::from_mapping(&mapping).unwrap();
        assert_eq!(columns.topic, TopicSource::Fixed("orders".to_owned()));
        assert!(columns.headers.is_none());
        assert!(!columns
            .needed()
            .iter()
            .any(|n| n.key == "topic" || n.key == "headers"));
    }
}
