//! What commands print: the job JSON shape and human tables.

use serde_json::json;

use crate::model::{JobRecord, StateCounts, TaskState};
use crate::store::StoredJob;

/// The final job as one JSON object, as `run --json` and `job --json` print it.
pub(super) fn job_json(job: &StoredJob, detailed: bool) -> serde_json::Value {
    let tasks: Vec<serde_json::Value> = job
        .spec
        .tasks
        .iter()
        .zip(&job.tasks)
        .map(|(spec, task)| {
            let mut value = json!({
                "id": &*spec.id,
                "job_type": &*spec.job_type,
                "state": task.state(),
                "attempt": task.attempt,
                "error": task.error,
            });
            if detailed {
                let extra = json!({
                    "handler": task.handler().map(|h| h.to_string()),
                    "failures": task.failures,
                    "lost": task.lost,
                    "created_at": task.created_at.to_rfc3339(),
                    "assigned_at": task.assigned_at().map(|t| t.to_rfc3339()),
                    "started_at": task.started_at().map(|t| t.to_rfc3339()),
                    "updated_at": task.updated_at.to_rfc3339(),
                    "finished_at": task.finished_at().map(|t| t.to_rfc3339()),
                    "output": task.output,
                });
                if let (Some(map), serde_json::Value::Object(extra)) = (value.as_object_mut(), extra) {
                    map.extend(extra);
                }
            }
            value
        })
        .collect();
    let mut value = json!({
        "id": job.record.id.to_string(),
        "name": job.record.name,
        "state": job.record.state,
        "tasks": tasks,
    });
    if detailed {
        if let Some(map) = value.as_object_mut() {
            map.insert("created_at".into(), json!(job.record.created_at.to_rfc3339()));
            map.insert("finished_at".into(), json!(job.record.finished_at.map(|t| t.to_rfc3339())));
            map.insert("handler".into(), json!(job.record.handler.map(|h| h.to_string())));
        }
    }
    value
}

/// `succeeded 7, failed 1, upstream_failed 2`: the non-zero counts.
pub(super) fn counts_line(counts: &StateCounts) -> String {
    counts.iter().filter(|(_, n)| *n > 0).map(|(s, n)| format!("{s} {n}")).collect::<Vec<_>>().join(", ")
}

pub(super) fn job_row(job: &JobRecord) -> String {
    format!(
        "{:<36}  {:<10}  {:>8}  {:<24}  {}",
        job.id.to_string(),
        job.state.as_str(),
        job.n_tasks,
        job.created_at.to_rfc3339(),
        job.name
    )
}

pub(super) fn job_header() -> String {
    format!("{:<36}  {:<10}  {:>8}  {:<24}  {}", "ID", "STATE", "TASKS", "CREATED", "NAME")
}

/// A table of a job's tasks, failed ones with their error.
pub(super) fn task_table(job: &StoredJob) -> String {
    let width = job.spec.tasks.iter().map(|t| t.id.len()).max().unwrap_or(2).clamp(2, 40);
    let mut out = format!("{:<width$}  {:<16}  {:<16}  {:>7}  ERROR\n", "ID", "JOB TYPE", "STATE", "ATTEMPT");
    for (spec, task) in job.spec.tasks.iter().zip(&job.tasks) {
        let error = match task.state() {
            TaskState::Succeeded => "",
            _ => task.error.as_deref().unwrap_or(""),
        };
        out.push_str(&format!(
            "{:<width$}  {:<16}  {:<16}  {:>7}  {}\n",
            &*spec.id,
            &*spec.job_type,
            task.state().as_str(),
            task.attempt,
            error
        ));
    }
    out
}
