//! Admin actions as structured events on their own tracing target, `txoutbox::audit`,
//! so they can be routed apart (a JSON log shipper filtering on `target`). The target is
//! kept at `info` whatever `RUST_LOG` filters, unless `RUST_LOG` names it (see
//! `telemetry::logging`). One event per action, after it ran: who, from which peer
//! address, on which outbox, with which arguments, and how it ended.

use std::net::SocketAddr;

use tonic::Status;

use super::{refusals, Caller};

pub use crate::telemetry::logging::AUDIT_TARGET as TARGET;

/// Records `action` by `caller` on `outbox`; `arguments` is a short `key=value` text.
pub fn record<T>(
    caller: &Caller,
    action: &str,
    outbox: &str,
    arguments: &str,
    outcome: &Result<T, Status>,
) {
    match outcome {
        Ok(_) => tracing::info!(
            target: TARGET,
            identity = caller.name(),
            peer = refusals::current_peer(),
            action,
            outbox = crate::relay::limits::echo(outbox),
            arguments,
            outcome = "ok",
            "admin action"
        ),
        Err(status) => tracing::warn!(
            target: TARGET,
            identity = caller.name(),
            peer = refusals::current_peer(),
            action,
            outbox = crate::relay::limits::echo(outbox),
            arguments,
            outcome = "refused",
            code = ?status.code(),
            message = status.message(),
            "admin action"
        ),
    }
}

/// Records an admin action the layer refused before any handler ran: by `identity` when
/// the credential named one (it holds the scope on no outbox, or is past a limit), `?`
/// when there was no credential or a wrong one. The outbox is not known there (it travels
/// inside the message, which the layer does not decode).
pub fn record_refused_call(
    path: &str,
    identity: Option<&str>,
    peer: Option<SocketAddr>,
    status: &Status,
) {
    let Some(action) = admin_action(path) else {
        return;
    };
    tracing::warn!(
        target: TARGET,
        identity = identity.unwrap_or("?"),
        peer = refusals::shown(peer),
        action,
        outbox = "?",
        arguments = "",
        outcome = "refused",
        code = ?status.code(),
        message = status.message(),
        "admin action"
    );
}

/// The audited action a method path names, if any.
fn admin_action(path: &str) -> Option<&'static str> {
    match path {
        "/txoutbox.v1.Admin/Purge" => Some("purge"),
        "/txoutbox.v1.Admin/InsertMessage" => Some("insert"),
        "/txoutbox.v1.Admin/Schema" => Some("schema"),
        "/txoutbox.v1.Admin/ListDeadLetters" => Some("read_dead_letters"),
        "/txoutbox.v1.Admin/RedriveDeadLetters" => Some("redrive"),
        "/txoutbox.v1.Admin/DiscardDeadLetters" => Some("discard"),
        "/txoutbox.v1.Admin/Pause" => Some("pause"),
        "/txoutbox.v1.Admin/Resume" => Some("resume"),
        _ => None,
    }
}
