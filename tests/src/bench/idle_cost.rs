//! What idle streams cost the subscriber that has work: one subscriber
//! with no topic filter receives rows a producer inserts at a steady rate, each in its own
//! transaction, while `N` streams whose filter matches nothing stay open and idle; for N
//! in `--idle-cost-streams` (0, 1,000 and 10,000 by default).
//!
//! - **Insert-to-batch latency**: from the producer's `COMMIT` returning to the batch
//!   holding the row arriving at the subscriber (a plain stub stream that acks each batch
//!   at once), over LISTEN/NOTIFY wake-ups.
//! - **Claims per insert**: the server's own counts over the producing phase, from its
//!   `/metrics`: claims that found nothing (`txoutbox_empty_claims_total`) plus the
//!   batches the subscriber received (each one claim that found rows; the idle streams'
//!   topics are never inserted), divided by the rows inserted. Idle polls are in it too.
//! - **Database transactions per insert**: the database's own count
//!   (`pg_stat_database.xact_commit + xact_rollback`) over the producing phase, divided by
//!   the rows inserted. Each measurement gets a database of its own, so nothing else is
//!   counted; the count includes the producer's insert, the claims, the acks, and the
//!   background (health checks, idle polls) of the ~35 s it spans. PostgreSQL publishes a
//!   session's counts at most once a second and an idle session's within 10 s, so the
//!   count is read 11 s after the streams settled and 11 s after the last row arrived.
//!
//! The idle streams share connections, 500 to a connection (`max_streams_per_connection`
//! is 1,000), as publisher processes holding many streams would.
//!
//! [`Filters`] says whose filter each idle stream has: all the same one (one poll group,
//! however many streams), or spread over [`DISTINCT_FILTERS`] filters of their own
//! (`--idle-cost-distinct`): every slot of `max_topic_filters` (64) that the subscriber
//! with work leaves, each a topic that is never inserted, as an outbox whose subscribers
//! each take their own topics would have. The figures say how many streams stayed open
//! (all of them: no filter past the bound is tried).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::stream::{self, StreamExt};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};
use tonic::Code;
use txoutbox_proto::v1::relay_client::RelayClient;
use txoutbox_proto::v1::subscribe_request::Request;
use txoutbox_proto::v1::subscribe_response::Response;
use txoutbox_proto::v1::{AckMessages, OpenSubscription, SubscribeRequest, SubscribeResponse};

use super::drain::{start_server, stop_server, OUTBOX};
use super::latency::Latencies;
use super::workload::wait_until;
use super::Plan;
use crate::Server;

/// Idle streams per connection.
const STREAMS_PER_CONNECTION: usize = 500;
/// Streams opened at once.
const OPENING_CONCURRENCY: usize = 32;
/// Rows per second the producer inserts.
const RATE: f64 = 50.0;
/// Distinct filters of the idle streams with [`Filters::Distinct`]: the default
/// `max_topic_filters` (64) less the subscriber with work's.
pub const DISTINCT_FILTERS: usize = 63;
/// How long PostgreSQL may take to publish a session's transaction counts (quick mode
/// waits a second: its figures mean nothing anyway).
fn stats_delay(plan: &Plan) -> Duration {
    Duration::from_secs(if plan.quick { 1 } else { 11 })
}

#[derive(Debug, Clone)]
pub struct IdleCost {
    pub latencies: Latencies,
    pub transactions_per_insert: f64,
    /// Claims (empty ones and batches) per row inserted.
    pub claims_per_insert: f64,
    /// Idle streams the server accepted.
    pub open: usize,
}

/// The topic filters of the idle streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filters {
    /// Every idle stream filters on `bench.idle`: one poll group.
    Shared,
    /// Idle stream `i` filters on `bench.idle.(i % DISTINCT_FILTERS)`: every group the
    /// server's `max_topic_filters` allows. A stream refused (RESOURCE_EXHAUSTED) would be
    /// counted out.
    Distinct,
}

/// One measurement with `idle` idle streams.
pub async fn measure(plan: &Plan, idle: usize, filters: Filters) -> anyhow::Result<IdleCost> {
    let name = format!(
        "bench_idle_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let admin = PgPoolOptions::new()
        .max_connections(1)
        .connect(&plan.database_url)
        .await?;
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&admin)
        .await?;
    let result = measure_in(plan, &name, idle, filters).await;
    let dropped = sqlx::query(&format!("DROP DATABASE {name} WITH (FORCE)"))
        .execute(&admin)
        .await;
    if let Err(error) = dropped {
        eprintln!("[bench] cannot drop database {name}: {error}");
    }
    admin.close().await;
    result
}

/// `url` with its database replaced by `database`, its query kept.
fn with_database(url: &str, database: &str) -> String {
    let (base, query) = url
        .split_once('?')
        .map_or((url, None), |(b, q)| (b, Some(q)));
    let (server, _) = base.rsplit_once('/').unwrap_or((base, ""));
    match query {
        Some(query) => format!("{server}/{database}?{query}"),
        None => format!("{server}/{database}"),
    }
}

async fn measure_in(
    plan: &Plan,
    database: &str,
    idle: usize,
    filters: Filters,
) -> anyhow::Result<IdleCost> {
    let relay_url = with_database(&plan.relay_url, database);
    let config = format!(
        r#"
[server]
listen = "127.0.0.1:0"
log_format = "json"
drain_timeout = "5s"
metrics_listen = "127.0.0.1:0"

[databases.main]
url = "{relay_url}"

[outboxes.{OUTBOX}]
database = "main"
max_batch_size = {batch}
notify_channel = "bench_wake"
create_schema = true
"#,
        batch = plan.batch_size,
    );
    let server = start_server(plan, &config).await;
    let result = run(plan, &server, database, idle, filters).await;
    stop_server(plan, server, &format!("idle-cost-{idle}-{filters:?}")).await;
    result
}

async fn run(
    plan: &Plan,
    server: &Server,
    database: &str,
    idle: usize,
    filters: Filters,
) -> anyhow::Result<IdleCost> {
    let url = &server.url();
    let work = open_subscriber(url).await?;
    let connections = idle.div_ceil(STREAMS_PER_CONNECTION);
    let mut channels = Vec::with_capacity(connections);
    for _ in 0..connections {
        channels.push(Endpoint::from_shared(url.to_owned())?.connect().await?);
    }
    let opened: Vec<anyhow::Result<Option<IdleStream>>> = stream::iter(0..idle)
        .map(|i| open_idle(channels[i / STREAMS_PER_CONNECTION].clone(), i, filters))
        .buffer_unordered(OPENING_CONCURRENCY)
        .collect()
        .await;
    let idle_streams: Vec<IdleStream> = opened
        .into_iter()
        .collect::<anyhow::Result<Vec<_>>>()?
        .into_iter()
        .flatten()
        .collect();
    let open = idle_streams.len();

    let arrivals: Arc<Mutex<Arrivals>> = Arc::default();
    let subscriber = tokio::spawn(subscribe(work, Arc::clone(&arrivals)));
    let db_url = with_database(&plan.database_url, database);
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .min_connections(8)
        .acquire_timeout(Duration::from_secs(300))
        .connect(&db_url)
        .await?;
    // The streams' first claims and the idle polls settle, and their counts are published.
    tokio::time::sleep(stats_delay(plan)).await;
    let before = transactions(&pool, database).await?;
    let claims_before = claims(server, &arrivals).await?;

    let commits = produce(plan, &pool).await?;
    let total = commits.len();
    wait_until(
        "every produced row to arrive",
        Duration::from_secs(120),
        Duration::from_millis(10),
        || {
            let have = arrivals.lock().unwrap().at.len();
            async move { have >= total }
        },
    )
    .await?;
    let claims_after = claims(server, &arrivals).await?;
    tokio::time::sleep(stats_delay(plan)).await;
    let after = transactions(&pool, database).await?;
    subscriber.abort();
    drop(idle_streams);
    pool.close().await;

    let arrivals = arrivals.lock().unwrap();
    let mut sorted_ms: Vec<f64> = commits
        .iter()
        .filter_map(|(id, committed)| {
            let arrived = arrivals.at.get(id)?;
            Some(arrived.saturating_duration_since(*committed).as_secs_f64() * 1000.0)
        })
        .collect();
    sorted_ms.sort_by(f64::total_cmp);
    Ok(IdleCost {
        latencies: Latencies { sorted_ms },
        transactions_per_insert: (after - before) as f64 / total as f64,
        claims_per_insert: (claims_after - claims_before) as f64 / total as f64,
        open,
    })
}

/// Committed and rolled back transactions of `database` so far, as published.
async fn transactions(pool: &PgPool, database: &str) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT (xact_commit + xact_rollback)::bigint FROM pg_stat_database WHERE datname = $1",
    )
    .bind(database)
    .fetch_one(pool)
    .await?)
}

/// What the subscriber with work received.
#[derive(Default)]
struct Arrivals {
    /// When each row's batch arrived.
    at: HashMap<i64, Instant>,
    /// Batches received.
    batches: u64,
}

/// Claims so far: the server's empty ones and the batches received.
async fn claims(server: &Server, arrivals: &Mutex<Arrivals>) -> anyhow::Result<u64> {
    let batches = arrivals.lock().unwrap().batches;
    let metrics = reqwest::get(server.metrics_url()).await?.text().await?;
    let empty = metrics
        .lines()
        .find(|line| line.starts_with("txoutbox_empty_claims_total{") && line.contains(OUTBOX))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse::<f64>().ok())
        .unwrap_or(0.0);
    Ok(empty as u64 + batches)
}

/// An open stream: dropping it ends the call.
struct IdleStream {
    _requests: mpsc::Sender<SubscribeRequest>,
    _responses: tonic::Streaming<SubscribeResponse>,
}

fn open_request(name: String, topics: Vec<String>, window: u32) -> SubscribeRequest {
    SubscribeRequest {
        request: Some(Request::Open(OpenSubscription {
            group: String::new(),
            outbox: OUTBOX.to_owned(),
            subscriber: name,
            topics,
            max_in_flight: window,
            lease_ms: 0,
        })),
    }
}

/// Opens idle stream `i`; `None` when the server refused its filter as one too many.
async fn open_idle(
    channel: Channel,
    i: usize,
    filters: Filters,
) -> anyhow::Result<Option<IdleStream>> {
    let (requests, rx) = mpsc::channel(4);
    let topic = match filters {
        Filters::Shared => "bench.idle".to_owned(),
        Filters::Distinct => format!("bench.idle.{}", i % DISTINCT_FILTERS),
    };
    requests
        .send(open_request(format!("idle-{i}"), vec![topic], 10))
        .await?;
    let responses = RelayClient::new(channel)
        .subscribe(ReceiverStream::new(rx))
        .await;
    let mut responses = match responses {
        Ok(responses) => responses.into_inner(),
        Err(status) if filters == Filters::Distinct && status.code() == Code::ResourceExhausted => {
            return Ok(None)
        }
        Err(status) => return Err(status.into()),
    };
    match responses.message().await? {
        Some(SubscribeResponse {
            response: Some(Response::Subscribed(_)),
        }) => Ok(Some(IdleStream {
            _requests: requests,
            _responses: responses,
        })),
        other => anyhow::bail!("idle stream {i}: expected `subscribed`, got {other:?}"),
    }
}

/// The subscriber with work's stream: its requests and its responses.
type WorkStream = (
    mpsc::Sender<SubscribeRequest>,
    tonic::Streaming<SubscribeResponse>,
);

/// Opens the subscriber with work (no filter). It opens before the idle streams, as a
/// running deployment's subscribers would: with a filter each, the idle streams take
/// every other slot of `max_topic_filters`, and it would be refused after them.
async fn open_subscriber(url: &str) -> anyhow::Result<WorkStream> {
    let channel = Endpoint::from_shared(url.to_owned())?.connect().await?;
    let (requests, rx) = mpsc::channel(64);
    requests
        .send(open_request("bench-idle-cost".to_owned(), Vec::new(), 100))
        .await?;
    let responses = RelayClient::new(channel)
        .subscribe(ReceiverStream::new(rx))
        .await?
        .into_inner();
    Ok((requests, responses))
}

/// The subscriber with work: records when each row's batch arrives and acks it at once.
async fn subscribe(
    (requests, mut responses): WorkStream,
    arrivals: Arc<Mutex<Arrivals>>,
) -> anyhow::Result<()> {
    while let Some(response) = responses.message().await? {
        if let Some(Response::Batch(batch)) = response.response {
            let now = Instant::now();
            let ids: Vec<i64> = batch.messages.iter().map(|m| m.id).collect();
            {
                let mut arrivals = arrivals.lock().unwrap();
                arrivals.batches += 1;
                arrivals.at.extend(ids.iter().map(|id| (*id, now)));
            }
            let ack = Request::Ack(AckMessages {
                ids,
                lease_tokens: Vec::new(),
            });
            requests
                .send(SubscribeRequest { request: Some(ack) })
                .await?;
        }
    }
    Ok(())
}

/// Inserts at [`RATE`] rows per second for the latency duration, each in its own
/// autocommit `INSERT`; returns (id, when its commit returned).
async fn produce(plan: &Plan, pool: &PgPool) -> anyhow::Result<Vec<(i64, Instant)>> {
    let count = (plan.latency_duration.as_secs_f64() * RATE).ceil() as u64;
    let period = Duration::from_secs_f64(1.0 / RATE);
    let start = tokio::time::Instant::now();
    let mut inserts = tokio::task::JoinSet::new();
    for n in 0..count {
        tokio::time::sleep_until(start + period.mul_f64(n as f64)).await;
        let pool = pool.clone();
        inserts.spawn(async move {
            let id: i64 = sqlx::query_scalar(
                "INSERT INTO outbox (topic, payload) VALUES ('bench.work', $1) RETURNING id",
            )
            .bind(format!("{{\"n\":{n}}}").into_bytes())
            .fetch_one(&pool)
            .await?;
            Ok::<_, sqlx::Error>((id, Instant::now()))
        });
    }
    let mut commits = Vec::with_capacity(count as usize);
    while let Some(joined) = inserts.join_next().await {
        commits.push(joined??);
    }
    Ok(commits)
}

#[cfg(test)]
mod tests {
    use super::with_database;

    #[test]
    fn the_database_of_a_url_is_replaced_and_its_query_kept() {
        assert_eq!(
            with_database("postgres://p@h:5432/test?options[jit]=off", "b"),
            "postgres://p@h:5432/b?options[jit]=off"
        );
        assert_eq!(
            with_database("postgres://p@h/test", "b"),
            "postgres://p@h/b"
        );
    }
}
