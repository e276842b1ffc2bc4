//! The tower layer in front of every service: authenticates each call, refuses those
//! whose scope the caller holds on no outbox, applies the caller's stream and call-rate
//! limits, and puts the [`Caller`] on the request for the handlers.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use http_body::Frame;
use tokio::sync::OwnedSemaphorePermit;
use tonic::body::Body;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
use tonic::Status;
use tower::{Layer, Service};

use super::caps::Caps;
use super::quotas::StreamSlot;
use super::reload::ReloadingAccess;
use super::{refusals, Access, Caller, Identity};
use crate::config::Scope;

const SUBSCRIBE: &str = "/txoutbox.v1.Relay/Subscribe";

#[derive(Clone)]
pub struct AuthLayer {
    access: Arc<ReloadingAccess>,
    caps: Caps,
}

impl AuthLayer {
    pub fn new(access: Arc<ReloadingAccess>, caps: Caps) -> Self {
        Self { access, caps }
    }
}

impl<S> Layer<S> for AuthLayer {
    type Service = Authenticated<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Authenticated {
            inner,
            access: Arc::clone(&self.access),
            caps: self.caps.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Authenticated<S> {
    inner: S,
    access: Arc<ReloadingAccess>,
    caps: Caps,
}

/// What a call needs, by its method.
#[derive(Debug, PartialEq, Eq)]
enum Needs {
    /// Nothing: health and reflection under `public_health`.
    Nothing,
    /// A known identity, whatever its scopes (listing outboxes, health otherwise).
    Identity,
    /// An identity holding this scope on some outbox (the handler checks which).
    Scope(Scope),
}

/// The `Admin` methods that change nothing, open to the `read` scope (and `admin`).
const READ_METHODS: [&str; 6] = [
    "Stats",
    "Schema",
    "ListDeadLetters",
    "CountDeadLetters",
    "ListBlockedKeys",
    "ListSubscribers",
];

fn needs(path: &str, public_health: bool) -> Needs {
    let (service, method) = path
        .trim_start_matches('/')
        .split_once('/')
        .unwrap_or((path, ""));
    match (service, method) {
        ("txoutbox.v1.Relay", _) => Needs::Scope(Scope::Subscribe),
        ("txoutbox.v1.Admin", "InsertMessage") => Needs::Scope(Scope::Insert),
        ("txoutbox.v1.Admin", "ListOutboxes") => Needs::Identity,
        ("txoutbox.v1.Admin", method) if READ_METHODS.contains(&method) => {
            Needs::Scope(Scope::Read)
        }
        // A method added later needs `admin` until someone decides it only observes.
        ("txoutbox.v1.Admin", _) => Needs::Scope(Scope::Admin),
        (
            "grpc.health.v1.Health"
            | "grpc.reflection.v1.ServerReflection"
            | "grpc.reflection.v1alpha.ServerReflection",
            _,
        ) if public_health => Needs::Nothing,
        _ => Needs::Identity,
    }
}

/// Whether a call is one request and one response (what `max_calls_per_second` counts).
fn is_unary(path: &str) -> bool {
    !(path == SUBSCRIBE
        || path == "/grpc.health.v1.Health/Watch"
        || path.contains("ServerReflection/"))
}

pub fn unauthenticated() -> Status {
    Status::unauthenticated(
        "this call needs a credential: a bearer token (metadata `authorization: Bearer TOKEN`) \
         or, under mutual TLS, the client certificate of a configured identity",
    )
}

impl Access {
    /// The identity the request's credential names: its bearer token if it carries one
    /// (which must then be right), else its client certificate.
    fn authenticate<B>(&self, request: &http::Request<B>) -> Result<Option<Arc<Identity>>, Status> {
        if let Some(value) = request.headers().get(http::header::AUTHORIZATION) {
            let token = value
                .to_str()
                .ok()
                .and_then(|v| v.split_once(' '))
                .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
                .map(|(_, token)| token.trim())
                .ok_or_else(|| {
                    Status::unauthenticated("the `authorization` metadata must be `Bearer TOKEN`")
                })?;
            return self
                .by_token(token)
                .map(Some)
                .ok_or_else(|| Status::unauthenticated("the bearer token matches no identity"));
        }
        let certificates = request
            .extensions()
            .get::<TlsConnectInfo<TcpConnectInfo>>()
            .and_then(|info| info.peer_certs());
        let Some(leaf) = certificates.as_ref().and_then(|chain| chain.first()) else {
            return Ok(None);
        };
        let names = super::tls::certificate_names(leaf);
        self.by_certificate_names(&names).map(Some).ok_or_else(|| {
            Status::unauthenticated(format!(
                "the client certificate ({}) matches no identity's certificate_names, and no bearer token was sent",
                names.join(", ")
            ))
        })
    }

    /// The caller of `request`, or why it is refused; a stream slot for `Subscribe`.
    fn admit<B>(
        &self,
        request: &http::Request<B>,
    ) -> Result<(Caller, Option<StreamSlot>), Refusal> {
        if !self.enabled() {
            return Ok((Caller::Open, None));
        }
        let path = request.uri().path();
        let identity = self.authenticate(request).map_err(Refusal::unknown)?;
        let needs = needs(path, self.public_health());
        let Some(identity) = identity else {
            return match needs {
                Needs::Nothing => Ok((Caller::Anonymous, None)),
                _ => Err(Refusal::unknown(unauthenticated())),
            };
        };
        let refused = |status| Refusal {
            status,
            identity: Some(Arc::clone(&identity)),
        };
        if let Needs::Scope(scope) = needs {
            if !identity.holds_anywhere(scope) {
                return Err(refused(Status::permission_denied(format!(
                    "identity `{}` needs scope `{scope}`{} for {path}, and holds it on no outbox",
                    identity.name,
                    scope.included_by()
                ))));
            }
        }
        let slot = if path == SUBSCRIBE {
            Some(
                identity
                    .budget
                    .open_stream(&identity.name)
                    .map_err(refused)?,
            )
        } else {
            if is_unary(path) {
                identity
                    .budget
                    .unary_call(&identity.name)
                    .map_err(refused)?;
            }
            None
        };
        Ok((Caller::Identity(identity), slot))
    }
}

/// A call the layer refuses, and who made it when the credential named someone (an
/// identity without the scope, or past a limit), for the audit event.
struct Refusal {
    status: Status,
    identity: Option<Arc<Identity>>,
}

impl Refusal {
    /// Refused before anyone was recognised: no credential, or a wrong one.
    fn unknown(status: Status) -> Self {
        Self {
            status,
            identity: None,
        }
    }
}

impl<S, B> Service<http::Request<B>> for Authenticated<S>
where
    S: Service<http::Request<B>, Response = http::Response<Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        // The clone is ready only if polled; the polled one goes with this call.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let peer = refusals::peer_of(&request);
        let admitted = self
            .access
            .current()
            .admit(&request)
            .and_then(|(caller, slot)| {
                // Counted once the caller is known, so a refused caller takes no place.
                let place = match is_unary(request.uri().path()) {
                    true => None,
                    false => Some(self.caps.open_stream().map_err(|status| Refusal {
                        status,
                        identity: caller.identity().cloned(),
                    })?),
                };
                Ok((caller, (slot, place)))
            });
        match admitted {
            Err(Refusal { status, identity }) => {
                let path = request.uri().path();
                let identity = identity.as_ref().map(|identity| identity.name.as_str());
                if refusals::may_log(peer) {
                    refusals::log(peer, identity, path, &status);
                    super::audit::record_refused_call(path, identity, peer, &status);
                }
                Box::pin(async move { Ok(status.into_http()) })
            }
            Ok((caller, slot)) => {
                request.extensions_mut().insert(caller);
                Box::pin(refusals::serving(peer, async move {
                    let response = inner.call(request).await?;
                    Ok(match slot {
                        // Held until the stream's response body ends.
                        (None, None) => response,
                        slot => response.map(|body| Body::new(WithSlot { body, _slot: slot })),
                    })
                }))
            }
        }
    }
}

/// A response body that keeps its stream's slot in the identity's `max_streams` and its
/// place in `server.max_streams`.
struct WithSlot {
    body: Body,
    _slot: (Option<StreamSlot>, Option<OwnedSemaphorePermit>),
}

impl http_body::Body for WithSlot {
    type Data = bytes::Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_method_needs_its_scope() {
        assert_eq!(needs(SUBSCRIBE, true), Needs::Scope(Scope::Subscribe));
        assert_eq!(
            needs("/txoutbox.v1.Relay/Ack", true),
            Needs::Scope(Scope::Subscribe)
        );
        assert_eq!(
            needs("/txoutbox.v1.Admin/Purge", true),
            Needs::Scope(Scope::Admin)
        );
        assert_eq!(
            needs("/txoutbox.v1.Admin/ListDeadLetters", true),
            Needs::Scope(Scope::Read)
        );
        assert_eq!(
            needs("/txoutbox.v1.Admin/Stats", true),
            Needs::Scope(Scope::Read)
        );
        assert_eq!(
            needs("/txoutbox.v1.Admin/InsertMessage", true),
            Needs::Scope(Scope::Insert)
        );
        assert_eq!(
            needs("/txoutbox.v1.Admin/ListOutboxes", true),
            Needs::Identity
        );
        assert_eq!(needs("/grpc.health.v1.Health/Check", true), Needs::Nothing);
        assert_eq!(
            needs("/grpc.health.v1.Health/Check", false),
            Needs::Identity
        );
        assert_eq!(
            needs("/txoutbox.v1.Admin/Pause", true),
            Needs::Scope(Scope::Admin)
        );
        assert_eq!(
            needs("/txoutbox.v1.Admin/RedriveDeadLetters", false),
            Needs::Scope(Scope::Admin)
        );
        assert_eq!(needs("/unknown.Service/Call", true), Needs::Identity);
        assert!(!is_unary(SUBSCRIBE) && is_unary("/txoutbox.v1.Relay/Claim"));
    }

    /// Every method of the protocol, read from its descriptor, so a method added later is
    /// checked here without being listed: none is open to anyone, and every one but
    /// `ListOutboxes` needs a scope.
    #[test]
    fn every_method_of_the_protocol_needs_a_scope_or_an_identity() {
        use prost::Message;
        let set = prost_types::FileDescriptorSet::decode(txoutbox_proto::FILE_DESCRIPTOR_SET)
            .expect("the protocol's descriptor");
        let mut checked = 0;
        for service in set.file.iter().flat_map(|file| &file.service) {
            let service_name = service.name();
            for method in &service.method {
                let path = format!("/txoutbox.v1.{service_name}/{}", method.name());
                let expected = match (service_name, method.name()) {
                    ("Relay", _) => Needs::Scope(Scope::Subscribe),
                    ("Admin", "InsertMessage") => Needs::Scope(Scope::Insert),
                    ("Admin", "ListOutboxes") => Needs::Identity,
                    (
                        "Admin",
                        "Stats" | "Schema" | "ListDeadLetters" | "CountDeadLetters"
                        | "ListBlockedKeys" | "ListSubscribers",
                    ) => Needs::Scope(Scope::Read),
                    ("Admin", _) => Needs::Scope(Scope::Admin),
                    (other, _) => panic!("a service this test does not know: {other}"),
                };
                assert_eq!(needs(&path, true), expected, "{path}");
                checked += 1;
            }
        }
        assert!(checked >= 19, "only {checked} methods in the descriptor");
    }
}
