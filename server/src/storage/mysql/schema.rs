//! The outbox table itself: its DDL rendered from the column mapping and applied
//! ([`Table::ensure`]), and the check of a live table against the mapping
//! ([`Table::verify`]).
//!
//! Indexes of the relay's own table are declared inside `CREATE TABLE` (MySQL 8 has no
//! `CREATE INDEX IF NOT EXISTS`):
//! - `(status, id)` serves the claim: pending rows in id order, stopping at the batch
//!   size. The claim's scan is pinned to it (`FORCE INDEX`), so a table without it cannot
//!   be claimed from: [`Storage::verify_table`](crate::storage::Storage::verify_table) reports it missing.
//! - `(key, status, id)` serves strict ordering's predecessor tests and successors.
//! - `(status, available_at)` finds the few rows that hold keys back (leased or
//!   retrying): the predecessor test behind a blocked hot key probes it instead of the
//!   key's backlog (0.53 s to 0.16 s for a claim behind 20,000 blocked rows).
//! - `(status, processed_at)` serves purge.
//!
//! `topic`, `key` and `leased_by` compare byte for byte (`utf8mb4_bin`), as in PostgreSQL:
//! the default collation would make `Order-1` and `order-1` one key. A team's own table
//! keeps its collation: with a case-insensitive one, keys that differ only in case are
//! ordered as one key (held back more, never less) and a topic filter matches
//! case-insensitively.
//!
//! A mapped table ("bring your own table") usually exists already, without the relay's
//! bookkeeping columns and indexes:
//! - `txoutboxd schema` prints the `CREATE TABLE IF NOT EXISTS` (for a team starting
//!   fresh), then one `ALTER TABLE ... ADD COLUMN IF NOT EXISTS ...` of the bookkeeping
//!   columns and one `ADD INDEX IF NOT EXISTS ...` of the indexes (MariaDB's syntax; the
//!   whole output runs as printed on a fresh or an existing table, again and again).
//! - [`Storage::ensure_table`](crate::storage::Storage::ensure_table) looks at the live
//!   table and adds only what it lacks, without `IF NOT EXISTS`, which MySQL 8 does not
//!   have.
//!
//! For the relay's own names the output is exactly what it always was: no `ALTER`s.

use sqlx::Executor;

use super::convert::{self, Conn};
use super::shape::{derived_name, pauses_table, quote, Shape, PENDING_INDEX};
use crate::config::columns::{ColumnKind, Columns, PayloadFormat};
use crate::storage::columns::check_live_columns;
use crate::storage::columns::LiveColumn;
use crate::storage::names::Names;
use crate::storage::{StorageError, StorageResult};

/// The DDL of one outbox table.
#[derive(Debug)]
pub(super) struct Schema {
    /// `CREATE DATABASE` (when one is named) and `CREATE TABLE IF NOT EXISTS` with every
    /// column and index, one statement each (sent one by one: no multi-statement packets).
    pub create: Vec<String>,
    /// The relay's bookkeeping columns, for a table that lacks some.
    pub add_columns: Vec<Part>,
    /// The relay's indexes, for a table that lacks some.
    pub indexes: Vec<Part>,
    /// The name of the index the claim is pinned to.
    pub pending_index: String,
    /// `` `db`.`table` ``.
    table: String,
    /// `db.table`, for the printed note.
    display_table: String,
    own_names: bool,
    /// Marks the rows already in a table delivered (printed with the `ALTER`s).
    skip_existing: String,
}

/// A column or index that `ALTER TABLE` can add: its name as the live table lists it, and
/// its definition.
#[derive(Debug)]
pub(super) struct Part {
    pub name: String,
    pub definition: String,
}

/// The parts the live table does not have, by name (case-insensitively, as MySQL).
pub(super) fn lacking<'a>(parts: &'a [Part], live: &[&str]) -> Vec<&'a Part> {
    parts
        .iter()
        .filter(|part| {
            !live
                .iter()
                .any(|name| name.eq_ignore_ascii_case(&part.name))
        })
        .collect()
}

impl Schema {
    pub fn render(t: &str, display_table: &str, shape: &Shape<'_>, c: &Names) -> Self {
        let columns = &shape.options.columns;
        let mut lines = Vec::new();
        let mut add_columns = Vec::new();
        for needed in columns.needed() {
            let (name, definition) = definition(needed.key, c, columns.payload_format);
            lines.push(format!("    {name:<12} {definition}"));
            if Columns::is_bookkeeping(needed.kind) {
                add_columns.push(Part {
                    name: needed.name.to_string(),
                    definition: format!("{name} {}", one_line(&definition)),
                });
            }
        }
        let index = |suffix: &str, columns: &[&str]| {
            let name = derived_name(shape.table.as_str(), suffix);
            let definition = format!("{} ({})", quote(&name), columns.join(", "));
            Part { name, definition }
        };
        let pending = index(PENDING_INDEX, &[&c.status, &c.id]);
        let pending_index = pending.name.clone();
        let indexes = vec![
            pending,
            index("_key_idx", &[&c.key, &c.status, &c.id]),
            index("_due_idx", &[&c.status, &c.available_at]),
            index("_processed_idx", &[&c.status, &c.processed_at]),
        ];
        lines.extend(
            indexes
                .iter()
                .map(|index| format!("    KEY {}", index.definition)),
        );

        let mut create = Vec::new();
        if let Some(database) = shape.database {
            create.push(format!(
                "CREATE DATABASE IF NOT EXISTS {}",
                quote(database.as_str())
            ));
        }
        create.push(format!(
            "CREATE TABLE IF NOT EXISTS {t} (\n{}\n) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4",
            lines.join(",\n")
        ));
        // The outbox's pause (see `Storage::paused_since`): a row whose `target` is empty
        // pauses the whole outbox.
        create.push(format!(
            "CREATE TABLE IF NOT EXISTS {} (\n    target    VARCHAR(255) NOT NULL PRIMARY KEY,\n    \
             paused_at DATETIME(6) NOT NULL\n) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4",
            pauses_table(shape)
        ));
        Self {
            create,
            add_columns,
            indexes,
            pending_index,
            table: t.to_owned(),
            display_table: display_table.to_owned(),
            own_names: columns.is_default(),
            skip_existing: c.fill(
                "UPDATE {t} SET {status} = 'done', {processed_at} = UTC_TIMESTAMP(6) \
                 WHERE {status} = 'pending'",
                &[("t", &t)],
            ),
        }
    }

    /// One `ALTER TABLE` adding `columns`, with MariaDB's `IF NOT EXISTS` or without.
    pub fn add_columns<'a>(
        &self,
        columns: impl IntoIterator<Item = &'a Part>,
        if_not_exists: bool,
    ) -> String {
        self.alter("ADD COLUMN", columns, if_not_exists)
    }

    /// One `ALTER TABLE` adding `indexes`, with MariaDB's `IF NOT EXISTS` or without.
    pub fn add_indexes<'a>(
        &self,
        indexes: impl IntoIterator<Item = &'a Part>,
        if_not_exists: bool,
    ) -> String {
        self.alter("ADD INDEX", indexes, if_not_exists)
    }

    fn alter<'a>(
        &self,
        clause: &str,
        parts: impl IntoIterator<Item = &'a Part>,
        if_not_exists: bool,
    ) -> String {
        let guard = if if_not_exists { " IF NOT EXISTS" } else { "" };
        let clauses: Vec<String> = parts
            .into_iter()
            .map(|part| format!("\n    {clause}{guard} {}", part.definition))
            .collect();
        format!("ALTER TABLE {}{}", self.table, clauses.join(","))
    }

    /// What `txoutboxd schema` prints (see the module docs).
    pub fn text(&self) -> String {
        let mut text: String = self
            .create
            .iter()
            .map(|statement| format!("{statement};\n"))
            .collect();
        if self.own_names {
            return text;
        }
        text += &format!(
            "-- A table of your own ({}) needs the relay's bookkeeping columns and indexes:
-- these statements add what it lacks. MySQL 8 has no IF NOT EXISTS here: leave out
-- what your table has.
{};
{};
-- Rows already in the table are now pending and will be published; to skip them, run
-- once, before starting txoutboxd:
--   {};
",
            self.display_table,
            self.add_columns(&self.add_columns, true),
            self.add_indexes(&self.indexes, true),
            self.skip_existing,
        );
        text
    }
}

fn one_line(definition: &str) -> String {
    definition.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A column of the `CREATE TABLE`, by its key under `columns.`: its name as written and
/// its definition.
fn definition<'a>(key: &str, c: &'a Names, format: PayloadFormat) -> (&'a str, String) {
    let (name, definition): (&str, &str) = match key {
        "id" => (&c.id, "BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY"),
        "topic" => (
            c.topic.as_deref().unwrap_or_default(),
            "VARCHAR(255) COLLATE utf8mb4_bin NOT NULL",
        ),
        "key" => (&c.key, "VARCHAR(255) COLLATE utf8mb4_bin NULL"),
        "payload" => (
            &c.payload,
            match format {
                PayloadFormat::Bytes => "LONGBLOB     NOT NULL",
                PayloadFormat::Text => "LONGTEXT     NOT NULL",
                PayloadFormat::Json => "JSON         NOT NULL",
            },
        ),
        "headers" => (
            c.headers.as_deref().unwrap_or_default(),
            "JSON         NOT NULL DEFAULT ('{}')",
        ),
        "created_at" => (
            &c.created_at,
            "DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6))",
        ),
        "status" => {
            return (
                &c.status,
                format!(
                    "VARCHAR(16)  NOT NULL DEFAULT 'pending'\n{:30}CHECK ({} IN ('pending', \
                     'done', 'dead'))",
                    "", c.status
                ),
            )
        }
        "attempts" => (&c.attempts, "INT          NOT NULL DEFAULT 0"),
        "available_at" => (
            &c.available_at,
            "DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6))",
        ),
        "leased_by" => (&c.leased_by, "VARCHAR(255) COLLATE utf8mb4_bin NULL"),
        "last_error" => (&c.last_error, "TEXT         NULL"),
        "processed_at" => (&c.processed_at, "DATETIME(6)  NULL"),
        _ => unreachable!("every key of Columns::needed is listed: {key}"),
    };
    (name, definition.to_owned())
}

/// Which column types can hold each kind of column, judged by `COLUMN_TYPE` (`int(10)
/// unsigned`, `datetime(6)`; MariaDB's `JSON` is a `longtext`); the error says what would
/// do. Ids may be `INT` as well as `BIGINT`, signed or not: statements read them as
/// `BIGINT`. Times are read as UTC, which a `TIMESTAMP` is in the relay's sessions
/// and a `DATETIME` is when producers write UTC.
pub(super) fn accepts(kind: ColumnKind, column: &LiveColumn) -> Result<(), &'static str> {
    let type_name = column.type_name.to_ascii_lowercase();
    let base = type_name.split(['(', ' ']).next().unwrap_or_default();
    let texts = ["text", "mediumtext", "longtext"];
    let is = |names: &[&str]| names.contains(&base);
    let ok = match kind {
        ColumnKind::Id => is(&["bigint", "int"]),
        ColumnKind::Text | ColumnKind::Status => is(&["varchar", "char"]),
        ColumnKind::Payload(PayloadFormat::Bytes) => {
            is(&["longblob", "mediumblob", "blob", "varbinary"])
        }
        ColumnKind::Payload(PayloadFormat::Text) => is(&texts) || is(&["varchar"]),
        ColumnKind::Payload(PayloadFormat::Json) | ColumnKind::Headers => {
            is(&texts) || is(&["json"])
        }
        ColumnKind::Timestamp | ColumnKind::NullableTimestamp => is(&["datetime", "timestamp"]),
        ColumnKind::DueAt => type_name == "datetime(6)",
        ColumnKind::Counter => {
            is(&["int", "bigint", "mediumint", "smallint", "tinyint"])
                && !type_name.contains("unsigned")
        }
        ColumnKind::NullableText => is(&texts) || is(&["varchar", "char"]),
    };
    if ok {
        return Ok(());
    }
    Err(match kind {
        ColumnKind::Id => "BIGINT or INT",
        ColumnKind::Text | ColumnKind::Status => "VARCHAR or CHAR",
        ColumnKind::Payload(PayloadFormat::Bytes) => {
            "LONGBLOB, MEDIUMBLOB, BLOB or VARBINARY (for a text column, set \
             payload_format = \"text\")"
        }
        ColumnKind::Payload(PayloadFormat::Text) => {
            "LONGTEXT, MEDIUMTEXT, TEXT or VARCHAR (payload_format = \"text\")"
        }
        ColumnKind::Payload(PayloadFormat::Json) => "JSON or LONGTEXT (payload_format = \"json\")",
        ColumnKind::Headers => "JSON or LONGTEXT (a JSON object of strings)",
        ColumnKind::Timestamp | ColumnKind::NullableTimestamp => "DATETIME or TIMESTAMP",
        ColumnKind::DueAt => "DATETIME(6) (a TIMESTAMP cannot hold retry times past 2038)",
        ColumnKind::Counter => "a signed INT",
        ColumnKind::NullableText => "VARCHAR or TEXT",
    })
}

/// A row of `information_schema.COLUMNS` (name, `COLUMN_TYPE`, nullable, has a default)
/// as a [`LiveColumn`].
pub(super) fn live_column(
    (name, type_name, nullable, has_default): (String, String, i64, i64),
) -> LiveColumn {
    LiveColumn {
        name,
        type_name,
        nullable: nullable != 0,
        has_default: has_default != 0,
    }
}

/// The live table: its DDL applied ([`Table::ensure`]) and checked ([`Table::verify`]).
pub(super) struct Table {
    conn: Conn,
    pub schema: Schema,
    /// The database (MySQL's "schema") holding the table; `None`: the URL's.
    database: Option<String>,
    /// The table's name, unquoted, as `information_schema` lists it.
    name: String,
    columns: Columns,
    ping: String,
}

/// `?` database (`NULL`: the connection's), `?` table: the live table's columns.
const LIVE_COLUMNS: &str = "SELECT COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE = 'YES', \
                              COLUMN_DEFAULT IS NOT NULL AND COLUMN_DEFAULT <> 'NULL' \
                            FROM information_schema.COLUMNS \
                            WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ?";
/// `?` database, `?` table: the names of the live table's indexes.
const LIVE_INDEXES: &str = "SELECT DISTINCT INDEX_NAME FROM information_schema.STATISTICS \
                            WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ?";

impl Table {
    pub fn new(conn: Conn, shape: &Shape<'_>, t: &str, c: &Names) -> Self {
        Self {
            schema: Schema::render(t, &conn.table, shape, c),
            conn,
            database: shape.database.map(|database| database.to_string()),
            name: shape.table.to_string(),
            columns: shape.options.columns.clone(),
            ping: format!("SELECT 1 FROM {t} LIMIT 0"),
        }
    }

    /// The live table's columns and index names; none when there is no table.
    async fn live_table(
        &self,
        action: &'static str,
    ) -> StorageResult<(Vec<LiveColumn>, Vec<String>)> {
        let database = self.database.as_deref();
        let columns: Vec<(String, String, i64, i64)> = sqlx::query_as(LIVE_COLUMNS)
            .bind(database)
            .bind(&self.name)
            .fetch_all(&self.conn.pool)
            .await
            .map_err(self.conn.error(action))?;
        let indexes = sqlx::query_scalar(LIVE_INDEXES)
            .bind(database)
            .bind(&self.name)
            .fetch_all(&self.conn.pool)
            .await
            .map_err(self.conn.error(action))?;
        Ok((columns.into_iter().map(live_column).collect(), indexes))
    }

    /// What lifts the session's statement limit for one statement: the DDL of
    /// `create_schema` may rebuild a large table, which takes as long as it takes (as on
    /// PostgreSQL). MariaDB's `max_statement_time` ends DDL too; MySQL's
    /// `max_execution_time` only `SELECT`s, and MySQL has no `SET STATEMENT`.
    async fn unlimited_statement_prefix(&self) -> StorageResult<&'static str> {
        let version: String = sqlx::query_scalar("SELECT VERSION()")
            .fetch_one(&self.conn.pool)
            .await
            .map_err(self.conn.error("create schema"))?;
        Ok(if version.contains("MariaDB") {
            "SET STATEMENT max_statement_time = 0 FOR "
        } else {
            ""
        })
    }

    /// Runs one `ALTER TABLE` of `create_schema`. A server starting at the same time may
    /// have added the same columns or indexes first: duplicates are what was wanted.
    async fn alter(&self, statement: &str) -> StorageResult<()> {
        match self.conn.pool.execute(statement).await {
            Err(err) if convert::is_duplicate_column_or_index(&err) => Ok(()),
            result => result.map(drop).map_err(self.conn.error("create schema")),
        }
    }
    /// The database and table if missing, then what a table of the team's own lacks of
    /// the bookkeeping columns and indexes, each kind in one `ALTER TABLE` (see the
    /// module docs).
    pub async fn ensure(&self) -> StorageResult<()> {
        // `CREATE ... IF NOT EXISTS` is atomic under MariaDB's metadata locks, so servers
        // starting together need no lock of their own. DDL commits implicitly: no
        // transaction around it.
        let schema = &self.schema;
        let unlimited = self.unlimited_statement_prefix().await?;
        for statement in &schema.create {
            self.conn
                .pool
                .execute(format!("{unlimited}{statement}").as_str())
                .await
                .map_err(self.conn.error("create schema"))?;
        }
        let (live_columns, live_indexes) = self.live_table("create schema").await?;
        let live: Vec<&str> = live_columns.iter().map(|c| c.name.as_str()).collect();
        let columns = lacking(&schema.add_columns, &live);
        if !columns.is_empty() {
            tracing::info!(columns = columns.len(), "adding bookkeeping columns");
            let statement = schema.add_columns(columns, false);
            self.alter(&format!("{unlimited}{statement}")).await?;
        }
        let live: Vec<&str> = live_indexes.iter().map(String::as_str).collect();
        let indexes = lacking(&schema.indexes, &live);
        if !indexes.is_empty() {
            tracing::info!(indexes = indexes.len(), "adding indexes");
            let statement = schema.add_indexes(indexes, false);
            self.alter(&format!("{unlimited}{statement}")).await?;
        }
        Ok(())
    }

    /// The table answers, its columns are what the mapping needs (the relay's own table
    /// is checked too), and it has the index claims are pinned to.
    pub async fn verify(&self) -> StorageResult<()> {
        sqlx::query(&self.ping)
            .execute(&self.conn.pool)
            .await
            .map_err(self.conn.error("ping"))?;
        let (columns, indexes) = self.live_table("ping").await?;
        let mut problems = check_live_columns(&self.columns, &columns, true, accepts);
        let pending_index = &self.schema.pending_index;
        if !indexes
            .iter()
            .any(|name| name.eq_ignore_ascii_case(pending_index))
        {
            problems.push(format!(
                "index {pending_index:?} is missing: claims are pinned to it; \
                 `txoutboxd schema` prints the statement that adds it"
            ));
        }
        StorageError::unless_problems(&self.conn.table, problems)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::columns::ColumnMapping;
    use crate::config::ident::Ident;
    use crate::storage::sql_common::events_mapping;
    use crate::storage::TableOptions;

    fn schema(database: Option<&str>, table: &str, columns: &Columns) -> Schema {
        let database = database.map(|d| Ident::new(d).unwrap());
        let table = Ident::new(table).unwrap();
        let t = match &database {
            Some(d) => format!("{}.{}", quote(d.as_str()), quote(table.as_str())),
            None => quote(table.as_str()),
        };
        let options = TableOptions {
            columns: columns.clone(),
            ..TableOptions::default()
        };
        let shape = Shape {
            database: database.as_ref(),
            table: &table,
            options: &options,
        };
        Schema::render(
            &t,
            table.as_str(),
            &shape,
            &Names::new(columns, &super::super::shape::DIALECT),
        )
    }

    /// The DDL of the relay's own table, as it was before column mappings existed.
    #[test]
    fn the_relays_own_table_is_created_as_before() {
        let expected = "CREATE DATABASE IF NOT EXISTS `app`;
CREATE TABLE IF NOT EXISTS `app`.`outbox` (
    id           BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    topic        VARCHAR(255) COLLATE utf8mb4_bin NOT NULL,
    `key`        VARCHAR(255) COLLATE utf8mb4_bin NULL,
    payload      LONGBLOB     NOT NULL,
    headers      JSON         NOT NULL DEFAULT ('{}'),
    created_at   DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    status       VARCHAR(16)  NOT NULL DEFAULT 'pending'
                              CHECK (status IN ('pending', 'done', 'dead')),
    attempts     INT          NOT NULL DEFAULT 0,
    available_at DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    leased_by    VARCHAR(255) COLLATE utf8mb4_bin NULL,
    last_error   TEXT         NULL,
    processed_at DATETIME(6)  NULL,
    KEY `outbox_pending_idx` (status, id),
    KEY `outbox_key_idx` (`key`, status, id),
    KEY `outbox_due_idx` (status, available_at),
    KEY `outbox_processed_idx` (status, processed_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
CREATE TABLE IF NOT EXISTS `app`.`outbox_pauses` (
    target    VARCHAR(255) NOT NULL PRIMARY KEY,
    paused_at DATETIME(6) NOT NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
";
        assert_eq!(
            schema(Some("app"), "outbox", &Columns::default()).text(),
            expected
        );
    }

    #[test]
    fn a_mapped_table_gets_its_names_and_what_an_existing_one_lacks() {
        let columns = Columns::from_mapping(&ColumnMapping {
            topic: None,
            fixed_topic: Some("orders".into()),
            payload_format: PayloadFormat::Json,
            headers: String::new(),
            status: "state".into(),
            ..events_mapping()
        })
        .unwrap();
        let schema = schema(None, "events", &columns);
        let text = schema.text();
        assert!(text.contains("    `event_id`   BIGINT       NOT NULL AUTO_INCREMENT"));
        assert!(text.contains("    `body`       JSON         NOT NULL,"));
        assert!(
            !text.contains("topic") && !text.contains("headers"),
            "{text}"
        );
        assert!(text.contains(
            "ALTER TABLE `events`
    ADD COLUMN IF NOT EXISTS `state` VARCHAR(16) NOT NULL DEFAULT 'pending' CHECK \
             (`state` IN ('pending', 'done', 'dead')),
    ADD COLUMN IF NOT EXISTS attempts INT NOT NULL DEFAULT 0,"
        ));
        assert!(text.contains(
            "    ADD INDEX IF NOT EXISTS `events_key_idx` (`aggregate_id`, `state`, `event_id`),"
        ));
        assert!(text.contains("--   UPDATE `events` SET `state` = 'done'"));
        assert_eq!(schema.pending_index, "events_pending_idx");
        let lacking = lacking(&schema.add_columns, &["STATE", "attempts"]);
        let added: Vec<&str> = lacking.iter().map(|part| part.name.as_str()).collect();
        assert_eq!(
            added,
            ["available_at", "leased_by", "last_error", "processed_at"]
        );
        assert!(!schema.add_columns(lacking, false).contains("IF NOT EXISTS"));
    }

    fn live(type_name: &str) -> LiveColumn {
        live_column(("c".into(), type_name.into(), 1, 0))
    }

    #[test]
    fn column_types_are_judged_by_their_base_type() {
        assert!(accepts(ColumnKind::Id, &live("int(10) unsigned")).is_ok());
        assert!(accepts(ColumnKind::Id, &live("smallint(6)")).is_err());
        assert!(accepts(ColumnKind::Text, &live("varchar(64)")).is_ok());
        assert!(accepts(ColumnKind::Text, &live("text")).is_err());
        assert!(accepts(ColumnKind::Headers, &live("longtext")).is_ok());
        assert!(accepts(ColumnKind::Timestamp, &live("timestamp(3)")).is_ok());
        assert!(accepts(ColumnKind::DueAt, &live("datetime(6)")).is_ok());
        let refused = accepts(ColumnKind::DueAt, &live("timestamp(6)")).unwrap_err();
        assert!(refused.contains("2038"), "{refused}");
        assert!(accepts(ColumnKind::Counter, &live("int(10) unsigned")).is_err());
        let refused = accepts(ColumnKind::Payload(PayloadFormat::Bytes), &live("longtext"));
        assert!(refused.unwrap_err().contains("payload_format = \"text\""));
    }
}
