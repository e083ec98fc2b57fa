//! The messages a worker sends, built from its state: the envelope, the
//! hello, heartbeats, schema responses and outcomes; and the `TaskContext` a
//! handler sees of an execution request.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::executions::Executions;
use super::{JOB_NAME_LABEL, PROTOCOL_VERSION, TASK_ID_LABEL};
use crate::clock::Timestamp;
use crate::follower::Outcome;
use crate::model::{AttemptId, HandlerId, JobId, TaskIdx, TaskRef};
use crate::proto::plugin::worker_to_admin_message::Body;
use crate::proto::plugin::{
    config_value, AdminRuntimeDefaults, ConfigSchemaResponse, ConfigValue, JobCompleted, JobResult, JobSpec,
    JobTypeCapability, JobTypeDescriptor, StringList, WorkerHeartbeat, WorkerHello, WorkerToAdminMessage,
};
use crate::wire;
use crate::worker::TaskContext;

fn saturating_i32(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

pub(super) fn wire_timestamp(at: Timestamp) -> prost_types::Timestamp {
    let millis = at.as_millis();
    prost_types::Timestamp {
        seconds: millis.div_euclid(1000),
        nanos: i32::try_from(millis.rem_euclid(1000) * 1_000_000).unwrap_or(0),
    }
}

pub(super) fn envelope(worker_id: &str, now: Timestamp, body: Body) -> WorkerToAdminMessage {
    WorkerToAdminMessage { worker_id: worker_id.to_string(), sent_at: Some(wire_timestamp(now)), body: Some(body) }
}

/// A job type's name and description for humans.
fn describe(job_type: &str) -> (String, String) {
    let (name, description) = match job_type {
        "noop" => ("No-op", "Sleeps for sleep_ms, then succeeds, or fails as told (fail, fail_attempts)"),
        "shell" => ("Shell command", "Runs command with sh -c, or argv directly; exit code 0 succeeds"),
        other => (other, ""),
    };
    (name.to_string(), description.to_string())
}

pub(super) fn hello_message(
    worker_id: &str,
    instance: HandlerId,
    job_types: &[Arc<str>],
    max_execute: u32,
    lease: Duration,
) -> WorkerHello {
    let capabilities = job_types
        .iter()
        .map(|job_type| {
            let (display_name, description) = describe(job_type);
            JobTypeCapability {
                job_type: job_type.to_string(),
                can_detect: false,
                can_execute: true,
                max_detection_concurrency: 0,
                max_execution_concurrency: saturating_i32(max_execute),
                display_name,
                description,
                weight: 0,
            }
        })
        .collect();
    WorkerHello {
        worker_id: worker_id.to_string(),
        worker_instance_id: instance.to_string(),
        address: String::new(),
        worker_version: env!("CARGO_PKG_VERSION").to_string(),
        protocol_version: PROTOCOL_VERSION.to_string(),
        capabilities,
        metadata: BTreeMap::from([
            ("runtime".to_string(), "jobcenter".to_string()),
            (wire::LEASE_METADATA.to_string(), lease.as_millis().to_string()),
        ]),
    }
}

pub(super) fn heartbeat_message(worker_id: &str, executions: &Executions, max_detect: u32) -> WorkerHeartbeat {
    WorkerHeartbeat {
        worker_id: worker_id.to_string(),
        running_work: executions.running_work(),
        detection_slots_used: 0,
        detection_slots_total: saturating_i32(max_detect),
        execution_slots_used: saturating_i32(executions.used()),
        execution_slots_total: saturating_i32(executions.capacity),
        queued_jobs_by_type: BTreeMap::new(),
        metadata: BTreeMap::from([("runtime".to_string(), "jobcenter".to_string())]),
    }
}

pub(super) fn schema_response(
    request_id: String,
    job_type: &str,
    served: bool,
    _max_execute: u32,
) -> ConfigSchemaResponse {
    if !served {
        return ConfigSchemaResponse {
            request_id,
            job_type: job_type.to_string(),
            success: false,
            error_message: format!("job type {job_type:?} is not served by this worker"),
            job_type_descriptor: None,
        };
    }
    let (display_name, description) = describe(job_type);
    ConfigSchemaResponse {
        request_id,
        job_type: job_type.to_string(),
        success: true,
        error_message: String::new(),
        job_type_descriptor: Some(JobTypeDescriptor {
            job_type: job_type.to_string(),
            display_name,
            description,
            descriptor_version: 1,
            admin_runtime_defaults: Some(AdminRuntimeDefaults {
                enabled: true,
                detection_interval_minutes: 0,
                detection_timeout_seconds: 45,
                max_jobs_per_detection: 1000,
                global_execution_concurrency: 1024,
                // A job type's descriptor is shared by every worker that serves
                // it; each worker's own slots bound it through its capability.
                per_worker_execution_concurrency: 1024,
                retry_limit: 0,
                retry_backoff_seconds: 5,
                job_type_max_runtime_seconds: 1800,
                execution_timeout_seconds: 0,
            }),
            ..JobTypeDescriptor::default()
        }),
    }
}

/// The `JobCompleted` of an execution request that was not run.
pub(super) fn refusal(
    request_id: String,
    job_id: String,
    job_type: String,
    error: String,
    now: Timestamp,
) -> JobCompleted {
    JobCompleted {
        request_id,
        job_id,
        job_type,
        success: false,
        error_message: error,
        completed_at: Some(wire_timestamp(now)),
        ..JobCompleted::default()
    }
}

/// The `JobCompleted` of an execution that ran; its output lines go in `output_values["output"]`.
pub(super) fn job_completed(
    request_id: String,
    job_id: String,
    job_type: String,
    outcome: Outcome,
    now: Timestamp,
) -> JobCompleted {
    let (success, error_message, summary, output) = match outcome {
        Outcome::Succeeded { output } => (true, String::new(), "succeeded".to_string(), output),
        Outcome::Failed { error, output } => (false, error.clone(), format!("failed: {error}"), output),
        // A give-back the admin asked for is reported in its own words.
        Outcome::Canceled { reason } if reason == wire::UNCOVERED => (false, reason.clone(), reason, Vec::new()),
        Outcome::Canceled { reason } => {
            let error = format!("canceled: {reason}");
            (false, error.clone(), error, Vec::new())
        }
    };
    let output = ConfigValue { kind: Some(config_value::Kind::StringList(StringList { values: output })) };
    JobCompleted {
        request_id,
        job_id,
        job_type,
        success,
        error_message,
        result: Some(JobResult { output_values: BTreeMap::from([("output".to_string(), output)]), summary }),
        activities: Vec::new(),
        completed_at: Some(wire_timestamp(now)),
    }
}

/// What a handler sees of a `JobSpec`. The task comes from the job id when it
/// is an `attempt_id`; otherwise a nil job id stands in and the request's
/// attempt counts.
pub(super) fn task_context(job: &JobSpec, request_attempt: i32) -> TaskContext {
    let parsed = job.job_id.parse::<AttemptId>().ok();
    let AttemptId { task, number: attempt } = parsed.unwrap_or_else(|| {
        let placeholder = TaskRef { job: JobId(uuid::Uuid::nil()), idx: TaskIdx(0) };
        AttemptId::new(placeholder, u32::try_from(request_attempt).unwrap_or(0).max(1))
    });
    let mut labels: BTreeMap<String, String> = job.labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    let task_id = labels.remove(TASK_ID_LABEL).unwrap_or_else(|| match parsed {
        Some(_) => task.idx.0.to_string(),
        None => job.job_id.clone(),
    });
    let job_name = labels.remove(JOB_NAME_LABEL).unwrap_or_else(|| job.summary.clone());
    // The trace's, not the task's.
    labels.remove(wire::TRACEPARENT_LABEL);
    TaskContext {
        task,
        job: task.job,
        job_name,
        task_id: one_word(&task_id).into_boxed_str(),
        job_type: Arc::from(job.job_type.as_str()),
        attempt,
        parameters: serde_json::Value::Object(wire::values_to_json(&job.parameters)),
        labels,
    }
}

/// `text` with its whitespace runs as `_`, so it stays one field of an execution log line.
fn one_word(text: &str) -> String {
    let word = text.split_whitespace().collect::<Vec<_>>().join("_");
    if word.is_empty() {
        "-".to_string()
    } else {
        word
    }
}
