//! The workers' sessions: one stream per connected worker, the registry of
//! the workers connected, and when a session may renew a worker's lease.

mod cover;
pub(crate) mod registry;
pub(crate) mod stream;
