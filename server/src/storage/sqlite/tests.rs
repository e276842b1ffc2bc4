//! The statements as rendered: parameters numbered in order, names quoted or bare.

use std::time::Duration;

use super::shape::{Shape, Statements};
use crate::config::columns::{ColumnMapping, Columns};
use crate::config::ident::Ident;
use crate::storage::sql_common::events_mapping;
use crate::storage::{TableOptions, TopicClause};

fn render(table: &str, columns: &Columns, visibility_delay: Duration) -> Statements {
    Statements::render(&Shape {
        table: &Ident::new(table).unwrap(),
        options: &TableOptions {
            columns: columns.clone(),
            visibility_delay,
            ..TableOptions::default()
        },
    })
}

fn mapped() -> Columns {
    Columns::from_mapping(&ColumnMapping {
        created_at: "occurred_at".into(),
        status: "relay_status".into(),
        ..events_mapping()
    })
    .unwrap()
}

#[test]
fn claim_parameters_are_numbered_in_order() {
    let sql = render("outbox", &Columns::default(), Duration::from_secs(1));
    let claim = &sql.claim(TopicClause::Only);
    assert!(claim.contains("o.topic IN (SELECT value FROM json_each(?2))"));
    assert!(claim.contains("o.created_at <= ?3"));
    assert!(claim.contains("leased_by = ?4") && claim.contains("available_at = ?5"));
    assert!(claim.contains("LIMIT ?6") && claim.contains("o.attempts < ?7"));
    let claim = &sql.claim(TopicClause::Any);
    assert!(claim.contains("o.created_at <= ?2") && claim.contains("LIMIT ?5"));
    assert!(claim.contains("o.attempts < ?6") && !claim.contains("?7"));
    let exhaust = &sql.exhaust(TopicClause::Only);
    assert!(exhaust.contains("LIMIT ?4") && exhaust.contains("attempts >= ?5"));
    assert!(
        sql.probe(TopicClause::Any).contains("o.created_at <= ?2")
            && !sql.probe(TopicClause::Any).contains("?3")
    );
    assert!(sql
        .claim(TopicClause::Except)
        .contains("(o.topic IN (SELECT value FROM json_each(?2))) IS NOT TRUE"));
}

#[test]
fn the_relays_own_names_render_as_before() {
    let sql = render("outbox", &Columns::default(), Duration::ZERO);
    assert!(sql
        .claim(TopicClause::Any)
        .contains("RETURNING id, topic, key, CASE WHEN "));
    assert!(sql.claim(TopicClause::Any).contains(
        "THEN CAST(payload AS BLOB) END AS payload, CASE WHEN (coalesce(length(CAST(payload \
         AS BLOB)), 0) + coalesce(length(CAST(headers AS BLOB)), 0)"
    ));
    assert!(sql
        .claim(TopicClause::Any)
        .contains("<= 4194304 THEN headers END AS headers, attempts, created_at, "));
    assert_eq!(
        sql.insert(),
        "INSERT INTO \"outbox\" (topic, key, payload, headers) VALUES (?1, ?2, ?3, ?4) \
         RETURNING id"
    );
    assert!(sql.stats().ends_with("GROUP BY topic ORDER BY topic"));
}

#[test]
fn mapped_names_are_quoted_and_read_under_the_relays_names() {
    let sql = render("events", &mapped(), Duration::from_secs(1));
    assert!(sql.claim(TopicClause::Only).contains(
        "RETURNING \"event_id\" AS id, \"event_type\" AS topic, \"aggregate_id\" AS key, \
         CASE WHEN"
    ));
    assert!(sql
        .claim(TopicClause::Only)
        .contains("THEN CAST(\"body\" AS BLOB) END AS payload"));
    assert!(sql
        .claim(TopicClause::Only)
        .contains("THEN \"meta\" END AS headers, attempts, \"occurred_at\" AS created_at"));
    assert!(sql
        .claim(TopicClause::Only)
        .contains("o.\"event_type\" IN (SELECT value"));
    assert!(sql
        .claim(TopicClause::Only)
        .contains("p.\"aggregate_id\" = o.\"aggregate_id\""));
    assert!(sql.ack().contains("SET \"relay_status\" = 'done'"));
    assert!(sql.stats().contains("\"event_type\" AS topic"));
    assert_eq!(
        sql.insert(),
        "INSERT INTO \"events\" (\"event_type\", \"aggregate_id\", \"body\", \"meta\") \
         VALUES (?1, ?2, ?3, ?4) RETURNING \"event_id\""
    );
}

#[test]
fn a_fixed_topic_is_a_literal_and_absent_headers_read_as_none() {
    let columns = Columns::from_mapping(&ColumnMapping {
        fixed_topic: Some("it's".into()),
        headers: String::new(),
        ..ColumnMapping::default()
    })
    .unwrap();
    let sql = render("outbox", &columns, Duration::ZERO);
    assert!(sql
        .claim(TopicClause::Any)
        .contains("RETURNING id, 'it''s' AS topic, key, CASE WHEN"));
    assert!(sql
        .claim(TopicClause::Any)
        .contains("THEN '{}' END AS headers"));
    assert!(sql.stats().contains("GROUP BY 'it''s'"));
    assert_eq!(
        sql.insert(),
        "INSERT INTO \"outbox\" (key, payload) VALUES (?1, ?2) RETURNING id"
    );
}
