//! The spans of jobs and attempts for the trace export, kept by the
//! committer from the batches it writes: at the engine's edge, so that the
//! state machine makes no span and reads no clock for one. A job's span runs
//! from the batch that stores it to the one that ends it; an attempt's, its
//! child, from the batch that hands it out to the one that ends it, with its
//! outcome. Only jobs stored since this process started are traced: a job
//! loaded at start, adopted from another instance or retried after its end
//! is not.

use std::collections::HashMap;
use std::sync::Arc;

use tracing::field::Empty;
use tracing::Span;

use crate::model::{AttemptId, Hold, JobId, JobOrigin, JobRecord, JobSpec, Phase, TaskIdx, TaskRecord};
use crate::store::Batch;
use crate::traces::TARGET;

/// Jobs traced at once at most: past them a new job is not traced.
const MAX_JOBS: usize = 10_000;

/// The open spans: each traced job's, and the attempt each of its tasks holds.
#[derive(Default)]
pub(super) struct Spans {
    jobs: HashMap<JobId, TracedJob>,
}

struct TracedJob {
    span: Span,
    spec: Arc<JobSpec>,
    attempts: HashMap<TaskIdx, TracedAttempt>,
}

/// An attempt held, with its task's counts when it was handed out: how its
/// task moves on from it tells its outcome.
struct TracedAttempt {
    number: u32,
    failures: u32,
    lost: u32,
    span: Span,
}

impl Spans {
    /// Opens the spans the writes of `batch` begin and closes those they end.
    pub(super) fn observe(&mut self, batch: &Batch) {
        for (record, spec) in &batch.new_jobs {
            if self.jobs.len() < MAX_JOBS && !self.jobs.contains_key(&record.id) {
                self.jobs.insert(record.id, TracedJob::new(record, spec.clone()));
            }
        }
        for (job, idx, record) in &batch.tasks {
            if let Some(traced) = self.jobs.get_mut(job) {
                traced.task(*job, *idx, record);
            }
        }
        for record in batch.jobs.iter().filter(|record| record.state.is_terminal()) {
            self.end(record.id, record.state.as_str());
        }
        for job in &batch.released {
            self.end(*job, "released");
        }
        for job in &batch.removed {
            self.end(*job, "removed");
        }
    }

    /// The `traceparent` of an attempt's span, when its job is traced.
    pub(super) fn traceparent(&self, attempt: AttemptId) -> Option<Box<str>> {
        let traced = self.jobs.get(&attempt.task.job)?.attempts.get(&attempt.task.idx)?;
        if traced.number != attempt.number {
            return None;
        }
        crate::traces::traceparent(&traced.span).map(String::into_boxed_str)
    }

    fn end(&mut self, job: JobId, outcome: &'static str) {
        let Some(traced) = self.jobs.remove(&job) else { return };
        // An attempt still open when its job ends goes with it.
        for (_, attempt) in traced.attempts {
            attempt.span.record("outcome", outcome);
        }
        traced.span.record("outcome", outcome);
    }
}

impl TracedJob {
    fn new(record: &JobRecord, spec: Arc<JobSpec>) -> TracedJob {
        let origin = match record.origin {
            JobOrigin::User => "submitted",
            JobOrigin::Scheduler { .. } => "scheduler",
            JobOrigin::Schedule { .. } => "schedule",
        };
        let span = tracing::info_span!(
            target: TARGET,
            parent: None,
            "job",
            job.id = %record.id,
            job.name = %record.name,
            tasks = record.n_tasks,
            origin,
            outcome = Empty,
        );
        TracedJob { span, spec, attempts: HashMap::new() }
    }

    /// A task's record changed: the attempt it held ended, or it holds a new one.
    fn task(&mut self, job: JobId, idx: TaskIdx, record: &TaskRecord) {
        let hold = record.hold();
        if let Some(open) = self.attempts.get(&idx) {
            if hold.is_some() && open.number == record.attempt {
                return;
            }
        }
        if let Some(ended) = self.attempts.remove(&idx) {
            ended.span.record("outcome", outcome(&ended, record));
        }
        if let Some(hold) = hold {
            let attempt = self.attempt(job, idx, record, hold);
            self.attempts.insert(idx, attempt);
        }
    }

    fn attempt(&self, job: JobId, idx: TaskIdx, record: &TaskRecord, hold: &Hold) -> TracedAttempt {
        let task = self.spec.task(idx);
        let span = tracing::info_span!(
            target: TARGET,
            parent: &self.span,
            "attempt",
            job.id = %job,
            task.id = %task.id,
            attempt = record.attempt,
            job.type = %task.job_type,
            handler = %hold.handler,
            outcome = Empty,
        );
        TracedAttempt { number: record.attempt, failures: record.failures, lost: record.lost, span }
    }
}

/// How an attempt ended, from the record of its task that moved on from it.
fn outcome(attempt: &TracedAttempt, record: &TaskRecord) -> &'static str {
    match record.phase {
        Phase::Ended { end, .. } => end.state().as_str(),
        _ if record.lost > attempt.lost => "lost",
        _ if record.failures > attempt.failures => "failed",
        // Given back uncounted: its worker stopped, or it was taken back.
        _ => "returned",
    }
}

/// The span of one group commit: its steps and the records it writes.
pub(super) fn commit(batch: &Batch, steps: usize) -> Span {
    let records = batch.new_jobs.len()
        + batch.jobs.len()
        + batch.tasks.len()
        + batch.settings.len()
        + batch.released.len()
        + batch.removed.len();
    tracing::info_span!(
        target: TARGET,
        parent: None,
        "commit",
        steps,
        batch.size = records,
        batch.new_jobs = batch.new_jobs.len(),
        batch.tasks = batch.tasks.len(),
        flush_ms = Empty,
        duration_ms = Empty,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::Timestamp;
    use crate::model::{End, HandlerId, LastAttempt};

    fn record(phase: Phase, attempt: u32, failures: u32, lost: u32) -> TaskRecord {
        TaskRecord {
            phase,
            attempt,
            failures,
            lost,
            last_attempt: LastAttempt::default(),
            ..TaskRecord::initial(false, Timestamp(0))
        }
    }

    #[test]
    fn an_attempt_s_outcome_is_how_its_task_moved_on() {
        let held = TracedAttempt { number: 1, failures: 0, lost: 0, span: Span::none() };
        let at = Timestamp(5);
        let ended = |end| record(Phase::Ended { end, at }, 1, 0, 0);
        assert_eq!(outcome(&held, &ended(End::Succeeded)), "succeeded");
        assert_eq!(outcome(&held, &ended(End::Canceled)), "canceled");
        assert_eq!(outcome(&held, &record(Phase::READY, 1, 1, 0)), "failed");
        assert_eq!(outcome(&held, &record(Phase::READY, 1, 0, 1)), "lost");
        assert_eq!(outcome(&held, &record(Phase::READY, 1, 0, 0)), "returned");
        let again = Hold { handler: HandlerId::new(), assigned_at: at, started_at: None };
        assert_eq!(outcome(&held, &record(Phase::Held(again), 2, 1, 0)), "failed", "retried at once");
    }
}
