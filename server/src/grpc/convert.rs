//! Translation between protobuf messages and the relay's types.

use std::time::Duration;

use chrono::{DateTime, Utc};
use prost_types::Timestamp;
use txoutbox_proto::v1;

use crate::relay::subscription::{Event, Settlement};
use crate::relay::Outbox;
use crate::storage::{OutboxMessage, Stats, TopicStats};

pub fn timestamp(time: DateTime<Utc>) -> Timestamp {
    Timestamp {
        seconds: time.timestamp(),
        nanos: time.timestamp_subsec_nanos() as i32,
    }
}

pub fn millis(duration: Duration) -> u64 {
    duration.as_millis().min(u64::MAX as u128) as u64
}

pub fn message(message: OutboxMessage) -> v1::Message {
    v1::Message {
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
        Event::Batch(claimed) => Response::Batch(v1::Batch {
            messages: claimed.messages.into_iter().map(message).collect(),
            lease_expires_at: Some(timestamp(claimed.lease_expires_at)),
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
    }
}

pub fn outbox_info(outbox: &Outbox) -> v1::OutboxInfo {
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
    }
}

pub fn stats(stats: Stats) -> v1::StatsResponse {
    v1::StatsResponse {
        total: Some(topic_stats(stats.total)),
        topics: stats.topics.into_iter().map(topic_stats).collect(),
    }
}

fn topic_stats(stats: TopicStats) -> v1::TopicStats {
    v1::TopicStats {
        topic: stats.topic,
        pending: stats.pending,
        leased: stats.leased,
        dead: stats.dead,
        oldest_pending_age: stats.oldest_pending_age.and_then(|age| age.try_into().ok()),
    }
}
