//! Bounds per identity (`server.auth.identities.NAME.limits`): streams open at once,
//! messages and bytes in flight across its streams, unary calls per second, distinct
//! topic filters among its streams of one outbox. Going past one is RESOURCE_EXHAUSTED
//! naming the limit, except `max_bytes_in_flight`, which holds the identity's streams
//! back until bytes are freed (see [`crate::relay::bytes_in_flight`]).

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::Status;

use crate::config::IdentityLimits;
use crate::relay::bytes_in_flight::BytesInFlight;

pub struct IdentityBudget {
    streams: Option<(u32, Arc<Semaphore>)>,
    messages: Option<(u32, Arc<Semaphore>)>,
    calls: Option<(u32, DefaultDirectRateLimiter)>,
    /// `max_bytes_in_flight`, shared by the identity's streams and unary claims.
    pub bytes: Option<Arc<BytesInFlight>>,
    filters: Option<(u32, Arc<Mutex<FilterCounts>>)>,
}

/// An outbox and a topic filter as its poll groups key it.
type FilterKey = (String, Vec<String>);
/// The identity's open streams per outbox and filter.
type FilterCounts = HashMap<FilterKey, usize>;

/// An open stream's filter counted in its identity's `max_topic_filters`, given back when
/// dropped.
pub struct FilterSlot(Option<(Arc<Mutex<FilterCounts>>, FilterKey)>);

impl Drop for FilterSlot {
    fn drop(&mut self) {
        let Some((counts, key)) = self.0.take() else {
            return;
        };
        let mut counts = counts.lock().expect("filter counts lock");
        if let Some(streams) = counts.get_mut(&key) {
            *streams -= 1;
            if *streams == 0 {
                counts.remove(&key);
            }
        }
    }
}

/// An open stream's place in its identity's `max_streams`, given back when dropped.
pub struct StreamSlot(#[allow(dead_code)] Option<OwnedSemaphorePermit>);

/// A stream's window reserved in its identity's `max_messages_in_flight`; grows and
/// shrinks with `set_window`, given back when the stream ends.
pub struct WindowReservation {
    identity: String,
    limit: u32,
    pool: Option<Arc<Semaphore>>,
    held: Mutex<Option<OwnedSemaphorePermit>>,
}

impl IdentityBudget {
    pub fn new(identity: &str, limits: &IdentityLimits) -> Self {
        let semaphore = |limit: u32| (limit, Arc::new(Semaphore::new(limit as usize)));
        Self {
            streams: limits.max_streams.map(semaphore),
            messages: limits.max_messages_in_flight.map(semaphore),
            calls: limits
                .max_calls_per_second
                .and_then(NonZeroU32::new)
                .map(|rate| (rate.get(), RateLimiter::direct(Quota::per_second(rate)))),
            bytes: limits
                .max_bytes_in_flight
                .map(|limit| BytesInFlight::new(identity, limit)),
            filters: limits
                .max_topic_filters
                .map(|limit| (limit, Arc::default())),
        }
    }

    /// Counts a stream on `outbox` filtering on `topics` (in any order; empty: every
    /// topic); refused when its filter is not among the identity's open streams of that
    /// outbox and they already have `max_topic_filters` distinct ones.
    pub fn hold_filter(
        &self,
        identity: &str,
        outbox: &str,
        topics: &[String],
    ) -> Result<FilterSlot, Status> {
        let Some((limit, counts)) = &self.filters else {
            return Ok(FilterSlot(None));
        };
        let key = (outbox.to_owned(), crate::relay::idle::filter_key(topics));
        let mut held = counts.lock().expect("filter counts lock");
        if !held.contains_key(&key) {
            let in_use = held.keys().filter(|(o, _)| o == outbox).count();
            if in_use >= *limit as usize {
                return Err(exhausted(format!(
                    "identity `{identity}` already has streams on {limit} distinct topic filters \
                     of outbox {outbox} (limit max_topic_filters = {limit}): subscribe with a \
                     filter its streams use, or close one"
                )));
            }
        }
        *held.entry(key.clone()).or_insert(0) += 1;
        Ok(FilterSlot(Some((Arc::clone(counts), key))))
    }

    pub fn open_stream(&self, identity: &str) -> Result<StreamSlot, Status> {
        let Some((limit, slots)) = &self.streams else {
            return Ok(StreamSlot(None));
        };
        Arc::clone(slots)
            .try_acquire_owned()
            .map(|permit| StreamSlot(Some(permit)))
            .map_err(|_| {
                exhausted(format!(
                    "identity `{identity}` already has {limit} streams open: limit max_streams = {limit}"
                ))
            })
    }

    pub fn unary_call(&self, identity: &str) -> Result<(), Status> {
        match &self.calls {
            Some((limit, limiter)) if limiter.check().is_err() => Err(exhausted(format!(
                "identity `{identity}` is calling faster than its limit max_calls_per_second = {limit}; retry shortly"
            ))),
            _ => Ok(()),
        }
    }

    pub fn reserve_window(&self, identity: &str, window: u32) -> Result<WindowReservation, Status> {
        let reservation = WindowReservation {
            identity: identity.to_owned(),
            limit: self.messages.as_ref().map_or(0, |(limit, _)| *limit),
            pool: self.messages.as_ref().map(|(_, pool)| Arc::clone(pool)),
            held: Mutex::new(None),
        };
        reservation.resize(window)?;
        Ok(reservation)
    }
}

impl WindowReservation {
    /// Holds exactly `window` messages of the identity's budget, or fails holding what
    /// it held before.
    pub fn resize(&self, window: u32) -> Result<(), Status> {
        let Some(pool) = &self.pool else {
            return Ok(());
        };
        let mut held = self.held.lock().expect("window reservation lock");
        let now = held.as_ref().map_or(0, |p| p.num_permits());
        let window = window as usize;
        if window > now {
            let more = Arc::clone(pool)
                .try_acquire_many_owned((window - now) as u32)
                .map_err(|_| {
                    exhausted(format!(
                        "identity `{}` would hold more than {} messages across its streams \
                         (limit max_messages_in_flight = {}): open this stream with a smaller \
                         max_in_flight, or close another",
                        self.identity, self.limit, self.limit
                    ))
                })?;
            match held.as_mut() {
                Some(permit) => permit.merge(more),
                None => *held = Some(more),
            }
        } else if let Some(permit) = held.as_mut() {
            drop(permit.split(now - window));
        }
        Ok(())
    }
}

fn exhausted(message: String) -> Status {
    Status::resource_exhausted(message)
}
