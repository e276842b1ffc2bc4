//! PostgreSQL with a team's own table, mapped ("bring your own table"): what the contract
//! run on `postgres_mapped` cannot show.

use super::pg_backend::{mapped_storage, team_mapping, PgBackend};
use super::*;
use txoutbox_server::config::columns::{ColumnMapping, PayloadFormat};
use txoutbox_server::storage::StorageError;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_that_does_not_fit_its_columns_is_reported_with_every_problem_at_once() {
    let backend = PgBackend::new().await;
    backend
        .execute(&format!(
            "CREATE SCHEMA \"{schema}\"; CREATE TABLE \"{schema}\".wrong (\
               event_id text PRIMARY KEY, event_type integer, body bytea NOT NULL, \
               occurred_at timestamp NOT NULL DEFAULT now(), relay_status text NOT NULL, \
               relay_owner text NOT NULL)",
            schema = backend.schema
        ))
        .await;
    let storage = mapped_storage(&backend, "wrong", team_mapping()).await;
    let Err(StorageError::MismatchedTable { problems, .. }) = storage.verify_table().await else {
        panic!("a mismatched table must be reported");
    };
    let text = problems.join("\n");
    for needle in [
        "\"event_id\" (columns.id) is text, needs bigint or integer",
        "\"event_type\" (columns.topic) is integer, needs text or character varying",
        "\"aggregate_id\" (columns.key) is missing; map the column",
        "\"meta\" (columns.headers) is missing",
        "\"occurred_at\" (columns.created_at) is timestamp without time zone, needs timestamp with time zone",
        "\"relay_status\" (columns.status) has no default",
        "\"relay_attempts\" (columns.attempts) is missing; `txoutboxd schema` prints",
        "\"relay_owner\" (columns.leased_by) is NOT NULL",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
    assert!(!text.contains("columns.payload"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_topic_json_table_without_headers_relays_what_producers_insert() {
    let backend = PgBackend::new().await;
    let audit = format!("\"{}\".audit", backend.schema);
    backend
        .execute(&format!(
            "CREATE SCHEMA \"{}\"; CREATE TABLE {audit} (\
               id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, aggregate text, \
               doc jsonb NOT NULL, at timestamptz NOT NULL DEFAULT now())",
            backend.schema
        ))
        .await;
    let mapping = ColumnMapping {
        fixed_topic: Some("audit".to_owned()),
        key: "aggregate".to_owned(),
        payload: "doc".to_owned(),
        payload_format: PayloadFormat::Json,
        headers: String::new(),
        created_at: "at".to_owned(),
        ..ColumnMapping::default()
    };
    let storage = mapped_storage(&backend, "audit", mapping).await;
    assert!(matches!(
        storage.verify_table().await,
        Err(StorageError::MismatchedTable { .. })
    ));
    let schema = storage.schema_sql();
    assert!(
        schema.contains("ADD COLUMN IF NOT EXISTS \"status\""),
        "{schema}"
    );
    storage
        .ensure_table()
        .await
        .expect("adds the relay's columns");
    storage
        .verify_table()
        .await
        .expect("fits once the columns are added");

    // A producer that knows nothing of the relay's columns.
    backend
        .execute(&format!(
            "INSERT INTO {audit} (aggregate, doc) VALUES ('order-1', '{{\"a\": 1}}')"
        ))
        .await;
    let id = storage
        .insert(NewMessage::new("audit", r#"{"b":[true]}"#).with_key("order-1"))
        .await
        .unwrap();
    for (message, why) in [
        (NewMessage::new("refunds", "{}"), "columns.fixed_topic"),
        (NewMessage::new("audit", "{"), "not JSON"),
        (
            NewMessage {
                headers: [("h".to_owned(), "v".to_owned())].into(),
                ..NewMessage::new("audit", "{}")
            },
            "no headers column",
        ),
    ] {
        match storage.insert(message).await {
            Err(StorageError::InvalidMessage(error)) => assert!(error.contains(why), "{error}"),
            other => panic!("expected InvalidMessage({why}), got {other:?}"),
        }
    }
    assert_eq!(
        backend.row_count_of(&audit).await,
        2,
        "refused inserts wrote nothing"
    );

    let none = claim_topics(&storage, "w1", 10, LEASE, &["refunds".to_owned()]).await;
    assert!(none.is_empty());
    let got = claim_topics(&storage, "w1", 10, LEASE, &["audit".to_owned()]).await;
    assert_eq!(got.len(), 2);
    assert_eq!(got[1].id, id);
    assert!(got
        .iter()
        .all(|m| m.topic == "audit" && m.headers.is_empty()));
    assert_eq!(got[0].payload, br#"{"a": 1}"#);
    assert_eq!(got[1].payload, br#"{"b": [true]}"#, "jsonb's own spelling");
    let stats = storage.stats().await.unwrap();
    assert_eq!(stats.topics[0].topic, "audit");
    assert_eq!(stats.total.leased, 2);
    let acked = storage
        .ack(&[got[0].id, got[1].id].into(), "w1")
        .await
        .unwrap();
    assert_eq!(acked.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_text_payload_is_handed_out_as_its_utf8_bytes() {
    let backend = PgBackend::new().await;
    let notes = format!("\"{}\".notes", backend.schema);
    backend
        .execute(&format!(
            "CREATE SCHEMA \"{}\"; CREATE TABLE {notes} (\
               id serial PRIMARY KEY, topic text NOT NULL, key text, body varchar(100) NOT NULL, \
               created_at timestamptz NOT NULL DEFAULT now())",
            backend.schema
        ))
        .await;
    let mapping = ColumnMapping {
        payload: "body".to_owned(),
        payload_format: PayloadFormat::Text,
        headers: String::new(),
        ..ColumnMapping::default()
    };
    let storage = mapped_storage(&backend, "notes", mapping).await;
    storage.ensure_table().await.unwrap();
    storage.verify_table().await.unwrap();
    storage
        .insert(NewMessage::new("t", "héllo").with_key("k"))
        .await
        .unwrap();
    let refused = storage.insert(NewMessage::new("t", vec![0xff, 0xfe])).await;
    assert!(
        matches!(refused, Err(StorageError::InvalidMessage(_))),
        "{refused:?}"
    );
    let got = claim(&storage, "w1", 10, LEASE).await;
    assert_eq!(got[0].payload, "héllo".as_bytes());
    assert_eq!(got[0].key.as_deref(), Some("k"));
}
