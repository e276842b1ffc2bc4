//! The SQL of the PostgreSQL backend, rendered once per table.
//!
//! Times come from `statement_timestamp()`, not `now()`: `now()` is the start of the
//! transaction, and a strict claim first waits for the table's advisory lock, so `now()`
//! would be stale by that wait (shorter leases, rows due a moment too late). Within one
//! statement `statement_timestamp()` is stable, like `now()`, so every row of a claim gets
//! the same lease deadline.
//!
//! Column meanings: `available_at` is when the row may next be claimed. A claim sets it to
//! the lease deadline (an expired lease is simply due again), a nack to the retry time, a
//! release to now plus the delay. A pending row is *leased* while `leased_by` is set and
//! `available_at` is in the future.

use std::sync::OnceLock;
use std::time::Duration;

use super::heads;
use super::table::{pauses_table, qualified, schema, SchemaCheck, StrictObjects, LIVE_COLUMNS};
use crate::storage::columns::{Columns, PayloadFormat};
use crate::storage::dead::FilterDialect;
use crate::storage::ident::Ident;
use crate::storage::names::{Dialect, Names, Placeholders};
use crate::storage::{TopicClause, MAX_LEASE_HOLDERS};

/// First half of the two-key advisory locks, so ours cannot collide with an
/// application's single-key locks. ASCII "txob".
pub(super) const LOCK_CLASS_CLAIM: i32 = 0x7478_6f62;
/// Serialises every `create_schema` of the database (servers starting together).
const LOCK_CLASS_DDL: i32 = LOCK_CLASS_CLAIM + 1;

/// Statements for one outbox table. Each runs on its own, as a transaction of its own:
/// no transaction of the relay spans a round trip to the server (issue 9), so a paused or
/// partitioned replica holds no lock that another replica or a producer needs.
#[derive(Debug)]
pub(super) struct Statements {
    /// `schema.table` unquoted, for messages.
    pub display_table: String,
    /// Non-strict claims, rendered on first use (see [`Statements::claim`]).
    claims: [[OnceLock<String>; 32]; 3],
    /// Rows larger than this are read without their payload and headers (see [`message`]).
    max_row_bytes: u64,
    /// Whether the table has a visibility delay (a parameter of the non-strict claim).
    delayed: bool,
    /// The messages of the ids `$1`, in id order, read once a strict claim committed.
    pub fetch: String,
    /// `(id, attempts)` of the rows among `$1` that `$2` holds.
    pub held_attempts: String,
    /// Acks return `(id, key)` of the rows they applied to.
    pub ack: String,
    pub ack_delete: String,
    /// `(id, attempts, key)` of the rows among `$1` that `$2` holds with a live lease.
    pub nack_held: String,
    /// Applies a batch of nacks whose outcome was decided (see `nack_many`).
    pub nack_apply: String,
    pub release: String,
    pub dead_letter: String,
    pub extend_lease: String,
    pub return_leases: String,
    pub stats: String,
    /// Rows delivered within `$1` (the processed index of delivered rows).
    pub delivered_within: String,
    pub purge_batch: String,
    pub ping: String,
    /// Describes the live table's columns; `$1` is [`Statements::qualified_table`].
    pub live_columns: String,
    /// Counts the functions among `$1` (`regprocedure` texts) that exist.
    pub functions_present: String,
    /// The functions a strict table needs, as `regprocedure` texts.
    pub functions: Vec<String>,
    /// The table as the statements name it: quoted, with its schema when configured.
    pub qualified_table: String,
    pub insert: String,
    /// The DDL, preceded by what makes it run alone and unbounded by the sessions'
    /// statement timeout: one simple query, one transaction.
    pub schema_run: String,
    pub schema: String,
    pub schema_check: SchemaCheck,
    /// With strict ordering: the function calls (see `heads.rs`).
    pub strict: Option<StrictStatements>,
    /// The columns as they appear in SQL, for the statements rendered per call (the
    /// dead-letter operations, whose selector varies).
    pub names: Names,
    /// With strict ordering: the heads table, quoted and qualified (see `heads.rs`).
    pub heads: Option<String>,
    /// Keys whose head is not due (see `blocked.rs`): `$1` after this head id, `$2` at
    /// most. With strict ordering, through the key-heads table ([`heads::blocked_keys`]).
    pub blocked_keys: String,
    /// `(owner, rows, earliest_expiry)` of the leases live now, the most rows first.
    pub lease_holders: String,
    /// The outbox's pauses `(target, paused_at)`; pause the targets `$1` (idempotent);
    /// resume them (see [`crate::storage::pauses`]).
    pub pauses: String,
    pub pause: String,
    pub resume: String,
}

#[derive(Debug)]
pub(super) struct StrictStatements {
    /// `$1` owner, `$2` lease, `$3` batch size, `$4` topics or NULL, `$5` visibility delay
    /// or NULL, `$6` max attempts, `$7` paused topics or NULL, `$8` whether a dead row
    /// holds its key; rows `(id, spent, lease_expires_at)`.
    pub claim: String,
    /// Moves on the heads of the keys `$1` after rows of theirs stopped being pending.
    pub advance: String,
    pub purge_drained: String,
}

/// What shapes the statements besides the table name.
pub(super) struct Shape<'a> {
    pub schema: Option<&'a Ident>,
    pub table: &'a Ident,
    pub columns: &'a Columns,
    pub strict_ordering: bool,
    /// `dead_letter_holds_key`, under strict ordering (see `heads::claim`).
    pub dead_holds_key: bool,
    pub visibility_delay: Duration,
    pub notify_channel: Option<&'a Ident>,
    /// See [`crate::storage::TableOptions::max_row_bytes`].
    pub max_row_bytes: u64,
}

/// How PostgreSQL writes names (every one quoted, so its case is kept) and the fixed
/// topic (a `text` literal).
pub(super) const DIALECT: Dialect = Dialect {
    column: quoted_column,
    literal: text_literal,
};

fn quoted_column(name: &Ident, _own: &str) -> String {
    name.quoted()
}

fn text_literal(text: &str) -> String {
    format!("{}::text", literal(text))
}

/// The columns of row `alias` as a message: `id, topic, key, payload, headers,
/// attempts, created_at, stored_bytes`, named so for decoding whatever the table calls
/// them. A row whose stored size (payload, headers, topic and key as stored) is over
/// `max_row_bytes` comes without its payload (NULL) and headers: the database never sends
/// what no response could hold (see [`crate::storage::OutboxMessage::too_large`]).
pub(super) fn message(n: &Names, alias: &str, max_row_bytes: u64) -> String {
    let payload = format!("{alias}.{}", n.payload);
    let payload = match n.payload_format {
        PayloadFormat::Bytes => payload,
        PayloadFormat::Text => format!("convert_to({payload}, 'UTF8')"),
        PayloadFormat::Json => format!("convert_to({payload}::text, 'UTF8')"),
    };
    let headers = match &n.headers {
        // A team's own table may leave its headers NULL: no headers, as elsewhere.
        Some(headers) => format!("coalesce({alias}.{headers}::jsonb, '{{}}'::jsonb)"),
        None => "'{}'::jsonb".to_owned(),
    };
    let topic = n.topic(&format!("{alias}."));
    let size = format!(
        "(octet_length({payload})::int8 + octet_length({headers}::text) \
         + octet_length({topic}) + coalesce(octet_length({alias}.{key}::text), 0))",
        key = n.key,
    );
    let fits = format!("{size} <= {max_row_bytes}");
    format!(
        "{alias}.{id}::int8 AS id, {topic} AS topic, {alias}.{key}::text AS key, \
         CASE WHEN {fits} THEN {payload} END AS payload, \
         CASE WHEN {fits} THEN {headers} ELSE '{{}}'::jsonb END AS headers, \
         {alias}.{attempts}::int4 AS attempts, {alias}.{created_at} AS created_at, \
         {size} AS stored_bytes",
        id = n.id,
        key = n.key,
        attempts = n.attempts,
        created_at = n.created_at,
    )
}

/// `INSERT` of one message; binds in order: the topic (only with a topic column), key,
/// payload (bytes, or a string for text and JSON), headers (only with a headers column).
pub(super) fn insert(n: &Names, t: &str) -> String {
    let values: Vec<String> = n
        .inserted()
        .iter()
        .enumerate()
        .map(|(i, column)| {
            let cast = if *column == n.payload && n.payload_format == PayloadFormat::Json {
                "::jsonb"
            } else {
                ""
            };
            format!("${}{cast}", i + 1)
        })
        .collect();
    format!(
        "INSERT INTO {t} ({}) VALUES ({}) RETURNING {}::int8",
        n.inserted().join(", "),
        values.join(", "),
        n.id
    )
}

/// `text` as a SQL string literal (standard_conforming_strings, on since PostgreSQL 9.1).
pub(super) fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

impl Statements {
    pub fn render(shape: &Shape<'_>) -> Self {
        let t = qualified(shape, &shape.table.quoted());
        let display_table = match shape.schema {
            Some(schema) => format!("{schema}.{}", shape.table),
            None => shape.table.to_string(),
        };
        let n = Names::new(shape.columns, &DIALECT);
        let Names {
            id,
            key,
            status,
            attempts,
            available_at,
            leased_by,
            last_error,
            processed_at,
            created_at,
            ..
        } = &n;
        // The answers find their rows by id, fenced by owner and status. They run unnamed
        // (`persistent(false)`), so PostgreSQL plans each for the table as it is: their
        // `status = 'pending'` lets a scan of a whole partial index serve them too, and a
        // cached generic plan made while the table held a few rows chose that scan, and
        // kept it with 20,000 pending rows (each ack read them all, issue 16). The price,
        // per statement (which answers many rows at once): tens of microseconds of planning,
        // and a round trip of its own in which sqlx prepares it (`Parse`, `Describe`,
        // `Sync`), which PostgreSQL counts as a transaction (BENCHMARKS.md, issue 16).
        let held = format!("WHERE {id} = ANY($1) AND {leased_by} = $2 AND {status} = 'pending'");
        // Answers that keep a row from being claimed need a lease that has not run out:
        // past it, another claim may be taking the row (docs/guarantees.md).
        let live = format!("{available_at} > statement_timestamp()");
        let objects = StrictObjects::new(shape);
        let functions = if shape.strict_ordering {
            vec![
                format!(
                    "{}(text,interval,integer,text[],interval,integer,text[],boolean,text[],bigint[])",
                    objects.claim_function
                ),
                format!("{}(text[])", objects.advance_function),
            ]
        } else {
            Vec::new()
        };
        let (schema, schema_check) = schema(&t, shape, &n, &objects);
        let pauses = pauses_table(shape);
        Self {
            claims: Default::default(),
            max_row_bytes: shape.max_row_bytes,
            delayed: !shape.visibility_delay.is_zero(),
            fetch: format!(
                "SELECT {message} FROM {t} o WHERE o.{id} = ANY($1) ORDER BY o.{id}",
                message = message(&n, "o", shape.max_row_bytes)
            ),
            held_attempts: format!(
                "SELECT {id}::int8, {attempts}::int4 FROM {t} {held} ORDER BY {id}"
            ),
            ack: format!(
                "UPDATE {t} SET {status} = 'done', {processed_at} = statement_timestamp(), \
                 {leased_by} = NULL {held} RETURNING {id}::int8 AS id, {key}::text AS key"
            ),
            ack_delete: format!(
                "DELETE FROM {t} {held} RETURNING {id}::int8 AS id, {key}::text AS key"
            ),
            nack_held: format!(
                "SELECT {id}::int8 AS id, {attempts}::int4 AS attempts, {key}::text AS key \
                 FROM {t} {held} AND {live}"
            ),
            nack_apply: nack_apply(&t, &n),
            release: format!(
                "UPDATE {t} SET {attempts} = GREATEST({attempts} - 1, 0), \
                 {available_at} = statement_timestamp() + $3::interval, {leased_by} = NULL \
                 {held} AND ({live} OR $3::interval = interval '0') RETURNING {id}::int8"
            ),
            dead_letter: format!(
                "UPDATE {t} SET {status} = 'dead', {processed_at} = statement_timestamp(), \
                 {last_error} = $3, {leased_by} = NULL \
                 WHERE {id} = $1 AND {leased_by} = $2 AND {status} = 'pending' \
                 RETURNING {id}::int8 AS id, {key}::text AS key"
            ),
            // One row even when nothing was extended, so the deadline is always known.
            extend_lease: format!(
                "WITH extended AS (\
                   UPDATE {t} SET {available_at} = statement_timestamp() + $3::interval \
                   {held} AND {live} RETURNING {id}::int8 AS id) \
                 SELECT e.id, statement_timestamp() + $3::interval AS lease_expires_at \
                 FROM (SELECT 1) AS clock LEFT JOIN extended e ON true ORDER BY e.id"
            ),
            return_leases: format!(
                "UPDATE {t} SET {leased_by} = NULL, {available_at} = statement_timestamp() \
                 {held}"
            ),
            // `status = 'pending' OR status = 'dead'` (not IN) lets the planner OR the two
            // partial indexes instead of scanning the delivered rows.
            stats: format!(
                "SELECT {topic} AS topic, \
                   count(*) FILTER (WHERE {status} = 'pending') AS pending, \
                   count(*) FILTER (WHERE {status} = 'pending' AND {leased_by} IS NOT NULL \
                     AND {available_at} > statement_timestamp()) AS leased, \
                   count(*) FILTER (WHERE {status} = 'pending' AND {leased_by} IS NULL \
                     AND {available_at} > statement_timestamp()) AS waiting, \
                   count(*) FILTER (WHERE {status} = 'dead') AS dead, \
                   EXTRACT(EPOCH FROM statement_timestamp() \
                     - min({created_at}) FILTER (WHERE {status} = 'pending'))::float8 \
                     AS oldest_pending_secs \
                 FROM {t} o WHERE {status} = 'pending' OR {status} = 'dead' \
                 GROUP BY 1 ORDER BY 1",
                topic = n.topic("o."),
            ),
            delivered_within: format!(
                "SELECT count(*) FROM {t} WHERE {status} = 'done' \
                 AND {processed_at} > statement_timestamp() - $1::interval"
            ),
            purge_batch: format!(
                "DELETE FROM {t} WHERE {id} IN (\
                   SELECT {id} FROM {t} WHERE {status} = 'done' \
                   AND {processed_at} < statement_timestamp() - $1::interval LIMIT $2)"
            ),
            ping: format!("SELECT 1 FROM {t} LIMIT 0"),
            live_columns: LIVE_COLUMNS.to_owned(),
            functions_present: "SELECT count(*) FROM unnest($1::text[]) AS f(name) \
                                WHERE to_regprocedure(f.name) IS NOT NULL"
                .to_owned(),
            functions,
            insert: insert(&n, &t),
            // One simple query: the statements run in one implicit transaction, sent at
            // once, so no lock of the DDL waits on this server between them. An index
            // build may take long; a table lock that does not come within a second is
            // given up (the health check tries again), since producers' inserts queue
            // behind a DDL statement waiting for it.
            schema_run: format!(
                "SET LOCAL statement_timeout = 0;\n\
                 SET LOCAL lock_timeout = '1s';\n\
                 SELECT pg_advisory_xact_lock({LOCK_CLASS_DDL}, 0);\n{schema}"
            ),
            schema,
            schema_check,
            strict: shape.strict_ordering.then(|| StrictStatements {
                claim: format!(
                    "SELECT txo_id AS id, txo_spent AS spent, \
                     txo_lease_expires_at AS lease_expires_at \
                     FROM {}($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
                    objects.claim_function
                ),
                advance: format!("SELECT {}($1)", objects.advance_function),
                purge_drained: heads::purge_drained(&objects.heads),
            }),
            heads: shape.strict_ordering.then(|| objects.heads.clone()),
            blocked_keys: match shape.strict_ordering {
                true => heads::blocked_keys(&t, &objects.heads, &n, shape.dead_holds_key),
                false => format!(
                    "SELECT o.{key}::text AS key, o.{id}::int8 AS head_id, o.{leased_by} AS owner, \
                   o.{attempts}::int4 AS attempts, o.{last_error} AS last_error, \
                   o.{created_at} AS created_at, o.{available_at} AS until, \
                   (SELECT count(*) FROM {t} b WHERE b.{key} = o.{key} \
                     AND b.{status} = 'pending' AND b.{id} > o.{id}) AS waiting, false AS dead \
                 FROM {t} o WHERE o.{status} = 'pending' AND o.{key} IS NOT NULL \
                   AND o.{available_at} > statement_timestamp() AND o.{id} > $1 \
                   AND NOT EXISTS (SELECT 1 FROM {t} p WHERE p.{key} = o.{key} \
                     AND p.{status} = 'pending' AND p.{id} < o.{id}) \
                 ORDER BY o.{id} LIMIT $2"
                ),
            },
            lease_holders: format!(
                "SELECT {leased_by}::text, count(*)::int8, min({available_at}) FROM {t} \
                 WHERE {status} = 'pending' AND {leased_by} IS NOT NULL \
                   AND {available_at} > statement_timestamp() \
                 GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT {MAX_LEASE_HOLDERS}"
            ),
            pauses: format!("SELECT target, paused_at FROM {pauses} ORDER BY target"),
            pause: format!(
                "INSERT INTO {pauses} (target, paused_at) \
                 SELECT t, statement_timestamp() FROM unnest($1::text[]) AS t \
                 ON CONFLICT (target) DO NOTHING"
            ),
            resume: format!("DELETE FROM {pauses} WHERE target = ANY($1::text[])"),
            names: n,
            qualified_table: t,
            display_table,
        }
    }

    /// The non-strict claim (the strict claim is a function, see [`StrictStatements`]) of
    /// rows of `topics` (every one but the paused ones bound as `$6`, for `Except`), for a
    /// batch of `batch_size`: capped at the power of two at or above it (see [`claim`]),
    /// rendered on first use since a server's claims use two or three of the caps.
    pub fn claim(&self, topics: TopicClause, batch_size: u32) -> &str {
        let cap = batch_size
            .max(1)
            .checked_next_power_of_two()
            .unwrap_or(1 << 31);
        let clause = match topics {
            TopicClause::Any => 0,
            TopicClause::Only => 1,
            TopicClause::Except => 2,
        };
        self.claims[clause][cap.trailing_zeros() as usize].get_or_init(|| {
            let t = &self.qualified_table;
            claim(
                t,
                self.delayed,
                &self.names,
                topics,
                cap,
                self.max_row_bytes,
            )
        })
    }

    /// Dead rows in id order: `$1` after this id, `$2` at most; `conditions` from
    /// [`crate::storage::dead::conditions`] with placeholders from `$3`.
    pub fn dead_list(&self, conditions: &str) -> String {
        let n = &self.names;
        format!(
            "SELECT {message}, coalesce(o.{last_error}, '') AS last_error, \
             o.{processed_at} AS died_at FROM {t} o \
             WHERE o.{status} = 'dead' AND o.{id} > $1{conditions} ORDER BY o.{id} LIMIT $2",
            message = message(n, "o", self.max_row_bytes),
            last_error = n.last_error,
            processed_at = n.processed_at,
            status = n.status,
            id = n.id,
            t = self.qualified_table,
        )
    }

    /// Dead rows by topic and error, largest groups first, `$1` groups at most, each with
    /// the total of every group; `conditions` with placeholders from `$2`.
    pub fn dead_count(&self, conditions: &str) -> String {
        let n = &self.names;
        format!(
            "SELECT {topic} AS topic, coalesce(o.{last_error}, '') AS error, count(*) AS count, \
             (sum(count(*)) OVER ())::int8 AS total FROM {t} o \
             WHERE o.{status} = 'dead'{conditions} GROUP BY 1, 2 ORDER BY 3 DESC, 1, 2 LIMIT $1",
            topic = n.topic("o."),
            last_error = n.last_error,
            status = n.status,
            t = self.qualified_table,
        )
    }

    /// Makes the first `$1` selected dead rows pending again, attempts reset, claimable
    /// after `$2`; returns their ids. With strict ordering the heads of their keys move
    /// back to the lowest re-driven row (a head may have moved past it, or to NULL, when
    /// it died), so a strict claim finds it before the key's later rows. `conditions`
    /// with placeholders from `$3`.
    pub fn dead_redrive(&self, conditions: &str) -> String {
        let n = &self.names;
        let t = &self.qualified_table;
        let Names {
            id,
            key,
            status,
            attempts,
            available_at,
            leased_by,
            processed_at,
            ..
        } = n;
        let heads = match &self.heads {
            Some(heads) => format!(
                ", heads AS (\
                   INSERT INTO {heads} AS h (key, head_id) \
                   SELECT r.key, min(r.id) FROM redriven r WHERE r.key IS NOT NULL \
                   GROUP BY 1 ORDER BY 1 \
                   ON CONFLICT (key) DO UPDATE SET head_id = least(h.head_id, excluded.head_id))"
            ),
            None => String::new(),
        };
        format!(
            "WITH chosen AS MATERIALIZED (\
               SELECT o.{id} AS id FROM {t} o WHERE o.{status} = 'dead'{conditions} \
               ORDER BY o.{id} LIMIT $1 FOR UPDATE SKIP LOCKED), \
             redriven AS (\
               UPDATE {t} u SET {status} = 'pending', {attempts} = 0, \
                 {available_at} = statement_timestamp() + $2::interval, {leased_by} = NULL, \
                 {processed_at} = NULL \
               FROM chosen c WHERE u.{id} = c.id AND u.{status} = 'dead' \
               RETURNING u.{id}::int8 AS id, u.{key}::text AS key){heads} \
             SELECT id FROM redriven ORDER BY id"
        )
    }

    /// Deletes the first `$1` selected dead rows; returns their ids. `conditions` with
    /// placeholders from `$2`.
    pub fn dead_discard(&self, conditions: &str) -> String {
        let Names { id, status, .. } = &self.names;
        let t = &self.qualified_table;
        // The choice in a CTE of its own: a `LIMIT` subquery under `IN` may be run again
        // per row by the plan, and took more rows than the limit.
        format!(
            "WITH chosen AS MATERIALIZED (\
               SELECT o.{id} AS id FROM {t} o WHERE o.{status} = 'dead'{conditions} \
               ORDER BY o.{id} LIMIT $1 FOR UPDATE SKIP LOCKED) \
             DELETE FROM {t} u USING chosen c WHERE u.{id} = c.id AND u.{status} = 'dead' \
             RETURNING u.{id}::int8"
        )
    }
}

/// How the dead-letter selector is written here: numbered `$n`, an id array.
pub(super) const FILTER: FilterDialect = FilterDialect {
    placeholder: |number| format!("${number}"),
    in_ids: |column, next, _| format!("{column} = ANY({}::int8[])", next()),
    contains: |column, placeholder| format!("strpos({column}, {placeholder}::text) > 0"),
};

/// The non-strict claim: `$1` owner, `$2` lease, `$3` batch size, `$4` max attempts, `$5`
/// the floor (rows above it first, see `floor.rs`), then `$6` topics (taken or, paused,
/// left: see `topics`) and the visibility delay (when `delayed`) as the next parameter;
/// `cap` is at least the batch size. Rows `(id, spent, lease_expires_at)` and a message's
/// columns ([`message`]): each leased row with its message (`spent` false), each
/// row dead-lettered for having used its attempts (true), and always a last row whose id
/// is NULL, for the deadline from the database clock.
///
/// The messages come back from the claim itself, not from a read once it committed (as
/// the strict claim's do): the rows it locks meanwhile are ones every other claim skips
/// (`SKIP LOCKED`) and only this owner may answer, and it takes no table-wide lock, so
/// however slowly this server reads, nobody waits (issue 9). One statement per batch
/// fewer: a round trip, a snapshot and an index probe per row (BENCHMARKS.md, issue 16).
///
/// The rows are chosen in two parts, `above` the floor and `below` it (at or under), which
/// between them hold every id: `below` is asked only for what `above` left of the batch,
/// and with nothing left its scan never runs (a `LIMIT 0`), so a claim that finds a full
/// batch above the floor never walks the leased rows and dead index entries under it. The
/// batch size bounds `chosen` again so the planner expects at most a batch there (and
/// probes the leased rows by primary key, not by a scan of the table).
///
/// Each part takes its rows from a subquery limited by the literal `cap`, then `$3` of
/// them (rows are locked as they are taken, so no more than `$3` are). That is for the
/// plan cache: planning this statement costs about 0.25 ms, 2-3 µs per message, and with
/// only `LIMIT $3` PostgreSQL plans it anew for every call, since a generic plan has to
/// assume the limit takes a tenth of the pending rows and always looks dearer than a
/// plan for the actual batch. Bounded by a literal near the batch, the generic plan (the
/// same index scans and primary-key probes) costs about what the custom ones did, and
/// is used from the sixth call on a connection.
fn claim(
    t: &str,
    delayed: bool,
    n: &Names,
    topics: TopicClause,
    cap: u32,
    max_row_bytes: u64,
) -> String {
    let mut params = Placeholders::starting_at('$', 6);
    let topics_param = (topics != TopicClause::Any).then(|| params.take());
    let delay_param = delayed.then(|| params.take());
    let Names {
        id,
        status,
        attempts,
        available_at,
        leased_by,
        created_at,
        last_error,
        processed_at,
        ..
    } = n;
    let mut filters = String::new();
    if let Some(p) = &delay_param {
        filters += &format!(" AND o.{created_at} <= statement_timestamp() - {p}::interval");
    }
    if let Some(p) = &topics_param {
        filters += &match topics {
            TopicClause::Except => format!(" AND ({} = ANY({p})) IS NOT TRUE", n.topic("o.")),
            _ => format!(" AND {} = ANY({p})", n.topic("o.")),
        };
    }
    let exhausted = heads::exhausted_error(n, "u", "$4");
    format!(
        "WITH above AS (\
           SELECT * FROM (\
             SELECT o.{id} AS id, o.{attempts} >= $4 AS spent FROM {t} o \
             WHERE o.{status} = 'pending' AND o.{available_at} <= statement_timestamp() \
               AND o.{id} > $5{filters} \
             ORDER BY o.{id} LIMIT {cap}) a \
           LIMIT $3 FOR UPDATE SKIP LOCKED), \
         below AS (\
           SELECT * FROM (\
             SELECT o.{id} AS id, o.{attempts} >= $4 AS spent FROM {t} o \
             WHERE o.{status} = 'pending' AND o.{available_at} <= statement_timestamp() \
               AND o.{id} <= $5{filters} \
             ORDER BY o.{id} LIMIT {cap}) b \
           LIMIT $3 - (SELECT count(*) FROM above) FOR UPDATE SKIP LOCKED), \
         chosen AS (SELECT * FROM above UNION ALL SELECT * FROM below LIMIT $3), \
         leased AS (\
           UPDATE {t} u SET {leased_by} = $1, {attempts} = u.{attempts} + 1, \
             {available_at} = statement_timestamp() + $2::interval \
           FROM chosen c WHERE u.{id} = c.id AND NOT c.spent RETURNING {message}), \
         spent AS (\
           UPDATE {t} u SET {status} = 'dead', {processed_at} = statement_timestamp(), \
             {leased_by} = NULL, {last_error} = {exhausted} \
           FROM chosen c WHERE u.{id} = c.id AND c.spent RETURNING u.{id}::int8 AS id) \
         SELECT l.id, false AS spent, statement_timestamp() + $2::interval AS lease_expires_at, \
           l.topic, l.key, l.payload, l.headers, l.attempts, l.created_at, l.stored_bytes \
         FROM leased l \
         UNION ALL SELECT s.id, true, statement_timestamp() + $2::interval, {none} FROM spent s \
         UNION ALL SELECT NULL::int8, NULL::bool, statement_timestamp() + $2::interval, {none}",
        message = message(n, "u", max_row_bytes),
        none = "NULL::text, NULL::text, NULL::bytea, NULL::jsonb, NULL::int4, NULL::timestamptz, \
                NULL::int8",
    )
}

/// A batch of nacks whose outcomes were decided from the attempts `nack_held` read:
/// `$1` ids, `$2` their attempts as read, `$3` retry delays (NULL: dead-letter), `$4`
/// errors, `$5` owner. Each applies only while the row is still held as read, with a live
/// lease. The later rows of a nacked row's key that the owner holds are given back
/// untried, claimable when the nacked row is (now, if it was dead-lettered); a row behind
/// several nacked rows of its key goes with the first of them in the batch, as if they had
/// come one by one. The caller leaves out a nack whose row an earlier nack of the batch
/// gives back. Rows `(id, key, cause, dead, at)`: a nacked row has `cause = id`, a row
/// given back the id of the nack that gave it back.
fn nack_apply(t: &str, n: &Names) -> String {
    let Names {
        id,
        key,
        status,
        attempts,
        available_at,
        leased_by,
        last_error,
        processed_at,
        ..
    } = n;
    format!(
        "WITH input AS (\
           SELECT * FROM unnest($1::int8[], $2::int4[], $3::interval[], $4::text[]) \
             WITH ORDINALITY AS i(id, attempts, delay, error, ord)), \
         nacked AS (\
           UPDATE {t} o SET \
             {status} = CASE WHEN i.delay IS NULL THEN 'dead' ELSE 'pending' END, \
             {available_at} = CASE WHEN i.delay IS NULL THEN o.{available_at} \
               ELSE statement_timestamp() + i.delay END, \
             {processed_at} = CASE WHEN i.delay IS NULL THEN statement_timestamp() \
               ELSE o.{processed_at} END, \
             {last_error} = i.error, {leased_by} = NULL \
           FROM input i \
           WHERE o.{id} = i.id AND o.{leased_by} = $5 AND o.{status} = 'pending' \
             AND o.{attempts} = i.attempts AND o.{available_at} > statement_timestamp() \
           RETURNING o.{id}::int8 AS id, o.{key} AS key, i.delay IS NULL AS dead, i.ord, \
             CASE WHEN i.delay IS NULL THEN statement_timestamp() \
               ELSE statement_timestamp() + i.delay END AS at), \
         successors AS (\
           SELECT DISTINCT ON (s.{id}) s.{id} AS id, c.id AS cause, c.key, c.at \
           FROM {t} s JOIN nacked c ON c.key IS NOT NULL AND s.{key} = c.key AND s.{id} > c.id \
           WHERE s.{leased_by} = $5 AND s.{status} = 'pending' AND s.{id} <> ALL($1::int8[]) \
           ORDER BY s.{id}, c.ord), \
         released AS (\
           UPDATE {t} s SET {attempts} = GREATEST(s.{attempts} - 1, 0), \
             {available_at} = x.at, {leased_by} = NULL \
           FROM successors x WHERE s.{id} = x.id \
           RETURNING s.{id}::int8 AS id, x.key, x.cause, x.at) \
         SELECT c.id, c.key::text AS key, c.id AS cause, c.dead, c.at FROM nacked c \
         UNION ALL SELECT r.id, r.key::text, r.cause, false, r.at FROM released r"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape<'a>(table: &'a Ident, columns: &'a Columns, channel: Option<&'a Ident>) -> Shape<'a> {
        Shape {
            schema: None,
            table,
            columns,
            strict_ordering: true,
            dead_holds_key: false,
            visibility_delay: Duration::ZERO,
            notify_channel: channel,
            max_row_bytes: 1 << 22,
        }
    }

    #[test]
    fn claim_parameters_are_numbered_in_order() {
        let columns = Columns::default();
        let n = Names::new(&columns, &DIALECT);
        let sql = claim("\"outbox\"", true, &n, TopicClause::Only, 128, 1 << 22);
        assert!(sql.contains("o.\"id\" > $5") && sql.contains("o.\"id\" <= $5"));
        assert!(sql.contains("o.\"topic\" = ANY($6)"), "{sql}");
        assert!(sql.contains("- $7::interval"));
        let sql = claim("\"outbox\"", true, &n, TopicClause::Except, 128, 1 << 22);
        assert!(sql.contains("(o.\"topic\" = ANY($6)) IS NOT TRUE"), "{sql}");
        let sql = claim("\"outbox\"", true, &n, TopicClause::Any, 128, 1 << 22);
        assert!(sql.contains("- $6::interval") && !sql.contains("$7"));
    }

    #[test]
    fn a_claim_is_capped_at_the_power_of_two_at_or_above_its_batch() {
        let table = Ident::new("outbox").unwrap();
        let columns = Columns::default();
        let mut s = shape(&table, &columns, None);
        s.strict_ordering = false;
        let statements = Statements::render(&s);
        let cap = |batch_size| {
            let sql = statements.claim(TopicClause::Any, batch_size);
            let caps: Vec<&str> = sql
                .split("LIMIT ")
                .skip(1)
                .filter_map(|rest| rest.split(')').next())
                .filter(|cap| cap.chars().all(|c| c.is_ascii_digit()))
                .collect();
            assert_eq!(caps.len(), 2, "{sql}");
            assert_eq!(caps[0], caps[1]);
            caps[0].parse::<u64>().unwrap()
        };
        assert_eq!(cap(0), 1);
        assert_eq!(cap(1), 1);
        assert_eq!(cap(64), 64);
        assert_eq!(cap(65), 128);
        assert_eq!(cap(100), 128);
        assert_eq!(cap(10_000), 16_384);
        assert_eq!(cap(u32::MAX), 1 << 31);
        assert!(statements.claim(TopicClause::Only, 100).contains("ANY($6)"));
    }
}
