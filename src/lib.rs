//! jobcenter: maintenance work as DAG jobs with leader/follower execution.

pub mod active;
pub mod backoff;
pub mod cli;
pub mod clock;
pub mod crash;
pub mod dag;
pub mod dispatch;
pub mod engine;
pub mod fate;
pub mod follower;
pub mod jobfile;
pub mod leader;
pub mod model;
pub mod policy;
pub mod proto;
pub mod retention;
pub mod scheduler;
pub mod server;
pub mod store;
pub mod tls;
pub mod wire;
pub mod worker;
