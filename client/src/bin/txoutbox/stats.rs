//! `txoutbox stats`: queue depth and lag of one outbox, overall and per topic; whether
//! it is paused, what was delivered in the last minute, answers fenced.

use std::time::Duration;

use serde_json::json;
use txoutbox_client::proto::v1::{GroupStats, StatsRequest, TopicStats};

use super::output::{print_json, print_table, Format};
use super::{CliError, Context};

pub async fn run(context: &mut Context) -> Result<(), CliError> {
    let outbox = context.outbox().await?;
    let stats = context
        .admin()
        .await?
        .stats(StatsRequest {
            outbox: outbox.clone(),
        })
        .await?
        .into_inner();
    let total = stats.total.unwrap_or_default();
    let paused_since = super::pause::paused_since(&stats.paused_since);
    match context.format_or(Format::Table) {
        Format::Json => print_json(&json!({
            "outbox": outbox,
            "paused_since": paused_since,
            "paused_topics": super::pause::paused_topics_json(&stats.paused_topics),
            "delivered_last_minute": stats.delivered_last_minute,
            "fenced_answers": stats.fenced_answers,
            "total": topic_json(&total),
            "topics": stats.topics.iter().map(topic_json).collect::<Vec<_>>(),
            "groups": stats.groups.iter().map(group_json).collect::<Vec<_>>(),
            "frontier_delay_ms": stats.frontier_delay.as_ref().map(millis),
        })),
        Format::Table => {
            let mut rows: Vec<Vec<String>> = stats.topics.iter().map(topic_row).collect();
            let mut total_row = topic_row(&total);
            total_row[0] = "(all topics)".to_owned();
            rows.push(total_row);
            match &paused_since {
                Some(since) => println!("outbox {outbox} (PAUSED since {since})"),
                None => println!("outbox {outbox}"),
            }
            super::pause::print_paused_topics(context, &outbox, &stats.paused_topics);
            print_table(
                &[
                    "TOPIC",
                    "PENDING",
                    "LEASED",
                    "RETRY WAITING",
                    "DEAD",
                    "OLDEST PENDING",
                ],
                &rows,
            )?;
            match stats.delivered_last_minute {
                Some(delivered) => println!("delivered in the last minute: {delivered}"),
                None => println!("delivered in the last minute: unknown (delete_on_ack)"),
            }
            println!(
                "answers fenced by this replica since it started: {}",
                stats.fenced_answers
            );
            if !stats.groups.is_empty() {
                let rows: Vec<Vec<String>> = stats.groups.iter().map(group_row).collect();
                print_table(
                    &[
                        "GROUP",
                        "LAG ROWS",
                        "LAG",
                        "RETRYING",
                        "HELD",
                        "DEAD",
                        "HELD KEYS",
                        "STREAMS",
                    ],
                    &rows,
                )?;
                for group in &stats.groups {
                    let Some(since) = super::pause::paused_since(&group.paused_since) else {
                        continue;
                    };
                    let resume = ["--outbox", &outbox, "resume", "--group", &group.group];
                    println!(
                        "group {} is paused (since {since}): resume with {}",
                        group.group,
                        context.command_line(&resume)
                    );
                }
                if let Some(delay) = &stats.frontier_delay {
                    println!(
                        "oldest open writing transaction (rows after its start wait): {}",
                        human_age(Duration::from_millis(millis(delay)))
                    );
                }
            }
            Ok(())
        }
    }
}

fn oldest(stats: &TopicStats) -> Option<Duration> {
    let age = stats.oldest_pending_age?;
    Some(Duration::new(
        u64::try_from(age.seconds).unwrap_or(0),
        u32::try_from(age.nanos).unwrap_or(0),
    ))
}

fn millis(duration: &txoutbox_client::proto::prost_types::Duration) -> u64 {
    u64::try_from(duration.seconds).unwrap_or(0) * 1000
        + u64::try_from(duration.nanos).unwrap_or(0) / 1_000_000
}

fn group_json(group: &GroupStats) -> serde_json::Value {
    json!({
        "group": group.group,
        "lag_rows": group.lag_rows,
        "lag_ms": group.lag.as_ref().map(millis),
        "retrying": group.retrying,
        "held": group.held,
        "dead": group.dead,
        "held_keys": group.held_keys,
        "members": group.members,
        "paused_since": super::pause::paused_since(&group.paused_since),
        "partitions": group.partitions.iter().map(|p| json!({
            "partition": p.partition,
            "owner": p.owner,
            "epoch": p.epoch,
            "position_id": p.position_id,
        })).collect::<Vec<_>>(),
    })
}

fn group_row(group: &GroupStats) -> Vec<String> {
    vec![
        group.group.clone(),
        group.lag_rows.to_string(),
        group.lag.as_ref().map_or_else(
            || "-".to_owned(),
            |lag| human_age(Duration::from_millis(millis(lag))),
        ),
        group.retrying.to_string(),
        group.held.to_string(),
        group.dead.to_string(),
        group.held_keys.to_string(),
        group.members.to_string(),
    ]
}

fn topic_json(stats: &TopicStats) -> serde_json::Value {
    json!({
        "topic": stats.topic,
        "pending": stats.pending,
        "leased": stats.leased,
        "retry_waiting": stats.retry_waiting,
        "dead": stats.dead,
        "oldest_pending_age_ms": oldest(stats).map(|age| age.as_millis() as u64),
    })
}

fn topic_row(stats: &TopicStats) -> Vec<String> {
    vec![
        stats.topic.clone(),
        stats.pending.to_string(),
        stats.leased.to_string(),
        stats.retry_waiting.to_string(),
        stats.dead.to_string(),
        oldest(stats).map_or_else(|| "-".to_owned(), human_age),
    ]
}

/// `4m 2s`, to the second (to the millisecond under a second).
fn human_age(age: Duration) -> String {
    let rounded = if age < Duration::from_secs(1) {
        Duration::from_millis(age.as_millis() as u64)
    } else {
        Duration::from_secs(age.as_secs())
    };
    humantime::format_duration(rounded).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_are_rounded_for_people() {
        assert_eq!(human_age(Duration::from_millis(242_123)), "4m 2s");
        assert_eq!(human_age(Duration::from_micros(1_500)), "1ms");
    }
}
