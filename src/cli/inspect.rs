//! `jobcenter jobs --data-dir` and `jobcenter job --data-dir`: read jobs
//! straight from a data directory that no process holds.
#![allow(clippy::print_stdout)]

use std::path::Path;
use std::process::ExitCode;

use super::output::{job_header, job_json, job_row, task_table};
use super::run::open_store;
use super::EXIT_USAGE;
use crate::model::{JobId, JobState};
use crate::store::JobFilter;

pub async fn jobs(data_dir: &Path, state: Option<&str>, limit: usize, json: bool) -> anyhow::Result<ExitCode> {
    let state = match state.map(str::parse::<JobState>).transpose() {
        Ok(state) => state,
        Err(e) => {
            eprintln!("jobcenter: {e}");
            return Ok(ExitCode::from(EXIT_USAGE));
        }
    };
    let store = open_store(data_dir).await?;
    let filter = JobFilter { state, limit: Some(limit), ..JobFilter::default() };
    let jobs = tokio::task::spawn_blocking(move || store.list_jobs(&filter)).await??;
    if json {
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

pub async fn job(data_dir: &Path, id: &str, json: bool) -> anyhow::Result<ExitCode> {
    let Ok(id) = id.parse::<JobId>() else {
        eprintln!("jobcenter: {id:?} is not a job id (a UUID)");
        return Ok(ExitCode::from(EXIT_USAGE));
    };
    let store = open_store(data_dir).await?;
    let Some(job) = tokio::task::spawn_blocking(move || store.get_job(id)).await?? else {
        eprintln!("jobcenter: no job {id} in {}", data_dir.display());
        return Ok(ExitCode::from(EXIT_USAGE));
    };
    if json {
        println!("{}", serde_json::to_string(&job_json(&job, true))?);
    } else {
        println!("job {} {:?}: {}", job.record.id, job.record.name, job.record.state);
        print!("{}", task_table(&job));
    }
    Ok(ExitCode::SUCCESS)
}
