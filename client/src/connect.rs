//! Server addresses: parsed once, then connected to one at a time, in rotation; with TLS
//! and a bearer token when the servers ask for them.

use std::path::Path;
use std::time::Duration;

use tonic::metadata::AsciiMetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::ClientError;

/// A connection to a server: a channel that sends the bearer token, if any, with every
/// call. What [`connect_with`] returns, for the generated stubs of [`proto`](crate::proto).
pub type Connection = InterceptedService<Channel, BearerToken>;

/// Adds `authorization: Bearer TOKEN` to every call when a token is set.
#[derive(Clone, Default)]
pub struct BearerToken(Option<AsciiMetadataValue>);

impl tonic::service::Interceptor for BearerToken {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}

/// How a client proves who it is and checks the server: a bearer token, and TLS settings
/// for `https://` addresses (the system's roots unless a CA is given; a client
/// certificate for mutual TLS).
///
/// ```no_run
/// # fn demo() -> Result<(), txoutbox_client::ClientError> {
/// let credentials = txoutbox_client::Credentials::from_files(
///     Some("ca.pem".as_ref()),            // the CA that signed the server's certificate
///     None,                               // a client certificate and key, for mutual TLS
///     None,
/// )?
/// .bearer_token(&std::env::var("TXOUTBOX_TOKEN").unwrap_or_default())?;
/// # Ok(()) }
/// ```
#[derive(Clone, Default)]
pub struct Credentials {
    token: BearerToken,
    ca_pem: Option<Vec<u8>>,
    client_pem: Option<(Vec<u8>, Vec<u8>)>,
    domain: Option<String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("token", &self.token.0.as_ref().map(|_| "<redacted>"))
            .field("ca", &self.ca_pem.is_some())
            .field("client_certificate", &self.client_pem.is_some())
            .field("domain", &self.domain)
            .finish()
    }
}

impl Credentials {
    /// No token, no TLS settings.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sends `authorization: Bearer TOKEN` with every call. An empty token sends none.
    pub fn bearer_token(mut self, token: &str) -> Result<Self, ClientError> {
        let token = token.trim();
        self.token = if token.is_empty() {
            BearerToken(None)
        } else {
            let mut value: AsciiMetadataValue =
                format!("Bearer {token}").parse().map_err(|_| {
                    ClientError::Config(
                        "the token must be printable ASCII, without spaces".to_owned(),
                    )
                })?;
            value.set_sensitive(true);
            BearerToken(Some(value))
        };
        Ok(self)
    }

    /// Trusts the servers' certificates signed by these CA certificates (PEM) instead of
    /// the system's roots.
    pub fn ca_certificate_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.ca_pem = Some(pem.into());
        self
    }

    /// Mutual TLS: presents this certificate chain and its private key (PEM).
    pub fn client_certificate_pem(
        mut self,
        cert: impl Into<Vec<u8>>,
        key: impl Into<Vec<u8>>,
    ) -> Self {
        self.client_pem = Some((cert.into(), key.into()));
        self
    }

    /// The name the server's certificate must carry, when it is not the address's host.
    pub fn tls_domain(mut self, name: impl Into<String>) -> Self {
        self.domain = Some(name.into());
        self
    }

    /// [`ca_certificate_pem`](Self::ca_certificate_pem) and
    /// [`client_certificate_pem`](Self::client_certificate_pem) from files; an error names
    /// the file it could not read.
    pub fn from_files(
        ca: Option<&Path>,
        cert: Option<&Path>,
        key: Option<&Path>,
    ) -> Result<Self, ClientError> {
        let read = |what: &str, path: &Path| {
            std::fs::read(path).map_err(|error| {
                ClientError::Config(format!(
                    "{what} {}: cannot read it: {error}",
                    path.display()
                ))
            })
        };
        let mut credentials = Self::new();
        if let Some(ca) = ca {
            credentials = credentials.ca_certificate_pem(read("TLS CA file", ca)?);
        }
        match (cert, key) {
            (Some(cert), Some(key)) => {
                credentials = credentials.client_certificate_pem(
                    read("TLS certificate file", cert)?,
                    read("TLS key file", key)?,
                )
            }
            (None, None) => {}
            _ => {
                return Err(ClientError::Config(
                    "a client certificate needs both its certificate and its key file".to_owned(),
                ))
            }
        }
        Ok(credentials)
    }

    /// Whether TLS settings were given (then every address must be `https://`).
    fn has_tls_settings(&self) -> bool {
        self.ca_pem.is_some() || self.client_pem.is_some() || self.domain.is_some()
    }

    fn tls(&self) -> ClientTlsConfig {
        let mut tls = ClientTlsConfig::new();
        tls = match &self.ca_pem {
            Some(pem) => tls.ca_certificate(Certificate::from_pem(pem)),
            None => tls.with_native_roots(),
        };
        if let Some((cert, key)) = &self.client_pem {
            tls = tls.identity(Identity::from_pem(cert, key));
        }
        if let Some(domain) = &self.domain {
            tls = tls.domain_name(domain.clone());
        }
        tls
    }
}

/// How a connection to one server is set up.
#[derive(Debug, Clone)]
pub(crate) struct ConnectOptions {
    pub connect_timeout: Duration,
    /// HTTP/2 pings, so a silently dead server or a cut network is noticed.
    pub keepalive: Duration,
    pub credentials: Credentials,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(5),
            keepalive: Duration::from_secs(10),
            credentials: Credentials::default(),
        }
    }
}

/// The servers a client may talk to, each a replica serving the same outboxes.
#[derive(Debug, Clone)]
pub(crate) struct Servers {
    endpoints: Vec<(String, Endpoint)>,
    next: usize,
    token: BearerToken,
}

impl std::fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Bearer <redacted>"
        } else {
            "none"
        })
    }
}

impl Servers {
    pub fn parse<I, S>(addresses: I, options: ConnectOptions) -> Result<Self, ClientError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut endpoints = Vec::new();
        for address in addresses {
            let address: String = address.into();
            let endpoint = Endpoint::from_shared(address.clone())
                .map_err(|error| ClientError::InvalidAddress {
                    address: address.clone(),
                    reason: error.to_string(),
                })?
                .connect_timeout(options.connect_timeout)
                .http2_keep_alive_interval(options.keepalive)
                .keep_alive_timeout(options.keepalive * 2)
                .keep_alive_while_idle(true)
                .tcp_nodelay(true);
            let endpoint = if address.starts_with("https://") {
                endpoint
                    .tls_config(options.credentials.tls())
                    .map_err(|error| ClientError::InvalidAddress {
                        address: address.clone(),
                        reason: format!("TLS settings: {}", error_chain(&error)),
                    })?
            } else if options.credentials.has_tls_settings() {
                return Err(ClientError::InvalidAddress {
                    address,
                    reason: "TLS settings were given, but the address is not https://".to_owned(),
                });
            } else {
                endpoint
            };
            endpoints.push((address, endpoint));
        }
        if endpoints.is_empty() {
            return Err(ClientError::Config(
                "no server address given; pass at least one, for example http://127.0.0.1:7411"
                    .to_owned(),
            ));
        }
        Ok(Self {
            endpoints,
            next: 0,
            token: options.credentials.token,
        })
    }

    /// Every address, for messages.
    pub fn addresses(&self) -> Vec<String> {
        self.endpoints.iter().map(|(a, _)| a.clone()).collect()
    }

    /// The bearer token every call to these servers carries.
    pub fn token(&self) -> BearerToken {
        self.token.clone()
    }

    /// The next address in rotation and its endpoint.
    pub fn rotate(&mut self) -> (String, Endpoint) {
        let (address, endpoint) = &self.endpoints[self.next % self.endpoints.len()];
        self.next = (self.next + 1) % self.endpoints.len();
        (address.clone(), endpoint.clone())
    }

    /// Tries each address once, in rotation order, and returns the first channel.
    pub async fn connect_any(&mut self) -> Result<(String, Connection), ClientError> {
        let (address, channel) = self.connect_channel().await?;
        Ok((
            address,
            InterceptedService::new(channel, self.token.clone()),
        ))
    }

    /// [`connect_any`](Self::connect_any) without the token.
    async fn connect_channel(&mut self) -> Result<(String, Channel), ClientError> {
        let mut last_error = String::new();
        for _ in 0..self.endpoints.len() {
            let (address, endpoint) = self.rotate();
            match endpoint.connect().await {
                Ok(channel) => return Ok((address, channel)),
                Err(error) => {
                    tracing::debug!(%address, error = %error_chain(&error), "connection failed");
                    last_error = error_chain(&error);
                }
            }
        }
        Err(ClientError::Unreachable {
            addresses: self.addresses(),
            reason: last_error,
        })
    }
}

/// Connects to the first reachable server of `addresses`, for the admin calls or the
/// generated stubs of [`proto`](crate::proto).
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use txoutbox_client::proto::v1::{admin_client::AdminClient, StatsRequest};
///
/// let channel = txoutbox_client::connect(["http://127.0.0.1:7411"]).await?;
/// let stats = AdminClient::new(channel)
///     .stats(StatsRequest { outbox: "orders".into() })
///     .await?;
/// println!("{:?}", stats.into_inner().total);
/// # Ok(())
/// # }
/// ```
pub async fn connect<I, S>(addresses: I) -> Result<Channel, ClientError>
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    let mut servers = Servers::parse(addresses, ConnectOptions::default())?;
    Ok(servers.connect_channel().await?.1)
}

/// [`connect`] with TLS and a bearer token (see [`Credentials`]).
pub async fn connect_with<I, S>(
    addresses: I,
    credentials: Credentials,
) -> Result<Connection, ClientError>
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    let options = ConnectOptions {
        credentials,
        ..ConnectOptions::default()
    };
    let mut servers = Servers::parse(addresses, options)?;
    Ok(servers.connect_any().await?.1)
}

/// A transport error with its sources: tonic's own text is just "transport error".
pub(crate) fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(inner) = cause {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        cause = inner.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_rotate_and_bad_ones_are_named() {
        let mut servers =
            Servers::parse(["http://a:1", "http://b:2"], ConnectOptions::default()).unwrap();
        assert_eq!(servers.rotate().0, "http://a:1");
        assert_eq!(servers.rotate().0, "http://b:2");
        assert_eq!(servers.rotate().0, "http://a:1");
        let error = Servers::parse(["not a uri"], ConnectOptions::default()).unwrap_err();
        assert!(error.to_string().contains("`not a uri`"), "{error}");
        assert!(Servers::parse(Vec::<String>::new(), ConnectOptions::default()).is_err());
    }
}
