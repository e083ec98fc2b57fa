//! The connected workers: what each declared, its last heartbeat, and a
//! way to stop its session when the same worker process connects again.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::clock::Timestamp;
use crate::model::{AttemptId, HandlerId};
use crate::proto::api;
use crate::proto::plugin::{AdminToWorkerMessage, JobTypeCapability, WorkerHeartbeat, WorkerHello};

/// The attempts a worker's session knows, in a cluster, so that the
/// recovery check can tell an attempt its leader assigned but that never
/// reached the worker (the leader died before sending it) from one the
/// worker has: sent on this session, reported running by the worker, or
/// with an outcome received and not yet settled by the job's leader.
#[derive(Debug, Default)]
pub struct Known {
    /// The worker sent a heartbeat on this session: `running` is what it runs.
    heard: bool,
    running: HashSet<AttemptId>,
    /// Sent on this session, or reported on it, until the report is settled.
    in_flight: HashSet<AttemptId>,
}

pub(crate) type KnownAttempts = Arc<Mutex<Known>>;

impl Known {
    /// Sent to the worker, or an outcome received from it.
    pub fn note(&mut self, attempt: AttemptId) {
        self.in_flight.insert(attempt);
    }

    /// Its report was settled by the job's leader: the leader holds it no more.
    pub fn settled(&mut self, attempt: AttemptId) {
        self.in_flight.remove(&attempt);
    }

    /// What the worker runs, as its heartbeat says.
    pub fn heartbeat(&mut self, running: HashSet<AttemptId>) {
        self.heard = true;
        self.running = running;
    }

    /// What was sent on this session or reported on it, not settled yet.
    pub fn in_flight(&self) -> HashSet<AttemptId> {
        self.in_flight.clone()
    }

    /// Whether the session knows the attempt; `None` before its first heartbeat.
    pub fn knows(&self, attempt: AttemptId) -> Option<bool> {
        self.heard.then(|| self.in_flight.contains(&attempt) || self.running.contains(&attempt))
    }

    /// Every attempt the session knows; `None` before its first heartbeat.
    pub fn all(&self) -> Option<Vec<AttemptId>> {
        self.heard.then(|| self.in_flight.union(&self.running).copied().collect())
    }
}

#[derive(Clone, Debug)]
pub struct WorkerEntry {
    pub worker_id: String,
    pub handler: HandlerId,
    pub address: String,
    pub version: String,
    pub capabilities: Vec<JobTypeCapability>,
    pub execution_slots_used: i32,
    pub execution_slots_total: i32,
    pub detection_slots_used: i32,
    pub detection_slots_total: i32,
    pub running_work: u32,
    /// Executions running by job type, as the last heartbeat said.
    pub running_by_type: BTreeMap<String, u32>,
    pub connected_at: Timestamp,
    pub last_heartbeat: Option<Timestamp>,
    /// When the worker last wrote anything on its stream.
    pub last_seen: Timestamp,
    pub heartbeats: u32,
    /// In a cluster: the attempts its session knows.
    pub known: Option<KnownAttempts>,
    session: u64,
    stop: Arc<Notify>,
    /// The worker's stream, for requests that are not work orders (detection).
    outbound: Option<tokio::sync::mpsc::Sender<Result<AdminToWorkerMessage, tonic::Status>>>,
}

impl WorkerEntry {
    pub fn to_api(&self) -> api::Worker {
        api::Worker {
            worker_id: self.worker_id.clone(),
            handler: self.handler.to_string(),
            address: self.address.clone(),
            version: self.version.clone(),
            capabilities: self
                .capabilities
                .iter()
                .map(|c| api::Capability {
                    job_type: c.job_type.clone(),
                    can_detect: c.can_detect,
                    can_execute: c.can_execute,
                    max_detection_concurrency: c.max_detection_concurrency,
                    max_execution_concurrency: c.max_execution_concurrency,
                })
                .collect(),
            execution_slots_used: self.execution_slots_used,
            execution_slots_total: self.execution_slots_total,
            detection_slots_used: self.detection_slots_used,
            detection_slots_total: self.detection_slots_total,
            connected_at_ms: self.connected_at.as_millis(),
            last_heartbeat_ms: self.last_heartbeat.map(Timestamp::as_millis).unwrap_or(0),
            heartbeats: self.heartbeats,
            held_attempts: self.running_work,
        }
    }
}

/// Every connected worker's slots and attempts, summed.
#[derive(Clone, Copy, Debug, Default)]
pub struct Totals {
    pub workers: usize,
    pub execution_slots_total: i64,
    pub execution_slots_used: i64,
    /// Attempts the workers run, as their last heartbeats said.
    pub running: u64,
}

/// A session's registration: dropping it does nothing; `stop` ends the session.
pub struct Registration {
    pub session: u64,
    pub stop: Arc<Notify>,
}

/// Cheap to clone: the clones share the workers.
#[derive(Clone, Default)]
pub struct Registry {
    inner: Arc<Mutex<(u64, BTreeMap<HandlerId, WorkerEntry>)>>,
}

impl Registry {
    /// How many worker sessions opened since the start.
    pub fn sessions_opened(&self) -> u64 {
        self.inner.lock().expect("registry lock").0
    }

    /// Registers a worker; a session of the same handler already there is told to stop.
    pub fn register(
        &self,
        handler: HandlerId,
        hello: &WorkerHello,
        now: Timestamp,
        outbound: Option<tokio::sync::mpsc::Sender<Result<AdminToWorkerMessage, tonic::Status>>>,
        known: Option<KnownAttempts>,
    ) -> (Registration, Option<Arc<Notify>>) {
        let mut guard = self.inner.lock().expect("registry lock");
        guard.0 += 1;
        let session = guard.0;
        let stop = Arc::new(Notify::new());
        let entry = WorkerEntry {
            worker_id: hello.worker_id.clone(),
            handler,
            address: hello.address.clone(),
            version: hello.worker_version.clone(),
            capabilities: hello.capabilities.clone(),
            execution_slots_used: 0,
            execution_slots_total: 0,
            detection_slots_used: 0,
            detection_slots_total: 0,
            running_work: 0,
            running_by_type: BTreeMap::new(),
            connected_at: now,
            last_heartbeat: None,
            last_seen: now,
            heartbeats: 0,
            known,
            session,
            stop: stop.clone(),
            outbound,
        };
        let previous = guard.1.insert(handler, entry).map(|old| old.stop);
        (Registration { session, stop }, previous)
    }

    pub fn heartbeat(&self, handler: HandlerId, heartbeat: &WorkerHeartbeat, now: Timestamp) {
        let mut guard = self.inner.lock().expect("registry lock");
        if let Some(entry) = guard.1.get_mut(&handler) {
            entry.execution_slots_used = heartbeat.execution_slots_used;
            entry.execution_slots_total = heartbeat.execution_slots_total;
            entry.detection_slots_used = heartbeat.detection_slots_used;
            entry.detection_slots_total = heartbeat.detection_slots_total;
            entry.running_work = heartbeat.running_work.len() as u32;
            entry.running_by_type.clear();
            for work in &heartbeat.running_work {
                *entry.running_by_type.entry(work.job_type.clone()).or_default() += 1;
            }
            entry.last_heartbeat = Some(now);
            entry.heartbeats += 1;
        }
    }

    /// Sends a request on the worker's stream; false if it is gone or its queue is full.
    pub fn send(&self, handler: HandlerId, message: AdminToWorkerMessage) -> bool {
        let outbound = self.inner.lock().expect("registry lock").1.get(&handler).and_then(|e| e.outbound.clone());
        outbound.is_some_and(|o| o.try_send(Ok(message)).is_ok())
    }

    /// Ends every session (the server is stopping).
    pub fn stop_all(&self) {
        for entry in self.inner.lock().expect("registry lock").1.values() {
            entry.stop.notify_one();
        }
    }

    /// The worker id behind a handler, while it is connected.
    pub fn worker_id(&self, handler: &str) -> Option<String> {
        let guard = self.inner.lock().expect("registry lock");
        guard.1.values().find(|e| e.handler.to_string() == handler).map(|e| e.worker_id.clone())
    }

    /// What the worker's session knows of its attempts, in a cluster.
    pub fn known(&self, handler: HandlerId) -> Option<KnownAttempts> {
        self.inner.lock().expect("registry lock").1.get(&handler).and_then(|e| e.known.clone())
    }

    /// Ends the worker's session.
    pub fn stop(&self, handler: HandlerId) {
        if let Some(entry) = self.inner.lock().expect("registry lock").1.get(&handler) {
            entry.stop.notify_one();
        }
    }

    /// The worker wrote something.
    pub fn seen(&self, handler: HandlerId, now: Timestamp) {
        if let Some(entry) = self.inner.lock().expect("registry lock").1.get_mut(&handler) {
            entry.last_seen = now;
        }
    }

    /// Removes the worker if `session` is still its session; true if it was.
    pub fn unregister(&self, handler: HandlerId, session: u64) -> bool {
        let mut guard = self.inner.lock().expect("registry lock");
        if guard.1.get(&handler).is_some_and(|e| e.session == session) {
            guard.1.remove(&handler);
            true
        } else {
            false
        }
    }

    /// A page of the workers in the order of their ids (then handlers),
    /// and how many are connected: only the page is copied.
    pub fn page(&self, offset: usize, limit: usize) -> (Vec<WorkerEntry>, usize) {
        let guard = self.inner.lock().expect("registry lock");
        let mut all: Vec<&WorkerEntry> = guard.1.values().collect();
        let total = all.len();
        all.sort_unstable_by(|a, b| (&a.worker_id, a.handler).cmp(&(&b.worker_id, b.handler)));
        (all.into_iter().skip(offset).take(limit).cloned().collect(), total)
    }

    /// The slots and attempts of every connected worker, summed.
    pub fn totals(&self) -> Totals {
        let guard = self.inner.lock().expect("registry lock");
        let mut totals = Totals { workers: guard.1.len(), ..Totals::default() };
        for entry in guard.1.values() {
            totals.execution_slots_total += i64::from(entry.execution_slots_total);
            totals.execution_slots_used += i64::from(entry.execution_slots_used);
            totals.running += u64::from(entry.running_work);
        }
        totals
    }

    pub fn workers(&self) -> Vec<WorkerEntry> {
        self.inner.lock().expect("registry lock").1.values().cloned().collect()
    }

    pub fn len(&self) -> usize {
        self.inner.lock().expect("registry lock").1.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn handlers(&self) -> Vec<HandlerId> {
        self.inner.lock().expect("registry lock").1.keys().copied().collect()
    }
}
