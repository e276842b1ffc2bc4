//! What the relay accepts from callers, checked before any SQL, each refusal an
//! [`RelayError::InvalidArgument`] naming the field and the limit:
//!
//! - **names** (`worker_id`, `subscriber`): 1 to [`MAX_NAME_BYTES`] bytes, no control
//!   characters (they are lease owners and log fields: a newline would forge a log line);
//! - **topics and keys**: at most [`MAX_TOPIC_CHARS`] / [`MAX_KEY_CHARS`] characters (what
//!   every backend's default table and indexes hold: MySQL's `VARCHAR(255)`, a PostgreSQL
//!   btree entry of at most 2,704 bytes), no NUL;
//! - **free texts** (nack and dead-letter errors, header names and values): no NUL
//!   (PostgreSQL's `text` and `jsonb` cannot hold one); error texts are stored cut at
//!   [`MAX_ERROR_BYTES`];
//! - **ids**: at most [`MAX_IDS`] in one call;
//! - **delays**: a release waits at most [`MAX_DURATION`].
//!
//! A caller's string echoed back in a message goes through [`echo`]: quoted, escaped and
//! cut, so a 1 MB name does not come back as a 1 MB status.

use std::collections::BTreeMap;
use std::time::Duration;

use super::{RelayError, RelayResult};
use crate::config::{MAX_DURATION, MAX_WINDOW};
use crate::storage::MessageId;

/// Longest error text stored with a row; longer texts are cut (on a char boundary).
pub const MAX_ERROR_BYTES: usize = 8 * 1024;
/// Most ids in one answer.
pub const MAX_IDS: usize = MAX_WINDOW as usize;
/// Most topics in one filter.
pub const MAX_TOPICS: usize = 100;
/// Longest worker id or subscriber name.
pub const MAX_NAME_BYTES: usize = 200;
/// Longest lease holder as written to the table (a name namespaced by its identity, or a
/// stream's name and id): what MySQL's `leased_by VARCHAR(255)` holds.
pub const MAX_HOLDER_BYTES: usize = 255;
pub use crate::storage::{MAX_KEY_CHARS, MAX_TOPIC_CHARS};
/// Most characters of a caller's string echoed in an error message.
const MAX_ECHO_CHARS: usize = 64;

fn invalid<T>(message: String) -> RelayResult<T> {
    Err(RelayError::InvalidArgument(message))
}

/// A lease holder as written to the table: a checked name with what the relay adds.
pub fn holder(value: &str) -> RelayResult<()> {
    if value.len() > MAX_HOLDER_BYTES {
        return invalid(format!(
            "the lease holder {} is {} bytes long with its identity; at most \
             {MAX_HOLDER_BYTES}: shorten worker_id, subscriber or the identity's name",
            echo(value),
            value.len()
        ));
    }
    name("lease holder", value)
}

/// A lease owner's name: `worker_id` or `subscriber`.
pub fn name(field: &str, value: &str) -> RelayResult<()> {
    if value.is_empty() {
        return invalid(format!("{field} must not be empty"));
    }
    if value.len() > MAX_NAME_BYTES {
        return invalid(format!(
            "{field} is {} bytes long; at most {MAX_NAME_BYTES}",
            value.len()
        ));
    }
    if value.chars().any(char::is_control) {
        return invalid(format!(
            "{field} {} holds a control character (newline, NUL...); use printable characters",
            echo(value)
        ));
    }
    Ok(())
}

/// A topic of a row or of a filter.
pub fn topic(value: &str) -> RelayResult<()> {
    if value.is_empty() {
        return invalid(
            "a topic must not be empty; leave the filter empty to receive every topic".into(),
        );
    }
    bounded_text("topic", value, MAX_TOPIC_CHARS)
}

pub fn topics(filter: &[String]) -> RelayResult<()> {
    if filter.len() > MAX_TOPICS {
        return invalid(format!(
            "{} topics in the filter; at most {MAX_TOPICS}",
            filter.len()
        ));
    }
    filter.iter().try_for_each(|t| topic(t))
}

pub fn key(value: &str) -> RelayResult<()> {
    bounded_text("key", value, MAX_KEY_CHARS)
}

fn bounded_text(field: &str, value: &str, max_chars: usize) -> RelayResult<()> {
    // Bytes first: a long string is refused without counting its characters.
    if value.len() > max_chars && value.chars().count() > max_chars {
        return invalid(format!(
            "{field} {} is {} characters long; at most {max_chars}",
            echo(value),
            value.chars().count()
        ));
    }
    text(field, value)
}

/// A free text stored as given: no NUL.
pub fn text(field: &str, value: &str) -> RelayResult<()> {
    if value.contains('\0') {
        return invalid(format!(
            "{field} {} holds a NUL character, which the database cannot store; remove it",
            echo(value)
        ));
    }
    Ok(())
}

/// Header names and values.
pub fn headers(headers: &BTreeMap<String, String>) -> RelayResult<()> {
    for (name, value) in headers {
        text("header name", name)?;
        text(&format!("header {}", echo(name)), value)?;
    }
    Ok(())
}

pub fn ids(ids: &[MessageId]) -> RelayResult<()> {
    if ids.len() > MAX_IDS {
        return invalid(format!("{} ids in one call; at most {MAX_IDS}", ids.len()));
    }
    Ok(())
}

/// A release's delay: at most [`MAX_DURATION`]. (A nack's requested delay is capped at
/// the outbox's `backoff.maximum` instead, since a nack is a failure the retry policy
/// paces; a release is the client scheduling an untried message, as in the original.)
pub fn release_delay(delay: Duration) -> RelayResult<()> {
    if delay > MAX_DURATION {
        return invalid(format!(
            "retry delay of {} is longer than {}; to park a message for longer, dead-letter it",
            humantime::format_duration(delay),
            humantime::format_duration(MAX_DURATION)
        ));
    }
    Ok(())
}

/// `text` cut to [`MAX_ERROR_BYTES`] on a char boundary.
pub fn truncate_error(text: &str) -> &str {
    truncate(text, MAX_ERROR_BYTES)
}

fn truncate(text: &str, max_bytes: usize) -> &str {
    if text.len() <= max_bytes {
        return text;
    }
    let mut end = max_bytes;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// A caller's string for an error message: in backquotes, escaped (no raw newline or
/// control character), and cut after [`MAX_ECHO_CHARS`] characters with its full length
/// said.
pub fn echo(untrusted: &str) -> String {
    let shown: String = untrusted
        .chars()
        .take(MAX_ECHO_CHARS)
        .flat_map(char::escape_debug)
        .collect();
    if untrusted.chars().nth(MAX_ECHO_CHARS).is_none() {
        format!("`{shown}`")
    } else {
        format!("`{shown}...` ({} bytes)", untrusted.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncate_respects_char_boundaries() {
        assert_eq!(truncate("héllo", 2), "h");
        assert_eq!(truncate("héllo", 3), "hé");
        assert_eq!(truncate("abc", 10), "abc");
    }

    #[test]
    fn echoes_are_escaped_and_bounded() {
        assert_eq!(echo("a\nb"), "`a\\nb`");
        let long = echo(&"x".repeat(1 << 20));
        assert!(
            long.len() < 100 && long.ends_with("(1048576 bytes)"),
            "{long}"
        );
    }

    #[test]
    fn names_refuse_control_characters_and_texts_refuse_nul() {
        assert!(name("subscriber", "billing-kafka").is_ok());
        assert!(name("subscriber", "a\nb").is_err());
        assert!(name("worker_id", "a\0").is_err());
        assert!(text("error", "tab\tis fine").is_ok());
        assert!(text("error", "\0").is_err());
        assert!(key(&"é".repeat(255)).is_ok());
        assert!(key(&"é".repeat(256)).is_err());
        assert!(topic("").is_err());
    }
}
