//! `[databases.NAME]`: a connection URL (see `url.rs`), its pool and time bounds, and
//! PostgreSQL's `synchronous_commit`; each backend checks the outbox keys that mean
//! something only there.

use std::time::Duration;

use serde::Deserialize;

use super::url::{mysql_url_names_database, Backend, DatabaseUrl};
use super::OutboxConfig;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseConfig {
    /// Connection URL, for example `postgres://app@127.0.0.1:5432/app` or
    /// `sqlite://outbox.db` (a file, created if missing; relative to the working directory).
    pub url: DatabaseUrl,
    #[serde(default = "default_max_connections")]
    pub max_connections: u32,
    /// PostgreSQL only: `synchronous_commit` of the relay's own sessions (producers keep
    /// theirs); `off` when not set (see [`SynchronousCommit`]).
    #[serde(default)]
    pub synchronous_commit: Option<SynchronousCommit>,
    /// Longest wait for a pooled connection (connecting included); past it the call is
    /// UNAVAILABLE.
    #[serde(default = "default_acquire_timeout", with = "humantime_serde")]
    pub acquire_timeout: Duration,
    /// Longest a statement of the relay may run: the sessions' own limit on PostgreSQL
    /// (`statement_timeout`) and MySQL/MariaDB (`max_execution_time` /
    /// `max_statement_time`), and, with `acquire_timeout`, the deadline of every storage
    /// call on the server's side, which also ends a call whose database went silent.
    #[serde(default = "default_statement_timeout", with = "humantime_serde")]
    pub statement_timeout: Duration,
}

fn default_max_connections() -> u32 {
    10
}

fn default_acquire_timeout() -> Duration {
    Timeouts::default().acquire
}

fn default_statement_timeout() -> Duration {
    Timeouts::default().statement
}

/// Shortest `acquire_timeout` and `statement_timeout`: below it, a busy but healthy
/// database would turn calls UNAVAILABLE.
const MIN_DATABASE_TIMEOUT: Duration = Duration::from_millis(100);

/// PostgreSQL's `synchronous_commit` for the relay's sessions. The default, `off`, lets a
/// claim or an answer return before its commit record reaches the disk: a database crash
/// may then lose the last few hundred milliseconds of claims and acks, which only means
/// redeliveries (at-least-once allows them), while a flush per claim and per ack was the
/// largest cost of a drain (BENCHMARKS.md). `on` (or a replication level) makes every
/// ack durable before it is answered, for a team whose consumers cannot tolerate the
/// redeliveries of a crash. Configured per database: `databases.NAME.synchronous_commit`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SynchronousCommit {
    #[default]
    Off,
    Local,
    On,
    RemoteWrite,
    RemoteApply,
}

impl SynchronousCommit {
    /// The setting as PostgreSQL spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Local => "local",
            Self::On => "on",
            Self::RemoteWrite => "remote_write",
            Self::RemoteApply => "remote_apply",
        }
    }
}

/// The time bounds of one `[databases.NAME]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// Longest wait for a pooled connection (connecting included).
    pub acquire: Duration,
    /// Longest a statement may run (the database's own session limit), and what a call
    /// may spend waiting for its database's answers.
    pub statement: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            acquire: DEFAULT_ACQUIRE_TIMEOUT,
            statement: DEFAULT_STATEMENT_TIMEOUT,
        }
    }
}

/// Short, so an outage surfaces as [`StorageError::Unavailable`] quickly.
pub const DEFAULT_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(3);

/// Far above any statement of the relay (milliseconds under load), below what a client
/// waits before it gives up on a call.
pub const DEFAULT_STATEMENT_TIMEOUT: Duration = Duration::from_secs(30);

impl Timeouts {
    /// What a whole storage call may take: a connection, then its statements' answers.
    pub fn call_deadline(&self) -> Duration {
        self.acquire + self.statement
    }
}

impl Backend {
    /// The problems of the outbox keys that mean something else, or nothing, on this
    /// backend; `key` is `outboxes.NAME`, `database` the name of the outbox's database.
    pub fn check_outbox(
        self,
        key: &str,
        outbox: &OutboxConfig,
        database: &str,
        url: &DatabaseUrl,
        problems: &mut Vec<String>,
    ) {
        match self {
            Self::Postgres => {}
            Self::Sqlite => {
                if outbox.schema.is_some() {
                    problems.push(format!(
                        "{key}.schema: not supported on SQLite (databases.{database} is a \
                         SQLite file, whose tables have no schema): remove it"
                    ));
                }
                if outbox.notify_channel.is_some() {
                    problems.push(format!(
                        "{key}.notify_channel: PostgreSQL only (databases.{database} is a \
                         SQLite file): remove it; SQLite outboxes poll, see {key}.poll"
                    ));
                }
            }
            Self::MySql => {
                if outbox.notify_channel.is_some() {
                    problems.push(format!(
                        "{key}.notify_channel: PostgreSQL only (databases.{database} is \
                         MySQL/MariaDB, which has no LISTEN/NOTIFY): remove it; MySQL \
                         outboxes poll, see {key}.poll"
                    ));
                }
                if outbox.schema.is_none() && !mysql_url_names_database(url.expose()) {
                    problems.push(format!(
                        "{key}.schema: missing, and databases.{database}.url names no \
                         database: set schema to the database holding the table, or end the \
                         URL with /DB"
                    ));
                }
            }
        }
    }
}

impl DatabaseConfig {
    /// The problems of `[databases.NAME]`, each naming its key.
    pub fn validate(&self, name: &str, problems: &mut Vec<String>) {
        let key = format!("databases.{name}");
        match self.url.backend_if_known() {
            Some(backend) => {
                if let Err(why) = backend.check_url(self.url.expose()) {
                    let shown = match backend {
                        // A file path carries no password: shown as written.
                        Backend::Sqlite => format!(" = {:?}", self.url.expose()),
                        Backend::Postgres | Backend::MySql => String::new(),
                    };
                    problems.push(format!("{key}.url{shown}: {why}"));
                }
            }
            None => problems.push(format!(
                "{key}.url: unsupported database URL (scheme of {:?}); supported: \
                 postgres://, mysql:// (or mariadb://), sqlite://PATH",
                self.url.redacted()
            )),
        }
        if self.max_connections == 0 {
            problems.push(format!("{key}.max_connections: must be at least 1"));
        }
        super::check_duration(
            problems,
            &format!("{key}.acquire_timeout"),
            self.acquire_timeout,
            MIN_DATABASE_TIMEOUT,
            "3s",
        );
        super::check_duration(
            problems,
            &format!("{key}.statement_timeout"),
            self.statement_timeout,
            MIN_DATABASE_TIMEOUT,
            "30s",
        );
        let postgres = matches!(self.url.backend_if_known(), Some(Backend::Postgres) | None);
        if self.synchronous_commit.is_some() && !postgres {
            problems.push(format!(
                "{key}.synchronous_commit: PostgreSQL only (this is not a PostgreSQL URL): \
                 remove it"
            ));
        }
    }
}

impl DatabaseConfig {
    /// The time bounds of this database's calls.
    pub fn timeouts(&self) -> Timeouts {
        Timeouts {
            acquire: self.acquire_timeout,
            statement: self.statement_timeout,
        }
    }
}
