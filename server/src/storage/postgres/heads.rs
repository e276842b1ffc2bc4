//! Strict per-key ordering without scanning blocked backlogs: the key-heads table.
//!
//! The seed held a row back with `NOT EXISTS (earlier pending row of the key that is not
//! claimable)`. A claim walking the pending rows in id order then visits every row queued
//! behind a blocked key before it finds anything claimable: with one hot key whose head is
//! leased, a claim costs seconds at a million pending rows (SEED-PITFALLS.md #1).
//!
//! Here every key with pending rows has one row in `<table>_heads` pointing at its oldest
//! pending row. A strict claim walks the heads in id order (only heads, never the rows
//! behind them), keeps the heads whose row is claimable, and extends each with the
//! consecutive claimable rows of its key. Keyless rows come from their own partial index.
//! The cost follows the batch size and the number of blocked keys, not the backlog.
//!
//! Who maintains the heads:
//! - producers, through a statement-level `AFTER INSERT` trigger: a key without a head
//!   gets the inserted row as its head;
//! - the relay, whenever a head row stops being pending (ack, dead-letter, delete): the
//!   key's head moves to its oldest remaining pending row, or to NULL when none is left.
//!
//! The one race that matters is a producer inserting a row of a key while the relay finds
//! the key empty: the relay would set the head to NULL without seeing the new row, which
//! would then never be claimed. Row locks on the heads row close it: the trigger holds a
//! `FOR KEY SHARE` lock on a key's head row until the producer commits (or takes a
//! stronger lock when it creates or fills the head), and the relay takes `FOR UPDATE`
//! before it looks for the key's oldest pending row in a *new* statement. So the relay
//! either waits for the producer's commit and then sees its row, or commits first, in
//! which case the trigger sees the NULL head and fills it. Producers never block each
//! other (`FOR KEY SHARE` is shared); heads rows of drained keys stay, with a NULL head,
//! until `purge` removes them.
//!
//! Claims are still serialised by the table's advisory lock (see `sql.rs`), so each claim
//! sees what the previous one leased.

use sqlx::PgConnection;

use super::sql::Names;
use crate::storage::MessageId;

/// DDL of the heads table, its trigger, and the backfill that makes an existing table
/// (created before, or without strict ordering) consistent.
pub(super) fn schema(
    t: &str,
    heads: &str,
    n: &Names,
    function: &str,
    trigger: &str,
    index: &str,
) -> String {
    let Names {
        id, key, status, ..
    } = n;
    format!(
        "CREATE TABLE IF NOT EXISTS {heads} (
    key     TEXT   PRIMARY KEY,
    head_id BIGINT
);
CREATE INDEX IF NOT EXISTS {index} ON {heads} (head_id) WHERE head_id IS NOT NULL;
CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    locked TEXT[];
BEGIN
    -- Keys that have a head: a shared lock keeps the relay from emptying them until
    -- this transaction commits. Ordered, so two producers never deadlock.
    SELECT coalesce(array_agg(h.key), '{{}}') INTO locked FROM (
        SELECT h.key FROM {heads} h
        WHERE h.key IN (SELECT n.{key} FROM new_rows n WHERE n.{key} IS NOT NULL)
          AND h.head_id IS NOT NULL
        ORDER BY h.key FOR KEY SHARE) h;
    -- The other keys: this statement's oldest row becomes the head, unless a concurrent
    -- transaction set one meanwhile (then the upsert's row lock serialises with the relay).
    INSERT INTO {heads} AS h (key, head_id)
        SELECT n.{key}, min(n.{id}) FROM new_rows n
        WHERE n.{key} IS NOT NULL AND n.{status} = 'pending' AND n.{key} <> ALL(locked)
        GROUP BY n.{key} ORDER BY n.{key}
    ON CONFLICT (key) DO UPDATE SET head_id = coalesce(h.head_id, excluded.head_id);
    RETURN NULL;
END;
$$;
DROP TRIGGER IF EXISTS {trigger} ON {t};
CREATE TRIGGER {trigger} AFTER INSERT ON {t}
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION {function}();
UPDATE {heads} h SET head_id = (
    SELECT min(o.{id}) FROM {t} o WHERE o.{key} = h.key AND o.{status} = 'pending')
WHERE h.head_id IS NULL OR NOT EXISTS (
    SELECT 1 FROM {t} o WHERE o.{id} = h.head_id AND o.{status} = 'pending');
INSERT INTO {heads} (key, head_id)
    SELECT {key}, min({id}) FROM {t} WHERE {status} = 'pending' AND {key} IS NOT NULL
    GROUP BY {key}
ON CONFLICT (key) DO NOTHING;
"
    )
}

/// The strict claim. Parameters: `$1` owner, `$2` lease, `$3` batch size, then the topics
/// (`topics`) and the visibility delay (when configured) as the next ones, named by
/// `topics_param` and `delay_param`.
pub(super) fn claim(
    t: &str,
    heads: &str,
    n: &Names,
    topics_param: Option<&str>,
    delay_param: Option<&str>,
) -> String {
    let Names {
        id,
        key,
        status,
        attempts,
        available_at,
        leased_by,
        created_at,
        ..
    } = n;
    // What makes one row claimable by this claim, given it is pending.
    let claimable = |alias: &str| {
        let mut condition = format!("{alias}.{available_at} <= statement_timestamp()");
        if let Some(p) = delay_param {
            condition +=
                &format!(" AND {alias}.{created_at} <= statement_timestamp() - {p}::interval");
        }
        if let Some(p) = topics_param {
            condition += &format!(" AND {} = ANY({p})", n.topic(alias));
        }
        condition
    };
    let (head_ok, row_ok, keyless_ok) = (claimable("r"), claimable("s"), claimable("o"));
    // `bound`: with a full set of heads, no row after the last head can be among the
    // batch's oldest rows, so each key's run is cut there; this keeps the work near the
    // batch size whatever the keys' backlogs. Written as one comparison (not `IS NULL
    // OR ...`) so it becomes part of the index condition instead of a filter applied
    // after walking the key's whole backlog.
    format!(
        "WITH heads AS (\
           SELECT h.key, h.head_id FROM {heads} h JOIN {t} r ON r.{id} = h.head_id \
           WHERE h.head_id IS NOT NULL AND r.{status} = 'pending' AND {head_ok} \
           ORDER BY h.head_id LIMIT $3), \
         bound AS (SELECT CASE WHEN count(*) >= $3 THEN max(head_id) END AS max_id FROM heads), \
         keyed AS (\
           SELECT s.id, bool_and(s.ok) OVER (PARTITION BY s.key ORDER BY s.id) AS ok \
           FROM heads h CROSS JOIN bound b CROSS JOIN LATERAL (\
             SELECT s.{id} AS id, s.{key} AS key, {row_ok} AS ok FROM {t} s \
             WHERE s.{key} = h.key AND s.{status} = 'pending' AND s.{id} >= h.head_id \
               AND s.{id} <= coalesce(b.max_id, 9223372036854775807) \
             ORDER BY s.{id} LIMIT $3) s), \
         keyless AS (\
           SELECT o.{id} AS id FROM {t} o \
           WHERE o.{status} = 'pending' AND o.{key} IS NULL AND {keyless_ok} \
           ORDER BY o.{id} LIMIT $3), \
         chosen AS (\
           (SELECT id FROM keyed WHERE ok UNION ALL SELECT id FROM keyless) ORDER BY id LIMIT $3), \
         claimed AS (\
           UPDATE {t} o SET {leased_by} = $1, {attempts} = o.{attempts} + 1, \
             {available_at} = statement_timestamp() + $2::interval \
           WHERE o.{id} IN (SELECT id FROM chosen) AND o.{status} = 'pending' \
             AND o.{available_at} <= statement_timestamp() \
           RETURNING {message}) \
         SELECT c.id, c.topic, c.key, c.payload, c.headers, c.attempts, c.created_at, \
           statement_timestamp() + $2::interval AS lease_expires_at \
         FROM (SELECT 1) AS clock LEFT JOIN claimed c ON true ORDER BY c.id",
        message = n.message("o"),
    )
}

/// Locks the heads rows of keys whose head is among `$1` (rows that just stopped being
/// pending), in key order; returns their keys.
pub(super) fn lock_finished(heads: &str) -> String {
    format!("SELECT key FROM {heads} WHERE head_id = ANY($1) ORDER BY key FOR UPDATE")
}

/// Moves the heads of the keys `$1` to their oldest pending row (NULL when none). Must run
/// as a statement of its own after [`lock_finished`], so it sees every committed insert.
pub(super) fn advance(t: &str, heads: &str, n: &Names) -> String {
    let Names {
        id, key, status, ..
    } = n;
    format!(
        "UPDATE {heads} h SET head_id = (\
           SELECT min(o.{id}) FROM {t} o WHERE o.{key} = h.key AND o.{status} = 'pending') \
         WHERE h.key = ANY($1)"
    )
}

/// Deletes up to `$1` heads rows of drained keys (`purge`).
pub(super) fn purge_drained(heads: &str) -> String {
    format!(
        "DELETE FROM {heads} WHERE key IN (\
           SELECT key FROM {heads} WHERE head_id IS NULL LIMIT $1 FOR UPDATE SKIP LOCKED) \
         AND head_id IS NULL"
    )
}

/// After rows stopped being pending within `conn`'s transaction: moves the heads of
/// their keys on. `lock` and `advance` are the rendered [`lock_finished`] and [`advance`].
pub(super) async fn move_on(
    conn: &mut PgConnection,
    lock: &str,
    advance: &str,
    finished: &[MessageId],
) -> Result<(), sqlx::Error> {
    if finished.is_empty() {
        return Ok(());
    }
    let keys: Vec<String> = sqlx::query_scalar(lock)
        .bind(finished)
        .fetch_all(&mut *conn)
        .await?;
    if keys.is_empty() {
        return Ok(());
    }
    sqlx::query(advance).bind(&keys).execute(&mut *conn).await?;
    Ok(())
}
