//! `txoutbox purge --older-than 7d`: delete delivered rows delivered longer ago than that.

use std::time::Duration;

use serde_json::json;
use txoutbox_client::proto::{prost_types, v1::PurgeRequest};

use super::output::{print_json, Format};
use super::{CliError, Context};

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  txoutbox --outbox orders purge --older-than 7d\n  txoutbox --outbox orders purge --older-than 12h --format json"
)]
pub struct Args {
    /// Delete rows delivered longer ago than this: 7d, 12h, 30m...
    /// Pending and dead-lettered rows are never purged.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    older_than: Duration,
}

pub async fn run(context: &mut Context, args: Args) -> Result<(), CliError> {
    let outbox = context.outbox().await?;
    let older_than = prost_types::Duration {
        seconds: args.older_than.as_secs() as i64,
        nanos: args.older_than.subsec_nanos() as i32,
    };
    let deleted = context
        .admin()
        .await?
        .purge(PurgeRequest {
            outbox: outbox.clone(),
            older_than: Some(older_than),
        })
        .await?
        .into_inner()
        .deleted;
    match context.format_or(Format::Table) {
        Format::Json => print_json(&json!({ "outbox": outbox, "deleted": deleted })),
        Format::Table => {
            println!(
                "deleted {deleted} delivered rows older than {} from outbox {outbox}",
                humantime::format_duration(args.older_than)
            );
            Ok(())
        }
    }
}
