//! A TCP link of our own between two parties of the fault suite (subscribers and a
//! replica, or a replica and its database), that a fault cuts for a while:
//!
//! - [`Link::reset`]: every open connection is reset (RST, as a crashed peer or a
//!   middlebox would), and new ones are reset on arrival, until [`Link::heal`].
//! - [`Link::black_hole`]: nothing passes either way (open connections stay open, new
//!   ones are accepted and left waiting), as in a silent partition; after
//!   [`Link::heal`] what was held back is delivered, as TCP retransmission would.
//!
//! Bytes are not parsed, so TLS and any protocol pass. The link also records the local
//! port of each of its upstream connections: a database lists its sessions by client
//! port (`pg_stat_activity.client_port`, MariaDB's processlist `host`), which is how the
//! suite finds one replica's sessions to terminate.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Open,
    Reset,
    BlackHole,
}

pub struct Link {
    pub port: u16,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

struct Shared {
    upstream: Mutex<SocketAddr>,
    state: watch::Sender<State>,
    /// Upstream-side local port of each open connection, by connection number.
    upstream_ports: Mutex<HashMap<u64, u16>>,
}

impl Link {
    /// A link to `upstream` on a port the kernel picks.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let shared = Arc::new(Shared {
            upstream: Mutex::new(upstream),
            state: watch::Sender::new(State::Open),
            upstream_ports: Mutex::new(HashMap::new()),
        });
        let accept = tokio::spawn({
            let shared = Arc::clone(&shared);
            async move {
                let mut number = 0_u64;
                while let Ok((client, _)) = listener.accept().await {
                    number += 1;
                    tokio::spawn(connection(client, number, Arc::clone(&shared)));
                }
            }
        });
        Ok(Self {
            port,
            shared,
            accept,
        })
    }

    pub fn address(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// Where new connections go from now on (a restarted replica listens elsewhere).
    pub fn set_upstream(&self, upstream: SocketAddr) {
        *self.shared.upstream.lock().unwrap() = upstream;
    }

    pub fn reset(&self) {
        self.shared.state.send_replace(State::Reset);
    }

    pub fn black_hole(&self) {
        self.shared.state.send_replace(State::BlackHole);
    }

    pub fn heal(&self) {
        self.shared.state.send_replace(State::Open);
    }

    /// Local ports of the link's open upstream connections.
    pub fn upstream_ports(&self) -> Vec<u16> {
        let ports = self.shared.upstream_ports.lock().unwrap();
        ports.values().copied().collect()
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.accept.abort();
        // Open connections end with a reset, their tasks then return.
        self.shared.state.send_replace(State::Reset);
    }
}

async fn connection(mut client: TcpStream, number: u64, shared: Arc<Shared>) {
    let mut state = shared.state.subscribe();
    // A black hole holds a new connection before it reaches upstream.
    let _ = state.wait_for(|s| *s != State::BlackHole).await;
    if *state.borrow() == State::Reset {
        return reset(client);
    }
    let upstream = *shared.upstream.lock().unwrap();
    let Ok(mut server) = TcpStream::connect(upstream).await else {
        return reset(client);
    };
    if let Ok(local) = server.local_addr() {
        let mut ports = shared.upstream_ports.lock().unwrap();
        ports.insert(number, local.port());
    }
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let was_reset = {
        let (client_read, client_write) = client.split();
        let (server_read, server_write) = server.split();
        let up = pipe(client_read, server_write, shared.state.subscribe());
        let down = pipe(server_read, client_write, shared.state.subscribe());
        let cut = state.wait_for(|s| *s == State::Reset);
        tokio::select! {
            _ = up => false,
            _ = down => false,
            _ = cut => true,
        }
    };
    shared.upstream_ports.lock().unwrap().remove(&number);
    if was_reset {
        reset(client);
        reset(server);
    }
}

/// Copies one direction, holding each chunk while the link is a black hole; returns when
/// either side closes or fails (the connection then ends both ways).
async fn pipe(
    mut from: impl AsyncReadExt + Unpin,
    mut to: impl AsyncWriteExt + Unpin,
    mut state: watch::Receiver<State>,
) {
    let mut buffer = vec![0_u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if state.wait_for(|s| *s == State::Open).await.is_err() {
            return;
        }
        if to.write_all(&buffer[..n]).await.is_err() {
            return;
        }
    }
}

/// Closes with a reset (SO_LINGER 0) rather than an orderly FIN.
fn reset(stream: TcpStream) {
    let _ = stream.set_zero_linger();
    drop(stream);
}
