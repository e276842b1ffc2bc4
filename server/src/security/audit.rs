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
    emit(Event {
        identity: caller.name(),
        peer: refusals::current_peer(),
        action,
        outbox: crate::relay::limits::echo(outbox),
        arguments,
        refused: outcome.as_ref().err(),
    });
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
    emit(Event {
        identity: identity.unwrap_or("?"),
        peer: refusals::shown(peer),
        action,
        outbox: "?".to_owned(),
        arguments: "",
        refused: Some(status),
    });
}

/// One audit event: who, from where, what, on which outbox, and how it ended.
struct Event<'a> {
    identity: &'a str,
    peer: String,
    action: &'a str,
    outbox: String,
    arguments: &'a str,
    refused: Option<&'a Status>,
}

/// Emits `event` at `info`, or at `warn` when it was refused; both carry the same fields,
/// and a refusal adds its `code` and `message`.
fn emit(event: Event<'_>) {
    // A tracing event's level is fixed where it is written: one call site per level.
    macro_rules! at {
        ($level:ident, $outcome:literal) => {
            tracing::$level!(
                target: TARGET,
                identity = event.identity,
                peer = event.peer.as_str(),
                action = event.action,
                outbox = event.outbox.as_str(),
                arguments = event.arguments,
                outcome = $outcome,
                code = event.refused.map(|status| tracing::field::debug(status.code())),
                message = event.refused.map(Status::message),
                "admin action"
            )
        };
    }
    match event.refused {
        None => at!(info, "ok"),
        Some(_) => at!(warn, "refused"),
    }
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
