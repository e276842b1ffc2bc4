//! How many bytes claimed rows take in a response on the wire, so that
//! [`Claims::claim`](super::Claims::claim) keeps what one response of
//! `server.max_message_bytes` holds. The relay knows no protobuf: these are upper bounds of
//! the encoding, which `grpc::convert`'s tests check against the real thing.

use crate::storage::OutboxMessage;

/// Room for everything of a response but its messages: the batch's lease deadline and the
/// `SubscribeResponse` wrapper (a `ClaimResponse` needs less).
pub const ENVELOPE_BYTES: usize = 64;

/// A message's fixed fields and framing: its own tag and length in the repeated field
/// (6), id (11), attempts (6), created_at (19), and the tags and lengths of topic, key
/// and payload (6 each).
const MESSAGE_OVERHEAD: usize = 64;
/// A message's lease token (see `lease_token.rs`) at its longest: its tag and length (3),
/// `v1.`, an id and an attempt with their dots, and a holder of
/// [`super::limits::MAX_HOLDER_BYTES`].
const TOKEN_BYTES: usize = 3 + 3 + 20 + 1 + 10 + 1 + super::limits::MAX_HOLDER_BYTES;
/// A header's map entry: its tag and length, and those of its name and value (6 each).
const HEADER_OVERHEAD: usize = 18;

/// At least the bytes `message` takes as one element of a response's messages.
pub fn message_bytes(message: &OutboxMessage) -> usize {
    let headers: usize = message
        .headers
        .iter()
        .map(|(name, value)| HEADER_OVERHEAD + name.len() + value.len())
        .sum();
    MESSAGE_OVERHEAD
        + TOKEN_BYTES
        + message.topic.len()
        + message.key.as_ref().map_or(0, String::len)
        + message.payload.len()
        + headers
}
