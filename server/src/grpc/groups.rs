//! The subscription-group calls of `txoutbox.v1.Admin` (seek, figures, dead letters of a
//! group), translated to and from protobuf; audited like the other admin actions.

use chrono::{DateTime, Utc};
use tonic::Status;
use txoutbox_proto::v1;

use crate::config::Scope;
use crate::relay::dead_letters::limit;
use crate::relay::limits::echo;
use crate::relay::{Outbox, Relay};
use crate::security::{audit, Caller};
use crate::storage::groups::{GroupStats, SeekTarget};
use crate::storage::{DeadLetter, Pauses};

pub async fn seek(
    relay: &Relay,
    caller: &Caller,
    request: v1::SeekGroupRequest,
) -> Result<v1::SeekGroupResponse, Status> {
    let mut arguments = format!("group={} dry_run={}", echo(&request.group), request.dry_run);
    let outcome = async {
        let outbox = caller.outbox(relay, Scope::Admin, &request.outbox)?;
        let groups = outbox.groups()?;
        groups.settings(&request.group)?;
        use v1::seek_group_request::To;
        let target = match request.to {
            Some(To::ToOldest(true)) => SeekTarget::Oldest,
            Some(To::ToNow(true)) => SeekTarget::Now,
            Some(To::ToId(id)) if id > 0 => SeekTarget::Id(id),
            Some(To::ToTime(at)) => SeekTarget::Time(
                u32::try_from(at.nanos)
                    .ok()
                    .and_then(|nanos| DateTime::<Utc>::from_timestamp(at.seconds, nanos))
                    .ok_or_else(|| Status::invalid_argument("to_time is not a valid time"))?,
            ),
            _ => {
                return Err(Status::invalid_argument(
                    "say where to seek: to_oldest, to_now, to_id (a row id above 0) or to_time",
                ))
            }
        };
        arguments = format!("{arguments} to={target:?}");
        let outcome = groups
            .store
            .seek(&request.group, target, request.dry_run)
            .await
            .map_err(crate::relay::RelayError::from)?;
        if !request.dry_run {
            tracing::info!(outbox = %outbox.name, group = %request.group, ?target, rows_ahead = outcome.rows_ahead, "group moved");
        }
        Ok(v1::SeekGroupResponse {
            rows_ahead: outcome.rows_ahead,
            partitions: outcome.partitions,
        })
    }
    .await;
    audit::record(caller, "seek_group", &request.outbox, &arguments, &outcome);
    outcome
}

/// Every group's figures and the frontier's delay, for `Stats`.
pub async fn stats(
    outbox: &Outbox,
    pauses: &Pauses,
) -> Result<(Vec<v1::GroupStats>, Option<prost_types::Duration>), Status> {
    let Ok(groups) = outbox.groups() else {
        return Ok((Vec::new(), None));
    };
    let mut out = Vec::new();
    for name in groups.names() {
        let holds = groups.settings(name)?.dead_letter_holds_key;
        let stats = groups
            .store
            .stats(name, holds)
            .await
            .map_err(crate::relay::RelayError::from)?;
        let paused_since = pauses
            .groups
            .get(name)
            .copied()
            .map(super::convert::timestamp);
        out.push(v1::GroupStats {
            paused_since,
            ..group_stats(stats)
        });
    }
    let delay = groups
        .store
        .frontier_delay()
        .await
        .map_err(crate::relay::RelayError::from)?;
    Ok((out, delay.try_into().ok()))
}

fn group_stats(stats: GroupStats) -> v1::GroupStats {
    v1::GroupStats {
        group: stats.group,
        lag_rows: stats.lag_rows,
        lag: stats.lag.and_then(|lag| lag.try_into().ok()),
        retrying: stats.retrying,
        held: stats.held,
        dead: stats.dead,
        held_keys: stats.held_keys,
        members: stats.members,
        partitions: stats
            .partitions
            .into_iter()
            .map(|p| v1::GroupPartition {
                partition: p.partition,
                owner: p.owner.filter(|_| !p.expired).unwrap_or_default(),
                epoch: p.epoch,
                position_id: p.position.id,
            })
            .collect(),
        paused_since: None,
    }
}

pub async fn list_dead(
    relay: &Relay,
    caller: &Caller,
    request: v1::ListDeadLettersRequest,
) -> Result<v1::ListDeadLettersResponse, Status> {
    let arguments = format!(
        "group={} after_id={} limit={}",
        echo(&request.group),
        request.after_id,
        request.limit
    );
    let outcome = async {
        let outbox = caller.outbox(relay, Scope::Read, &request.outbox)?;
        let groups = outbox.groups()?;
        groups.settings(&request.group)?;
        let page = limit(request.limit)?;
        let rows = groups
            .store
            .list_dead(&request.group, request.after_id, page)
            .await
            .map_err(crate::relay::RelayError::from)?;
        let rows: Vec<DeadLetter> = rows
            .into_iter()
            .map(|row| DeadLetter {
                message: row.message,
                last_error: row.error.unwrap_or_default(),
                died_at: Some(row.dead_at),
            })
            .collect();
        Ok(super::convert::dead_letter_page(
            rows,
            page,
            outbox.claims.response_budget(),
        ))
    }
    .await;
    audit::record(
        caller,
        "read_dead_letters",
        &request.outbox,
        &arguments,
        &outcome,
    );
    outcome
}

/// Re-drives (`redrive`) or discards a group's dead letters; audited.
#[allow(clippy::too_many_arguments)]
pub async fn change_dead(
    relay: &Relay,
    caller: &Caller,
    outbox: &str,
    group: &str,
    selector: Option<v1::DeadLetterSelector>,
    page: u32,
    dry_run: bool,
    redrive: bool,
) -> Result<v1::DeadLetterActionResponse, Status> {
    let action = if redrive { "redrive" } else { "discard" };
    let ids = selector.map(|s| s.ids).unwrap_or_default();
    let arguments = format!(
        "group={} ids={} limit={page} dry_run={dry_run}",
        echo(group),
        ids.len()
    );
    let outcome = async {
        let outbox = caller.outbox(relay, Scope::Admin, outbox)?;
        let groups = outbox.groups()?;
        groups.settings(group)?;
        let page = limit(page)?;
        let store = &groups.store;
        let ids = if dry_run {
            let dead = store
                .list_dead(group, 0, 1000)
                .await
                .map_err(crate::relay::RelayError::from)?;
            dead.into_iter()
                .map(|d| d.message.id)
                .filter(|id| ids.is_empty() || ids.contains(id))
                .take(page as usize)
                .collect()
        } else if redrive {
            store
                .redrive_dead(group, &ids, page)
                .await
                .map_err(crate::relay::RelayError::from)?
        } else {
            store
                .discard_dead(group, &ids, page)
                .await
                .map_err(crate::relay::RelayError::from)?
        };
        let more = ids.len() == page as usize;
        Ok(v1::DeadLetterActionResponse { ids, more })
    }
    .await;
    audit::record(caller, action, outbox, &arguments, &outcome);
    outcome
}
