//! TLS on the gRPC port (rustls, TLS 1.3 and 1.2), mutual TLS when `client_ca` is set.
//!
//! The handshake is done here, not by tonic, so that certificates can change under a
//! running server: every connection is accepted with the configuration current at that
//! moment, and the files are read again when their modification time or size changes
//! (checked every `reload_interval`) or on SIGHUP. A rotation that leaves unreadable or
//! mismatched files is logged and ignored: the previous certificates stay in use.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::Context;
use futures::Stream;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{
    CertificateDer, CertificateRevocationListDer, PrivateKeyDer,
};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{self, RootCertStore, ServerConfig};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use super::caps::{Caps, Counted};
use super::watch::{self, Reload};
use crate::config::TlsConfig;

/// Longest a client may take to finish its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The TLS configuration in use, replaced when the files change.
pub struct ReloadingTls {
    config: TlsConfig,
    current: RwLock<Arc<ServerConfig>>,
}

impl ReloadingTls {
    pub fn load(config: &TlsConfig) -> anyhow::Result<Arc<Self>> {
        Ok(Arc::new(Self {
            current: RwLock::new(server_config(config)?),
            config: config.clone(),
        }))
    }

    fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(Arc::clone(&self.current.read().expect("tls config lock")))
    }

    /// Reloads when the files change or on SIGHUP, until `stop`.
    pub async fn watch(self: Arc<Self>, stop: CancellationToken) {
        let interval = self.config.reload_interval;
        watch::watch(self, interval, stop).await;
    }
}

impl Reload for ReloadingTls {
    const NO_SIGHUP: &'static str = "no SIGHUP handler; TLS reloads on file changes only";

    fn files(&self) -> Vec<PathBuf> {
        let mut files = vec![self.config.cert.clone(), self.config.key.clone()];
        files.extend(self.config.client_ca.clone());
        files.extend(self.config.client_crls.iter().cloned());
        files
    }

    fn reload(&self, why: &str) {
        match server_config(&self.config) {
            Ok(config) => {
                *self.current.write().expect("tls config lock") = config;
                tracing::info!(why, cert = %self.config.cert.display(), "TLS certificates reloaded");
            }
            Err(error) => tracing::error!(
                why,
                error = format!("{error:#}"),
                "TLS certificates not reloaded; the previous ones stay in use"
            ),
        }
    }
}

fn server_config(config: &TlsConfig) -> anyhow::Result<Arc<ServerConfig>> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&config.cert)
        .and_then(|certs| certs.collect())
        .with_context(|| format!("server.tls.cert = {}", config.cert.display()))?;
    anyhow::ensure!(
        !chain.is_empty(),
        "server.tls.cert = {}: no PEM certificate in it",
        config.cert.display()
    );
    let key = PrivateKeyDer::from_pem_file(&config.key)
        .with_context(|| format!("server.tls.key = {}", config.key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .context("TLS versions")?;
    let builder = match &config.client_ca {
        None => builder.with_no_client_auth(),
        Some(path) => {
            let mut roots = RootCertStore::empty();
            for certificate in CertificateDer::pem_file_iter(path)
                .with_context(|| format!("server.tls.client_ca = {}", path.display()))?
            {
                let certificate = certificate
                    .with_context(|| format!("server.tls.client_ca = {}", path.display()))?;
                roots
                    .add(certificate)
                    .with_context(|| format!("server.tls.client_ca = {}", path.display()))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let verifier = match client_crls(&config.client_crls)? {
                // The leaf's status: the CAs of `client_ca` sign clients directly, and an
                // intermediate's list is seldom at hand.
                Some(crls) => verifier.with_crls(crls).only_check_end_entity_revocation(),
                None => verifier,
            };
            let verifier = if config.client_cert_optional {
                verifier.allow_unauthenticated()
            } else {
                verifier
            };
            builder.with_client_cert_verifier(
                verifier
                    .build()
                    .with_context(|| format!("server.tls.client_ca = {}", path.display()))?,
            )
        }
    };
    let mut server = builder.with_single_cert(chain, key).with_context(|| {
        format!(
            "server.tls.key = {} does not go with server.tls.cert = {}",
            config.key.display(),
            config.cert.display()
        )
    })?;
    server.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(server))
}

/// The revocation lists of `server.tls.client_crls`, none when it is empty.
fn client_crls(
    paths: &[PathBuf],
) -> anyhow::Result<Option<Vec<CertificateRevocationListDer<'static>>>> {
    if paths.is_empty() {
        return Ok(None);
    }
    let mut crls = Vec::new();
    for path in paths {
        let context = || format!("server.tls.client_crls: {}", path.display());
        let before = crls.len();
        for crl in CertificateRevocationListDer::pem_file_iter(path).with_context(context)? {
            crls.push(crl.with_context(context)?);
        }
        anyhow::ensure!(crls.len() > before, "{}: no PEM X509 CRL in it", context());
    }
    Ok(Some(crls))
}

/// Connections from `listener` within the server's caps, each handshaken with the
/// certificates current when it was accepted, until `stop`. A client that does not finish
/// its handshake in time is dropped without holding up the others.
pub fn incoming(
    listener: TcpListener,
    tls: Arc<ReloadingTls>,
    caps: &Caps,
    stop: CancellationToken,
) -> impl Stream<Item = Result<Counted<TlsStream<TcpStream>>, std::io::Error>> {
    let handshakes = caps.clone();
    caps.incoming(listener, stop, move |stream, peer| {
        let acceptor = tls.acceptor();
        let place = handshakes.handshake();
        async move {
            // Held until the handshake ends: a slow client holds one of the places.
            let _place = place?;
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(stream)) => Some(stream),
                Ok(Err(error)) => {
                    tracing::info!(%peer, %error, "TLS handshake failed");
                    None
                }
                Err(_) => {
                    tracing::info!(%peer, "TLS handshake not finished within 10s");
                    None
                }
            }
        }
    })
}

/// The names a client certificate carries, which `certificate_names` are matched against:
/// subject common names, then DNS names, URIs and e-mail addresses of the
/// subjectAltName extension. Empty when the certificate cannot be parsed (rustls
/// verified it already).
pub fn certificate_names(der: &CertificateDer<'_>) -> Vec<String> {
    use x509_parser::extensions::GeneralName;
    let Ok((_, certificate)) = x509_parser::parse_x509_certificate(der.as_ref()) else {
        return Vec::new();
    };
    let mut names: Vec<String> = certificate
        .subject()
        .iter_common_name()
        .filter_map(|cn| cn.as_str().ok().map(str::to_owned))
        .collect();
    if let Ok(Some(san)) = certificate.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                GeneralName::DNSName(n) | GeneralName::URI(n) | GeneralName::RFC822Name(n) => {
                    names.push((*n).to_owned())
                }
                _ => {}
            }
        }
    }
    names
}
