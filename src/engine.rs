//! The engine: one loop that owns every active job, applies leader and
//! follower steps in order, and hands each iteration's changes to a
//! committer thread that writes them as one atomic batch, flushes (group
//! commit), and only then sends replies and dispatches work.
//!
//! Because the loop is the only writer and hands over whole iterations, no
//! reader (of the engine or of the store) ever sees half of a step.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use jobcenter_recovery as recovery;
use tokio::sync::{broadcast, mpsc, oneshot};

use crate::active::ActiveJob;
use crate::clock::{Clock, Timestamp};
use crate::dispatch::{Assignment, Dispatch, HandlerSpec, Sink, TypeLimits, WorkOrder};
use crate::follower::{self, Outcome, Rejection, Released};
use crate::leader;
use crate::model::{
    HandlerId, JobId, JobOrigin, JobRecord, JobSpec, JobState, StateCounts, TaskIdx, TaskRef, TaskState,
};
use crate::store::{self, Batch, JobFilter, Store, StoredJob};
use crate::wire;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("unknown job {0}")]
    UnknownJob(JobId),
    #[error("job {0} has already ended")]
    JobEnded(JobId),
    #[error("job {0} has not ended: only an ended job can be retried")]
    JobNotEnded(JobId),
    #[error("job {job} has nothing to retry: it {state}")]
    NothingToRetry { job: JobId, state: JobState },
    #[error(transparent)]
    Store(#[from] store::Error),
    #[error("the engine has stopped")]
    Stopped,
}

/// What to do at start-up with attempts held by handlers of a previous run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Orphans {
    /// Run them again at once: their handlers died with the process (embedded use).
    Requeue,
    /// Keep them; the recovery check decides once handlers had time to come back.
    Keep,
}

#[derive(Clone, Debug)]
pub struct Options {
    /// This admin instance's own handler id, fresh at every start; recorded
    /// on the jobs whose leader steps it takes.
    pub instance: HandlerId,
    pub orphans: Orphans,
    /// Attempts a task may lose with its handler before it fails.
    pub lost_attempt_limit: u32,
    /// Commands one iteration takes at most.
    pub max_commands_per_iteration: usize,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            instance: HandlerId::new(),
            orphans: Orphans::Keep,
            lost_attempt_limit: 3,
            max_commands_per_iteration: 8192,
        }
    }
}

/// A summary of a job for progress displays.
#[derive(Clone, Debug)]
pub struct Summary {
    pub record: JobRecord,
    pub counts: StateCounts,
}

/// A change that watchers see, after it is durable.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    Task {
        job: JobId,
        idx: u32,
        state: TaskState,
        attempt: u32,
        error: Option<String>,
        handler: Option<HandlerId>,
        at: Timestamp,
        progress_percent: f32,
        stage: String,
    },
    Job {
        job: JobId,
        state: JobState,
        at: Timestamp,
    },
}

/// Progress a handler reports for an attempt it holds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Progress {
    pub percent: f32,
    pub stage: String,
    pub message: String,
}

type Reply<T> = oneshot::Sender<T>;

enum Command {
    Submit {
        id: JobId,
        spec: Arc<JobSpec>,
        origin: JobOrigin,
        reply: Reply<Result<JobId, Error>>,
    },
    Started {
        task: TaskRef,
        attempt: u32,
        handler: HandlerId,
        reply: Option<Reply<Result<(), Rejection>>>,
    },
    Complete {
        task: TaskRef,
        attempt: u32,
        handler: HandlerId,
        outcome: Outcome,
        /// When the report reached the server, to measure dispatch latency.
        received: Option<std::time::Instant>,
        reply: Option<Reply<Result<(), Rejection>>>,
    },
    Cancel {
        job: JobId,
        reply: Reply<Result<(), Error>>,
    },
    Retry {
        job: StoredJob,
        reply: Reply<Result<(), Error>>,
    },
    AddHandler {
        spec: HandlerSpec,
    },
    Progress {
        task: TaskRef,
        attempt: u32,
        handler: HandlerId,
        progress: Progress,
    },
    Requeue {
        task: TaskRef,
        attempt: u32,
        handler: HandlerId,
        reason: String,
    },
    HandlerSlots {
        handler: HandlerId,
        total: u32,
    },
    LoseAllBut {
        live: HashSet<HandlerId>,
        reason: String,
        reply: Reply<usize>,
    },
    SetLimits {
        job_type: Arc<str>,
        limits: TypeLimits,
    },
    RecoverySnapshot {
        reply: Reply<(Vec<recovery::JobSnapshot>, Vec<HandlerId>)>,
    },
    ApplyRecovery {
        actions: Vec<(recovery::Rule, recovery::Action)>,
        reply: Reply<Vec<bool>>,
    },
    Reconcile {
        handler: HandlerId,
        running: HashSet<String>,
        before: Timestamp,
    },
    ActiveDedupeKeys {
        reply: Reply<HashSet<String>>,
    },
    Gate {
        gated: Vec<Arc<str>>,
        open: bool,
        /// (queued, running) attempts of gated job types.
        reply: Reply<(usize, u32)>,
    },
    HandlerGone {
        handler: HandlerId,
        reason: String,
        count_lost: bool,
    },
    Get {
        job: JobId,
        reply: Reply<Option<StoredJob>>,
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

/// Work that may only happen after the iteration's batch is durable.
enum Action {
    Send { sink: Sink, order: WorkOrder },
    Reply(Box<dyn FnOnce() + Send>),
    Event(Event),
}

#[derive(Default)]
struct Step {
    batch: Batch,
    actions: Vec<Action>,
}

impl Step {
    fn reply<T: Send + 'static>(&mut self, reply: Reply<T>, value: T) {
        self.actions.push(Action::Reply(Box::new(move || {
            let _ = reply.send(value);
        })));
    }
}

/// The engine's state: every active job, the dispatch table and the waiters.
struct Core {
    options: Options,
    jobs: HashMap<JobId, ActiveJob>,
    dispatch: Dispatch,
    waiters: HashMap<JobId, Vec<Reply<Option<JobRecord>>>>,
    /// Execution deadlines of held attempts: (deadline, task, attempt).
    deadlines: BTreeSet<(Timestamp, TaskRef, u32)>,
    events: broadcast::Sender<Event>,
    /// While a completion is applied: when it reached the server.
    releasing: Option<std::time::Instant>,
    /// When the completion that made each queued task ready reached the server.
    released_at: HashMap<TaskRef, std::time::Instant>,
    /// Resources (volumes) held by running attempts: key -> (task, attempt).
    resources: HashMap<String, (TaskRef, u32)>,
}

impl Core {
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

    fn after_release(&mut self, job: JobId, released: Released, now: Timestamp, step: &mut Step) {
        if let Some(received) = self.releasing {
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

    fn apply(&mut self, command: Command, now: Timestamp, step: &mut Step) {
        match command {
            Command::Submit { id, spec, origin, reply } => {
                let (job, ready) = leader::submit(id, spec, origin, self.options.instance, now, &mut step.batch);
                tracing::info!(job.id = %id, job.name = %job.record.name, tasks = job.len(), "job submitted");
                self.jobs.insert(id, job);
                self.queue_ready(id, &ready, now);
                step.reply(reply, Ok(id));
            }
            Command::Started { task, attempt, handler, reply } => {
                let result = match self.jobs.get_mut(&task.job) {
                    Some(job) => follower::start(job, task.idx.0, attempt, handler, now),
                    None => Err(Rejection::JobEnded { job: task.job }),
                };
                if let Some(reply) = reply {
                    step.reply(reply, result);
                }
            }
            Command::Complete { task, attempt, handler, outcome, received, reply } => {
                self.releasing = received;
                let result = self.complete(task, attempt, handler, outcome, now, step);
                self.releasing = None;
                if let Err(rejection) = &result {
                    tracing::warn!(job.id = %task.job, task.idx = task.idx.0, attempt, %handler, %rejection, "completion rejected");
                }
                if let Some(reply) = reply {
                    step.reply(reply, result);
                }
            }
            Command::Cancel { job, reply } => {
                let result = match self.jobs.get_mut(&job) {
                    Some(active) => {
                        let running = leader::cancel(active, now, &mut step.batch);
                        for (idx, attempt, handler) in running.running {
                            if let Some(sink) = self.dispatch.sink(handler) {
                                let order = WorkOrder::Cancel { task: TaskRef { job, idx: TaskIdx(idx) }, attempt };
                                step.actions.push(Action::Send { sink: sink.clone(), order });
                            }
                        }
                        self.dispatch.forget_job(job);
                        self.finalize(job, now, step);
                        Ok(())
                    }
                    None => Err(Error::JobEnded(job)),
                };
                step.reply(reply, result);
            }
            Command::Retry { job, reply } => {
                let id = job.record.id;
                let result = if self.jobs.contains_key(&id) || !job.record.state.is_terminal() {
                    Err(Error::JobNotEnded(id))
                } else if job.record.state == JobState::Succeeded {
                    Err(Error::NothingToRetry { job: id, state: job.record.state })
                } else {
                    let mut active = ActiveJob::from_stored(job);
                    let ready = leader::retry(&mut active, self.options.instance, now, &mut step.batch);
                    self.jobs.insert(id, active);
                    self.queue_ready(id, &ready, now);
                    Ok(())
                };
                step.reply(reply, result);
            }
            Command::Progress { task, attempt, handler, progress } => {
                let Some(job) = self.jobs.get_mut(&task.job) else { return };
                if follower::start(job, task.idx.0, attempt, handler, now).is_ok() {
                    let record = &mut job.tasks[task.idx.index()];
                    record.progress_percent = progress.percent;
                    record.stage = progress.stage;
                    record.updated_at = now;
                    if self.events.receiver_count() > 0 {
                        step.actions.push(Action::Event(task_event(task.job, task.idx.0, record)));
                    }
                }
            }
            Command::Requeue { task, attempt, handler, reason } => {
                let holds = self
                    .jobs
                    .get(&task.job)
                    .is_some_and(|job| follower::check_holder(job, task.idx.0, attempt, handler).is_ok());
                if holds {
                    self.lose(task, &reason, false, now, step);
                }
            }
            Command::HandlerSlots { handler, total } => self.dispatch.report_slots(handler, total),
            Command::SetLimits { job_type, limits } => self.dispatch.set_limits(job_type, limits),
            Command::RecoverySnapshot { reply } => {
                let _ = reply.send(self.recovery_snapshot());
            }
            Command::ApplyRecovery { actions, reply } => {
                let applied =
                    actions.iter().map(|(rule, action)| self.apply_recovery(*rule, action, now, step)).collect();
                step.reply(reply, applied);
            }
            Command::Reconcile { handler, running, before } => self.reconcile(handler, &running, before, now, step),
            Command::Gate { gated, open, reply } => {
                self.dispatch.set_gate(gated, open);
                let _ = reply.send((self.dispatch.gated_queued(), self.dispatch.gated_running()));
            }
            Command::ActiveDedupeKeys { reply } => {
                let keys =
                    self.jobs
                        .values()
                        .flat_map(|job| {
                            job.spec.tasks.iter().zip(&job.tasks).filter(|(_, t)| !t.state.is_terminal()).filter_map(
                                |(spec, _)| spec.labels.get("dedupe_key").filter(|k| !k.is_empty()).cloned(),
                            )
                        })
                        .collect();
                let _ = reply.send(keys);
            }
            Command::LoseAllBut { live, reason, reply } => {
                let mut orphans = Vec::new();
                for (id, job) in &self.jobs {
                    for (idx, task) in job.tasks.iter().enumerate() {
                        let gone = task.handler.is_some_and(|h| !live.contains(&h) && !self.dispatch.has_handler(h));
                        if task.state.is_held() && gone {
                            orphans.push(TaskRef { job: *id, idx: TaskIdx(idx as u32) });
                        }
                    }
                }
                let n_orphans = orphans.len();
                for task in orphans {
                    self.lose_attempt(task, &reason, false, now, step);
                }
                step.reply(reply, n_orphans);
            }
            Command::AddHandler { spec } => {
                tracing::debug!(handler = %spec.handler, capacity = spec.capacity, "handler joined");
                self.dispatch.add_handler(spec);
            }
            Command::HandlerGone { handler, reason, count_lost } => {
                self.dispatch.remove_handler(handler);
                self.lose_handler(handler, &reason, count_lost, now, step);
            }
            // A job that is not active is read from the store by the caller;
            // "not here" is answered after the committer has written every
            // earlier step, so that the store already shows how the job ended.
            Command::Get { job, reply } => match self.jobs.get(&job) {
                Some(active) => {
                    let _ = reply.send(Some(active.to_stored()));
                }
                None => step.reply(reply, None),
            },
            Command::Summary { job, reply } => match self.jobs.get(&job) {
                Some(a) => {
                    let _ = reply.send(Some(Summary { record: a.record.clone(), counts: a.counts }));
                }
                None => step.reply(reply, None),
            },
            Command::Wait { job, reply } => {
                if self.jobs.contains_key(&job) {
                    self.waiters.entry(job).or_default().push(reply);
                } else {
                    step.reply(reply, None);
                }
            }
            Command::ActiveJobs { reply } => {
                let _ = reply.send(self.jobs.values().map(|a| a.record.clone()).collect());
            }
        }
    }

    fn complete(
        &mut self,
        task: TaskRef,
        attempt: u32,
        handler: HandlerId,
        outcome: Outcome,
        now: Timestamp,
        step: &mut Step,
    ) -> Result<(), Rejection> {
        let Some(job) = self.jobs.get_mut(&task.job) else {
            return Err(Rejection::JobEnded { job: task.job });
        };
        let released = follower::complete(job, task.idx.0, attempt, handler, outcome, now, &mut step.batch)?;
        let job_type = job.spec.tasks[task.idx.index()].job_type.clone();
        self.dispatch.release_slot(handler, &job_type);
        self.after_release(task.job, released, now, step);
        Ok(())
    }

    /// Every attempt held by `handler` is lost at once.
    fn lose_handler(&mut self, handler: HandlerId, reason: &str, count_lost: bool, now: Timestamp, step: &mut Step) {
        let mut held: Vec<TaskRef> = Vec::new();
        for (id, job) in &self.jobs {
            for (idx, task) in job.tasks.iter().enumerate() {
                if task.state.is_held() && task.handler == Some(handler) {
                    held.push(TaskRef { job: *id, idx: TaskIdx(idx as u32) });
                }
            }
        }
        for task in held {
            self.lose_attempt(task, reason, count_lost, now, step);
        }
    }

    /// The held attempt is gone with its handler. A scheduler job is not
    /// resubmitted: it fails whole, and the next detection proposes the work again.
    fn lose_attempt(&mut self, task: TaskRef, reason: &str, count_lost: bool, now: Timestamp, step: &mut Step) {
        let from_scheduler =
            self.jobs.get(&task.job).is_some_and(|job| matches!(job.record.origin, JobOrigin::Scheduler { .. }));
        if from_scheduler {
            let reason = format!("the scheduler job was failed, not resubmitted: {reason}");
            self.fail_job(task.job, &reason, now, step);
        } else {
            self.lose(task, reason, count_lost, now, step);
        }
    }

    /// Fails a whole job: unfinished tasks fail, running ones are told to stop.
    fn fail_job(&mut self, job_id: JobId, reason: &str, now: Timestamp, step: &mut Step) {
        let Some(job) = self.jobs.get_mut(&job_id) else { return };
        let running = leader::fail_job(job, reason, now, &mut step.batch);
        for (idx, attempt, handler) in running.running {
            self.dispatch.release_slot(handler, &job.spec.tasks[idx as usize].job_type);
            if let Some(sink) = self.dispatch.sink(handler) {
                let order = WorkOrder::Cancel { task: TaskRef { job: job_id, idx: TaskIdx(idx) }, attempt };
                step.actions.push(Action::Send { sink: sink.clone(), order });
            }
        }
        self.dispatch.forget_job(job_id);
        self.finalize(job_id, now, step);
    }

    /// A plain snapshot of the active jobs for the recovery rules: each job
    /// with its held and ready tasks, and the handlers that are connected.
    fn recovery_snapshot(&self) -> (Vec<recovery::JobSnapshot>, Vec<HandlerId>) {
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
                            pinned_node: spec.labels.get("node").cloned(),
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
        (jobs, self.dispatch.handler_ids())
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
                if let Some(sink) = holder.and_then(|h| self.dispatch.sink(h)) {
                    let order = WorkOrder::Cancel { task: task_ref, attempt: *attempt };
                    step.actions.push(Action::Send { sink: sink.clone(), order });
                }
                if rule == recovery::Rule::HandlerSilent {
                    // A silent handler gets no more work, this task included.
                    if let Some(handler) = holder {
                        self.dispatch.remove_handler(handler);
                    }
                }
                if matches!(action, A::FailTask { .. }) {
                    let limit_reason = format!("{reason}: its node is unresponsive");
                    let Some(job) = self.jobs.get_mut(&job_id) else { return false };
                    if let Some(handler) = job.tasks[*task as usize].handler {
                        self.dispatch.release_slot(handler, &job.spec.tasks[*task as usize].job_type);
                    }
                    let released = follower::abandon(job, *task, &limit_reason, now, &mut step.batch);
                    self.after_release(job_id, released, now, step);
                } else {
                    let count = rule == recovery::Rule::HandlerSilent;
                    self.lose_attempt(task_ref, &reason, count, now, step);
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

    /// Attempts a handler was given before `before` and no longer runs (it
    /// reconnected without them: a worker drops its work with its stream).
    fn reconcile(
        &mut self,
        handler: HandlerId,
        running: &HashSet<String>,
        before: Timestamp,
        now: Timestamp,
        step: &mut Step,
    ) {
        let mut dropped = Vec::new();
        for (id, job) in &self.jobs {
            for (idx, task) in job.tasks.iter().enumerate() {
                let task_ref = TaskRef { job: *id, idx: TaskIdx(idx as u32) };
                if task.state.is_held()
                    && task.handler == Some(handler)
                    && task.assigned_at.is_some_and(|at| at < before)
                    && !running.contains(&wire::attempt_id(task_ref, task.attempt))
                {
                    dropped.push(task_ref);
                }
            }
        }
        for task in dropped {
            self.lose_attempt(task, "its worker no longer runs it", false, now, step);
        }
    }

    fn lose(&mut self, task: TaskRef, reason: &str, count_lost: bool, now: Timestamp, step: &mut Step) {
        let limit = self.options.lost_attempt_limit;
        let Some(job) = self.jobs.get_mut(&task.job) else { return };
        if let Some(handler) = job.tasks[task.idx.index()].handler {
            self.dispatch.release_slot(handler, &job.spec.tasks[task.idx.index()].job_type);
        }
        let released = follower::lose(job, task.idx.0, reason, count_lost, limit, now, &mut step.batch);
        self.after_release(task.job, released, now, step);
    }

    /// Hands queued tasks to handlers with free slots, type by type.
    fn dispatch_ready(&mut self, now: Timestamp, step: &mut Step) {
        self.dispatch.promote_due(now);
        for job_type in self.dispatch.queued_types() {
            let mut blocked: Vec<(TaskRef, crate::model::Priority)> = Vec::new();
            while let Some(handler) = self.dispatch.pick_handler(&job_type) {
                let Some(task) = self.dispatch.pop(&job_type) else { break };
                let Some(job) = self.jobs.get(&task.job) else { continue };
                let record = &job.tasks[task.idx.index()];
                if record.state != TaskState::Ready {
                    continue;
                }
                // A task never runs while another task on the same volume runs,
                // whatever job or job type that one belongs to.
                let resource = job.spec.tasks[task.idx.index()].labels.get("volume_id").map(|v| format!("volume:{v}"));
                let priority = job.spec.tasks[task.idx.index()].priority;
                if let Some(key) = &resource {
                    if self.resource_busy(key) {
                        blocked.push((task, priority));
                        continue;
                    }
                }
                let Some(job) = self.jobs.get_mut(&task.job) else { continue };
                let record = &job.tasks[task.idx.index()];
                if record.not_before.is_some_and(|at| at > now) {
                    let (job_type, priority) = {
                        let spec = &job.spec.tasks[task.idx.index()];
                        (spec.job_type.clone(), spec.priority)
                    };
                    self.dispatch.push_ready(job_type, priority, task, record.not_before, now);
                    continue;
                }
                let running = self.dispatch.starts_running(handler);
                let attempt = leader::assign(job, task.idx.0, handler, running, now, &mut step.batch);
                if let Some(key) = resource {
                    self.resources.insert(key, (task, attempt));
                }
                let spec = &job.spec.tasks[task.idx.index()];
                let assignment = Assignment {
                    released_at: self.released_at.remove(&task),
                    task,
                    attempt,
                    job_name: job.record.name.clone(),
                    task_id: spec.id.clone(),
                    job_type: spec.job_type.clone(),
                    parameters: spec.parameters.clone(),
                    labels: spec.labels.clone(),
                    priority: spec.priority,
                    execution_timeout_seconds: spec.execution_timeout_seconds,
                };
                self.dispatch.take_slot(handler, &spec.job_type);
                let type_timeout = self.dispatch.limits(&spec.job_type).and_then(|l| l.execution_timeout_seconds);
                if let Some(seconds) = spec.execution_timeout_seconds.or(type_timeout) {
                    self.deadlines.insert((now.plus_seconds(seconds), task, attempt));
                }
                if let Some(sink) = self.dispatch.sink(handler) {
                    step.actions.push(Action::Send { sink: sink.clone(), order: WorkOrder::Execute(assignment) });
                }
            }
            for (task, priority) in blocked {
                self.dispatch.push_ready(job_type.clone(), priority, task, None, now);
            }
        }
    }

    /// Whether a task that holds the resource still runs.
    fn resource_busy(&mut self, key: &str) -> bool {
        let Some(&(task, attempt)) = self.resources.get(key) else { return false };
        let busy = self
            .jobs
            .get(&task.job)
            .and_then(|job| job.tasks.get(task.idx.index()))
            .is_some_and(|t| t.state.is_held() && t.attempt == attempt);
        if !busy {
            self.resources.remove(key);
        }
        busy
    }

    /// When the next delayed task or execution deadline is due.
    fn next_wake(&self) -> Option<Timestamp> {
        let deadline = self.deadlines.first().map(|(at, _, _)| *at);
        match (self.dispatch.next_wake(), deadline) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Ends attempts that ran past their execution timeout: the handler is
    /// told to stop, and the attempt fails (and is retried if it may be).
    fn expire_deadlines(&mut self, now: Timestamp, step: &mut Step) {
        while let Some(&(at, task, attempt)) = self.deadlines.first() {
            if at > now {
                break;
            }
            self.deadlines.pop_first();
            let Some(job) = self.jobs.get(&task.job) else { continue };
            let record = &job.tasks[task.idx.index()];
            let Some(handler) = record.handler.filter(|_| record.state.is_held() && record.attempt == attempt) else {
                continue;
            };
            let seconds = at.millis_since(record.assigned_at.unwrap_or(at)) / 1000;
            if let Some(sink) = self.dispatch.sink(handler) {
                step.actions.push(Action::Send { sink: sink.clone(), order: WorkOrder::Cancel { task, attempt } });
            }
            let error = format!("execution timed out after {seconds} s");
            let outcome = Outcome::Failed { error, output: Vec::new() };
            if let Err(rejection) = self.complete(task, attempt, handler, outcome, now, step) {
                tracing::warn!(job.id = %task.job, task.idx = task.idx.0, %rejection, "timeout not applied");
            }
        }
    }

    /// Brings stored active jobs back: repairs derived state, deals with
    /// orphaned attempts, finalizes jobs whose tasks all ended, queues the rest.
    fn restore(&mut self, stored: Vec<StoredJob>, now: Timestamp, step: &mut Step) {
        for stored_job in stored {
            let id = stored_job.record.id;
            let mut job = ActiveJob::from_stored(stored_job);
            let mut ready = Vec::new();
            let mut orphans = Vec::new();
            for idx in 0..job.len() as u32 {
                let state = job.tasks[idx as usize].state;
                if state == TaskState::Pending && job.unmet[idx as usize] == 0 {
                    job.set_state(idx, TaskState::Ready, now);
                    job.record_task(idx, &mut step.batch);
                }
                match job.tasks[idx as usize].state {
                    TaskState::Ready => ready.push(idx),
                    TaskState::Assigned | TaskState::Running => orphans.push(idx),
                    _ => {}
                }
            }
            self.jobs.insert(id, job);
            self.queue_ready(id, &ready, now);
            if self.options.orphans == Orphans::Requeue {
                for idx in orphans {
                    self.lose(TaskRef { job: id, idx: TaskIdx(idx) }, "the admin restarted", false, now, step);
                }
            }
            if self.jobs.get(&id).is_some_and(ActiveJob::all_ended) {
                self.finalize(id, now, step);
            }
        }
    }
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

fn task_event(job: JobId, idx: u32, record: &crate::model::TaskRecord) -> Event {
    Event::Task {
        job,
        idx,
        state: record.state,
        attempt: record.attempt,
        error: record.error.clone(),
        handler: record.handler,
        at: record.updated_at,
        progress_percent: record.progress_percent,
        stage: record.stage.clone(),
    }
}

/// The events of a step's batch, for watchers.
fn batch_events(batch: &Batch) -> Vec<Event> {
    let tasks = batch.tasks.iter().map(|(job, idx, record)| task_event(*job, idx.0, record));
    let jobs = batch.new_jobs.iter().map(|(record, _)| record).chain(batch.jobs.iter()).map(|record| Event::Job {
        job: record.id,
        state: record.state,
        at: record.updated_at,
    });
    jobs.chain(tasks).collect()
}

/// Called after each group commit with the time of its write and flush, and of the flush alone.
pub type CommitObserver = Arc<dyn Fn(std::time::Duration, std::time::Duration) + Send + Sync>;

/// A cheap, cloneable handle to a running engine.
#[derive(Clone)]
pub struct EngineHandle {
    commands: mpsc::Sender<Command>,
    store: Arc<dyn Store>,
    events: broadcast::Sender<Event>,
    commit_observer: Arc<std::sync::OnceLock<CommitObserver>>,
}

/// The engine itself; `start` loads the store and returns its handle.
pub struct Engine;

impl Engine {
    /// Loads every active job, makes start-up repairs durable, then runs the
    /// loop and the committer until every handle is dropped.
    pub async fn start(store: Arc<dyn Store>, clock: Arc<dyn Clock>, options: Options) -> Result<EngineHandle, Error> {
        let loaded = {
            let store = store.clone();
            tokio::task::spawn_blocking(move || store.load_active()).await.map_err(|_| Error::Stopped)??
        };
        let (events, _) = broadcast::channel(65_536);
        let mut core = Core {
            options,
            jobs: HashMap::new(),
            dispatch: Dispatch::default(),
            waiters: HashMap::new(),
            deadlines: BTreeSet::new(),
            events: events.clone(),
            releasing: None,
            released_at: HashMap::new(),
            resources: HashMap::new(),
        };
        let mut step = Step::default();
        core.restore(loaded, clock.now(), &mut step);
        if !step.batch.is_empty() {
            let store = store.clone();
            let batch = std::mem::take(&mut step.batch);
            tokio::task::spawn_blocking(move || store.write(&batch).and_then(|()| store.flush()))
                .await
                .map_err(|_| Error::Stopped)??;
        }
        let (commands_tx, commands_rx) = mpsc::channel(65_536);
        let (steps_tx, steps_rx) = mpsc::channel(64);
        let committer_store = store.clone();
        let committer_events = events.clone();
        let commit_observer: Arc<std::sync::OnceLock<CommitObserver>> = Arc::default();
        let committer_observer = commit_observer.clone();
        std::thread::Builder::new()
            .name("jobcenter-commit".into())
            .spawn(move || run_committer(committer_store, steps_rx, committer_events, committer_observer))
            .map_err(|e| Error::Store(store::Error::Io(e.to_string())))?;
        tokio::spawn(run_loop(core, clock, commands_rx, steps_tx));
        Ok(EngineHandle { commands: commands_tx, store, events, commit_observer })
    }
}

async fn run_loop(
    mut core: Core,
    clock: Arc<dyn Clock>,
    mut commands: mpsc::Receiver<Command>,
    steps: mpsc::Sender<Step>,
) {
    let max = core.options.max_commands_per_iteration;
    let mut received: Vec<Command> = Vec::with_capacity(max);
    loop {
        let first = match core.next_wake() {
            Some(at) => {
                let wait = std::time::Duration::from_millis(at.millis_since(clock.now()));
                tokio::select! {
                    command = commands.recv() => match command {
                        Some(command) => Some(command),
                        None => break,
                    },
                    () = tokio::time::sleep(wait) => None,
                }
            }
            None => match commands.recv().await {
                Some(command) => Some(command),
                None => break,
            },
        };
        received.extend(first);
        while received.len() < max {
            match commands.try_recv() {
                Ok(command) => received.push(command),
                Err(_) => break,
            }
        }
        let now = clock.now();
        let mut step = Step::default();
        for command in received.drain(..) {
            core.apply(command, now, &mut step);
        }
        core.expire_deadlines(now, &mut step);
        core.dispatch_ready(now, &mut step);
        if core.events.receiver_count() > 0 {
            step.actions.extend(batch_events(&step.batch).into_iter().map(Action::Event));
        }
        if (!step.batch.is_empty() || !step.actions.is_empty()) && steps.send(step).await.is_err() {
            break;
        }
    }
}

/// Writes every step it has as one batch, flushes once, then performs their actions.
fn run_committer(
    store: Arc<dyn Store>,
    mut steps: mpsc::Receiver<Step>,
    events: broadcast::Sender<Event>,
    observer: Arc<std::sync::OnceLock<CommitObserver>>,
) {
    let mut pending: Vec<Step> = Vec::new();
    let mut crash = CrashPoint::from_env();
    while let Some(step) = steps.blocking_recv() {
        pending.push(step);
        while let Ok(step) = steps.try_recv() {
            pending.push(step);
        }
        let mut batch = Batch::default();
        for step in &mut pending {
            batch.append(std::mem::take(&mut step.batch));
        }
        if !batch.is_empty() {
            let started = std::time::Instant::now();
            fail_stop(store.write(&batch));
            crash.reached("before-flush");
            let flush_started = std::time::Instant::now();
            fail_stop(store.flush());
            if let Some(observe) = observer.get() {
                observe(started.elapsed(), flush_started.elapsed());
            }
            crash.reached("after-flush");
        }
        for step in pending.drain(..) {
            for action in step.actions {
                match action {
                    Action::Send { sink, order } => {
                        let _ = sink.send(order);
                    }
                    Action::Reply(reply) => reply(),
                    Action::Event(event) => {
                        let _ = events.send(event);
                    }
                }
            }
        }
    }
}

/// A named moment at which the process dies on purpose, for crash tests:
/// `JOBCENTER_CRASH_AT=POINT:N` aborts the N-th time the committer reaches
/// `POINT` (`before-flush`: written, not flushed; `after-flush`: flushed,
/// nothing acknowledged or dispatched yet).
struct CrashPoint {
    point: Option<(String, u64)>,
    seen: u64,
}

impl CrashPoint {
    fn from_env() -> CrashPoint {
        let point = std::env::var("JOBCENTER_CRASH_AT").ok().and_then(|spec| {
            let (name, count) = spec.split_once(':')?;
            Some((name.to_string(), count.parse().ok()?))
        });
        CrashPoint { point, seen: 0 }
    }

    fn reached(&mut self, name: &str) {
        let Some((point, count)) = &self.point else { return };
        if point == name {
            self.seen += 1;
            if self.seen >= *count {
                eprintln!("jobcenter: crashing on purpose at {name} ({count})");
                std::process::abort();
            }
        }
    }
}

/// A store that cannot write is fail-stop: nothing after it may be acknowledged.
fn fail_stop(result: Result<(), store::Error>) {
    if let Err(e) = result {
        tracing::error!(error = %e, "store write failed; stopping");
        eprintln!("jobcenter: {e}; stopping so that nothing unwritten is acknowledged");
        std::process::exit(74);
    }
}

impl EngineHandle {
    async fn call<T>(&self, make: impl FnOnce(Reply<T>) -> Command) -> Result<T, Error> {
        let (tx, rx) = oneshot::channel();
        self.commands.send(make(tx)).await.map_err(|_| Error::Stopped)?;
        rx.await.map_err(|_| Error::Stopped)
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Persists a validated job; returns its id once it is durable.
    pub async fn submit(&self, spec: JobSpec, origin: JobOrigin) -> Result<JobId, Error> {
        let spec = Arc::new(spec);
        self.call(|reply| Command::Submit { id: JobId::new(), spec, origin, reply }).await?
    }

    /// Reports that an attempt began executing.
    pub async fn started(
        &self,
        task: TaskRef,
        attempt: u32,
        handler: HandlerId,
    ) -> Result<Result<(), Rejection>, Error> {
        self.call(|reply| Command::Started { task, attempt, handler, reply: Some(reply) }).await
    }

    /// Reports an attempt's outcome; the answer comes once the step is durable.
    pub async fn complete(
        &self,
        task: TaskRef,
        attempt: u32,
        handler: HandlerId,
        outcome: Outcome,
    ) -> Result<Result<(), Rejection>, Error> {
        self.call(|reply| Command::Complete { task, attempt, handler, outcome, received: None, reply: Some(reply) })
            .await
    }

    /// Reports an attempt's outcome without waiting for the step; a refusal
    /// is logged. `received` is when the report reached the server.
    pub async fn report(
        &self,
        task: TaskRef,
        attempt: u32,
        handler: HandlerId,
        outcome: Outcome,
        received: std::time::Instant,
    ) -> Result<(), Error> {
        self.send(Command::Complete { task, attempt, handler, outcome, received: Some(received), reply: None }).await
    }

    pub async fn cancel(&self, job: JobId) -> Result<(), Error> {
        match self.call(|reply| Command::Cancel { job, reply }).await? {
            Err(Error::JobEnded(_)) if self.stored(job).await?.is_none() => Err(Error::UnknownJob(job)),
            other => other,
        }
    }

    /// Retries the failed part of an ended job.
    pub async fn retry(&self, job: JobId) -> Result<(), Error> {
        let stored = self.stored(job).await?.ok_or(Error::UnknownJob(job))?;
        self.call(|reply| Command::Retry { job: stored, reply }).await?
    }

    /// Reports the timing of every group commit from now on; the first observer set stays.
    pub fn on_commit(&self, observer: CommitObserver) {
        let _ = self.commit_observer.set(observer);
    }

    /// Every durable change from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    /// Progress of an attempt; the first report also marks it running.
    pub async fn progress(
        &self,
        task: TaskRef,
        attempt: u32,
        handler: HandlerId,
        progress: Progress,
    ) -> Result<(), Error> {
        self.send(Command::Progress { task, attempt, handler, progress }).await
    }

    /// The handler gave the attempt back without running it (it was at
    /// capacity): the task is ready again, and nothing is counted against it.
    pub async fn requeue(&self, task: TaskRef, attempt: u32, handler: HandlerId, reason: &str) -> Result<(), Error> {
        self.send(Command::Requeue { task, attempt, handler, reason: reason.to_string() }).await
    }

    /// The slot total a handler reports about itself.
    pub async fn handler_slots(&self, handler: HandlerId, total: u32) -> Result<(), Error> {
        self.send(Command::HandlerSlots { handler, total }).await
    }

    pub async fn set_limits(&self, job_type: Arc<str>, limits: TypeLimits) -> Result<(), Error> {
        self.send(Command::SetLimits { job_type, limits }).await
    }

    /// Every attempt held by a handler that is neither connected nor in
    /// `live` is lost (not counted against the task). Returns how many.
    pub async fn lose_all_but(&self, live: HashSet<HandlerId>, reason: &str) -> Result<usize, Error> {
        let reason = reason.to_string();
        self.call(|reply| Command::LoseAllBut { live, reason, reply }).await
    }

    /// The active jobs and connected handlers, for the recovery rules.
    pub async fn recovery_snapshot(&self) -> Result<(Vec<recovery::JobSnapshot>, Vec<HandlerId>), Error> {
        self.call(|reply| Command::RecoverySnapshot { reply }).await
    }

    /// Applies recovery actions; for each, whether it changed anything. Answers once the changes are durable.
    pub async fn apply_recovery(&self, actions: Vec<(recovery::Rule, recovery::Action)>) -> Result<Vec<bool>, Error> {
        self.call(|reply| Command::ApplyRecovery { actions, reply }).await
    }

    /// The attempts a (re)connected handler runs now: those it was given
    /// before `before` and does not run are lost, uncounted.
    pub async fn reconcile(
        &self,
        handler: HandlerId,
        running: HashSet<String>,
        before: Timestamp,
    ) -> Result<(), Error> {
        self.send(Command::Reconcile { handler, running, before }).await
    }

    /// Sets which job types run only while the gate is open, and whether it
    /// is; answers how many attempts of those types are queued and running.
    pub async fn gate(&self, gated: Vec<Arc<str>>, open: bool) -> Result<(usize, u32), Error> {
        self.call(|reply| Command::Gate { gated, open, reply }).await
    }

    /// The dedupe keys (label `dedupe_key`) of every task that has not ended.
    pub async fn active_dedupe_keys(&self) -> Result<HashSet<String>, Error> {
        self.call(|reply| Command::ActiveDedupeKeys { reply }).await
    }

    async fn send(&self, command: Command) -> Result<(), Error> {
        self.commands.send(command).await.map_err(|_| Error::Stopped)
    }

    pub async fn add_handler(&self, spec: HandlerSpec) -> Result<(), Error> {
        self.commands.send(Command::AddHandler { spec }).await.map_err(|_| Error::Stopped)
    }

    /// Every attempt the handler holds is lost; `count_lost` counts it against the tasks.
    pub async fn handler_gone(&self, handler: HandlerId, reason: &str, count_lost: bool) -> Result<(), Error> {
        let reason = reason.to_string();
        self.commands.send(Command::HandlerGone { handler, reason, count_lost }).await.map_err(|_| Error::Stopped)
    }

    /// A job with all its tasks, active or ended.
    pub async fn job(&self, job: JobId) -> Result<Option<StoredJob>, Error> {
        match self.call(|reply| Command::Get { job, reply }).await? {
            Some(active) => Ok(Some(active)),
            None => self.stored(job).await,
        }
    }

    pub async fn summary(&self, job: JobId) -> Result<Option<Summary>, Error> {
        match self.call(|reply| Command::Summary { job, reply }).await? {
            Some(summary) => Ok(Some(summary)),
            None => Ok(self.stored(job).await?.map(|stored| {
                let mut counts = StateCounts::default();
                for task in &stored.tasks {
                    counts.add(task.state);
                }
                Summary { record: stored.record, counts }
            })),
        }
    }

    /// Waits until the job has ended and returns its final record.
    pub async fn wait(&self, job: JobId) -> Result<JobRecord, Error> {
        match self.call(|reply| Command::Wait { job, reply }).await? {
            Some(record) => Ok(record),
            None => match self.stored(job).await? {
                Some(stored) if stored.record.state.is_terminal() => Ok(stored.record),
                Some(_) => Err(Error::Stopped),
                None => Err(Error::UnknownJob(job)),
            },
        }
    }

    pub async fn active_jobs(&self) -> Result<Vec<JobRecord>, Error> {
        self.call(|reply| Command::ActiveJobs { reply }).await
    }

    pub async fn list(&self, filter: JobFilter) -> Result<Vec<JobRecord>, Error> {
        let store = self.store.clone();
        Ok(tokio::task::spawn_blocking(move || store.list_jobs(&filter)).await.map_err(|_| Error::Stopped)??)
    }

    async fn stored(&self, job: JobId) -> Result<Option<StoredJob>, Error> {
        let store = self.store.clone();
        Ok(tokio::task::spawn_blocking(move || store.get_job(job)).await.map_err(|_| Error::Stopped)??)
    }
}
