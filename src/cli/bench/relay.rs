//! A relay between the bench's instances and their database that counts
//! round trips on the wire: one for each time a connection's client speaks
//! after its server has answered (or first). Statements sent together
//! before the answer, a pipelined transaction, are one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::task::JoinSet;

use crate::store::ServerAddress;

trait Duplex: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Duplex for T {}

pub(super) struct Relay {
    pub(super) port: u16,
    round_trips: Arc<AtomicU64>,
    /// The accepting task, stopped when the relay is dropped; its
    /// connections end with it.
    _accepting: tokio_util::task::AbortOnDropHandle<()>,
}

impl Relay {
    /// Listens on 127.0.0.1 and relays each connection to the first of
    /// `server` that accepts it.
    pub(super) async fn start(server: Vec<ServerAddress>) -> std::io::Result<Relay> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let round_trips = Arc::new(AtomicU64::new(0));
        let counted = round_trips.clone();
        let accepting = tokio::spawn(async move {
            let mut connections = JoinSet::new();
            loop {
                let client = match listener.accept().await {
                    Ok((client, _)) => client,
                    // The instances' next connections fail, and the bench with them.
                    Err(e) => return tracing::warn!(error = %e, "the database relay stopped accepting"),
                };
                let server = server.clone();
                let counted = counted.clone();
                connections.spawn(async move {
                    if let Err(e) = relay(client, &server, &counted).await {
                        tracing::debug!(error = %e, "relayed database connection ended");
                    }
                });
                while connections.try_join_next().is_some() {}
            }
        });
        Ok(Relay { port, round_trips, _accepting: tokio_util::task::AbortOnDropHandle::new(accepting) })
    }

    /// Round trips counted so far, over every connection.
    pub(super) fn round_trips(&self) -> u64 {
        self.round_trips.load(Ordering::Relaxed)
    }
}

async fn connect(server: &[ServerAddress]) -> std::io::Result<Box<dyn Duplex>> {
    let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, "the database URL names no server");
    for address in server {
        let connected: std::io::Result<Box<dyn Duplex>> = match address {
            ServerAddress::Tcp(host, port) => match tokio::net::TcpStream::connect((host.as_str(), *port)).await {
                Ok(stream) => stream.set_nodelay(true).map(|()| Box::new(stream) as Box<dyn Duplex>),
                Err(e) => Err(e),
            },
            ServerAddress::Unix(path) => {
                tokio::net::UnixStream::connect(path).await.map(|s| Box::new(s) as Box<dyn Duplex>)
            }
        };
        match connected {
            Ok(stream) => return Ok(stream),
            Err(e) => last = e,
        }
    }
    Err(last)
}

async fn relay(
    client: tokio::net::TcpStream,
    server: &[ServerAddress],
    round_trips: &AtomicU64,
) -> std::io::Result<()> {
    client.set_nodelay(true)?;
    let server = connect(server).await?;
    let (mut from_client, mut to_client) = tokio::io::split(client);
    let (mut from_server, mut to_server) = tokio::io::split(server);
    let mut up = vec![0u8; 64 * 1024];
    let mut down = vec![0u8; 64 * 1024];
    let mut answered = true;
    loop {
        tokio::select! {
            read = from_client.read(&mut up) => {
                let n = read?;
                if n == 0 {
                    return Ok(());
                }
                if answered {
                    round_trips.fetch_add(1, Ordering::Relaxed);
                    answered = false;
                }
                to_server.write_all(&up[..n]).await?;
            }
            read = from_server.read(&mut down) => {
                let n = read?;
                if n == 0 {
                    return Ok(());
                }
                answered = true;
                to_client.write_all(&down[..n]).await?;
            }
        }
    }
}
