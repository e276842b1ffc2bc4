//! Who is calling and what they may do.
//!
//! - [`tls`]: TLS and mutual TLS on the gRPC port, certificates reloaded without a restart;
//! - [`layer`]: the one place credentials are checked: a tower layer in front of every
//!   service authenticates the caller (bearer token or client certificate), refuses a call
//!   whose scope the caller holds on no outbox, applies the caller's limits, and hands the
//!   [`Caller`] to the handlers;
//! - the handlers reach an outbox only through [`Caller::outbox`], which checks the scope
//!   on that outbox (the outbox name travels inside the protobuf message, which the layer
//!   does not decode);
//! - [`quotas`]: per-identity bounds; [`caps`]: server-wide ones (streams, connections,
//!   TLS handshakes); [`audit`]: admin actions as structured events;
//!   [`refusals`]: refused calls logged with the peer address, rate-limited per peer.
//!
//! With no identity configured every caller may do everything: the embedded default and
//! a relay listening on `127.0.0.1` (configuration refuses other addresses without TLS and
//! credentials unless `server.allow_insecure` says so).

pub mod audit;
pub mod caps;
pub mod layer;
pub mod quotas;
pub mod refusals;
pub mod reload;
pub mod tls;
mod watch;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tonic::Status;

use crate::config::{AuthConfig, IdentityConfig, IdentityLimits, Scope, EVERY_OUTBOX};
use crate::relay::{Outbox, Relay};
use quotas::IdentityBudget;

/// The identities of `[server.auth]`, with their tokens hashed and their budgets.
pub struct Access {
    identities: Vec<Arc<Identity>>,
    public_health: bool,
}

pub struct Identity {
    pub name: String,
    /// SHA-256 of the token: the token itself is never kept.
    token_sha256: Option<[u8; 32]>,
    certificate_names: Vec<String>,
    grants: BTreeMap<String, BTreeSet<Scope>>,
    /// What `budget` was made from, to tell after a reload whether it still applies.
    limits: IdentityLimits,
    /// Shared with the identity of the same name and limits after a reload, so its open
    /// streams keep counting.
    pub budget: Arc<IdentityBudget>,
}

/// Who made a call, as the layer established it.
#[derive(Clone)]
pub enum Caller {
    /// No identity is configured: every call is allowed.
    Open,
    /// No credential, on a call that needs none (health, reflection).
    Anonymous,
    Identity(Arc<Identity>),
}

impl Access {
    /// Reads the tokens of `token_file` and `token_env` (validation checked they exist).
    pub fn from_config(auth: &AuthConfig) -> anyhow::Result<Self> {
        Self::reloaded(auth, None)
    }

    /// [`Access::from_config`] after `previous`: an identity whose name and limits did
    /// not change keeps its budget (its open streams, its calls this second).
    pub fn reloaded(auth: &AuthConfig, previous: Option<&Access>) -> anyhow::Result<Self> {
        let identities: Vec<Arc<Identity>> = auth
            .identities
            .iter()
            .map(|(name, identity)| {
                let budget = previous
                    .and_then(|access| access.identities.iter().find(|old| &old.name == name))
                    .filter(|old| old.limits == identity.limits)
                    .map(|old| Arc::clone(&old.budget));
                Identity::from_config(name, identity, budget).map(Arc::new)
            })
            .collect::<anyhow::Result<_>>()?;
        let shared = shared_tokens(&identities);
        if !shared.is_empty() {
            anyhow::bail!("{}", shared.join("\n"));
        }
        Ok(Self {
            identities,
            public_health: auth.public_health,
        })
    }

    pub fn enabled(&self) -> bool {
        !self.identities.is_empty()
    }

    pub fn public_health(&self) -> bool {
        self.public_health
    }

    /// The identity whose token this is. Every identity's hash is compared, in constant
    /// time, so the time taken says nothing about which one came close.
    pub fn by_token(&self, token: &str) -> Option<Arc<Identity>> {
        let hash: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut found = None;
        for identity in &self.identities {
            if let Some(expected) = &identity.token_sha256 {
                if bool::from(expected.ct_eq(&hash)) {
                    found = Some(Arc::clone(identity));
                }
            }
        }
        found
    }

    /// The identity one of whose `certificate_names` the client certificate carries.
    pub fn by_certificate_names(&self, names: &[String]) -> Option<Arc<Identity>> {
        self.identities
            .iter()
            .find(|identity| {
                identity
                    .certificate_names
                    .iter()
                    .any(|wanted| names.contains(wanted))
            })
            .cloned()
    }
}

/// Tokens that would name two identities, whatever each came from (a file, a variable,
/// a digest): the token would log in as whichever identity comes first, and revoking one
/// identity's token would leave it valid for the other. (Configuration validation finds
/// shared certificate names.)
fn shared_tokens(identities: &[Arc<Identity>]) -> Vec<String> {
    let mut problems = Vec::new();
    for (i, first) in identities.iter().enumerate() {
        for second in &identities[i + 1..] {
            if first.token_sha256.is_some() && first.token_sha256 == second.token_sha256 {
                problems.push(format!(
                    "server.auth.identities.{} and server.auth.identities.{} have the same \
                     token: give each identity a token of its own",
                    first.name, second.name
                ));
            }
        }
    }
    problems
}

impl Identity {
    fn from_config(
        name: &str,
        config: &IdentityConfig,
        budget: Option<Arc<IdentityBudget>>,
    ) -> anyhow::Result<Self> {
        use anyhow::Context;
        let key = format!("server.auth.identities.{name}");
        let token = if let Some(path) = &config.token_file {
            Some(
                std::fs::read_to_string(path)
                    .with_context(|| format!("{key}.token_file = {}", path.display()))?,
            )
        } else if let Some(variable) = &config.token_env {
            Some(std::env::var(variable).with_context(|| format!("{key}.token_env = {variable}"))?)
        } else {
            None
        };
        let token_sha256 = match (token, &config.token_sha256) {
            // A file or a variable usually ends with a newline nobody meant as the token's.
            (Some(token), _) => {
                // An empty token would let in a caller sending `Bearer ` and nothing else.
                anyhow::ensure!(
                    !token.trim().is_empty(),
                    "{key}: its token_file or token_env is empty"
                );
                Some(Sha256::digest(token.trim().as_bytes()).into())
            }
            (None, Some(hex_digest)) => {
                let mut hash = [0u8; 32];
                hex::decode_to_slice(hex_digest, &mut hash)
                    .with_context(|| format!("{key}.token_sha256"))?;
                Some(hash)
            }
            (None, None) => None,
        };
        Ok(Self {
            name: name.to_owned(),
            token_sha256,
            certificate_names: config.certificate_names.clone(),
            grants: config
                .grants
                .iter()
                .map(|(outbox, scopes)| (outbox.clone(), scopes.iter().copied().collect()))
                .collect(),
            budget: budget.unwrap_or_else(|| Arc::new(IdentityBudget::new(name, &config.limits))),
            limits: config.limits.clone(),
        })
    }

    fn may(&self, scope: Scope, outbox: &str) -> bool {
        [outbox, EVERY_OUTBOX].iter().any(|name| {
            self.grants
                .get(*name)
                .is_some_and(|scopes| scopes.iter().any(|held| held.allows(scope)))
        })
    }

    pub(crate) fn holds_anywhere(&self, scope: Scope) -> bool {
        self.grants
            .values()
            .flatten()
            .any(|held| held.allows(scope))
    }

    fn sees(&self, outbox: &str) -> bool {
        self.grants.contains_key(outbox) || self.grants.contains_key(EVERY_OUTBOX)
    }
}

impl Caller {
    /// The outbox `name`, if this caller holds `scope` on it. A caller without the scope
    /// is told so whether the outbox exists or not, so names it may not see do not leak.
    pub fn outbox<'a>(
        &self,
        relay: &'a Relay,
        scope: Scope,
        name: &str,
    ) -> Result<&'a Arc<Outbox>, Status> {
        match self {
            Caller::Open => {}
            Caller::Identity(identity) if identity.may(scope, name) => {}
            Caller::Identity(identity) => {
                let status = Status::permission_denied(format!(
                    "identity `{}` needs scope `{scope}`{} on outbox {} (see server.auth.identities.{}.grants)",
                    identity.name,
                    scope.included_by(),
                    crate::relay::limits::echo(name),
                    identity.name
                ));
                let what = format!("outbox {}", crate::relay::limits::echo(name));
                refusals::log_in_call(&identity.name, &what, &status);
                return Err(status);
            }
            Caller::Anonymous => return Err(layer::unauthenticated()),
        }
        Ok(relay.outbox(name)?)
    }

    /// Whether `ListOutboxes` shows this outbox to the caller: any scope on it.
    pub fn sees(&self, outbox: &str) -> bool {
        match self {
            Caller::Open => true,
            Caller::Anonymous => false,
            Caller::Identity(identity) => identity.sees(outbox),
        }
    }

    /// The name logs and audit events give the caller.
    pub fn name(&self) -> &str {
        match self {
            Caller::Open => "-",
            Caller::Anonymous => "anonymous",
            Caller::Identity(identity) => &identity.name,
        }
    }

    pub fn identity(&self) -> Option<&Arc<Identity>> {
        match self {
            Caller::Identity(identity) => Some(identity),
            _ => None,
        }
    }

    /// The caller the layer put on a request. Absent only if the layer is missing,
    /// which must not open the door.
    pub fn of<T>(request: &tonic::Request<T>) -> Result<Caller, Status> {
        request
            .extensions()
            .get::<Caller>()
            .cloned()
            .ok_or_else(|| Status::internal("no caller on the request: the auth layer is missing"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth(token: &str, max_streams: u32) -> AuthConfig {
        let hash: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let identity = IdentityConfig {
            token_sha256: Some(hex::encode(hash)),
            token_file: None,
            token_env: None,
            certificate_names: Vec::new(),
            grants: BTreeMap::from([("orders".to_owned(), vec![Scope::Subscribe])]),
            limits: IdentityLimits {
                max_streams: Some(max_streams),
                ..IdentityLimits::default()
            },
        };
        AuthConfig {
            identities: BTreeMap::from([("relay".to_owned(), identity)]),
            ..AuthConfig::default()
        }
    }

    #[test]
    fn a_reload_swaps_tokens_and_keeps_the_budget_of_unchanged_limits() {
        let first = Access::from_config(&auth("old", 4)).unwrap();
        let rotated = Access::reloaded(&auth("new", 4), Some(&first)).unwrap();
        assert!(rotated.by_token("old").is_none());
        let relay = rotated.by_token("new").expect("the new token");
        let before = first.by_token("old").unwrap();
        assert!(Arc::ptr_eq(&relay.budget, &before.budget), "budget kept");

        let raised = Access::reloaded(&auth("new", 8), Some(&rotated)).unwrap();
        let after = raised.by_token("new").unwrap();
        assert!(
            !Arc::ptr_eq(&after.budget, &relay.budget),
            "new limits, new budget"
        );
    }
}
