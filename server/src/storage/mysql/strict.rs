//! Strict ordering without a lock: once a claim has locked its candidates, a fresh
//! statement drops every candidate that has an earlier pending row of its key outside
//! the batch ([`Statements::claim_successors`]). The claim's scan already leaves out most
//! of them (its pre-filter, [`Statements::claim_candidates`]); this is what makes the
//! guarantee hold across concurrent claimers.

use sqlx::mysql::MySqlConnection;

use super::claim::ClaimShape;
use super::convert::BindIds;
use super::shape::{placeholders, Statements};
use super::MySqlStorage;
use crate::storage::{MessageId, OutboxMessage};

impl Statements {
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
        // With `dead_holds_key` an earlier dead row holds a row back too: one the scan's
        // pre-filter saw, or one this claim dead-lettered for its attempts.
        let dead = match self.dead_holds_key {
            true => format!(" OR {}", self.table.dead_before("o")),
            false => String::new(),
        };
        self.fill(
            "SELECT CAST(o.{id} AS SIGNED) FROM {t} o WHERE o.{id} IN ({tested}) \
             AND o.{key} IS NOT NULL \
             AND (EXISTS (SELECT 1 FROM {t} p WHERE p.{key} = o.{key} AND p.{id} < o.{id} \
               AND p.{status} = 'pending' AND p.{id} NOT IN ({batch})){dead})",
            &[
                ("tested", &placeholders(tested)),
                ("batch", &placeholders(batch)),
                ("dead", &dead),
            ],
        )
    }

    /// The pre-filter of strict ordering in a claim's scan (see
    /// [`Statements::claim_candidates`]): an earlier pending row of the key holds a row
    /// back unless this very claim can take it. Parameters: `now`, then, as the claim's
    /// shape has them, `visible_before`, the topics and the paused topics.
    pub fn claim_held_back(&self, shape: &ClaimShape) -> String {
        let blocked = self.fill("p.{available_at} > ?", &[])
            + &self.shape_filters(
                "p.",
                shape,
                [
                    " OR p.{created_at} > ?",
                    " OR {topic} NOT IN ({topics})",
                    " OR {topic} IN ({topics})",
                ],
            );
        self.table
            .no_earlier_blocking(&blocked, self.dead_holds_key)
    }
}

impl MySqlStorage {
    /// Which of the locked `fresh` rows have an earlier pending row of their key outside
    /// the batch (`kept` plus `fresh`); see [`Statements::claim_successors`].
    pub(super) async fn held_back(
        &self,
        conn: &mut MySqlConnection,
        fresh: &[OutboxMessage],
        kept: &[OutboxMessage],
    ) -> Result<Vec<MessageId>, sqlx::Error> {
        let keyed: Vec<MessageId> = fresh
            .iter()
            .filter(|m| m.key.is_some())
            .map(|m| m.id)
            .collect();
        if keyed.is_empty() {
            return Ok(Vec::new());
        }
        let statement = self
            .sql
            .claim_successors(keyed.len(), kept.len() + fresh.len());
        let batch = kept.iter().chain(fresh).map(|m| &m.id);
        let held_back: Vec<MessageId> = sqlx::query_scalar(&statement)
            .bind_ids(&keyed)
            .bind_ids(batch)
            .fetch_all(conn)
            .await?;
        if !held_back.is_empty() {
            tracing::debug!(
                held_back = held_back.len(),
                "candidates behind an earlier row of their key"
            );
        }
        Ok(held_back)
    }
}
