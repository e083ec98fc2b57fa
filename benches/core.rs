//! Benchmarks of the core engine, durable (every step flushed): follower
//! transitions per second, submitting a million-task job, propagating a
//! failure over a million descendants, and restarting with a million tasks
//! stored. On the embedded sled store, or, with `BENCH_DATABASE_URL=URL`, on
//! PostgreSQL (each scenario in a fresh database created beside the one the
//! URL names, and dropped after).
//!
//! `cargo bench --bench core` runs every scenario RUNS times, each in a fresh
//! child process (so peak RSS is the scenario's own), and prints the median.
//! `cargo bench --bench core -- SCENARIO` runs one scenario once;
//! `cargo bench --bench core -- job-file PATH` writes the job of
//! `transitions` to PATH, for `BENCH_JOB_FILE=PATH` to read.
#![allow(clippy::print_stdout)]

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use jobcenter::clock::SystemClock;
use jobcenter::dispatch::{HandlerSpec, WorkOrder};
use jobcenter::engine::{Engine, EngineHandle, Options, Orphans};
use jobcenter::follower::Outcome;
use jobcenter::jobfile::{self, Limits};
use jobcenter::model::{HandlerId, JobOrigin, JobState};
use jobcenter::store::{PasswordSources, ScratchDatabase, SledStore, Store};
use jobcenter::worker::{builtin_handlers, LocalExecutor, Registry};

/// The allocator the `jobcenter` binary uses, so that the figures are its own.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const RUNS: usize = 3;
const SCENARIOS: [&str; 7] = ["flush", "floor", "transitions", "submit", "propagate", "restart", "orphans"];

/// A seeded layered DAG in the job file format, like `gen_dag.py --shape layered`.
fn layered(n: usize, width: usize, fanin: usize, extra: &str) -> String {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut out = String::with_capacity(n * 80);
    out.push_str(&format!(r#"{{"name":"layered-{n}","tasks":["#));
    for i in 0..n {
        let layer = i / width;
        let mut deps: Vec<usize> = Vec::new();
        if layer > 0 {
            let start = (layer - 1) * width;
            while deps.len() < fanin.min(width) {
                let d = start + (next() as usize % width);
                if !deps.contains(&d) {
                    deps.push(d);
                }
            }
            deps.sort_unstable();
        }
        let deps: Vec<String> = deps.iter().map(|d| format!("\"t{d}\"")).collect();
        if i > 0 {
            out.push(',');
        }
        out.push_str(&format!(
            r#"{{"id":"t{i}","job_type":"noop","parameters":{{{extra}}},"depends_on":[{}]}}"#,
            deps.join(",")
        ));
    }
    out.push_str("]}");
    out
}

/// A binary out-tree: each task releases two children; the root fails.
fn tree(n: usize) -> String {
    let mut out = String::with_capacity(n * 70);
    out.push_str(&format!(r#"{{"name":"tree-{n}","tasks":["#));
    for i in 0..n {
        if i > 0 {
            out.push(',');
        }
        let deps = if i == 0 { String::new() } else { format!("\"t{}\"", (i - 1) / 2) };
        let fail = i == 0;
        out.push_str(&format!(
            r#"{{"id":"t{i}","job_type":"noop","parameters":{{"fail":{fail}}},"depends_on":[{deps}]}}"#
        ));
    }
    out.push_str("]}");
    out
}

fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
        .unwrap_or(0.0)
}

/// CPU seconds (user and system) each of this process's live threads has
/// used, summed by name with trailing digits dropped (`sled-io-3` counts as
/// `sled-io`); read from `/proc`, whose ticks are 1/100 s on Linux.
fn cpu_by_thread() -> std::collections::BTreeMap<String, f64> {
    let mut by_name = std::collections::BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return by_name };
    for task in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else { continue };
        // The name is in parentheses and may hold spaces; fields follow it.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else { continue };
        let name = stat[open + 1..close].trim_end_matches(|c: char| c.is_ascii_digit()).trim_end_matches('-');
        let fields: Vec<&str> = stat[close + 1..].split_whitespace().collect();
        // utime and stime are the 14th and 15th fields, the 12th and 13th after the name.
        let ticks: f64 = fields.iter().skip(11).take(2).filter_map(|f| f.parse::<f64>().ok()).sum();
        *by_name.entry(name.to_string()).or_insert(0.0) += ticks / 100.0;
    }
    by_name
}

/// The CPU seconds each thread name used between two readings.
fn cpu_used(
    before: &std::collections::BTreeMap<String, f64>,
    after: &std::collections::BTreeMap<String, f64>,
) -> serde_json::Value {
    let used: serde_json::Map<String, serde_json::Value> = after
        .iter()
        .map(|(name, &s)| {
            (name.clone(), serde_json::json!(((s - before.get(name).unwrap_or(&0.0)) * 100.0).round() / 100.0))
        })
        .filter(|(_, s)| s.as_f64().is_some_and(|s| s > 0.0))
        .collect();
    serde_json::Value::Object(used)
}

/// The scenario's database, when it runs on PostgreSQL.
static SCRATCH: std::sync::Mutex<Option<ScratchDatabase>> = std::sync::Mutex::new(None);

/// The store a scenario runs on: sled in `path`, or the scenario's database.
fn open_store(path: &Path) -> Arc<dyn Store> {
    let Ok(url) = std::env::var("BENCH_DATABASE_URL") else {
        return Arc::new(SledStore::open(path).expect("open store"));
    };
    let url = {
        let mut scratch = SCRATCH.lock().unwrap();
        if scratch.is_none() {
            *scratch = Some(ScratchDatabase::create(&url, &PasswordSources::default()).expect("scratch database"));
        }
        scratch.as_ref().unwrap().url().to_string()
    };
    let location = jobcenter::store::Location::Database { url, passwords: PasswordSources::default() };
    location.open().expect("open the database")
}

fn parse(text: &str) -> jobcenter::model::JobSpec {
    jobfile::parse(text.as_bytes(), jobfile::Format::Json, "bench", &Limits::default()).expect("valid")
}

async fn engine(path: &Path) -> EngineHandle {
    let store = open_store(path);
    Engine::start(store, Arc::new(SystemClock), Options { orphans: Orphans::Requeue, ..Options::default() })
        .await
        .expect("engine")
}

async fn transitions(dir: &Path) -> serde_json::Value {
    let n = 100_000;
    // BENCH_TERMS=1: the same under windows, a rate limit, a budget (of
    // other job types; `budgeted`: of noop) and priorities cycling by task.
    // BENCH_TERMS=plain, what to compare them with: the concurrency limits
    // every job type of a server has, and a priority named on every task,
    // all `normal` (the same job file but for the names).
    let terms = std::env::var("BENCH_TERMS").ok();
    // BENCH_JOB_FILE=PATH: the job text as `core -- job-file PATH` wrote it,
    // so that a count of instructions leaves out making it.
    let mut text = match std::env::var_os("BENCH_JOB_FILE") {
        Some(path) => std::fs::read_to_string(path).expect("BENCH_JOB_FILE"),
        None => layered(n, 100, 3, ""),
    };
    if terms.is_some() {
        let names = match terms.as_deref() {
            Some("plain") => ["normal"; 4],
            _ => ["low", "normal", "high", "critical"],
        };
        let mut parts = text.split(r#""job_type":"noop""#);
        let mut out = parts.next().unwrap_or_default().to_string();
        for (i, part) in parts.enumerate() {
            out.push_str(&format!(r#""job_type":"noop","priority":"{}""#, names[i % 4]));
            out.push_str(part);
        }
        text = out;
    }
    // The engine starts first: what a count of instructions made with
    // `--zero-before=jobcenter::jobfile::parse_with` leaves out is the
    // process's and the store's start.
    let engine = engine(dir).await;
    let spec = parse(&text);
    match terms.as_deref() {
        None => {}
        Some("plain") => engine.set_bench_limits("noop", false).await.unwrap(),
        Some(terms) => engine.set_bench_terms("noop", terms == "budgeted").await.unwrap(),
    }
    LocalExecutor::start(engine.clone(), Registry::new(builtin_handlers()), 1024, None).await.unwrap();
    let commits = Arc::new(std::sync::Mutex::new((0u64, Duration::ZERO, Duration::ZERO)));
    let counted = commits.clone();
    engine.on_commit(Arc::new(move |whole, flush| {
        let mut c = counted.lock().unwrap();
        *c = (c.0 + 1, c.1 + whole, c.2 + flush);
    }));
    let started = Instant::now();
    let job = engine.submit(spec, JobOrigin::User).await.unwrap();
    let submitted = started.elapsed();
    let before = *commits.lock().unwrap();
    let cpu_before = cpu_by_thread();
    let record = engine.wait(job).await.unwrap();
    let elapsed = started.elapsed() - submitted;
    let cpu_after = cpu_by_thread();
    let after = *commits.lock().unwrap();
    assert_eq!(record.state, JobState::Succeeded);
    let count = after.0 - before.0;
    serde_json::json!({
        "tasks": n,
        "seconds": elapsed.as_secs_f64(),
        "transitions_per_s": n as f64 / elapsed.as_secs_f64(),
        "peak_rss_mib": peak_rss_mib(),
        "commits": count,
        "tasks_per_commit": n as f64 / count.max(1) as f64,
        "committing_s": (after.1 - before.1).as_secs_f64(),
        "flushing_s": (after.2 - before.2).as_secs_f64(),
        "cpu_s_by_thread": cpu_used(&cpu_before, &cpu_after),
        "cpu_s": cpu_after.values().sum::<f64>() - cpu_before.values().sum::<f64>(),
    })
}

async fn submit(dir: &Path) -> serde_json::Value {
    let n = 1_000_000;
    let file = dir.join("job.json");
    std::fs::write(&file, layered(n, 100, 3, "")).unwrap();
    let engine = engine(&dir.join("data")).await;
    let started = Instant::now();
    let path = file.clone();
    let spec =
        tokio::task::spawn_blocking(move || jobfile::read_file(&path, &Limits::default()).unwrap()).await.unwrap();
    let validated = started.elapsed();
    let job = engine.submit(spec, JobOrigin::User).await.unwrap();
    let elapsed = started.elapsed();
    std::hint::black_box(job);
    serde_json::json!({
        "tasks": n,
        "read_and_validate_s": validated.as_secs_f64(),
        "submit_s": elapsed.as_secs_f64(),
        "peak_rss_mib": peak_rss_mib(),
    })
}

async fn propagate(dir: &Path) -> serde_json::Value {
    let n = 1_000_000;
    let spec = parse(&tree(n));
    let engine = engine(dir).await;
    let job = engine.submit(spec, JobOrigin::User).await.unwrap();
    let handler = HandlerId::new();
    let (sink, mut orders) = tokio::sync::mpsc::unbounded_channel();
    engine
        .connected(HandlerSpec {
            handler,
            job_types: None,
            capacity: 1,
            type_capacity: Default::default(),
            starts_running: true,
            session: 0,
            sink,
            place: Default::default(),
        })
        .await
        .unwrap();
    let Some(WorkOrder::Execute(root)) = orders.recv().await else { panic!("the root is dispatched") };
    let started = Instant::now();
    let failed = Outcome::Failed { error: "root fails".into(), output: vec![] };
    engine.complete(root.attempt, handler, failed).await.unwrap().unwrap();
    let elapsed = started.elapsed();
    let record = engine.wait(job).await.unwrap();
    assert_eq!(record.state, JobState::Failed);
    serde_json::json!({
        "descendants": n - 1,
        "propagate_s": elapsed.as_secs_f64(),
        "peak_rss_mib": peak_rss_mib(),
    })
}

async fn restart(dir: &Path) -> serde_json::Value {
    let n = 1_000_000;
    {
        let spec = parse(&layered(n, 100, 3, ""));
        let engine = engine(dir).await;
        engine.submit(spec, JobOrigin::User).await.unwrap();
    }
    // The first engine's threads let go of the directory shortly after its handles drop.
    std::thread::sleep(Duration::from_millis(500));
    let started = Instant::now();
    let engine = engine(dir).await;
    let jobs = engine.active_jobs().await.unwrap();
    let elapsed = started.elapsed();
    assert_eq!(jobs.len(), 1);
    serde_json::json!({ "tasks_stored": n, "serving_after_s": elapsed.as_secs_f64() })
}

/// The floor under every durable step: one small batch written and flushed.
async fn flush(dir: &Path) -> serde_json::Value {
    use jobcenter::clock::Timestamp;
    use jobcenter::model::{JobId, TaskIdx, TaskRecord};
    use jobcenter::store::Batch;
    let store = open_store(dir);
    let job = JobId::new();
    let mut latencies = Vec::new();
    for i in 0..2000u32 {
        let mut batch = Batch::default();
        batch.tasks.push((job, TaskIdx(i % 100), TaskRecord::initial(false, Timestamp(i64::from(i)))));
        let started = Instant::now();
        store.write(&batch).unwrap();
        store.flush().unwrap();
        latencies.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    let tail: Vec<f64> = latencies[1000..].to_vec();
    serde_json::json!({ "write_and_flush_ms": median(tail) })
}

/// The floor under a dependent step through worker processes: one small
/// batch flushed (as `flush`) plus one message to the server and one back
/// on loopback gRPC (a unary call to a running server that does next to
/// no work for it).
async fn floor(dir: &Path) -> serde_json::Value {
    let flush_ms = flush(dir).await["write_and_flush_ms"].as_f64().unwrap();
    let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = grpc.local_addr().unwrap();
    let store: Arc<dyn jobcenter::store::Store> = Arc::new(jobcenter::store::MemoryStore::new());
    let options = jobcenter::server::ServerOptions::default();
    tokio::spawn(jobcenter::server::run(store, options, http, grpc, std::future::pending()));
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{address}")).unwrap();
    let channel = loop {
        match endpoint.connect().await {
            Ok(channel) => break channel,
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    };
    let mut client = jobcenter::proto::api::job_service_client::JobServiceClient::new(channel);
    let mut latencies = Vec::new();
    for _ in 0..3000 {
        let started = Instant::now();
        client.list_workers(jobcenter::proto::api::ListWorkersRequest::default()).await.unwrap();
        latencies.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    let round_trip_ms = median(latencies[1000..].to_vec());
    serde_json::json!({ "flush_ms": flush_ms, "round_trip_ms": round_trip_ms, "floor_ms": flush_ms + round_trip_ms })
}

/// 1,000 attempts held by a handler of a previous run, with 1,000,000 tasks
/// stored: the time from the restart to the recovery check having
/// resubmitted them all (snapshot, rules, actions, flush).
async fn orphans(dir: &Path) -> serde_json::Value {
    let n = 1_000_000;
    {
        let spec = parse(&layered(n, 1000, 3, ""));
        let engine = engine_keep(dir).await;
        engine.submit(spec, JobOrigin::User).await.unwrap();
        let handler = HandlerId::new();
        let (sink, mut orders) = tokio::sync::mpsc::unbounded_channel();
        let spec = HandlerSpec {
            handler,
            job_types: None,
            capacity: 1000,
            type_capacity: Default::default(),
            starts_running: true,
            session: 0,
            sink,
            place: Default::default(),
        };
        engine.connected(spec).await.unwrap();
        for _ in 0..1000 {
            orders.recv().await.expect("an assignment");
        }
    }
    std::thread::sleep(Duration::from_millis(500));
    let started = Instant::now();
    let engine = engine_keep(dir).await;
    let serving = started.elapsed();
    let (jobs, _) = engine.recovery_snapshot().await.unwrap();
    let snapshot = jobcenter_recovery::Snapshot {
        now: i64::MAX / 2,
        config: jobcenter_recovery::Config::default(),
        handlers: Default::default(),
        jobs,
    };
    let findings = jobcenter_recovery::check(&snapshot);
    let applied = engine.apply_recovery(findings.iter().map(|f| (f.rule, f.action.clone())).collect()).await.unwrap();
    let resubmitted = started.elapsed();
    assert_eq!(applied.iter().filter(|a| **a).count(), 1000);
    serde_json::json!({
        "tasks_stored": n,
        "orphans": 1000,
        "serving_after_s": serving.as_secs_f64(),
        "resubmitted_after_s": resubmitted.as_secs_f64(),
    })
}

async fn engine_keep(path: &Path) -> EngineHandle {
    let store = open_store(path);
    Engine::start(
        store,
        Arc::new(SystemClock),
        Options { orphans: Orphans::Keep { grace: std::time::Duration::from_secs(30) }, ..Options::default() },
    )
    .await
    .expect("engine")
}

fn run_one(name: &str) {
    let dir = tempfile::tempdir_in(std::env::var("BENCH_DIR").unwrap_or_else(|_| ".".into())).unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let result = runtime.block_on(async {
        match name {
            "flush" => flush(dir.path()).await,
            "floor" => floor(dir.path()).await,
            "transitions" => transitions(dir.path()).await,
            "submit" => submit(dir.path()).await,
            "propagate" => propagate(dir.path()).await,
            "restart" => restart(dir.path()).await,
            "orphans" => orphans(dir.path()).await,
            other => panic!("unknown scenario {other}; known: {SCENARIOS:?}"),
        }
    });
    let mut result = result;
    if let Some(scratch) = SCRATCH.lock().unwrap().take() {
        result["database_mb"] = serde_json::json!(scratch.size().unwrap_or(0) as f64 / (1024.0 * 1024.0));
        result["store"] = serde_json::json!("postgres");
    }
    println!("{}", serde_json::json!({ "scenario": name, "result": result }));
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    if let [mode, path] = &args[..] {
        assert_eq!(mode, "job-file", "usage: core [SCENARIO | job-file PATH]");
        std::fs::write(path, layered(100_000, 100, 3, "")).unwrap();
        return;
    }
    if let Some(name) = args.first() {
        run_one(name);
        return;
    }
    let exe = std::env::current_exe().unwrap();
    for name in SCENARIOS {
        let mut results: Vec<serde_json::Value> = Vec::new();
        for _ in 0..RUNS {
            let output = Command::new(&exe).arg(name).output().expect("run scenario");
            assert!(output.status.success(), "{name} failed: {}", String::from_utf8_lossy(&output.stderr));
            let line = String::from_utf8_lossy(&output.stdout);
            let value: serde_json::Value = serde_json::from_str(line.trim()).expect("one JSON line");
            results.push(value["result"].clone());
        }
        let mut summary = serde_json::Map::new();
        for key in results[0].as_object().unwrap().keys() {
            let values: Vec<f64> = results.iter().filter_map(|r| r[key].as_f64()).collect();
            summary.insert(key.clone(), serde_json::json!(median(values)));
        }
        println!("{}", serde_json::json!({ "scenario": name, "runs": RUNS, "median": summary }));
    }
}
