//! Shared harness of the multi-process tests: start the real `jobcenter`
//! server and workers on loopback, find their ports, kill and restart them.
//! Its submodules are the harness pieces some tests need (a throwaway
//! PostgreSQL, network namespaces, SeaweedFS, a browser, ...).
#![allow(dead_code)]

pub mod browser;
pub mod fleet;
pub mod layered;
pub mod net;
pub mod postgres;
pub mod proxy;
pub mod raw_http;
pub mod rig;
pub mod seaweedfs;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A loopback port free now, for a process the test starts to bind (again
/// on the same address after a restart, if need be). It comes from 28,000 to
/// 29,999, below the kernel's ephemeral ports (32,768 and up here), so that
/// no connection's own port and no bind to port 0 takes it meanwhile; the
/// PostgreSQL (25,000) and SeaweedFS (20,000 and 30,000) ports of these tests
/// lie beside it, and one counter keeps the tests of this process apart.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const BASE: u16 = 28_000;
    const SPAN: u32 = 2_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = std::process::id().wrapping_mul(151) % SPAN;
    for _ in 0..SPAN {
        let port = BASE + ((start + NEXT.fetch_add(1, Ordering::SeqCst)) % SPAN) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {BASE}..{}", u32::from(BASE) + SPAN);
}

pub fn binary() -> &'static str {
    env!("CARGO_BIN_EXE_jobcenter")
}

/// A child process that is killed (SIGKILL) when dropped.
pub struct Process {
    pub child: Child,
    pub name: String,
}

impl Process {
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A running `jobcenter server` and where it listens.
pub struct Server {
    pub process: Process,
    pub http: String,
    pub grpc: String,
    pub data_dir: PathBuf,
    pub log: PathBuf,
}

impl Server {
    /// Starts a server on free loopback ports and waits until it listens.
    pub fn start(data_dir: &Path, extra: &[&str]) -> Server {
        Server::start_on(data_dir, "127.0.0.1:0", extra)
    }

    pub fn start_on(data_dir: &Path, http: &str, extra: &[&str]) -> Server {
        Server::start_wrapped(&[], data_dir, http, extra)
    }

    /// Starts the server under a wrapper command (such as `faketime -f +1h`).
    pub fn start_wrapped(wrapper: &[&str], data_dir: &Path, http: &str, extra: &[&str]) -> Server {
        let log = data_dir.with_extension("server.log");
        let log_file = std::fs::OpenOptions::new().create(true).append(true).open(&log).unwrap();
        let mut args = vec!["server", "--data-dir", data_dir.to_str().unwrap(), "--http", http];
        if http.ends_with(":0") {
            args.extend(["--grpc", "0"]);
        }
        args.extend_from_slice(extra);
        let mut command = match wrapper.split_first() {
            Some((program, rest)) => {
                let mut command = Command::new(program);
                command.args(rest).arg(binary());
                command
            }
            None => Command::new(binary()),
        };
        let mut child = command
            .args(&args)
            .env("JOBCENTER_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the server");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut log_file = log_file;
            let mut sent = false;
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                use std::io::Write;
                let _ = writeln!(log_file, "{line}");
                if !sent {
                    if let Some(rest) = line.strip_prefix("jobcenter server listening: ") {
                        let _ = tx.send(rest.to_string());
                        sent = true;
                    }
                }
            }
        });
        let line = rx.recv_timeout(Duration::from_secs(30)).unwrap_or_else(|_| {
            panic!("the server did not start: {}", std::fs::read_to_string(&log).unwrap_or_default())
        });
        // "http 127.0.0.1:P grpc 127.0.0.1:Q"
        let parts: Vec<&str> = line.split_whitespace().collect();
        let (http, grpc) = (parts[1].to_string(), parts[3].to_string());
        Server { process: Process { child, name: "server".into() }, http, grpc, data_dir: data_dir.to_path_buf(), log }
    }

    /// Runs a client command against this server and returns its output.
    pub fn cli(&self, args: &[&str]) -> Output {
        let mut command = Command::new(binary());
        command.args(args).args(["--admin", &self.http]);
        run_with_timeout(command, Duration::from_secs(120))
    }

    /// Writes `text` as `dir/NAME.json`, submits it and returns the job id.
    pub fn submit_file(&self, dir: &Path, name: &str, text: &str) -> String {
        let file = dir.join(format!("{name}.json"));
        std::fs::write(&file, text).unwrap();
        let output = self.cli(&["submit", file.to_str().unwrap()]);
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8(output.stdout).unwrap().trim().to_string()
    }

    pub fn cli_json(&self, args: &[&str]) -> serde_json::Value {
        let output = self.cli(args);
        let stdout = String::from_utf8_lossy(&output.stdout);
        serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
            panic!("{args:?} printed no JSON ({e}): {stdout}\nstderr: {}", String::from_utf8_lossy(&output.stderr))
        })
    }

    pub fn workers(&self) -> Vec<serde_json::Value> {
        self.cli_json(&["workers", "--json"]).as_array().cloned().unwrap_or_default()
    }

    /// Waits until `count` workers are connected.
    pub fn wait_for_workers(&self, count: usize) -> Vec<serde_json::Value> {
        wait_until(Duration::from_secs(30), || {
            let workers = self.workers();
            (workers.len() >= count).then_some(workers)
        })
        .unwrap_or_else(|| panic!("{count} workers did not connect: {:?}", self.workers()))
    }
}

/// Starts `jobcenter worker` against a server (or the `--admin` that `extra` gives).
pub fn start_worker(server: &Server, id: &str, extra: &[&str], exec_log: Option<&Path>) -> Process {
    let mut command = Command::new(binary());
    command.args(["worker", "--id", id, "--heartbeat", "1s"]);
    if !extra.contains(&"--admin") {
        command.args(["--admin", &server.http]);
    }
    command.args(extra).stdout(Stdio::null()).stderr(Stdio::null());
    if let Some(log) = exec_log {
        command.env("JOBCENTER_EXEC_LOG", log);
    }
    let child = command.spawn().expect("start a worker");
    Process { child, name: id.to_string() }
}

/// Starts `jobcenter worker` under `wrapper` (such as `ip netns exec HOST`)
/// against `admin`, its log (at `JOBCENTER_LOG=info`) in `log`.
pub fn start_worker_with(
    wrapper: &[String],
    admin: &str,
    id: &str,
    extra: &[&str],
    exec_log: Option<&Path>,
    log: &Path,
) -> Process {
    let mut command = match wrapper.split_first() {
        Some((program, rest)) => {
            let mut command = Command::new(program);
            command.args(rest).arg(binary());
            command
        }
        None => Command::new(binary()),
    };
    let log_file = std::fs::OpenOptions::new().create(true).append(true).open(log).expect("open the worker's log");
    command.args(["worker", "--id", id, "--heartbeat", "1s", "--admin", admin]).args(extra);
    command.env("JOBCENTER_LOG", "info").stdout(Stdio::null()).stderr(log_file);
    if let Some(exec_log) = exec_log {
        command.env("JOBCENTER_EXEC_LOG", exec_log);
    }
    let child = command.spawn().expect("start a worker");
    Process { child, name: id.to_string() }
}

/// Runs a command to its end, killing it after `limit`.
pub fn run_with_timeout(mut command: Command, limit: Duration) -> Output {
    let child = command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn");
    wait_with_timeout(child, limit).unwrap_or_else(|| panic!("{command:?} did not finish within {limit:?}"))
}

/// Waits for a started command's end and output; kills it after `limit`.
pub fn wait_with_timeout(child: Child, limit: Duration) -> Option<Output> {
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(output) => Some(output.expect("wait for the command")),
        Err(_) => {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            None
        }
    }
}

/// A wrapper for `Server::start_wrapped` that runs the program with its
/// clock shifted by `offset` (`+1h`), with libfaketime preloaded in the same
/// process, so that killing it kills the program.
pub fn clock_ahead(offset: &str) -> Vec<String> {
    let library = ["x86_64-linux-gnu", "aarch64-linux-gnu"]
        .iter()
        .map(|arch| format!("/usr/lib/{arch}/faketime/libfaketimeMT.so.1"))
        .find(|path| std::path::Path::new(path).exists())
        .expect("libfaketime is installed (Debian's faketime package)");
    vec!["env".into(), format!("LD_PRELOAD={library}"), format!("FAKETIME={offset}")]
}

/// Polls `check` every 100 ms until it gives a value or `limit` passes.
pub fn wait_until<T>(limit: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let started = Instant::now();
    loop {
        if let Some(value) = check() {
            return Some(value);
        }
        if started.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The specification's nine-task job; task `fail` (if any) fails every attempt.
pub fn nine_tasks(fail: Option<u32>, sleep_ms: u64) -> String {
    let edges = [(1, 4), (1, 7), (2, 4), (2, 5), (2, 6), (2, 7), (4, 7), (4, 9), (5, 8), (6, 8), (6, 9)];
    let tasks: Vec<String> = (1..=9)
        .map(|i| {
            let deps: Vec<String> = edges.iter().filter(|(_, b)| *b == i).map(|(a, _)| format!("\"{a}\"")).collect();
            let fail = fail == Some(i);
            format!(
                r#"{{"id":"{i}","job_type":"noop","parameters":{{"fail":{fail},"sleep_ms":{sleep_ms}}},"depends_on":[{}]}}"#,
                deps.join(",")
            )
        })
        .collect();
    format!(r#"{{"name":"nine","tasks":[{}]}}"#, tasks.join(","))
}

/// The reference model's states of the nine-task example with task 4 failing.
pub fn nine_tasks_4_failing() -> Vec<(String, String)> {
    [
        ("1", "succeeded"),
        ("2", "succeeded"),
        ("3", "succeeded"),
        ("4", "failed"),
        ("5", "succeeded"),
        ("6", "succeeded"),
        ("7", "upstream_failed"),
        ("8", "succeeded"),
        ("9", "upstream_failed"),
    ]
    .iter()
    .map(|(t, s)| (t.to_string(), s.to_string()))
    .collect()
}

/// Every task of that job that succeeds succeeded on exactly one execution.
pub fn each_succeeded_once(events: &[(String, u32, String)]) {
    for task in ["1", "2", "3", "5", "6", "8"] {
        let succeeded = events.iter().filter(|(t, _, e)| t == task && e == "succeeded").count();
        assert_eq!(succeeded, 1, "task {task} succeeded {succeeded} times: {events:?}");
    }
}

/// (task id, state) pairs of a job JSON as `run --json` and `submit --wait --json` print it.
pub fn states(job: &serde_json::Value) -> Vec<(String, String)> {
    let mut states: Vec<(String, String)> = job["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .map(|t| (t["id"].as_str().unwrap().to_string(), t["state"].as_str().unwrap().to_string()))
        .collect();
    states.sort();
    states
}

/// Exec log lines `JOB TASK ATTEMPT EVENT` of one job, in order.
pub fn exec_events(log: &Path, job: &str) -> Vec<(String, u32, String)> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let parts: Vec<&str> = line.split_whitespace().collect();
            if parts.len() != 4 || parts[0] != job {
                return None;
            }
            Some((parts[1].to_string(), parts[2].parse().ok()?, parts[3].to_string()))
        })
        .collect()
}

/// Sets `job_type`'s global limit to `limit` through the first of a
/// cluster's instances, and waits until every one of them applies it.
pub fn set_global_limit(servers: &[Server], job_type: &str, limit: u32) {
    let setting = format!("global_execution_concurrency={limit}");
    let set = servers[0].cli(&["policy", "set", job_type, &setting]);
    assert!(set.status.success(), "{}", String::from_utf8_lossy(&set.stderr));
    let wanted = limit.to_string();
    for server in servers {
        wait_until(Duration::from_secs(15), || {
            let policy = String::from_utf8_lossy(&server.cli(&["policy", "get", job_type]).stdout).to_string();
            policy
                .lines()
                .any(|l| l.contains("global_execution_concurrency") && l.split_whitespace().any(|w| w == wanted))
                .then_some(())
        })
        .unwrap_or_else(|| panic!("{} does not apply the limit", server.http));
    }
}

/// The most executions of the jobs `of` picks running at once, from the
/// workers' log (`JOB TASK ATTEMPT start|...`; each worker writes an end
/// before it reports it, so a line order is a time order), and how many
/// started in all.
pub fn most_at_once(log: &Path, of: impl Fn(&str) -> bool) -> (i32, usize) {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let (mut running, mut most, mut starts) = (0i32, 0i32, 0);
    for line in text.lines() {
        let parts: Vec<&str> = line.split_whitespace().collect();
        if parts.len() != 4 || !of(parts[0]) {
            continue;
        }
        if parts[3] == "start" {
            running += 1;
            starts += 1;
        } else {
            running -= 1;
        }
        most = most.max(running);
    }
    (most, starts)
}

/// How many times each task started, and how many times it succeeded, from
/// `exec_events` in the order they were written (the log is appended to by
/// every worker, so its order is the order of the events). Panics when a
/// task starts while an execution of it is still running, or an execution
/// ends that is not the one running: never two executions of a task at once.
pub fn executions(events: &[(String, u32, String)]) -> std::collections::BTreeMap<String, (u32, u32)> {
    let mut open: std::collections::BTreeMap<&str, u32> = std::collections::BTreeMap::new();
    let mut counts: std::collections::BTreeMap<String, (u32, u32)> = std::collections::BTreeMap::new();
    for (n, (task, attempt, event)) in events.iter().enumerate() {
        let count = counts.entry(task.clone()).or_default();
        if event == "start" {
            if let Some(running) = open.insert(task, *attempt) {
                panic!("task {task}: attempt {attempt} started while attempt {running} ran (event {n}): {events:?}");
            }
            count.0 += 1;
        } else {
            match open.remove(task.as_str()) {
                Some(running) if running == *attempt => {}
                other => panic!("task {task}: attempt {attempt} {event} while {other:?} ran (event {n}): {events:?}"),
            }
            if event == "succeeded" {
                count.1 += 1;
            }
        }
    }
    counts
}

/// A detector for `noop` on the server's worker stream, as a `weed worker`
/// that only detects would be: the sender of its messages (the hello is
/// sent) and the stream of the admin's requests.
pub async fn noop_detector(
    server: &Server,
    name: &str,
) -> (
    tokio::sync::mpsc::Sender<jobcenter::proto::plugin::WorkerToAdminMessage>,
    tonic::Streaming<jobcenter::proto::plugin::AdminToWorkerMessage>,
) {
    use jobcenter::proto::plugin::{
        plugin_control_service_client::PluginControlServiceClient, worker_to_admin_message::Body, JobTypeCapability,
        WorkerHello, WorkerToAdminMessage,
    };
    let mut client = PluginControlServiceClient::connect(format!("http://{}", server.grpc)).await.unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let hello = WorkerHello {
        worker_id: name.into(),
        worker_instance_id: uuid::Uuid::new_v4().to_string(),
        capabilities: vec![JobTypeCapability {
            job_type: "noop".into(),
            can_detect: true,
            can_execute: false,
            max_detection_concurrency: 1,
            ..JobTypeCapability::default()
        }],
        ..WorkerHello::default()
    };
    tx.send(WorkerToAdminMessage { body: Some(Body::Hello(hello)), ..Default::default() }).await.unwrap();
    let inbound = client.worker_stream(tokio_stream::wrappers::ReceiverStream::new(rx)).await.unwrap().into_inner();
    (tx, inbound)
}

/// A `noop` detector (see `noop_detector`) that answers every detection
/// request with `proposals`; the task ends with the stream, giving how many
/// requests it answered.
pub async fn proposing_detector(
    server: &Server,
    name: &str,
    proposals: Vec<jobcenter::proto::plugin::JobProposal>,
) -> tokio::task::JoinHandle<u32> {
    use jobcenter::proto::plugin::{
        admin_to_worker_message, worker_to_admin_message::Body, DetectionComplete, DetectionProposals,
        WorkerToAdminMessage,
    };
    let (tx, mut inbound) = noop_detector(server, name).await;
    tokio::spawn(async move {
        let mut detections = 0;
        while let Ok(Some(message)) = inbound.message().await {
            if let Some(admin_to_worker_message::Body::RunDetectionRequest(request)) = message.body {
                detections += 1;
                let send = |body| WorkerToAdminMessage { body: Some(body), ..Default::default() };
                let batch = DetectionProposals {
                    request_id: message.request_id.clone(),
                    job_type: request.job_type.clone(),
                    proposals: proposals.clone(),
                    has_more: false,
                };
                let _ = tx.send(send(Body::DetectionProposals(batch))).await;
                let done = DetectionComplete {
                    request_id: message.request_id,
                    job_type: request.job_type,
                    success: true,
                    total_proposals: proposals.len() as i32,
                    ..DetectionComplete::default()
                };
                let _ = tx.send(send(Body::DetectionComplete(done))).await;
            }
        }
        detections
    })
}
