//! jobcenter: maintenance work as DAG jobs with leader/follower execution.

#![warn(unreachable_pub)]

pub mod active;
pub(crate) mod backoff;
pub(crate) mod budget;
pub mod cli;
pub mod clock;
pub(crate) mod crash;
pub(crate) mod dag;
pub mod dispatch;
pub mod engine;
pub mod fate;
pub mod follower;
pub mod jobfile;
pub mod leader;
pub mod model;
pub(crate) mod policy;
pub mod proto;
pub mod rate;
pub(crate) mod retention;
pub(crate) mod scheduler;
pub mod server;
pub mod store;
pub(crate) mod tls;
pub mod traces;
pub(crate) mod windows;
pub mod wire;
pub mod worker;
