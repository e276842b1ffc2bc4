//! [`WebhookPublisherBuilder`]: the endpoint's settings, checked by `build`, and the HTTP
//! client with its TLS files.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use reqwest::header::HeaderMap;
use reqwest::Url;

use super::{header, BatchLimits, Batcher, Endpoint, SendBatch, WebhookPublisher};
use crate::brokers::batch::same_outcome;
use crate::brokers::{CloudEvents, TlsFiles};
use crate::ClientError;

/// Configures a [`WebhookPublisher`]; start with [`WebhookPublisher::builder`].
#[must_use]
pub struct WebhookPublisherBuilder {
    pub(super) url: String,
    pub(super) secret: Option<Vec<u8>>,
    pub(super) timeout: Duration,
    pub(super) headers: Vec<(String, String)>,
    pub(super) retried_statuses: BTreeSet<u16>,
    pub(super) client: Option<reqwest::Client>,
    pub(super) batch: Option<BatchLimits>,
    pub(super) tls: TlsFiles,
    pub(super) cloudevents: Option<CloudEvents>,
}

impl WebhookPublisherBuilder {
    crate::brokers::tls_methods!();
    crate::brokers::cloudevents_method!();

    /// Signs every request with this shared secret (header `txoutbox-signature`).
    /// Without one, requests are not signed.
    pub fn secret(mut self, secret: impl Into<Vec<u8>>) -> Self {
        self.secret = Some(secret.into());
        self
    }

    /// How long a request may take, connecting included (default 8s), before the row is
    /// nacked and retried. Keep it below the subscriber's `publish_timeout` (10s).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// A header sent with every request (for example `authorization`); a row's header of
    /// the same name wins.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Retries a 4xx status that would otherwise dead-letter the message (for example
    /// 404 while the endpoint is being deployed, or 409).
    pub fn retry_status(mut self, status: u16) -> Self {
        self.retried_statuses.insert(status);
        self
    }

    /// Sends the messages published at about the same time as one POST whose body is a
    /// JSON array (see the [module documentation](self)): a batch leaves when it holds
    /// `max_messages`, or `max_wait` after its first message, whichever comes first. Every
    /// message of a batch gets the POST's outcome.
    ///
    /// A batch holds at most one message per key and at most as many as the subscribers
    /// publish at once: give them a `concurrency` of at least `max_messages`. A publish
    /// now takes up to `max_wait` longer: keep `max_wait + timeout` below the
    /// subscriber's `publish_timeout`.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use txoutbox_client::webhook::WebhookPublisher;
    ///
    /// # fn demo() -> Result<(), txoutbox_client::ClientError> {
    /// let hook = WebhookPublisher::builder("https://example.com/hooks/orders")
    ///     .secret("whsec-...")
    ///     .batch(50, Duration::from_millis(20))
    ///     .build()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn batch(mut self, max_messages: usize, max_wait: Duration) -> Self {
        self.batch = Some(BatchLimits {
            max_messages,
            // One POST of any size: the endpoint says what it takes.
            max_bytes: usize::MAX,
            max_wait,
        });
        self
    }

    /// Checks the URL and the headers and makes the HTTP client (no connection yet).
    pub fn build(self) -> Result<WebhookPublisher, ClientError> {
        let url = Url::parse(&self.url)
            .ok()
            .filter(|url| matches!(url.scheme(), "http" | "https"))
            .ok_or_else(|| {
                ClientError::Config(format!(
                    "invalid webhook URL `{}`: use for example https://example.com/hooks/orders",
                    self.url
                ))
            })?;
        let mut headers = HeaderMap::new();
        for (name, value) in &self.headers {
            let (name, value) = header(name, value).map_err(ClientError::Config)?;
            headers.insert(name, value);
        }
        let client = match self.client {
            Some(client) => client,
            None => http_client(self.timeout, &self.tls)?,
        };
        if self.batch.is_some() && self.cloudevents.is_some() {
            return Err(ClientError::Config(
                "webhook batches cannot be CloudEvents (each POST holds one event): turn \
                 one of them off"
                    .to_owned(),
            ));
        }
        if let Some(limits) = &self.batch {
            if limits.max_messages == 0 || limits.max_wait.is_zero() {
                return Err(ClientError::Config(format!(
                    "webhook batch of at most {} messages within {}ms: both must be positive, \
                     for example 50 messages within 20ms",
                    limits.max_messages,
                    limits.max_wait.as_millis()
                )));
            }
        }
        let endpoint = Arc::new(Endpoint {
            url,
            secret: self.secret,
            headers,
            retried_statuses: self.retried_statuses,
            client,
            cloudevents: self.cloudevents,
        });
        let batcher = self.batch.map(|limits| {
            let endpoint = Arc::clone(&endpoint);
            let send: SendBatch<crate::Message> = Arc::new(move |messages| {
                let endpoint = Arc::clone(&endpoint);
                Box::pin(async move {
                    let result = endpoint.post_batch(&messages).await;
                    same_outcome(&result, messages.len())
                })
            });
            Batcher::new(limits, send)
        });
        Ok(WebhookPublisher { endpoint, batcher })
    }
}

fn http_client(timeout: Duration, tls: &TlsFiles) -> Result<reqwest::Client, ClientError> {
    let invalid = |what: &str, error: reqwest::Error| {
        ClientError::Config(format!("the webhook's {what} is not usable: {error}"))
    };
    let pem = tls.read()?;
    let mut builder = reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(timeout)
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("txoutbox/", env!("CARGO_PKG_VERSION")));
    if let Some(ca) = pem.ca {
        let ca = reqwest::Certificate::from_pem(&ca).map_err(|e| invalid("CA certificate", e))?;
        builder = builder
            .tls_built_in_root_certs(false)
            .add_root_certificate(ca);
    }
    if let Some((cert, key)) = pem.client {
        let identity = reqwest::Identity::from_pem(&[cert.as_slice(), b"\n", &key].concat())
            .map_err(|e| invalid("client certificate", e))?;
        builder = builder.identity(identity);
    }
    builder
        .build()
        .map_err(|error| ClientError::Config(format!("cannot make the HTTP client: {error}")))
}
