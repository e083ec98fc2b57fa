//! The recovery check's side of the state machine: the plain snapshot its
//! rules read, and its actions applied, each only if its task has not moved on.

use jobcenter_recovery as recovery;

use super::super::attempts::Ending;
use super::{Core, Step};
use crate::active::ActiveJob;
use crate::clock::Timestamp;
use crate::follower::{self, Loss};
use crate::model::{AttemptId, HandlerId, JobId, JobOrigin, Phase, TaskIdx, TaskRef, TaskState};

impl Core {
    /// A plain snapshot of the active jobs for the recovery rules: each job
    /// with its held and ready tasks, and the handlers that are connected or
    /// still within the time their attempts wait for them.
    pub(super) fn recovery_snapshot(&self, now: Timestamp) -> (Vec<recovery::JobSnapshot>, Vec<HandlerId>) {
        let jobs = self
            .jobs
            .values()
            .map(|job| {
                let tasks = job
                    .tasks
                    .iter()
                    .enumerate()
                    .filter(|(_, t)| matches!(t.phase, Phase::Held(_) | Phase::Ready { .. }))
                    .map(|(idx, t)| {
                        let spec = &job.spec.tasks[idx];
                        recovery::TaskSnapshot {
                            idx: idx as u32,
                            id: spec.id.to_string(),
                            state: recovery_state(t.state()),
                            attempt: t.attempt,
                            handler: t.holder().map(|h| h.to_string()),
                            assigned_at: t.assigned_at().map(Timestamp::as_millis),
                            started_at: t.started_at().map(Timestamp::as_millis),
                            updated_at: t.updated_at.as_millis(),
                            finished_at: t.finished_at().map(Timestamp::as_millis),
                            pinned_node: spec.placement.as_ref().and_then(|p| p.node.as_deref()).map(str::to_string),
                            progress_timeout_ms: t
                                .hold()
                                .is_some()
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
    pub(super) fn apply_recovery(
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
                let Some(holder) = record.holder().filter(|_| record.attempt == *attempt) else { return false };
                self.cancel_attempt(holder, task_ref, *attempt, step);
                if rule == recovery::Rule::HandlerSilent {
                    // A silent handler gets no more work, this task included.
                    self.dispatch.remove_handler(holder, None);
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
                    .is_some_and(|t| matches!(t.phase, Phase::Ready { .. }));
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
