//! Who is knocking: the peer address of the call being served, and refused calls logged at
//! warn with that address and the identity the credential named, at most
//! [`LOGGED_PER_MINUTE`] lines per minute per peer address (a burst of that many, then one
//! every few seconds), so a client retrying a wrong token in a loop cannot flood the log
//! (or the disk under it). Each line says how many refusals, of any peer, went unlogged
//! since the line before (`suppressed`).
//!
//! The peer address is kept for the whole call ([`serving`]), so the handlers' audit
//! events carry it without every handler passing it down.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::LazyLock;

use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
use tonic::Status;

/// Refusal lines logged per peer address per minute, at most.
pub const LOGGED_PER_MINUTE: u32 = 10;

/// Peer addresses remembered at once before the idle ones are forgotten.
const REMEMBERED_PEERS: usize = 10_000;

tokio::task_local! {
    static PEER: Option<SocketAddr>;
}

/// The peer address a request came from, plain TCP or TLS.
pub fn peer_of<B>(request: &http::Request<B>) -> Option<SocketAddr> {
    let extensions = request.extensions();
    extensions
        .get::<TcpConnectInfo>()
        .and_then(TcpConnectInfo::remote_addr)
        .or_else(|| {
            extensions
                .get::<TlsConnectInfo<TcpConnectInfo>>()
                .and_then(|info| info.get_ref().remote_addr())
        })
}

/// Runs `call` with `peer` as [`current_peer`].
pub async fn serving<F: Future>(peer: Option<SocketAddr>, call: F) -> F::Output {
    PEER.scope(peer, call).await
}

/// The peer address of the call being served, if known.
fn peer() -> Option<SocketAddr> {
    PEER.try_with(|peer| *peer).ok().flatten()
}

/// The peer address of the call being served, as logs show it (`-` outside a call).
pub fn current_peer() -> String {
    shown(peer())
}

pub(super) fn shown(peer: Option<SocketAddr>) -> String {
    peer.map_or_else(|| "-".to_owned(), |peer| peer.to_string())
}

struct Log {
    limiter: DefaultKeyedRateLimiter<IpAddr>,
    suppressed: AtomicU64,
}

static LOG: LazyLock<Log> = LazyLock::new(|| Log {
    limiter: RateLimiter::keyed(Quota::per_minute(
        NonZeroU32::new(LOGGED_PER_MINUTE).expect("a positive rate"),
    )),
    suppressed: AtomicU64::new(0),
});

/// Whether a refusal of `peer` may be logged now; counts it as suppressed when not. Calls
/// without a peer address (in-process tests) share one budget.
pub fn may_log(peer: Option<SocketAddr>) -> bool {
    let log = &*LOG;
    if log.limiter.len() > REMEMBERED_PEERS {
        log.limiter.retain_recent();
    }
    let key = peer.map_or(IpAddr::from([0, 0, 0, 0]), |peer| peer.ip());
    let allowed = log.limiter.check_key(&key).is_ok();
    if !allowed {
        log.suppressed.fetch_add(1, Ordering::Relaxed);
    }
    allowed
}

/// Logs a refused call at warn, unless `peer` is past its budget (see [`may_log`], which
/// the caller asked first so related lines go or stay together).
pub fn log(peer: Option<SocketAddr>, identity: Option<&str>, path: &str, status: &Status) {
    let suppressed = LOG.suppressed.swap(0, Ordering::Relaxed);
    tracing::warn!(
        peer = shown(peer),
        identity = identity.unwrap_or("?"),
        path,
        code = ?status.code(),
        reason = status.message(),
        suppressed,
        "call refused"
    );
}

/// Logs, within the peer's budget, a call refused by a handler (the scope on this outbox
/// is missing) rather than by the layer; `what` names the outbox asked for.
pub fn log_in_call(identity: &str, what: &str, status: &Status) {
    let peer = peer();
    if may_log(peer) {
        log(peer, Some(identity), what, status);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_past_its_budget_is_suppressed_and_others_are_not() {
        let loud: SocketAddr = "192.0.2.7:4000".parse().unwrap();
        let other: SocketAddr = "192.0.2.8:4000".parse().unwrap();
        let logged = (0..100).filter(|_| may_log(Some(loud))).count();
        assert_eq!(logged, LOGGED_PER_MINUTE as usize);
        // Another port of the same address is the same peer: a client reconnecting.
        assert!(!may_log(Some("192.0.2.7:4001".parse().unwrap())));
        assert!(may_log(Some(other)));
    }

    #[tokio::test]
    async fn the_peer_is_known_for_the_whole_call() {
        let peer: SocketAddr = "192.0.2.9:5000".parse().unwrap();
        assert_eq!(current_peer(), "-");
        let seen = serving(Some(peer), async { current_peer() }).await;
        assert_eq!(seen, "192.0.2.9:5000");
    }
}
