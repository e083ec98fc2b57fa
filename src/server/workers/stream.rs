//! The worker stream: one session per connected worker. It registers the
//! worker as a handler, turns the engine's work orders into execute and
//! cancel requests, and turns progress, completions and heartbeats back into
//! engine calls. When the stream ends, every attempt the worker held is lost.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

use super::registry::{KnownAttempts, Registry};
use crate::clock::Clock;
use crate::dispatch::{Assignment, HandlerSpec, Place, WorkOrder};
use crate::engine::Answer;
use crate::engine::{EngineHandle, Progress};
use crate::follower::{Loss, Outcome, Rejection};
use crate::jobfile;
use crate::model::{AttemptId, HandlerId};
use crate::proto::peer::peer_report;
use crate::proto::plugin::{
    admin_to_worker_message, plugin_control_service_server::PluginControlService, worker_to_admin_message, AdminHello,
    AdminToWorkerMessage, CancelRequest, ExecuteJobRequest, JobCompleted, JobSpec, RequestConfigSchema, WorkKind,
    WorkerHeartbeat, WorkerHello, WorkerToAdminMessage,
};
use crate::server::cluster::peer::{self, Peers, Reports};
use crate::server::cluster::Topology;
use crate::server::duties::scheduler::{self, Board};
use crate::server::duties::Duties;
use crate::server::policies::Policies;
use crate::server::seaweedfs::SeaweedFs;
use crate::server::Stats;
use crate::wire;
use crate::worker::cut;

/// How long a new stream may take to say hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Messages waiting to go out to one worker.
const OUTBOUND_QUEUE: usize = 1024;
/// Output lines kept from a worker's result, the longest line kept, and
/// the longest error kept (as the built-in handlers keep theirs); longer
/// ones are cut.
const MAX_OUTPUT_LINES: usize = 200;
const MAX_LINE_BYTES: usize = 1000;
const MAX_ERROR_BYTES: usize = 4096;
/// The most job types one worker may declare in its hello.
const MAX_CAPABILITIES: usize = 256;

type Outbound = mpsc::Sender<Result<AdminToWorkerMessage, Status>>;

#[derive(Clone)]
pub(crate) struct WorkerStreamService {
    pub(crate) sessions: Arc<WorkerSessions>,
    /// The token a worker's stream must carry, when one is set.
    requests: Arc<AtomicU64>,
}

/// What the worker sessions use, shared by them all: the registry they join
/// and the engine their workers serve; the cluster (the fence,
/// adoptions, reports to a job's leader, the borrower's wake-up); the
/// scheduler's board (detectors' messages, the activity log); the policy
/// book; the SeaweedFS cluster's context; the dispatch figures; the duties
/// a session hands its background reports to; and its settings.
pub(crate) struct WorkerSessions {
    pub(crate) engine: EngineHandle,
    pub(crate) registry: Registry,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) topology: Topology,
    pub(crate) peers: Peers,
    pub(crate) reports: Reports,
    pub(crate) board: Board,
    pub(crate) policies: Policies,
    pub(crate) seaweedfs: SeaweedFs,
    pub(crate) stats: Arc<Stats>,
    pub(crate) duties: Duties,
    pub(crate) settings: Settings,
    /// A worker lost while it ran work is a notification (`worker.lost`).
    pub(crate) notifier: Arc<crate::server::notify::Notifier>,
}

/// The server's settings a session reads.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Settings {
    /// Workers connected at once; more are refused until one leaves.
    pub(crate) max_workers: usize,
    /// How often a worker heartbeats, and a session compares what it runs.
    pub(crate) heartbeat_interval: Duration,
    /// A worker's lease must fit within both (`lease_refusal`); the first
    /// also bounds a vouch (`peer::vouch_validity`).
    pub(crate) orphan_grace: Duration,
    pub(crate) silence_timeout: Duration,
}

impl WorkerStreamService {
    pub(crate) fn new(sessions: Arc<WorkerSessions>) -> WorkerStreamService {
        WorkerStreamService { sessions, requests: Arc::default() }
    }
}

/// The handler id of a worker process: its instance id when that is a UUID,
/// otherwise a UUID derived from it (the same instance, the same handler).
pub fn handler_of(hello: &WorkerHello) -> HandlerId {
    let instance = if hello.worker_instance_id.is_empty() { &hello.worker_id } else { &hello.worker_instance_id };
    match instance.parse::<HandlerId>() {
        Ok(handler) => handler,
        Err(_) => HandlerId(uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, instance.as_bytes())),
    }
}

fn message(request_id: String, body: impl Into<Option<admin_to_worker_message::Body>>) -> AdminToWorkerMessage {
    AdminToWorkerMessage { request_id, sent_at: Some(now_timestamp()), body: body.into() }
}

fn now_timestamp() -> prost_types::Timestamp {
    let millis = crate::clock::Clock::now(&crate::clock::SystemClock).as_millis();
    prost_types::Timestamp { seconds: millis.div_euclid(1000), nanos: (millis.rem_euclid(1000) * 1_000_000) as i32 }
}

fn body_name(body: &Option<worker_to_admin_message::Body>) -> &'static str {
    use worker_to_admin_message::Body;
    match body {
        None => "an empty message",
        Some(Body::Hello(_)) => "hello",
        Some(Body::Heartbeat(_)) => "heartbeat",
        Some(Body::Acknowledge(_)) => "acknowledge",
        Some(Body::ConfigSchemaResponse(_)) => "config_schema_response",
        Some(Body::DetectionProposals(_)) => "detection_proposals",
        Some(Body::DetectionComplete(_)) => "detection_complete",
        Some(Body::JobProgressUpdate(_)) => "job_progress_update",
        Some(Body::JobCompleted(_)) => "job_completed",
        Some(Body::Observations(_)) => "observations",
        Some(Body::ObjectPreviewResponse(_)) => "object_preview_response",
    }
}

#[tonic::async_trait]
impl PluginControlService for WorkerStreamService {
    type WorkerStreamStream = Pin<Box<dyn Stream<Item = Result<AdminToWorkerMessage, Status>> + Send + 'static>>;

    async fn worker_stream(
        &self,
        request: Request<Streaming<WorkerToAdminMessage>>,
    ) -> Result<Response<Self::WorkerStreamStream>, Status> {
        if let Some(node) = self.sessions.topology.member().filter(|node| node.is_fenced()) {
            return Err(Status::unavailable(format!(
                "admin instance {} cannot reach its database and takes no workers: connect to another instance",
                node.id
            )));
        }
        let peer = request.remote_addr();
        let outbound = self.open(request.into_inner(), peer).await?;
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(outbound))))
    }
}

impl WorkerStreamService {
    /// Opens a session for a worker whose messages arrive on `inbound`: it
    /// waits for the hello, checks it, and starts the session. Returns the
    /// messages for the worker (the stream's answer), or why it is refused.
    pub(crate) async fn open<S>(
        &self,
        mut inbound: S,
        peer: Option<std::net::SocketAddr>,
    ) -> Result<mpsc::Receiver<Result<AdminToWorkerMessage, Status>>, Status>
    where
        S: Stream<Item = Result<WorkerToAdminMessage, Status>> + Unpin + Send + 'static,
    {
        let first = match tokio::time::timeout(HELLO_TIMEOUT, inbound.next()).await {
            Err(_) => return Err(Status::deadline_exceeded("no hello within 10 s: the first message must be hello")),
            Ok(Some(Err(status))) => return Err(status),
            Ok(None) => return Err(Status::cancelled("the stream ended before hello")),
            Ok(Some(Ok(first))) => first,
        };
        let hello = match first.body {
            Some(worker_to_admin_message::Body::Hello(hello)) => hello,
            other => {
                return Err(Status::failed_precondition(format!(
                    "protocol: the first message must be hello, not {}",
                    body_name(&other)
                )))
            }
        };
        if hello.worker_id.is_empty() && hello.worker_instance_id.is_empty() {
            return Err(Status::invalid_argument("hello: worker_id and worker_instance_id are both empty"));
        }
        if hello.capabilities.len() > MAX_CAPABILITIES {
            return Err(Status::invalid_argument(format!(
                "hello: {} capabilities, the most a worker may declare is {MAX_CAPABILITIES}",
                hello.capabilities.len()
            )));
        }
        for (n, capability) in hello.capabilities.iter().enumerate() {
            if !jobfile::is_job_type(&capability.job_type) {
                return Err(Status::invalid_argument(format!(
                    "hello: capability #{n} has job type {:?}; a job type is 1 to 128 ASCII letters, digits, _ - or .",
                    capability.job_type
                )));
            }
        }
        let lease = wire::lease_of(&hello.metadata).map_err(Status::invalid_argument)?;
        if self.sessions.registry.len() >= self.sessions.settings.max_workers {
            return Err(Status::resource_exhausted(format!(
                "{} workers are connected, the most this admin takes; try again later",
                self.sessions.settings.max_workers
            )));
        }
        let (outbound, receiver) = mpsc::channel(OUTBOUND_QUEUE);
        if let Some(refusal) = lease.and_then(|lease| lease_refusal(&self.sessions.settings, lease)) {
            tracing::warn!(worker.id = %hello.worker_id, %refusal, "worker refused");
            let body = admin_to_worker_message::Body::Hello(AdminHello {
                accepted: false,
                message: refusal,
                heartbeat_interval_seconds: 0,
                reconnect_delay_seconds: 30,
            });
            let _ = outbound.try_send(Ok(message(String::new(), body)));
            return Ok(receiver);
        }
        let handler = handler_of(&hello);
        let renewals = outbound.clone();
        let session = Session {
            sessions: self.sessions.clone(),
            requests: self.requests.clone(),
            handler,
            place: place_of(&hello, peer),
            hello,
            lease,
            outbound,
            pending_schema: HashMap::new(),
            reported_slots: None,
            connected_at: self.sessions.clock.now(),
            reconciled_at: None,
            adoptions_seen: 0,
            lent: std::sync::Mutex::default(),
            known: self.sessions.topology.member().map(|_| KnownAttempts::default()),
            renewed_at: tokio::time::Instant::now(),
            cover: lease.map(|lease| super::cover::Cover::new(self.sessions.clone(), handler, lease, renewals.clone())),
        };
        tokio::spawn(session.run(inbound));
        Ok(receiver)
    }
}

/// Why a worker's lease does not fit this admin's timeouts, if it does not:
/// the admin must wait for a disconnected worker longer than the worker
/// keeps running without an admin, or one attempt could run twice at once.
fn lease_refusal(settings: &Settings, lease: Duration) -> Option<String> {
    let wait = wire::take_back_after(lease);
    let (limit, option) = if settings.orphan_grace <= settings.silence_timeout {
        (settings.orphan_grace, "--orphan-grace")
    } else {
        (settings.silence_timeout, "--silence-timeout")
    };
    (wait >= limit).then(|| {
        format!(
            "the worker's lease of {:.1} s does not fit this admin: it keeps a disconnected worker's attempts for \
             {:.1} s, which must be shorter than {option} ({:.1} s); give the worker a shorter --lease, or the \
             admin a longer {option}",
            lease.as_secs_f64(),
            wait.as_secs_f64(),
            limit.as_secs_f64()
        )
    })
}

/// Where a worker runs: the host of the address it gives (else of its
/// connection) and the rack its metadata names.
fn place_of(hello: &WorkerHello, peer: Option<std::net::SocketAddr>) -> Place {
    let host = Place::host_of(&hello.address).or_else(|| peer.map(|p| Arc::from(p.ip().to_string().as_str())));
    let rack = hello.metadata.get("rack").filter(|r| !r.is_empty()).map(|r| Arc::from(r.as_str()));
    Place { host, rack }
}

struct Session {
    sessions: Arc<WorkerSessions>,
    requests: Arc<AtomicU64>,
    handler: HandlerId,
    /// Where the worker runs.
    place: Place,
    hello: WorkerHello,
    /// The worker keeps running its work without an admin for this long
    /// (a jobcenter worker); `None` for a worker that declares none.
    lease: Option<Duration>,
    outbound: Outbound,
    /// Schema requests in flight: request id -> job type.
    pending_schema: HashMap<String, String>,
    /// The slot total the worker last reported.
    reported_slots: Option<u32>,
    connected_at: crate::clock::Timestamp,
    /// When the worker's running work was last compared with what it holds.
    reconciled_at: Option<tokio::time::Instant>,
    /// The cluster's adoption count when this session last reconciled.
    adoptions_seen: u64,
    /// Attempts other instances lent to this worker, by attempt id: the
    /// gRPC address of the instance leading each one's job.
    lent: std::sync::Mutex<foldhash::HashMap<String, Lent>>,
    /// In a cluster: the attempts this session knows, for the recovery check.
    known: Option<KnownAttempts>,
    /// When the last hello or heartbeat arrived: the worker stops its
    /// executions within its lease of the last one renewed, which is no
    /// later, so its attempts are surely stopped `take_back_after(lease)`
    /// after it.
    renewed_at: tokio::time::Instant,
    /// For a worker with a lease: whether each attempt it runs is covered,
    /// which a renewal of its lease needs.
    cover: Option<super::cover::Cover>,
}

/// An attempt another instance lent to this session's worker.
struct Lent {
    /// The gRPC address of the instance leading its job.
    leader: Arc<str>,
    /// Its leader was told it runs.
    started: bool,
}

impl Session {
    fn next_request_id(&self, kind: &str) -> String {
        format!("{kind}-{}", self.requests.fetch_add(1, Ordering::Relaxed) + 1)
    }

    async fn send(&self, message: AdminToWorkerMessage) -> bool {
        self.outbound.send(Ok(message)).await.is_ok()
    }

    /// The session from the hello to the stream's end: the worker joins the
    /// engine, gets its orders, and its attempts wait for it once it goes.
    async fn run<S>(mut self, inbound: S)
    where
        S: Stream<Item = Result<WorkerToAdminMessage, Status>> + Unpin,
    {
        let sessions = self.sessions.clone();
        let handler = self.handler;
        let (registration, previous) = sessions.registry.register(
            handler,
            &self.hello,
            sessions.clock.now(),
            Some(self.outbound.clone()),
            self.known.clone(),
        );
        if let Some(previous) = previous {
            // The same process reconnected before its old stream was noticed
            // gone: that session ends, and this one takes over its attempts.
            previous.notify_one();
        }
        let (sink, orders) = mpsc::unbounded_channel();
        if !self.join(registration.session, sink).await {
            sessions.registry.unregister(handler, registration.session);
            return;
        }
        self.end_what_it_left_behind().await;
        sessions.board.wake();
        sessions.peers.wake();
        self.learn_its_job_types().await;
        let reason = self.serve(inbound, orders, &registration.stop).await;
        tracing::info!(worker.id = %self.hello.worker_id, %handler, reason, "worker disconnected");
        sessions.registry.unregister(handler, registration.session);
        // A worker with a lease keeps running its attempts and reports them
        // when it is back; they wait for it until its lease, counted from
        // the last heartbeat renewed, has surely run out. A worker without
        // one dropped them with its stream.
        let keep_for = self.lease.map(|lease| {
            (self.renewed_at + wire::take_back_after(lease)).saturating_duration_since(tokio::time::Instant::now())
        });
        self.notify_lost(handler, &reason).await;
        if let Err(e) = sessions.engine.disconnected(handler, registration.session, keep_for, &reason).await {
            tracing::debug!(error = %e, "engine stopped before the worker's attempts were released");
        }
    }

    /// A worker whose stream ended while it held attempts is a notification,
    /// when an endpoint wants one (the engine is asked only then).
    async fn notify_lost(&self, handler: HandlerId, reason: &str) {
        let notifier = &self.sessions.notifier;
        if !notifier.routes().wants(crate::model::notify::Kind::WorkerLost) {
            return;
        }
        let Ok(held) = self.sessions.engine.attempts().await else { return };
        let attempts: Vec<serde_json::Value> = held
            .iter()
            .filter(|a| a.handler == handler)
            .map(|a| serde_json::json!({ "job": a.job.to_string(), "task": a.task_id, "attempt": a.attempt }))
            .collect();
        if attempts.is_empty() {
            return;
        }
        let payload = serde_json::json!({
            "worker": self.hello.worker_id,
            "handler": handler.to_string(),
            "reason": reason,
            "attempts": attempts,
        });
        notifier.record(crate::model::notify::Kind::WorkerLost, payload).await;
    }

    /// What the worker's hello declares, as the engine's dispatch takes a handler.
    fn handler_spec(&self, session: u64, sink: crate::dispatch::Sink) -> HandlerSpec {
        let executes = self.hello.capabilities.iter().filter(|c| c.can_execute);
        let job_types: Vec<Arc<str>> =
            executes.clone().filter(|c| !c.job_type.is_empty()).map(|c| Arc::from(c.job_type.as_str())).collect();
        let type_capacity: BTreeMap<Arc<str>, u32> = executes
            .filter(|c| c.max_execution_concurrency > 0)
            .map(|c| (Arc::from(c.job_type.as_str()), c.max_execution_concurrency as u32))
            .collect();
        let capacity = type_capacity.values().copied().max().unwrap_or(1).max(1);
        HandlerSpec {
            handler: self.handler,
            job_types: Some(job_types),
            capacity,
            type_capacity,
            starts_running: false,
            session,
            sink,
            place: self.place.clone(),
        }
    }

    /// Answers the hello (and a worker with a lease learns at once that this
    /// admin renews it) and joins the engine's dispatch; false when the
    /// worker or the engine is gone already.
    async fn join(&mut self, session: u64, sink: crate::dispatch::Sink) -> bool {
        let spec = self.handler_spec(session, sink);
        tracing::info!(
            worker.id = %self.hello.worker_id, handler = %self.handler, job_types = ?spec.job_types.as_deref().unwrap_or_default(), capacity = spec.capacity,
            "worker connected"
        );
        let hello_reply = message(
            String::new(),
            admin_to_worker_message::Body::Hello(AdminHello {
                accepted: true,
                message: format!("jobcenter {}", env!("CARGO_PKG_VERSION")),
                heartbeat_interval_seconds: self.sessions.settings.heartbeat_interval.as_secs().max(1) as i32,
                reconnect_delay_seconds: 5,
            }),
        );
        // The renewals that count come with its heartbeats, once what it
        // runs is known to be covered.
        self.renewed_at = tokio::time::Instant::now();
        let renewal = self.lease.is_some().then(|| message(wire::LEASE_RENEWAL.into(), None));
        self.send(hello_reply).await
            && renewal.is_none_or(|renewal| self.outbound.try_send(Ok(renewal)).is_ok())
            && self.sessions.engine.connected(spec).await.is_ok()
    }

    /// A worker without a lease dropped whatever it ran when its last
    /// stream broke: what it held then (under another handler: a SeaweedFS
    /// worker is a new instance at each connection) ends now, not when that
    /// handler is given up for gone.
    async fn end_what_it_left_behind(&self) {
        if self.lease.is_some() || self.hello.worker_id.is_empty() {
            return;
        }
        let name: Arc<str> = Arc::from(self.hello.worker_id.as_str());
        let Ok(ended) = self.sessions.engine.returned(self.handler, name).await else { return };
        for attempt in ended {
            let what = if attempt.from_scheduler {
                "its scheduler job is failed now, and the next detection proposes the work again"
            } else {
                "the task runs again, uncounted"
            };
            let line = format!(
                "worker {} came back without task {} of job {} (attempt {}): a SeaweedFS worker cancels what it runs when its stream breaks; {what}",
                self.hello.worker_id, attempt.task_id, attempt.attempt.task.job, attempt.attempt.number
            );
            tracing::warn!(worker.id = %self.hello.worker_id, handler = %self.handler, job.id = %attempt.attempt.task.job, task.id = %attempt.task_id, "{line}");
            self.sessions.board.record(&attempt.job_type, line);
        }
    }

    /// Each job type the worker declares takes its limits, and the worker
    /// is asked for the descriptor of any type without one.
    async fn learn_its_job_types(&mut self) {
        for capability in self.hello.capabilities.clone() {
            self.sessions.policies.push_limits(&self.sessions.engine, &capability.job_type).await;
            if !self.sessions.policies.has_descriptor(&capability.job_type) {
                let request_id = self.next_request_id("schema");
                self.pending_schema.insert(request_id.clone(), capability.job_type.clone());
                let body = admin_to_worker_message::Body::RequestConfigSchema(RequestConfigSchema {
                    job_type: capability.job_type.clone(),
                    force_refresh: false,
                });
                self.send(message(request_id, body)).await;
            }
        }
    }

    /// The worker's messages and its orders, until the session ends: says why.
    async fn serve<S>(
        &mut self,
        mut inbound: S,
        mut orders: mpsc::UnboundedReceiver<WorkOrder>,
        stop: &tokio::sync::Notify,
    ) -> String
    where
        S: Stream<Item = Result<WorkerToAdminMessage, Status>> + Unpin,
    {
        let mut fencing = self.sessions.topology.member().map(|node| node.fencing());
        loop {
            // A worker with a lease heartbeats at least every quarter of it:
            // one silent for a whole lease has stopped its executions, or
            // will before the admin takes them back.
            let silent_at = self.lease.map(|lease| self.renewed_at + lease);
            tokio::select! {
                incoming = inbound.next() => match incoming {
                    Some(Ok(message)) => {
                        if let Err(status) = self.handle(message).await {
                            let reason = status.message().to_string();
                            let _ = self.outbound.send(Err(status)).await;
                            return reason;
                        }
                    }
                    None => return "the worker closed its stream".to_string(),
                    Some(Err(status)) => {
                        // Say why before closing: a message over the size limit ends up here.
                        let reason = format!("the worker stream failed: {}", status.message());
                        let _ = self.outbound.send(Err(Status::new(status.code(), reason.clone()))).await;
                        return reason;
                    }
                },
                order = orders.recv() => match order {
                    Some(order) => {
                        if !self.send_order(order).await {
                            return "the worker stopped reading its stream".to_string();
                        }
                    }
                    None => return "the engine stopped".to_string(),
                },
                () = stop.notified() => return "the admin ended the session (the worker reconnected, or went silent)".to_string(),
                () = self.outbound.closed() => return "the worker went away".to_string(),
                () = sleep_until(silent_at), if silent_at.is_some() => {
                    return "the worker sent no heartbeat within its lease".to_string()
                }
                () = fenced(&mut fencing) => {
                    return "this admin instance cannot reach its database: the worker goes to another".to_string()
                }
            }
        }
    }

    async fn send_order(&self, order: WorkOrder) -> bool {
        match order {
            WorkOrder::Execute(assignment) => {
                if let Some(leader) = &assignment.lent_by {
                    let id = assignment.attempt.to_string();
                    self.lent.lock().expect("lent lock").insert(id, Lent { leader: leader.clone(), started: false });
                }
                let request = self.execute_request(&assignment);
                let request_id = request.request_id.clone();
                if let (Some(cover), None) = (&self.cover, &assignment.lent_by) {
                    cover.sent(assignment.attempt);
                }
                // Known from before it leaves: the worker may run it, and even
                // report on it, before this task is polled again. Unsent, the
                // session ends, and what it knows with it.
                self.note(assignment.attempt);
                let sent =
                    self.send(message(request_id, admin_to_worker_message::Body::ExecuteJobRequest(request))).await;
                if let Some(released_at) = assignment.released_at {
                    self.sessions.stats.record_dispatch(released_at.elapsed());
                }
                sent
            }
            WorkOrder::Cancel { attempt } => {
                let cancel = CancelRequest {
                    target_id: attempt.to_string(),
                    target_kind: WorkKind::Execution as i32,
                    reason: "canceled by jobcenter".into(),
                    force: false,
                };
                let request_id = self.next_request_id("cancel");
                self.send(message(request_id, admin_to_worker_message::Body::CancelRequest(cancel))).await
            }
        }
    }

    /// The session sent the attempt, or received its outcome: it knows it
    /// until the job's leader has settled its report.
    fn note(&self, attempt: AttemptId) {
        if let Some(known) = &self.known {
            known.lock().expect("known lock").note(attempt);
        }
    }

    fn execute_request(&self, assignment: &Assignment) -> ExecuteJobRequest {
        let job_id = assignment.attempt.to_string();
        let mut parameters = serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(&assignment.parameters)
            .map(|map| wire::json_to_values(&map))
            .unwrap_or_default();
        // A share of the bandwidth budget, where SeaweedFS's workers read it.
        if let Some(rate) = assignment.io_byte_per_second {
            crate::server::seaweedfs::rate::apply(&assignment.job_type, rate, &mut parameters);
        }
        let book = self.sessions.policies.for_dispatch(&assignment.job_type);
        let task_id = String::from(&*assignment.task_id);
        ExecuteJobRequest {
            request_id: ["exec-", &job_id].concat(),
            job: Some(JobSpec {
                job_id,
                job_type: String::from(&*assignment.job_type),
                dedupe_key: assignment.labels.get("dedupe_key").cloned().unwrap_or_default(),
                priority: wire::priority_to_wire(assignment.priority) as i32,
                summary: task_id.clone(),
                detail: assignment.job_name.clone(),
                parameters,
                labels: {
                    let mut labels = assignment.labels.clone();
                    labels.insert(wire::TASK_ID_LABEL.into(), task_id);
                    labels.insert(wire::JOB_NAME_LABEL.into(), assignment.job_name.clone());
                    if let Some(traceparent) = &assignment.traceparent {
                        labels.insert(wire::TRACEPARENT_LABEL.into(), traceparent.to_string());
                    }
                    labels
                },
                created_at: Some(now_timestamp()),
                scheduled_at: None,
            }),
            admin_runtime: Some(book.runtime_for(assignment.execution_timeout_seconds)),
            admin_config_values: book.admin_values.clone(),
            worker_config_values: book.worker_values.clone(),
            cluster_context: Some(self.sessions.seaweedfs.context(
                &self.sessions.policies,
                &self.sessions.registry,
                &assignment.job_type,
                true,
            )),
            attempt: i32::try_from(assignment.attempt.number).unwrap_or(i32::MAX),
        }
    }

    /// Handles one message; an error ends the stream with that status.
    async fn handle(&mut self, incoming: WorkerToAdminMessage) -> Result<(), Status> {
        use worker_to_admin_message::Body;
        let engine = &self.sessions.engine;
        self.sessions.registry.seen(self.handler, self.sessions.clock.now());
        match incoming.body {
            Some(Body::Heartbeat(heartbeat)) => {
                self.sessions.registry.heartbeat(self.handler, &heartbeat, self.sessions.clock.now());
                if let Some(known) = &self.known {
                    let running = heartbeat.running_work.iter().filter_map(|w| w.work_id.parse::<AttemptId>().ok());
                    known.lock().expect("known lock").heartbeat(running.collect());
                }
                if let Some(cover) = &self.cover {
                    // Renewed as of this heartbeat, which the worker numbers,
                    // once every attempt it lists is covered.
                    self.renewed_at = tokio::time::Instant::now();
                    let number = heartbeat.metadata.get(wire::HEARTBEAT_METADATA).and_then(|n| n.parse().ok());
                    let running = {
                        let lent = self.lent.lock().expect("lent lock");
                        heartbeat
                            .running_work
                            .iter()
                            .filter(|w| !lent.contains_key(&w.work_id))
                            .filter_map(|w| w.work_id.parse::<AttemptId>().ok())
                            .collect()
                    };
                    match number {
                        Some(number) => cover.heartbeat(number, running, wire::lease_left_of(&heartbeat.metadata)),
                        None => {
                            self.send(message(wire::LEASE_RENEWAL.into(), None)).await;
                        }
                    }
                }
                self.reconcile(&heartbeat).await;
                let total = u32::try_from(heartbeat.execution_slots_total).unwrap_or(0);
                if total > 0 && self.reported_slots != Some(total) {
                    self.reported_slots = Some(total);
                    let _ = self.sessions.engine.handler_slots(self.handler, total).await;
                }
            }
            Some(Body::JobProgressUpdate(update)) => {
                if update.job_id.is_empty() {
                    // Detection activity, not an attempt.
                    let text = update.activities.first().map(|a| a.message.clone()).unwrap_or(update.message.clone());
                    let event = scheduler::DetectionEvent::Activity(format!("{}: {text}", update.stage));
                    self.sessions.board.route(&update.request_id, event);
                    return Ok(());
                }
                let attempt = attempt_of("job_progress_update", &update.job_id)?;
                let progress = Progress {
                    percent: percent(update.progress_percent),
                    stage: update.stage.clone(),
                    message: update.message.clone(),
                };
                let lent_by = self.lent.lock().expect("lent lock").get_mut(&update.job_id).map(|l| {
                    l.started = true;
                    l.leader.clone()
                });
                if let Some(leader) = lent_by {
                    let (reports, handler, report) =
                        (self.sessions.reports.clone(), self.handler, peer::progress_report(&progress));
                    self.sessions.duties.spawn(async move {
                        reports.report_to_leader(Some(leader), handler, attempt, report).await;
                    });
                    return Ok(());
                }
                let _ = engine.progress(attempt, self.handler, progress).await;
            }
            Some(Body::JobCompleted(completed)) => self.completed(completed).await?,
            Some(Body::ConfigSchemaResponse(response)) => {
                // A descriptor is kept only as the answer to this session's
                // own request, for the job type it asked about: no worker
                // writes the policy book of a job type unasked.
                let Some(asked) = self.pending_schema.remove(&response.request_id) else {
                    return Err(Status::failed_precondition(format!(
                        "protocol: config_schema_response {:?} answers no request this session sent",
                        response.request_id
                    )));
                };
                if let Some(other) = response.job_type_descriptor.as_ref().filter(|d| d.job_type != asked) {
                    return Err(Status::failed_precondition(format!(
                        "protocol: config_schema_response {:?} describes job type {:?}, the request asked about {asked:?}",
                        response.request_id, other.job_type
                    )));
                }
                match response.job_type_descriptor {
                    Some(descriptor) if response.success => {
                        let job_type = descriptor.job_type.clone();
                        if let Err(e) = self.sessions.policies.save_descriptor(descriptor).await {
                            tracing::error!(job_type, error = %e, "cannot store a job type descriptor");
                        }
                        self.sessions.policies.push_limits(engine, &job_type).await;
                    }
                    _ => tracing::warn!(
                        job_type = response.job_type,
                        error = response.error_message,
                        "worker sent no descriptor"
                    ),
                }
            }
            Some(Body::Acknowledge(ack)) => {
                if ack.request_id.starts_with("cancel") {
                    let (handler, accepted) = (self.handler, ack.accepted);
                    tracing::info!(%handler, request_id = ack.request_id, accepted, answer = ack.message, "worker answered a cancel");
                } else if !ack.accepted {
                    tracing::debug!(request_id = ack.request_id, message = ack.message, "worker declined a request");
                }
            }
            Some(Body::Hello(_)) => {
                return Err(Status::failed_precondition("protocol: hello was already received on this stream"))
            }
            Some(Body::DetectionProposals(proposals)) => {
                let request_id = proposals.request_id.clone();
                let event = scheduler::DetectionEvent::Proposals(proposals.proposals);
                if !self.sessions.board.route(&request_id, event) {
                    tracing::debug!(handler = %self.handler, request_id, "proposals for no detection running");
                }
            }
            Some(Body::DetectionComplete(complete)) => {
                let request_id = complete.request_id.clone();
                let event =
                    scheduler::DetectionEvent::Complete { success: complete.success, error: complete.error_message };
                if !self.sessions.board.route(&request_id, event) {
                    tracing::debug!(handler = %self.handler, request_id, "completion of no detection running");
                }
            }
            Some(Body::Observations(_) | Body::ObjectPreviewResponse(_)) => {}
            None => return Err(Status::invalid_argument("protocol: a message with no body")),
        }
        Ok(())
    }

    /// Compares what the worker runs with what it holds: on its first
    /// heartbeat, attempts it was given before and no longer runs are lost
    /// (uncounted); at most once per heartbeat interval after that, attempts
    /// it runs that it does not hold (taken back while it was away) are
    /// canceled on the worker.
    async fn reconcile(&mut self, heartbeat: &WorkerHeartbeat) {
        self.report_lent_started(heartbeat);
        // Jobs adopted from another instance may hold attempts of this worker:
        // compare at once. Held attempts it does not report are not dropped
        // here: their outcomes may still be on their way.
        let adoptions = self.sessions.topology.member().map_or(0, |node| node.adoptions());
        let adopted = adoptions != self.adoptions_seen;
        self.adoptions_seen = adoptions;
        let first = self.reconciled_at.is_none();
        if !first
            && !adopted
            && self.reconciled_at.is_some_and(|at| at.elapsed() < self.sessions.settings.heartbeat_interval)
        {
            return;
        }
        self.reconciled_at = Some(tokio::time::Instant::now());
        let running = heartbeat.running_work.iter().filter_map(|w| w.work_id.parse::<AttemptId>().ok()).collect();
        let dropped_before = first.then_some(self.connected_at);
        // Outcomes this session sent on to a job's leader may come back here,
        // should the job be adopted meanwhile: what they report on is not dropped.
        let reported = match (&self.known, first) {
            (Some(known), true) => known.lock().expect("known lock").in_flight(),
            _ => HashSet::new(),
        };
        let Ok(answer) = self.sessions.engine.reconcile(self.handler, running, reported, dropped_before).await else {
            return;
        };
        let sessions = self.sessions.clone();
        let outbound = self.outbound.clone();
        let (handler, worker_id) = (self.handler, self.hello.worker_id.clone());
        tokio::spawn(async move {
            let Ok(reconciled) = answer.await else { return };
            if first && (reconciled.adopted > 0 || reconciled.dropped > 0) {
                tracing::info!(
                    worker.id = %worker_id, %handler, adopted = reconciled.adopted, dropped = reconciled.dropped,
                    "worker's running work reconciled"
                );
            }
            let mut stop = reconciled.not_held;
            for attempt in reconciled.not_led_here {
                if !keep_foreign(&sessions, attempt.task.job).await {
                    stop.push(attempt);
                }
            }
            for attempt in stop {
                tracing::warn!(worker.id = %worker_id, %handler, %attempt, "the worker runs an attempt it does not hold: canceling it");
                let cancel = CancelRequest {
                    target_id: attempt.to_string(),
                    target_kind: WorkKind::Execution as i32,
                    reason: "the attempt was taken back while the worker was away".into(),
                    force: true,
                };
                let body = admin_to_worker_message::Body::CancelRequest(cancel);
                let _ = outbound.send(Ok(message(format!("cancel-{attempt}"), body))).await;
            }
        });
    }

    /// Attempts lent by other instances that the worker now reports running:
    /// their leaders learn that they started.
    fn report_lent_started(&self, heartbeat: &WorkerHeartbeat) {
        let mut lent = self.lent.lock().expect("lent lock");
        for work in &heartbeat.running_work {
            let Some(entry) = lent.get_mut(&work.work_id).filter(|e| !e.started) else { continue };
            let Ok(attempt) = work.work_id.parse::<AttemptId>() else { continue };
            entry.started = true;
            let progress =
                Progress { percent: percent(work.progress_percent), stage: work.stage.clone(), message: String::new() };
            let (reports, handler, leader) = (self.sessions.reports.clone(), self.handler, entry.leader.clone());
            self.sessions.duties.spawn(async move {
                let report = peer::progress_report(&progress);
                reports.report_to_leader(Some(leader), handler, attempt, report).await;
            });
        }
    }

    /// The acknowledgement sent to a worker with a lease once its report is
    /// durable (or refused), so that it can forget the outcome.
    fn acknowledgement(&self, attempt_id: &str) -> Option<Answer> {
        self.lease?;
        let outbound = self.outbound.clone();
        let attempt_id = attempt_id.to_string();
        Some(Box::new(move |result: Result<(), Rejection>| {
            let refusal = result.err().map(|rejection| rejection.to_string());
            acknowledge(&outbound, &attempt_id, refusal.as_deref());
        }))
    }

    /// What to do once the engine applied or refused a report: acknowledge
    /// it; in a cluster, a report on a job not led here goes to its leader
    /// first, and is acknowledged once that one settled it.
    fn answer(&self, attempt: AttemptId, report: peer_report::Kind) -> Option<Answer> {
        let ack = self.acknowledgement(&attempt.to_string());
        self.sessions.topology.member()?;
        let sessions = self.sessions.clone();
        let (handler, outbound, lease) = (self.handler, self.outbound.clone(), self.lease.is_some());
        let known = self.known.clone();
        let runtime = tokio::runtime::Handle::current();
        Some(Box::new(move |result: Result<(), Rejection>| match result {
            Err(Rejection::UnknownJob { .. } | Rejection::JobEnded { .. }) => {
                let outbound = lease.then_some(outbound);
                runtime.spawn(settle(sessions, None, handler, attempt, report, outbound, known));
            }
            other => {
                if let Some(known) = known {
                    known.lock().expect("known lock").settled(attempt);
                }
                if let Some(ack) = ack {
                    ack(other);
                }
            }
        }))
    }

    /// A report on an attempt another instance lent: it goes to that
    /// instance (or whoever leads the job now), and the worker is answered
    /// once it is settled.
    fn settle_lent(&self, leader: Option<Arc<str>>, attempt: AttemptId, report: peer_report::Kind) {
        let outbound = self.lease.is_some().then(|| self.outbound.clone());
        let (sessions, handler, known) = (self.sessions.clone(), self.handler, self.known.clone());
        self.sessions.duties.spawn(settle(sessions, leader, handler, attempt, report, outbound, known));
    }

    async fn completed(&self, completed: JobCompleted) -> Result<(), Status> {
        let received = std::time::Instant::now();
        let engine = &self.sessions.engine;
        let attempt = attempt_of("job_completed", &completed.job_id)?;
        self.note(attempt);
        let lent_by = self.lent.lock().expect("lent lock").remove(&completed.job_id).map(|l| l.leader);
        let given_up = match completed.error_message.as_str() {
            _ if completed.success => None,
            wire::AT_CAPACITY => Some(Loss::NotCounted("the worker was at capacity".into())),
            wire::STOPPING => Some(Loss::NotCounted(wire::STOPPING.into())),
            wire::LEASE_EXPIRED => Some(Loss::WithWorker(format!("lost with its worker: {}", wire::LEASE_EXPIRED))),
            wire::UNCOVERED => Some(Loss::NotCounted(wire::UNCOVERED.into())),
            _ => None,
        };
        if let Some(loss) = given_up {
            if lent_by.is_some() {
                self.settle_lent(lent_by, attempt, peer::give_up_report(&loss));
                return Ok(());
            }
            let answer = self.answer(attempt, peer::give_up_report(&loss)).or(self.acknowledgement(&completed.job_id));
            let _ = engine.give_up(attempt, self.handler, loss, answer).await;
            return Ok(());
        }
        let mut output: Vec<String> = completed
            .result
            .as_ref()
            .and_then(|r| r.output_values.get("output"))
            .map(|v| match wire::value_to_json(v) {
                serde_json::Value::Array(lines) => {
                    lines.into_iter().map(|l| l.as_str().map(String::from).unwrap_or_else(|| l.to_string())).collect()
                }
                other => vec![other.to_string()],
            })
            .unwrap_or_default();
        if let Some(summary) = completed.result.as_ref().map(|r| &r.summary).filter(|s| !s.is_empty()) {
            output.push(summary.clone());
        }
        for activity in &completed.activities {
            output.push(format!("{}: {}", activity.stage, activity.message));
        }
        if output.len() > MAX_OUTPUT_LINES {
            output.drain(..output.len() - MAX_OUTPUT_LINES);
        }
        let output: Vec<String> = output.into_iter().map(|line| cut(line, MAX_LINE_BYTES)).collect();
        let outcome = if completed.success {
            Outcome::Succeeded { output }
        } else {
            let error = if completed.error_message.is_empty() {
                "the worker reported a failure".into()
            } else {
                cut(completed.error_message, MAX_ERROR_BYTES)
            };
            Outcome::Failed { error, output }
        };
        if lent_by.is_some() {
            // Lent by the instance that leads the job: the report goes there.
            self.settle_lent(lent_by, attempt, peer::outcome_report(&outcome));
            return Ok(());
        }
        let answer = match self.sessions.topology {
            Topology::Member(_) => self.answer(attempt, peer::outcome_report(&outcome)),
            Topology::Alone => self.acknowledgement(&completed.job_id),
        };
        // The engine logs a refusal; the stream goes on with the next message
        // while the step is written, and the acknowledgement follows it.
        if let Err(e) = engine.report(attempt, self.handler, outcome, Some(received), answer).await {
            tracing::debug!(error = %e, "engine stopped before a completion");
        }
        Ok(())
    }
}

/// Sends a worker's report on an attempt of a job led elsewhere to the job's
/// leader; once settled, acknowledges it (to a worker with a lease) and
/// frees the slot it held here. Unsettled, the worker keeps the outcome and
/// reports it again.
async fn settle(
    sessions: Arc<WorkerSessions>,
    leader: Option<Arc<str>>,
    handler: HandlerId,
    attempt: AttemptId,
    report: peer_report::Kind,
    outbound: Option<Outbound>,
    known: Option<KnownAttempts>,
) {
    let attempt_id = attempt.to_string();
    let settled = sessions.reports.report_to_leader(leader, handler, attempt, report).await;
    let refusal = match settled {
        None => {
            tracing::warn!(attempt_id, "report on a job led elsewhere not settled: the worker keeps it");
            return;
        }
        Some(peer::Settled::Applied) => None,
        Some(peer::Settled::Refused(reason)) => {
            tracing::debug!(attempt_id, reason, "the job's leader refused a report");
            Some(reason)
        }
    };
    if let Some(known) = known {
        known.lock().expect("known lock").settled(attempt);
    }
    if let Some(outbound) = outbound {
        acknowledge(&outbound, &attempt_id, refusal.as_deref());
    }
    let _ = sessions.engine.return_borrowed(attempt).await;
    sessions.peers.wake();
}

/// Waits until this instance fences itself (never alone).
async fn fenced(fencing: &mut Option<tokio::sync::watch::Receiver<bool>>) {
    match fencing {
        Some(fencing) => {
            if fencing.wait_for(|fenced| *fenced).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending().await,
    }
}

/// Waits until `at`, or for ever without one.
async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The attempt a report names by the id its execute request gave it; a
/// report naming anything else breaks the protocol and ends the stream.
fn attempt_of(what: &str, job_id: &str) -> Result<AttemptId, Status> {
    job_id.parse::<AttemptId>().map_err(|_| {
        Status::invalid_argument(format!(
            "protocol: {what} names job {job_id:?}, which is no attempt id (JOB_UUID.TASK_INDEX.ATTEMPT) this admin gives"
        ))
    })
}

/// A worker's progress as a task keeps it: a percentage from 0 to 100, and
/// 0 for what is not a number.
fn percent(reported: f64) -> f32 {
    if reported.is_nan() {
        0.0
    } else {
        reported.clamp(0.0, 100.0) as f32
    }
}

fn acknowledge(outbound: &Outbound, attempt_id: &str, refusal: Option<&str>) {
    let request_id = wire::outcome_ack(attempt_id, refusal);
    // A full queue loses the acknowledgement; the worker reports again and is refused as a repeat.
    let _ = outbound.try_send(Ok(message(request_id, None)));
}

/// Whether an attempt of `job` that this instance does not hold belongs to
/// a job led elsewhere (or about to be), so the worker must keep it.
async fn keep_foreign(sessions: &WorkerSessions, job: crate::model::JobId) -> bool {
    match &sessions.topology {
        Topology::Member(_) => not_ended(&sessions.engine, job).await,
        Topology::Alone => false,
    }
}

/// Whether `job`, which this instance's engine does not lead, has not
/// ended: it is led by another instance, or by nobody yet, or by this one
/// and not loaded yet (adopted a moment ago, or released a moment ago).
async fn not_ended(engine: &crate::engine::EngineHandle, job: crate::model::JobId) -> bool {
    match crate::server::cluster::peer::whereabouts(engine, job).await {
        Some(Some(w)) => !w.state.is_terminal(),
        // Unsure (the database away): keep the attempt rather than cancel it.
        None => true,
        Some(None) => false,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio_stream::wrappers::UnboundedReceiverStream;

    use super::*;
    use crate::clock::SystemClock;
    use crate::model::{JobId, JobOrigin, TaskRecord};
    use crate::proto::plugin::{
        ConfigSchemaResponse, JobProgressUpdate, JobResult, JobTypeCapability, JobTypeDescriptor, StringList,
    };
    use crate::store::MemoryStore;

    type Inbound = mpsc::UnboundedSender<Result<WorkerToAdminMessage, Status>>;
    type Answers = mpsc::Receiver<Result<AdminToWorkerMessage, Status>>;

    /// An admin over the memory store, with no listener.
    async fn service() -> WorkerStreamService {
        let clock: Arc<dyn crate::clock::Clock> = Arc::new(SystemClock);
        let store = Arc::new(MemoryStore::new());
        let (parts, _) =
            crate::server::assemble(store, &crate::server::ServerOptions::default(), clock, super::Topology::Alone, 0)
                .await
                .expect("an admin");
        parts.workers
    }

    fn send(inbound: &Inbound, body: worker_to_admin_message::Body) {
        inbound.send(Ok(WorkerToAdminMessage { body: Some(body), ..WorkerToAdminMessage::default() })).expect("open");
    }

    fn hello(job_types: &[&str]) -> worker_to_admin_message::Body {
        worker_to_admin_message::Body::Hello(WorkerHello {
            worker_id: "test".into(),
            worker_instance_id: uuid::Uuid::new_v4().to_string(),
            capabilities: job_types
                .iter()
                .map(|t| JobTypeCapability {
                    job_type: (*t).into(),
                    can_execute: true,
                    max_execution_concurrency: 4,
                    ..JobTypeCapability::default()
                })
                .collect(),
            ..WorkerHello::default()
        })
    }

    /// Opens a session that said `hello`.
    async fn open(service: &WorkerStreamService, hello: worker_to_admin_message::Body) -> (Inbound, Answers) {
        let (inbound, messages) = mpsc::unbounded_channel();
        send(&inbound, hello);
        let answers = service.open(UnboundedReceiverStream::new(messages), None).await.expect("accepted");
        (inbound, answers)
    }

    /// The next answer of the session, skipping requests for descriptors.
    async fn next(answers: &mut Answers) -> Option<Result<AdminToWorkerMessage, Status>> {
        loop {
            let answer = tokio::time::timeout(Duration::from_secs(10), answers.recv()).await.expect("an answer");
            match &answer {
                Some(Ok(AdminToWorkerMessage {
                    body: Some(admin_to_worker_message::Body::RequestConfigSchema(_)),
                    ..
                })) => {}
                _ => return answer,
            }
        }
    }

    /// The status the session ended with.
    async fn ended_with(answers: &mut Answers) -> Status {
        loop {
            match next(answers).await {
                Some(Ok(_)) => {}
                Some(Err(status)) => return status,
                None => panic!("the session ended without a status"),
            }
        }
    }

    async fn schema_request(answers: &mut Answers) -> (String, String) {
        loop {
            let answer = tokio::time::timeout(Duration::from_secs(10), answers.recv()).await.expect("an answer");
            if let Some(Ok(AdminToWorkerMessage {
                request_id,
                body: Some(admin_to_worker_message::Body::RequestConfigSchema(request)),
                ..
            })) = answer
            {
                return (request_id, request.job_type);
            }
        }
    }

    fn schema(request_id: &str, job_type: &str) -> worker_to_admin_message::Body {
        worker_to_admin_message::Body::ConfigSchemaResponse(ConfigSchemaResponse {
            request_id: request_id.into(),
            job_type: job_type.into(),
            success: true,
            error_message: String::new(),
            job_type_descriptor: Some(JobTypeDescriptor { job_type: job_type.into(), ..JobTypeDescriptor::default() }),
        })
    }

    #[tokio::test]
    async fn a_descriptor_is_kept_only_as_the_answer_to_the_sessions_request() {
        let service = service().await;
        let policies = &service.sessions.policies;

        // Unasked: refused, and nothing is stored.
        let (inbound, mut answers) = open(&service, hello(&["noop"])).await;
        send(&inbound, schema("schema-999", "vacuum"));
        let status = ended_with(&mut answers).await;
        assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
        assert!(status.message().contains("answers no request this session sent"), "{status:?}");
        assert!(!policies.has_descriptor("vacuum"));

        // Asked about one job type, describing another: refused, nothing stored.
        let (inbound, mut answers) = open(&service, hello(&["noop"])).await;
        let (request_id, job_type) = schema_request(&mut answers).await;
        assert_eq!(job_type, "noop");
        send(&inbound, schema(&request_id, "vacuum"));
        let status = ended_with(&mut answers).await;
        assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
        assert!(status.message().contains("describes job type \"vacuum\""), "{status:?}");
        assert!(!policies.has_descriptor("vacuum") && !policies.has_descriptor("noop"));

        // The answer to the request: kept.
        let (inbound, mut answers) = open(&service, hello(&["noop"])).await;
        let (request_id, _) = schema_request(&mut answers).await;
        send(&inbound, schema(&request_id, "noop"));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !policies.has_descriptor("noop") {
            assert!(tokio::time::Instant::now() < deadline, "the asked-for descriptor was not kept");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn a_report_naming_no_attempt_id_ends_the_stream() {
        let service = service().await;
        for body in [
            worker_to_admin_message::Body::JobCompleted(JobCompleted {
                job_id: "not-an-attempt".into(),
                success: true,
                ..JobCompleted::default()
            }),
            worker_to_admin_message::Body::JobProgressUpdate(JobProgressUpdate {
                job_id: "7.7".into(),
                ..JobProgressUpdate::default()
            }),
        ] {
            let (inbound, mut answers) = open(&service, hello(&["noop"])).await;
            send(&inbound, body);
            let status = ended_with(&mut answers).await;
            assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
            assert!(status.message().contains("which is no attempt id"), "{status:?}");
        }
    }

    #[tokio::test]
    async fn a_hello_with_too_many_job_types_is_refused() {
        let service = service().await;
        let (inbound, messages) = mpsc::unbounded_channel();
        let job_types: Vec<String> = (0..=MAX_CAPABILITIES).map(|n| format!("type{n}")).collect();
        send(&inbound, hello(&job_types.iter().map(String::as_str).collect::<Vec<_>>()));
        let status = service.open(UnboundedReceiverStream::new(messages), None).await.expect_err("refused");
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert_eq!(status.message(), "hello: 257 capabilities, the most a worker may declare is 256");
        assert!(service.sessions.registry.is_empty());
    }

    /// Runs one `noop` task on a session: the record it leaves after the
    /// worker reports `reports` on its attempt.
    async fn task_after(reports: impl FnOnce(String) -> Vec<worker_to_admin_message::Body>) -> TaskRecord {
        let service = service().await;
        let spec = crate::jobfile::parse(
            br#"{"name":"one","tasks":[{"id":"a","job_type":"noop"}]}"#,
            crate::jobfile::Format::Json,
            "one.json",
            &crate::jobfile::Limits::default(),
        )
        .expect("a job");
        let engine = service.sessions.engine.clone();
        let job: JobId = engine.submit(spec, JobOrigin::User).await.expect("submitted");
        let (inbound, mut answers) = open(&service, hello(&["noop"])).await;
        let attempt_id = loop {
            match next(&mut answers).await {
                Some(Ok(AdminToWorkerMessage {
                    body: Some(admin_to_worker_message::Body::ExecuteJobRequest(request)),
                    ..
                })) => break request.job.expect("a job").job_id,
                Some(Ok(_)) => {}
                other => panic!("no work came: {other:?}"),
            }
        };
        for body in reports(attempt_id) {
            send(&inbound, body);
        }
        drop(inbound);
        while next(&mut answers).await.is_some() {}
        engine.job(job).await.expect("the engine runs").expect("the job").tasks.swap_remove(0)
    }

    fn progress(attempt_id: &str, percent: f64) -> worker_to_admin_message::Body {
        worker_to_admin_message::Body::JobProgressUpdate(JobProgressUpdate {
            job_id: attempt_id.into(),
            progress_percent: percent,
            stage: "copying".into(),
            ..JobProgressUpdate::default()
        })
    }

    #[tokio::test]
    async fn a_progress_is_kept_between_0_and_100() {
        for (reported, kept) in [(f64::NAN, 0.0), (-5.0, 0.0), (1e12, 100.0), (f64::INFINITY, 100.0), (42.5, 42.5)] {
            let task = task_after(|id| vec![progress(&id, reported)]).await;
            assert_eq!(task.progress_percent, kept, "reported {reported}");
            assert_eq!(&*task.stage, "copying");
        }
    }

    #[tokio::test]
    async fn long_output_lines_and_errors_are_cut() {
        let line = "é".repeat(MAX_LINE_BYTES);
        let error = "x".repeat(3 * MAX_ERROR_BYTES);
        let (reported_line, reported_error) = (line.clone(), error.clone());
        let task = task_after(move |id| {
            let output = crate::proto::plugin::ConfigValue {
                kind: Some(crate::proto::plugin::config_value::Kind::StringList(StringList {
                    values: vec![reported_line, "short".into()],
                })),
            };
            vec![worker_to_admin_message::Body::JobCompleted(JobCompleted {
                job_id: id,
                success: false,
                error_message: reported_error,
                result: Some(JobResult {
                    output_values: BTreeMap::from([("output".to_string(), output)]),
                    summary: String::new(),
                }),
                ..JobCompleted::default()
            })]
        })
        .await;
        assert_eq!(task.state(), crate::model::TaskState::Failed);
        let kept_line = format!("{} [...]", "é".repeat(MAX_LINE_BYTES / 2));
        assert_eq!(task.output.iter().map(|l| l.to_string()).collect::<Vec<_>>(), [kept_line, "short".to_string()]);
        assert_eq!(task.error.as_deref(), Some(format!("{} [...]", &error[..MAX_ERROR_BYTES]).as_str()));
    }
}
