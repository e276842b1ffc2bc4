//! The database of one fault run, on any backend: the replicas' configuration (through a
//! link of the run's own), the producer's inserts, the rows left unfinished at the end,
//! and the termination of one replica's sessions. Names start `faults_`; the run drops
//! what it created.

use std::net::{SocketAddr, ToSocketAddrs};

use anyhow::Context;
use sqlx::Row;

use super::history::now_us;
use crate::{MariaDb, SqliteDb, TestDb};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    Postgres,
    Mariadb,
    Sqlite,
}

impl Backend {
    /// Whether the replicas reach the database over the network (links to cut, sessions
    /// to terminate). SQLite is a file: its faults are the processes' and the
    /// subscribers' links.
    pub fn networked(self) -> bool {
        self != Self::Sqlite
    }
}

pub enum Database {
    Postgres(TestDb),
    Mariadb(MariaDb),
    Sqlite(SqliteDb),
}

const PREFIX: &str = "faults";
pub const TOPIC: &str = "faults";

/// What every replica's outbox adds to the test configuration: no dead letters from the
/// faults themselves (a row may be claimed by many holders that died), short retries.
const OUTBOX_EXTRA: &str = r#"max_attempts = 1000
backoff.base = "100ms"
backoff.maximum = "1s"
"#;

/// The outbox's groups, each ordered by key, its partitions leased as long as the
/// subscribers' messages: a dead replica's partitions move on as soon as its rows would.
/// On SQLite, longer: its one writer at a time (two replicas' heartbeats, flushes and
/// the producer's inserts) held heartbeats for over 2 s on a busy machine, their
/// partitions ran out and were delivered again by the next owner with no fault at all.
/// Retries are the outbox's ([`OUTBOX_EXTRA`]).
fn groups_config(groups: &[String], backend: Backend) -> String {
    let lease = match backend {
        Backend::Sqlite => 10_000,
        _ => super::processes::LEASE_MS,
    };
    groups
        .iter()
        .map(|group| {
            format!("[outboxes.orders.groups.{group}]\nordering = \"key\"\nlease = \"{lease}ms\"\n")
        })
        .collect()
}

impl Database {
    pub async fn create(backend: Backend) -> Self {
        match backend {
            Backend::Postgres => Self::Postgres(TestDb::with_prefix(PREFIX).await),
            Backend::Mariadb => Self::Mariadb(MariaDb::with_prefix(PREFIX).await),
            Backend::Sqlite => Self::Sqlite(SqliteDb::new().await),
        }
    }

    pub fn backend(&self) -> Backend {
        match self {
            Self::Postgres(_) => Backend::Postgres,
            Self::Mariadb(_) => Backend::Mariadb,
            Self::Sqlite(_) => Backend::Sqlite,
        }
    }

    /// The database server's address, for the links in front of it; none for SQLite.
    pub fn server_address(&self) -> anyhow::Result<Option<SocketAddr>> {
        let url = match self {
            Self::Postgres(db) => &db.url,
            Self::Mariadb(db) => &db.url,
            Self::Sqlite(_) => return Ok(None),
        };
        let authority = host_port(url).context("database url without host:port")?;
        let address = authority
            .to_socket_addrs()?
            .next()
            .with_context(|| format!("{authority} resolves to nothing"))?;
        Ok(Some(address))
    }

    /// The configuration of replica `name`, reaching a networked database through `link`,
    /// its outbox declaring `groups` (none: per-row claims).
    pub fn replica_config(
        &self,
        name: &str,
        link: Option<SocketAddr>,
        groups: &[String],
    ) -> String {
        let extra = format!("{OUTBOX_EXTRA}{}", groups_config(groups, self.backend()));
        let extra = extra.as_str();
        let through = |url: &str| match (link, host_port(url)) {
            (Some(link), Some(authority)) => url.replacen(authority, &link.to_string(), 1),
            _ => url.to_owned(),
        };
        match self {
            Self::Postgres(db) => {
                let url = through(&db.url);
                let separator = if url.contains('?') { '&' } else { '?' };
                let url = format!("{url}{separator}application_name={PREFIX}-{name}");
                db.config_at(&url, extra)
            }
            Self::Mariadb(db) => db.config_at(&through(&db.url), extra),
            Self::Sqlite(db) => db.config(extra),
        }
    }

    /// Inserts one row in a transaction of its own, as a producer's business transaction
    /// would; returns its id once committed, and when (Unix microseconds) the INSERT
    /// statement answered, before the commit.
    pub async fn insert(&self, key: Option<&str>, payload: &[u8]) -> sqlx::Result<(i64, i64)> {
        match self {
            Self::Postgres(db) => {
                let mut tx = db.pool.begin().await?;
                let id = sqlx::query_scalar(&format!(
                    "INSERT INTO {}.outbox (topic, key, payload) VALUES ($1, $2, $3) RETURNING id",
                    db.schema
                ))
                .bind(TOPIC)
                .bind(key)
                .bind(payload)
                .fetch_one(&mut *tx)
                .await?;
                let answered = now_us();
                tx.commit().await?;
                Ok((id, answered))
            }
            Self::Mariadb(db) => {
                let mut tx = db.pool.begin().await?;
                let done =
                    sqlx::query("INSERT INTO outbox (topic, `key`, payload) VALUES (?, ?, ?)")
                        .bind(TOPIC)
                        .bind(key)
                        .bind(payload)
                        .execute(&mut *tx)
                        .await?;
                let answered = now_us();
                tx.commit().await?;
                Ok((done.last_insert_id() as i64, answered))
            }
            Self::Sqlite(db) => {
                let mut tx = db.pool().begin().await?;
                let id = sqlx::query_scalar(
                    "INSERT INTO outbox (topic, key, payload) VALUES (?1, ?2, ?3) RETURNING id",
                )
                .bind(TOPIC)
                .bind(key)
                .bind(payload)
                .fetch_one(&mut *tx)
                .await?;
                let answered = now_us();
                tx.commit().await?;
                Ok((id, answered))
            }
        }
    }

    /// `(id, status)` of every row not delivered (`done`) yet.
    pub async fn unfinished(&self) -> sqlx::Result<Vec<(i64, String)>> {
        let rows = match self {
            Self::Postgres(db) => {
                let sql = format!(
                    "SELECT id, status FROM {}.outbox WHERE status <> 'done'",
                    db.schema
                );
                sqlx::query(&sql)
                    .fetch_all(&db.pool)
                    .await?
                    .into_iter()
                    .map(|row| (row.get(0), row.get(1)))
                    .collect()
            }
            Self::Mariadb(db) => {
                sqlx::query("SELECT id, status FROM outbox WHERE status <> 'done'")
                    .fetch_all(&db.pool)
                    .await?
                    .into_iter()
                    .map(|row| (row.get(0), row.get(1)))
                    .collect()
            }
            Self::Sqlite(db) => sqlx::query("SELECT id, status FROM outbox WHERE status <> 'done'")
                .fetch_all(db.pool())
                .await?
                .into_iter()
                .map(|row| (row.get(0), row.get(1)))
                .collect(),
        };
        Ok(rows)
    }

    /// Ends the database sessions whose client port is one of `ports` (one replica's
    /// connections, as its link records them): `pg_terminate_backend` on PostgreSQL,
    /// `KILL CONNECTION` on MariaDB. Returns how many were ended.
    pub async fn terminate_sessions(&self, ports: &[u16]) -> sqlx::Result<usize> {
        let ports: Vec<i32> = ports.iter().map(|port| i32::from(*port)).collect();
        match self {
            Self::Postgres(db) => {
                // The subquery (fenced by OFFSET 0) picks the sessions before any is
                // terminated: the planner may not evaluate the port test first otherwise.
                let ended: i64 = sqlx::query_scalar(
                    "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM \
                     (SELECT pid FROM pg_stat_activity WHERE client_port = ANY($1) OFFSET 0) s",
                )
                .bind(&ports)
                .fetch_one(&db.pool)
                .await?;
                Ok(ended as usize)
            }
            Self::Mariadb(db) => {
                let sessions =
                    sqlx::query("SELECT ID, HOST FROM information_schema.PROCESSLIST WHERE DB = ?")
                        .bind(&db.database)
                        .fetch_all(&db.pool)
                        .await?;
                let mut ended = 0;
                for session in sessions {
                    let (id, host): (i64, String) = (session.get(0), session.get(1));
                    let port = host.rsplit_once(':').and_then(|(_, p)| p.parse().ok());
                    if port.is_some_and(|port: i32| ports.contains(&port)) {
                        // Gone already is fine: it ended by itself.
                        let _ = sqlx::query(&format!("KILL CONNECTION {id}"))
                            .execute(&db.pool)
                            .await;
                        ended += 1;
                    }
                }
                Ok(ended)
            }
            Self::Sqlite(_) => Ok(0),
        }
    }

    pub async fn drop(self) {
        match self {
            Self::Postgres(db) => db.drop().await,
            Self::Mariadb(db) => db.drop().await,
            Self::Sqlite(db) => db.drop().await,
        }
    }
}

/// The `host:port` of a database URL (`scheme://user@host:port/db?...`).
fn host_port(url: &str) -> Option<&str> {
    let rest = url.split_once("://")?.1;
    let authority = rest.split(['/', '?']).next()?;
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, hp)| hp);
    host_port.contains(':').then_some(host_port)
}

#[cfg(test)]
mod tests {
    use super::host_port;

    #[test]
    fn host_port_of_database_urls() {
        assert_eq!(
            host_port("postgres://postgres@127.0.0.1:5432/test"),
            Some("127.0.0.1:5432")
        );
        assert_eq!(
            host_port("mariadb://root:pw@localhost:3306/db?x=1"),
            Some("localhost:3306")
        );
        assert_eq!(host_port("sqlite:///tmp/x.db"), None);
    }
}
