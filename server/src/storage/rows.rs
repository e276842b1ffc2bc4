//! Decoding helpers every backend's rows need, whatever the driver: the attempts counter,
//! counts, headers stored as JSON, and the clamp on durations sent to a database.

use std::collections::BTreeMap;
use std::time::Duration;

/// Longest delay or lease sent to a database; longer means "practically never" and would
/// otherwise overflow a timestamp (PostgreSQL's, MySQL's `DATETIME`, epoch milliseconds).
pub const MAX_DELAY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// `duration` clamped to [`MAX_DELAY`].
pub fn clamped(duration: Duration) -> Duration {
    duration.min(MAX_DELAY)
}

/// Attempts as stored (an integer column of any width) to the trait's count; a negative
/// value, which only a hand-edited row can hold, counts as none.
pub fn attempts<T: TryInto<u32>>(stored: T) -> u32 {
    stored.try_into().unwrap_or(0)
}

/// A count from `count(*)` or `SUM`, never negative.
pub fn count(stored: i64) -> u64 {
    stored.max(0) as u64
}

/// JSON headers to strings; a non-string value becomes its JSON text, and anything that
/// is not a JSON object (a team's own table may hold one) reads as no headers.
pub fn headers_from_json(value: serde_json::Value) -> BTreeMap<String, String> {
    let serde_json::Value::Object(map) = value else {
        return BTreeMap::new();
    };
    map.into_iter()
        .map(|(name, value)| match value {
            serde_json::Value::String(text) => (name, text),
            other => (name, other.to_string()),
        })
        .collect()
}

/// Headers stored as JSON text (MySQL's `JSON` arrives as bytes, SQLite's as text); NULL
/// or anything that is not JSON reads as no headers rather than failing every claim
/// that meets the row.
pub fn headers_from_text(stored: Option<&[u8]>) -> BTreeMap<String, String> {
    stored
        .and_then(|bytes| serde_json::from_slice(bytes).ok())
        .map(headers_from_json)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_keep_strings_and_render_other_values_as_json() {
        let headers = headers_from_json(serde_json::json!({"a": "x", "n": 1, "o": {"k": true}}));
        assert_eq!(headers["a"], "x");
        assert_eq!(headers["n"], "1");
        assert_eq!(headers["o"], r#"{"k":true}"#);
        assert!(headers_from_json(serde_json::json!([1])).is_empty());
    }

    #[test]
    fn stored_headers_tolerate_anything_else() {
        assert!(headers_from_text(None).is_empty());
        assert!(headers_from_text(Some(b"not json")).is_empty());
        assert!(headers_from_text(Some(b"[1]")).is_empty());
        assert_eq!(headers_from_text(Some(br#"{"a":"x"}"#))["a"], "x");
        let headers = headers_from_text(Some(br#"{"a": "x", "n": 1, "o": {"k": true}}"#));
        assert_eq!(headers["o"], r#"{"k":true}"#);
        let stored = serde_json::to_string(&headers).unwrap();
        assert_eq!(headers_from_text(Some(stored.as_bytes())), headers);
    }

    #[test]
    fn attempts_and_counts_are_never_negative() {
        assert_eq!(attempts(-1i32), 0);
        assert_eq!(attempts(3i64), 3);
        assert_eq!(count(-2), 0);
    }
}
