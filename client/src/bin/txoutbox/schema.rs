//! `txoutbox schema`: the DDL of an outbox's table (Admin.Schema), for a migration tool.

use serde_json::json;
use txoutbox_client::proto::v1::SchemaRequest;

use super::output::{print_json, Format};
use super::{CliError, Context};

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  txoutbox schema orders > migrations/0001_outbox.sql\n  txoutbox --outbox orders schema | psql \"$DATABASE_URL\""
)]
pub struct Args {
    /// The outbox (default: --outbox, or the server's only outbox).
    #[arg(value_name = "OUTBOX")]
    outbox: Option<String>,
}

pub async fn run(context: &mut Context, args: Args) -> Result<(), CliError> {
    let outbox = match args.outbox {
        Some(outbox) => outbox,
        None => context.outbox().await?,
    };
    let sql = context
        .admin()
        .await?
        .schema(SchemaRequest {
            outbox: outbox.clone(),
        })
        .await?
        .into_inner()
        .sql;
    // SQL is the table format: it pipes straight into psql.
    match context.format_or(Format::Table) {
        Format::Json => print_json(&json!({ "outbox": outbox, "sql": sql })),
        Format::Table => {
            println!("{}", sql.trim_end());
            Ok(())
        }
    }
}
