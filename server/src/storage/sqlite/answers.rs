//! The answers of a lease holder: ack, nack, release, dead-letter, lease extension, and
//! the leases of a subscriber that went away given back. Each is one `UPDATE ...
//! RETURNING` on the writer, fenced by [`Statements::held`]; a batch of nacks is one
//! write transaction, each nack a read, a write, and the later rows of its key given back.
//!
//! An answer naming no rows needs no check here: the relay answers it without a storage
//! call (`relay/answers.rs`), and a statement given an empty JSON list changes nothing.

use std::time::Duration;

use super::convert::{after, datetime, json_list, now_ms};
use super::shape::Statements;
use super::SqliteStorage;
use crate::storage::rows::attempts;
use crate::storage::{
    Extended, FailureDecision, MessageId, NackRequest, NackResult, RetryPolicy, SortedIds,
    StorageResult,
};

impl Statements {
    /// `(id, attempts)` of the held rows (see [`Statements::held`]), in id order.
    pub fn held_attempts(&self) -> String {
        self.fill("SELECT {id}, {attempts} FROM {t} {held} ORDER BY {id}", &[])
    }

    /// `?3` now.
    pub fn ack(&self) -> String {
        self.fill(
            "UPDATE {t} SET {status} = 'done', {processed_at} = ?3, {leased_by} = NULL \
             {held} RETURNING {id}",
            &[],
        )
    }

    pub fn ack_delete(&self) -> String {
        self.fill("DELETE FROM {t} {held} RETURNING {id}", &[])
    }

    /// `?1` id, `?2` owner, `?3` now: a nack needs a live lease (docs/guarantees.md).
    pub fn nack_select(&self) -> String {
        self.fill(
            "SELECT {attempts}, {key} FROM {t} \
             WHERE {id} = ?1 AND {leased_by} = ?2 AND {status} = 'pending' \
             AND {available_at} > ?3",
            &[],
        )
    }

    /// `?1` id, `?2` retry time, `?3` error. The row is known to be held by the owner
    /// ([`Statements::nack_select`], same transaction).
    pub fn nack_retry(&self) -> String {
        self.fill(
            "UPDATE {t} SET {available_at} = ?2, {last_error} = ?3, {leased_by} = NULL \
             WHERE {id} = ?1",
            &[],
        )
    }

    /// `?1` id, `?2` now, `?3` error, as [`Statements::nack_retry`].
    pub fn nack_dead(&self) -> String {
        self.fill(
            "UPDATE {t} SET {status} = 'dead', {processed_at} = ?2, {last_error} = ?3, \
             {leased_by} = NULL WHERE {id} = ?1",
            &[],
        )
    }

    /// `?1` key, `?2` the nacked id, `?3` owner, `?4` when they are due.
    pub fn release_successors(&self) -> String {
        self.give_back(
            "?4",
            "WHERE {key} = ?1 AND {id} > ?2 AND {leased_by} = ?3 AND {status} = 'pending'",
        )
    }

    /// `?3` when they are due, `?4` now: a delayed release needs a live lease.
    pub fn release(&self) -> String {
        self.give_back("?3", "{held} AND ({available_at} > ?4 OR ?3 <= ?4)")
    }

    /// Gives the rows `selected` back untried, due at `due`, returning their ids.
    fn give_back(&self, due: &str, selected: &str) -> String {
        let selected = self.fill(selected, &[]);
        self.fill(
            "UPDATE {t} SET {attempts} = MAX({attempts} - 1, 0), {available_at} = {due}, \
             {leased_by} = NULL {selected} RETURNING {id}",
            &[("due", &due), ("selected", &selected)],
        )
    }

    /// `?1` id, `?2` owner, `?3` error, `?4` now.
    pub fn dead_letter(&self) -> String {
        self.fill(
            "UPDATE {t} SET {status} = 'dead', {processed_at} = ?4, {last_error} = ?3, \
             {leased_by} = NULL \
             WHERE {id} = ?1 AND {leased_by} = ?2 AND {status} = 'pending' RETURNING {id}",
            &[],
        )
    }

    /// `?3` the new deadline, `?4` now: an extension needs a live lease.
    pub fn extend_lease(&self) -> String {
        self.fill(
            "UPDATE {t} SET {available_at} = ?3 {held} AND {available_at} > ?4 RETURNING {id}",
            &[],
        )
    }

    /// `?3` now.
    pub fn return_leases(&self) -> String {
        self.fill(
            "UPDATE {t} SET {leased_by} = NULL, {available_at} = ?3 {held}",
            &[],
        )
    }
}

impl SqliteStorage {
    pub(super) async fn held_attempts_of(
        &self,
        ids: &SortedIds,
        owner: &str,
    ) -> StorageResult<Vec<(MessageId, u32)>> {
        let rows: Vec<(MessageId, i64)> = sqlx::query_as(&self.sql.held_attempts())
            .bind(json_list(ids.as_slice()))
            .bind(owner)
            .fetch_all(&self.pools.reader)
            .await
            .map_err(self.error("held_attempts"))?;
        Ok(rows
            .into_iter()
            .map(|(id, stored)| (id, attempts(stored)))
            .collect())
    }

    pub(super) async fn ack_held(&self, ids: &SortedIds, owner: &str) -> StorageResult<SortedIds> {
        let statement = if self.options.delete_on_ack {
            self.sql.ack_delete()
        } else {
            self.sql.ack()
        };
        let mut conn = self.writer("ack").await?;
        let mut query = sqlx::query_scalar(&statement)
            .bind(json_list(ids.as_slice()))
            .bind(owner);
        if !self.options.delete_on_ack {
            query = query.bind(now_ms());
        }
        let applied: Vec<MessageId> = query
            .fetch_all(&mut *conn)
            .await
            .map_err(self.error("ack"))?;
        Ok(ids.only(applied))
    }

    pub(super) async fn nack_held(
        &self,
        nacks: &[NackRequest<'_>],
        owner: &str,
        policy: &dyn RetryPolicy,
    ) -> StorageResult<Vec<NackResult>> {
        // One write transaction for the batch; each nack sees what the ones before it did.
        let mut tx = self.begin_immediate("nack").await?;
        let mut results = Vec::with_capacity(nacks.len());
        for nack in nacks {
            results.push(self.nack_in(&mut tx, nack, owner, policy).await?);
        }
        tx.commit().await.map_err(self.error("nack"))?;
        Ok(results)
    }

    pub(super) async fn release_held(
        &self,
        ids: &SortedIds,
        owner: &str,
        delay: Duration,
    ) -> StorageResult<SortedIds> {
        let mut conn = self.writer("release").await?;
        let now = now_ms();
        let applied: Vec<MessageId> = sqlx::query_scalar(&self.sql.release())
            .bind(json_list(ids.as_slice()))
            .bind(owner)
            .bind(after(now, delay))
            .bind(now)
            .fetch_all(&mut *conn)
            .await
            .map_err(self.error("release"))?;
        Ok(ids.only(applied))
    }

    pub(super) async fn dead_letter_held(
        &self,
        id: MessageId,
        owner: &str,
        error: &str,
    ) -> StorageResult<bool> {
        let mut conn = self.writer("dead-letter").await?;
        let applied: Option<MessageId> = sqlx::query_scalar(&self.sql.dead_letter())
            .bind(id)
            .bind(owner)
            .bind(error)
            .bind(now_ms())
            .fetch_optional(&mut *conn)
            .await
            .map_err(self.error("dead-letter"))?;
        Ok(applied.is_some())
    }

    pub(super) async fn extend_held(
        &self,
        ids: &SortedIds,
        owner: &str,
        lease: Duration,
    ) -> StorageResult<Extended> {
        let err = || self.error("extend lease");
        if ids.is_empty() {
            let lease_expires_at = datetime(after(now_ms(), lease)).map_err(err())?;
            return Ok(Extended {
                ids: SortedIds::default(),
                lease_expires_at,
            });
        }
        let mut conn = self.writer("extend lease").await?;
        let now = now_ms();
        let until = after(now, lease);
        let extended: Vec<MessageId> = sqlx::query_scalar(&self.sql.extend_lease())
            .bind(json_list(ids.as_slice()))
            .bind(owner)
            .bind(until)
            .bind(now)
            .fetch_all(&mut *conn)
            .await
            .map_err(err())?;
        Ok(Extended {
            ids: ids.only(extended),
            lease_expires_at: datetime(until).map_err(err())?,
        })
    }

    pub(super) async fn return_held(&self, ids: &SortedIds, owner: &str) -> StorageResult<u64> {
        let mut conn = self.writer("return leases").await?;
        let done = sqlx::query(&self.sql.return_leases())
            .bind(json_list(ids.as_slice()))
            .bind(owner)
            .bind(now_ms())
            .execute(&mut *conn)
            .await
            .map_err(self.error("return leases"))?;
        Ok(done.rows_affected())
    }

    /// One nack of a batch, inside the batch's write transaction.
    pub(super) async fn nack_in(
        &self,
        tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>,
        nack: &NackRequest<'_>,
        owner: &str,
        policy: &dyn RetryPolicy,
    ) -> StorageResult<NackResult> {
        let err = || self.error("nack");
        let now = now_ms();
        let held: Option<(i64, Option<String>)> = sqlx::query_as(&self.sql.nack_select())
            .bind(nack.id)
            .bind(owner)
            .bind(now)
            .fetch_optional(&mut **tx)
            .await
            .map_err(err())?;
        let Some((stored_attempts, key)) = held else {
            return Ok(NackResult::Fenced);
        };

        let decision = policy.on_failure(attempts(stored_attempts), nack.requested_delay);
        // When the later rows of the key become claimable: the retry time, or now.
        let successors_at = match decision {
            FailureDecision::RetryAfter(delay) => {
                let retry_at = after(now, delay);
                sqlx::query(&self.sql.nack_retry())
                    .bind(nack.id)
                    .bind(retry_at)
                    .bind(nack.error)
                    .execute(&mut **tx)
                    .await
                    .map_err(err())?;
                retry_at
            }
            FailureDecision::DeadLetter => {
                sqlx::query(&self.sql.nack_dead())
                    .bind(nack.id)
                    .bind(now)
                    .bind(nack.error)
                    .execute(&mut **tx)
                    .await
                    .map_err(err())?;
                now
            }
        };
        let released = match key {
            Some(key) => sqlx::query_scalar(&self.sql.release_successors())
                .bind(key)
                .bind(nack.id)
                .bind(owner)
                .bind(successors_at)
                .fetch_all(&mut **tx)
                .await
                .map_err(err())?,
            None => Vec::new(),
        };
        let at = datetime(successors_at).map_err(err())?;
        let released = SortedIds::from(released).into_vec();
        Ok(NackResult::applied(decision, at, released))
    }
}
