//! The steps after a task ends: what it released is queued, and a job whose
//! last task ended is finalized and its waiters answered.

use super::{Core, Step};
use crate::clock::Timestamp;
use crate::follower::Released;
use crate::leader;
use crate::model::{JobId, TaskIdx, TaskRef};

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
        self.jobs.remove(&job);
        self.dispatch.forget_job(job);
        self.released_at.retain(|task, _| task.job != job);
        for waiter in self.waiters.remove(&job).unwrap_or_default() {
            step.reply(waiter, Some(record.clone()));
        }
    }
}
