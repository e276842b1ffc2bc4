//! Server addresses: parsed once, then connected to one at a time, in rotation.

use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

use crate::ClientError;

/// How a connection to one server is set up.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnectOptions {
    pub connect_timeout: Duration,
    /// HTTP/2 pings, so a silently dead server or a cut network is noticed.
    pub keepalive: Duration,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(5),
            keepalive: Duration::from_secs(10),
        }
    }
}

/// The servers a client may talk to, each a replica serving the same outboxes.
#[derive(Debug, Clone)]
pub(crate) struct Servers {
    endpoints: Vec<(String, Endpoint)>,
    next: usize,
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
            endpoints.push((address, endpoint));
        }
        if endpoints.is_empty() {
            return Err(ClientError::Config(
                "no server address given; pass at least one, for example http://127.0.0.1:7411"
                    .to_owned(),
            ));
        }
        Ok(Self { endpoints, next: 0 })
    }

    /// Every address, for messages.
    pub fn addresses(&self) -> Vec<String> {
        self.endpoints.iter().map(|(a, _)| a.clone()).collect()
    }

    /// The next address in rotation and its endpoint.
    pub fn rotate(&mut self) -> (String, Endpoint) {
        let (address, endpoint) = &self.endpoints[self.next % self.endpoints.len()];
        self.next = (self.next + 1) % self.endpoints.len();
        (address.clone(), endpoint.clone())
    }

    /// Tries each address once, in rotation order, and returns the first channel.
    pub async fn connect_any(&mut self) -> Result<(String, Channel), ClientError> {
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
