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

use crate::storage::ident::Ident;

/// Statements for one outbox table.
#[derive(Debug)]
pub(super) struct Statements {
    /// `db.table` unquoted, for messages.
    pub display_table: String,
    /// `` `db`.`table` ``, for the statements rendered per call.
    pub table: String,
    /// `` `table_pending_idx` ``, which the claim's scan is pinned to.
    pub pending_index: String,
    pub now: String,
    pub nack_select: String,
    pub nack_retry: String,
    pub nack_dead: String,
    pub successors_select: String,
    pub dead_letter: String,
    pub stats: String,
    pub purge_batch: String,
    pub ping: String,
    pub insert: String,
    /// The DDL, one statement per entry (sent one by one: no multi-statement packets).
    pub schema: Vec<String>,
}

/// What shapes the statements besides the table name.
pub(super) struct Shape<'a> {
    /// The database (MySQL's "schema") holding the table; `None`: the connection's.
    pub database: Option<&'a Ident>,
    pub table: &'a Ident,
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
        Self {
            now: "SELECT UTC_TIMESTAMP(6)".to_owned(),
            nack_select: format!(
                "SELECT attempts, `key` FROM {t} \
                 WHERE id = ? AND leased_by = ? AND status = 'pending' FOR UPDATE"
            ),
            // The row is locked and known to be held by the owner (nack_select).
            nack_retry: format!(
                "UPDATE {t} SET available_at = ?, last_error = ?, leased_by = NULL WHERE id = ?"
            ),
            nack_dead: format!(
                "UPDATE {t} SET status = 'dead', processed_at = ?, last_error = ?, \
                 leased_by = NULL WHERE id = ?"
            ),
            successors_select: format!(
                "SELECT id FROM {t} \
                 WHERE `key` = ? AND id > ? AND leased_by = ? AND status = 'pending' \
                 ORDER BY id FOR UPDATE"
            ),
            // One row: no transaction needed to know whether it applied.
            dead_letter: format!(
                "UPDATE {t} SET status = 'dead', processed_at = UTC_TIMESTAMP(6), \
                 last_error = ?, leased_by = NULL \
                 WHERE id = ? AND leased_by = ? AND status = 'pending'"
            ),
            // SUM of a comparison counts the rows where it holds; SUM yields DECIMAL.
            stats: format!(
                "SELECT topic, \
                   CAST(SUM(status = 'pending') AS SIGNED) AS pending, \
                   CAST(SUM(status = 'pending' AND leased_by IS NOT NULL \
                     AND available_at > UTC_TIMESTAMP(6)) AS SIGNED) AS leased, \
                   CAST(SUM(status = 'dead') AS SIGNED) AS dead, \
                   TIMESTAMPDIFF(MICROSECOND, \
                     MIN(CASE WHEN status = 'pending' THEN created_at END), \
                     UTC_TIMESTAMP(6)) AS oldest_pending_us \
                 FROM {t} WHERE status IN ('pending', 'dead') \
                 GROUP BY topic ORDER BY topic"
            ),
            purge_batch: format!(
                "DELETE FROM {t} WHERE status = 'done' \
                 AND processed_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND \
                 ORDER BY processed_at LIMIT ?"
            ),
            ping: format!("SELECT 1 FROM {t} LIMIT 0"),
            insert: format!("INSERT INTO {t} (topic, `key`, payload, headers) VALUES (?, ?, ?, ?)"),
            schema: schema(&t, shape),
            pending_index: quote(&derived_name(shape.table.as_str(), PENDING_INDEX)),
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

/// What a claim's candidate query filters on, besides due pending rows.
pub(super) struct ClaimShape {
    pub strict_ordering: bool,
    pub visibility_delay: bool,
    pub topics: usize,
}

/// Candidates of a claim: due, pending rows in id order, locked with `SKIP LOCKED` so
/// concurrent claimers (and producers' uncommitted rows) never wait for each other.
///
/// Parameters, in order: `now`; with a visibility delay, `visible_before`; each topic;
/// with strict ordering `now`, then `visible_before` and the topics again for the
/// predecessor test; the batch size.
///
/// With strict ordering an earlier pending row of the key holds a row back unless it is
/// claimable by this very claim (it then comes first in id order and is taken in the same
/// batch). Not claimable: leased or waiting for a retry, or, beyond the seed, not visible
/// yet or outside the topic filter. This is a pre-filter that keeps batches full; the
/// guarantee itself comes from [`claim_successors`], run after the candidates are locked.
///
/// The scan is pinned to the `(status, id)` index: it walks pending rows in id order and
/// stops at the batch size. Left to itself the optimizer may pick the primary key for
/// `ORDER BY id LIMIT` and walk every delivered row too (SEED-PITFALLS #3).
pub(super) fn claim_candidates(t: &str, pending_index: &str, shape: &ClaimShape) -> String {
    let mut filters = String::new();
    if shape.visibility_delay {
        filters += " AND o.created_at <= ?";
    }
    if shape.topics > 0 {
        filters += &format!(" AND o.topic IN ({})", placeholders(shape.topics));
    }
    if shape.strict_ordering {
        let mut blocked = String::from("p.available_at > ?");
        if shape.visibility_delay {
            blocked += " OR p.created_at > ?";
        }
        if shape.topics > 0 {
            blocked += &format!(" OR p.topic NOT IN ({})", placeholders(shape.topics));
        }
        filters += &format!(
            " AND (o.`key` IS NULL OR NOT EXISTS (SELECT 1 FROM {t} p \
             WHERE p.`key` = o.`key` AND p.id < o.id AND p.status = 'pending' AND ({blocked})))"
        );
    }
    format!(
        "SELECT o.id, o.topic, o.`key`, o.payload, o.headers, o.attempts, o.created_at \
         FROM {t} o FORCE INDEX ({pending_index}) \
         WHERE o.status = 'pending' AND o.available_at <= ?{filters} \
         ORDER BY o.id LIMIT ? FOR UPDATE SKIP LOCKED"
    )
}

/// Which of the `n` locked candidates (bound twice: the ids to test, then the whole batch)
/// have an earlier pending row of their key outside the batch: those must not be claimed.
///
/// This is what makes strict ordering hold across concurrent claimers, in a fresh
/// statement after the candidates are locked. A row leaves `pending` only through its
/// holder (ack, dead-letter), never by a claim, so "every earlier pending row of the key is
/// in my batch, locked by me" stays true until this transaction commits: no other claimer
/// can hold an earlier row of the key, nor claim a later one (its own check sees ours).
/// It also covers what the pre-filter cannot see: an earlier row skipped because another
/// transaction had it locked, which `SKIP LOCKED` passes over silently.
pub(super) fn claim_successors(t: &str, n: usize) -> String {
    let ids = placeholders(n);
    format!(
        "SELECT o.id FROM {t} o WHERE o.id IN ({ids}) AND o.`key` IS NOT NULL \
         AND EXISTS (SELECT 1 FROM {t} p WHERE p.`key` = o.`key` AND p.id < o.id \
           AND p.status = 'pending' AND p.id NOT IN ({ids}))"
    )
}

/// Leases `n` locked rows: `?` owner, `?` lease deadline, then the ids.
pub(super) fn claim_update(t: &str, n: usize) -> String {
    format!(
        "UPDATE {t} SET leased_by = ?, attempts = attempts + 1, available_at = ? \
         WHERE id IN ({})",
        placeholders(n)
    )
}

/// Fence of every multi-row write-back: which of the `n` ids (then `?` owner) the owner
/// holds, locked until the transaction ends. MariaDB has no `UPDATE ... RETURNING`, so the
/// applied ids come from here and the update follows in the same transaction.
pub(super) fn held(t: &str, n: usize) -> String {
    format!(
        "SELECT id FROM {t} WHERE id IN ({}) AND leased_by = ? AND status = 'pending' \
         ORDER BY id FOR UPDATE",
        placeholders(n)
    )
}

/// Marks `n` held rows delivered.
pub(super) fn ack(t: &str, n: usize) -> String {
    format!(
        "UPDATE {t} SET status = 'done', processed_at = UTC_TIMESTAMP(6), leased_by = NULL \
         WHERE id IN ({})",
        placeholders(n)
    )
}

pub(super) fn ack_delete(t: &str, n: usize) -> String {
    format!("DELETE FROM {t} WHERE id IN ({})", placeholders(n))
}

/// Gives `n` held rows back untried: `?` when they are claimable, then the ids.
pub(super) fn release_at(t: &str, n: usize) -> String {
    release(t, n, "?")
}

/// Gives `n` held rows back untried: `?` microseconds from now, then the ids.
pub(super) fn release_after(t: &str, n: usize) -> String {
    release(t, n, "UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND")
}

fn release(t: &str, n: usize, available_at: &str) -> String {
    format!(
        "UPDATE {t} SET attempts = GREATEST(attempts - 1, 0), available_at = {available_at}, \
         leased_by = NULL WHERE id IN ({})",
        placeholders(n)
    )
}

/// `?` new lease deadline, then `n` held ids.
pub(super) fn extend_lease(t: &str, n: usize) -> String {
    format!(
        "UPDATE {t} SET available_at = ? WHERE id IN ({})",
        placeholders(n)
    )
}

/// Fenced in its own `WHERE`: only the count is reported, so no transaction is needed.
/// `n` ids, then `?` owner.
pub(super) fn return_leases(t: &str, n: usize) -> String {
    format!(
        "UPDATE {t} SET leased_by = NULL, available_at = UTC_TIMESTAMP(6) \
         WHERE id IN ({}) AND leased_by = ? AND status = 'pending'",
        placeholders(n)
    )
}

/// The DDL. Indexes are declared inside `CREATE TABLE` (MySQL 8 has no
/// `CREATE INDEX IF NOT EXISTS`), so a table that already exists is left as it is.
///
/// - `(status, id)` serves the claim: pending rows in id order, stopping at the batch size.
/// - `(key, status, id)` serves strict ordering's predecessor tests and successors.
/// - `(status, available_at)` finds the few rows that hold keys back (leased or
///   retrying): the predecessor test behind a blocked hot key probes it instead of the
///   key's backlog (0.53 s to 0.16 s for a claim behind 20,000 blocked rows).
/// - `(status, processed_at)` serves purge.
///
/// `topic`, `key` and `leased_by` compare byte for byte (`utf8mb4_bin`), as in PostgreSQL:
/// the default collation would make `Order-1` and `order-1` one key.
fn schema(t: &str, shape: &Shape<'_>) -> Vec<String> {
    let name = |suffix: &str| quote(&derived_name(shape.table.as_str(), suffix));
    let mut statements = Vec::new();
    if let Some(database) = shape.database {
        statements.push(format!(
            "CREATE DATABASE IF NOT EXISTS {}",
            quote(database.as_str())
        ));
    }
    statements.push(format!(
        "CREATE TABLE IF NOT EXISTS {t} (
    id           BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    topic        VARCHAR(255) COLLATE utf8mb4_bin NOT NULL,
    `key`        VARCHAR(255) COLLATE utf8mb4_bin NULL,
    payload      LONGBLOB     NOT NULL,
    headers      JSON         NOT NULL DEFAULT ('{{}}'),
    created_at   DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    status       VARCHAR(16)  NOT NULL DEFAULT 'pending'
                              CHECK (status IN ('pending', 'done', 'dead')),
    attempts     INT          NOT NULL DEFAULT 0,
    available_at DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    leased_by    VARCHAR(255) COLLATE utf8mb4_bin NULL,
    last_error   TEXT         NULL,
    processed_at DATETIME(6)  NULL,
    KEY {pending} (status, id),
    KEY {key_pending} (`key`, status, id),
    KEY {due} (status, available_at),
    KEY {processed} (status, processed_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4",
        pending = name(PENDING_INDEX),
        key_pending = name("_key_idx"),
        due = name("_due_idx"),
        processed = name("_processed_idx"),
    ));
    statements
}

/// Suffix of the claim's index, which [`claim_candidates`] names.
const PENDING_INDEX: &str = "_pending_idx";

/// `table` + `suffix`, kept within MySQL's 64 characters. A long table name is cut and
/// tagged with a hash of the full name, so two long tables sharing a prefix never
/// truncate to the same name.
fn derived_name(table: &str, suffix: &str) -> String {
    const MAX_LEN: usize = 64;
    if table.len() + suffix.len() <= MAX_LEN {
        return format!("{table}{suffix}");
    }
    let keep = MAX_LEN - suffix.len() - 9;
    format!("{}_{:08x}{suffix}", &table[..keep], fnv1a32(table))
}

/// FNV-1a: tiny and stable across Rust releases, unlike `DefaultHasher`.
fn fnv1a32(text: &str) -> u32 {
    text.bytes().fold(0x811c_9dc5, |hash: u32, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    })
}

/// Longest interval sent to the database; longer delays mean "practically never" and
/// would otherwise overflow a `DATETIME`.
pub(super) const MAX_INTERVAL: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// Microseconds for `INTERVAL ? MICROSECOND`, clamped to [`MAX_INTERVAL`].
pub(super) fn micros(duration: Duration) -> i64 {
    duration.min(MAX_INTERVAL).as_micros() as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_backtick_quoted_and_qualified() {
        let (db, table) = (Ident::new("app").unwrap(), Ident::new("Outbox").unwrap());
        let sql = Statements::render(&Shape {
            database: Some(&db),
            table: &table,
        });
        assert_eq!(sql.table, "`app`.`Outbox`");
        assert_eq!(sql.display_table, "app.Outbox");
        assert_eq!(sql.schema[0], "CREATE DATABASE IF NOT EXISTS `app`");
        assert!(sql.schema[1].contains("KEY `Outbox_pending_idx` (status, id)"));
        assert_eq!(quote("a`b"), "`a``b`");
    }

    #[test]
    fn claim_placeholders_follow_the_shape() {
        let shape = ClaimShape {
            strict_ordering: true,
            visibility_delay: true,
            topics: 2,
        };
        let sql = claim_candidates("`t`", "`t_pending_idx`", &shape);
        assert_eq!(sql.matches('?').count(), 1 + 1 + 2 + 1 + 1 + 2 + 1);
        assert!(sql.contains("FORCE INDEX (`t_pending_idx`)"));
        assert!(sql.contains("o.topic IN (?, ?)") && sql.contains("p.topic NOT IN (?, ?)"));
        let plain = ClaimShape {
            strict_ordering: false,
            visibility_delay: false,
            topics: 0,
        };
        let sql = claim_candidates("`t`", "`t_pending_idx`", &plain);
        assert_eq!(sql.matches('?').count(), 2);
        assert!(!sql.contains("EXISTS"));
        assert_eq!(claim_successors("`t`", 3).matches('?').count(), 6);
    }

    #[test]
    fn derived_names_fit_and_stay_distinct() {
        let long = "t".repeat(63);
        let a = derived_name(&long, "_pending_idx");
        let b = derived_name(&long, "_key_idx");
        assert!(a.len() <= 64 && b.len() <= 64);
        assert_ne!(a, b);
        assert_eq!(derived_name("outbox", "_key_idx"), "outbox_key_idx");
    }
}
