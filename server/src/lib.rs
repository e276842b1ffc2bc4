//! `txoutboxd`: a transactional-outbox relay served over gRPC.
//!
//! Start reading at [`app::run`], which assembles the pieces:
//! - [`config`]: the TOML file, environment and flag overrides, validation; each
//!   database's URL is a secret and names its [`config::Backend`] once; the embedded
//!   default when there is no file; and the values the other layers are built from
//!   ([`config::columns`], [`config::ident`], [`config::Timeouts`]): it imports none of
//!   them;
//! - [`storage`]: the [`storage::Storage`] trait and what every backend shares
//!   ([`storage::TableOptions`], [`storage::names`] with each dialect's quoting,
//!   [`storage::columns`], [`storage::rows`], [`storage::SortedIds`] (the ids a
//!   write-back takes and returns, sorted once by the relay), [`storage::nack`], the
//!   operator's [`storage::dead`], [`storage::pauses`] and [`storage::blocked`], the
//!   purge loop, [`storage::sql_common`] what MySQL and SQLite share), then one module
//!   per backend with the same files (see [`storage`]):
//!   `mod.rs` the trait, each method a call into the file doing the work, `shape.rs` the
//!   table's names, `schema.rs` DDL and the check of a live table, `claim.rs`,
//!   `strict.rs`, `answers.rs`, `admin.rs`, and `convert.rs` errors and rows;
//! - [`relay`]: outboxes, idle polling, retry policy, an identity's bytes in flight
//!   (`relay/bytes_in_flight.rs`), and the subscription loop behind `Subscribe` (its
//!   claiming and answering sides state machines, `relay/subscription/claiming.rs` and
//!   `answering.rs`);
//! - [`grpc`]: the services, which only translate protobuf to relay calls;
//! - [`security`]: TLS, credentials and scopes (one tower layer), limits per identity, audit;
//! - [`health`] (verifies each table; ensures it where `create_schema` allows),
//!   [`telemetry`]: operations.

pub mod app;
pub mod cli;
pub mod config;
pub mod grpc;
pub mod health;
pub mod relay;
pub mod security;
pub mod storage;
pub mod telemetry;

pub use app::run;
pub use config::Config;
