//! Kill test for `jobcenter run`: SIGKILLs the real binary again and again
//! while it runs a 2,000-task layered job, reruns it on the same data
//! directory (or the same PostgreSQL database), and checks that the same job
//! resumes, ends as a reference model says, and, from the execution log, that
//! no attempt ran twice and nothing that had succeeded ran again.
//!
//! Job and kill times follow one seed, printed first; `JOBCENTER_KILL_SEED=N
//! cargo test --test it kill_run:: -- --nocapture` replays a seed (timing still varies).
#![cfg(unix)]

use crate::support::postgres as pg;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const N_LAYERS: usize = 20;
const LAYER_WIDTH: usize = 100;
const N_PARENTS: usize = 3;
/// Each task sleeps between 0 and this many ms: the sleeps, not the engine,
/// set the job's length, so it stays a few seconds on fast machines too.
const MAX_SLEEP_MS: u64 = 80;
const CONCURRENCY: u32 = 16;
/// One task of each of these layers fails every attempt. A failure reaches
/// nearly all of the layers five and more below it, so the first is past the
/// middle: most of the job still runs, and the later ones mostly end
/// `upstream_failed` themselves.
const FAIL_LAYERS: [usize; 5] = [10, 13, 16, 18, 19];
/// One task of each of these layers fails its first attempt, then succeeds.
const RETRY_LAYERS: [usize; 8] = [0, 2, 4, 6, 8, 9, 11, 14];
/// Runs killed at most; the job must still be unfinished at `MIN_KILLS` of them.
const PLANNED_KILLS: usize = 14;
const MIN_KILLS: usize = 10;
const MIN_KILL_DELAY_MS: u64 = 50;
/// What a restarted debug binary needs before it runs a task again (about
/// 100-200 ms on a busy 2-core machine); each kill delay gets it on top.
const STARTUP_ALLOWANCE_MS: u64 = 120;
/// The kills together leave about this fraction of the job's work done, so
/// that the job is still unfinished at the last planned kill.
const KILL_COVERAGE: f64 = 0.6;
/// Any one process that runs longer than this fails the test.
const PROCESS_TIMEOUT: Duration = Duration::from_secs(120);
/// The signal `Child::kill` sends on unix (9 everywhere), without a libc dependency.
const SIGKILL: i32 = 9;
/// `JOBCENTER_KILL_SEED` overrides it, to explore or to replay a failure.
const DEFAULT_SEED: u64 = 0x6b69_6c6c_5f72_756e;

/// Xorshift64: small, seeded, the same on every platform.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// A number in `0..n`.
    fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

struct TaskDef {
    id: String,
    parents: Vec<usize>,
    sleep_ms: u64,
    fail: bool,
    fail_attempts: u32,
}

fn task_id(layer: usize, idx: usize) -> String {
    format!("l{layer:02}-t{idx:03}")
}

/// The layered job: tasks in layer order, each of layer L > 0 depending on
/// `N_PARENTS` distinct tasks of layer L - 1.
fn generate_job(rng: &mut Rng) -> Vec<TaskDef> {
    let fail_idx: Vec<usize> = FAIL_LAYERS.iter().map(|_| rng.below(LAYER_WIDTH as u64) as usize).collect();
    let retry_idx: Vec<usize> = RETRY_LAYERS.iter().map(|_| rng.below(LAYER_WIDTH as u64) as usize).collect();
    let mut tasks = Vec::with_capacity(N_LAYERS * LAYER_WIDTH);
    for layer in 0..N_LAYERS {
        for idx in 0..LAYER_WIDTH {
            let mut parents = BTreeSet::new();
            if layer > 0 {
                while parents.len() < N_PARENTS {
                    parents.insert((layer - 1) * LAYER_WIDTH + rng.below(LAYER_WIDTH as u64) as usize);
                }
            }
            let fail = FAIL_LAYERS.iter().zip(&fail_idx).any(|(&l, &i)| (l, i) == (layer, idx));
            let retry = RETRY_LAYERS.iter().zip(&retry_idx).any(|(&l, &i)| (l, i) == (layer, idx));
            tasks.push(TaskDef {
                id: task_id(layer, idx),
                parents: parents.into_iter().collect(),
                sleep_ms: rng.below(MAX_SLEEP_MS + 1),
                fail,
                fail_attempts: u32::from(retry),
            });
        }
    }
    tasks
}

fn job_file(tasks: &[TaskDef]) -> Value {
    let tasks: Vec<Value> = tasks
        .iter()
        .map(|task| {
            let mut parameters = json!({ "sleep_ms": task.sleep_ms });
            if task.fail {
                parameters["fail"] = json!(true);
            }
            let mut value = json!({
                "id": task.id,
                "job_type": "noop",
                "parameters": parameters,
                "depends_on": task.parents.iter().map(|&p| tasks[p].id.clone()).collect::<Vec<_>>(),
            });
            if task.fail_attempts > 0 {
                value["parameters"]["fail_attempts"] = json!(task.fail_attempts);
                value["retry_limit"] = json!(1);
                value["retry_backoff_seconds"] = json!(0);
            }
            value
        })
        .collect();
    json!({ "name": "kill-run", "tasks": tasks })
}

/// The reference model: a task whose parent did not succeed is
/// `upstream_failed` (so a task told to fail never runs under a failed
/// ancestor); otherwise one told to fail is `failed`; otherwise `succeeded`.
fn expected_states(tasks: &[TaskDef]) -> Vec<&'static str> {
    let mut states: Vec<&'static str> = Vec::with_capacity(tasks.len());
    for task in tasks {
        let state = if task.parents.iter().any(|&p| states[p] != "succeeded") {
            "upstream_failed"
        } else if task.fail {
            "failed"
        } else {
            "succeeded"
        };
        states.push(state);
    }
    states
}

/// Sum of the sleeps of the tasks that will run, spread over the slots.
fn expected_job_ms(tasks: &[TaskDef], states: &[&str]) -> u64 {
    let busy: u64 = tasks
        .iter()
        .zip(states)
        .filter(|(_, state)| **state != "upstream_failed")
        .map(|(task, _)| task.sleep_ms * (1 + u64::from(task.fail_attempts)))
        .sum();
    busy / u64::from(CONCURRENCY)
}

fn jobcenter() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_jobcenter"));
    command.env_remove("JOBCENTER_EXEC_LOG").env_remove("JOBCENTER_LOG").stdin(Stdio::null());
    command
}

/// Starts a command with stdout and stderr in files (no pipe can fill up).
fn spawn(mut command: Command, out: &Path, err: &Path) -> Child {
    let stdout = std::fs::File::create(out).expect("create stdout file");
    let stderr = std::fs::File::create(err).expect("create stderr file");
    command.stdout(stdout).stderr(stderr).spawn().expect("start jobcenter")
}

/// Waits for the child until `deadline`; past it, kills it and fails the test.
fn wait_until(child: &mut Child, deadline: Instant, what: &str, err: &Path) -> ExitStatus {
    loop {
        if let Some(status) = child.try_wait().expect("wait for jobcenter") {
            return status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{what} still running after {PROCESS_TIMEOUT:?}; stderr:\n{}",
                std::fs::read_to_string(err).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// What a run printed about its job: `started job ID` or `resuming job ID (NAME)`.
#[derive(Clone, Debug, PartialEq, Eq)]
enum JobLine {
    Started(String),
    Resuming(String),
}

/// The job line of a run's stderr. A run killed mid-line leaves a cut id,
/// which does not parse and counts as no line.
fn job_line(stderr: &str) -> Option<JobLine> {
    stderr.lines().find_map(|line| {
        let (make, rest): (fn(String) -> JobLine, &str) = if let Some(rest) = line.strip_prefix("started job ") {
            (JobLine::Started, rest)
        } else if let Some(rest) = line.strip_prefix("resuming job ") {
            (JobLine::Resuming, rest)
        } else {
            return None;
        };
        let id = rest.split_whitespace().next()?;
        uuid::Uuid::parse_str(id).ok()?;
        Some(make(id.to_string()))
    })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Event {
    Start,
    Succeeded,
    Failed,
    Canceled,
}

/// One line of the execution log, with the run (process) that wrote it.
#[derive(Debug)]
struct LogLine {
    /// The line's index in the log.
    pos: usize,
    run: usize,
    job: String,
    task: String,
    attempt: u32,
    event: Event,
}

/// Parses the execution log; `run_ends[r]` is its length when run `r` had exited.
fn read_exec_log(path: &Path, run_ends: &[u64]) -> Vec<LogLine> {
    let text = std::fs::read_to_string(path).expect("read the execution log");
    assert!(text.is_empty() || text.ends_with('\n'), "the execution log ends in a cut line: {:?}", text.lines().last());
    let mut offset = 0u64;
    let mut lines = Vec::new();
    for (pos, line) in text.lines().enumerate() {
        let run = run_ends.iter().position(|&end| offset < end).unwrap_or(run_ends.len());
        offset += line.len() as u64 + 1;
        let fields: Vec<&str> = line.split(' ').collect();
        assert_eq!(fields.len(), 4, "malformed execution log line {line:?}");
        let event = match fields[3] {
            "start" => Event::Start,
            "succeeded" => Event::Succeeded,
            "failed" => Event::Failed,
            "canceled" => Event::Canceled,
            other => panic!("unknown event {other:?} in execution log line {line:?}"),
        };
        lines.push(LogLine {
            pos,
            run,
            job: fields[0].to_string(),
            task: fields[1].to_string(),
            attempt: fields[2].parse().unwrap_or_else(|_| panic!("bad attempt in execution log line {line:?}")),
            event,
        });
    }
    lines
}

/// A task of the job JSON: (state, attempt).
fn final_tasks(job: &Value) -> BTreeMap<String, (String, u32)> {
    job["tasks"]
        .as_array()
        .expect("the job JSON has tasks")
        .iter()
        .map(|t| {
            let id = t["id"].as_str().expect("task id").to_string();
            let state = t["state"].as_str().expect("task state").to_string();
            let attempt = u32::try_from(t["attempt"].as_u64().expect("task attempt")).expect("attempt fits u32");
            (id, (state, attempt))
        })
        .collect()
}

/// The job's final states against the model; returns the task map.
fn check_final_states(job: &Value, tasks: &[TaskDef], expected: &[&str]) -> BTreeMap<String, (String, u32)> {
    let finals = final_tasks(job);
    assert_eq!(finals.len(), tasks.len(), "the job JSON has {} tasks, the job file {}", finals.len(), tasks.len());
    let mut wrong = Vec::new();
    for (task, want) in tasks.iter().zip(expected) {
        let (state, attempt) = &finals[&task.id];
        if state != want {
            wrong.push(format!("{} is {state} (attempt {attempt}), the model says {want}", task.id));
        }
    }
    assert!(wrong.is_empty(), "{} tasks end in the wrong state:\n{}", wrong.len(), wrong.join("\n"));
    let want_job = if expected.iter().all(|s| *s == "succeeded") { "succeeded" } else { "failed" };
    assert_eq!(job["state"].as_str(), Some(want_job), "job state");
    finals
}

/// What the execution log shows about the kills.
#[derive(Debug, Default)]
struct LogStats {
    /// Attempts that started and never reported: cut off by a kill.
    lost: usize,
    /// Successes that a kill cut off before they were durable, so the task ran again.
    rerun_after_success: usize,
    /// The most attempts one kill cut off (lost, or succeeded but not durable).
    max_in_flight: usize,
}

/// Checks the execution log of one job against its final task states.
/// `final_run` is the run that was not killed.
fn check_exec_log(
    log: &[LogLine],
    job: &str,
    tasks: &[TaskDef],
    finals: &BTreeMap<String, (String, u32)>,
    final_run: usize,
) -> LogStats {
    let index: HashMap<&str, usize> = tasks.iter().enumerate().map(|(idx, t)| (t.id.as_str(), idx)).collect();
    let mut by_task: Vec<Vec<&LogLine>> = vec![Vec::new(); tasks.len()];
    for line in log.iter().filter(|l| l.job == job) {
        let idx = *index
            .get(line.task.as_str())
            .unwrap_or_else(|| panic!("the execution log names a task not in the job: {line:?}"));
        assert_ne!(line.event, Event::Canceled, "nothing cancels this job, yet: {line:?}");
        by_task[idx].push(line);
    }
    // A child is dispatched only once the successes of all its parents are
    // durable, so from the first start of any child on, a parent never starts again.
    let mut durable_from: Vec<Option<usize>> = vec![None; tasks.len()];
    for (child, task) in tasks.iter().enumerate() {
        if let Some(first) = by_task[child].iter().find(|l| l.event == Event::Start) {
            for &parent in &task.parents {
                durable_from[parent] = Some(durable_from[parent].map_or(first.pos, |pos| pos.min(first.pos)));
            }
        }
    }
    // Per run: attempts its end cut off. The executor has CONCURRENCY slots,
    // and a slot gets new work only once the previous attempt's outcome is
    // durable, so a kill cuts off at most CONCURRENCY attempts.
    let mut in_flight = vec![0usize; final_run + 1];
    let mut stats = LogStats::default();
    let mut problems = Vec::new();
    for (idx, task) in tasks.iter().enumerate() {
        let (state, final_attempt) = &finals[&task.id];
        let lines = &by_task[idx];
        let show = || {
            lines
                .iter()
                .map(|l| format!("  line {} run {} attempt {} {:?}", l.pos + 1, l.run, l.attempt, l.event))
                .collect::<Vec<_>>()
                .join("\n")
        };
        // Attempts start in increasing order: no (task, attempt) starts twice.
        let starts: Vec<&LogLine> = lines.iter().copied().filter(|l| l.event == Event::Start).collect();
        if starts.windows(2).any(|w| w[0].attempt >= w[1].attempt) {
            problems.push(format!("{}: attempts do not start in increasing order:\n{}", task.id, show()));
        }
        if let Some(last) = starts.last() {
            if last.attempt > *final_attempt {
                problems.push(format!(
                    "{}: attempt {} started, the final attempt is {final_attempt}:\n{}",
                    task.id,
                    last.attempt,
                    show()
                ));
            }
        }
        // Each outcome follows the start of its attempt, in the same run, once.
        let mut outcomes: BTreeMap<u32, Event> = BTreeMap::new();
        for line in lines.iter().filter(|l| l.event != Event::Start) {
            if !starts.iter().any(|s| s.attempt == line.attempt && s.run == line.run && s.pos < line.pos) {
                problems.push(format!(
                    "{}: attempt {} ended without starting in run {}:\n{}",
                    task.id,
                    line.attempt,
                    line.run,
                    show()
                ));
            }
            if outcomes.insert(line.attempt, line.event).is_some() {
                problems.push(format!("{}: attempt {} ended twice:\n{}", task.id, line.attempt, show()));
            }
        }
        // Within one run, a new attempt starts only after the previous one failed;
        // nothing runs again after it succeeded in the same run.
        for pair in starts.windows(2) {
            if pair[0].run == pair[1].run && outcomes.get(&pair[0].attempt) != Some(&Event::Failed) {
                problems.push(format!(
                    "{}: attempt {} started in run {} while attempt {} had not failed:\n{}",
                    task.id,
                    pair[1].attempt,
                    pair[1].run,
                    pair[0].attempt,
                    show()
                ));
            }
        }
        if let Some(from) = durable_from[idx] {
            if let Some(late) = starts.iter().find(|s| s.pos > from) {
                problems.push(format!(
                    "{}: attempt {} started at line {}, after a child had started at line {} (so after its success \
                     was durable):\n{}",
                    task.id,
                    late.attempt,
                    late.pos + 1,
                    from + 1,
                    show()
                ));
            }
        }
        for start in starts.iter().filter(|s| !outcomes.contains_key(&s.attempt)) {
            in_flight[start.run] += 1;
            stats.lost += 1;
        }
        for success in lines.iter().filter(|l| l.event == Event::Succeeded) {
            if starts.iter().any(|s| s.attempt > success.attempt) {
                in_flight[success.run] += 1;
                stats.rerun_after_success += 1;
            }
        }
        match state.as_str() {
            "succeeded" => {
                let succeeded =
                    lines.iter().filter(|l| l.event == Event::Succeeded && l.attempt == *final_attempt).count();
                if succeeded != 1 {
                    problems.push(format!(
                        "{}: succeeded, with {succeeded} `succeeded` lines for its final attempt {final_attempt}:\n{}",
                        task.id,
                        show()
                    ));
                }
                if task.fail_attempts > 0 && *final_attempt <= task.fail_attempts {
                    problems.push(format!(
                        "{}: succeeded on attempt {final_attempt}, which was told to fail:\n{}",
                        task.id,
                        show()
                    ));
                }
            }
            "failed" => {
                if outcomes.get(final_attempt) != Some(&Event::Failed) {
                    problems.push(format!(
                        "{}: failed, with no `failed` line for its final attempt {final_attempt}:\n{}",
                        task.id,
                        show()
                    ));
                }
            }
            "upstream_failed" => {
                if !lines.is_empty() || *final_attempt != 0 {
                    problems.push(format!(
                        "{}: upstream_failed (attempt {final_attempt}), yet it ran:\n{}",
                        task.id,
                        show()
                    ));
                }
            }
            other => problems.push(format!("{}: ended {other}", task.id)),
        }
    }
    for (run, &n) in in_flight.iter().enumerate() {
        if run == final_run && n > 0 {
            problems.push(format!("the final run, never killed, left {n} attempts cut off or run again"));
        } else if n > CONCURRENCY as usize {
            problems.push(format!(
                "the kill of run {run} cut off {n} attempts (lost, or succeeded and run again), more than the \
                 {CONCURRENCY} slots: a durable success ran again, or the executor overran its slots"
            ));
        }
    }
    stats.max_in_flight = in_flight[..final_run].iter().copied().max().unwrap_or(0);
    assert!(
        problems.is_empty(),
        "the execution log of job {job} breaks {} rules:\n{}",
        problems.len(),
        problems.join("\n")
    );
    stats
}

#[test]
fn killed_run_resumes_and_never_reruns_what_succeeded() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data_dir = dir.path().join("data");
    killed_run(&["--data-dir".into(), data_dir.display().to_string()]);
}

#[test]
fn killed_run_on_postgres_resumes_and_never_reruns_what_succeeded() {
    let cluster = pg::shared();
    let database = cluster.new_database();
    killed_run(&["--database-url".into(), cluster.url(&database)]);
}

/// `jobcenter run` killed over and over on the store `store` names.
fn killed_run(store: &[String]) {
    let started_at = Instant::now();
    let seed = std::env::var("JOBCENTER_KILL_SEED")
        .ok()
        .map(|s| s.parse::<u64>().expect("JOBCENTER_KILL_SEED is a u64"))
        .unwrap_or(DEFAULT_SEED);
    let mut rng = Rng::new(seed);
    let tasks = generate_job(&mut rng);
    let expected = expected_states(&tasks);
    let count = |state: &str| expected.iter().filter(|s| **s == state).count();
    let job_ms = expected_job_ms(&tasks, &expected);
    // Kill delays: uniform; past the start-up, together about KILL_COVERAGE of the job.
    let mean_delay_ms = STARTUP_ALLOWANCE_MS + (KILL_COVERAGE * job_ms as f64 / PLANNED_KILLS as f64) as u64;
    let max_delay_ms = (2 * mean_delay_ms).saturating_sub(MIN_KILL_DELAY_MS).max(MIN_KILL_DELAY_MS);
    eprintln!(
        "seed {seed}: {} tasks, model: {} succeeded, {} failed, {} upstream_failed; \
         about {job_ms} ms of work; kill delays {MIN_KILL_DELAY_MS}..{max_delay_ms} ms",
        tasks.len(),
        count("succeeded"),
        count("failed"),
        count("upstream_failed"),
    );

    let dir = tempfile::tempdir().expect("temp dir");
    let job_path = dir.path().join("job.json");
    let exec_log = dir.path().join("exec.log");
    std::fs::write(&job_path, serde_json::to_vec(&job_file(&tasks)).expect("job JSON")).expect("write job file");
    let run_command = |json: bool| {
        let mut command = jobcenter();
        command.arg("run").arg(&job_path).args(store).arg("--exec-log").arg(&exec_log);
        command.arg("--concurrency").arg(CONCURRENCY.to_string());
        if json {
            command.arg("--json");
        }
        command
    };
    let run_files = |run: usize| -> (PathBuf, PathBuf) {
        (dir.path().join(format!("run-{run}.stdout")), dir.path().join(format!("run-{run}.stderr")))
    };
    let log_len = || std::fs::metadata(&exec_log).map(|m| m.len()).unwrap_or(0);

    // The kill loop.
    let mut first_job: Option<String> = None;
    let mut run_ends: Vec<u64> = Vec::new();
    let mut kills = 0;
    let mut kills_while_unfinished = 0;
    // Kills since the last run that printed its job line: they landed while the
    // job was unfinished if the next run that prints one resumes it.
    let mut unconfirmed_kills = 0;
    let mut job_ended_early = false;
    for run in 0..PLANNED_KILLS {
        let (out, err) = run_files(run);
        let mut child = spawn(run_command(false), &out, &err);
        let spawned = Instant::now();
        let delay = Duration::from_millis(MIN_KILL_DELAY_MS + rng.below(max_delay_ms - MIN_KILL_DELAY_MS + 1));
        while spawned.elapsed() < delay && child.try_wait().expect("poll jobcenter").is_none() {
            std::thread::sleep(Duration::from_millis(2));
        }
        let exited_by_itself = child.try_wait().expect("poll jobcenter").is_some();
        if !exited_by_itself {
            child.kill().expect("SIGKILL jobcenter");
        }
        let status = wait_until(&mut child, spawned + PROCESS_TIMEOUT, "a killed run", &err);
        run_ends.push(log_len());
        let killed = status.signal() == Some(SIGKILL);
        let stderr = std::fs::read_to_string(&err).unwrap_or_default();
        match (job_line(&stderr), &first_job) {
            // The first run may die before it prints the id of the job it submitted.
            (Some(JobLine::Started(id)), None) => first_job = Some(id),
            (Some(JobLine::Resuming(id)), None) => {
                first_job = Some(id);
                kills_while_unfinished += unconfirmed_kills;
            }
            (Some(JobLine::Resuming(id)), Some(first)) => {
                assert_eq!(&id, first, "run {run} resumed another job; stderr:\n{stderr}");
                kills_while_unfinished += unconfirmed_kills;
            }
            (Some(JobLine::Started(id)), Some(first)) => {
                assert_ne!(&id, first, "run {run} started the first job again");
                eprintln!("run {run}: job {first} had ended before the kill; started job {id}");
                job_ended_early = true;
            }
            (None, _) => {}
        }
        if job_line(&stderr).is_some() {
            unconfirmed_kills = 0;
        }
        if killed {
            kills += 1;
            unconfirmed_kills += 1;
        }
        eprintln!(
            "run {run}: {} after {} ms, exec log {} bytes",
            if killed { "killed".to_string() } else { format!("exited by itself with {status}") },
            spawned.elapsed().as_millis(),
            log_len(),
        );
        if !killed {
            let code = status.code();
            assert!(
                code == Some(0) || code == Some(1),
                "run {run} exited by itself with {status} instead of running the job; stderr:\n{stderr}"
            );
        }
        if !killed || job_ended_early {
            break;
        }
    }

    // The last run, to the end.
    let final_run = run_ends.len();
    let (out, err) = run_files(final_run);
    let mut child = spawn(run_command(true), &out, &err);
    let spawned = Instant::now();
    let status = wait_until(&mut child, spawned + PROCESS_TIMEOUT, "the final run", &err);
    let final_ms = spawned.elapsed().as_millis();
    run_ends.push(log_len());
    let stderr = std::fs::read_to_string(&err).unwrap_or_default();
    let stdout = std::fs::read_to_string(&out).unwrap_or_default();
    let want_code = if count("succeeded") == tasks.len() { 0 } else { 1 };
    assert_eq!(status.code(), Some(want_code), "final run exit status {status}; stderr:\n{stderr}");
    let final_job: Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("the final run printed no job JSON ({e}): {stdout:?}; stderr:\n{stderr}"));
    let final_id = final_job["id"].as_str().expect("job id").to_string();
    let first_job = first_job.unwrap_or_else(|| final_id.clone());
    if final_id == first_job && job_line(&stderr) == Some(JobLine::Resuming(final_id.clone())) {
        kills_while_unfinished += unconfirmed_kills;
    }
    check_final_states(&final_job, &tasks, &expected);

    let first_job_json = if final_id == first_job {
        assert!(!job_ended_early, "job {first_job} resumed after a new job had started");
        final_job
    } else {
        assert!(
            job_ended_early || job_line(&stderr) == Some(JobLine::Started(final_id.clone())),
            "the final run reports job {final_id}, the first run job {first_job}; stderr:\n{stderr}"
        );
        let (out, err) = run_files(final_run + 1);
        let mut command = jobcenter();
        let place: Vec<String> = match store[0].as_str() {
            "--database-url" => vec!["--database-url".into(), store[1].clone()],
            _ => store.to_vec(),
        };
        command.arg("job").arg(&first_job).args(&place).arg("--json");
        let mut child = spawn(command, &out, &err);
        let status = wait_until(&mut child, Instant::now() + PROCESS_TIMEOUT, "jobcenter job", &err);
        assert!(status.success(), "jobcenter job {first_job} exited with {status}");
        let stdout = std::fs::read_to_string(&out).unwrap_or_default();
        serde_json::from_str(stdout.trim())
            .unwrap_or_else(|e| panic!("jobcenter job printed no JSON ({e}): {stdout:?}"))
    };
    assert_eq!(first_job_json["id"].as_str(), Some(first_job.as_str()), "job id");
    let finals = check_final_states(&first_job_json, &tasks, &expected);
    let log = read_exec_log(&exec_log, &run_ends);
    let stats = check_exec_log(&log, &first_job, &tasks, &finals, final_run);

    eprintln!(
        "job {first_job}: {} runs, {kills} kills ({kills_while_unfinished} while the job was unfinished), \
         {} attempts lost to kills, {} tasks run again after a success a kill cut off, at most {} cut off by one \
         kill; final run {final_ms} ms, test {} ms",
        run_ends.len(),
        stats.lost,
        stats.rerun_after_success,
        stats.max_in_flight,
        started_at.elapsed().as_millis(),
    );
    assert!(
        kills_while_unfinished >= MIN_KILLS,
        "only {kills_while_unfinished} kills landed while job {first_job} was unfinished (of {kills}); \
         the test needs {MIN_KILLS}"
    );
}

/// A job that a release from before BLAKE3 fingerprints started in a data
/// directory carries its file's SHA-256: `jobcenter run` of the same file
/// resumes it rather than starting the file again, and finishes it.
#[test]
fn a_run_resumes_a_job_whose_fingerprint_is_the_files_sha256() {
    use sha2::Digest;
    let dir = tempfile::tempdir().expect("temp dir");
    let (file, data_dir) = (dir.path().join("job.json"), dir.path().join("data"));
    let text = r#"{"name": "older", "tasks": [
        {"id": "a", "job_type": "noop"},
        {"id": "b", "job_type": "noop", "depends_on": ["a"]}]}"#;
    std::fs::write(&file, text).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let stored = runtime.block_on(async {
        let store = std::sync::Arc::new(jobcenter::store::SledStore::open(&data_dir).unwrap());
        let engine = jobcenter::engine::Engine::start(
            store,
            std::sync::Arc::new(jobcenter::clock::SystemClock),
            jobcenter::engine::Options::default(),
        )
        .await
        .unwrap();
        let mut spec = jobcenter::jobfile::read_file(&file, &jobcenter::jobfile::Limits::default()).unwrap();
        assert_ne!(
            spec.fingerprint,
            <[u8; 32]>::from(sha2::Sha256::digest(text)),
            "the fingerprint is no longer SHA-256"
        );
        spec.fingerprint = sha2::Sha256::digest(text).into();
        let id = engine.submit(spec, jobcenter::model::JobOrigin::User).await.unwrap();
        engine.close().await;
        id
    });
    drop(runtime);
    let mut command = Command::new(crate::support::binary());
    command.arg("run").arg(&file).arg("--data-dir").arg(&data_dir);
    let output = crate::support::run_with_timeout(command, PROCESS_TIMEOUT);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the run failed: {stderr}");
    assert_eq!(job_line(&stderr), Some(JobLine::Resuming(stored.to_string())), "{stderr}");
}
