//! The leader's steps: accept a validated job and release its ready tasks,
//! hand tasks to handlers, finalize a job whose tasks have all ended,
//! cancel a job and retry the failed part of one.

use std::sync::Arc;

use crate::active::ActiveJob;
use crate::clock::Timestamp;
use crate::model::{
    End, HandlerId, Hold, JobId, JobOrigin, JobRecord, JobSpec, JobState, Phase, TaskRecord, TaskState,
};
use crate::store::{Batch, StoredJob};

/// Creates a job from a validated spec; its roots are ready at once.
/// Returns the job and the ready tasks to dispatch.
pub fn submit(
    id: JobId,
    spec: Arc<JobSpec>,
    origin: JobOrigin,
    leader: HandlerId,
    now: Timestamp,
    batch: &mut Batch,
) -> (ActiveJob, Vec<u32>) {
    let record = JobRecord {
        id,
        name: spec.name.clone(),
        state: JobState::Pending,
        origin,
        n_tasks: spec.len() as u32,
        fingerprint: spec.fingerprint,
        created_at: now,
        updated_at: now,
        finished_at: None,
        cancel_requested: false,
        handler: Some(leader),
    };
    batch.new_jobs.push((record.clone(), spec.clone()));
    let tasks = (0..spec.len() as u32).map(|t| TaskRecord::initial(spec.dag.in_degree(t) > 0, now)).collect();
    let job = ActiveJob::from_stored(StoredJob { record, spec, tasks });
    let ready = job.spec.dag.roots().collect();
    (job, ready)
}

/// Hands a ready task to a handler as a new attempt. With `running` the
/// handler starts it at once (an in-process executor), so it skips `assigned`.
/// Returns the attempt number.
pub fn assign(
    job: &mut ActiveJob,
    idx: u32,
    handler: HandlerId,
    running: bool,
    now: Timestamp,
    batch: &mut Batch,
) -> u32 {
    debug_assert_eq!(job.tasks[idx as usize].state(), TaskState::Ready);
    let task = &mut job.tasks[idx as usize];
    task.attempt += 1;
    let attempt = task.attempt;
    let hold = Hold { handler, assigned_at: now, started_at: running.then_some(now) };
    job.set_phase(idx, Phase::Held(hold), now);
    job.record_task(idx, batch);
    if job.record.state == JobState::Pending {
        job.record.state = JobState::Running;
        job.record.updated_at = now;
        batch.jobs.push(job.record.clone());
    }
    attempt
}

/// Marks a job whose tasks have all ended: canceled if that was asked,
/// succeeded if every task succeeded, failed otherwise. Returns false (and
/// changes nothing) while a task has not ended.
pub fn finalize(job: &mut ActiveJob, leader: HandlerId, now: Timestamp, batch: &mut Batch) -> bool {
    if !job.all_ended() {
        return false;
    }
    job.record.handler = Some(leader);
    job.record.state = if job.record.cancel_requested {
        JobState::Canceled
    } else if job.counts.get(TaskState::Succeeded) as usize == job.len() {
        JobState::Succeeded
    } else {
        JobState::Failed
    };
    job.record.updated_at = now;
    job.record.finished_at = Some(now);
    batch.jobs.push(job.record.clone());
    true
}

/// What canceling a job asks of the handlers still running its tasks.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct CancelRunning {
    /// (task, attempt, handler) of every attempt that must be told to stop.
    pub running: Vec<(u32, u32, HandlerId)>,
}

/// Cancels every task that has not started; running ones are returned so
/// that their handlers are asked to stop. The job ends `canceled` once they have.
pub fn cancel(job: &mut ActiveJob, now: Timestamp, batch: &mut Batch) -> CancelRunning {
    let mut out = CancelRunning::default();
    if !job.record.cancel_requested {
        job.record.cancel_requested = true;
        job.record.updated_at = now;
        batch.jobs.push(job.record.clone());
    }
    for idx in 0..job.len() as u32 {
        let task = &job.tasks[idx as usize];
        match task.phase {
            Phase::Pending | Phase::Ready { .. } => {
                job.tasks[idx as usize].error = Some("canceled with its job".into());
                job.end(idx, End::Canceled, now);
                job.record_task(idx, batch);
            }
            Phase::Held(hold) => out.running.push((idx, task.attempt, hold.handler)),
            Phase::Ended { .. } => {}
        }
    }
    out
}

/// Retries the failed part of an ended job: failed, upstream_failed and
/// canceled tasks start over (with a fresh retry budget); succeeded tasks
/// are kept. Returns the tasks that are ready at once.
pub fn retry(job: &mut ActiveJob, leader: HandlerId, now: Timestamp, batch: &mut Batch) -> Vec<u32> {
    job.record.handler = Some(leader);
    for idx in 0..job.len() as u32 {
        let task = &mut job.tasks[idx as usize];
        if matches!(task.phase, Phase::Ended { end: End::Failed | End::UpstreamFailed | End::Canceled, .. }) {
            task.failures = 0;
            task.lost = 0;
            task.error = None;
            task.last_attempt.handler = None;
            job.set_phase(idx, Phase::Pending, now);
        }
    }
    // Recompute the unmet counts from scratch: every parent's state may have changed.
    let spec = job.spec.clone();
    let mut ready = Vec::new();
    for idx in 0..job.len() as u32 {
        let unmet =
            spec.dag.parents(idx).iter().filter(|&&p| job.tasks[p as usize].state() != TaskState::Succeeded).count();
        job.unmet[idx as usize] = unmet as u32;
        if matches!(job.tasks[idx as usize].phase, Phase::Pending) {
            if unmet == 0 {
                job.set_phase(idx, Phase::READY, now);
                ready.push(idx);
            }
            job.record_task(idx, batch);
        }
    }
    job.record.state = JobState::Running;
    job.record.cancel_requested = false;
    job.record.finished_at = None;
    job.record.updated_at = now;
    batch.jobs.push(job.record.clone());
    ready
}

/// Fails a job outright: every task that has not ended fails with `reason`
/// (held ones are returned, so that their handlers are told to stop), and the
/// job ends `failed`. Used for scheduler jobs, which are not resubmitted.
pub fn fail_job(job: &mut ActiveJob, reason: &str, now: Timestamp, batch: &mut Batch) -> CancelRunning {
    let mut out = CancelRunning::default();
    for idx in 0..job.len() as u32 {
        let task = &job.tasks[idx as usize];
        match task.phase {
            Phase::Ended { .. } => continue,
            Phase::Held(hold) => out.running.push((idx, task.attempt, hold.handler)),
            Phase::Pending | Phase::Ready { .. } => {}
        }
        job.tasks[idx as usize].error = Some(job.texts.text(reason));
        job.end(idx, End::Failed, now);
        job.record_task(idx, batch);
    }
    out
}
