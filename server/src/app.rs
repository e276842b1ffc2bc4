//! Assembly: storages from configuration, the relay, the gRPC server, health, drain.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::service::Routes;
use tonic::transport::Server;
use txoutbox_proto::v1::admin_server::AdminServer;
use txoutbox_proto::v1::relay_server::RelayServer;

use crate::config::columns::Columns;
use crate::config::{Backend, Config, OutboxConfig};
use crate::grpc::admin_service::AdminService;
use crate::grpc::relay_service::RelayService;
use crate::health::{self, Readiness};
use crate::relay::drain::Drain;
use crate::relay::{Outbox, Relay};
use crate::security;
use crate::security::caps::Caps;
use crate::security::layer::AuthLayer;
use crate::security::reload::ReloadingAccess;
use crate::security::tls::ReloadingTls;
use crate::storage::groups::GroupStore;
use crate::storage::mysql::{self, MySqlStorage};
use crate::storage::postgres::groups::PostgresGroups;
use crate::storage::postgres::{self, PostgresExtras, PostgresStorage};
use crate::storage::sqlite::groups::SqliteGroups;
use crate::storage::sqlite::{self, SqlitePools, SqliteStorage};
use crate::storage::timed::Timed;
use crate::storage::{Storage, StorageError, TableOptions};
use crate::telemetry::metrics::{Metrics, PoolUsage};
use crate::telemetry::{depth, http as metrics_http};

/// Extra time, past the drain timeout, for subscriptions to give their leases back.
const GIVE_BACK_GRACE: Duration = Duration::from_secs(5);

/// The connections of one `[databases.NAME]`, shared by its outboxes.
enum Pools {
    Postgres(sqlx::PgPool),
    Sqlite(SqlitePools),
    MySql(sqlx::MySqlPool),
}

/// Which connections a storage gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Purpose {
    /// The relay's work: `databases.NAME.max_connections` per database.
    Relay,
    /// The health checks: one connection per database of their own, so a pool busy with
    /// claims (or starved by them) never turns an outbox NOT_SERVING; no insert listener.
    Health,
    /// The depth gauges' counts (`telemetry::depth`): one connection per database of
    /// their own too, so a slow count (a big backlog, a table lock) never holds the
    /// health checks' connection. Opened only with `server.metrics_listen`.
    Depth,
}

/// Opens a storage per outbox, sharing one connection pool per database. Pools connect
/// lazily: a database that is down at start makes its outboxes NOT_SERVING, not the
/// server fail.
pub fn open_storages(config: &Config) -> anyhow::Result<BTreeMap<String, Arc<dyn Storage>>> {
    open_storages_for(config, Purpose::Relay)
}

fn open_storages_for(
    config: &Config,
    purpose: Purpose,
) -> anyhow::Result<BTreeMap<String, Arc<dyn Storage>>> {
    let pools = open_pools(config, purpose)?;
    storages_on(config, &pools, purpose)
}

/// One pool (SQLite: a writer and a reader pool) per `[databases.NAME]`, connecting lazily.
fn open_pools(config: &Config, purpose: Purpose) -> anyhow::Result<BTreeMap<String, Pools>> {
    let mut pools = BTreeMap::new();
    for (name, database) in &config.databases {
        let size = match purpose {
            Purpose::Relay => database.max_connections,
            Purpose::Health | Purpose::Depth => 1,
        };
        let url = database.url.expose();
        let timeouts = database.timeouts();
        let pool = match database.url.backend() {
            // A file: no link to lose, and its writers queue for the write lock longer
            // than a server's acquire timeout (see `sqlite::lazy_pools`); the call
            // deadline of `Timed` still applies.
            Backend::Sqlite => sqlite::lazy_pools(url, size).map(Pools::Sqlite),
            Backend::MySql => mysql::lazy_pool_with(url, size, timeouts).map(Pools::MySql),
            Backend::Postgres => {
                let synchronous_commit = database.synchronous_commit.unwrap_or_default();
                postgres::lazy_pool_with(url, size, synchronous_commit, timeouts)
                    .map(Pools::Postgres)
            }
        }
        .with_context(|| format!("databases.{name}"))?;
        pools.insert(name.clone(), pool);
    }
    Ok(pools)
}

/// A storage per outbox on the pools of its database.
fn storages_on(
    config: &Config,
    pools: &BTreeMap<String, Pools>,
    purpose: Purpose,
) -> anyhow::Result<BTreeMap<String, Arc<dyn Storage>>> {
    let mut storages: BTreeMap<String, Arc<dyn Storage>> = BTreeMap::new();
    for (name, outbox) in &config.outboxes {
        let database = &config.databases[&outbox.database];
        let options = table_options(outbox, config.server.max_message_bytes)?;
        let storage: Arc<dyn Storage> = match &pools[&outbox.database] {
            Pools::Postgres(pool) => {
                let extras = PostgresExtras {
                    schema: outbox.schema.clone(),
                    // The health checks' storages do not listen for inserts.
                    notify_channel: outbox
                        .notify_channel
                        .clone()
                        .filter(|_| purpose == Purpose::Relay),
                };
                Arc::new(
                    PostgresStorage::from_pool(
                        pool.clone(),
                        Some(database.url.expose()),
                        options,
                        extras,
                    )
                    .with_context(|| format!("outboxes.{name}"))?,
                )
            }
            // `schema` and `notify_channel` are refused for SQLite by configuration.
            Pools::Sqlite(pools) => Arc::new(
                SqliteStorage::from_pools(pools.clone(), options)
                    .with_context(|| format!("outboxes.{name}"))?,
            ),
            // `schema` names the database holding the table; `notify_channel` is refused
            // for MySQL by configuration.
            Pools::MySql(pool) => Arc::new(
                MySqlStorage::from_pool(pool.clone(), options, outbox.schema.clone())
                    .with_context(|| format!("outboxes.{name}"))?,
            ),
        };
        let storage = Timed::new(storage, &outbox.database, database.timeouts());
        storages.insert(name.clone(), Arc::new(storage));
    }
    Ok(storages)
}

/// The group tables of every outbox that declares groups, on the relay's pools.
/// Configuration refuses groups on MySQL.
fn group_stores_on(
    config: &Config,
    pools: &BTreeMap<String, Pools>,
) -> anyhow::Result<BTreeMap<String, Arc<dyn GroupStore>>> {
    let mut stores: BTreeMap<String, Arc<dyn GroupStore>> = BTreeMap::new();
    for (name, outbox) in config.outboxes.iter().filter(|(_, o)| o.has_groups()) {
        let columns = Columns::from_mapping(&outbox.columns)
            .map_err(|problems| anyhow::anyhow!(problems.join("; ")))?;
        let store: Arc<dyn GroupStore> = match &pools[&outbox.database] {
            Pools::Postgres(pool) => Arc::new(PostgresGroups::new(
                pool.clone(),
                outbox.schema.as_deref(),
                &outbox.table,
                &columns,
                outbox.partitions,
                config.server.max_message_bytes as u64,
            )?),
            Pools::Sqlite(pools) => Arc::new(SqliteGroups::new(
                pools.clone(),
                &outbox.table,
                &columns,
                outbox.partitions,
                config.server.max_message_bytes as u64,
            )?),
            Pools::MySql(_) => anyhow::bail!(
                "outboxes.{name}.groups: subscription groups need PostgreSQL or SQLite"
            ),
        };
        let database = &config.databases[&outbox.database];
        let store = Timed::groups(store, &outbox.database, database.timeouts());
        stores.insert(name.clone(), Arc::new(store));
    }
    Ok(stores)
}

/// The table settings every backend takes; configuration validation reports a bad
/// column mapping with its key.
fn table_options(outbox: &OutboxConfig, max_message_bytes: usize) -> anyhow::Result<TableOptions> {
    let columns = Columns::from_mapping(&outbox.columns)
        .map_err(|problems| anyhow::anyhow!(problems.join("; ")))?;
    Ok(TableOptions {
        table: outbox.table.clone(),
        // Groups keep key order themselves, without the heads trigger that makes a
        // producer wait for another's commit.
        strict_ordering: outbox.strict_ordering && !outbox.has_groups(),
        dead_letter_holds_key: outbox.dead_letter_holds_key,
        delete_on_ack: outbox.delete_on_ack,
        visibility_delay: outbox.visibility_delay,
        columns,
        max_row_bytes: max_message_bytes as u64,
    })
}

/// The relay over every configured outbox, counting into `metrics`, which also reads
/// the relay's pools at every scrape.
pub fn build_relay(config: &Config, metrics: &Metrics) -> anyhow::Result<Relay> {
    let pools = open_pools(config, Purpose::Relay)?;
    for (database, pools) in &pools {
        watch_pools(metrics, database, pools);
    }
    let storages = storages_on(config, &pools, Purpose::Relay)?;
    let mut health = open_storages_for(config, Purpose::Health)?;
    let mut depth = match config.server.metrics_listen {
        Some(_) => open_storages_for(config, Purpose::Depth)?,
        None => BTreeMap::new(),
    };
    let mut group_stores = group_stores_on(config, &pools)?;
    let outboxes = storages.into_iter().map(|(name, storage)| {
        let outbox_config = config.outboxes[&name].clone();
        let group_store = group_stores.remove(&name);
        let health = health.remove(&name).expect("a health storage per outbox");
        let depth = depth.remove(&name);
        let outbox_metrics = metrics.outbox(&name);
        let outbox = Outbox::new(
            name,
            outbox_config,
            storage,
            config.server.max_message_bytes,
        )
        .with_health_storage(health)
        .with_metrics(outbox_metrics);
        let outbox = match group_store {
            Some(store) => outbox.with_groups(store),
            None => outbox,
        };
        Arc::new(match depth {
            Some(depth) => outbox.with_depth_storage(depth),
            None => outbox,
        })
    });
    Ok(Relay::new(outboxes))
}

/// The pool gauges of `database`: SQLite's writer and readers summed, as one database.
fn watch_pools(metrics: &Metrics, database: &str, pools: &Pools) {
    fn usage<DB: sqlx::Database>(pool: &sqlx::Pool<DB>) -> PoolUsage {
        PoolUsage {
            open: pool.size(),
            idle: pool.num_idle(),
            max: pool.options().get_max_connections(),
        }
    }
    match pools {
        Pools::Postgres(pool) => {
            let pool = pool.clone();
            metrics.watch_pool(database, move || usage(&pool));
        }
        Pools::MySql(pool) => {
            let pool = pool.clone();
            metrics.watch_pool(database, move || usage(&pool));
        }
        Pools::Sqlite(pools) => {
            let pools = pools.clone();
            metrics.watch_pool(database, move || {
                let [writer, reader] = pools.each().map(usage);
                PoolUsage {
                    open: writer.open + reader.open,
                    idle: writer.idle + reader.idle,
                    max: writer.max + reader.max,
                }
            });
        }
    }
}

/// Refuses to start when a reachable outbox table does not fit its column mapping (after
/// `create_schema` added what it could), listing every problem of every outbox. A database
/// that is down or a table not created yet is left to the health watch (NOT_SERVING until it is fixed), so the server can start first.
async fn check_tables(relay: &Relay) -> anyhow::Result<()> {
    let checks = relay.outboxes().map(|outbox| async move {
        match health::verify_or_ensure_table(outbox, true).await {
            Err(error @ StorageError::MismatchedTable { .. }) => {
                Some(format!("outboxes.{}: {error}", outbox.name))
            }
            _ => None,
        }
    });
    let problems: Vec<String> = futures::future::join_all(checks)
        .await
        .into_iter()
        .flatten()
        .collect();
    if problems.is_empty() {
        Ok(())
    } else {
        anyhow::bail!("{}", problems.join("\n"))
    }
}

/// Serves until `shutdown` completes, then drains: no new batches, subscribers get
/// `drain_timeout` to answer, what they still hold is given back, and `run` returns.
pub async fn run(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    // The credentials first: a wrong one stops the start before any database is reached.
    let access = ReloadingAccess::load(&config)?;
    let metrics = Arc::new(Metrics::new());
    let relay = Arc::new(build_relay(&config, &metrics)?);
    check_tables(&relay).await?;
    let metrics_listener = match config.server.metrics_listen {
        Some(address) => Some(TcpListener::bind(address).await.with_context(|| {
            format!("server.metrics_listen = {address}: cannot listen; set a free address")
        })?),
        None => None,
    };
    let drain = Drain::new(config.server.drain_timeout);
    for outbox in relay.outboxes() {
        if let Ok(groups) = outbox.groups() {
            groups.spawn_retention(&drain);
        }
    }
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    let readiness = Arc::new(Readiness::new(relay.outboxes().map(|o| o.name.as_str())));
    let stop_health = CancellationToken::new();
    let health_task = tokio::spawn(health::watch(
        Arc::clone(&relay),
        health_reporter.clone(),
        Arc::clone(&readiness),
        config.server.health_interval,
        stop_health.clone(),
    ));
    let address = listener.local_addr()?;
    let stop_serving = CancellationToken::new();
    let grpc = Grpc {
        relay: &relay,
        access: &access,
        drain: &drain,
        stop: &stop_serving,
    };
    let (mut server, tls) = grpc.serve(&config, listener, Routes::new(health_service))?;
    let stop_metrics = CancellationToken::new();
    let metrics_address = match metrics_listener {
        Some(listener) => Some(serve_metrics(
            listener,
            &relay,
            &metrics,
            &readiness,
            config.server.metrics_depth_interval,
            &stop_metrics,
        )?),
        None => None,
    };
    let outboxes: Vec<&str> = relay.outboxes().map(|o| o.name.as_str()).collect();
    tracing::info!(
        %address,
        metrics_address = metrics_address.map(|a| a.to_string()),
        outboxes = ?outboxes,
        tls = tls,
        mutual_tls = config.server.tls.as_ref().is_some_and(|t| t.client_ca.is_some()),
        identities = config.server.auth.identities.len(),
        "txoutboxd listening"
    );
    if !access.current().enabled() && !address.ip().is_loopback() {
        tracing::warn!(%address, "serving without credentials on an address other machines can reach (server.allow_insecure = true): anyone who reaches it may read and purge every outbox");
    }

    // The metrics stay up through the drain (it is what they show), until `run` returns.
    let _stop_metrics = stop_metrics.drop_guard();
    tokio::select! {
        () = shutdown => {}
        result = &mut server => {
            stop_health.cancel();
            return result.context("server task")?.context("gRPC server failed");
        }
    }

    tracing::info!(timeout = %humantime::format_duration(drain.timeout()), "draining");
    // The watch first: a pass of it still running would set the outboxes SERVING again.
    stop_health.cancel();
    let _ = health_task.await;
    health::mark_draining(&relay, &health_reporter, &readiness).await;
    metrics.set_draining();
    drain.start();
    if tokio::time::timeout(drain.timeout() + GIVE_BACK_GRACE, drain.finished())
        .await
        .is_err()
    {
        tracing::warn!(
            "some subscriptions did not finish in time; their leases expire on their own"
        );
    }
    stop_serving.cancel();
    server
        .await
        .context("server task")?
        .context("gRPC server failed")?;
    tracing::info!("stopped");
    Ok(())
}

/// The gRPC server's shared parts: what its services serve, who may call, the drain they
/// obey, and what stops it.
struct Grpc<'a> {
    relay: &'a Arc<Relay>,
    access: &'a Arc<ReloadingAccess>,
    drain: &'a Drain,
    stop: &'a CancellationToken,
}

/// The task serving gRPC until stopped, with the server's result.
type ServerTask = tokio::task::JoinHandle<Result<(), tonic::transport::Error>>;

impl Grpc<'_> {
    /// Serves the relay, admin, reflection and `health` services on `listener` (over TLS
    /// when configured) until `stop`; also whether it serves TLS.
    fn serve(
        &self,
        config: &Config,
        listener: TcpListener,
        health: Routes,
    ) -> anyhow::Result<(ServerTask, bool)> {
        let reflection = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(txoutbox_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1()
            .context("building the reflection service")?;
        let tls = config
            .server
            .tls
            .as_ref()
            .map(ReloadingTls::load)
            .transpose()
            .context("server.tls")?;
        let caps = Caps::new(&config.server);
        let router = Server::builder()
            // Detects subscribers behind a cut network, so their leases come back promptly.
            .http2_keepalive_interval(Some(Duration::from_secs(10)))
            .http2_keepalive_timeout(Some(Duration::from_secs(10)))
            // Streams per connection: a client opening more waits for one to end (tonic
            // passes "unlimited" to hyper otherwise).
            .max_concurrent_streams(config.server.max_streams_per_connection)
            // A span per call (admin calls included), the parent of the relay's own spans.
            .trace_fn(|request| tracing::info_span!("grpc", path = %request.uri().path()))
            .layer(AuthLayer::new(Arc::clone(self.access), caps.clone()))
            .add_routes(health)
            .add_service(reflection)
            .add_service(RelayServer::new(RelayService::new(
                Arc::clone(self.relay),
                self.drain.clone(),
            )))
            .add_service(AdminServer::new(AdminService::new(Arc::clone(self.relay))));
        let stopped = self.stop.clone().cancelled_owned();
        tokio::spawn(Arc::clone(self.access).watch(self.stop.clone()));
        let server = match &tls {
            Some(tls) => {
                tokio::spawn(Arc::clone(tls).watch(self.stop.clone()));
                let incoming =
                    security::tls::incoming(listener, Arc::clone(tls), &caps, self.stop.clone());
                tokio::spawn(router.serve_with_incoming_shutdown(incoming, stopped))
            }
            None => {
                let incoming = caps.incoming(listener, self.stop.clone(), |stream, _| async move {
                    Some(stream)
                });
                tokio::spawn(router.serve_with_incoming_shutdown(incoming, stopped))
            }
        };
        Ok((server, tls.is_some()))
    }
}

/// Serves the metrics and the probes on `listener`, and refreshes the depth gauges every
/// `depth_interval`, until `stop`; returns the address served.
fn serve_metrics(
    listener: TcpListener,
    relay: &Relay,
    metrics: &Arc<Metrics>,
    readiness: &Arc<Readiness>,
    depth_interval: Duration,
    stop: &CancellationToken,
) -> anyhow::Result<std::net::SocketAddr> {
    let address = listener.local_addr()?;
    let counted = relay
        .outboxes()
        .map(|outbox| depth::Counted {
            outbox: outbox.name.clone(),
            storage: Arc::clone(outbox.depth_storage()),
            metrics: outbox.metrics().clone(),
            groups: outbox.groups().ok().map(|groups| depth::CountedGroups {
                store: Arc::clone(&groups.store),
                groups: groups
                    .names()
                    .filter_map(|name| {
                        let holds = groups.settings(name).ok()?.dead_letter_holds_key;
                        Some((name.to_owned(), holds))
                    })
                    .collect(),
            }),
        })
        .collect();
    tokio::spawn(depth::watch(
        counted,
        Arc::clone(metrics),
        depth_interval,
        stop.clone(),
    ));
    let stopped = stop.clone().cancelled_owned();
    let metrics = Arc::clone(metrics);
    let readiness = Arc::clone(readiness);
    let not_ready: metrics_http::NotReady = Arc::new(move || readiness.problems());
    tokio::spawn(async move {
        if let Err(error) = metrics_http::serve(listener, metrics, not_ready, stopped).await {
            tracing::error!(%error, "the metrics listener failed");
        }
    });
    Ok(address)
}
