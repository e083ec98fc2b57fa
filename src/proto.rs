//! Generated protocol code: the worker stream (`plugin`), the client API
//! (`api`), the calls between admin instances (`peer`), and the calls
//! jobcenter makes to a SeaweedFS master (`master`), and the part of a
//! SeaweedFS task's parameters it reads (`worker`); and the codec every
//! service here is generated with (`codec`).

#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod plugin {
    tonic::include_proto!("plugin");
}

#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod api {
    tonic::include_proto!("jobcenter.v1");
}

#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod master {
    tonic::include_proto!("master_pb");
}

#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod peer {
    tonic::include_proto!("jobcenter.peer.v1");
}

#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod worker {
    tonic::include_proto!("worker_pb");
}

pub mod codec;
