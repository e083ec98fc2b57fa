//! Recovery with real processes: a stalled worker's task is resubmitted once
//! and its late completion refused; a task that kills its worker every time
//! ends failed; a killed worker's task runs again within the bound; and
//! `jobcenter recover` reports and applies findings.

use crate::support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use support::{exec_events, start_worker, wait_until, Process, Server};

fn signal(process: &Process, signal: Signal) {
    kill(Pid::from_raw(process.child.id() as i32), signal).expect("signal the worker");
}

fn job(server: &Server, id: &str) -> serde_json::Value {
    server.cli_json(&["job", id, "--json"])
}

fn wait_for_end(server: &Server, id: &str, limit: Duration) -> serde_json::Value {
    wait_until(limit, || {
        let job = job(server, id);
        matches!(job["state"].as_str(), Some("succeeded" | "failed" | "canceled")).then_some(job)
    })
    .unwrap_or_else(|| panic!("job {id} did not end: {}", job(server, id)))
}

#[test]
fn a_stalled_worker_s_task_is_resubmitted_once_and_its_late_completion_refused() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(
        &dir.path().join("data"),
        &["--silence-timeout", "3s", "--heartbeat", "1s", "--recovery-interval", "500ms", "--orphan-grace", "3s"],
    );
    let log = dir.path().join("exec.log");
    let stalled = start_worker(&server, "stalled", &["--max-execute", "1", "--lease", "1s"], Some(&log));
    server.wait_for_workers(1);
    let id = server.submit_file(
        dir.path(),
        "one",
        r#"{"name":"one","tasks":[{"id":"work","job_type":"noop","parameters":{"sleep_ms":4000}}]}"#,
    );
    wait_until(Duration::from_secs(20), || (job(&server, &id)["tasks"][0]["state"] == "running").then_some(()))
        .expect("the task runs on the first worker");
    // The worker stops answering: stream stalled, process alive.
    signal(&stalled, Signal::SIGSTOP);
    let healthy = start_worker(&server, "healthy", &["--max-execute", "1", "--lease", "1s"], Some(&log));
    let resubmitted = wait_until(Duration::from_secs(20), || {
        let job = job(&server, &id);
        (job["tasks"][0]["attempt"] == 2).then_some(job)
    });
    assert!(resubmitted.is_some(), "the silent worker's task was resubmitted");
    // The stalled worker wakes: its stream is gone, it drops the attempt or its report is refused.
    signal(&stalled, Signal::SIGCONT);
    let done = wait_for_end(&server, &id, Duration::from_secs(30));
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(done["tasks"][0]["attempt"], 2, "resubmitted exactly once");
    assert_eq!(done["tasks"][0]["lost"], 1);
    let healthy_handler = server.workers().iter().find(|w| w["worker_id"] == "healthy").map(|w| w["handler"].clone());
    assert_eq!(Some(done["tasks"][0]["handler"].clone()), healthy_handler, "the second attempt's success counts");
    drop(healthy);
    let events = exec_events(&log, &id);
    let successes_of_attempt_2 = events.iter().filter(|e| e.1 == 2 && e.2 == "succeeded").count();
    assert_eq!(successes_of_attempt_2, 1);
    // Whatever attempt 1 did when it woke, the job recorded only attempt 2.
    let server_log = std::fs::read_to_string(&server.log).unwrap_or_default();
    let attempt_1_succeeded = events.iter().any(|e| e.1 == 1 && e.2 == "succeeded");
    if attempt_1_succeeded {
        assert!(server_log.contains("completion rejected"), "a late completion of attempt 1 must be refused");
    }
}

#[test]
fn a_task_that_kills_its_worker_every_time_ends_failed() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &["--lost-attempt-limit", "2"]);
    // A short lease: a killed worker's attempt is taken back 1.5 s after its stream ends.
    let lease = ["--lease", "1s"];
    let mut workers: Vec<Process> = (0..2).map(|n| start_worker(&server, &format!("w{n}"), &lease, None)).collect();
    server.wait_for_workers(2);
    let id = server.submit_file(
        dir.path(),
        "killer",
        r#"{"name":"killer","tasks":[
            {"id":"killer","job_type":"shell","parameters":{"command":"kill -9 $PPID"}},
            {"id":"after","job_type":"noop","depends_on":["killer"]},
            {"id":"fine","job_type":"noop"}]}"#,
    );
    // Keep two workers alive, as a supervisor would.
    let started = Instant::now();
    let mut restarts = 0;
    let done = loop {
        assert!(started.elapsed() < Duration::from_secs(90), "the job never ended");
        let job = job(&server, &id);
        if matches!(job["state"].as_str(), Some("failed" | "succeeded")) {
            break job;
        }
        for (n, worker) in workers.iter_mut().enumerate() {
            if !worker.is_running() {
                *worker = start_worker(&server, &format!("w{n}-{restarts}"), &lease, None);
                restarts += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let states: BTreeMap<String, String> = done["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["id"].as_str().unwrap().to_string(), t["state"].as_str().unwrap().to_string()))
        .collect();
    assert_eq!(done["state"], "failed");
    assert_eq!(states["killer"], "failed");
    assert_eq!(states["after"], "upstream_failed");
    assert_eq!(states["fine"], "succeeded");
    let killer = &done["tasks"][0];
    assert_eq!(killer["lost"], 3, "the limit of 2 lost attempts, then the third loss fails it");
    assert!(killer["error"].as_str().unwrap().contains("lost 3 times"), "{killer}");
    assert!(restarts >= 2, "workers were killed by the task: {restarts} restarts");
}

#[test]
fn a_killed_worker_s_task_runs_again_within_the_bound() {
    let dir = tempfile::tempdir().unwrap();
    let heartbeat = Duration::from_secs(1);
    let interval = Duration::from_secs(1);
    let server = Server::start(
        &dir.path().join("data"),
        &["--silence-timeout", "3s", "--recovery-interval", "1s", "--heartbeat", "1s"],
    );
    let log = dir.path().join("exec.log");
    // The victim alone takes the first task; the other worker, started
    // after, takes the second and keeps a free slot.
    // With a lease of 1.5 s, the admin waits 2 s for a worker whose stream ended.
    let mut victim = start_worker(&server, "victim", &["--max-execute", "1", "--lease", "1500ms"], Some(&log));
    server.wait_for_workers(1);
    let id = server.submit_file(dir.path(),
        "two",
        r#"{"name":"two","tasks":[{"id":"a","job_type":"noop","parameters":{"sleep_ms":3000}},{"id":"b","job_type":"noop","parameters":{"sleep_ms":3000}}]}"#,
    );
    wait_until(Duration::from_secs(20), || {
        (exec_events(&log, &id).iter().filter(|e| e.2 == "start").count() == 1).then_some(())
    })
    .expect("the victim runs a task");
    let _other = start_worker(&server, "other", &["--max-execute", "2", "--lease", "1500ms"], Some(&log));
    server.wait_for_workers(2);
    wait_until(Duration::from_secs(20), || {
        (exec_events(&log, &id).iter().filter(|e| e.2 == "start").count() == 2).then_some(())
    })
    .expect("both tasks run");
    let killed_at = Instant::now();
    victim.kill();
    let rerun = wait_until(Duration::from_secs(30), || {
        exec_events(&log, &id).iter().any(|e| e.1 == 2 && e.2 == "start").then(|| killed_at.elapsed())
    })
    .expect("the victim's task runs again");
    eprintln!("a killed worker's task ran again after {rerun:?}");
    assert!(rerun < heartbeat + interval + Duration::from_secs(1), "{rerun:?}");
    let done = wait_for_end(&server, &id, Duration::from_secs(30));
    assert_eq!(done["state"], "succeeded");
}

/// A worker without a lease (as a SeaweedFS worker is) that takes one
/// `noop` attempt, reports it started, then says nothing more while its
/// stream stays open: a silent worker, as only recovery rule R3 finds.
/// (A worker with a lease that falls silent loses its session once its
/// lease has passed, before the silence timeout.)
pub(crate) async fn silent_worker(
    server: &Server,
) -> tokio::sync::mpsc::Sender<jobcenter::proto::plugin::WorkerToAdminMessage> {
    use jobcenter::proto::plugin::{
        admin_to_worker_message, plugin_control_service_client::PluginControlServiceClient,
        worker_to_admin_message::Body, JobProgressUpdate, JobState, JobTypeCapability, WorkerHello,
        WorkerToAdminMessage,
    };
    let mut client = PluginControlServiceClient::connect(format!("http://{}", server.grpc)).await.unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    let hello = WorkerHello {
        worker_id: "silent".into(),
        worker_instance_id: uuid::Uuid::new_v4().to_string(),
        capabilities: vec![JobTypeCapability {
            job_type: "noop".into(),
            can_execute: true,
            max_execution_concurrency: 1,
            ..JobTypeCapability::default()
        }],
        ..WorkerHello::default()
    };
    tx.send(WorkerToAdminMessage { body: Some(Body::Hello(hello)), ..Default::default() }).await.unwrap();
    let mut inbound = client.worker_stream(tokio_stream::wrappers::ReceiverStream::new(rx)).await.unwrap().into_inner();
    let sender = tx.clone();
    tokio::spawn(async move {
        while let Ok(Some(message)) = inbound.message().await {
            if let Some(admin_to_worker_message::Body::ExecuteJobRequest(request)) = message.body {
                let job = request.job.unwrap_or_default();
                let started = JobProgressUpdate {
                    request_id: request.request_id,
                    job_id: job.job_id,
                    job_type: job.job_type,
                    state: JobState::Running as i32,
                    stage: "started".into(),
                    ..JobProgressUpdate::default()
                };
                let _ = sender
                    .send(WorkerToAdminMessage { body: Some(Body::JobProgressUpdate(started)), ..Default::default() })
                    .await;
            }
        }
    });
    tx
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recover_reports_findings_and_applies_them() {
    let dir = tempfile::tempdir().unwrap();
    // A long recovery interval: only the command below acts.
    let server = Server::start(
        &dir.path().join("data"),
        &["--silence-timeout", "3s", "--heartbeat", "1s", "--recovery-interval", "1h", "--orphan-grace", "1h"],
    );
    let _silent = silent_worker(&server).await;
    server.wait_for_workers(1);
    let id = server.submit_file(
        dir.path(),
        "one",
        r#"{"name":"one","tasks":[{"id":"work","job_type":"noop","parameters":{"sleep_ms":60000}}]}"#,
    );
    wait_until(Duration::from_secs(20), || (job(&server, &id)["tasks"][0]["state"] == "running").then_some(()))
        .expect("the task runs");
    tokio::time::sleep(Duration::from_millis(4500)).await;
    let findings = server.cli_json(&["recover", "--dry-run", "--json"]);
    let findings = findings.as_array().unwrap();
    assert_eq!(findings.len(), 1, "{findings:?}");
    assert_eq!(findings[0]["rule"], "R3");
    assert_eq!(findings[0]["job_id"], id.as_str());
    assert_eq!(findings[0]["applied"], false);
    assert_eq!(job(&server, &id)["tasks"][0]["attempt"], 1, "a dry run changes nothing");
    let applied = server.cli_json(&["recover", "--json"]);
    assert_eq!(applied[0]["applied"], true);
    let after = job(&server, &id);
    assert_eq!(after["tasks"][0]["attempt"], 1, "no worker left to take it yet");
    assert_eq!(after["tasks"][0]["state"], "ready");
    let log = server.cli_json(&["activities", "--job-type", "recovery_check", "--json"]);
    assert!(
        log.as_array().unwrap().iter().any(|a| a["message"].as_str().unwrap_or("").starts_with("R3 handler-silent")),
        "{log}"
    );
    let again = server.cli_json(&["recover", "--json"]);
    assert!(again.as_array().unwrap().is_empty(), "a finding applied once is not found again: {again}");
}
