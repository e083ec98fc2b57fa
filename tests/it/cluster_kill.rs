//! Several admin instances on one real PostgreSQL, with the instance leading
//! a 10,000-task layered job SIGKILLed while three worker processes run it:
//! its leadership moves within the lag threshold plus one heartbeat, workers
//! that lost their instance carry on through another one and their attempts
//! are adopted there, and the job ends as the reference model says with no
//! task succeeding twice. With 2 of 3 instances killed, the survivor
//! finishes the job, keeps the recovery check running, and a client waiting
//! through `--admin A,B,C` follows the job to its end. A worker that
//! reaches another instance while its dead leader is still listed as live
//! keeps its attempts, or, with a lease too short to wait, gives them back
//! to run again rather than fail them. The soak (`--ignored`) kills instances over and
//! over: `JOBCENTER_CLUSTER_KILLS=N` (default 100) kills spread over 3
//! instances, each started again at once under a new id.

use crate::support;
use crate::support::layered;
use crate::support::postgres as pg_common;

use std::time::{Duration, Instant};

use layered::{layered_job, Rng, Work};
use pg_common::shared as pg;
use support::{exec_events, start_worker, wait_until, Server};

const HEARTBEAT: Duration = Duration::from_secs(1);
const LAG: Duration = Duration::from_secs(4);

/// One instance's place: its data directory name and fixed addresses, so
/// that an instance started again listens where the workers look for it.
struct Place {
    name: String,
    http: String,
    grpc: String,
}

impl Place {
    fn new(name: &str) -> Place {
        let free = crate::support::free_port;
        Place { name: name.into(), http: format!("127.0.0.1:{}", free()), grpc: free().to_string() }
    }

    fn start(&self, dir: &std::path::Path, url: &str) -> Server {
        self.start_with(dir, url, &["--lag-threshold", "4s"])
    }

    /// Started with `extra` arguments, the lag threshold among them.
    fn start_with(&self, dir: &std::path::Path, url: &str, extra: &[&str]) -> Server {
        let mut args = vec![
            "--database-url",
            url,
            "--grpc",
            &self.grpc,
            "--cluster-heartbeat",
            "1s",
            "--recovery-interval",
            "2s",
            "--delivery-grace",
            "5s",
        ];
        args.extend_from_slice(extra);
        Server::start_on(&dir.join(&self.name), &self.http, &args)
    }
}

/// The active instances' ids by HTTP address.
fn active_ids(database: &str) -> Vec<(String, String)> {
    let rows = pg().psql(database, "SELECT http_address || '|' || id FROM jobcenter.instances WHERE status = 'active'");
    rows.lines().filter_map(|l| l.trim().split_once('|')).map(|(http, id)| (http.to_string(), id.to_string())).collect()
}

fn owner(database: &str, job: &str) -> String {
    pg().psql(database, &format!("SELECT coalesce(owner::text, '') FROM jobcenter.jobs WHERE id = '{job}'"))
        .trim()
        .into()
}

fn succeeded_in_store(database: &str, job: &str) -> u64 {
    let count = pg().psql(
        database,
        &format!("SELECT count(*) FROM jobcenter.tasks WHERE job_id = '{job}' AND state = 'succeeded'"),
    );
    count.trim().parse().unwrap_or(0)
}

/// 3 instances and 3 workers, each worker told all three addresses
/// starting with its own instance's.
struct Rig {
    dir: tempfile::TempDir,
    database: String,
    url: String,
    places: Vec<Place>,
    servers: Vec<Server>,
    log: std::path::PathBuf,
    _workers: Vec<support::Process>,
}

fn rig() -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let database = pg().new_database();
    let url = pg().url(&database);
    let places: Vec<Place> = ["a", "b", "c"].iter().map(|n| Place::new(n)).collect();
    let servers: Vec<Server> = places.iter().map(|p| p.start(dir.path(), &url)).collect();
    wait_until(Duration::from_secs(20), || (active_ids(&database).len() == 3).then_some(()))
        .unwrap_or_else(|| panic!("3 instances did not register: {:?}", active_ids(&database)));
    let log = dir.path().join("exec.log");
    let workers = (0..3)
        .map(|n| {
            let admins: Vec<&str> = (0..3).map(|k| places[(n + k) % 3].http.as_str()).collect();
            let args = ["--admin", &admins.join(","), "--max-execute", "8"];
            start_worker(&servers[n], &format!("w{n}"), &args, Some(&log))
        })
        .collect();
    wait_until(Duration::from_secs(30), || {
        (servers.iter().map(|s| s.workers().len()).sum::<usize>() == 3).then_some(())
    })
    .unwrap_or_else(|| panic!("the workers did not connect"));
    Rig { dir, database, url, places, servers, log, _workers: workers }
}

impl Rig {
    fn submit(&self, text: &str) -> String {
        let file = self.dir.path().join("job.json");
        std::fs::write(&file, text).unwrap();
        let output = self.servers[0].cli(&["submit", file.to_str().unwrap()]);
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8(output.stdout).unwrap().trim().to_string()
    }

    /// The index of the instance that leads `job` now, if a live one does.
    fn leader(&self, job: &str) -> Option<usize> {
        let owner = owner(&self.database, job);
        let ids = active_ids(&self.database);
        let http = ids.iter().find(|(_, id)| *id == owner).map(|(http, _)| http.clone())?;
        self.places.iter().position(|p| p.http == http)
    }

    /// Waits for the job to end, asking any live instance.
    fn ended(&self, job: &str, limit: Duration) -> serde_json::Value {
        let mut last = serde_json::Value::Null;
        wait_until(limit, || {
            let server = self.servers.iter().find(|s| active_ids(&self.database).iter().any(|(h, _)| *h == s.http))?;
            last = server.cli_json(&["job", job, "--json"]);
            matches!(last["state"].as_str(), Some("succeeded" | "failed")).then(|| last.clone())
        })
        .unwrap_or_else(|| {
            let states = pg().psql(
                &self.database,
                &format!("SELECT state, count(*) FROM jobcenter.tasks WHERE job_id = '{job}' GROUP BY state"),
            );
            let running = pg().psql(
                &self.database,
                &format!(
                    "SELECT idx, attempt, handler FROM jobcenter.tasks WHERE job_id = '{job}' \
                     AND state NOT IN ('succeeded', 'failed', 'upstream_failed') LIMIT 10"
                ),
            );
            let warnings: Vec<String> = self
                .servers
                .iter()
                .flat_map(|s| {
                    std::fs::read_to_string(&s.log).unwrap_or_default().lines().map(String::from).collect::<Vec<_>>()
                })
                .filter(|l| l.contains("WARN") || l.contains("ERROR"))
                .collect();
            panic!(
                "the job did not end: {}\nstates:\n{states}\nnot ended:\n{running}\n{}",
                last["state"],
                warnings[warnings.len().saturating_sub(30)..].join("\n"),
            )
        })
    }
}

#[test]
fn the_leader_of_a_10000_task_job_dies_and_the_job_ends_as_the_model_says() {
    let rig = rig();
    let job = layered_job(&mut Rng(0x0c1a_55e5), "cluster-kill", 10_000, 100, &Work::Sleep { from: 1, spread: 10 });
    let id = rig.submit(&job.text);
    let victim = wait_until(Duration::from_secs(20), || rig.leader(&id)).expect("a live instance leads the job");
    let victim_id = owner(&rig.database, &id);

    // Mid-run: a third of the tasks have succeeded.
    wait_until(Duration::from_secs(120), || (succeeded_in_store(&rig.database, &id) >= 3_000).then_some(()))
        .unwrap_or_else(|| panic!("the job made too little progress: {}", succeeded_in_store(&rig.database, &id)));
    let mut rig = rig;
    rig.servers[victim].process.kill();
    let killed = Instant::now();
    let at_kill = succeeded_in_store(&rig.database, &id);

    // Its leadership moves to a live instance.
    let moved = wait_until(Duration::from_secs(30), || {
        let owner = owner(&rig.database, &id);
        (!owner.is_empty() && owner != victim_id).then(|| killed.elapsed())
    })
    .expect("the job's leadership did not move");
    // The job progresses again: tasks succeed past what the workers were
    // already running at the kill (at most 24 slots).
    let progressed = wait_until(Duration::from_secs(60), || {
        (succeeded_in_store(&rig.database, &id) > at_kill + 24).then(|| killed.elapsed())
    })
    .expect("the job did not progress again");
    eprintln!(
        "leadership moved {:.2} s and the job progressed again {:.2} s after its leader's SIGKILL \
         (lag threshold {} s, heartbeat {} s)",
        moved.as_secs_f64(),
        progressed.as_secs_f64(),
        LAG.as_secs(),
        HEARTBEAT.as_secs()
    );
    // Polled every 100 ms: that much on top of the bound.
    assert!(
        moved <= LAG + HEARTBEAT + Duration::from_millis(200),
        "leadership moved {moved:?} after the kill, past the lag threshold plus one heartbeat"
    );

    let done = rig.ended(&id, Duration::from_secs(300));
    eprintln!("the job ended {:.1} s after the kill", killed.elapsed().as_secs_f64());
    ended_exactly(&job, &done, &rig.log, &id);
    rig.servers.truncate(0);
}

#[test]
fn with_two_of_three_instances_dead_the_survivor_finishes_and_recovers_and_a_waiting_client_follows() {
    let rig = rig();
    let admins: Vec<&str> = rig.places.iter().map(|p| p.http.as_str()).collect();
    let file = rig.dir.path().join("nine.json");
    std::fs::write(&file, support::nine_tasks(Some(4), 1500)).unwrap();
    // A client waits for the job through every instance's address, the first one's first.
    let client = std::process::Command::new(support::binary())
        .args(["submit", file.to_str().unwrap(), "--wait", "--json", "--admin", &admins.join(",")])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let id = wait_until(Duration::from_secs(20), || {
        let id = pg().psql(&rig.database, "SELECT id FROM jobcenter.jobs WHERE name = 'nine'");
        (!id.trim().is_empty()).then(|| id.trim().to_string())
    })
    .expect("the job was submitted");
    wait_until(Duration::from_secs(30), || {
        let events = exec_events(&rig.log, &id);
        (events.iter().filter(|(_, _, e)| e == "succeeded").count() >= 2).then_some(())
    })
    .unwrap_or_else(|| panic!("the job made no progress: {:?}", exec_events(&rig.log, &id)));

    // Kill the job's leader and the instance the client talks to (or another).
    let leader = rig.leader(&id).expect("a live instance leads the job");
    let other = if leader == 0 { 1 } else { 0 };
    let survivor = 3 - leader - other;
    let mut rig = rig;
    rig.servers[leader].process.kill();
    rig.servers[other].process.kill();
    let killed_at = pg().psql(&rig.database, "SELECT (extract(epoch FROM now()) * 1000)::bigint");
    let killed_at: i64 = killed_at.trim().parse().unwrap();

    // The client carries on through the survivor and sees the job end as the model says.
    let output = support::wait_with_timeout(client, Duration::from_secs(120)).expect("the waiting client ended");
    let job: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!("the waiting client printed no job ({e}): {}", String::from_utf8_lossy(&output.stderr))
    });
    assert_eq!(support::states(&job), support::nine_tasks_4_failing(), "the reference model's states: {job}");
    let events = exec_events(&rig.log, &id);
    support::each_succeeded_once(&events);
    // Attempts running on the workers of the dead instances were adopted
    // where their workers went: no task ran twice.
    for task in ["1", "2", "3", "4", "5", "6", "8"] {
        let starts = events.iter().filter(|(t, _, e)| t == task && e == "start").count();
        assert_eq!(starts, 1, "task {task} started {starts} times: {events:?}");
    }
    let ids = active_ids(&rig.database);
    assert_eq!(ids.len(), 1, "one instance left: {ids:?}");
    assert_eq!(ids[0].0, rig.places[survivor].http);
    assert_eq!(rig.servers[survivor].workers().len(), 3, "every worker moved to the survivor");

    // The survivor keeps the recovery check running: checks made after the kills end.
    let checks = wait_until(Duration::from_secs(30), || {
        let count = pg().psql(
            &rig.database,
            &format!(
                "SELECT count(*) FROM jobcenter.jobs WHERE name = 'recovery_check' AND state = 'succeeded' \
                 AND created_at > {killed_at} + 5000"
            ),
        );
        let count: u64 = count.trim().parse().unwrap_or(0);
        (count >= 3).then_some(count)
    });
    assert!(
        checks.is_some(),
        "the recovery check stopped with 2 of 3 instances dead (killed at {killed_at}): {}\nleases: {}",
        pg().psql(
            &rig.database,
            "SELECT state, created_at, owner FROM jobcenter.jobs WHERE name = 'recovery_check' ORDER BY created_at DESC LIMIT 5"
        ),
        pg().psql(&rig.database, "SELECT * FROM jobcenter.leases")
    );
}

/// The instance leading a job dies while its only worker, of lease
/// `lease`, runs the job's four 16 s attempts, and the database lists it as
/// live until past the moment the worker reaches the other instance (the
/// lag threshold, 9 s, outlasts the worker's reconnect). Returns the job as
/// it ended and the executions' events.
fn dead_leader_still_listed(lease: &str) -> (serde_json::Value, Vec<(String, u32, String)>) {
    let dir = tempfile::tempdir().unwrap();
    let database = pg().new_database();
    let url = pg().url(&database);
    let places: Vec<Place> = ["a", "b"].iter().map(|n| Place::new(n)).collect();
    // A worker's lease of up to 30 s is taken back after 37.5 s: the orphan grace is longer.
    let timing = ["--lag-threshold", "9s", "--orphan-grace", "45s"];
    let mut servers: Vec<Server> = places.iter().map(|p| p.start_with(dir.path(), &url, &timing)).collect();
    wait_until(Duration::from_secs(20), || (active_ids(&database).len() == 2).then_some(()))
        .unwrap_or_else(|| panic!("2 instances did not register: {:?}", active_ids(&database)));
    let log = dir.path().join("exec.log");
    let admins = format!("{},{}", places[0].http, places[1].http);
    let args = ["--admin", &admins, "--max-execute", "4", "--lease", lease];
    let _worker = start_worker(&servers[0], "w0", &args, Some(&log));
    wait_until(Duration::from_secs(30), || (servers[0].workers().len() == 1).then_some(()))
        .expect("the worker connected to the first instance");
    let file = dir.path().join("four.json");
    std::fs::write(&file, crate::support::rig::independent(4, 16_000)).unwrap();
    let output = servers[0].cli(&["submit", file.to_str().unwrap()]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let id = String::from_utf8(output.stdout).unwrap().trim().to_string();
    wait_until(Duration::from_secs(20), || {
        (exec_events(&log, &id).iter().filter(|(_, _, e)| e == "start").count() == 4).then_some(())
    })
    .unwrap_or_else(|| panic!("the 4 tasks did not start: {:?}", exec_events(&log, &id)));
    let leader = owner(&database, &id);
    servers[0].process.kill();
    let killed = Instant::now();

    let survivor = &servers[1];
    let moved = wait_until(Duration::from_secs(20), || (survivor.workers().len() == 1).then(|| killed.elapsed()))
        .expect("the worker reached the other instance");
    let listed = active_ids(&database).iter().any(|(_, id)| *id == leader);
    assert!(
        listed,
        "the dead leader was no longer listed when the worker moved {moved:?} after the kill: the case is not made"
    );
    let done = wait_until(Duration::from_secs(90), || {
        let job = survivor.cli_json(&["job", &id, "--json"]);
        matches!(job["state"].as_str(), Some("succeeded" | "failed")).then_some(job)
    })
    .unwrap_or_else(|| panic!("the job did not end: {:?}", exec_events(&log, &id)));
    eprintln!(
        "lease {lease}: the worker reached the other instance {moved:?} after the kill, its dead leader still listed; \
         the job ended {:?} after the kill",
        killed.elapsed()
    );
    servers.truncate(0);
    (done, exec_events(&log, &id))
}

/// With a lease long enough, the other instance asks the dead leader again
/// while the lease the worker says it has left allows, and adopts the job
/// meanwhile, rather than cancel the attempts: no task runs twice.
#[test]
fn a_worker_that_reaches_another_instance_before_its_dead_leader_is_noticed_keeps_its_attempts() {
    let (done, events) = dead_leader_still_listed("30s");
    assert_eq!(done["state"], "succeeded", "{done}");
    for task in 0..4 {
        let starts = events.iter().filter(|(t, _, e)| *t == format!("t{task}") && e == "start").count();
        assert_eq!(starts, 1, "task t{task} started {starts} times: {events:?}");
    }
}

/// With a lease too short to wait for the adoption, the attempts are
/// canceled on the worker so that its lease can be renewed: each is given
/// back, not failed, and runs again once the job is adopted.
#[test]
fn attempts_canceled_because_their_dead_leader_cannot_vouch_are_given_back_not_failed() {
    let (done, events) = dead_leader_still_listed("8s");
    assert_eq!(done["state"], "succeeded", "{done}");
    let mut twice = 0;
    for task in 0..4 {
        let task = format!("t{task}");
        let succeeded = events.iter().filter(|(t, _, e)| *t == task && e == "succeeded").count();
        assert_eq!(succeeded, 1, "task {task} succeeded {succeeded} times: {events:?}");
        twice += usize::from(events.iter().filter(|(t, _, e)| *t == task && e == "start").count() > 1);
    }
    assert!(twice > 0, "no attempt was canceled and run again: the case is not made: {events:?}");
}

#[test]
#[ignore = "a soak of minutes: cargo test --test it cluster_kill:: -- --ignored"]
fn instances_killed_over_and_over_still_finish_a_10000_task_job_exactly() {
    let kills: usize = std::env::var("JOBCENTER_CLUSTER_KILLS").ok().and_then(|k| k.parse().ok()).unwrap_or(100);
    let seed: u64 = std::env::var("JOBCENTER_KILL_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5eed_cafe);
    let mut rng = Rng(seed);
    let mut rig = rig();
    let job = layered_job(&mut rng, "cluster-soak", 10_000, 100, &Work::Sleep { from: 100, spread: 200 });
    let id = rig.submit(&job.text);
    let started = Instant::now();
    let mut landed = 0;
    let mut leader_kills = 0;
    for _ in 0..kills {
        std::thread::sleep(Duration::from_millis(300 + rng.below(1200)));
        let state = pg().psql(&rig.database, &format!("SELECT state FROM jobcenter.jobs WHERE id = '{id}'"));
        if matches!(state.trim(), "succeeded" | "failed") {
            break;
        }
        let victim = rng.below(3) as usize;
        if rig.leader(&id) == Some(victim) {
            leader_kills += 1;
        }
        rig.servers[victim].process.kill();
        landed += 1;
        rig.servers[victim] = rig.places[victim].start(rig.dir.path(), &rig.url);
    }
    eprintln!(
        "{landed} instance kills ({leader_kills} of the job's leader) in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    assert!(landed >= kills * 2 / 3, "only {landed} kills landed before the job ended");

    let last = Instant::now();
    let done = rig.ended(&id, Duration::from_secs(600));
    eprintln!(
        "the job ended {:.1} s after the last kill, {:.0} s after its submission",
        last.elapsed().as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    ended_exactly(&job, &done, &rig.log, &id);
}

/// The ended job is in the model's states, and its executions were orderly
/// and as many as its tasks' own outcomes ask for: the kills made none run again.
fn ended_exactly(job: &layered::Layered, done: &serde_json::Value, log: &std::path::Path, id: &str) {
    job.assert_as_modelled(done);
    let events = exec_events(log, id);
    let twice = job.succeeded_more_than_once(&events);
    if !twice.is_empty() {
        explain(log, id, &twice);
    }
    job.assert_each_succeeded_once(&events);
    job.assert_orderly_executions(done, &events);
    let (reruns, total) = job.reruns(&events);
    eprintln!(
        "{total} executions for {} tasks that ran; {} ran again: {:?}",
        job.tasks_that_run(),
        reruns.len(),
        &reruns[..reruns.len().min(5)]
    );
    assert!(reruns.is_empty(), "the kills made tasks run again: {reruns:?}");
}

/// Prints what each instance's log says of `tasks` (by task id, index or
/// attempt id), so that a failure shows how a task came to run again.
fn explain(exec_log: &std::path::Path, job: &str, tasks: &[String]) {
    let dir = exec_log.parent().expect("the rig's directory");
    for name in ["a", "b", "c"] {
        let text = std::fs::read_to_string(dir.join(format!("{name}.server.log"))).unwrap_or_default();
        for task in tasks {
            let idx = &task[1..];
            let needles = [
                format!("task.id=\"{task}\""),
                format!("task.idx={idx} "),
                format!("{job}.{idx}."),
                format!(" {task} "),
            ];
            for line in text.lines().filter(|l| needles.iter().any(|n| l.contains(n.as_str()))) {
                eprintln!("{name}: {line}");
            }
        }
    }
}
