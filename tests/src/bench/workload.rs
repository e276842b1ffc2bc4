//! The backlogs the benchmark drains, the schemas that hold them, and how they are
//! loaded: one `INSERT ... SELECT generate_series` and an `ANALYZE`, so a million rows
//! take seconds, not minutes.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use txoutbox_server::storage::postgres::{PostgresExtras, PostgresStorage};
use txoutbox_server::storage::{Storage, TableOptions};

/// Topic of every benchmark row.
pub const TOPIC: &str = "bench";
/// Table name inside each benchmark schema.
pub const TABLE: &str = "outbox";

/// What the backlog looks like.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Workload {
    /// Rows spread round-robin over `keys` keys, strict ordering on.
    Keyed,
    /// No keys, strict ordering off.
    Keyless,
    /// One key holding every row, strict ordering on.
    HotKey,
}

impl Workload {
    pub fn label(self) -> &'static str {
        match self {
            Self::Keyed => "keyed",
            Self::Keyless => "keyless",
            Self::HotKey => "hot-key",
        }
    }

    pub fn describe(self, keys: u64) -> String {
        match self {
            Self::Keyed => format!("{keys} keys, strict"),
            Self::Keyless => "keyless, not strict".to_owned(),
            Self::HotKey => "one hot key, strict".to_owned(),
        }
    }

    /// Rows of this workload's backlog.
    pub fn rows(self, plan: &super::Plan) -> u64 {
        match self {
            Self::HotKey => plan.hot_key_rows,
            _ => plan.rows,
        }
    }

    pub fn strict_ordering(self) -> bool {
        !matches!(self, Self::Keyless)
    }

    /// The SQL expression of row `g`'s key.
    fn key_sql(self, keys: u64) -> String {
        match self {
            Self::Keyed => format!("'k' || (g % {})", keys.max(1)),
            Self::Keyless => "NULL".to_owned(),
            Self::HotKey => "'hot'".to_owned(),
        }
    }
}

/// A schema of its own per measurement, dropped afterwards.
pub struct BenchSchema {
    pub name: String,
    pub pool: PgPool,
}

impl BenchSchema {
    pub async fn create(url: &str, prefix: &str) -> anyhow::Result<Self> {
        let pool = PgPoolOptions::new()
            .max_connections(2)
            .connect(url)
            .await
            .with_context(|| format!("cannot connect to {url} (is PostgreSQL running?)"))?;
        let name = format!(
            "bench_{prefix}_{}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        sqlx::query(&format!("CREATE SCHEMA {name}"))
            .execute(&pool)
            .await?;
        Ok(Self { name, pool })
    }

    /// `schema.outbox`.
    pub fn table(&self) -> String {
        format!("{}.{TABLE}", self.name)
    }

    /// The storage options of the outbox table in this schema.
    pub fn options(&self, strict_ordering: bool) -> (TableOptions, PostgresExtras) {
        let table = TableOptions {
            table: TABLE.to_owned(),
            strict_ordering,
            ..TableOptions::default()
        };
        let extras = PostgresExtras {
            schema: Some(self.name.clone()),
            notify_channel: None,
        };
        (table, extras)
    }

    /// Creates txoutboxd's table (and, if strict, its key-heads table and trigger) the way
    /// the server does, and returns a storage on it with a pool of `connections`.
    pub async fn create_outbox(
        &self,
        url: &str,
        strict_ordering: bool,
        connections: u32,
    ) -> anyhow::Result<Arc<PostgresStorage>> {
        let (options, extras) = self.options(strict_ordering);
        let storage = PostgresStorage::connect(url, connections, options, extras).await?;
        storage.ensure_table().await?;
        Ok(Arc::new(storage))
    }

    /// Appends `rows` rows shaped by `workload` to `table` (columns `topic`, `key`,
    /// `payload`, which both txoutboxd's and the Python original's tables have), then
    /// analyzes the schema's tables.
    pub async fn load(
        &self,
        table: &str,
        workload: Workload,
        keys: u64,
        rows: u64,
    ) -> anyhow::Result<()> {
        let key = workload.key_sql(keys);
        self.load_with_key(table, &key, rows).await
    }

    /// Like [`load`](Self::load) with any key expression over `g` (the row number, from 1).
    pub async fn load_with_key(&self, table: &str, key_sql: &str, rows: u64) -> anyhow::Result<()> {
        // ~100 bytes of JSON per row, like a small domain event.
        sqlx::query(&format!(
            "INSERT INTO {table} (topic, key, payload) \
             SELECT '{TOPIC}', {key_sql}, \
               convert_to('{{\"n\":' || g || ',\"event\":\"order.paid\",\"pad\":\"' \
                 || repeat('x', 48) || '\"}}', 'UTF8') \
             FROM generate_series(1, $1::bigint) AS g"
        ))
        .bind(rows as i64)
        .execute(&self.pool)
        .await
        .with_context(|| format!("loading {rows} rows into {table}"))?;
        self.analyze().await
    }

    /// `ANALYZE` of every table of the schema.
    pub async fn analyze(&self) -> anyhow::Result<()> {
        let tables: Vec<String> = sqlx::query_scalar(
            "SELECT quote_ident(schemaname) || '.' || quote_ident(tablename) \
             FROM pg_tables WHERE schemaname = $1",
        )
        .bind(&self.name)
        .fetch_all(&self.pool)
        .await?;
        for table in tables {
            sqlx::query(&format!("ANALYZE {table}"))
                .execute(&self.pool)
                .await?;
        }
        Ok(())
    }

    /// Rows of `table` with this status.
    pub async fn count(&self, table: &str, status: &str) -> anyhow::Result<i64> {
        Ok(
            sqlx::query_scalar(&format!("SELECT count(*) FROM {table} WHERE status = $1"))
                .bind(status)
                .fetch_one(&self.pool)
                .await?,
        )
    }

    /// Rows left in `table`, whatever their status.
    pub async fn count_all(&self, table: &str) -> anyhow::Result<i64> {
        let sql = format!("SELECT count(*) FROM {table}");
        Ok(sqlx::query_scalar(&sql).fetch_one(&self.pool).await?)
    }

    /// Drops the schema and everything in it.
    pub async fn drop(self) {
        let dropped = sqlx::query(&format!("DROP SCHEMA {} CASCADE", self.name))
            .execute(&self.pool)
            .await;
        if let Err(error) = dropped {
            eprintln!("warning: could not drop schema {}: {error}", self.name);
        }
        self.pool.close().await;
    }
}

/// Waits until `condition` holds, checking every `every`; errors after `deadline`.
pub async fn wait_until<F, Fut>(
    what: &str,
    deadline: Duration,
    every: Duration,
    mut condition: F,
) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = tokio::time::Instant::now();
    while !condition().await {
        if started.elapsed() > deadline {
            anyhow::bail!("timed out after {deadline:?} waiting for {what}");
        }
        tokio::time::sleep(every).await;
    }
    Ok(())
}
