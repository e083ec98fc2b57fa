//! The remote worker runtime behind `jobcenter worker`: connects to an admin
//! server over the worker stream (`plugin.proto`, as a SeaweedFS worker does),
//! announces the job types it serves and executes the admin's
//! `ExecuteJobRequest`s with the registered handlers.
//!
//! One connection is one session:
//! 1. resolve the stream's address from the admin's HTTP address (or take it
//!    as given with `grpc://`), connect, open `WorkerStream` and send
//!    `WorkerHello`, which declares the worker's lease;
//! 2. wait for `AdminHello`; a refusal ends the session. A jobcenter admin
//!    then renews the lease at once and after every heartbeat;
//! 3. report every outcome still waiting for an acknowledgement, then a
//!    heartbeat listing every execution still running, then serve requests,
//!    with a heartbeat every interval and after every start and end;
//! 4. when the stream breaks, connect again (the next admin address first,
//!    if several are given), backing off from 1 s to 30 s.
//!
//! Executions outlive sessions when the admin renews the lease: they go on
//! while the worker is away, their outcomes wait until an admin has
//! acknowledged them, and every execution is given up (its processes
//! killed) once the worker has reached no admin for its lease, which the
//! admin waits out before it runs the attempt elsewhere: so no attempt runs
//! twice at once. With an admin that does not renew (a SeaweedFS admin), a
//! broken stream drops every execution, as such an admin expects.
//!
//! One loop owns the table of executions and is the only writer of the
//! stream's completions, so a cancel and a completion never both report one
//! execution.
//!
//! The files: `connection.rs` opens one connection and ends it, from the
//! hello to the stream's end; `session.rs` is the session on that stream
//! (its loop, heartbeats and reports) and `requests.rs` what it does with the
//! admin's requests; `work.rs` is what outlives a session (the lease, the
//! outcomes kept until acknowledged); `executions.rs` the table of running
//! executions; `messages.rs` the messages the worker sends. `tests.rs` tests
//! the parts, `stream_tests.rs` the whole against the fake admin of
//! `fake_admin.rs`.

mod connection;
mod executions;
mod messages;
mod requests;
mod session;
mod work;

#[cfg(test)]
mod fake_admin;
#[cfg(test)]
mod stream_tests;
#[cfg(test)]
mod tests;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tonic::metadata::{Ascii, MetadataValue};

use self::connection::SessionEnd;
use self::work::Work;
use super::{ExecLog, Registry};
use crate::backoff::Backoff;
use crate::clock::{Clock, SystemClock};
use crate::model::HandlerId;
use crate::wire;

/// The protocol version a worker announces in its hello.
pub const PROTOCOL_VERSION: &str = "1";
pub use crate::wire::{JOB_NAME_LABEL, TASK_ID_LABEL};
/// The default lease: how long the worker keeps running its work without
/// reaching an admin. An admin keeps a disconnected worker's attempts for
/// the lease and a margin (25 s), within its orphan grace (30 s).
pub const DEFAULT_LEASE: Duration = Duration::from_secs(20);

/// How a `jobcenter worker` process meets its admins.
#[derive(Clone)]
pub struct RemoteWorkerOptions {
    /// Admin addresses, tried in turn: an HTTP `host:port` (the stream's
    /// port is looked up there at every connect) or `grpc://host:port`.
    pub admins: Vec<String>,
    /// The worker's stable id, the same across restarts (see `default_worker_id`).
    pub worker_id: String,
    /// Executions at once; further requests are refused with `wire::AT_CAPACITY`.
    pub max_execute: u32,
    /// Detection slots reported in heartbeats; this runtime runs no detection.
    pub max_detect: u32,
    /// Heartbeat interval unless the admin's hello names one.
    pub heartbeat: Duration,
    /// How long executions go on without reaching any admin.
    pub lease: Duration,
    /// Sent as `authorization: Bearer TOKEN` when opening the stream.
    pub token: Option<String>,
    /// Records the start and end of every execution.
    pub exec_log: Option<ExecLog>,
    /// TLS towards the admin's gRPC port.
    pub tls: crate::tls::ClientTls,
}

/// `jobcenter-worker-HOSTNAME`, or a random short id when the host has no usable name.
pub fn default_worker_id() -> String {
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|name| name.into_string().ok())
        .map(|name| name.trim().to_string())
        .filter(|name| !name.is_empty() && !name.contains(char::is_whitespace));
    let suffix = host.unwrap_or_else(|| uuid::Uuid::new_v4().simple().to_string()[..8].to_string());
    format!("jobcenter-worker-{suffix}")
}

/// Serves `registry`'s job types to the admin until `shutdown` completes;
/// reconnects whenever the stream breaks. Fails only on invalid options.
pub async fn run(
    options: RemoteWorkerOptions,
    registry: Registry,
    shutdown: impl Future<Output = ()>,
) -> Result<(), InvalidOptions> {
    let authorization = match options.token.as_deref() {
        Some(token) => Some(bearer(token)?),
        None => None,
    };
    if registry.job_types().is_empty() {
        return Err(InvalidOptions::NoJobTypes);
    }
    if options.admins.is_empty() {
        return Err(InvalidOptions::NoAdmin);
    }
    for admin in &options.admins {
        wire::split_host_port(admin.strip_prefix(wire::GRPC_SCHEME).unwrap_or(admin))
            .map_err(|e| InvalidOptions::Admin { admin: admin.clone(), reason: e.to_string() })?;
    }
    if options.lease < Duration::from_millis(400) {
        return Err(InvalidOptions::LeaseTooShort);
    }
    let worker = Worker { options, registry, instance: HandlerId::new(), authorization, clock: Arc::new(SystemClock) };
    let job_types: Vec<String> = worker.registry.job_types().iter().map(|t| t.to_string()).collect();
    tracing::info!(
        worker.id = %worker.options.worker_id,
        worker.instance = %worker.instance,
        admins = %worker.options.admins.join(","),
        lease_ms = worker.options.lease.as_millis() as u64,
        job_types = %job_types.join(","),
        "worker starting"
    );
    let (stop_tx, stop) = watch::channel(false);
    let worker = &worker;
    let serve = async move {
        let mut work = Work::new(worker.options.lease);
        let mut backoff = reconnect_pauses(worker.options.lease);
        let mut admin = 0usize;
        loop {
            let end = worker.session(&worker.options.admins[admin], &mut work, &mut backoff, stop.clone()).await;
            let mut delay = backoff.next_pause();
            match end {
                SessionEnd::Stopped => break,
                SessionEnd::Refused { message, reconnect_delay } => {
                    delay = delay.max(reconnect_delay);
                    tracing::warn!(%message, retry_in_ms = delay.as_millis() as u64, "admin refused the worker");
                }
                SessionEnd::Broken(error) => {
                    tracing::warn!(%error, retry_in_ms = delay.as_millis() as u64, "worker stream ended");
                }
            }
            // The next address, if several are given: a failover.
            admin = (admin + 1) % worker.options.admins.len();
            if work.meanwhile(worker, stop_signal(stop.clone(), delay)).await {
                break;
            }
        }
        work
    };
    tokio::pin!(serve);
    tokio::pin!(shutdown);
    let work = tokio::select! {
        work = &mut serve => Some(work),
        () = &mut shutdown => {
            let _ = stop_tx.send(true);
            // The session gives its executions back; bounded, in case the admin does not read.
            tokio::time::timeout(Duration::from_secs(5), &mut serve).await.ok()
        }
    };
    if let Some(mut work) = work {
        let n_dropped = work.executions.len();
        if n_dropped > 0 {
            tracing::warn!(n_dropped, "stopping with executions running: they are stopped");
        }
        work.tasks.shutdown().await;
    }
    tracing::info!(worker.id = %worker.options.worker_id, "worker stopped");
    Ok(())
}

/// Completes when the worker is told to stop (never, if the sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    if stop.wait_for(|stop| *stop).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Completes with `true` when the worker is told to stop, or with `false` after `delay`.
async fn stop_signal(mut stop: watch::Receiver<bool>, delay: Duration) -> bool {
    tokio::select! {
        changed = stop.wait_for(|stop| *stop) => changed.is_ok(),
        () = tokio::time::sleep(delay) => false,
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Options a worker cannot start with.
#[derive(Debug, thiserror::Error)]
pub enum InvalidOptions {
    #[error("the worker has no job types to serve")]
    NoJobTypes,
    #[error("no admin address given")]
    NoAdmin,
    #[error("invalid admin address {admin:?}: {reason}")]
    Admin { admin: String, reason: String },
    #[error("the lease must be at least 400 ms")]
    LeaseTooShort,
    #[error("the token holds characters a gRPC header cannot carry")]
    Token,
}

/// The `authorization` header a worker sends to its admins.
pub(super) fn bearer(token: &str) -> Result<MetadataValue<Ascii>, InvalidOptions> {
    MetadataValue::try_from(format!("Bearer {}", token.trim())).map_err(|_| InvalidOptions::Token)
}

struct Worker {
    options: RemoteWorkerOptions,
    registry: Registry,
    /// This process's handler id: the admin charges the attempts it hands out here to it.
    instance: HandlerId,
    authorization: Option<MetadataValue<Ascii>>,
    clock: Arc<dyn Clock>,
}

/// The pauses between tries to reach an admin, back to the first after a
/// hello: a tenth of the lease (100 ms to 1 s), doubling up to a quarter of
/// it (at most 30 s), each drawn between half and the whole, so that several
/// tries fit in one lease (a short outage costs no work) and the workers of
/// an admin that restarts do not all come back at once.
fn reconnect_pauses(lease: Duration) -> Backoff {
    let first = (lease / 10).clamp(Duration::from_millis(100), Duration::from_secs(1));
    Backoff::spread(first, (lease / 4).clamp(first, Duration::from_secs(30)))
}
