//! `jobcenter backup` on a running server under load, and `jobcenter
//! restore` into an empty data directory: the copy holds every job whole
//! and in a state the rules allow (no task ahead of its parents), a running
//! job included; restored, the server finishes it; restoring over data is
//! refused.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use support::{start_worker, wait_until, Server};

/// `layers` layers of `width` noop tasks; each after the first depends on two of the layer before.
fn layered(layers: usize, width: usize, sleep_ms: u64) -> String {
    let mut tasks = Vec::new();
    for l in 0..layers {
        for w in 0..width {
            let deps =
                if l == 0 { String::new() } else { format!(r#""t{}-{w}","t{}-{}""#, l - 1, l - 1, (w + 1) % width) };
            tasks.push(format!(
                r#"{{"id":"t{l}-{w}","job_type":"noop","parameters":{{"sleep_ms":{sleep_ms}}},"depends_on":[{deps}]}}"#
            ));
        }
    }
    format!(r#"{{"name":"layered","tasks":[{}]}}"#, tasks.join(","))
}

/// One job of a backup file: its record, each task's parents and state.
struct Copied {
    record: Value,
    parents: Vec<Vec<usize>>,
    states: BTreeMap<usize, String>,
}

fn read_backup(path: &std::path::Path) -> Vec<Copied> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines = text.lines().map(|l| serde_json::from_str::<Value>(l).unwrap());
    let header = lines.next().unwrap();
    assert_eq!(header["format"], "jobcenter-export");
    let mut jobs: Vec<Copied> = Vec::new();
    let mut open = false;
    for line in lines {
        match line["kind"].as_str().unwrap() {
            "job" => {
                assert!(!open, "a job starts inside another");
                open = true;
                jobs.push(Copied { record: line["record"].clone(), parents: Vec::new(), states: BTreeMap::new() });
            }
            "tasks" => {
                let job = jobs.last_mut().unwrap();
                for task in line["tasks"].as_array().unwrap() {
                    let parents = task["parents"].as_array().unwrap().iter().map(|p| p.as_u64().unwrap() as usize);
                    job.parents.push(parents.collect());
                }
            }
            "records" => {
                let job = jobs.last_mut().unwrap();
                for pair in line["records"].as_array().unwrap() {
                    let state = pair[1]["state"].as_str().unwrap().to_string();
                    job.states.insert(pair[0].as_u64().unwrap() as usize, state);
                }
            }
            "end" => open = false,
            "setting" => {}
            other => panic!("unknown line kind {other}"),
        }
    }
    assert!(!open, "the copy ends inside a job");
    jobs
}

impl Copied {
    fn state(&self, idx: usize) -> &str {
        match self.states.get(&idx) {
            Some(state) => state,
            None if self.parents[idx].is_empty() => "ready",
            None => "pending",
        }
    }

    /// Every task's state is one the rules allow beside its parents': a job
    /// copied in the middle of a step would break this.
    fn assert_whole(&self) {
        assert_eq!(self.parents.len() as u64, self.record["n_tasks"].as_u64().unwrap(), "every task copied");
        for idx in 0..self.parents.len() {
            let parents_done = self.parents[idx].iter().all(|&p| self.state(p) == "succeeded");
            match self.state(idx) {
                "ready" | "assigned" | "running" | "succeeded" => {
                    assert!(parents_done, "task {idx} is {} before its parents succeeded", self.state(idx))
                }
                "pending" => assert!(!parents_done, "task {idx} waits with every parent succeeded"),
                _ => {}
            }
        }
        if self.record["state"] == "succeeded" {
            assert!((0..self.parents.len()).all(|i| self.state(i) == "succeeded"));
        }
    }
}

#[test]
fn a_backup_taken_under_load_restores_into_a_server_that_finishes_the_work() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start(&data, &[]);
    let workers: Vec<_> = (0..2).map(|n| start_worker(&server, &format!("w{n}"), &[], None)).collect();
    server.wait_for_workers(2);

    let file = dir.path().join("layered.json");
    std::fs::write(&file, layered(40, 50, 10)).unwrap();
    let output = server.cli(&["submit", file.to_str().unwrap()]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let big = String::from_utf8_lossy(&output.stdout).trim().to_string();

    // Small jobs keep coming while the copy is made.
    let stop = Arc::new(AtomicBool::new(false));
    let submitter = {
        let (stop, admin, dir) = (stop.clone(), server.http.clone(), dir.path().to_path_buf());
        std::thread::spawn(move || {
            let small = dir.join("small.json");
            std::fs::write(&small, r#"{"name":"small","tasks":[{"id":"a","job_type":"noop"}]}"#).unwrap();
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let mut command = std::process::Command::new(support::binary());
                command.args(["submit", small.to_str().unwrap(), "--admin", &admin]);
                if support::run_with_timeout(command, Duration::from_secs(30)).status.success() {
                    n += 1;
                }
            }
            n
        })
    };
    wait_until(Duration::from_secs(60), || {
        let job = server.cli_json(&["job", &big, "--json"]);
        let done = job["tasks"].as_array().unwrap().iter().filter(|t| t["state"] == "succeeded").count();
        (done >= 300).then_some(())
    })
    .expect("the layered job made progress");

    let copy = dir.path().join("copy.jsonl");
    let output = server.cli(&["backup", copy.to_str().unwrap()]);
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success() && said.contains("backed up"), "{said}");
    stop.store(true, Ordering::Relaxed);
    let submitted = submitter.join().unwrap();
    assert!(submitted > 0, "small jobs were submitted during the copy");

    let jobs = read_backup(&copy);
    for job in &jobs {
        job.assert_whole();
    }
    let layered = jobs.iter().find(|j| j.record["id"] == big.as_str()).expect("the running job is in the copy");
    let done = (0..layered.parents.len()).filter(|&i| layered.state(i) == "succeeded").count();
    assert!(layered.record["state"] == "running" && (300..2000).contains(&done), "copied mid-run: {done} succeeded");
    let ids: BTreeSet<String> = jobs.iter().map(|j| j.record["id"].as_str().unwrap().to_string()).collect();
    assert_eq!(ids.len(), jobs.len(), "each job once");
    drop(workers);
    drop(server);

    // Over existing data: refused, the data left as it was.
    let over = std::process::Command::new(support::binary())
        .args(["restore", copy.to_str().unwrap(), "--data-dir", data.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(over.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&over.stderr).contains("not empty"), "{}", String::from_utf8_lossy(&over.stderr));

    // Into an empty directory: the server there finishes the job.
    let restored = dir.path().join("restored");
    let output = std::process::Command::new(support::binary())
        .args(["restore", copy.to_str().unwrap(), "--data-dir", restored.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    // The attempts copied as running belonged to workers that are gone: taken back after 3 s.
    let server = Server::start(&restored, &["--orphan-grace", "3s"]);
    let listed = server.cli_json(&["jobs", "--all", "--json", "--limit", "100000"]);
    let listed: BTreeSet<String> =
        listed.as_array().unwrap().iter().map(|j| j["id"].as_str().unwrap().to_string()).collect();
    assert_eq!(listed, ids, "every job of the copy, and only those");
    let _workers: Vec<_> = (0..2).map(|n| start_worker(&server, &format!("r{n}"), &["--lease", "1s"], None)).collect();
    let finished = wait_until(Duration::from_secs(120), || {
        let job = server.cli_json(&["job", &big, "--json"]);
        (job["state"] != "running" && job["state"] != "pending").then_some(job)
    })
    .unwrap_or_else(|| {
        let job = server.cli_json(&["job", &big, "--json"]);
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for t in job["tasks"].as_array().unwrap() {
            *counts.entry(t["state"].as_str().unwrap().to_string()).or_default() += 1;
        }
        let log = std::fs::read_to_string(&server.log).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(30).collect();
        panic!("the restored job did not end: {counts:?}\n{}", tail.join("\n"))
    });
    assert_eq!(finished["state"], "succeeded");
    assert!(finished["tasks"].as_array().unwrap().iter().all(|t| t["state"] == "succeeded"));
}
