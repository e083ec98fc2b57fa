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

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::task::{AbortHandle, JoinError, JoinSet};
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::Streaming;

use super::{ExecLog, Handler, Registry, TaskContext};
use crate::backoff::Backoff;
use crate::clock::{Clock, SystemClock, Timestamp};
use crate::follower::Outcome;
use crate::model::{AttemptId, HandlerId, JobId, TaskIdx, TaskRef};
use crate::proto::plugin::admin_to_worker_message::Body as AdminBody;
use crate::proto::plugin::plugin_control_service_client::PluginControlServiceClient;
use crate::proto::plugin::worker_to_admin_message::Body;
use crate::proto::plugin::{
    config_value, AdminRuntimeDefaults, AdminToWorkerMessage, CancelRequest, ConfigSchemaResponse, ConfigValue,
    DetectionComplete, ExecuteJobRequest, JobCompleted, JobProgressUpdate, JobResult, JobSpec, JobState,
    JobTypeCapability, JobTypeDescriptor, RunningWork, StringList, WorkKind, WorkerAcknowledge, WorkerHeartbeat,
    WorkerHello, WorkerToAdminMessage,
};
use crate::wire;

/// The protocol version a worker announces in its hello.
pub const PROTOCOL_VERSION: &str = "1";
pub use crate::wire::{JOB_NAME_LABEL, TASK_ID_LABEL};
/// The default lease: how long the worker keeps running its work without
/// reaching an admin. An admin keeps a disconnected worker's attempts for
/// the lease and a margin (25 s), within its orphan grace (30 s).
pub const DEFAULT_LEASE: Duration = Duration::from_secs(20);

/// Messages queued for the admin before sending waits.
const OUTBOUND_QUEUE: usize = 1024;
/// Largest message sent or received.
const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Opening the stream, and then the admin's hello, each get this long.
const HELLO_TIMEOUT: Duration = Duration::from_secs(15);
/// A send that waits this long for room in the queue ends the session.
const SEND_TIMEOUT: Duration = Duration::from_secs(30);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(20);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// Heartbeat intervals are at least this long, whatever the options or the admin say.
const MIN_HEARTBEAT: Duration = Duration::from_millis(100);
/// The reason of a `CancelRequest` that gives none.
const DEFAULT_CANCEL_REASON: &str = "requested by the admin";

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

/// Why a session ended.
enum SessionEnd {
    /// The admin's hello refused the worker.
    Refused { message: String, reconnect_delay: Duration },
    /// Connecting failed, or the stream broke or closed: why.
    Broken(String),
    /// The worker is stopping.
    Stopped,
}

impl From<String> for SessionEnd {
    fn from(reason: String) -> SessionEnd {
        SessionEnd::Broken(reason)
    }
}

/// An outcome kept until an admin acknowledges it.
struct Ended {
    completed: JobCompleted,
    /// When it was last sent, in this session.
    sent: Option<Instant>,
}

/// What outlives a session: the running executions, the outcomes that no
/// admin has acknowledged yet, and when an admin was last heard from.
struct Work {
    lease: Duration,
    executions: Executions,
    /// The executions' futures; dropping the set drops them all.
    tasks: JoinSet<Outcome>,
    /// By job id, oldest first in `order`.
    unacknowledged: BTreeMap<String, Ended>,
    /// The lease runs from here: when the worker sent the newest hello or
    /// heartbeat that an admin renewed (not when the renewal arrived, which
    /// a slow or partitioned network can hold up past the admin's count).
    renewed_as_of: Instant,
    /// The last admin renewed the lease: executions outlive its stream, and
    /// are given up when the lease runs out.
    keeps_work: bool,
    /// Set when the table of executions changed, for the next heartbeat.
    changed: bool,
}

impl Work {
    fn new(lease: Duration) -> Work {
        Work {
            lease,
            executions: Executions::new(0),
            tasks: JoinSet::new(),
            unacknowledged: BTreeMap::new(),
            renewed_as_of: Instant::now(),
            keeps_work: false,
            changed: false,
        }
    }

    /// An admin renewed the lease as of `sent`, when the hello or heartbeat
    /// it answers left.
    fn renewed_as_of(&mut self, sent: Instant) {
        self.renewed_as_of = self.renewed_as_of.max(sent);
    }

    /// When the lease runs out, if it binds now.
    fn lease_deadline(&self) -> Option<Instant> {
        (self.keeps_work && self.executions.len() > 0).then_some(self.renewed_as_of + self.lease)
    }

    /// Runs `future` while executions go on: an execution that ends keeps
    /// its outcome for the next session, and every execution is given up
    /// when the lease runs out.
    async fn meanwhile<F: Future>(&mut self, worker: &Worker, future: F) -> F::Output {
        tokio::pin!(future);
        loop {
            let lease = self.lease_deadline();
            tokio::select! {
                output = &mut future => return output,
                Some(joined) = self.tasks.join_next_with_id(), if !self.tasks.is_empty() => {
                    if let Some(completed) = self.finished(worker, joined) {
                        self.keep(completed, None);
                    }
                }
                () = sleep_until(lease), if lease.is_some() => self.give_up_all(worker),
            }
        }
    }

    /// An execution's future ended: its outcome, unless a cancel already reported it.
    fn finished(
        &mut self,
        worker: &Worker,
        joined: Result<(tokio::task::Id, Outcome), JoinError>,
    ) -> Option<JobCompleted> {
        let (task, result) = match joined {
            Ok((task, outcome)) => (task, Ok(outcome)),
            Err(e) => (e.id(), Err(e)),
        };
        let execution = self.executions.remove_task(task)?;
        self.changed = true;
        let outcome = match result {
            Ok(outcome) => outcome,
            Err(e) if e.is_panic() => Outcome::Failed { error: "the handler panicked".into(), output: Vec::new() },
            Err(_) => Outcome::Canceled { reason: "the execution was aborted".into() },
        };
        Some(ended(worker, execution, outcome))
    }

    /// Keeps an outcome until an admin acknowledges it (when the admin does).
    fn keep(&mut self, completed: JobCompleted, sent: Option<Instant>) {
        if self.keeps_work {
            self.unacknowledged.insert(completed.job_id.clone(), Ended { completed, sent });
        }
    }

    /// The lease ran out: every execution stops, and its attempt is given up.
    fn give_up_all(&mut self, worker: &Worker) {
        let running = self.executions.take_all();
        tracing::warn!(
            n_executions = running.len(),
            lease_ms = self.lease.as_millis() as u64,
            "no admin reached within the lease: giving up every execution"
        );
        for execution in running {
            execution.abort.abort();
            let completed = given_up(worker, execution, wire::LEASE_EXPIRED, "abandoned");
            self.keep(completed, None);
        }
        self.changed = true;
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The outcome of an execution that ran, logged and made a `JobCompleted`.
fn ended(worker: &Worker, execution: Execution, outcome: Outcome) -> JobCompleted {
    let event = match &outcome {
        Outcome::Succeeded { .. } => "succeeded",
        Outcome::Failed { .. } => "failed",
        Outcome::Canceled { .. } => "canceled",
    };
    if let Some(log) = &worker.options.exec_log {
        log.record_event(execution.record.job, &execution.record.task_id, execution.record.attempt, event);
    }
    tracing::info!(work.id = %execution.job_id, job_type = %execution.job_type, outcome = event, "execution ended");
    job_completed(execution.request_id, execution.job_id, execution.job_type, outcome, worker.clock.now())
}

/// An execution stopped without an outcome of its own: `error` tells the
/// admin why (its lease ran out, or the worker is stopping).
fn given_up(worker: &Worker, execution: Execution, error: &str, event: &str) -> JobCompleted {
    if let Some(log) = &worker.options.exec_log {
        log.record_event(execution.record.job, &execution.record.task_id, execution.record.attempt, event);
    }
    tracing::warn!(work.id = %execution.job_id, job_type = %execution.job_type, error, "execution given up");
    refusal(execution.request_id, execution.job_id, execution.job_type, error.to_string(), worker.clock.now())
}

impl Worker {
    /// One connection, from the hello to the stream's end. Resets `backoff`
    /// once the admin accepts the hello.
    async fn session(
        &self,
        admin: &str,
        work: &mut Work,
        backoff: &mut Backoff,
        mut stop: watch::Receiver<bool>,
    ) -> SessionEnd {
        work.executions.capacity = self.options.max_execute;
        let (outbound, outbound_rx) = mpsc::channel(OUTBOUND_QUEUE);
        let hello = hello_message(
            &self.options.worker_id,
            self.instance,
            &self.registry.job_types(),
            self.options.max_execute,
            self.options.lease,
        );
        let hello = envelope(&self.options.worker_id, self.clock.now(), Body::Hello(hello));
        let hello_sent = Instant::now();
        if outbound.send(hello).await.is_err() {
            return SessionEnd::Broken("the outbound queue closed before the hello".into());
        }
        let opening = async {
            tokio::select! {
                opened = self.open(admin, outbound_rx) => Some(opened),
                _ = stopped(&mut stop) => None,
            }
        };
        let mut inbound = match work.meanwhile(self, opening).await {
            None => return SessionEnd::Stopped,
            Some(Ok(inbound)) => inbound,
            Some(Err(e)) => return SessionEnd::Broken(e),
        };
        let first = match work.meanwhile(self, tokio::time::timeout(HELLO_TIMEOUT, inbound.next())).await {
            Err(_) => return SessionEnd::Broken(format!("no admin hello within {HELLO_TIMEOUT:?}")),
            Ok(None) => return SessionEnd::Broken("the admin closed the stream before its hello".into()),
            Ok(Some(Err(status))) => return SessionEnd::Broken(format!("the stream failed: {status}")),
            Ok(Some(Ok(message))) => message,
        };
        let mut heartbeat = self.options.heartbeat;
        let pending = match first.body {
            Some(AdminBody::Hello(hello)) if !hello.accepted => {
                return SessionEnd::Refused {
                    message: hello.message,
                    reconnect_delay: Duration::from_secs(u64::try_from(hello.reconnect_delay_seconds).unwrap_or(0)),
                };
            }
            Some(AdminBody::Hello(hello)) => {
                if let Ok(seconds @ 1..) = u64::try_from(hello.heartbeat_interval_seconds) {
                    heartbeat = Duration::from_secs(seconds);
                }
                None
            }
            _ => {
                tracing::warn!("the admin's first message is not a hello; serving it anyway");
                Some(first)
            }
        };
        backoff.reset();
        tracing::info!(
            worker.id = %self.options.worker_id,
            admin,
            heartbeat_ms = heartbeat.as_millis() as u64,
            running = work.executions.len(),
            unacknowledged = work.unacknowledged.len(),
            "connected to the admin"
        );
        let mut session = Session {
            worker: self,
            outbound,
            work,
            draining: false,
            last_heartbeat: Instant::now() - HEARTBEAT_COALESCE,
            heartbeat_pending: false,
            admin_renews: None,
            connected_at: Instant::now(),
            heartbeat,
            unannounced: Vec::new(),
            sent_beats: std::collections::VecDeque::from([(0, hello_sent)]),
            next_beat: 1,
        };
        let end = session.serve(inbound, pending, stop).await;
        let work = session.work;
        if !work.keeps_work {
            let running = work.executions.take_all();
            if !running.is_empty() {
                tracing::warn!(n_dropped = running.len(), "dropped the running executions with the stream");
            }
            for execution in running {
                execution.abort.abort();
            }
        }
        end
    }

    /// Connects and opens the stream; `outbound` already holds the hello.
    async fn open(
        &self,
        admin: &str,
        outbound: mpsc::Receiver<WorkerToAdminMessage>,
    ) -> Result<Streaming<AdminToWorkerMessage>, String> {
        let address = wire::resolve_grpc_address(admin).await.map_err(|e| e.to_string())?;
        let uri = grpc_uri(&address).map_err(|e| e.to_string())?;
        let channel = self
            .options
            .tls
            .endpoint(&address)
            .map_err(|e| e.to_string())?
            .connect_timeout(CONNECT_TIMEOUT)
            .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
            .keep_alive_timeout(KEEPALIVE_TIMEOUT)
            .connect()
            .await
            .map_err(|e| format!("connecting to {uri}: {e}"))?;
        let mut client = PluginControlServiceClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        let mut request = tonic::Request::new(ReceiverStream::new(outbound));
        if let Some(authorization) = &self.authorization {
            request.metadata_mut().insert("authorization", authorization.clone());
        }
        let response = tokio::time::timeout(HELLO_TIMEOUT, client.worker_stream(request))
            .await
            .map_err(|_| format!("opening the worker stream at {uri} timed out"))?
            .map_err(|status| format!("opening the worker stream at {uri}: {status}"))?;
        Ok(response.into_inner())
    }
}

/// `http://HOST:PORT`, with brackets around an IPv6 host.
fn grpc_uri(address: &str) -> Result<String, wire::AddressError> {
    let (host, port) = wire::split_host_port(address)?;
    Ok(if host.contains(':') { format!("http://[{host}]:{port}") } else { format!("http://{host}:{port}") })
}

/// A session's state after the hello: its stream, and the work it serves.
struct Session<'a> {
    worker: &'a Worker,
    outbound: mpsc::Sender<WorkerToAdminMessage>,
    work: &'a mut Work,
    /// Set by `AdminShutdown`: execution requests are refused from then on.
    draining: bool,
    /// When the last heartbeat went out, and whether a change waits for the next one.
    last_heartbeat: Instant,
    heartbeat_pending: bool,
    /// Whether this admin renews the lease: unknown until its first renewal
    /// (sent right after its hello), or until half a lease passes without one.
    admin_renews: Option<bool>,
    connected_at: Instant,
    /// The interval the admin asked for.
    heartbeat: Duration,
    /// Executions accepted whose start is not reported yet (by job id).
    unannounced: Vec<String>,
    /// The hello (0) and the latest heartbeats, by number, with when each
    /// left: a renewal names one, and the lease runs from its departure.
    sent_beats: std::collections::VecDeque<(u64, Instant)>,
    next_beat: u64,
}

/// Heartbeats remembered for their renewals: a renewal of an older one
/// renews nothing that a newer one did not.
const BEATS_KEPT: usize = 64;

/// Heartbeats that report a start or an end go out at most this often, so
/// that many short executions do not each send the whole running list twice.
const HEARTBEAT_COALESCE: Duration = Duration::from_millis(200);

type Step = Result<(), SessionEnd>;

impl Session<'_> {
    /// The heartbeat interval: the admin's, or a quarter of the lease if
    /// that is shorter, so that a renewing admin's answer comes well within it.
    fn heartbeat_interval(&self) -> Duration {
        self.heartbeat.min(self.work.lease / 4).max(MIN_HEARTBEAT)
    }

    async fn serve(
        &mut self,
        mut inbound: Streaming<AdminToWorkerMessage>,
        pending: Option<AdminToWorkerMessage>,
        mut stop: watch::Receiver<bool>,
    ) -> SessionEnd {
        if let Some(message) = pending {
            if let Err(end) = self.handle(message).await {
                return end;
            }
        }
        // What ended while the worker was away goes first, then what still
        // runs: the admin applies the one before it compares the other.
        if let Err(end) = self.report_unacknowledged(true).await {
            return end;
        }
        if let Err(end) = self.send_heartbeat().await {
            return end;
        }
        let mut ticker =
            tokio::time::interval_at(Instant::now() + self.heartbeat_interval(), self.heartbeat_interval());
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let lease = self.work.lease_deadline();
            // A renewing admin that falls silent for half a lease is given up
            // for another connection (another admin, if there are several).
            // A new session gets its half lease too, from its start.
            let silent_at = (self.admin_renews == Some(true))
                .then(|| self.work.renewed_as_of.max(self.connected_at) + self.work.lease / 2);
            // An admin that has not renewed within half a lease never will.
            let undecided_at = (self.admin_renews.is_none()).then(|| self.connected_at + self.work.lease / 2);
            let step = tokio::select! {
                message = inbound.next() => match message {
                    Some(Ok(message)) => self.handle(message).await,
                    Some(Err(status)) => Err(SessionEnd::Broken(format!("the stream failed: {status}"))),
                    None => Err(SessionEnd::Broken("the admin closed the stream".into())),
                },
                _ = ticker.tick() => {
                    match self.send_heartbeat().await {
                        Ok(()) => self.report_unacknowledged(false).await,
                        Err(end) => Err(end),
                    }
                }
                () = tokio::time::sleep_until(self.last_heartbeat + HEARTBEAT_COALESCE), if self.heartbeat_pending => {
                    self.send_heartbeat().await
                }
                // Ready once the executions just accepted have had a turn
                // and nothing else is waiting.
                () = tokio::task::yield_now(), if !self.unannounced.is_empty() => self.announce_starts().await,
                Some(joined) = self.work.tasks.join_next_with_id(), if !self.work.tasks.is_empty() => {
                    match self.work.finished(self.worker, joined) {
                        Some(completed) => self.report(completed).await,
                        None => Ok(()),
                    }
                }
                () = sleep_until(lease), if lease.is_some() => {
                    self.work.give_up_all(self.worker);
                    Err(SessionEnd::Broken("no word from the admin within the lease".into()))
                }
                () = sleep_until(silent_at), if silent_at.is_some() => {
                    Err(SessionEnd::Broken("no word from the admin for half the lease".into()))
                }
                () = sleep_until(undecided_at), if undecided_at.is_some() => {
                    self.admin_renews = Some(false);
                    self.work.keeps_work = false;
                    // Such an admin acknowledges nothing: what was reported is done with.
                    self.work.unacknowledged.clear();
                    Ok(())
                }
                _ = stopped(&mut stop) => {
                    self.give_back_all().await;
                    Err(SessionEnd::Stopped)
                }
            };
            if self.work.changed {
                self.work.changed = false;
                if let Err(end) = self.heartbeat_soon().await {
                    return end;
                }
            }
            if let Err(end) = step {
                return end;
            }
        }
    }

    async fn send(&self, body: Body) -> Step {
        let message = envelope(&self.worker.options.worker_id, self.worker.clock.now(), body);
        match tokio::time::timeout(SEND_TIMEOUT, self.outbound.send(message)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(SessionEnd::Broken("the stream to the admin is closed".into())),
            Err(_) => Err(SessionEnd::Broken(format!("the admin took no message for {SEND_TIMEOUT:?}"))),
        }
    }

    async fn acknowledge(&self, request_id: String, accepted: bool, message: &str) -> Step {
        self.send(Body::Acknowledge(WorkerAcknowledge { request_id, accepted, message: message.to_string() })).await
    }

    async fn send_heartbeat(&mut self) -> Step {
        self.last_heartbeat = Instant::now();
        self.heartbeat_pending = false;
        let number = self.next_beat;
        self.next_beat += 1;
        let mut heartbeat =
            heartbeat_message(&self.worker.options.worker_id, &self.work.executions, self.worker.options.max_detect);
        heartbeat.metadata.insert(wire::HEARTBEAT_METADATA.into(), number.to_string());
        if self.sent_beats.len() >= BEATS_KEPT {
            self.sent_beats.pop_front();
        }
        self.sent_beats.push_back((number, Instant::now()));
        self.send(Body::Heartbeat(heartbeat)).await
    }

    /// A heartbeat after a change: now if none went out lately, else soon.
    async fn heartbeat_soon(&mut self) -> Step {
        if self.last_heartbeat.elapsed() >= HEARTBEAT_COALESCE {
            self.send_heartbeat().await
        } else {
            self.heartbeat_pending = true;
            Ok(())
        }
    }

    /// Keeps an outcome until the admin acknowledges it, and reports it now
    /// (kept first: a stream that breaks while it is sent loses nothing).
    async fn report(&mut self, completed: JobCompleted) -> Step {
        self.work.keep(completed.clone(), Some(Instant::now()));
        self.send(Body::JobCompleted(completed)).await
    }

    /// Sends the outcomes no admin has acknowledged: all of them (`all`, at
    /// the start of a session), or those whose acknowledgement is overdue.
    async fn report_unacknowledged(&mut self, all: bool) -> Step {
        let overdue = self.heartbeat_interval() * 2;
        let due: Vec<JobCompleted> = self
            .work
            .unacknowledged
            .values_mut()
            .filter(|ended| all || ended.sent.is_none_or(|at| at.elapsed() >= overdue))
            .map(|ended| {
                ended.sent = Some(Instant::now());
                ended.completed.clone()
            })
            .collect();
        if !due.is_empty() {
            tracing::info!(n_outcomes = due.len(), "reporting outcomes the admin has not acknowledged");
        }
        for completed in due {
            self.send(Body::JobCompleted(completed)).await?;
        }
        Ok(())
    }

    /// The worker is stopping: every execution stops, and its attempt goes
    /// back to the admin at once, uncounted.
    async fn give_back_all(&mut self) {
        for execution in self.work.executions.take_all() {
            execution.abort.abort();
            let completed = given_up(self.worker, execution, wire::STOPPING, "given-back");
            let _ = self.send(Body::JobCompleted(completed)).await;
        }
    }

    async fn handle(&mut self, message: AdminToWorkerMessage) -> Step {
        let request_id = message.request_id;
        match message.body {
            Some(AdminBody::Hello(hello)) if !hello.accepted => Err(SessionEnd::Refused {
                message: hello.message,
                reconnect_delay: Duration::from_secs(u64::try_from(hello.reconnect_delay_seconds).unwrap_or(0)),
            }),
            Some(AdminBody::Hello(_)) => Ok(()),
            Some(AdminBody::RequestConfigSchema(request)) => {
                let served = self.worker.registry.get(&request.job_type).is_some();
                let response = schema_response(request_id, &request.job_type, served, self.worker.options.max_execute);
                self.send(Body::ConfigSchemaResponse(response)).await
            }
            Some(AdminBody::RunDetectionRequest(request)) => {
                let request_id = if request_id.is_empty() { request.request_id } else { request_id };
                let error_message = format!("this worker runs no detection (job type {:?})", request.job_type);
                self.send(Body::DetectionComplete(DetectionComplete {
                    request_id,
                    job_type: request.job_type,
                    success: false,
                    error_message,
                    total_proposals: 0,
                }))
                .await
            }
            Some(AdminBody::ExecuteJobRequest(request)) => self.execute(request_id, request).await,
            Some(AdminBody::CancelRequest(request)) => self.cancel(request_id, request).await,
            Some(AdminBody::Shutdown(request)) => {
                tracing::info!(reason = %request.reason, "the admin is shutting down; taking no more work");
                self.draining = true;
                self.acknowledge(request_id, true, "shutdown acknowledged").await
            }
            None if wire::parse_lease_renewal(&request_id).is_some() || request_id == wire::LEASE_RENEWAL => {
                self.renewed();
                // The lease runs from when the renewed heartbeat left; a
                // renewal that names none, or one too old to remember,
                // renews nothing.
                let number = wire::parse_lease_renewal(&request_id);
                if let Some(&(_, sent)) = self.sent_beats.iter().find(|(n, _)| Some(*n) == number) {
                    self.work.renewed_as_of(sent);
                }
                Ok(())
            }
            None if wire::parse_outcome_ack(&request_id).is_some() => {
                self.renewed();
                if let Some((attempt, refused)) = wire::parse_outcome_ack(&request_id) {
                    if let Some(reason) = refused {
                        tracing::info!(work.id = attempt, %reason, "the admin refused an outcome; forgetting it");
                    }
                    self.work.unacknowledged.remove(attempt);
                }
                Ok(())
            }
            Some(AdminBody::RequestObjectPreview(_)) | None => {
                self.acknowledge(request_id, false, "unsupported request").await
            }
        }
    }

    /// This admin renews the lease: executions outlive its stream from now on.
    fn renewed(&mut self) {
        if self.admin_renews != Some(true) {
            self.admin_renews = Some(true);
            self.work.keeps_work = true;
        }
    }

    async fn refuse(&self, request_id: String, job: Option<&JobSpec>, error: String) -> Step {
        let (job_id, job_type) = job.map(|j| (j.job_id.clone(), j.job_type.clone())).unwrap_or_default();
        tracing::debug!(work.id = %job_id, job_type = %job_type, %error, "execute request refused");
        let completed = refusal(request_id, job_id, job_type, error, self.worker.clock.now());
        self.send(Body::JobCompleted(completed)).await
    }

    async fn execute(&mut self, request_id: String, request: ExecuteJobRequest) -> Step {
        let request_id = if request_id.is_empty() { request.request_id.clone() } else { request_id };
        let Some(job) = request.job.as_ref() else {
            return self.refuse(request_id, None, "execute request without a job".into()).await;
        };
        if job.job_id.is_empty() {
            return self.refuse(request_id, Some(job), "execute request without a job id".into()).await;
        }
        let Some(handler) = self.worker.registry.get(&job.job_type).cloned() else {
            return self.refuse(request_id, Some(job), format!("unknown job type {}", job.job_type)).await;
        };
        if self.draining {
            return self.refuse(request_id, Some(job), wire::AT_CAPACITY.into()).await;
        }
        match self.work.executions.admit(&job.job_id) {
            Admission::Admit => {}
            Admission::AtCapacity => return self.refuse(request_id, Some(job), wire::AT_CAPACITY.into()).await,
            Admission::AlreadyRunning => {
                let message = format!("job {} is already running here", job.job_id);
                return self.acknowledge(request_id, false, &message).await;
            }
        }
        let ctx = task_context(job, request.attempt);
        let timeout_seconds = request
            .admin_runtime
            .as_ref()
            .and_then(|runtime| u64::try_from(runtime.execution_timeout_seconds).ok())
            .filter(|seconds| *seconds > 0);
        let record = ExecRecord { job: ctx.job, task_id: ctx.task_id.clone(), attempt: ctx.attempt };
        if let Some(log) = &self.worker.options.exec_log {
            log.record_event(record.job, &record.task_id, record.attempt, "start");
        }
        tracing::info!(work.id = %job.job_id, job_type = %job.job_type, task.id = %ctx.task_id, attempt = ctx.attempt, "execution started");
        let abort = self.work.tasks.spawn(execute_with_timeout(handler, ctx, timeout_seconds));
        let (job_id, job_type) = (job.job_id.clone(), job.job_type.clone());
        self.work.executions.insert(Execution {
            job_id: job_id.clone(),
            request_id: request_id.clone(),
            job_type,
            record,
            abort,
        });
        self.acknowledge(request_id.clone(), true, "execute request accepted").await?;
        self.unannounced.push(job_id);
        self.heartbeat_soon().await
    }

    /// Reports "started" for the executions accepted since the last call
    /// that still run. Called once they have had a turn, so that one that
    /// ended in its first turn reports only its outcome, which says as
    /// much: an admin takes the outcome of an attempt it has not seen start.
    async fn announce_starts(&mut self) -> Step {
        for job_id in std::mem::take(&mut self.unannounced) {
            let Some(execution) = self.work.executions.running.get(&job_id) else { continue };
            if execution.abort.is_finished() {
                continue;
            }
            let (request_id, job_type) = (execution.request_id.clone(), execution.job_type.clone());
            self.send(Body::JobProgressUpdate(JobProgressUpdate {
                request_id,
                job_id,
                job_type,
                state: JobState::Running.into(),
                progress_percent: 0.0,
                stage: "started".into(),
                updated_at: Some(wire_timestamp(self.worker.clock.now())),
                ..JobProgressUpdate::default()
            }))
            .await?;
        }
        Ok(())
    }

    async fn cancel(&mut self, request_id: String, request: CancelRequest) -> Step {
        let target = request.target_id.trim();
        if target.is_empty() {
            return self.acknowledge(request_id, false, "cancel target is required").await;
        }
        let Some(execution) = self.work.executions.find(target) else {
            return self.acknowledge(request_id, false, "cancel target not found").await;
        };
        if execution.abort.is_finished() {
            // Its outcome is waiting in `tasks`; `finished` reports it.
            return self.acknowledge(request_id, false, "cancel target has already finished").await;
        }
        let job_id = execution.job_id.clone();
        let Some(execution) = self.work.executions.remove(&job_id) else { return Ok(()) };
        execution.abort.abort();
        let reason = match request.reason.trim() {
            "" => DEFAULT_CANCEL_REASON.to_string(),
            reason => reason.to_string(),
        };
        self.acknowledge(request_id, true, "cancel request accepted").await?;
        let completed = ended(self.worker, execution, Outcome::Canceled { reason });
        self.report(completed).await?;
        self.heartbeat_soon().await
    }
}

/// Runs one attempt, bounded by the admin's execution timeout when it gives one.
async fn execute_with_timeout(handler: Arc<dyn Handler>, ctx: TaskContext, timeout_seconds: Option<u64>) -> Outcome {
    let future = handler.execute(ctx);
    match timeout_seconds {
        Some(seconds) => match tokio::time::timeout(Duration::from_secs(seconds), future).await {
            Ok(outcome) => outcome,
            Err(_) => Outcome::Failed { error: format!("execution timed out after {seconds} s"), output: Vec::new() },
        },
        None => future.await,
    }
}

/// What the execution log names an execution by.
#[derive(Clone, Debug, PartialEq, Eq)]
struct ExecRecord {
    job: JobId,
    task_id: Box<str>,
    attempt: u32,
}

/// One running execution.
#[derive(Debug)]
struct Execution {
    /// The `JobSpec.job_id`: `JOB_UUID.TASK_INDEX.ATTEMPT` from a jobcenter admin.
    job_id: String,
    request_id: String,
    job_type: String,
    record: ExecRecord,
    abort: AbortHandle,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Admission {
    Admit,
    AtCapacity,
    AlreadyRunning,
}

/// The running executions by job id, and the slots they hold.
#[derive(Debug)]
struct Executions {
    capacity: u32,
    running: BTreeMap<String, Execution>,
}

impl Executions {
    fn new(capacity: u32) -> Executions {
        Executions { capacity, running: BTreeMap::new() }
    }

    fn len(&self) -> usize {
        self.running.len()
    }

    fn used(&self) -> u32 {
        u32::try_from(self.running.len()).unwrap_or(u32::MAX)
    }

    fn admit(&self, job_id: &str) -> Admission {
        if self.running.contains_key(job_id) {
            Admission::AlreadyRunning
        } else if self.used() >= self.capacity {
            Admission::AtCapacity
        } else {
            Admission::Admit
        }
    }

    fn insert(&mut self, execution: Execution) {
        self.running.insert(execution.job_id.clone(), execution);
    }

    fn remove(&mut self, job_id: &str) -> Option<Execution> {
        self.running.remove(job_id)
    }

    /// Every execution, taken out of the table (to stop or give up).
    fn take_all(&mut self) -> Vec<Execution> {
        std::mem::take(&mut self.running).into_values().collect()
    }

    fn remove_task(&mut self, task: tokio::task::Id) -> Option<Execution> {
        let job_id = self.running.values().find(|e| e.abort.id() == task)?.job_id.clone();
        self.running.remove(&job_id)
    }

    /// The execution a cancel's `target_id` names: by job id, else by request id.
    fn find(&self, target: &str) -> Option<&Execution> {
        self.running.get(target).or_else(|| self.running.values().find(|e| e.request_id == target))
    }

    fn running_work(&self) -> Vec<RunningWork> {
        self.running
            .values()
            .map(|e| RunningWork {
                work_id: e.job_id.clone(),
                kind: WorkKind::Execution.into(),
                job_type: e.job_type.clone(),
                state: JobState::Running.into(),
                progress_percent: 0.0,
                stage: "running".into(),
            })
            .collect()
    }
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

fn saturating_i32(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

fn wire_timestamp(at: Timestamp) -> prost_types::Timestamp {
    let millis = at.as_millis();
    prost_types::Timestamp {
        seconds: millis.div_euclid(1000),
        nanos: i32::try_from(millis.rem_euclid(1000) * 1_000_000).unwrap_or(0),
    }
}

fn envelope(worker_id: &str, now: Timestamp, body: Body) -> WorkerToAdminMessage {
    WorkerToAdminMessage { worker_id: worker_id.to_string(), sent_at: Some(wire_timestamp(now)), body: Some(body) }
}

/// A job type's name and description for humans.
fn describe(job_type: &str) -> (String, String) {
    let (name, description) = match job_type {
        "noop" => ("No-op", "Sleeps for sleep_ms, then succeeds, or fails as told (fail, fail_attempts)"),
        "shell" => ("Shell command", "Runs command with sh -c, or argv directly; exit code 0 succeeds"),
        other => (other, ""),
    };
    (name.to_string(), description.to_string())
}

fn hello_message(
    worker_id: &str,
    instance: HandlerId,
    job_types: &[Arc<str>],
    max_execute: u32,
    lease: Duration,
) -> WorkerHello {
    let capabilities = job_types
        .iter()
        .map(|job_type| {
            let (display_name, description) = describe(job_type);
            JobTypeCapability {
                job_type: job_type.to_string(),
                can_detect: false,
                can_execute: true,
                max_detection_concurrency: 0,
                max_execution_concurrency: saturating_i32(max_execute),
                display_name,
                description,
                weight: 0,
            }
        })
        .collect();
    WorkerHello {
        worker_id: worker_id.to_string(),
        worker_instance_id: instance.to_string(),
        address: String::new(),
        worker_version: env!("CARGO_PKG_VERSION").to_string(),
        protocol_version: PROTOCOL_VERSION.to_string(),
        capabilities,
        metadata: HashMap::from([
            ("runtime".to_string(), "jobcenter".to_string()),
            (wire::LEASE_METADATA.to_string(), lease.as_millis().to_string()),
        ]),
    }
}

fn heartbeat_message(worker_id: &str, executions: &Executions, max_detect: u32) -> WorkerHeartbeat {
    WorkerHeartbeat {
        worker_id: worker_id.to_string(),
        running_work: executions.running_work(),
        detection_slots_used: 0,
        detection_slots_total: saturating_i32(max_detect),
        execution_slots_used: saturating_i32(executions.used()),
        execution_slots_total: saturating_i32(executions.capacity),
        queued_jobs_by_type: HashMap::new(),
        metadata: HashMap::from([("runtime".to_string(), "jobcenter".to_string())]),
    }
}

fn schema_response(request_id: String, job_type: &str, served: bool, _max_execute: u32) -> ConfigSchemaResponse {
    if !served {
        return ConfigSchemaResponse {
            request_id,
            job_type: job_type.to_string(),
            success: false,
            error_message: format!("job type {job_type:?} is not served by this worker"),
            job_type_descriptor: None,
        };
    }
    let (display_name, description) = describe(job_type);
    ConfigSchemaResponse {
        request_id,
        job_type: job_type.to_string(),
        success: true,
        error_message: String::new(),
        job_type_descriptor: Some(JobTypeDescriptor {
            job_type: job_type.to_string(),
            display_name,
            description,
            descriptor_version: 1,
            admin_runtime_defaults: Some(AdminRuntimeDefaults {
                enabled: true,
                detection_interval_minutes: 0,
                detection_timeout_seconds: 45,
                max_jobs_per_detection: 1000,
                global_execution_concurrency: 1024,
                // A job type's descriptor is shared by every worker that serves
                // it; each worker's own slots bound it through its capability.
                per_worker_execution_concurrency: 1024,
                retry_limit: 0,
                retry_backoff_seconds: 5,
                job_type_max_runtime_seconds: 1800,
                execution_timeout_seconds: 0,
            }),
            ..JobTypeDescriptor::default()
        }),
    }
}

/// The `JobCompleted` of an execution request that was not run.
fn refusal(request_id: String, job_id: String, job_type: String, error: String, now: Timestamp) -> JobCompleted {
    JobCompleted {
        request_id,
        job_id,
        job_type,
        success: false,
        error_message: error,
        completed_at: Some(wire_timestamp(now)),
        ..JobCompleted::default()
    }
}

/// The `JobCompleted` of an execution that ran; its output lines go in `output_values["output"]`.
fn job_completed(
    request_id: String,
    job_id: String,
    job_type: String,
    outcome: Outcome,
    now: Timestamp,
) -> JobCompleted {
    let (success, error_message, summary, output) = match outcome {
        Outcome::Succeeded { output } => (true, String::new(), "succeeded".to_string(), output),
        Outcome::Failed { error, output } => (false, error.clone(), format!("failed: {error}"), output),
        Outcome::Canceled { reason } => {
            let error = format!("canceled: {reason}");
            (false, error.clone(), error, Vec::new())
        }
    };
    let output = ConfigValue { kind: Some(config_value::Kind::StringList(StringList { values: output })) };
    JobCompleted {
        request_id,
        job_id,
        job_type,
        success,
        error_message,
        result: Some(JobResult { output_values: HashMap::from([("output".to_string(), output)]), summary }),
        activities: Vec::new(),
        completed_at: Some(wire_timestamp(now)),
    }
}

/// What a handler sees of a `JobSpec`. The task comes from the job id when it
/// is an `attempt_id`; otherwise a nil job id stands in and the request's
/// attempt counts.
fn task_context(job: &JobSpec, request_attempt: i32) -> TaskContext {
    let parsed = job.job_id.parse::<AttemptId>().ok();
    let AttemptId { task, number: attempt } = parsed.unwrap_or_else(|| {
        let placeholder = TaskRef { job: JobId(uuid::Uuid::nil()), idx: TaskIdx(0) };
        AttemptId::new(placeholder, u32::try_from(request_attempt).unwrap_or(0).max(1))
    });
    let mut labels: BTreeMap<String, String> = job.labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    let task_id = labels.remove(TASK_ID_LABEL).unwrap_or_else(|| match parsed {
        Some(_) => task.idx.0.to_string(),
        None => job.job_id.clone(),
    });
    let job_name = labels.remove(JOB_NAME_LABEL).unwrap_or_else(|| job.summary.clone());
    TaskContext {
        task,
        job: task.job,
        job_name,
        task_id: one_word(&task_id).into_boxed_str(),
        job_type: Arc::from(job.job_type.as_str()),
        attempt,
        parameters: serde_json::Value::Object(wire::values_to_json(&job.parameters)),
        labels,
    }
}

/// `text` with its whitespace runs as `_`, so it stays one field of an execution log line.
fn one_word(text: &str) -> String {
    let word = text.split_whitespace().collect::<Vec<_>>().join("_");
    if word.is_empty() {
        "-".to_string()
    } else {
        word
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::sync::oneshot;
    use tonic::{Request, Response, Status};

    use super::*;
    use crate::proto::plugin::plugin_control_service_server::{PluginControlService, PluginControlServiceServer};
    use crate::proto::plugin::{
        AdminHello, AdminRuntimeConfig, AdminShutdown, RequestConfigSchema, RunDetectionRequest,
    };
    use crate::worker::builtin_handlers;

    fn spec(job_id: &str, job_type: &str, parameters: serde_json::Value) -> JobSpec {
        JobSpec {
            job_id: job_id.to_string(),
            job_type: job_type.to_string(),
            parameters: wire::json_to_values(parameters.as_object().expect("an object")),
            ..JobSpec::default()
        }
    }

    async fn pending_task(tasks: &mut JoinSet<Outcome>) -> AbortHandle {
        tasks.spawn(std::future::pending())
    }

    fn execution(job_id: &str, request_id: &str, abort: AbortHandle) -> Execution {
        Execution {
            job_id: job_id.into(),
            request_id: request_id.into(),
            job_type: "noop".into(),
            record: ExecRecord { job: JobId::new(), task_id: "t".into(), attempt: 1 },
            abort,
        }
    }

    #[tokio::test]
    async fn executions_account_for_their_slots() {
        let mut tasks = JoinSet::new();
        let mut executions = Executions::new(2);
        assert_eq!(executions.admit("a"), Admission::Admit);
        let a = pending_task(&mut tasks).await;
        let a_id = a.id();
        executions.insert(execution("a", "r1", a));
        assert_eq!(executions.admit("a"), Admission::AlreadyRunning);
        assert_eq!(executions.admit("b"), Admission::Admit);
        executions.insert(execution("b", "r2", pending_task(&mut tasks).await));
        assert_eq!(executions.admit("c"), Admission::AtCapacity);
        assert_eq!(executions.used(), 2);

        let heartbeat = heartbeat_message("w1", &executions, 1);
        assert_eq!((heartbeat.execution_slots_used, heartbeat.execution_slots_total), (2, 2));
        assert_eq!((heartbeat.detection_slots_used, heartbeat.detection_slots_total), (0, 1));
        let work: Vec<(&str, i32, i32)> =
            heartbeat.running_work.iter().map(|w| (w.work_id.as_str(), w.kind, w.state)).collect();
        let (execution_kind, running) = (WorkKind::Execution as i32, JobState::Running as i32);
        assert_eq!(work, [("a", execution_kind, running), ("b", execution_kind, running)]);

        assert_eq!(executions.find("r2").map(|e| e.job_id.as_str()), Some("b"));
        assert_eq!(executions.find("a").map(|e| e.job_id.as_str()), Some("a"));
        assert!(executions.find("zzz").is_none());
        assert_eq!(executions.remove_task(a_id).map(|e| e.job_id), Some("a".to_string()));
        assert!(executions.remove_task(a_id).is_none());
        assert_eq!(executions.admit("c"), Admission::Admit);
        assert!(executions.remove("b").is_some());
        assert_eq!(executions.used(), 0);
        assert_eq!(executions.admit("c"), Admission::Admit);
        tasks.shutdown().await;
    }

    #[test]
    fn three_tries_to_reconnect_fit_in_any_lease() {
        for lease_ms in [400, 1_000, 3_000, 10_000, 60_000, 600_000] {
            let lease = Duration::from_millis(lease_ms);
            for _ in 0..50 {
                let mut pauses = reconnect_pauses(lease);
                let three: Duration = (0..3).map(|_| pauses.next_pause()).sum();
                assert!(three < lease, "three pauses take {three:?}, the lease is {lease:?}");
            }
            let mut pauses = reconnect_pauses(lease);
            let most = (0..20).map(|_| pauses.next_pause()).max().unwrap();
            assert!(most <= Duration::from_secs(30) && most <= (lease / 4).max(Duration::from_millis(100)), "{most:?}");
        }
    }

    #[test]
    fn hello_announces_every_job_type() {
        let instance = HandlerId::new();
        let hello = hello_message("w1", instance, &[Arc::from("noop"), Arc::from("shell")], 3, DEFAULT_LEASE);
        assert_eq!(hello.worker_id, "w1");
        assert_eq!(hello.worker_instance_id, instance.to_string());
        assert_eq!(hello.protocol_version, "1");
        assert_eq!(hello.worker_version, env!("CARGO_PKG_VERSION"));
        assert_eq!(hello.metadata.get("runtime").map(String::as_str), Some("jobcenter"));
        let capabilities: Vec<(&str, bool, bool, i32, i32)> = hello
            .capabilities
            .iter()
            .map(|c| {
                (
                    c.job_type.as_str(),
                    c.can_detect,
                    c.can_execute,
                    c.max_detection_concurrency,
                    c.max_execution_concurrency,
                )
            })
            .collect();
        assert_eq!(capabilities, [("noop", false, true, 0, 3), ("shell", false, true, 0, 3)]);
        assert_eq!(hello.capabilities[1].display_name, "Shell command");

        let message = envelope("w1", Timestamp(1_500), Body::Hello(hello));
        assert_eq!(message.worker_id, "w1");
        assert_eq!(message.sent_at, Some(prost_types::Timestamp { seconds: 1, nanos: 500_000_000 }));
    }

    #[test]
    fn schema_responses() {
        let response = schema_response("q1".into(), "shell", true, 4);
        assert!(response.success);
        let descriptor = response.job_type_descriptor.expect("a descriptor");
        assert_eq!((descriptor.job_type.as_str(), descriptor.descriptor_version), ("shell", 1));
        let defaults = descriptor.admin_runtime_defaults.expect("runtime defaults");
        assert!(defaults.enabled);
        assert_eq!(defaults.per_worker_execution_concurrency, 1024);
        assert_eq!(defaults.global_execution_concurrency, 1024);
        assert_eq!(defaults.job_type_max_runtime_seconds, 1800);
        assert_eq!(defaults.detection_timeout_seconds, 45);

        let response = schema_response("q2".into(), "vacuum", false, 4);
        assert_eq!((response.request_id.as_str(), response.success), ("q2", false));
        assert_eq!(response.error_message, "job type \"vacuum\" is not served by this worker");
        assert!(response.job_type_descriptor.is_none());
    }

    fn output_lines(completed: &JobCompleted) -> Vec<String> {
        let result = completed.result.as_ref().expect("a result");
        match &result.output_values.get("output").and_then(|v| v.kind.clone()) {
            Some(config_value::Kind::StringList(list)) => list.values.clone(),
            other => panic!("output is {other:?}"),
        }
    }

    #[test]
    fn completions_carry_outcome_and_output() {
        let now = Timestamp(2_000);
        let done = job_completed(
            "r".into(),
            "j".into(),
            "shell".into(),
            Outcome::Succeeded { output: vec!["a".into(), "b".into()] },
            now,
        );
        assert!(done.success && done.error_message.is_empty());
        assert_eq!(output_lines(&done), ["a", "b"]);
        assert_eq!(done.result.as_ref().unwrap().summary, "succeeded");
        assert_eq!(done.completed_at, Some(prost_types::Timestamp { seconds: 2, nanos: 0 }));

        let failed = job_completed(
            "r".into(),
            "j".into(),
            "shell".into(),
            Outcome::Failed { error: "exit 3".into(), output: vec!["x".into()] },
            now,
        );
        assert_eq!((failed.success, failed.error_message.as_str()), (false, "exit 3"));
        assert_eq!(output_lines(&failed), ["x"]);

        let canceled =
            job_completed("r".into(), "j".into(), "noop".into(), Outcome::Canceled { reason: "stop".into() }, now);
        assert_eq!((canceled.success, canceled.error_message.as_str()), (false, "canceled: stop"));
        assert!(output_lines(&canceled).is_empty());

        let refused = refusal("r".into(), "j".into(), "noop".into(), wire::AT_CAPACITY.into(), now);
        assert_eq!((refused.success, refused.error_message.as_str()), (false, "executor is at capacity"));
        assert!(refused.result.is_none());
    }

    #[test]
    fn task_context_from_an_attempt_id() {
        let task = TaskRef { job: JobId::new(), idx: TaskIdx(7) };
        let mut job =
            spec(&AttemptId::new(task, 3).to_string(), "shell", serde_json::json!({"command": "true", "n": 2}));
        job.labels = HashMap::from([
            (TASK_ID_LABEL.to_string(), "vacuum 7".to_string()),
            (JOB_NAME_LABEL.to_string(), "nightly".to_string()),
            ("volume_id".to_string(), "7".to_string()),
        ]);
        let ctx = task_context(&job, 9);
        assert_eq!((ctx.task, ctx.job, ctx.attempt), (task, task.job, 3));
        assert_eq!((&*ctx.task_id, ctx.job_name.as_str(), &*ctx.job_type), ("vacuum_7", "nightly", "shell"));
        assert_eq!(ctx.parameters, serde_json::json!({"command": "true", "n": 2}));
        assert_eq!(ctx.labels, BTreeMap::from([("volume_id".to_string(), "7".to_string())]));

        job.labels.clear();
        job.summary = "a summary".into();
        let ctx = task_context(&job, 9);
        assert_eq!((&*ctx.task_id, ctx.job_name.as_str()), ("7", "a summary"));
    }

    #[test]
    fn task_context_from_a_foreign_job_id() {
        let ctx = task_context(&spec("vacuum-42", "noop", serde_json::json!({})), 2);
        assert_eq!(ctx.task.job, JobId(uuid::Uuid::nil()));
        assert_eq!((&*ctx.task_id, ctx.attempt), ("vacuum-42", 2));
        assert_eq!(task_context(&spec("", "noop", serde_json::json!({})), 0).attempt, 1);
        assert_eq!(&*task_context(&spec(" ", "noop", serde_json::json!({})), 0).task_id, "-");
    }

    #[test]
    fn stream_uris() {
        assert_eq!(grpc_uri("127.0.0.1:33646").unwrap(), "http://127.0.0.1:33646");
        assert_eq!(grpc_uri("[::1]:33646").unwrap(), "http://[::1]:33646");
        assert_eq!(grpc_uri("::1:33646").unwrap(), "http://[::1]:33646");
        assert!(grpc_uri("nowhere").is_err());
    }

    #[test]
    fn default_worker_ids_are_one_word() {
        let id = default_worker_id();
        assert!(id.starts_with("jobcenter-worker-") && id.len() > "jobcenter-worker-".len(), "{id}");
        assert!(!id.contains(char::is_whitespace), "{id}");
    }

    #[test]
    fn invalid_tokens_are_refused() {
        assert!(bearer("abc.DEF-123").is_ok());
        assert!(bearer("line\nbreak").is_err());
    }

    // A fake admin: the worker stream's server side, driven by the test.

    struct FakeSession {
        authorization: Option<String>,
        /// What the worker sends, read off its stream as it comes.
        from_worker: mpsc::UnboundedReceiver<Result<WorkerToAdminMessage, Status>>,
        to_worker: mpsc::Sender<Result<AdminToWorkerMessage, Status>>,
        /// Messages read while looking for a heartbeat, in order.
        queued: std::collections::VecDeque<Body>,
        /// While set, every heartbeat (and the hello) is answered with a
        /// renewal naming it, as a jobcenter admin answers them.
        renewing: Arc<std::sync::atomic::AtomicBool>,
    }

    impl FakeSession {
        fn new(
            authorization: Option<String>,
            mut stream: Streaming<WorkerToAdminMessage>,
            to_worker: mpsc::Sender<Result<AdminToWorkerMessage, Status>>,
        ) -> FakeSession {
            let renewing = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let (tx, from_worker) = mpsc::unbounded_channel();
            let (renews, renewals) = (renewing.clone(), to_worker.clone());
            tokio::spawn(async move {
                while let Some(message) = stream.next().await {
                    if let Ok(WorkerToAdminMessage { body: Some(Body::Heartbeat(heartbeat)), .. }) = &message {
                        let number = heartbeat.metadata.get(wire::HEARTBEAT_METADATA).and_then(|n| n.parse().ok());
                        if let (Some(number), true) = (number, renews.load(std::sync::atomic::Ordering::SeqCst)) {
                            let renewal = AdminToWorkerMessage {
                                request_id: wire::lease_renewal(number),
                                sent_at: None,
                                body: None,
                            };
                            let _ = renewals.send(Ok(renewal)).await;
                        }
                    }
                    if tx.send(message).is_err() {
                        return;
                    }
                }
            });
            FakeSession { authorization, from_worker, to_worker, queued: Default::default(), renewing }
        }

        async fn next_raw(&mut self) -> Body {
            let message = tokio::time::timeout(Duration::from_secs(10), self.from_worker.recv())
                .await
                .expect("a message within 10 s")
                .expect("the stream is open")
                .expect("a message");
            assert_eq!(message.worker_id, "w-test");
            assert!(message.sent_at.is_some());
            message.body.expect("a body")
        }

        /// The next message that is not a heartbeat: heartbeats (coalesced by
        /// the worker) come whenever they come, and are read on their own.
        async fn recv(&mut self) -> Body {
            if let Some(body) = self.queued.pop_front() {
                return body;
            }
            loop {
                match self.next_raw().await {
                    Body::Heartbeat(_) => continue,
                    body => return body,
                }
            }
        }

        /// Waits for a heartbeat that satisfies `check`, keeping other messages for `recv`.
        async fn heartbeat_where(&mut self, check: impl Fn(&WorkerHeartbeat) -> bool) -> WorkerHeartbeat {
            loop {
                match self.next_raw().await {
                    Body::Heartbeat(heartbeat) if check(&heartbeat) => return heartbeat,
                    Body::Heartbeat(_) => continue,
                    body => self.queued.push_back(body),
                }
            }
        }

        /// Renews the worker's lease as a jobcenter admin does: as of its
        /// hello now, then as of each heartbeat, until the renewal is ended.
        async fn renew(&self) -> Renewing {
            self.renewing.store(true, std::sync::atomic::Ordering::SeqCst);
            self.send(&wire::lease_renewal(0), None).await;
            Renewing(self.renewing.clone())
        }

        async fn send(&self, request_id: &str, body: Option<AdminBody>) {
            let message = AdminToWorkerMessage { request_id: request_id.into(), sent_at: None, body };
            self.to_worker.send(Ok(message)).await.expect("the worker listens");
        }

        async fn hello(&mut self) -> WorkerHello {
            match self.recv().await {
                Body::Hello(hello) => hello,
                other => panic!("expected a hello, got {other:?}"),
            }
        }

        async fn heartbeat(&mut self) -> WorkerHeartbeat {
            self.heartbeat_where(|_| true).await
        }

        async fn ack(&mut self) -> WorkerAcknowledge {
            match self.recv().await {
                Body::Acknowledge(ack) => ack,
                other => panic!("expected an acknowledgement, got {other:?}"),
            }
        }

        async fn completed(&mut self) -> JobCompleted {
            match self.recv().await {
                Body::JobCompleted(completed) => completed,
                other => panic!("expected a completion, got {other:?}"),
            }
        }

        async fn execute(&self, request_id: &str, job: JobSpec, timeout_seconds: i32) {
            let admin_runtime = AdminRuntimeConfig { execution_timeout_seconds: timeout_seconds, ..Default::default() };
            let request = ExecuteJobRequest {
                request_id: request_id.into(),
                job: Some(job),
                admin_runtime: Some(admin_runtime),
                attempt: 1,
                ..Default::default()
            };
            self.send(request_id, Some(AdminBody::ExecuteJobRequest(request))).await;
        }

        /// Expects an accepted execution: acknowledgement and "started".
        async fn started(&mut self, request_id: &str, job_id: &str) {
            let ack = self.ack().await;
            assert_eq!((ack.request_id.as_str(), ack.accepted), (request_id, true));
            let Body::JobProgressUpdate(progress) = self.recv().await else { panic!("expected progress") };
            assert_started(&progress, request_id, job_id);
        }

        /// Expects an accepted execution that may end before its start is
        /// reported: acknowledgement, "started" if it was still running, and
        /// its outcome.
        async fn ran(&mut self, request_id: &str, job_id: &str) -> JobCompleted {
            let ack = self.ack().await;
            assert_eq!((ack.request_id.as_str(), ack.accepted), (request_id, true));
            match self.recv().await {
                Body::JobProgressUpdate(progress) => {
                    assert_started(&progress, request_id, job_id);
                    self.completed().await
                }
                Body::JobCompleted(completed) => completed,
                other => panic!("expected a start or an outcome, got {other:?}"),
            }
        }
    }

    struct FakeAdmin {
        sessions: mpsc::UnboundedSender<FakeSession>,
    }

    /// A fake admin's renewing of a lease, ended by `abort`.
    struct Renewing(Arc<std::sync::atomic::AtomicBool>);

    impl Renewing {
        fn abort(&self) {
            self.0.store(false, std::sync::atomic::Ordering::SeqCst);
        }
    }

    #[tonic::async_trait]
    impl PluginControlService for FakeAdmin {
        type WorkerStreamStream = ReceiverStream<Result<AdminToWorkerMessage, Status>>;

        async fn worker_stream(
            &self,
            request: Request<Streaming<WorkerToAdminMessage>>,
        ) -> Result<Response<Self::WorkerStreamStream>, Status> {
            let authorization = request.metadata().get("authorization").and_then(|v| v.to_str().ok()).map(String::from);
            let (to_worker, outbound) = mpsc::channel(64);
            let session = FakeSession::new(authorization, request.into_inner(), to_worker);
            self.sessions.send(session).map_err(|_| Status::unavailable("test over"))?;
            Ok(Response::new(ReceiverStream::new(outbound)))
        }
    }

    /// Answers `GET /api/plugin/status` with the stream's port, as the admin does.
    async fn serve_plugin_status(listener: tokio::net::TcpListener, grpc_port: u16) {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buffer = [0u8; 1024];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < 16 * 1024 {
                    match socket.read(&mut buffer).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => request.extend_from_slice(&buffer[..n]),
                    }
                }
                let body = format!("{{\"worker_grpc_port\": {grpc_port}}}");
                let response = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = socket.write_all(response.as_bytes()).await;
            });
        }
    }

    /// Starts a fake admin and returns its HTTP address and its sessions.
    async fn start_fake_admin() -> (String, mpsc::UnboundedReceiver<FakeSession>) {
        let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let grpc_port = grpc.local_addr().unwrap().port();
        let (sessions, accepted) = mpsc::unbounded_channel();
        let service = PluginControlServiceServer::new(FakeAdmin { sessions });
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(grpc)),
        );
        let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let http_address = http.local_addr().unwrap().to_string();
        tokio::spawn(serve_plugin_status(http, grpc_port));
        (http_address, accepted)
    }

    async fn next_session(sessions: &mut mpsc::UnboundedReceiver<FakeSession>) -> FakeSession {
        tokio::time::timeout(Duration::from_secs(10), sessions.recv())
            .await
            .expect("a connection within 10 s")
            .expect("the fake admin runs")
    }

    fn assert_started(progress: &JobProgressUpdate, request_id: &str, job_id: &str) {
        assert_eq!((progress.request_id.as_str(), progress.job_id.as_str()), (request_id, job_id));
        assert_eq!((progress.state, progress.stage.as_str()), (JobState::Running as i32, "started"));
    }

    /// A worker's options for the fake admin at `admin`, an hour between heartbeats.
    fn options_for(admin: String, max_execute: u32) -> RemoteWorkerOptions {
        RemoteWorkerOptions {
            admins: vec![admin],
            worker_id: "w-test".into(),
            max_execute,
            max_detect: 1,
            heartbeat: Duration::from_secs(3600),
            lease: DEFAULT_LEASE,
            token: None,
            exec_log: None,
            tls: Default::default(),
        }
    }

    /// Runs a worker with the built-in handlers until the sender is used or dropped.
    fn start_worker(
        options: RemoteWorkerOptions,
    ) -> (oneshot::Sender<()>, tokio::task::JoinHandle<Result<(), InvalidOptions>>) {
        let (stop, stopped) = oneshot::channel::<()>();
        let worker = tokio::spawn(run(options, Registry::new(builtin_handlers()), async move {
            let _ = stopped.await;
        }));
        (stop, worker)
    }

    fn accepted_hello() -> Option<AdminBody> {
        Some(AdminBody::Hello(AdminHello {
            accepted: true,
            message: String::new(),
            heartbeat_interval_seconds: 3600,
            reconnect_delay_seconds: 0,
        }))
    }

    async fn wait_for_file(path: &Path) -> String {
        for _ in 0..500 {
            if let Ok(text) = std::fs::read_to_string(path) {
                if text.ends_with('\n') {
                    return text;
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("{} never appeared", path.display());
    }

    async fn process_ends(pid: &str) -> bool {
        for _ in 0..250 {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // Gone, or a zombie waiting for its parent to reap it.
            if stat.is_empty() || stat.split(' ').nth(2) == Some("Z") {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    }

    #[tokio::test]
    async fn an_execution_that_ends_in_its_first_turn_reports_its_outcome_without_a_start() {
        let (admin, mut sessions) = start_fake_admin().await;
        let (stop, worker) = start_worker(options_for(admin, 4));
        let mut session = next_session(&mut sessions).await;
        session.hello().await;
        session.send("", accepted_hello()).await;
        session.heartbeat().await;

        let job = JobId::new();
        let quick = AttemptId::new(TaskRef { job, idx: TaskIdx(0) }, 1).to_string();
        session.execute("r1", spec(&quick, "noop", serde_json::json!({})), 0).await;
        let ack = session.ack().await;
        assert_eq!((ack.request_id.as_str(), ack.accepted), ("r1", true));
        let done = session.completed().await;
        assert_eq!((done.job_id.as_str(), done.success), (quick.as_str(), true));

        // One still running after its first turn reports its start first.
        let slow = AttemptId::new(TaskRef { job, idx: TaskIdx(1) }, 1).to_string();
        session.execute("r2", spec(&slow, "noop", serde_json::json!({"sleep_ms": 300})), 0).await;
        session.started("r2", &slow).await;
        let done = session.completed().await;
        assert_eq!((done.job_id.as_str(), done.success), (slow.as_str(), true));

        stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(10), worker).await.expect("the worker stops").unwrap().unwrap();
    }

    #[tokio::test]
    async fn serves_an_admin_over_the_worker_stream() {
        let dir = tempfile::tempdir().unwrap();
        let (admin, mut sessions) = start_fake_admin().await;
        let log_path = dir.path().join("exec.log");
        let options = RemoteWorkerOptions {
            token: Some("s3cret".into()),
            exec_log: Some(ExecLog::open(&log_path).unwrap()),
            ..options_for(admin, 1)
        };
        let (stop, worker) = start_worker(options);

        // A refused hello: the worker comes back, as the same process.
        let mut session = next_session(&mut sessions).await;
        assert_eq!(session.authorization.as_deref(), Some("Bearer s3cret"));
        let first_hello = session.hello().await;
        assert_eq!(first_hello.capabilities.len(), 2);
        let refusal = AdminHello { accepted: false, message: "not now".into(), ..AdminHello::default() };
        session.send("", Some(AdminBody::Hello(refusal))).await;
        let mut session = next_session(&mut sessions).await;
        assert_eq!(session.hello().await.worker_instance_id, first_hello.worker_instance_id);
        session.send("", accepted_hello()).await;
        let heartbeat = session.heartbeat().await;
        assert_eq!((heartbeat.execution_slots_used, heartbeat.execution_slots_total), (0, 1));

        // Schemas.
        let schema = |job_type: &str| {
            Some(AdminBody::RequestConfigSchema(RequestConfigSchema {
                job_type: job_type.into(),
                force_refresh: false,
            }))
        };
        session.send("q1", schema("shell")).await;
        let Body::ConfigSchemaResponse(response) = session.recv().await else { panic!("expected a schema") };
        assert_eq!((response.request_id.as_str(), response.success), ("q1", true));
        session.send("q2", schema("vacuum")).await;
        let Body::ConfigSchemaResponse(response) = session.recv().await else { panic!("expected a schema") };
        assert_eq!((response.request_id.as_str(), response.success), ("q2", false));

        // One slot: a long execution takes it; the next is refused, the same one is not run twice.
        let sleepy = TaskRef { job: JobId::new(), idx: TaskIdx(0) };
        let sleepy_id = AttemptId::new(sleepy, 1).to_string();
        let mut sleepy_spec = spec(&sleepy_id, "noop", serde_json::json!({"sleep_ms": 60_000}));
        sleepy_spec.labels.insert(TASK_ID_LABEL.into(), "sleepy".into());
        session.execute("r1", sleepy_spec.clone(), 0).await;
        session.started("r1", &sleepy_id).await;
        let other = AttemptId::new(TaskRef { job: sleepy.job, idx: TaskIdx(1) }, 1).to_string();
        session.execute("r2", spec(&other, "noop", serde_json::json!({})), 0).await;
        let refused = session.completed().await;
        assert_eq!((refused.request_id.as_str(), refused.job_id.as_str()), ("r2", other.as_str()));
        assert_eq!((refused.success, refused.error_message.as_str()), (false, wire::AT_CAPACITY));
        session.execute("r3", spec(&other, "vacuum", serde_json::json!({})), 0).await;
        let refused = session.completed().await;
        assert_eq!((refused.success, refused.error_message.as_str()), (false, "unknown job type vacuum"));
        session.execute("r4", sleepy_spec, 0).await;
        let ack = session.ack().await;
        assert_eq!((ack.request_id.as_str(), ack.accepted), ("r4", false));

        // Cancels, by request id; an unknown target is refused.
        let cancel = |target: &str| {
            Some(AdminBody::CancelRequest(CancelRequest {
                target_id: target.into(),
                reason: "stop".into(),
                ..CancelRequest::default()
            }))
        };
        session.send("c1", cancel("r1")).await;
        let ack = session.ack().await;
        assert_eq!((ack.request_id.as_str(), ack.accepted), ("c1", true));
        let canceled = session.completed().await;
        assert_eq!((canceled.request_id.as_str(), canceled.job_id.as_str()), ("r1", sleepy_id.as_str()));
        assert_eq!((canceled.success, canceled.error_message.as_str()), (false, "canceled: stop"));
        session.heartbeat_where(|h| h.execution_slots_used == 0).await;
        session.send("c2", cancel("nothing")).await;
        let ack = session.ack().await;
        assert_eq!((ack.request_id.as_str(), ack.accepted), ("c2", false));

        // A command runs to its end; another one runs into the admin's timeout.
        let echo_id = AttemptId::new(TaskRef { job: sleepy.job, idx: TaskIdx(2) }, 1).to_string();
        session.execute("r5", spec(&echo_id, "shell", serde_json::json!({"command": "echo hi"})), 0).await;
        let done = session.ran("r5", &echo_id).await;
        assert_eq!((done.request_id.as_str(), done.success), ("r5", true), "{done:?}");
        assert_eq!(output_lines(&done), ["hi"]);
        session.heartbeat_where(|h| h.execution_slots_used == 0).await;
        let slow_id = AttemptId::new(TaskRef { job: sleepy.job, idx: TaskIdx(3) }, 2).to_string();
        session.execute("r6", spec(&slow_id, "noop", serde_json::json!({"sleep_ms": 60_000})), 1).await;
        session.started("r6", &slow_id).await;
        let timed_out = session.completed().await;
        assert_eq!((timed_out.success, timed_out.error_message.as_str()), (false, "execution timed out after 1 s"));
        session.heartbeat_where(|h| h.execution_slots_used == 0).await;

        // What this worker does not do.
        session.send("u1", None).await;
        let ack = session.ack().await;
        assert_eq!((ack.request_id.as_str(), ack.accepted, ack.message.as_str()), ("u1", false, "unsupported request"));
        let detection = RunDetectionRequest { job_type: "noop".into(), ..RunDetectionRequest::default() };
        session.send("d1", Some(AdminBody::RunDetectionRequest(detection))).await;
        let Body::DetectionComplete(detection) = session.recv().await else { panic!("expected a detection end") };
        assert_eq!((detection.request_id.as_str(), detection.success), ("d1", false));

        // A broken stream ends the running execution and its processes; the worker comes back.
        let pid_file = dir.path().join("pid");
        let command = format!("echo $$ > {}; exec sleep 30", pid_file.display());
        let lost_id = AttemptId::new(TaskRef { job: sleepy.job, idx: TaskIdx(4) }, 1).to_string();
        session.execute("r7", spec(&lost_id, "shell", serde_json::json!({"command": command})), 0).await;
        session.started("r7", &lost_id).await;
        let pid = wait_for_file(&pid_file).await.trim().to_string();
        drop(session);
        assert!(process_ends(&pid).await, "the command {pid} outlived the stream");
        let mut session = next_session(&mut sessions).await;
        assert_eq!(session.hello().await.worker_instance_id, first_hello.worker_instance_id);
        session.send("", accepted_hello()).await;
        session.heartbeat().await;

        // After the admin's shutdown, no more work.
        let shutdown = AdminShutdown { reason: "restart".into(), grace_period_seconds: 0 };
        session.send("s1", Some(AdminBody::Shutdown(shutdown))).await;
        let ack = session.ack().await;
        assert_eq!((ack.request_id.as_str(), ack.accepted), ("s1", true));
        session.execute("r8", spec(&other, "noop", serde_json::json!({})), 0).await;
        assert_eq!(session.completed().await.error_message, wire::AT_CAPACITY);

        stop.send(()).unwrap();
        let result = tokio::time::timeout(Duration::from_secs(10), worker).await.expect("the worker stops");
        result.unwrap().unwrap();

        let log = std::fs::read_to_string(&log_path).unwrap();
        let job = sleepy.job;
        let expected = format!(
            "{job} sleepy 1 start\n{job} sleepy 1 canceled\n{job} 2 1 start\n{job} 2 1 succeeded\n\
             {job} 3 2 start\n{job} 3 2 failed\n{job} 4 1 start\n"
        );
        assert_eq!(log, expected);
    }

    #[tokio::test]
    async fn with_a_renewing_admin_executions_outlive_the_stream_until_the_lease_runs_out() {
        let dir = tempfile::tempdir().unwrap();
        let (admin, mut sessions) = start_fake_admin().await;
        let log_path = dir.path().join("exec.log");
        let options = RemoteWorkerOptions {
            lease: Duration::from_secs(2),
            exec_log: Some(ExecLog::open(&log_path).unwrap()),
            ..options_for(admin, 2)
        };
        let (stop, worker) = start_worker(options);

        let mut session = next_session(&mut sessions).await;
        let hello = session.hello().await;
        assert_eq!(hello.metadata.get(wire::LEASE_METADATA).map(String::as_str), Some("2000"));
        session.send("", accepted_hello()).await;
        let renewing = session.renew().await;
        let job = JobId::new();
        let short = AttemptId::new(TaskRef { job, idx: TaskIdx(0) }, 1).to_string();
        session.execute("r1", spec(&short, "noop", serde_json::json!({"sleep_ms": 700})), 0).await;
        session.started("r1", &short).await;
        // The stream breaks: the execution goes on, and ends while the worker is away.
        renewing.abort();
        drop(session);
        let mut session = next_session(&mut sessions).await;
        session.hello().await;
        session.send("", accepted_hello()).await;
        let renewing = session.renew().await;
        // What ended while away comes first, then the heartbeat of what still runs.
        let reported = session.completed().await;
        assert_eq!((reported.job_id.as_str(), reported.success), (short.as_str(), true), "{reported:?}");
        let heartbeat = session.heartbeat().await;
        assert!(heartbeat.running_work.is_empty(), "{heartbeat:?}");
        // Unacknowledged, it is reported again; acknowledged, never again.
        let again = session.completed().await;
        assert_eq!(again.job_id, short);
        let ack = AdminToWorkerMessage { request_id: wire::outcome_ack(&short, None), sent_at: None, body: None };
        session.to_worker.send(Ok(ack)).await.unwrap();

        // A long command; then no admin answers at all: after the lease it is given up.
        let pid_file = dir.path().join("pid");
        let command = format!("echo $$ > {}; exec sleep 60", pid_file.display());
        let long = AttemptId::new(TaskRef { job, idx: TaskIdx(1) }, 1).to_string();
        session.execute("r2", spec(&long, "shell", serde_json::json!({"command": command})), 0).await;
        session.started("r2", &long).await;
        let pid = wait_for_file(&pid_file).await.trim().to_string();
        renewing.abort();
        let given_up_by = Instant::now() + Duration::from_secs(5);
        let mut silent = Vec::new();
        while Instant::now() < given_up_by && !process_ends(&pid).await {
            // Connections come, and get no hello: no admin is reached.
            if let Ok(Some(session)) = tokio::time::timeout(Duration::from_millis(100), sessions.recv()).await {
                silent.push(session);
            }
        }
        assert!(process_ends(&pid).await, "the command {pid} outlived the lease");
        drop(silent);
        let mut session = next_session(&mut sessions).await;
        session.hello().await;
        session.send("", accepted_hello()).await;
        let _renewing = session.renew().await;
        let reported = session.completed().await;
        assert_eq!((reported.job_id.as_str(), reported.error_message.as_str()), (long.as_str(), wire::LEASE_EXPIRED));

        stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(10), worker).await.expect("the worker stops").unwrap().unwrap();
        let log = std::fs::read_to_string(&log_path).unwrap();
        assert_eq!(log, format!("{job} 0 1 start\n{job} 0 1 succeeded\n{job} 1 1 start\n{job} 1 1 abandoned\n"));
    }

    #[tokio::test]
    async fn a_renewal_held_up_on_the_way_renews_only_as_of_the_heartbeat_it_answers() {
        let dir = tempfile::tempdir().unwrap();
        let (admin, mut sessions) = start_fake_admin().await;
        let lease = Duration::from_secs(4);
        let (stop, worker) = start_worker(RemoteWorkerOptions { lease, ..options_for(admin, 1) });
        let mut session = next_session(&mut sessions).await;
        session.hello().await;
        session.send("", accepted_hello()).await;
        let renewing = session.renew().await;
        let job = JobId::new();
        let pid_file = dir.path().join("pid");
        let command = format!("echo $$ > {}; exec sleep 60", pid_file.display());
        let long = AttemptId::new(TaskRef { job, idx: TaskIdx(0) }, 1).to_string();
        session.execute("r1", spec(&long, "shell", serde_json::json!({"command": command})), 0).await;
        session.started("r1", &long).await;
        let pid = wait_for_file(&pid_file).await.trim().to_string();
        // From here the admin answers nothing on time: the heartbeat read
        // now is renewed 0.9 s later (within the half lease after which the
        // worker gives the session up), as a network that held the renewal
        // up would deliver it.
        renewing.abort();
        let heartbeat = session.heartbeat_where(|h| !h.running_work.is_empty()).await;
        let sent = Instant::now();
        let number: u64 = heartbeat.metadata[wire::HEARTBEAT_METADATA].parse().unwrap();
        tokio::time::sleep(Duration::from_millis(900)).await;
        session.send(&wire::lease_renewal(number), None).await;
        // The lease runs from the heartbeat's departure: the command stops
        // about 4 s after it, not 4 s after the late renewal.
        assert!(process_ends(&pid).await, "the command {pid} outlived the lease");
        let stopped_after = sent.elapsed();
        assert!(
            stopped_after < lease + Duration::from_millis(500),
            "stopped {stopped_after:?} after the renewed heartbeat: the late renewal stretched the lease"
        );
        stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(10), worker).await.expect("the worker stops").unwrap().unwrap();
    }
}
