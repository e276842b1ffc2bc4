//! The `txoutboxd` command line: `run` (the default), `check-config`, `schema`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::config::{self, Backend, Config, Overrides, EMBEDDED_NAME};
use crate::storage::StorageError;
use crate::{app, telemetry};

/// Looked for in the working directory when no `--config` is given.
const DEFAULT_CONFIG_FILE: &str = "txoutboxd.toml";

const EXAMPLES: &str = "\
Examples:
  txoutboxd                    (no configuration: one SQLite outbox `default` in ./txoutbox.db)
  txoutboxd --db /tmp/demo.db  (the same, in another file)
  txoutboxd --config deploy/txoutboxd.example.toml
  txoutboxd --config txoutboxd.toml check-config
  txoutboxd --config txoutboxd.toml schema orders | psql \"$DATABASE_URL\"
  TXOUTBOX_SERVER__LISTEN=0.0.0.0:7411 txoutboxd --config txoutboxd.toml

Any setting can be overridden by an environment variable: TXOUTBOX_ followed by its
key path with __ between levels, for example TXOUTBOX_DATABASES__MAIN__URL.";

#[derive(Debug, Parser)]
#[command(name = "txoutboxd", version = env!("TXOUTBOX_VERSION"), about = "Transactional-outbox relay served over gRPC", after_help = EXAMPLES)]
struct Cli {
    /// Configuration file (TOML). Default: ./txoutboxd.toml if it exists.
    #[arg(long, short, env = "TXOUTBOX_CONFIG", global = true)]
    config: Option<PathBuf>,
    /// Listen address, overriding server.listen.
    #[arg(long, global = true)]
    listen: Option<SocketAddr>,
    /// SQLite file of the embedded default (used when there is no configuration).
    /// Default: ./txoutbox.db, created if missing.
    #[arg(long, value_name = "PATH", global = true)]
    db: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve (the default).
    Run,
    /// Validate the configuration and exit: 0 when valid, 2 with every problem listed.
    CheckConfig,
    /// Print the DDL of an outbox's table, for a migration tool.
    Schema {
        /// Name of a configured outbox.
        outbox: String,
    },
}

pub async fn main() -> ExitCode {
    let cli = Cli::parse();
    let path = cli.config.clone().or_else(|| {
        let default = Path::new(DEFAULT_CONFIG_FILE);
        default.exists().then(|| default.to_path_buf())
    });
    let overrides = Overrides {
        listen: cli.listen,
        db: cli.db.clone(),
    };
    let config = match Config::load(path.as_deref(), &overrides) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("txoutboxd: {error}");
            if path.is_none() {
                eprintln!("hint: pass --config FILE; {}", example_config());
            }
            return ExitCode::from(2);
        }
    };
    match cli.command.unwrap_or(Command::Run) {
        Command::CheckConfig => {
            println!(
                "configuration is valid{}: {} database(s), outboxes: {}",
                if config.embedded_default {
                    " (the embedded default)"
                } else {
                    ""
                },
                config.databases.len(),
                config
                    .outboxes
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            ExitCode::SUCCESS
        }
        Command::Schema { outbox } => schema(&config, &outbox).await,
        Command::Run => serve(config).await,
    }
}

/// Prints the outbox's DDL (idempotent: safe to run on a table that exists). When the
/// database answers, also says on stderr what the live table still lacks, so a team with
/// its own table sees what the statements will add and what only a mapping can fix.
async fn schema(config: &Config, outbox: &str) -> ExitCode {
    if !config.outboxes.contains_key(outbox) {
        let configured: Vec<&str> = config.outboxes.keys().map(String::as_str).collect();
        eprintln!(
            "txoutboxd: outbox `{outbox}` is not configured; configured: {}",
            configured.join(", ")
        );
        return ExitCode::from(2);
    }
    match app::open_storages(config) {
        Ok(storages) => {
            let storage = &storages[outbox];
            println!("{}", storage.schema_sql());
            // Opening a SQLite file that does not exist would create it: not for a command
            // that only prints.
            let url = &config.databases[&config.outboxes[outbox].database].url;
            let absent_file = url.backend() == Backend::Sqlite
                && config::sqlite_database_file(url.expose()).is_ok_and(|file| !file.exists());
            if absent_file {
                return ExitCode::SUCCESS;
            }
            match storage.verify_table().await {
                Ok(()) => eprintln!("txoutboxd: the live table already fits outbox `{outbox}`"),
                Err(
                    error @ (StorageError::MismatchedTable { .. }
                    | StorageError::MissingTable { .. }),
                ) => {
                    eprintln!("txoutboxd: today, {error}")
                }
                Err(_) => {} // Database not reachable from here: the DDL is all we can say.
            }
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("txoutboxd: {error:#}");
            ExitCode::from(2)
        }
    }
}

async fn serve(config: Config) -> ExitCode {
    let provider = match telemetry::traces::provider(&config.telemetry) {
        Ok(provider) => provider,
        Err(error) => {
            eprintln!("txoutboxd: {error:#}; set [telemetry] otlp_endpoint or OTEL_EXPORTER_OTLP_ENDPOINT to a valid URL, or unset them");
            return ExitCode::FAILURE;
        }
    };
    let _telemetry = telemetry::init_with(config.server.log_format, provider);
    let listener = match tokio::net::TcpListener::bind(config.server.listen).await {
        Ok(listener) => listener,
        Err(error) => {
            tracing::error!(listen = %config.server.listen, %error, "cannot listen; set server.listen or --listen to a free address");
            return ExitCode::FAILURE;
        }
    };
    if config.embedded_default {
        announce_embedded_default(&config, &listener);
    }
    match app::run(config, listener, shutdown_signal()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(error = format!("{error:#}"), "txoutboxd failed");
            ExitCode::FAILURE
        }
    }
}

/// The one line that tells a newcomer what runs and how to try it.
fn announce_embedded_default(config: &Config, listener: &tokio::net::TcpListener) {
    let address = listener
        .local_addr()
        .map_or_else(|_| config.server.listen.to_string(), |a| a.to_string());
    let Some(outbox) = config.outboxes.get(EMBEDDED_NAME) else {
        return;
    };
    let table = &outbox.table;
    let file = config
        .databases
        .get(&outbox.database)
        .filter(|database| database.url.backend() == Backend::Sqlite)
        .and_then(|database| config::sqlite_database_file(database.url.expose()).ok());
    let Some(file) = file.map(|file| file.display().to_string()) else {
        // The environment moved the default outbox off SQLite: nothing to demo here.
        tracing::info!(outbox = EMBEDDED_NAME, "serving the embedded default");
        return;
    };
    tracing::info!(
        outbox = EMBEDDED_NAME,
        table,
        file = %file,
        created = !Path::new(&file).exists(),
        // Display (`%`), not Debug: the commands must be copyable as printed.
        insert = %format!(
            r#"sqlite3 {} "INSERT INTO {table} (topic, payload) VALUES ('demo', 'hello')""#,
            shell_word(&file)
        ),
        subscribe = %match example_subscriber() {
            Some(script) => format!("{script} --server {address} --outbox {EMBEDDED_NAME}"),
            None => format!(
                "client/python/subscribe --server {address} --outbox {EMBEDDED_NAME}, in a clone of the txoutbox repository"
            ),
        },
        "no configuration given: serving the embedded default, one outbox in a SQLite file"
    );
}

/// Where to start a configuration file: the example of the sources this binary was built
/// from, as a `--config` that works from here.
fn example_config() -> String {
    match source_file("deploy/txoutboxd.example.toml") {
        Some(example) => format!("start from --config {example}"),
        None => "start from deploy/txoutboxd.example.toml in a clone of the txoutbox repository"
            .to_owned(),
    }
}

/// The Python example subscriber's wrapper, which makes its venv on first use, so the
/// printed command works on a fresh machine. `None` without the sources.
fn example_subscriber() -> Option<String> {
    source_file("client/python/subscribe")
}

/// `path` in the sources this binary was built from, as one shell word that names it from
/// the working directory: relative when the working directory holds it (the README's
/// `cargo run` from the repository root), else absolute. `None` without those sources
/// (a binary copied elsewhere).
fn source_file(path: &str) -> Option<String> {
    let sources = Path::new(env!("CARGO_MANIFEST_DIR")).parent()?;
    let file = sources.join(path);
    if !file.is_file() {
        return None;
    }
    let cwd = std::env::current_dir().ok();
    let shown = cwd
        .and_then(|cwd| file.strip_prefix(cwd).ok().map(Path::to_path_buf))
        .unwrap_or(file);
    Some(shell_word(&shown.display().to_string()))
}

/// `word` as one shell word: as it is when it holds only characters the shell leaves
/// alone, else single-quoted.
fn shell_word(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_-./:=@%+,".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        return word.to_owned();
    }
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// Completes on the first SIGINT or SIGTERM; a second one exits at once.
async fn shutdown_signal() {
    wait_for_signal().await;
    tracing::info!("shutdown signal received; a second signal exits at once");
    tokio::spawn(async {
        wait_for_signal().await;
        tracing::warn!("second signal; exiting without draining");
        std::process::exit(130);
    });
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut terminate = signal(SignalKind::terminate()).expect("installing a SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
}

#[cfg(test)]
mod tests {
    use super::shell_word;

    #[test]
    fn shell_words_are_quoted_only_when_the_shell_would_change_them() {
        assert_eq!(shell_word("txoutbox.db"), "txoutbox.db");
        assert_eq!(
            shell_word("/work/client/python/subscribe"),
            "/work/client/python/subscribe"
        );
        assert_eq!(shell_word("my demo.db"), "'my demo.db'");
        assert_eq!(shell_word("it's.db"), r"'it'\''s.db'");
        assert_eq!(shell_word("$HOME.db"), "'$HOME.db'");
        assert_eq!(shell_word(""), "''");
    }
}
