//! The worker fleet benchmark: N worker streams from one process against
//! one admin server process on loopback, each stream a worker as `weed
//! worker` is one (a hello with a few job types, a heartbeat every 15 s, no
//! lease; it runs what it is sent at once and reconnects when its stream
//! breaks). For each N it measures the admin's memory per connected worker,
//! its CPU per heartbeat, whether a heartbeat went missing, the time for
//! all N to register again after the admin is killed and started again (a
//! reconnect storm), a 10,000-task job spread over the fleet, and how fast
//! the console's reads answer meanwhile.
//!
//! `cargo bench --bench workers` runs N = 1,000, 5,000 and 10,000;
//! `cargo bench --bench workers -- 2000 3000` the sizes given. Each size
//! prints one JSON line.
#![allow(clippy::print_stdout)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use jobcenter::proto::api::{self, job_service_client::JobServiceClient};
use jobcenter::proto::plugin::plugin_control_service_client::PluginControlServiceClient;
use jobcenter::proto::plugin::{
    admin_to_worker_message, worker_to_admin_message, AdminRuntimeDefaults, ConfigSchemaResponse, JobCompleted,
    JobTypeCapability, JobTypeDescriptor, WorkerAcknowledge, WorkerHeartbeat, WorkerHello, WorkerToAdminMessage,
};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::transport::Endpoint;

/// How often each worker heartbeats, as `weed worker` does.
const HEARTBEAT: Duration = Duration::from_secs(15);
/// The job types every worker declares; the job's tasks are of the first.
const JOB_TYPES: [&str; 3] = ["fleet", "fleet_vacuum", "fleet_balance"];
/// Execution slots of each worker.
const SLOTS: i32 = 2;
/// Tasks of the job spread over the fleet, in layers of `LAYER`.
const TASKS: usize = 10_000;
const LAYER: usize = 1_000;
/// How long the admin's CPU is counted while the fleet only heartbeats.
const QUIET: Duration = Duration::from_secs(30);
/// The longest any phase may take before the benchmark gives up on it.
const PHASE_LIMIT: Duration = Duration::from_secs(300);

#[derive(Default)]
struct Fleet {
    /// Workers whose hello the admin accepted and whose stream is open.
    connected: AtomicUsize,
    /// Heartbeats sent, over every session.
    heartbeats: AtomicU64,
    /// Streams that ended while the benchmark did not end them.
    breaks: AtomicU64,
    /// Connection or hello attempts that failed.
    failed_connects: AtomicU64,
    executed: AtomicU64,
    /// Heartbeats sent on each worker's current session.
    beats: Vec<AtomicU32>,
}

fn main() -> anyhow::Result<()> {
    let sizes: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.replace([',', '_'], "").parse().ok()).collect();
    let sizes = if sizes.is_empty() { vec![1_000, 5_000, 10_000] } else { sizes };
    let limit = raise_descriptor_limit();
    eprintln!("file descriptors: soft limit now {limit}");
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    for n in sizes {
        let result = runtime.block_on(run(n))?;
        println!("{result}");
    }
    Ok(())
}

/// Raises this process's soft limit of open files to its hard limit; the new soft limit.
fn raise_descriptor_limit() -> u64 {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else { return 0 };
    if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
        return hard;
    }
    soft
}

/// The admin server: its process and the addresses it listens on.
struct Admin {
    child: Child,
    http: String,
    grpc: String,
}

impl Admin {
    fn start(exe: &Path, dir: &Path, http: &str, grpc: &str) -> anyhow::Result<Admin> {
        let grpc_port = grpc.rsplit(':').next().unwrap_or("0");
        let mut child = Command::new(exe)
            .args(["server", "--data-dir", &dir.display().to_string(), "--http", http, "--grpc", grpc_port])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        let stderr = child.stderr.take().expect("piped");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut sent = false;
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                match line.strip_prefix("jobcenter server listening: ") {
                    Some(rest) if !sent => {
                        let _ = tx.send(rest.to_string());
                        sent = true;
                    }
                    _ => eprintln!("admin: {line}"),
                }
            }
        });
        let line = rx.recv_timeout(Duration::from_secs(60))?;
        let parts: Vec<&str> = line.split_whitespace().collect();
        Ok(Admin { child, http: parts[1].to_string(), grpc: parts[3].to_string() })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Resident memory now, in bytes.
    fn rss(&self) -> u64 {
        status_kib(self.pid(), "VmRSS:") * 1024
    }

    /// CPU time used so far by the admin's threads, in nanoseconds.
    fn cpu_ns(&self) -> u64 {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{}/task", self.pid())) else { return 0 };
        tasks
            .flatten()
            .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
            .filter_map(|s| s.split_whitespace().next().and_then(|n| n.parse::<u64>().ok()))
            .sum()
    }

    async fn get(&self, path: &str) -> anyhow::Result<Value> {
        Ok(jobcenter::wire::http_get_json(&self.http, path).await?)
    }

    /// Workers the admin has registered now.
    async fn registered(&self) -> usize {
        self.get("/api/workers?limit=1").await.ok().and_then(|v| v["total"].as_u64()).unwrap_or(0) as usize
    }

    /// Every worker the admin lists, a page at a time.
    async fn workers(&self) -> anyhow::Result<Vec<Value>> {
        let mut all = Vec::new();
        loop {
            let page = self.get(&format!("/api/workers?offset={}&limit=1000", all.len())).await?;
            let workers = page["workers"].as_array().cloned().unwrap_or_default();
            let total = page["total"].as_u64().unwrap_or(0) as usize;
            if workers.is_empty() || all.len() + workers.len() >= total {
                all.extend(workers);
                return Ok(all);
            }
            all.extend(workers);
        }
    }
}

impl Drop for Admin {
    fn drop(&mut self) {
        self.kill();
    }
}

fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// Waits until `done` holds, checking every 100 ms; the time it took.
async fn until(what: &str, mut done: impl AsyncFnMut() -> bool) -> anyhow::Result<Duration> {
    let start = Instant::now();
    while !done().await {
        anyhow::ensure!(start.elapsed() < PHASE_LIMIT, "{what}: not done within {PHASE_LIMIT:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(start.elapsed())
}

/// The console's reads, timed every 250 ms while a phase runs.
#[derive(Default)]
struct Probe {
    millis: Mutex<Vec<f64>>,
    failed: AtomicU64,
}

impl Probe {
    fn start(http: String, stop: CancellationToken) -> (Arc<Probe>, tokio::task::JoinHandle<()>) {
        let probe = Arc::new(Probe::default());
        let mine = probe.clone();
        let task = tokio::spawn(async move {
            while !stop.is_cancelled() {
                for path in ["/api/workers?limit=100", "/api/overview"] {
                    let start = Instant::now();
                    match jobcenter::wire::http_get_json(&http, path).await {
                        Ok(_) => mine.millis.lock().expect("probe").push(start.elapsed().as_secs_f64() * 1e3),
                        Err(_) => {
                            mine.failed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                tokio::select! {
                    () = stop.cancelled() => {}
                    () = tokio::time::sleep(Duration::from_millis(250)) => {}
                }
            }
        });
        (probe, task)
    }

    fn summary(&self) -> Value {
        let mut m = self.millis.lock().expect("probe").clone();
        m.sort_by(f64::total_cmp);
        let at = |q: f64| m.get(((m.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or(0.0);
        serde_json::json!({
            "reads": m.len(), "failed": self.failed.load(Ordering::Relaxed),
            "p50_ms": at(0.5), "p99_ms": at(0.99), "max_ms": m.last().copied().unwrap_or(0.0),
        })
    }
}

async fn run(n: usize) -> anyhow::Result<Value> {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_jobcenter"));
    let dir = std::env::temp_dir().join(format!("jobcenter-fleet-{}", uuid::Uuid::new_v4()));
    let outcome = measure(&exe, &dir, n).await;
    let _ = std::fs::remove_dir_all(&dir);
    outcome
}

async fn measure(exe: &Path, dir: &Path, n: usize) -> anyhow::Result<Value> {
    let mut admin = Admin::start(exe, dir, "127.0.0.1:0", "0")?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (idle_rss, idle_cpu) = (admin.rss(), admin.cpu_ns());
    tokio::time::sleep(Duration::from_secs(5)).await;
    let idle_cpu_per_s = (admin.cpu_ns() - idle_cpu) as f64 / 5.0;

    let fleet = Arc::new(Fleet { beats: (0..n).map(|_| AtomicU32::new(0)).collect(), ..Fleet::default() });
    let stop = CancellationToken::new();
    let url: Arc<str> = Arc::from(format!("http://{}", admin.grpc));
    let workers = tokio_util::task::TaskTracker::new();
    for i in 0..n {
        workers.spawn(worker(i, url.clone(), fleet.clone(), stop.clone()));
    }
    let first_connect = until("the first connections", async || {
        fleet.connected.load(Ordering::Relaxed) == n && admin.registered().await == n
    })
    .await?;

    // Every worker heartbeats a few times; then the admin's CPU is counted
    // over a quiet stretch of heartbeats only.
    tokio::time::sleep(HEARTBEAT + Duration::from_secs(2)).await;
    let (cpu_before, beats_before, breaks_before) =
        (admin.cpu_ns(), fleet.heartbeats.load(Ordering::Relaxed), fleet.breaks.load(Ordering::Relaxed));
    tokio::time::sleep(QUIET).await;
    let cpu = admin.cpu_ns() - cpu_before;
    let beats = fleet.heartbeats.load(Ordering::Relaxed) - beats_before;
    let quiet_breaks = fleet.breaks.load(Ordering::Relaxed) - breaks_before;
    let held_rss = admin.rss();
    let missed = missed_heartbeats(&admin, &fleet).await?;

    // The reconnect storm: the admin is killed and started again on the same ports.
    let (http, grpc) = (admin.http.clone(), admin.grpc.clone());
    admin.kill();
    until("the streams breaking", async || fleet.connected.load(Ordering::Relaxed) == 0).await?;
    let storm_probe_stop = CancellationToken::new();
    let restarted = Instant::now();
    let admin = Admin::start(exe, dir, &http, &grpc)?;
    let listening = restarted.elapsed();
    let (storm_probe, storm_probing) = Probe::start(admin.http.clone(), storm_probe_stop.clone());
    until("the reconnect storm", async || {
        fleet.connected.load(Ordering::Relaxed) == n && admin.registered().await == n
    })
    .await?;
    let storm = restarted.elapsed();
    storm_probe_stop.cancel();
    let _ = storm_probing.await;
    let storm_rss = admin.rss();

    // A 10,000-task job spread over the fleet.
    let job_probe_stop = CancellationToken::new();
    let (job_probe, job_probing) = Probe::start(admin.http.clone(), job_probe_stop.clone());
    let executed_before = fleet.executed.load(Ordering::Relaxed);
    let job = job_outcome(&admin).await;
    job_probe_stop.cancel();
    let _ = job_probing.await;
    let job = job?;
    let executed = fleet.executed.load(Ordering::Relaxed) - executed_before;
    let job_rss = admin.rss();
    let peak_rss = status_kib(admin.pid(), "VmHWM:") * 1024;

    stop.cancel();
    workers.close();
    workers.wait().await;
    drop(admin);
    Ok(serde_json::json!({
        "workers": n,
        "first_connect_s": first_connect.as_secs_f64(),
        "admin_rss_idle_mib": mib(idle_rss),
        "admin_rss_held_mib": mib(held_rss),
        "admin_rss_per_worker_kib": (held_rss.saturating_sub(idle_rss)) as f64 / 1024.0 / n as f64,
        "admin_idle_cpu_ms_per_s": idle_cpu_per_s / 1e6,
        "heartbeats_counted": beats,
        "admin_cpu_per_heartbeat_us": cpu as f64 / 1e3 / beats.max(1) as f64,
        "heartbeats_missed": missed,
        "streams_broken_while_quiet": quiet_breaks,
        "storm_listening_s": listening.as_secs_f64(),
        "storm_settled_s": storm.as_secs_f64(),
        "storm_failed_connects": fleet.failed_connects.load(Ordering::Relaxed),
        "storm_reads": storm_probe.summary(),
        "admin_rss_after_storm_mib": mib(storm_rss),
        "job": job,
        "job_executions": executed,
        "job_reads": job_probe.summary(),
        "admin_rss_after_job_mib": mib(job_rss),
        "admin_peak_rss_after_restart_mib": mib(peak_rss),
    }))
}

/// Workers whose heartbeats the admin has not all counted, or whose last
/// one it heard longer ago than an interval and a half.
async fn missed_heartbeats(admin: &Admin, fleet: &Fleet) -> anyhow::Result<usize> {
    let listed = admin.workers().await?;
    let now_ms = jobcenter::clock::Clock::now(&jobcenter::clock::SystemClock).as_millis();
    let by_id: HashMap<&str, &Value> = listed.iter().filter_map(|w| Some((w["worker_id"].as_str()?, w))).collect();
    let late = HEARTBEAT.as_millis() as i64 * 3 / 2;
    Ok((0..fleet.beats.len())
        .filter(|i| {
            let Some(w) = by_id.get(format!("fleet-{i}").as_str()) else { return true };
            let sent = fleet.beats[*i].load(Ordering::Relaxed);
            let counted = w["heartbeats"].as_u64().unwrap_or(0) as u32;
            let last = w["last_heartbeat_ms"].as_i64().unwrap_or(0);
            // One may be on its way while the list is read.
            counted + 1 < sent || now_ms - last > late
        })
        .count())
}

/// Submits the job and waits for its end: makespan and dispatch latency.
async fn job_outcome(admin: &Admin) -> anyhow::Result<Value> {
    // Layers as wide as the fleet's slots allow, each task after three of
    // the layer before: every task but the first layer's is released by a
    // completion, so that the dispatch latency is measured.
    let tasks: Vec<Value> = (0..TASKS)
        .map(|i| {
            let (layer, at) = (i / LAYER, i % LAYER);
            let after: Vec<String> = match layer {
                0 => Vec::new(),
                _ => (0..3).map(|k| format!("t{}", (layer - 1) * LAYER + (at + k * 337) % LAYER)).collect(),
            };
            serde_json::json!({"id": format!("t{i}"), "job_type": JOB_TYPES[0], "depends_on": after})
        })
        .collect();
    let content = serde_json::to_vec(&serde_json::json!({"name": "fleet", "tasks": tasks}))?;
    let channel = Endpoint::from_shared(format!("http://{}", admin.grpc))?.connect().await?;
    let mut client = JobServiceClient::new(channel).max_decoding_message_size(64 * 1024 * 1024);
    let started = Instant::now();
    let request = api::SubmitJobRequest { content, format: "json".into(), ..Default::default() };
    let job_id = client.submit_job(request).await?.into_inner().job_id;
    let ended = client.wait_job(api::JobRef { job_id }).await?.into_inner();
    let makespan = started.elapsed().as_secs_f64();
    let stats = admin.get("/api/stats").await?;
    Ok(serde_json::json!({
        "state": ended.state,
        "tasks": ended.tasks,
        "makespan_s": makespan,
        "tasks_per_s": f64::from(ended.tasks) / makespan,
        "dispatch_p50_us": stats["dispatch"]["p50_us"],
        "dispatch_p99_us": stats["dispatch"]["p99_us"],
    }))
}

fn envelope(worker_id: &str, body: worker_to_admin_message::Body) -> WorkerToAdminMessage {
    WorkerToAdminMessage { worker_id: worker_id.to_string(), sent_at: None, body: Some(body) }
}

fn hello(worker_id: &str, instance: &str) -> worker_to_admin_message::Body {
    let capabilities = JOB_TYPES
        .iter()
        .map(|t| JobTypeCapability {
            job_type: t.to_string(),
            can_execute: true,
            max_execution_concurrency: SLOTS,
            ..JobTypeCapability::default()
        })
        .collect();
    worker_to_admin_message::Body::Hello(WorkerHello {
        worker_id: worker_id.to_string(),
        worker_instance_id: instance.to_string(),
        address: String::new(),
        worker_version: "fleet".into(),
        protocol_version: "1".into(),
        capabilities,
        metadata: Default::default(),
    })
}

fn heartbeat(worker_id: &str) -> worker_to_admin_message::Body {
    worker_to_admin_message::Body::Heartbeat(WorkerHeartbeat {
        worker_id: worker_id.to_string(),
        execution_slots_total: SLOTS,
        ..WorkerHeartbeat::default()
    })
}

/// One worker: sessions, one after the other, until the benchmark ends.
async fn worker(i: usize, url: Arc<str>, fleet: Arc<Fleet>, stop: CancellationToken) {
    let worker_id = format!("fleet-{i}");
    let instance = uuid::Uuid::new_v4().to_string();
    let mut delay = Duration::from_millis(250);
    while !stop.is_cancelled() {
        match session(i, &worker_id, &instance, &url, &fleet, &stop).await {
            Ok(()) => delay = Duration::from_millis(250),
            Err(_) => {
                fleet.failed_connects.fetch_add(1, Ordering::Relaxed);
            }
        }
        // A worker whose stream broke tries again at once, and then backs off.
        let jitter = Duration::from_millis(rand_below(delay.as_millis() as u64));
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(delay / 2 + jitter / 2) => {}
        }
        delay = (delay * 2).min(Duration::from_secs(5));
    }
}

fn rand_below(n: u64) -> u64 {
    uuid::Uuid::new_v4().as_u64_pair().0 % n.max(1)
}

/// One stream: Ok once it was accepted (and ended), Err when it never was.
async fn session(
    i: usize,
    worker_id: &str,
    instance: &str,
    url: &str,
    fleet: &Fleet,
    stop: &CancellationToken,
) -> anyhow::Result<()> {
    let channel = Endpoint::from_shared(url.to_string())?
        .connect_timeout(Duration::from_secs(10))
        .tcp_nodelay(true)
        .connect()
        .await?;
    let mut client = PluginControlServiceClient::new(channel);
    let (tx, rx) = mpsc::channel(64);
    tx.send(envelope(worker_id, hello(worker_id, instance))).await?;
    let mut inbound = client.worker_stream(tokio_stream::wrappers::ReceiverStream::new(rx)).await?.into_inner();
    match inbound.message().await?.and_then(|m| m.body) {
        Some(admin_to_worker_message::Body::Hello(h)) if h.accepted => {}
        other => anyhow::bail!("not accepted: {other:?}"),
    }
    fleet.beats[i].store(0, Ordering::Relaxed);
    fleet.connected.fetch_add(1, Ordering::Relaxed);
    let ended = serve(i, worker_id, &tx, &mut inbound, fleet, stop).await;
    fleet.connected.fetch_sub(1, Ordering::Relaxed);
    if !stop.is_cancelled() {
        fleet.breaks.fetch_add(1, Ordering::Relaxed);
    }
    ended
}

async fn serve(
    i: usize,
    worker_id: &str,
    tx: &mpsc::Sender<WorkerToAdminMessage>,
    inbound: &mut tonic::Streaming<jobcenter::proto::plugin::AdminToWorkerMessage>,
    fleet: &Fleet,
    stop: &CancellationToken,
) -> anyhow::Result<()> {
    use admin_to_worker_message::Body;
    let mut beat = tokio::time::interval(HEARTBEAT);
    loop {
        let message = tokio::select! {
            () = stop.cancelled() => return Ok(()),
            _ = beat.tick() => {
                tx.send(envelope(worker_id, heartbeat(worker_id))).await?;
                fleet.heartbeats.fetch_add(1, Ordering::Relaxed);
                fleet.beats[i].fetch_add(1, Ordering::Relaxed);
                continue;
            }
            message = inbound.message() => match message {
                Ok(Some(message)) => message,
                Ok(None) | Err(_) => return Ok(()),
            },
        };
        let reply = match message.body {
            Some(Body::ExecuteJobRequest(request)) => {
                let job = request.job.unwrap_or_default();
                fleet.executed.fetch_add(1, Ordering::Relaxed);
                worker_to_admin_message::Body::JobCompleted(JobCompleted {
                    request_id: request.request_id,
                    job_id: job.job_id,
                    job_type: job.job_type,
                    success: true,
                    ..JobCompleted::default()
                })
            }
            Some(Body::RequestConfigSchema(asked)) => {
                worker_to_admin_message::Body::ConfigSchemaResponse(descriptor(message.request_id, &asked.job_type))
            }
            Some(Body::CancelRequest(_)) => worker_to_admin_message::Body::Acknowledge(WorkerAcknowledge {
                request_id: message.request_id,
                accepted: true,
                message: String::new(),
            }),
            _ => continue,
        };
        tx.send(envelope(worker_id, reply)).await?;
    }
}

fn descriptor(request_id: String, job_type: &str) -> ConfigSchemaResponse {
    ConfigSchemaResponse {
        request_id,
        job_type: job_type.to_string(),
        success: true,
        error_message: String::new(),
        job_type_descriptor: Some(JobTypeDescriptor {
            job_type: job_type.to_string(),
            display_name: job_type.to_string(),
            descriptor_version: 1,
            admin_runtime_defaults: Some(AdminRuntimeDefaults {
                enabled: true,
                max_jobs_per_detection: 1000,
                global_execution_concurrency: 100_000,
                per_worker_execution_concurrency: SLOTS,
                detection_timeout_seconds: 45,
                job_type_max_runtime_seconds: 1800,
                ..AdminRuntimeDefaults::default()
            }),
            ..JobTypeDescriptor::default()
        }),
    }
}
