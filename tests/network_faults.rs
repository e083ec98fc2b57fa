//! Networks that fail, between real processes on hosts of their own
//! (network namespaces, `common/net.rs`): links cut and healed, hosts
//! partitioned from each other, one way or both. For each fault: the
//! reference model's final states, no task succeeding twice, never two
//! executions of one task at once (the execution log every worker appends
//! to), and progress again within a stated time once the fault heals.

mod common;
#[path = "common/net.rs"]
mod net;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{exec_events, executions, start_worker_with, wait_until, Process, Server};

/// The lease every worker here declares, and the heartbeat interval.
const LEASE: Duration = Duration::from_secs(3);

/// `n` independent `noop` tasks of `sleep_ms` each: the model's final
/// state is every task succeeded.
fn independent(n: usize, sleep_ms: u64) -> String {
    let tasks: Vec<String> = (0..n)
        .map(|i| format!(r#"{{"id":"t{i}","job_type":"noop","parameters":{{"sleep_ms":{sleep_ms}}}}}"#))
        .collect();
    format!(r#"{{"name":"independent","tasks":[{}]}}"#, tasks.join(","))
}

fn submit(server: &Server, dir: &Path, text: &str) -> String {
    let file = dir.join(format!("job-{}.json", uuid::Uuid::new_v4()));
    std::fs::write(&file, text).unwrap();
    let output = server.cli(&["submit", file.to_str().unwrap()]);
    assert!(output.status.success(), "submit: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).unwrap().trim().to_string()
}

/// Waits for the job to end and returns it.
fn ended(server: &Server, job: &str, limit: Duration) -> serde_json::Value {
    let mut last = serde_json::Value::Null;
    wait_until(limit, || {
        last = server.cli_json(&["job", job, "--json"]);
        matches!(last["state"].as_str(), Some("succeeded" | "failed" | "canceled")).then(|| last.clone())
    })
    .unwrap_or_else(|| panic!("job {job} did not end within {limit:?}: {last}"))
}

/// A worker on `host`, with the lease, logging to `dir/ID.log`.
fn worker(host: &net::Host, admin: &str, id: &str, dir: &Path, exec_log: &Path, slots: u32) -> Process {
    let lease = format!("{}ms", LEASE.as_millis());
    let slots = slots.to_string();
    let extra = ["--lease", &lease, "--max-execute", &slots];
    start_worker_with(&host.wrapper(), admin, id, &extra, Some(exec_log), &dir.join(format!("{id}.log")))
}

fn connected(server: &Server, id: &str) -> bool {
    server.workers().iter().any(|w| w["worker_id"].as_str() == Some(id) || w["id"].as_str() == Some(id))
}

/// A worker cut off (its host's link down at the router, the process alive)
/// for three times its lease, then healed. It gives its attempts up once
/// its lease runs out; the admin runs each again exactly once, not before
/// the lease has run out since the cut, and within lease + margin + a few
/// seconds; the worker's late reports on them are refused; once healed it
/// is back within 10 s.
#[test]
fn a_worker_cut_off_gives_its_attempts_up_and_each_runs_again_exactly_once() {
    let network = net::Network::new();
    let (admin_host, w1_host, w2_host) = (network.host("admin"), network.host("w1"), network.host("w2"));
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_wrapped(
        &admin_host.wrapper().iter().map(String::as_str).collect::<Vec<_>>(),
        &dir.path().join("data"),
        &admin_host.at(0),
        &["--allow-insecure-bind", "--heartbeat", "1s", "--orphan-grace", "10s", "--silence-timeout", "60s"],
    );
    let log = dir.path().join("exec.log");
    let _w1 = worker(&w1_host, &server.http, "w1", dir.path(), &log, 4);
    server.wait_for_workers(1);
    // Eight tasks of 8 s: w1 takes four, then w2 (started after) the rest.
    let job = submit(&server, dir.path(), &independent(8, 8_000));
    wait_until(Duration::from_secs(30), || (exec_events(&log, &job).len() >= 4).then_some(()))
        .expect("w1 started four tasks");
    let on_w1: Vec<String> = exec_events(&log, &job).into_iter().map(|(task, _, _)| task).collect();
    let _w2 = worker(&w2_host, &server.http, "w2", dir.path(), &log, 8);
    wait_until(Duration::from_secs(30), || {
        (exec_events(&log, &job).iter().filter(|e| e.2 == "start").count() >= 8).then_some(())
    })
    .expect("w2 started the other four");

    network.cut(&w1_host);
    let cut = Instant::now();
    // Each of w1's tasks runs again (attempt 2), on w2: when it starts.
    let mut again_at = None;
    wait_until(LEASE * 3, || {
        let events = exec_events(&log, &job);
        let again = on_w1.iter().all(|t| events.iter().any(|e| &e.0 == t && e.1 == 2 && e.2 == "start"));
        if again && again_at.is_none() {
            again_at = Some(cut.elapsed());
        }
        again_at
    })
    .unwrap_or_else(|| panic!("w1's tasks did not run again within {:?}: {:?}", LEASE * 3, exec_events(&log, &job)));
    let again_at = again_at.unwrap();
    let remaining = (LEASE * 3).saturating_sub(cut.elapsed());
    std::thread::sleep(remaining);
    network.heal(&w1_host);
    let healed = Instant::now();
    let back = wait_until(Duration::from_secs(10), || connected(&server, "w1").then(|| healed.elapsed()))
        .unwrap_or_else(|| panic!("w1 did not come back within 10 s of the heal: {:?}", server.workers()));

    let finished = ended(&server, &job, Duration::from_secs(60));
    assert_eq!(finished["state"], "succeeded", "{finished}");
    let events = exec_events(&log, &job);
    let counts = executions(&events);
    for (task, (starts, successes)) in &counts {
        assert_eq!(*successes, 1, "task {task} succeeded {successes} times: {events:?}");
        let expected = if on_w1.contains(task) { 2 } else { 1 };
        assert_eq!(*starts, expected, "task {task} ran {starts} times: {events:?}");
    }
    for task in &on_w1 {
        assert!(
            events.iter().any(|e| &e.0 == task && e.1 == 1 && e.2 == "abandoned"),
            "w1 did not give up task {task} once its lease ran out: {events:?}"
        );
    }
    // Not before w1's lease can have run out, and soon after the take-back.
    assert!(again_at >= LEASE, "w1's tasks ran again {again_at:?} after the cut, inside its lease");
    let bound = common_take_back(LEASE) + Duration::from_secs(5);
    assert!(again_at <= bound, "w1's tasks ran again only {again_at:?} after the cut (bound {bound:?})");
    // Its late reports on the attempts it gave up were refused.
    wait_until(Duration::from_secs(10), || {
        let text = std::fs::read_to_string(dir.path().join("w1.log")).unwrap_or_default();
        text.contains("the admin refused an outcome").then_some(())
    })
    .unwrap_or_else(|| {
        panic!("w1's late reports were not refused: {}", std::fs::read_to_string(dir.path().join("w1.log")).unwrap())
    });
    for task in finished["tasks"].as_array().unwrap() {
        let expected = if on_w1.iter().any(|t| Some(t.as_str()) == task["id"].as_str()) { 2 } else { 1 };
        assert_eq!(task["attempt"], expected, "{task}");
    }
    eprintln!(
        "worker cut off: its tasks ran again {again_at:?} after the cut (lease {LEASE:?}); back {back:?} after the heal"
    );
}

/// How long the admin keeps a silent worker's attempts: `wire::take_back_after`.
fn common_take_back(lease: Duration) -> Duration {
    jobcenter::wire::take_back_after(lease)
}
