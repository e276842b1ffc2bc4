//! The outbox table itself: its DDL rendered from the column mapping and applied, and the
//! check of a live table against the mapping.
//!
//! A mapped table ("bring your own table") usually exists already, holding the producer's
//! message columns but not the relay's bookkeeping columns. SQLite has no
//! `ADD COLUMN IF NOT EXISTS`, so the two ways of getting them differ:
//! - [`Storage::ensure_table`](crate::storage::Storage::ensure_table) looks at the live
//!   table and adds only the bookkeeping columns it lacks, then the indexes, in one write
//!   transaction.
//! - `txoutboxd schema` prints the `CREATE TABLE IF NOT EXISTS` (for a team starting
//!   fresh), then the `ALTER TABLE ... ADD COLUMN` of every bookkeeping column as SQL
//!   *comments* with a note to run the ones the table lacks, then the indexes. Commented
//!   out, the whole output stays runnable on a fresh database (where the table already has
//!   every column and a live `ADD COLUMN` would fail as a duplicate); on an existing table
//!   whose columns were not added, the indexes fail loudly on the missing `status` column
//!   instead of anything being skipped silently.
//!
//! For the relay's own names the output is exactly what it always was: no `ALTER` part.
//!
//! `ADD COLUMN` cannot take an expression default, so an added `available_at` defaults to
//! `0` (due since 1970: claimable at once, like the `CREATE TABLE` default of "now").

use sqlx::Executor;

use super::shape::{pauses_table, NOW_MS};
use super::SqliteStorage;
use crate::config::columns::{ColumnKind, Columns, PayloadFormat};
use crate::config::ident::{self, Ident};
use crate::storage::columns::check_live_columns;
use crate::storage::columns::LiveColumn;
use crate::storage::names::Names;
use crate::storage::MAX_KEY_CHARS;
use crate::storage::{StorageError, StorageResult};

/// The DDL of one outbox table.
#[derive(Debug)]
pub(super) struct Schema {
    /// `CREATE TABLE IF NOT EXISTS` with every column the mapping names.
    pub create_table: String,
    /// The relay's bookkeeping columns, each with the statement that adds it.
    pub add_columns: Vec<AddColumn>,
    /// `CREATE INDEX IF NOT EXISTS` of the claim's, strict ordering's, purge's and the
    /// dead rows' indexes.
    pub indexes: String,
    /// `CREATE TABLE IF NOT EXISTS` of the outbox's pauses table.
    pub pauses: String,
    /// The table as named, and whether its names are the relay's own.
    table: String,
    own_names: bool,
    /// Marks the rows already in a table delivered (printed with the `ALTER`s).
    skip_existing: String,
}

/// One bookkeeping column and the `ALTER TABLE` that adds it.
#[derive(Debug)]
pub(super) struct AddColumn {
    pub name: Ident,
    pub statement: String,
}

impl Schema {
    /// `t` is the quoted table name; `c` the columns as [`super::shape`] writes them.
    pub fn render(t: &str, table: &Ident, columns: &Columns, c: &Names) -> Self {
        let mut lines = Vec::new();
        let mut add_columns = Vec::new();
        for needed in columns.needed() {
            let (name, definition) = definition(needed.key, c, columns.payload_format);
            let comment = match needed.key {
                "created_at" => "    -- Times: Unix epoch milliseconds (UTC).\n",
                _ => "",
            };
            lines.push(format!("{comment}    {name:<12} {definition}"));
            if Columns::is_bookkeeping(needed.kind) {
                let definition = match needed.key {
                    "available_at" => "INTEGER NOT NULL DEFAULT 0".to_owned(),
                    _ => definition.split_whitespace().collect::<Vec<_>>().join(" "),
                };
                add_columns.push(AddColumn {
                    name: needed.name.clone(),
                    statement: format!("ALTER TABLE {t} ADD COLUMN {name} {definition}"),
                });
            }
        }
        let create_table = format!(
            "CREATE TABLE IF NOT EXISTS {t} (\n{}\n);\n",
            lines.join(",\n")
        );
        let index = |suffix: &str| ident::quote(&format!("{table}{suffix}"));
        let indexes = c.fill(
            "CREATE INDEX IF NOT EXISTS {pending} ON {t} ({id}) WHERE {status} = 'pending';
CREATE INDEX IF NOT EXISTS {key_pending} ON {t} ({key}, {id}) WHERE {status} = 'pending';
CREATE INDEX IF NOT EXISTS {processed} ON {t} ({processed_at}) WHERE {status} = 'done';
CREATE INDEX IF NOT EXISTS {dead} ON {t} ({id}) WHERE {status} = 'dead';
",
            &[
                ("t", &t),
                ("pending", &index("_pending_idx")),
                ("key_pending", &index("_key_pending_idx")),
                ("processed", &index("_processed_idx")),
                ("dead", &index("_dead_idx")),
            ],
        );
        // The outbox's pause (see `Storage::paused_since`): a row whose `target` is empty
        // pauses the whole outbox. Times in epoch milliseconds, as the outbox's.
        let pauses = format!(
            "CREATE TABLE IF NOT EXISTS {} (\n    target    TEXT    PRIMARY KEY,\n    \
             paused_at INTEGER NOT NULL\n);\n",
            pauses_table(table)
        );
        Self {
            create_table,
            add_columns,
            indexes,
            pauses,
            table: table.to_string(),
            own_names: columns.is_default(),
            skip_existing: c.fill(
                "UPDATE {t} SET {status} = 'done', {processed_at} = {now} \
                 WHERE {status} = 'pending'",
                &[("t", &t), ("now", &NOW_MS)],
            ),
        }
    }

    /// What `txoutboxd schema` prints (see the module docs).
    pub fn text(&self) -> String {
        let mut text = self.create_table.clone();
        if !self.own_names {
            text += &format!(
                "-- A table of your own ({}) needs the relay's bookkeeping columns. SQLite has
-- no ADD COLUMN IF NOT EXISTS: run the statements below for the columns your table lacks.
",
                self.table
            );
            for add in &self.add_columns {
                text += &format!("-- {};\n", add.statement);
            }
            text += &format!(
                "-- Rows already in the table are now pending and will be published; to skip
-- them, run once the columns are there:
--   {};
",
                self.skip_existing
            );
        }
        text + &self.indexes + &self.pauses
    }
}

/// A column of the `CREATE TABLE`, by its key under `columns.`: its name as written and
/// its definition.
fn definition<'a>(key: &str, c: &'a Names, format: PayloadFormat) -> (&'a str, String) {
    match key {
        "id" => (&c.id, "INTEGER PRIMARY KEY AUTOINCREMENT".to_owned()),
        "topic" => (
            c.topic.as_deref().unwrap_or_default(),
            "TEXT    NOT NULL".to_owned(),
        ),
        "key" => (
            &c.key,
            format!("TEXT    CHECK (length({}) <= {MAX_KEY_CHARS})", c.key),
        ),
        "payload" => (
            &c.payload,
            match format {
                PayloadFormat::Bytes => "BLOB    NOT NULL".to_owned(),
                PayloadFormat::Text => "TEXT    NOT NULL".to_owned(),
                PayloadFormat::Json => format!("TEXT    NOT NULL CHECK (json_valid({}))", c.payload),
            },
        ),
        "headers" => {
            let name = c.headers.as_deref().unwrap_or_default();
            (
                name,
                format!("TEXT    NOT NULL DEFAULT '{{}}' CHECK (json_valid({name}))"),
            )
        }
        "created_at" => (&c.created_at, format!("INTEGER NOT NULL DEFAULT ({NOW_MS})")),
        "status" => (
            &c.status,
            format!(
                "TEXT    NOT NULL DEFAULT 'pending'\n{:25}CHECK ({} IN ('pending', 'done', 'dead'))",
                "", c.status
            ),
        ),
        "attempts" => (&c.attempts, "INTEGER NOT NULL DEFAULT 0".to_owned()),
        "available_at" => (
            &c.available_at,
            format!("INTEGER NOT NULL DEFAULT ({NOW_MS})"),
        ),
        "leased_by" => (&c.leased_by, "TEXT".to_owned()),
        "last_error" => (&c.last_error, "TEXT".to_owned()),
        "processed_at" => (&c.processed_at, "INTEGER".to_owned()),
        _ => unreachable!("every key of Columns::needed is listed: {key}"),
    }
}

/// SQLite's type affinity of a declared type (section 3.1 of "Datatypes In SQLite"):
/// the declared type is free text, and only these rules give it meaning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Affinity {
    Integer,
    Text,
    Blob,
    Real,
    Numeric,
}

/// How [`live_column`] shows a column declared without a type (`CREATE TABLE t (a, b)`),
/// which no declared type can look like.
const UNTYPED: &str = "(no declared type)";

fn affinity(declared: &str) -> Affinity {
    if declared == UNTYPED {
        return Affinity::Blob;
    }
    let declared = declared.to_ascii_uppercase();
    let has = |part: &str| declared.contains(part);
    if has("INT") {
        Affinity::Integer
    } else if has("CHAR") || has("CLOB") || has("TEXT") {
        Affinity::Text
    } else if has("BLOB") || declared.trim().is_empty() {
        Affinity::Blob
    } else if has("REAL") || has("FLOA") || has("DOUB") {
        Affinity::Real
    } else {
        Affinity::Numeric
    }
}

/// Which declared types can hold each kind of column; the error says what would do.
/// Times are integers of epoch milliseconds, as everywhere in this backend (see `sql`):
/// a table keeping text times (`CURRENT_TIMESTAMP`) is refused rather than misread.
pub(super) fn accepts(kind: ColumnKind, column: &LiveColumn) -> Result<(), &'static str> {
    let affinity = affinity(&column.type_name);
    let is_json = column.type_name.trim().eq_ignore_ascii_case("JSON");
    let ok = match kind {
        ColumnKind::Id | ColumnKind::Counter => affinity == Affinity::Integer,
        ColumnKind::Timestamp | ColumnKind::DueAt | ColumnKind::NullableTimestamp => {
            affinity == Affinity::Integer
        }
        ColumnKind::Text | ColumnKind::Status | ColumnKind::NullableText => {
            affinity == Affinity::Text
        }
        ColumnKind::Payload(PayloadFormat::Bytes) => affinity == Affinity::Blob,
        ColumnKind::Payload(PayloadFormat::Text) => affinity == Affinity::Text,
        ColumnKind::Payload(PayloadFormat::Json) | ColumnKind::Headers => {
            affinity == Affinity::Text || is_json
        }
    };
    if ok {
        return Ok(());
    }
    Err(match kind {
        ColumnKind::Id => "INTEGER (ideally INTEGER PRIMARY KEY, the rowid)",
        ColumnKind::Counter => "INTEGER",
        ColumnKind::Timestamp | ColumnKind::DueAt | ColumnKind::NullableTimestamp => {
            "INTEGER (Unix epoch milliseconds)"
        }
        ColumnKind::Text | ColumnKind::Status | ColumnKind::NullableText => "TEXT",
        ColumnKind::Payload(PayloadFormat::Bytes) => {
            "BLOB (for a TEXT column, set payload_format = \"text\")"
        }
        ColumnKind::Payload(PayloadFormat::Text) => "TEXT (payload_format = \"text\")",
        ColumnKind::Payload(PayloadFormat::Json) => "TEXT or JSON (payload_format = \"json\")",
        ColumnKind::Headers => "TEXT or JSON (a JSON object of strings)",
    })
}

/// A row of `pragma_table_info` (name, declared type, NOT NULL, has a default) as a
/// [`LiveColumn`].
pub(super) fn live_column(
    (name, declared, not_null, has_default): (String, String, i64, i64),
) -> LiveColumn {
    LiveColumn {
        name,
        type_name: if declared.trim().is_empty() {
            UNTYPED.to_owned()
        } else {
            declared
        },
        nullable: not_null == 0,
        has_default: has_default != 0,
    }
}

/// `?1` the table name: the live table's columns.
const LIVE_COLUMNS: &str = "SELECT name, type, \"notnull\", dflt_value IS NOT NULL \
                            FROM pragma_table_info(?1)";

impl SqliteStorage {
    /// The table's DDL (rendered when asked for: at start and by `txoutboxd schema`).
    pub(super) fn schema(&self) -> Schema {
        let (t, c) = (&self.sql.table.quoted, &self.sql.table.names);
        dead_holds_schema(
            Schema::render(t, &self.table, &self.options.columns, c),
            self.sql.dead_holds_key,
            &self.sql.table.display,
            t,
            c,
        )
    }

    /// A write that changes nothing: fails with SQLITE_READONLY on a read-only file.
    fn write_probe(&self) -> String {
        let id = &self.sql.table.names.id;
        format!("UPDATE {} SET {id} = {id} WHERE 0", self.sql.table.quoted)
    }

    /// The live table's columns, as `conn` sees them; none when there is no table.
    async fn live_columns(
        &self,
        conn: impl sqlx::SqliteExecutor<'_>,
        action: &'static str,
    ) -> StorageResult<Vec<LiveColumn>> {
        let rows = sqlx::query_as(LIVE_COLUMNS)
            .bind(&self.sql.table.display)
            .fetch_all(conn)
            .await
            .map_err(self.error(action))?;
        Ok(rows.into_iter().map(live_column).collect())
    }

    /// The table if missing, the bookkeeping columns a table of the team's own lacks
    /// (see the module docs: SQLite cannot add a column "if not exists"), then the indexes.
    pub(super) async fn create_schema(&self) -> StorageResult<()> {
        let err = || self.error("create schema");
        let schema = &self.schema();
        // Under the write lock, so servers starting together create it once.
        let mut tx = self.begin_immediate("create schema").await?;
        // No bind parameters: every statement of the script runs.
        tx.execute(schema.create_table.as_str())
            .await
            .map_err(err())?;
        let live = self.live_columns(&mut *tx, "create schema").await?;
        for add in &schema.add_columns {
            let name = add.name.as_str();
            if !live.iter().any(|c| c.name.eq_ignore_ascii_case(name)) {
                tracing::info!(column = name, "adding a bookkeeping column");
                tx.execute(add.statement.as_str()).await.map_err(err())?;
            }
        }
        tx.execute(schema.indexes.as_str()).await.map_err(err())?;
        tx.execute(schema.pauses.as_str()).await.map_err(err())?;
        tx.commit().await.map_err(err())
    }

    /// The table answers, its columns are what the mapping needs (the relay's own table
    /// is checked too), and the file takes writes: a write that changes nothing fails on
    /// a read-only file ([`StorageError::ReadOnly`]). The file being locked by another
    /// writer proves nothing either way, and is left to the relay's own writes.
    pub(super) async fn check_table(&self) -> StorageResult<()> {
        sqlx::query(&format!("SELECT 1 FROM {} LIMIT 0", self.sql.table.quoted))
            .execute(&self.pools.reader)
            .await
            .map_err(self.error("ping"))?;
        let live = self.live_columns(&self.pools.reader, "ping").await?;
        let problems = check_live_columns(&self.options.columns, &live, true, accepts);
        StorageError::unless_problems(&self.sql.table.display, problems)?;
        let probe = sqlx::query(&self.write_probe())
            .execute(&self.pools.writer)
            .await
            .map_err(self.error("ping"));
        match probe {
            Err(error @ StorageError::ReadOnly(_)) => Err(error),
            _ => Ok(()),
        }
    }
}

/// The schema, with the `(key, id)` index of dead rows that `dead_letter_holds_key` looks
/// keys up in (only then: most outboxes never look).
fn dead_holds_schema(
    mut schema: Schema,
    dead_holds_key: bool,
    table: &str,
    t: &str,
    c: &Names,
) -> Schema {
    if dead_holds_key {
        schema.indexes += &format!(
            "CREATE INDEX IF NOT EXISTS {} ON {t} ({}, {}) WHERE {} = 'dead';\n",
            crate::config::ident::quote(&format!("{table}_key_dead_idx")),
            c.key,
            c.id,
            c.status
        );
    }
    schema
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::columns::ColumnMapping;
    use crate::storage::sql_common::events_mapping;

    fn schema(table: &str, columns: &Columns) -> Schema {
        let ident = Ident::new(table).unwrap();
        Schema::render(
            &ident.quoted(),
            &ident,
            columns,
            &Names::new(columns, &super::super::shape::DIALECT),
        )
    }

    fn columns(mapping: ColumnMapping) -> Columns {
        Columns::from_mapping(&mapping).unwrap()
    }

    /// The DDL of the relay's own table, as it was before column mappings existed, plus
    /// the key's length check.
    #[test]
    fn the_relays_own_table_is_created_as_before() {
        let expected = format!(
            "CREATE TABLE IF NOT EXISTS \"Outbox\" (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    topic        TEXT    NOT NULL,
    key          TEXT    CHECK (length(key) <= 255),
    payload      BLOB    NOT NULL,
    headers      TEXT    NOT NULL DEFAULT '{{}}' CHECK (json_valid(headers)),
    -- Times: Unix epoch milliseconds (UTC).
    created_at   INTEGER NOT NULL DEFAULT ({NOW_MS}),
    status       TEXT    NOT NULL DEFAULT 'pending'
                         CHECK (status IN ('pending', 'done', 'dead')),
    attempts     INTEGER NOT NULL DEFAULT 0,
    available_at INTEGER NOT NULL DEFAULT ({NOW_MS}),
    leased_by    TEXT,
    last_error   TEXT,
    processed_at INTEGER
);
CREATE INDEX IF NOT EXISTS \"Outbox_pending_idx\" ON \"Outbox\" (id) WHERE status = 'pending';
CREATE INDEX IF NOT EXISTS \"Outbox_key_pending_idx\" ON \"Outbox\" (key, id) WHERE status = 'pending';
CREATE INDEX IF NOT EXISTS \"Outbox_processed_idx\" ON \"Outbox\" (processed_at) WHERE status = 'done';
CREATE INDEX IF NOT EXISTS \"Outbox_dead_idx\" ON \"Outbox\" (id) WHERE status = 'dead';
CREATE TABLE IF NOT EXISTS \"Outbox_pauses\" (
    target    TEXT    PRIMARY KEY,
    paused_at INTEGER NOT NULL
);
"
        );
        assert_eq!(schema("Outbox", &Columns::default()).text(), expected);
    }

    #[test]
    fn a_mapped_table_gets_its_names_and_the_columns_to_add_as_comments() {
        let columns = columns(ColumnMapping {
            topic: None,
            fixed_topic: Some("orders".into()),
            payload_format: PayloadFormat::Json,
            headers: String::new(),
            status: "relay_status".into(),
            ..events_mapping()
        });
        let schema = schema("events", &columns);
        let text = schema.text();
        assert!(text.contains("    \"event_id\"   INTEGER PRIMARY KEY AUTOINCREMENT,"));
        assert!(text.contains("\"body\"       TEXT    NOT NULL CHECK (json_valid(\"body\"))"));
        assert!(
            !text.contains("topic") && !text.contains("headers"),
            "{text}"
        );
        assert!(text.contains(
            "-- ALTER TABLE \"events\" ADD COLUMN \"relay_status\" TEXT NOT NULL DEFAULT \
             'pending' CHECK (\"relay_status\" IN ('pending', 'done', 'dead'));\n"
        ));
        assert!(text.contains(
            "-- ALTER TABLE \"events\" ADD COLUMN available_at INTEGER NOT NULL DEFAULT 0;\n"
        ));
        assert!(text.contains("--   UPDATE \"events\" SET \"relay_status\" = 'done'"));
        assert!(text.contains(
            "ON \"events\" (\"aggregate_id\", \"event_id\") WHERE \"relay_status\" = 'pending';"
        ));
        let added: Vec<&str> = schema.add_columns.iter().map(|a| a.name.as_str()).collect();
        assert_eq!(
            added,
            [
                "relay_status",
                "attempts",
                "available_at",
                "leased_by",
                "last_error",
                "processed_at"
            ]
        );
    }

    fn live(type_name: &str) -> LiveColumn {
        live_column(("c".into(), type_name.into(), 0, 0))
    }

    #[test]
    fn declared_types_are_judged_by_their_affinity() {
        assert!(accepts(ColumnKind::Id, &live("BIGINT")).is_ok());
        assert!(accepts(ColumnKind::Text, &live("VARCHAR(64)")).is_ok());
        assert!(accepts(ColumnKind::Payload(PayloadFormat::Bytes), &live("")).is_ok());
        assert!(accepts(ColumnKind::Payload(PayloadFormat::Json), &live("json")).is_ok());
        assert!(accepts(ColumnKind::Headers, &live("TEXT")).is_ok());
        let refused = accepts(ColumnKind::Payload(PayloadFormat::Bytes), &live("TEXT"));
        assert!(refused.unwrap_err().contains("payload_format = \"text\""));
        let refused = accepts(ColumnKind::Timestamp, &live("DATETIME")).unwrap_err();
        assert!(refused.contains("epoch milliseconds"), "{refused}");
        assert!(accepts(ColumnKind::Counter, &live("REAL")).is_err());
        assert_eq!(live(" ").type_name, UNTYPED);
    }
}
