//! Strict per-key ordering without scanning blocked backlogs, and without a lock held
//! across a round trip: the key-heads table and the two functions of a strict table.
//!
//! The plain way holds a row back with `NOT EXISTS (earlier pending row of the key that is
//! not claimable)`. A claim walking the pending rows in id order then visits every row
//! queued behind a blocked key before it finds anything claimable: with one hot key whose
//! head is leased, a claim costs seconds at a million pending rows.
//!
//! Here every key with pending rows has one row in `<table>_heads` whose `head_id` is at
//! or before its oldest pending row. A strict claim walks the heads in `head_id` order
//! (never the rows behind them), finds each key's first pending row from there, keeps the
//! keys whose first row is claimable, and extends each with the consecutive claimable rows
//! of its key. Keyless rows come from their own partial index. The cost follows the batch
//! size and the number of blocked keys, not the backlog.
//!
//! Who moves the heads:
//! - producers, through a statement-level `AFTER INSERT` trigger: a key without a head
//!   gets its oldest new row as its head, and so does a key whose head is past that row;
//! - the relay, after rows stopped being pending (ack, dead-letter, delete): the heads
//!   of their keys move to the oldest remaining pending row, or to NULL when none is left
//!   ([`advance`]).
//!
//! The race that matters is a producer inserting a row of a key while the relay finds the
//! key empty: the relay would set the head to NULL without seeing the new row, which would
//! then never be claimed. Row locks on the heads row close it without either side waiting
//! for the other's round trips: the trigger holds a `FOR KEY SHARE` lock on the head it
//! found until the producer commits, and the relay takes `FOR UPDATE SKIP LOCKED` before
//! it looks for the key's oldest pending row in a *new* statement (a fresh snapshot). So
//! the relay either skips a key a producer is writing (its head stays behind, where claims
//! look past it, and the next finished row of the key moves it), or moves it in a function
//! that commits in the same round trip, which is all a producer's trigger may wait for.
//! A producer whose id was drawn before the relay moved the head past it, but whose
//! trigger runs after (a commit-order inversion), moves the head back to its row.
//!
//! Under `dead_letter_holds_key` heads still point at pending rows only (producers, answers
//! and `advance` do not change with the policy): the claim also asks, per key it walks,
//! whether a dead row comes before the key's first pending row, and where the first dead
//! row after it is (which ends the key's run), through a `(key, id)` index of the dead
//! rows that the policy's DDL adds.
//!
//! A strict claim runs as one function call: it takes the table's advisory lock (claims on
//! one table run one at a time across servers), then chooses rows in a new snapshot that
//! sees what the claim before it leased. The lock is a transaction lock and the call is
//! its own transaction, so it ends when the function returns, whatever becomes of the
//! server that called it: a paused or partitioned replica never holds it. The
//! claim then locks the rows it chose and checks them again: an answer that committed in
//! between (a late nack making the key's first row wait, a late ack settling it) may have
//! changed them, and a key's later rows are handed out only behind rows that are still
//! claimable or settled. The function returns ids only (the messages are read after it
//! committed), so a slow reader never holds the lock either.
//!
//! Both functions run their statements on cached (generic) plans, planned once per session
//! rather than on every call (`SET plan_cache_mode = force_generic_plan` on the function;
//! BENCHMARKS.md has the counts). Left to PostgreSQL's own rule, a session kept
//! planning afresh whenever its first few custom plans looked cheaper than the generic
//! one, which depends on the rows present when the session started: a claim of 5 new rows
//! then spent 0.32 ms planning its choice of rows, more than the claim itself, and every
//! ack 0.06 ms planning the move of its heads. A generic plan is only as good as the
//! statement lets it be: every part of the choice of rows is bounded by a literal near the
//! batch size (see [`CLAIM_CAPS`]), and the relay's sessions never take a sequential scan
//! (see `connect_options` in `postgres/mod.rs`), so a plan made while the table was small
//! still probes the indexes once it is large. The check for a head left behind is a scalar
//! subquery: as `NOT EXISTS` PostgreSQL could run it as a hash of every pending row,
//! planned for all the heads the walk might visit, and it runs whenever a key's first row
//! walked is past its head, as in every claim that follows the owner's own rows. Such a
//! claim read the whole backlog (about 60 ms at 200,000 pending rows, with custom plans
//! too), and forcing generic plans on the earlier version made the 1,000-key strict drain
//! 3x slower through it.

use sqlx::postgres::PgRow;

use super::convert::{interval, Conn};
use super::shape::{exhausted_error, literal, StrictObjects, LOCK_CLASS_CLAIM};
use crate::storage::names::Names;
use crate::storage::{blocked, ClaimRequest, HeldKeys, StorageResult, TopicFilter};

/// The batch sizes the claim function has a statement of its own for: a batch takes the
/// first at or above it (past the last, the statement limited by the batch size itself).
/// Each statement bounds its parts (the key-heads walk, each key's run, the keyless rows)
/// by the literal, and only then by the batch size. That is for the plan cache, as in the
/// non-strict claim (`claim.rs`): limited by a variable only, a generic plan has to assume
/// it takes a tenth of what it could, so PostgreSQL planned the statement anew on every
/// call of a full batch (0.9-1.1 ms of a 4.5 ms claim of 100 rows over 1,000 keys). Bounded
/// by a literal near the batch, the generic plan walks the same indexes as the custom ones,
/// and the function runs it (see the module docs). Each cap is eight times the one before:
/// a relay's claims ask for between half its `max_batch_size` and all of it, so a session
/// uses one or two of the statements.
const CLAIM_CAPS: [u32; 3] = [16, 128, 1024];
/// How many heads an empty claim looks at to move on heads left behind (see the claim).
const HEADS_REPAIRED_BY_AN_EMPTY_CLAIM: u32 = 16;

/// The claim function's arguments, in order, as `(name, type)`: its declaration, its
/// `regprocedure` (what `verify_table` looks for) and its call are all written from this.
/// See [`claim`] for what each means.
const CLAIM_ARGS: [(&str, &str); 10] = [
    ("txo_owner", "text"),
    ("txo_lease", "interval"),
    ("txo_batch", "integer"),
    ("txo_topics", "text[]"),
    ("txo_delay", "interval"),
    ("txo_max_attempts", "integer"),
    ("txo_paused", "text[]"),
    ("txo_dead_holds", "boolean"),
    ("txo_follow_keys", "text[]"),
    ("txo_follow_upto", "bigint[]"),
];

/// The functions a strict table needs, as `regprocedure` texts.
pub(super) fn functions(objects: &StrictObjects) -> Vec<String> {
    let types: Vec<&str> = CLAIM_ARGS.iter().map(|(_, kind)| *kind).collect();
    vec![
        format!("{}({})", objects.claim_function, types.join(",")),
        format!("{}(text[])", objects.advance_function),
    ]
}

/// The statements of strict ordering, with the pool they run on: the claim function's
/// call, moving the heads of finished keys on, and the purge of drained keys' heads.
pub(super) struct Strict {
    conn: Conn,
    /// [`CLAIM_ARGS`] as `$1`..`$10`; rows `(id, spent, lease_expires_at)`.
    claim: String,
    /// Moves on the heads of the keys `$1` after rows of theirs stopped being pending.
    advance: String,
    purge_drained: String,
    /// The heads table, quoted and qualified.
    pub heads: String,
}

impl Strict {
    pub fn new(conn: Conn, objects: &StrictObjects) -> Self {
        let call: Vec<String> = (1..=CLAIM_ARGS.len()).map(|i| format!("${i}")).collect();
        Self {
            conn,
            claim: format!(
                "SELECT txo_id AS id, txo_spent AS spent, \
                 txo_lease_expires_at AS lease_expires_at FROM {}({})",
                objects.claim_function,
                call.join(", ")
            ),
            advance: format!("SELECT {}($1)", objects.advance_function),
            purge_drained: purge_drained(&objects.heads),
            heads: objects.heads.clone(),
        }
    }

    /// The claim function called for `request` (its arguments in the order of
    /// [`CLAIM_ARGS`]); with `ahead`, following the owner's own rows of those keys.
    pub async fn claim(
        &self,
        request: &ClaimRequest<'_>,
        topics: &TopicFilter<'_>,
        visibility_delay: std::time::Duration,
        dead_holds: bool,
        ahead: Option<&HeldKeys>,
    ) -> StorageResult<Vec<PgRow>> {
        let delay = (!visibility_delay.is_zero()).then(|| interval(visibility_delay));
        sqlx::query(&self.claim)
            .bind(request.owner)
            .bind(interval(request.lease))
            .bind(i32::try_from(request.batch_size).unwrap_or(i32::MAX))
            .bind(matches!(topics, TopicFilter::Only(_)).then_some(topics.topics()))
            .bind(delay)
            .bind(i32::try_from(request.max_attempts).unwrap_or(i32::MAX))
            .bind(matches!(topics, TopicFilter::Except(_)).then_some(topics.topics()))
            .bind(dead_holds)
            .bind(ahead.map(|held| &held.keys[..]))
            .bind(ahead.map(|held| &held.last_ids[..]))
            .fetch_all(&self.conn.pool)
            .await
            .map_err(self.conn.error("claim"))
    }

    /// After rows of these keys stopped being pending: moves the keys' heads on. A
    /// failure only leaves a head behind, which claims look past and a later call moves:
    /// it is logged, never the answer's error.
    pub async fn advance(&self, keys: impl IntoIterator<Item = String>) {
        let mut keys: Vec<String> = keys.into_iter().collect();
        if keys.is_empty() {
            return;
        }
        keys.sort_unstable();
        keys.dedup();
        if let Err(error) = sqlx::query(&self.advance)
            .bind(&keys)
            .execute(&self.conn.pool)
            .await
        {
            tracing::warn!(table = %self.conn.table, %error, "could not move the heads of finished keys on; claims look past them");
        }
    }

    /// Deletes the heads rows of drained keys, a batch at a time; a producer about to
    /// fill one keeps it (row lock).
    pub async fn purge_drained(&self) -> StorageResult<()> {
        crate::storage::in_batches(|| async {
            let done = sqlx::query(&self.purge_drained)
                .bind(crate::storage::PURGE_BATCH)
                .execute(&self.conn.pool)
                .await
                .map_err(self.conn.error("purge"))?;
            Ok(done.rows_affected())
        })
        .await?;
        Ok(())
    }
}

/// DDL of the heads table, its trigger, the two functions, and the backfill that makes an
/// existing table (created before, or without strict ordering) consistent.
pub(super) fn schema(o: &StrictObjects, n: &Names) -> String {
    let StrictObjects {
        table: t,
        heads,
        trigger_function,
        trigger,
        heads_index,
        ..
    } = o;
    n.fill(
        "CREATE TABLE IF NOT EXISTS {heads} (
    key     TEXT   PRIMARY KEY,
    head_id BIGINT
);
CREATE INDEX IF NOT EXISTS {heads_index} ON {heads} (head_id) WHERE head_id IS NOT NULL;
CREATE OR REPLACE FUNCTION {trigger_function}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- The oldest new row of each key becomes its head when the key has none, or when its
    -- head is past that row (the relay moved it on while this row, whose id was drawn
    -- earlier, was not committed yet). A head at or before the new rows stays, and this
    -- transaction holds a share lock on it until it commits: the relay skips a key that
    -- is locked so, and never empties it behind this row's back. Share locks never block
    -- another producer; filling a key's head serialises with another producer filling it.
    INSERT INTO {heads} AS h (key, head_id)
        SELECT n.key, n.first_id FROM (
            SELECT n.{key}::text AS key, min(n.{id}) AS first_id FROM new_rows n
            WHERE n.{key} IS NOT NULL AND n.{status} = 'pending' GROUP BY 1) n
        LEFT JOIN LATERAL (
            SELECT c.head_id FROM {heads} c WHERE c.key = n.key FOR KEY SHARE) c ON true
        WHERE c.head_id IS NULL OR c.head_id > n.first_id
        ORDER BY n.key
    ON CONFLICT (key) DO UPDATE SET head_id = least(h.head_id, excluded.head_id);
    RETURN NULL;
END;
$$;
DROP TRIGGER IF EXISTS {trigger} ON {t};
CREATE TRIGGER {trigger} AFTER INSERT ON {t}
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION {trigger_function}();
{advance}{claim}UPDATE {heads} h SET head_id = (
    SELECT min(o.{id}) FROM {t} o WHERE o.{key} = h.key AND o.{status} = 'pending')
WHERE h.head_id IS NULL OR NOT EXISTS (
    SELECT 1 FROM {t} o WHERE o.{id} = h.head_id AND o.{status} = 'pending');
INSERT INTO {heads} (key, head_id)
    SELECT {key}, min({id}) FROM {t} WHERE {status} = 'pending' AND {key} IS NOT NULL
    GROUP BY {key}
ON CONFLICT (key) DO NOTHING;
",
        &[
            ("advance", &advance(o, n)),
            ("claim", &claim(o, n)),
            ("heads", &heads),
            ("heads_index", &heads_index),
            ("t", &t),
            ("trigger", &trigger),
            ("trigger_function", &trigger_function),
        ],
    )
}

/// `advance(keys text[])`: moves the heads of `keys` whose head row is no longer pending to
/// the key's oldest pending row (NULL when none is left). Heads a producer's transaction
/// holds are skipped: they stay behind, which claims look past, until a later call.
fn advance(o: &StrictObjects, n: &Names) -> String {
    let StrictObjects {
        table: t,
        heads,
        advance_function,
        ..
    } = o;
    n.fill(
        "CREATE OR REPLACE FUNCTION {advance_function}(txo_keys text[]) RETURNS void
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    txo_locked text[];
BEGIN
    SELECT coalesce(array_agg(l.key), '{}') INTO txo_locked FROM (
        SELECT h.key FROM {heads} h
        WHERE h.key = ANY(txo_keys) AND h.head_id IS NOT NULL
          -- The head row's status, probed by primary key: as `NOT EXISTS` (a pending row
          -- of that id) PostgreSQL could join the heads to a scan of every pending row.
          AND (SELECT o.{status} FROM {t} o WHERE o.{id} = h.head_id) IS DISTINCT FROM 'pending'
        ORDER BY h.key FOR UPDATE SKIP LOCKED) l;
    IF cardinality(txo_locked) > 0 THEN
        -- A statement of its own: its snapshot holds every row committed before the locks.
        UPDATE {heads} h SET head_id = (
            SELECT min(o.{id}) FROM {t} o WHERE o.{key} = h.key AND o.{status} = 'pending')
        WHERE h.key = ANY(txo_locked);
    END IF;
END;
$$;
",
        &[
            ("advance_function", &advance_function),
            ("heads", &heads),
            ("t", &t),
        ],
    )
}

/// `claim(owner, lease, batch, topics, delay, max_attempts, paused, dead_holds,
/// follow_keys, follow_upto)`: the strict claim (see the module docs). `topics` NULL means every topic, `delay` NULL no
/// visibility delay, `paused` (topics an operator paused) NULL none. A key whose first row
/// is of a paused topic waits, like a key whose first row is leased. With `dead_holds`, a
/// dead row of a key holds back every later row of the key, like a leased row: the key's
/// first pending row waits while a dead row of the key comes before it, and a run stops
/// at a dead row (both looked up through the `(key, id)` index of dead rows that the
/// policy's DDL adds; a head never points at a dead row, so producers, answers and
/// `advance` are the same with the policy or without), and a row this claim dead-letters
/// for its attempts holds back the later rows it chose of its key. Returns
/// one row per leased id (`txo_spent` false), one per row dead-lettered for having used
/// `max_attempts` (true), and always a last row whose id is NULL, for the lease deadline.
///
/// With `follow_keys` (NULL: none) and `follow_upto` beside it, a key of `follow_keys`
/// whose first pending rows are leased by `owner` itself (the lease not run out) at or
/// before its `follow_upto` id is walked from the first row after them: the owner gets
/// the key's next rows while it still holds the earlier ones, so a stream can hold two
/// batches of a hot key. Only a prefix of the owner's own rows is skipped: a key whose
/// first row is free, leased by another owner or waiting for its retry is handled as
/// without it, and a run still stops at any row that is not claimable (the owner's own
/// included), so the rows handed out always follow every earlier pending row of their
/// key, each of which the owner holds. The bound per key is the last row of it the caller
/// knows it holds: an own row past it is one the caller does not know of (a claim whose
/// answer was lost with its connection after it committed, a give-back that failed) and
/// must not be walked past, since the caller will never answer it; it holds its key back
/// until its lease runs out, as any other owner's would. The caller must also make sure
/// the owner may hold rows so (the relay's streams send a key's later rows only once its
/// earlier ones are acked, see `relay/subscription/parked.rs`); a unary caller passes
/// NULL.
fn claim(o: &StrictObjects, n: &Names) -> String {
    let StrictObjects {
        heads,
        claim_function,
        advance_function,
        lock_key,
        ..
    } = o;
    let lock_key = literal(lock_key);
    let repaired = HEADS_REPAIRED_BY_AN_EMPTY_CLAIM;
    let arguments: Vec<String> = CLAIM_ARGS
        .chunks(4)
        .map(|line| {
            let line: Vec<String> = line
                .iter()
                .map(|(name, kind)| format!("{name} {kind}"))
                .collect();
            line.join(", ")
        })
        .collect();
    let arguments = arguments.join(",\n    ");
    let mut branches = String::new();
    for cap in CLAIM_CAPS {
        let keyword = if branches.is_empty() { "IF" } else { "ELSIF" };
        branches += &format!(
            "    {keyword} txo_batch <= {cap} THEN\n{}",
            choose(o, n, &cap.to_string())
        );
    }
    let choose = format!(
        "{branches}    ELSE\n{}    END IF;\n",
        choose(o, n, "txo_batch")
    );
    format!(
        "CREATE OR REPLACE FUNCTION {claim_function}(
    {arguments})
RETURNS TABLE (txo_id bigint, txo_spent boolean, txo_lease_expires_at timestamptz)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    txo_now timestamptz;
    txo_chosen bigint[];
    txo_take bigint[];
    txo_spend bigint[];
    txo_spent_keys text[];
    txo_behind text[];
    txo_upto jsonb;
BEGIN
    PERFORM pg_advisory_xact_lock({LOCK_CLASS_CLAIM}, hashtext({lock_key}));
    -- After the lock: the claim before this one may have waited as long.
    txo_now := clock_timestamp();
    -- Key -> last id of it the caller holds, looked up per key walked.
    txo_upto := CASE WHEN txo_follow_keys IS NOT NULL
                THEN jsonb_object(txo_follow_keys, txo_follow_upto::text[]) END;
{choose}    IF cardinality(txo_behind) > 0 THEN
        -- Heads left behind (an answer skipped them while a producer held them): this
        -- claim walked past finished rows to reach their first pending row. Move them on.
        PERFORM {advance_function}(txo_behind);
    END IF;

    IF cardinality(txo_chosen) = 0 THEN
        -- Idle: move on a few heads left behind by answers that skipped them.
        PERFORM {advance_function}(ARRAY(
            SELECT h.key FROM {heads} h WHERE h.head_id IS NOT NULL
            ORDER BY h.head_id LIMIT {repaired}));
    ELSE
{lease}    END IF;
    RETURN QUERY
        SELECT u.id, false, txo_now + txo_lease FROM unnest(txo_take) AS u(id)
        UNION ALL SELECT u.id, true, txo_now + txo_lease FROM unnest(txo_spend) AS u(id)
        UNION ALL SELECT NULL::bigint, NULL::boolean, txo_now + txo_lease;
END;
$$;
",
        lease = lease_chosen(o, n),
    )
}

/// What makes one pending row (alias `alias`) claimable by the claim function.
fn claimable(n: &Names, alias: &str) -> String {
    format!(
        "{alias}.{available_at} <= txo_now \
         AND (txo_delay IS NULL OR {alias}.{created_at} <= txo_now - txo_delay) \
         AND (txo_topics IS NULL OR {topic} = ANY(txo_topics)) \
         AND (txo_paused IS NULL OR ({topic} = ANY(txo_paused)) IS NOT TRUE)",
        available_at = n.available_at,
        created_at = n.created_at,
        topic = n.topic(&format!("{alias}."))
    )
}

/// The claim function's choice of rows, for a batch of at most `cap` (a literal, or
/// `txo_batch` past the largest of [`CLAIM_CAPS`]; see there for why), into `txo_chosen`,
/// and the keys whose head it found left behind into `txo_behind`.
///
/// `bound`: with a full set of heads, no row after the last head can be among the
/// batch's oldest rows (every other key's rows come after its head), so each key's run
/// is cut there; this keeps the work near the batch size whatever the backlogs. One
/// comparison (not `IS NULL OR ...`), so it is part of the index condition. When
/// following the owner's rows, a key's run starts at its first row past the owner's own
/// (`first_id`), so the cut is the last of those: every key of the set keeps at least its
/// first row. `behind` is a scalar subquery, not `NOT EXISTS`: see the module docs.
fn choose(o: &StrictObjects, n: &Names, cap: &str) -> String {
    let StrictObjects {
        table: t, heads, ..
    } = o;
    let (head_ok, row_ok, keyless_ok) = (claimable(n, "r"), claimable(n, "s"), claimable(n, "o"));
    let dead_before_first = blocked::dead_before(t, n, "h.key", "f.id");
    n.fill(
        "        WITH heads AS (
            SELECT * FROM (SELECT h.key, h.head_id, f.id AS first_id,
                   CASE WHEN txo_dead_holds THEN (
                       SELECT min(d.{id}) FROM {t} d
                       WHERE d.{key} = h.key AND d.{status} = 'dead' AND d.{id} > f.id)
                   END AS dead_after
            FROM {heads} h
            CROSS JOIN LATERAL (
                SELECT r.{id} AS id, {head_ok} AS ok FROM {t} r
                WHERE r.{key} = h.key AND r.{status} = 'pending' AND r.{id} >= h.head_id
                  AND NOT (r.{id} <= coalesce((txo_upto ->> h.key)::bigint, 0)
                           AND r.{leased_by} IS NOT DISTINCT FROM txo_owner
                           AND r.{available_at} > txo_now)
                ORDER BY r.{id} LIMIT 1) f
            WHERE h.head_id IS NOT NULL AND f.ok
              AND NOT (txo_dead_holds AND {dead_before_first})
            ORDER BY h.head_id LIMIT {cap}) w LIMIT txo_batch),
        bound AS (
            SELECT CASE WHEN count(*) >= txo_batch THEN
                       CASE WHEN txo_upto IS NOT NULL THEN max(first_id) ELSE max(head_id) END
                   END AS max_id FROM heads),
        keyed AS (
            SELECT s.id, bool_and(s.ok) OVER (PARTITION BY s.key ORDER BY s.id) AS ok
            FROM heads h CROSS JOIN bound b CROSS JOIN LATERAL (
                SELECT s.{id} AS id, s.{key} AS key, {row_ok} AS ok FROM {t} s
                WHERE s.{key} = h.key AND s.{status} = 'pending' AND s.{id} >= h.first_id
                  AND s.{id} <= coalesce(b.max_id, 9223372036854775807)
                  AND s.{id} < coalesce(h.dead_after, 9223372036854775807)
                ORDER BY s.{id} LIMIT {cap}) s),
        keyless AS (
            SELECT o.{id} AS id FROM {t} o
            WHERE o.{status} = 'pending' AND o.{key} IS NULL AND {keyless_ok}
            ORDER BY o.{id} LIMIT {cap}),
        chosen AS (
            (SELECT k.id FROM keyed k WHERE k.ok UNION ALL SELECT l.id FROM keyless l)
            ORDER BY 1 LIMIT txo_batch)
        SELECT (SELECT coalesce(array_agg(c.id ORDER BY c.id), '{}') FROM chosen c),
               (SELECT coalesce(array_agg(h.key), '{}') FROM heads h
                WHERE h.first_id > h.head_id
                  AND (SELECT true FROM {t} p
                       WHERE p.{id} = h.head_id AND p.{status} = 'pending' LIMIT 1) IS NULL)
        INTO txo_chosen, txo_behind;\n",
        &[
            ("cap", &cap),
            ("dead_before_first", &dead_before_first),
            ("head_ok", &head_ok),
            ("heads", &heads),
            ("keyless_ok", &keyless_ok),
            ("row_ok", &row_ok),
            ("t", &t),
        ],
    )
}

/// The claim function's lease of the rows it chose: locked and looked at again (an answer
/// may have committed meanwhile), into `txo_take` (leased) and `txo_spend` (dead-lettered
/// for their attempts, their keys' heads moved on).
fn lease_chosen(o: &StrictObjects, n: &Names) -> String {
    let StrictObjects {
        table: t,
        advance_function,
        ..
    } = o;
    let exhausted = exhausted_error(n, "o", "txo_max_attempts");
    n.fill(
        "        -- Lock what was chosen and look again: an answer may have committed meanwhile.
        -- A key's row is kept only while every chosen row before it is kept or settled
        -- (with `dead_holds`, settled as delivered: a row dead now holds the rest back).
        WITH locked AS (
            SELECT o.{id} AS id, o.{key} AS key, o.{status} = 'pending' AS pending,
                   o.{status} = 'dead' AS dead,
                   o.{available_at} <= txo_now AS due, o.{attempts} >= txo_max_attempts AS spent
            FROM {t} o WHERE o.{id} = ANY(txo_chosen) ORDER BY o.{id} FOR UPDATE),
        judged AS (
            SELECT l.id, l.key, l.pending AND l.due AS ok, l.spent,
                   coalesce(bool_and(CASE WHEN l.pending
                           THEN l.due AND NOT (txo_dead_holds AND l.spent)
                           ELSE NOT (txo_dead_holds AND l.dead) END)
                       OVER (PARTITION BY l.key ORDER BY l.id
                             ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), true) AS run_ok
            FROM locked l)
        SELECT coalesce(array_agg(j.id ORDER BY j.id) FILTER (WHERE NOT j.spent), '{}'),
               coalesce(array_agg(j.id ORDER BY j.id) FILTER (WHERE j.spent), '{}')
        INTO txo_take, txo_spend
        FROM judged j WHERE j.ok AND (j.key IS NULL OR j.run_ok);

        UPDATE {t} o SET {leased_by} = txo_owner, {attempts} = o.{attempts} + 1,
            {available_at} = txo_now + txo_lease
        WHERE o.{id} = ANY(txo_take);
        IF cardinality(txo_spend) > 0 THEN
            WITH spent AS (
                UPDATE {t} o SET {status} = 'dead', {processed_at} = txo_now,
                    {leased_by} = NULL, {last_error} = {exhausted}
                WHERE o.{id} = ANY(txo_spend) RETURNING o.{key}::text AS key)
            SELECT coalesce(array_agg(s.key) FILTER (WHERE s.key IS NOT NULL), '{}')
            INTO txo_spent_keys FROM spent s;
            PERFORM {advance_function}(txo_spent_keys);
        END IF;
",
        &[
            ("advance_function", &advance_function),
            ("exhausted", &exhausted),
            ("t", &t),
        ],
    )
}

/// Deletes up to `$1` heads rows of drained keys (`purge`).
fn purge_drained(heads: &str) -> String {
    format!(
        "DELETE FROM {heads} WHERE key IN (\
           SELECT key FROM {heads} WHERE head_id IS NULL LIMIT $1 FOR UPDATE SKIP LOCKED) \
         AND head_id IS NULL"
    )
}
