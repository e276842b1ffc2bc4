//! Identities that change under a running server: `[server.auth]` of the configuration
//! file and every identity's `token_file` are read again when one of them changes
//! (checked every `server.auth.reload_interval`) or on SIGHUP, as the TLS files are, so a
//! revoked token or a rotated Kubernetes Secret takes effect without a restart. A new set
//! that does not load (a configuration that no longer validates, a token file missing or
//! empty, one token on two identities) is logged with why, and the previous set stays in
//! use. `token_env` is read again too, but a process's environment does not change.
//!
//! Calls already admitted keep the identity they were admitted with; an identity whose
//! limits did not change keeps its budget (see [`Access::reloaded`]).

use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::watch::{self, Reload};
use super::Access;
use crate::config::{AuthConfig, Config, Overrides};

/// The identities in use, replaced when their files change.
pub struct ReloadingAccess {
    current: RwLock<Arc<Access>>,
    /// The `[server.auth]` the current identities were made from.
    auth: Mutex<AuthConfig>,
    /// The configuration file, when the server was started with one, and its flags.
    file: Option<(PathBuf, Overrides)>,
    interval: Duration,
}

impl ReloadingAccess {
    pub fn load(config: &Config) -> anyhow::Result<Arc<Self>> {
        let auth = config.server.auth.clone();
        Ok(Arc::new(Self {
            current: RwLock::new(Arc::new(Access::from_config(&auth)?)),
            interval: auth.reload_interval,
            auth: Mutex::new(auth),
            file: config
                .file
                .clone()
                .map(|file| (file, config.overrides.clone())),
        }))
    }

    /// The identities in use now.
    pub fn current(&self) -> Arc<Access> {
        Arc::clone(&self.current.read().expect("access lock"))
    }

    /// `[server.auth]` as the files say now: the configuration file read again (and
    /// validated whole, as at start), or the one in use when there is no file.
    fn read_auth(&self) -> anyhow::Result<AuthConfig> {
        match &self.file {
            Some((path, overrides)) => Ok(Config::load(Some(path), overrides)
                .map_err(|error| anyhow::anyhow!("{error}"))?
                .server
                .auth),
            None => Ok(self.auth.lock().expect("auth lock").clone()),
        }
    }

    /// Reloads when the files change or on SIGHUP, until `stop`.
    pub async fn watch(self: Arc<Self>, stop: CancellationToken) {
        let interval = self.interval;
        watch::watch(self, interval, stop).await;
    }
}

impl Reload for ReloadingAccess {
    const NO_SIGHUP: &'static str = "no SIGHUP handler; identities reload on file changes only";

    fn files(&self) -> Vec<PathBuf> {
        let auth = self.auth.lock().expect("auth lock");
        self.file
            .iter()
            .map(|(file, _)| file.clone())
            .chain(
                auth.identities
                    .values()
                    .filter_map(|identity| identity.token_file.clone()),
            )
            .collect()
    }

    fn reload(&self, why: &str) {
        let reloaded = self.read_auth().and_then(|auth| {
            let access = Access::reloaded(&auth, Some(&self.current()))?;
            Ok((auth, access))
        });
        match reloaded {
            Ok((auth, access)) => {
                let identities = auth.identities.len();
                *self.auth.lock().expect("auth lock") = auth;
                *self.current.write().expect("access lock") = Arc::new(access);
                tracing::info!(why, identities, "identities reloaded");
            }
            Err(error) => tracing::error!(
                why,
                error = format!("{error:#}"),
                "identities not reloaded; the previous ones stay in use"
            ),
        }
    }
}
