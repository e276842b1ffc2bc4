//! The claim: due, unleased, pending rows in id order, leased to their owner in one
//! statement, or with strict ordering in one call of the claim function (`strict.rs`)
//! and a read of its messages once it committed.

use std::sync::OnceLock;

use sqlx::postgres::PgRow;
use sqlx::Row;
use tokio::time::Instant;

use super::convert::{decode_claim, decode_message, interval, ClaimOutcome};
use super::floor::Start;
use super::shape::{exhausted_error, message, Shape};
use super::Shared;
use crate::storage::names::{Names, Placeholders};
use crate::storage::{
    ClaimRequest, Claimed, HeldKeys, OutboxMessage, StorageResult, TopicClause, TopicFilter,
};

/// The claims of one table, and what they need: the pool, the floor of non-strict
/// claims (see `floor.rs`), with strict ordering the claim function.
pub(super) struct Claims {
    shared: Shared,
    statements: ClaimStatements,
    /// The messages of the ids `$1`, in id order, read once a strict claim committed.
    fetch: String,
    visibility_delay: std::time::Duration,
    dead_holds_key: bool,
}

impl Claims {
    pub fn new(shared: Shared, shape: &Shape<'_>) -> Self {
        let n = shape.names();
        Self {
            shared,
            fetch: format!(
                "SELECT {message} FROM {t} o WHERE o.{id} = ANY($1) ORDER BY o.{id}",
                message = message(&n, "o", shape.options.max_row_bytes),
                t = shape.table_sql(),
                id = n.id,
            ),
            statements: ClaimStatements::new(shape),
            visibility_delay: shape.options.visibility_delay,
            dead_holds_key: shape.options.dead_holds_key(),
        }
    }

    /// The claim; with `ahead`, a strict claim follows the owner's own leases of those
    /// keys (see [`crate::storage::Storage::claim_ahead`]), except under
    /// `dead_letter_holds_key`, whose check for a dead row before a key's first row would
    /// have to look behind the owner's rows too.
    pub async fn claim(
        &self,
        request: ClaimRequest<'_>,
        ahead: Option<&HeldKeys>,
    ) -> StorageResult<Claimed> {
        let ahead = ahead.filter(|_| !self.dead_holds_key);
        let topics = TopicFilter::requested(&request);
        let (outcome, messages) = match &self.shared.strict {
            Some(strict) => {
                let rows = strict
                    .claim(
                        &request,
                        &topics,
                        self.visibility_delay,
                        self.dead_holds_key,
                        ahead,
                    )
                    .await?;
                let outcome = decode_claim(&rows).map_err(self.shared.conn.error("claim"))?;
                let messages = self.fetch(&outcome).await?;
                (outcome, messages)
            }
            None => self.claim_unordered(&request, &topics).await?,
        };
        if !outcome.exhausted.is_empty() {
            tracing::warn!(
                ids = ?outcome.exhausted,
                max_attempts = request.max_attempts,
                "dead-lettered rows claimed max_attempts times without an answer"
            );
        }
        tracing::debug!(claimed = outcome.leased.len(), "claimed");
        Ok(Claimed {
            messages,
            lease_expires_at: outcome.lease_expires_at,
            exhausted: outcome.exhausted,
        })
    }

    /// The non-strict claim, which returns its messages (see [`claim`]). Only a claim of
    /// every topic starts at the floor (see `floor.rs`).
    async fn claim_unordered(
        &self,
        request: &ClaimRequest<'_>,
        topics: &TopicFilter<'_>,
    ) -> StorageResult<(ClaimOutcome, Vec<OutboxMessage>)> {
        let err = || self.shared.conn.error("claim");
        let floored = *topics == TopicFilter::Any;
        let start = match floored {
            true => self.shared.floor.start(Instant::now()),
            false => Start::Bottom,
        };
        let statement = self.statements.claim(topics.clause(), request.batch_size);
        let mut query = sqlx::query(statement)
            .bind(request.owner)
            .bind(interval(request.lease))
            .bind(i64::from(request.batch_size))
            .bind(i32::try_from(request.max_attempts).unwrap_or(i32::MAX))
            .bind(start.bound());
        if *topics != TopicFilter::Any {
            query = query.bind(topics.topics());
        }
        if !self.visibility_delay.is_zero() {
            query = query.bind(interval(self.visibility_delay));
        }
        let rows = query
            .fetch_all(&self.shared.conn.pool)
            .await
            .map_err(err())?;
        let outcome = decode_claim(&rows).map_err(err())?;
        let mut messages = rows
            .iter()
            .filter(|row| leased(row))
            .map(decode_message)
            .collect::<Result<Vec<_>, _>>()
            .map_err(err())?;
        messages.sort_unstable_by_key(|message| message.id);
        if floored {
            let highest = messages.last().map(|message| message.id);
            self.shared
                .floor
                .claimed(start, highest.max(outcome.exhausted.iter().copied().max()));
        }
        Ok((outcome, messages))
    }

    /// The messages a strict claim leased. The claim held the table's advisory lock: they
    /// are read once it committed, so no claim waits on how fast this server reads.
    async fn fetch(&self, outcome: &ClaimOutcome) -> StorageResult<Vec<OutboxMessage>> {
        if outcome.leased.is_empty() {
            return Ok(Vec::new());
        }
        let err = || self.shared.conn.error("claim");
        let rows = sqlx::query(&self.fetch)
            .bind(&outcome.leased)
            .fetch_all(&self.shared.conn.pool)
            .await
            .map_err(err())?;
        rows.iter()
            .map(decode_message)
            .collect::<Result<_, _>>()
            .map_err(err())
    }
}

/// Whether a row of the non-strict claim is one it leased (with its message).
fn leased(row: &PgRow) -> bool {
    matches!(row.try_get::<Option<bool>, _>("spent"), Ok(Some(false)))
}

/// The non-strict claims of one table, rendered on first use (see [`ClaimStatements::claim`]).
#[derive(Debug)]
pub(super) struct ClaimStatements {
    claims: [[OnceLock<String>; 32]; 3],
    /// The table, quoted and qualified.
    table: String,
    names: Names,
    /// Rows larger than this are read without their payload and headers (see [`message`]).
    max_row_bytes: u64,
    /// Whether the table has a visibility delay (a parameter of the non-strict claim).
    delayed: bool,
}

impl ClaimStatements {
    pub fn new(shape: &Shape<'_>) -> Self {
        Self {
            claims: Default::default(),
            table: shape.table_sql(),
            names: shape.names(),
            max_row_bytes: shape.options.max_row_bytes,
            delayed: !shape.options.visibility_delay.is_zero(),
        }
    }

    /// The non-strict claim (the strict claim is a function, see `strict.rs`) of
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
            let t = &self.table;
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
}

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
/// however slowly this server reads, nobody waits. One statement per batch
/// fewer: a round trip, a snapshot and an index probe per row (BENCHMARKS.md).
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
    let mut filters = String::new();
    if let Some(p) = &delay_param {
        filters += &n.fill(
            " AND o.{created_at} <= statement_timestamp() - {p}::interval",
            &[("p", &p)],
        );
    }
    if let Some(p) = &topics_param {
        filters += &match topics {
            TopicClause::Except => format!(" AND ({} = ANY({p})) IS NOT TRUE", n.topic("o.")),
            _ => format!(" AND {} = ANY({p})", n.topic("o.")),
        };
    }
    let exhausted = exhausted_error(n, "u", "$4");
    let none = "NULL::text, NULL::text, NULL::bytea, NULL::jsonb, NULL::int4, NULL::timestamptz, \
                NULL::int8";
    n.fill(
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
        &[
            ("t", &t),
            ("cap", &cap),
            ("filters", &filters),
            ("exhausted", &exhausted),
            ("message", &message(n, "u", max_row_bytes)),
            ("none", &none),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::columns::Columns;
    use crate::config::ident::Ident;
    use crate::storage::postgres::shape::{test_shape as shape, DIALECT};
    use crate::storage::TableOptions;

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
        let options = TableOptions {
            strict_ordering: false,
            ..TableOptions::default()
        };
        let s = shape(&table, &options, None);
        let statements = ClaimStatements::new(&s);
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
