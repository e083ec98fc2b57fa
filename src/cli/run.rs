//! `jobcenter run` and `jobcenter validate`: a job file run in this process.
#![allow(clippy::print_stdout)]

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use super::output::{counts_line, job_json, task_table};
use super::{EXIT_JOB_FAILED, EXIT_USAGE};
use crate::clock::SystemClock;
use crate::engine::{Engine, EngineHandle, Options, Orphans};
use crate::jobfile::{self, Limits};
use crate::model::{JobId, JobOrigin, JobRecord, JobSpec, JobState, TaskState};
use crate::store::JobFilter;
use crate::worker::{builtin_handlers, ExecLog, LocalExecutor, Registry};

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// The job file (JSON, or TOML/YAML by extension).
    pub file: PathBuf,
    #[command(flatten)]
    pub store: super::store_args::StoreArgs,
    /// Tasks executed at once.
    #[arg(long, default_value_t = 8)]
    pub concurrency: u32,
    /// Print the final job as one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
    /// Append a line per execution event (start and outcome) to this file.
    #[arg(long, env = "JOBCENTER_EXEC_LOG")]
    pub exec_log: Option<PathBuf>,
}

/// Reads and validates a job file off the async threads.
pub(super) async fn read_job_file(path: &Path) -> Result<JobSpec, jobfile::Error> {
    let path = path.to_path_buf();
    tokio::task::spawn_blocking(move || jobfile::read_file(&path, &Limits::default()))
        .await
        .expect("job file reader panicked")
}

pub(super) async fn validate(file: &Path) -> anyhow::Result<ExitCode> {
    match read_job_file(file).await {
        Ok(spec) => {
            let types: Vec<String> = spec.job_types().iter().map(|t| t.to_string()).collect();
            println!(
                "{}: valid job {:?}: {} tasks, {} dependencies, {} ready at start, job types {}",
                file.display(),
                spec.name,
                spec.len(),
                spec.dag.n_edges(),
                spec.dag.roots().count(),
                types.join(", ")
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("{e}");
            Ok(ExitCode::from(EXIT_USAGE))
        }
    }
}

/// The newest job of this fingerprint, if it has not ended.
async fn unfinished(engine: &EngineHandle, fingerprint: [u8; 32]) -> anyhow::Result<Option<JobRecord>> {
    let newest = engine.list(JobFilter { fingerprint: Some(fingerprint), limit: Some(1), ..JobFilter::default() });
    Ok(newest.await?.into_iter().find(|job| !job.state.is_terminal()))
}

pub(super) async fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let spec = match read_job_file(&args.file).await {
        Ok(spec) => spec,
        Err(e) => {
            eprintln!("{e}");
            return Ok(ExitCode::from(EXIT_USAGE));
        }
    };
    let registry = Registry::new(builtin_handlers());
    let known = registry.job_types();
    if let Some(task) = spec.tasks.iter().find(|t| !known.iter().any(|k| **k == *t.job_type)) {
        let known: Vec<String> = known.iter().map(|t| t.to_string()).collect();
        eprintln!(
            "invalid job {}: unknown job type: task {:?} has job type {:?}; `jobcenter run` executes {}",
            args.file.display(),
            &*task.id,
            &*task.job_type,
            known.join(", ")
        );
        return Ok(ExitCode::from(EXIT_USAGE));
    }
    let store = match args.store.open().await {
        Ok(store) => store,
        Err(e) => {
            eprintln!("jobcenter: {e:#}");
            return Ok(ExitCode::from(EXIT_USAGE));
        }
    };
    let options = Options { orphans: Orphans::Requeue, ..Options::default() };
    let engine = Engine::start(store, Arc::new(SystemClock), options).await?;
    let exec_log = match &args.exec_log {
        Some(path) => Some(ExecLog::open(path).with_context(|| format!("opening {}", path.display()))?),
        None => None,
    };
    let mut resumable = unfinished(&engine, spec.fingerprint).await?;
    if resumable.is_none() {
        // A job an older release started carries the file's SHA-256.
        let bytes = tokio::fs::read(&args.file).await.with_context(|| format!("reading {}", args.file.display()))?;
        resumable = unfinished(&engine, jobfile::fingerprint_before_blake3(&bytes)).await?;
    }
    let job = match resumable {
        Some(job) => {
            eprintln!("resuming job {} ({})", job.id, job.name);
            job.id
        }
        None => {
            let id = engine.submit(spec, JobOrigin::User).await?;
            eprintln!("started job {id}");
            id
        }
    };
    LocalExecutor::start(engine.clone(), registry, args.concurrency, exec_log).await?;

    let progress = tokio::spawn(show_progress(engine.clone(), job));
    let waited = engine.wait(job).await;
    progress.abort();
    // An engine that stopped for good says why; `main` owns what follows.
    let record = match (waited, engine.fate().fatal()) {
        (Ok(record), _) => record,
        (Err(_), Some(fatal)) => return Err(fatal.clone().into()),
        (Err(e), None) => return Err(e.into()),
    };
    if std::io::stderr().is_terminal() {
        eprintln!();
    }
    let final_job = engine.job(job).await?.context("the finished job is missing from the store")?;
    if args.json {
        println!("{}", serde_json::to_string(&job_json(&final_job, false))?);
    } else {
        print_summary(&final_job);
    }
    Ok(if record.state == JobState::Succeeded { ExitCode::SUCCESS } else { ExitCode::from(EXIT_JOB_FAILED) })
}

fn print_summary(job: &crate::store::StoredJob) {
    const MAX_ROWS: usize = 50;
    if job.tasks.len() <= MAX_ROWS {
        print!("{}", task_table(job));
    } else {
        let unsucceeded: Vec<(usize, &crate::model::TaskRecord)> =
            job.tasks.iter().enumerate().filter(|(_, t)| t.state() == TaskState::Failed).take(MAX_ROWS).collect();
        for (idx, task) in unsucceeded {
            println!("{}  failed  {}", job.spec.tasks[idx].id, task.error.as_deref().unwrap_or(""));
        }
    }
    let mut counts = crate::model::StateCounts::default();
    for task in &job.tasks {
        counts.add(task.state());
    }
    println!("job {} {:?} {}: {}", job.record.id, job.record.name, job.record.state, counts_line(&counts));
}

/// A status line on stderr: redrawn each second on a terminal, every five seconds otherwise.
async fn show_progress(engine: EngineHandle, job: JobId) {
    let terminal = std::io::stderr().is_terminal();
    let period = if terminal { Duration::from_secs(1) } else { Duration::from_secs(5) };
    let started = tokio::time::Instant::now();
    let mut ticker = tokio::time::interval(period);
    ticker.tick().await;
    loop {
        ticker.tick().await;
        let Ok(Some(summary)) = engine.summary(job).await else { return };
        let total = summary.counts.total().max(1);
        let done = summary.counts.terminal();
        let line = format!(
            "[{:>5.1}s] {done}/{total} tasks ended ({:.0}%): {}",
            started.elapsed().as_secs_f64(),
            f64::from(done) * 100.0 / f64::from(total),
            counts_line(&summary.counts)
        );
        if terminal {
            eprint!("\r\x1b[K{line}");
        } else {
            eprintln!("{line}");
        }
    }
}
