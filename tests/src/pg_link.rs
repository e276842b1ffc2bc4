//! A TCP link to PostgreSQL that a test cuts at an exact point of the conversation: once a
//! client of the link has sent a statement whose SQL matches (and the `Sync` or simple
//! query that makes the server run it), every connection of the link stops passing bytes
//! both ways, as the database sees a paused or partitioned server. The cut lasts until
//! [`PgLink::heal`] (held connections go on where they stopped, as TCP does after a
//! partition heals) or until the link is dropped, which closes every connection.
//!
//! It reads the frontend protocol just enough to know which SQL each `Execute` runs
//! (`Parse` names statements, `Bind` names the portal's statement), and the backend
//! protocol for each connection's backend pid (`BackendKeyData`), so a test can check that
//! the database did not end the cut-off sessions itself. TLS would hide all of that: give
//! clients [`PgLink::url`], which turns it off.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::{eventually, DEADLINE};

type Matcher = Box<dyn Fn(&str) -> bool + Send + Sync>;

pub struct PgLink {
    pub port: u16,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

struct Shared {
    upstream: SocketAddr,
    cut_after: Mutex<Option<Matcher>>,
    cut: watch::Sender<bool>,
    pids: Mutex<Vec<i32>>,
    connections: Mutex<Vec<JoinHandle<()>>>,
}

impl PgLink {
    /// A link to the PostgreSQL at `upstream` (`host:port`), on a port the kernel picks.
    pub async fn start(upstream: &str) -> Self {
        let upstream: SocketAddr = upstream.parse().expect("upstream host:port");
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Shared {
            upstream,
            cut_after: Mutex::new(None),
            cut: watch::Sender::new(false),
            pids: Mutex::new(Vec::new()),
            connections: Mutex::new(Vec::new()),
        });
        let accept = tokio::spawn({
            let shared = Arc::clone(&shared);
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    let connection = tokio::spawn(relay(client, Arc::clone(&shared)));
                    shared.connections.lock().unwrap().push(connection);
                }
            }
        });
        Self {
            port,
            shared,
            accept,
        }
    }

    /// `url` (a `postgres://` URL of the upstream) through this link, without TLS.
    pub fn url(&self, url: &str) -> String {
        let upstream = self.shared.upstream.to_string();
        assert!(url.contains(&upstream), "{url} is not at {upstream}");
        let url = url.replace(&upstream, &format!("127.0.0.1:{}", self.port));
        let separator = if url.contains('?') { '&' } else { '?' };
        format!("{url}{separator}sslmode=disable")
    }

    /// Cuts the link once a client sent a statement whose SQL `matches`.
    pub fn cut_after(&self, matches: impl Fn(&str) -> bool + Send + Sync + 'static) {
        *self.shared.cut_after.lock().unwrap() = Some(Box::new(matches));
    }

    /// Passes bytes again, the messages held at the cut first; cuts no more.
    pub fn heal(&self) {
        *self.shared.cut_after.lock().unwrap() = None;
        self.shared.cut.send_replace(false);
    }

    pub fn is_cut(&self) -> bool {
        *self.shared.cut.borrow()
    }

    /// Waits until the link is cut; fails after [`DEADLINE`].
    pub async fn until_cut(&self) {
        eventually("the link is cut", DEADLINE, || async {
            self.is_cut().then_some(())
        })
        .await;
    }

    /// Backend pids of the sessions opened through the link.
    pub fn pids(&self) -> Vec<i32> {
        self.shared.pids.lock().unwrap().clone()
    }
}

impl Drop for PgLink {
    fn drop(&mut self) {
        self.accept.abort();
        for connection in self.shared.connections.lock().unwrap().drain(..) {
            connection.abort();
        }
    }
}

async fn relay(client: TcpStream, shared: Arc<Shared>) {
    let Ok(server) = TcpStream::connect(shared.upstream).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let frontend = frontend(client_read, server_write, Arc::clone(&shared));
    let backend = backend(server_read, client_write, shared);
    // Either side closing ends the connection; a cut one stays open until aborted.
    tokio::select! {
        _ = frontend => {}
        _ = backend => {}
    }
}

/// Client to server: forwards message by message, and cuts the link after the `Sync` (or
/// simple query) that runs a matching statement.
async fn frontend(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    shared: Arc<Shared>,
) -> std::io::Result<()> {
    let mut cut = shared.cut.subscribe();
    // The startup message has no type byte; with TLS off it is the first message.
    let length = from.read_i32().await?;
    let mut startup = vec![0; usize::try_from(length - 4).unwrap_or(0)];
    from.read_exact(&mut startup).await?;
    assert_ne!(
        startup.get(..4),
        Some(&[0x04, 0xd2, 0x16, 0x2f][..]),
        "a client asked for TLS through the link: connect with PgLink::url"
    );
    to.write_all(&length.to_be_bytes()).await?;
    to.write_all(&startup).await?;

    let mut statements: HashMap<String, String> = HashMap::new();
    let mut bound = String::new();
    let mut executed: Vec<String> = Vec::new();
    loop {
        let (kind, body) = read_message(&mut from).await?;
        // Held while cut: the server sees it only once the link heals.
        wait_healed(&mut cut).await;
        match kind {
            b'P' => {
                let (name, rest) = c_string(&body);
                let (sql, _) = c_string(rest);
                statements.insert(name.to_owned(), sql.to_owned());
            }
            b'B' => {
                let (_portal, rest) = c_string(&body);
                let (statement, _) = c_string(rest);
                bound = statements.get(statement).cloned().unwrap_or_default();
            }
            b'E' => executed.push(bound.clone()),
            b'Q' => executed.push(c_string(&body).0.to_owned()),
            _ => {}
        }
        write_message(&mut to, kind, &body).await?;
        if matches!(kind, b'S' | b'Q') {
            let matched = {
                let matcher = shared.cut_after.lock().unwrap();
                matcher
                    .as_ref()
                    .is_some_and(|matches| executed.iter().any(|sql| matches(sql)))
            };
            executed.clear();
            if matched {
                to.flush().await?;
                shared.cut.send_replace(true);
            }
        }
    }
}

/// Returns once the link is not cut (never, if it is never healed).
async fn wait_healed(cut: &mut watch::Receiver<bool>) {
    if cut.wait_for(|cut| !*cut).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Server to client: forwards message by message, noting each session's backend pid.
async fn backend(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    shared: Arc<Shared>,
) -> std::io::Result<()> {
    let mut cut = shared.cut.subscribe();
    loop {
        let (kind, body) = read_message(&mut from).await?;
        wait_healed(&mut cut).await;
        if kind == b'K' && body.len() >= 4 {
            let pid = i32::from_be_bytes(body[..4].try_into().unwrap());
            shared.pids.lock().unwrap().push(pid);
        }
        write_message(&mut to, kind, &body).await?;
    }
}

async fn read_message(from: &mut (impl AsyncRead + Unpin)) -> std::io::Result<(u8, Vec<u8>)> {
    let kind = from.read_u8().await?;
    let length = from.read_i32().await?;
    let mut body = vec![0; usize::try_from(length - 4).unwrap_or(0)];
    from.read_exact(&mut body).await?;
    Ok((kind, body))
}

async fn write_message(
    to: &mut (impl AsyncWrite + Unpin),
    kind: u8,
    body: &[u8],
) -> std::io::Result<()> {
    let length = i32::try_from(body.len() + 4).expect("message size");
    let mut message = Vec::with_capacity(body.len() + 5);
    message.push(kind);
    message.extend_from_slice(&length.to_be_bytes());
    message.extend_from_slice(body);
    to.write_all(&message).await
}

/// The NUL-terminated string at the start of `bytes`, and what follows it.
fn c_string(bytes: &[u8]) -> (&str, &[u8]) {
    let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
    let text = std::str::from_utf8(&bytes[..end]).unwrap_or_default();
    (text, bytes.get(end + 1..).unwrap_or_default())
}
