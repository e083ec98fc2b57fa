//! What jobcenter does towards the SeaweedFS masters it is given: it holds
//! the `admin-server` presence lock while it runs, switches the master's own
//! periodic vacuum off while a vacuum-capable worker is connected (and back
//! on when none is), and takes the cluster's `shell` admin lock around each
//! detection and while attempts of cluster job types run, so that an
//! operator's `weed shell` and jobcenter never act on the cluster at once.

use std::sync::Arc;
use std::time::Duration;

use tonic::transport::Channel;

use super::SeaweedFs;
use crate::clock::Clock;
use crate::engine::EngineHandle;
use crate::proto::master::{
    seaweed_client::SeaweedClient, DisableVacuumRequest, EnableVacuumRequest, LeaseAdminTokenRequest,
    ListClusterNodesRequest, ReleaseAdminTokenRequest, VolumeListRequest,
};
use crate::server::duties::{Duties, Stage};
use crate::server::workers::registry::Registry;
use crate::wire;

/// The lock an admin holds to say it is there (the master then leaves a
/// plugin's vacuum switch alone).
pub const PRESENCE_LOCK: &str = "admin-server";
/// The cluster's admin lock, the one `weed shell` takes.
pub const SHELL_LOCK: &str = "shell";
pub const CLIENT_NAME: &str = "jobcenter";
/// A lease lasts 10 s on the master; renew well within it.
const RENEW_EVERY: Duration = Duration::from_secs(4);
const CALL_TIMEOUT: Duration = Duration::from_secs(3);

/// A held lease on a master lock.
#[derive(Clone, Debug)]
pub struct Lease {
    pub name: String,
    token: i64,
    lock_ts_ns: i64,
}

/// The masters jobcenter acts on, and the TLS it reaches them with (none by
/// default; with a SeaweedFS `security.toml`, its `grpc.ca` and a
/// certificate the masters accept).
#[derive(Clone, Debug, Default)]
pub struct Masters {
    /// As given: `host:port` (gRPC on port + 10000) or `host:port.grpcport`.
    pub addresses: Vec<String>,
    pub tls: crate::tls::ClientTls,
}

impl Masters {
    pub fn is_empty(&self) -> bool {
        self.addresses.is_empty()
    }
}

/// Why a call to the masters gave nothing.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("no master address given")]
    NoMaster,
    #[error("master {0}: {1}")]
    Address(String, String),
    #[error("master {master} ({address}): {reason}")]
    Unreachable { master: String, address: String, reason: String },
    #[error("no answer within {CALL_TIMEOUT:?}")]
    TimedOut(#[from] tokio::time::error::Elapsed),
    #[error("{}", .0.message())]
    Refused(#[from] tonic::Status),
    #[error("the master's {name:?} lock was not free within {patience:?}: {reason}")]
    LockBusy { name: &'static str, patience: Duration, reason: String },
}

/// The gRPC address of a master given as `host:port` (gRPC on port + 10000)
/// or `host:port.grpcport`.
pub fn grpc_address(master: &str) -> Result<String, Error> {
    if let Some((http, grpc)) = master.rsplit_once('.') {
        if let (Ok((host, _)), Ok(port)) = (wire::split_host_port(http), grpc.parse::<u16>()) {
            return Ok(format!("{host}:{port}"));
        }
    }
    let invalid = |reason: String| Error::Address(master.to_string(), reason);
    let (host, port) = wire::split_host_port(master).map_err(|e| invalid(e.to_string()))?;
    let port = port.checked_add(wire::GRPC_PORT_OFFSET).ok_or_else(|| invalid("port too high".into()))?;
    Ok(format!("{host}:{port}"))
}

async fn client(masters: &Masters) -> Result<SeaweedClient<Channel>, Error> {
    let mut last = Error::NoMaster;
    for master in &masters.addresses {
        let address = grpc_address(master)?;
        let endpoint = masters.tls.endpoint(&address).map_err(|e| Error::Address(master.clone(), e.to_string()))?;
        let unreachable =
            |reason: String| Error::Unreachable { master: master.clone(), address: address.clone(), reason };
        match tokio::time::timeout(CALL_TIMEOUT, endpoint.connect()).await {
            Ok(Ok(channel)) => return Ok(SeaweedClient::new(channel)),
            Ok(Err(e)) => last = unreachable(e.to_string()),
            Err(_) => last = unreachable(format!("no answer within {CALL_TIMEOUT:?}")),
        }
    }
    Err(last)
}

/// Takes a lock, trying every second until `patience` runs out.
pub async fn acquire(masters: &Masters, name: &'static str, message: &str, patience: Duration) -> Result<Lease, Error> {
    let deadline = tokio::time::Instant::now() + patience;
    loop {
        let attempt = async {
            let mut master = client(masters).await?;
            let request = LeaseAdminTokenRequest {
                previous_token: 0,
                previous_lock_time: 0,
                lock_name: name.into(),
                client_name: CLIENT_NAME.into(),
                message: message.into(),
            };
            let response = tokio::time::timeout(CALL_TIMEOUT, master.lease_admin_token(request)).await??.into_inner();
            Ok::<_, Error>(Lease { name: name.into(), token: response.token, lock_ts_ns: response.lock_ts_ns })
        };
        match attempt.await {
            Ok(lease) => return Ok(lease),
            Err(e) if tokio::time::Instant::now() >= deadline => {
                return Err(Error::LockBusy { name, patience, reason: e.to_string() });
            }
            Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
        }
    }
}

/// Renews a held lease (the master hands out a new token each time).
pub async fn renew(masters: &Masters, lease: &mut Lease, message: &str) -> Result<(), Error> {
    let mut master = client(masters).await?;
    let request = LeaseAdminTokenRequest {
        previous_token: lease.token,
        previous_lock_time: lease.lock_ts_ns,
        lock_name: lease.name.clone(),
        client_name: CLIENT_NAME.into(),
        message: message.into(),
    };
    let response = tokio::time::timeout(CALL_TIMEOUT, master.lease_admin_token(request)).await??.into_inner();
    lease.token = response.token;
    lease.lock_ts_ns = response.lock_ts_ns;
    Ok(())
}

pub async fn release(masters: &Masters, lease: &Lease) -> Result<(), Error> {
    let mut master = client(masters).await?;
    let request = ReleaseAdminTokenRequest {
        previous_token: lease.token,
        previous_lock_time: lease.lock_ts_ns,
        lock_name: lease.name.clone(),
    };
    tokio::time::timeout(CALL_TIMEOUT, master.release_admin_token(request)).await??;
    Ok(())
}

/// The filers and S3 servers the masters list (`ListClusterNodes`), each
/// address as the master gives it.
pub async fn cluster_nodes(masters: &Masters) -> Result<super::context::Nodes, Error> {
    let mut master = client(masters).await?;
    let mut lists = Vec::new();
    for client_type in ["filer", "s3"] {
        let request = ListClusterNodesRequest { client_type: client_type.into(), ..Default::default() };
        let answer = tokio::time::timeout(CALL_TIMEOUT, master.list_cluster_nodes(request)).await??;
        let mut addresses: Vec<String> =
            answer.into_inner().cluster_nodes.into_iter().map(|n| n.address).filter(|a| !a.is_empty()).collect();
        addresses.sort();
        lists.push(addresses);
    }
    let s3 = lists.pop().unwrap_or_default();
    let filers = lists.pop().unwrap_or_default();
    Ok(super::context::Nodes { filers, s3 })
}

/// The master's topology: data centers, racks, volume servers, their disks
/// with volumes and EC shards.
pub async fn volume_list(masters: &Masters) -> Result<crate::proto::master::VolumeListResponse, Error> {
    let mut master = client(masters).await?;
    let answer = tokio::time::timeout(CALL_TIMEOUT, master.volume_list(VolumeListRequest {})).await??;
    Ok(answer.into_inner())
}

async fn set_vacuum(masters: &Masters, enabled: bool) -> Result<(), Error> {
    let mut master = client(masters).await?;
    if enabled {
        tokio::time::timeout(CALL_TIMEOUT, master.enable_vacuum(EnableVacuumRequest { by_plugin: true })).await??;
    } else {
        tokio::time::timeout(CALL_TIMEOUT, master.disable_vacuum(DisableVacuumRequest { by_plugin: true })).await??;
    }
    Ok(())
}

/// Job types that act on the cluster (SeaweedFS's default lane): their
/// attempts run only while jobcenter holds the cluster's admin lock.
pub const CLUSTER_JOB_TYPES: [&str; 5] = ["vacuum", "erasure_coding", "volume_balance", "ec_balance", "admin_script"];

/// The lane SeaweedFS runs a job type in. Only the `default` lane (the
/// cluster job types, and any job type not named here) acts on volumes and
/// detects under the cluster lock; the others never wait for it.
pub fn lane(job_type: &str) -> &'static str {
    match job_type {
        "iceberg_maintenance" => "iceberg",
        "s3_lifecycle" => "lifecycle",
        "lance_compact" | "lance_optimize_indices" | "lance_cleanup_versions" => "lance",
        _ => "default",
    }
}

/// Job types whose SeaweedFS worker undoes an attempt that ended without
/// success on its own, after the attempt ended, and how long that may take:
/// a canceled or failed erasure-coding encode is rolled back on a 60 s clock
/// of the worker's, which wipes the volume's EC state whatever the shard
/// generation, so no other task on that volume may start before it is done
/// (the margin covers a late start of the rollback and the clocks' drift).
pub fn rollback_windows() -> std::collections::HashMap<String, std::time::Duration> {
    std::collections::HashMap::from([("erasure_coding".to_string(), std::time::Duration::from_secs(75))])
}

/// How jobcenter shares the cluster's `shell` lock with an operator's
/// `weed shell`, which asks the master for it once a second.
#[derive(Clone, Copy, Debug)]
pub struct Turns {
    /// Held continuously this long, the lock is let go as soon as what holds
    /// it ends: new detections and new maintenance attempts wait for that.
    pub turn: Duration,
    /// Once let go, jobcenter does not ask for it again for this long, so a
    /// waiting operator gets it first.
    pub yield_window: Duration,
    /// Let go this long after the last user, even within a turn.
    pub idle: Duration,
}

impl Default for Turns {
    fn default() -> Turns {
        Turns { turn: Duration::from_secs(60), yield_window: Duration::from_secs(2), idle: Duration::from_secs(2) }
    }
}

impl Turns {
    /// Whether a lease taken at `held_since` has had its turn by `now`.
    pub fn turn_over(&self, held_since: tokio::time::Instant, now: tokio::time::Instant) -> bool {
        now.saturating_duration_since(held_since) >= self.turn
    }

    /// How long to wait before asking for the lock again after letting it go
    /// at `released_at` (zero: ask now).
    pub fn wait_to_ask(&self, released_at: Option<tokio::time::Instant>, now: tokio::time::Instant) -> Duration {
        released_at.map_or(Duration::ZERO, |at| self.yield_window.saturating_sub(now.saturating_duration_since(at)))
    }
}

/// A lease held, with when it was taken and last renewed.
struct Holding {
    lease: Lease,
    since: tokio::time::Instant,
    renewed_at: tokio::time::Instant,
}

/// The lease held, if any, and when the last one was let go.
#[derive(Default)]
struct LockState {
    holding: Option<Holding>,
    released_at: Option<tokio::time::Instant>,
}

/// One lease on the cluster's `shell` lock, shared by every detection and by
/// the running maintenance: taken by the first user, renewed while any holds
/// it, let go when its turn is over and its users ended, or 2 s after the
/// last user otherwise; then not asked for again for the yield window. So an
/// operator's `weed shell` gets in between jobs even while maintenance is busy.
#[derive(Default)]
pub struct ClusterLock {
    turns: Turns,
    state: tokio::sync::Mutex<LockState>,
    users: std::sync::atomic::AtomicUsize,
}

/// A user's hold on the cluster lock; dropping it lets go.
pub struct Hold<'a>(&'a ClusterLock);

impl Drop for Hold<'_> {
    fn drop(&mut self) {
        self.0.users.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

impl ClusterLock {
    pub fn new(turns: Turns) -> ClusterLock {
        ClusterLock { turns, ..ClusterLock::default() }
    }

    /// Holds the lock, taking it from the master if nobody here holds it
    /// yet. While the lease's turn is over, waits for it to be let go and
    /// for the yield window to pass first.
    pub async fn hold(&self, masters: &Masters, message: &str, patience: Duration) -> Result<Hold<'_>, Error> {
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            let mut state = self.state.lock().await;
            let now = tokio::time::Instant::now();
            let wait = match state.holding.as_ref().map(|h| h.since) {
                Some(since) if !self.turns.turn_over(since, now) => {
                    self.users.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
                    return Ok(Hold(self));
                }
                // The turn is over: wait for the lease to be let go.
                Some(_) => Duration::from_millis(250),
                None => self.turns.wait_to_ask(state.released_at, now),
            };
            if wait.is_zero() {
                let lease = acquire(masters, SHELL_LOCK, message, deadline.saturating_duration_since(now)).await?;
                let taken = tokio::time::Instant::now();
                state.holding = Some(Holding { lease, since: taken, renewed_at: taken });
                self.users.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
                return Ok(Hold(self));
            }
            drop(state);
            if now + wait > deadline {
                let reason = "jobcenter's turn with it is over and it waits to be let go".to_string();
                return Err(Error::LockBusy { name: SHELL_LOCK, patience, reason });
            }
            tokio::time::sleep(wait.min(Duration::from_millis(250))).await;
        }
    }

    /// Whether the held lease has had its turn: whoever holds it should let
    /// go once what it runs has ended.
    pub async fn turn_over(&self) -> bool {
        let state = self.state.lock().await;
        state.holding.as_ref().is_some_and(|h| self.turns.turn_over(h.since, tokio::time::Instant::now()))
    }

    /// Renews while held; lets go once nobody holds it and its turn is over
    /// or it has been idle for a while.
    async fn keep(&self, masters: Masters) {
        let mut idle_since: Option<tokio::time::Instant> = None;
        loop {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let mut state = self.state.lock().await;
            let now = tokio::time::Instant::now();
            let Some(holding) = state.holding.as_mut() else { continue };
            if self.users.load(std::sync::atomic::Ordering::Acquire) > 0 {
                idle_since = None;
                if now.saturating_duration_since(holding.renewed_at) >= RENEW_EVERY / 2 {
                    match renew(&masters, &mut holding.lease, "jobcenter maintenance").await {
                        Ok(()) => holding.renewed_at = now,
                        Err(e) => tracing::warn!(error = %e, "cannot renew the cluster lock"),
                    }
                }
                continue;
            }
            let idle = now.saturating_duration_since(*idle_since.get_or_insert(now));
            if self.turns.turn_over(holding.since, now) || idle >= self.turns.idle {
                if let Err(e) = release(&masters, &holding.lease).await {
                    tracing::warn!(error = %e, "cannot release the cluster lock");
                }
                *state = LockState { holding: None, released_at: Some(tokio::time::Instant::now()) };
                idle_since = None;
            }
        }
    }
}

/// Attempts of cluster job types are dispatched only while the cluster lock
/// is held: it is held as long as any waits or runs, within a turn. When the
/// turn is over the gate closes, and the lock is let go once the running
/// attempts end (an operator's `weed shell` gets in then).
async fn execution_lock(seaweedfs: SeaweedFs, engine: EngineHandle) {
    let gated: Vec<Arc<str>> = CLUSTER_JOB_TYPES.iter().map(|t| Arc::from(*t)).collect();
    let mut hold: Option<Hold<'_>> = None;
    let mut idle_since: Option<tokio::time::Instant> = None;
    loop {
        let open = hold.is_some() && !seaweedfs.lock.turn_over().await;
        let Ok((queued, running)) = engine.gate(gated.clone(), open).await else { return };
        if hold.is_none() && queued > 0 {
            match seaweedfs.hold("jobcenter maintenance", Duration::from_secs(30)).await {
                Ok(h) => {
                    hold = Some(h);
                    idle_since = None;
                    continue;
                }
                Err(e) => tracing::info!(error = %e, "maintenance waits for the cluster lock"),
            }
        } else if hold.is_some() && !open {
            // The turn is over and the gate closed: let go once nothing runs.
            if running == 0 {
                tracing::info!(queued, "maintenance lets the cluster lock go: its turn is over");
                hold = None;
            }
        } else if hold.is_some() && queued == 0 && running == 0 {
            if idle_since.get_or_insert_with(tokio::time::Instant::now).elapsed() >= Duration::from_secs(2) {
                // Close the gate first; let go only if nothing slipped through.
                let Ok((queued, running)) = engine.gate(gated.clone(), false).await else { return };
                if queued == 0 && running == 0 {
                    hold = None;
                }
                idle_since = None;
            }
        } else {
            idle_since = None;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Holds the presence lock, keeps the master's vacuum off while a
/// vacuum-capable worker is connected, and runs cluster job types only under
/// the cluster lock; the capacity view follows the engine's tasks (`engine`,
/// `clock`), and the vacuum the workers connected (`registry`).
pub(crate) fn keep_duties(
    duties: &Duties,
    seaweedfs: &SeaweedFs,
    engine: &EngineHandle,
    clock: &Arc<dyn Clock>,
    registry: &Registry,
) {
    let keeper = seaweedfs.clone();
    duties.keep("cluster lock", Stage::Intake, move || {
        let keeper = keeper.clone();
        async move { keeper.lock.keep((*keeper.masters).clone()).await }
    });
    let (masters, known) = (seaweedfs.masters.clone(), seaweedfs.nodes.clone());
    duties.keep("cluster nodes", Stage::Intake, move || super::context::refresh(masters.clone(), known.clone()));
    let (tracker, masters, followed, clock) =
        (seaweedfs.capacity.clone(), seaweedfs.masters.clone(), engine.clone(), clock.clone());
    duties.keep("capacity", Stage::Intake, move || {
        super::capacity::follow(tracker.clone(), masters.clone(), followed.clone(), clock.clone())
    });
    let (runner, engine) = (seaweedfs.clone(), engine.clone());
    duties.keep("execution lock", Stage::Intake, move || execution_lock(runner.clone(), engine.clone()));
    let masters = seaweedfs.masters.clone();
    duties.keep("presence lock", Stage::Intake, move || presence_lock(masters.clone()));
    let (masters, registry) = (seaweedfs.masters.clone(), registry.clone());
    duties.keep("master vacuum", Stage::Intake, move || master_vacuum(masters.clone(), registry.clone()));
}

/// Holds the presence lock that tells the masters an admin is connected.
async fn presence_lock(masters: Arc<Masters>) {
    loop {
        match acquire(&masters, PRESENCE_LOCK, "jobcenter admin connected", Duration::from_secs(5)).await {
            Ok(mut lease) => loop {
                tokio::time::sleep(RENEW_EVERY).await;
                if let Err(e) = renew(&masters, &mut lease, "jobcenter admin connected").await {
                    tracing::warn!(error = %e, "lost the master presence lock; taking it again");
                    break;
                }
            },
            Err(e) => {
                tracing::debug!(error = %e, "master presence lock not taken yet");
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        }
    }
}

/// Keeps the master's periodic vacuum off while a vacuum-capable worker is
/// connected, and on otherwise.
async fn master_vacuum(masters: Arc<Masters>, registry: Registry) {
    let mut disabled: Option<bool> = None;
    loop {
        let capable =
            registry.workers().iter().any(|w| w.capabilities.iter().any(|c| c.job_type == "vacuum" && c.can_execute));
        if disabled != Some(capable) {
            match set_vacuum(&masters, !capable).await {
                Ok(()) => {
                    let state = if capable { "off: a vacuum worker is connected" } else { "on" };
                    tracing::info!(state, "master periodic vacuum");
                    disabled = Some(capable);
                }
                Err(e) => tracing::debug!(error = %e, "cannot switch the master's vacuum yet"),
            }
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_default_lane_takes_the_cluster_lock() {
        for job_type in CLUSTER_JOB_TYPES {
            assert_eq!(lane(job_type), "default", "{job_type}");
        }
        assert_eq!(lane("my_own_type"), "default");
        assert_eq!(lane("iceberg_maintenance"), "iceberg");
        assert_eq!(lane("s3_lifecycle"), "lifecycle");
        assert_eq!(lane("lance_compact"), "lance");
    }

    #[test]
    fn a_turn_ends_after_its_length_and_the_lock_is_not_asked_for_within_the_yield_window() {
        let turns = Turns { turn: Duration::from_secs(60), yield_window: Duration::from_secs(2), idle: Duration::ZERO };
        let t0 = tokio::time::Instant::now();
        assert!(!turns.turn_over(t0, t0 + Duration::from_secs(59)));
        assert!(turns.turn_over(t0, t0 + Duration::from_secs(60)));
        assert_eq!(turns.wait_to_ask(None, t0), Duration::ZERO);
        assert_eq!(turns.wait_to_ask(Some(t0), t0 + Duration::from_millis(500)), Duration::from_millis(1500));
        assert_eq!(turns.wait_to_ask(Some(t0), t0 + Duration::from_secs(3)), Duration::ZERO);
    }

    #[test]
    fn master_grpc_addresses() {
        assert_eq!(grpc_address("127.0.0.1:9333").unwrap(), "127.0.0.1:19333");
        assert_eq!(grpc_address("127.0.0.1:9333.19444").unwrap(), "127.0.0.1:19444");
        assert!(grpc_address("nowhere").is_err());
    }
}
