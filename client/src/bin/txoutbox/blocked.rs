//! `txoutbox blocked`: keys whose oldest pending row is leased or waiting for a retry, or
//! (under `dead_letter_holds_key`) whose later rows wait behind a dead row, so their later
//! rows wait; who holds each (the lease owner), until when (for a dead head: since when),
//! and how many rows wait behind it. Oldest first, a page at a time. With `--group`, the
//! keys of a subscription group held by a row waiting for its retry, or by a dead row
//! (`dead_letter_holds_key`).

use std::time::SystemTime;

use serde_json::json;
use txoutbox_client::proto::prost_types;
use txoutbox_client::proto::v1::{BlockedKey, ListBlockedKeysRequest};

use super::output::{print_json, print_table, Format};
use super::{CliError, Context};

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  txoutbox --outbox orders blocked\n  txoutbox --outbox orders blocked --after-id 1234 --format json\n  txoutbox --outbox orders blocked --group search"
)]
pub struct Args {
    /// Keys whose head id is above this one (the `next` of the previous page).
    #[arg(long, default_value_t = 0, value_name = "ID")]
    after_id: i64,
    /// Keys per page, at most 1000.
    #[arg(long, default_value_t = 50)]
    limit: u32,
    /// The keys held in this subscription group (an outbox with groups needs one).
    #[arg(long, value_name = "GROUP")]
    group: Option<String>,
}

pub async fn run(context: &mut Context, args: Args) -> Result<(), CliError> {
    let outbox = context.outbox().await?;
    let page = context
        .admin()
        .await?
        .list_blocked_keys(ListBlockedKeysRequest {
            outbox: outbox.clone(),
            after_id: args.after_id,
            limit: args.limit,
            group: args.group.clone().unwrap_or_default(),
        })
        .await?
        .into_inner();
    match context.format_or(Format::Table) {
        Format::Json => print_json(&json!({
            "outbox": outbox,
            "group": args.group,
            "keys": page.keys.iter().map(key_json).collect::<Vec<_>>(),
            "next_after_id": (page.next_after_id != 0).then_some(page.next_after_id),
        })),
        Format::Table => {
            let rows: Vec<Vec<String>> = page.keys.iter().map(key_cells).collect();
            print_table(
                &[
                    "KEY",
                    "HEAD",
                    "STATE",
                    "OWNER",
                    "ATTEMPTS",
                    "SINCE",
                    "UNTIL",
                    "BEHIND",
                    "LAST ERROR",
                ],
                &rows,
            )?;
            if page.next_after_id != 0 {
                println!("more: add --after-id {}", page.next_after_id);
            }
            Ok(())
        }
    }
}

fn time(at: &Option<prost_types::Timestamp>) -> Option<String> {
    let at = SystemTime::try_from((*at)?).ok()?;
    Some(humantime::format_rfc3339_seconds(at).to_string())
}

fn key_json(key: &BlockedKey) -> serde_json::Value {
    json!({
        "key": key.key,
        "head_id": key.head_id,
        "state": key.state,
        "owner": key.owner,
        "attempts": key.attempts,
        "last_error": key.last_error,
        "head_created_at": time(&key.head_created_at),
        "until": time(&key.until),
        "waiting_behind": key.waiting_behind,
    })
}

fn key_cells(key: &BlockedKey) -> Vec<String> {
    let dash = || "-".to_owned();
    vec![
        key.key.clone(),
        key.head_id.to_string(),
        key.state.clone(),
        key.owner.clone().unwrap_or_else(dash),
        key.attempts.to_string(),
        time(&key.head_created_at).unwrap_or_else(dash),
        match (key.state.as_str(), time(&key.until)) {
            ("dead", Some(died)) => format!("died {died}"),
            (_, until) => until.unwrap_or_else(dash),
        },
        key.waiting_behind.to_string(),
        key.last_error
            .as_deref()
            .map(|error| error.replace(char::is_control, " "))
            .unwrap_or_else(dash),
    ]
}
