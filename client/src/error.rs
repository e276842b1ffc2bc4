//! The errors of the client's public calls.

/// Why a subscriber, worker or connection gave up.
///
/// Transient trouble (a server down or restarting, a broken stream) never shows up here:
/// the subscriber reconnects on its own. These are the failures retrying cannot fix.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// A setting is out of range; the message names it.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A server address is not a valid URI.
    #[error("invalid server address `{address}`: {reason}; use for example http://127.0.0.1:7411")]
    InvalidAddress {
        /// The address as given.
        address: String,
        /// What is wrong with it.
        reason: String,
    },
    /// None of the addresses accepted a connection.
    #[error("cannot connect to any of {addresses:?}: {reason}")]
    Unreachable {
        /// Every address tried.
        addresses: Vec<String>,
        /// The last connection error.
        reason: String,
    },
    /// The server refused the request for a reason retrying cannot fix (unknown outbox,
    /// invalid argument, missing permission...).
    #[error("server {address} refused: {status}")]
    Refused {
        /// The server's address.
        address: String,
        /// The server's answer; its message says what to change.
        status: tonic::Status,
    },
    /// A call failed (for the one-shot [`Worker`](crate::Worker)).
    #[error("call to {address} failed: {status}")]
    Call {
        /// The server's address.
        address: String,
        /// The gRPC status.
        status: tonic::Status,
    },
}

/// Whether a gRPC status means "do not bother retrying": the request itself is wrong.
pub(crate) fn is_permanent(status: &tonic::Status) -> bool {
    use tonic::Code;
    matches!(
        status.code(),
        Code::NotFound
            | Code::InvalidArgument
            | Code::Unauthenticated
            | Code::PermissionDenied
            | Code::Unimplemented
    )
}
