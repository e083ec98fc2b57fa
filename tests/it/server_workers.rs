//! The admin server with real worker processes on loopback: the nine-task
//! job through two workers ends as `jobcenter run` ends it, and a worker
//! killed while it holds tasks has its attempts run again on the other.

use crate::support;
use crate::support::postgres as pg;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use support::{exec_events, nine_tasks, run_with_timeout, start_worker, states, wait_until, Server};

fn run_embedded(file: &std::path::Path, store: &[String]) -> serde_json::Value {
    let mut command = Command::new(support::binary());
    command.args(["run", file.to_str().unwrap(), "--json"]).args(store);
    let output = run_with_timeout(command, Duration::from_secs(60));
    serde_json::from_slice(&output.stdout).expect("run --json")
}

#[test]
fn nine_tasks_through_two_workers_end_as_run_ends_them() {
    let dir = tempfile::tempdir().unwrap();
    let embedded = dir.path().join("embedded").display().to_string();
    nine_tasks_through_two_workers(dir.path(), &[], &["--data-dir".into(), embedded]);
}

#[test]
fn nine_tasks_on_postgres_through_two_workers_end_as_run_ends_them() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = pg::shared();
    let (server_db, embedded_db) = (cluster.new_database(), cluster.new_database());
    nine_tasks_through_two_workers(
        dir.path(),
        &["--database-url".into(), cluster.url(&server_db)],
        &["--database-url".into(), cluster.url(&embedded_db)],
    );
}

/// The nine-task job, failing and not, through a server and two workers and
/// through `jobcenter run`, each on the store its arguments name.
fn nine_tasks_through_two_workers(dir: &std::path::Path, server_store: &[String], embedded_store: &[String]) {
    let server_args: Vec<&str> = server_store.iter().map(String::as_str).collect();
    let server = Server::start(&dir.join("data"), &server_args);
    let _a = start_worker(&server, "worker-a", &[], None);
    let _b = start_worker(&server, "worker-b", &[], None);
    server.wait_for_workers(2);
    for (name, fail, expected_exit) in [("success", None, 0), ("failure", Some(4), 1)] {
        let file = dir.join(format!("{name}.json"));
        std::fs::write(&file, nine_tasks(fail, 20)).unwrap();
        let output = server.cli(&["submit", file.to_str().unwrap(), "--wait", "--json"]);
        assert_eq!(output.status.code(), Some(expected_exit), "{}", String::from_utf8_lossy(&output.stderr));
        let remote: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        let embedded = run_embedded(&file, embedded_store);
        assert_eq!(states(&remote), states(&embedded), "{name}: the server and `run` agree");
        assert_eq!(remote["state"], embedded["state"]);
        if fail.is_some() {
            let by_id: BTreeMap<String, String> = states(&remote).into_iter().collect();
            assert_eq!(by_id["4"], "failed");
            assert_eq!(by_id["7"], "upstream_failed");
            assert_eq!(by_id["9"], "upstream_failed");
            assert_eq!(by_id["8"], "succeeded");
        }
    }
    // Both workers took part: every succeeded task names its handler.
    let jobs = server.cli_json(&["jobs", "--json"]);
    let id = jobs[0]["id"].as_str().unwrap().to_string();
    let job = server.cli_json(&["job", &id, "--json"]);
    assert!(!job["handler"].as_str().unwrap_or("").is_empty(), "the job records the admin instance that led it");
    let handlers: std::collections::BTreeSet<&str> = job["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["handler"].as_str())
        .filter(|h| !h.is_empty())
        .collect();
    assert!(!handlers.is_empty());
}

#[test]
fn a_killed_worker_s_attempts_run_again_on_the_other_worker() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &[]);
    let log = dir.path().join("exec.log");
    let mut victim = start_worker(&server, "victim", &["--max-execute", "4", "--lease", "2s"], Some(&log));
    server.wait_for_workers(1);
    // Twelve independent tasks of 1.5 s: the victim takes four at once.
    let tasks: Vec<String> =
        (0..12).map(|i| format!(r#"{{"id":"t{i}","job_type":"noop","parameters":{{"sleep_ms":1500}}}}"#)).collect();
    let file = dir.path().join("slow.json");
    std::fs::write(&file, format!(r#"{{"name":"slow","tasks":[{}]}}"#, tasks.join(","))).unwrap();
    let job_id = String::from_utf8(server.cli(&["submit", file.to_str().unwrap()]).stdout).unwrap().trim().to_string();
    // Wait until the victim holds work, then kill it.
    let held = wait_until(Duration::from_secs(20), || {
        let starts = exec_events(&log, &job_id).iter().filter(|e| e.2 == "start").count();
        (starts >= 4).then_some(starts)
    });
    assert!(held.is_some(), "the victim never started its tasks");
    victim.kill();
    let _survivor = start_worker(&server, "survivor", &["--max-execute", "4"], Some(&log));
    let done = wait_until(Duration::from_secs(60), || {
        let job = server.cli_json(&["job", &job_id, "--json"]);
        matches!(job["state"].as_str(), Some("succeeded" | "failed")).then_some(job)
    })
    .expect("the job ends");
    assert_eq!(done["state"], "succeeded");
    let events = exec_events(&log, &job_id);
    let lost: Vec<&serde_json::Value> =
        done["tasks"].as_array().unwrap().iter().filter(|t| t["attempt"].as_u64() == Some(2)).collect();
    assert!(!lost.is_empty(), "the attempts the victim held ran again as attempt 2");
    for task in lost {
        assert_eq!(task["lost"], 1, "{task}");
    }
    // No task succeeded twice.
    let mut successes: BTreeMap<String, u32> = BTreeMap::new();
    for (task, _, event) in &events {
        if event == "succeeded" {
            *successes.entry(task.clone()).or_default() += 1;
        }
    }
    assert_eq!(successes.len(), 12);
    assert!(successes.values().all(|&n| n == 1), "{successes:?}");
}

#[test]
fn timeouts_cancel_and_retry_through_remote_workers() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &[]);
    let _worker = start_worker(&server, "worker", &["--max-execute", "8"], None);
    server.wait_for_workers(1);

    // An attempt that outlives its execution timeout is stopped and fails.
    let file = dir.path().join("slow.json");
    std::fs::write(
        &file,
        r#"{"name":"slow","tasks":[{"id":"sleepy","job_type":"noop","parameters":{"sleep_ms":30000},"execution_timeout_seconds":1},
           {"id":"after","job_type":"noop","depends_on":["sleepy"]}]}"#,
    )
    .unwrap();
    let started = std::time::Instant::now();
    let output = server.cli(&["submit", file.to_str().unwrap(), "--wait", "--json"]);
    assert!(started.elapsed() < Duration::from_secs(20), "the timeout ended the attempt");
    assert_eq!(output.status.code(), Some(1));
    let job: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(job["tasks"][0]["state"], "failed");
    assert_eq!(job["tasks"][0]["error"], "execution timed out after 1 s");
    assert_eq!(job["tasks"][1]["state"], "upstream_failed");

    // Cancel while a task runs on the worker: the job ends canceled.
    let file = dir.path().join("long.json");
    std::fs::write(
        &file,
        r#"{"name":"long","tasks":[{"id":"long","job_type":"noop","parameters":{"sleep_ms":30000}},
           {"id":"next","job_type":"noop","depends_on":["long"]}]}"#,
    )
    .unwrap();
    let id = String::from_utf8(server.cli(&["submit", file.to_str().unwrap()]).stdout).unwrap().trim().to_string();
    wait_until(Duration::from_secs(20), || {
        let job = server.cli_json(&["job", &id, "--json"]);
        (job["tasks"][0]["state"] == "running").then_some(())
    })
    .expect("the task runs");
    assert!(server.cli(&["cancel", &id]).status.success());
    let canceled = wait_until(Duration::from_secs(20), || {
        let job = server.cli_json(&["job", &id, "--json"]);
        (job["state"] == "canceled").then_some(job)
    })
    .expect("the job ends canceled");
    assert_eq!(canceled["tasks"][0]["state"], "canceled");
    assert_eq!(canceled["tasks"][1]["state"], "canceled");
    assert!(!server.cli(&["cancel", &id]).status.success(), "an ended job cannot be canceled again");

    // Retry runs the canceled part again.
    let retried = server.cli(&["retry", &id]);
    assert!(retried.status.success(), "{}", String::from_utf8_lossy(&retried.stderr));
    let job = server.cli_json(&["job", &id, "--json"]);
    assert_eq!(job["state"], "running");
    assert!(matches!(job["tasks"][0]["state"].as_str(), Some("ready" | "assigned" | "running")), "{job}");
}

#[test]
fn sigterm_stops_the_server_even_with_workers_connected() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(&dir.path().join("data"), &[]);
    let _worker = start_worker(&server, "w", &[], None);
    server.wait_for_workers(1);
    let pid = nix::unistd::Pid::from_raw(server.process.child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let exited = wait_until(Duration::from_secs(15), || server.process.child.try_wait().ok().flatten());
    let status = exited.expect("the server stopped within 15 s of SIGTERM");
    assert!(status.success(), "{status:?}");
}

/// A worker whose work takes `seconds` a task (`shell` tasks sleep for
/// `$WORK_SECONDS`, which each worker's environment sets): the same
/// program on a host where the work is slower.
fn worker_whose_work_takes(server: &Server, id: &str, seconds: &str) -> support::Process {
    let child = Command::new(support::binary())
        .args(["worker", "--id", id, "--heartbeat", "1s", "--max-execute", "2", "--admin", &server.http])
        .env("WORK_SECONDS", seconds)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start a worker");
    support::Process { child, name: id.to_string() }
}

/// Tasks run by each worker id in a job.
fn tasks_by_worker(server: &Server, job: &serde_json::Value) -> BTreeMap<String, usize> {
    let ids: BTreeMap<String, String> = server
        .workers()
        .iter()
        .map(|w| (w["handler"].as_str().unwrap().to_string(), w["worker_id"].as_str().unwrap().to_string()))
        .collect();
    let mut counts = BTreeMap::new();
    for task in job["tasks"].as_array().unwrap() {
        let handler = task["handler"].as_str().unwrap_or_default();
        *counts.entry(ids.get(handler).cloned().unwrap_or_else(|| format!("unknown {handler}"))).or_insert(0) += 1;
    }
    counts
}

#[test]
fn a_worker_three_times_slower_gets_clearly_fewer_tasks() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &[]);
    let _fast = worker_whose_work_takes(&server, "fast", "0.1");
    let _slow = worker_whose_work_takes(&server, "slow", "0.3");
    server.wait_for_workers(2);
    let work = |id: String, depends_on: Option<String>| {
        let mut task = serde_json::json!({"id": id, "job_type": "shell",
                                          "parameters": {"command": "sleep \"$WORK_SECONDS\""}});
        if let Some(d) = depends_on {
            task["depends_on"] = serde_json::json!([d]);
        }
        task
    };
    let submit = |name: &str, tasks: Vec<serde_json::Value>| {
        let file = dir.path().join(format!("{name}.json"));
        std::fs::write(&file, serde_json::to_vec(&serde_json::json!({"name": name, "tasks": tasks})).unwrap()).unwrap();
        let started = std::time::Instant::now();
        let output = server.cli(&["submit", file.to_str().unwrap(), "--wait", "--json"]);
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let job: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        assert_eq!(job["state"], "succeeded", "{job}");
        let took = started.elapsed();
        let job = server.cli_json(&["job", job["id"].as_str().unwrap(), "--json"]);
        (tasks_by_worker(&server, &job), took)
    };

    // Two chains of 30: two tasks at a time, while the workers have four
    // slots. The fast worker, free enough for both, gets nearly all.
    let chains: Vec<serde_json::Value> = ["a", "b"]
        .iter()
        .flat_map(|c| (0..30).map(move |i| (c, i)))
        .map(|(c, i)| work(format!("{c}{i}"), (i > 0).then(|| format!("{c}{}", i - 1))))
        .collect();
    let (split, took) = submit("chains", chains);
    eprintln!("two chains of 30: {split:?} in {took:?}");
    assert_eq!(split.values().sum::<usize>(), 60, "{split:?}");
    let slow = split.get("slow").copied().unwrap_or(0);
    assert!(slow * 10 <= 60, "the slow worker ran {slow} of 60 chained tasks: {split:?}");

    // 60 tasks at once: every slot stays busy, each worker runs what its
    // speed allows, the slow one about a quarter.
    let (split, took) = submit("wide", (0..60).map(|i| work(format!("w{i}"), None)).collect());
    eprintln!("60 independent tasks: {split:?} in {took:?}");
    let (fast, slow) = (split.get("fast").copied().unwrap_or(0), split.get("slow").copied().unwrap_or(0));
    assert_eq!(fast + slow, 60, "{split:?}");
    assert!(slow > 0 && fast >= 2 * slow, "{split:?}");
}
