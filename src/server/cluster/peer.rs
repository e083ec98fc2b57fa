//! Work across instances on one database. A job is led by one instance, but
//! any worker of the cluster may run its tasks: an instance whose workers
//! have free slots that nothing queued here can use borrows ready tasks from
//! the other live instances (`Lend`, assigned and made durable by the
//! leader), and every report on an attempt of a job led elsewhere goes to
//! that job's leader (`Report`), found in the database when it moved.
//!
//! The borrower holds a borrowed attempt's slot until the leader has settled
//! its report, so a worker is never given more than it has room for.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status};

use super::{Node, Topology};
use crate::backoff::Backoff;
use crate::dispatch::{Assignment, FreeSlots};
use crate::engine::EngineHandle;
use crate::follower::{Loss, Outcome, Rejection};
use crate::model::{AttemptId, HandlerId, JobId};
use crate::proto::peer::{
    peer_report, peer_service_client::PeerServiceClient, peer_service_server::PeerService, DedupeKeysRequest,
    DedupeKeysResponse, KnowsRequest, KnowsResponse, LendRequest, LendResponse, LentTask, PeerCancel,
    PeerCancelResponse, PeerGiveUp, PeerOutcome, PeerProgress, PeerReport, PeerReportResponse, PeerReportResponses,
    PeerReports, VouchRequest, VouchResponse,
};
use crate::proto::plugin::{admin_to_worker_message, AdminToWorkerMessage, CancelRequest, WorkKind};
use crate::server::duties::Duties;
use crate::server::workers::registry::Registry;
use crate::wire;

/// How long one call to another instance may take.
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_secs(3);
/// The most any call on a link to another instance may take.
const LINK_TIMEOUT: Duration = Duration::from_secs(60);
/// How often an instance with idle slots asks the others for work, when
/// nothing else wakes it.
const IDLE_POLL: Duration = Duration::from_millis(200);
/// How long a report on an attempt of a job led elsewhere is retried while
/// nobody leads the job (a failover in progress).
const REPORT_PATIENCE: Duration = Duration::from_secs(90);

/// This instance's links to the others, and the credential it calls them
/// with (a token, or its certificate over mutual TLS). Cheap to clone: the
/// clones share the links.
#[derive(Clone)]
pub(crate) struct Peers {
    links: Arc<Links>,
    /// `Bearer TOKEN`, sent with every call when a token is set.
    bearer: Option<tonic::metadata::AsciiMetadataValue>,
    /// TLS to the others when they serve it: the CA that signed their
    /// certificates, and this instance's own to present.
    tls: Option<crate::tls::ClientTls>,
    /// Where the calls carrying reports run: stopped with the server's duties.
    duties: Duties,
}

#[derive(Default)]
struct Links {
    clients: Mutex<HashMap<String, PeerServiceClient<Channel>>>,
    /// Who leads a job, as last learned: its leader's gRPC address.
    leaders: Mutex<HashMap<JobId, Arc<str>>>,
    /// A borrowed slot came free, or a worker joined: ask for work now.
    wake: Notify,
    /// Where the handlers tasks were lent to are connected: the borrower's
    /// gRPC address, and when it last offered the handler.
    handler_at: Mutex<HashMap<HandlerId, (Arc<str>, std::time::Instant)>>,
    /// Reports waiting for a call to their job's leader.
    outbox: super::outbox::Outbox,
}

impl Peers {
    /// Links to be made as they are needed, each call carrying `token`,
    /// over TLS when `tls` is given.
    pub(crate) fn new(token: Option<&str>, tls: Option<crate::tls::ClientTls>, duties: Duties) -> Peers {
        let bearer = token.and_then(|t| format!("Bearer {}", t.trim()).parse().ok());
        Peers { links: Arc::default(), bearer, tls, duties }
    }

    pub(super) fn duties(&self) -> &Duties {
        &self.duties
    }

    /// Where another instance's gRPC port is reached, over TLS when the
    /// instances serve it.
    fn endpoint(&self, address: &str) -> Option<Endpoint> {
        match &self.tls {
            Some(tls) => tls
                .endpoint(address)
                .inspect_err(|e| tracing::warn!(%address, error = %e, "cannot link to another instance over TLS"))
                .ok(),
            None => Endpoint::from_shared(format!("http://{address}")).ok(),
        }
    }

    /// The client API of another instance (its gRPC address), connected now.
    pub(crate) async fn job_service(
        &self,
        address: &str,
    ) -> Result<crate::proto::api::job_service_client::JobServiceClient<Channel>, String> {
        let endpoint = self.endpoint(address).ok_or_else(|| format!("{address} cannot be linked to"))?;
        let channel = endpoint.connect_timeout(CALL_TIMEOUT).connect().await.map_err(|e| e.to_string())?;
        Ok(crate::proto::api::job_service_client::JobServiceClient::new(channel))
    }

    /// The handlers tasks were lent to within `within`, with the gRPC
    /// address of the instance that offered each and how long ago.
    pub(crate) fn lent_within(&self, within: std::time::Duration) -> Vec<(HandlerId, Arc<str>, std::time::Duration)> {
        let at = self.links.handler_at.lock().expect("handler_at lock");
        at.iter()
            .map(|(handler, (address, when))| (*handler, address.clone(), when.elapsed()))
            .filter(|(_, _, ago)| *ago < within)
            .collect()
    }

    pub(super) fn outbox(&self) -> &super::outbox::Outbox {
        &self.links.outbox
    }

    pub(super) fn client(&self, address: &str) -> Option<PeerServiceClient<Channel>> {
        let mut clients = self.links.clients.lock().expect("peer clients lock");
        if let Some(client) = clients.get(address) {
            return Some(client.clone());
        }
        // A link to an instance that a partition cut off fails in seconds,
        // not when the system gives the connection up (many minutes): the
        // connect, every call and an idle link are all bounded.
        let endpoint = self
            .endpoint(address)?
            .tcp_nodelay(true)
            .connect_timeout(CALL_TIMEOUT)
            .timeout(LINK_TIMEOUT)
            .http2_keep_alive_interval(Duration::from_secs(2))
            .keep_alive_timeout(Duration::from_secs(3))
            .keep_alive_while_idle(true);
        let client = PeerServiceClient::new(endpoint.connect_lazy());
        clients.insert(address.to_string(), client.clone());
        Some(client)
    }

    fn forget(&self, address: &str) {
        self.links.clients.lock().expect("peer clients lock").remove(address);
    }

    pub(crate) fn wake(&self) {
        self.links.wake.notify_one();
    }

    pub(super) fn request<T>(&self, message: T) -> Request<T> {
        self.request_within(message, CALL_TIMEOUT)
    }

    /// A call to another instance, with this one's token, bounded by `timeout`.
    pub(crate) fn request_within<T>(&self, message: T, timeout: Duration) -> Request<T> {
        let mut request = Request::new(message);
        request.set_timeout(timeout);
        if let Some(value) = self.bearer.clone() {
            request.metadata_mut().insert("authorization", value);
        }
        request
    }

    /// Which of `attempts` (held here for `handler`, a worker connected to the
    /// instance at `address`) that worker's session knows; `None` if that
    /// instance cannot tell (it did not answer, or the worker has not sent a
    /// heartbeat there yet).
    pub(crate) async fn known_at(
        &self,
        address: &str,
        handler: HandlerId,
        attempts: &[AttemptId],
    ) -> Option<Vec<AttemptId>> {
        let mut client = self.client(address)?;
        let attempt_ids = attempts.iter().map(AttemptId::to_string).collect();
        let request = KnowsRequest { handler: handler.to_string(), attempt_ids };
        let answer = client.knows(self.request_within(request, CALL_TIMEOUT)).await.ok()?.into_inner();
        answer.heard.then(|| answer.known.iter().filter_map(|id| id.parse().ok()).collect())
    }

    /// Asks the instance at `address`, which leads the jobs of `attempts`, to
    /// vouch for them: the attempts it holds for `handler` (a worker connected
    /// here whose lease is `lease`), and how long from the call they are covered.
    pub(crate) async fn vouch_at(
        &self,
        address: &str,
        handler: HandlerId,
        attempts: &[AttemptId],
        lease: Duration,
    ) -> Result<(Vec<AttemptId>, Duration), String> {
        let mut client = self.client(address).ok_or_else(|| format!("{address} is not an address"))?;
        let attempt_ids = attempts.iter().map(AttemptId::to_string).collect();
        let message = VouchRequest { handler: handler.to_string(), attempt_ids, lease_ms: lease.as_millis() as u64 };
        let call = client.vouch(self.request_within(message, CALL_TIMEOUT));
        let answer = match tokio::time::timeout(CALL_TIMEOUT, call).await {
            Ok(Ok(answer)) => answer.into_inner(),
            Ok(Err(status)) => return Err(status.message().to_string()),
            Err(_) => return Err(format!("no answer within {CALL_TIMEOUT:?}")),
        };
        let held = answer.held.iter().filter_map(|id| id.parse().ok()).collect();
        Ok((held, Duration::from_millis(answer.valid_ms)))
    }

    /// The dedupe keys of the tasks not ended in the jobs the instance at
    /// `address` leads.
    pub(crate) async fn dedupe_keys_at(&self, address: &str) -> Result<Vec<String>, String> {
        let mut client = self.client(address).ok_or_else(|| format!("{address} is not an address"))?;
        match client.dedupe_keys(self.request(DedupeKeysRequest {})).await {
            Ok(answer) => Ok(answer.into_inner().keys),
            Err(status) => Err(status.message().to_string()),
        }
    }
}

/// How long a vouch for a worker's attempts lets another instance renew
/// the worker's lease: its lease, but no longer than the orphan grace leaves
/// after the worker's own wait (an instance that adopts the job, or this one
/// restarted, waits the grace before it takes the attempts back; a worker
/// renewed up to the end of the vouch has stopped by then).
pub(crate) fn vouch_validity(orphan_grace: Duration, lease: Duration) -> Duration {
    lease.min(orphan_grace.saturating_sub(wire::take_back_after(lease)))
}

/// The lender's side: answers other instances.
#[derive(Clone)]
pub(crate) struct PeerServiceImpl {
    engine: EngineHandle,
    /// Where the handlers of the tasks lent are connected.
    peers: Peers,
    /// The workers connected here: cancels go to them, and their sessions
    /// say what they know.
    registry: Registry,
    /// A fenced instance vouches for nothing.
    topology: Topology,
    /// What a vouch may cover (`vouch_validity`).
    orphan_grace: Duration,
    crash: Arc<crate::crash::CrashPoint>,
}

impl PeerServiceImpl {
    pub(crate) fn new(
        engine: EngineHandle,
        peers: Peers,
        registry: Registry,
        topology: Topology,
        orphan_grace: Duration,
    ) -> PeerServiceImpl {
        let crash = Arc::new(crate::crash::CrashPoint::from_env());
        PeerServiceImpl { engine, peers, registry, topology, orphan_grace, crash }
    }
}

fn handler_of(text: &str) -> Result<HandlerId, Status> {
    text.parse().map_err(|_| Status::invalid_argument(format!("peer: handler {text:?} is not a UUID")))
}

fn engine_status(e: crate::engine::Error) -> Status {
    Status::unavailable(format!("peer: {e}"))
}

#[tonic::async_trait]
impl PeerService for PeerServiceImpl {
    async fn lend(&self, request: Request<LendRequest>) -> Result<Response<LendResponse>, Status> {
        let request = request.into_inner();
        let borrower: Arc<str> = Arc::from(request.address.as_str());
        let mut slots = Vec::new();
        for free in request.slots {
            let mut job_types: Vec<(Arc<str>, u32)> =
                free.job_types.into_iter().map(|(t, n)| (Arc::from(t.as_str()), n)).collect();
            job_types.sort();
            slots.push(FreeSlots { handler: handler_of(&free.handler)?, total: free.total, job_types });
        }
        // Where the handlers offered are connected is known before any
        // attempt is lent to them: a recovery check that sees an attempt
        // held for one of them finds it connected there, never gone.
        {
            let mut at = self.peers.links.handler_at.lock().expect("handler_at lock");
            let now = std::time::Instant::now();
            for slot in &slots {
                at.insert(slot.handler, (borrower.clone(), now));
            }
        }
        let lent = self.engine.lend(slots).await.map_err(engine_status)?;
        if !lent.is_empty() {
            // The attempts are durable here, and the borrower has not heard of them.
            self.crash.reached("lend-durable");
        }
        let tasks = lent
            .into_iter()
            .map(|(handler, a)| LentTask {
                handler: handler.to_string(),
                attempt_id: a.attempt.to_string(),
                job_name: a.job_name,
                task_id: a.task_id.to_string(),
                job_type: a.job_type.to_string(),
                parameters: a.parameters.to_string(),
                labels: a.labels.into_iter().collect(),
                priority: wire::priority_to_wire(a.priority) as i32,
                execution_timeout_seconds: a.execution_timeout_seconds,
                io_byte_per_second: a.io_byte_per_second,
            })
            .collect();
        Ok(Response::new(LendResponse { tasks }))
    }

    async fn cancel(&self, request: Request<PeerCancel>) -> Result<Response<PeerCancelResponse>, Status> {
        let cancel = request.into_inner();
        let handler = handler_of(&cancel.handler)?;
        let body = admin_to_worker_message::Body::CancelRequest(CancelRequest {
            target_id: cancel.attempt_id.clone(),
            target_kind: WorkKind::Execution as i32,
            reason: cancel.reason,
            force: false,
        });
        let message = AdminToWorkerMessage {
            request_id: format!("cancel-{}", cancel.attempt_id),
            sent_at: None,
            body: Some(body),
        };
        Ok(Response::new(PeerCancelResponse { delivered: self.registry.send(handler, message) }))
    }

    async fn knows(&self, request: Request<KnowsRequest>) -> Result<Response<KnowsResponse>, Status> {
        let request = request.into_inner();
        let handler = handler_of(&request.handler)?;
        let Some(known) = self.registry.known(handler) else {
            return Ok(Response::new(KnowsResponse { heard: false, known: Vec::new() }));
        };
        let known = known.lock().expect("known lock");
        let mut heard = true;
        let mut answer = Vec::new();
        for id in request.attempt_ids {
            let Ok(attempt) = id.parse::<AttemptId>() else { continue };
            match known.knows(attempt) {
                None => heard = false,
                Some(true) => answer.push(id),
                Some(false) => {}
            }
        }
        Ok(Response::new(KnowsResponse { heard, known: answer }))
    }

    async fn vouch(&self, request: Request<VouchRequest>) -> Result<Response<VouchResponse>, Status> {
        // A fenced instance may have been deactivated: its word binds nobody.
        if self.topology.is_fenced() {
            return Err(Status::unavailable("peer: this instance cannot reach its database and vouches for nothing"));
        }
        let request = request.into_inner();
        let handler = handler_of(&request.handler)?;
        let mut attempts = Vec::with_capacity(request.attempt_ids.len());
        for id in &request.attempt_ids {
            let attempt = id.parse::<AttemptId>().map_err(|e| Status::invalid_argument(format!("peer: vouch: {e}")))?;
            attempts.push(attempt);
        }
        if request.lease_ms == 0 {
            return Err(Status::invalid_argument("peer: vouch: lease_ms must be above 0"));
        }
        let lease = Duration::from_millis(request.lease_ms);
        let valid = vouch_validity(self.orphan_grace, lease);
        let keep = valid + wire::take_back_after(lease);
        let held = self.engine.vouch(handler, attempts, keep).await.map_err(engine_status)?;
        let held = held.iter().map(AttemptId::to_string).collect();
        Ok(Response::new(VouchResponse { held, valid_ms: valid.as_millis() as u64 }))
    }

    async fn dedupe_keys(&self, _request: Request<DedupeKeysRequest>) -> Result<Response<DedupeKeysResponse>, Status> {
        let keys = self.engine.active_dedupe_keys().await.map_err(engine_status)?;
        Ok(Response::new(DedupeKeysResponse { keys: keys.into_iter().collect() }))
    }

    async fn report(&self, request: Request<PeerReport>) -> Result<Response<PeerReportResponse>, Status> {
        Ok(Response::new(answer(self.engine.clone(), request.into_inner()).await?))
    }

    async fn reports(&self, request: Request<PeerReports>) -> Result<Response<PeerReportResponses>, Status> {
        // All at once: the engine applies those that arrive together in one
        // step and makes them durable in one commit.
        let reports = request.into_inner().reports;
        if reports.len() > super::outbox::MOST_REPORTS {
            return Err(Status::invalid_argument(format!(
                "peer: {} reports in one call, the most one takes is {}",
                reports.len(),
                super::outbox::MOST_REPORTS
            )));
        }
        let mut answers = tokio::task::JoinSet::new();
        for (n, report) in reports.into_iter().enumerate() {
            let engine = self.engine.clone();
            answers.spawn(async move { (n, answer(engine, report).await) });
        }
        let mut responses = vec![PeerReportResponse::default(); answers.len()];
        while let Some(joined) = answers.join_next().await {
            let (n, response) = joined.map_err(|e| Status::internal(format!("peer: {e}")))?;
            responses[n] = response?;
        }
        Ok(Response::new(PeerReportResponses { responses }))
    }
}

/// Applies a report from another instance here, and says how it went.
async fn answer(engine: EngineHandle, report: PeerReport) -> Result<PeerReportResponse, Status> {
    let handler = handler_of(&report.handler)?;
    let attempt = report
        .attempt_id
        .parse::<AttemptId>()
        .map_err(|e| Status::invalid_argument(format!("peer: bad attempt id: {e}")))?;
    Ok(match settle_here(&engine, handler, attempt, report.kind).await.map_err(engine_status)? {
        Some(Settled::Applied) => PeerReportResponse { applied: true, refusal: String::new(), not_led_here: false },
        Some(Settled::Refused(refusal)) => PeerReportResponse { applied: false, refusal, not_led_here: false },
        None => PeerReportResponse { applied: false, refusal: String::new(), not_led_here: true },
    })
}

/// Applies a report to this instance's engine, and says what that settled:
/// nothing (`None`) when the engine does not hold the job although the
/// database says it has not ended. The job is then led elsewhere, or by
/// nobody, or led here and not loaded yet (an adoption under way): refused,
/// the worker would forget an outcome nobody applied. It is sent again.
async fn settle_here(
    engine: &EngineHandle,
    handler: HandlerId,
    attempt: AttemptId,
    kind: Option<peer_report::Kind>,
) -> Result<Option<Settled>, crate::engine::Error> {
    Ok(match apply_here(engine, handler, attempt, kind).await? {
        Ok(()) => Some(Settled::Applied),
        Err(Rejection::JobEnded { job } | Rejection::UnknownJob { job }) if !ended(engine, job).await => None,
        Err(rejection) => Some(Settled::Refused(rejection.to_string())),
    })
}

/// Applies a report to this instance's engine.
async fn apply_here(
    engine: &EngineHandle,
    handler: HandlerId,
    attempt: AttemptId,
    kind: Option<peer_report::Kind>,
) -> Result<Result<(), Rejection>, crate::engine::Error> {
    match kind {
        Some(peer_report::Kind::Outcome(outcome)) => {
            let outcome = if outcome.success {
                Outcome::Succeeded { output: outcome.output }
            } else if outcome.canceled {
                Outcome::Canceled { reason: outcome.error }
            } else {
                Outcome::Failed { error: outcome.error, output: outcome.output }
            };
            engine.complete(attempt, handler, outcome).await
        }
        Some(peer_report::Kind::Progress(progress)) => {
            let progress =
                crate::engine::Progress { percent: progress.percent, stage: progress.stage, message: progress.message };
            engine.progress(attempt, handler, progress).await.map(Ok)
        }
        Some(peer_report::Kind::GiveUp(give_up)) => {
            let loss =
                if give_up.counted { Loss::WithWorker(give_up.reason) } else { Loss::NotCounted(give_up.reason) };
            let (tx, rx) = tokio::sync::oneshot::channel();
            let answer: crate::engine::Answer = Box::new(move |result| {
                let _ = tx.send(result);
            });
            engine.give_up(attempt, handler, loss, Some(answer)).await?;
            rx.await.map_err(|_| crate::engine::Error::Stopped)
        }
        None => Ok(Ok(())),
    }
}

/// Waits before a report is tried again; false, without waiting, once its
/// patience has run out.
async fn pause(deadline: tokio::time::Instant, pauses: &mut Backoff) -> bool {
    if tokio::time::Instant::now() >= deadline {
        return false;
    }
    tokio::time::sleep(pauses.next_pause()).await;
    true
}

/// Whether the job has ended, as the database says (unsure counts as not).
async fn ended(engine: &EngineHandle, job: JobId) -> bool {
    matches!(whereabouts(engine, job).await, Some(Some(w)) if w.state.is_terminal())
}

/// Where the database says `job` is: `None` when it cannot tell now,
/// `Some(None)` when there is no such job.
pub(crate) async fn whereabouts(
    engine: &EngineHandle,
    job: JobId,
) -> Option<Option<crate::store::cluster::Whereabouts>> {
    let store = engine.store().clone();
    tokio::task::spawn_blocking(move || store.cluster().map(|c| c.whereabouts(job)))
        .await
        .ok()
        .flatten()
        .and_then(Result::ok)
}

/// What became of a report sent on to a job's leader.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Settled {
    Applied,
    Refused(String),
}

/// The kinds of report a worker makes on an attempt.
pub(crate) fn outcome_report(outcome: &Outcome) -> peer_report::Kind {
    match outcome {
        Outcome::Succeeded { output } => peer_report::Kind::Outcome(PeerOutcome {
            success: true,
            error: String::new(),
            output: output.clone(),
            canceled: false,
        }),
        Outcome::Failed { error, output } => peer_report::Kind::Outcome(PeerOutcome {
            success: false,
            error: error.clone(),
            output: output.clone(),
            canceled: false,
        }),
        Outcome::Canceled { reason } => peer_report::Kind::Outcome(PeerOutcome {
            success: false,
            error: reason.clone(),
            output: Vec::new(),
            canceled: true,
        }),
    }
}

pub(crate) fn give_up_report(loss: &Loss) -> peer_report::Kind {
    let (counted, reason) = match loss {
        Loss::WithWorker(reason) => (true, reason.clone()),
        Loss::NotCounted(reason) => (false, reason.clone()),
    };
    peer_report::Kind::GiveUp(PeerGiveUp { counted, reason })
}

pub(crate) fn progress_report(progress: &crate::engine::Progress) -> peer_report::Kind {
    peer_report::Kind::Progress(PeerProgress {
        percent: progress.percent,
        stage: progress.stage.clone(),
        message: progress.message.clone(),
    })
}

/// Reports on attempts of jobs led elsewhere, sent on to their leader: what
/// a worker session and the borrower use. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Reports {
    /// Alone, there is nobody to send them to.
    pub(crate) topology: Topology,
    pub(crate) peers: Peers,
    /// A job led here by now takes the report itself; the database says who leads.
    pub(crate) engine: EngineHandle,
}

impl Reports {
    /// Sends a report on an attempt of a job led elsewhere to its leader
    /// (`leader` when known), and follows the job when it moves; retried while
    /// nobody leads it. `None` when it could not be settled: the worker keeps
    /// the outcome and reports it again.
    pub(crate) async fn report_to_leader(
        &self,
        leader: Option<Arc<str>>,
        handler: HandlerId,
        attempt: AttemptId,
        kind: peer_report::Kind,
    ) -> Option<Settled> {
        let task = attempt.task;
        let node = self.topology.member()?;
        let peers = &self.peers;
        let deadline = tokio::time::Instant::now() + REPORT_PATIENCE;
        let mut address = leader.or_else(|| peers.links.leaders.lock().expect("leaders lock").get(&task.job).cloned());
        let mut pauses = Backoff::doubling(Duration::from_millis(100), Duration::from_secs(2));
        loop {
            let target = match address.take() {
                Some(address) => address,
                None => match whereabouts(&self.engine, task.job).await {
                    Some(Some(w)) if w.state.is_terminal() => {
                        return Some(Settled::Refused(Rejection::JobEnded { job: task.job }.to_string()))
                    }
                    Some(Some(w)) => match w.owner {
                        Some(owner) if owner.id == node.id => {
                            // It is led here now, or will be once its adoption is loaded.
                            if let Some(settled) =
                                settle_here(&self.engine, handler, attempt, Some(kind.clone())).await.ok()?
                            {
                                return Some(settled);
                            }
                            if !pause(deadline, &mut pauses).await {
                                return None;
                            }
                            continue;
                        }
                        Some(owner) => Arc::from(owner.grpc_address.as_str()),
                        None => {
                            if !pause(deadline, &mut pauses).await {
                                return None;
                            }
                            continue;
                        }
                    },
                    Some(None) => return Some(Settled::Refused(Rejection::UnknownJob { job: task.job }.to_string())),
                    None => return None,
                },
            };
            let message =
                PeerReport { handler: handler.to_string(), attempt_id: attempt.to_string(), kind: Some(kind.clone()) };
            match peers.report(&target, message).await {
                Ok(r) if r.applied => {
                    peers.links.leaders.lock().expect("leaders lock").insert(task.job, target);
                    return Some(Settled::Applied);
                }
                Ok(r) if !r.not_led_here => {
                    peers.links.leaders.lock().expect("leaders lock").remove(&task.job);
                    return Some(Settled::Refused(r.refusal));
                }
                Ok(_) => {}
                Err(status) => {
                    tracing::debug!(leader = %target, error = %status, "report to a job's leader failed");
                    peers.forget(&target);
                }
            }
            // The job moved, or its leader is away: ask the database who leads it.
            peers.links.leaders.lock().expect("leaders lock").remove(&task.job);
            if !pause(deadline, &mut pauses).await {
                return None;
            }
        }
    }
}

/// This instance's part in the work across instances, as its duties do it:
/// borrowing ready tasks for its idle workers (`borrower`), and stopping
/// attempts lent to workers connected elsewhere (`foreign_orders`).
pub(crate) struct Lending {
    pub(crate) node: Arc<Node>,
    pub(crate) engine: EngineHandle,
    pub(crate) peers: Peers,
    /// A borrowed attempt its worker left before it came goes back to its leader.
    pub(crate) reports: Reports,
    pub(crate) duties: Duties,
    /// The address offered to lenders until the heartbeats list this instance's own.
    pub(crate) grpc_port: u16,
}

impl Lending {
    /// The borrower: while this instance's workers have slots nothing queued
    /// here can use, ask the other live servers for ready tasks.
    pub(crate) async fn borrower(self: Arc<Self>) {
        let node = &self.node;
        let mut first = 0usize;
        loop {
            let others: Vec<Arc<str>> = node
                .live()
                .iter()
                .filter(|i| i.id != node.id && i.role == crate::store::cluster::Role::Server && i.active)
                .map(|i| Arc::from(i.grpc_address.as_str()))
                .collect();
            let got = if others.is_empty() { 0 } else { self.borrow_round(&others, first).await };
            first = first.wrapping_add(1);
            if got == 0 {
                tokio::select! {
                    () = self.peers.links.wake.notified() => {}
                    () = tokio::time::sleep(IDLE_POLL) => {}
                }
            }
        }
    }

    /// One round: reserve the idle slots, offer them to each other instance in
    /// turn, and hand what was lent to the workers. Returns how many tasks came.
    async fn borrow_round(&self, others: &[Arc<str>], first: usize) -> usize {
        let node = &self.node;
        let Ok(offers) = self.engine.reserve().await else { return 0 };
        if offers.is_empty() {
            return 0;
        }
        let reserved: BTreeMap<HandlerId, u32> = offers.iter().map(|o| (o.handler, o.total)).collect();
        let mut left: BTreeMap<HandlerId, FreeSlots> = offers.into_iter().map(|o| (o.handler, o)).collect();
        let mut lent: BTreeMap<HandlerId, Vec<Assignment>> = BTreeMap::new();
        for k in 0..others.len() {
            if left.is_empty() {
                break;
            }
            let lender = &others[(first + k) % others.len()];
            let slots = left
                .values()
                .map(|o| crate::proto::peer::FreeSlots {
                    handler: o.handler.to_string(),
                    total: o.total,
                    job_types: o.job_types.iter().map(|(t, n)| (t.to_string(), *n)).collect(),
                })
                .collect();
            let address = format!("127.0.0.1:{}", self.grpc_port);
            let address = node.live().into_iter().find(|i| i.id == node.id).map_or(address, |me| me.grpc_address);
            let message = LendRequest { instance: node.id.to_string(), slots, address };
            let Some(mut client) = self.peers.client(lender) else { continue };
            let tasks = match client.lend(self.peers.request(message)).await {
                Ok(response) => response.into_inner().tasks,
                Err(status) => {
                    tracing::debug!(lender = %lender, error = %status, "asking another instance for work failed");
                    self.peers.forget(lender);
                    continue;
                }
            };
            for task in tasks {
                let (Ok(handler), Ok(attempt)) =
                    (task.handler.parse::<HandlerId>(), task.attempt_id.parse::<AttemptId>())
                else {
                    continue;
                };
                let job_type: Arc<str> = Arc::from(task.job_type.as_str());
                if let Some(offer) = left.get_mut(&handler) {
                    offer.total = offer.total.saturating_sub(1);
                    if let Some((_, n)) = offer.job_types.iter_mut().find(|(t, _)| *t == job_type) {
                        *n = n.saturating_sub(1);
                    }
                    offer.job_types.retain(|(_, n)| *n > 0);
                }
                lent.entry(handler).or_default().push(Assignment {
                    attempt,
                    job_name: task.job_name,
                    task_id: task.task_id.into(),
                    job_type,
                    parameters: task.parameters.into(),
                    labels: task.labels.into_iter().collect(),
                    priority: wire::priority_from_wire(task.priority),
                    execution_timeout_seconds: task.execution_timeout_seconds,
                    released_at: None,
                    lent_by: Some(lender.clone()),
                    traceparent: None,
                    io_byte_per_second: task.io_byte_per_second,
                });
            }
            left.retain(|_, o| o.total > 0 && !o.job_types.is_empty());
        }
        let mut got = 0;
        for (handler, n) in reserved {
            let assignments = lent.remove(&handler).unwrap_or_default();
            got += assignments.len();
            let Ok(unsent) = self.engine.borrowed(handler, n, assignments).await else { continue };
            for a in unsent {
                // The worker left between the offer and the answer: the leader takes the attempt back.
                let reports = self.reports.clone();
                self.duties.spawn(async move {
                    let loss = Loss::NotCounted("the worker it was lent to left".into());
                    reports.report_to_leader(a.lent_by.clone(), handler, a.attempt, give_up_report(&loss)).await;
                });
            }
        }
        got
    }

    /// Stops attempts of jobs led here that workers connected to other
    /// instances run: each order goes to the instance the worker is connected to.
    pub(crate) async fn foreign_orders(self: Arc<Self>, orders: crate::server::ForeignReceiver) {
        let node = &self.node;
        // Held while this duty runs: a duty started again takes it over.
        let mut orders = orders.lock().await;
        while let Some((handler, order)) = orders.recv().await {
            let crate::dispatch::WorkOrder::Cancel { attempt } = order else { continue };
            // Where it was lent to, else where the cluster last saw it.
            let lent_to =
                self.peers.links.handler_at.lock().expect("handler_at lock").get(&handler).map(|(a, _)| a.clone());
            let address = lent_to.or_else(|| {
                let live = node.live();
                let instance = live.iter().find(|i| i.id != node.id && i.handlers.contains(&handler))?;
                Some(Arc::from(instance.grpc_address.as_str()))
            });
            let Some(address) = address else {
                tracing::warn!(%handler, %attempt, "no live instance has the worker of an attempt to stop");
                continue;
            };
            let peers = self.peers.clone();
            self.duties.spawn(async move {
                let message = PeerCancel {
                    handler: handler.to_string(),
                    attempt_id: attempt.to_string(),
                    reason: "canceled by jobcenter".into(),
                };
                let Some(mut client) = peers.client(&address) else { return };
                if let Err(status) = client.cancel(peers.request(message)).await {
                    tracing::warn!(instance = %address, %handler, error = %status, "could not stop an attempt on another instance's worker");
                }
            });
        }
    }
}
