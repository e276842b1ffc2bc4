//! A database URL: the backend its scheme names, decided once; the URL itself held as a
//! secret (it may carry a password), shown redacted; and what each backend reads from it
//! (a SQLite file, MySQL's connect options), parsed here as the storage parses it, so
//! `check-config` passes only what `run` takes.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use anyhow::Context;
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use sqlx::mysql::MySqlConnectOptions;
use sqlx::sqlite::SqliteConnectOptions;

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
    pub(super) fn check_url(self, url: &str) -> Result<(), String> {
        match self {
            Self::Sqlite => sqlite_database_file(url).map(drop),
            Self::Postgres => sqlx::postgres::PgConnectOptions::from_str(url)
                .map(drop)
                .map_err(|why| format!("not a usable PostgreSQL URL: {why}")),
            Self::MySql => mysql_connect_options(url)
                .map(drop)
                .map_err(|why| format!("not a usable MySQL URL: {why:#}")),
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

/// Whether a `mysql://` URL has a database path (`mysql://user@host:3306/db`).
pub(super) fn mysql_url_names_database(url: &str) -> bool {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let rest = rest.split(['?', '#']).next().unwrap_or_default();
    let after_userinfo = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    after_userinfo
        .split_once('/')
        .is_some_and(|(_, path)| !path.is_empty())
}

/// The file a `sqlite://PATH` (or `sqlite:PATH`) URL names, or why it names none that
/// a relay can use. Relative paths are relative to the working directory.
pub fn sqlite_database_file(url: &str) -> Result<PathBuf, String> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
        .ok_or_else(|| "expected sqlite://PATH".to_owned())?;
    let path = rest.split_once('?').map_or(rest, |(path, _)| path);
    if path.is_empty() {
        return Err("no file: write sqlite://PATH, for example sqlite://txoutbox.db".to_owned());
    }
    if path == ":memory:" || url.contains("mode=memory") {
        return Err(
            "an in-memory database is private to this process; the relay and your \
                    producers must share a file: write sqlite://PATH"
                .to_owned(),
        );
    }
    let options = SqliteConnectOptions::from_str(url).map_err(|err| err.to_string())?;
    Ok(options.get_filename().to_path_buf())
}

/// Options from a `mysql://` or `mariadb://` URL (the driver knows only the first).
pub fn mysql_connect_options(url: &str) -> anyhow::Result<MySqlConnectOptions> {
    let url = match url.strip_prefix("mariadb://") {
        Some(rest) => format!("mysql://{rest}"),
        None => url.to_owned(),
    };
    // The url is not echoed: it may carry a password.
    MySqlConnectOptions::from_str(&url).context("invalid mysql url")
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

    #[test]
    fn sqlite_urls_name_a_file() {
        assert_eq!(
            sqlite_database_file("sqlite://txoutbox.db").unwrap(),
            PathBuf::from("txoutbox.db")
        );
        assert_eq!(
            sqlite_database_file("sqlite:///var/lib/txoutbox/outbox.db?mode=rwc").unwrap(),
            PathBuf::from("/var/lib/txoutbox/outbox.db")
        );
        assert_eq!(
            sqlite_database_file("sqlite:data/a%3Fb.db").unwrap(),
            PathBuf::from("data/a?b.db")
        );
        for url in ["sqlite::memory:", "sqlite://x.db?mode=memory"] {
            assert!(
                sqlite_database_file(url).unwrap_err().contains("in-memory"),
                "{url}"
            );
        }
        assert!(sqlite_database_file("sqlite://")
            .unwrap_err()
            .contains("no file"));
        assert!(sqlite_database_file("sqlite://x.db?bogus=1").is_err());
    }

    #[test]
    fn mariadb_urls_are_read_as_mysql_urls() {
        let options = mysql_connect_options("mariadb://app:secret@db.internal:3307/shop").unwrap();
        assert_eq!(options.get_host(), "db.internal");
        assert_eq!(options.get_port(), 3307);
        assert_eq!(options.get_database(), Some("shop"));
        assert!(mysql_url_names_database(
            "mysql://root@localhost:3306/test?x=1"
        ));
        assert!(!mysql_url_names_database("mysql://root@localhost:3306/"));
    }
}
