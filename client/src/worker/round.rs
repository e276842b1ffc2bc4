//! One round of a [`Worker`]: publishing the claimed groups concurrently, answering
//! every message, and extending the leases of what is not answered yet.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Mutex;
use tracing::Instrument;

use crate::connect::Connection;
use tokio::time::{interval_at, Instant, MissedTickBehavior};

use super::{RoundResult, Worker};
use crate::events::{Count, Event};
use crate::message::system_time;
use crate::proto::v1::relay_client::RelayClient;
use crate::proto::v1::{self, NackOutcome};
use crate::{Message, PublishError};

pub(super) struct RoundState {
    pub result: RoundResult,
    /// Claimed and not answered yet: their leases are extended.
    pub unanswered: BTreeSet<i64>,
    /// Leases an extension found gone: do not publish them.
    pub lost: HashSet<i64>,
    /// Each claimed message's lease token, sent back with its answers
    /// (docs/lease-tokens.md).
    pub lease_tokens: HashMap<i64, String>,
}

pub(super) struct Round<'w> {
    pub worker: &'w Worker,
    pub client: RelayClient<Connection>,
    pub state: Mutex<RoundState>,
}

impl Round<'_> {
    pub fn result(&self) -> RoundResult {
        self.state.lock().unwrap().result
    }

    fn update(&self, change: impl FnOnce(&mut RoundState)) {
        change(&mut self.state.lock().unwrap());
    }

    /// The lease tokens of `ids`, one per id in order; none at all when one is missing (a
    /// server from before tokens), since the server takes one per id or none.
    fn tokens_of(&self, ids: &[i64]) -> Vec<String> {
        let state = self.state.lock().unwrap();
        ids.iter()
            .map(|id| state.lease_tokens.get(id).cloned())
            .collect::<Option<Vec<_>>>()
            .unwrap_or_default()
    }

    fn token_of(&self, id: i64) -> String {
        self.tokens_of(&[id]).pop().unwrap_or_default()
    }

    fn answered(&self, ids: &[i64]) {
        self.update(|s| {
            for id in ids {
                s.unanswered.remove(id);
            }
        });
    }

    /// Publishes one key's messages in order; stops at the first failure or lost lease.
    pub async fn publish_group(&self, group: Vec<Message>) {
        let worker = self.worker;
        for (index, message) in group.iter().enumerate() {
            let rest = &group[index + 1..];
            if self.state.lock().unwrap().lost.contains(&message.id) {
                self.lease_lost(message.id);
                self.give_back(message.id, rest).await;
                return;
            }
            let started = Instant::now();
            let timeout = worker.config.publish_timeout;
            let mut traced = message.clone();
            let span = crate::trace_context::publish_span(&mut traced);
            let publish = worker.publisher.publish(&traced).instrument(span);
            let result = tokio::time::timeout(timeout, publish)
                .await
                .unwrap_or_else(|_| Err(PublishError::timed_out(timeout)));
            if let Err(error) = result {
                self.fail(message, error, rest).await;
                return;
            }
            worker.reporter.add(Count::Published, 1);
            worker.reporter.emit(Event::Published {
                id: message.id,
                topic: message.topic.clone(),
                key: message.key.clone(),
                attempts: message.attempts,
                elapsed: started.elapsed(),
            });
            // Acked before the next of the key starts: if the ack were fenced, this
            // message comes back, and the next one must not overtake it.
            let acked = self.call(
                |mut c, r| async move { c.ack(r).await },
                v1::AckRequest {
                    outbox: worker.config.outbox.clone(),
                    worker_id: worker.config.worker_id.clone(),
                    ids: vec![message.id],
                    lease_tokens: self.tokens_of(&[message.id]),
                },
            );
            match acked.await {
                Some(response) if response.acked.contains(&message.id) => {
                    self.answered(&[message.id]);
                    worker.reporter.add(Count::Acked, 1);
                    self.update(|s| s.result.published += 1);
                }
                Some(_) => {
                    self.lease_lost(message.id);
                    self.give_back(message.id, rest).await;
                    return;
                }
                None => {
                    self.unreported(message.id, rest);
                    return;
                }
            }
        }
    }

    async fn fail(&self, message: &Message, error: PublishError, rest: &[Message]) {
        let worker = self.worker;
        let config = &worker.config;
        // The server refuses a NUL in an error text (the database cannot store one).
        let text = error.text().replace('\0', "\u{FFFD}");
        tracing::info!(id = message.id, error = %text, permanent = error.is_permanent(), "publish failed");
        if error.is_permanent() {
            let request = v1::DeadLetterRequest {
                outbox: config.outbox.clone(),
                worker_id: config.worker_id.clone(),
                id: message.id,
                error: text.clone(),
                lease_token: self.token_of(message.id),
            };
            match self
                .call(|mut c, r| async move { c.dead_letter(r).await }, request)
                .await
            {
                Some(response) if response.dead_lettered => {
                    self.answered(&[message.id]);
                    self.dead_lettered(message, text);
                }
                Some(_) => self.lease_lost(message.id),
                None => return self.unreported(message.id, rest),
            }
            self.give_back(message.id, rest).await;
            return;
        }
        let request = v1::NackRequest {
            outbox: config.outbox.clone(),
            worker_id: config.worker_id.clone(),
            id: message.id,
            error: text.clone(),
            retry_delay_ms: error.retry_delay().map(|d| d.as_millis() as u64),
            lease_token: self.token_of(message.id),
        };
        let Some(response) = self
            .call(|mut c, r| async move { c.nack(r).await }, request)
            .await
        else {
            return self.unreported(message.id, rest);
        };
        match response.outcome() {
            NackOutcome::RetryScheduled => {
                worker.reporter.add(Count::Retried, 1);
                worker.reporter.emit(Event::Retried {
                    id: message.id,
                    key: message.key.clone(),
                    error: text,
                    retry_at: response.retry_at.and_then(system_time),
                });
                self.update(|s| s.result.retried += 1);
            }
            NackOutcome::DeadLettered => self.dead_lettered(message, text),
            NackOutcome::Fenced | NackOutcome::Unspecified => {
                self.lease_lost(message.id);
                // Fenced: the server released nothing for us.
                self.give_back(message.id, rest).await;
                return;
            }
        }
        self.answered(&[message.id]);
        // The server released the rest of the key with the nack.
        let rest_ids: Vec<i64> = rest.iter().map(|m| m.id).collect();
        self.answered(&rest_ids);
        self.blocked(message.id, rest);
    }

    fn dead_lettered(&self, message: &Message, error: String) {
        self.worker.reporter.add(Count::DeadLettered, 1);
        self.worker.reporter.emit(Event::DeadLettered {
            id: message.id,
            key: message.key.clone(),
            error,
        });
        self.update(|s| s.result.dead_lettered += 1);
    }

    fn lease_lost(&self, id: i64) {
        self.worker.reporter.add(Count::LeaseLost, 1);
        self.worker.reporter.emit(Event::LeaseLost { id });
        self.answered(&[id]);
        self.update(|s| s.result.lost += 1);
    }

    /// The outcome of `id` could not be reported; it and the rest of its key wait for
    /// their leases to run out.
    fn unreported(&self, id: i64, rest: &[Message]) {
        let mut ids = vec![id];
        ids.extend(rest.iter().map(|m| m.id));
        self.answered(&ids);
        self.update(|s| s.result.lost += ids.len());
    }

    fn blocked(&self, behind: i64, rest: &[Message]) {
        let reporter = &self.worker.reporter;
        reporter.add(Count::Blocked, rest.len());
        for message in rest {
            reporter.emit(Event::Blocked {
                id: message.id,
                key: message.key.clone(),
                behind,
            });
        }
        self.update(|s| s.result.blocked += rest.len());
    }

    /// Gives back the rest of a key untried, behind `behind`.
    async fn give_back(&self, behind: i64, rest: &[Message]) {
        if rest.is_empty() {
            return;
        }
        let ids: Vec<i64> = rest.iter().map(|m| m.id).collect();
        self.answered(&ids);
        let request = v1::ReleaseRequest {
            outbox: self.worker.config.outbox.clone(),
            worker_id: self.worker.config.worker_id.clone(),
            lease_tokens: self.tokens_of(&ids),
            ids,
            retry_delay_ms: None,
        };
        match self
            .call(|mut c, r| async move { c.release(r).await }, request)
            .await
        {
            Some(_) => self.blocked(behind, rest),
            None => self.update(|s| s.result.lost += rest.len()),
        }
    }

    /// Extends the leases of unanswered messages every quarter lease, while allowed.
    pub async fn extend_leases(&self, claimed_at: Instant) {
        let config = &self.worker.config;
        let lease = config.lease;
        let limit = claimed_at + lease + config.max_lease_extension;
        let mut deadline = claimed_at + lease;
        let period = lease / 4;
        let mut ticker = interval_at(claimed_at + period, period);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            let now = Instant::now();
            if deadline > now + lease / 2 || now + lease > limit {
                continue;
            }
            let ids: Vec<i64> = self
                .state
                .lock()
                .unwrap()
                .unanswered
                .iter()
                .copied()
                .collect();
            if ids.is_empty() {
                continue;
            }
            let request = v1::ExtendLeaseRequest {
                outbox: config.outbox.clone(),
                worker_id: config.worker_id.clone(),
                lease_tokens: self.tokens_of(&ids),
                ids,
                lease_ms: lease.as_millis() as u64,
            };
            if let Some(response) = self
                .call(|mut c, r| async move { c.extend_lease(r).await }, request)
                .await
            {
                deadline = now + lease;
                self.worker
                    .reporter
                    .add(Count::LeaseExtensions, response.extended.len());
                self.update(|s| s.lost.extend(response.fenced));
            }
        }
    }

    /// Makes one bookkeeping call; `None` (logged) when it fails.
    async fn call<Req, Resp, F, Fut>(&self, call: F, request: Req) -> Option<Resp>
    where
        F: FnOnce(RelayClient<Connection>, Req) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<Resp>, tonic::Status>>,
    {
        match call(self.client.clone(), request).await {
            Ok(response) => Some(response.into_inner()),
            Err(status) => {
                tracing::warn!(%status, "bookkeeping call failed; the lease will bring the message back");
                self.worker.forget_channel();
                None
            }
        }
    }
}

/// Messages sharing a key form one ordered group; keyless messages are groups of one.
pub(super) fn group_by_key(messages: Vec<Message>) -> Vec<Vec<Message>> {
    let mut groups: Vec<Vec<Message>> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    for message in messages {
        match message.key.clone() {
            None => groups.push(vec![message]),
            Some(key) => match index.get(&key) {
                Some(&i) => groups[i].push(message),
                None => {
                    index.insert(key, groups.len());
                    groups.push(vec![message]);
                }
            },
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_keep_first_seen_order_and_id_order_within() {
        let m = |id, key: Option<&str>| {
            let message = Message::new(id, "t", "p");
            match key {
                Some(k) => message.with_key(k),
                None => message,
            }
        };
        let groups = group_by_key(vec![
            m(1, Some("a")),
            m(2, None),
            m(3, Some("b")),
            m(4, Some("a")),
            m(5, None),
        ]);
        let ids: Vec<Vec<i64>> = groups
            .iter()
            .map(|g| g.iter().map(|m| m.id).collect())
            .collect();
        assert_eq!(ids, vec![vec![1, 4], vec![2], vec![3], vec![5]]);
    }
}
