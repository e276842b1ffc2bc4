//! `txoutbox pause` and `txoutbox resume`: stop every replica handing out rows of an
//! outbox, of some of its topics (`--topic`; a broker is down, being fixed), or to one
//! subscription group (`--group`; the others go on), and start again. The pause is held
//! in the database: replicas started meanwhile obey it too. Streams stay open; `stats`
//! shows it.

use std::time::SystemTime;

use serde_json::json;
use txoutbox_client::proto::prost_types;
use txoutbox_client::proto::v1::{PauseRequest, PausedGroup, PausedTopic, ResumeRequest};

use super::output::{print_json, Format};
use super::{CliError, Context};

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  txoutbox --outbox orders pause\n  txoutbox --outbox orders pause --topic orders.paid --topic orders.refunded\n  txoutbox --outbox orders resume --topic orders.paid\n  txoutbox --outbox orders pause --group search"
)]
pub struct Args {
    /// Only this topic (repeat for several); without it, the whole outbox. `resume`
    /// without it lifts the pause of the whole outbox only: paused topics stay paused.
    #[arg(long = "topic", value_name = "TOPIC", conflicts_with = "group")]
    topics: Vec<String>,
    /// Only this subscription group: its streams get nothing, the other groups go on;
    /// `resume --group` goes on from where it stopped.
    #[arg(long, value_name = "GROUP")]
    group: Option<String>,
}

/// `pause` (true) or `resume` (false).
pub async fn run(context: &mut Context, args: Args, pause: bool) -> Result<(), CliError> {
    let outbox = context.outbox().await?;
    let mut admin = context.admin().await?;
    let topics = args.topics;
    let group = args.group.unwrap_or_default();
    let state = if pause {
        let request = PauseRequest {
            outbox: outbox.clone(),
            topics,
            group,
        };
        admin.pause(request).await?.into_inner()
    } else {
        let request = ResumeRequest {
            outbox: outbox.clone(),
            topics,
            group,
        };
        admin.resume(request).await?.into_inner()
    };
    let since = paused_since(&state.paused_since);
    match context.format_or(Format::Table) {
        Format::Json => print_json(&json!({
            "outbox": outbox,
            "paused_since": since,
            "paused_topics": paused_topics_json(&state.paused_topics),
            "paused_groups": paused_groups_json(&state.paused_groups),
        })),
        Format::Table => {
            match since {
                Some(since) => println!(
                    "outbox {outbox} is paused (since {since}): no replica hands out rows; \
                     resume with {}",
                    context.command_line(&["--outbox", &outbox, "resume"])
                ),
                None => println!("outbox {outbox} is running"),
            }
            print_paused_topics(context, &outbox, &state.paused_topics);
            print_paused_groups(context, &outbox, &state.paused_groups);
            Ok(())
        }
    }
}

/// A pause time for people and scripts: RFC 3339 to the second.
pub fn paused_since(at: &Option<prost_types::Timestamp>) -> Option<String> {
    let at = SystemTime::try_from((*at)?).ok()?;
    Some(humantime::format_rfc3339_seconds(at).to_string())
}

/// The paused topics as a JSON object: topic to the time of its pause.
pub fn paused_topics_json(topics: &[PausedTopic]) -> serde_json::Value {
    topics
        .iter()
        .map(|t| (t.topic.clone(), json!(paused_since(&t.paused_since))))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// One line per paused topic, with the command that resumes it (as printed hints are:
/// with the servers and credentials of this command).
pub fn print_paused_topics(context: &Context, outbox: &str, topics: &[PausedTopic]) {
    for topic in topics {
        let resume = ["--outbox", outbox, "resume", "--topic", &topic.topic];
        println!(
            "topic {} is paused (since {}): resume with {}",
            topic.topic,
            paused_since(&topic.paused_since).unwrap_or_else(|| "-".to_owned()),
            context.command_line(&resume)
        );
    }
}

/// The paused groups as a JSON object: group to the time of its pause.
fn paused_groups_json(groups: &[PausedGroup]) -> serde_json::Value {
    groups
        .iter()
        .map(|g| (g.group.clone(), json!(paused_since(&g.paused_since))))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// One line per paused group, with the command that resumes it.
fn print_paused_groups(context: &Context, outbox: &str, groups: &[PausedGroup]) {
    for group in groups {
        let resume = ["--outbox", outbox, "resume", "--group", &group.group];
        println!(
            "group {} is paused (since {}): resume with {}",
            group.group,
            paused_since(&group.paused_since).unwrap_or_else(|| "-".to_owned()),
            context.command_line(&resume)
        );
    }
}
