//! `jobcenter bench FILE --workers N`: a server and N worker processes on
//! loopback run one job; prints one JSON line of throughput, dispatch
//! latency and the server's peak memory.
#![allow(clippy::print_stdout)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use tonic::transport::Channel;

use crate::jobfile::Format;
use crate::proto::api::{self, job_event, job_service_client::JobServiceClient};
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
    /// Where the server keeps its data (default: a fresh directory, removed after).
    #[arg(long, conflicts_with = "database_url")]
    pub data_dir: Option<PathBuf>,
    /// Run the server on PostgreSQL instead: a fresh database is created on
    /// the server this URL names (the user needs CREATEDB), and dropped after.
    #[arg(long)]
    pub database_url: Option<String>,
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

pub async fn run(args: BenchArgs) -> anyhow::Result<ExitCode> {
    let content = std::fs::read(&args.file).with_context(|| format!("reading {}", args.file.display()))?;
    let format = match Format::from_path(&args.file) {
        Format::Json => "json",
        Format::Toml => "toml",
        Format::Yaml => "yaml",
    };
    let exe = std::env::current_exe()?;
    let (data_dir, temporary) = match &args.data_dir {
        Some(dir) => (dir.clone(), false),
        None => (std::env::temp_dir().join(format!("jobcenter-bench-{}", uuid::Uuid::new_v4())), true),
    };
    let scratch = match &args.database_url {
        Some(url) => {
            let url = url.clone();
            Some(
                tokio::task::spawn_blocking(move || ScratchDatabase::create(&url, &PasswordSources::default()))
                    .await??,
            )
        }
        None => None,
    };
    let store_args: Vec<String> = match &scratch {
        Some(scratch) => vec!["--database-url".into(), scratch.url().to_string()],
        None => vec!["--data-dir".into(), data_dir.display().to_string()],
    };
    let (server, http, grpc) = start_server(&exe, &store_args)?;
    let server_pid = server.id();
    let mut children = Children(vec![server]);
    for n in 0..args.workers {
        let worker = Command::new(&exe)
            .args(["worker", "--admin", &http, "--id", &format!("bench-{n}"), "--heartbeat", "1s"])
            .args(["--max-execute", &args.max_execute.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting a worker")?;
        children.0.push(worker);
    }
    let channel = Channel::from_shared(format!("http://{grpc}"))?.connect().await?;
    let mut client = JobServiceClient::new(channel).max_encoding_message_size(512 * 1024 * 1024);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let workers = client.list_workers(api::ListWorkersRequest {}).await?.into_inner().workers;
        if workers.len() as u32 >= args.workers {
            break;
        }
        anyhow::ensure!(Instant::now() < deadline, "only {} of {} workers connected", workers.len(), args.workers);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let started = Instant::now();
    let request =
        api::SubmitJobRequest { content, format: format.into(), source_name: args.file.display().to_string() };
    let job_id = client.submit_job(request).await.map_err(|s| anyhow::anyhow!("{}", s.message()))?.into_inner().job_id;
    let mut events = client.watch_job(api::JobRef { job_id: job_id.clone() }).await?.into_inner();
    let mut state = String::new();
    while let Some(event) = events.message().await? {
        let ended = match &event.event {
            Some(job_event::Event::Job(t)) => Some(t.state.clone()),
            Some(job_event::Event::Snapshot(j)) if !matches!(j.state.as_str(), "pending" | "running") => {
                Some(j.state.clone())
            }
            _ => None,
        };
        if let Some(s) = ended {
            state = s;
            break;
        }
    }
    let makespan = started.elapsed().as_secs_f64();
    let job = client.get_job(api::JobRef { job_id }).await?.into_inner();
    let stats = wire::http_get_json(&http, "/api/stats").await?;
    let tasks = job.tasks.len();
    let result = serde_json::json!({
        "tasks": tasks,
        "state": state,
        "workers": args.workers,
        "makespan_s": makespan,
        "tasks_per_s": tasks as f64 / makespan,
        "dispatch_p50_us": stats["dispatch"]["p50_us"],
        "dispatch_p99_us": stats["dispatch"]["p99_us"],
        "dispatches_measured": stats["dispatch"]["count"],
        "server_peak_rss_mb": peak_rss_mib(server_pid),
        "store": if scratch.is_some() { "postgres" } else { "sled" },
    });
    drop(children);
    let mut result = result;
    if let Some(scratch) = scratch {
        let size = tokio::task::spawn_blocking(move || scratch.size()).await??;
        result["database_mb"] = serde_json::json!(size as f64 / (1024.0 * 1024.0));
    }
    println!("{result}");
    if temporary && args.database_url.is_none() {
        let _ = std::fs::remove_dir_all(&data_dir);
    }
    Ok(if state == "succeeded" { ExitCode::SUCCESS } else { ExitCode::from(super::EXIT_JOB_FAILED) })
}
