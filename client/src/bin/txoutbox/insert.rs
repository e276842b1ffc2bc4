//! `txoutbox insert`: one row through the server (Admin.InsertMessage), for demos only.

use std::collections::HashMap;
use std::io::Read;

use serde_json::json;
use txoutbox_client::proto::v1::InsertMessageRequest;

use super::output::{print_json, Format};
use super::{CliError, Context};

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  txoutbox --outbox orders insert --topic orders.paid --key order-42 '{\"order\": 42}'\n  echo hello | txoutbox insert --topic greetings --header content-type=text/plain -"
)]
pub struct Args {
    /// Topic of the message, for example orders.paid.
    #[arg(long)]
    topic: String,
    /// Ordering key: messages sharing a key are delivered one after another.
    #[arg(long)]
    key: Option<String>,
    /// A header, NAME=VALUE; repeat for more.
    #[arg(long = "header", value_name = "NAME=VALUE", value_parser = parse_header)]
    headers: Vec<(String, String)>,
    /// The payload; `-` reads it from stdin.
    #[arg(value_name = "PAYLOAD")]
    payload: String,
}

fn parse_header(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((name, value)) if !name.is_empty() => Ok((name.to_owned(), value.to_owned())),
        _ => Err(format!("`{text}` is not NAME=VALUE")),
    }
}

pub async fn run(context: &mut Context, args: Args) -> Result<(), CliError> {
    let outbox = context.outbox().await?;
    let payload = if args.payload == "-" {
        let mut payload = Vec::new();
        std::io::stdin()
            .read_to_end(&mut payload)
            .map_err(|error| CliError::Failed(format!("cannot read stdin: {error}")))?;
        payload
    } else {
        args.payload.into_bytes()
    };
    let headers: HashMap<String, String> = args.headers.into_iter().collect();
    let id = context
        .admin()
        .await?
        .insert_message(InsertMessageRequest {
            outbox: outbox.clone(),
            topic: args.topic.clone(),
            key: args.key,
            payload,
            headers,
        })
        .await?
        .into_inner()
        .id;
    match context.format_or(Format::Table) {
        Format::Json => print_json(&json!({ "outbox": outbox, "id": id })),
        Format::Table => {
            println!(
                "inserted message {id} ({}) into outbox {outbox}",
                args.topic
            );
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_are_name_equals_value() {
        assert_eq!(
            parse_header("a=b=c").unwrap(),
            ("a".to_owned(), "b=c".to_owned())
        );
        assert!(parse_header("novalue").is_err());
        assert!(parse_header("=x").is_err());
    }
}
