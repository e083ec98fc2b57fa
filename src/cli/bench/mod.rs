//! `jobcenter bench FILE --workers N`: a server and N worker processes on
//! loopback run one job; prints one JSON line of throughput, dispatch
//! latency and the server's peak memory. With `--database-url` and
//! `--instances M`, M servers share the database as one cluster, the
//! workers spread over them; the job is submitted to the first. With
//! `--jobs N`, N copies of the job are submitted at once, copy k to
//! instance k mod M, and the figures are over all of them.
#![allow(clippy::print_stdout)]

mod relay;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use tonic::transport::Channel;

use crate::jobfile::Format;
use crate::proto::api::{self, job_service_client::JobServiceClient};
use crate::store::{PasswordSources, ScratchDatabase};
use crate::wire;

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// The job file to run.
    pub file: PathBuf,
    /// Worker processes.
    #[arg(long, default_value_t = 2)]
    pub workers: u32,
    /// Execution slots of each worker.
    #[arg(long, default_value_t = 256)]
    pub max_execute: u32,
    /// A policy setting made before the job is submitted, as
    /// `JOB_TYPE:NAME=VALUE` (`noop:priority=high`); repeatable.
    #[arg(long = "policy", value_name = "JOB_TYPE:NAME=VALUE")]
    pub policies: Vec<String>,
    /// A bandwidth budget set before the job is submitted, as
    /// `jobcenter budget set` takes its cluster rate (`200MB/s`).
    #[arg(long)]
    pub budget: Option<String>,
    /// Where the server keeps its data (default: a fresh directory, removed after).
    #[arg(long, conflicts_with = "database_url")]
    pub data_dir: Option<PathBuf>,
    /// Run the server on PostgreSQL instead: a fresh database is created on
    /// the server this URL names (the user needs CREATEDB), and dropped after.
    /// The job is submitted 11 s after the instances are up, once the
    /// database's statistics count their setting up.
    #[arg(long)]
    pub database_url: Option<String>,
    /// With --database-url: admin instances sharing the database; worker n
    /// connects to instance n mod M (and knows them all).
    #[arg(long, default_value_t = 1, requires = "database_url")]
    pub instances: u32,
    /// Copies of the job submitted at once (copy k to instance k mod M);
    /// throughput is over all of them.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub jobs: u32,
    /// With --database-url: the instances reach the database through a relay
    /// in this process that counts round trips (`db_round_trips_per_task`);
    /// each costs two more loopback hops, so time the run without it.
    #[arg(long, requires = "database_url")]
    pub count_round_trips: bool,
}

struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn peak_rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
        .unwrap_or(0.0)
}

/// CPU seconds (user and system) the process has used so far.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat.rsplit_once(')').map_or("", |(_, rest)| rest).split_whitespace().collect();
    let ticks = |n: usize| fields.get(n).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime, in ticks of 1/100 s (USER_HZ).
    (ticks(11) + ticks(12)) / 100.0
}

fn start_server(exe: &Path, store: &[String]) -> anyhow::Result<(Child, String, String)> {
    let mut child = Command::new(exe)
        .arg("server")
        .args(store)
        .args(["--http", "127.0.0.1:0", "--grpc", "0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting the server")?;
    let stderr = child.stderr.take().context("server stderr")?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut sent = false;
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if !sent {
                if let Some(rest) = line.strip_prefix("jobcenter server listening: ") {
                    let _ = tx.send(rest.to_string());
                    sent = true;
                }
            }
        }
    });
    let line = rx.recv_timeout(Duration::from_secs(30)).context("the server did not start")?;
    let parts: Vec<&str> = line.split_whitespace().collect();
    Ok((child, parts[1].to_string(), parts[3].to_string()))
}

/// How long PostgreSQL may keep a session's counts before they show in
/// `pg_stat_database`: a session that goes idle within a second of its
/// last report reports again up to 10 s later (`PGSTAT_IDLE_INTERVAL`).
const STATISTICS_LAG: Duration = Duration::from_secs(11);

/// The transactions the scratch database has seen so far.
async fn transactions(scratch: &Option<std::sync::Arc<ScratchDatabase>>) -> Option<i64> {
    let scratch = scratch.clone()?;
    tokio::task::spawn_blocking(move || scratch.transactions().ok()).await.ok().flatten()
}

pub(super) async fn run(args: BenchArgs) -> anyhow::Result<ExitCode> {
    let content = std::fs::read(&args.file).with_context(|| format!("reading {}", args.file.display()))?;
    let format = Format::from_path(&args.file).name();
    let (data_dir, temporary) = match &args.data_dir {
        Some(dir) => (dir.clone(), false),
        None => (std::env::temp_dir().join(format!("jobcenter-bench-{}", uuid::Uuid::new_v4())), true),
    };
    let scratch = match &args.database_url {
        Some(url) => {
            let url = url.clone();
            Some(std::sync::Arc::new(
                tokio::task::spawn_blocking(move || ScratchDatabase::create(&url, &PasswordSources::default()))
                    .await??,
            ))
        }
        None => None,
    };
    let outcome = bench(&args, content, format, &data_dir, &scratch).await;
    // The scratch database is dropped (and its runtime with it) off the runtime.
    if let Some(scratch) = scratch {
        let _ = tokio::task::spawn_blocking(move || drop(scratch)).await;
    }
    if temporary && args.database_url.is_none() {
        let _ = std::fs::remove_dir_all(&data_dir);
    }
    outcome
}

async fn bench(
    args: &BenchArgs,
    content: Vec<u8>,
    format: &str,
    data_dir: &Path,
    scratch: &Option<std::sync::Arc<ScratchDatabase>>,
) -> anyhow::Result<ExitCode> {
    let exe = std::env::current_exe()?;
    let relay = match scratch {
        Some(scratch) if args.count_round_trips => Some(relay::Relay::start(scratch.server_addresses()).await?),
        _ => None,
    };
    let store_args: Vec<String> = match (scratch, &relay) {
        (Some(scratch), Some(relay)) => vec!["--database-url".into(), scratch.url_via(relay.port)],
        (Some(scratch), None) => vec!["--database-url".into(), scratch.url().to_string()],
        (None, _) => vec!["--data-dir".into(), data_dir.display().to_string()],
    };
    let mut children = Children(Vec::new());
    let mut https = Vec::new();
    let mut server_pids = Vec::new();
    let mut grpc_addresses = Vec::new();
    for _ in 0..args.instances.max(1) {
        let (server, http, address) = start_server(&exe, &store_args)?;
        server_pids.push(server.id());
        children.0.push(server);
        https.push(http);
        grpc_addresses.push(address);
    }
    let grpc = grpc_addresses[0].clone();
    let http = https[0].clone();
    for n in 0..args.workers {
        let k = n as usize % https.len();
        let admins: Vec<&str> = https[k..].iter().chain(&https[..k]).map(String::as_str).collect();
        let worker = Command::new(&exe)
            .args(["worker", "--admin", &admins.join(","), "--id", &format!("bench-{n}"), "--heartbeat", "1s"])
            .args(["--max-execute", &args.max_execute.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting a worker")?;
        children.0.push(worker);
    }
    let channel = Channel::from_shared(format!("http://{grpc}"))?.connect().await?;
    let mut client = JobServiceClient::new(channel)
        .max_encoding_message_size(512 * 1024 * 1024)
        .max_decoding_message_size(1024 * 1024 * 1024);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut connected = 0;
        for http in &https {
            connected +=
                wire::http_get_json(http, "/api/workers?limit=1").await?["total"].as_u64().unwrap_or(0) as usize;
        }
        if connected as u32 >= args.workers {
            break;
        }
        anyhow::ensure!(Instant::now() < deadline, "only {connected} of {} workers connected", args.workers);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for setting in &args.policies {
        let (job_type, change) = setting.split_once(':').context("--policy takes JOB_TYPE:NAME=VALUE")?;
        let (name, value) = change.split_once('=').context("--policy takes JOB_TYPE:NAME=VALUE")?;
        let values = [(name.to_string(), value.to_string())].into();
        let request = api::SetPolicyRequest { job_type: job_type.to_string(), values };
        client.set_policy(request).await.map_err(|s| anyhow::anyhow!("--policy {setting}: {}", s.message()))?;
    }
    if let Some(cluster) = &args.budget {
        let request = api::SetBudgetRequest { cluster: cluster.clone(), ..Default::default() };
        client.set_budget(request).await.map_err(|s| anyhow::anyhow!("--budget {cluster}: {}", s.message()))?;
    }
    // The instances' setting up (the schema, registering, reading the
    // policies) is not the run's: its counts must show before the count
    // the run starts from.
    if scratch.is_some() {
        tokio::time::sleep(STATISTICS_LAG).await;
    }
    let transactions_before = transactions(scratch).await;
    let round_trips_before = relay.as_ref().map(relay::Relay::round_trips);

    let mut clients = vec![client];
    for address in grpc_addresses.iter().skip(1) {
        let channel = Channel::from_shared(format!("http://{address}"))?.connect().await?;
        clients.push(JobServiceClient::new(channel).max_encoding_message_size(512 * 1024 * 1024));
    }
    let cpu_before: Vec<f64> = server_pids.iter().map(|pid| cpu_seconds(*pid)).collect();
    let started = Instant::now();
    let runs = (0..args.jobs).map(|k| {
        let mut client = clients[k as usize % clients.len()].clone();
        let chunks = super::client::submit_chunks(content.clone(), format, &args.file.display().to_string());
        async move {
            let job_id = client
                .submit_job_stream(tokio_stream::iter(chunks))
                .await
                .map_err(|s| anyhow::anyhow!("{}", s.message()))?
                .into_inner()
                .job_id;
            let ended =
                client.wait_job(api::JobRef { job_id }).await.map_err(|s| anyhow::anyhow!("{}", s.message()))?;
            anyhow::Ok(ended.into_inner())
        }
    });
    let ended = all_at_once(runs).await?;
    let state = match ended.iter().find(|e| e.state != "succeeded") {
        Some(other) => other.state.clone(),
        None => "succeeded".to_string(),
    };
    let tasks: usize = ended.iter().map(|e| e.tasks as usize).sum();
    let makespan = started.elapsed().as_secs_f64();
    let stats = wire::http_get_json(&http, "/api/stats").await?;
    let result = serde_json::json!({
        "tasks": tasks,
        "state": state,
        "workers": args.workers,
        "makespan_s": makespan,
        "tasks_per_s": tasks as f64 / makespan,
        "dispatch_p50_us": stats["dispatch"]["p50_us"],
        "dispatch_p99_us": stats["dispatch"]["p99_us"],
        "dispatches_measured": stats["dispatch"]["count"],
        "server_peak_rss_mb": server_pids.iter().map(|pid| peak_rss_mib(*pid)).fold(0.0, f64::max),
        "store": if scratch.is_some() { "postgres" } else { "sled" },
        "instances": https.len(),
        "jobs": args.jobs,
        // Each instance's CPU over the run, the first (the leader of a single job) first.
        "server_cpu_s": server_pids.iter().zip(&cpu_before).map(|(pid, before)| cpu_seconds(*pid) - before).collect::<Vec<f64>>(),
    });
    drop(children);
    let round_trips = relay.as_ref().zip(round_trips_before).map(|(relay, before)| relay.round_trips() - before);
    // A server's sessions report their statistics when they end.
    let transactions_after = match scratch {
        Some(_) => {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            transactions(scratch).await
        }
        None => None,
    };
    let mut result = result;
    if let (Some(before), Some(after)) = (transactions_before, transactions_after) {
        // Every transaction in the database over the run, heartbeats and
        // the client's reads included, per task.
        result["db_transactions_per_task"] = serde_json::json!((after - before) as f64 / tasks.max(1) as f64);
    }
    if let Some(round_trips) = round_trips {
        // Every round trip between the instances and the database over the
        // run, heartbeats and leases included, per task.
        result["db_round_trips_per_task"] = serde_json::json!(round_trips as f64 / tasks.max(1) as f64);
    }
    if let Some(scratch) = scratch.clone() {
        let size = tokio::task::spawn_blocking(move || scratch.size()).await??;
        result["database_mb"] = serde_json::json!(size as f64 / (1024.0 * 1024.0));
    }
    println!("{result}");
    Ok(if state == "succeeded" { ExitCode::SUCCESS } else { ExitCode::from(super::EXIT_JOB_FAILED) })
}

/// Runs the futures at once; their outputs in order, or the first error.
async fn all_at_once<T>(
    runs: impl Iterator<Item = impl std::future::Future<Output = anyhow::Result<T>> + Send + 'static>,
) -> anyhow::Result<Vec<T>>
where
    T: Send + 'static,
{
    let tasks: Vec<_> = runs.map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(tasks.len());
    for task in tasks {
        out.push(task.await??);
    }
    Ok(out)
}
