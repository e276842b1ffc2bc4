//! `txoutbox dead list|count|redrive|discard`: find dead-lettered rows and why they died,
//! then re-drive them (pending again, attempts reset, in id order per key) or discard
//! them. Re-drive and discard are dry runs unless `--yes` is given: they print the rows
//! they would take. Each call takes at most `--limit` rows (lowest ids first) and says
//! when more match; running it again goes on, and a repeat of one that applied is
//! harmless (rows no longer dead are left alone).

use std::time::{Duration, SystemTime};

use serde_json::json;
use txoutbox_client::proto::prost_types;
use txoutbox_client::proto::v1::{
    CountDeadLettersRequest, DeadLetter, DeadLetterActionResponse, DeadLetterSelector,
    DiscardDeadLettersRequest, ListDeadLettersRequest, RedriveDeadLettersRequest,
};

use super::output::{print_json, print_table, Format};
use super::{CliError, Context};

const EXAMPLES: &str = "\
Examples:
  txoutbox --outbox orders dead count
  txoutbox --outbox orders dead list --topic orders.paid --error timeout --limit 20
  txoutbox --outbox orders dead list --died-after 1h        (died within the last hour)
  txoutbox --outbox orders dead redrive --key order-42      (dry run: what would be re-driven)
  txoutbox --outbox orders dead redrive --key order-42 --yes
  txoutbox --outbox orders dead redrive --error 'broker down' --delay 30s --yes
  txoutbox --outbox orders dead discard --ids 17,18 --yes";

#[derive(Debug, clap::Args)]
#[command(after_help = EXAMPLES)]
pub struct Args {
    #[command(subcommand)]
    command: DeadCommand,
}

#[derive(Debug, clap::Subcommand)]
enum DeadCommand {
    /// Dead rows in id order, a page at a time: attempts, last error, when each died.
    // The last --after-id counts: "add --after-id N" works on any page's command line.
    #[command(args_override_self = true)]
    List {
        #[command(flatten)]
        select: Select,
        /// Rows with an id above this one (the `next` of the previous page).
        #[arg(long, default_value_t = 0, value_name = "ID")]
        after_id: i64,
        /// Rows per page, at most 1000.
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// How many rows are dead, by topic and error.
    Count {
        #[command(flatten)]
        select: Select,
    },
    /// Make dead rows pending again (attempts reset), in id order per key. Dry run
    /// without --yes.
    Redrive {
        #[command(flatten)]
        select: Select,
        /// Claimable after this delay (30s, 5m...); default now.
        #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
        delay: Option<Duration>,
        #[command(flatten)]
        apply: Apply,
    },
    /// Delete dead rows for good. Dry run without --yes.
    Discard {
        #[command(flatten)]
        select: Select,
        #[command(flatten)]
        apply: Apply,
    },
}

/// Which dead rows: every given option must match.
#[derive(Debug, clap::Args)]
struct Select {
    /// Only these ids (comma-separated).
    #[arg(long, value_delimiter = ',', value_name = "ID,...")]
    ids: Vec<i64>,
    #[arg(long)]
    topic: Option<String>,
    #[arg(long)]
    key: Option<String>,
    /// The last error contains this text.
    #[arg(long = "error", value_name = "TEXT")]
    error_contains: Option<String>,
    /// Died at or after this time: RFC 3339 (2026-12-03T09:00:00Z), or a duration ago (1h).
    #[arg(long, value_name = "TIME", value_parser = parse_time)]
    died_after: Option<SystemTime>,
    /// Died before this time: RFC 3339, or a duration ago.
    #[arg(long, value_name = "TIME", value_parser = parse_time)]
    died_before: Option<SystemTime>,
}

#[derive(Debug, clap::Args)]
struct Apply {
    /// Rows to take in this call, at most 1000 (lowest ids first).
    #[arg(long, default_value_t = 100)]
    limit: u32,
    /// Apply: without it, only print what would be done.
    #[arg(long)]
    yes: bool,
}

/// RFC 3339, or a duration meaning "that long ago".
fn parse_time(text: &str) -> Result<SystemTime, String> {
    if let Ok(ago) = humantime::parse_duration(text) {
        return SystemTime::now()
            .checked_sub(ago)
            .ok_or_else(|| format!("{text} ago is before the epoch"));
    }
    humantime::parse_rfc3339_weak(text).map_err(|_| {
        format!("{text:?} is neither a time (2026-12-03T09:00:00Z) nor a duration ago (1h)")
    })
}

impl Select {
    fn selector(self) -> DeadLetterSelector {
        DeadLetterSelector {
            ids: self.ids,
            topic: self.topic,
            key: self.key,
            error_contains: self.error_contains,
            died_after: self.died_after.map(prost_types::Timestamp::from),
            died_before: self.died_before.map(prost_types::Timestamp::from),
        }
    }
}

pub async fn run(context: &mut Context, args: Args) -> Result<(), CliError> {
    let outbox = context.outbox().await?;
    match args.command {
        DeadCommand::List {
            select,
            after_id,
            limit,
        } => list(context, outbox, select, after_id, limit).await,
        DeadCommand::Count { select } => count(context, outbox, select).await,
        DeadCommand::Redrive {
            select,
            delay,
            apply,
        } => {
            let request = RedriveDeadLettersRequest {
                outbox: outbox.clone(),
                selector: Some(select.selector()),
                limit: apply.limit,
                delay: delay.map(|delay| prost_types::Duration {
                    seconds: delay.as_secs() as i64,
                    nanos: delay.subsec_nanos() as i32,
                }),
                dry_run: !apply.yes,
            };
            let done = context
                .admin()
                .await?
                .redrive_dead_letters(request)
                .await?
                .into_inner();
            report(context, &outbox, "re-drive", apply.yes, &done)
        }
        DeadCommand::Discard { select, apply } => {
            let request = DiscardDeadLettersRequest {
                outbox: outbox.clone(),
                selector: Some(select.selector()),
                limit: apply.limit,
                dry_run: !apply.yes,
            };
            let done = context
                .admin()
                .await?
                .discard_dead_letters(request)
                .await?
                .into_inner();
            report(context, &outbox, "discard", apply.yes, &done)
        }
    }
}

async fn list(
    context: &mut Context,
    outbox: String,
    select: Select,
    after_id: i64,
    limit: u32,
) -> Result<(), CliError> {
    let page = context
        .admin()
        .await?
        .list_dead_letters(ListDeadLettersRequest {
            outbox: outbox.clone(),
            selector: Some(select.selector()),
            after_id,
            limit,
        })
        .await?
        .into_inner();
    match context.format_or(Format::Table) {
        Format::Json => print_json(&json!({
            "outbox": outbox,
            "dead_letters": page.dead_letters.iter().map(row_json).collect::<Vec<_>>(),
            "next_after_id": (page.next_after_id != 0).then_some(page.next_after_id),
            "truncated": page.truncated,
        })),
        Format::Table => {
            let rows: Vec<Vec<String>> = page.dead_letters.iter().map(row_cells).collect();
            print_table(
                &["ID", "TOPIC", "KEY", "ATTEMPTS", "DIED", "LAST ERROR"],
                &rows,
            )?;
            if page.truncated {
                println!("page cut short to fit one response (server.max_message_bytes)");
            }
            if page.next_after_id != 0 {
                println!("more: add --after-id {}", page.next_after_id);
            }
            Ok(())
        }
    }
}

async fn count(context: &mut Context, outbox: String, select: Select) -> Result<(), CliError> {
    let counts = context
        .admin()
        .await?
        .count_dead_letters(CountDeadLettersRequest {
            outbox: outbox.clone(),
            selector: Some(select.selector()),
        })
        .await?
        .into_inner();
    match context.format_or(Format::Table) {
        Format::Json => print_json(&json!({
            "outbox": outbox,
            "total": counts.total,
            "counts": counts.counts.iter().map(|c| json!({
                "topic": c.topic, "error": c.error, "count": c.count,
            })).collect::<Vec<_>>(),
        })),
        Format::Table => {
            let rows: Vec<Vec<String>> = counts
                .counts
                .iter()
                .map(|c| vec![c.count.to_string(), c.topic.clone(), one_line(&c.error)])
                .collect();
            print_table(&["COUNT", "TOPIC", "ERROR"], &rows)?;
            println!("{} dead rows in outbox {outbox}", counts.total);
            Ok(())
        }
    }
}

fn report(
    context: &Context,
    outbox: &str,
    action: &str,
    applied: bool,
    done: &DeadLetterActionResponse,
) -> Result<(), CliError> {
    match context.format_or(Format::Table) {
        Format::Json => print_json(&json!({
            "outbox": outbox,
            "action": action,
            "dry_run": !applied,
            "ids": done.ids,
            "more": done.more,
        })),
        Format::Table => {
            let ids: Vec<String> = done.ids.iter().map(i64::to_string).collect();
            let ids = if ids.is_empty() {
                "none".to_owned()
            } else {
                ids.join(", ")
            };
            if applied {
                println!(
                    "{action}: {} rows of outbox {outbox}: {ids}",
                    done.ids.len()
                );
                if done.more {
                    println!("more dead rows match: run the same command again to go on");
                }
            } else {
                println!(
                    "dry run: would {action} {} rows of outbox {outbox}: {ids}",
                    done.ids.len()
                );
                if done.more {
                    println!("(more match than --limit; each run takes the next ones)");
                }
                println!("add --yes to apply");
            }
            Ok(())
        }
    }
}

fn time(at: &Option<prost_types::Timestamp>) -> Option<String> {
    let at = at.as_ref()?;
    let at = SystemTime::try_from(*at).ok()?;
    Some(humantime::format_rfc3339_seconds(at).to_string())
}

fn row_json(row: &DeadLetter) -> serde_json::Value {
    json!({
        "id": row.id,
        "topic": row.topic,
        "key": row.key,
        "payload": (!row.payload_omitted).then(|| String::from_utf8_lossy(&row.payload)),
        "payload_omitted_bytes": row.payload_omitted.then_some(row.stored_bytes),
        "headers": row.headers,
        "attempts": row.attempts,
        "last_error": row.last_error,
        "created_at": time(&row.created_at),
        "died_at": time(&row.died_at),
    })
}

fn row_cells(row: &DeadLetter) -> Vec<String> {
    vec![
        row.id.to_string(),
        row.topic.clone(),
        row.key.clone().unwrap_or_else(|| "-".to_owned()),
        row.attempts.to_string(),
        time(&row.died_at).unwrap_or_else(|| "-".to_owned()),
        one_line(&row.last_error),
    ]
}

/// An error text on one table line: newlines shown as spaces, cut at 120 characters.
fn one_line(text: &str) -> String {
    let line: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(120)
        .collect();
    if text.chars().count() > 120 {
        format!("{line}...")
    } else {
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339_or_a_duration_ago() {
        let ago = parse_time("1h").unwrap();
        let elapsed = SystemTime::now().duration_since(ago).unwrap();
        assert!(elapsed >= Duration::from_secs(3600));
        assert!(parse_time("2026-12-03T09:00:00Z").is_ok());
        assert!(parse_time("yesterday").unwrap_err().contains("neither"));
    }

    #[test]
    fn errors_fit_one_line() {
        assert_eq!(one_line("a\nb"), "a b");
        assert!(one_line(&"x".repeat(200)).ends_with("..."));
    }
}
