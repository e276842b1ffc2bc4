//! `txoutbox pause` and `txoutbox resume`: stop every replica handing out rows of an
//! outbox (a broker is down, being fixed), and start again. The pause is held in the
//! database: replicas started meanwhile obey it too. Streams stay open; `stats` shows it.

use std::time::SystemTime;

use serde_json::json;
use txoutbox_client::proto::prost_types;
use txoutbox_client::proto::v1::{PauseRequest, ResumeRequest};

use super::output::{print_json, Format};
use super::{CliError, Context};

/// `pause` (true) or `resume` (false).
pub async fn run(context: &mut Context, pause: bool) -> Result<(), CliError> {
    let outbox = context.outbox().await?;
    let mut admin = context.admin().await?;
    let state = if pause {
        let request = PauseRequest {
            outbox: outbox.clone(),
        };
        admin.pause(request).await?.into_inner()
    } else {
        let request = ResumeRequest {
            outbox: outbox.clone(),
        };
        admin.resume(request).await?.into_inner()
    };
    let since = paused_since(&state.paused_since);
    match context.format_or(Format::Table) {
        Format::Json => print_json(&json!({ "outbox": outbox, "paused_since": since })),
        Format::Table => {
            match since {
                Some(since) => println!(
                    "outbox {outbox} is paused (since {since}): no replica hands out rows; \
                     resume with {}",
                    context.command_line(&["--outbox", &outbox, "resume"])
                ),
                None => println!("outbox {outbox} is running"),
            }
            Ok(())
        }
    }
}

/// A pause time for people and scripts: RFC 3339 to the second.
pub fn paused_since(at: &Option<prost_types::Timestamp>) -> Option<String> {
    let at = SystemTime::try_from((*at)?).ok()?;
    Some(humantime::format_rfc3339_seconds(at).to_string())
}
