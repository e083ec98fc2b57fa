//! Tests of the worker runtime's parts without a stream: the executions'
//! slots, the reconnect pauses, the messages, task contexts, addresses,
//! worker ids and tokens.

use std::collections::BTreeMap;

use tokio::task::{AbortHandle, JoinSet};

use super::connection::grpc_uri;
use super::executions::{Admission, ExecRecord, Execution, Executions};
use super::fake_admin::{output_lines, spec};
use super::messages::{
    envelope, heartbeat_message, hello_message, job_completed, refusal, schema_response, task_context,
};
use super::*;
use crate::clock::Timestamp;
use crate::follower::Outcome;
use crate::model::{AttemptId, JobId, TaskIdx, TaskRef};
use crate::proto::plugin::worker_to_admin_message::Body;
use crate::proto::plugin::{JobState, WorkKind};

async fn pending_task(tasks: &mut JoinSet<Outcome>) -> AbortHandle {
    tasks.spawn(std::future::pending())
}

fn execution(job_id: &str, request_id: &str, abort: AbortHandle) -> Execution {
    Execution {
        job_id: job_id.into(),
        request_id: request_id.into(),
        job_type: "noop".into(),
        record: ExecRecord { job: JobId::new(), task_id: "t".into(), attempt: 1 },
        abort,
        span: tracing::Span::none(),
    }
}

#[tokio::test]
async fn executions_account_for_their_slots() {
    let mut tasks = JoinSet::new();
    let mut executions = Executions::new(2);
    assert_eq!(executions.admit("a"), Admission::Admit);
    let a = pending_task(&mut tasks).await;
    let a_id = a.id();
    executions.insert(execution("a", "r1", a));
    assert_eq!(executions.admit("a"), Admission::AlreadyRunning);
    assert_eq!(executions.admit("b"), Admission::Admit);
    executions.insert(execution("b", "r2", pending_task(&mut tasks).await));
    assert_eq!(executions.admit("c"), Admission::AtCapacity);
    assert_eq!(executions.used(), 2);

    let heartbeat = heartbeat_message("w1", &executions, 1);
    assert_eq!((heartbeat.execution_slots_used, heartbeat.execution_slots_total), (2, 2));
    assert_eq!((heartbeat.detection_slots_used, heartbeat.detection_slots_total), (0, 1));
    let work: Vec<(&str, i32, i32)> =
        heartbeat.running_work.iter().map(|w| (w.work_id.as_str(), w.kind, w.state)).collect();
    let (execution_kind, running) = (WorkKind::Execution as i32, JobState::Running as i32);
    assert_eq!(work, [("a", execution_kind, running), ("b", execution_kind, running)]);

    assert_eq!(executions.find("r2").map(|e| e.job_id.as_str()), Some("b"));
    assert_eq!(executions.find("a").map(|e| e.job_id.as_str()), Some("a"));
    assert!(executions.find("zzz").is_none());
    assert_eq!(executions.remove_task(a_id).map(|e| e.job_id), Some("a".to_string()));
    assert!(executions.remove_task(a_id).is_none());
    assert_eq!(executions.admit("c"), Admission::Admit);
    assert!(executions.remove("b").is_some());
    assert_eq!(executions.used(), 0);
    assert_eq!(executions.admit("c"), Admission::Admit);
    tasks.shutdown().await;
}

#[test]
fn three_tries_to_reconnect_fit_in_any_lease() {
    for lease_ms in [400, 1_000, 3_000, 10_000, 60_000, 600_000] {
        let lease = Duration::from_millis(lease_ms);
        for _ in 0..50 {
            let mut pauses = reconnect_pauses(lease);
            let three: Duration = (0..3).map(|_| pauses.next_pause()).sum();
            assert!(three < lease, "three pauses take {three:?}, the lease is {lease:?}");
        }
        let mut pauses = reconnect_pauses(lease);
        let most = (0..20).map(|_| pauses.next_pause()).max().unwrap();
        assert!(most <= Duration::from_secs(30) && most <= (lease / 4).max(Duration::from_millis(100)), "{most:?}");
    }
}

#[test]
fn hello_announces_every_job_type() {
    let instance = HandlerId::new();
    let hello = hello_message("w1", instance, &[Arc::from("noop"), Arc::from("shell")], 3, DEFAULT_LEASE);
    assert_eq!(hello.worker_id, "w1");
    assert_eq!(hello.worker_instance_id, instance.to_string());
    assert_eq!(hello.protocol_version, "1");
    assert_eq!(hello.worker_version, env!("CARGO_PKG_VERSION"));
    assert_eq!(hello.metadata.get("runtime").map(String::as_str), Some("jobcenter"));
    let capabilities: Vec<(&str, bool, bool, i32, i32)> = hello
        .capabilities
        .iter()
        .map(|c| {
            (c.job_type.as_str(), c.can_detect, c.can_execute, c.max_detection_concurrency, c.max_execution_concurrency)
        })
        .collect();
    assert_eq!(capabilities, [("noop", false, true, 0, 3), ("shell", false, true, 0, 3)]);
    assert_eq!(hello.capabilities[1].display_name, "Shell command");

    let message = envelope("w1", Timestamp(1_500), Body::Hello(hello));
    assert_eq!(message.worker_id, "w1");
    assert_eq!(message.sent_at, Some(prost_types::Timestamp { seconds: 1, nanos: 500_000_000 }));
}

#[test]
fn schema_responses() {
    let response = schema_response("q1".into(), "shell", true, 4);
    assert!(response.success);
    let descriptor = response.job_type_descriptor.expect("a descriptor");
    assert_eq!((descriptor.job_type.as_str(), descriptor.descriptor_version), ("shell", 1));
    let defaults = descriptor.admin_runtime_defaults.expect("runtime defaults");
    assert!(defaults.enabled);
    assert_eq!(defaults.per_worker_execution_concurrency, 1024);
    assert_eq!(defaults.global_execution_concurrency, 1024);
    assert_eq!(defaults.job_type_max_runtime_seconds, 1800);
    assert_eq!(defaults.detection_timeout_seconds, 45);

    let response = schema_response("q2".into(), "vacuum", false, 4);
    assert_eq!((response.request_id.as_str(), response.success), ("q2", false));
    assert_eq!(response.error_message, "job type \"vacuum\" is not served by this worker");
    assert!(response.job_type_descriptor.is_none());
}

#[test]
fn completions_carry_outcome_and_output() {
    let now = Timestamp(2_000);
    let done = job_completed(
        "r".into(),
        "j".into(),
        "shell".into(),
        Outcome::Succeeded { output: vec!["a".into(), "b".into()] },
        now,
    );
    assert!(done.success && done.error_message.is_empty());
    assert_eq!(output_lines(&done), ["a", "b"]);
    assert_eq!(done.result.as_ref().unwrap().summary, "succeeded");
    assert_eq!(done.completed_at, Some(prost_types::Timestamp { seconds: 2, nanos: 0 }));

    let failed = job_completed(
        "r".into(),
        "j".into(),
        "shell".into(),
        Outcome::Failed { error: "exit 3".into(), output: vec!["x".into()] },
        now,
    );
    assert_eq!((failed.success, failed.error_message.as_str()), (false, "exit 3"));
    assert_eq!(output_lines(&failed), ["x"]);

    let canceled =
        job_completed("r".into(), "j".into(), "noop".into(), Outcome::Canceled { reason: "stop".into() }, now);
    assert_eq!((canceled.success, canceled.error_message.as_str()), (false, "canceled: stop"));
    assert!(output_lines(&canceled).is_empty());
    // A cancel that gives the attempt back is reported in the admin's words.
    let given_back = Outcome::Canceled { reason: wire::UNCOVERED.into() };
    let given_back = job_completed("r".into(), "j".into(), "noop".into(), given_back, now);
    assert_eq!((given_back.success, given_back.error_message.as_str()), (false, wire::UNCOVERED));

    let refused = refusal("r".into(), "j".into(), "noop".into(), wire::AT_CAPACITY.into(), now);
    assert_eq!((refused.success, refused.error_message.as_str()), (false, "executor is at capacity"));
    assert!(refused.result.is_none());
}

#[test]
fn task_context_from_an_attempt_id() {
    let task = TaskRef { job: JobId::new(), idx: TaskIdx(7) };
    let mut job = spec(&AttemptId::new(task, 3).to_string(), "shell", serde_json::json!({"command": "true", "n": 2}));
    job.labels = BTreeMap::from([
        (TASK_ID_LABEL.to_string(), "vacuum 7".to_string()),
        (JOB_NAME_LABEL.to_string(), "nightly".to_string()),
        ("volume_id".to_string(), "7".to_string()),
    ]);
    let ctx = task_context(&job, 9);
    assert_eq!((ctx.task, ctx.job, ctx.attempt), (task, task.job, 3));
    assert_eq!((&*ctx.task_id, ctx.job_name.as_str(), &*ctx.job_type), ("vacuum_7", "nightly", "shell"));
    assert_eq!(ctx.parameters, serde_json::json!({"command": "true", "n": 2}));
    assert_eq!(ctx.labels, BTreeMap::from([("volume_id".to_string(), "7".to_string())]));

    job.labels.clear();
    job.summary = "a summary".into();
    let ctx = task_context(&job, 9);
    assert_eq!((&*ctx.task_id, ctx.job_name.as_str()), ("7", "a summary"));
}

#[test]
fn task_context_from_a_foreign_job_id() {
    let ctx = task_context(&spec("vacuum-42", "noop", serde_json::json!({})), 2);
    assert_eq!(ctx.task.job, JobId(uuid::Uuid::nil()));
    assert_eq!((&*ctx.task_id, ctx.attempt), ("vacuum-42", 2));
    assert_eq!(task_context(&spec("", "noop", serde_json::json!({})), 0).attempt, 1);
    assert_eq!(&*task_context(&spec(" ", "noop", serde_json::json!({})), 0).task_id, "-");
}

#[test]
fn stream_uris() {
    assert_eq!(grpc_uri("127.0.0.1:33646").unwrap(), "http://127.0.0.1:33646");
    assert_eq!(grpc_uri("[::1]:33646").unwrap(), "http://[::1]:33646");
    assert_eq!(grpc_uri("::1:33646").unwrap(), "http://[::1]:33646");
    assert!(grpc_uri("nowhere").is_err());
}

#[test]
fn default_worker_ids_are_one_word() {
    let id = default_worker_id();
    assert!(id.starts_with("jobcenter-worker-") && id.len() > "jobcenter-worker-".len(), "{id}");
    assert!(!id.contains(char::is_whitespace), "{id}");
}

#[test]
fn invalid_tokens_are_refused() {
    assert!(bearer("abc.DEF-123").is_ok());
    assert!(bearer("line\nbreak").is_err());
}
