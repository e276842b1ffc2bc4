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

use std::time::Duration;

use super::heads;
use crate::storage::ident::{self, Ident};

/// First half of the two-key advisory locks, so ours cannot collide with an
/// application's single-key locks. ASCII "txob".
const LOCK_CLASS_CLAIM: i32 = 0x7478_6f62;
/// Serialises every `create_schema` of the database (servers starting together).
const LOCK_CLASS_DDL: i32 = LOCK_CLASS_CLAIM + 1;

/// Statements for one outbox table.
#[derive(Debug)]
pub(super) struct Statements {
    /// `schema.table` unquoted, for messages.
    pub display_table: String,
    /// Text hashed into the advisory lock key: the same for every server on this table.
    pub lock_key: String,
    pub claim_lock: String,
    pub ddl_lock: String,
    pub claim_all: String,
    pub claim_topics: String,
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
    /// Key-heads maintenance, with strict ordering (see `heads.rs`).
    pub heads: Option<HeadStatements>,
}

#[derive(Debug)]
pub(super) struct HeadStatements {
    pub lock_finished: String,
    pub advance: String,
    pub purge_drained: String,
}

/// What shapes the statements besides the table name.
pub(super) struct Shape<'a> {
    pub schema: Option<&'a Ident>,
    pub table: &'a Ident,
    pub strict_ordering: bool,
    pub visibility_delay: Duration,
    pub notify_channel: Option<&'a Ident>,
}

impl Statements {
    pub fn render(shape: &Shape<'_>) -> Self {
        let t = match shape.schema {
            Some(schema) => format!("{}.{}", schema.quoted(), shape.table.quoted()),
            None => shape.table.quoted(),
        };
        let display_table = match shape.schema {
            Some(schema) => format!("{schema}.{}", shape.table),
            None => shape.table.to_string(),
        };
        Self {
            lock_key: format!("txoutbox:{display_table}"),
            claim_lock: format!("SELECT pg_advisory_xact_lock({LOCK_CLASS_CLAIM}, hashtext($1))"),
            ddl_lock: format!("SELECT pg_advisory_xact_lock({LOCK_CLASS_DDL}, 0)"),
            claim_all: claim(&t, shape, false),
            claim_topics: claim(&t, shape, true),
            ack: format!(
                "UPDATE {t} SET status = 'done', processed_at = statement_timestamp(), \
                 leased_by = NULL {HELD} RETURNING id"
            ),
            ack_delete: format!("DELETE FROM {t} {HELD} RETURNING id"),
            nack_select: format!(
                "SELECT attempts, key FROM {t} \
                 WHERE id = $1 AND leased_by = $2 AND status = 'pending' FOR UPDATE"
            ),
            // The row is locked and known to be held by the owner (nack_select).
            nack_retry: format!(
                "UPDATE {t} SET available_at = statement_timestamp() + $2::interval, \
                 last_error = $3, leased_by = NULL WHERE id = $1 RETURNING available_at"
            ),
            nack_dead: format!(
                "UPDATE {t} SET status = 'dead', processed_at = statement_timestamp(), \
                 last_error = $2, leased_by = NULL WHERE id = $1 RETURNING processed_at"
            ),
            release_successors: format!(
                "UPDATE {t} SET attempts = GREATEST(attempts - 1, 0), available_at = $4, \
                 leased_by = NULL \
                 WHERE key = $1 AND id > $2 AND leased_by = $3 AND status = 'pending' \
                 RETURNING id"
            ),
            release: format!(
                "UPDATE {t} SET attempts = GREATEST(attempts - 1, 0), \
                 available_at = statement_timestamp() + $3::interval, leased_by = NULL \
                 {HELD} RETURNING id"
            ),
            dead_letter: format!(
                "UPDATE {t} SET status = 'dead', processed_at = statement_timestamp(), \
                 last_error = $3, leased_by = NULL \
                 WHERE id = $1 AND leased_by = $2 AND status = 'pending' RETURNING id"
            ),
            // One row even when nothing was extended, so the deadline is always known.
            extend_lease: format!(
                "WITH extended AS (\
                   UPDATE {t} SET available_at = statement_timestamp() + $3::interval \
                   {HELD} RETURNING id) \
                 SELECT e.id, statement_timestamp() + $3::interval AS lease_expires_at \
                 FROM (SELECT 1) AS clock LEFT JOIN extended e ON true ORDER BY e.id"
            ),
            return_leases: format!(
                "UPDATE {t} SET leased_by = NULL, available_at = statement_timestamp() {HELD}"
            ),
            // `status = 'pending' OR status = 'dead'` (not IN) lets the planner OR the two
            // partial indexes instead of scanning the delivered rows.
            stats: format!(
                "SELECT topic, \
                   count(*) FILTER (WHERE status = 'pending') AS pending, \
                   count(*) FILTER (WHERE status = 'pending' AND leased_by IS NOT NULL \
                     AND available_at > statement_timestamp()) AS leased, \
                   count(*) FILTER (WHERE status = 'dead') AS dead, \
                   EXTRACT(EPOCH FROM statement_timestamp() \
                     - min(created_at) FILTER (WHERE status = 'pending'))::float8 \
                     AS oldest_pending_secs \
                 FROM {t} WHERE status = 'pending' OR status = 'dead' \
                 GROUP BY topic ORDER BY topic"
            ),
            purge_batch: format!(
                "DELETE FROM {t} WHERE id IN (\
                   SELECT id FROM {t} WHERE status = 'done' \
                   AND processed_at < statement_timestamp() - $1::interval LIMIT $2)"
            ),
            ping: format!("SELECT 1 FROM {t} LIMIT 0"),
            insert: format!(
                "INSERT INTO {t} (topic, key, payload, headers) VALUES ($1, $2, $3, $4) \
                 RETURNING id"
            ),
            schema: schema(&t, shape),
            heads: shape.strict_ordering.then(|| {
                let h = heads_table(shape);
                HeadStatements {
                    lock_finished: heads::lock_finished(&h),
                    advance: heads::advance(&t, &h),
                    purge_drained: heads::purge_drained(&h),
                }
            }),
            display_table,
        }
    }
}

/// Fence of every write-back: `$1` ids, `$2` owner.
const HELD: &str = "WHERE id = ANY($1) AND leased_by = $2 AND status = 'pending'";

/// `$1` owner, `$2` lease, `$3` batch size, then `$4` topics (with `topics`) and the
/// visibility delay (when configured) as the next parameter.
///
/// Always returns at least one row: with nothing claimed, a single row of NULLs except
/// `lease_expires_at`, so the deadline comes from the database clock either way.
fn claim(t: &str, shape: &Shape<'_>, topics: bool) -> String {
    let mut next_param = 4;
    let mut param = || {
        let p = format!("${next_param}");
        next_param += 1;
        p
    };
    let topics_param = topics.then(&mut param);
    let delay_param = (!shape.visibility_delay.is_zero()).then(&mut param);

    if shape.strict_ordering {
        return heads::claim(
            t,
            &heads_table(shape),
            topics_param.as_deref(),
            delay_param.as_deref(),
        );
    }
    let mut filters = String::new();
    if let Some(p) = &delay_param {
        filters += &format!(" AND o.created_at <= statement_timestamp() - {p}::interval");
    }
    if let Some(p) = &topics_param {
        filters += &format!(" AND o.topic = ANY({p})");
    }
    format!(
        "WITH claimed AS (\
           UPDATE {t} SET leased_by = $1, attempts = attempts + 1, \
             available_at = statement_timestamp() + $2::interval \
           WHERE id IN (\
             SELECT o.id FROM {t} o \
             WHERE o.status = 'pending' AND o.available_at <= statement_timestamp(){filters} \
             ORDER BY o.id LIMIT $3 FOR UPDATE SKIP LOCKED) \
           RETURNING id, topic, key, payload, headers, attempts, created_at) \
         SELECT c.id, c.topic, c.key, c.payload, c.headers, c.attempts, c.created_at, \
           statement_timestamp() + $2::interval AS lease_expires_at \
         FROM (SELECT 1) AS clock LEFT JOIN claimed c ON true ORDER BY c.id"
    )
}

fn schema(t: &str, shape: &Shape<'_>) -> String {
    let name = |suffix: &str| ident::quote(&derived_name(shape.table.as_str(), suffix));
    let mut sql = String::new();
    if let Some(schema) = shape.schema {
        sql += &format!("CREATE SCHEMA IF NOT EXISTS {};\n", schema.quoted());
    }
    sql += &format!(
        "CREATE TABLE IF NOT EXISTS {t} (
    id           BIGINT      GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    topic        TEXT        NOT NULL,
    key          TEXT,
    payload      BYTEA       NOT NULL,
    headers      JSONB       NOT NULL DEFAULT '{{}}',
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    status       TEXT        NOT NULL DEFAULT 'pending'
                             CHECK (status IN ('pending', 'done', 'dead')),
    attempts     INTEGER     NOT NULL DEFAULT 0,
    available_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    leased_by    TEXT,
    last_error   TEXT,
    processed_at TIMESTAMPTZ
);
CREATE INDEX IF NOT EXISTS {pending} ON {t} (id) WHERE status = 'pending';
CREATE INDEX IF NOT EXISTS {key_pending} ON {t} (key, id) WHERE status = 'pending';
CREATE INDEX IF NOT EXISTS {processed} ON {t} (processed_at) WHERE status = 'done';
CREATE INDEX IF NOT EXISTS {dead} ON {t} (id) WHERE status = 'dead';
CREATE INDEX IF NOT EXISTS {keyless} ON {t} (id) WHERE status = 'pending' AND key IS NULL;
",
        keyless = name("_keyless_idx"),
        pending = name("_pending_idx"),
        key_pending = name("_key_pending_idx"),
        processed = name("_processed_idx"),
        dead = name("_dead_idx"),
    );
    if shape.strict_ordering {
        let qualified = |n: String| match shape.schema {
            Some(schema) => format!("{}.{}", schema.quoted(), n),
            None => n,
        };
        sql += &heads::schema(
            t,
            &heads_table(shape),
            &qualified(name("_heads_on_insert")),
            &name("_heads_on_insert"),
            &name("_heads_idx"),
        );
    }
    if let Some(channel) = shape.notify_channel {
        let function = match shape.schema {
            Some(schema) => format!("{}.{}", schema.quoted(), name("_notify")),
            None => name("_notify"),
        };
        // One notification per INSERT statement, not per row: a bulk insert wakes the
        // relay once. The channel passed validation, so it is safe in a string literal.
        sql += &format!(
            "CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('{channel}', '');
    RETURN NULL;
END;
$$;
DROP TRIGGER IF EXISTS {trigger} ON {t};
CREATE TRIGGER {trigger} AFTER INSERT ON {t}
    FOR EACH STATEMENT EXECUTE FUNCTION {function}();
",
            channel = channel.as_str(),
            trigger = name("_notify"),
        );
    }
    sql
}

/// The key-heads table of a strict outbox, quoted and qualified like the outbox table.
fn heads_table(shape: &Shape<'_>) -> String {
    let heads = ident::quote(&derived_name(shape.table.as_str(), "_heads"));
    match shape.schema {
        Some(schema) => format!("{}.{heads}", schema.quoted()),
        None => heads,
    }
}

/// `table` + `suffix`, kept within PostgreSQL's 63 bytes. A long table name is cut and
/// tagged with a hash of the full name, so two long tables sharing a prefix, or two
/// suffixes of one table, never truncate to the same name (`IF NOT EXISTS` would then
/// silently skip an index).
fn derived_name(table: &str, suffix: &str) -> String {
    if table.len() + suffix.len() <= ident::MAX_LEN {
        return format!("{table}{suffix}");
    }
    let keep = ident::MAX_LEN - suffix.len() - 9;
    format!("{}_{:08x}{suffix}", &table[..keep], fnv1a32(table))
}

/// FNV-1a: tiny and stable across Rust releases, unlike `DefaultHasher`.
fn fnv1a32(text: &str) -> u32 {
    text.bytes().fold(0x811c_9dc5, |hash: u32, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape<'a>(table: &'a Ident, channel: Option<&'a Ident>) -> Shape<'a> {
        Shape {
            schema: None,
            table,
            strict_ordering: true,
            visibility_delay: Duration::ZERO,
            notify_channel: channel,
        }
    }

    #[test]
    fn derived_names_fit_and_stay_distinct() {
        let long = "t".repeat(63);
        let a = derived_name(&long, "_pending_idx");
        let b = derived_name(&long, "_key_pending_idx");
        assert!(a.len() <= 63 && b.len() <= 63);
        assert_ne!(a, b);
        assert_eq!(derived_name("outbox", "_pending_idx"), "outbox_pending_idx");
    }

    #[test]
    fn claim_parameters_are_numbered_in_order() {
        let table = Ident::new("outbox").unwrap();
        let mut s = shape(&table, None);
        s.visibility_delay = Duration::from_secs(1);
        let sql = claim("\"outbox\"", &s, true);
        assert!(sql.contains("o.topic = ANY($4)"));
        assert!(sql.contains("- $5::interval"));
        let sql = claim("\"outbox\"", &s, false);
        assert!(sql.contains("- $4::interval") && !sql.contains("$5"));
    }

    #[test]
    fn schema_quotes_names_and_adds_the_trigger_only_with_a_channel() {
        let table = Ident::new("Outbox").unwrap();
        let channel = Ident::new("outbox_inserted").unwrap();
        assert!(!schema("\"Outbox\"", &shape(&table, None)).contains("pg_notify"));
        let sql = schema("\"Outbox\"", &shape(&table, Some(&channel)));
        assert!(sql.contains("CREATE INDEX IF NOT EXISTS \"Outbox_pending_idx\""));
        assert!(sql.contains("pg_notify('outbox_inserted', '')"));
        assert!(sql.contains("FOR EACH STATEMENT"));
    }
}
