//! `txoutboxd`: a transactional-outbox relay served over gRPC.
//!
//! Start reading at [`app::run`], which assembles the pieces:
//! - [`config`]: the TOML file, environment and flag overrides, validation;
//! - [`storage`]: the [`storage::Storage`] trait and one module per backend;
//! - [`relay`]: outboxes, retry policy, and the subscription loop behind `Subscribe`;
//! - [`grpc`]: the services, which only translate protobuf to relay calls;
//! - [`security`]: TLS, credentials and scopes (one tower layer), limits per identity, audit;
//! - [`health`], [`telemetry`]: operations.

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
