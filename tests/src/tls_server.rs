//! TLS servers of the tests' own, for what no real server here does with TLS:
//!
//! - [`FakeKafka`]: a TLS listener that speaks just enough of the Kafka protocol for a
//!   client to get through the TLS handshake and start its SASL exchange (ApiVersions,
//!   SaslHandshake, the first SaslAuthenticate), and records what it saw: librdkafka's
//!   mock cluster speaks neither TLS nor SASL.
//! - [`HttpsReceiver`]: an HTTPS endpoint that may require client certificates, answering
//!   204 to every POST and recording its body.
//!
//! Both verify client certificates against the test's CA when asked to (a client without
//! one, or with one of another CA, fails the handshake) and record each handshake.

use std::path::Path;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{self, RootCertStore, ServerConfig};
use tokio_rustls::TlsAcceptor;

use crate::pki::TlsFiles;

/// What a TLS server of the tests saw, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// A TLS handshake completed; whether the client presented a certificate.
    Handshake { client_certificate: bool },
    /// A TLS handshake failed.
    HandshakeFailed(String),
    /// A Kafka request of this API key arrived (18 ApiVersions, 3 Metadata, ...).
    KafkaRequest(i16),
    /// The mechanism of a Kafka SaslHandshake.
    SaslMechanism(String),
    /// The client's first SASL message (SaslAuthenticate's bytes).
    SaslFirstMessage(Vec<u8>),
    /// An HTTP request's body.
    HttpBody(Vec<u8>),
}

/// The acceptor for `server.pem` / `server.key` of `files`, verifying client certificates
/// against `ca.pem` when `client_certificates` is set.
pub fn acceptor(files: &TlsFiles, client_certificates: bool) -> TlsAcceptor {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .unwrap();
    let builder = if client_certificates {
        let mut roots = RootCertStore::empty();
        for cert in certificates(&files.path("ca.pem")) {
            roots.add(cert).unwrap();
        }
        let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .unwrap();
        builder.with_client_cert_verifier(verifier)
    } else {
        builder.with_no_client_auth()
    };
    let key = PrivateKeyDer::from_pem_file(files.path("server.key")).unwrap();
    let config = builder
        .with_single_cert(certificates(&files.path("server.pem")), key)
        .unwrap();
    TlsAcceptor::from(Arc::new(config))
}

fn certificates(path: &Path) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_file_iter(path)
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// A TLS server on a port of its own, serving each connection with `serve`; stopped when
/// dropped.
struct TlsServer {
    port: u16,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl TlsServer {
    async fn start<F, Fut>(acceptor: TlsAcceptor, serve: F) -> Self
    where
        F: Fn(tokio_rustls::server::TlsStream<tokio::net::TcpStream>, Arc<Mutex<Vec<Seen>>>) -> Fut
            + Send
            + Sync
            + 'static,
        Fut: std::future::Future<Output = std::io::Result<()>> + Send,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let serve = Arc::new(serve);
        let task = {
            let seen = Arc::clone(&seen);
            tokio::spawn(async move {
                loop {
                    let Ok((tcp, _)) = listener.accept().await else {
                        return;
                    };
                    let (acceptor, seen, serve) =
                        (acceptor.clone(), Arc::clone(&seen), Arc::clone(&serve));
                    tokio::spawn(async move {
                        match acceptor.accept(tcp).await {
                            Ok(tls) => {
                                let client_certificate =
                                    tls.get_ref().1.peer_certificates().is_some();
                                seen.lock()
                                    .unwrap()
                                    .push(Seen::Handshake { client_certificate });
                                let _ = serve(tls, seen).await;
                            }
                            Err(error) => seen
                                .lock()
                                .unwrap()
                                .push(Seen::HandshakeFailed(error.to_string())),
                        }
                    });
                }
            })
        };
        Self { port, seen, task }
    }
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// See the [module documentation](self).
pub struct FakeKafka {
    server: TlsServer,
}

impl FakeKafka {
    pub async fn start(files: &TlsFiles, client_certificates: bool) -> Self {
        let server = TlsServer::start(acceptor(files, client_certificates), |tls, seen| {
            serve_kafka(tls, seen)
        })
        .await;
        Self { server }
    }

    /// `localhost:PORT`: the server certificate names localhost, which librdkafka checks.
    pub fn bootstrap(&self) -> String {
        format!("localhost:{}", self.server.port)
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.server.seen.lock().unwrap().clone()
    }
}

/// Reads Kafka requests and answers ApiVersions and SaslHandshake; records the first
/// SaslAuthenticate's bytes and ends the connection there, as a broker whose credential
/// check failed would.
async fn serve_kafka(
    mut tls: tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
    seen: Arc<Mutex<Vec<Seen>>>,
) -> std::io::Result<()> {
    loop {
        let frame = read_frame(&mut tls).await?;
        let mut request = Reader(&frame);
        let (api_key, version, correlation) = (request.i16(), request.i16(), request.i32());
        seen.lock().unwrap().push(Seen::KafkaRequest(api_key));
        let client_id_length = request.i16();
        request.skip(client_id_length.max(0) as usize);
        let flexible = (api_key == 18 && version >= 3) || (api_key == 36 && version >= 2);
        if flexible {
            request.skip(1); // no tagged fields
        }
        let mut body = Vec::new();
        match api_key {
            18 => api_versions(&mut body, version),
            17 => {
                let length = request.i16() as usize;
                let mechanism = String::from_utf8_lossy(request.take(length)).into_owned();
                seen.lock()
                    .unwrap()
                    .push(Seen::SaslMechanism(mechanism.clone()));
                body.extend(0i16.to_be_bytes());
                body.extend(1i32.to_be_bytes());
                body.extend((mechanism.len() as i16).to_be_bytes());
                body.extend(mechanism.as_bytes());
            }
            36 => {
                let length = request.i32() as usize;
                let first = request.take(length).to_vec();
                seen.lock().unwrap().push(Seen::SaslFirstMessage(first));
                return Ok(());
            }
            _ => return Ok(()),
        }
        let mut response = Vec::new();
        response.extend(((body.len() + 4) as i32).to_be_bytes());
        response.extend(correlation.to_be_bytes());
        response.extend(body);
        tls.write_all(&response).await?;
    }
}

/// ApiVersions' answer: ApiVersions 0-3, SaslHandshake 0-1, SaslAuthenticate 0-1 and
/// Metadata 0-4, in the layout of the version asked (3 and up: compact, tagged).
fn api_versions(body: &mut Vec<u8>, version: i16) {
    let keys: [(i16, i16, i16); 4] = [(18, 0, 3), (17, 0, 1), (36, 0, 1), (3, 0, 4)];
    body.extend(0i16.to_be_bytes());
    if version >= 3 {
        body.push(keys.len() as u8 + 1);
    } else {
        body.extend((keys.len() as i32).to_be_bytes());
    }
    for (key, min, max) in keys {
        body.extend(key.to_be_bytes());
        body.extend(min.to_be_bytes());
        body.extend(max.to_be_bytes());
        if version >= 3 {
            body.push(0);
        }
    }
    if version >= 1 {
        body.extend(0i32.to_be_bytes());
    }
    if version >= 3 {
        body.push(0);
    }
}

async fn read_frame(stream: &mut (impl AsyncRead + Unpin)) -> std::io::Result<Vec<u8>> {
    let length = stream.read_i32().await?;
    let mut frame = vec![0; length.max(0) as usize];
    stream.read_exact(&mut frame).await?;
    Ok(frame)
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> &'a [u8] {
        let (taken, rest) = self.0.split_at(n.min(self.0.len()));
        self.0 = rest;
        taken
    }
    fn skip(&mut self, n: usize) {
        self.take(n);
    }
    fn i16(&mut self) -> i16 {
        i16::from_be_bytes(self.take(2).try_into().unwrap())
    }
    fn i32(&mut self) -> i32 {
        i32::from_be_bytes(self.take(4).try_into().unwrap())
    }
}

/// See the [module documentation](self).
pub struct HttpsReceiver {
    server: TlsServer,
}

impl HttpsReceiver {
    pub async fn start(files: &TlsFiles, client_certificates: bool) -> Self {
        let server = TlsServer::start(acceptor(files, client_certificates), |tls, seen| {
            serve_http(tls, seen)
        })
        .await;
        Self { server }
    }

    /// `https://localhost:PORT/hook`.
    pub fn url(&self) -> String {
        format!("https://localhost:{}/hook", self.server.port)
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.server.seen.lock().unwrap().clone()
    }
}

/// Reads one HTTP/1.1 request (headers, then `content-length` bytes), records its body
/// and answers 204.
async fn serve_http(
    mut tls: tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
    seen: Arc<Mutex<Vec<Seen>>>,
) -> std::io::Result<()> {
    let mut received = Vec::new();
    let mut buffer = [0u8; 4096];
    let (head_end, length) = loop {
        let n = tls.read(&mut buffer).await?;
        if n == 0 {
            return Ok(());
        }
        received.extend_from_slice(&buffer[..n]);
        if let Some(end) = received.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&received[..end]).to_ascii_lowercase();
            let length = head
                .lines()
                .find_map(|line| line.strip_prefix("content-length:"))
                .map_or(0, |value| value.trim().parse().unwrap());
            break (end + 4, length);
        }
    };
    while received.len() < head_end + length {
        let n = tls.read(&mut buffer).await?;
        if n == 0 {
            return Ok(());
        }
        received.extend_from_slice(&buffer[..n]);
    }
    let body = received[head_end..head_end + length].to_vec();
    seen.lock().unwrap().push(Seen::HttpBody(body));
    tls.write_all(b"HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n")
        .await?;
    tls.shutdown().await
}
