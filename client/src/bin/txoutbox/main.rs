//! The `txoutbox` command line: look at an outbox (`tail`, `stats`, `health`, `schema`),
//! keep it small (`purge`), act on dead letters (`dead`), put a demo row in (`insert`), and run a ready relay to a
//! broker (`relay --kafka`, `--nats`, `--amqp`, `--webhook`, `--redis`).
//!
//! One file per command, dispatched by [`Command`]; [`Context`] holds what every command
//! shares (the servers, the outbox, the output format); `exit.rs` holds the exit codes.
//! The binary is built with the crate's `cli` feature and talks to txoutboxd only through
//! the library's public API, like any other user of it; `relay` uses the publishers of
//! `txoutbox_client::brokers`.

mod blocked;
mod command_line;
mod dead;
mod exit;
mod health;
mod insert;
mod output;
mod pause;
mod purge;
mod relay;
mod schema;
mod seek;
mod stats;
mod subscribers;
mod tail;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use std::path::PathBuf;

use txoutbox_client::proto::v1::admin_client::AdminClient;
use txoutbox_client::proto::v1::ListOutboxesRequest;
use txoutbox_client::{Connection, Credentials};

use command_line::Reach;
use exit::CliError;
use output::Format;

/// What `--server` is when neither the flag nor `TXOUTBOX_SERVER` is given: txoutboxd's
/// default listen address.
const DEFAULT_SERVER: &str = "http://127.0.0.1:7411";

const EXAMPLES: &str = "\
Examples:
  txoutbox stats                                 (the only outbox of a local txoutboxd)
  txoutbox --server http://10.0.0.5:7411 --outbox orders stats --format json
  txoutbox --outbox orders tail --count 10       (look at 10 pending messages; they stay pending)
  txoutbox --outbox orders tail --ack            (consume: print and ack, until Ctrl-C)
  txoutbox --outbox orders insert --topic orders.paid --key order-42 '{\"order\": 42}'
  txoutbox --outbox orders purge --older-than 7d
  txoutbox --outbox orders dead count             (dead rows by topic and error)
  txoutbox --outbox orders dead redrive --key order-42 --yes
  txoutbox --outbox orders pause                  (a broker is down: stop delivering)
  txoutbox --outbox orders pause --topic orders.paid   (only that topic's rows wait)
  txoutbox --outbox orders blocked                (keys stuck behind a leased or retrying row)
  txoutbox --outbox orders subscribers            (who is connected, who holds leases)
  txoutbox --outbox orders schema | psql \"$DATABASE_URL\"
  txoutbox health
  txoutbox --outbox orders relay --kafka broker-1:9092,broker-2:9092 --topic-prefix outbox.
  txoutbox --outbox orders relay --nats nats://127.0.0.1:4222

Exit codes:
  0  success
  1  failure (the command ran and failed; `health`: something is not SERVING)
  2  usage: bad arguments or settings
  3  server unreachable, or unavailable right now (retry later)
  4  not found: no such outbox";

#[derive(Debug, Parser)]
#[command(
    name = "txoutbox",
    // The version and the git commit (`build.rs`).
    version = env!("TXOUTBOX_VERSION"),
    about = "Command line of txoutboxd: look at outboxes, keep them small, relay them to a broker",
    after_help = EXAMPLES
)]
struct Cli {
    /// A txoutboxd address; repeat it (or separate with commas) for replicas: the first
    /// that answers is used.
    #[arg(
        long = "server",
        env = "TXOUTBOX_SERVER",
        value_delimiter = ',',
        default_value = DEFAULT_SERVER,
        global = true,
        value_name = "URL"
    )]
    servers: Vec<String>,
    /// The outbox. Optional when the server has only one.
    #[arg(long, env = "TXOUTBOX_OUTBOX", global = true, value_name = "NAME")]
    outbox: Option<String>,
    /// Output format (default: table, except `tail`, which prints JSON lines).
    #[arg(long, value_enum, global = true)]
    format: Option<Format>,
    /// Bearer token of an identity configured on the server (`server.auth`).
    #[arg(
        long,
        env = "TXOUTBOX_TOKEN",
        global = true,
        value_name = "TOKEN",
        hide_env_values = true
    )]
    token: Option<String>,
    /// CA certificate (PEM) that signed the server's certificate; addresses default to
    /// https:// with any --tls-* option (without this one: the system's roots).
    #[arg(long, env = "TXOUTBOX_TLS_CA", global = true, value_name = "FILE")]
    tls_ca: Option<PathBuf>,
    /// Client certificate (PEM) for mutual TLS, with --tls-key.
    #[arg(
        long,
        env = "TXOUTBOX_TLS_CERT",
        global = true,
        value_name = "FILE",
        requires = "tls_key"
    )]
    tls_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(
        long,
        env = "TXOUTBOX_TLS_KEY",
        global = true,
        value_name = "FILE",
        requires = "tls_cert"
    )]
    tls_key: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Subscribe and print each message as a JSON line.
    Tail(tail::Args),
    /// Queue depth and lag: pending, leased, dead, oldest pending age, per topic.
    Stats,
    /// Delete delivered rows older than a duration.
    Purge(purge::Args),
    /// Move a subscription group to the oldest row, now, a row id or a time: replay from
    /// there, or skip a backlog.
    Seek(seek::Args),
    /// Dead-lettered rows: list, count, re-drive (in id order per key) or discard them.
    Dead(dead::Args),
    /// Stop every replica handing out rows of the outbox, or of some topics (`--topic`),
    /// held in the database, until `resume`: streams stay open, answers are still applied.
    Pause(pause::Args),
    /// Lift a `pause` of the outbox, or of some topics (`--topic`).
    Resume(pause::Args),
    /// Keys whose oldest pending row is leased or waiting for a retry, or that a dead row
    /// holds (`dead_letter_holds_key`): who holds them, until when, how many rows wait
    /// behind.
    Blocked(blocked::Args),
    /// The streams connected to the replica that answers (name, owner, address, window,
    /// in flight, answers, since when) and the owners holding leases on every replica.
    Subscribers,
    /// Print the DDL of an outbox's table, for your migration tool.
    Schema(schema::Args),
    /// Health of the server and of each outbox (grpc.health.v1).
    Health,
    /// Insert one message through the server: NOT transactional with your data, for demos
    /// and smoke tests only.
    ///
    /// The row is committed on its own, whatever happens to your business transaction.
    /// Real producers insert outbox rows in their own database transaction, next to the
    /// data they change (the producer helpers of the txoutbox-client crate, or a plain
    /// INSERT).
    Insert(insert::Args),
    /// Relay the outbox to Kafka, NATS JetStream, RabbitMQ, a webhook or Redis Streams
    /// until SIGINT/SIGTERM (a ready publisher in one command).
    Relay(Box<relay::Args>),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("txoutbox: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let default_log = if matches!(cli.command, Command::Relay(_)) {
        "info"
    } else {
        "warn"
    };
    init_logging(default_log);
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("txoutbox: {error}");
            error.exit_code()
        }
    }
}

/// Logs go to stderr (stdout carries the output); `RUST_LOG` chooses the level.
fn init_logging(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

async fn run(cli: Cli) -> Result<(), CliError> {
    let tls = cli.tls_ca.is_some() || cli.tls_cert.is_some();
    let credentials = Credentials::from_files(
        cli.tls_ca.as_deref(),
        cli.tls_cert.as_deref(),
        cli.tls_key.as_deref(),
    )?
    .bearer_token(cli.token.as_deref().unwrap_or_default())?;
    let mut context = Context::new(cli.servers, cli.outbox, cli.format, tls)?;
    context.credentials = credentials;
    // A token from TXOUTBOX_TOKEN is still there when a printed command runs.
    let token_from_env = std::env::var("TXOUTBOX_TOKEN").ok() == cli.token;
    context.reach = Reach {
        servers: context.servers.clone(),
        token_flag: cli.token.is_some() && !token_from_env,
        tls_ca: cli.tls_ca,
        tls_cert: cli.tls_cert,
        tls_key: cli.tls_key,
    };
    match cli.command {
        Command::Tail(args) => tail::run(&mut context, args).await,
        Command::Stats => stats::run(&mut context).await,
        Command::Purge(args) => purge::run(&mut context, args).await,
        Command::Seek(args) => seek::run(&mut context, args).await,
        Command::Dead(args) => dead::run(&mut context, args).await,
        Command::Pause(args) => pause::run(&mut context, args, true).await,
        Command::Resume(args) => pause::run(&mut context, args, false).await,
        Command::Blocked(args) => blocked::run(&mut context, args).await,
        Command::Subscribers => subscribers::run(&mut context).await,
        Command::Schema(args) => schema::run(&mut context, args).await,
        Command::Health => health::run(&mut context).await,
        Command::Insert(args) => insert::run(&mut context, args).await,
        Command::Relay(args) => relay::run(&mut context, *args).await,
    }
}

/// What every command shares.
pub(crate) struct Context {
    /// Server URIs, `http://` added where the scheme was left out.
    servers: Vec<String>,
    outbox: Option<String>,
    format: Option<Format>,
    credentials: Credentials,
    /// The servers and credential options again, for the commands hints print.
    reach: Reach,
    channel: Option<Connection>,
}

impl Context {
    fn new(
        servers: Vec<String>,
        outbox: Option<String>,
        format: Option<Format>,
        tls: bool,
    ) -> Result<Self, CliError> {
        let scheme = if tls { "https" } else { "http" };
        let servers: Vec<String> = servers
            .into_iter()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .map(|s| {
                if s.contains("://") {
                    s
                } else {
                    format!("{scheme}://{s}")
                }
            })
            .collect();
        if servers.is_empty() {
            return Err(CliError::Usage(
                "--server is empty; for example --server http://127.0.0.1:7411".to_owned(),
            ));
        }
        Ok(Self {
            servers,
            outbox: outbox.filter(|o| !o.is_empty()),
            format,
            credentials: Credentials::default(),
            reach: Reach::default(),
            channel: None,
        })
    }

    /// The `txoutbox` command with these `args` that reaches the same servers with the
    /// same credentials, for a hint to print (see `command_line.rs`).
    fn command_line(&self, args: &[&str]) -> String {
        self.reach.command(args)
    }

    /// The output format, or this command's default.
    fn format_or(&self, default: Format) -> Format {
        self.format.unwrap_or(default)
    }

    /// A connection to the first server that answers (made once).
    async fn channel(&mut self) -> Result<Connection, CliError> {
        if let Some(channel) = &self.channel {
            return Ok(channel.clone());
        }
        let channel =
            txoutbox_client::connect_with(self.servers.clone(), self.credentials.clone()).await?;
        self.channel = Some(channel.clone());
        Ok(channel)
    }

    async fn admin(&mut self) -> Result<AdminClient<Connection>, CliError> {
        Ok(AdminClient::new(self.channel().await?).max_decoding_message_size(usize::MAX))
    }

    /// Every configured outbox, by name.
    async fn outbox_names(&mut self) -> Result<Vec<String>, CliError> {
        let listed = self
            .admin()
            .await?
            .list_outboxes(ListOutboxesRequest {})
            .await?
            .into_inner();
        Ok(listed.outboxes.into_iter().map(|o| o.name).collect())
    }

    /// `--outbox`, or the server's only outbox.
    async fn outbox(&mut self) -> Result<String, CliError> {
        if let Some(outbox) = &self.outbox {
            return Ok(outbox.clone());
        }
        let names = self.outbox_names().await?;
        match names.as_slice() {
            [only] => {
                self.outbox = Some(only.clone());
                Ok(only.clone())
            }
            [] => Err(CliError::NotFound(
                "the server has no outbox configured".to_owned(),
            )),
            several => Err(CliError::Usage(format!(
                "the server has {} outboxes; choose one with --outbox (or TXOUTBOX_OUTBOX): {}",
                several.len(),
                several.join(", ")
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn addresses_without_a_scheme_get_http() {
        let context = Context::new(vec!["127.0.0.1:7411".into()], None, None, false).unwrap();
        assert_eq!(context.servers, ["http://127.0.0.1:7411"]);
        let context = Context::new(vec!["relay:7411".into()], None, None, true).unwrap();
        assert_eq!(context.servers, ["https://relay:7411"], "with TLS options");
        assert!(Context::new(vec![" ".into()], None, None, false).is_err());
    }
}
