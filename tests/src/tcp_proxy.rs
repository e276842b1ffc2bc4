//! A TCP proxy between a client and a shared service (a broker), which a test uses to
//! break the link without touching the service others use: [`TcpProxy::reset`] resets
//! every connection and refuses new ones (the service went down), [`TcpProxy::black_hole`]
//! stops every byte both ways while connections stay open (a partition, a paused host),
//! [`TcpProxy::restore`] lets bytes pass again (held connections resume where they were,
//! as TCP does after a partition heals).

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Link {
    Open,
    Reset,
    BlackHole,
}

pub struct TcpProxy {
    pub port: u16,
    link: watch::Sender<Link>,
    accept: JoinHandle<()>,
}

impl TcpProxy {
    /// A proxy to `upstream` (`host:port`) on a port the kernel picks.
    pub async fn start(upstream: &str) -> Self {
        let upstream: SocketAddr = upstream.parse().expect("upstream host:port");
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let link = watch::Sender::new(Link::Open);
        let accept = tokio::spawn({
            let link = link.clone();
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    tokio::spawn(pipe(client, upstream, link.subscribe()));
                }
            }
        });
        Self { port, link, accept }
    }

    /// `host:port` of the proxy.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Resets every connection (RST) and every new one, until [`TcpProxy::restore`].
    pub fn reset(&self) {
        self.link.send_replace(Link::Reset);
    }

    /// Passes no byte either way, connections held open, until [`TcpProxy::restore`].
    pub fn black_hole(&self) {
        self.link.send_replace(Link::BlackHole);
    }

    /// Passes bytes again.
    pub fn restore(&self) {
        self.link.send_replace(Link::Open);
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.link.send_replace(Link::Reset);
        self.accept.abort();
    }
}

/// Copies bytes both ways while the link is open; stops reading while it is a black
/// hole; resets both sides when it is reset, or when either side closes.
async fn pipe(client: TcpStream, upstream: SocketAddr, mut link: watch::Receiver<Link>) {
    abortive_close(&client);
    if *link.borrow_and_update() == Link::Reset {
        return;
    }
    let Ok(Ok(server)) =
        tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(upstream)).await
    else {
        return;
    };
    abortive_close(&server);
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let mut up = vec![0u8; 16 * 1024];
    let mut down = vec![0u8; 16 * 1024];
    loop {
        let state = *link.borrow_and_update();
        match state {
            Link::Reset => return,
            Link::BlackHole => {
                if link.changed().await.is_err() {
                    return;
                }
                continue;
            }
            Link::Open => {}
        }
        tokio::select! {
            changed = link.changed() => if changed.is_err() { return },
            read = client_read.read(&mut up) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => if server_write.write_all(&up[..n]).await.is_err() { return },
            },
            read = server_read.read(&mut down) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => if client_write.write_all(&down[..n]).await.is_err() { return },
            },
        }
    }
}

/// Dropping the socket sends RST rather than FIN: the peer sees a connection reset, as
/// when a server dies.
fn abortive_close(stream: &TcpStream) {
    // Deprecated because a non-zero linger blocks the closing thread; zero does not.
    #[allow(deprecated)]
    let _ = stream.set_linger(Some(Duration::ZERO));
}
