//! The answers of a lease holder: ack, nack, release, dead-letter, lease extension, and
//! the leases of a subscriber that went away given back. MariaDB has no `UPDATE ...
//! RETURNING`: every multi-row answer is a short transaction that locks the rows the
//! owner holds ([`Statements::held`]), updates exactly those, and returns their ids. One
//! attempt each; `mod.rs` retries them once after a lock conflict.
//!
//! An answer naming no rows returns at once: `IN ()` is not SQL (the relay itself sends
//! none, `relay/answers.rs`; the other backends' statements take an empty list).

use std::time::Duration;

use sqlx::mysql::MySqlConnection;
use sqlx::Row;

use super::convert::{self, after, now, BindIds};
use super::shape::{locking_by_ids, micros, placeholders, Statements};
use super::MySqlStorage;
use crate::storage::rows::attempts;
use crate::storage::{
    Extended, FailureDecision, MessageId, NackRequest, NackResult, RetryPolicy, SortedIds,
    StorageResult,
};

impl Statements {
    /// The fence of every answer: `FROM` the table, `WHERE` the row is one of `n` ids
    /// (then `?` owner) that the owner holds; with `live`, only with a lease that has not
    /// run out: an answer that keeps a row from being claimed needs one
    /// (docs/guarantees.md). Found by primary key, so that a locking read of it keeps
    /// only the rows that match locked (see [`locking_by_ids`]).
    fn held_by(&self, n: usize, live: bool) -> String {
        let live = match live {
            true => self.fill(" AND {available_at} > UTC_TIMESTAMP(6)", &[]),
            false => String::new(),
        };
        self.fill(
            "FROM {t} {by_id} AND {leased_by} = ? AND {status} = 'pending'{live}",
            &[
                ("by_id", &locking_by_ids(&self.table.names.id, n)),
                ("live", &live),
            ],
        )
    }

    /// The attempts and key of the row `?` if `?` owner holds it with a live lease,
    /// locked.
    pub fn nack_select(&self) -> String {
        self.fill(
            "SELECT CAST({attempts} AS SIGNED) AS attempts, {key} AS `key` {held} FOR UPDATE",
            &[("held", &self.held_by(1, true))],
        )
    }

    /// `?` retry time, `?` error, `?` id: the row is locked and known to be held by the
    /// owner ([`Statements::nack_select`]).
    pub fn nack_retry(&self) -> String {
        self.fill(
            "UPDATE {t} SET {available_at} = ?, {last_error} = ?, {leased_by} = NULL \
             WHERE {id} = ?",
            &[],
        )
    }

    /// `?` now, `?` error, `?` id, as [`Statements::nack_retry`].
    pub fn nack_dead(&self) -> String {
        self.fill(
            "UPDATE {t} SET {status} = 'dead', {processed_at} = ?, {last_error} = ?, \
             {leased_by} = NULL WHERE {id} = ?",
            &[],
        )
    }

    /// The later rows of the key `?` after the id `?` that `?` owner holds. A plain read:
    /// the ids are then locked by [`Statements::held`] (see [`locking_by_ids`]).
    pub fn successors_select(&self) -> String {
        self.fill(
            "SELECT CAST({id} AS SIGNED) FROM {t} \
             WHERE {key} = ? AND {id} > ? AND {leased_by} = ? AND {status} = 'pending' \
             ORDER BY {id}",
            &[],
        )
    }

    /// `?` error, `?` id, `?` owner. One row: no transaction needed to know whether it
    /// applied.
    pub fn dead_letter(&self) -> String {
        self.fill(
            "UPDATE {t} SET {status} = 'dead', {processed_at} = UTC_TIMESTAMP(6), \
             {last_error} = ?, {leased_by} = NULL \
             WHERE {id} = ? AND {leased_by} = ? AND {status} = 'pending'",
            &[],
        )
    }

    /// Fence of every multi-row write-back: which of the `n` ids (then `?` owner) the
    /// owner holds (with `live`, see [`Statements::held_by`]), locked until the
    /// transaction ends. MariaDB has no `UPDATE ... RETURNING`, so the applied ids come
    /// from here and the update follows in the same transaction.
    pub fn held(&self, n: usize, live: bool) -> String {
        self.fill(
            "SELECT CAST({id} AS SIGNED) {held} ORDER BY {id} FOR UPDATE",
            &[("held", &self.held_by(n, live))],
        )
    }

    /// `(id, attempts)` of the `n` ids (then `?` owner) that the owner holds, locking
    /// nothing.
    pub fn held_attempts(&self, n: usize) -> String {
        self.fill(
            "SELECT CAST({id} AS SIGNED), CAST({attempts} AS SIGNED) {held} ORDER BY {id}",
            &[("held", &self.held_by(n, false))],
        )
    }

    /// Marks `n` held rows delivered.
    pub fn ack(&self, n: usize) -> String {
        self.fill(
            "UPDATE {t} SET {status} = 'done', {processed_at} = UTC_TIMESTAMP(6), \
             {leased_by} = NULL WHERE {id} IN ({ids})",
            &[("ids", &placeholders(n))],
        )
    }

    pub fn ack_delete(&self, n: usize) -> String {
        self.fill(
            "DELETE FROM {t} WHERE {id} IN ({ids})",
            &[("ids", &placeholders(n))],
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
        self.fill(
            "UPDATE {t} SET {attempts} = GREATEST({attempts} - 1, 0), {available_at} = {due}, \
             {leased_by} = NULL WHERE {id} IN ({ids})",
            &[("due", &due), ("ids", &placeholders(n))],
        )
    }

    /// `?` new lease deadline, then `n` held ids.
    pub fn extend_lease(&self, n: usize) -> String {
        self.fill(
            "UPDATE {t} SET {available_at} = ? WHERE {id} IN ({ids})",
            &[("ids", &placeholders(n))],
        )
    }

    /// Fenced in its own `WHERE`: only the count is reported, so no transaction is
    /// needed. `n` ids, then `?` owner.
    pub fn return_leases(&self, n: usize) -> String {
        self.fill(
            "UPDATE {t} SET {leased_by} = NULL, {available_at} = UTC_TIMESTAMP(6) \
             WHERE {id} IN ({ids}) AND {leased_by} = ? AND {status} = 'pending'",
            &[("ids", &placeholders(n))],
        )
    }
}

impl MySqlStorage {
    /// Which of `ids` `owner` holds (with `live`, with a lease that has not run out),
    /// locked until `conn`'s transaction ends.
    async fn held(
        &self,
        conn: &mut MySqlConnection,
        ids: &SortedIds,
        owner: &str,
        live: bool,
    ) -> Result<SortedIds, sqlx::Error> {
        let statement = self.sql.held(ids.len(), live);
        let held: Vec<MessageId> = sqlx::query_scalar(&statement)
            .bind_ids(ids)
            .bind(owner)
            .fetch_all(conn)
            .await?;
        Ok(ids.only(held))
    }

    pub(super) async fn held_attempts_of(
        &self,
        ids: &SortedIds,
        owner: &str,
    ) -> StorageResult<Vec<(MessageId, u32)>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let statement = self.sql.held_attempts(ids.len());
        let rows: Vec<(MessageId, i64)> = sqlx::query_as(&statement)
            .bind_ids(ids)
            .bind(owner)
            .fetch_all(&self.conn.pool)
            .await
            .map_err(self.conn.error("held_attempts"))?;
        Ok(rows
            .into_iter()
            .map(|(id, attempts)| (id, crate::storage::rows::attempts(attempts)))
            .collect())
    }

    pub(super) async fn dead_letter_held(
        &self,
        id: MessageId,
        owner: &str,
        error: &str,
    ) -> StorageResult<bool> {
        let statement = self.sql.dead_letter();
        let done = self
            .conn
            .retrying("dead-letter", || {
                sqlx::query(&statement)
                    .bind(error)
                    .bind(id)
                    .bind(owner)
                    .execute(&self.conn.pool)
            })
            .await?;
        Ok(done.rows_affected() == 1)
    }

    pub(super) async fn nack_each(
        &self,
        nacks: &[NackRequest<'_>],
        owner: &str,
        policy: &dyn RetryPolicy,
    ) -> StorageResult<Vec<NackResult>> {
        // A transaction per nack: each holds its row and its key's later rows locked,
        // and a batch in one would hold them all until the last.
        let mut results = Vec::with_capacity(nacks.len());
        for nack in nacks {
            let result = self
                .conn
                .retrying("nack", || self.nack_once(nack, owner, policy))
                .await?;
            results.push(result);
        }
        Ok(results)
    }

    pub(super) async fn ack_once(
        &self,
        ids: &SortedIds,
        owner: &str,
    ) -> Result<SortedIds, sqlx::Error> {
        if ids.is_empty() {
            return Ok(SortedIds::default());
        }
        let mut tx = self.conn.pool.begin().await?;
        let held = self.held(&mut tx, ids, owner, false).await?;
        if !held.is_empty() {
            let statement = if self.options.delete_on_ack {
                self.sql.ack_delete(held.len())
            } else {
                self.sql.ack(held.len())
            };
            sqlx::query(&statement)
                .bind_ids(&held)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(held)
    }

    /// One nack, in a transaction of its own.
    pub(super) async fn nack_once(
        &self,
        nack: &NackRequest<'_>,
        owner: &str,
        policy: &dyn RetryPolicy,
    ) -> Result<NackResult, sqlx::Error> {
        let NackRequest {
            id,
            error,
            requested_delay,
        } = *nack;
        let mut tx = self.conn.pool.begin().await?;
        let held = sqlx::query(&self.sql.nack_select())
            .bind(id)
            .bind(owner)
            .fetch_optional(&mut *tx)
            .await?;
        let Some(held) = held else {
            return Ok(NackResult::Fenced);
        };
        let stored_attempts: i64 = held.try_get("attempts")?;
        let key = convert::text(&held, "key")?;
        let now = now(&mut tx).await?;

        let decision = policy.on_failure(attempts(stored_attempts), requested_delay);
        // When the later rows of the key become claimable: the retry time, or now.
        let successors_at = match decision {
            FailureDecision::RetryAfter(delay) => {
                let retry_at = after(now, delay);
                sqlx::query(&self.sql.nack_retry())
                    .bind(retry_at)
                    .bind(error)
                    .bind(id)
                    .execute(&mut *tx)
                    .await?;
                retry_at
            }
            FailureDecision::DeadLetter => {
                sqlx::query(&self.sql.nack_dead())
                    .bind(now)
                    .bind(error)
                    .bind(id)
                    .execute(&mut *tx)
                    .await?;
                now
            }
        };
        let successors: Vec<MessageId> = match key {
            Some(key) => {
                sqlx::query_scalar(&self.sql.successors_select())
                    .bind(key)
                    .bind(id)
                    .bind(owner)
                    .fetch_all(&mut *tx)
                    .await?
            }
            None => Vec::new(),
        };
        let released = if successors.is_empty() {
            successors
        } else {
            let successors = SortedIds::from(successors);
            self.held(&mut tx, &successors, owner, false)
                .await?
                .into_vec()
        };
        if !released.is_empty() {
            let statement = self.sql.release_at(released.len());
            sqlx::query(&statement)
                .bind(successors_at)
                .bind_ids(&released)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(NackResult::applied(decision, successors_at, released))
    }

    pub(super) async fn release_once(
        &self,
        ids: &SortedIds,
        owner: &str,
        delay: Duration,
    ) -> Result<SortedIds, sqlx::Error> {
        if ids.is_empty() {
            return Ok(SortedIds::default());
        }
        let mut tx = self.conn.pool.begin().await?;
        let held = self.held(&mut tx, ids, owner, !delay.is_zero()).await?;
        if !held.is_empty() {
            let statement = self.sql.release_after(held.len());
            sqlx::query(&statement)
                .bind(micros(delay))
                .bind_ids(&held)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(held)
    }

    pub(super) async fn extend_lease_once(
        &self,
        ids: &SortedIds,
        owner: &str,
        lease: Duration,
    ) -> Result<Extended, sqlx::Error> {
        let mut tx = self.conn.pool.begin().await?;
        let held = if ids.is_empty() {
            SortedIds::default()
        } else {
            self.held(&mut tx, ids, owner, true).await?
        };
        let lease_expires_at = after(now(&mut tx).await?, lease);
        if !held.is_empty() {
            let statement = self.sql.extend_lease(held.len());
            sqlx::query(&statement)
                .bind(lease_expires_at)
                .bind_ids(&held)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(Extended {
            ids: held,
            lease_expires_at,
        })
    }

    pub(super) async fn return_leases_once(
        &self,
        ids: &SortedIds,
        owner: &str,
    ) -> Result<u64, sqlx::Error> {
        if ids.is_empty() {
            return Ok(0);
        }
        let statement = self.sql.return_leases(ids.len());
        let done = sqlx::query(&statement)
            .bind_ids(ids)
            .bind(owner)
            .execute(&self.conn.pool)
            .await?;
        Ok(done.rows_affected())
    }
}
