//! The claim: due pending rows in id order, leased to their owner in one transaction of
//! rounds of scan, lock, check (see [`MySqlStorage::claim_once`]); with strict ordering
//! each round also drops the rows behind an earlier row of their key (`strict.rs`).

use chrono::{DateTime, Utc};
use sqlx::mysql::MySqlConnection;

use super::convert::{after, decode_candidate, decode_scanned, now, BindIds};
use super::shape::{locking_by_ids, placeholders, Statements};
use super::MySqlStorage;
use crate::storage::{ClaimRequest, Claimed, MessageId, OutboxMessage, TopicFilter};

/// Most scan-lock-check rounds of one claim (see `claim_once`): enough to pass the rows
/// of a stuck claim and the keys it holds, few enough that a claim stays a handful of
/// statements.
const CLAIM_ROUNDS: usize = 4;
/// A round scans this many candidates per row it still wants, and locks the first free
/// ones: concurrent claims see each other's rows as candidates until they commit.
const SCAN_FACTOR: usize = 2;

/// What a claim's candidate scan filters on, besides due pending rows.
pub(super) struct ClaimShape {
    pub strict_ordering: bool,
    pub visibility_delay: bool,
    /// How many topics the filter names; never more than zero for a fixed topic (the
    /// backend decides in Rust whether a filter includes it).
    pub topics: usize,
    /// How many paused topics the claim leaves out (only without a topic filter).
    pub paused_topics: usize,
    /// How many keys an earlier round of the same claim found taken (see
    /// [`Statements::claim_candidates`]).
    pub excluded_keys: usize,
}

impl Statements {
    /// Candidates of a claim: ids and keys of due, pending rows in id order after a given
    /// id, outside the keys an earlier round of the claim found taken. A plain
    /// (consistent) read that locks nothing: [`Statements::claim_lock`] then locks the
    /// ones still free.
    ///
    /// Why not lock here, with `FOR UPDATE SKIP LOCKED` on the scan: InnoDB keeps the
    /// lock of every row a locking scan of a secondary index reads, matching or not
    /// (tested on MariaDB 10.11, READ COMMITTED). The scan walks past the rows other
    /// claimers hold, so a claim stopped between its statements (its replica paused, its
    /// database link cut) held them all, and their holders' acks waited behind it until
    /// their leases ran out. Locking by primary key only keeps the locks of
    /// rows that match.
    ///
    /// Parameters, in order: `now`, the id to scan after; with a visibility delay,
    /// `visible_before`; each topic; each paused topic; each excluded key; with strict
    /// ordering `now`, then `visible_before`, the topics and the paused topics again for
    /// the predecessor test; the row count.
    ///
    /// With strict ordering an earlier pending row of the key holds a row back unless it is
    /// claimable by this very claim (it then comes first in id order and is taken in the
    /// same batch). Not claimable: leased or waiting for a retry, not visible yet or
    /// outside the topic filter. This is a pre-filter that keeps batches full; the
    /// guarantee itself comes from [`Statements::claim_successors`], run after the
    /// candidates are locked.
    ///
    /// The scan is pinned to the `(status, id)` index: it walks pending rows in id order
    /// and stops at the row count. Left to itself the optimizer may pick the primary key
    /// for `ORDER BY id LIMIT` and walk every delivered row too: a claim then costs as
    /// much as the table's whole history.
    pub fn claim_candidates(&self, shape: &ClaimShape) -> String {
        let mut filters = self.shape_filters(
            "o.",
            shape,
            [
                " AND o.{created_at} <= ?",
                " AND {topic} IN ({topics})",
                " AND ({topic} IN ({topics})) IS NOT TRUE",
            ],
        );
        if shape.excluded_keys > 0 {
            filters += &self.fill(
                " AND (o.{key} IS NULL OR o.{key} NOT IN ({keys}))",
                &[("keys", &placeholders(shape.excluded_keys))],
            );
        }
        if shape.strict_ordering {
            filters += &self.claim_held_back(shape);
        }
        self.fill(
            "SELECT CAST(o.{id} AS SIGNED) AS id, o.{key} AS `key` \
             FROM {t} o FORCE INDEX ({pending_index}) \
             WHERE o.{status} = 'pending' AND o.{available_at} <= ? AND o.{id} > ?{filters} \
             ORDER BY o.{id} LIMIT ?",
            &[
                ("pending_index", &self.pending_index),
                ("filters", &filters),
            ],
        )
    }

    /// The filters of a claim that its shape has, each rendered from its template: the
    /// visibility cutoff, the topics, the paused topics (in that order, as they bind).
    /// `{topic}` is the topic of the row `alias` (`o.` or `p.`), `{topics}` a placeholder
    /// per topic.
    pub fn shape_filters(&self, alias: &str, shape: &ClaimShape, templates: [&str; 3]) -> String {
        let topic = self.table.names.topic(alias);
        let counts = [
            usize::from(shape.visibility_delay),
            shape.topics,
            shape.paused_topics,
        ];
        counts
            .into_iter()
            .zip(templates)
            .filter(|(n, _)| *n > 0)
            .map(|(n, template)| {
                self.fill(template, &[("topic", &topic), ("topics", &placeholders(n))])
            })
            .collect()
    }

    /// Locks the first `?` (after the ids and `?` now) of `n` candidates that are still due and
    /// pending and that no other transaction holds, in id order, under the relay's own
    /// column names (what [`super::convert::decode_candidate`] reads). Lookups by primary
    /// key: a row that no longer matches is not kept locked.
    pub fn claim_lock(&self, n: usize) -> String {
        self.fill(
            "SELECT {message} FROM {t} o {by_id} \
             AND o.{status} = 'pending' AND o.{available_at} <= ? \
             ORDER BY o.{id} LIMIT ? FOR UPDATE SKIP LOCKED",
            &[
                ("message", &self.message()),
                (
                    "by_id",
                    &locking_by_ids(&format!("o.{}", self.table.names.id), n),
                ),
            ],
        )
    }

    /// Leases `n` locked rows: `?` owner, `?` lease deadline, then the ids.
    pub fn claim_update(&self, n: usize) -> String {
        self.fill(
            "UPDATE {t} SET {leased_by} = ?, {attempts} = {attempts} + 1, \
             {available_at} = ? WHERE {id} IN ({ids})",
            &[("ids", &placeholders(n))],
        )
    }

    /// Dead-letters `n` locked candidates of a claim that were claimed `max_attempts`
    /// times already (`?` now, `?` max attempts, then the ids); the reason goes into
    /// `last_error`, before the error the row had.
    pub fn exhaust(&self, n: usize) -> String {
        self.fill(
            "UPDATE {t} SET {status} = 'dead', {processed_at} = ?, {leased_by} = NULL, \
             {last_error} = CONCAT('claimed ', {attempts}, \
               ' times without an answer (max_attempts = ', ?, ')', \
               COALESCE(CONCAT('; last error: ', {last_error}), '')) \
             WHERE {id} IN ({ids})",
            &[("ids", &placeholders(n))],
        )
    }
}

/// What the rounds of one claim took so far.
#[derive(Default)]
struct Taken {
    messages: Vec<OutboxMessage>,
    /// Rows dead-lettered for having used their attempts.
    exhausted: Vec<MessageId>,
    /// With strict ordering, keys whose rows this claim scanned but did not keep: later
    /// rounds leave them out.
    keys: Vec<String>,
    /// The last id a round looked at: the next one scans after it.
    scanned_to: MessageId,
}

impl MySqlStorage {
    pub(super) async fn claim_once(
        &self,
        request: &ClaimRequest<'_>,
    ) -> Result<Claimed, sqlx::Error> {
        let mut tx = self.conn.pool.begin().await?;
        let now = now(&mut tx).await?;
        let lease_expires_at = after(now, request.lease);
        let Some(filter) = TopicFilter::of(request, &self.options.columns.topic) else {
            tx.commit().await?;
            return Ok(Claimed {
                exhausted: Vec::new(),
                messages: Vec::new(),
                lease_expires_at,
            });
        };
        let taken = self.claim_rounds(&mut tx, request, &filter, now).await?;
        if !taken.messages.is_empty() {
            let statement = self.sql.claim_update(taken.messages.len());
            sqlx::query(&statement)
                .bind(request.owner)
                .bind(lease_expires_at)
                .bind_ids(taken.messages.iter().map(|m| &m.id))
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(Claimed {
            exhausted: taken.exhausted,
            messages: taken.messages,
            lease_expires_at,
        })
    }

    /// Rounds of scan, lock, check: a round that takes less than it scanned (rows another
    /// transaction holds locked, or behind an earlier row of their key outside the batch)
    /// goes on past what it scanned, without the keys it found taken, so another claim
    /// stuck on a few keys' heads does not fill every batch with rows of those keys.
    /// Bounded by `CLAIM_ROUNDS`.
    async fn claim_rounds(
        &self,
        tx: &mut MySqlConnection,
        request: &ClaimRequest<'_>,
        filter: &TopicFilter<'_>,
        now: DateTime<Utc>,
    ) -> Result<Taken, sqlx::Error> {
        let strict = self.options.strict_ordering;
        let batch_size = request.batch_size as usize;
        let mut taken = Taken::default();
        for _ in 0..CLAIM_ROUNDS {
            let wanted = batch_size - taken.messages.len();
            let candidates = self.scan(tx, filter, &taken, now, wanted).await?;
            let Some(&(last, _)) = candidates.last() else {
                break;
            };
            let locked = self.lock_candidates(tx, &candidates, now, wanted).await?;
            // Candidates after the last locked one were not looked at when the lock
            // stopped at `wanted`.
            let examined = match locked.last() {
                Some(m) if locked.len() == wanted => m.id,
                _ => last,
            };
            taken.scanned_to = examined;
            let candidates: Vec<_> = candidates
                .into_iter()
                .filter(|(id, _)| *id <= examined)
                .collect();
            // Claimed `max_attempts` times already, never answered: dead, not handed out.
            let (dead, mut fresh): (Vec<_>, Vec<_>) = locked
                .into_iter()
                .partition(|m| m.attempts > request.max_attempts);
            let dead = self.dying(&dead);
            self.exhaust(tx, &dead, now, request.max_attempts).await?;
            taken.exhausted.extend(dead);

            if strict {
                let held_back = self.held_back(tx, &fresh, &taken.messages).await?;
                fresh.retain(|m| !held_back.contains(&m.id));
            }
            // What was scanned but not kept: its key is taken for this claim. (Without
            // strict ordering a key holds nothing back: only the scan moves on.)
            for (id, key) in candidates.iter().filter(|_| strict) {
                let kept = fresh.iter().any(|m| m.id == *id) || taken.exhausted.contains(id);
                if let (false, Some(key)) = (kept, key) {
                    if !taken.keys.contains(key) {
                        taken.keys.push(key.clone());
                    }
                }
            }
            taken.messages.extend(fresh);
            if taken.messages.len() >= batch_size
                || last == examined && candidates.len() < wanted * SCAN_FACTOR
            {
                break;
            }
        }
        Ok(taken)
    }

    /// One round's candidates (see [`Statements::claim_candidates`]): `wanted` times
    /// [`SCAN_FACTOR`] of them at most.
    async fn scan(
        &self,
        tx: &mut MySqlConnection,
        filter: &TopicFilter<'_>,
        taken: &Taken,
        now: DateTime<Utc>,
        wanted: usize,
    ) -> Result<Vec<(MessageId, Option<String>)>, sqlx::Error> {
        let strict = self.options.strict_ordering;
        let delay = !self.options.visibility_delay.is_zero();
        let visible_before = now
            - chrono::Duration::from_std(self.options.visibility_delay)
                .unwrap_or(chrono::Duration::MAX);
        let (topics, paused): (&[String], &[String]) = match filter {
            TopicFilter::Any => (&[], &[]),
            TopicFilter::Only(topics) => (topics, &[]),
            TopicFilter::Except(paused) => (&[], paused),
        };
        let statement = self.sql.claim_candidates(&ClaimShape {
            strict_ordering: strict,
            visibility_delay: delay,
            topics: topics.len(),
            paused_topics: paused.len(),
            excluded_keys: taken.keys.len(),
        });
        let mut query = sqlx::query(&statement).bind(now).bind(taken.scanned_to);
        if delay {
            query = query.bind(visible_before);
        }
        for topic in topics.iter().chain(paused) {
            query = query.bind(topic);
        }
        for key in &taken.keys {
            query = query.bind(key);
        }
        if strict {
            query = query.bind(now);
            if delay {
                query = query.bind(visible_before);
            }
            for topic in topics.iter().chain(paused) {
                query = query.bind(topic);
            }
        }
        query
            .bind((wanted * SCAN_FACTOR) as i64)
            .fetch_all(&mut *tx)
            .await?
            .iter()
            .map(decode_scanned)
            .collect()
    }

    /// Which of the locked rows that used their attempts die now: all of them, but under
    /// `dead_letter_holds_key` only a key's first (the ones behind it wait behind it, and
    /// `held_back` then sees it dead).
    fn dying(&self, dead: &[OutboxMessage]) -> Vec<MessageId> {
        if !self.options.dead_holds_key() {
            return dead.iter().map(|m| m.id).collect();
        }
        let mut keys = Vec::new();
        dead.iter()
            .filter(|m| match &m.key {
                Some(key) if keys.contains(&key) => false,
                Some(key) => {
                    keys.push(key);
                    true
                }
                None => true,
            })
            .map(|m| m.id)
            .collect()
    }

    /// Locks those of `candidates` still claimable (see [`Statements::claim_lock`]).
    async fn lock_candidates(
        &self,
        conn: &mut MySqlConnection,
        candidates: &[(MessageId, Option<String>)],
        now: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<OutboxMessage>, sqlx::Error> {
        let statement = self.sql.claim_lock(candidates.len());
        sqlx::query(&statement)
            .bind_ids(candidates.iter().map(|(id, _)| id))
            .bind(now)
            .bind(limit as i64)
            .fetch_all(conn)
            .await?
            .iter()
            .map(decode_candidate)
            .collect()
    }

    /// Dead-letters locked candidates claimed `max_attempts` times already.
    async fn exhaust(
        &self,
        conn: &mut MySqlConnection,
        ids: &[MessageId],
        now: DateTime<Utc>,
        max_attempts: u32,
    ) -> Result<(), sqlx::Error> {
        if ids.is_empty() {
            return Ok(());
        }
        let statement = self.sql.exhaust(ids.len());
        sqlx::query(&statement)
            .bind(now)
            .bind(i64::from(max_attempts))
            .bind_ids(ids)
            .execute(conn)
            .await?;
        Ok(())
    }
}
