//! jobcenter's duties towards a real SeaweedFS master: it holds the
//! `admin-server` presence lock while it runs, and a detection waits for the
//! cluster's `shell` admin lock (the one `weed shell` takes), so an operator
//! and jobcenter never act on the cluster at once.

use crate::support;
use crate::support::seaweedfs;

use std::process::{Command, Stdio};
use std::time::Duration;

use jobcenter::proto::master::{seaweed_client::SeaweedClient, GetAdminLockStatusRequest, ReleaseAdminTokenRequest};
use support::{wait_until, Process, Server};

fn spawn(args: &[String], dir: &std::path::Path, name: &str) -> Process {
    let child = Command::new("weed")
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("start weed {name} (run `bash .ci/setup`): {e}"));
    Process { child, name: name.into() }
}

/// A SeaweedFS master on free ports, and a client of its gRPC port.
fn start_master(dir: &std::path::Path) -> (Process, SeaweedClient<tonic::transport::Channel>, u16) {
    // The master listens for gRPC on its port + 10,000, as weed does.
    let port = crate::support::seaweedfs::free_port_pair();
    let mdir = dir.join("master");
    std::fs::create_dir_all(&mdir).unwrap();
    let process = spawn(
        &["master".into(), "-ip=127.0.0.1".into(), format!("-port={port}"), format!("-mdir={}", mdir.display())],
        dir,
        "master",
    );
    let grpc = format!("http://127.0.0.1:{}", port + 10_000);
    let client = wait_until(Duration::from_secs(60), || {
        let runtime = tokio::runtime::Handle::current();
        std::thread::scope(|s| s.spawn(|| runtime.block_on(SeaweedClient::connect(grpc.clone())).ok()).join().unwrap())
    })
    .expect("the master starts");
    (process, client, port)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn presence_lock_held_and_detection_waits_for_the_shell_lock() {
    let dir = tempfile::tempdir().unwrap();
    let (_master, mut master, port) = start_master(dir.path());

    let master_arg = format!("127.0.0.1:{port}");
    let server = Server::start(&dir.path().join("data"), &["--master", &master_arg]);
    let held = wait_until(Duration::from_secs(30), || {
        let runtime = tokio::runtime::Handle::current();
        let mut m = master.clone();
        let status = std::thread::scope(|s| {
            s.spawn(|| {
                runtime
                    .block_on(m.get_admin_lock_status(GetAdminLockStatusRequest { lock_name: "admin-server".into() }))
            })
            .join()
            .unwrap()
        });
        status.ok().map(|r| r.into_inner()).filter(|s| s.is_locked)
    })
    .expect("jobcenter holds the presence lock");
    assert_eq!(held.client_name, "jobcenter");

    assert!(server
        .cli(&["policy", "set", "vacuum", "detection_enabled=0", "detection_timeout_seconds=3"])
        .status
        .success());
    // A vacuum detector: a real SeaweedFS worker.
    let working = dir.path().join("worker");
    std::fs::create_dir_all(&working).unwrap();
    let _worker = spawn(
        &[
            "worker".into(),
            format!("-admin={}", server.http),
            "-jobType=vacuum".into(),
            format!("-workingDir={}", working.display()),
        ],
        &working,
        "worker",
    );
    server.wait_for_workers(1);
    assert!(server
        .cli(&["policy", "set", "vacuum", "detection_enabled=0", "detection_timeout_seconds=3"])
        .status
        .success());

    // An operator holds the shell lock: the detection waits for it, then gives up.
    let lease = master
        .lease_admin_token(seaweedfs::operator_lease_request(None))
        .await
        .expect("the operator takes the lock")
        .into_inner();
    let refused = server.cli(&["detect", "vacuum"]);
    assert!(!refused.status.success());
    let message = String::from_utf8_lossy(&refused.stderr).to_string();
    assert!(message.contains("\"shell\" lock was not free"), "{message}");

    // Released: the detection runs, and the lock is free again after it.
    master
        .release_admin_token(ReleaseAdminTokenRequest {
            previous_token: lease.token,
            previous_lock_time: lease.lock_ts_ns,
            lock_name: "shell".into(),
        })
        .await
        .unwrap();
    // (A master with no volume servers may answer the detector that it has no
    // topology yet: the detection then fails for that reason, not for the lock.)
    let detected = server.cli(&["detect", "vacuum", "--json"]);
    let stderr = String::from_utf8_lossy(&detected.stderr).to_string();
    assert!(!stderr.contains("lock was not free"), "{stderr}");
    // The lock is let go within a couple of seconds of the detection.
    let mut freed = false;
    for _ in 0..40 {
        let status =
            master.get_admin_lock_status(GetAdminLockStatusRequest { lock_name: "shell".into() }).await.unwrap();
        if !status.into_inner().is_locked {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(freed, "jobcenter released the shell lock after its detection");
    let log = server.cli_json(&["activities", "--job-type", "vacuum", "--json"]);
    assert!(
        log.as_array().unwrap().iter().any(|a| a["message"].as_str().unwrap_or("").contains("lock was not free")),
        "{log}"
    );
}

/// A worker stream driven by the test that executes `vacuum`: it reports
/// each execute request on `seen` and completes it at once.
async fn fake_vacuum_executor(server: &Server) -> tokio::sync::mpsc::UnboundedReceiver<String> {
    use jobcenter::proto::plugin::{
        admin_to_worker_message, plugin_control_service_client::PluginControlServiceClient,
        worker_to_admin_message::Body, JobCompleted, JobTypeCapability, WorkerHello, WorkerToAdminMessage,
    };
    let mut client = PluginControlServiceClient::connect(format!("http://{}", server.grpc)).await.unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let hello = WorkerHello {
        worker_id: "fake-vacuum".into(),
        worker_instance_id: uuid::Uuid::new_v4().to_string(),
        capabilities: vec![JobTypeCapability {
            job_type: "vacuum".into(),
            can_execute: true,
            max_execution_concurrency: 2,
            ..JobTypeCapability::default()
        }],
        ..WorkerHello::default()
    };
    tx.send(WorkerToAdminMessage { body: Some(Body::Hello(hello)), ..Default::default() }).await.unwrap();
    let mut inbound = client.worker_stream(tokio_stream::wrappers::ReceiverStream::new(rx)).await.unwrap().into_inner();
    let (seen_tx, seen_rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok(Some(message)) = inbound.message().await {
            if let Some(admin_to_worker_message::Body::ExecuteJobRequest(request)) = message.body {
                let job_id = request.job.map(|j| j.job_id).unwrap_or_default();
                let _ = seen_tx.send(job_id.clone());
                let done = JobCompleted { request_id: message.request_id, job_id, success: true, ..Default::default() };
                let _ =
                    tx.send(WorkerToAdminMessage { body: Some(Body::JobCompleted(done)), ..Default::default() }).await;
            }
        }
    });
    seen_rx
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maintenance_runs_only_under_the_cluster_lock() {
    let dir = tempfile::tempdir().unwrap();
    let (_master, mut master, port) = start_master(dir.path());
    let server = Server::start(&dir.path().join("data"), &["--master", &format!("127.0.0.1:{port}")]);
    assert!(server.cli(&["policy", "set", "vacuum", "detection_enabled=0"]).status.success());
    let mut seen = fake_vacuum_executor(&server).await;
    server.wait_for_workers(1);

    // An operator holds the cluster lock: a submitted vacuum waits.
    let lease = seaweedfs::operator_lease(&mut master).await;
    let file = dir.path().join("vacuum.json");
    std::fs::write(
        &file,
        r#"{"name":"by-hand","tasks":[{"id":"v","job_type":"vacuum","parameters":{"volume_id":1}}]}"#,
    )
    .unwrap();
    let id = String::from_utf8(server.cli(&["submit", file.to_str().unwrap()]).stdout).unwrap().trim().to_string();
    let early = tokio::time::timeout(Duration::from_secs(3), seen.recv()).await;
    assert!(early.is_err(), "a vacuum was dispatched while an operator held the cluster lock: {early:?}");
    assert_eq!(server.cli_json(&["job", &id, "--json"])["tasks"][0]["state"], "ready");

    // Released: jobcenter takes the lock, the vacuum runs, and the lock is let go after.
    master
        .release_admin_token(ReleaseAdminTokenRequest {
            previous_token: lease.token,
            previous_lock_time: lease.lock_ts_ns,
            lock_name: "shell".into(),
        })
        .await
        .unwrap();
    let dispatched = tokio::time::timeout(Duration::from_secs(15), seen.recv()).await;
    assert!(matches!(dispatched, Ok(Some(_))), "the vacuum ran once the lock was free");
    let ended = wait_until(Duration::from_secs(20), || {
        (server.cli_json(&["job", &id, "--json"])["state"] == "succeeded").then_some(())
    });
    assert!(ended.is_some());
    let mut freed = false;
    for _ in 0..40 {
        let status =
            master.get_admin_lock_status(GetAdminLockStatusRequest { lock_name: "shell".into() }).await.unwrap();
        if !status.into_inner().is_locked {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(freed, "jobcenter let go of the cluster lock once nothing ran");
}
