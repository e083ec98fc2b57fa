//! The running executions: the table of them by job id and the slots they
//! hold, one attempt run within the admin's execution timeout, and its span.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::AbortHandle;

use super::super::{Handler, TaskContext};
use crate::follower::Outcome;
use crate::model::JobId;
use crate::proto::plugin::{JobSpec, JobState, RunningWork, WorkKind};
use crate::wire;

/// Runs one attempt, bounded by the admin's execution timeout when it gives one.
pub(super) async fn execute_with_timeout(
    handler: Arc<dyn Handler>,
    ctx: TaskContext,
    timeout_seconds: Option<u64>,
) -> Outcome {
    let future = handler.execute(ctx);
    match timeout_seconds {
        Some(seconds) => match tokio::time::timeout(Duration::from_secs(seconds), future).await {
            Ok(outcome) => outcome,
            Err(_) => Outcome::Failed { error: format!("execution timed out after {seconds} s"), output: Vec::new() },
        },
        None => future.await,
    }
}

/// The span of one execution, for the trace export: the child of its
/// attempt's span on the admin when the order carries its `traceparent`.
/// Disabled, and free, when this process exports no traces.
pub(super) fn span(job: &JobSpec, ctx: &TaskContext, worker_id: &str) -> tracing::Span {
    let span = tracing::info_span!(
        target: crate::traces::TARGET,
        "execution",
        job.id = %ctx.job,
        task.id = %ctx.task_id,
        attempt = ctx.attempt,
        job.type = %job.job_type,
        worker.id = worker_id,
        outcome = tracing::field::Empty,
    );
    if let Some(traceparent) = job.labels.get(wire::TRACEPARENT_LABEL) {
        crate::traces::join(&span, traceparent);
    }
    span
}

/// What the execution log names an execution by.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct ExecRecord {
    pub(super) job: JobId,
    pub(super) task_id: Box<str>,
    pub(super) attempt: u32,
}

/// One running execution.
#[derive(Debug)]
pub(super) struct Execution {
    /// The `JobSpec.job_id`: `JOB_UUID.TASK_INDEX.ATTEMPT` from a jobcenter admin.
    pub(super) job_id: String,
    pub(super) request_id: String,
    pub(super) job_type: String,
    pub(super) record: ExecRecord,
    pub(super) abort: AbortHandle,
    /// Its span: it closes once the outcome is recorded and the execution's future is gone.
    pub(super) span: tracing::Span,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Admission {
    Admit,
    AtCapacity,
    AlreadyRunning,
}

/// The running executions by job id, and the slots they hold.
#[derive(Debug)]
pub(super) struct Executions {
    pub(super) capacity: u32,
    pub(super) running: BTreeMap<String, Execution>,
}

impl Executions {
    pub(super) fn new(capacity: u32) -> Executions {
        Executions { capacity, running: BTreeMap::new() }
    }

    pub(super) fn len(&self) -> usize {
        self.running.len()
    }

    pub(super) fn used(&self) -> u32 {
        u32::try_from(self.running.len()).unwrap_or(u32::MAX)
    }

    pub(super) fn admit(&self, job_id: &str) -> Admission {
        if self.running.contains_key(job_id) {
            Admission::AlreadyRunning
        } else if self.used() >= self.capacity {
            Admission::AtCapacity
        } else {
            Admission::Admit
        }
    }

    pub(super) fn insert(&mut self, execution: Execution) {
        self.running.insert(execution.job_id.clone(), execution);
    }

    pub(super) fn remove(&mut self, job_id: &str) -> Option<Execution> {
        self.running.remove(job_id)
    }

    /// Every execution, taken out of the table (to stop or give up).
    pub(super) fn take_all(&mut self) -> Vec<Execution> {
        std::mem::take(&mut self.running).into_values().collect()
    }

    pub(super) fn remove_task(&mut self, task: tokio::task::Id) -> Option<Execution> {
        let job_id = self.running.values().find(|e| e.abort.id() == task)?.job_id.clone();
        self.running.remove(&job_id)
    }

    /// The execution a cancel's `target_id` names: by job id, else by request id.
    pub(super) fn find(&self, target: &str) -> Option<&Execution> {
        self.running.get(target).or_else(|| self.running.values().find(|e| e.request_id == target))
    }

    pub(super) fn running_work(&self) -> Vec<RunningWork> {
        self.running
            .values()
            .map(|e| RunningWork {
                work_id: e.job_id.clone(),
                kind: WorkKind::Execution.into(),
                job_type: e.job_type.clone(),
                state: JobState::Running.into(),
                progress_percent: 0.0,
                stage: "running".into(),
            })
            .collect()
    }
}
