//! One connection to an admin, from the hello to the stream's end: resolve
//! and connect, open the stream with the hello, wait for the admin's hello,
//! serve the session, and drop the executions with the stream when the admin
//! does not renew the lease; why a session ended.

use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;
use tonic::Streaming;

use super::messages::{envelope, hello_message};
use super::session::{Session, HEARTBEAT_COALESCE};
use super::work::Work;
use super::{stopped, Worker};
use crate::backoff::Backoff;
use crate::proto::plugin::admin_to_worker_message::Body as AdminBody;
use crate::proto::plugin::plugin_control_service_client::PluginControlServiceClient;
use crate::proto::plugin::worker_to_admin_message::Body;
use crate::proto::plugin::{AdminToWorkerMessage, WorkerToAdminMessage};
use crate::wire;

/// Messages queued for the admin before sending waits.
const OUTBOUND_QUEUE: usize = 1024;
/// Largest message sent or received.
const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Opening the stream, and then the admin's hello, each get this long.
const HELLO_TIMEOUT: Duration = Duration::from_secs(15);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(20);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a session ended.
pub(super) enum SessionEnd {
    /// The admin's hello refused the worker.
    Refused { message: String, reconnect_delay: Duration },
    /// Connecting failed, or the stream broke or closed: why.
    Broken(String),
    /// The worker is stopping.
    Stopped,
}

impl From<String> for SessionEnd {
    fn from(reason: String) -> SessionEnd {
        SessionEnd::Broken(reason)
    }
}

impl Worker {
    /// One connection, from the hello to the stream's end. Resets `backoff`
    /// once the admin accepts the hello.
    pub(super) async fn session(
        &self,
        admin: &str,
        work: &mut Work,
        backoff: &mut Backoff,
        mut stop: watch::Receiver<bool>,
    ) -> SessionEnd {
        work.executions.capacity = self.options.max_execute;
        let (outbound, outbound_rx) = mpsc::channel(OUTBOUND_QUEUE);
        let hello = hello_message(
            &self.options.worker_id,
            self.instance,
            &self.registry.job_types(),
            self.options.max_execute,
            self.options.lease,
        );
        let hello = envelope(&self.options.worker_id, self.clock.now(), Body::Hello(hello));
        let hello_sent = Instant::now();
        if outbound.send(hello).await.is_err() {
            return SessionEnd::Broken("the outbound queue closed before the hello".into());
        }
        let opening = async {
            tokio::select! {
                opened = self.open(admin, outbound_rx) => Some(opened),
                _ = stopped(&mut stop) => None,
            }
        };
        let mut inbound = match work.meanwhile(self, opening).await {
            None => return SessionEnd::Stopped,
            Some(Ok(inbound)) => inbound,
            Some(Err(e)) => return SessionEnd::Broken(e),
        };
        let first = match work.meanwhile(self, tokio::time::timeout(HELLO_TIMEOUT, inbound.next())).await {
            Err(_) => return SessionEnd::Broken(format!("no admin hello within {HELLO_TIMEOUT:?}")),
            Ok(None) => return SessionEnd::Broken("the admin closed the stream before its hello".into()),
            Ok(Some(Err(status))) => return SessionEnd::Broken(format!("the stream failed: {status}")),
            Ok(Some(Ok(message))) => message,
        };
        let mut heartbeat = self.options.heartbeat;
        let pending = match first.body {
            Some(AdminBody::Hello(hello)) if !hello.accepted => {
                return SessionEnd::Refused {
                    message: hello.message,
                    reconnect_delay: Duration::from_secs(u64::try_from(hello.reconnect_delay_seconds).unwrap_or(0)),
                };
            }
            Some(AdminBody::Hello(hello)) => {
                if let Ok(seconds @ 1..) = u64::try_from(hello.heartbeat_interval_seconds) {
                    heartbeat = Duration::from_secs(seconds);
                }
                None
            }
            _ => {
                tracing::warn!("the admin's first message is not a hello; serving it anyway");
                Some(first)
            }
        };
        backoff.reset();
        tracing::info!(
            worker.id = %self.options.worker_id,
            admin,
            heartbeat_ms = heartbeat.as_millis() as u64,
            running = work.executions.len(),
            unacknowledged = work.unacknowledged.len(),
            "connected to the admin"
        );
        let mut session = Session {
            worker: self,
            outbound,
            work,
            draining: false,
            last_heartbeat: Instant::now() - HEARTBEAT_COALESCE,
            heartbeat_pending: false,
            admin_renews: None,
            connected_at: Instant::now(),
            heartbeat,
            unannounced: Vec::new(),
            sent_beats: std::collections::VecDeque::from([(0, hello_sent)]),
            next_beat: 1,
        };
        let end = session.serve(inbound, pending, stop).await;
        let work = session.work;
        if !work.keeps_work {
            let running = work.executions.take_all();
            if !running.is_empty() {
                tracing::warn!(n_dropped = running.len(), "dropped the running executions with the stream");
            }
            for execution in running {
                execution.abort.abort();
            }
        }
        end
    }

    /// Connects and opens the stream; `outbound` already holds the hello.
    async fn open(
        &self,
        admin: &str,
        outbound: mpsc::Receiver<WorkerToAdminMessage>,
    ) -> Result<Streaming<AdminToWorkerMessage>, String> {
        let address = wire::resolve_grpc_address(admin).await.map_err(|e| e.to_string())?;
        let uri = grpc_uri(&address).map_err(|e| e.to_string())?;
        let channel = self
            .options
            .tls
            .endpoint(&address)
            .map_err(|e| e.to_string())?
            .connect_timeout(CONNECT_TIMEOUT)
            .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
            .keep_alive_timeout(KEEPALIVE_TIMEOUT)
            .connect()
            .await
            .map_err(|e| format!("connecting to {uri}: {e}"))?;
        let mut client = PluginControlServiceClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        let mut request = tonic::Request::new(ReceiverStream::new(outbound));
        if let Some(authorization) = &self.authorization {
            request.metadata_mut().insert("authorization", authorization.clone());
        }
        let response = tokio::time::timeout(HELLO_TIMEOUT, client.worker_stream(request))
            .await
            .map_err(|_| format!("opening the worker stream at {uri} timed out"))?
            .map_err(|status| format!("opening the worker stream at {uri}: {status}"))?;
        Ok(response.into_inner())
    }
}

/// `http://HOST:PORT`, with brackets around an IPv6 host.
pub(super) fn grpc_uri(address: &str) -> Result<String, wire::AddressError> {
    let (host, port) = wire::split_host_port(address)?;
    Ok(if host.contains(':') { format!("http://[{host}]:{port}") } else { format!("http://{host}:{port}") })
}
