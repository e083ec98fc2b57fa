//! The steps that start an attempt: ready tasks queued, handed to a
//! handler here (held, with its slot, lock and deadline) or lent to another
//! instance's, attempts borrowed from another instance, and what this
//! instance asks of the cluster's permits.

use foldhash::HashMap;
use std::sync::Arc;

use super::super::attempts::{Deadline, Held};
use super::{Core, Step, SHARE};
use crate::active::ActiveJob;
use crate::budget::Share;
use crate::clock::Timestamp;
use crate::dispatch::{Assignment, FreeSlots, Place, Queued, WorkOrder};
use crate::leader;
use crate::model::{AttemptId, HandlerId, JobId, Phase, TaskIdx, TaskRef};

/// A job type with tasks queued, as one pass of dispatch sees it: whether
/// its tasks share the bandwidth budget is looked up once a pass, not once
/// a task.
pub(super) struct Candidate {
    job_type: Arc<str>,
    budgeted: bool,
}

impl AsRef<str> for Candidate {
    fn as_ref(&self) -> &str {
        &self.job_type
    }
}

/// What taking the next queued task of a type came to.
// Moved once, from `take_one` to its caller: boxing the assignment would
// allocate once more for every task dispatched.
#[allow(clippy::large_enum_variant)]
pub(super) enum Take {
    /// Nothing is queued.
    Empty,
    /// The task popped may not run now (or no longer exists); try the next.
    Skipped,
    Assigned(Assignment),
}

impl Core {
    /// What this instance asks of the cluster's permits: its limited job
    /// types, and the resources its ready tasks need or its attempts lock.
    pub(super) fn permit_demand(&mut self) -> crate::dispatch::Demand {
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
                if let Phase::Ready { .. } = record.phase {
                    if let Some(key) = spec.lock() {
                        resources.entry(key.to_string()).or_insert(false);
                    }
                }
            }
        }
        // Until the settlement is written, a volume wanted for nothing may be
        // given back: nothing starts on it meanwhile.
        if let Some(held) = self.resource_permits.as_mut() {
            held.retain(|key| resources.contains_key(key));
        }
        let budget = self.budget_asks();
        crate::dispatch::Demand { types: self.dispatch.demand(), resources, budget }
    }

    /// What this instance asks of the bandwidth budget's permits: the
    /// cluster's while budgeted tasks wait or run here, and each volume
    /// server's that a waiting budgeted task moves data through.
    fn budget_asks(&self) -> Vec<crate::budget::Ask> {
        if self.shares.budget().is_none() {
            return Vec::new();
        }
        let mut servers: Vec<Arc<str>> = Vec::new();
        let mut waiting = false;
        for job in self.jobs.values() {
            for (spec, record) in job.spec.tasks.iter().zip(&job.tasks) {
                if matches!(record.phase, Phase::Ready { .. }) && self.shares.applies_to(&spec.job_type) {
                    waiting = true;
                    servers.extend(spec.servers().iter().cloned());
                }
            }
        }
        servers.sort();
        servers.dedup();
        self.shares.asks(waiting, &servers)
    }

    /// Budgeted tasks that want a share now: those running, this one, and
    /// those queued that their type's global limit lets start.
    fn budget_wanting(&self, this_type: &str) -> u32 {
        let mut wanting = u32::try_from(self.shares.running()).unwrap_or(u32::MAX).saturating_add(1);
        for job_type in self.dispatch.queued_types() {
            if !self.shares.applies_to(&job_type) {
                continue;
            }
            let running = self.dispatch.running(&job_type) + u32::from(*job_type == *this_type);
            let room = self.dispatch.limits(&job_type).map_or(u32::MAX, |l| l.global.saturating_sub(running));
            wanting = wanting.saturating_add(self.dispatch.queued_of(&job_type).min(room));
        }
        wanting
    }

    /// A job type as dispatch sees it in this pass.
    fn candidate(&self, job_type: Arc<str>) -> Candidate {
        Candidate { budgeted: self.shares.applies_to(&job_type), job_type }
    }

    /// Whether no task of the type may start for want of budget.
    fn out_of_budget(&self, of: &Candidate) -> bool {
        of.budgeted && self.shares.exhausted()
    }

    pub(super) fn queue_ready(&mut self, job: JobId, ready: &[u32], now: Timestamp) {
        let Some(active) = self.jobs.get(&job) else { return };
        for &idx in ready {
            let spec = &active.spec.tasks[idx as usize];
            let not_before = active.tasks[idx as usize].not_before();
            self.dispatch.push_ready(
                spec.job_type.clone(),
                self.priorities.get(&job).copied().unwrap_or(spec.priority),
                TaskRef { job, idx: TaskIdx(idx) },
                not_before,
                now,
            );
        }
    }

    /// The one place an attempt becomes held: its slot, lock and deadline.
    pub(super) fn hold(&mut self, task: TaskRef, attempt: u32, handler: HandlerId, assigned_at: Timestamp) {
        let Some(job) = self.jobs.get(&task.job) else { return };
        let spec = &job.spec.tasks[task.idx.index()];
        let type_timeout = self.dispatch.limits(&spec.job_type).and_then(|l| l.execution_timeout_seconds);
        let held = Held {
            attempt,
            handler,
            job_type: spec.job_type.clone(),
            resource: spec.lock().map(str::to_string),
            deadline: match spec.execution_timeout_seconds {
                Some(seconds) => Deadline::Own(assigned_at.plus_seconds(seconds)),
                None => Deadline::OfType(type_timeout.map(|seconds| assigned_at.plus_seconds(seconds))),
            },
        };
        self.dispatch.take_slot(handler, &held.job_type);
        self.attempts.hold(task, held);
    }

    /// A job type's execution timeout changed: held attempts of that type
    /// without a timeout of their own take the new one.
    pub(super) fn retime_held(&mut self, job_type: &str, seconds: Option<u64>) {
        for task in self.attempts.of_type_without_own_timeout(job_type) {
            let assigned_at = self.jobs.get(&task.job).and_then(|j| j.tasks[task.idx.index()].assigned_at());
            let deadline = seconds.zip(assigned_at).map(|(s, at)| at.plus_seconds(s));
            self.attempts.set_deadline(task, Deadline::OfType(deadline));
        }
    }

    /// Hands queued tasks to handlers with free slots, the first by rank
    /// (priority and wait) over every job type first, until no type that
    /// has tasks queued may start one.
    pub(super) fn dispatch_ready(&mut self, now: Timestamp, step: &mut Step) {
        self.dispatch.promote_due(now);
        self.cooled(now, step);
        let mut types: Vec<Candidate> = self.dispatch.queued_types().into_iter().map(|t| self.candidate(t)).collect();
        let mut blocked: Vec<(Arc<str>, Queued)> = Vec::new();
        while let Some(i) = self.dispatch.first_of(&mut types) {
            let of = &types[i];
            if self.out_of_budget(of) {
                types.swap_remove(i);
                continue;
            }
            let jobs = &self.jobs;
            let near = || self.dispatch.peek(&of.job_type).map_or_else(Place::default, |t| place_of(jobs, t));
            let Some(handler) = self.dispatch.pick_handler(&of.job_type, near, now) else {
                types.swap_remove(i);
                continue;
            };
            let running = self.dispatch.starts_running(handler);
            match self.take_one(of, handler, running, now, step, &mut blocked) {
                Take::Empty => {
                    types.swap_remove(i);
                }
                Take::Skipped => {}
                Take::Assigned(assignment) => {
                    step.send(self.dispatch.sink(handler), WorkOrder::Execute(assignment));
                }
            }
        }
        for (job_type, queued) in blocked {
            self.dispatch.requeue(job_type, queued);
        }
    }

    /// Takes the next queued task of `job_type` and assigns it to `handler`
    /// (held, and written in the step), unless it may not run now.
    pub(super) fn take_one(
        &mut self,
        of: &Candidate,
        handler: HandlerId,
        running: bool,
        now: Timestamp,
        step: &mut Step,
        blocked: &mut Vec<(Arc<str>, Queued)>,
    ) -> Take {
        let job_type = &of.job_type;
        let Some(queued) = self.dispatch.pop(job_type) else { return Take::Empty };
        let task = queued.task;
        let Some(job) = self.jobs.get(&task.job) else { return Take::Skipped };
        let record = &job.tasks[task.idx.index()];
        let Phase::Ready { not_before } = record.phase else { return Take::Skipped };
        let spec = &job.spec.tasks[task.idx.index()];
        // A task never runs while another task on the same volume runs,
        // whatever job or job type that one belongs to.
        let locked_elsewhere = |key: &str| self.resource_permits.as_ref().is_some_and(|held| !held.contains(key));
        if spec.lock().is_some_and(|key| self.attempts.locked(key, now) || locked_elsewhere(key)) {
            blocked.push((job_type.clone(), queued));
            return Take::Skipped;
        }
        if not_before.is_some_and(|at| at > now) {
            self.dispatch.push_ready(spec.job_type.clone(), queued.priority, task, not_before, now);
            return Take::Skipped;
        }
        // A task that shares the bandwidth budget starts only with its share.
        let offer = match of.budgeted {
            true => match self.shares.offer(spec.servers(), self.budget_wanting(job_type)) {
                Some(share) => Some(share),
                None => {
                    blocked.push((job_type.clone(), queued));
                    return Take::Skipped;
                }
            },
            false => None,
        };
        let Some(job) = self.jobs.get_mut(&task.job) else { return Take::Skipped };
        let attempt = leader::assign(job, task.idx.0, handler, running, now, &mut step.batch);
        let spec = &job.spec.tasks[task.idx.index()];
        let attempt_id = AttemptId::new(task, attempt);
        // A task that asks for less itself holds only that.
        let io_byte_per_second = offer.map(|offer| spec.own_rate().map_or(offer, |own| own.min(offer)));
        if let Some(bytes_per_second) = io_byte_per_second {
            let share = Share { bytes_per_second, job_type: spec.job_type.clone(), servers: spec.servers().into() };
            let stored = serde_json::to_vec(&share).expect("a share serializes");
            step.batch.settings.push((format!("{SHARE}{attempt_id}"), Some(stored)));
            self.shares.start(attempt_id, share);
        }
        let assignment = Assignment {
            released_at: self.released_at.remove(&task),
            attempt: attempt_id,
            job_name: job.record.name.clone(),
            task_id: spec.id.clone(),
            job_type: spec.job_type.clone(),
            parameters: spec.parameters.clone(),
            labels: spec.labels.clone(),
            priority: queued.priority,
            execution_timeout_seconds: spec.execution_timeout_seconds,
            lent_by: None,
            traceparent: None,
            io_byte_per_second,
        };
        self.hold(task, attempt, handler, now);
        self.dispatch.started(job_type, now);
        Take::Assigned(assignment)
    }

    /// Lends queued tasks to the free slots of another instance's handlers:
    /// each is assigned and held here (its handler is the peer's worker)
    /// and returned once the step is durable. A job type whose tasks the
    /// handlers here run faster than they start is not lent.
    pub(super) fn lend(
        &mut self,
        slots: Vec<FreeSlots>,
        now: Timestamp,
        step: &mut Step,
    ) -> Vec<(HandlerId, Assignment)> {
        self.dispatch.promote_due(now);
        let mut lent = Vec::new();
        // Asked once a type: an offer may list thousands of workers, of few types.
        let mut kept: Vec<(Arc<str>, bool)> = Vec::new();
        for offer in slots {
            let mut left = offer.total;
            for (job_type, free) in offer.job_types {
                // The handlers here keep pace with what starts: lending would
                // cost both instances the hop and run nothing sooner.
                let keeps = match kept.iter().find(|(t, _)| *t == job_type) {
                    Some(&(_, keeps)) => keeps,
                    None => {
                        let keeps = self.dispatch.keeps_pace(&job_type, now);
                        kept.push((job_type.clone(), keeps));
                        keeps
                    }
                };
                if keeps {
                    continue;
                }
                let mut free = free.min(left);
                let mut blocked = Vec::new();
                let of = self.candidate(job_type);
                while free > 0 && self.dispatch.may_run(&of.job_type, now) && !self.out_of_budget(&of) {
                    match self.take_one(&of, offer.handler, false, now, step, &mut blocked) {
                        Take::Empty => break,
                        Take::Skipped => {}
                        Take::Assigned(assignment) => {
                            lent.push((offer.handler, assignment));
                            free -= 1;
                            left -= 1;
                        }
                    }
                }
                for (job_type, queued) in blocked {
                    self.dispatch.requeue(job_type, queued);
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
    pub(super) fn borrowed(
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
}

/// Where a task's data lives (`TaskSpec::place`).
fn place_of(jobs: &HashMap<JobId, ActiveJob>, task: TaskRef) -> Place {
    jobs.get(&task.job)
        .and_then(|j| j.spec.tasks.get(task.idx.index()))
        .map(crate::model::TaskSpec::place)
        .unwrap_or_default()
}
