//! Server-wide caps, whoever the callers are: streams (`server.max_streams`), connections
//! (`server.max_connections`) and TLS handshakes in progress
//! (`server.max_pending_handshakes`). Each is a semaphore; a stream or a connection holds
//! its permit until it ends. The defaults are far above what a busy honest deployment
//! opens and far below what exhausts the process (file descriptors, memory per HTTP/2
//! connection), so anonymous health watchers or a client in a reconnect loop cannot take
//! the server down.
//!
//! How each is enforced follows from where it can be told to the client: a stream past
//! the cap is a call, answered RESOURCE_EXHAUSTED naming the key; a connection past the
//! cap cannot be answered before it speaks HTTP/2, so the server stops accepting until one
//! closes (the kernel's listen backlog holds the next ones); a TLS handshake past the cap
//! is closed at once, since a slow handshake is the cheapest way to hold a connection.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::server::Connected;
use tonic::Status;

use crate::config::ServerConfig;

/// Accepted connections waiting for the gRPC server to take them.
const ACCEPTED_BACKLOG: usize = 64;

/// The caps of one server.
#[derive(Clone)]
pub struct Caps {
    streams: (u32, Arc<Semaphore>),
    connections: (u32, Arc<Semaphore>),
    handshakes: (u32, Arc<Semaphore>),
}

impl Caps {
    pub fn new(server: &ServerConfig) -> Self {
        let cap = |limit: u32| (limit, Arc::new(Semaphore::new(limit as usize)));
        Self {
            streams: cap(server.max_streams),
            connections: cap(server.max_connections),
            handshakes: cap(server.max_pending_handshakes),
        }
    }

    /// A place among the server's streams, held until the stream ends.
    pub fn open_stream(&self) -> Result<OwnedSemaphorePermit, Status> {
        let (limit, streams) = &self.streams;
        Arc::clone(streams).try_acquire_owned().map_err(|_| {
            Status::resource_exhausted(format!(
                "this server has {limit} streams open, its limit (server.max_streams = \
                 {limit}): try again later or another replica; an operator raises \
                 server.max_streams"
            ))
        })
    }

    /// A place among the server's connections, waiting for one when every place is taken
    /// (logged once per wait).
    async fn connection(&self) -> OwnedSemaphorePermit {
        let (limit, connections) = &self.connections;
        if let Ok(permit) = Arc::clone(connections).try_acquire_owned() {
            return permit;
        }
        tracing::warn!(
            limit,
            "server.max_connections reached: no new connection is accepted until one \
             closes; raise server.max_connections if this load is expected"
        );
        Arc::clone(connections)
            .acquire_owned()
            .await
            .expect("the semaphore is never closed")
    }

    /// A place among the TLS handshakes in progress, or none when every place is taken.
    pub fn handshake(&self) -> Option<OwnedSemaphorePermit> {
        let (limit, handshakes) = &self.handshakes;
        let permit = Arc::clone(handshakes).try_acquire_owned().ok();
        if permit.is_none() && super::refusals::may_log(None) {
            tracing::warn!(
                limit,
                "server.max_pending_handshakes reached: closed a new connection before its \
                 TLS handshake; raise server.max_pending_handshakes if this load is expected"
            );
        }
        permit
    }

    /// Accepts connections from `listener` within `server.max_connections`, each
    /// yielded with its permit, until `stop`; `setup` runs on each accepted socket and
    /// turns it into what is served (a TLS handshake, or nothing), `None` to drop it.
    pub fn incoming<T, F, Fut>(
        &self,
        listener: TcpListener,
        stop: CancellationToken,
        setup: F,
    ) -> impl Stream<Item = Result<Counted<T>, io::Error>>
    where
        T: Send + 'static,
        F: Fn(TcpStream, std::net::SocketAddr) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Option<T>> + Send + 'static,
    {
        let (tx, rx) = mpsc::channel(ACCEPTED_BACKLOG);
        let caps = self.clone();
        tokio::spawn(async move {
            loop {
                let permit = tokio::select! {
                    () = stop.cancelled() => return,
                    () = tx.closed() => return,
                    permit = caps.connection() => permit,
                };
                let accepted = tokio::select! {
                    () = stop.cancelled() => return,
                    () = tx.closed() => return,
                    accepted = listener.accept() => accepted,
                };
                let (stream, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        // Out of file descriptors and the like: wait, as tonic's own loop does.
                        tracing::warn!(%error, "accepting a connection failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                // Nagle would hold each small batch or confirmation back by tens of ms.
                let _ = stream.set_nodelay(true);
                let setup = setup(stream, peer);
                let tx = tx.clone();
                tokio::spawn(async move {
                    if let Some(io) = setup.await {
                        let _ = tx
                            .send(Ok(Counted {
                                io,
                                _permit: permit,
                            }))
                            .await;
                    }
                });
            }
        });
        ReceiverStream::new(rx)
    }
}

/// A connection holding its place in `server.max_connections` until it is dropped.
pub struct Counted<T> {
    io: T,
    _permit: OwnedSemaphorePermit,
}

impl<T: Connected> Connected for Counted<T> {
    type ConnectInfo = T::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Counted<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Counted<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}
