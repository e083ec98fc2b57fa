//! Jobs, tasks and policies as the client API carries them.

use std::collections::BTreeMap;

use crate::clock::Timestamp;
use crate::model::{JobOrigin, JobRecord};
use crate::policy::{Policy, Source};
use crate::proto::api;
use crate::store::StoredJob;

fn millis(t: Option<Timestamp>) -> i64 {
    t.map(Timestamp::as_millis).unwrap_or(0)
}

pub(crate) fn origin(origin: &JobOrigin) -> String {
    match origin {
        JobOrigin::User => "user".into(),
        JobOrigin::Scheduler { job_type, sequence } => format!("scheduler:{job_type}:{sequence}"),
        JobOrigin::Schedule { name, slot } => format!("schedule:{name}:{}", Timestamp(*slot).to_rfc3339()),
    }
}

/// The tasks in `range` as one part of the job: the first part (from task
/// 0) carries the job's own fields as well.
pub(crate) fn part(stored: &StoredJob, range: std::ops::Range<usize>) -> api::Job {
    let first_task = range.start as u32;
    let tasks = range.map(|idx| task(stored, idx)).collect();
    let record = &stored.record;
    let base = api::Job {
        id: record.id.to_string(),
        task_count: stored.spec.len() as u32,
        first_task,
        tasks,
        ..api::Job::default()
    };
    if first_task > 0 {
        return base;
    }
    api::Job {
        name: record.name.clone(),
        state: record.state.as_str().into(),
        origin: origin(&record.origin),
        created_at_ms: record.created_at.as_millis(),
        finished_at_ms: millis(record.finished_at),
        cancel_requested: record.cancel_requested,
        handler: record.handler.map(|h| h.to_string()).unwrap_or_default(),
        ..base
    }
}

/// The task at `idx` of a job, as the client API carries it.
pub(crate) fn task(stored: &StoredJob, idx: usize) -> api::Task {
    task_of(&stored.spec, idx, &stored.tasks[idx])
}

/// The task at `idx` of a job's spec, with its record.
pub(crate) fn task_of(spec: &crate::model::JobSpec, idx: usize, task: &crate::model::TaskRecord) -> api::Task {
    let task_spec = &spec.tasks[idx];
    api::Task {
        id: task_spec.id.to_string(),
        job_type: task_spec.job_type.to_string(),
        state: task.state().as_str().into(),
        attempt: task.attempt,
        error: task.error.as_deref().unwrap_or_default().to_string(),
        handler: task.handler().map(|h| h.to_string()).unwrap_or_default(),
        failures: task.failures,
        lost: task.lost,
        created_at_ms: task.created_at.as_millis(),
        assigned_at_ms: millis(task.assigned_at()),
        started_at_ms: millis(task.started_at()),
        updated_at_ms: task.updated_at.as_millis(),
        finished_at_ms: millis(task.finished_at()),
        depends_on: spec.dag.parents(idx as u32).iter().map(|&p| spec.tasks[p as usize].id.to_string()).collect(),
        priority: task_spec.priority.as_str().into(),
        labels: task_spec.labels.clone().into_iter().collect(),
        parameters: task_spec.parameters.to_string(),
        output: task.output.iter().map(|l| l.to_string()).collect(),
        progress_percent: f64::from(task.progress_percent),
        stage: task.stage.to_string(),
        worker_id: String::new(),
    }
}

pub(crate) fn summary(record: &JobRecord) -> api::JobSummary {
    api::JobSummary {
        id: record.id.to_string(),
        name: record.name.clone(),
        state: record.state.as_str().into(),
        tasks: record.n_tasks,
        created_at_ms: record.created_at.as_millis(),
        finished_at_ms: millis(record.finished_at),
        origin: origin(&record.origin),
    }
}

pub(crate) fn policy(job_type: &str, policy: &Policy, sources: &BTreeMap<String, Source>) -> api::Policy {
    api::Policy {
        job_type: job_type.into(),
        global_execution_concurrency: policy.global_execution_concurrency,
        per_worker_execution_concurrency: policy.per_worker_execution_concurrency,
        retry_limit: policy.retry_limit,
        retry_backoff_seconds: policy.retry_backoff_seconds,
        execution_timeout_seconds: policy.execution_timeout_seconds,
        job_type_max_runtime_seconds: policy.job_type_max_runtime_seconds,
        detection_interval_seconds: policy.detection_interval_seconds,
        detection_timeout_seconds: policy.detection_timeout_seconds,
        max_jobs_per_detection: policy.max_jobs_per_detection,
        detection_enabled: policy.detection_enabled != 0,
        worker_config: Default::default(),
        admin_config: Default::default(),
        terms: policy.texts().into_iter().map(|(name, text)| (name.to_string(), text)).collect(),
        sources: sources.iter().map(|(k, v)| (k.clone(), v.as_str().to_string())).collect(),
    }
}

pub(crate) fn audit_record(record: crate::model::audit::Record) -> api::AuditRecord {
    api::AuditRecord {
        id: record.id.to_string(),
        at_ms: i64::try_from(record.at_ms).unwrap_or(i64::MAX),
        who: record.who,
        role: record.role,
        from: record.from,
        action: record.action,
        target: record.target,
        args: record.args.into_iter().collect(),
        outcome: record.outcome,
    }
}
