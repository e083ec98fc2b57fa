//! The steps after a task ends: what it released is queued, and a job whose
//! last task ended is finalized and its waiters answered.

use super::{Core, Step};
use crate::active::ActiveJob;
use crate::clock::Timestamp;
use crate::follower::Released;
use crate::leader;
use crate::model::notify::{self, FailedTask};
use crate::model::{JobId, TaskIdx, TaskRef, TaskState};

impl Core {
    /// Queues what a step released and finalizes the job if it ended;
    /// `received` is when the report behind the step reached the server.
    pub(super) fn after_release(
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
    pub(super) fn finalize(&mut self, job: JobId, now: Timestamp, step: &mut Step) {
        let Some(active) = self.jobs.get_mut(&job) else { return };
        if !leader::finalize(active, self.options.instance, now, &mut step.batch) {
            return;
        }
        let record = active.record.clone();
        tracing::info!(job.id = %job, job.state = %record.state, "job ended");
        // The failed tasks are looked for only when an endpoint wants the event.
        if let Some(event) = notify::job_ended(&record, || failed_tasks(active), &self.options.notify, now) {
            step.batch.settings.push(event.into_setting());
        }
        self.jobs.remove(&job);
        if self.priorities.remove(&job).is_some() {
            step.batch.settings.push((super::job::priority_key(job), None));
        }
        self.dispatch.forget_job(job);
        self.released_at.retain(|task, _| task.job != job);
        for waiter in self.waiters.remove(&job).unwrap_or_default() {
            step.reply(waiter, Some(record.clone()));
        }
    }
}

/// The tasks of an ended job that failed, for its notification.
fn failed_tasks(job: &ActiveJob) -> Vec<FailedTask> {
    job.tasks
        .iter()
        .zip(&job.spec.tasks)
        .filter(|(record, _)| record.state() == TaskState::Failed)
        .map(|(record, spec)| FailedTask {
            id: spec.id.to_string(),
            job_type: spec.job_type.to_string(),
            attempt: record.attempt,
            error: record.error.as_deref().unwrap_or_default().to_string(),
        })
        .collect()
}
