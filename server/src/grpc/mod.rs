//! The gRPC surface: one file per service, one function mapping errors to statuses.
//! Handlers only translate between protobuf and the relay.

pub mod admin_service;
pub mod convert;
pub mod dead_letters;
pub mod groups;
pub mod relay_service;
pub mod status;
