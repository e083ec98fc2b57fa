//! The engine loop's state and every step it applies. Pure bookkeeping over
//! memory: each command appends its writes to the iteration's `Step` and
//! defers its effects (replies, work orders, events) until the committer
//! has made that step durable.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use jobcenter_recovery as recovery;
use tokio::sync::{broadcast, oneshot};

use super::attempts::{Ending, Held, Ledger};
use super::{Answer, Error, Event, Options, Orphans, Progress, Summary, Waiters};
use crate::active::ActiveJob;
use crate::clock::Timestamp;
use crate::dispatch::{Assignment, Dispatch, FreeSlots, HandlerSpec, Place, Sink, TypeLimits, WorkOrder};
use crate::follower::{self, Loss, Outcome, Rejection, Released};
use crate::leader;
use crate::model::{
    AttemptId, HandlerId, JobId, JobOrigin, JobRecord, JobSpec, TaskIdx, TaskRecord, TaskRef, TaskState,
};
use crate::store::{Batch, StoredJob};

mod cluster;
mod handler;
mod job;
mod query;
mod report;
#[cfg(test)]
mod tests;

pub(super) type Reply<T> = oneshot::Sender<T>;

/// What taking the next queued task of a type came to.
enum Take {
    /// Nothing is queued.
    Empty,
    /// The task popped may not run now (or no longer exists); try the next.
    Skipped,
    Assigned(Assignment),
}

/// Every step the engine applies, by what it is about.
pub(super) enum Command {
    Job(JobCommand),
    Report(ReportCommand),
    Handler(HandlerCommand),
    Cluster(ClusterCommand),
    Query(Query),
}

impl From<JobCommand> for Command {
    fn from(command: JobCommand) -> Command {
        Command::Job(command)
    }
}

impl From<ReportCommand> for Command {
    fn from(command: ReportCommand) -> Command {
        Command::Report(command)
    }
}

impl From<HandlerCommand> for Command {
    fn from(command: HandlerCommand) -> Command {
        Command::Handler(command)
    }
}

impl From<ClusterCommand> for Command {
    fn from(command: ClusterCommand) -> Command {
        Command::Cluster(command)
    }
}

impl From<Query> for Command {
    fn from(command: Query) -> Command {
        Command::Query(command)
    }
}

/// Jobs and their types: submit, cancel, retry, remove, settings, limits and gates, and recovery's actions on them.
pub(super) enum JobCommand {
    Submit {
        id: JobId,
        spec: Arc<JobSpec>,
        origin: JobOrigin,
        reply: Reply<Result<JobId, Error>>,
    },
    Cancel {
        job: JobId,
        reply: Reply<Result<(), Error>>,
    },
    /// `removals`: how many removals were durable before the caller read the
    /// job; `None` answers that it must be read again (one became durable since).
    Retry {
        job: StoredJob,
        removals: u64,
        reply: Reply<Option<Result<(), Error>>>,
    },
    /// Removes ended jobs (retention) that are not led here; answers, once
    /// durable, how many were asked for removal.
    Remove {
        jobs: Vec<JobId>,
        reply: Reply<usize>,
    },
    PutSettings {
        settings: Vec<(String, Option<Vec<u8>>)>,
        reply: Reply<()>,
    },
    SetLimits {
        job_type: Arc<str>,
        limits: TypeLimits,
    },
    Gate {
        gated: Vec<Arc<str>>,
        open: bool,
        /// (queued, running) attempts of gated job types.
        reply: Reply<(usize, u32)>,
    },
    ApplyRecovery {
        actions: Vec<(recovery::Rule, recovery::Action)>,
        reply: Reply<Vec<bool>>,
    },
}

/// What a handler reports of an attempt it holds: started, progress, its outcome, or that it gave it up.
pub(super) enum ReportCommand {
    Started {
        attempt: AttemptId,
        handler: HandlerId,
        reply: Option<Reply<Result<(), Rejection>>>,
    },
    Complete {
        attempt: AttemptId,
        handler: HandlerId,
        outcome: Outcome,
        /// When the report reached the server, to measure dispatch latency.
        received: Option<std::time::Instant>,
        /// Told once the step is durable (or the report refused).
        answer: Option<Answer>,
    },
    Progress {
        attempt: AttemptId,
        handler: HandlerId,
        progress: Progress,
    },
    /// The handler gave the attempt up without an outcome.
    GiveUp {
        attempt: AttemptId,
        handler: HandlerId,
        loss: Loss,
        answer: Option<Answer>,
    },
}

/// Handlers coming and going: connections, slots, reconciliations after a reconnect, and leases renewed.
pub(super) enum HandlerCommand {
    Connected {
        spec: HandlerSpec,
    },
    Disconnected {
        handler: HandlerId,
        session: u64,
        /// `None`: its attempts are lost now; else they wait this long for it.
        keep_for: Option<Duration>,
        reason: String,
    },
    HandlerGone {
        handler: HandlerId,
        loss: Loss,
    },
    HandlerSlots {
        handler: HandlerId,
        total: u32,
    },
    /// The handler runs this many attempts not held here.
    HandlerElsewhere {
        handler: HandlerId,
        running: u32,
    },
    Reconcile {
        handler: HandlerId,
        running: HashSet<AttemptId>,
        dropped_before: Option<Timestamp>,
        reply: Reply<super::Reconciled>,
    },
    /// Which of these attempts the handler holds here (read from memory:
    /// an attempt a worker runs was durable before it was sent).
    Holds {
        handler: HandlerId,
        attempts: Vec<AttemptId>,
        reply: Reply<Vec<AttemptId>>,
    },
    /// A worker without a lease (it drops its work with its stream)
    /// connected as `handler`: the attempts any other handler of the same
    /// worker id holds while away are over now. Answers them.
    Returned {
        handler: HandlerId,
        name: Arc<str>,
        reply: Reply<Vec<Returned>>,
    },
    /// Another instance renews the handler's lease for these attempts: of
    /// those it holds, none is taken back before `keep` from now.
    Vouch {
        handler: HandlerId,
        attempts: Vec<AttemptId>,
        keep: Duration,
        reply: Reply<Vec<AttemptId>>,
    },
}

/// Work between instances on one store: jobs adopted and released, slots reserved, attempts lent and borrowed, permits.
pub(super) enum ClusterCommand {
    /// Takes the lead of jobs claimed from the store (another instance led them).
    Adopt { jobs: Vec<StoredJob>, reply: Reply<usize> },
    /// Stops leading up to `up_to` jobs that no attempt runs for and nobody
    /// waits on, so that other instances may claim them.
    Release { up_to: usize, reply: Reply<Vec<JobId>> },
    /// Reserves the free slots no queued task here can use, to offer them
    /// to the jobs other instances lead.
    Reserve { reply: Reply<Vec<FreeSlots>> },
    /// Attempts another instance lent for the reserved slots of a handler.
    Borrowed { handler: HandlerId, reserved: u32, lent: Vec<Assignment>, reply: Reply<Vec<Assignment>> },
    /// A borrowed attempt's report was settled with its leader.
    ReturnBorrowed { attempt: AttemptId },
    /// Lends queued tasks to another instance's handlers.
    Lend { slots: Vec<FreeSlots>, reply: Reply<Vec<(HandlerId, Assignment)>> },
    /// What this instance asks of the cluster's permits: limited job types and resources.
    PermitDemand { reply: oneshot::Sender<crate::dispatch::Demand> },
    /// The slots of each type's global limit this instance holds, and the
    /// resources (volumes) it holds the cluster's lock of.
    SetPermits { permits: HashMap<Arc<str>, u32>, resources: HashSet<String> },
    /// The handlers connected to the other live instances now.
    PeerHandlers { handlers: HashSet<HandlerId> },
}

/// Reads: each is answered from memory once the step it sees is durable, and changes nothing but who waits.
pub(super) enum Query {
    RecoverySnapshot {
        reply: Reply<(Vec<recovery::JobSnapshot>, Vec<HandlerId>)>,
    },
    ActiveDedupeKeys {
        reply: Reply<HashSet<String>>,
    },
    Get {
        job: JobId,
        reply: Reply<Option<StoredJob>>,
    },
    /// Every attempt held now (answered once the step is durable).
    Attempts {
        reply: Reply<Vec<super::HeldAttempt>>,
    },
    /// One task of a job led here by its id: `None` when the job is not led
    /// here, `Some(None)` when it has no such task.
    Task {
        job: JobId,
        task: super::TaskKey,
        reply: Reply<Option<Option<super::OneTask>>>,
    },
    /// Every job led here, whole, as of one step (answered once it is durable), and that step's time.
    Snapshot {
        reply: Reply<(Timestamp, Vec<StoredJob>)>,
    },
    Summary {
        job: JobId,
        reply: Reply<Option<Summary>>,
    },
    Wait {
        job: JobId,
        reply: Reply<Option<JobRecord>>,
    },
    ActiveJobs {
        reply: Reply<Vec<JobRecord>>,
    },
}

/// The settings that keep what the engine must remember across a restart:
/// cooling resources (`cooling/<resource>`: until when, ms, big-endian) and
/// the workers of handlers without a lease (`handler/<id>`: the worker id).
pub(super) const COOLING: &str = "cooling/";
pub(super) const HANDLER_NAME: &str = "handler/";

/// An attempt that ended because its worker came back without it.
#[derive(Clone, Debug)]
pub struct Returned {
    pub attempt: AttemptId,
    pub task_id: Arc<str>,
    pub job_type: Arc<str>,
    /// Its job came from a detection: it fails whole, and the next
    /// detection proposes the work again.
    pub from_scheduler: bool,
}

/// Work that may only happen after the iteration's batch is durable.
pub(super) enum Action {
    Send { sink: Sink, order: WorkOrder },
    Foreign { to: super::ForeignOrders, handler: HandlerId, order: WorkOrder },
    Reply(Box<dyn FnOnce() + Send>),
    Event(Event),
}

#[derive(Default)]
pub(super) struct Step {
    pub batch: Batch,
    pub actions: Vec<Action>,
}

impl Step {
    fn reply<T: Send + 'static>(&mut self, reply: Reply<T>, value: T) {
        self.actions.push(Action::Reply(Box::new(move || {
            let _ = reply.send(value);
        })));
    }

    fn answer(&mut self, answer: Option<Answer>, result: Result<(), Rejection>) {
        if let Some(answer) = answer {
            self.actions.push(Action::Reply(Box::new(move || answer(result))));
        }
    }

    fn send(&mut self, sink: Option<&Sink>, order: WorkOrder) {
        if let Some(sink) = sink {
            self.actions.push(Action::Send { sink: sink.clone(), order });
        }
    }
}

/// The engine's state: every active job, the dispatch table, the held
/// attempts and the waiters.
pub(super) struct Core {
    options: Options,
    jobs: HashMap<JobId, ActiveJob>,
    dispatch: Dispatch,
    /// Every attempt known here: held, borrowed, or waiting for an absent handler.
    attempts: Ledger,
    waiters: Waiters,
    events: broadcast::Sender<Event>,
    /// When the completion that made each queued task ready reached the server.
    released_at: HashMap<TaskRef, std::time::Instant>,
    /// Handlers connected to the other live instances: alive, though not here.
    peer_handlers: HashSet<HandlerId>,
    /// The worker (its id) of each handler without a lease that holds or
    /// held attempts: such a worker drops its work with its stream, so when
    /// it comes back, under another handler, what its old one holds is over.
    names: HashMap<HandlerId, Arc<str>>,
    /// In a cluster: the resources (volumes) whose lock this instance holds;
    /// a task on another resource waits.
    resource_permits: Option<HashSet<String>>,
    /// Whether a job has tasks on a resource, as first looked up.
    resource_jobs: HashMap<JobId, bool>,
    /// Removals of ended jobs taken (each numbered), and how many of them
    /// are durable, so that a retry never brings back a job being removed.
    removals: u64,
    removals_durable: Arc<std::sync::atomic::AtomicU64>,
    /// Jobs of removals not known to be durable yet, with the removal's number.
    removing: HashMap<JobId, u64>,
}

impl Core {
    pub(super) fn new(options: Options, events: broadcast::Sender<Event>) -> Core {
        Core {
            attempts: Ledger::new(options.rollback_windows.clone()),
            options,
            jobs: HashMap::new(),
            dispatch: Dispatch::default(),
            waiters: HashMap::new(),
            events,
            released_at: HashMap::new(),
            peer_handlers: HashSet::new(),
            names: HashMap::new(),
            resource_permits: None,
            resource_jobs: HashMap::new(),
            removals: 0,
            removals_durable: Arc::default(),
            removing: HashMap::new(),
        }
    }

    /// How many removals are durable, shared with the handle.
    pub(super) fn removals(&self) -> Arc<std::sync::atomic::AtomicU64> {
        self.removals_durable.clone()
    }

    /// What this instance asks of the cluster's permits: its limited job
    /// types, and the resources its ready tasks need or its attempts lock.
    fn permit_demand(&mut self) -> crate::dispatch::Demand {
        // A cooling volume stays locked here, as if still held.
        let mut resources: std::collections::BTreeMap<String, bool> =
            self.attempts.locked_resources().map(|key| (key.clone(), true)).collect();
        self.resource_jobs.retain(|id, _| self.jobs.contains_key(id));
        for (id, job) in &self.jobs {
            let on_resources =
                *self.resource_jobs.entry(*id).or_insert_with(|| job.spec.tasks.iter().any(|t| t.lock().is_some()));
            if !on_resources {
                continue;
            }
            for (spec, record) in job.spec.tasks.iter().zip(&job.tasks) {
                if record.state == TaskState::Ready {
                    if let Some(key) = spec.lock() {
                        resources.entry(key.to_string()).or_insert(false);
                    }
                }
            }
        }
        crate::dispatch::Demand { types: self.dispatch.demand(), resources }
    }

    fn queue_ready(&mut self, job: JobId, ready: &[u32], now: Timestamp) {
        let Some(active) = self.jobs.get(&job) else { return };
        for &idx in ready {
            let spec = &active.spec.tasks[idx as usize];
            let not_before = active.tasks[idx as usize].not_before;
            self.dispatch.push_ready(
                spec.job_type.clone(),
                spec.priority,
                TaskRef { job, idx: TaskIdx(idx) },
                not_before,
                now,
            );
        }
    }

    /// Queues what a step released and finalizes the job if it ended;
    /// `received` is when the report behind the step reached the server.
    fn after_release(
        &mut self,
        job: JobId,
        released: Released,
        received: Option<std::time::Instant>,
        now: Timestamp,
        step: &mut Step,
    ) {
        if let Some(received) = received {
            for &idx in &released.ready {
                self.released_at.insert(TaskRef { job, idx: TaskIdx(idx) }, received);
            }
        }
        self.queue_ready(job, &released.ready, now);
        if released.job_done {
            self.finalize(job, now, step);
        }
    }

    /// The leader's last step: mark the job and let its waiters go.
    fn finalize(&mut self, job: JobId, now: Timestamp, step: &mut Step) {
        let Some(active) = self.jobs.get_mut(&job) else { return };
        if !leader::finalize(active, self.options.instance, now, &mut step.batch) {
            return;
        }
        let record = active.record.clone();
        tracing::info!(job.id = %job, job.state = %record.state, "job ended");
        self.jobs.remove(&job);
        self.dispatch.forget_job(job);
        self.released_at.retain(|task, _| task.job != job);
        for waiter in self.waiters.remove(&job).unwrap_or_default() {
            step.reply(waiter, Some(record.clone()));
        }
    }

    /// Tells a handler to stop an attempt, here or, when it is connected to
    /// another instance, there.
    fn cancel_attempt(&self, handler: HandlerId, task: TaskRef, attempt: u32, step: &mut Step) {
        let order = WorkOrder::Cancel { attempt: AttemptId::new(task, attempt) };
        match (self.dispatch.sink(handler), &self.options.foreign_orders) {
            (Some(sink), _) => step.send(Some(sink), order),
            (None, Some(to)) => {
                step.actions.push(Action::Foreign { to: to.clone(), handler, order });
            }
            (None, None) => {}
        }
    }

    /// The one way an attempt ends, however it ended, held or borrowed: the
    /// ledger forgets it with its volume lock and deadline, and its slot is
    /// free again. One that did not succeed, of a type whose worker undoes
    /// it on its own, keeps its volume locked while that may run
    /// (`Options::rollback_windows`), in the store too.
    fn end(&mut self, attempt: AttemptId, ending: Ending, now: Timestamp, step: &mut Step) {
        let Some(ended) = self.attempts.end(attempt, ending, now) else { return };
        self.dispatch.release_slot(ended.handler, &ended.job_type);
        if let Some((key, until)) = ended.cooling {
            tracing::info!(%attempt, resource = %key, until_ms = until.as_millis(), "an attempt that ended without success keeps its volume locked while its worker may undo it");
            step.batch.settings.push((format!("{COOLING}{key}"), Some(until.as_millis().to_be_bytes().to_vec())));
        }
    }

    /// Volumes whose cooling is over at `now` are forgotten (in the store too).
    fn cooled(&mut self, now: Timestamp, step: &mut Step) {
        for key in self.attempts.cooled(now) {
            step.batch.settings.push((format!("{COOLING}{key}"), None));
        }
    }

    /// What the store kept of cooling resources and of the workers of
    /// handlers without a lease, at start.
    pub(super) fn remember(&mut self, cooling: Vec<(String, Vec<u8>)>, names: Vec<(String, Vec<u8>)>) {
        for (key, value) in cooling {
            let (Some(resource), Ok(bytes)) = (key.strip_prefix(COOLING), <[u8; 8]>::try_from(value.as_slice())) else {
                continue;
            };
            self.attempts.keep_cooling(resource.to_string(), Timestamp(i64::from_be_bytes(bytes)));
        }
        for (key, value) in names {
            let (Some(Ok(handler)), Ok(name)) =
                (key.strip_prefix(HANDLER_NAME).map(str::parse::<HandlerId>), String::from_utf8(value))
            else {
                continue;
            };
            self.names.insert(handler, Arc::from(name));
        }
    }

    /// The one place an attempt becomes held: its slot, lock and deadline.
    fn hold(&mut self, task: TaskRef, attempt: u32, handler: HandlerId, assigned_at: Timestamp) {
        let Some(job) = self.jobs.get(&task.job) else { return };
        let spec = &job.spec.tasks[task.idx.index()];
        let type_timeout = self.dispatch.limits(&spec.job_type).and_then(|l| l.execution_timeout_seconds);
        let held = Held {
            attempt,
            handler,
            job_type: spec.job_type.clone(),
            resource: spec.lock().map(str::to_string),
            deadline: spec.execution_timeout_seconds.or(type_timeout).map(|s| assigned_at.plus_seconds(s)),
            own_timeout: spec.execution_timeout_seconds.is_some(),
        };
        self.dispatch.take_slot(handler, &held.job_type);
        self.attempts.hold(task, held);
    }

    pub(super) fn apply(&mut self, command: Command, now: Timestamp, step: &mut Step) {
        match command {
            Command::Job(command) => self.apply_job(command, now, step),
            Command::Report(command) => self.apply_report(command, now, step),
            Command::Handler(command) => self.apply_handler(command, now, step),
            Command::Cluster(command) => self.apply_cluster(command, now, step),
            Command::Query(query) => self.answer(query, now, step),
        }
    }

    /// A worker without a lease connected as `handler`, under its id
    /// `name`: any other handler of that worker, away, dropped what it held
    /// when its stream broke, so its attempts end now (uncounted: the
    /// worker itself is fine) rather than when it is given up for gone.
    fn returned(&mut self, handler: HandlerId, name: Arc<str>, now: Timestamp, step: &mut Step) -> Vec<Returned> {
        let before: Vec<HandlerId> = self
            .names
            .iter()
            .filter(|(old, old_name)| **old != handler && **old_name == name && !self.dispatch.has_handler(**old))
            .map(|(old, _)| *old)
            .collect();
        let mut ended = Vec::new();
        for old in before {
            self.attempts.back(old);
            self.names.remove(&old);
            step.batch.settings.push((format!("{HANDLER_NAME}{old}"), None));
            let reason = format!(
                "its worker {name} came back without it (a worker without a lease drops its work with its stream)"
            );
            for attempt in self.attempts.of_handler(old) {
                let Some(job) = self.jobs.get(&attempt.task.job) else { continue };
                let spec = &job.spec.tasks[attempt.task.idx.index()];
                ended.push(Returned {
                    attempt,
                    task_id: Arc::from(&*spec.id),
                    job_type: spec.job_type.clone(),
                    from_scheduler: matches!(job.record.origin, JobOrigin::Scheduler { .. }),
                });
                self.lose_attempt(attempt, &Loss::NotCounted(reason.clone()), now, step);
            }
        }
        if self.names.insert(handler, name.clone()).as_deref() != Some(&*name) {
            step.batch.settings.push((format!("{HANDLER_NAME}{handler}"), Some(name.as_bytes().to_vec())));
        }
        ended
    }

    /// Of these attempts, those the handler holds here.
    fn held_by(&self, handler: HandlerId, attempts: Vec<AttemptId>) -> Vec<AttemptId> {
        attempts.into_iter().filter(|a| self.attempts.holds(handler, *a)).collect()
    }

    #[allow(clippy::too_many_arguments)]
    fn complete(
        &mut self,
        task: TaskRef,
        attempt: u32,
        handler: HandlerId,
        outcome: Outcome,
        received: Option<std::time::Instant>,
        now: Timestamp,
        step: &mut Step,
    ) -> Result<(), Rejection> {
        let Some(job) = self.jobs.get_mut(&task.job) else {
            return Err(Rejection::JobEnded { job: task.job });
        };
        let succeeded = matches!(outcome, Outcome::Succeeded { .. });
        // A report may name a task the job does not have: `complete` refuses it.
        let since = job.tasks.get(task.idx.index()).and_then(|t| t.assigned_at);
        let released = follower::complete(job, task.idx.0, attempt, handler, outcome, now, &mut step.batch)?;
        if let (true, Some(since), Some(held)) = (succeeded, since, self.attempts.get(task)) {
            let job_type = held.job_type.clone();
            self.dispatch.record_duration(handler, &job_type, now.as_millis() - since.as_millis(), now);
        }
        let ending = if succeeded { Ending::Succeeded } else { Ending::Unsuccessful };
        self.end(AttemptId::new(task, attempt), ending, now, step);
        self.after_release(task.job, released, received, now, step);
        Ok(())
    }

    /// Every attempt held by `handler` is lost at once.
    fn lose_handler(&mut self, handler: HandlerId, loss: &Loss, now: Timestamp, step: &mut Step) {
        for attempt in self.attempts.of_handler(handler) {
            self.lose_attempt(attempt, loss, now, step);
        }
    }

    /// The held attempt is gone with its handler. A scheduler job is not
    /// resubmitted: it fails whole, and the next detection proposes the work again.
    fn lose_attempt(&mut self, attempt: AttemptId, loss: &Loss, now: Timestamp, step: &mut Step) {
        let from_scheduler = self
            .jobs
            .get(&attempt.task.job)
            .is_some_and(|job| matches!(job.record.origin, JobOrigin::Scheduler { .. }));
        if from_scheduler {
            let reason = format!("the scheduler job was failed, not resubmitted: {}", loss.reason());
            self.fail_job(attempt.task.job, &reason, now, step);
        } else {
            self.lose(attempt, loss, now, step);
        }
    }

    /// Fails a whole job: unfinished tasks fail, running ones are told to stop.
    fn fail_job(&mut self, job_id: JobId, reason: &str, now: Timestamp, step: &mut Step) {
        let Some(job) = self.jobs.get_mut(&job_id) else { return };
        let running = leader::fail_job(job, reason, now, &mut step.batch);
        for (idx, attempt, handler) in running.running {
            let task = TaskRef { job: job_id, idx: TaskIdx(idx) };
            self.end(AttemptId::new(task, attempt), Ending::Unsuccessful, now, step);
            self.cancel_attempt(handler, task, attempt, step);
        }
        self.dispatch.forget_job(job_id);
        self.finalize(job_id, now, step);
    }

    /// The attempt is lost, if it is still the one its task runs.
    fn lose(&mut self, attempt: AttemptId, loss: &Loss, now: Timestamp, step: &mut Step) {
        let limit = self.options.lost_attempt_limit;
        let task = attempt.task;
        let Some(job) = self.jobs.get_mut(&task.job) else { return };
        let record = &job.tasks[task.idx.index()];
        if !record.state.is_held() || record.attempt != attempt.number {
            return;
        }
        let released = follower::lose(job, task.idx.0, loss, limit, now, &mut step.batch);
        self.end(attempt, Ending::Unsuccessful, now, step);
        self.after_release(task.job, released, None, now, step);
    }

    /// A plain snapshot of the active jobs for the recovery rules: each job
    /// with its held and ready tasks, and the handlers that are connected or
    /// still within the time their attempts wait for them.
    fn recovery_snapshot(&self, now: Timestamp) -> (Vec<recovery::JobSnapshot>, Vec<HandlerId>) {
        let jobs = self
            .jobs
            .values()
            .map(|job| {
                let tasks = job
                    .tasks
                    .iter()
                    .enumerate()
                    .filter(|(_, t)| t.state.is_held() || t.state == TaskState::Ready)
                    .map(|(idx, t)| {
                        let spec = &job.spec.tasks[idx];
                        recovery::TaskSnapshot {
                            idx: idx as u32,
                            id: spec.id.to_string(),
                            state: recovery_state(t.state),
                            attempt: t.attempt,
                            handler: t.handler.map(|h| h.to_string()),
                            assigned_at: t.assigned_at.map(Timestamp::as_millis),
                            started_at: t.started_at.map(Timestamp::as_millis),
                            updated_at: t.updated_at.as_millis(),
                            finished_at: t.finished_at.map(Timestamp::as_millis),
                            pinned_node: spec.placement.as_ref().and_then(|p| p.node.as_deref()).map(str::to_string),
                            progress_timeout_ms: t
                                .state
                                .is_held()
                                .then(|| spec.placement.as_ref()?.estimated_runtime_ms.map(|ms| ms.saturating_mul(2)))
                                .flatten(),
                            queued: self.dispatch.is_queued(TaskRef { job: job.id(), idx: TaskIdx(idx as u32) }),
                        }
                    })
                    .collect();
                recovery::JobSnapshot {
                    id: job.id().to_string(),
                    active: !job.record.state.is_terminal(),
                    from_scheduler: matches!(job.record.origin, JobOrigin::Scheduler { .. }),
                    updated_at: job.record.updated_at.as_millis(),
                    unfinished: job.len() - job.counts.terminal() as usize,
                    tasks,
                }
            })
            .collect();
        let mut handlers = self.dispatch.handler_ids();
        handlers.extend(self.attempts.away_handlers());
        // A handler another instance vouched for is alive there, whatever
        // its membership says yet.
        handlers.extend(self.attempts.vouched(now));
        (jobs, handlers)
    }

    /// Applies one recovery action; false when its task has moved on (or the
    /// job has ended), so that a stale or repeated finding changes nothing.
    fn apply_recovery(
        &mut self,
        rule: recovery::Rule,
        action: &recovery::Action,
        now: Timestamp,
        step: &mut Step,
    ) -> bool {
        use recovery::Action as A;
        let job_of = |id: &str| id.parse::<JobId>().ok();
        let reason = format!("recovery {}", rule);
        match action {
            A::Resubmit { job, task, attempt } | A::FailTask { job, task, attempt } => {
                let Some(job_id) = job_of(job) else { return false };
                let task_ref = TaskRef { job: job_id, idx: TaskIdx(*task) };
                let Some(active) = self.jobs.get(&job_id) else { return false };
                let Some(record) = active.tasks.get(*task as usize) else { return false };
                if !record.state.is_held() || record.attempt != *attempt {
                    return false;
                }
                let holder = record.handler;
                if let Some(handler) = holder {
                    self.cancel_attempt(handler, task_ref, *attempt, step);
                }
                if rule == recovery::Rule::HandlerSilent {
                    // A silent handler gets no more work, this task included.
                    if let Some(handler) = holder {
                        self.dispatch.remove_handler(handler, None);
                    }
                }
                if matches!(action, A::FailTask { .. }) {
                    let limit_reason = format!("{reason}: its node is unresponsive");
                    let Some(job) = self.jobs.get_mut(&job_id) else { return false };
                    let released = follower::abandon(job, *task, &limit_reason, now, &mut step.batch);
                    self.end(AttemptId::new(task_ref, *attempt), Ending::Unsuccessful, now, step);
                    self.after_release(job_id, released, None, now, step);
                } else {
                    let loss = if rule == recovery::Rule::HandlerSilent {
                        Loss::WithWorker(reason)
                    } else {
                        Loss::NotCounted(reason)
                    };
                    self.lose_attempt(AttemptId::new(task_ref, *attempt), &loss, now, step);
                }
                true
            }
            A::Dispatch { job, task } => {
                let Some(job_id) = job_of(job) else { return false };
                let task_ref = TaskRef { job: job_id, idx: TaskIdx(*task) };
                let ready = self
                    .jobs
                    .get(&job_id)
                    .and_then(|j| j.tasks.get(*task as usize))
                    .is_some_and(|t| t.state == TaskState::Ready);
                if !ready || self.dispatch.is_queued(task_ref) {
                    return false;
                }
                self.queue_ready(job_id, &[*task], now);
                true
            }
            A::Finalize { job } => {
                let Some(job_id) = job_of(job) else { return false };
                if !self.jobs.get(&job_id).is_some_and(ActiveJob::all_ended) {
                    return false;
                }
                self.finalize(job_id, now, step);
                true
            }
            A::FailJob { job } => {
                let Some(job_id) = job_of(job) else { return false };
                if !self.jobs.contains_key(&job_id) {
                    return false;
                }
                let reason = format!("{reason}: the scheduler job was failed, not resubmitted");
                self.fail_job(job_id, &reason, now, step);
                true
            }
        }
    }

    /// A (re)connected handler says what it runs. On its first report
    /// (`dropped_before` set), attempts it was given before then and no
    /// longer runs are lost, uncounted (a worker that drops its work with its
    /// stream). Attempts it runs that it does not hold are returned, so that
    /// it is told to stop them: they were taken back while it was away.
    fn reconcile(
        &mut self,
        handler: HandlerId,
        running: &HashSet<AttemptId>,
        dropped_before: Option<Timestamp>,
        now: Timestamp,
        step: &mut Step,
    ) -> super::Reconciled {
        let mut reconciled = super::Reconciled::default();
        for &attempt in running {
            if self.attempts.holds(handler, attempt) {
                reconciled.adopted += 1;
            } else {
                reconciled.not_held.push(attempt);
            }
        }
        if let Some(before) = dropped_before {
            for attempt in self.attempts.of_handler(handler) {
                let task = attempt.task;
                let assigned_at = self.jobs.get(&task.job).and_then(|j| j.tasks[task.idx.index()].assigned_at);
                if !running.contains(&attempt) && assigned_at.is_some_and(|at| at < before) {
                    reconciled.dropped += 1;
                    self.lose_attempt(attempt, &Loss::NotCounted("its worker no longer runs it".into()), now, step);
                }
            }
        }
        reconciled
    }

    /// A job type's execution timeout changed: held attempts of that type
    /// without a timeout of their own take the new one.
    fn retime_held(&mut self, job_type: &str, seconds: Option<u64>) {
        for task in self.attempts.of_type_without_own_timeout(job_type) {
            let assigned_at = self.jobs.get(&task.job).and_then(|j| j.tasks[task.idx.index()].assigned_at);
            let deadline = seconds.zip(assigned_at).map(|(s, at)| at.plus_seconds(s));
            self.attempts.set_deadline(task, deadline);
        }
    }

    /// Hands queued tasks to handlers with free slots, type by type.
    pub(super) fn dispatch_ready(&mut self, now: Timestamp, step: &mut Step) {
        self.dispatch.promote_due(now);
        self.cooled(now, step);
        for job_type in self.dispatch.queued_types() {
            let mut blocked: Vec<(TaskRef, crate::model::Priority)> = Vec::new();
            loop {
                let jobs = &self.jobs;
                let near = || self.dispatch.peek(&job_type).map_or_else(Place::default, |t| place_of(jobs, t));
                let Some(handler) = self.dispatch.pick_handler(&job_type, near, now) else { break };
                let running = self.dispatch.starts_running(handler);
                match self.take_one(&job_type, handler, running, now, step, &mut blocked) {
                    Take::Empty => break,
                    Take::Skipped => {}
                    Take::Assigned(assignment) => {
                        step.send(self.dispatch.sink(handler), WorkOrder::Execute(assignment));
                    }
                }
            }
            for (task, priority) in blocked {
                self.dispatch.push_ready(job_type.clone(), priority, task, None, now);
            }
        }
    }

    /// Takes the next queued task of `job_type` and assigns it to `handler`
    /// (held, and written in the step), unless it may not run now.
    fn take_one(
        &mut self,
        job_type: &Arc<str>,
        handler: HandlerId,
        running: bool,
        now: Timestamp,
        step: &mut Step,
        blocked: &mut Vec<(TaskRef, crate::model::Priority)>,
    ) -> Take {
        let Some(task) = self.dispatch.pop(job_type) else { return Take::Empty };
        let Some(job) = self.jobs.get(&task.job) else { return Take::Skipped };
        let record = &job.tasks[task.idx.index()];
        if record.state != TaskState::Ready {
            return Take::Skipped;
        }
        let spec = &job.spec.tasks[task.idx.index()];
        // A task never runs while another task on the same volume runs,
        // whatever job or job type that one belongs to.
        let locked_elsewhere = |key: &str| self.resource_permits.as_ref().is_some_and(|held| !held.contains(key));
        if spec.lock().is_some_and(|key| self.attempts.locked(key, now) || locked_elsewhere(key)) {
            blocked.push((task, spec.priority));
            return Take::Skipped;
        }
        if record.not_before.is_some_and(|at| at > now) {
            let (job_type, priority, not_before) = (spec.job_type.clone(), spec.priority, record.not_before);
            self.dispatch.push_ready(job_type, priority, task, not_before, now);
            return Take::Skipped;
        }
        let Some(job) = self.jobs.get_mut(&task.job) else { return Take::Skipped };
        let attempt = leader::assign(job, task.idx.0, handler, running, now, &mut step.batch);
        let spec = &job.spec.tasks[task.idx.index()];
        let assignment = Assignment {
            released_at: self.released_at.remove(&task),
            attempt: AttemptId::new(task, attempt),
            job_name: job.record.name.clone(),
            task_id: spec.id.clone(),
            job_type: spec.job_type.clone(),
            parameters: spec.parameters.clone(),
            labels: spec.labels.clone(),
            priority: spec.priority,
            execution_timeout_seconds: spec.execution_timeout_seconds,
            lent_by: None,
        };
        self.hold(task, attempt, handler, now);
        Take::Assigned(assignment)
    }

    /// Lends queued tasks to the free slots of another instance's handlers:
    /// each is assigned and held here (its handler is the peer's worker)
    /// and returned once the step is durable.
    fn lend(&mut self, slots: Vec<FreeSlots>, now: Timestamp, step: &mut Step) -> Vec<(HandlerId, Assignment)> {
        self.dispatch.promote_due(now);
        let mut lent = Vec::new();
        for offer in slots {
            let mut left = offer.total;
            for (job_type, free) in offer.job_types {
                let mut free = free.min(left);
                let mut blocked = Vec::new();
                while free > 0 && self.dispatch.may_run(&job_type) {
                    match self.take_one(&job_type, offer.handler, false, now, step, &mut blocked) {
                        Take::Empty => break,
                        Take::Skipped => {}
                        Take::Assigned(assignment) => {
                            lent.push((offer.handler, assignment));
                            free -= 1;
                            left -= 1;
                        }
                    }
                }
                for (task, priority) in blocked {
                    self.dispatch.push_ready(job_type.clone(), priority, task, None, now);
                }
            }
        }
        if !lent.is_empty() {
            tracing::debug!(lent = lent.len(), "lent ready tasks to another instance's workers");
        }
        lent
    }

    /// Attempts another instance lent to a handler here: the reserved
    /// slots become theirs, and they go to the handler. Those that cannot
    /// (the handler left) are returned.
    fn borrowed(
        &mut self,
        handler: HandlerId,
        reserved: u32,
        lent: Vec<Assignment>,
        step: &mut Step,
    ) -> Vec<Assignment> {
        self.dispatch.unreserve(handler, reserved);
        let Some(sink) = self.dispatch.sink(handler).cloned() else { return lent };
        for assignment in lent {
            self.dispatch.take_slot(handler, &assignment.job_type);
            self.attempts.borrow(assignment.attempt, handler, assignment.job_type.clone());
            step.send(Some(&sink), WorkOrder::Execute(assignment));
        }
        Vec::new()
    }

    /// When the next delayed task, execution deadline or take-back is due.
    /// One turn of the engine's loop, at `now`: applies the commands that
    /// arrived, ends what has run out and hands ready tasks to handlers. The
    /// step it returns is made durable before anything in it takes effect.
    pub(super) fn turn(&mut self, commands: impl IntoIterator<Item = Command>, now: Timestamp) -> Step {
        let mut step = Step::default();
        for command in commands {
            self.apply(command, now, &mut step);
        }
        self.expire(now, &mut step);
        self.dispatch_ready(now, &mut step);
        if self.events.receiver_count() > 0 {
            step.actions.extend(batch_events(&step.batch).into_iter().map(Action::Event));
        }
        step
    }

    /// How many commands one turn takes at most.
    pub(super) fn most_commands_per_turn(&self) -> usize {
        self.options.max_commands_per_iteration
    }

    /// When the next deadline falls, if any: the loop wakes then without a command.
    pub(super) fn next_wake(&self) -> Option<Timestamp> {
        [self.dispatch.next_wake(), self.attempts.next_wake()].into_iter().flatten().min()
    }

    /// Ends attempts that ran past their execution timeout (the handler is
    /// told to stop, and the attempt fails, and is retried if it may be),
    /// and takes back the attempts of handlers that did not come back in time.
    pub(super) fn expire(&mut self, now: Timestamp, step: &mut Step) {
        while let Some((at, attempt)) = self.attempts.overdue(now) {
            let task = attempt.task;
            let Some(handler) = self.attempts.get(task).map(|held| held.handler) else { break };
            let assigned_at = self.jobs.get(&task.job).and_then(|j| j.tasks[task.idx.index()].assigned_at);
            let seconds = at.millis_since(assigned_at.unwrap_or(at)) / 1000;
            self.cancel_attempt(handler, task, attempt.number, step);
            let error = format!("execution timed out after {seconds} s");
            let outcome = Outcome::Failed { error, output: Vec::new() };
            if let Err(rejection) = self.complete(task, attempt.number, handler, outcome, None, now, step) {
                tracing::warn!(%attempt, %rejection, "timeout not applied");
                // Never leave a deadline that cannot be applied in the table.
                self.attempts.set_deadline(task, None);
            }
        }
        while let Some((handler, reason)) = self.attempts.due_back(now) {
            tracing::warn!(%handler, held = self.dispatch.held_by(handler), "taking back the attempts of a handler that did not come back");
            self.lose_handler(handler, &Loss::WithWorker(reason), now, step);
        }
    }

    /// Brings stored active jobs back: repairs derived state, rebuilds what
    /// every held attempt implies (its slot, volume lock and deadline), deals
    /// with the attempts of the previous run's handlers, finalizes jobs whose
    /// tasks all ended, and queues the rest.
    pub(super) fn restore(&mut self, stored: Vec<StoredJob>, now: Timestamp, step: &mut Step) {
        let mut orphans: Vec<AttemptId> = Vec::new();
        for stored_job in stored {
            let id = stored_job.record.id;
            let mut job = ActiveJob::from_stored(stored_job);
            let mut ready = Vec::new();
            let mut held: Vec<(u32, u32, HandlerId, Timestamp)> = Vec::new();
            for idx in 0..job.len() as u32 {
                let state = job.tasks[idx as usize].state;
                if state == TaskState::Pending && job.unmet[idx as usize] == 0 {
                    job.set_state(idx, TaskState::Ready, now);
                    job.record_task(idx, &mut step.batch);
                }
                let record: &TaskRecord = &job.tasks[idx as usize];
                match record.state {
                    TaskState::Ready => ready.push(idx),
                    // Held with no handler is not read back: decoding makes it ready (rule R1).
                    TaskState::Assigned | TaskState::Running => {
                        if let Some(handler) = record.handler {
                            held.push((idx, record.attempt, handler, record.assigned_at.unwrap_or(now)));
                        }
                    }
                    _ => {}
                }
            }
            self.jobs.insert(id, job);
            self.queue_ready(id, &ready, now);
            for (idx, attempt, handler, assigned_at) in held {
                let task = TaskRef { job: id, idx: TaskIdx(idx) };
                self.hold(task, attempt, handler, assigned_at);
                orphans.push(AttemptId::new(task, attempt));
            }
            if self.jobs.get(&id).is_some_and(ActiveJob::all_ended) {
                self.finalize(id, now, step);
            }
        }
        match self.options.orphans {
            Orphans::Requeue => {
                let loss = Loss::NotCounted("the admin restarted".into());
                for attempt in orphans {
                    self.lose(attempt, &loss, now, step);
                }
            }
            Orphans::Keep { grace } => {
                let handlers: std::collections::BTreeSet<HandlerId> =
                    orphans.iter().filter_map(|a| self.attempts.get(a.task).map(|held| held.handler)).collect();
                // A connected handler reports what it runs with its heartbeats;
                // one already absent keeps the time it was given.
                let away = |handler: &HandlerId| {
                    !self.dispatch.has_handler(*handler)
                        && !self.peer_handlers.contains(handler)
                        && !self.attempts.is_away(*handler)
                };
                let handlers: Vec<HandlerId> = handlers.into_iter().filter(away).collect();
                for handler in handlers {
                    let reason = format!(
                        "lost with its worker: the admin restarted and the worker did not come back within {:.1} s",
                        grace.as_secs_f64()
                    );
                    self.attempts.away(handler, now.plus_millis(grace.as_millis() as i64), reason);
                }
                if !self.attempts.is_empty() {
                    tracing::info!(
                        held = self.attempts.len(),
                        handlers = self.attempts.handlers().len(),
                        grace_ms = grace.as_millis() as u64,
                        "keeping the attempts of the previous run for their workers"
                    );
                }
            }
        }
    }
}

/// Where a task's data lives (`TaskSpec::place`).
fn place_of(jobs: &HashMap<JobId, ActiveJob>, task: TaskRef) -> Place {
    jobs.get(&task.job)
        .and_then(|j| j.spec.tasks.get(task.idx.index()))
        .map(crate::model::TaskSpec::place)
        .unwrap_or_default()
}

fn recovery_state(state: TaskState) -> recovery::TaskState {
    match state {
        TaskState::Pending => recovery::TaskState::Pending,
        TaskState::Ready => recovery::TaskState::Ready,
        TaskState::Assigned => recovery::TaskState::Assigned,
        TaskState::Running => recovery::TaskState::Running,
        TaskState::Succeeded => recovery::TaskState::Succeeded,
        TaskState::Failed => recovery::TaskState::Failed,
        TaskState::UpstreamFailed => recovery::TaskState::UpstreamFailed,
        TaskState::Canceled => recovery::TaskState::Canceled,
    }
}

fn task_event(job: JobId, idx: u32, record: &TaskRecord) -> Event {
    Event::Task {
        job,
        idx,
        state: record.state,
        attempt: record.attempt,
        error: record.error.as_deref().map(String::from),
        handler: record.handler,
        at: record.updated_at,
        progress_percent: record.progress_percent,
        stage: record.stage.to_string(),
    }
}

/// The events of a step's batch, for watchers, in the order a watcher needs
/// them: jobs created, then task transitions, then the jobs' own (so that a
/// job's final state comes after the last task's).
fn batch_events(batch: &Batch) -> Vec<Event> {
    let job_event = |record: &JobRecord| Event::Job { job: record.id, state: record.state, at: record.updated_at };
    let created = batch.new_jobs.iter().map(|(record, _)| job_event(record));
    let tasks = batch.tasks.iter().map(|(job, idx, record)| task_event(*job, idx.0, record));
    let changed = batch.jobs.iter().map(job_event);
    created.chain(tasks).chain(changed).collect()
}
