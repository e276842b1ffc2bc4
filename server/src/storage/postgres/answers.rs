//! The answers of a lease holder: ack, nack, release, dead-letter, lease extension, and
//! the leases of a subscriber that went away given back. Each is one statement (a nack:
//! a read, then one statement for the batch), fenced by `leased_by = owner AND status =
//! 'pending'`, returning the ids it applied to; a nack, an extension and a delayed
//! release also need a lease that has not run out. With strict ordering, rows that
//! stopped being pending move their keys' heads on (`strict.rs`); rows pending again
//! below where claims reached move the claim floor back (`floor.rs`).
//!
//! An answer naming no rows needs no check here: the relay answers it without a storage
//! call (`relay/answers.rs`), and a statement given an empty id array changes nothing.

use std::collections::HashMap;
use std::fmt::Display;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::types::PgInterval;
use tokio::time::Instant;

use super::convert::interval;
use super::shape::Shape;
use super::Shared;
use crate::storage::nack::{plan_nacks, HeldRow};
use crate::storage::names::Names;
use crate::storage::rows::attempts;
use crate::storage::{
    Extended, FailureDecision, MessageId, NackRequest, NackResult, RetryPolicy, SortedIds,
    StorageResult,
};

/// The answers' statements for one table, and what they move besides their rows.
pub(super) struct Answers {
    shared: Shared,
    /// `(id, attempts)` of the rows among `$1` that `$2` holds.
    held_attempts: String,
    /// Returns `(id, key)` of the rows it applied to; a delete with `delete_on_ack`.
    ack: String,
    /// `(id, attempts, key)` of the rows among `$1` that `$2` holds with a live lease.
    nack_held: String,
    /// Applies a batch of nacks whose outcome was decided (see [`nack_apply`]).
    nack_apply: String,
    release: String,
    dead_letter: String,
    extend_lease: String,
    return_leases: String,
}

impl Answers {
    pub fn new(shared: Shared, shape: &Shape<'_>, delete_on_ack: bool) -> Self {
        let t = shape.table_sql();
        let n = shape.names();
        // The answers find their rows by id, fenced by owner and status. They run unnamed
        // (`persistent(false)`), so PostgreSQL plans each for the table as it is: their
        // `status = 'pending'` lets a scan of a whole partial index serve them too, and a
        // cached generic plan made while the table held a few rows chose that scan, and
        // kept it with 20,000 pending rows (each ack read them all). The price,
        // per statement (which answers many rows at once): tens of microseconds of planning,
        // and a round trip of its own in which sqlx prepares it (`Parse`, `Describe`,
        // `Sync`), which PostgreSQL counts as a transaction (BENCHMARKS.md).
        let held = n.fill(
            "WHERE {id} = ANY($1) AND {leased_by} = $2 AND {status} = 'pending'",
            &[],
        );
        // Answers that keep a row from being claimed need a lease that has not run out:
        // past it, another claim may be taking the row (docs/guarantees.md).
        let live = n.fill("{available_at} > statement_timestamp()", &[]);
        let values: [(&str, &dyn Display); 3] = [("t", &t), ("held", &held), ("live", &live)];
        Self {
            held_attempts: n.fill(
                "SELECT {id}::int8, {attempts}::int4 FROM {t} {held} ORDER BY {id}",
                &values,
            ),
            ack: match delete_on_ack {
                true => n.fill(
                    "DELETE FROM {t} {held} RETURNING {id}::int8 AS id, {key}::text AS key",
                    &values,
                ),
                false => n.fill(
                    "UPDATE {t} SET {status} = 'done', {processed_at} = statement_timestamp(), \
                     {leased_by} = NULL {held} RETURNING {id}::int8 AS id, {key}::text AS key",
                    &values,
                ),
            },
            nack_held: n.fill(
                "SELECT {id}::int8 AS id, {attempts}::int4 AS attempts, {key}::text AS key \
                 FROM {t} {held} AND {live}",
                &values,
            ),
            nack_apply: nack_apply(&t, &n),
            release: n.fill(
                "UPDATE {t} SET {attempts} = GREATEST({attempts} - 1, 0), \
                 {available_at} = statement_timestamp() + $3::interval, {leased_by} = NULL \
                 {held} AND ({live} OR $3::interval = interval '0') RETURNING {id}::int8",
                &values,
            ),
            dead_letter: n.fill(
                "UPDATE {t} SET {status} = 'dead', {processed_at} = statement_timestamp(), \
                 {last_error} = $3, {leased_by} = NULL \
                 WHERE {id} = $1 AND {leased_by} = $2 AND {status} = 'pending' \
                 RETURNING {id}::int8 AS id, {key}::text AS key",
                &values,
            ),
            // One row even when nothing was extended, so the deadline is always known.
            extend_lease: n.fill(
                "WITH extended AS (\
                   UPDATE {t} SET {available_at} = statement_timestamp() + $3::interval \
                   {held} AND {live} RETURNING {id}::int8 AS id) \
                 SELECT e.id, statement_timestamp() + $3::interval AS lease_expires_at \
                 FROM (SELECT 1) AS clock LEFT JOIN extended e ON true ORDER BY e.id",
                &values,
            ),
            return_leases: n.fill(
                "UPDATE {t} SET {leased_by} = NULL, {available_at} = statement_timestamp() \
                 {held}",
                &values,
            ),
            shared,
        }
    }

    /// With strict ordering, after rows of these keys stopped being pending: moves the
    /// keys' heads on (see [`Strict::advance`]).
    async fn advance_heads(&self, keys: impl IntoIterator<Item = String>) {
        if let Some(strict) = &self.shared.strict {
            strict.advance(keys).await;
        }
    }

    /// See [`crate::storage::Storage::held_attempts`].
    pub async fn held_attempts(
        &self,
        ids: &SortedIds,
        owner: &str,
    ) -> StorageResult<Vec<(MessageId, u32)>> {
        let rows: Vec<(MessageId, i32)> = sqlx::query_as(&self.held_attempts)
            .persistent(false)
            .bind(ids.as_slice())
            .bind(owner)
            .fetch_all(&self.shared.conn.pool)
            .await
            .map_err(self.shared.conn.error("held_attempts"))?;
        Ok(rows
            .into_iter()
            .map(|(id, stored)| (id, attempts(stored)))
            .collect())
    }

    pub async fn ack(&self, ids: &SortedIds, owner: &str) -> StorageResult<SortedIds> {
        let applied: Vec<(MessageId, Option<String>)> = sqlx::query_as(&self.ack)
            .persistent(false)
            .bind(ids.as_slice())
            .bind(owner)
            .fetch_all(&self.shared.conn.pool)
            .await
            .map_err(self.shared.conn.error("ack"))?;
        self.advance_heads(applied.iter().filter_map(|(_, key)| key.clone()))
            .await;
        Ok(ids.only(applied.into_iter().map(|(id, _)| id)))
    }

    pub async fn release(
        &self,
        ids: &SortedIds,
        owner: &str,
        delay: Duration,
    ) -> StorageResult<SortedIds> {
        let applied: Vec<MessageId> = sqlx::query_scalar(&self.release)
            .persistent(false)
            .bind(ids.as_slice())
            .bind(owner)
            .bind(interval(delay))
            .fetch_all(&self.shared.conn.pool)
            .await
            .map_err(self.shared.conn.error("release"))?;
        if !applied.is_empty() {
            self.shared.floor.rescan_at(Instant::now() + delay);
        }
        Ok(ids.only(applied))
    }

    pub async fn dead_letter(
        &self,
        id: MessageId,
        owner: &str,
        error: &str,
    ) -> StorageResult<bool> {
        let applied: Option<(MessageId, Option<String>)> = sqlx::query_as(&self.dead_letter)
            .persistent(false)
            .bind(id)
            .bind(owner)
            .bind(error)
            .fetch_optional(&self.shared.conn.pool)
            .await
            .map_err(self.shared.conn.error("dead-letter"))?;
        let Some((_, key)) = applied else {
            return Ok(false);
        };
        self.advance_heads(key).await;
        Ok(true)
    }

    pub async fn extend_lease(
        &self,
        ids: &SortedIds,
        owner: &str,
        lease: Duration,
    ) -> StorageResult<Extended> {
        let rows: Vec<(Option<MessageId>, DateTime<Utc>)> = sqlx::query_as(&self.extend_lease)
            .persistent(false)
            .bind(ids.as_slice())
            .bind(owner)
            .bind(interval(lease))
            .fetch_all(&self.shared.conn.pool)
            .await
            .map_err(self.shared.conn.error("extend lease"))?;
        let lease_expires_at = rows
            .first()
            .map(|(_, at)| *at)
            .ok_or_else(|| (self.shared.conn.error("extend lease"))(sqlx::Error::RowNotFound))?;
        let ids = ids.only(rows.into_iter().filter_map(|(id, _)| id));
        Ok(Extended {
            ids,
            lease_expires_at,
        })
    }

    pub async fn return_leases(&self, ids: &SortedIds, owner: &str) -> StorageResult<u64> {
        let done = sqlx::query(&self.return_leases)
            .persistent(false)
            .bind(ids.as_slice())
            .bind(owner)
            .execute(&self.shared.conn.pool)
            .await
            .map_err(self.shared.conn.error("return leases"))?;
        if done.rows_affected() > 0 {
            self.shared.floor.rescan_at(Instant::now());
        }
        Ok(done.rows_affected())
    }

    /// The nacks of a batch: the held rows read, the outcomes planned ([`plan_nacks`]),
    /// then applied in one statement.
    pub async fn nack_many(
        &self,
        nacks: &[NackRequest<'_>],
        owner: &str,
        policy: &dyn RetryPolicy,
    ) -> StorageResult<Vec<NackResult>> {
        let held = self.nack_held(nacks, owner).await?;
        let plan = plan_nacks(nacks, &held, policy);
        let mut apply = NackBatch::default();
        for (nack, decision) in nacks.iter().zip(&plan) {
            let Some(decision) = decision else { continue };
            apply.ids.push(nack.id);
            apply.attempts.push(held[&nack.id].attempts as i32);
            apply.delays.push(match decision {
                FailureDecision::RetryAfter(delay) => Some(interval(*delay)),
                FailureDecision::DeadLetter => None,
            });
            apply.errors.push(nack.error);
        }
        let rows = self.nack_apply(&apply, owner).await?;
        // Rows back in the pending set: a retry, or a key's later rows given back.
        let due_again = rows
            .iter()
            .filter(|(id, _, cause, dead, _)| id != cause || !*dead)
            .map(|(.., at)| *at)
            .min();
        if let Some(at) = due_again {
            let wait = (at - Utc::now()).to_std().unwrap_or_default();
            self.shared.floor.rescan_at(Instant::now() + wait);
        }
        self.advance_heads(
            rows.iter()
                .filter(|(id, _, cause, dead, _)| id == cause && *dead)
                .filter_map(|(_, key, ..)| key.clone()),
        )
        .await;
        Ok(nack_results(nacks, &plan, &rows))
    }

    /// The rows of `nacks` that `owner` holds with a live lease, by id.
    async fn nack_held(
        &self,
        nacks: &[NackRequest<'_>],
        owner: &str,
    ) -> StorageResult<HashMap<MessageId, HeldRow>> {
        let ids: Vec<MessageId> = nacks.iter().map(|nack| nack.id).collect();
        let held: Vec<(MessageId, i32, Option<String>)> = sqlx::query_as(&self.nack_held)
            .persistent(false)
            .bind(&ids)
            .bind(owner)
            .fetch_all(&self.shared.conn.pool)
            .await
            .map_err(self.shared.conn.error("nack"))?;
        Ok(held
            .into_iter()
            .map(|(id, stored, key)| {
                let row = HeldRow {
                    attempts: attempts(stored),
                    key,
                };
                (id, row)
            })
            .collect())
    }

    async fn nack_apply(
        &self,
        apply: &NackBatch<'_>,
        owner: &str,
    ) -> StorageResult<Vec<NackApplied>> {
        if apply.ids.is_empty() {
            return Ok(Vec::new());
        }
        sqlx::query_as(&self.nack_apply)
            .persistent(false)
            .bind(&apply.ids)
            .bind(&apply.attempts)
            .bind(&apply.delays)
            .bind(&apply.errors)
            .bind(owner)
            .fetch_all(&self.shared.conn.pool)
            .await
            .map_err(self.shared.conn.error("nack"))
    }
}

/// The outcome of each nack, from the rows [`nack_apply`] returned.
fn nack_results(
    nacks: &[NackRequest<'_>],
    plan: &[Option<FailureDecision>],
    rows: &[NackApplied],
) -> Vec<NackResult> {
    nacks
        .iter()
        .zip(plan)
        .map(|(nack, decision)| {
            let applied = rows.iter().find(|row| row.0 == nack.id && row.2 == nack.id);
            let (Some(_), Some((_, _, _, dead, at))) = (decision, applied) else {
                return NackResult::Fenced;
            };
            let released: SortedIds = rows
                .iter()
                .filter(|row| row.2 == nack.id && row.0 != nack.id)
                .map(|row| row.0)
                .collect();
            let released = released.into_vec();
            if *dead {
                NackResult::DeadLettered { released }
            } else {
                NackResult::Retried {
                    retry_at: *at,
                    released,
                }
            }
        })
        .collect()
}

/// A row of [`nack_apply`]: `(id, key, cause, dead, at)`.
type NackApplied = (MessageId, Option<String>, MessageId, bool, DateTime<Utc>);

/// The columns of a batch of nacks to apply (see [`nack_apply`]).
#[derive(Default)]
struct NackBatch<'a> {
    ids: Vec<MessageId>,
    attempts: Vec<i32>,
    delays: Vec<Option<PgInterval>>,
    errors: Vec<&'a str>,
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
    n.fill(
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
         UNION ALL SELECT r.id, r.key::text, r.cause, false, r.at FROM released r",
        &[("t", &t)],
    )
}
