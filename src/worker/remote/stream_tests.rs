//! Tests of the worker runtime against a fake admin over a real stream:
//! executions, cancels, refusals, reconnects, and the lease that executions
//! outlive a stream by.

use std::time::Duration;

use tokio::time::Instant;

use super::fake_admin::{
    accepted_hello, next_session, options_for, output_lines, process_ends, serving, spec, start_fake_admin,
    start_worker, stop_worker, wait_for_file, FakeSession, Renewing,
};
use super::*;
use crate::model::{AttemptId, JobId, TaskIdx, TaskRef};
use crate::proto::plugin::admin_to_worker_message::Body as AdminBody;
use crate::proto::plugin::worker_to_admin_message::Body;
use crate::proto::plugin::{
    AdminHello, AdminShutdown, AdminToWorkerMessage, CancelRequest, RequestConfigSchema, RunDetectionRequest,
};
use crate::worker::ExecLog;

#[tokio::test]
async fn an_execution_that_ends_in_its_first_turn_reports_its_outcome_without_a_start() {
    let (stop, worker, mut session) = serving(4).await;

    let job = JobId::new();
    let quick = AttemptId::new(TaskRef { job, idx: TaskIdx(0) }, 1).to_string();
    session.execute("r1", spec(&quick, "noop", serde_json::json!({})), 0).await;
    let ack = session.ack().await;
    assert_eq!((ack.request_id.as_str(), ack.accepted), ("r1", true));
    let done = session.completed().await;
    assert_eq!((done.job_id.as_str(), done.success), (quick.as_str(), true));

    // One still running after its first turn reports its start first.
    let slow = AttemptId::new(TaskRef { job, idx: TaskIdx(1) }, 1).to_string();
    session.execute("r2", spec(&slow, "noop", serde_json::json!({"sleep_ms": 300})), 0).await;
    session.started("r2", &slow).await;
    let done = session.completed().await;
    assert_eq!((done.job_id.as_str(), done.success), (slow.as_str(), true));

    stop_worker(stop, worker).await;
}

/// A cancel can overtake its execute order (they take different paths
/// between instances): the order that comes after it is not run.
#[tokio::test]
async fn an_order_canceled_before_it_arrived_is_not_run() {
    let (stop, worker, mut session) = serving(4).await;

    let job = JobId::new();
    let early = AttemptId::new(TaskRef { job, idx: TaskIdx(0) }, 1).to_string();
    let cancel = CancelRequest { target_id: early.clone(), reason: "taken back".into(), ..CancelRequest::default() };
    session.send("c1", Some(AdminBody::CancelRequest(cancel))).await;
    let ack = session.ack().await;
    assert_eq!((ack.request_id.as_str(), ack.accepted), ("c1", false));
    session.execute("r1", spec(&early, "noop", serde_json::json!({})), 0).await;
    let ack = session.ack().await;
    assert_eq!((ack.request_id.as_str(), ack.accepted), ("r1", false), "{}", ack.message);
    // Another attempt of the same task is run.
    let next = AttemptId::new(TaskRef { job, idx: TaskIdx(0) }, 2).to_string();
    session.execute("r2", spec(&next, "noop", serde_json::json!({})), 0).await;
    let ack = session.ack().await;
    assert_eq!((ack.request_id.as_str(), ack.accepted), ("r2", true));
    let done = session.completed().await;
    assert_eq!((done.job_id.as_str(), done.success), (next.as_str(), true));

    stop_worker(stop, worker).await;
}

#[tokio::test]
async fn serves_an_admin_over_the_worker_stream() {
    let dir = tempfile::tempdir().unwrap();
    let (admin, mut sessions) = start_fake_admin().await;
    let log_path = dir.path().join("exec.log");
    let options = RemoteWorkerOptions {
        token: Some("s3cret".into()),
        exec_log: Some(ExecLog::open(&log_path).unwrap()),
        ..options_for(admin, 1)
    };
    let (stop, worker) = start_worker(options);

    // A refused hello: the worker comes back, as the same process.
    let mut session = next_session(&mut sessions).await;
    assert_eq!(session.authorization.as_deref(), Some("Bearer s3cret"));
    let first_hello = session.hello().await;
    assert_eq!(first_hello.capabilities.len(), 2);
    let refusal = AdminHello { accepted: false, message: "not now".into(), ..AdminHello::default() };
    session.send("", Some(AdminBody::Hello(refusal))).await;
    let mut session = next_session(&mut sessions).await;
    assert_eq!(session.hello().await.worker_instance_id, first_hello.worker_instance_id);
    session.send("", accepted_hello()).await;
    let heartbeat = session.heartbeat().await;
    assert_eq!((heartbeat.execution_slots_used, heartbeat.execution_slots_total), (0, 1));

    // Schemas.
    let schema = |job_type: &str| {
        Some(AdminBody::RequestConfigSchema(RequestConfigSchema { job_type: job_type.into(), force_refresh: false }))
    };
    session.send("q1", schema("shell")).await;
    let Body::ConfigSchemaResponse(response) = session.recv().await else { panic!("expected a schema") };
    assert_eq!((response.request_id.as_str(), response.success), ("q1", true));
    session.send("q2", schema("vacuum")).await;
    let Body::ConfigSchemaResponse(response) = session.recv().await else { panic!("expected a schema") };
    assert_eq!((response.request_id.as_str(), response.success), ("q2", false));

    // One slot: a long execution takes it; the next is refused, the same one is not run twice.
    let sleepy = TaskRef { job: JobId::new(), idx: TaskIdx(0) };
    let sleepy_id = AttemptId::new(sleepy, 1).to_string();
    let mut sleepy_spec = spec(&sleepy_id, "noop", serde_json::json!({"sleep_ms": 60_000}));
    sleepy_spec.labels.insert(TASK_ID_LABEL.into(), "sleepy".into());
    session.execute("r1", sleepy_spec.clone(), 0).await;
    session.started("r1", &sleepy_id).await;
    let other = AttemptId::new(TaskRef { job: sleepy.job, idx: TaskIdx(1) }, 1).to_string();
    session.execute("r2", spec(&other, "noop", serde_json::json!({})), 0).await;
    let refused = session.completed().await;
    assert_eq!((refused.request_id.as_str(), refused.job_id.as_str()), ("r2", other.as_str()));
    assert_eq!((refused.success, refused.error_message.as_str()), (false, wire::AT_CAPACITY));
    session.execute("r3", spec(&other, "vacuum", serde_json::json!({})), 0).await;
    let refused = session.completed().await;
    assert_eq!((refused.success, refused.error_message.as_str()), (false, "unknown job type vacuum"));
    session.execute("r4", sleepy_spec, 0).await;
    let ack = session.ack().await;
    assert_eq!((ack.request_id.as_str(), ack.accepted), ("r4", false));

    // Cancels, by request id; an unknown target is refused.
    let cancel = |target: &str| {
        Some(AdminBody::CancelRequest(CancelRequest {
            target_id: target.into(),
            reason: "stop".into(),
            ..CancelRequest::default()
        }))
    };
    session.send("c1", cancel("r1")).await;
    let ack = session.ack().await;
    assert_eq!((ack.request_id.as_str(), ack.accepted), ("c1", true));
    let canceled = session.completed().await;
    assert_eq!((canceled.request_id.as_str(), canceled.job_id.as_str()), ("r1", sleepy_id.as_str()));
    assert_eq!((canceled.success, canceled.error_message.as_str()), (false, "canceled: stop"));
    session.heartbeat_where(|h| h.execution_slots_used == 0).await;
    session.send("c2", cancel("nothing")).await;
    let ack = session.ack().await;
    assert_eq!((ack.request_id.as_str(), ack.accepted), ("c2", false));

    // A command runs to its end; another one runs into the admin's timeout.
    let echo_id = AttemptId::new(TaskRef { job: sleepy.job, idx: TaskIdx(2) }, 1).to_string();
    session.execute("r5", spec(&echo_id, "shell", serde_json::json!({"command": "echo hi"})), 0).await;
    let done = session.ran("r5", &echo_id).await;
    assert_eq!((done.request_id.as_str(), done.success), ("r5", true), "{done:?}");
    assert_eq!(output_lines(&done), ["hi"]);
    session.heartbeat_where(|h| h.execution_slots_used == 0).await;
    let slow_id = AttemptId::new(TaskRef { job: sleepy.job, idx: TaskIdx(3) }, 2).to_string();
    session.execute("r6", spec(&slow_id, "noop", serde_json::json!({"sleep_ms": 60_000})), 1).await;
    session.started("r6", &slow_id).await;
    let timed_out = session.completed().await;
    assert_eq!((timed_out.success, timed_out.error_message.as_str()), (false, "execution timed out after 1 s"));
    session.heartbeat_where(|h| h.execution_slots_used == 0).await;

    // What this worker does not do.
    session.send("u1", None).await;
    let ack = session.ack().await;
    assert_eq!((ack.request_id.as_str(), ack.accepted, ack.message.as_str()), ("u1", false, "unsupported request"));
    let detection = RunDetectionRequest { job_type: "noop".into(), ..RunDetectionRequest::default() };
    session.send("d1", Some(AdminBody::RunDetectionRequest(detection))).await;
    let Body::DetectionComplete(detection) = session.recv().await else { panic!("expected a detection end") };
    assert_eq!((detection.request_id.as_str(), detection.success), ("d1", false));

    // A broken stream ends the running execution and its processes; the worker comes back.
    let pid_file = dir.path().join("pid");
    let command = format!("echo $$ > {}; exec sleep 30", pid_file.display());
    let lost_id = AttemptId::new(TaskRef { job: sleepy.job, idx: TaskIdx(4) }, 1).to_string();
    session.execute("r7", spec(&lost_id, "shell", serde_json::json!({"command": command})), 0).await;
    session.started("r7", &lost_id).await;
    let pid = wait_for_file(&pid_file).await.trim().to_string();
    drop(session);
    assert!(process_ends(&pid).await, "the command {pid} outlived the stream");
    let mut session = next_session(&mut sessions).await;
    assert_eq!(session.hello().await.worker_instance_id, first_hello.worker_instance_id);
    session.send("", accepted_hello()).await;
    session.heartbeat().await;

    // After the admin's shutdown, no more work.
    let shutdown = AdminShutdown { reason: "restart".into(), grace_period_seconds: 0 };
    session.send("s1", Some(AdminBody::Shutdown(shutdown))).await;
    let ack = session.ack().await;
    assert_eq!((ack.request_id.as_str(), ack.accepted), ("s1", true));
    session.execute("r8", spec(&other, "noop", serde_json::json!({})), 0).await;
    assert_eq!(session.completed().await.error_message, wire::AT_CAPACITY);

    stop.send(()).unwrap();
    let result = tokio::time::timeout(Duration::from_secs(10), worker).await.expect("the worker stops");
    result.unwrap().unwrap();

    let log = std::fs::read_to_string(&log_path).unwrap();
    let job = sleepy.job;
    let expected = format!(
        "{job} sleepy 1 start\n{job} sleepy 1 canceled\n{job} 2 1 start\n{job} 2 1 succeeded\n\
         {job} 3 2 start\n{job} 3 2 failed\n{job} 4 1 start\n"
    );
    assert_eq!(log, expected);
}

#[tokio::test]
async fn with_a_renewing_admin_executions_outlive_the_stream_until_the_lease_runs_out() {
    let dir = tempfile::tempdir().unwrap();
    let (admin, mut sessions) = start_fake_admin().await;
    let log_path = dir.path().join("exec.log");
    let options = RemoteWorkerOptions {
        lease: Duration::from_secs(2),
        exec_log: Some(ExecLog::open(&log_path).unwrap()),
        ..options_for(admin, 2)
    };
    let (stop, worker) = start_worker(options);

    let mut session = next_session(&mut sessions).await;
    let hello = session.hello().await;
    assert_eq!(hello.metadata.get(wire::LEASE_METADATA).map(String::as_str), Some("2000"));
    session.send("", accepted_hello()).await;
    let renewing = session.renew().await;
    let job = JobId::new();
    let short = AttemptId::new(TaskRef { job, idx: TaskIdx(0) }, 1).to_string();
    session.execute("r1", spec(&short, "noop", serde_json::json!({"sleep_ms": 700})), 0).await;
    session.started("r1", &short).await;
    // The stream breaks: the execution goes on, and ends while the worker is away.
    renewing.abort();
    drop(session);
    let mut session = next_session(&mut sessions).await;
    session.hello().await;
    session.send("", accepted_hello()).await;
    let renewing = session.renew().await;
    // What ended while away comes first, then the heartbeat of what still runs.
    let reported = session.completed().await;
    assert_eq!((reported.job_id.as_str(), reported.success), (short.as_str(), true), "{reported:?}");
    let heartbeat = session.heartbeat().await;
    assert!(heartbeat.running_work.is_empty(), "{heartbeat:?}");
    // Unacknowledged, it is reported again; acknowledged, never again.
    let again = session.completed().await;
    assert_eq!(again.job_id, short);
    let ack = AdminToWorkerMessage { request_id: wire::outcome_ack(&short, None), sent_at: None, body: None };
    session.to_worker.send(Ok(ack)).await.unwrap();

    // A long command; then no admin answers at all: after the lease it is given up.
    let pid_file = dir.path().join("pid");
    let command = format!("echo $$ > {}; exec sleep 60", pid_file.display());
    let long = AttemptId::new(TaskRef { job, idx: TaskIdx(1) }, 1).to_string();
    session.execute("r2", spec(&long, "shell", serde_json::json!({"command": command})), 0).await;
    session.started("r2", &long).await;
    let pid = wait_for_file(&pid_file).await.trim().to_string();
    renewing.abort();
    let given_up_by = Instant::now() + Duration::from_secs(5);
    let mut silent = Vec::new();
    while Instant::now() < given_up_by && !process_ends(&pid).await {
        // Connections come, and get no hello: no admin is reached.
        if let Ok(Some(session)) = tokio::time::timeout(Duration::from_millis(100), sessions.recv()).await {
            silent.push(session);
        }
    }
    assert!(process_ends(&pid).await, "the command {pid} outlived the lease");
    drop(silent);
    let mut session = next_session(&mut sessions).await;
    session.hello().await;
    session.send("", accepted_hello()).await;
    let _renewing = session.renew().await;
    let reported = session.completed().await;
    assert_eq!((reported.job_id.as_str(), reported.error_message.as_str()), (long.as_str(), wire::LEASE_EXPIRED));

    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), worker).await.expect("the worker stops").unwrap().unwrap();
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert_eq!(log, format!("{job} 0 1 start\n{job} 0 1 succeeded\n{job} 1 1 start\n{job} 1 1 abandoned\n"));
}

/// A worker of one slot and a lease of `lease`, its hello accepted and each
/// heartbeat renewed until `Renewing` ends; the session's receiver is kept
/// with it.
async fn leased_worker(lease: Duration) -> (Stopper, FakeSession, Renewing, Sessions) {
    let (admin, mut sessions) = start_fake_admin().await;
    let stopper = start_worker(RemoteWorkerOptions { lease, ..options_for(admin, 1) });
    let mut session = next_session(&mut sessions).await;
    session.hello().await;
    session.send("", accepted_hello()).await;
    let renewing = session.renew().await;
    (stopper, session, renewing, sessions)
}

/// Starts a shell command that sleeps a minute as attempt 1 of a task of a
/// new job: its attempt id, and its process id once it runs.
async fn start_sleeper(session: &mut FakeSession, dir: &std::path::Path) -> (String, String) {
    let pid_file = dir.join("pid");
    let command = format!("echo $$ > {}; exec sleep 60", pid_file.display());
    let long = AttemptId::new(TaskRef { job: JobId::new(), idx: TaskIdx(0) }, 1).to_string();
    session.execute("r1", spec(&long, "shell", serde_json::json!({"command": command})), 0).await;
    session.started("r1", &long).await;
    let pid = wait_for_file(&pid_file).await.trim().to_string();
    (long, pid)
}

type Stopper = (tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<Result<(), InvalidOptions>>);
type Sessions = tokio::sync::mpsc::UnboundedReceiver<FakeSession>;

#[tokio::test]
async fn a_renewal_held_up_on_the_way_renews_only_as_of_the_heartbeat_it_answers() {
    let dir = tempfile::tempdir().unwrap();
    let lease = Duration::from_secs(4);
    let ((stop, worker), mut session, renewing, _sessions) = leased_worker(lease).await;
    let (_, pid) = start_sleeper(&mut session, dir.path()).await;
    // From here the admin answers nothing on time: the heartbeat read
    // now is renewed 0.9 s later (within the half lease after which the
    // worker gives the session up), as a network that held the renewal
    // up would deliver it.
    renewing.abort();
    let heartbeat = session.heartbeat_where(|h| !h.running_work.is_empty()).await;
    let sent = Instant::now();
    let number: u64 = heartbeat.metadata[wire::HEARTBEAT_METADATA].parse().unwrap();
    tokio::time::sleep(Duration::from_millis(900)).await;
    session.send(&wire::lease_renewal(number), None).await;
    // The lease runs from the heartbeat's departure: the command stops
    // about 4 s after it, not 4 s after the late renewal.
    assert!(process_ends(&pid).await, "the command {pid} outlived the lease");
    let stopped_after = sent.elapsed();
    assert!(
        stopped_after < lease + Duration::from_millis(500),
        "stopped {stopped_after:?} after the renewed heartbeat: the late renewal stretched the lease"
    );
    stop_worker(stop, worker).await;
}

#[tokio::test]
async fn a_heartbeat_says_how_much_of_the_lease_is_left_while_it_binds() {
    let dir = tempfile::tempdir().unwrap();
    let lease = Duration::from_secs(4);
    let ((stop, worker), mut session, renewing, _sessions) = leased_worker(lease).await;
    let idle = session.heartbeat().await;
    assert_eq!(wire::lease_left_of(&idle.metadata), None, "nothing runs: the lease binds nothing");
    // Renewals stop before anything runs: from here what is left only shrinks.
    renewing.abort();
    start_sleeper(&mut session, dir.path()).await;
    let mut said = Vec::new();
    // (The worker gives the session up half a lease after the last renewal.)
    while said.len() < 2 {
        let heartbeat = session.heartbeat_where(|h| !h.running_work.is_empty()).await;
        said.push(
            wire::lease_left_of(&heartbeat.metadata).expect("a heartbeat under a binding lease says what is left"),
        );
    }
    assert!(said[0] <= lease, "{said:?} left of a lease of {lease:?}");
    assert!(said[1] < said[0], "what is left did not shrink without a renewal: {said:?}");
    stop_worker(stop, worker).await;
}
