//! The dead-letter calls of `txoutbox.v1.Admin`: the selector from protobuf, the rows and
//! counts back, and the audit record of each re-drive and discard (dry runs included,
//! marked so). Called by [`super::admin_service`].

use std::time::Duration;

use chrono::{DateTime, Utc};
use tonic::Status;
use txoutbox_proto::v1;

use super::convert::dead_letter_page;
use crate::config::Scope;
use crate::relay::limits::echo;
use crate::relay::Relay;
use crate::security::{audit, Caller};
use crate::storage::DeadFilter;

/// The selector as the storage takes it; times must be valid timestamps.
pub fn filter(selector: Option<v1::DeadLetterSelector>) -> Result<DeadFilter, Status> {
    let selector = selector.unwrap_or_default();
    let time = |field: &str, at: Option<prost_types::Timestamp>| {
        at.map(|at| {
            u32::try_from(at.nanos)
                .ok()
                .and_then(|nanos| DateTime::<Utc>::from_timestamp(at.seconds, nanos))
                .ok_or_else(|| Status::invalid_argument(format!("{field} is not a valid time")))
        })
        .transpose()
    };
    Ok(DeadFilter {
        ids: selector.ids,
        topic: selector.topic,
        key: selector.key,
        error_contains: selector.error_contains,
        died_after: time("died_after", selector.died_after)?,
        died_before: time("died_before", selector.died_before)?,
    })
}

/// The selector as audit arguments: short, the caller's strings escaped and cut.
fn describe(filter: &DeadFilter) -> String {
    let mut parts = Vec::new();
    if !filter.ids.is_empty() {
        parts.push(format!("ids={}", filter.ids.len()));
    }
    for (name, value) in [
        ("topic", &filter.topic),
        ("key", &filter.key),
        ("error_contains", &filter.error_contains),
    ] {
        if let Some(value) = value {
            parts.push(format!("{name}={}", echo(value)));
        }
    }
    if let Some(at) = filter.died_after {
        parts.push(format!("died_after={}", at.to_rfc3339()));
    }
    if let Some(at) = filter.died_before {
        parts.push(format!("died_before={}", at.to_rfc3339()));
    }
    parts.join(" ")
}

/// `ListDeadLetters`, audited: it hands out payloads, which may hold what a `read`
/// holder should be seen reading.
pub async fn list(
    relay: &Relay,
    caller: &Caller,
    request: v1::ListDeadLettersRequest,
) -> Result<v1::ListDeadLettersResponse, Status> {
    if !request.group.is_empty() {
        return super::groups::list_dead(relay, caller, request).await;
    }
    let mut arguments = format!("after_id={} limit={}", request.after_id, request.limit);
    let outcome = async {
        let outbox = caller.outbox(relay, Scope::Read, &request.outbox)?;
        let filter = filter(request.selector)?;
        arguments = format!("{arguments} {}", describe(&filter));
        let rows = outbox
            .admin
            .list_dead(&filter, request.after_id, request.limit)
            .await?;
        let page = crate::relay::dead_letters::limit(request.limit)?;
        Ok(dead_letter_page(
            rows,
            page,
            outbox.claims.response_budget(),
        ))
    }
    .await;
    if let Ok(response) = &outcome {
        let bytes: usize = response.dead_letters.iter().map(|d| d.payload.len()).sum();
        arguments = format!(
            "{arguments} rows={} payload_bytes={bytes}",
            response.dead_letters.len()
        );
    }
    audit::record(
        caller,
        "read_dead_letters",
        &request.outbox,
        arguments.trim(),
        &outcome,
    );
    outcome
}

pub async fn count(
    relay: &Relay,
    caller: &Caller,
    request: v1::CountDeadLettersRequest,
) -> Result<v1::CountDeadLettersResponse, Status> {
    let outbox = caller.outbox(relay, Scope::Read, &request.outbox)?;
    let counts = outbox.admin.count_dead(&filter(request.selector)?).await?;
    Ok(v1::CountDeadLettersResponse {
        counts: counts
            .groups
            .into_iter()
            .map(|group| v1::DeadLetterCount {
                topic: group.topic,
                error: group.error,
                count: group.count,
            })
            .collect(),
        total: counts.total,
    })
}

/// The selection of a re-drive or discard request: the same fields in both.
macro_rules! selected {
    ($request:ident) => {
        Selected {
            outbox: $request.outbox,
            group: $request.group,
            selector: $request.selector,
            limit: $request.limit,
            dry_run: $request.dry_run,
        }
    };
}

pub async fn redrive(
    relay: &Relay,
    caller: &Caller,
    request: v1::RedriveDeadLettersRequest,
) -> Result<v1::DeadLetterActionResponse, Status> {
    let selected = selected!(request);
    let delay = request.delay;
    selected
        .change(relay, caller, Change::Redrive { delay })
        .await
}

pub async fn discard(
    relay: &Relay,
    caller: &Caller,
    request: v1::DiscardDeadLettersRequest,
) -> Result<v1::DeadLetterActionResponse, Status> {
    let selected = selected!(request);
    selected.change(relay, caller, Change::Discard).await
}

/// What a re-drive or a discard selects: the same fields in both requests.
struct Selected {
    outbox: String,
    group: String,
    selector: Option<v1::DeadLetterSelector>,
    limit: u32,
    dry_run: bool,
}

/// What is done to the selected dead letters.
enum Change {
    Redrive {
        delay: Option<prost_types::Duration>,
    },
    Discard,
}

impl Selected {
    /// Applies `change` (with `dry_run`, only lists what it would take) to the outbox's
    /// dead letters, or to a group's when the request names one, and records it in the
    /// audit trail.
    async fn change(
        self,
        relay: &Relay,
        caller: &Caller,
        change: Change,
    ) -> Result<v1::DeadLetterActionResponse, Status> {
        let redrive = matches!(change, Change::Redrive { .. });
        if !self.group.is_empty() {
            return super::groups::change_dead(
                relay,
                caller,
                &self.outbox,
                &self.group,
                self.selector,
                self.limit,
                self.dry_run,
                redrive,
            )
            .await;
        }
        let mut arguments = format!("limit={} dry_run={}", self.limit, self.dry_run);
        let outcome = async {
            let outbox = caller.outbox(relay, Scope::Admin, &self.outbox)?;
            let filter = filter(self.selector)?;
            arguments = format!("{arguments} {}", describe(&filter));
            let admin = &outbox.admin;
            let action = match change {
                Change::Redrive { delay } => {
                    let delay = match delay {
                        Some(delay) => Duration::try_from(delay)
                            .map_err(|_| Status::invalid_argument("delay must not be negative"))?,
                        None => Duration::ZERO,
                    };
                    admin
                        .redrive_dead(&filter, self.limit, delay, self.dry_run)
                        .await?
                }
                Change::Discard => {
                    admin
                        .discard_dead(&filter, self.limit, self.dry_run)
                        .await?
                }
            };
            Ok(v1::DeadLetterActionResponse {
                ids: action.ids,
                more: action.more,
            })
        }
        .await;
        let action = if redrive { "redrive" } else { "discard" };
        audit::record(caller, action, &self.outbox, &arguments, &outcome);
        outcome
    }
}
