//! A hostile client on the worker stream of the real `jobcenter server`:
//! raw gRPC messages that are malformed, oversized, out of order, replayed,
//! or about attempts the sender does not hold. Each is refused with a
//! status whose code and message name the rule it breaks (the stream then
//! closes), or refused in its acknowledgement, or ignored; none changes
//! what its sender may not change (read back through the CLI), and the
//! server goes on serving: a real `jobcenter worker` runs a job to its end
//! alongside.

use crate::support;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use jobcenter::proto::plugin::{
    admin_to_worker_message, config_value, plugin_control_service_client::PluginControlServiceClient,
    worker_to_admin_message::Body, AdminRuntimeDefaults, AdminToWorkerMessage, ConfigSchemaResponse, ConfigValue,
    ExecuteJobRequest, JobCompleted, JobProgressUpdate, JobResult, JobTypeCapability, JobTypeDescriptor, RunningWork,
    StringList, WorkerHeartbeat, WorkerHello, WorkerToAdminMessage,
};
use jobcenter::wire;
use serde_json::Value;
use support::{each_succeeded_once, exec_events, nine_tasks, start_worker, wait_until, Server};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Status};

/// Every wait of these tests ends within this.
const LIMIT: Duration = Duration::from_secs(20);
/// The lease the raw workers declare, so that the admin acknowledges
/// their reports (applied, or refused with the reason).
const LEASE_MS: &str = "10000";

fn hello(job_types: &[&str], lease: bool) -> WorkerHello {
    WorkerHello {
        worker_id: "hostile".into(),
        worker_instance_id: uuid::Uuid::new_v4().to_string(),
        capabilities: job_types
            .iter()
            .map(|t| JobTypeCapability {
                job_type: (*t).into(),
                can_execute: true,
                max_execution_concurrency: 4,
                ..JobTypeCapability::default()
            })
            .collect(),
        metadata: if lease {
            BTreeMap::from([(wire::LEASE_METADATA.into(), LEASE_MS.into())])
        } else {
            BTreeMap::new()
        },
        ..WorkerHello::default()
    }
}

fn message(body: Body) -> WorkerToAdminMessage {
    WorkerToAdminMessage { body: Some(body), ..WorkerToAdminMessage::default() }
}

fn completed(job_id: &str, success: bool, error: &str, output: &[&str]) -> Body {
    let output = ConfigValue {
        kind: Some(config_value::Kind::StringList(StringList {
            values: output.iter().map(|l| l.to_string()).collect(),
        })),
    };
    Body::JobCompleted(JobCompleted {
        job_id: job_id.into(),
        success,
        error_message: error.into(),
        result: Some(JobResult { output_values: BTreeMap::from([("output".into(), output)]), summary: String::new() }),
        ..JobCompleted::default()
    })
}

fn progress(job_id: &str, percent: f64, stage: &str) -> Body {
    Body::JobProgressUpdate(JobProgressUpdate {
        job_id: job_id.into(),
        progress_percent: percent,
        stage: stage.into(),
        ..JobProgressUpdate::default()
    })
}

fn heartbeat(running: Vec<String>) -> Body {
    Body::Heartbeat(WorkerHeartbeat {
        worker_id: "hostile".into(),
        running_work: running
            .into_iter()
            .map(|work_id| RunningWork { work_id, job_type: "noop".into(), ..RunningWork::default() })
            .collect(),
        execution_slots_total: 4,
        ..WorkerHeartbeat::default()
    })
}

/// One raw worker stream: what it sends, and what the admin answers.
struct Raw {
    tx: mpsc::Sender<WorkerToAdminMessage>,
    inbound: tonic::Streaming<AdminToWorkerMessage>,
    /// Answers received while waiting for another, in order.
    backlog: std::collections::VecDeque<AdminToWorkerMessage>,
}

impl Raw {
    /// Opens a stream whose first messages are `first`; the admin's refusal
    /// of the stream itself is the error.
    async fn open(server: &Server, first: Vec<WorkerToAdminMessage>) -> Result<Raw, Status> {
        let mut client = PluginControlServiceClient::connect(format!("http://{}", server.grpc))
            .await
            .expect("the admin's gRPC port")
            .max_encoding_message_size(256 * 1024 * 1024);
        let (tx, rx) = mpsc::channel(64);
        for message in first {
            tx.send(message).await.expect("the stream is open");
        }
        let opened = tokio::time::timeout(LIMIT, client.worker_stream(ReceiverStream::new(rx))).await;
        let inbound = opened.expect("the admin answers the stream")?.into_inner();
        Ok(Raw { tx, inbound, backlog: Default::default() })
    }

    /// A worker that said hello and was accepted.
    async fn hello(server: &Server, hello: WorkerHello) -> Raw {
        let mut raw = Raw::open(server, vec![message(Body::Hello(hello))]).await.expect("the hello is taken");
        match raw.next().await {
            Ok(Some(AdminToWorkerMessage { body: Some(admin_to_worker_message::Body::Hello(h)), .. })) => {
                assert!(h.accepted, "the hello was refused: {}", h.message);
            }
            other => panic!("no admin hello: {other:?}"),
        }
        raw
    }

    async fn send(&self, body: Body) {
        self.tx.send(message(body)).await.expect("the stream is open");
    }

    async fn next(&mut self) -> Result<Option<AdminToWorkerMessage>, Status> {
        tokio::time::timeout(LIMIT, self.inbound.message()).await.expect("the admin answers within the limit")
    }

    /// The status the admin ends the stream with (the messages before it skipped).
    async fn ended_with(&mut self) -> Status {
        loop {
            match self.next().await {
                Ok(Some(_)) => {}
                Ok(None) => panic!("the stream ended without a status"),
                Err(status) => return status,
            }
        }
    }

    /// The first answer that `pick` takes; the others are kept for later waits.
    async fn next_where<T>(&mut self, mut pick: impl FnMut(&AdminToWorkerMessage) -> Option<T>) -> T {
        if let Some(at) = self.backlog.iter().position(|answer| pick(answer).is_some()) {
            let answer = self.backlog.remove(at).expect("found");
            return pick(&answer).expect("picked");
        }
        loop {
            match self.next().await {
                Ok(Some(answer)) => match pick(&answer) {
                    Some(found) => return found,
                    None => self.backlog.push_back(answer),
                },
                other => panic!("the stream ended first: {other:?}"),
            }
        }
    }

    async fn execute(&mut self) -> ExecuteJobRequest {
        self.next_where(|m| match &m.body {
            Some(admin_to_worker_message::Body::ExecuteJobRequest(request)) => Some(request.clone()),
            _ => None,
        })
        .await
    }

    /// The acknowledgement of a report on `attempt_id`: `None` applied, else the refusal.
    async fn acknowledgement(&mut self, attempt_id: &str) -> Option<String> {
        let attempt_id = attempt_id.to_string();
        self.next_where(move |m| {
            let (attempt, refusal) = wire::parse_outcome_ack(&m.request_id)?;
            (attempt == attempt_id).then(|| refusal.map(String::from))
        })
        .await
    }
}

fn attempt_id(request: &ExecuteJobRequest) -> String {
    request.job.as_ref().expect("a job").job_id.clone()
}

fn job(server: &Server, id: &str) -> Value {
    server.cli_json(&["job", id, "--json"])
}

fn task<'a>(job: &'a Value, id: &str) -> &'a Value {
    job["tasks"].as_array().unwrap().iter().find(|t| t["id"] == id).unwrap_or_else(|| panic!("no task {id}: {job}"))
}

/// Waits for the job's end and returns it.
fn ended(server: &Server, id: &str) -> Value {
    wait_until(Duration::from_secs(60), || {
        let job = job(server, id);
        matches!(job["state"].as_str(), Some("succeeded" | "failed" | "canceled")).then_some(job)
    })
    .unwrap_or_else(|| panic!("job {id} did not end: {}", job(server, id)))
}

fn refused(status: &Status, code: Code, rule: &str) {
    assert_eq!(status.code(), code, "{status:?}");
    assert!(status.message().contains(rule), "the refusal names no rule {rule:?}: {status:?}");
}

/// A real worker runs the nine-task job alongside; it must end as if nothing else happened.
fn real_worker_alongside(server: &Server, dir: &Path, sleep_ms: u64) -> (support::Process, String) {
    let log = dir.join("exec.log");
    let worker = start_worker(server, "real", &["--job-types", "noop"], Some(&log));
    server.wait_for_workers(1);
    let id = server.submit_file(dir, "nine", &nine_tasks(None, sleep_ms));
    (worker, id)
}

fn real_job_ended_untouched(server: &Server, dir: &Path, id: &str) {
    let job = ended(server, id);
    assert_eq!(job["state"], "succeeded", "{job}");
    for task in job["tasks"].as_array().unwrap() {
        assert_eq!(task["attempt"], 1, "a task of the real worker ran again: {task}");
        assert!(task["error"].as_str().unwrap_or("").is_empty(), "{task}");
    }
    each_succeeded_once(&exec_events(&dir.join("exec.log"), id));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_messages_are_refused_naming_the_rule() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(&dir.path().join("data"), &[]);
    let (_worker, real_job) = real_worker_alongside(&server, dir.path(), 100);

    // Before hello, and hellos that break a rule: the stream is refused.
    let status = Raw::open(&server, vec![message(heartbeat(vec![]))]).await.err().expect("refused");
    refused(&status, Code::FailedPrecondition, "the first message must be hello, not heartbeat");
    let status = Raw::open(&server, vec![WorkerToAdminMessage::default()]).await.err().expect("refused");
    refused(&status, Code::FailedPrecondition, "the first message must be hello, not an empty message");
    let nobody = WorkerHello { worker_id: String::new(), worker_instance_id: String::new(), ..hello(&["noop"], false) };
    let status = Raw::open(&server, vec![message(Body::Hello(nobody))]).await.err().expect("refused");
    refused(&status, Code::InvalidArgument, "worker_id and worker_instance_id are both empty");
    let status =
        Raw::open(&server, vec![message(Body::Hello(hello(&["../etc"], false)))]).await.err().expect("refused");
    refused(&status, Code::InvalidArgument, "capability #0 has job type \"../etc\"");
    let mut soon = hello(&["noop"], false);
    soon.metadata.insert(wire::LEASE_METADATA.into(), "soon".into());
    let status = Raw::open(&server, vec![message(Body::Hello(soon))]).await.err().expect("refused");
    refused(&status, Code::InvalidArgument, "jobcenter.lease_ms is \"soon\"");
    let many: Vec<String> = (0..5000).map(|n| format!("type-{n}")).collect();
    let many = hello(&many.iter().map(String::as_str).collect::<Vec<_>>(), false);
    let status = Raw::open(&server, vec![message(Body::Hello(many))]).await.err().expect("refused");
    refused(&status, Code::InvalidArgument, "5000 capabilities, the most a worker may declare is 256");

    // After hello: each breach ends the stream with its rule.
    let cases: Vec<(Body, Code, &str)> = vec![
        (Body::Hello(hello(&["noop"], false)), Code::FailedPrecondition, "hello was already received"),
        (
            completed("not-an-attempt", true, "", &[]),
            Code::InvalidArgument,
            "job_completed names job \"not-an-attempt\"",
        ),
        (progress("1.2.3.4", 10.0, "x"), Code::InvalidArgument, "job_progress_update names job \"1.2.3.4\""),
        (
            Body::ConfigSchemaResponse(ConfigSchemaResponse {
                request_id: "schema-1".into(),
                job_type: "vacuum".into(),
                success: true,
                error_message: String::new(),
                job_type_descriptor: Some(JobTypeDescriptor {
                    job_type: "vacuum".into(),
                    admin_runtime_defaults: Some(AdminRuntimeDefaults {
                        job_type_max_runtime_seconds: 7,
                        ..AdminRuntimeDefaults::default()
                    }),
                    ..JobTypeDescriptor::default()
                }),
            }),
            Code::FailedPrecondition,
            "config_schema_response \"schema-1\" answers no request this session sent",
        ),
    ];
    // These workers declare a job type nothing is submitted for: a noop task
    // of the real job given to one of them would be taken back when its
    // stream is refused and run a second time.
    for (body, code, rule) in cases {
        let mut raw = Raw::hello(&server, hello(&["idle"], false)).await;
        raw.tx.send(message(body)).await.expect("open");
        refused(&raw.ended_with().await, code, rule);
    }
    let mut raw = Raw::hello(&server, hello(&["idle"], false)).await;
    raw.tx.send(WorkerToAdminMessage::default()).await.expect("open");
    refused(&raw.ended_with().await, Code::InvalidArgument, "a message with no body");
    // The descriptor nobody asked for was not kept.
    let policy = server.cli_json(&["policy", "get", "vacuum", "--json"]);
    assert_ne!(policy["sources"]["job_type_max_runtime_seconds"], "descriptor", "{policy}");

    // Asked for one job type's descriptor, a worker answers with another's.
    let mut raw = Raw::hello(&server, hello(&["odd-type"], false)).await;
    let (request_id, asked) = raw
        .next_where(|m| match &m.body {
            Some(admin_to_worker_message::Body::RequestConfigSchema(r)) => {
                Some((m.request_id.clone(), r.job_type.clone()))
            }
            _ => None,
        })
        .await;
    assert_eq!(asked, "odd-type");
    raw.send(Body::ConfigSchemaResponse(ConfigSchemaResponse {
        request_id: request_id.clone(),
        job_type: "vacuum".into(),
        success: true,
        error_message: String::new(),
        job_type_descriptor: Some(JobTypeDescriptor { job_type: "vacuum".into(), ..JobTypeDescriptor::default() }),
    }))
    .await;
    refused(
        &raw.ended_with().await,
        Code::FailedPrecondition,
        "describes job type \"vacuum\", the request asked about \"odd-type\"",
    );
    let policy = server.cli_json(&["policy", "get", "vacuum", "--json"]);
    assert_ne!(policy["sources"]["job_type_max_runtime_seconds"], "descriptor", "{policy}");

    // A 100 MB output line for an attempt the sender holds: over the
    // message limit, the stream fails and the outcome is not taken.
    let big_job = server.submit_file(dir.path(), "big", r#"{"name":"big","tasks":[{"id":"b","job_type":"big"}]}"#);
    let mut raw = Raw::hello(&server, hello(&["big"], false)).await;
    let held = attempt_id(&raw.execute().await);
    let line = "x".repeat(100 * 1024 * 1024);
    raw.send(completed(&held, true, "", &[&line])).await;
    let status = raw.ended_with().await;
    assert!(matches!(status.code(), Code::OutOfRange | Code::ResourceExhausted), "{status:?}");
    assert!(status.message().contains("too large"), "{status:?}");
    drop(raw);
    let big = wait_until(LIMIT, || {
        let job = job(&server, &big_job);
        (task(&job, "b")["state"] == "ready").then_some(job)
    })
    .unwrap_or_else(|| {
        panic!("the attempt of a worker whose stream failed was not taken back: {}", job(&server, &big_job))
    });
    assert!(task(&big, "b")["output"].as_array().unwrap().is_empty(), "{big}");

    real_job_ended_untouched(&server, dir.path(), &real_job);
    assert!(server.process.is_running(), "the server died");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_on_attempts_the_sender_does_not_hold_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(&dir.path().join("data"), &[]);
    let (_worker, real_job) = real_worker_alongside(&server, dir.path(), 1500);
    let victim_job = server.submit_file(
        dir.path(),
        "victim",
        r#"{"name":"victim","tasks":[{"id":"v1","job_type":"victim"},{"id":"v2","job_type":"victim"}]}"#,
    );
    let parked_job =
        server.submit_file(dir.path(), "parked", r#"{"name":"parked","tasks":[{"id":"p","job_type":"parked"}]}"#);
    // The victim runs its job's tasks, one at a time unless the job type's
    // limit of one came after the first dispatch.
    let mut victim = Raw::hello(&server, hello(&["victim"], true)).await;
    let first = victim.execute().await;
    let held = if first.job.as_ref().unwrap().summary == "v1" { "v1" } else { "v2" };
    let v1 = attempt_id(&first);
    let mut intruder = Raw::hello(&server, hello(&["intruder"], true)).await;
    let before = job(&server, &victim_job);
    let victim_handler = task(&before, held)["handler"].clone();

    // A completion, and a progress, for the victim's attempt.
    intruder.send(completed(&v1, true, "", &["forged"])).await;
    let refusal = intruder.acknowledgement(&v1).await.expect("refused");
    assert!(refusal.starts_with("not the holder: attempt 1 is held by handler"), "{refusal}");
    intruder.send(progress(&v1, 99.0, "forged")).await;

    // Completions for the real worker's attempts under way.
    let under_way = wait_until(LIMIT, || {
        let job = job(&server, &real_job);
        let held: Vec<String> = job["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| t["state"] == "running" || t["state"] == "assigned")
            .map(|t| {
                let idx = job["tasks"].as_array().unwrap().iter().position(|x| x["id"] == t["id"]).unwrap();
                format!("{real_job}.{idx}.{}", t["attempt"])
            })
            .collect();
        (!held.is_empty()).then_some(held)
    })
    .expect("the real worker runs something");
    for attempt in &under_way {
        intruder.send(completed(attempt, false, "forged", &[])).await;
        let refusal = intruder.acknowledgement(attempt).await.expect("refused");
        // The real worker may have finished it meanwhile.
        assert!(refusal.starts_with("not the holder") || refusal.starts_with("already ended"), "{refusal}");
    }

    // Completions before any execute request: the task is ready, on attempt 0.
    let parked = |n: u32| format!("{parked_job}.0.{n}");
    intruder.send(completed(&parked(1), true, "", &[])).await;
    let refusal = intruder.acknowledgement(&parked(1)).await.expect("refused");
    assert_eq!(refusal, "stale attempt: the task is on attempt 0, the report is for attempt 1");
    intruder.send(completed(&parked(0), true, "", &[])).await;
    let refusal = intruder.acknowledgement(&parked(0)).await.expect("refused");
    assert_eq!(refusal, "not dispatched: the task is ready");

    // A heartbeat claiming 10,000 running attempts, the victim's and the
    // real worker's among them: the admin tells it to stop what it does
    // not hold, and takes nothing from their holders.
    let mut claimed: Vec<String> = (0..9990).map(|n| format!("{}.{n}.1", uuid::Uuid::now_v7())).collect();
    claimed.push(v1.clone());
    claimed.extend(under_way.iter().cloned());
    intruder.send(heartbeat(claimed)).await;
    let stop = intruder
        .next_where(|m| match &m.body {
            Some(admin_to_worker_message::Body::CancelRequest(c)) if c.target_id == v1 => Some(c.clone()),
            _ => None,
        })
        .await;
    assert!(stop.reason.contains("taken back"), "{stop:?}");

    // A progress for a job that does not exist is ignored, and the stream
    // goes on: the next heartbeat is answered.
    intruder.backlog.retain(|m| m.request_id != wire::LEASE_RENEWAL);
    intruder.send(progress(&format!("{}.0.1", uuid::Uuid::now_v7()), 5.0, "nowhere")).await;
    intruder.send(heartbeat(vec![])).await;
    intruder.next_where(|m| (m.request_id == wire::LEASE_RENEWAL && m.body.is_none()).then_some(())).await;

    // Nothing of the victim's changed.
    let after = job(&server, &victim_job);
    for id in ["v1", "v2"] {
        let (old, new) = (task(&before, id), task(&after, id));
        for field in ["state", "attempt", "handler", "error", "output", "stage", "progress_percent"] {
            assert_eq!(old[field], new[field], "{id}.{field} changed: {new}");
        }
    }
    assert_eq!(task(&after, held)["handler"], victim_handler);
    let parked_after = job(&server, &parked_job);
    assert_eq!(
        (&task(&parked_after, "p")["state"], &task(&parked_after, "p")["attempt"]),
        (&"ready".into(), &0.into())
    );

    // The victim's own reports are taken; replayed or out of order, they change nothing.
    victim.send(progress(&v1, 40.0, "copying")).await;
    victim.send(completed(&v1, true, "", &["victim-output"])).await;
    assert_eq!(victim.acknowledgement(&v1).await, None, "the holder's completion is applied");
    victim.send(completed(&v1, false, "replayed", &["replayed-output"])).await;
    let refusal = victim.acknowledgement(&v1).await.expect("a replay is refused");
    assert_eq!(refusal, "already ended: the task is succeeded");
    victim.send(progress(&v1, 10.0, "late")).await;
    let v2 = attempt_id(&victim.execute().await);
    victim.send(completed(&v2, true, "", &[])).await;
    assert_eq!(victim.acknowledgement(&v2).await, None);
    let done = ended(&server, &victim_job);
    assert_eq!(done["state"], "succeeded", "{done}");
    let v1_done = task(&done, held);
    assert_eq!(v1_done["output"], serde_json::json!(["victim-output"]), "{v1_done}");
    assert_eq!(v1_done["failures"], 0, "{v1_done}");
    assert_eq!(v1_done["handler"], victim_handler);
    assert_ne!(v1_done["stage"], "late", "{v1_done}");

    real_job_ended_untouched(&server, dir.path(), &real_job);
    assert!(server.process.is_running(), "the server died");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_worker_reports_is_kept_within_bounds() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &[]);
    let id = server.submit_file(
        dir.path(),
        "bounds",
        r#"{"name":"bounds","tasks":[{"id":"t1","job_type":"bounds"},{"id":"t2","job_type":"bounds"}]}"#,
    );
    let mut raw = Raw::hello(&server, hello(&["bounds"], true)).await;
    let first = raw.execute().await;
    let (named, later) = if first.job.as_ref().unwrap().summary == "t1" { ("t1", "t2") } else { ("t2", "t1") };
    let t1 = &attempt_id(&first);

    // A percentage that is not one is kept as the nearest that is. (A
    // progress is not acknowledged: each is waited for until it shows.)
    let shows = |percent: f64| {
        wait_until(LIMIT, || {
            (task(&job(&server, &id), named)["progress_percent"].as_f64() == Some(percent)).then_some(())
        })
    };
    for (reported, kept) in [(f64::NAN, 0.0), (1e12, 100.0), (-3.0, 0.0), (f64::INFINITY, 100.0)] {
        raw.send(progress(t1, 50.0, "stage")).await;
        shows(50.0).expect("a plain progress is kept");
        raw.send(progress(t1, reported, "stage")).await;
        let shown = shows(kept);
        assert!(shown.is_some(), "a progress of {reported} is not kept as {kept}: {}", job(&server, &id));
    }

    // A 10 MB line and a 100 KB error are cut.
    let line = "y".repeat(10 * 1024 * 1024);
    let error = "e".repeat(100 * 1024);
    raw.send(completed(t1, false, &error, &[&line, "short"])).await;
    assert_eq!(raw.acknowledgement(t1).await, None);
    let t2 = attempt_id(&raw.execute().await);
    raw.send(completed(&t2, true, "", &[])).await;
    assert_eq!(raw.acknowledgement(&t2).await, None);
    let done = ended(&server, &id);
    assert_eq!(task(&done, later)["state"], "succeeded", "{done}");
    let t1 = task(&done, named);
    assert_eq!(t1["state"], "failed", "{t1}");
    let output: Vec<&str> = t1["output"].as_array().unwrap().iter().map(|l| l.as_str().unwrap()).collect();
    assert_eq!(output, [format!("{} [...]", &line[..1000]).as_str(), "short"]);
    assert_eq!(t1["error"].as_str().unwrap(), format!("{} [...]", &error[..4096]));
}
