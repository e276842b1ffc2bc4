//! The columns of an outbox table: the relay's own names, or a team's existing table mapped
//! in configuration ("bring your own table", `[outboxes.NAME.columns]`).
//!
//! A mapping names the message columns the producer writes (id, topic or a fixed topic,
//! key, payload in one of three formats, optional headers, created-at) and the relay's
//! bookkeeping columns. Backends render their SQL from a [`Columns`] and check it against
//! the live table with [`check_live_columns`], which reports every problem at once.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use super::ident::Ident;
use super::{NewMessage, StorageError};

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

/// A column of the live table, as the backend describes it.
#[derive(Debug, Clone)]
pub struct LiveColumn {
    pub name: String,
    /// The backend's type name, for messages (`bigint`, `character varying(64)`).
    pub type_name: String,
    pub nullable: bool,
    pub has_default: bool,
}

/// Compares the live table with what `columns` needs and lists every problem at once:
/// missing columns, types `accepts` refuses (it returns what would be accepted), NOT NULL
/// relay columns the relay must be able to clear, and relay columns without the default
/// a producer's insert relies on. Names are compared case-insensitively when
/// `fold_case`, as MySQL and SQLite do.
pub fn check_live_columns(
    columns: &Columns,
    live: &[LiveColumn],
    fold_case: bool,
    accepts: impl Fn(ColumnKind, &LiveColumn) -> Result<(), &'static str>,
) -> Vec<String> {
    let find = |name: &str| {
        live.iter().find(|column| {
            if fold_case {
                column.name.eq_ignore_ascii_case(name)
            } else {
                column.name == name
            }
        })
    };
    let mut problems = Vec::new();
    for needed in columns.needed() {
        let name = needed.name.as_str();
        let described = format!("column {name:?} (columns.{})", needed.key);
        let Some(column) = find(name) else {
            let hint = if Columns::is_bookkeeping(needed.kind) {
                "; `txoutboxd schema` prints the statement that adds it"
            } else {
                "; map the column that holds it under [outboxes.NAME.columns]"
            };
            problems.push(format!("{described} is missing{hint}"));
            continue;
        };
        if let Err(wanted) = accepts(needed.kind, column) {
            problems.push(format!(
                "{described} is {}, needs {wanted}",
                column.type_name
            ));
        }
        let must_be_nullable = matches!(
            needed.kind,
            ColumnKind::NullableText | ColumnKind::NullableTimestamp
        );
        if must_be_nullable && !column.nullable {
            problems.push(format!(
                "{described} is NOT NULL; the relay clears it, so it must allow NULL"
            ));
        }
        let needs_default = matches!(
            needed.kind,
            ColumnKind::Status | ColumnKind::Counter | ColumnKind::DueAt
        );
        if needs_default && !column.has_default {
            problems.push(format!(
                "{described} has no default; producers do not set it, so it needs one \
                 (see `txoutboxd schema`)"
            ));
        }
    }
    problems
}

/// A payload as the payload column takes it.
#[derive(Debug, Clone, PartialEq)]
pub enum InsertPayload {
    Bytes(Vec<u8>),
    /// UTF-8 text; for a JSON column, checked to be JSON.
    Text(String),
}

/// The values of one insert, shaped by the table's columns.
#[derive(Debug, Clone, PartialEq)]
pub struct InsertRow {
    /// `None` with a fixed topic: the table has no topic column.
    pub topic: Option<String>,
    pub key: Option<String>,
    pub payload: InsertPayload,
    /// `None` when the table has no headers column.
    pub headers: Option<BTreeMap<String, String>>,
}

/// Checks that `message` fits a table with `columns` and shapes it for the insert;
/// [`StorageError::InvalidMessage`] says what does not fit, before anything is written.
pub fn insert_row(columns: &Columns, message: NewMessage) -> Result<InsertRow, StorageError> {
    let invalid = |why: String| Err(StorageError::InvalidMessage(why));
    let topic = match &columns.topic {
        TopicSource::Column(_) => Some(message.topic),
        TopicSource::Fixed(fixed) if message.topic == *fixed || message.topic.is_empty() => None,
        TopicSource::Fixed(fixed) => {
            return invalid(format!(
                "topic {:?}: the table has no topic column, every row has topic {fixed:?} \
                 (columns.fixed_topic)",
                message.topic
            ))
        }
    };
    let headers = match &columns.headers {
        Some(_) => Some(message.headers),
        None if message.headers.is_empty() => None,
        None => {
            return invalid(
                "headers: this outbox's table has no headers column (columns.headers is \
                 empty); send the message without headers"
                    .to_owned(),
            )
        }
    };
    let payload = match columns.payload_format {
        PayloadFormat::Bytes => InsertPayload::Bytes(message.payload),
        PayloadFormat::Text | PayloadFormat::Json => match String::from_utf8(message.payload) {
            Err(_) => {
                return invalid(format!(
                    "payload: not UTF-8, but the payload column holds {format} \
                     (columns.payload_format = \"{format}\")",
                    format = columns.payload_format.as_str()
                ))
            }
            Ok(text) => {
                if columns.payload_format == PayloadFormat::Json {
                    if let Err(why) = serde_json::from_str::<serde::de::IgnoredAny>(&text) {
                        return invalid(format!(
                            "payload: not JSON ({why}), but the payload column holds JSON \
                             (columns.payload_format = \"json\")"
                        ));
                    }
                }
                InsertPayload::Text(text)
            }
        },
    };
    Ok(InsertRow {
        topic,
        key: message.key,
        payload,
        headers,
    })
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

    #[test]
    fn an_insert_must_fit_the_table() {
        let mapping = ColumnMapping {
            fixed_topic: Some("orders".to_owned()),
            headers: String::new(),
            payload_format: PayloadFormat::Json,
            ..ColumnMapping::default()
        };
        let columns = Columns::from_mapping(&mapping).unwrap();
        let message = |topic: &str, payload: &[u8]| NewMessage::new(topic, payload.to_vec());
        let row = insert_row(&columns, message("orders", b"{\"a\": 1}")).unwrap();
        assert_eq!(row.topic, None);
        assert_eq!(row.payload, InsertPayload::Text("{\"a\": 1}".to_owned()));
        let error = |m: NewMessage| insert_row(&columns, m).unwrap_err().to_string();
        assert!(error(message("refunds", b"{}")).contains("columns.fixed_topic"));
        assert!(error(message("orders", b"not json")).contains("not JSON"));
        assert!(error(message("orders", &[0xff])).contains("not UTF-8"));
        let mut with_headers = message("orders", b"{}");
        with_headers.headers.insert("h".to_owned(), "v".to_owned());
        assert!(error(with_headers).contains("no headers column"));
    }

    #[test]
    fn live_check_lists_missing_mistyped_and_misdeclared_columns() {
        let columns = Columns::default();
        let column = |name: &str, type_name: &str, nullable: bool, has_default: bool| LiveColumn {
            name: name.to_owned(),
            type_name: type_name.to_owned(),
            nullable,
            has_default,
        };
        let live = vec![
            column("ID", "bigint", false, true),
            column("topic", "integer", false, false),
            column("status", "text", false, false),
            column("leased_by", "text", false, false),
        ];
        let accepts = |kind: ColumnKind, column: &LiveColumn| match kind {
            ColumnKind::Text if column.type_name != "text" => Err("text"),
            _ => Ok(()),
        };
        let problems = check_live_columns(&columns, &live, true, accepts).join("\n");
        assert!(problems.contains("\"topic\" (columns.topic) is integer, needs text"));
        assert!(problems.contains("\"payload\" (columns.payload) is missing; map"));
        assert!(problems.contains("\"attempts\" (columns.attempts) is missing; `txoutboxd schema`"));
        assert!(problems.contains("\"status\" (columns.status) has no default"));
        assert!(problems.contains("\"leased_by\" (columns.leased_by) is NOT NULL"));
        assert!(!problems.contains("(columns.id)"), "{problems}");
        let strict = check_live_columns(&columns, &live, false, accepts).join("\n");
        assert!(strict.contains("(columns.id) is missing"));
    }
}
