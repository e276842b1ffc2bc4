//! Bring your own table, end to end: a team's existing PostgreSQL outbox table with its own
//! column names, mapped in `[outboxes.NAME.columns]`, prepared with `txoutboxd schema`,
//! relayed by a real `txoutboxd` to a real subscriber; and a table that does not fit,
//! refused at start with every problem named.

use txoutbox_tests::server::run_to_exit;
use txoutbox_tests::{MappedPgDb, OutboxDb, Server, Subscriber, DEADLINE};

#[tokio::test]
async fn a_mapped_team_table_is_prepared_by_txoutboxd_schema_and_relayed() {
    let db = MappedPgDb::unprepared().await;
    let config = db.config("");

    let printed = run_to_exit(&config, &["schema", "orders"]);
    assert!(printed.status.success(), "{printed:?}");
    let stderr = String::from_utf8_lossy(&printed.stderr);
    assert!(
        stderr.contains("\"relay_status\" (columns.status) is missing"),
        "schema should say what the live table lacks: {stderr}"
    );
    let ddl = String::from_utf8(printed.stdout).unwrap();
    assert!(
        ddl.contains("ADD COLUMN IF NOT EXISTS \"relay_due_at\""),
        "{ddl}"
    );
    sqlx::raw_sql(&ddl).execute(db.pool()).await.unwrap();
    let printed = run_to_exit(&config, &["schema", "orders"]);
    assert!(
        String::from_utf8_lossy(&printed.stderr).contains("already fits"),
        "{printed:?}"
    );

    // The producer writes only its own columns.
    let ids: Vec<i32> = sqlx::query_scalar(&format!(
        "INSERT INTO {}.order_events (event_type, aggregate_id, body, meta) VALUES \
           ('orders.created', 'order-1', 'first', '{{\"source\": \"shop\"}}'), \
           ('orders.created', 'order-1', 'second', '{{}}'), \
           ('orders.paid', NULL, 'third', '{{}}') RETURNING event_id",
        db.schema()
    ))
    .fetch_all(db.pool())
    .await
    .unwrap();
    let ids: Vec<i64> = ids.into_iter().map(i64::from).collect();

    let server = Server::start_serving(&config).await;
    let mut sub = Subscriber::open(&server, "mapped", 10, 0).await;
    let got = sub.take(3).await;
    assert_eq!(got.iter().map(|m| m.id).collect::<Vec<_>>(), ids);
    assert_eq!(got[0].topic, "orders.created");
    assert_eq!(got[0].key.as_deref(), Some("order-1"));
    assert_eq!(got[0].payload, b"first");
    assert_eq!(
        got[0].headers.get("source").map(String::as_str),
        Some("shop")
    );
    assert_eq!(got[2].key, None);
    assert!(got
        .iter()
        .all(|m| m.attempts == 1 && m.created_at.is_some()));

    let settled = sub.ack(&ids[..2]).await;
    assert_eq!(settled.acked, ids[..2]);
    let settled = sub.nack(ids[2], "broker down", Some(60_000)).await;
    assert_eq!(settled.retried, [ids[2]]);

    let rows: Vec<(String, i32, Option<String>)> = sqlx::query_as(&format!(
        "SELECT relay_status, relay_attempts, relay_error FROM {}.order_events ORDER BY event_id",
        db.schema()
    ))
    .fetch_all(db.pool())
    .await
    .unwrap();
    assert_eq!(
        rows,
        [
            ("done".to_owned(), 1, None),
            ("done".to_owned(), 1, None),
            ("pending".to_owned(), 1, Some("broker down".to_owned())),
        ]
    );
    db.drop().await;
}

#[tokio::test]
async fn txoutboxd_refuses_to_start_on_a_table_that_does_not_fit_and_names_every_problem() {
    let db = MappedPgDb::unprepared().await;
    let config = db
        .config("")
        .replace("payload = \"body\"", "payload = \"data\"");

    let run = tokio::time::timeout(
        DEADLINE,
        tokio::task::spawn_blocking(move || run_to_exit(&config, &["--listen", "127.0.0.1:0"])),
    )
    .await
    .expect("txoutboxd should exit at start, not serve")
    .unwrap();
    assert!(!run.status.success(), "{run:?}");
    let log = String::from_utf8_lossy(&run.stderr);
    for needle in [
        "outboxes.orders",
        "\\\"data\\\" (columns.payload) is missing",
        "\\\"relay_status\\\" (columns.status) is missing",
        "\\\"relay_done_at\\\" (columns.processed_at) is missing",
    ] {
        assert!(log.contains(needle), "missing {needle:?} in:\n{log}");
    }
    db.drop().await;
}

#[tokio::test]
async fn with_create_schema_txoutboxd_adds_the_columns_a_team_table_lacks() {
    let db = MappedPgDb::unprepared().await;
    let server = Server::start_serving(&db.config("create_schema = true")).await;
    let id = db.insert("orders.created", Some("order-1"), b"hello").await;
    let mut sub = Subscriber::open(&server, "mapped", 10, 0).await;
    let got = sub.take(1).await;
    assert_eq!((got[0].id, got[0].payload.as_slice()), (id, &b"hello"[..]));
    sub.ack(&[id]).await;
    assert_eq!(db.count("done").await, 1);
    db.drop().await;
}
