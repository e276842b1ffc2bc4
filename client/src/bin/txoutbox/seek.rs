//! `txoutbox seek --group G --to oldest|now|ID|TIME`: move a subscription group, to
//! replay from a place in the log or to skip a backlog.

use serde_json::json;
use txoutbox_client::proto::prost_types;
use txoutbox_client::proto::v1::{seek_group_request::To, SeekGroupRequest};

use super::output::{print_json, Format};
use super::{CliError, Context};

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  txoutbox --outbox orders seek --group search --to oldest --dry-run\n  txoutbox --outbox orders seek --group search --to 2026-12-01T00:00:00Z\n  txoutbox --outbox orders seek --group kafka --to now     (skip the backlog)\n  txoutbox --outbox orders seek --group kafka --to 1042    (from row 1042 on)"
)]
pub struct Args {
    /// The subscription group to move.
    #[arg(long, value_name = "GROUP")]
    group: String,
    /// Where to: `oldest` (every row the table holds), `now` (skip everything so far), a
    /// row id, or an RFC 3339 time (rows created from then on).
    #[arg(long, value_name = "PLACE")]
    to: String,
    /// Only say how many rows the group would deliver from there.
    #[arg(long)]
    dry_run: bool,
}

fn place(to: &str) -> Result<To, CliError> {
    match to {
        "oldest" => Ok(To::ToOldest(true)),
        "now" => Ok(To::ToNow(true)),
        _ => {
            if let Ok(id) = to.parse::<i64>() {
                return Ok(To::ToId(id));
            }
            let at = humantime::parse_rfc3339_weak(to).map_err(|_| {
                CliError::Usage(format!(
                    "--to {to}: say oldest, now, a row id, or a time like 2026-12-01T00:00:00Z"
                ))
            })?;
            Ok(To::ToTime(prost_types::Timestamp::from(at)))
        }
    }
}

pub async fn run(context: &mut Context, args: Args) -> Result<(), CliError> {
    let outbox = context.outbox().await?;
    let to = place(&args.to)?;
    let moved = context
        .admin()
        .await?
        .seek_group(SeekGroupRequest {
            outbox: outbox.clone(),
            group: args.group.clone(),
            to: Some(to),
            dry_run: args.dry_run,
        })
        .await?
        .into_inner();
    match context.format_or(Format::Table) {
        Format::Json => print_json(&json!({
            "outbox": outbox,
            "group": args.group,
            "to": args.to,
            "dry_run": args.dry_run,
            "rows_ahead": moved.rows_ahead,
        })),
        Format::Table => {
            let verb = if args.dry_run {
                "would deliver"
            } else {
                "delivers"
            };
            println!(
                "group {} of outbox {outbox} {verb} {} rows from {}",
                args.group, moved.rows_ahead, args.to
            );
            Ok(())
        }
    }
}
