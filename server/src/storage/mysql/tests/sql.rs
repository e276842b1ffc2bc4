//! The rendering of the statements: quoting, placeholders, names.

use crate::config::columns::{ColumnMapping, Columns};
use crate::config::ident::Ident;
use crate::storage::mysql::claim::ClaimShape;
use crate::storage::mysql::schema::Schema;
use crate::storage::mysql::shape::{derived_name, quote, Shape, Statements};
use crate::storage::sql_common::events_mapping;
use crate::storage::TableOptions;

fn render(database: Option<&str>, table: &str, columns: &Columns) -> Statements {
    let database = database.map(|d| Ident::new(d).unwrap());
    Statements::render(&Shape {
        database: database.as_ref(),
        table: &Ident::new(table).unwrap(),
        options: &TableOptions {
            columns: columns.clone(),
            ..TableOptions::default()
        },
    })
}

#[test]
fn identifiers_are_backtick_quoted_and_qualified() {
    let sql = render(Some("app"), "Outbox", &Columns::default());
    assert_eq!(sql.table.quoted, "`app`.`Outbox`");
    assert_eq!(sql.table.display, "app.Outbox");
    let database = Ident::new("app").unwrap();
    let shape = Shape {
        database: Some(&database),
        table: &Ident::new("Outbox").unwrap(),
        options: &TableOptions::default(),
    };
    let schema = Schema::render(
        &sql.table.quoted,
        &sql.table.display,
        &shape,
        &sql.table.names,
    );
    assert_eq!(schema.create[0], "CREATE DATABASE IF NOT EXISTS `app`");
    assert!(schema.create[1].contains("KEY `Outbox_pending_idx` (status, id)"));
    assert_eq!(quote("a`b"), "`a``b`");
}

#[test]
fn claim_placeholders_follow_the_shape() {
    let sql = render(None, "t", &Columns::default());
    let shape = ClaimShape {
        strict_ordering: true,
        visibility_delay: true,
        topics: 2,
        paused_topics: 0,
        excluded_keys: 3,
    };
    let claim = sql.claim_candidates(&shape);
    assert_eq!(claim.matches('?').count(), 2 + 1 + 2 + 3 + 1 + 1 + 2 + 1);
    assert!(claim.contains("o.`key` NOT IN (?, ?, ?)"));
    assert!(!claim.contains("FOR UPDATE"));
    assert!(claim.contains("FORCE INDEX (`t_pending_idx`)"));
    assert!(claim.contains("o.topic IN (?, ?)") && claim.contains("p.topic NOT IN (?, ?)"));
    let plain = ClaimShape {
        strict_ordering: false,
        visibility_delay: false,
        topics: 0,
        paused_topics: 0,
        excluded_keys: 0,
    };
    let claim = sql.claim_candidates(&plain);
    assert_eq!(claim.matches('?').count(), 3);
    assert!(!claim.contains("EXISTS") && !claim.contains("NOT IN"));
    assert_eq!(sql.claim_successors(2, 5).matches('?').count(), 7);
    let lock = sql.claim_lock(3);
    assert_eq!(lock.matches('?').count(), 5);
    assert!(lock.ends_with("FOR UPDATE SKIP LOCKED"));
}

#[test]
fn mapped_names_are_quoted_and_read_under_the_relays_names() {
    let columns = Columns::from_mapping(&ColumnMapping {
        status: "state".into(),
        ..events_mapping()
    })
    .unwrap();
    let sql = render(None, "events", &columns);
    let claim = sql.claim_candidates(&ClaimShape {
        strict_ordering: true,
        visibility_delay: false,
        topics: 1,
        paused_topics: 0,
        excluded_keys: 0,
    });
    assert!(claim
        .starts_with("SELECT CAST(o.`event_id` AS SIGNED) AS id, o.`aggregate_id` AS `key` FROM"));
    assert!(sql.claim_lock(1).starts_with(
        "SELECT CAST(o.`event_id` AS SIGNED) AS id, o.`event_type` AS topic, \
         o.`aggregate_id` AS `key`, CASE WHEN"
    ));
    assert!(claim.contains("p.`aggregate_id` = o.`aggregate_id` AND p.`event_id` < o.`event_id`"));
    assert!(claim.contains("WHERE o.`state` = 'pending'"));
    assert!(sql
        .held(1, false)
        .starts_with("SELECT CAST(`event_id` AS SIGNED) FROM `events`"));
    assert_eq!(
        sql.insert(),
        "INSERT INTO `events` (`event_type`, `aggregate_id`, `body`, `meta`) \
         VALUES (?, ?, ?, ?)"
    );
    assert!(sql
        .stats()
        .ends_with("GROUP BY `event_type` ORDER BY `event_type`"));
}

#[test]
fn a_fixed_topic_reads_the_same_under_every_sql_mode() {
    let columns = Columns::from_mapping(&ColumnMapping {
        fixed_topic: Some("a\\'b".into()),
        headers: String::new(),
        ..ColumnMapping::default()
    })
    .unwrap();
    let sql = render(None, "t", &columns);
    let literal = "CONVERT(X'615c2762' USING utf8mb4)";
    let claim = sql.claim_lock(1);
    assert!(claim.contains(&format!("{literal} AS topic")), "{claim}");
    assert!(claim.contains("THEN '{}' END AS headers"), "{claim}");
    assert!(sql.stats().contains(&format!("GROUP BY {literal}")));
    assert_eq!(
        sql.insert(),
        "INSERT INTO `t` (`key`, payload) VALUES (?, ?)"
    );
}

#[test]
fn derived_names_fit_and_stay_distinct() {
    let long = "t".repeat(63);
    let a = derived_name(&long, "_pending_idx");
    let b = derived_name(&long, "_key_idx");
    assert!(a.len() <= 64 && b.len() <= 64);
    assert_ne!(a, b);
    assert_eq!(derived_name("outbox", "_key_idx"), "outbox_key_idx");
}
