//! The claiming side of a subscription as a state machine: what it waits for, and the
//! one future that completes when a claim finishes or its batch is taken.

use tokio::sync::oneshot;
use tokio::task::{JoinError, JoinHandle};
use tokio::time::Instant;

use super::super::bytes_in_flight::Allowance;
use super::super::idle::Turn;
use super::super::RelayResult;
use crate::storage::Claimed;

/// What a claim task returns: the rows, and the size of the first row left out for the
/// byte allowance (see [`super::super::Outbox::claim_within`]).
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
