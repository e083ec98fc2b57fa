//! Retention on a real server: ended jobs past the rules (count, age, the
//! recovery check's own jobs) are removed, by `jobcenter prune` and in the
//! background, with everything they own and across a SIGKILL; jobs that
//! have not ended are never removed; `jobs` leaves recovery checks out.

use crate::support;

use std::time::Duration;

use serde_json::Value;
use support::{start_worker, wait_until, Server};

fn submit(server: &Server, dir: &std::path::Path, name: &str, job_type: &str, wait: bool) -> String {
    let file = dir.join(format!("{name}.json"));
    std::fs::write(&file, format!(r#"{{"name":"{name}","tasks":[{{"id":"a","job_type":"{job_type}"}}]}}"#)).unwrap();
    let mut args = vec!["submit", file.to_str().unwrap(), "--json"];
    if wait {
        args.push("--wait");
    }
    let job = server.cli_json(&args);
    let id = if wait { &job["id"] } else { &job["job_id"] };
    id.as_str().unwrap_or_else(|| panic!("{job}")).to_string()
}

/// The body of a GET (HTTP/1.0: neither kept open nor chunked).
fn get(address: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response.split_once("\r\n\r\n").map(|(_, body)| body.to_string()).unwrap_or_default()
}

fn ids(list: &Value) -> Vec<String> {
    list.as_array().unwrap().iter().map(|j| j["id"].as_str().unwrap().to_string()).collect()
}

fn exists(server: &Server, id: &str) -> bool {
    let output = server.cli(&["job", id, "--json"]);
    match output.status.code() {
        Some(0) => true,
        Some(2) if String::from_utf8_lossy(&output.stderr).contains("no job") => false,
        _ => panic!("job {id}: {}", String::from_utf8_lossy(&output.stderr)),
    }
}

#[test]
fn prune_removes_what_the_rules_say_and_nothing_that_runs() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let rules = ["--keep-ended", "2", "--keep-recovery-checks-for", "1s", "--prune-interval", "1h"];
    let mut args = rules.to_vec();
    args.extend(["--recovery-interval", "300ms"]);
    let server = Server::start(&data, &args);
    let _worker = start_worker(&server, "w1", &[], None);
    server.wait_for_workers(1);

    let done: Vec<String> = (0..4).map(|n| submit(&server, dir.path(), &format!("small-{n}"), "noop", true)).collect();
    let parked = submit(&server, dir.path(), "parked", "parked", false);
    let checks = wait_until(Duration::from_secs(30), || {
        let list = server.cli_json(&["jobs", "--origin", "recovery", "--state", "succeeded", "--json"]);
        (list.as_array().unwrap().len() >= 2).then_some(ids(&list))
    })
    .expect("the recovery check ran as jobs");

    // `jobs` leaves the recovery check's jobs out; `--all` shows them.
    let listed = ids(&server.cli_json(&["jobs", "--json"]));
    let mut expected: Vec<String> = done.iter().rev().cloned().collect();
    expected.insert(0, parked.clone());
    assert_eq!(listed, expected, "newest first, no recovery check");
    let all = ids(&server.cli_json(&["jobs", "--all", "--json", "--limit", "1000"]));
    assert!(checks.iter().all(|c| all.contains(c)), "--all shows the recovery checks");

    // Dry: named with their reasons, nothing removed.
    std::thread::sleep(Duration::from_millis(1500));
    let dry = server.cli_json(&["prune", "--dry-run", "--json"]);
    assert_eq!(dry["dry_run"], true);
    let named: Vec<(String, String)> = dry["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["job"]["id"].as_str().unwrap().to_string(), p["reason"].as_str().unwrap().to_string()))
        .collect();
    let reason = |id: &str| named.iter().find(|(n, _)| n == id).map(|(_, r)| r.as_str());
    assert_eq!(reason(&done[0]), Some("older than the newest 2 ended jobs"), "{named:?}");
    assert_eq!(reason(&done[1]), Some("older than the newest 2 ended jobs"));
    assert_eq!(reason(&checks[checks.len() - 1]), Some("a recovery check that ended more than 1s ago"));
    for kept in [&done[2], &done[3], &parked] {
        assert_eq!(reason(kept), None, "{kept} is kept");
    }
    assert!(exists(&server, &done[0]), "a dry run removes nothing");

    // For real: gone with all they own, the rest untouched.
    let pruned = server.cli_json(&["prune", "--json"]);
    let removed: Vec<&str> =
        pruned["jobs"].as_array().unwrap().iter().map(|p| p["job"]["id"].as_str().unwrap()).collect();
    assert!(removed.contains(&done[0].as_str()) && removed.contains(&done[1].as_str()), "{pruned}");
    for id in &done[..2] {
        assert!(!exists(&server, id));
        let retry = server.cli(&["retry", id]);
        assert_eq!(retry.status.code(), Some(2), "a removed job cannot be retried");
    }
    for id in [&done[2], &done[3], &parked] {
        assert!(exists(&server, id));
    }
    let counted = counter(&server, "jobcenter_jobs_pruned_total");
    assert!(counted >= removed.len() as f64, "{counted} < {}", removed.len());

    // Durable: after a SIGKILL the removed jobs stay removed.
    drop(server);
    let server = Server::start(&data, &args);
    for id in &done[..2] {
        assert!(!exists(&server, id), "{id} came back after a restart");
    }
    for id in [&done[2], &done[3], &parked] {
        assert!(exists(&server, id));
    }
}

#[test]
fn the_server_removes_jobs_older_than_the_age_kept_by_itself() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let args = ["--local-workers", "1", "--keep-ended-for", "1h", "--prune-interval", "200ms"];
    let server = Server::start(&data, &args);
    let done: Vec<String> = (0..3).map(|n| submit(&server, dir.path(), &format!("small-{n}"), "noop", true)).collect();
    let parked = submit(&server, dir.path(), "parked", "parked", false);
    std::thread::sleep(Duration::from_millis(800));
    assert!(done.iter().all(|id| exists(&server, id)), "younger than the age kept");
    drop(server);

    // Two hours later, by the server's clock.
    let ahead = support::clock_ahead("+2h");
    let ahead: Vec<&str> = ahead.iter().map(String::as_str).collect();
    let server = Server::start_wrapped(&ahead, &data, "127.0.0.1:0", &args);
    let gone = wait_until(Duration::from_secs(20), || done.iter().all(|id| !exists(&server, id)).then_some(()));
    assert!(gone.is_some(), "the background prune removed the old jobs");
    assert!(exists(&server, &parked), "a job that has not ended is never removed");
    let log = std::fs::read_to_string(&server.log).unwrap();
    assert!(log.contains("ended jobs removed"), "the log says so");
}

/// A counter's value in the server's metrics.
fn counter(server: &Server, name: &str) -> f64 {
    let metrics = get(&server.http, "/metrics");
    let prefix = format!("{name} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no {name} in the metrics"))
}

/// A job file of 2,000 `noop` tasks with long ids: enough for a few of them
/// to grow a data directory past the compaction's 8 MiB.
fn wide_job(dir: &std::path::Path) -> std::path::PathBuf {
    let wide = dir.join("wide.json");
    let tasks: Vec<String> = (0..2_000)
        .map(|i| format!(r#"{{"id":"task-{i}-{}","job_type":"noop","parameters":{{"sleep_ms":0}}}}"#, "x".repeat(48)))
        .collect();
    std::fs::write(&wide, format!(r#"{{"name":"wide","tasks":[{}]}}"#, tasks.join(","))).unwrap();
    wide
}

/// The generations (`log.N`) in a data directory.
fn generations(data: &std::path::Path) -> Vec<u64> {
    let mut found: Vec<u64> = std::fs::read_dir(data)
        .unwrap()
        .filter_map(|e| e.unwrap().file_name().to_str()?.strip_prefix("log.")?.parse().ok())
        .collect();
    found.sort();
    found
}

/// The one generation left once no compaction is under way (a copy is a
/// second generation until it switches), and the one `CURRENT` names; `None`
/// if that is not so within 30 s (a generation left behind stays until the
/// next start).
fn settled_generation(data: &std::path::Path) -> Option<u64> {
    let current = || {
        let text = std::fs::read_to_string(data.join("CURRENT")).unwrap_or_default();
        text.lines().find_map(|l| l.strip_prefix("generation ")?.parse::<u64>().ok())
    };
    wait_until(Duration::from_secs(30), || match generations(data)[..] {
        [only] if Some(only) == current() => Some(only),
        _ => None,
    })
}

#[test]
fn the_server_compacts_its_data_directory_and_a_kill_after_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let args = ["--local-workers", "2", "--keep-ended", "3", "--prune-interval", "200ms"];
    let server = Server::start(&data, &args);
    let parked = submit(&server, dir.path(), "parked", "parked", false);
    let set = server.cli(&["policy", "set", "noop", "max_jobs_per_detection=7"]);
    assert!(set.status.success(), "{}", String::from_utf8_lossy(&set.stderr));
    let wide = wide_job(dir.path());

    // Jobs of 2,000 tasks run and are removed until the log has grown enough
    // for the server to compact it.
    let started = std::time::Instant::now();
    let mut done = Vec::new();
    while counter(&server, "jobcenter_store_compactions_total") < 1.0 {
        assert!(started.elapsed() < Duration::from_secs(240), "no compaction after {} jobs", done.len());
        let job = server.cli_json(&["submit", wide.to_str().unwrap(), "--wait", "--json"]);
        assert_eq!(job["state"], "succeeded", "{}", job["tasks"][0]);
        done.push(job["id"].as_str().unwrap().to_string());
    }
    assert!(counter(&server, "jobcenter_store_reclaimed_bytes_total") > 0.0);
    let log = std::fs::read_to_string(&server.log).unwrap();
    assert!(log.contains("store compacted"), "the log says so");
    let live = settled_generation(&data);
    assert!(live.is_some_and(|n| n >= 2), "one generation, a compacted one: {:?}", generations(&data));

    // SIGKILL right after, and a restart: what was kept is there, whole.
    let kept: Vec<String> = done.iter().rev().take(2).cloned().collect();
    drop(server);
    let server = Server::start(&data, &args);
    for id in &kept {
        let job = server.cli_json(&["job", id, "--json"]);
        assert_eq!(job["state"], "succeeded", "{}", job["tasks"][0]);
        assert_eq!(job["tasks"].as_array().map(Vec::len), Some(2_000));
    }
    let parked = server.cli_json(&["job", &parked, "--json"]);
    assert!(matches!(parked["state"].as_str(), Some("pending" | "running")), "{parked}");
    let policy = server.cli(&["policy", "get", "noop"]);
    let policy = String::from_utf8_lossy(&policy.stdout);
    assert!(policy.lines().any(|l| l.contains("max_jobs_per_detection") && l.contains('7')), "{policy}");
    let job = server.cli_json(&["submit", wide.to_str().unwrap(), "--wait", "--json"]);
    assert_eq!(job["state"], "succeeded", "the restarted server runs jobs: {}", job["tasks"][0]);
    // The job just run grew the log again, and the server may be compacting
    // it meanwhile.
    assert!(settled_generation(&data).is_some(), "one generation: {:?}", generations(&data));
}

#[test]
fn a_kill_in_the_middle_of_a_compaction_leaves_one_whole_generation() {
    // Killed with the copy durable and `CURRENT` not switched yet, the old
    // generation stays; killed just after the switch, the new one.
    for (point, moves_on) in [("compaction-copied", false), ("compaction-switched", true)] {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let args = ["--local-workers", "2", "--keep-ended", "3", "--prune-interval", "200ms"];
        let crash = format!("JOBCENTER_CRASH_AT={point}:1");
        let mut server = Server::start_wrapped(&["env", &crash], &data, "127.0.0.1:0", &args);
        let parked = submit(&server, dir.path(), "parked", "parked", false);
        let wide = wide_job(dir.path());

        // Jobs run and are removed until the first compaction kills the server.
        let started = std::time::Instant::now();
        let mut done = Vec::new();
        let before = generations(&data);
        assert_eq!(before.len(), 1);
        // (`submit --wait` would wait for the server to come back: each job
        // is followed by `job` instead, which fails at once when it is gone.)
        let mut running: Option<String> = None;
        while server.process.child.try_wait().unwrap().is_none() {
            assert!(started.elapsed() < Duration::from_secs(240), "{point}: no crash after {} jobs", done.len());
            let Some(id) = running.clone() else {
                let submitted = server.cli(&["submit", wide.to_str().unwrap(), "--json"]);
                if submitted.status.success() {
                    let job: Value = serde_json::from_slice(&submitted.stdout).unwrap();
                    running = Some(job["job_id"].as_str().unwrap().to_string());
                }
                continue;
            };
            let read = server.cli(&["job", &id, "--json"]);
            let Ok(job) = serde_json::from_slice::<Value>(&read.stdout) else { continue };
            match job["state"].as_str() {
                Some("succeeded") => {
                    done.push(id);
                    running = None;
                }
                Some("pending" | "running") => std::thread::sleep(Duration::from_millis(50)),
                _ => panic!("{point}: {}", job["tasks"][0]),
            }
        }
        let log = std::fs::read_to_string(&server.log).unwrap();
        assert!(log.contains(&format!("crashing on purpose at {point}")), "{point}: {log}");
        assert_eq!(generations(&data).len(), 2, "{point}: killed with two generations on disk");
        drop(server);

        // The restart keeps the generation `CURRENT` names and removes the
        // other. (It prunes rarely, so that no compaction of its own, due at
        // once after a crash at `compaction-copied`, runs before the check.)
        let mut hourly = args;
        let interval = hourly.iter().position(|a| *a == "--prune-interval").expect("the test sets it") + 1;
        hourly[interval] = "1h";
        let server = Server::start(&data, &hourly);
        let live = generations(&data);
        let expected = if moves_on { before[0] + 1 } else { before[0] };
        assert_eq!(live, vec![expected], "{point}");
        let last = done.last().unwrap_or_else(|| panic!("{point}: no job ended before the crash"));
        let job = server.cli_json(&["job", last, "--json"]);
        assert_eq!(job["state"], "succeeded", "{point}: {}", job["tasks"][0]);
        assert_eq!(job["tasks"].as_array().map(Vec::len), Some(2_000));
        let parked = server.cli_json(&["job", &parked, "--json"]);
        assert!(matches!(parked["state"].as_str(), Some("pending" | "running")), "{point}: {parked}");
        let job = server.cli_json(&["submit", wide.to_str().unwrap(), "--wait", "--json"]);
        assert_eq!(job["state"], "succeeded", "{point}: the restarted server runs jobs: {}", job["tasks"][0]);
    }
}
