//! `[databases.NAME]`: a connection URL, held as a secret, and the backend it names,
//! decided once from its scheme; each backend checks its own URL and the outbox keys that
//! mean something only there.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;

use super::OutboxConfig;
use crate::storage::postgres::SynchronousCommit;
use crate::storage::timed::Timeouts;
use crate::storage::{mysql, sqlite};

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

/// The database servers and files the relay works with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// `postgres://` or `postgresql://`.
    Postgres,
    /// `mysql://` or `mariadb://`. An outbox's `schema` is the database (MySQL's "schema")
    /// holding its table.
    MySql,
    /// `sqlite://PATH` or `sqlite:PATH`.
    Sqlite,
}

impl Backend {
    /// The backend a URL's scheme names, if any.
    pub fn of_url(url: &str) -> Option<Self> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Some(Self::Postgres)
        } else if url.starts_with("mysql://") || url.starts_with("mariadb://") {
            Some(Self::MySql)
        } else if url.starts_with("sqlite:") {
            Some(Self::Sqlite)
        } else {
            None
        }
    }

    /// Why `url` cannot be used by this backend, if it cannot: parsed as `run` parses it,
    /// so check-config passes only what run takes.
    fn check_url(self, url: &str) -> Result<(), String> {
        match self {
            Self::Sqlite => sqlite::database_file(url).map(drop),
            Self::Postgres => sqlx::postgres::PgConnectOptions::from_str(url)
                .map(drop)
                .map_err(|why| format!("not a usable PostgreSQL URL: {why}")),
            Self::MySql => mysql::connect_options(url)
                .map(drop)
                .map_err(|why| format!("not a usable MySQL URL: {why:#}")),
        }
    }

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

/// A database URL: a secret (it may carry a password), shown redacted in `Debug` and in
/// messages, with the backend its scheme names.
///
/// Read from a plain string (`from`, not `try_from`): an unsupported scheme is reported by
/// [`DatabaseConfig::validate`] together with every other problem of the configuration,
/// not alone by the parser.
#[derive(Clone, Deserialize)]
#[serde(from = "String")]
pub struct DatabaseUrl {
    secret: SecretString,
    backend: Option<Backend>,
}

impl From<String> for DatabaseUrl {
    fn from(url: String) -> Self {
        Self {
            backend: Backend::of_url(&url),
            secret: url.into(),
        }
    }
}

impl From<&str> for DatabaseUrl {
    fn from(url: &str) -> Self {
        Self::from(url.to_owned())
    }
}

impl DatabaseUrl {
    /// The backend of a validated configuration's URL.
    pub fn backend(&self) -> Backend {
        self.backend
            .expect("configuration validation refuses a URL of no supported backend")
    }

    /// The backend, or `None` when the scheme names none (which validation reports).
    pub fn backend_if_known(&self) -> Option<Backend> {
        self.backend
    }

    /// The URL itself, for the driver.
    pub fn expose(&self) -> &str {
        self.secret.expose_secret()
    }

    /// The URL with its password replaced, for messages and logs.
    pub fn redacted(&self) -> String {
        redact(self.expose())
    }
}

impl fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl DatabaseConfig {
    /// The problems of `[databases.NAME]`, each naming its key.
    pub fn validate(&self, name: &str, problems: &mut Vec<String>) {
        let key = format!("databases.{name}");
        match self.url.backend {
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
        let postgres = matches!(self.url.backend, Some(Backend::Postgres) | None);
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

/// Whether a `mysql://` URL has a database path (`mysql://user@host:3306/db`).
fn mysql_url_names_database(url: &str) -> bool {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let rest = rest.split(['?', '#']).next().unwrap_or_default();
    let after_userinfo = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    after_userinfo
        .split_once('/')
        .is_some_and(|(_, path)| !path.is_empty())
}

/// A URL with its password replaced, for error messages and logs.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let Some((userinfo, host)) = rest.split_once('@') else {
        return url.to_owned();
    };
    match userinfo.split_once(':') {
        Some((user, _password)) => format!("{scheme}://{user}:***@{host}"),
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact("postgres://app:secret@db/app"),
            "postgres://app:***@db/app"
        );
        assert_eq!(redact("postgres://app@db/app"), "postgres://app@db/app");
    }

    #[test]
    fn the_backend_is_named_by_the_scheme_and_the_password_never_shown() {
        let url = DatabaseUrl::from("mariadb://app:secret@db/shop");
        assert_eq!(url.backend(), Backend::MySql);
        assert_eq!(format!("{url:?}"), "mariadb://app:***@db/shop");
        assert_eq!(url.expose(), "mariadb://app:secret@db/shop");
        assert_eq!(Backend::of_url("postgresql://x"), Some(Backend::Postgres));
        assert_eq!(Backend::of_url("sqlite:x.db"), Some(Backend::Sqlite));
        assert_eq!(Backend::of_url("redis://x"), None);
    }
}
