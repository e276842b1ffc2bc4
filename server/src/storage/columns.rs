//! What the storage does with an outbox table's [`Columns`] (validated from configuration
//! in `config::columns`): checks them against the live table with [`check_live_columns`],
//! which reports every problem at once, and shapes an insert's values for them.

use std::collections::BTreeMap;

use crate::config::columns::{ColumnKind, Columns, PayloadFormat, TopicSource};

use super::{NewMessage, StorageError};

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
    use crate::config::columns::ColumnMapping;

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
