//! The scheduler loop with real processes: a detector (a worker stream
//! driven by the test, speaking the real protocol) proposes work; each
//! detection run becomes one DAG job with volume chains, run by a jobcenter
//! worker; dedupe, manual triggers, interval changes, the activity log and
//! the run history.

use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;

use jobcenter::proto::plugin::{
    plugin_control_service_client::PluginControlServiceClient, worker_to_admin_message::Body, ConfigValue, JobPriority,
    JobProposal, JobTypeCapability, WorkerHello, WorkerToAdminMessage,
};
use support::{start_worker, wait_until, Server};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

fn int(v: i64) -> ConfigValue {
    ConfigValue { kind: Some(jobcenter::proto::plugin::config_value::Kind::Int64Value(v)) }
}

/// Proposals for `noop`: two on volume 7 (the critical one first), one on volume 8.
fn proposals(sleep_ms: i64) -> Vec<JobProposal> {
    let proposal = |id: &str, volume: i64, priority: JobPriority| JobProposal {
        proposal_id: id.into(),
        dedupe_key: format!("noop:{id}"),
        job_type: "noop".into(),
        priority: priority as i32,
        summary: format!("{id} on volume {volume}"),
        parameters: BTreeMap::from([("sleep_ms".to_string(), int(sleep_ms))]),
        labels: BTreeMap::from([("volume_id".to_string(), volume.to_string())]),
        ..JobProposal::default()
    };
    vec![
        proposal("low-7", 7, JobPriority::Low),
        proposal("critical-7", 7, JobPriority::Critical),
        proposal("normal-8", 8, JobPriority::Normal),
    ]
}

/// A detector for `noop`: answers every detection request with `proposals`.
async fn detector(server: &Server, sleep_ms: i64) -> tokio::task::JoinHandle<u32> {
    support::proposing_detector(server, "detector", proposals(sleep_ms)).await
}

fn scheduler_jobs(server: &Server) -> Vec<serde_json::Value> {
    let jobs = server.cli_json(&["jobs", "--json"]);
    jobs.as_array().unwrap().iter().filter(|j| j["name"].as_str().unwrap_or("").starts_with("noop-")).cloned().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detection_runs_become_jobs_on_their_interval() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &[]);
    let _worker = start_worker(&server, "runner", &["--max-execute", "4", "--job-types", "noop"], None);
    // Detection off at first: only a manual trigger runs it.
    assert!(server.cli(&["policy", "set", "noop", "detection_enabled=0"]).status.success());
    let _detector = detector(&server, 1500).await;
    server.wait_for_workers(2);

    // `detect` shows the proposals and creates nothing.
    let shown = server.cli_json(&["detect", "noop", "--json"]);
    assert_eq!(shown["proposals"].as_array().unwrap().len(), 3, "{shown}");
    assert_eq!(shown["job_id"], "");

    // `detect --run --wait`: one job, volume 7's proposals chained critical first.
    let output = server.cli(&["detect", "noop", "--run", "--wait", "--json"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let jobs = scheduler_jobs(&server);
    assert!(!jobs.is_empty(), "the run made a job");
    let id = jobs[0]["id"].as_str().unwrap().to_string();
    let job = server.cli_json(&["job", &id, "--json"]);
    assert_eq!(job["state"], "succeeded");
    assert!(job["origin"].as_str().unwrap().starts_with("scheduler:noop:"), "{}", job["origin"]);
    let task = |name: &str| job["tasks"].as_array().unwrap().iter().find(|t| t["id"] == name).unwrap().clone();
    assert_eq!(task("low-7")["depends_on"], serde_json::json!(["critical-7"]), "same volume: critical first");
    assert_eq!(task("normal-8")["depends_on"], serde_json::json!([]));
    assert_eq!(task("critical-7")["labels"]["dedupe_key"], "noop:critical-7");
    let low_started = task("low-7")["started_at_ms"].as_i64().unwrap();
    let critical_finished = task("critical-7")["finished_at_ms"].as_i64().unwrap();
    assert!(low_started >= critical_finished, "never two tasks on one volume at once");

    // On with a long interval: the type, never run by the loop, runs once now.
    let before = scheduler_jobs(&server).len();
    let on = server.cli(&["policy", "set", "noop", "detection_enabled=1", "detection_interval_seconds=3600"]);
    assert!(on.status.success());
    let first = wait_until(Duration::from_secs(20), || (scheduler_jobs(&server).len() == before + 1).then_some(()));
    assert!(first.is_some(), "the loop ran the type at once");
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(scheduler_jobs(&server).len(), before + 1, "then not again for an hour");

    // An interval change takes effect at once, and runs repeat on it; while a
    // run's tasks are active, the next run's same proposals are dropped.
    let before = scheduler_jobs(&server).len();
    assert!(server.cli(&["policy", "set", "noop", "detection_interval_seconds=1"]).status.success());
    let more = wait_until(Duration::from_secs(20), || {
        let jobs = scheduler_jobs(&server);
        (jobs.len() > before).then_some(jobs)
    });
    assert!(more.is_some(), "the new interval took effect without waiting an hour");
    let deduped = wait_until(Duration::from_secs(20), || {
        let log = server.cli_json(&["activities", "--job-type", "noop", "--limit", "500", "--json"]);
        log.as_array()
            .unwrap()
            .iter()
            .any(|a| a["message"].as_str().unwrap_or("").contains("is already being done"))
            .then_some(())
    });
    assert!(deduped.is_some(), "proposals of active tasks were dropped");

    // The run history keeps successful runs with their jobs.
    let runs = server.cli_json(&["runs", "noop", "--json"]);
    let succeeded = runs["succeeded"].as_array().unwrap();
    assert!(succeeded.len() >= 2, "{runs}");
    assert_eq!(succeeded[0]["proposals"], 3);
    assert!(succeeded.len() <= 10, "at most 10 runs are kept");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_detection_that_does_not_answer_times_out_and_is_recorded_as_failed() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &[]);
    assert!(server
        .cli(&["policy", "set", "noop", "detection_enabled=0", "detection_timeout_seconds=1"])
        .status
        .success());
    // A detector that takes detection requests and never answers them.
    let mut client = PluginControlServiceClient::connect(format!("http://{}", server.grpc)).await.unwrap();
    let (tx, rx) = mpsc::channel(8);
    let hello = WorkerHello {
        worker_id: "mute".into(),
        worker_instance_id: uuid::Uuid::new_v4().to_string(),
        capabilities: vec![JobTypeCapability {
            job_type: "noop".into(),
            can_detect: true,
            ..JobTypeCapability::default()
        }],
        ..WorkerHello::default()
    };
    tx.send(WorkerToAdminMessage { body: Some(Body::Hello(hello)), ..Default::default() }).await.unwrap();
    let mut inbound = client.worker_stream(ReceiverStream::new(rx)).await.unwrap().into_inner();
    tokio::spawn(async move { while let Ok(Some(_)) = inbound.message().await {} });
    server.wait_for_workers(1);

    let started = std::time::Instant::now();
    let output = server.cli(&["detect", "noop", "--run"]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    assert!(stderr.contains("no detection result within 1s"), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(10), "the timeout bounded the wait");
    let runs = server.cli_json(&["runs", "noop", "--json"]);
    let failed = runs["failed"].as_array().unwrap();
    assert_eq!(failed.len(), 1, "{runs}");
    assert!(failed[0]["error"].as_str().unwrap().contains("no detection result"), "{runs}");
    assert!(scheduler_jobs(&server).is_empty(), "a failed detection makes no job");
    drop(tx);
}
