//! Rust client for `txoutboxd`.
//!
//! For now this crate re-exports the generated protocol stubs; the subscriber runtime,
//! producer-side insert helpers and publishers arrive with their own issue. Start with
//! [`proto::v1::relay_client::RelayClient`].

pub use txoutbox_proto as proto;
