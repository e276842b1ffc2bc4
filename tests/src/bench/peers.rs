//! What a user could run instead, on the same keyless backlog in the same run: pgmq
//! (its SQL-only install, `tests/bench/pgmq-1.5.1.sql`), and the physical limit, the
//! least SQL that moves a row from pending to leased to done on this PostgreSQL.
//!
//! - **pgmq**: a database of its own per measurement (pgmq installs into the schema
//!   `pgmq`), the queue made by `pgmq.create`, the rows inserted straight into its table
//!   (what `send_batch` does) with the same ~100-byte JSON; each consumer loops
//!   `pgmq.read(queue, vt, batch)` then `pgmq.delete` (or `pgmq.archive`) of the ids read,
//!   on a connection of its own.
//! - **the limit**: a table of `(id, payload, leased)` with its primary key and nothing
//!   else, half-full pages (`fillfactor = 50`, as txoutboxd's table, so a claim is a HOT
//!   update); a claim is one `UPDATE ... RETURNING` of a batch picked with `SKIP LOCKED`,
//!   an ack one `DELETE` by id; `synchronous_commit = off`. No ordering, no lease deadline,
//!   no attempts, no fencing: what no relay can beat here.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgPool, Row};

use super::pgcost::{row_ops, Cost, CostMeter, RowOps};
use super::workload::BenchSchema;
use super::Plan;

const PGMQ_SQL: &str = include_str!("../../bench/pgmq-1.5.1.sql");
/// pgmq's version, for the table.
pub const PGMQ_VERSION: &str = "1.5.1";
/// The queue's name (its table is `pgmq.q_bench`).
const QUEUE: &str = "bench";
/// Visibility timeout of every read, seconds: far longer than any drain.
const VT_SECONDS: i32 = 600;

/// How a consumer finishes with a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PgmqAck {
    Delete,
    Archive,
}

/// The durability of the consumers' sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// `synchronous_commit = off`, txoutboxd's default.
    Off,
    /// The server's own setting (`on` here, PostgreSQL's default).
    Default,
}

impl Durability {
    pub fn label(self) -> &'static str {
        match self {
            Self::Off => "sync-off",
            Self::Default => "sync-on",
        }
    }

    /// `url` with this durability for its sessions.
    fn url(self, url: &str) -> String {
        match self {
            Self::Off => {
                let separator = if url.contains('?') { '&' } else { '?' };
                format!("{url}{separator}options[synchronous_commit]=off")
            }
            Self::Default => url.to_owned(),
        }
    }
}

/// What a peer's drain measured.
#[derive(Debug, Clone, Copy)]
pub struct PeerResult {
    /// Messages finished per second, from the consumers' start to the last one.
    pub rate: f64,
    pub cost: Cost,
    pub ops: RowOps,
}

/// pgmq drained by `consumers` consumers.
pub async fn pgmq(
    plan: &Plan,
    ack: PgmqAck,
    durability: Durability,
    consumers: usize,
) -> anyhow::Result<PeerResult> {
    let name = format!(
        "bench_pgmq_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let admin = PgPoolOptions::new()
        .max_connections(1)
        .connect(&plan.database_url)
        .await
        .context("cannot connect to PostgreSQL")?;
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&admin)
        .await?;
    let url = database_url(&plan.database_url, &name);
    let result = pgmq_in(plan, &url, ack, durability, consumers).await;
    let dropped = sqlx::query(&format!("DROP DATABASE {name} WITH (FORCE)"))
        .execute(&admin)
        .await;
    if let Err(error) = dropped {
        eprintln!("[bench] cannot drop database {name}: {error}");
    }
    admin.close().await;
    result
}

async fn pgmq_in(
    plan: &Plan,
    url: &str,
    ack: PgmqAck,
    durability: Durability,
    consumers: usize,
) -> anyhow::Result<PeerResult> {
    let setup = PgPoolOptions::new().max_connections(1).connect(url).await?;
    sqlx::raw_sql(PGMQ_SQL)
        .execute(&setup)
        .await
        .context("installing pgmq's SQL")?;
    sqlx::query("SELECT pgmq.create($1)")
        .bind(QUEUE)
        .execute(&setup)
        .await?;
    let rows = plan.rows;
    sqlx::query(&format!(
        "INSERT INTO pgmq.q_{QUEUE} (vt, message) \
         SELECT clock_timestamp(), ('{{\"n\":' || g || ',\"event\":\"order.paid\",\"pad\":\"' \
           || repeat('x', 48) || '\"}}')::jsonb \
         FROM generate_series(1, $1::bigint) AS g"
    ))
    .bind(rows as i64)
    .execute(&setup)
    .await?;
    sqlx::query(&format!("ANALYZE pgmq.q_{QUEUE}"))
        .execute(&setup)
        .await?;

    let finish = match ack {
        PgmqAck::Delete => "SELECT * FROM pgmq.delete($1, $2::bigint[])",
        PgmqAck::Archive => "SELECT * FROM pgmq.archive($1, $2::bigint[])",
    };
    let batch = plan.batch_size as i32;
    let step = move |pool: PgPool| async move {
        // Every column, as pgmq's clients read them.
        let read = sqlx::query("SELECT * FROM pgmq.read($1, $2, $3)")
            .bind(QUEUE)
            .bind(VT_SECONDS)
            .bind(batch)
            .fetch_all(&pool)
            .await?;
        let ids = read
            .iter()
            .map(|row| row.try_get::<i64, _>("msg_id"))
            .collect::<Result<Vec<_>, _>>()?;
        if ids.is_empty() {
            return Ok(0);
        }
        let done: Vec<i64> = sqlx::query_scalar(finish)
            .bind(QUEUE)
            .bind(&ids)
            .fetch_all(&pool)
            .await?;
        Ok(done.len() as u64)
    };
    let result = run_workers(&setup, durability.url(url), consumers, rows, step).await;
    let (rate, cost) = result?;
    let ops = row_ops(&setup, &format!("pgmq.q_{QUEUE}"), 2 * rows, rows).await?;
    setup.close().await;
    Ok(PeerResult { rate, cost, ops })
}

/// The physical limit drained by `workers` workers (see the module docs).
pub async fn limit(plan: &Plan, workers: usize) -> anyhow::Result<PeerResult> {
    let schema = BenchSchema::create(&plan.database_url, "limit").await?;
    let result = limit_in(plan, &schema, workers).await;
    schema.drop().await;
    result
}

async fn limit_in(plan: &Plan, schema: &BenchSchema, workers: usize) -> anyhow::Result<PeerResult> {
    let table = format!("{}.rows", schema.name);
    sqlx::query(&format!(
        "CREATE TABLE {table} (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, \
         payload bytea NOT NULL, leased boolean NOT NULL DEFAULT false) \
         WITH (fillfactor = 50)"
    ))
    .execute(&schema.pool)
    .await?;
    let rows = plan.rows;
    sqlx::query(&format!(
        "INSERT INTO {table} (payload) \
         SELECT convert_to('{{\"n\":' || g || ',\"event\":\"order.paid\",\"pad\":\"' \
           || repeat('x', 48) || '\"}}', 'UTF8') \
         FROM generate_series(1, $1::bigint) AS g"
    ))
    .bind(rows as i64)
    .execute(&schema.pool)
    .await?;
    schema.analyze().await?;
    // The primary key is the cheapest way to the next unleased rows: a sequential scan
    // would step over every finished row's dead tuples at the table's head on each claim.
    let claim = Arc::new(format!(
        "UPDATE {table} SET leased = true WHERE id IN (\
           SELECT id FROM {table} WHERE NOT leased ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED) \
         RETURNING id, payload"
    ));
    let ack = Arc::new(format!("DELETE FROM {table} WHERE id = ANY($1)"));
    let batch = i64::from(plan.batch_size);
    let step = move |pool: PgPool| {
        let (claim, ack) = (Arc::clone(&claim), Arc::clone(&ack));
        async move {
            let claimed: Vec<(i64, Vec<u8>)> =
                sqlx::query_as(&claim).bind(batch).fetch_all(&pool).await?;
            if claimed.is_empty() {
                return Ok(0);
            }
            let ids: Vec<i64> = claimed.iter().map(|(id, _)| *id).collect();
            let done = sqlx::query(&ack).bind(&ids).execute(&pool).await?;
            Ok(done.rows_affected())
        }
    };
    let url = Durability::Off.url(&plan.database_url);
    let (rate, cost) = run_workers(&schema.pool, url, workers, rows, step).await?;
    let ops = row_ops(&schema.pool, &table, 2 * rows, rows).await?;
    Ok(PeerResult { rate, cost, ops })
}

/// Runs `workers` loops of `step` (one claim and its ack, returning the rows finished)
/// on a pool of `workers` connections to `url` until `rows` rows are finished; closes the
/// pool (so its sessions publish their statistics) and returns msg/s and the cost, read
/// on `meter_pool`.
async fn run_workers<F, Fut>(
    meter_pool: &PgPool,
    url: String,
    workers: usize,
    rows: u64,
    step: F,
) -> anyhow::Result<(f64, Cost)>
where
    F: Fn(PgPool) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = anyhow::Result<u64>> + Send,
{
    let pool = PgPoolOptions::new()
        .max_connections(workers as u32)
        .min_connections(workers as u32)
        .connect(&url)
        .await?;
    // Every connection open before the clock starts.
    let warm: Vec<_> = futures::future::join_all((0..workers).map(|_| pool.acquire()))
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    drop(warm);
    let finished = Arc::new(AtomicU64::new(0));
    let meter = CostMeter::start(meter_pool).await?;
    let started = Instant::now();
    let tasks: Vec<_> = (0..workers)
        .map(|_| {
            let (pool, finished, step) = (pool.clone(), Arc::clone(&finished), step.clone());
            tokio::spawn(async move {
                let deadline = Instant::now() + Duration::from_secs(600);
                while finished.load(Ordering::Relaxed) < rows {
                    anyhow::ensure!(Instant::now() < deadline, "the drain did not finish");
                    match step(pool.clone()).await? {
                        0 => tokio::time::sleep(Duration::from_millis(1)).await,
                        n => {
                            finished.fetch_add(n, Ordering::Relaxed);
                        }
                    }
                }
                Ok(())
            })
        })
        .collect();
    for task in tasks {
        task.await??;
    }
    let elapsed = started.elapsed();
    let cost = meter.finish(meter_pool, rows).await?;
    pool.close().await;
    Ok((rows as f64 / elapsed.as_secs_f64(), cost))
}

/// `url` with its database replaced by `database`.
fn database_url(url: &str, database: &str) -> String {
    let (base, query) = url
        .split_once('?')
        .map_or((url, None), |(b, q)| (b, Some(q)));
    let (prefix, _) = base.rsplit_once('/').unwrap_or((base, ""));
    match query {
        Some(query) => format!("{prefix}/{database}?{query}"),
        None => format!("{prefix}/{database}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_database_of_a_url_is_replaced() {
        assert_eq!(
            database_url("postgres://u@h:5432/test", "x"),
            "postgres://u@h:5432/x"
        );
        assert_eq!(
            database_url("postgres://u@h/test?sslmode=disable", "x"),
            "postgres://u@h/x?sslmode=disable"
        );
    }
}
