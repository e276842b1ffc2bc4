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

use crate::storage::ident::{self, Ident};

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
    pub probe_all: String,
    pub probe_topics: String,
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
    pub purge_batch: String,
    pub ping: String,
    pub insert: String,
    pub schema: String,
}

/// What shapes the statements besides the table name.
pub(super) struct Shape<'a> {
    pub table: &'a Ident,
    pub strict_ordering: bool,
    pub visibility_delay: Duration,
}

/// Fence of every write-back: `?1` ids (a JSON array), `?2` owner.
const HELD: &str = "WHERE id IN (SELECT value FROM json_each(?1)) AND leased_by = ?2 \
                    AND status = 'pending'";

/// The message columns, payload as bytes whatever a producer stored (`'hello'` from the
/// `sqlite3` shell is TEXT in a BLOB column).
const MESSAGE: &str = "id, topic, key, CAST(payload AS BLOB) AS payload, headers, attempts, \
                       created_at";

impl Statements {
    pub fn render(shape: &Shape<'_>) -> Self {
        let t = shape.table.quoted();
        Self {
            claim_all: claim(&t, shape, false),
            claim_topics: claim(&t, shape, true),
            probe_all: probe(&t, shape, false),
            probe_topics: probe(&t, shape, true),
            // `?3` now.
            ack: format!(
                "UPDATE {t} SET status = 'done', processed_at = ?3, leased_by = NULL \
                 {HELD} RETURNING id"
            ),
            ack_delete: format!("DELETE FROM {t} {HELD} RETURNING id"),
            nack_select: format!(
                "SELECT attempts, key FROM {t} \
                 WHERE id = ?1 AND leased_by = ?2 AND status = 'pending'"
            ),
            // The row is known to be held by the owner (nack_select, same transaction).
            // `?2` retry time.
            nack_retry: format!(
                "UPDATE {t} SET available_at = ?2, last_error = ?3, leased_by = NULL \
                 WHERE id = ?1"
            ),
            // `?2` now.
            nack_dead: format!(
                "UPDATE {t} SET status = 'dead', processed_at = ?2, last_error = ?3, \
                 leased_by = NULL WHERE id = ?1"
            ),
            // `?1` key, `?2` the nacked id, `?3` owner, `?4` when they are due.
            release_successors: format!(
                "UPDATE {t} SET attempts = MAX(attempts - 1, 0), available_at = ?4, \
                 leased_by = NULL \
                 WHERE key = ?1 AND id > ?2 AND leased_by = ?3 AND status = 'pending' \
                 RETURNING id"
            ),
            // `?3` when they are due.
            release: format!(
                "UPDATE {t} SET attempts = MAX(attempts - 1, 0), available_at = ?3, \
                 leased_by = NULL {HELD} RETURNING id"
            ),
            // `?4` now.
            dead_letter: format!(
                "UPDATE {t} SET status = 'dead', processed_at = ?4, last_error = ?3, \
                 leased_by = NULL \
                 WHERE id = ?1 AND leased_by = ?2 AND status = 'pending' RETURNING id"
            ),
            // `?3` the new deadline.
            extend_lease: format!("UPDATE {t} SET available_at = ?3 {HELD} RETURNING id"),
            // `?3` now.
            return_leases: format!("UPDATE {t} SET leased_by = NULL, available_at = ?3 {HELD}"),
            // `?1` now. `status = 'pending' OR status = 'dead'` (not IN) lets the planner
            // use the two partial indexes instead of scanning the delivered rows.
            stats: format!(
                "SELECT topic, \
                   sum(status = 'pending') AS pending, \
                   sum(status = 'pending' AND leased_by IS NOT NULL AND available_at > ?1) \
                     AS leased, \
                   sum(status = 'dead') AS dead, \
                   min(CASE WHEN status = 'pending' THEN created_at END) \
                     AS oldest_pending_created_at \
                 FROM {t} WHERE status = 'pending' OR status = 'dead' \
                 GROUP BY topic ORDER BY topic"
            ),
            // `?1` cutoff, `?2` batch size.
            purge_batch: format!(
                "DELETE FROM {t} WHERE id IN (\
                   SELECT id FROM {t} WHERE status = 'done' AND processed_at < ?1 LIMIT ?2)"
            ),
            ping: format!("SELECT 1 FROM {t} LIMIT 0"),
            insert: format!(
                "INSERT INTO {t} (topic, key, payload, headers) VALUES (?1, ?2, ?3, ?4) \
                 RETURNING id"
            ),
            schema: schema(&t, shape.table),
            display_table: shape.table.to_string(),
        }
    }
}

/// `?1` now, then `?2` topics (a JSON array, with `topics`) and the visibility cutoff (now
/// minus the delay, when one is configured) as the next parameter: the rows a claim may
/// take, in id order. Shared by the claim and its probe, which bind the same prefix.
fn candidates(t: &str, shape: &Shape<'_>, topics: bool) -> (String, usize) {
    let mut next_param = 2;
    let mut param = || {
        let p = format!("?{next_param}");
        next_param += 1;
        p
    };
    let topics_param = topics.then(&mut param);
    let cutoff_param = (!shape.visibility_delay.is_zero()).then(&mut param);

    let mut filters = String::new();
    if let Some(p) = &cutoff_param {
        filters += &format!(" AND o.created_at <= {p}");
    }
    if let Some(p) = &topics_param {
        filters += &format!(" AND o.topic IN (SELECT value FROM json_each({p}))");
    }
    if shape.strict_ordering {
        // As in PostgreSQL: an earlier pending row of the key holds this one back unless
        // this very claim can take it (it then comes first in id order). Not claimable:
        // leased or waiting for a retry, not visible yet, or outside the topic filter.
        let mut blocked = String::from("p.available_at > ?1");
        if let Some(p) = &cutoff_param {
            blocked += &format!(" OR p.created_at > {p}");
        }
        if let Some(p) = &topics_param {
            blocked += &format!(" OR p.topic NOT IN (SELECT value FROM json_each({p}))");
        }
        filters += &format!(
            " AND (o.key IS NULL OR NOT EXISTS (SELECT 1 FROM {t} p \
             WHERE p.key = o.key AND p.id < o.id AND p.status = 'pending' AND ({blocked})))"
        );
    }
    let select = format!(
        "SELECT o.id FROM {t} o \
         WHERE o.status = 'pending' AND o.available_at <= ?1{filters} ORDER BY o.id"
    );
    (select, next_param)
}

/// Whether a claim would find anything: a read, answered without the write lock, so an
/// idle relay polling the file never stands in a producer's way. Parameters as in
/// [`candidates`].
fn probe(t: &str, shape: &Shape<'_>, topics: bool) -> String {
    let (select, _) = candidates(t, shape, topics);
    format!("SELECT EXISTS ({select} LIMIT 1)")
}

/// The parameters of [`candidates`], then owner, lease deadline and batch size.
///
/// One statement, run under `BEGIN IMMEDIATE` (see the module docs of the backend): SQLite
/// has one writer at a time per file, so the rows it picks cannot be picked by another
/// claim, and the strict-ordering predicate sees every earlier claim's result.
fn claim(t: &str, shape: &Shape<'_>, topics: bool) -> String {
    let (select, next) = candidates(t, shape, topics);
    let (owner, lease_until, limit) = (next, next + 1, next + 2);
    format!(
        "UPDATE {t} SET leased_by = ?{owner}, attempts = attempts + 1, \
           available_at = ?{lease_until} \
         WHERE id IN ({select} LIMIT ?{limit}) \
         RETURNING {MESSAGE}"
    )
}

fn schema(t: &str, table: &Ident) -> String {
    let name = |suffix: &str| ident::quote(&format!("{table}{suffix}"));
    format!(
        "CREATE TABLE IF NOT EXISTS {t} (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    topic        TEXT    NOT NULL,
    key          TEXT,
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
CREATE INDEX IF NOT EXISTS {pending} ON {t} (id) WHERE status = 'pending';
CREATE INDEX IF NOT EXISTS {key_pending} ON {t} (key, id) WHERE status = 'pending';
CREATE INDEX IF NOT EXISTS {processed} ON {t} (processed_at) WHERE status = 'done';
CREATE INDEX IF NOT EXISTS {dead} ON {t} (id) WHERE status = 'dead';
",
        pending = name("_pending_idx"),
        key_pending = name("_key_pending_idx"),
        processed = name("_processed_idx"),
        dead = name("_dead_idx"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_parameters_are_numbered_in_order() {
        let table = Ident::new("outbox").unwrap();
        let shape = Shape {
            table: &table,
            strict_ordering: true,
            visibility_delay: Duration::from_secs(1),
        };
        let sql = claim("\"outbox\"", &shape, true);
        assert!(sql.contains("o.topic IN (SELECT value FROM json_each(?2))"));
        assert!(sql.contains("o.created_at <= ?3"));
        assert!(sql.contains("leased_by = ?4") && sql.contains("available_at = ?5"));
        assert!(sql.contains("LIMIT ?6"));
        let sql = claim("\"outbox\"", &shape, false);
        assert!(sql.contains("o.created_at <= ?2") && sql.contains("LIMIT ?5"));
        assert!(!sql.contains("?6"));
        let sql = probe("\"outbox\"", &shape, false);
        assert!(sql.contains("o.created_at <= ?2") && !sql.contains("?3"));
    }

    #[test]
    fn schema_quotes_names_and_defaults_times_to_the_clock() {
        let table = Ident::new("Outbox").unwrap();
        let sql = schema("\"Outbox\"", &table);
        assert!(sql.contains("CREATE TABLE IF NOT EXISTS \"Outbox\""));
        assert!(sql.contains("CREATE INDEX IF NOT EXISTS \"Outbox_pending_idx\""));
        assert!(sql.contains(&format!("DEFAULT ({NOW_MS})")));
    }
}
