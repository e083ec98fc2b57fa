//! `jobcenter jobs --data-dir|--database-url` and `jobcenter job ...`: read
//! jobs straight from a data directory that no process holds, or a database.
#![allow(clippy::print_stdout)]

use std::path::PathBuf;
use std::process::ExitCode;

use super::output::{job_header, job_json, job_row, task_table};
use super::EXIT_USAGE;
use crate::model::{JobId, JobState};
use crate::store::{JobFilter, Location, PasswordSources};

/// The store to read directly, when one is named.
pub(super) fn location(data_dir: &Option<PathBuf>, database_url: &Option<String>) -> Option<Location> {
    match (data_dir, database_url) {
        (_, Some(url)) => Some(Location::Database { url: url.clone(), passwords: PasswordSources::default() }),
        (Some(dir), None) => Some(Location::DataDir(dir.clone())),
        (None, None) => None,
    }
}

fn describe(place: &Location) -> String {
    match place {
        Location::DataDir(dir) => dir.display().to_string(),
        Location::Database { .. } => "the database".into(),
    }
}

pub(super) async fn jobs(place: Location, state: Option<&str>, limit: usize, json: bool) -> anyhow::Result<ExitCode> {
    let state = match state.map(str::parse::<JobState>).transpose() {
        Ok(state) => state,
        Err(e) => {
            eprintln!("jobcenter: {e}");
            return Ok(ExitCode::from(EXIT_USAGE));
        }
    };
    let store = super::store_args::open(place).await?;
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

pub(super) async fn job(place: Location, id: &str, json: bool) -> anyhow::Result<ExitCode> {
    let Ok(id) = id.parse::<JobId>() else {
        eprintln!("jobcenter: {id:?} is not a job id (a UUID)");
        return Ok(ExitCode::from(EXIT_USAGE));
    };
    let described = describe(&place);
    let store = super::store_args::open(place).await?;
    let Some(job) = tokio::task::spawn_blocking(move || store.get_job(id)).await?? else {
        eprintln!("jobcenter: no job {id} in {described}");
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
