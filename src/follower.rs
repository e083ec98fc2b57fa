//! The follower step: what happens when a task ends, as one set of changes
//! that the engine writes in a single atomic batch.
//!
//! On success the step records the result and releases every child whose
//! last unmet dependency this was. On failure (retries spent) it records the
//! failure and marks every descendant `upstream_failed` in the same batch, so
//! a child that would become ready at the same moment is never dispatched.
//! It reports when it ended the job's last task: the leader then finalizes.

use std::sync::Arc;

use crate::active::ActiveJob;
use crate::clock::Timestamp;
use crate::model::{End, HandlerId, Hold, JobId, Phase, TaskState};
use crate::store::Batch;

/// How an attempt ended, as its handler reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Succeeded { output: Vec<String> },
    Failed { error: String, output: Vec<String> },
    Canceled { reason: String },
}

/// Why a completion (or start report) was refused; a refused report changes nothing.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    #[error("unknown job {job}")]
    UnknownJob { job: JobId },
    #[error("job {job} has already ended")]
    JobEnded { job: JobId },
    #[error("unknown task #{idx} in job {job}")]
    UnknownTask { job: JobId, idx: u32 },
    #[error("stale attempt: the task is on attempt {current}, the report is for attempt {reported}")]
    StaleAttempt { current: u32, reported: u32 },
    #[error("already ended: the task is {state}")]
    AlreadyEnded { state: TaskState },
    #[error("not dispatched: the task is {state}")]
    NotHeld { state: TaskState },
    #[error("not the holder: attempt {attempt} is held by handler {holder}")]
    NotHolder { attempt: u32, holder: String },
}

/// What the follower step did besides writing records.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Released {
    /// Children that became ready (or the task itself, for a retry).
    pub ready: Vec<u32>,
    /// The job has no task left that is not terminal.
    pub job_done: bool,
}

/// Checks that `handler` holds `attempt` of the task.
pub fn check_holder(job: &ActiveJob, idx: u32, attempt: u32, handler: HandlerId) -> Result<(), Rejection> {
    let Some(task) = job.tasks.get(idx as usize) else {
        return Err(Rejection::UnknownTask { job: job.id(), idx });
    };
    if attempt != task.attempt {
        return Err(Rejection::StaleAttempt { current: task.attempt, reported: attempt });
    }
    match task.phase {
        Phase::Ended { end, .. } => Err(Rejection::AlreadyEnded { state: end.state() }),
        Phase::Pending | Phase::Ready { .. } => Err(Rejection::NotHeld { state: task.state() }),
        Phase::Held(hold) if hold.handler != handler => {
            Err(Rejection::NotHolder { attempt, holder: hold.handler.to_string() })
        }
        Phase::Held(_) => Ok(()),
    }
}

/// The attempt has begun executing (assigned -> running).
///
/// The start is kept in memory and written with the task's next change (its
/// completion): recovery treats an assigned and a running attempt alike, so
/// a start needs no write, and no flush, of its own.
pub fn start(job: &mut ActiveJob, idx: u32, attempt: u32, handler: HandlerId, now: Timestamp) -> Result<(), Rejection> {
    check_holder(job, idx, attempt, handler)?;
    if let Phase::Held(hold @ Hold { started_at: None, .. }) = job.tasks[idx as usize].phase {
        job.set_phase(idx, Phase::Held(Hold { started_at: Some(now), ..hold }), now);
    }
    Ok(())
}

/// The follower step for a reported outcome.
pub fn complete(
    job: &mut ActiveJob,
    idx: u32,
    attempt: u32,
    handler: HandlerId,
    outcome: Outcome,
    now: Timestamp,
    batch: &mut Batch,
) -> Result<Released, Rejection> {
    check_holder(job, idx, attempt, handler)?;
    let mut released = Released::default();
    match outcome {
        Outcome::Succeeded { output } => {
            let output = job.texts.lines(&output);
            let task = &mut job.tasks[idx as usize];
            task.output = output;
            task.error = None;
            succeed(job, idx, now, batch, &mut released);
        }
        Outcome::Failed { error, output } => {
            let retry_limit = job.spec.tasks[idx as usize].retry_limit;
            let backoff = job.spec.tasks[idx as usize].retry_backoff_seconds;
            let (output, error) = (job.texts.lines(&output), job.texts.text(&error));
            let task = &mut job.tasks[idx as usize];
            task.output = output;
            task.error = Some(error);
            task.failures += 1;
            if job.record.cancel_requested {
                // A handler stopped by a cancel reports a failure.
                fail(job, idx, End::Canceled, now, batch);
            } else if task.failures <= retry_limit {
                job.set_phase(idx, Phase::Ready { not_before: Some(now.plus_seconds(backoff)) }, now);
                // Whoever ran it, it waits for a handler again.
                job.tasks[idx as usize].last_attempt.handler = None;
                job.record_task(idx, batch);
                released.ready.push(idx);
            } else {
                fail(job, idx, End::Failed, now, batch);
            }
        }
        Outcome::Canceled { reason } => {
            job.tasks[idx as usize].error = Some(job.texts.text(&reason));
            fail(job, idx, End::Canceled, now, batch);
        }
    }
    released.job_done = job.all_ended();
    Ok(released)
}

/// Why a held attempt ended without an outcome from its handler.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Loss {
    /// Lost with its worker: the process died, went silent, or gave the
    /// attempt up when its lease ran out. Counted against the task's
    /// lost-attempt limit.
    WithWorker(String),
    /// Not the task's fault: the embedded executor died with the admin, the
    /// worker no longer ran it when it reconnected, or it was at capacity.
    NotCounted(String),
}

impl Loss {
    pub fn counts(&self) -> bool {
        matches!(self, Loss::WithWorker(_))
    }

    pub fn reason(&self) -> &str {
        match self {
            Loss::WithWorker(reason) | Loss::NotCounted(reason) => reason,
        }
    }
}

/// The held attempt is gone without an outcome: the task is ready again,
/// unless a counted loss took it past `lost_limit` (then it fails) or its
/// job is being canceled. Returns what was released.
pub fn lose(
    job: &mut ActiveJob,
    idx: u32,
    loss: &Loss,
    lost_limit: u32,
    now: Timestamp,
    batch: &mut Batch,
) -> Released {
    let mut released = Released::default();
    if job.tasks[idx as usize].hold().is_none() {
        return released;
    }
    let reason = loss.reason();
    let error = job.texts.text(reason);
    let task = &mut job.tasks[idx as usize];
    if loss.counts() {
        task.lost += 1;
    }
    task.error = Some(error);
    let end = if task.lost > lost_limit {
        task.error = Some(Arc::from(format!("{reason}; lost {} times, the limit is {lost_limit}", task.lost)));
        Some(End::Failed)
    } else {
        job.record.cancel_requested.then_some(End::Canceled)
    };
    match end {
        Some(end) => job.end(idx, end, now),
        None => job.set_phase(idx, Phase::READY, now),
    }
    // A lost attempt's handler says nothing of its task.
    job.tasks[idx as usize].last_attempt.handler = None;
    job.record_task(idx, batch);
    match end {
        Some(end) => fail_descendants(job, idx, end, now, batch),
        None => released.ready.push(idx),
    }
    released.job_done = job.all_ended();
    released
}

/// Ends a held attempt failed, with no retry (its node is gone for good),
/// marking every descendant `upstream_failed`.
pub fn abandon(job: &mut ActiveJob, idx: u32, reason: &str, now: Timestamp, batch: &mut Batch) -> Released {
    let mut released = Released::default();
    if job.tasks[idx as usize].hold().is_none() {
        return released;
    }
    job.tasks[idx as usize].error = Some(job.texts.text(reason));
    fail(job, idx, End::Failed, now, batch);
    released.job_done = job.all_ended();
    released
}

fn succeed(job: &mut ActiveJob, idx: u32, now: Timestamp, batch: &mut Batch, released: &mut Released) {
    job.end(idx, End::Succeeded, now);
    job.record_task(idx, batch);
    let spec = job.spec.clone();
    for &child in spec.dag.children(idx) {
        let unmet = &mut job.unmet[child as usize];
        *unmet -= 1;
        if *unmet == 0 && matches!(job.tasks[child as usize].phase, Phase::Pending) {
            job.set_phase(child, Phase::READY, now);
            job.record_task(child, batch);
            released.ready.push(child);
        }
    }
}

/// Ends a task as failed or canceled and marks every descendant that has
/// not ended `upstream_failed` (or `canceled`), iteratively.
fn fail(job: &mut ActiveJob, idx: u32, end: End, now: Timestamp, batch: &mut Batch) {
    job.end(idx, end, now);
    job.record_task(idx, batch);
    fail_descendants(job, idx, end, now, batch);
}

/// Marks every descendant of a task that ended `end` and has not ended
/// itself `upstream_failed` (or `canceled`), iteratively.
fn fail_descendants(job: &mut ActiveJob, idx: u32, end: End, now: Timestamp, batch: &mut Batch) {
    let (descendant_end, error) = match end {
        End::Canceled => (End::Canceled, job.texts.text("canceled with its job")),
        _ => (End::UpstreamFailed, Arc::from(format!("upstream task {:?} failed", &*job.spec.tasks[idx as usize].id))),
    };
    let spec = job.spec.clone();
    let mut stack: Vec<u32> = spec.dag.children(idx).to_vec();
    while let Some(t) = stack.pop() {
        if !matches!(job.tasks[t as usize].phase, Phase::Pending) {
            // Already ended through another failed ancestor (with its own
            // descendants), or, for a ready child of a retried job, not ours.
            continue;
        }
        job.tasks[t as usize].error = Some(error.clone());
        job.end(t, descendant_end, now);
        job.record_task(t, batch);
        stack.extend_from_slice(spec.dag.children(t));
    }
}
