//! The gRPC API's bound on connections: each holds a permit from one semaphore for as long as
//! it is open, and one accepted beyond the bound is closed at once (the clients back off and
//! retry, as they do for any refused connection), with at most one log line a second.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::transport::server::{Connected, TcpConnectInfo, TcpIncoming};

/// Connections the gRPC API serves at once, over all clients.
pub const GRPC_CONNECTIONS_MAX: usize = 4096;

/// An accepted connection and its share of the bound.
pub struct Counted {
    stream: tokio::net::TcpStream,
    _permit: OwnedSemaphorePermit,
}

impl Connected for Counted {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.stream.connect_info()
    }
}

impl AsyncRead for Counted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buffer: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(context, buffer)
    }
}

impl AsyncWrite for Counted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
        bytes: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(context, bytes)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buffers: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(context, buffers)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(context)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(context)
    }
}

/// The accepted connections of `incoming`, at most `connections_max` open at once.
pub fn bounded(
    incoming: TcpIncoming,
    connections_max: usize,
) -> impl futures_lite::Stream<Item = io::Result<Counted>> + Send + 'static {
    use futures_lite::StreamExt;
    let permits = Arc::new(Semaphore::new(connections_max));
    let last_logged_second = Arc::new(AtomicU64::new(0));
    incoming.filter_map(move |accepted| match accepted {
        Err(error) => Some(Err(error)),
        Ok(stream) => match permits.clone().try_acquire_owned() {
            Ok(permit) => Some(Ok(Counted { stream, _permit: permit })),
            Err(_) => {
                let second = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |elapsed| elapsed.as_secs());
                if last_logged_second.swap(second, Ordering::Relaxed) != second {
                    eprintln!(
                        "ringpostd: the gRPC API refused a connection from {}: {connections_max} are open (GRPC_CONNECTIONS_MAX)",
                        stream.peer_addr().map(|peer| peer.to_string()).unwrap_or_else(|_| "?".into())
                    );
                }
                None
            }
        },
    })
}
