//! The server's surface, what clients reach over its ports: the client API
//! (gRPC and JSON over HTTP, one implementation), the web console, who may do what,
//! backups, the Prometheus metrics, the OpenAPI description, the bound
//! on connections whose client stops reading, and the file descriptors
//! every connection takes.

pub(crate) mod access;
pub(crate) mod api;
pub(crate) mod audit;
mod backup;
pub(crate) mod console;
pub(crate) mod convert;
pub(crate) mod descriptors;
pub(crate) mod http;
pub(crate) mod metrics;
pub(crate) mod stall;
mod views;
