//! Translation between protobuf messages and the relay's types.

use crate::relay::lease_token::LeaseToken;
use std::time::Duration;

use chrono::{DateTime, Utc};
use prost_types::Timestamp;
use txoutbox_proto::v1;

use crate::relay::subscribers::StreamView;
use crate::relay::subscription::{Event, Settlement};
use crate::relay::Outbox;
use crate::storage::{
    BlockedKey, DeadLetter, LeaseHolder, OutboxMessage, Pauses, Stats, TopicStats,
};

pub fn timestamp(time: DateTime<Utc>) -> Timestamp {
    Timestamp {
        seconds: time.timestamp(),
        nanos: time.timestamp_subsec_nanos() as i32,
    }
}

pub fn millis(duration: Duration) -> u64 {
    duration.as_millis().min(u64::MAX as u128) as u64
}

/// A delivered row, with the lease token naming this delivery to `holder`.
pub fn message(message: OutboxMessage, holder: &str) -> v1::Message {
    let lease_token = LeaseToken {
        id: message.id,
        attempt: message.attempts,
        holder: holder.to_owned(),
    }
    .encode();
    v1::Message {
        lease_token,
        id: message.id,
        topic: message.topic,
        key: message.key,
        payload: message.payload,
        headers: message.headers.into_iter().collect(),
        attempts: message.attempts,
        created_at: Some(timestamp(message.created_at)),
    }
}

pub fn event(event: Event) -> v1::SubscribeResponse {
    use v1::subscribe_response::Response;
    let response = match event {
        Event::Subscribed {
            owner,
            lease,
            max_in_flight,
            max_attempts,
        } => Response::Subscribed(v1::Subscribed {
            owner,
            lease_ms: millis(lease),
            max_in_flight,
            max_attempts,
        }),
        // Taking the batch here tells its subscription the transport has it.
        Event::Batch(batch) => Response::Batch(v1::Batch {
            messages: batch
                .claimed
                .messages
                .into_iter()
                .map(|row| message(row, &batch.holder))
                .collect(),
            lease_expires_at: Some(timestamp(batch.claimed.lease_expires_at)),
        }),
        Event::Settled(settlement) => Response::Settled(settled(settlement)),
        Event::LeasesExpired(ids) => Response::LeasesExpired(v1::LeasesExpired { ids }),
        Event::Draining { deadline } => Response::Draining(v1::Draining {
            deadline: Some(timestamp(deadline)),
        }),
    };
    v1::SubscribeResponse {
        response: Some(response),
    }
}

fn settled(settlement: Settlement) -> v1::Settled {
    v1::Settled {
        acked: settlement.acked,
        retried: settlement.retried,
        dead_lettered: settlement.dead_lettered,
        released: settlement.released,
        extended: settlement.extended,
        fenced: settlement.fenced,
        retry_at: settlement.retry_at.map(timestamp),
        lease_expires_at: settlement.lease_expires_at.map(timestamp),
        rejected: settlement.rejected.map(|rejection| v1::Rejection {
            ids: rejection.ids,
            reason: rejection.reason,
        }),
    }
}

pub fn blocked_key(key: BlockedKey) -> v1::BlockedKey {
    v1::BlockedKey {
        key: key.key,
        head_id: key.head_id,
        state: key.state.as_str().to_owned(),
        owner: key.owner,
        attempts: key.attempts,
        last_error: key.last_error,
        head_created_at: Some(timestamp(key.head_created_at)),
        until: Some(timestamp(key.until)),
        waiting_behind: key.waiting_behind,
    }
}

/// `pauses`: the outbox's pauses as the database holds them.
pub fn outbox_info(outbox: &Outbox, pauses: Pauses) -> v1::OutboxInfo {
    let config = &outbox.config;
    v1::OutboxInfo {
        name: outbox.name.clone(),
        backend: outbox.storage().backend().to_owned(),
        database: config.database.clone(),
        schema: config.schema.clone().unwrap_or_default(),
        table: config.table.clone(),
        strict_ordering: config.strict_ordering,
        delete_on_ack: config.delete_on_ack,
        visibility_delay_ms: millis(config.visibility_delay),
        notify_channel: config.notify_channel.clone().unwrap_or_default(),
        lease_ms: millis(config.lease),
        max_attempts: config.max_attempts,
        backoff_base_ms: millis(config.backoff.base),
        backoff_factor: config.backoff.factor,
        backoff_max_ms: millis(config.backoff.maximum),
        backoff_jitter: config.backoff.jitter,
        max_batch_size: config.max_batch_size,
        paused_since: pauses.outbox.map(timestamp),
        paused_topics: paused_topics(&pauses),
        groups: config.groups.keys().cloned().collect(),
        retention_ms: if config.has_groups() {
            millis(config.retention)
        } else {
            0
        },
        partitions: if config.has_groups() {
            config.partitions
        } else {
            0
        },
    }
}

pub fn connected_subscriber(stream: StreamView) -> v1::ConnectedSubscriber {
    let connection = stream.connection;
    v1::ConnectedSubscriber {
        name: connection.name,
        owner: connection.owner,
        peer: connection.peer.unwrap_or_default(),
        identity: connection.identity,
        topics: connection.topics,
        window: stream.window,
        in_flight: u32::try_from(stream.in_flight).unwrap_or(u32::MAX),
        acked: stream.acked,
        nacked: stream.nacked,
        fenced: stream.fenced,
        connected_since: Some(timestamp(connection.connected_since)),
        last_answer: stream.last_answer.map(timestamp),
    }
}

pub fn lease_holder(holder: LeaseHolder) -> v1::LeaseHolder {
    v1::LeaseHolder {
        owner: holder.owner,
        rows: holder.rows,
        earliest_expiry: Some(timestamp(holder.earliest_expiry)),
    }
}

/// The paused topics, by name.
pub fn paused_topics(pauses: &Pauses) -> Vec<v1::PausedTopic> {
    pauses
        .topics
        .iter()
        .map(|(topic, since)| v1::PausedTopic {
            topic: topic.clone(),
            paused_since: Some(timestamp(*since)),
        })
        .collect()
}

pub fn paused_groups(pauses: &Pauses) -> Vec<v1::PausedGroup> {
    pauses
        .groups
        .iter()
        .map(|(group, since)| v1::PausedGroup {
            group: group.clone(),
            paused_since: Some(timestamp(*since)),
        })
        .collect()
}

/// What the Stats call adds to the storage's counts.
pub struct StatsExtras {
    pub pauses: Pauses,
    pub delivered_last_minute: Option<u64>,
    pub fenced_answers: u64,
    pub groups: Vec<v1::GroupStats>,
    pub frontier_delay: Option<prost_types::Duration>,
}

pub fn stats(stats: Stats, extras: StatsExtras) -> v1::StatsResponse {
    v1::StatsResponse {
        total: Some(topic_stats(stats.total)),
        topics: stats.topics.into_iter().map(topic_stats).collect(),
        paused_since: extras.pauses.outbox.map(timestamp),
        paused_topics: paused_topics(&extras.pauses),
        delivered_last_minute: extras.delivered_last_minute,
        fenced_answers: extras.fenced_answers,
        groups: extras.groups,
        frontier_delay: extras.frontier_delay,
    }
}

fn topic_stats(stats: TopicStats) -> v1::TopicStats {
    v1::TopicStats {
        topic: stats.topic,
        pending: stats.pending,
        leased: stats.leased,
        dead: stats.dead,
        retry_waiting: stats.waiting,
        oldest_pending_age: stats.oldest_pending_age.and_then(|age| age.try_into().ok()),
    }
}

/// A dead row as the admin calls hand it out.
pub fn dead_letter(row: DeadLetter) -> v1::DeadLetter {
    let message = row.message;
    v1::DeadLetter {
        payload_omitted: message.too_large.is_some(),
        stored_bytes: message.too_large.unwrap_or(0),
        id: message.id,
        topic: message.topic,
        key: message.key,
        payload: message.payload,
        headers: message.headers.into_iter().collect(),
        attempts: message.attempts,
        last_error: row.last_error,
        created_at: Some(timestamp(message.created_at)),
        died_at: row.died_at.map(timestamp),
    }
}

/// A page of a read of at most `page` rows: as many of `rows` as fit in `budget` bytes,
/// and where the next page starts when more may follow (this one was full, or cut).
pub fn dead_letter_page(
    rows: Vec<DeadLetter>,
    page: u32,
    budget: usize,
) -> v1::ListDeadLettersResponse {
    let full = rows.len() == page as usize;
    let (dead_letters, truncated) = within(rows, budget);
    let next_after_id = match dead_letters.last() {
        Some(last) if full || truncated => last.id,
        _ => 0,
    };
    v1::ListDeadLettersResponse {
        dead_letters,
        next_after_id,
        truncated,
    }
}

/// The id-ordered prefix of `rows` that fits in `budget` bytes on the wire, and whether
/// rows were left out for it. A row too large on its own goes without its payload and
/// headers (the database may already have left them out), so a page always moves on.
fn within(rows: Vec<DeadLetter>, budget: usize) -> (Vec<v1::DeadLetter>, bool) {
    use prost::Message as _;
    // The element's tag and length prefix in the repeated field.
    const FRAMING: usize = 6;
    let mut kept = Vec::new();
    let mut used = 0;
    for row in rows {
        let mut row = dead_letter(row);
        if row.encoded_len() + FRAMING > budget {
            row.stored_bytes = (row.payload.len()
                + row
                    .headers
                    .iter()
                    .map(|(k, v)| k.len() + v.len())
                    .sum::<usize>()
                + row.topic.len()
                + row.key.as_ref().map_or(0, String::len)) as u64;
            row.payload_omitted = true;
            row.payload = Vec::new();
            row.headers.clear();
        }
        let bytes = row.encoded_len() + FRAMING;
        if !kept.is_empty() && used + bytes > budget {
            return (kept, true);
        }
        used += bytes;
        kept.push(row);
    }
    (kept, false)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use prost::Message as _;

    use super::*;
    use crate::relay::limits::MAX_HOLDER_BYTES;
    use crate::relay::response_size::{message_bytes, ENVELOPE_BYTES};
    use crate::storage::Claimed;

    fn row(
        id: i64,
        payload: usize,
        key: Option<usize>,
        headers: &[(usize, usize)],
    ) -> OutboxMessage {
        OutboxMessage {
            id,
            topic: "orders.paid".repeat(3),
            key: key.map(|n| "k".repeat(n)),
            payload: vec![7; payload],
            headers: headers
                .iter()
                .enumerate()
                .map(|(i, (name, value))| (format!("{i}{}", "n".repeat(*name)), "v".repeat(*value)))
                .collect::<BTreeMap<_, _>>(),
            attempts: u32::MAX,
            created_at: Utc::now(),
            too_large: None,
        }
    }

    /// The relay sizes responses with `message_bytes` and `ENVELOPE_BYTES`: they must
    /// bound the protobuf encoding from above, for a batch and for a unary claim.
    #[test]
    fn the_relays_size_bounds_bound_the_encoding() {
        let rows = vec![
            row(i64::MIN, 0, None, &[]),
            row(i64::MAX, 1 << 20, Some(255 * 4), &[(200, 300_000), (0, 0)]),
            row(-1, 200_000, Some(0), &[(70_000, 70_000)]),
            row(1, 127, Some(127), &[(127, 127); 3]),
        ];
        let bound: usize = rows.iter().map(message_bytes).sum::<usize>() + ENVELOPE_BYTES;
        let claimed = Claimed {
            messages: rows.clone(),
            lease_expires_at: Utc::now(),
            exhausted: Vec::new(),
        };
        let mut batch: crate::relay::subscription::Batch = claimed.into();
        batch.holder = "h".repeat(MAX_HOLDER_BYTES).into();
        let batch = event(Event::Batch(batch));
        assert!(
            batch.encoded_len() <= bound,
            "{} > {bound}",
            batch.encoded_len()
        );
        let unary = v1::ClaimResponse {
            messages: rows
                .iter()
                .cloned()
                .map(|row| message(row, &"h".repeat(MAX_HOLDER_BYTES)))
                .collect(),
            lease_expires_at: Some(timestamp(Utc::now())),
            paused: false,
            paused_topics: Vec::new(),
        };
        assert!(unary.encoded_len() <= bound);
        for row in rows {
            let alone = v1::ClaimResponse {
                messages: vec![message(row.clone(), &"h".repeat(MAX_HOLDER_BYTES))],
                lease_expires_at: None,
                paused: false,
                paused_topics: Vec::new(),
            };
            assert!(alone.encoded_len() <= message_bytes(&row));
        }
    }
}
