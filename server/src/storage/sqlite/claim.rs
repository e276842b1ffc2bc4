//! The claim: a read probe first (no write lock while idle), then, in one `BEGIN
//! IMMEDIATE`, the rows that used their attempts dead-lettered and the rest leased, each
//! one `UPDATE ... RETURNING` (see the module docs of the backend for the locking).

use sqlx::sqlite::SqliteRow;

use super::convert::{after, before, datetime, decode_messages, json_list, now_ms};
use super::shape::{message, Statements};
use super::SqliteStorage;
use crate::storage::names::Placeholders;
use crate::storage::{
    ClaimRequest, Claimed, MessageId, SortedIds, StorageResult, TopicClause, TopicFilter,
};

impl Statements {
    /// `clause` as this table's statements filter it: a fixed topic is never filtered in
    /// SQL (the backend decides in Rust whether a filter includes it).
    fn filtered(&self, clause: TopicClause) -> TopicClause {
        match self.table.names.topic {
            Some(_) => clause,
            None => TopicClause::Any,
        }
    }

    /// `?1` now, then `?2` topics (a JSON array, taken or, paused, left: see `topics`) and
    /// the visibility cutoff (now minus the delay, when one is configured) as the next
    /// parameter: the rows a claim may
    /// take, in id order. Shared by the claim and its probe, which bind the same prefix.
    /// A fixed topic has no topic filter: the backend decides in Rust whether a filter
    /// includes it (claim everything) or not (claim nothing).
    fn candidates(&self, topics: TopicClause) -> (String, usize) {
        let mut params = Placeholders::starting_at('?', 2);
        let topics_param = (topics != TopicClause::Any).then(|| params.take());
        let except = topics == TopicClause::Except;
        let cutoff_param = self.delayed.then(|| params.take());

        let mut filters = String::new();
        if let Some(p) = &cutoff_param {
            filters += &self.fill(" AND o.{created_at} <= {p}", &[("p", p)]);
        }
        if let Some(p) = &topics_param {
            let topic = self.table.names.topic("");
            filters += &match except {
                true => {
                    format!(" AND (o.{topic} IN (SELECT value FROM json_each({p}))) IS NOT TRUE")
                }
                false => format!(" AND o.{topic} IN (SELECT value FROM json_each({p}))"),
            };
        }
        if self.strict_ordering {
            filters += &self.held_back(cutoff_param.as_deref(), topics_param.as_deref(), except);
        }
        let select = self.fill(
            "SELECT o.{id} FROM {t} o \
             WHERE o.{status} = 'pending' AND o.{available_at} <= ?1{filters} ORDER BY o.{id}",
            &[("filters", &filters)],
        );
        (select, params.next_number())
    }

    /// Whether a claim would find anything: a read, answered without the write lock, so an
    /// idle relay polling the file never stands in a producer's way. Parameters as in
    /// [`Statements::candidates`].
    pub fn probe(&self, topics: TopicClause) -> String {
        let (select, _) = self.candidates(self.filtered(topics));
        format!("SELECT EXISTS ({select} LIMIT 1)")
    }

    /// The parameters of [`Statements::candidates`], then owner, lease deadline, batch size and max
    /// attempts.
    ///
    /// One statement, run under `BEGIN IMMEDIATE` (see the module docs of the backend): SQLite
    /// has one writer at a time per file, so the rows it picks cannot be picked by another
    /// claim, and the strict-ordering predicate sees every earlier claim's result. Rows that
    /// used their attempts are passed over: [`Statements::exhaust`] dead-letters them first.
    pub fn claim(&self, topics: TopicClause) -> String {
        let (select, next) = self.candidates(self.filtered(topics));
        let (owner, lease_until, limit, max_attempts) = (next, next + 1, next + 2, next + 3);
        self.fill(
            "UPDATE {t} SET {leased_by} = ?{owner}, {attempts} = {attempts} + 1, \
               {available_at} = ?{lease_until} \
             WHERE {id} IN ({select} AND o.{attempts} < ?{max_attempts} LIMIT ?{limit}) \
             RETURNING {message}",
            &[
                ("owner", &owner),
                ("lease_until", &lease_until),
                ("select", &select),
                ("max_attempts", &max_attempts),
                ("limit", &limit),
                ("message", &message(&self.table.names, self.max_row_bytes)),
            ],
        )
    }

    /// The parameters of [`Statements::candidates`], then batch size and max attempts: dead-letters the
    /// rows among the next batch a claim would take that were claimed `max_attempts` times
    /// already (their holders never answered), returning their ids. The reason goes into
    /// `last_error`, before the error the row had.
    pub fn exhaust(&self, topics: TopicClause) -> String {
        let (select, next) = self.candidates(self.filtered(topics));
        let (limit, max_attempts) = (next, next + 1);
        let holds = match self.dead_holds_key {
            // Only a key's first used-up row dies: the rows behind it wait behind it,
            // whatever their attempts (the claim that follows sees it dead).
            true => self.fill(
                " AND ({key} IS NULL OR NOT EXISTS (SELECT 1 FROM {t} p \
                 WHERE p.{key} = {t}.{key} AND p.{id} < {t}.{id} AND p.{status} = 'pending' \
                 AND p.{attempts} >= ?{max_attempts}))",
                &[("max_attempts", &max_attempts)],
            ),
            false => String::new(),
        };
        self.fill(
            "UPDATE {t} SET {status} = 'dead', {processed_at} = ?1, {leased_by} = NULL, \
               {last_error} = 'claimed ' || {attempts} || ' times without an answer (max_attempts = ' \
                 || ?{max_attempts} || ')' || coalesce('; last error: ' || {last_error}, '') \
             WHERE {id} IN ({select} LIMIT ?{limit}) AND {attempts} >= ?{max_attempts}{holds} \
             RETURNING {id}",
            &[
                ("select", &select),
                ("limit", &limit),
                ("max_attempts", &max_attempts),
                ("holds", &holds),
            ],
        )
    }
}

impl SqliteStorage {
    /// A claim: a read probe first (no write lock while idle), then the rows that used
    /// their attempts dead-lettered and the rest leased, in one `BEGIN IMMEDIATE`.
    pub(super) async fn claim_rows(&self, request: ClaimRequest<'_>) -> StorageResult<Claimed> {
        let err = || self.error("claim");
        let nothing = |now: i64| {
            Ok(Claimed {
                exhausted: Vec::new(),
                messages: Vec::new(),
                lease_expires_at: datetime(after(now, request.lease)).map_err(err())?,
            })
        };
        let Some(filter) = TopicFilter::of(&request, &self.options.columns.topic) else {
            return nothing(now_ms());
        };
        let clause = filter.clause();
        let topics = filter.topics();
        let topics = (!topics.is_empty()).then(|| json_list(topics));
        let delay = self.options.visibility_delay;

        // The common idle case, answered by a read: no write lock taken.
        let now = now_ms();
        if !self.claimable(clause, topics.as_deref(), now).await? {
            return nothing(now);
        }

        let mut tx = self.begin_immediate("claim").await?;
        let now = now_ms();
        let lease_until = after(now, request.lease);
        let max_attempts = i64::from(request.max_attempts);
        let exhaust = self.sql.exhaust(clause);
        let mut query = sqlx::query_scalar(&exhaust).bind(now);
        if let Some(topics) = &topics {
            query = query.bind(topics.as_str());
        }
        if !delay.is_zero() {
            query = query.bind(before(now, delay));
        }
        let exhausted: Vec<MessageId> = query
            .bind(i64::from(request.batch_size))
            .bind(max_attempts)
            .fetch_all(&mut *tx)
            .await
            .map_err(err())?;
        let statement = self.sql.claim(clause);
        let mut query = sqlx::query(&statement).bind(now);
        if let Some(topics) = &topics {
            query = query.bind(topics.as_str());
        }
        if !delay.is_zero() {
            query = query.bind(before(now, delay));
        }
        let rows: Vec<SqliteRow> = query
            .bind(request.owner)
            .bind(lease_until)
            .bind(i64::from(request.batch_size))
            .bind(max_attempts)
            .fetch_all(&mut *tx)
            .await
            .map_err(err())?;
        // Decoded before the commit: a row that cannot be decoded fails the claim instead
        // of being leased and lost from sight until its lease runs out.
        let messages = decode_messages(rows).map_err(err())?;
        let lease_expires_at = datetime(lease_until).map_err(err())?;
        tx.commit().await.map_err(err())?;
        if !exhausted.is_empty() {
            tracing::warn!(
                ids = ?exhausted,
                max_attempts = request.max_attempts,
                "dead-lettered rows claimed max_attempts times without an answer"
            );
        }
        tracing::debug!(claimed = messages.len(), "claimed");
        Ok(Claimed {
            exhausted: SortedIds::from(exhausted).into_vec(),
            messages,
            lease_expires_at,
        })
    }

    /// Whether a claim at `now` would find anything, read on the reader pool.
    async fn claimable(
        &self,
        clause: TopicClause,
        topics: Option<&str>,
        now: i64,
    ) -> StorageResult<bool> {
        let probe = self.sql.probe(clause);
        let mut query = sqlx::query_scalar(&probe).bind(now);
        if let Some(topics) = topics {
            query = query.bind(topics);
        }
        let delay = self.options.visibility_delay;
        if !delay.is_zero() {
            query = query.bind(before(now, delay));
        }
        query
            .fetch_one(&self.pools.reader)
            .await
            .map_err(self.error("claim"))
    }
}
