//! What the server does with SeaweedFS: acting on its masters (locks, the
//! master's vacuum, lanes), the cluster context workers are given, and the
//! capacity view that keeps proposals off nearly full disks.

pub(crate) mod capacity;
pub(crate) mod context;
pub mod master;
pub(crate) mod rate;

use std::sync::Arc;
use std::time::Duration;

use crate::proto::plugin::ClusterContext;
use crate::server::policies::Policies;
use crate::server::workers::registry::Registry;

/// What the server keeps of the SeaweedFS cluster it is given: the masters
/// (none: nothing here acts), the cluster's `shell` lock held between
/// jobcenter's users, the filers and S3 servers the masters listed last,
/// and the maintenance under way. Cheap to clone: the clones share it.
#[derive(Clone)]
pub(crate) struct SeaweedFs {
    masters: Arc<master::Masters>,
    lock: Arc<master::ClusterLock>,
    /// The filers and S3 servers the masters listed last.
    nodes: Arc<context::Known>,
    /// The maintenance changes under way, for the capacity view.
    capacity: Arc<capacity::Tracker>,
}

impl SeaweedFs {
    /// Nothing known yet of the cluster of `masters`; jobcenter holds its
    /// `shell` lock for `turn` at a stretch.
    pub(crate) fn new(masters: master::Masters, turn: Duration) -> SeaweedFs {
        let turns = master::Turns { turn, ..master::Turns::default() };
        SeaweedFs {
            masters: Arc::new(masters),
            lock: Arc::new(master::ClusterLock::new(turns)),
            nodes: Arc::default(),
            capacity: Arc::default(),
        }
    }

    /// Whether masters were given.
    pub(crate) fn has_masters(&self) -> bool {
        !self.masters.is_empty()
    }

    /// Holds the cluster's `shell` lock (`ClusterLock::hold`).
    pub(crate) async fn hold(&self, message: &str, patience: Duration) -> Result<master::Hold<'_>, master::Error> {
        self.lock.hold(&self.masters, message, patience).await
    }

    /// The master's topology (`Tracker::topology`).
    pub(crate) async fn topology(&self, fresh: bool) -> (Option<Arc<capacity::Topology>>, Option<String>) {
        self.capacity.topology(&self.masters, fresh).await
    }

    /// The maintenance changes under way, and those the master does not show yet.
    pub(crate) fn changes(&self) -> Vec<capacity::Change> {
        self.capacity.changes()
    }

    /// The cluster context of a detection or an execution of `job_type`
    /// (`context::cluster_context`).
    pub(crate) fn context(
        &self,
        policies: &Policies,
        registry: &Registry,
        job_type: &str,
        execution: bool,
    ) -> ClusterContext {
        context::cluster_context(&self.masters, &self.nodes, policies, registry, job_type, execution)
    }
}
