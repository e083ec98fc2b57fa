//! Generated protocol code: the worker stream (`plugin`) and the client API (`api`).
#![allow(clippy::all, clippy::pedantic, missing_docs)]

pub mod plugin {
    tonic::include_proto!("plugin");
}

pub mod api {
    tonic::include_proto!("jobcenter.v1");
}
