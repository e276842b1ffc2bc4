//! One `Subscribe` stream, from `open` to its end: receives batches, runs publishes (one
//! per key at a time, up to `concurrency`; a key's next one starts as soon as the previous
//! publish returned `Ok`, see `dispatch.rs`), answers, extends leases, and on a requested
//! stop finishes what is in flight and gives the rest back untried.
//!
//! Like the server's side of the stream, the loop owns all state: server responses,
//! finished publishes, the lease ticker and the stop signal are events of one `select!`.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument;

use tokio::sync::mpsc;
use tokio::task::{AbortHandle, JoinError, JoinSet};
use tokio::time::{interval_at, Instant, MissedTickBehavior};
use tonic::Streaming;

use super::dispatch::{Dispatch, State};
use super::{Shared, Stop};
use crate::events::{Count, Event};
use crate::message::system_time;
use crate::proto::v1::subscribe_request::Request;
use crate::proto::v1::subscribe_response::Response;
use crate::proto::v1::{self, SubscribeRequest};
use crate::{Message, PublishError};

mod failures;
mod open;

use open::ended_by;
pub(super) use open::open;

/// How a stream ended.
#[derive(Debug)]
pub(super) enum End {
    /// A requested stop completed: do not reconnect.
    Stopped,
    /// The stream broke, ended or could not be opened: reconnect.
    Lost(String),
    /// The server refused in a way reconnecting cannot fix.
    Refused(tonic::Status),
}

/// What a publish task returns.
pub(super) struct Outcome {
    message: Message,
    result: Result<(), PublishError>,
    elapsed: Duration,
}

/// Publishes still running when a stream ended: awaited before the next stream, so a
/// message redelivered there never runs alongside its older self.
pub(super) type Leftovers = JoinSet<Outcome>;

/// An answer sent and not settled yet. The server settles answers in the order sent.
enum Sent {
    Ack,
    Nack {
        id: i64,
        key: Option<String>,
        error: String,
        /// The later messages of its key; the server releases them with the nack.
        blocked: Vec<i64>,
    },
    DeadLetter {
        id: i64,
        key: Option<String>,
        error: String,
    },
    Release {
        /// Given back on stop or drain (counted as released), not behind a failure.
        untried: bool,
    },
    Extend {
        at: Instant,
    },
    /// `set_window(0)` on stop: once settled, no batch we have not seen is on its way.
    CloseWindow,
}

pub(super) struct Session {
    shared: Arc<Shared>,
    /// The server's address, for events.
    pub address: String,
    /// The lease owner the server gave this stream.
    pub owner: String,
    /// The effective lease of every delivered message.
    lease: Duration,
    /// Answers towards the server; `None` once the client has closed its side.
    /// Unbounded so the loop never waits on the network (answers are bounded by the
    /// window anyway).
    requests: Option<mpsc::UnboundedSender<SubscribeRequest>>,
    dispatch: Dispatch,
    sent: VecDeque<Sent>,
    tasks: JoinSet<Outcome>,
    /// Abort handles of running publishes, by message id (to stop one whose lease is lost).
    running: HashMap<i64, AbortHandle>,
    /// Message id of each task, for tasks that end without an outcome (panic, abort).
    task_ids: HashMap<tokio::task::Id, i64>,
    /// Published messages whose ack is not sent yet: sent together after each event, and
    /// before any other answer (the server settles answers in the order sent).
    pending_acks: Vec<i64>,
    /// The lease token of each message held, sent back with its answers so that an answer
    /// applies to that delivery only (docs/lease-tokens.md).
    lease_tokens: HashMap<i64, String>,
    /// The server is shutting down: start nothing new.
    draining: bool,
    /// A stop was requested: start nothing new, then close.
    stopping: bool,
}

impl Session {
    /// Serves the stream until it ends; returns how, and the publishes still running.
    pub async fn run(
        mut self,
        inbound: &mut Streaming<v1::SubscribeResponse>,
        stop: &Stop,
    ) -> (End, Leftovers) {
        let period = self.lease / 4;
        let mut ticker = interval_at(Instant::now() + period, period);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let end = loop {
            self.start_publishes();
            self.flush_acks();
            if self.stopping && self.tasks.is_empty() && self.sent.is_empty() {
                break self.close(inbound, stop).await;
            }
            tokio::select! {
                biased;
                _ = stop.now.cancelled() => break End::Stopped,
                _ = stop.graceful.cancelled(), if !self.stopping => {
                    tracing::info!(owner = %self.owner, publishing = self.tasks.len(), "stopping: finishing publishes in flight");
                    self.stopping = true;
                    // No new batches from here on; the untried messages go back once the
                    // server confirms (batches already on their way are among them).
                    self.send(
                        Request::SetWindow(v1::SetWindow { max_in_flight: 0 }),
                        Sent::CloseWindow,
                    );
                }
                response = inbound.message() => match response {
                    Ok(Some(response)) => {
                        if let Err(problem) = self.on_response(response) {
                            break End::Lost(problem);
                        }
                    }
                    Ok(None) if self.draining => break End::Lost("the server drained the stream".to_owned()),
                    Ok(None) => break End::Lost("the server ended the stream".to_owned()),
                    Err(status) => break ended_by(status),
                },
                Some(joined) = self.tasks.join_next_with_id() => {
                    self.on_joined(joined);
                    // Collect every other finished publish too, so their acks go together.
                    while let Some(joined) = self.tasks.try_join_next_with_id() {
                        self.on_joined(joined);
                    }
                }
                _ = ticker.tick() => self.extend_leases(),
            }
        };
        (end, std::mem::take(&mut self.tasks))
    }

    /// Closes the client side once a stop has finished the publishes in flight and every
    /// answer is settled, and reads the stream to its end.
    ///
    /// The window was closed (`set_window(0)`, settled) before this, and the untried
    /// messages were given back then: no batch can arrive any more, so nothing is claimed
    /// for this stream behind our back and no attempt is burned by the stop.
    async fn close(&mut self, inbound: &mut Streaming<v1::SubscribeResponse>, stop: &Stop) -> End {
        // Normally empty: the untried were given back when the window closed.
        let untried = self.dispatch.take_queued();
        tracing::info!(owner = %self.owner, untried = untried.len(), "closing the stream");
        self.release(untried, true);
        self.requests = None;
        let mut late = 0;
        loop {
            let response = tokio::select! {
                biased;
                _ = stop.now.cancelled() => break,
                response = inbound.message() => response,
            };
            match response {
                Ok(Some(v1::SubscribeResponse {
                    response: Some(Response::Settled(settled)),
                })) => {
                    let _ = self.on_settled(settled);
                }
                Ok(Some(v1::SubscribeResponse {
                    response: Some(Response::Batch(batch)),
                })) => late += batch.messages.len(),
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => break,
            }
        }
        if late > 0 {
            // Not expected after a settled `set_window(0)`. The server gives them back as
            // the stream ends, with their attempt counted.
            tracing::warn!(owner = %self.owner, late, "messages arrived after the window was closed; the server gives them back");
        }
        End::Stopped
    }

    fn on_response(&mut self, response: v1::SubscribeResponse) -> Result<(), String> {
        match response.response {
            Some(Response::Batch(batch)) => self.on_batch(batch),
            Some(Response::Settled(settled)) => self.on_settled(settled)?,
            Some(Response::LeasesExpired(expired)) => {
                tracing::warn!(owner = %self.owner, count = expired.ids.len(), "leases ran out before an answer");
                for id in expired.ids {
                    self.lose(id);
                }
            }
            Some(Response::Draining(_)) => {
                tracing::info!(owner = %self.owner, "server is draining: finishing publishes in flight, giving back the rest");
                self.draining = true;
                self.shared.reporter.emit(Event::Draining {
                    address: self.address.clone(),
                });
                let untried = self.dispatch.take_queued();
                self.release(untried, true);
            }
            Some(Response::Subscribed(_)) | None => {
                return Err("unexpected response from the server".to_owned())
            }
        }
        Ok(())
    }

    fn on_batch(&mut self, batch: v1::Batch) {
        let config = &self.shared.config;
        let deadline = Instant::now() + self.lease;
        let limit = deadline + config.max_lease_extension;
        self.shared
            .reporter
            .add(Count::Received, batch.messages.len());
        tracing::debug!(owner = %self.owner, count = batch.messages.len(), "batch received");
        for message in batch.messages {
            // Delivered again while still held: the server found its lease run out before
            // telling us. The old delivery is lost; this one replaces it.
            if self.dispatch.state(message.id).is_some() {
                self.lose(message.id);
            }
            if !message.lease_token.is_empty() {
                self.lease_tokens
                    .insert(message.id, message.lease_token.clone());
            }
            self.dispatch.add(Message::from(message), deadline, limit);
        }
        if self.draining {
            let untried = self.dispatch.take_queued();
            self.release(untried, true);
        }
    }

    fn on_settled(&mut self, settled: v1::Settled) -> Result<(), String> {
        let Some(sent) = self.sent.pop_front() else {
            return Err("a settlement arrived for no answer".to_owned());
        };
        if let Some(rejection) = &settled.rejected {
            // Nothing was applied: the messages stay leased to this stream until it ends
            // or their lease runs out; below, the answer counts as fenced.
            tracing::error!(owner = %self.owner, ids = ?rejection.ids, reason = %rejection.reason, "the server rejected an answer");
        }
        let reporter = self.shared.reporter.clone();
        match sent {
            Sent::Ack => {
                for id in &settled.acked {
                    self.dispatch.acked(*id);
                }
                reporter.add(Count::Acked, settled.acked.len());
            }
            Sent::Nack {
                id,
                key,
                error,
                blocked,
            } => {
                if settled.retried.contains(&id) {
                    reporter.add(Count::Retried, 1);
                    reporter.emit(Event::Retried {
                        id,
                        key,
                        error,
                        retry_at: settled.retry_at.and_then(system_time),
                    });
                } else if settled.dead_lettered.contains(&id) {
                    reporter.add(Count::DeadLettered, 1);
                    reporter.emit(Event::DeadLettered { id, key, error });
                } else {
                    // Fenced: the lease was gone, so the server released nothing for us.
                    reporter.add(Count::LeaseLost, 1);
                    reporter.emit(Event::LeaseLost { id });
                    self.release(blocked, false);
                }
                return Ok(());
            }
            Sent::DeadLetter { id, key, error } => {
                if settled.dead_lettered.contains(&id) {
                    reporter.add(Count::DeadLettered, 1);
                    reporter.emit(Event::DeadLettered { id, key, error });
                } else {
                    reporter.add(Count::LeaseLost, 1);
                    reporter.emit(Event::LeaseLost { id });
                }
                return Ok(());
            }
            Sent::Release { untried } => {
                if untried {
                    reporter.add(Count::Released, settled.released.len());
                }
                return Ok(());
            }
            Sent::Extend { at } => {
                for id in &settled.extended {
                    self.dispatch.extended(*id, at + self.lease);
                }
                reporter.add(Count::LeaseExtensions, settled.extended.len());
            }
            Sent::CloseWindow => {
                // Every batch sent before this settlement has arrived: give back what
                // will not be published now, so other subscribers can take it while the
                // publishes in flight finish.
                let untried = self.dispatch.take_queued();
                tracing::info!(owner = %self.owner, untried = untried.len(), "window closed; giving back untried messages");
                self.release(untried, true);
                return Ok(());
            }
        }
        for id in settled.fenced {
            self.lose(id);
        }
        Ok(())
    }

    /// Starts publishes while there is room, unless stopping or draining.
    fn start_publishes(&mut self) {
        if self.stopping || self.draining {
            return;
        }
        while self.tasks.len() < self.shared.config.concurrency {
            let Some(message) = self
                .dispatch
                .next_ready(Instant::now(), self.start_margin())
            else {
                return;
            };
            let id = message.id;
            let publisher = Arc::clone(&self.shared.publisher);
            let timeout = self.shared.config.publish_timeout;
            let handle = self.tasks.spawn(async move {
                let mut message = message;
                let span = crate::trace_context::publish_span(&mut message);
                let started = Instant::now();
                let publish = publisher.publish(&message).instrument(span);
                let result = match tokio::time::timeout(timeout, publish).await {
                    Ok(result) => result,
                    Err(_) => Err(PublishError::timed_out(timeout)),
                };
                Outcome {
                    message,
                    result,
                    elapsed: started.elapsed(),
                }
            });
            self.task_ids.insert(handle.id(), id);
            self.running.insert(id, handle);
        }
    }

    fn on_joined(&mut self, joined: Result<(tokio::task::Id, Outcome), JoinError>) {
        let outcome = match joined {
            Ok((task, outcome)) => {
                self.task_ids.remove(&task);
                outcome
            }
            Err(error) => {
                let Some(id) = self.task_ids.remove(&error.id()) else {
                    return;
                };
                self.running.remove(&id);
                if !error.is_panic() {
                    return;
                }
                match self.dispatch.state(id) {
                    Some(State::Publishing) => {
                        tracing::error!(owner = %self.owner, id, "the publisher panicked");
                        self.on_failure(id, PublishError::new("the publisher panicked"));
                    }
                    Some(State::Orphaned { .. }) => {
                        tracing::error!(owner = %self.owner, id, "the publisher panicked");
                        self.give_back_orphan(id);
                    }
                    _ => {}
                }
                return;
            }
        };
        let Outcome {
            message,
            result,
            elapsed,
        } = outcome;
        self.running.remove(&message.id);
        let id = message.id;
        match (self.dispatch.state(id), result) {
            (Some(State::Publishing), Ok(())) => {
                self.dispatch.published(id);
                self.pending_acks.push(id);
                self.report_published(message, elapsed);
            }
            (Some(State::Publishing), Err(error)) => self.on_failure(id, error),
            // An earlier message of its key was lost while this one published: the key
            // comes back from that one on, so this one is given back, not acked.
            (Some(State::Orphaned { .. }), result) => {
                if result.is_ok() {
                    self.report_published(message, elapsed);
                }
                self.give_back_orphan(id);
            }
            // Lost while publishing (lease ran out): the result no longer matters.
            _ => {}
        }
    }

    fn report_published(&self, message: Message, elapsed: Duration) {
        self.shared.reporter.add(Count::Published, 1);
        self.shared.reporter.emit(Event::Published {
            id: message.id,
            topic: message.topic,
            key: message.key,
            attempts: message.attempts,
            elapsed,
        });
    }

    fn flush_acks(&mut self) {
        if self.pending_acks.is_empty() {
            return;
        }
        let ids = std::mem::take(&mut self.pending_acks);
        let lease_tokens = self.tokens_of(&ids, true);
        self.push(
            Request::Ack(v1::AckMessages { ids, lease_tokens }),
            Sent::Ack,
        );
    }

    /// The lease tokens of `ids`, one per id in order (forgotten with `done`, for a final
    /// answer); none at all when one is missing (a server from before tokens), since the
    /// server takes one per id or none.
    fn tokens_of(&mut self, ids: &[i64], done: bool) -> Vec<String> {
        let tokens: Option<Vec<String>> = ids
            .iter()
            .map(|id| match done {
                true => self.lease_tokens.remove(id),
                false => self.lease_tokens.get(id).cloned(),
            })
            .collect();
        tokens.unwrap_or_default()
    }

    /// How close to its deadline a lease is extended; also, how much lease a key's
    /// unsettled ack must have left for the key's next message to start behind it.
    fn margin(&self) -> Duration {
        self.lease / 2
    }

    /// How much lease a message must have left for its key's next message to start
    /// before its ack is confirmed; `None` (pipelining off): never.
    fn start_margin(&self) -> Option<Duration> {
        self.shared.config.pipeline_keys.then(|| self.margin())
    }

    fn extend_leases(&mut self) {
        let now = Instant::now();
        let ids = self
            .dispatch
            .due_for_extension(now, self.margin(), self.lease);
        if ids.is_empty() {
            return;
        }
        tracing::debug!(owner = %self.owner, count = ids.len(), "extending leases");
        let lease_tokens = self.tokens_of(&ids, false);
        self.send(
            Request::ExtendLease(v1::ExtendLeases {
                ids,
                lease_ms: 0,
                lease_tokens,
            }),
            Sent::Extend { at: now },
        );
    }

    /// Sends an answer other than an ack, after the acks decided before it.
    fn send(&mut self, request: Request, sent: Sent) {
        self.flush_acks();
        self.push(request, sent);
    }

    fn push(&mut self, request: Request, sent: Sent) {
        let Some(requests) = &self.requests else {
            return;
        };
        if requests
            .send(SubscribeRequest {
                request: Some(request),
            })
            .is_ok()
        {
            self.sent.push_back(sent);
        }
    }
}
