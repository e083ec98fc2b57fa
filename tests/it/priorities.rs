//! Priorities and rate limits with real processes: one worker slot shared
//! by two job types, taken by the first by priority over both; a job's
//! priority changed while it waits; the policy's default; refusals; a
//! rate limit that spaces the starts of a type.

use crate::support;

use std::time::Duration;

use support::{start_worker, wait_until, Server};

fn job(name: &str, job_type: &str, priority: Option<&str>, tasks: usize, sleep_ms: u64) -> String {
    let parameters = match job_type {
        "noop" => serde_json::json!({ "sleep_ms": sleep_ms }),
        _ => serde_json::json!({ "argv": ["sleep", format!("{}", sleep_ms as f64 / 1000.0)] }),
    };
    let tasks: Vec<serde_json::Value> = (0..tasks)
        .map(|i| serde_json::json!({ "id": format!("{name}-{i}"), "job_type": job_type, "parameters": parameters }))
        .collect();
    let mut file = serde_json::json!({ "name": name, "tasks": tasks });
    if let Some(priority) = priority {
        file["priority"] = priority.into();
    }
    file.to_string()
}

fn wait_ended(server: &Server, id: &str) -> serde_json::Value {
    wait_until(Duration::from_secs(60), || {
        let job = server.cli_json(&["job", id, "--json"]);
        (job["state"] == "succeeded").then_some(job)
    })
    .unwrap_or_else(|| panic!("job {id} did not succeed: {}", server.cli_json(&["job", id, "--json"])))
}

/// (start, task id) of every task of the jobs, in the order they started.
fn start_order(jobs: &[&serde_json::Value]) -> Vec<(i64, String)> {
    let mut starts: Vec<(i64, String)> = jobs
        .iter()
        .flat_map(|job| job["tasks"].as_array().unwrap().iter())
        .map(|t| (t["started_at_ms"].as_i64().unwrap(), t["id"].as_str().unwrap().to_string()))
        .collect();
    starts.sort();
    starts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_slot_goes_to_the_first_by_priority_over_every_job_type() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &[]);
    let _worker = start_worker(&server, "one-slot", &["--max-execute", "1", "--job-types", "noop,shell"], None);
    server.wait_for_workers(1);
    assert!(server.cli(&["policy", "set", "shell", "global_execution_concurrency=4"]).status.success());
    assert!(server.cli(&["policy", "set", "noop", "global_execution_concurrency=4"]).status.success());
    // Tasks of shell that name no priority take the policy's.
    let set = server.cli(&["policy", "set", "shell", "priority=high"]);
    assert!(set.status.success(), "{}", String::from_utf8_lossy(&set.stderr));

    // The slot is busy while the others queue up.
    let blocker = server.submit_file(dir.path(), "blocker.json", &job("blocker", "noop", None, 1, 1500));
    let blocker_started = wait_until(Duration::from_secs(20), || {
        (server.cli_json(&["job", &blocker, "--json"])["tasks"][0]["state"] == "running").then_some(())
    });
    assert!(blocker_started.is_some());
    let low = server.submit_file(dir.path(), "low.json", &job("low", "noop", Some("low"), 3, 50));
    let normal = server.submit_file(dir.path(), "normal.json", &job("normal", "noop", None, 2, 50));
    let high = server.submit_file(dir.path(), "high.json", &job("high", "shell", None, 2, 50));
    let shown = server.cli_json(&["job", &high, "--json"]);
    assert_eq!(shown["priority"], "high", "from the shell policy: {shown}");
    assert_eq!(shown["tasks"][0]["priority"], "high");
    assert_eq!(server.cli_json(&["job", &low, "--json"])["priority"], "low", "from the job file");

    // While it waits, the low job becomes critical: it goes first now.
    let output = server.cli(&["job", &low, "--priority", "critical"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(String::from_utf8_lossy(&output.stdout).contains("priority critical"));
    let table = server.cli(&["job", &low]);
    assert!(String::from_utf8_lossy(&table.stdout).contains("(priority critical)"), "{table:?}");

    let jobs: Vec<serde_json::Value> =
        [&blocker, &low, &normal, &high].iter().map(|id| wait_ended(&server, id)).collect();
    let order: Vec<String> = start_order(&jobs.iter().collect::<Vec<_>>()).into_iter().map(|(_, id)| id).collect();
    let prefixes: Vec<&str> = order.iter().map(|id| id.split('-').next().unwrap()).collect();
    assert_eq!(
        prefixes,
        ["blocker", "low", "low", "low", "high", "high", "normal", "normal"],
        "critical, then high over both job types, then normal: {order:?}"
    );
    assert_eq!(jobs[1]["priority"], "low", "an operator's priority lasts while the job runs");

    // An ended job keeps its priority no more: a change is refused, and
    // nothing is written; so are a priority that is none and an unknown job.
    let ended = server.cli(&["job", &low, "--priority", "low"]);
    assert!(!ended.status.success());
    assert!(String::from_utf8_lossy(&ended.stderr).contains("ended"), "{ended:?}");
    let bad = server.cli(&["job", &normal, "--priority", "urgent"]);
    assert!(!bad.status.success());
    assert_eq!(
        String::from_utf8_lossy(&bad.stderr).trim(),
        "jobcenter: priority: \"urgent\" is not a priority; priorities are low, normal, high, critical"
    );
    let unknown = server.cli(&["job", "0190c4a0-0000-7000-8000-000000000000", "--priority", "high"]);
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("unknown job"), "{unknown:?}");

    // Each change is in the audit trail, refusals with their reason.
    let records = server.cli_json(&["audit", "--json"]);
    let changes: Vec<&serde_json::Value> =
        records.as_array().unwrap().iter().filter(|r| r["action"] == "job.priority").collect();
    assert_eq!(changes.len(), 4, "{changes:#?}");
    assert_eq!((&changes[0]["target"], &changes[0]["outcome"]), (&low.as_str().into(), &"ok".into()));
    assert_eq!(changes[0]["args"]["priority"], "critical");
    assert!(changes[1]["outcome"].as_str().unwrap().contains("ended"), "{:?}", changes[1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_priority_given_while_waiting_outlives_a_restart_of_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut server = Server::start(&data, &[]);
    let id = server.submit_file(dir.path(), "waits.json", &job("waits", "noop", None, 2, 10));
    assert!(server.cli(&["job", &id, "--priority", "high"]).status.success());
    server.process.kill();
    let server = Server::start(&data, &[]);
    assert_eq!(server.cli_json(&["job", &id, "--json"])["priority"], "high");
    let _worker = start_worker(&server, "late", &["--job-types", "noop"], None);
    let ended = wait_ended(&server, &id);
    assert_eq!(ended["tasks"][1]["priority"], "normal", "once ended, the tasks show their own again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_spaces_the_starts_of_a_job_type_after_its_burst() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &[]);
    let _worker = start_worker(&server, "wide", &["--max-execute", "8", "--job-types", "noop"], None);
    server.wait_for_workers(1);
    let refused = server.cli(&["policy", "set", "noop", "rate_burst=0"]);
    assert!(String::from_utf8_lossy(&refused.stderr).contains("rate_burst must be at least 1"), "{refused:?}");
    let set =
        server.cli(&["policy", "set", "noop", "global_execution_concurrency=8", "rate_per_minute=60", "rate_burst=2"]);
    assert!(set.status.success(), "{}", String::from_utf8_lossy(&set.stderr));
    let policy = server.cli_json(&["policy", "get", "noop", "--json"]);
    assert_eq!((&policy["rate_per_minute"], &policy["rate_burst"]), (&60.into(), &2.into()), "{policy}");

    let id = server.submit_file(dir.path(), "five.json", &job("five", "noop", None, 5, 10));
    let job = wait_ended(&server, &id);
    let starts: Vec<i64> = start_order(&[&job]).into_iter().map(|(at, _)| at).collect();
    // A burst of two, then one a second: the fifth starts three seconds
    // after the first at the earliest (less what the start reports'
    // delivery may differ by).
    assert!(starts[4] - starts[0] >= 2_900, "{starts:?}");
    assert!(starts[2] - starts[0] >= 900, "{starts:?}");
}

/// An instance on the shared database, beating every second.
fn member(dir: &std::path::Path, name: &str, url: &str) -> Server {
    let free = crate::support::free_port;
    let (http, grpc) = (format!("127.0.0.1:{}", free()), free().to_string());
    let args = ["--database-url", url, "--grpc", &grpc, "--cluster-heartbeat", "1s", "--lag-threshold", "4s"];
    Server::start_wrapped(&[], &dir.join(name), &http, &args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_priority_set_through_any_instance_reaches_the_one_leading_the_job() {
    use support::postgres::shared as pg;
    let dir = tempfile::tempdir().unwrap();
    let database = pg().new_database();
    let url = pg().url(&database);
    let a = member(dir.path(), "a", &url);
    let b = member(dir.path(), "b", &url);
    let both = wait_until(Duration::from_secs(20), || {
        let instances = a.cli_json(&["instances", "--json"]);
        (instances.as_array().unwrap().iter().filter(|i| i["status"] == "active").count() == 2).then_some(())
    });
    assert!(both.is_some(), "two instances did not register");
    // No worker: the job waits, led by a.
    let id = a.submit_file(dir.path(), "waits.json", &job("waits", "noop", None, 2, 10));
    let output = b.cli(&["job", &id, "--priority", "critical"]);
    assert!(output.status.success(), "through b: {}", String::from_utf8_lossy(&output.stderr));
    for server in [&a, &b] {
        assert_eq!(server.cli_json(&["job", &id, "--json"])["priority"], "critical");
    }
    let records = b.cli_json(&["audit", "--json"]);
    let change = records.as_array().unwrap().iter().find(|r| r["action"] == "job.priority").cloned();
    let change = change.unwrap_or_else(|| panic!("no job.priority record: {records}"));
    assert_eq!(change["outcome"], "ok", "{change}");
    let _worker = start_worker(&b, "late", &["--job-types", "noop"], None);
    let ended = wait_ended(&b, &id);
    assert_eq!(ended["state"], "succeeded");
}
