//! Connections whose client stops taking bytes: a write that can make no
//! progress for the send timeout fails, and the connection closes with
//! it, so a client that reads a byte a second (or not at all) holds its
//! connection and the response it waits for no longer than that bound.
//! Every accepted connection of both ports is wrapped; a write that goes
//! through costs nothing more, a timer exists only while a write waits.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Sleep;

/// A stream whose writes fail once they wait longer than `limit`.
pub(crate) struct Bounded<S> {
    inner: S,
    limit: Duration,
    /// Runs while a write waits; dropped when one goes through.
    waiting: Option<Pin<Box<Sleep>>>,
}

impl<S> Bounded<S> {
    pub(crate) fn new(inner: S, limit: Duration) -> Bounded<S> {
        Bounded { inner, limit, waiting: None }
    }

    /// The outcome of a write-side call: a result resets the timer; a
    /// wait starts it, or fails once it has run out.
    fn bound<T>(&mut self, cx: &mut Context<'_>, polled: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        match polled {
            Poll::Ready(result) => {
                self.waiting = None;
                Poll::Ready(result)
            }
            Poll::Pending => {
                let limit = self.limit;
                let timer = self.waiting.get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("the client took no bytes for {limit:?}: connection closed"),
                    ))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Bounded<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Bounded<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.bound(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.bound(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_flush(cx);
        self.bound(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.bound(cx, polled)
    }
}

impl tonic::transport::server::Connected for Bounded<TcpStream> {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

/// The address an HTTP connection comes from, for the requests on it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Remote(pub(crate) std::net::SocketAddr);

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, HttpListener>> for Remote {
    fn connect_info(stream: axum::serve::IncomingStream<'_, HttpListener>) -> Remote {
        Remote(*stream.remote_addr())
    }
}

/// The HTTP port's listener: every connection bounded, no Nagle.
pub(crate) struct HttpListener {
    pub listener: TcpListener,
    pub limit: Duration,
}

impl axum::serve::Listener for HttpListener {
    type Io = Bounded<TcpStream>;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.listener.accept().await {
                Ok((stream, address)) => {
                    let _ = stream.set_nodelay(true);
                    return (Bounded::new(stream, self.limit), address);
                }
                // Out of descriptors, or a connection reset before it was
                // taken: wait a little rather than spin.
                Err(e) => super::descriptors::accept_failed(&e, "http").await,
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.listener.local_addr()
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_write_nobody_takes_fails_after_the_limit() {
        // A pipe of 16 bytes whose far end reads nothing.
        let (near, mut far) = tokio::io::duplex(16);
        let mut bounded = Bounded::new(near, Duration::from_secs(30));
        bounded.write_all(&[1; 16]).await.expect("the first 16 bytes fit");
        let started = tokio::time::Instant::now();
        let error = bounded.write_all(&[2; 16]).await.expect_err("nobody takes them");
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_secs(30));
        // What was written before is still there to read.
        let mut got = [0; 16];
        far.read_exact(&mut got).await.unwrap();
        assert_eq!(got, [1; 16]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_reader_within_the_limit_gets_everything() {
        let (near, mut far) = tokio::io::duplex(4);
        let mut bounded = Bounded::new(near, Duration::from_secs(30));
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            let mut byte = [0; 1];
            while far.read_exact(&mut byte).await.is_ok() {
                got.push(byte[0]);
                // One byte every 10 s: each wait of the writer is under the limit.
                tokio::time::sleep(Duration::from_secs(10)).await;
            }
            got
        });
        bounded.write_all(b"0123456789").await.expect("every wait is under 30 s");
        bounded.shutdown().await.unwrap();
        drop(bounded);
        assert_eq!(reader.await.unwrap(), b"0123456789");
    }
}
