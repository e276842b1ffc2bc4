//! What the TLS certificates and the identities share: files read again when their
//! modification time or size changes (checked every interval) or on SIGHUP.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio_util::sync::CancellationToken;

/// Something made from files, replaced by a new version when they change.
pub(super) trait Reload {
    /// Logged, with the error, when SIGHUP cannot be handled.
    const NO_SIGHUP: &'static str;

    /// The files it is made from now (a reload may name others).
    fn files(&self) -> Vec<PathBuf>;

    /// Reads the files again and logs how that went, with `why`; a new version that does
    /// not load leaves the previous one in use.
    fn reload(&self, why: &str);
}

/// Reloads `target` when its files change (checked every `interval`) or on SIGHUP, until
/// `stop`.
pub(super) async fn watch<R: Reload>(target: Arc<R>, interval: Duration, stop: CancellationToken) {
    let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .map_err(|error| tracing::warn!(%error, "{}", R::NO_SIGHUP))
        .ok();
    let mut files = target.files();
    let mut seen = stamp(&files);
    let mut tick = tokio::time::interval(interval);
    loop {
        let why = tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => "files changed",
            Some(()) = async { match hangup.as_mut() { Some(h) => h.recv().await, None => std::future::pending().await } } => "SIGHUP",
        };
        let now = stamp(&files);
        if why == "SIGHUP" || now != seen {
            seen = now;
            target.reload(why);
            // The new version may be made from other files: compare with those next time.
            let reloaded = target.files();
            if reloaded != files {
                seen = stamp(&reloaded);
                files = reloaded;
            }
        }
    }
}

/// What identifies a version of the files: a change moves one of these.
fn stamp(files: &[PathBuf]) -> Vec<Option<(SystemTime, u64)>> {
    files
        .iter()
        .map(|path| {
            let meta = std::fs::metadata(path).ok()?;
            Some((meta.modified().ok()?, meta.len()))
        })
        .collect()
}
