//! The SQL of the MySQL/MariaDB backend, rendered once per table.
//!
//! Times: every column holds UTC in a `DATETIME(6)` (no time-zone conversion, range to the
//! year 9999, unlike `TIMESTAMP`'s 2038). Defaults are `UTC_TIMESTAMP(6)`, so a producer
//! inserting with any session `time_zone` still writes UTC, and the relay compares with
//! `UTC_TIMESTAMP(6)` or with a clock reading it took from the database (`now`).
//!
//! Column meanings are PostgreSQL's: `available_at` is when the row may next be claimed (a
//! claim sets it to the lease deadline, a nack to the retry time, a release to now plus
//! the delay); a pending row is *leased* while `leased_by` is set and `available_at` is in
//! the future.
//!
//! Id lists are bound one placeholder per id (`IN (?, ?, ...)`), so those statements are
//! rendered per call by the functions at the bottom.

use std::time::Duration;

mod dead;

use super::table::{pauses_table, Schema};
use crate::storage::blocked;
use crate::storage::columns::Columns;
use crate::storage::ident::Ident;
use crate::storage::names::{self, Dialect, Names};
use crate::storage::rows;
use crate::storage::MAX_LEASE_HOLDERS;

pub(super) use self::dead::FILTER;

/// Statements for one outbox table.
#[derive(Debug)]
pub(super) struct Statements {
    /// `db.table` unquoted, for messages.
    pub display_table: String,
    /// `` `db`.`table` ``, for the statements rendered per call.
    pub table: String,
    /// The columns as they appear in SQL.
    pub names: Names,
    /// `` `table_pending_idx` ``, which the claim's scan is pinned to.
    pub pending_index: String,
    /// See [`Shape::dead_holds_key`]. The `(key, status, id)` index serves its lookups.
    pub dead_holds_key: bool,
    /// See [`Shape::max_row_bytes`].
    pub max_row_bytes: u64,
    pub now: String,
    pub nack_select: String,
    pub nack_retry: String,
    pub nack_dead: String,
    pub successors_select: String,
    pub dead_letter: String,
    pub stats: String,
    /// Rows delivered within `?` microseconds.
    pub delivered_within: String,
    pub purge_batch: String,
    pub ping: String,
    /// `?` database (`NULL`: the connection's), `?` table: the live table's columns.
    pub live_columns: String,
    /// `?` database, `?` table: the names of the live table's indexes.
    pub live_indexes: String,
    /// Parameters in column order: topic (unless the topic is fixed), key, payload,
    /// headers (if the table has them).
    pub insert: String,
    pub schema: Schema,
    /// Keys whose head is not due (see `blocked.rs`): `?` after this head id (twice with
    /// [`Statements::dead_holds_key`]: for the keys behind a dead row too), `?` at
    /// most.
    pub blocked_keys: String,
    /// `(owner, rows, earliest_expiry)` of the leases live now, the most rows first.
    pub lease_holders: String,
    /// The outbox's pauses `(target, paused_at)`; pause the target `?` (idempotent);
    /// resume it (see [`crate::storage::pauses`]).
    pub pauses: String,
    pub pause: String,
    pub resume: String,
}

/// What shapes the statements besides the table name.
pub(super) struct Shape<'a> {
    /// The database (MySQL's "schema") holding the table; `None`: the connection's.
    pub database: Option<&'a Ident>,
    pub table: &'a Ident,
    pub columns: &'a Columns,
    /// `dead_letter_holds_key`, under strict ordering: a dead row holds back its key's
    /// later rows (see [`Statements::claim_candidates`]).
    pub dead_holds_key: bool,
    /// See [`crate::storage::TableOptions::max_row_bytes`].
    pub max_row_bytes: u64,
}

/// How MySQL writes names: the relay's own bare, as its tables always had them (but
/// `` `key` ``, a reserved word), a configured one quoted; and the fixed topic as a value
/// that reads the same under every `sql_mode`.
pub(super) const DIALECT: Dialect = Dialect {
    column,
    literal: string_literal,
};

/// `name` as SQL: bare when it is the relay's own name `own` (but `` `key` ``), quoted
/// otherwise.
fn column(name: &Ident, own: &str) -> String {
    if name.as_str() == own && own != "key" {
        own.to_owned()
    } else {
        quote(name.as_str())
    }
}

/// A string as a MySQL value that reads the same under every `sql_mode`: hex bytes
/// reinterpreted as UTF-8 (a quoted literal's backslashes mean different things with and
/// without `NO_BACKSLASH_ESCAPES`).
fn string_literal(text: &str) -> String {
    let hex: String = text.bytes().map(|byte| format!("{byte:02x}")).collect();
    format!("CONVERT(X'{hex}' USING utf8mb4)")
}

impl Statements {
    pub fn render(shape: &Shape<'_>) -> Self {
        let t = match shape.database {
            Some(database) => format!(
                "{}.{}",
                quote(database.as_str()),
                quote(shape.table.as_str())
            ),
            None => quote(shape.table.as_str()),
        };
        let display_table = match shape.database {
            Some(database) => format!("{database}.{}", shape.table),
            None => shape.table.to_string(),
        };
        let names = Names::new(shape.columns, &DIALECT);
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
        } = &names;
        let topic = names.topic("");
        let inserted = names.inserted();
        let pauses = pauses_table(shape);
        Self {
            now: "SELECT UTC_TIMESTAMP(6)".to_owned(),
            nack_select: format!(
                "SELECT CAST({attempts} AS SIGNED) AS attempts, {key} AS `key` FROM {t} \
                 {by_id} AND {leased_by} = ? AND {status} = 'pending' \
                 AND {available_at} > UTC_TIMESTAMP(6) FOR UPDATE",
                by_id = locking_by_ids(id, 1)
            ),
            // The row is locked and known to be held by the owner (nack_select).
            nack_retry: format!(
                "UPDATE {t} SET {available_at} = ?, {last_error} = ?, {leased_by} = NULL \
                 WHERE {id} = ?"
            ),
            nack_dead: format!(
                "UPDATE {t} SET {status} = 'dead', {processed_at} = ?, {last_error} = ?, \
                 {leased_by} = NULL WHERE {id} = ?"
            ),
            // A plain read: the ids are then locked by `held` (see `locking_by_ids`).
            successors_select: format!(
                "SELECT CAST({id} AS SIGNED) FROM {t} \
                 WHERE {key} = ? AND {id} > ? AND {leased_by} = ? AND {status} = 'pending' \
                 ORDER BY {id}"
            ),
            // One row: no transaction needed to know whether it applied.
            dead_letter: format!(
                "UPDATE {t} SET {status} = 'dead', {processed_at} = UTC_TIMESTAMP(6), \
                 {last_error} = ?, {leased_by} = NULL \
                 WHERE {id} = ? AND {leased_by} = ? AND {status} = 'pending'"
            ),
            // SUM of a comparison counts the rows where it holds; SUM yields DECIMAL. A
            // fixed topic groups by a constant: one group, or none for no rows.
            stats: format!(
                "SELECT {topic} AS topic, \
                   CAST(SUM({status} = 'pending') AS SIGNED) AS pending, \
                   CAST(SUM({status} = 'pending' AND {leased_by} IS NOT NULL \
                     AND {available_at} > UTC_TIMESTAMP(6)) AS SIGNED) AS leased, \
                   CAST(SUM({status} = 'pending' AND {leased_by} IS NULL \
                     AND {available_at} > UTC_TIMESTAMP(6)) AS SIGNED) AS waiting, \
                   CAST(SUM({status} = 'dead') AS SIGNED) AS dead, \
                   TIMESTAMPDIFF(MICROSECOND, \
                     MIN(CASE WHEN {status} = 'pending' THEN {created_at} END), \
                     UTC_TIMESTAMP(6)) AS oldest_pending_us \
                 FROM {t} WHERE {status} IN ('pending', 'dead') \
                 GROUP BY {topic} ORDER BY {topic}"
            ),
            delivered_within: format!(
                "SELECT COUNT(*) FROM {t} WHERE {status} = 'done' \
                 AND {processed_at} > UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND"
            ),
            purge_batch: format!(
                "DELETE FROM {t} WHERE {status} = 'done' \
                 AND {processed_at} < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND \
                 ORDER BY {processed_at} LIMIT ?"
            ),
            ping: format!("SELECT 1 FROM {t} LIMIT 0"),
            live_columns: "SELECT COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE = 'YES', \
                             COLUMN_DEFAULT IS NOT NULL AND COLUMN_DEFAULT <> 'NULL' \
                           FROM information_schema.COLUMNS \
                           WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ?"
                .to_owned(),
            live_indexes: "SELECT DISTINCT INDEX_NAME FROM information_schema.STATISTICS \
                           WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ?"
                .to_owned(),
            insert: format!(
                "INSERT INTO {t} ({}) VALUES ({})",
                inserted.join(", "),
                placeholders(inserted.len())
            ),
            schema: Schema::render(&t, &display_table, shape, &names),
            blocked_keys: format!(
                "SELECT o.{key} AS `key`, CAST(o.{id} AS SIGNED) AS head_id, o.{leased_by} AS owner, \
               CAST(o.{attempts} AS SIGNED) AS attempts, o.{last_error} AS last_error, \
               o.{created_at} AS created_at, o.{available_at} AS until, \
               (SELECT CAST(COUNT(*) AS SIGNED) FROM {t} b WHERE b.{key} = o.{key} \
                 AND b.{status} = 'pending' AND b.{id} > o.{id}) AS waiting, \
               CAST(0 AS SIGNED) AS dead \
             FROM {t} o WHERE o.{status} = 'pending' AND o.{key} IS NOT NULL \
               AND o.{available_at} > UTC_TIMESTAMP(6) AND o.{id} > ? \
               AND NOT EXISTS (SELECT 1 FROM {t} p WHERE p.{key} = o.{key} \
                 AND p.{status} = 'pending' AND p.{id} < o.{id}){} \
             ORDER BY head_id LIMIT ?",
                blocked_keys_dead(shape.dead_holds_key, &t, &names),
            ),
            lease_holders: format!(
                "SELECT CAST({leased_by} AS CHAR), CAST(COUNT(*) AS SIGNED), MIN({available_at}) \
                 FROM {t} \
                 WHERE {status} = 'pending' AND {leased_by} IS NOT NULL \
                   AND {available_at} > UTC_TIMESTAMP(6) \
                 GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT {MAX_LEASE_HOLDERS}"
            ),
            pauses: format!("SELECT target, paused_at FROM {pauses} ORDER BY target"),
            pause: format!(
                "INSERT IGNORE INTO {pauses} (target, paused_at) VALUES (?, UTC_TIMESTAMP(6))"
            ),
            resume: format!("DELETE FROM {pauses} WHERE target = ?"),
            pending_index: quote(&derived_name(shape.table.as_str(), PENDING_INDEX)),
            dead_holds_key: shape.dead_holds_key,
            max_row_bytes: shape.max_row_bytes,
            names,
            table: t,
            display_table,
        }
    }
}

/// Backtick-quotes an identifier, doubling embedded backticks. Validated identifiers have
/// none, but quoting stays correct for any input. (`"` quotes strings in MySQL unless
/// `ANSI_QUOTES` is set, so [`Ident::quoted`] does not fit.)
pub(super) fn quote(ident: &str) -> String {
    format!("`{}`", ident.replace('`', "``"))
}

/// `?, ?, ...`: `n` placeholders (at least one; callers skip empty lists).
fn placeholders(n: usize) -> String {
    vec!["?"; n.max(1)].join(", ")
}

/// `FORCE INDEX (PRIMARY) WHERE id IN (NULL, ?...)` with `n` ids: how every locking read
/// of this backend finds its rows, so that it keeps locked only the rows that match the
/// rest of its `WHERE` (issue 9). Under READ COMMITTED, InnoDB releases the lock of a
/// row that does not match only when it was read by a range scan of the primary key
/// (tested on MariaDB 10.11, `pending_rows_of_others_stay_unlocked` in the contract
/// suite): a scan of a secondary index (which the optimizer picks for `status =
/// 'pending'`) or a single-row lookup (`id = ?`, or `IN` of one id) keeps it until the
/// transaction ends. A transaction stopped there (its replica paused, its database link
/// cut) would then hold rows another replica has leased, and that replica's acks would
/// wait on it. The `NULL` matches nothing and keeps even one id a range scan.
fn locking_by_ids(id: &str, n: usize) -> String {
    format!(
        "FORCE INDEX (PRIMARY) WHERE {id} IN (NULL, {})",
        placeholders(n)
    )
}

/// With `dead_holds_key`: the blocked keys behind a dead row, appended to the statement of
/// leased and retrying heads (whose heads behind a dead row it leaves out), `?` after
/// this id (see `storage/blocked.rs`).
fn blocked_keys_dead(dead_holds_key: bool, t: &str, n: &Names) -> String {
    if !dead_holds_key {
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
    } = n;
    let (from, waiting) = blocked::dead_heads(t, n, "?", "CAST(COUNT(*) AS SIGNED)");
    format!(
        " AND NOT {} UNION ALL \
         SELECT d.{key}, CAST(d.{id} AS SIGNED), NULL, CAST(d.{attempts} AS SIGNED), \
           d.{last_error}, d.{created_at}, d.{processed_at}, {waiting}, CAST(1 AS SIGNED) {from}",
        blocked::dead_before(t, n, &format!("o.{key}"), &format!("o.{id}")),
    )
}

/// What a claim's candidate scan filters on, besides due pending rows.
pub(super) struct ClaimShape {
    pub strict_ordering: bool,
    pub visibility_delay: bool,
    /// How many topics the filter names; never more than zero for a fixed topic (the
    /// backend decides in Rust whether a filter includes it).
    pub topics: usize,
    /// How many paused topics the claim leaves out (only without a topic filter).
    pub paused_topics: usize,
    /// How many keys an earlier round of the same claim found taken (see
    /// [`Statements::claim_candidates`]).
    pub excluded_keys: usize,
}

impl Statements {
    /// Candidates of a claim: ids and keys of due, pending rows in id order after a given
    /// id, outside the keys an earlier round of the claim found taken. A plain
    /// (consistent) read that locks nothing: [`Statements::claim_lock`] then locks the
    /// ones still free.
    ///
    /// Why not lock here, with `FOR UPDATE SKIP LOCKED` on the scan: InnoDB keeps the
    /// lock of every row a locking scan of a secondary index reads, matching or not
    /// (tested on MariaDB 10.11, READ COMMITTED). The scan walks past the rows other
    /// claimers hold, so a claim stopped between its statements (its replica paused, its
    /// database link cut) held them all, and their holders' acks waited behind it until
    /// their leases ran out (issue 9). Locking by primary key only keeps the locks of
    /// rows that match.
    ///
    /// Parameters, in order: `now`, the id to scan after; with a visibility delay,
    /// `visible_before`; each topic; each paused topic; each excluded key; with strict
    /// ordering `now`, then `visible_before`, the topics and the paused topics again for
    /// the predecessor test; the row count.
    ///
    /// With strict ordering an earlier pending row of the key holds a row back unless it
    /// is claimable by this very claim (it then comes first in id order and is taken in
    /// the same batch). Not claimable: leased or waiting for a retry, or, beyond the seed,
    /// not visible yet or outside the topic filter. This is a pre-filter that keeps
    /// batches full; the guarantee itself comes from [`Statements::claim_successors`], run
    /// after the candidates are locked.
    ///
    /// The scan is pinned to the `(status, id)` index: it walks pending rows in id order
    /// and stops at the row count. Left to itself the optimizer may pick the primary key
    /// for `ORDER BY id LIMIT` and walk every delivered row too (SEED-PITFALLS #3).
    pub fn claim_candidates(&self, shape: &ClaimShape) -> String {
        let (t, pending_index, c) = (&self.table, &self.pending_index, &self.names);
        let Names {
            id,
            key,
            status,
            available_at,
            created_at,
            ..
        } = c;
        let topic = |alias: &str| c.topic(alias);
        let mut filters = String::new();
        if shape.visibility_delay {
            filters += &format!(" AND o.{created_at} <= ?");
        }
        if shape.topics > 0 {
            filters += &format!(" AND {} IN ({})", topic("o."), placeholders(shape.topics));
        }
        if shape.paused_topics > 0 {
            filters += &format!(
                " AND ({} IN ({})) IS NOT TRUE",
                topic("o."),
                placeholders(shape.paused_topics)
            );
        }
        if shape.excluded_keys > 0 {
            filters += &format!(
                " AND (o.{key} IS NULL OR o.{key} NOT IN ({}))",
                placeholders(shape.excluded_keys)
            );
        }
        if shape.strict_ordering {
            let mut blocked = format!("p.{available_at} > ?");
            if shape.visibility_delay {
                blocked += &format!(" OR p.{created_at} > ?");
            }
            if shape.topics > 0 {
                blocked += &format!(
                    " OR {} NOT IN ({})",
                    topic("p."),
                    placeholders(shape.topics)
                );
            }
            if shape.paused_topics > 0 {
                blocked += &format!(
                    " OR {} IN ({})",
                    topic("p."),
                    placeholders(shape.paused_topics)
                );
            }
            filters += &format!(
                " AND (o.{key} IS NULL OR NOT EXISTS (SELECT 1 FROM {t} p \
                 WHERE p.{key} = o.{key} AND p.{id} < o.{id} AND p.{status} = 'pending' \
                 AND ({blocked})))"
            );
            if self.dead_holds_key {
                // A dead row holds the key too: a range of the `(key, status, id)` index.
                filters += &format!(
                    " AND (o.{key} IS NULL OR NOT {})",
                    blocked::dead_before(t, c, &format!("o.{key}"), &format!("o.{id}"))
                );
            }
        }
        format!(
            "SELECT CAST(o.{id} AS SIGNED) AS id, o.{key} AS `key` \
             FROM {t} o FORCE INDEX ({pending_index}) \
             WHERE o.{status} = 'pending' AND o.{available_at} <= ? AND o.{id} > ?{filters} \
             ORDER BY o.{id} LIMIT ?"
        )
    }

    /// Locks the first `?` (after the ids and `?` now) of `n` candidates that are still due and
    /// pending and that no other transaction holds, in id order, under the relay's own
    /// column names (what [`super::convert::decode_candidate`] reads). Lookups by primary
    /// key: a row that no longer matches is not kept locked.
    pub fn claim_lock(&self, n: usize) -> String {
        let c = &self.names;
        let Names {
            id,
            status,
            available_at,
            ..
        } = c;
        format!(
            "SELECT {} FROM {} o {} AND o.{status} = 'pending' AND o.{available_at} <= ? \
             ORDER BY o.{id} LIMIT ? FOR UPDATE SKIP LOCKED",
            self.message(),
            self.table,
            locking_by_ids(&format!("o.{id}"), n)
        )
    }

    /// The columns of row `o` as a message (what [`super::convert`] decodes): `id, topic,
    /// key, payload, headers, attempts, created_at, stored_bytes`. A row whose stored size
    /// (payload, headers, topic and key) is over `max_row_bytes` comes without its payload
    /// (NULL) and headers, so the server never sends what no response could hold.
    pub fn message(&self) -> String {
        let c = &self.names;
        let Names {
            id,
            key,
            created_at,
            attempts,
            payload,
            ..
        } = c;
        let headers = c
            .headers
            .as_ref()
            .map_or_else(|| "'{}'".to_owned(), |headers| format!("o.{headers}"));
        let topic = c.topic("o.");
        let size = format!(
            "(OCTET_LENGTH(o.{payload}) + COALESCE(OCTET_LENGTH({headers}), 0) \
             + OCTET_LENGTH({topic}) + COALESCE(OCTET_LENGTH(o.{key}), 0))"
        );
        let fits = format!("{size} <= {}", self.max_row_bytes);
        format!(
            "CAST(o.{id} AS SIGNED) AS id, {topic} AS topic, o.{key} AS `key`, \
               CASE WHEN {fits} THEN o.{payload} END AS payload, \
               CASE WHEN {fits} THEN {headers} END AS headers, \
               CAST(o.{attempts} AS SIGNED) AS attempts, o.{created_at} AS created_at, \
               CAST({size} AS SIGNED) AS stored_bytes"
        )
    }

    /// Which of `tested` locked candidates (bound first, then the `batch` ids of the whole
    /// claim, which includes them) have an earlier pending row of their key outside the
    /// batch: those must not be claimed.
    ///
    /// This is what makes strict ordering hold across concurrent claimers, in a fresh
    /// statement after the candidates are locked. A row leaves `pending` only through its
    /// holder (ack, dead-letter), never by a claim, so "every earlier pending row of the
    /// key is in my batch, locked by me" stays true until this transaction commits: no
    /// other claimer can hold an earlier row of the key, nor claim a later one (its own
    /// check sees ours). It also covers what the pre-filter cannot see: an earlier row
    /// that another transaction had locked, which [`Statements::claim_lock`] passes over
    /// silently.
    pub fn claim_successors(&self, tested: usize, batch: usize) -> String {
        let (
            t,
            Names {
                id, key, status, ..
            },
        ) = (&self.table, &self.names);
        // With `dead_holds_key` an earlier dead row holds a row back too: one the scan's
        // pre-filter saw, or one this claim dead-lettered for its attempts.
        let dead = match self.dead_holds_key {
            true => format!(
                " OR {}",
                blocked::dead_before(t, &self.names, &format!("o.{key}"), &format!("o.{id}"))
            ),
            false => String::new(),
        };
        format!(
            "SELECT CAST(o.{id} AS SIGNED) FROM {t} o WHERE o.{id} IN ({}) \
             AND o.{key} IS NOT NULL \
             AND (EXISTS (SELECT 1 FROM {t} p WHERE p.{key} = o.{key} AND p.{id} < o.{id} \
               AND p.{status} = 'pending' AND p.{id} NOT IN ({})){dead})",
            placeholders(tested),
            placeholders(batch)
        )
    }

    /// Leases `n` locked rows: `?` owner, `?` lease deadline, then the ids.
    pub fn claim_update(&self, n: usize) -> String {
        let Names {
            id,
            leased_by,
            attempts,
            available_at,
            ..
        } = &self.names;
        format!(
            "UPDATE {} SET {leased_by} = ?, {attempts} = {attempts} + 1, \
             {available_at} = ? WHERE {id} IN ({})",
            self.table,
            placeholders(n)
        )
    }

    /// Fence of every multi-row write-back: which of the `n` ids (then `?` owner) the
    /// owner holds, locked until the transaction ends. MariaDB has no
    /// `UPDATE ... RETURNING`, so the applied ids come from here and the update follows in
    /// the same transaction. With `live`, only rows whose lease has not run out: an answer
    /// that keeps a row from being claimed needs one (docs/guarantees.md).
    pub fn held(&self, n: usize, live: bool) -> String {
        let Names {
            id,
            leased_by,
            status,
            available_at,
            ..
        } = &self.names;
        let live = if live {
            format!(" AND {available_at} > UTC_TIMESTAMP(6)")
        } else {
            String::new()
        };
        format!(
            "SELECT CAST({id} AS SIGNED) FROM {} {} \
             AND {leased_by} = ? AND {status} = 'pending'{live} ORDER BY {id} FOR UPDATE",
            self.table,
            locking_by_ids(&id.to_string(), n)
        )
    }

    /// Dead-letters `n` locked candidates of a claim that were claimed `max_attempts`
    /// times already (`?` now, `?` max attempts, then the ids); the reason goes into
    /// `last_error`, before the error the row had.
    pub fn exhaust(&self, n: usize) -> String {
        let Names {
            id,
            status,
            attempts,
            leased_by,
            last_error,
            processed_at,
            ..
        } = &self.names;
        format!(
            "UPDATE {} SET {status} = 'dead', {processed_at} = ?, {leased_by} = NULL, \
             {last_error} = CONCAT('claimed ', {attempts}, \
               ' times without an answer (max_attempts = ', ?, ')', \
               COALESCE(CONCAT('; last error: ', {last_error}), '')) \
             WHERE {id} IN ({})",
            self.table,
            placeholders(n)
        )
    }

    /// `(id, attempts)` of the `n` ids (then `?` owner) that the owner holds, locking
    /// nothing.
    pub fn held_attempts(&self, n: usize) -> String {
        let Names {
            id,
            leased_by,
            status,
            attempts,
            ..
        } = &self.names;
        format!(
            "SELECT CAST({id} AS SIGNED), CAST({attempts} AS SIGNED) FROM {} {} \
             AND {leased_by} = ? AND {status} = 'pending' ORDER BY {id}",
            self.table,
            locking_by_ids(&id.to_string(), n)
        )
    }

    /// Marks `n` held rows delivered.
    pub fn ack(&self, n: usize) -> String {
        let Names {
            id,
            status,
            processed_at,
            leased_by,
            ..
        } = &self.names;
        format!(
            "UPDATE {} SET {status} = 'done', {processed_at} = UTC_TIMESTAMP(6), \
             {leased_by} = NULL WHERE {id} IN ({})",
            self.table,
            placeholders(n)
        )
    }

    pub fn ack_delete(&self, n: usize) -> String {
        format!(
            "DELETE FROM {} WHERE {} IN ({})",
            self.table,
            self.names.id,
            placeholders(n)
        )
    }

    /// Gives `n` held rows back untried: `?` when they are claimable, then the ids.
    pub fn release_at(&self, n: usize) -> String {
        self.release(n, "?")
    }

    /// Gives `n` held rows back untried: `?` microseconds from now, then the ids.
    pub fn release_after(&self, n: usize) -> String {
        self.release(n, "UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND")
    }

    fn release(&self, n: usize, due: &str) -> String {
        let Names {
            id,
            attempts,
            available_at,
            leased_by,
            ..
        } = &self.names;
        format!(
            "UPDATE {} SET {attempts} = GREATEST({attempts} - 1, 0), {available_at} = {due}, \
             {leased_by} = NULL WHERE {id} IN ({})",
            self.table,
            placeholders(n)
        )
    }

    /// `?` new lease deadline, then `n` held ids.
    pub fn extend_lease(&self, n: usize) -> String {
        let Names {
            id, available_at, ..
        } = &self.names;
        format!(
            "UPDATE {} SET {available_at} = ? WHERE {id} IN ({})",
            self.table,
            placeholders(n)
        )
    }

    /// Fenced in its own `WHERE`: only the count is reported, so no transaction is
    /// needed. `n` ids, then `?` owner.
    pub fn return_leases(&self, n: usize) -> String {
        let Names {
            id,
            available_at,
            leased_by,
            status,
            ..
        } = &self.names;
        format!(
            "UPDATE {} SET {leased_by} = NULL, {available_at} = UTC_TIMESTAMP(6) \
             WHERE {id} IN ({}) AND {leased_by} = ? AND {status} = 'pending'",
            self.table,
            placeholders(n)
        )
    }
}

/// Suffix of the claim's index, which [`Statements::claim_candidates`] names.
pub(super) const PENDING_INDEX: &str = "_pending_idx";

/// `table` + `suffix`, kept within MySQL's 64 characters (see [`names::derived_name`]).
pub(super) fn derived_name(table: &str, suffix: &str) -> String {
    names::derived_name(table, suffix, 64)
}

/// Microseconds for `INTERVAL ? MICROSECOND`, clamped (see [`rows::clamped`]).
pub(super) fn micros(duration: Duration) -> i64 {
    rows::clamped(duration).as_micros() as i64
}

#[cfg(test)]
mod tests;
