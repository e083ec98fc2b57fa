//! What the server does with SeaweedFS: acting on its masters (locks, the
//! master's vacuum, lanes), the cluster context workers are given, and the
//! capacity view that keeps proposals off nearly full disks.

pub(crate) mod capacity;
pub(crate) mod context;
pub mod master;
