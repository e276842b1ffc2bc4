//! The SQL of the SQLite backend, rendered once per table.
//!
//! Times are integers: Unix epoch milliseconds (UTC). Integers compare and add exactly,
//! and a producer's plain `INSERT` gets them from the column defaults, which read the
//! same machine clock the server reads (SQLite has no server: the database clock *is*
//! the machine's clock). "Now" is taken once per operation in Rust
//! ([`super::convert::now_ms`]) and bound as a parameter, after the write lock is held,
//! so a claim that waited for the lock does not hand out a lease shortened by that wait.
//!
//! Column meanings are PostgreSQL's: `available_at` is when the row may next be claimed
//! (a claim sets it to the lease deadline, a nack to the retry time, a release to now plus
//! the delay); a pending row is *leased* while `leased_by` is set and `available_at` is in
//! the future.
//!
//! Id lists and topic filters are bound as one JSON array and read with `json_each`, so
//! every statement has a fixed text (and a cached prepared statement) for any list length.

use std::time::Duration;

use super::table::{pauses_table, Schema};
use crate::storage::blocked;
use crate::storage::columns::Columns;
use crate::storage::dead::FilterDialect;
use crate::storage::ident::Ident;
use crate::storage::names::{Dialect, Names, Placeholders};
use crate::storage::{TopicClause, MAX_LEASE_HOLDERS};

/// The machine clock in epoch milliseconds, as SQL, for column defaults. Truncated like
/// [`super::convert::now_ms`], so a row inserted "now" is never ahead of the server's now.
/// `julianday` rather than `unixepoch('subsec')`, which needs SQLite 3.42: producers
/// (and the `sqlite3` shell) may link an older library.
pub(super) const NOW_MS: &str = "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)";

/// Statements for one outbox table.
#[derive(Debug)]
pub(super) struct Statements {
    /// The table name unquoted, for messages.
    pub display_table: String,
    pub claim_all: String,
    pub claim_topics: String,
    /// Every topic but the paused ones (a JSON array in `?2`).
    pub claim_except: String,
    /// Dead-letter the rows a claim would take that used their attempts (`exhaust_*`),
    /// before the claim, which then passes them over.
    pub exhaust_all: String,
    pub exhaust_topics: String,
    pub exhaust_except: String,
    pub probe_all: String,
    pub probe_topics: String,
    pub probe_except: String,
    /// `(id, attempts)` of the held rows (see `held`), in id order.
    pub held_attempts: String,
    pub ack: String,
    pub ack_delete: String,
    pub nack_select: String,
    pub nack_retry: String,
    pub nack_dead: String,
    pub release_successors: String,
    pub release: String,
    pub dead_letter: String,
    pub extend_lease: String,
    pub return_leases: String,
    pub stats: String,
    /// `?1` cutoff: rows delivered after it.
    pub delivered_within: String,
    pub purge_batch: String,
    pub ping: String,
    /// A write that changes nothing: fails with SQLITE_READONLY on a read-only file.
    pub write_probe: String,
    /// `?1` the table name: the live table's columns, for [`super::table::check`].
    pub live_columns: String,
    /// Parameters in column order: topic (unless the topic is fixed), key, payload,
    /// headers (if the table has them).
    pub insert: String,
    pub schema: Schema,
    /// The table, quoted, and its columns as they appear in SQL, for the statements
    /// rendered per call (the dead-letter operations, whose selector varies).
    pub table: String,
    pub names: Names,
    /// See [`Shape::max_row_bytes`].
    pub max_row_bytes: u64,
    /// Keys whose head is not due (see `blocked.rs`): `?1` after this head id, `?2` at
    /// most, `?3` now.
    pub blocked_keys: String,
    /// `(owner, rows, earliest_expiry)` of the leases live at `?1`, the most rows first.
    pub lease_holders: String,
    /// The outbox's pauses `(target, paused_at)`; pause the target `?1` at `?2`
    /// (idempotent); resume it (see [`crate::storage::pauses`]).
    pub pauses: String,
    pub pause: String,
    pub resume: String,
}

/// What shapes the statements besides the table name.
pub(super) struct Shape<'a> {
    pub table: &'a Ident,
    pub columns: &'a Columns,
    pub strict_ordering: bool,
    /// `dead_letter_holds_key`, under strict ordering: a dead row holds back its key's
    /// later rows (see [`candidates`]).
    pub dead_holds_key: bool,
    pub visibility_delay: Duration,
    /// See [`crate::storage::TableOptions::max_row_bytes`].
    pub max_row_bytes: u64,
}

/// How SQLite writes names: the relay's own bare, as its tables always had them (none is
/// a word SQLite reserves), a configured one quoted; and the fixed topic as a literal.
pub(super) const DIALECT: Dialect = Dialect {
    column,
    literal: string_literal,
};

/// `name` as SQL: bare when it is the relay's own name `own`, quoted otherwise.
fn column(name: &Ident, own: &str) -> String {
    if name.as_str() == own {
        own.to_owned()
    } else {
        name.quoted()
    }
}

/// A string as an SQLite literal. SQLite has no backslash escapes: doubling the quote is
/// all there is to it.
fn string_literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// `expr AS name`, or just `name` when the expression is that column already.
fn aliased(expr: &str, name: &str) -> String {
    if expr == name {
        name.to_owned()
    } else {
        format!("{expr} AS {name}")
    }
}

/// Fence of every write-back: `?1` ids (a JSON array), `?2` owner.
fn held(c: &Names) -> String {
    format!(
        "WHERE {} IN (SELECT value FROM json_each(?1)) AND {} = ?2 AND {} = 'pending'",
        c.id, c.leased_by, c.status
    )
}

/// The message columns under the relay's own names (what [`super::convert`] decodes),
/// payload as bytes whatever a producer stored (`'hello'` from the `sqlite3` shell is TEXT
/// in a BLOB column; a TEXT or JSON payload column gives its UTF-8 text), and the row's
/// stored size in bytes (payload, headers, topic and key). A row over `max_row_bytes`
/// comes without its payload (NULL) and headers: no response could hold them.
fn message(c: &Names, max_row_bytes: u64) -> String {
    let headers = c.headers.as_deref().unwrap_or("'{}'");
    let bytes = |value: &str| format!("coalesce(length(CAST({value} AS BLOB)), 0)");
    let size = format!(
        "({} + {} + {} + {})",
        bytes(&c.payload),
        bytes(headers),
        bytes(&c.topic("")),
        bytes(&c.key)
    );
    let fits = format!("{size} <= {max_row_bytes}");
    [
        aliased(&c.id, "id"),
        aliased(&c.topic(""), "topic"),
        aliased(&c.key, "key"),
        format!(
            "CASE WHEN {fits} THEN CAST({} AS BLOB) END AS payload",
            c.payload
        ),
        format!("CASE WHEN {fits} THEN {headers} END AS headers"),
        aliased(&c.attempts, "attempts"),
        aliased(&c.created_at, "created_at"),
        format!("{size} AS stored_bytes"),
    ]
    .join(", ")
}

impl Statements {
    pub fn render(shape: &Shape<'_>) -> Self {
        let t = shape.table.quoted();
        let c = Names::new(shape.columns, &DIALECT);
        let held = held(&c);
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
        } = &c;
        let topic_value = &c.topic("");
        let inserted = c.inserted();
        let pauses = pauses_table(shape.table);
        let params: Vec<String> = (1..=inserted.len()).map(|n| format!("?{n}")).collect();
        // A fixed topic is never filtered in SQL (see `candidates`): its "topics"
        // statements are the unfiltered ones, and unused.
        // A fixed topic is filtered in Rust (see `candidates`).
        let (only, except) = match c.topic {
            Some(_) => (TopicClause::Only, TopicClause::Except),
            None => (TopicClause::Any, TopicClause::Any),
        };
        Self {
            claim_all: claim(&t, &c, shape, TopicClause::Any),
            claim_topics: claim(&t, &c, shape, only),
            claim_except: claim(&t, &c, shape, except),
            exhaust_all: exhaust(&t, &c, shape, TopicClause::Any),
            exhaust_topics: exhaust(&t, &c, shape, only),
            exhaust_except: exhaust(&t, &c, shape, except),
            probe_all: probe(&t, &c, shape, TopicClause::Any),
            probe_topics: probe(&t, &c, shape, only),
            probe_except: probe(&t, &c, shape, except),
            // `?3` now.
            held_attempts: format!("SELECT {id}, {attempts} FROM {t} {held} ORDER BY {id}"),
            ack: format!(
                "UPDATE {t} SET {status} = 'done', {processed_at} = ?3, {leased_by} = NULL \
                 {held} RETURNING {id}"
            ),
            ack_delete: format!("DELETE FROM {t} {held} RETURNING {id}"),
            // `?3` now: a nack needs a live lease (docs/guarantees.md).
            nack_select: format!(
                "SELECT {attempts}, {key} FROM {t} \
                 WHERE {id} = ?1 AND {leased_by} = ?2 AND {status} = 'pending' \
                 AND {available_at} > ?3"
            ),
            // The row is known to be held by the owner (nack_select, same transaction).
            // `?2` retry time.
            nack_retry: format!(
                "UPDATE {t} SET {available_at} = ?2, {last_error} = ?3, {leased_by} = NULL \
                 WHERE {id} = ?1"
            ),
            // `?2` now.
            nack_dead: format!(
                "UPDATE {t} SET {status} = 'dead', {processed_at} = ?2, {last_error} = ?3, \
                 {leased_by} = NULL WHERE {id} = ?1"
            ),
            // `?1` key, `?2` the nacked id, `?3` owner, `?4` when they are due.
            release_successors: format!(
                "UPDATE {t} SET {attempts} = MAX({attempts} - 1, 0), {available_at} = ?4, \
                 {leased_by} = NULL \
                 WHERE {key} = ?1 AND {id} > ?2 AND {leased_by} = ?3 AND {status} = 'pending' \
                 RETURNING {id}"
            ),
            // `?3` when they are due, `?4` now: a delayed release needs a live lease.
            release: format!(
                "UPDATE {t} SET {attempts} = MAX({attempts} - 1, 0), {available_at} = ?3, \
                 {leased_by} = NULL {held} AND ({available_at} > ?4 OR ?3 <= ?4) RETURNING {id}"
            ),
            // `?4` now.
            dead_letter: format!(
                "UPDATE {t} SET {status} = 'dead', {processed_at} = ?4, {last_error} = ?3, \
                 {leased_by} = NULL \
                 WHERE {id} = ?1 AND {leased_by} = ?2 AND {status} = 'pending' RETURNING {id}"
            ),
            // `?3` the new deadline, `?4` now: an extension needs a live lease.
            extend_lease: format!(
                "UPDATE {t} SET {available_at} = ?3 {held} AND {available_at} > ?4 RETURNING {id}"
            ),
            // `?3` now.
            return_leases: format!("UPDATE {t} SET {leased_by} = NULL, {available_at} = ?3 {held}"),
            // `?1` now. `status = 'pending' OR status = 'dead'` (not IN) lets the planner
            // use the two partial indexes instead of scanning the delivered rows. A fixed
            // topic groups by a constant: one group, or none for no rows.
            stats: format!(
                "SELECT {topic}, \
                   sum({status} = 'pending') AS pending, \
                   sum({status} = 'pending' AND {leased_by} IS NOT NULL \
                     AND {available_at} > ?1) AS leased, \
                   sum({status} = 'pending' AND {leased_by} IS NULL \
                     AND {available_at} > ?1) AS waiting, \
                   sum({status} = 'dead') AS dead, \
                   min(CASE WHEN {status} = 'pending' THEN {created_at} END) \
                     AS oldest_pending_created_at \
                 FROM {t} WHERE {status} = 'pending' OR {status} = 'dead' \
                 GROUP BY {topic_value} ORDER BY {topic_value}",
                topic = aliased(topic_value, "topic"),
            ),
            // `?1` cutoff, `?2` batch size.
            delivered_within: format!(
                "SELECT count(*) FROM {t} WHERE {status} = 'done' AND {processed_at} > ?1"
            ),
            purge_batch: format!(
                "DELETE FROM {t} WHERE {id} IN (\
                   SELECT {id} FROM {t} WHERE {status} = 'done' AND {processed_at} < ?1 \
                   LIMIT ?2)"
            ),
            ping: format!("SELECT 1 FROM {t} LIMIT 0"),
            write_probe: format!("UPDATE {t} SET {id} = {id} WHERE 0"),
            live_columns: "SELECT name, type, \"notnull\", dflt_value IS NOT NULL \
                           FROM pragma_table_info(?1)"
                .to_owned(),
            insert: format!(
                "INSERT INTO {t} ({}) VALUES ({}) RETURNING {id}",
                inserted.join(", "),
                params.join(", ")
            ),
            schema: dead_holds_schema(
                Schema::render(&t, shape.table, shape.columns, &c),
                shape,
                &t,
                &c,
            ),
            display_table: shape.table.to_string(),
            blocked_keys: format!(
                "SELECT o.{key} AS key, o.{id} AS head_id, o.{leased_by} AS owner, \
               o.{attempts} AS attempts, o.{last_error} AS last_error, \
               o.{created_at} AS created_at, o.{available_at} AS until, \
               (SELECT count(*) FROM {t} b WHERE b.{key} = o.{key} \
                 AND b.{status} = 'pending' AND b.{id} > o.{id}) AS waiting, 0 AS dead \
             FROM {t} o WHERE o.{status} = 'pending' AND o.{key} IS NOT NULL \
               AND o.{available_at} > ?3 AND o.{id} > ?1 \
               AND NOT EXISTS (SELECT 1 FROM {t} p WHERE p.{key} = o.{key} \
                 AND p.{status} = 'pending' AND p.{id} < o.{id}){} \
             ORDER BY head_id LIMIT ?2",
                blocked_keys_dead(shape, &t, &c),
            ),
            lease_holders: format!(
                "SELECT {leased_by}, count(*), min({available_at}) FROM {t} \
                 WHERE {status} = 'pending' AND {leased_by} IS NOT NULL AND {available_at} > ?1 \
                 GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT {MAX_LEASE_HOLDERS}"
            ),
            pauses: format!("SELECT target, paused_at FROM {pauses} ORDER BY target"),
            pause: format!("INSERT OR IGNORE INTO {pauses} (target, paused_at) VALUES (?1, ?2)"),
            resume: format!("DELETE FROM {pauses} WHERE target = ?1"),
            table: t.clone(),
            names: c.clone(),
            max_row_bytes: shape.max_row_bytes,
        }
    }

    /// Dead rows in id order: `?1` after this id, `?2` at most; the selector's
    /// `conditions` with placeholders from `?3`.
    pub fn dead_list(&self, conditions: &str) -> String {
        let c = &self.names;
        format!(
            "SELECT {message}, coalesce(o.{last_error}, '') AS last_error, \
               o.{processed_at} AS died_at FROM {t} o \
             WHERE o.{status} = 'dead' AND o.{id} > ?1{conditions} ORDER BY o.{id} LIMIT ?2",
            message = message(c, self.max_row_bytes),
            last_error = c.last_error,
            processed_at = c.processed_at,
            status = c.status,
            id = c.id,
            t = self.table,
        )
    }

    /// Dead rows by topic and error, largest groups first, `?1` groups at most, each with
    /// the total of every group; `conditions` with placeholders from `?2`.
    pub fn dead_count(&self, conditions: &str) -> String {
        let c = &self.names;
        format!(
            "SELECT {topic} AS topic, coalesce(o.{last_error}, '') AS error, count(*) AS count, \
               sum(count(*)) OVER () AS total FROM {t} o \
             WHERE o.{status} = 'dead'{conditions} GROUP BY 1, 2 ORDER BY 3 DESC, 1, 2 LIMIT ?1",
            topic = c.topic("o."),
            last_error = c.last_error,
            status = c.status,
            t = self.table,
        )
    }

    /// Makes the first `?1` selected dead rows pending again, attempts reset, claimable
    /// at `?2`; returns their ids. `conditions` with placeholders from `?3`.
    pub fn dead_redrive(&self, conditions: &str) -> String {
        let Names {
            id,
            status,
            attempts,
            available_at,
            leased_by,
            processed_at,
            ..
        } = &self.names;
        format!(
            "UPDATE {t} SET {status} = 'pending', {attempts} = 0, {available_at} = ?2, \
             {leased_by} = NULL, {processed_at} = NULL WHERE {id} IN (\
               SELECT o.{id} FROM {t} o WHERE o.{status} = 'dead'{conditions} \
               ORDER BY o.{id} LIMIT ?1) RETURNING {id}",
            t = self.table,
        )
    }

    /// Deletes the first `?1` selected dead rows; returns their ids. `conditions` with
    /// placeholders from `?2`.
    pub fn dead_discard(&self, conditions: &str) -> String {
        let Names { id, status, .. } = &self.names;
        format!(
            "DELETE FROM {t} WHERE {id} IN (\
               SELECT o.{id} FROM {t} o WHERE o.{status} = 'dead'{conditions} \
               ORDER BY o.{id} LIMIT ?1) RETURNING {id}",
            t = self.table,
        )
    }
}

/// How the dead-letter selector is written here: numbered `?n`, ids as a JSON array.
pub(super) const FILTER: FilterDialect = FilterDialect {
    placeholder: |number| format!("?{number}"),
    in_ids: |column, next, _| format!("{column} IN (SELECT value FROM json_each({}))", next()),
    contains: |column, placeholder| format!("instr({column}, {placeholder}) > 0"),
};

/// `?1` now, then `?2` topics (a JSON array, taken or, paused, left: see `topics`) and
/// the visibility cutoff (now minus the delay, when one is configured) as the next
/// parameter: the rows a claim may
/// take, in id order. Shared by the claim and its probe, which bind the same prefix.
/// A fixed topic has no topic filter: the backend decides in Rust whether a filter
/// includes it (claim everything) or not (claim nothing).
fn candidates(t: &str, c: &Names, shape: &Shape<'_>, topics: TopicClause) -> (String, usize) {
    let mut params = Placeholders::starting_at('?', 2);
    let topics_param = (topics != TopicClause::Any).then(|| params.take());
    let except = topics == TopicClause::Except;
    let cutoff_param = (!shape.visibility_delay.is_zero()).then(|| params.take());
    let Names {
        id,
        key,
        status,
        available_at,
        created_at,
        ..
    } = c;
    let topic = c.topic("");

    let mut filters = String::new();
    if let Some(p) = &cutoff_param {
        filters += &format!(" AND o.{created_at} <= {p}");
    }
    if let Some(p) = &topics_param {
        filters += &match except {
            true => format!(" AND (o.{topic} IN (SELECT value FROM json_each({p}))) IS NOT TRUE"),
            false => format!(" AND o.{topic} IN (SELECT value FROM json_each({p}))"),
        };
    }
    if shape.strict_ordering {
        // As in PostgreSQL: an earlier pending row of the key holds this one back unless
        // this very claim can take it (it then comes first in id order). Not claimable:
        // leased or waiting for a retry, not visible yet, or outside the topic filter.
        let mut blocked = format!("p.{available_at} > ?1");
        if let Some(p) = &cutoff_param {
            blocked += &format!(" OR p.{created_at} > {p}");
        }
        if let Some(p) = &topics_param {
            let not = if except { "" } else { "NOT " };
            blocked += &format!(" OR p.{topic} {not}IN (SELECT value FROM json_each({p}))");
        }
        filters += &format!(
            " AND (o.{key} IS NULL OR NOT EXISTS (SELECT 1 FROM {t} p \
             WHERE p.{key} = o.{key} AND p.{id} < o.{id} AND p.{status} = 'pending' \
             AND ({blocked})))"
        );
        if shape.dead_holds_key {
            // `dead_letter_holds_key`: an earlier dead row of the key holds it back too,
            // found through the `(key, id)` index of dead rows.
            filters += &format!(
                " AND (o.{key} IS NULL OR NOT {})",
                blocked::dead_before(t, c, &format!("o.{key}"), &format!("o.{id}"))
            );
        }
    }
    let select = format!(
        "SELECT o.{id} FROM {t} o \
         WHERE o.{status} = 'pending' AND o.{available_at} <= ?1{filters} ORDER BY o.{id}"
    );
    (select, params.next_number())
}

/// Whether a claim would find anything: a read, answered without the write lock, so an
/// idle relay polling the file never stands in a producer's way. Parameters as in
/// [`candidates`].
fn probe(t: &str, c: &Names, shape: &Shape<'_>, topics: TopicClause) -> String {
    let (select, _) = candidates(t, c, shape, topics);
    format!("SELECT EXISTS ({select} LIMIT 1)")
}

/// The parameters of [`candidates`], then owner, lease deadline, batch size and max
/// attempts.
///
/// One statement, run under `BEGIN IMMEDIATE` (see the module docs of the backend): SQLite
/// has one writer at a time per file, so the rows it picks cannot be picked by another
/// claim, and the strict-ordering predicate sees every earlier claim's result. Rows that
/// used their attempts are passed over: [`exhaust`] dead-letters them first.
fn claim(t: &str, c: &Names, shape: &Shape<'_>, topics: TopicClause) -> String {
    let (select, next) = candidates(t, c, shape, topics);
    let (owner, lease_until, limit, max_attempts) = (next, next + 1, next + 2, next + 3);
    let Names {
        id,
        attempts,
        available_at,
        leased_by,
        ..
    } = c;
    format!(
        "UPDATE {t} SET {leased_by} = ?{owner}, {attempts} = {attempts} + 1, \
           {available_at} = ?{lease_until} \
         WHERE {id} IN ({select} AND o.{attempts} < ?{max_attempts} LIMIT ?{limit}) \
         RETURNING {}",
        message(c, shape.max_row_bytes)
    )
}

/// The parameters of [`candidates`], then batch size and max attempts: dead-letters the
/// rows among the next batch a claim would take that were claimed `max_attempts` times
/// already (their holders never answered), returning their ids. The reason goes into
/// `last_error`, before the error the row had.
fn exhaust(t: &str, c: &Names, shape: &Shape<'_>, topics: TopicClause) -> String {
    let (select, next) = candidates(t, c, shape, topics);
    let (limit, max_attempts) = (next, next + 1);
    let Names {
        id,
        status,
        attempts,
        leased_by,
        last_error,
        processed_at,
        ..
    } = c;
    format!(
        "UPDATE {t} SET {status} = 'dead', {processed_at} = ?1, {leased_by} = NULL, \
           {last_error} = 'claimed ' || {attempts} || ' times without an answer (max_attempts = ' \
             || ?{max_attempts} || ')' || coalesce('; last error: ' || {last_error}, '') \
         WHERE {id} IN ({select} LIMIT ?{limit}) AND {attempts} >= ?{max_attempts}{holds} \
         RETURNING {id}",
        holds = match shape.dead_holds_key {
            // Only a key's first used-up row dies: the rows behind it wait behind it,
            // whatever their attempts (the claim that follows sees it dead).
            true => format!(
                " AND ({key} IS NULL OR NOT EXISTS (SELECT 1 FROM {t} p \
                 WHERE p.{key} = {t}.{key} AND p.{id} < {t}.{id} AND p.{status} = 'pending' \
                 AND p.{attempts} >= ?{max_attempts}))",
                key = c.key,
            ),
            false => String::new(),
        },
    )
}

/// The schema, with the `(key, id)` index of dead rows that `dead_letter_holds_key` looks
/// keys up in (only then: most outboxes never look).
fn dead_holds_schema(mut schema: Schema, shape: &Shape<'_>, t: &str, c: &Names) -> Schema {
    if shape.dead_holds_key {
        schema.indexes += &format!(
            "CREATE INDEX IF NOT EXISTS {} ON {t} ({}, {}) WHERE {} = 'dead';\n",
            crate::storage::ident::quote(&format!("{}_key_dead_idx", shape.table)),
            c.key,
            c.id,
            c.status
        );
    }
    schema
}

/// With `dead_letter_holds_key`: blocked keys also behind a dead row, in the columns of
/// the statement of leased and retrying heads (closed by `?1` after, `?2` at most); its
/// heads behind a dead row are left to the dead part. See `storage/blocked.rs`.
fn blocked_keys_dead(shape: &Shape<'_>, t: &str, c: &Names) -> String {
    if !shape.dead_holds_key {
        return String::new();
    }
    let Names {
        id,
        key,
        attempts,
        last_error,
        created_at,
        processed_at,
        ..
    } = c;
    let (from, waiting) = blocked::dead_heads(t, c, "?1", "count(*)");
    format!(
        " AND NOT {} UNION ALL \
         SELECT d.{key} AS key, d.{id} AS head_id, NULL AS owner, d.{attempts} AS attempts, \
           d.{last_error} AS last_error, d.{created_at} AS created_at, \
           d.{processed_at} AS until, {waiting} AS waiting, 1 AS dead {from}",
        blocked::dead_before(t, c, &format!("o.{key}"), &format!("o.{id}")),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::columns::{ColumnMapping, PayloadFormat};

    fn render(table: &str, columns: &Columns, visibility_delay: Duration) -> Statements {
        Statements::render(&Shape {
            table: &Ident::new(table).unwrap(),
            columns,
            strict_ordering: true,
            dead_holds_key: false,
            visibility_delay,
            max_row_bytes: 1 << 22,
        })
    }

    fn mapped() -> Columns {
        Columns::from_mapping(&ColumnMapping {
            id: "event_id".into(),
            topic: Some("event_type".into()),
            key: "aggregate_id".into(),
            payload: "body".into(),
            payload_format: PayloadFormat::Text,
            headers: "meta".into(),
            created_at: "occurred_at".into(),
            status: "relay_status".into(),
            ..ColumnMapping::default()
        })
        .unwrap()
    }

    #[test]
    fn claim_parameters_are_numbered_in_order() {
        let sql = render("outbox", &Columns::default(), Duration::from_secs(1));
        let claim = &sql.claim_topics;
        assert!(claim.contains("o.topic IN (SELECT value FROM json_each(?2))"));
        assert!(claim.contains("o.created_at <= ?3"));
        assert!(claim.contains("leased_by = ?4") && claim.contains("available_at = ?5"));
        assert!(claim.contains("LIMIT ?6") && claim.contains("o.attempts < ?7"));
        let claim = &sql.claim_all;
        assert!(claim.contains("o.created_at <= ?2") && claim.contains("LIMIT ?5"));
        assert!(claim.contains("o.attempts < ?6") && !claim.contains("?7"));
        let exhaust = &sql.exhaust_topics;
        assert!(exhaust.contains("LIMIT ?4") && exhaust.contains("attempts >= ?5"));
        assert!(sql.probe_all.contains("o.created_at <= ?2") && !sql.probe_all.contains("?3"));
        assert!(sql
            .claim_except
            .contains("(o.topic IN (SELECT value FROM json_each(?2))) IS NOT TRUE"));
    }

    #[test]
    fn the_relays_own_names_render_as_before() {
        let sql = render("outbox", &Columns::default(), Duration::ZERO);
        assert!(sql
            .claim_all
            .contains("RETURNING id, topic, key, CASE WHEN "));
        assert!(sql.claim_all.contains(
            "THEN CAST(payload AS BLOB) END AS payload, CASE WHEN (coalesce(length(CAST(payload \
             AS BLOB)), 0) + coalesce(length(CAST(headers AS BLOB)), 0)"
        ));
        assert!(sql
            .claim_all
            .contains("<= 4194304 THEN headers END AS headers, attempts, created_at, "));
        assert_eq!(
            sql.insert,
            "INSERT INTO \"outbox\" (topic, key, payload, headers) VALUES (?1, ?2, ?3, ?4) \
             RETURNING id"
        );
        assert!(sql.stats.ends_with("GROUP BY topic ORDER BY topic"));
    }

    #[test]
    fn mapped_names_are_quoted_and_read_under_the_relays_names() {
        let sql = render("events", &mapped(), Duration::from_secs(1));
        assert!(sql.claim_topics.contains(
            "RETURNING \"event_id\" AS id, \"event_type\" AS topic, \"aggregate_id\" AS key, \
             CASE WHEN"
        ));
        assert!(sql
            .claim_topics
            .contains("THEN CAST(\"body\" AS BLOB) END AS payload"));
        assert!(sql
            .claim_topics
            .contains("THEN \"meta\" END AS headers, attempts, \"occurred_at\" AS created_at"));
        assert!(sql
            .claim_topics
            .contains("o.\"event_type\" IN (SELECT value"));
        assert!(sql
            .claim_topics
            .contains("p.\"aggregate_id\" = o.\"aggregate_id\""));
        assert!(sql.ack.contains("SET \"relay_status\" = 'done'"));
        assert!(sql.stats.contains("\"event_type\" AS topic"));
        assert_eq!(
            sql.insert,
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
            .claim_all
            .contains("RETURNING id, 'it''s' AS topic, key, CASE WHEN"));
        assert!(sql.claim_all.contains("THEN '{}' END AS headers"));
        assert!(sql.stats.contains("GROUP BY 'it''s'"));
        assert_eq!(
            sql.insert,
            "INSERT INTO \"outbox\" (key, payload) VALUES (?1, ?2) RETURNING id"
        );
    }
}
