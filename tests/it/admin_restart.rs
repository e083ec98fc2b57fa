//! The admin restarted under running work: workers keep executing through
//! admin SIGKILLs and report to the restarted admin, which adopts what they
//! run instead of running it again; what a kept attempt holds (its volume,
//! its deadline) is rebuilt before anything is dispatched; and a worker cut
//! off from every admin for longer than its lease gives its work up before
//! the admin runs it elsewhere, so no attempt ever runs twice at once.

use crate::support;
use crate::support::proxy;

use std::path::Path;
use std::time::{Duration, Instant};

use support::{exec_events, free_port, start_worker, wait_until, Process, Server};

/// A server on fixed loopback ports, so that workers find it again after a restart.
struct Admin {
    data: std::path::PathBuf,
    http: String,
    args: Vec<String>,
    server: Option<Server>,
}

impl Admin {
    fn start(dir: &Path, extra: &[&str]) -> Admin {
        let (http, grpc) = (format!("127.0.0.1:{}", free_port()), free_port().to_string());
        let mut args: Vec<String> = vec!["--grpc".into(), grpc, "--heartbeat".into(), "1s".into()];
        args.extend(extra.iter().map(|a| a.to_string()));
        let mut admin = Admin { data: dir.join("data"), http, args, server: None };
        admin.restart();
        admin
    }

    /// SIGKILLs the admin, leaving it down until `restart`.
    fn kill(&mut self) {
        if let Some(mut server) = self.server.take() {
            server.process.kill();
        }
    }

    fn server(&self) -> &Server {
        self.server.as_ref().expect("the admin runs")
    }

    /// SIGKILLs the admin if it runs, and starts it again on the same ports and data.
    fn restart(&mut self) -> Instant {
        if let Some(mut server) = self.server.take() {
            server.process.kill();
        }
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        self.server = Some(Server::start_on(&self.data, &self.http, &args));
        Instant::now()
    }

    fn submit(&self, dir: &Path, name: &str, text: &str) -> String {
        self.server().submit_file(dir, name, text)
    }

    fn job(&self, id: &str) -> serde_json::Value {
        self.server().cli_json(&["job", id, "--json"])
    }

    fn wait_for_end(&self, id: &str, limit: Duration) -> serde_json::Value {
        wait_until(limit, || {
            let job = self.job(id);
            matches!(job["state"].as_str(), Some("succeeded" | "failed" | "canceled")).then_some(job)
        })
        .unwrap_or_else(|| panic!("job {id} did not end: {}", self.job(id)))
    }
}

fn starts(log: &Path, job: &str) -> usize {
    exec_events(log, job).iter().filter(|e| e.2 == "start").count()
}

fn wait_for_starts(log: &Path, job: &str, n: usize) {
    wait_until(Duration::from_secs(30), || (starts(log, job) >= n).then_some(()))
        .unwrap_or_else(|| panic!("{n} executions did not start: {:?}", exec_events(log, job)));
}

/// Each task started exactly once, as attempt 1, and succeeded once.
fn ran_exactly_once(log: &Path, job: &serde_json::Value) {
    let id = job["id"].as_str().unwrap();
    let events = exec_events(log, id);
    for task in job["tasks"].as_array().unwrap() {
        let task_id = task["id"].as_str().unwrap();
        let mine: Vec<(u32, &str)> = events.iter().filter(|e| e.0 == task_id).map(|e| (e.1, e.2.as_str())).collect();
        assert_eq!(mine, [(1, "start"), (1, "succeeded")], "task {task_id}: {events:?}");
        assert_eq!(task["attempt"], 1, "{task}");
        assert_eq!(task["lost"], 0, "{task}");
    }
}

#[test]
fn four_admin_restarts_under_six_running_tasks_cost_no_execution() {
    let dir = tempfile::tempdir().unwrap();
    let mut admin = Admin::start(dir.path(), &["--recovery-interval", "1s"]);
    let log = dir.path().join("exec.log");
    let _workers: Vec<Process> =
        (0..2).map(|n| start_worker(admin.server(), &format!("w{n}"), &["--max-execute", "3"], Some(&log))).collect();
    admin.server().wait_for_workers(2);
    let tasks: Vec<String> =
        (0..6).map(|i| format!(r#"{{"id":"t{i}","job_type":"shell","parameters":{{"command":"sleep 8"}}}}"#)).collect();
    let submitted = Instant::now();
    let id = admin.submit(dir.path(), "six", &format!(r#"{{"name":"six","tasks":[{}]}}"#, tasks.join(",")));
    wait_for_starts(&log, &id, 6);
    for _ in 0..4 {
        std::thread::sleep(Duration::from_millis(1500));
        admin.restart();
    }
    let done = admin.wait_for_end(&id, Duration::from_secs(60));
    let took = submitted.elapsed();
    eprintln!("six 8 s tasks through 4 admin restarts ended after {took:?}");
    assert_eq!(done["state"], "succeeded", "{done}");
    ran_exactly_once(&log, &done);
    assert!(took < Duration::from_secs(8 + 5), "the job took {took:?} for 8 s of work");
}

#[test]
fn three_restarts_during_one_long_task_keep_its_first_attempt() {
    let dir = tempfile::tempdir().unwrap();
    let mut admin = Admin::start(dir.path(), &["--recovery-interval", "1s"]);
    let log = dir.path().join("exec.log");
    let _worker = start_worker(admin.server(), "w", &[], Some(&log));
    admin.server().wait_for_workers(1);
    let id = admin.submit(
        dir.path(),
        "long",
        r#"{"name":"long","tasks":[{"id":"long","job_type":"shell","parameters":{"command":"sleep 10"}}]}"#,
    );
    wait_for_starts(&log, &id, 1);
    let mut reports_applied = Vec::new();
    for _ in 0..3 {
        std::thread::sleep(Duration::from_millis(2000));
        let restarted = admin.restart();
        // The worker's report of what it runs is applied once it is back.
        let adopted = wait_until(Duration::from_secs(20), || {
            let log = std::fs::read_to_string(&admin.server().log).unwrap_or_default();
            (log.matches("worker's running work reconciled").count() > reports_applied.len()).then_some(())
        });
        assert!(adopted.is_some(), "the worker reported its running work to the restarted admin");
        reports_applied.push(restarted.elapsed());
    }
    eprintln!("from an admin restart to the worker's report applied: {reports_applied:?}");
    let done = admin.wait_for_end(&id, Duration::from_secs(30));
    assert_eq!(done["state"], "succeeded", "{done}");
    ran_exactly_once(&log, &done);
}

#[test]
fn a_kept_attempt_still_holds_its_volume_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut admin = Admin::start(dir.path(), &[]);
    let log = dir.path().join("exec.log");
    let _workers: Vec<Process> =
        (0..2).map(|n| start_worker(admin.server(), &format!("w{n}"), &[], Some(&log))).collect();
    admin.server().wait_for_workers(2);
    let first = admin.submit(
        dir.path(),
        "first",
        r#"{"name":"first","tasks":[{"id":"first","job_type":"shell","parameters":{"command":"sleep 5"},"labels":{"volume_id":"7"}}]}"#,
    );
    wait_for_starts(&log, &first, 1);
    admin.restart();
    admin.server().wait_for_workers(2);
    let second = admin.submit(
        dir.path(),
        "second",
        r#"{"name":"second","tasks":[{"id":"second","job_type":"shell","parameters":{"command":"true"},"labels":{"volume_id":"7"}}]}"#,
    );
    let first_done = admin.wait_for_end(&first, Duration::from_secs(30));
    let second_done = admin.wait_for_end(&second, Duration::from_secs(30));
    assert_eq!((first_done["state"].as_str(), second_done["state"].as_str()), (Some("succeeded"), Some("succeeded")));
    ran_exactly_once(&log, &first_done);
    // In the shared execution log, the first task ended before the second started.
    let lines = std::fs::read_to_string(&log).unwrap();
    let position =
        |needle: &str| lines.lines().position(|l| l == needle).unwrap_or_else(|| panic!("{needle} in {lines}"));
    assert!(
        position(&format!("{first} first 1 succeeded")) < position(&format!("{second} second 1 start")),
        "the second task on volume 7 started while the kept one ran:\n{lines}"
    );
}

/// An admin and one worker, running one `shell` task `sleep 60` whose own
/// execution timeout is `timeout_seconds`: the admin, the worker, the
/// execution log and the job id, once the task has started.
fn a_slow_task_running(dir: &Path, timeout_seconds: u32) -> (Admin, Process, std::path::PathBuf, String) {
    let admin = Admin::start(dir, &[]);
    let log = dir.join("exec.log");
    let worker = start_worker(admin.server(), "w", &[], Some(&log));
    admin.server().wait_for_workers(1);
    let text = format!(
        r#"{{"name":"slow","tasks":[{{"id":"slow","job_type":"shell","parameters":{{"command":"sleep 60"}},"execution_timeout_seconds":{timeout_seconds}}}]}}"#
    );
    let id = admin.submit(dir, "slow", &text);
    wait_for_starts(&log, &id, 1);
    (admin, worker, log, id)
}

#[test]
fn a_kept_attempt_still_times_out_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (mut admin, _worker, log, id) = a_slow_task_running(dir.path(), 4);
    let started = Instant::now();
    std::thread::sleep(Duration::from_secs(1));
    admin.restart();
    let done = admin.wait_for_end(&id, Duration::from_secs(25));
    let took = started.elapsed();
    assert_eq!(done["state"], "failed", "{done}");
    assert_eq!(done["tasks"][0]["error"], "execution timed out after 4 s", "{done}");
    assert!(took < Duration::from_secs(10), "the timeout of 4 s ended the attempt after {took:?}");
    let events = exec_events(&log, &id);
    assert_eq!(events.iter().filter(|e| e.2 == "start").count(), 1, "{events:?}");
}

#[test]
fn a_worker_ends_an_attempt_at_its_task_s_own_timeout_while_no_admin_is_there() {
    let dir = tempfile::tempdir().unwrap();
    let (mut admin, _worker, log, id) = a_slow_task_running(dir.path(), 3);
    let started = Instant::now();
    admin.kill();
    // The work order carried the task's own timeout: the worker keeps the
    // attempt through the admin's absence and ends it on time by itself.
    let ended = wait_until(Duration::from_secs(20), || {
        exec_events(&log, &id).iter().any(|e| e.2 != "start").then(|| started.elapsed())
    });
    let events = exec_events(&log, &id);
    let took = ended.unwrap_or_else(|| panic!("the attempt did not end while the admin was down: {events:?}"));
    assert!(events.iter().any(|e| e.2 == "failed"), "{events:?}");
    assert!(took < Duration::from_secs(8), "the timeout of 3 s ended the attempt after {took:?}");
    admin.restart();
    let done = admin.wait_for_end(&id, Duration::from_secs(25));
    assert_eq!(done["state"], "failed", "{done}");
    assert_eq!(done["tasks"][0]["error"], "execution timed out after 3 s", "{done}");
    assert_eq!(exec_events(&log, &id).iter().filter(|e| e.2 == "start").count(), 1);
}

/// Attempt number and time (ms) of every line a running attempt writes, every 100 ms.
fn stamps(path: &Path) -> Vec<(u32, u64)> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let (attempt, at) = line.split_once(' ')?;
            Some((attempt.parse().ok()?, at.trim().parse().ok()?))
        })
        .collect()
}

#[test]
fn a_worker_cut_off_past_its_lease_gives_its_attempt_up_before_it_runs_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    let admin =
        Admin::start(dir.path(), &["--silence-timeout", "5s", "--orphan-grace", "5s", "--recovery-interval", "500ms"]);
    let log = dir.path().join("exec.log");
    let proxy = proxy::Proxy::start(&admin.server().grpc);
    let via_proxy = format!("grpc://{}", proxy.address);
    let _cut_off = start_worker(
        admin.server(),
        "cut-off",
        &["--admin", &via_proxy, "--lease", "2s", "--max-execute", "1"],
        Some(&log),
    );
    admin.server().wait_for_workers(1);
    let stamp_file = dir.path().join("stamps");
    let command = format!(
        "for i in $(seq 60); do echo \"$JOBCENTER_ATTEMPT $(date +%s%3N)\" >> {}; sleep 0.1; done",
        stamp_file.display()
    );
    let text = serde_json::json!({
        "name": "cut",
        "tasks": [{"id": "work", "job_type": "shell", "parameters": {"command": command}}]
    });
    let id = admin.submit(dir.path(), "cut", &text.to_string());
    wait_until(Duration::from_secs(20), || (!stamps(&stamp_file).is_empty()).then_some(()))
        .expect("the first attempt runs on the worker behind the proxy");
    let _healthy = start_worker(admin.server(), "healthy", &["--max-execute", "1", "--lease", "2s"], Some(&log));
    admin.server().wait_for_workers(2);
    proxy.freeze();
    let second = wait_until(Duration::from_secs(30), || (admin.job(&id)["tasks"][0]["attempt"] == 2).then_some(()));
    assert!(second.is_some(), "the cut-off worker's attempt was resubmitted: {}", admin.job(&id));
    // Let the cut-off worker reach the admin again: it reports the attempt it gave up.
    std::thread::sleep(Duration::from_secs(2));
    proxy.thaw();
    let done = admin.wait_for_end(&id, Duration::from_secs(40));
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(done["tasks"][0]["attempt"], 2, "resubmitted exactly once: {done}");
    assert_eq!(done["tasks"][0]["lost"], 1, "{done}");
    let events = exec_events(&log, &id);
    assert!(events.contains(&("work".into(), 1, "abandoned".into())), "the cut-off worker gave up: {events:?}");
    let successes: Vec<u32> = events.iter().filter(|e| e.2 == "succeeded").map(|e| e.1).collect();
    assert_eq!(successes, [2], "exactly one attempt succeeded: {events:?}");
    // Never two copies at once: the first attempt's last sign of life comes
    // before the second attempt's first.
    let stamps = stamps(&stamp_file);
    let first_last = stamps.iter().filter(|s| s.0 == 1).map(|s| s.1).max().unwrap();
    let second_first = stamps.iter().filter(|s| s.0 == 2).map(|s| s.1).min().expect("the second attempt ran");
    assert!(first_last < second_first, "attempt 1 ran until {first_last}, attempt 2 began at {second_first}");
    // Its late report was refused by the admin.
    let wait_for_refusal = wait_until(Duration::from_secs(20), || {
        let server_log = std::fs::read_to_string(&admin.server().log).unwrap_or_default();
        server_log.contains("report refused").then_some(())
    });
    assert!(wait_for_refusal.is_some(), "the late report of attempt 1 was refused");
}
