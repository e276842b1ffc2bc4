//! The table itself: its DDL rendered from the column mapping (with the strict-ordering
//! objects of `strict.rs` and the insert trigger), run by [`Schema::ensure`], and the
//! check of a live table against the mapping ([`Schema::verify`]).

use sha2::{Digest, Sha256};
use sqlx::postgres::PgRow;
use sqlx::{Executor, Row};

use super::convert::Conn;
use super::shape::StrictObjects;
use super::shape::{derived_name, Shape, LOCK_CLASS_DDL};
use super::strict;
use crate::config::columns::{ColumnKind, Columns, PayloadFormat};
use crate::storage::columns::{check_live_columns, LiveColumn};
use crate::storage::names::Names;
use crate::storage::{StorageError, StorageResult};

/// The DDL of one table, and what checks the live table against it.
pub(super) struct Schema {
    conn: Conn,
    columns: Columns,
    /// The DDL, for a migration tool.
    pub ddl: String,
    /// The DDL, preceded by what makes it run alone and unbounded by the sessions'
    /// statement timeout: one simple query, one transaction.
    run: String,
    check: SchemaCheck,
    /// The table as the statements name it: quoted, with its schema when configured.
    table: String,
    ping: String,
    /// The functions a strict table needs, as `regprocedure` texts.
    functions: Vec<String>,
}

impl Schema {
    pub fn new(conn: Conn, shape: &Shape<'_>, strict: &StrictObjects) -> Self {
        let t = shape.table_sql();
        let n = shape.names();
        let (ddl, check) = schema(&t, shape, &n, strict);
        Self {
            conn,
            columns: shape.options.columns.clone(),
            // One simple query: the statements run in one implicit transaction, sent at
            // once, so no lock of the DDL waits on this server between them. An index
            // build may take long; a table lock that does not come within a second is
            // given up (the health check tries again), since producers' inserts queue
            // behind a DDL statement waiting for it.
            run: format!(
                "SET LOCAL statement_timeout = 0;\n\
                 SET LOCAL lock_timeout = '1s';\n\
                 SELECT pg_advisory_xact_lock({LOCK_CLASS_DDL}, 0);\n{ddl}"
            ),
            ddl,
            check,
            ping: format!("SELECT 1 FROM {t} LIMIT 0"),
            table: t,
            functions: match shape.options.strict_ordering {
                true => strict::functions(strict),
                false => Vec::new(),
            },
        }
    }

    /// Whether this version's DDL already ran on the live table (see [`SchemaCheck`]);
    /// catalog reads only, so it waits for no lock.
    async fn is_current(&self) -> StorageResult<bool> {
        let check = &self.check;
        sqlx::query_scalar(SCHEMA_CURRENT)
            .bind(&check.relations)
            .bind(&self.table)
            .bind(&check.triggers)
            .bind(&check.marker_on)
            .bind(&check.marker)
            .fetch_one(&self.conn.pool)
            .await
            .map_err(self.conn.error("create schema"))
    }

    /// See [`crate::storage::Storage::ensure_table`].
    pub async fn ensure(&self) -> StorageResult<()> {
        if self.is_current().await? {
            return Ok(());
        }
        // One simple query: one transaction, sent at once (see `Schema::run`). Servers
        // starting together serialise on its advisory lock (tables in one schema share
        // its CREATE SCHEMA, so the lock is global, not per table).
        self.conn
            .pool
            .execute(self.run.as_str())
            .await
            .map_err(self.conn.error("create schema"))?;
        Ok(())
    }

    /// See [`crate::storage::Storage::verify_table`].
    pub async fn verify(&self) -> StorageResult<()> {
        let err = || self.conn.error("ping");
        sqlx::query(&self.ping)
            .execute(&self.conn.pool)
            .await
            .map_err(err())?;
        let live = sqlx::query(LIVE_COLUMNS)
            .bind(&self.table)
            .fetch_all(&self.conn.pool)
            .await
            .map_err(err())?
            .iter()
            .map(live_column)
            .collect::<Result<Vec<_>, _>>()
            .map_err(err())?;
        let mut problems = check_live_columns(&self.columns, &live, false, accepts);
        if !self.functions.is_empty() {
            let present: i64 = sqlx::query_scalar(FUNCTIONS_PRESENT)
                .bind(&self.functions)
                .fetch_one(&self.conn.pool)
                .await
                .map_err(err())?;
            if present < self.functions.len() as i64 {
                problems.push(format!(
                    "the functions of strict ordering ({}) are missing or of another version: \
                     run the DDL of `txoutboxd schema <outbox>`, or set create_schema = true",
                    self.functions.join(", ")
                ));
            }
        }
        StorageError::unless_problems(&self.conn.table, problems)
    }
}

/// Counts the functions among `$1` (`regprocedure` texts) that exist.
const FUNCTIONS_PRESENT: &str = "SELECT count(*) FROM unnest($1::text[]) AS f(name) \
                                 WHERE to_regprocedure(f.name) IS NOT NULL";

/// What tells, without a lock, that the DDL of this version already ran on the live
/// table: the objects it creates exist, and its last statement left `marker` as the
/// comment of the pending index (see [`schema`]). A restarting replica with
/// `create_schema` then runs no DDL: `DROP TRIGGER` and `CREATE INDEX` take table locks
/// that producers' inserts queue behind while the lock waits for the relay's own
/// transactions (the relay must not hold up a producer's insert).
#[derive(Debug)]
pub(super) struct SchemaCheck {
    /// Quoted, qualified names of every relation the DDL creates.
    pub relations: Vec<String>,
    /// The triggers it creates on the table, by their names in the catalog.
    pub triggers: Vec<String>,
    /// Quoted, qualified name of the index that carries the marker.
    pub marker_on: String,
    /// `txoutbox schema ` and a digest of the DDL before it.
    pub marker: String,
}

/// `$1` relations, `$2` the table, `$3` trigger names, `$4` the marker's index, `$5` the
/// marker: true when the schema is current (see [`SchemaCheck`]). Catalog reads only.
pub(super) const SCHEMA_CURRENT: &str = "SELECT \
       (SELECT coalesce(bool_and(to_regclass(r) IS NOT NULL), true) FROM unnest($1::text[]) AS r) \
       AND (SELECT count(*) FROM pg_trigger \
            WHERE tgrelid = to_regclass($2) AND tgname = ANY($3::text[])) = cardinality($3::text[]) \
       AND coalesce(obj_description(to_regclass($4), 'pg_class'), '') = $5";

/// The columns of the table named by `$1` (a quoted, possibly qualified name), resolved
/// like the statements resolve it, through the search path.
pub(super) const LIVE_COLUMNS: &str = "SELECT a.attname::text AS name, \
       format_type(a.atttypid, a.atttypmod) AS type_name, t.typname::text AS udt, \
       NOT a.attnotnull AS nullable, a.atthasdef OR a.attidentity <> '' AS has_default \
     FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid \
     WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped";

/// How full an insert leaves a page of the relay's own table, in percent. A claim
/// changes no indexed column (`leased_by`, `attempts`, `available_at`), so it is a HOT
/// update, which touches no index, when the row's page has room for the new version;
/// with PostgreSQL's default (100) the pages of a backlog are full, and every claim
/// inserted into the four indexes of pending rows instead. Half-full pages make every
/// claim of a freshly written backlog HOT: WAL per keyless message 1,026 -> 433 bytes
/// (BENCHMARKS.md), at the price of a table twice the size while rows wait.
const FILLFACTOR: u8 = 50;

/// The DDL of the table and what it needs: indexes, strict ordering's objects, the
/// insert trigger; for a mapped table, the bookkeeping columns it lacks. It ends by
/// marking the pending index with a digest of itself, and returns what checks that.
pub(super) fn schema(
    t: &str,
    shape: &Shape<'_>,
    n: &Names,
    strict: &StrictObjects,
) -> (String, SchemaCheck) {
    let mut check = SchemaCheck {
        relations: vec![t.to_owned()],
        triggers: Vec::new(),
        marker_on: shape.qualified(&shape.derived("_pending_idx")),
        marker: String::new(),
    };
    let name = |suffix: &str| shape.derived(suffix);
    let mut sql = create_table(t, shape, n);
    sql += &n.fill(
        "CREATE INDEX IF NOT EXISTS {pending} ON {t} ({id}) WHERE {status} = 'pending';
CREATE INDEX IF NOT EXISTS {key_pending} ON {t} ({key}, {id}) WHERE {status} = 'pending';
CREATE INDEX IF NOT EXISTS {processed} ON {t} ({processed_at}) WHERE {status} = 'done';
CREATE INDEX IF NOT EXISTS {dead} ON {t} ({id}) WHERE {status} = 'dead';
CREATE INDEX IF NOT EXISTS {keyless} ON {t} ({id}) WHERE {status} = 'pending' AND {key} IS NULL;
",
        &[
            ("dead", &name("_dead_idx")),
            ("key_pending", &name("_key_pending_idx")),
            ("keyless", &name("_keyless_idx")),
            ("pending", &name("_pending_idx")),
            ("processed", &name("_processed_idx")),
            ("t", &t),
        ],
    );
    for suffix in [
        "_pending_idx",
        "_key_pending_idx",
        "_processed_idx",
        "_dead_idx",
        "_keyless_idx",
    ] {
        check.relations.push(shape.qualified(&name(suffix)));
    }
    // The outbox's pause (see `Storage::paused_since`): a row whose `target` is empty pauses
    // the whole outbox.
    sql += &format!(
        "CREATE TABLE IF NOT EXISTS {} (
    target    TEXT        PRIMARY KEY,
    paused_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
",
        shape.pauses_table()
    );
    check.relations.push(shape.pauses_table());
    if shape.options.dead_holds_key() {
        // What a strict claim under `dead_letter_holds_key` looks up per key: its dead
        // rows before and after its first pending row. Only with the policy: building it
        // scans the table while producers' inserts wait.
        let key_dead = name("_key_dead_idx");
        sql += &n.fill(
            "CREATE INDEX IF NOT EXISTS {key_dead} ON {t} ({key}, {id}) WHERE {status} = 'dead';\n",
            &[("key_dead", &key_dead), ("t", &t)],
        );
        check.relations.push(shape.qualified(&key_dead));
    }
    if shape.options.strict_ordering {
        sql += &strict::schema(strict, n);
        check.relations.push(strict.heads.clone());
        check.relations.push(shape.qualified(&strict.heads_index));
        check
            .triggers
            .push(derived_name(shape.table.as_str(), "_heads_on_insert"));
    }
    if let Some(channel) = shape.notify_channel {
        let function = match shape.schema {
            Some(schema) => format!("{}.{}", schema.quoted(), name("_notify")),
            None => name("_notify"),
        };
        sql += &notify_trigger(t, &function, &name("_notify"), channel.as_str(), n);
        check
            .triggers
            .push(derived_name(shape.table.as_str(), "_notify"));
    }
    let digest = Sha256::digest(sql.as_bytes());
    check.marker = format!("txoutbox schema {}", hex::encode(&digest[..8]));
    sql += &format!(
        "-- Marks this DDL as applied: a server with create_schema = true then runs none.\n\
         COMMENT ON INDEX {} IS '{}';\n",
        check.marker_on, check.marker
    );
    (sql, check)
}

/// The table (and its schema) when missing; for a table made by an earlier version, its
/// fill factor; for a team's existing table, the bookkeeping columns it lacks.
fn create_table(t: &str, shape: &Shape<'_>, n: &Names) -> String {
    let columns = &shape.options.columns;
    let mut sql = String::new();
    if let Some(schema) = shape.schema {
        sql += &format!("CREATE SCHEMA IF NOT EXISTS {};\n", schema.quoted());
    }
    let payload_type = match columns.payload_format {
        PayloadFormat::Bytes => "BYTEA",
        PayloadFormat::Text => "TEXT",
        PayloadFormat::Json => "JSONB",
    };
    // `(column, definition)` in table order: what the producer writes, then the relay's
    // own columns, shared by the new table and the additions to a mapped one.
    let mut message: Vec<(&str, String)> = vec![(
        &n.id,
        "BIGINT      GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY".to_owned(),
    )];
    message.extend(
        n.topic
            .as_deref()
            .map(|topic| (topic, "TEXT        NOT NULL".to_owned())),
    );
    message.push((
        &n.key,
        format!(
            "TEXT        CHECK (char_length({}) <= {})",
            n.key,
            crate::storage::MAX_KEY_CHARS
        ),
    ));
    message.push((&n.payload, format!("{payload_type:<11} NOT NULL")));
    message.extend(
        n.headers
            .as_deref()
            .map(|headers| (headers, "JSONB       NOT NULL DEFAULT '{}'".to_owned())),
    );
    message.push((
        &n.created_at,
        "TIMESTAMPTZ NOT NULL DEFAULT now()".to_owned(),
    ));
    let bookkeeping = [
        (
            n.status.as_str(),
            format!(
                "TEXT        NOT NULL DEFAULT 'pending'\n{:29}\
                 CHECK ({} IN ('pending', 'done', 'dead'))",
                "", n.status
            ),
        ),
        (&n.attempts, "INTEGER     NOT NULL DEFAULT 0".to_owned()),
        (
            &n.available_at,
            "TIMESTAMPTZ NOT NULL DEFAULT now()".to_owned(),
        ),
        (&n.leased_by, "TEXT".to_owned()),
        (&n.last_error, "TEXT".to_owned()),
        (&n.processed_at, "TIMESTAMPTZ".to_owned()),
    ];
    let definitions: Vec<String> = message
        .iter()
        .chain(&bookkeeping)
        .map(|(column, definition)| format!("    {column:<12} {definition}"))
        .collect();
    sql += &format!(
        "CREATE TABLE IF NOT EXISTS {t} (\n{}\n) WITH (fillfactor = {FILLFACTOR});\n",
        definitions.join(",\n")
    );
    if columns.is_default() {
        // A table made by an earlier version: the same room for its later pages.
        sql += &format!("ALTER TABLE {t} SET (fillfactor = {FILLFACTOR});\n");
    } else {
        // A team's existing table: what the relay still needs, idempotently.
        let additions: Vec<String> = bookkeeping
            .iter()
            .map(|(column, definition)| {
                format!("    ADD COLUMN IF NOT EXISTS {column} {definition}")
            })
            .collect();
        sql += &format!(
            "-- The relay's bookkeeping columns, for a table that existed before. Rows already
-- in the table become pending and will be delivered: mark the ones published already
-- with UPDATE {t} SET {status} = 'done' WHERE ... before starting txoutboxd.
ALTER TABLE {t}
{};
",
            additions.join(",\n"),
            status = n.status
        );
    }
    sql
}

/// Distinct topics one INSERT statement notifies at most; more make one notification of
/// unknown topic.
const MAX_NOTIFIED_TOPICS: usize = 16;

/// The insert trigger: one notification per INSERT statement, not per row, so a bulk
/// insert wakes the relay once per topic it inserted. The payload is `topic:` and the
/// topic (see `listen.rs`), so only the streams whose filter matches claim; the topic is
/// the whole rest of the payload, so nothing in it needs escaping. A statement of more
/// than [`MAX_NOTIFIED_TOPICS`] topics, or of a topic longer than any filter can name
/// (which a payload, at most 8,000 bytes, might not hold), sends one empty payload, as
/// the trigger of earlier versions always did: every stream claims. So does a table
/// whose topic is fixed (it has no topic column, and its streams filter on that topic or
/// on none). PostgreSQL drops a notification equal to one already sent by the same
/// transaction, so many rows of one topic in one transaction also notify once.
///
/// `CREATE OR REPLACE` and the trigger dropped and made again upgrade a table made by an
/// earlier version when `create_schema` runs this DDL (its marker changed with it).
fn notify_trigger(t: &str, function: &str, trigger: &str, channel: &str, n: &Names) -> String {
    // The channel passed validation, so it is safe in a string literal.
    let Some(topic) = &n.topic else {
        return format!(
            "CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('{channel}', '');
    RETURN NULL;
END;
$$;
DROP TRIGGER IF EXISTS {trigger} ON {t};
CREATE TRIGGER {trigger} AFTER INSERT ON {t}
    FOR EACH STATEMENT EXECUTE FUNCTION {function}();
"
        );
    };
    let max_topic = crate::storage::MAX_TOPIC_CHARS;
    format!(
        "CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    txoutbox_topics text[];
BEGIN
    SELECT array_agg(topic) INTO txoutbox_topics
        FROM (SELECT DISTINCT {topic} AS topic FROM txoutbox_inserted
              LIMIT {limit}) AS inserted;
    IF txoutbox_topics IS NULL THEN
        RETURN NULL;
    ELSIF cardinality(txoutbox_topics) > {MAX_NOTIFIED_TOPICS}
        OR EXISTS (SELECT FROM unnest(txoutbox_topics) AS topic
                   WHERE topic IS NULL OR char_length(topic) > {max_topic}) THEN
        PERFORM pg_notify('{channel}', '');
    ELSE
        PERFORM pg_notify('{channel}', '{prefix}' || topic) FROM unnest(txoutbox_topics) AS topic;
    END IF;
    RETURN NULL;
END;
$$;
DROP TRIGGER IF EXISTS {trigger} ON {t};
CREATE TRIGGER {trigger} AFTER INSERT ON {t} REFERENCING NEW TABLE AS txoutbox_inserted
    FOR EACH STATEMENT EXECUTE FUNCTION {function}();
",
        limit = MAX_NOTIFIED_TOPICS + 1,
        prefix = super::listen::TOPIC_PREFIX,
    )
}

/// One row of the live-columns query ([`LIVE_COLUMNS`]).
pub(super) fn live_column(row: &PgRow) -> Result<LiveColumn, sqlx::Error> {
    Ok(LiveColumn {
        name: row.try_get("name")?,
        type_name: row.try_get("type_name")?,
        nullable: row.try_get("nullable")?,
        has_default: row.try_get("has_default")?,
    })
}

/// The PostgreSQL types the relay can use for each kind of column; the error says which.
/// Times must carry their zone (`timestamptz`): a `timestamp` would be read in the
/// session's zone, and leases compare it with the database clock.
pub(super) fn accepts(kind: ColumnKind, column: &LiveColumn) -> Result<(), &'static str> {
    let base = column
        .type_name
        .split('(')
        .next()
        .unwrap_or_default()
        .trim();
    let text = matches!(base, "text" | "character varying");
    let (ok, wanted) = match kind {
        ColumnKind::Id => (matches!(base, "bigint" | "integer"), "bigint or integer"),
        ColumnKind::Text | ColumnKind::Status | ColumnKind::NullableText => {
            (text, "text or character varying")
        }
        ColumnKind::Payload(PayloadFormat::Bytes) => {
            (base == "bytea", "bytea (payload_format = \"bytes\")")
        }
        ColumnKind::Payload(PayloadFormat::Text) => (
            text,
            "text or character varying (payload_format = \"text\")",
        ),
        ColumnKind::Payload(PayloadFormat::Json) => (
            matches!(base, "json" | "jsonb"),
            "json or jsonb (payload_format = \"json\")",
        ),
        ColumnKind::Headers => (matches!(base, "json" | "jsonb"), "json or jsonb"),
        ColumnKind::Counter => (base == "integer", "integer"),
        ColumnKind::Timestamp | ColumnKind::DueAt | ColumnKind::NullableTimestamp => (
            base == "timestamp with time zone",
            "timestamp with time zone (timestamptz)",
        ),
    };
    if ok {
        Ok(())
    } else {
        Err(wanted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::columns::{ColumnMapping, Columns};
    use crate::config::ident::Ident;
    use crate::storage::postgres::shape::{
        insert, message, test_options, test_shape as shape, DIALECT,
    };
    #[test]
    fn schema_quotes_names_and_adds_the_trigger_only_with_a_channel() {
        let table = Ident::new("Outbox").unwrap();
        let channel = Ident::new("outbox_inserted").unwrap();
        let columns = Columns::default();
        let n = Names::new(&columns, &DIALECT);
        let options = test_options(&columns);
        let s = shape(&table, &options, None);
        let (sql, _) = schema("\"Outbox\"", &s, &n, &StrictObjects::new(&s));
        assert!(!sql.contains("pg_notify"));
        assert!(
            !sql.contains("ADD COLUMN"),
            "the relay's own table needs no additions"
        );
        assert!(sql.contains(") WITH (fillfactor = 50);"), "{sql}");
        assert!(sql.contains("ALTER TABLE \"Outbox\" SET (fillfactor = 50);"));
        let s = shape(&table, &options, Some(&channel));
        let (sql, _) = schema("\"Outbox\"", &s, &n, &StrictObjects::new(&s));
        assert!(sql.contains("CREATE INDEX IF NOT EXISTS \"Outbox_pending_idx\""));
        assert!(sql.contains("pg_notify('outbox_inserted', 'topic:' || topic)"));
        assert!(sql.contains("FOR EACH STATEMENT"));
    }

    #[test]
    fn a_mapped_table_gets_its_names_and_the_bookkeeping_columns_it_lacks() {
        let table = Ident::new("order_events").unwrap();
        let columns = Columns::from_mapping(&ColumnMapping {
            id: "event_id".to_owned(),
            fixed_topic: Some("it's".to_owned()),
            payload: "body".to_owned(),
            payload_format: PayloadFormat::Json,
            headers: String::new(),
            status: "relay_status".to_owned(),
            ..ColumnMapping::default()
        })
        .unwrap();
        let n = Names::new(&columns, &DIALECT);
        let options = test_options(&columns);
        let s = shape(&table, &options, None);
        let (sql, _) = schema("\"order_events\"", &s, &n, &StrictObjects::new(&s));
        assert!(sql.contains("\"body\"       JSONB"), "{sql}");
        assert!(
            sql.contains("ADD COLUMN IF NOT EXISTS \"relay_status\" TEXT"),
            "{sql}"
        );
        assert!(sql.contains("WHERE \"relay_status\" = 'pending'"), "{sql}");
        assert!(
            !sql.contains("\"topic\"") && !sql.contains("\"headers\""),
            "{sql}"
        );
        assert_eq!(n.topic("o."), "'it''s'::text");
        assert!(message(&n, "o", 1 << 22)
            .contains("THEN convert_to(o.\"body\"::text, 'UTF8') END AS payload"));
        assert!(
            message(&n, "o", 1 << 22).contains("THEN '{}'::jsonb ELSE '{}'::jsonb END AS headers")
        );
        assert_eq!(
            insert(&n, "t"),
            "INSERT INTO t (\"key\", \"body\") VALUES ($1, $2::jsonb) RETURNING \"event_id\"::int8"
        );
    }
}
