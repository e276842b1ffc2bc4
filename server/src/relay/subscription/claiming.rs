//! The claiming side of a subscription: a state machine (what it waits for, and the one
//! future that completes when a claim finishes or its batch is taken), and the loop's
//! steps that size a claim, start it, and take its rows.

use std::sync::Arc;

use tokio::sync::oneshot;
use tokio::task::{JoinError, JoinHandle};
use tokio::time::Instant;
use tracing::Instrument;

use super::super::bytes_in_flight::{Allowance, StreamBytes};
use super::super::drain::Drain;
use super::super::idle::Turn;
use super::super::response_size::message_bytes;
use super::super::{RelayError, RelayResult};
use super::{
    task_failed, Batch, Event, Subscription, MAX_STORAGE_ERROR_DELAY, STORAGE_ERROR_DELAY,
};
use crate::storage::{Claimed, StorageError};

/// What a claim task returns: the rows, and the size of the first row left out for the
/// byte allowance (see [`super::super::Claims::claim_within`]).
pub(super) type ClaimResult = RelayResult<(Claimed, Option<usize>)>;

/// The claiming side of a stream, one state at a time:
///
/// ```text
///            start_claim                    claimed: rows
///   Ready ───────────────▶ Running ─────────────────────────▶ InTransit
///     ▲                     │  claimed: no rows, or an error     │ transport took the batch
///     └─────────────────────┴────────────────────────────────────┘
/// ```
///
/// In `Ready`, a claim starts once the window has room (and no answer that gives rows
/// back is waiting or running, and the drain has not begun): at `NextClaim::At`, or in
/// `NextClaim::Idle` on the group's poll turn or a "found more" signal.
pub(super) enum Claiming {
    /// A claim runs on its own task.
    Running(ClaimRun),
    /// The last batch waits for the transport to take it (see [`Batch`]); then `next`.
    InTransit {
        taken: oneshot::Receiver<()>,
        next: NextClaim,
    },
    Ready(NextClaim),
}

/// When the next claim starts, once one may.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum NextClaim {
    /// At this instant: now (the last batch was full, or answers may have unblocked
    /// keys), or after a failed claim's pause.
    At(Instant),
    /// On the group's poll turn, an insert signal, or this stream's own answers: with
    /// `short_while_holding` (the last claim came back short while the stream held rows,
    /// which may have held it back), answers that free rows claim at once.
    Idle { short_while_holding: bool },
}

impl Claiming {
    /// Makes the next claim (after the batch in transit, if any) start now.
    pub fn claim_now(&mut self) {
        match self {
            Self::Running(_) => {}
            Self::InTransit { next, .. } | Self::Ready(next) => {
                *next = NextClaim::At(Instant::now())
            }
        }
    }
}

pub(super) struct ClaimRun {
    pub task: JoinHandle<ClaimResult>,
    /// The bytes taken from the identity's `max_bytes_in_flight` for this claim.
    pub allowance: Option<Allowance>,
    /// What the claim asked for, and whether in a turn of its group.
    pub asked: Asked,
    /// Answers settled while this claim ran made rows free: its keys may have been
    /// unblocked after the claim looked.
    pub freed_rows: bool,
}

/// What a claim asked for.
#[derive(Debug, Clone, Copy)]
pub(super) struct Asked {
    pub count: usize,
    /// Claiming in a turn of its group.
    pub turn: Option<Turn>,
}

/// What the claiming side did: a claim finished (it is `Ready` now, for the loop to say
/// when the next starts), or the batch in transit was taken by the transport (or the
/// stream ended), and it is `Ready` for the claim after it.
pub(super) enum Progress {
    Claimed {
        result: Result<ClaimResult, JoinError>,
        allowance: Option<Allowance>,
        asked: Asked,
        freed_rows: bool,
    },
    Taken,
}

/// Completes when the claim running finishes or the batch in transit is taken, having
/// moved to `Ready`; never in `Ready`, where what starts a claim is the loop's to watch.
pub(super) async fn progress(claiming: &mut Claiming) -> Progress {
    match claiming {
        Claiming::Running(run) => {
            let result = (&mut run.task).await;
            let progress = Progress::Claimed {
                result,
                allowance: run.allowance.take(),
                asked: run.asked,
                freed_rows: run.freed_rows,
            };
            *claiming = Claiming::Ready(NextClaim::Idle {
                short_while_holding: false,
            });
            progress
        }
        Claiming::InTransit { taken, next } => {
            let _ = taken.await;
            *claiming = Claiming::Ready(*next);
            Progress::Taken
        }
        Claiming::Ready(_) => std::future::pending().await,
    }
}

impl Subscription {
    /// How many rows a claim may ask for now, and when it starts; `None` when no claim
    /// may start: one is running, the last batch is not taken by the transport yet, an
    /// answer that gives rows back is waiting or running, the drain has begun, or the
    /// window has too little room.
    pub(super) fn claim_size(&self, drain: &Drain) -> Option<(usize, NextClaim)> {
        let Claiming::Ready(next) = self.claiming else {
            return None;
        };
        if self.answering.gives_back() || drain.is_started() || self.parked.has_orphans() {
            return None;
        }
        let window = self.spec.max_in_flight as usize;
        // A batch is also bounded in bytes: rows of a megabyte come a few at a time.
        let batch_cap = (self.outbox.config.max_batch_size as usize)
            .min(self.outbox.claims.rows_per_response() as usize)
            .min(window);
        // Claim in chunks: wait until half a batch of room is free (or nothing is held),
        // so a subscriber acking one at a time still gets full-ish batches.
        let low_water = batch_cap.div_ceil(2).max(1);
        let room = window.saturating_sub(self.held.len());
        let enough = room > 0 && (room >= low_water || self.held.len() == 0);
        enough.then_some((room.min(batch_cap), next))
    }

    /// With a byte budget: whether the stream would claim (`wants`) but its identity has
    /// too few bytes left, so it waits in line for a release. A stream that would not
    /// claim leaves the line, holding no one back.
    pub(super) fn waits_for_bytes(&mut self, wants: bool) -> bool {
        let need = self.need();
        match &mut self.bytes {
            Some(bytes) if wants => !bytes.ready(need),
            Some(bytes) => {
                bytes.leave();
                false
            }
            None => false,
        }
    }

    /// The bytes the next claim must be able to keep: the row the last one left out, or
    /// a row of the outbox's average size.
    pub(super) fn need(&self) -> usize {
        self.need
            .unwrap_or_else(|| self.outbox.claims.average_row_bytes())
    }

    /// Starts a claim of up to `count` rows on its own task.
    pub(super) fn start_claim(&mut self, count: usize, turn: Option<Turn>) {
        let need = self.need();
        let allowance = match &mut self.bytes {
            Some(bytes) => match bytes.take(need, self.outbox.claims.response_budget()) {
                Some(allowance) => Some(allowance),
                None => {
                    // Another stream of the identity took the bytes since the loop looked:
                    // wait in line, then claim at once. A group turn taken for this claim
                    // is lost; the group hands a poll turn out again after its wait.
                    self.claiming.claim_now();
                    return;
                }
            },
            None => None,
        };
        let max_bytes = allowance.as_ref().map_or(usize::MAX, Allowance::bytes);
        self.parked.claim_starts();
        let outbox = Arc::clone(&self.outbox);
        let owner = Arc::clone(&self.owner);
        let topics = Arc::clone(&self.topics);
        let lease = self.spec.lease;
        let ahead = self.parked.held_keys();
        let task = tokio::spawn(
            async move {
                outbox
                    .claims
                    .claim_within(&owner, count as u32, lease, &topics, max_bytes, ahead)
                    .await
            }
            .in_current_span(),
        );
        self.claiming = Claiming::Running(ClaimRun {
            task,
            allowance,
            asked: Asked { count, turn },
            freed_rows: false,
        });
        // This claim answers whatever the group found before it started.
        if let Some(found) = &mut self.found {
            found.mark_unchanged();
        }
    }

    /// Takes a finished claim: holds and sends its rows, and decides when to claim next.
    pub(super) async fn claimed(
        &mut self,
        result: Result<ClaimResult, JoinError>,
        allowance: Option<Allowance>,
        asked: Asked,
        freed_rows: bool,
    ) -> RelayResult<()> {
        // A failed claim drops its allowance, which gives the bytes back.
        let (claimed, left_out) = match result.map_err(task_failed)? {
            Ok(claimed) => claimed,
            // Retrying cannot heal the caller's own mistake: end with its status.
            Err(error) if error.is_callers_fault() => return Err(error),
            Err(RelayError::Storage(error)) => {
                log_claim_error(&self.outbox.name, &error);
                let pause = STORAGE_ERROR_DELAY
                    .saturating_mul(1 << self.claim_failures.min(5))
                    .min(MAX_STORAGE_ERROR_DELAY);
                self.claim_failures += 1;
                self.claiming = Claiming::Ready(NextClaim::At(Instant::now() + pause));
                return Ok(());
            }
            Err(error) => return Err(error),
        };
        self.claim_failures = 0;
        let sizes = hold_bytes(&claimed, allowance);
        self.need = left_out;
        let got = claimed.messages.len();
        // Cut by the byte allowance: there is more, as after a full batch, and the group's
        // other streams are told so (they may have bytes of other identities, or the
        // fair share of this one's).
        let short = got < asked.count && left_out.is_none();
        let found = if short { got } else { asked.count };
        self.idle.record(asked.turn, asked.count, found);
        // A full batch means there is probably more: claim again as soon as there is room.
        // A short one after answers freed rows of this stream during the claim: those may
        // have unblocked keys after the claim looked, so look again now too. Otherwise
        // wait for the group's poll, an insert signal, or this stream's own answers.
        let next = if !short || freed_rows {
            NextClaim::At(Instant::now())
        } else {
            NextClaim::Idle {
                short_while_holding: self.held.len() > 0,
            }
        };
        if got == 0 {
            self.claiming = Claiming::Ready(next);
            return Ok(());
        }
        // The local deadline is measured after the claim returned, so it never runs out
        // before the database's lease does.
        let deadline = Instant::now() + self.spec.lease;
        for (message, bytes) in claimed.messages.iter().zip(sizes) {
            self.held
                .insert(message.id, message.attempts, deadline, bytes);
        }
        let claimed = self.parked.sort(claimed);
        if claimed.messages.is_empty() {
            // All parked behind rows of their keys the subscriber has not acked yet.
            self.claiming = Claiming::Ready(next);
            return Ok(());
        }
        let (taken, in_transit) = oneshot::channel();
        self.claiming = Claiming::InTransit {
            taken: in_transit,
            next,
        };
        self.send(Event::Batch(Batch {
            claimed,
            holder: Arc::clone(&self.owner),
            _taken: Some(taken),
        }))
        .await;
        Ok(())
    }
}

/// The size of each claimed row; the allowance keeps their sum (the rows hold it from
/// now on) and gives back the rest.
pub(super) fn hold_bytes(claimed: &Claimed, allowance: Option<Allowance>) -> Vec<usize> {
    let sizes: Vec<usize> = claimed.messages.iter().map(message_bytes).collect();
    if let Some(allowance) = allowance {
        allowance.keep(sizes.iter().sum());
    }
    sizes
}

/// Completes when the identity's bytes were released since the stream found too few;
/// never without a byte budget.
pub(super) async fn freed(bytes: &mut Option<StreamBytes>) {
    match bytes {
        Some(bytes) => bytes.freed().await,
        None => std::future::pending().await,
    }
}

pub(super) fn log_claim_error(outbox: &str, error: &StorageError) {
    match error {
        StorageError::Unavailable(_)
        | StorageError::ReadOnly(_)
        | StorageError::MissingTable { .. }
        | StorageError::MismatchedTable { .. } => {
            tracing::warn!(outbox, %error, "claim failed; retrying")
        }
        StorageError::Other(_) | StorageError::InvalidMessage(_) => {
            tracing::error!(outbox, error = ?error, "claim failed; retrying")
        }
    }
}
