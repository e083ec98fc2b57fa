//! An admin as the fuzz targets reach it (feature `fuzzing`, hidden from
//! the documentation): its parts and engine over a given store, with
//! no listener and no background loop; worker sessions fed from any stream
//! of decoded messages, exactly as the worker stream feeds them; and the
//! peer service.

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_stream::Stream;
use tonic::Status;

use super::cluster::peer::PeerServiceImpl;
use super::policies::Policies;
use super::workers::stream::WorkerStreamService;
use super::{assemble, Registry, ServerOptions};
use crate::clock::{Clock, SystemClock};
use crate::engine::EngineHandle;
use crate::model::HandlerId;
use crate::proto::plugin::{AdminToWorkerMessage, WorkerToAdminMessage};
use crate::store::Store;

/// One admin, alone (no cluster).
pub struct Admin {
    engine: EngineHandle,
    workers: WorkerStreamService,
    peer: PeerServiceImpl,
    registry: Registry,
    policies: Policies,
}

impl Admin {
    /// Starts the engine over `store` and assembles the server's parts
    /// (its loops are not started).
    pub async fn start(store: Arc<dyn Store>, options: ServerOptions) -> Result<Admin, super::Error> {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let (parts, _loops) = assemble(store, &options, clock, super::Topology::Alone, 0).await?;
        let policies = parts.workers.sessions.policies.clone();
        Ok(Admin { engine: parts.engine, workers: parts.workers, peer: parts.peer, registry: parts.registry, policies })
    }

    pub fn engine(&self) -> &EngineHandle {
        &self.engine
    }

    /// Opens a worker session whose messages arrive on `inbound`, as a
    /// worker stream does: the messages for the worker, ending when the
    /// session has ended, or the status that refused the stream.
    pub async fn open_worker_stream<S>(
        &self,
        inbound: S,
    ) -> Result<mpsc::Receiver<Result<AdminToWorkerMessage, Status>>, Status>
    where
        S: Stream<Item = Result<WorkerToAdminMessage, Status>> + Unpin + Send + 'static,
    {
        self.workers.open(inbound, None).await
    }

    /// The peer service other instances call.
    pub fn peer_service(&self) -> impl crate::proto::peer::peer_service_server::PeerService {
        self.peer.clone()
    }

    /// The workers whose sessions are registered now.
    pub fn connected_workers(&self) -> Vec<HandlerId> {
        self.registry.handlers()
    }

    /// Whether a job type's descriptor is in the policy book.
    pub fn has_descriptor(&self, job_type: &str) -> bool {
        self.policies.has_descriptor(job_type)
    }
}
