//! `jobcenter jobs` and `jobcenter job`: read jobs from a data directory.
#![allow(clippy::print_stdout)]

use std::path::PathBuf;
use std::process::ExitCode;

use super::output::{job_header, job_json, job_row, task_table};
use super::run::open_store;
use super::EXIT_USAGE;
use crate::model::{JobId, JobState};
use crate::store::JobFilter;

#[derive(clap::Args, Debug)]
pub struct JobsArgs {
    /// The data directory to read.
    #[arg(long, default_value = "jobcenter-data")]
    pub data_dir: PathBuf,
    /// Only jobs in this state.
    #[arg(long)]
    pub state: Option<JobState>,
    /// At most this many jobs, newest first.
    #[arg(long, default_value_t = 50)]
    pub limit: usize,
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args, Debug)]
pub struct JobArgs {
    pub id: String,
    #[arg(long, default_value = "jobcenter-data")]
    pub data_dir: PathBuf,
    #[arg(long)]
    pub json: bool,
}

pub async fn jobs(args: JobsArgs) -> anyhow::Result<ExitCode> {
    let store = open_store(&args.data_dir).await?;
    let filter = JobFilter { state: args.state, limit: Some(args.limit), ..JobFilter::default() };
    let jobs = tokio::task::spawn_blocking(move || store.list_jobs(&filter)).await??;
    if args.json {
        let rows: Vec<serde_json::Value> = jobs
            .iter()
            .map(|j| {
                serde_json::json!({
                    "id": j.id.to_string(), "name": j.name, "state": j.state, "tasks": j.n_tasks,
                    "created_at": j.created_at.to_rfc3339(),
                    "finished_at": j.finished_at.map(|t| t.to_rfc3339()),
                })
            })
            .collect();
        println!("{}", serde_json::to_string(&rows)?);
    } else {
        println!("{}", job_header());
        for job in &jobs {
            println!("{}", job_row(job));
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn job(args: JobArgs) -> anyhow::Result<ExitCode> {
    let Ok(id) = args.id.parse::<JobId>() else {
        eprintln!("jobcenter: {:?} is not a job id (a UUID)", args.id);
        return Ok(ExitCode::from(EXIT_USAGE));
    };
    let store = open_store(&args.data_dir).await?;
    let Some(job) = tokio::task::spawn_blocking(move || store.get_job(id)).await?? else {
        eprintln!("jobcenter: no job {id} in {}", args.data_dir.display());
        return Ok(ExitCode::from(EXIT_USAGE));
    };
    if args.json {
        println!("{}", serde_json::to_string(&job_json(&job, true))?);
    } else {
        println!("job {} {:?}: {}", job.record.id, job.record.name, job.record.state);
        print!("{}", task_table(&job));
    }
    Ok(ExitCode::SUCCESS)
}
