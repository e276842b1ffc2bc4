//! Every end-to-end test in one binary: a module per concern, in the files beside this
//! one. One binary links the client (librdkafka, the brokers' clients) and the harness once
//! instead of once per file, which is most of the suite's build time.
//!
//! Run one concern with nextest's filters, for example
//! `scripts/test -E 'test(security::)'` or `-E 'test(/^python_client::/)'`.

#[path = "client_common/mod.rs"]
mod client_common;
#[path = "kafka_common/mod.rs"]
mod kafka_common;

#[path = "bench_quick.rs"]
mod bench_quick;
#[path = "broker_amqp.rs"]
mod broker_amqp;
#[path = "broker_aws.rs"]
mod broker_aws;
#[path = "broker_mqtt.rs"]
mod broker_mqtt;
#[path = "broker_nats.rs"]
mod broker_nats;
#[path = "broker_redis.rs"]
mod broker_redis;
#[path = "broker_tls.rs"]
mod broker_tls;
#[path = "broker_webhook.rs"]
mod broker_webhook;
#[path = "broker_webhook_batch.rs"]
mod broker_webhook_batch;
#[path = "cli.rs"]
mod cli;
#[path = "cli_client.rs"]
mod cli_client;
#[path = "client_errors.rs"]
mod client_errors;
#[path = "client_lease.rs"]
mod client_lease;
#[path = "client_ordering.rs"]
mod client_ordering;
#[path = "client_producer.rs"]
mod client_producer;
#[path = "client_restart.rs"]
mod client_restart;
#[path = "client_run_once.rs"]
mod client_run_once;
#[path = "client_stop.rs"]
mod client_stop;
#[path = "cloudevents.rs"]
mod cloudevents;
#[path = "database_passwords.rs"]
mod database_passwords;
#[path = "deploy.rs"]
mod deploy;
#[path = "docs.rs"]
mod docs;
#[path = "e2e.rs"]
mod e2e;
#[path = "faults.rs"]
mod faults;
#[path = "hostile_input.rs"]
mod hostile_input;
#[path = "hostile_limits.rs"]
mod hostile_limits;
#[path = "kafka_delivery.rs"]
mod kafka_delivery;
#[path = "kafka_faults.rs"]
mod kafka_faults;
#[path = "lease_tokens.rs"]
mod lease_tokens;
#[path = "mapped_table.rs"]
mod mapped_table;
#[path = "mariadb.rs"]
mod mariadb;
#[path = "newcomer.rs"]
mod newcomer;
#[path = "node_client.rs"]
mod node_client;
#[path = "observability.rs"]
mod observability;
#[path = "operations.rs"]
mod operations;
#[path = "printed_hints.rs"]
mod printed_hints;
#[path = "probes.rs"]
mod probes;
#[path = "python_client.rs"]
mod python_client;
#[path = "relay_tls.rs"]
mod relay_tls;
#[path = "replica_stall.rs"]
mod replica_stall;
#[path = "security.rs"]
mod security;
#[path = "setup_script.rs"]
mod setup_script;
#[path = "sqlite.rs"]
mod sqlite;
#[path = "subscribe.rs"]
mod subscribe;
#[path = "timeouts.rs"]
mod timeouts;
#[path = "traces.rs"]
mod traces;
#[path = "unary_and_admin.rs"]
mod unary_and_admin;
#[path = "version.rs"]
mod version;
