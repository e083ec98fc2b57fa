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
        priority: shared_priority(&stored.spec).map(|p| p.as_str().into()).unwrap_or_default(),
        ..base
    }
}

/// The priority every task of a job has, if they share one.
pub(super) fn shared_priority(spec: &crate::model::JobSpec) -> Option<crate::model::Priority> {
    let first = spec.tasks.first()?.priority;
    spec.tasks.iter().all(|t| t.priority == first).then_some(first)
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
        rate_per_minute: policy.rate_per_minute,
        rate_burst: policy.rate_burst,
        sources: sources.iter().map(|(k, v)| (k.clone(), v.as_str().to_string())).collect(),
        window_grace_seconds: policy.window_grace_seconds,
        uses_bandwidth_budget: policy.uses_bandwidth_budget,
    }
}

/// A job type's maintenance windows at `now`: open or not, and when it next opens and closes.
pub(crate) fn window(job_type: &str, policy: &Policy, now: Timestamp) -> api::JobTypeWindow {
    let mut out = api::JobTypeWindow {
        job_type: job_type.into(),
        open: true,
        windows: policy.windows.clone(),
        blackouts: policy.blackouts.clone(),
        on_window_close: policy.on_window_close.as_str().into(),
        window_grace_seconds: policy.window_grace_seconds,
        ..api::JobTypeWindow::default()
    };
    let Some(window) = policy.window() else { return out };
    let calendar = &window.calendar;
    let state = calendar.state(now);
    let after = |at: Option<Timestamp>| at.and_then(|at| calendar.state(at).next_change);
    let (opens, closes) = match state.open {
        true => (after(state.next_change), state.next_change),
        false => (state.next_change, after(state.next_change)),
    };
    let zone = calendar.zone().unwrap_or(chrono_tz::Tz::UTC);
    let local = |at: Option<Timestamp>| at.map(|at| crate::windows::local_text(zone, at)).unwrap_or_default();
    out.open = state.open;
    (out.next_open_ms, out.next_open_local) = (opens.map_or(0, Timestamp::as_millis), local(opens));
    (out.next_close_ms, out.next_close_local) = (closes.map_or(0, Timestamp::as_millis), local(closes));
    out
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

/// The bandwidth budget as the API shows it.
pub(crate) fn budget(view: &crate::budget::View, job_types: Vec<String>) -> api::Budget {
    api::Budget {
        set: true,
        cluster_bytes_per_second: view.budget.cluster,
        per_server_bytes_per_second: view.budget.per_server.unwrap_or(0),
        minimum_bytes_per_second: view.budget.minimum,
        used_bytes_per_second: view.used,
        free_bytes_per_second: view.free(),
        shares: view
            .shares
            .iter()
            .map(|(attempt, share)| api::BudgetShare {
                attempt: attempt.clone(),
                job_type: share.job_type.to_string(),
                bytes_per_second: share.bytes_per_second,
                servers: share.servers.iter().map(|s| s.to_string()).collect(),
            })
            .collect(),
        servers: view
            .servers
            .iter()
            .map(|(server, used)| api::ServerBudget { server: server.to_string(), used_bytes_per_second: *used })
            .collect(),
        job_types,
    }
}
