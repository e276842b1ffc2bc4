//! A team's own outbox table ("bring your own table"), as the contract suites map it: on
//! each backend, the DDL of its message columns under names of its own (none is the
//! relay's), and the mapping that names them in configuration. Shared by the storage
//! contract and the group contract, so both run on the same mapped table.

use txoutbox_server::config::columns::ColumnMapping;

/// The machine clock in epoch milliseconds, as a team's own SQLite table would default it.
pub const SQLITE_NOW_MS: &str = "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)";

/// PostgreSQL: other names for every column, an `integer` id, `varchar` topic and key,
/// and `json` (not `jsonb`) headers; `{table}` stands for the qualified table.
pub const POSTGRES_TABLE: &str = "CREATE TABLE IF NOT EXISTS {table} (
    event_id     serial PRIMARY KEY,
    event_type   varchar(200) NOT NULL,
    aggregate_id varchar(200),
    body         bytea NOT NULL,
    meta         json NOT NULL DEFAULT '{}',
    occurred_at  timestamptz NOT NULL DEFAULT now()
)";

/// The mapping of [`POSTGRES_TABLE`], bookkeeping columns included.
pub fn postgres_mapping() -> ColumnMapping {
    ColumnMapping {
        id: "event_id".to_owned(),
        topic: Some("event_type".to_owned()),
        key: "aggregate_id".to_owned(),
        payload: "body".to_owned(),
        headers: "meta".to_owned(),
        created_at: "occurred_at".to_owned(),
        status: "relay_status".to_owned(),
        attempts: "relay_attempts".to_owned(),
        available_at: "relay_due_at".to_owned(),
        leased_by: "relay_owner".to_owned(),
        last_error: "relay_error".to_owned(),
        processed_at: "relay_done_at".to_owned(),
        ..ColumnMapping::default()
    }
}

/// SQLite: the message columns under names of its own (an `INTEGER` rowid without
/// `AUTOINCREMENT`, a `VARCHAR` topic, headers that may be NULL), and none of the relay's;
/// `create_schema` adds those, some under mapped names too. The payload stays binary.
pub fn sqlite_table() -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS order_events (
                event_id     INTEGER PRIMARY KEY,
                event_type   VARCHAR(100) NOT NULL,
                aggregate_id TEXT,
                body         BLOB NOT NULL,
                meta         TEXT,
                occurred_at  INTEGER NOT NULL DEFAULT ({SQLITE_NOW_MS})
            )"
    )
}

/// The mapping of [`sqlite_table`], and of the storage contract's MariaDB team table,
/// which has the same names.
pub fn mariadb_and_sqlite_mapping() -> ColumnMapping {
    ColumnMapping {
        id: "event_id".into(),
        topic: Some("event_type".into()),
        key: "aggregate_id".into(),
        payload: "body".into(),
        headers: "meta".into(),
        created_at: "occurred_at".into(),
        status: "relay_status".into(),
        leased_by: "claimed_by".into(),
        ..ColumnMapping::default()
    }
}
