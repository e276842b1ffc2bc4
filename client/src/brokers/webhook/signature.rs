//! The signature of a webhook request, in the convention of Stripe's and GitHub's
//! webhooks: a timestamp and an HMAC-SHA256 over `TIMESTAMP.BODY` with a shared secret,
//! sent as
//!
//! ```text
//! txoutbox-signature: t=1767225600,v1=5f2b...e0 (64 lowercase hex digits)
//! ```
//!
//! A receiver verifies it in four steps:
//!
//! 1. split the header on `,` into `t=` (Unix seconds) and `v1=` (hex);
//! 2. compute `HMAC-SHA256(secret, t + "." + raw body)`, over the body's bytes exactly
//!    as received (before any JSON parsing);
//! 3. compare it with `v1` in constant time;
//! 4. refuse a `t` too far from its own clock (five minutes is usual), so a captured
//!    request cannot be replayed later.
//!
//! In Python:
//!
//! ```python
//! import hashlib, hmac, time
//! fields = dict(part.split("=", 1) for part in request.headers["txoutbox-signature"].split(","))
//! expected = hmac.new(secret, fields["t"].encode() + b"." + body, hashlib.sha256).hexdigest()
//! ok = hmac.compare_digest(expected, fields["v1"]) and abs(time.time() - int(fields["t"])) < 300
//! ```
//!
//! [`verify`] does the same in Rust.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The header carrying the signature.
pub const SIGNATURE_HEADER: &str = "txoutbox-signature";

/// The value of [`SIGNATURE_HEADER`] for `body` sent at `timestamp` (Unix seconds).
///
/// ```
/// use txoutbox_client::webhook::signature::{sign, verify};
///
/// let header = sign(b"secret", 1_767_225_600, b"{\"order\":42}");
/// assert!(header.starts_with("t=1767225600,v1="));
/// assert!(verify(b"secret", &header, b"{\"order\":42}", 1_767_225_600, 300).is_ok());
/// assert!(verify(b"other", &header, b"{\"order\":42}", 1_767_225_600, 300).is_err());
/// ```
pub fn sign(secret: &[u8], timestamp: u64, body: &[u8]) -> String {
    let digest = mac(secret, timestamp, body).finalize().into_bytes();
    format!("t={timestamp},v1={}", hex::encode(digest))
}

/// Checks a [`SIGNATURE_HEADER`] value against `body`, accepting timestamps at most
/// `tolerance_secs` away from `now` (Unix seconds). The error says what is wrong.
pub fn verify(
    secret: &[u8],
    header: &str,
    body: &[u8],
    now: u64,
    tolerance_secs: u64,
) -> Result<(), &'static str> {
    let mut timestamp = None;
    let mut signature = None;
    for part in header.split(',') {
        match part.trim().split_once('=') {
            Some(("t", value)) => timestamp = value.parse::<u64>().ok(),
            Some(("v1", value)) => signature = hex::decode(value).ok(),
            _ => {}
        }
    }
    let timestamp = timestamp.ok_or("no valid t= in the signature header")?;
    let signature = signature.ok_or("no valid v1= in the signature header")?;
    if now.abs_diff(timestamp) > tolerance_secs {
        return Err("the signature's timestamp is outside the tolerance");
    }
    // `verify_slice` compares in constant time.
    mac(secret, timestamp, body)
        .verify_slice(&signature)
        .map_err(|_| "the signature does not match the body")
}

/// Now, in Unix seconds.
pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_secs()
}

/// The HMAC of `TIMESTAMP.BODY`, ready to finalize or verify.
fn mac(secret: &[u8], timestamp: u64, body: &[u8]) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes a key of any length");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A known answer, computed with Python's hmac module:
    /// hmac.new(b"whsec", b"1700000000.hello", hashlib.sha256).hexdigest()
    #[test]
    fn matches_a_signature_computed_elsewhere() {
        assert_eq!(
            sign(b"whsec", 1_700_000_000, b"hello"),
            "t=1700000000,v1=9499b343742dec164cd3d22098f598a85f645defe270c4d16d38750d1ede8514"
        );
    }

    #[test]
    fn verify_refuses_a_changed_body_an_old_timestamp_and_garbage() {
        let header = sign(b"k", 1000, b"body");
        assert!(verify(b"k", &header, b"body", 1000, 300).is_ok());
        assert!(verify(b"k", &header, b"bodx", 1000, 300).is_err());
        assert!(verify(b"k", &header, b"body", 2000, 300).is_err());
        assert!(verify(b"k", "v1=00", b"body", 1000, 300).is_err());
        assert!(verify(b"k", "t=1000", b"body", 1000, 300).is_err());
    }
}
