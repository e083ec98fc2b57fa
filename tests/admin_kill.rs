//! The admin killed at random moments, and crashed on purpose at named
//! points (after a write before its flush, after a flush before anything is
//! acknowledged or dispatched), over and over during a 2,000-task layered
//! job; workers keep executing, reconnect by themselves and report what they
//! ran. The job ends as the reference model says, nothing acknowledged is
//! lost, nothing that succeeded runs again, and the kills cost no execution:
//! every task runs as often as its own outcomes ask (once, twice for a task
//! that fails once and is retried), never more.
//! `JOBCENTER_ADMIN_KILLS=N` sets the number of restarts (default 20),
//! `JOBCENTER_ADMIN_KILL_TASKS=N` the size of the job (default 2,000), and
//! `JOBCENTER_ADMIN_KILL_SHELL_MS=N` makes every task a shell command of N ms
//! instead of an in-process sleep of 20 to 80 ms: the soak is 200 kills of a
//! 10,000-task job of 150 ms shell tasks.

mod common;
#[path = "common/postgres.rs"]
mod pg;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::{exec_events, start_worker, wait_until, Server};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The job, and each task's parents, whether it always fails, and whether it fails once.
fn layered_job(
    rng: &mut Rng,
    n: usize,
    width: usize,
    shell_ms: Option<u64>,
) -> (String, Vec<Vec<usize>>, Vec<bool>, Vec<bool>) {
    let mut parents = Vec::new();
    let mut fails = Vec::new();
    let mut flakies = Vec::new();
    let mut tasks = Vec::new();
    for i in 0..n {
        let layer = i / width;
        let mut deps: Vec<usize> = Vec::new();
        if layer > 0 {
            while deps.len() < 3 {
                let d = (layer - 1) * width + rng.below(width as u64) as usize;
                if !deps.contains(&d) {
                    deps.push(d);
                }
            }
        }
        let fail = layer >= n / width - 4 && rng.below(200) == 0;
        let flaky = !fail && rng.below(100) == 0;
        let sleep = 20 + rng.below(60);
        let params = if fail {
            format!(r#"{{"fail":true,"sleep_ms":{sleep}}}"#)
        } else if flaky {
            format!(r#"{{"fail_attempts":1,"sleep_ms":{sleep}}}"#)
        } else {
            format!(r#"{{"sleep_ms":{sleep}}}"#)
        };
        let (job_type, params) = match shell_ms {
            None => ("noop", params),
            Some(ms) => {
                let seconds = ms as f64 / 1000.0;
                let command = if fail {
                    format!("sleep {seconds}; exit 1")
                } else if flaky {
                    format!("sleep {seconds}; [ \"$JOBCENTER_ATTEMPT\" -gt 1 ]")
                } else {
                    format!("sleep {seconds}")
                };
                ("shell", serde_json::json!({ "command": command }).to_string())
            }
        };
        let deps_json: Vec<String> = deps.iter().map(|d| format!("\"t{d}\"")).collect();
        let retry = if flaky { r#","retry_limit":1,"retry_backoff_seconds":0"# } else { "" };
        tasks.push(format!(
            r#"{{"id":"t{i}","job_type":"{job_type}","parameters":{params},"depends_on":[{}]{retry}}}"#,
            deps_json.join(",")
        ));
        parents.push(deps);
        fails.push(fail);
        flakies.push(flaky);
    }
    (format!(r#"{{"name":"admin-kill","tasks":[{}]}}"#, tasks.join(",")), parents, fails, flakies)
}

/// Expected final state of every task.
fn model(parents: &[Vec<usize>], fails: &[bool]) -> Vec<&'static str> {
    let mut states: Vec<&'static str> = Vec::with_capacity(parents.len());
    for (i, deps) in parents.iter().enumerate() {
        let state = if deps.iter().any(|&p| states[p] != "succeeded") {
            "upstream_failed"
        } else if fails[i] {
            "failed"
        } else {
            "succeeded"
        };
        states.push(state);
    }
    states
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
fn the_admin_killed_over_and_over_still_finishes_the_job_exactly() {
    admin_killed(&[]);
}

#[test]
fn the_admin_killed_over_and_over_on_postgres_still_finishes_the_job_exactly() {
    let cluster = pg::shared();
    let database = cluster.new_database();
    admin_killed(&["--database-url".into(), cluster.url(&database)]);
}

/// The admin killed over and over during a layered job, keeping its data
/// where `store` says (a data directory by default).
fn admin_killed(store: &[String]) {
    let kills: usize = std::env::var("JOBCENTER_ADMIN_KILLS").ok().and_then(|k| k.parse().ok()).unwrap_or(20);
    let seed: u64 = std::env::var("JOBCENTER_KILL_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5eed_cafe);
    let mut rng = Rng(seed);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (http_port, grpc_port) = (free_port(), free_port());
    let http = format!("127.0.0.1:{http_port}");
    let grpc = grpc_port.to_string();
    // Workers keep running through the kills for their lease (10 s); the
    // admin waits a little longer for them (12.5 s) within its orphan grace
    // and silence timeout (15 s).
    let mut server_args = vec![
        "--grpc",
        grpc.as_str(),
        "--silence-timeout",
        "15s",
        "--heartbeat",
        "1s",
        "--recovery-interval",
        "1s",
        "--orphan-grace",
        "15s",
    ];
    server_args.extend(store.iter().map(String::as_str));
    let start = |crash: Option<String>| {
        if let Some(crash) = &crash {
            std::env::set_var("JOBCENTER_CRASH_AT", crash);
        } else {
            std::env::remove_var("JOBCENTER_CRASH_AT");
        }
        let server = Server::start_on(&data, &http, &server_args);
        std::env::remove_var("JOBCENTER_CRASH_AT");
        server
    };

    let n_tasks: usize = std::env::var("JOBCENTER_ADMIN_KILL_TASKS").ok().and_then(|n| n.parse().ok()).unwrap_or(2000);
    let shell_ms: Option<u64> = std::env::var("JOBCENTER_ADMIN_KILL_SHELL_MS").ok().and_then(|n| n.parse().ok());
    let (text, parents, fails, flaky) = layered_job(&mut rng, n_tasks, 100, shell_ms);
    let expected = model(&parents, &fails);
    let log = dir.path().join("exec.log");
    let mut server = start(None);
    let worker_args = ["--max-execute", "4", "--lease", "10s"];
    let _workers: Vec<_> = (0..2).map(|n| start_worker(&server, &format!("w{n}"), &worker_args, Some(&log))).collect();
    server.wait_for_workers(2);
    let file = dir.path().join("job.json");
    std::fs::write(&file, text).unwrap();
    let output = server.cli(&["submit", file.to_str().unwrap()]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let job_id = String::from_utf8(output.stdout).unwrap().trim().to_string();

    let points = ["before-flush", "after-flush"];
    let (mut landed, mut crashes) = (0, 0);
    for round in 0..kills {
        let finished = || {
            let job = server_state(&http, &job_id);
            matches!(job.as_deref(), Some("succeeded" | "failed"))
        };
        if round % 3 == 2 {
            // Crash on purpose at a named point, a few commits from now.
            server.process.kill();
            let point = points[rng.below(2) as usize];
            let n = 1 + rng.below(20);
            server = start(Some(format!("{point}:{n}")));
            let died = wait_until(Duration::from_secs(20), || (!server.process.is_running()).then_some(()));
            if died.is_some() {
                crashes += 1;
                landed += 1;
            }
        } else {
            std::thread::sleep(Duration::from_millis(200 + rng.below(600)));
            if finished() {
                break;
            }
            server.process.kill();
            landed += 1;
        }
        server = start(None);
    }
    let last_start = Instant::now();
    eprintln!("{landed} admin kills ({crashes} at named crash points)");
    assert!(landed >= kills * 2 / 3, "only {landed} kills landed");

    // The work left after the last restart, on 8 slots, with room to spare.
    let work_left = Duration::from_millis(n_tasks as u64 * shell_ms.unwrap_or(50) / 4);
    let done = wait_until(Duration::from_secs(180) + work_left, || {
        let job = server.cli_json(&["job", &job_id, "--json"]);
        matches!(job["state"].as_str(), Some("succeeded" | "failed")).then_some(job)
    })
    .expect("the job ends after the last restart");
    eprintln!("the job ended {:?} after the last restart", last_start.elapsed());

    // Final states as the model says.
    let tasks = done["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), n_tasks);
    let mut mismatches = Vec::new();
    for task in tasks {
        let id = task["id"].as_str().unwrap();
        let idx: usize = id[1..].parse().unwrap();
        if task["state"] != expected[idx] {
            mismatches.push(format!("{id}: {} (expected {})", task["state"], expected[idx]));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} tasks differ from the model: {:?}",
        mismatches.len(),
        &mismatches[..mismatches.len().min(10)]
    );
    let expected_job = if expected.iter().all(|s| *s == "succeeded") { "succeeded" } else { "failed" };
    assert_eq!(done["state"], expected_job);

    // Executions: no attempt started twice, none past the final attempt, and
    // nothing started again once a child had started (the parent's success was durable).
    let events = exec_events(&log, &job_id);
    let final_attempt: BTreeMap<&str, u64> =
        tasks.iter().map(|t| (t["id"].as_str().unwrap(), t["attempt"].as_u64().unwrap())).collect();
    let mut started: BTreeSet<(String, u32)> = BTreeSet::new();
    let mut first_start: BTreeMap<String, usize> = BTreeMap::new();
    let mut last_start: BTreeMap<String, usize> = BTreeMap::new();
    for (line, (task, attempt, event)) in events.iter().enumerate() {
        if event != "start" {
            continue;
        }
        assert!(started.insert((task.clone(), *attempt)), "{task} attempt {attempt} started twice");
        assert!(
            u64::from(*attempt) <= final_attempt[task.as_str()],
            "{task} started attempt {attempt} past its final one"
        );
        first_start.entry(task.clone()).or_insert(line);
        last_start.insert(task.clone(), line);
    }
    for (i, deps) in parents.iter().enumerate() {
        let Some(&child_first) = first_start.get(&format!("t{i}")) else { continue };
        for &p in deps {
            let parent = format!("t{p}");
            let parent_last = last_start[&parent];
            assert!(parent_last < child_first, "{parent} started again after its child t{i} had started");
        }
    }
    for task in tasks.iter().filter(|t| t["state"] == "upstream_failed") {
        let id = task["id"].as_str().unwrap();
        assert!(!first_start.contains_key(id), "{id} ended upstream_failed but ran");
    }

    // Executions: as many as each task's own outcomes ask for. A kill makes
    // none run again: workers keep what they run and report it when the
    // admin is back, and an outcome not yet durable is reported again.
    let mut executions: BTreeMap<&str, usize> = BTreeMap::new();
    for (task, _, event) in &events {
        if event == "start" {
            *executions.entry(task.as_str()).or_default() += 1;
        }
    }
    let mut reruns = Vec::new();
    for (i, state) in expected.iter().enumerate() {
        let id = format!("t{i}");
        // A flaky task fails its first attempt only. An attempt 1 that was
        // assigned but never reached its worker before a kill (taken back
        // uncounted) leaves attempt 2 to succeed at its first execution.
        let first_attempt_ran = events.iter().any(|(t, attempt, e)| *t == id && *attempt == 1 && e == "start");
        let asked = match *state {
            "upstream_failed" => 0,
            _ if flaky[i] && first_attempt_ran => 2,
            _ => 1,
        };
        let ran = executions.get(id.as_str()).copied().unwrap_or(0);
        if ran != asked {
            let mine: Vec<_> = events.iter().filter(|e| e.0 == id).collect();
            reruns.push(format!("{id}: ran {ran} times, its outcomes ask for {asked}: {mine:?}"));
        }
    }
    let total: usize = executions.values().sum();
    let ran_tasks = expected.iter().filter(|s| **s != "upstream_failed").count();
    eprintln!(
        "{total} executions for {ran_tasks} tasks that ran ({:.3} per task); {} re-runs",
        total as f64 / ran_tasks as f64,
        reruns.len()
    );
    assert!(reruns.is_empty(), "the kills made tasks run again: {reruns:?}");
}

/// The job's state, if the server answers.
fn server_state(http: &str, job: &str) -> Option<String> {
    let mut command = std::process::Command::new(common::binary());
    command.args(["job", job, "--json", "--admin", http]);
    let output = common::run_with_timeout(command, Duration::from_secs(30));
    let value: serde_json::Value = serde_json::from_slice(&output.stdout).ok()?;
    value["state"].as_str().map(String::from)
}
