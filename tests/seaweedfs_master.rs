//! jobcenter's duties towards a real SeaweedFS master: it holds the
//! `admin-server` presence lock while it runs, and a detection waits for the
//! cluster's `shell` admin lock (the one `weed shell` takes), so an operator
//! and jobcenter never act on the cluster at once.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::{wait_until, Process, Server};
use jobcenter::proto::master::{
    seaweed_client::SeaweedClient, GetAdminLockStatusRequest, LeaseAdminTokenRequest, ReleaseAdminTokenRequest,
};

fn free_port() -> u16 {
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        if port < 55_000 && std::net::TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn presence_lock_held_and_detection_waits_for_the_shell_lock() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mdir = dir.path().join("master");
    std::fs::create_dir_all(&mdir).unwrap();
    let _master = spawn(
        &["master".into(), "-ip=127.0.0.1".into(), format!("-port={port}"), format!("-mdir={}", mdir.display())],
        dir.path(),
        "master",
    );
    let grpc = format!("http://127.0.0.1:{}", port + 10_000);
    let mut master = wait_until(Duration::from_secs(60), || {
        let runtime = tokio::runtime::Handle::current();
        std::thread::scope(|s| s.spawn(|| runtime.block_on(SeaweedClient::connect(grpc.clone())).ok()).join().unwrap())
    })
    .expect("the master starts");

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
        .lease_admin_token(LeaseAdminTokenRequest {
            lock_name: "shell".into(),
            client_name: "operator".into(),
            message: "weed shell".into(),
            ..LeaseAdminTokenRequest::default()
        })
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
    let status = master.get_admin_lock_status(GetAdminLockStatusRequest { lock_name: "shell".into() }).await.unwrap();
    assert!(!status.into_inner().is_locked, "jobcenter released the shell lock after its detection");
    let log = server.cli_json(&["activities", "--job-type", "vacuum", "--json"]);
    assert!(
        log.as_array().unwrap().iter().any(|a| a["message"].as_str().unwrap_or("").contains("lock was not free")),
        "{log}"
    );
}
