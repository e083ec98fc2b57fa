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

use crate::support;
use crate::support::layered;
use crate::support::postgres as pg;

use std::time::{Duration, Instant};

use layered::{layered_job, Rng, Work};
use support::{exec_events, free_port, start_worker, wait_until, Server};

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
    // The crash point goes to the server's environment alone (`env` execs
    // it, so its pid is the server's): set on this process, it would reach
    // every server, worker and in-process engine of the other tests.
    let start = |crash: Option<String>| {
        let wrapper = match &crash {
            Some(crash) => vec!["env".to_string(), format!("JOBCENTER_CRASH_AT={crash}")],
            None => ["env", "-u", "JOBCENTER_CRASH_AT"].map(String::from).to_vec(),
        };
        let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
        Server::start_wrapped(&wrapper, &data, &http, &server_args)
    };

    let n_tasks: usize = std::env::var("JOBCENTER_ADMIN_KILL_TASKS").ok().and_then(|n| n.parse().ok()).unwrap_or(2000);
    let shell_ms: Option<u64> = std::env::var("JOBCENTER_ADMIN_KILL_SHELL_MS").ok().and_then(|n| n.parse().ok());
    let work = match shell_ms {
        Some(ms) => Work::Shell { ms },
        None => Work::Sleep { from: 20, spread: 60 },
    };
    let job = layered_job(&mut rng, "admin-kill", n_tasks, 100, &work);
    let log = dir.path().join("exec.log");
    let mut server = start(None);
    let worker_args = ["--max-execute", "4", "--lease", "10s"];
    let _workers: Vec<_> = (0..2).map(|n| start_worker(&server, &format!("w{n}"), &worker_args, Some(&log))).collect();
    server.wait_for_workers(2);
    let file = dir.path().join("job.json");
    std::fs::write(&file, &job.text).unwrap();
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

    // Final states as the model says; executions orderly, and as many as
    // each task's own outcomes ask for. A kill makes none run again: workers
    // keep what they run and report it when the admin is back, and an
    // outcome not yet durable is reported again.
    job.assert_as_modelled(&done);
    let events = exec_events(&log, &job_id);
    job.assert_orderly_executions(&done, &events);
    let (reruns, total) = job.reruns(&events);
    let ran_tasks = job.tasks_that_run();
    eprintln!(
        "{total} executions for {ran_tasks} tasks that ran ({:.3} per task); {} re-runs",
        total as f64 / ran_tasks as f64,
        reruns.len()
    );
    assert!(reruns.is_empty(), "the kills made tasks run again: {reruns:?}");
}

/// The job's state, if the server answers.
fn server_state(http: &str, job: &str) -> Option<String> {
    let mut command = std::process::Command::new(support::binary());
    command.args(["job", job, "--json", "--admin", http]);
    let output = support::run_with_timeout(command, Duration::from_secs(30));
    let value: serde_json::Value = serde_json::from_slice(&output.stdout).ok()?;
    value["state"].as_str().map(String::from)
}
