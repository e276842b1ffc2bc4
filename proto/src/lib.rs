//! The txoutbox v1 protocol: Rust stubs generated from `proto/txoutbox/v1/*.proto`.
//!
//! Servers implement [`v1::relay_server::Relay`] and [`v1::admin_server::Admin`]; clients
//! use [`v1::relay_client::RelayClient`] and [`v1::admin_client::AdminClient`]. Other
//! languages generate their own stubs from the same `.proto` files.

pub mod codec;

pub mod v1 {
    #![allow(clippy::doc_lazy_continuation, clippy::large_enum_variant)]
    tonic::include_proto!("txoutbox.v1");
    // The servers, generated with `crate::codec::RequestCodec` (see build.rs).
    include!(concat!(env!("OUT_DIR"), "/server/txoutbox.v1.rs"));
}

/// The encoded file descriptor set of the protocol, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("txoutbox_descriptor");

/// Proto package of the protocol, for health-check service names and reflection.
pub const PACKAGE: &str = "txoutbox.v1";

pub use prost_types;
