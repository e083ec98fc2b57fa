//! The scheduler loop: every job type with a connected detector is visited
//! at its own detection interval; a detector worker is asked what needs
//! doing, and the proposals of that run become one DAG job. Job types run
//! independently (a slow detection or job of one never holds up another),
//! every decision goes to a bounded activity log, and each type keeps its
//! last successful and failed runs.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, Notify};
use tracing::Instrument;

use crate::clock::{Clock, Timestamp};
use crate::engine::EngineHandle;
use crate::jobfile::Limits;
use crate::model::notify::Kind;
use crate::model::{HandlerId, JobId, JobOrigin};
use crate::proto::plugin::{admin_to_worker_message, AdminToWorkerMessage, JobProposal, RunDetectionRequest};
use crate::scheduler::{build_job, filter, Dropped, Due, Proposal};
use crate::server::cluster::peer::Peers;
use crate::server::cluster::{self, Topology};
use crate::server::duties::{Duties, DutyError};
use crate::server::policies::Policies;
use crate::server::seaweedfs::{master, SeaweedFs};
use crate::server::surface::metrics::Metrics;
use crate::server::workers::registry::Registry;
use crate::store::cluster::Role;
use crate::wire;

/// Activity entries kept (and persisted).
const MAX_ACTIVITIES: usize = 4000;
/// Runs kept per job type and outcome.
const MAX_RUNS: usize = 10;
/// Each activity entry is a setting of its own under this prefix, its key in
/// time order, so that a new entry writes one key (and removes the oldest).
const ACTIVITY_PREFIX: &str = "scheduler/activity/";
/// Where an earlier build kept the whole log as one value; read once and converted.
const LEGACY_ACTIVITIES_KEY: &str = "scheduler/activities";
const RUNS_PREFIX: &str = "scheduler/runs/";

/// What a detector sends back about one detection request.
#[derive(Debug)]
pub(crate) enum DetectionEvent {
    Proposals(Vec<JobProposal>),
    Activity(String),
    Complete { success: bool, error: String },
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub(crate) struct Activity {
    pub at_ms: i64,
    pub job_type: String,
    pub message: String,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub(crate) struct Run {
    pub at_ms: i64,
    pub duration_ms: i64,
    pub detector: String,
    pub proposals: usize,
    pub kept: usize,
    pub job_id: Option<String>,
    pub error: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub(crate) struct Runs {
    pub succeeded: VecDeque<Run>,
    pub failed: VecDeque<Run>,
}

/// What a detection run found, and the job it made (when it ran one).
#[derive(Debug, Default)]
pub(crate) struct Outcome {
    pub proposals: Vec<Proposal>,
    pub dropped: Vec<Dropped>,
    pub job: Option<JobId>,
}

/// The scheduler's own state, which its `Board` shares.
#[derive(Default)]
struct SchedulerState {
    routes: Mutex<HashMap<String, mpsc::UnboundedSender<DetectionEvent>>>,
    due: Mutex<Due>,
    wake: Notify,
    in_flight: super::flight::Gates<String>,
    last_detector: Mutex<HashMap<String, HandlerId>>,
    /// Each entry with the key it is stored under.
    activities: Mutex<VecDeque<(String, Activity)>>,
    runs: Mutex<HashMap<String, Runs>>,
    sequence: AtomicU64,
    activity_sequence: AtomicU64,
    /// The scheduler loop is paused (alone; in a cluster, the node says).
    paused: AtomicBool,
}

/// A detection's entry in the routes, removed when it is dropped: a
/// detection cut short (its caller hung up) leaves no route behind.
struct Route<'a> {
    state: &'a SchedulerState,
    request_id: String,
}

impl<'a> Route<'a> {
    fn open(state: &'a SchedulerState, request_id: &str, tx: mpsc::UnboundedSender<DetectionEvent>) -> Route<'a> {
        state.routes.lock().expect("routes lock").insert(request_id.to_string(), tx);
        Route { state, request_id: request_id.to_string() }
    }
}

impl Drop for Route<'_> {
    fn drop(&mut self) {
        self.state.routes.lock().expect("routes lock").remove(&self.request_id);
    }
}

/// What the rest of the server reaches of the scheduler: the routes to
/// the detections under way, its wake-up and pause, the activity log and
/// the run histories, with the engine and the duties that write them.
/// Cheap to clone.
#[derive(Clone)]
pub(crate) struct Board {
    state: Arc<SchedulerState>,
    engine: EngineHandle,
    clock: Arc<dyn Clock>,
    duties: Duties,
}

impl Board {
    pub(crate) fn new(engine: EngineHandle, clock: Arc<dyn Clock>, duties: Duties) -> Board {
        Board { state: Arc::default(), engine, clock, duties }
    }

    /// Detections under way, and routes open to their detectors.
    pub(crate) fn in_flight(&self) -> (usize, usize) {
        (self.state.in_flight.len(), self.state.routes.lock().expect("routes lock").len())
    }

    /// Hands a detector's message to the detection waiting for it.
    pub(crate) fn route(&self, request_id: &str, event: DetectionEvent) -> bool {
        let routes = self.state.routes.lock().expect("routes lock");
        routes.get(request_id).is_some_and(|tx| tx.send(event).is_ok())
    }

    /// Wakes the loop (a policy changed, a worker came, a trigger).
    pub(crate) fn wake(&self) {
        self.state.wake.notify_one();
    }

    /// Pauses or resumes the loop of an instance alone.
    pub(crate) fn set_paused(&self, paused: bool) {
        self.state.paused.store(paused, Ordering::Relaxed);
    }

    pub(crate) fn activities(&self) -> Vec<Activity> {
        self.state.activities.lock().expect("activities lock").iter().map(|(_, a)| a.clone()).collect()
    }

    /// Adds an entry to the bounded activity log; it is written with the
    /// engine's next step (the oldest entry past the bound goes with it).
    pub(crate) fn record(&self, job_type: &str, message: String) {
        tracing::info!(job_type, message, "scheduler");
        let at_ms = self.clock.now().as_millis();
        let n = self.state.activity_sequence.fetch_add(1, Ordering::Relaxed) % 1_000_000;
        let key = format!("{ACTIVITY_PREFIX}{at_ms:013}-{n:06}");
        let entry = Activity { at_ms, job_type: job_type.to_string(), message };
        let Ok(bytes) = serde_json::to_vec(&entry) else { return };
        let mut settings = vec![(key.clone(), Some(bytes))];
        {
            let mut activities = self.state.activities.lock().expect("activities lock");
            activities.push_back((key, entry));
            while activities.len() > MAX_ACTIVITIES {
                if let Some((old, _)) = activities.pop_front() {
                    settings.push((old, None));
                }
            }
        }
        let engine = self.engine.clone();
        self.duties.spawn(async move {
            if let Err(e) = engine.put_settings(settings).await {
                tracing::error!(error = %e, "cannot store the activity log");
            }
        });
    }

    /// Loads the activity log and the run history a previous run kept.
    async fn load(&self) {
        let store = self.engine.store().clone();
        let loaded = tokio::task::spawn_blocking(move || {
            let activities = store.settings(ACTIVITY_PREFIX)?;
            let legacy = store.settings(LEGACY_ACTIVITIES_KEY)?;
            let runs = store.settings(RUNS_PREFIX)?;
            Ok::<_, crate::store::Error>((activities, legacy, runs))
        })
        .await;
        let Ok(Ok((stored, legacy, runs))) = loaded else {
            tracing::error!("cannot read the activity log and run history");
            return;
        };
        let mut activities: VecDeque<(String, Activity)> = VecDeque::new();
        let mut converted = Vec::new();
        if let Some((key, bytes)) = legacy.into_iter().find(|(k, _)| k == LEGACY_ACTIVITIES_KEY) {
            let saved: VecDeque<Activity> = serde_json::from_slice(&bytes).unwrap_or_default();
            for (n, entry) in saved.into_iter().enumerate() {
                let key = format!("{ACTIVITY_PREFIX}{:013}-legacy{n:06}", entry.at_ms);
                converted.push((key.clone(), serde_json::to_vec(&entry).ok()));
                activities.push_back((key, entry));
            }
            converted.push((key, None));
        }
        for (key, bytes) in stored {
            if let Ok(entry) = serde_json::from_slice::<Activity>(&bytes) {
                activities.push_back((key, entry));
            }
        }
        activities.make_contiguous().sort_by(|a, b| a.0.cmp(&b.0));
        while activities.len() > MAX_ACTIVITIES {
            if let Some((old, _)) = activities.pop_front() {
                converted.push((old, None));
            }
        }
        *self.state.activities.lock().expect("activities lock") = activities;
        let runs: HashMap<String, Runs> = runs
            .into_iter()
            .filter_map(|(key, bytes)| {
                Some((key[RUNS_PREFIX.len()..].to_string(), serde_json::from_slice(&bytes).ok()?))
            })
            .collect();
        *self.state.runs.lock().expect("runs lock") = runs;
        if !converted.is_empty() && self.engine.put_settings(converted).await.is_err() {
            tracing::error!("cannot convert the activity log");
        }
    }

    pub(crate) fn runs(&self, job_type: &str) -> Runs {
        self.state.runs.lock().expect("runs lock").get(job_type).cloned().unwrap_or_default()
    }

    async fn save_run(&self, job_type: &str, run: Run) {
        let bytes = {
            let mut all = self.state.runs.lock().expect("runs lock");
            let runs = all.entry(job_type.to_string()).or_default();
            let list = if run.error.is_some() { &mut runs.failed } else { &mut runs.succeeded };
            list.push_front(run);
            list.truncate(MAX_RUNS);
            serde_json::to_vec(&*runs)
        };
        let key = format!("{RUNS_PREFIX}{job_type}");
        match bytes {
            Ok(bytes) => {
                if let Err(e) = self.engine.put_settings(vec![(key, Some(bytes))]).await {
                    tracing::error!(job_type, error = %e, "cannot store the run history");
                }
            }
            Err(e) => tracing::error!(job_type, error = %e, "cannot encode the run history"),
        }
    }
}

/// Job types some connected worker can detect, with their detectors.
fn detectors(registry: &Registry) -> BTreeMap<String, Vec<HandlerId>> {
    let mut out: BTreeMap<String, Vec<HandlerId>> = BTreeMap::new();
    for worker in registry.workers() {
        for capability in worker.capabilities.iter().filter(|c| c.can_detect) {
            out.entry(capability.job_type.clone()).or_default().push(worker.handler);
        }
    }
    out
}

/// The scheduler's detections: its board, and what a detection reads and
/// asks (the detectors connected, the policies, the other instances'
/// dedupe keys, the SeaweedFS cluster's context, lock and capacity).
pub(crate) struct Scheduler {
    pub(crate) board: Board,
    pub(crate) registry: Registry,
    pub(crate) policies: Policies,
    pub(crate) topology: Topology,
    pub(crate) peers: Peers,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) seaweedfs: SeaweedFs,
    /// A detection's job is a job like any other.
    pub(crate) limits: Limits,
    /// A detection that fails is a notification (`detection.failed`).
    pub(crate) notifier: Arc<crate::server::notify::Notifier>,
}

impl Scheduler {
    /// Whether the scheduler loop of this instance is paused.
    pub(crate) fn paused(&self) -> bool {
        match &self.topology {
            Topology::Member(node) => node.is_paused(),
            Topology::Alone => self.board.state.paused.load(Ordering::Relaxed),
        }
    }

    /// The loop of an instance alone: run what is due, then sleep until the
    /// next due time or a wake-up.
    pub(crate) async fn detections(self: Arc<Self>) {
        let state = &self.board.state;
        self.board.load().await;
        loop {
            if self.paused() {
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(500)) => {}
                    () = state.wake.notified() => {}
                }
                continue;
            }
            let now = self.board.clock.now();
            let types = detectors(&self.registry);
            let mut next: Option<Timestamp> = None;
            for job_type in types.keys() {
                let (policy, _) = self.policies.effective(job_type);
                if policy.detection_enabled == 0 {
                    continue;
                }
                // Outside its maintenance window a type is not detected: the
                // loop wakes when the window opens, and it is due then.
                let window = self.policies.window(job_type).map(|window| window.calendar.state(now));
                if let Some(window) = window.filter(|window| !window.open) {
                    next = [next, window.next_change].into_iter().flatten().min();
                    continue;
                }
                let interval = u64::from(policy.detection_interval_seconds.max(1));
                if state.in_flight.is_taken(job_type) {
                    continue;
                }
                let due = state.due.lock().expect("due lock").mark_detection_due(job_type, interval, now);
                if due {
                    let scheduler = self.clone();
                    let job_type = job_type.clone();
                    self.board.duties.spawn(async move {
                        if let Err(e) = scheduler.detect(&job_type, true).await {
                            tracing::debug!(job_type, error = %e, "detection did not run");
                        }
                    });
                }
                let at = state.due.lock().expect("due lock").next_due([job_type.as_str()], now);
                next = match (next, at) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
            let wait = next
                .map(|at| Duration::from_millis(at.millis_since(self.board.clock.now())))
                .unwrap_or(Duration::from_secs(60));
            let wait = wait.clamp(Duration::from_millis(50), Duration::from_secs(60));
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = state.wake.notified() => {}
            }
        }
    }

    /// The loop of an instance among several: intervals are counted on the
    /// database's clock (slot = its time divided by the interval), and each
    /// slot of each job type is claimed in the database by exactly one
    /// instance. The slots of a type take turns over the live instances that
    /// have a detector for it; when the instance whose turn it is has not
    /// claimed a slot by its middle (it died, or is paused), any other claims it.
    pub(crate) async fn cluster_detections(self: Arc<Self>, node: Arc<cluster::Node>) {
        let state = &self.board.state;
        self.board.load().await;
        let mut tried: HashMap<String, i64> = HashMap::new();
        loop {
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(100)) => {}
                () = state.wake.notified() => {}
            }
            if node.is_paused() {
                continue;
            }
            let now_ms = node.db_now_ms();
            for job_type in detectors(&self.registry).into_keys() {
                let (policy, _) = self.policies.effective(&job_type);
                if policy.detection_enabled == 0 {
                    continue;
                }
                // Outside its maintenance window, on the database's clock, a type is not detected.
                if self.policies.window(&job_type).is_some_and(|w| !w.calendar.is_open(Timestamp(now_ms))) {
                    continue;
                }
                let interval = Duration::from_secs(u64::from(policy.detection_interval_seconds.max(1)));
                let interval_ms = interval.as_millis() as i64;
                let slot = now_ms.div_euclid(interval_ms);
                if tried.get(&job_type).is_some_and(|last| *last >= slot) {
                    continue;
                }
                if state.in_flight.is_taken(&job_type) {
                    continue;
                }
                let turns = node.detecting_servers(&job_type, true);
                let turn = turns[slot.rem_euclid(turns.len() as i64) as usize];
                let into_slot = now_ms - slot * interval_ms;
                if turn != node.id && into_slot < interval_ms / 2 {
                    continue;
                }
                tried.insert(job_type.clone(), slot);
                let scheduler = self.clone();
                let node = node.clone();
                self.board.duties.spawn(async move {
                    let store = scheduler.board.engine.store().clone();
                    let claim_type = job_type.clone();
                    let claimed = tokio::task::spawn_blocking(move || {
                        store.cluster().expect("cluster").claim_detection(&claim_type, interval, slot)
                    })
                    .await;
                    match claimed {
                        Ok(Ok(true)) => {
                            node.note_detection(&job_type);
                            if let Err(e) = scheduler.detect(&job_type, true).await {
                                tracing::debug!(job_type, error = %e, "detection did not run");
                            }
                        }
                        Ok(Ok(false)) => tracing::trace!(job_type, slot, "another instance detects this interval"),
                        Ok(Err(crate::store::Error::Fenced { .. })) => {
                            cluster::deactivated(&scheduler.board.engine, &node)
                        }
                        Ok(Err(e)) => tracing::warn!(job_type, error = %e, "cannot claim a detection"),
                        Err(e) => tracing::warn!(job_type, error = %e, "cannot claim a detection"),
                    }
                });
            }
        }
    }

    /// Asks a detector what needs doing for `job_type`; with `run`, makes the
    /// proposals one job. One detection per job type at a time.
    pub(crate) async fn detect(&self, job_type: &str, run: bool) -> Result<Outcome, DutyError> {
        // A detection already running is waited for (within its timeout), not doubled.
        let (policy, _) = self.policies.effective(job_type);
        let patience = Duration::from_secs(u64::from(policy.detection_timeout_seconds.max(1)) + 5);
        let deadline = tokio::time::Instant::now() + patience;
        let key = job_type.to_string();
        let _pass = loop {
            if let Some(pass) = self.board.state.in_flight.enter(&key) {
                break pass;
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(DutyError::Busy(format!("a detection of {job_type} is already running")));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let span = tracing::info_span!(
            target: crate::traces::TARGET,
            "detection",
            job.type = job_type,
            run,
            proposals = tracing::field::Empty,
            kept = tracing::field::Empty,
            job.id = tracing::field::Empty,
            error = tracing::field::Empty,
        );
        let result = self.detect_inner(job_type, run).instrument(span.clone()).await;
        match &result {
            Ok(outcome) => {
                span.record("proposals", outcome.proposals.len() + outcome.dropped.len());
                span.record("kept", outcome.proposals.len());
                if let Some(job) = &outcome.job {
                    span.record("job.id", tracing::field::display(job));
                }
            }
            Err(e) => {
                span.record("error", tracing::field::display(e));
            }
        }
        result
    }

    async fn detect_inner(&self, job_type: &str, run: bool) -> Result<Outcome, DutyError> {
        let board = &self.board;
        let started = board.clock.now();
        let (detector, sequence) = self.pick_detector(job_type)?;
        self.metrics.record_detection(job_type);
        let (policy, _) = self.policies.effective(job_type);
        let request_id = format!("detect-{job_type}-{}-{sequence}", started.as_millis());
        let (tx, rx) = mpsc::unbounded_channel();
        let route = Route::open(&board.state, &request_id, tx);
        let message = self.detection_request(job_type, &policy, request_id, sequence, started);
        board.record(job_type, format!("detection {sequence} asked of handler {detector}"));
        let (result, proposals) = self.ask(job_type, &policy, detector, message, rx).await;
        drop(route);
        let mut run_record = Run {
            at_ms: started.as_millis(),
            duration_ms: board.clock.now().as_millis() - started.as_millis(),
            detector: detector.to_string(),
            proposals: proposals.len(),
            ..Run::default()
        };
        // What the other jobs already do is asked only of a detection that succeeded.
        let active = match result {
            Ok(()) => {
                self.metrics.record_proposals(job_type, proposals.len() as u64);
                self.active_dedupe_keys().await.map_err(|e| ("set aside", e))
            }
            Err(e) => {
                self.metrics.record_detection_failure(job_type);
                let payload = serde_json::json!({
                    "job_type": job_type,
                    "detector": detector.to_string(),
                    "sequence": sequence,
                    "error": e.to_string(),
                });
                self.notifier.record(Kind::DetectionFailed, payload).await;
                Err(("failed", e))
            }
        };
        let active = match active {
            Ok(active) => active,
            Err((what, e)) => {
                board.record(job_type, format!("detection {sequence} {what}: {e}"));
                run_record.error = Some(e.to_string());
                board.save_run(job_type, run_record).await;
                return Err(e);
            }
        };
        let now = board.clock.now();
        let policies = &self.policies;
        let proposals: Vec<Proposal> = proposals.iter().map(|p| to_proposal(job_type, p, policies)).collect();
        let (kept, mut dropped) = filter(proposals, &active, now);
        let kept = self.place_on_capacity(job_type, kept, &mut dropped).await;
        for d in &dropped {
            board.record(job_type, format!("proposal {} dropped: {}", d.proposal_id, d.reason));
        }
        let mut outcome = Outcome { proposals: kept, dropped, job: None };
        run_record.kept = outcome.proposals.len();
        if run && !outcome.proposals.is_empty() {
            let job = self.submit(job_type, &policy, sequence, &outcome.proposals).await?;
            run_record.job_id = Some(job.to_string());
            outcome.job = Some(job);
        } else {
            board.record(job_type, format!("detection {sequence}: {} proposals, no job", outcome.proposals.len()));
        }
        board.save_run(job_type, run_record).await;
        Ok(outcome)
    }

    /// The worker to ask, and the run's sequence number: the one that
    /// detected last time if it still can, otherwise each in turn.
    fn pick_detector(&self, job_type: &str) -> Result<(HandlerId, u64), DutyError> {
        let state = &self.board.state;
        let candidates = detectors(&self.registry).remove(job_type).unwrap_or_default();
        let previous = state.last_detector.lock().expect("detector lock").get(job_type).copied();
        let sequence = state.sequence.fetch_add(1, Ordering::Relaxed) + 1;
        let detector = match previous.filter(|p| candidates.contains(p)) {
            Some(p) => p,
            None => *candidates
                .get(sequence as usize % candidates.len().max(1))
                .ok_or_else(|| DutyError::NotNow(format!("no connected worker can detect {job_type}")))?,
        };
        state.last_detector.lock().expect("detector lock").insert(job_type.to_string(), detector);
        Ok((detector, sequence))
    }

    /// The request a detector gets: the type's policy and configuration,
    /// the cluster as SeaweedFS describes it, and when a run last succeeded.
    fn detection_request(
        &self,
        job_type: &str,
        policy: &crate::policy::Policy,
        request_id: String,
        sequence: u64,
        started: Timestamp,
    ) -> AdminToWorkerMessage {
        let request = RunDetectionRequest {
            request_id: request_id.clone(),
            job_type: job_type.to_string(),
            detection_sequence: started.as_millis().saturating_mul(1_000_000) + sequence as i64,
            admin_runtime: Some(policy.to_runtime()),
            admin_config_values: self.policies.admin_values(job_type),
            worker_config_values: self.policies.worker_values(job_type),
            cluster_context: Some(self.seaweedfs.context(&self.policies, &self.registry, job_type, false)),
            last_successful_run: self.board.runs(job_type).succeeded.front().map(|r| prost_types::Timestamp {
                seconds: r.at_ms.div_euclid(1000),
                nanos: (r.at_ms.rem_euclid(1000) * 1_000_000) as i32,
            }),
            max_results: i32::try_from(policy.max_jobs_per_detection).unwrap_or(i32::MAX),
        };
        AdminToWorkerMessage {
            request_id,
            sent_at: None,
            body: Some(admin_to_worker_message::Body::RunDetectionRequest(request)),
        }
    }

    /// Sends the request to `detector` and gathers what it proposes until it
    /// says it is done, fails, or runs out of time; with SeaweedFS masters,
    /// a detection of the default lane holds the cluster's admin lock (the
    /// other lanes never wait for it). What it proposed, even if it failed.
    async fn ask(
        &self,
        job_type: &str,
        policy: &crate::policy::Policy,
        detector: HandlerId,
        message: AdminToWorkerMessage,
        mut events: mpsc::UnboundedReceiver<DetectionEvent>,
    ) -> (Result<(), DutyError>, Vec<JobProposal>) {
        let board = &self.board;
        let timeout = Duration::from_secs(u64::from(policy.detection_timeout_seconds.max(1)));
        let mut proposals = Vec::new();
        let detection = async {
            if !self.registry.send(detector, message) {
                return Err(DutyError::NotNow("the detector's stream is gone".into()));
            }
            let deadline = tokio::time::Instant::now() + timeout;
            loop {
                match tokio::time::timeout_at(deadline, events.recv()).await {
                    Err(_) => return Err(DutyError::Failed(format!("no detection result within {timeout:?}"))),
                    Ok(None) => return Err(DutyError::Failed("the detection was abandoned".into())),
                    Ok(Some(DetectionEvent::Proposals(batch))) => proposals.extend(batch),
                    Ok(Some(DetectionEvent::Activity(text))) => board.record(job_type, format!("detector: {text}")),
                    Ok(Some(DetectionEvent::Complete { success: true, .. })) => return Ok(()),
                    Ok(Some(DetectionEvent::Complete { success: false, error, .. })) => {
                        return Err(DutyError::Failed(format!("detection failed: {error}")));
                    }
                }
            }
        };
        let result = if !self.seaweedfs.has_masters() || master::lane(job_type) != "default" {
            detection.await
        } else {
            let holder = format!("jobcenter detection of {job_type}");
            match self.seaweedfs.hold(&holder, timeout).await {
                Ok(_hold) => detection.await,
                Err(e) => {
                    drop(detection);
                    Err(DutyError::NotNow(e.to_string()))
                }
            }
        };
        (result, proposals)
    }

    /// Submits the kept proposals of detection `sequence` as one job, and
    /// bounds its runtime as the type's policy says.
    async fn submit(
        &self,
        job_type: &str,
        policy: &crate::policy::Policy,
        sequence: u64,
        proposals: &[Proposal],
    ) -> Result<JobId, DutyError> {
        let name = format!("{job_type}-{sequence}");
        let spec = build_job(
            &name,
            proposals,
            policy.retry_limit,
            policy.retry_backoff_seconds,
            policy.execution_timeout_seconds,
            &self.limits,
        )
        .map_err(|e| DutyError::Failed(format!("the proposals make no valid job: {e}")))?;
        let origin = JobOrigin::Scheduler { job_type: job_type.to_string(), sequence };
        let job = self.board.engine.submit(spec, origin).await?;
        self.board.record(job_type, format!("detection {sequence}: {} proposals became job {job}", proposals.len()));
        spawn_runtime_limit(self.board.clone(), job_type.to_string(), job, policy.job_type_max_runtime_seconds);
        Ok(job)
    }

    /// With SeaweedFS masters, proposals that change disks are placed one by one
    /// on the capacity view (the master's figures and the maintenance under
    /// way): one whose target disk would be left with no free slot is set aside,
    /// so two proposals never both fill the same nearly full disk.
    async fn place_on_capacity(
        &self,
        job_type: &str,
        proposals: Vec<Proposal>,
        dropped: &mut Vec<Dropped>,
    ) -> Vec<Proposal> {
        use crate::server::seaweedfs::capacity::{self, Change, Placement};
        if !self.seaweedfs.has_masters() || !capacity::changes_disks(job_type) || proposals.is_empty() {
            return proposals;
        }
        let (Some(topology), _) = self.seaweedfs.topology(true).await else { return proposals };
        let mut placement = Placement::new(&topology, self.seaweedfs.changes());
        let mut kept = Vec::with_capacity(proposals.len());
        for proposal in proposals {
            let change = capacity::where_of_json(&proposal.parameters, &proposal.labels)
                .and_then(|at| Change::plan(format!("proposal {}", proposal.proposal_id), job_type, &at, &topology));
            match change.map(|c| placement.place(c)) {
                Some(Err(why)) => dropped.push(Dropped {
                    proposal_id: proposal.proposal_id.clone(),
                    reason: format!("set aside, its target is too full: {why}"),
                }),
                _ => kept.push(proposal),
            }
        }
        kept
    }

    /// The dedupe keys of every task not ended in the cluster: the jobs led here
    /// and, with several instances, those every other live server leads. A
    /// detection whose view is incomplete (an instance does not answer, or jobs
    /// are between leaders) is set aside until the next interval rather than
    /// risk starting work that is already in hand.
    async fn active_dedupe_keys(&self) -> Result<HashSet<String>, DutyError> {
        let mut keys = self.board.engine.active_dedupe_keys().await?;
        let Some(node) = self.topology.member() else { return Ok(keys) };
        // Read now, not as of the last heartbeat: an instance that joined since
        // may already lead jobs.
        let store = self.board.engine.store().clone();
        let instances = tokio::task::spawn_blocking(move || store.cluster().expect("cluster").instances())
            .await
            .map_err(|e| DutyError::Failed(crate::fate::panic_text(e)))??;
        for instance in instances.iter().filter(|i| i.active && i.id != node.id && i.role == Role::Server) {
            match self.peers.dedupe_keys_at(&instance.grpc_address).await {
                Ok(theirs) => keys.extend(theirs),
                Err(e) => {
                    return Err(DutyError::NotNow(format!(
                        "the dedupe keys of instance {} are unknown ({e})",
                        instance.id
                    )))
                }
            }
        }
        let unowned = node.unowned_jobs();
        if unowned > 0 {
            return Err(DutyError::NotNow(format!(
                "{unowned} jobs are between leaders, so their dedupe keys are unknown"
            )));
        }
        Ok(keys)
    }
}

/// A detection's job that outlives its type's max runtime has its remaining tasks canceled.
fn spawn_runtime_limit(board: Board, job_type: String, job: JobId, seconds: u32) {
    if seconds == 0 {
        return;
    }
    let duties = board.duties.clone();
    duties.spawn(async move {
        tokio::time::sleep(Duration::from_secs(u64::from(seconds))).await;
        if let Ok(Some(summary)) = board.engine.summary(job).await {
            if !summary.record.state.is_terminal() && board.engine.cancel(job).await.is_ok() {
                board.record(&job_type, format!("job {job} ran past {seconds} s: its remaining tasks are canceled"));
            }
        }
    });
}

fn millis(t: &Option<prost_types::Timestamp>) -> Option<Timestamp> {
    t.as_ref().filter(|t| t.seconds > 0).map(|t| Timestamp(t.seconds * 1000 + i64::from(t.nanos) / 1_000_000))
}

/// A detector's proposal; one that names no priority takes its job type's policy's.
fn to_proposal(job_type: &str, p: &JobProposal, policies: &Policies) -> Proposal {
    let job_type = if p.job_type.is_empty() { job_type.to_string() } else { p.job_type.clone() };
    let priority = match p.priority {
        0 => policies.effective(&job_type).0.priority,
        named => wire::priority_from_wire(named),
    };
    Proposal {
        proposal_id: p.proposal_id.clone(),
        dedupe_key: p.dedupe_key.clone(),
        job_type,
        priority,
        summary: p.summary.clone(),
        parameters: wire::values_to_json(&p.parameters),
        labels: p.labels.clone().into_iter().collect(),
        not_before: millis(&p.not_before),
        expires_at: millis(&p.expires_at),
    }
}
