//! `jobcenter export` and `jobcenter import`: a store's jobs and settings
//! as JSON lines, to move between a data directory and a database.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use super::store_args::StoreArgs;
use super::EXIT_USAGE;
use crate::store::transfer;

#[derive(clap::Args, Debug)]
pub struct ExportArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// Write here instead of standard output.
    #[arg(long, short)]
    pub output: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
pub struct ImportArgs {
    /// A file written by `jobcenter export`.
    pub file: PathBuf,
    #[command(flatten)]
    pub store: StoreArgs,
}

pub async fn export(args: ExportArgs) -> anyhow::Result<ExitCode> {
    let store = match args.store.open().await {
        Ok(store) => store,
        Err(e) => {
            eprintln!("jobcenter: {e:#}");
            return Ok(ExitCode::from(EXIT_USAGE));
        }
    };
    let output = args.output.clone();
    let summary = tokio::task::spawn_blocking(move || -> anyhow::Result<transfer::Summary> {
        match &output {
            Some(path) => {
                let file = std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
                let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
                let summary = transfer::export(&*store, &mut out)?;
                out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
                Ok(summary)
            }
            None => {
                let stdout = std::io::stdout();
                let mut out = std::io::BufWriter::with_capacity(1 << 20, stdout.lock());
                Ok(transfer::export(&*store, &mut out)?)
            }
        }
    })
    .await??;
    eprintln!("exported {} jobs ({} tasks) and {} settings", summary.jobs, summary.tasks, summary.settings);
    Ok(ExitCode::SUCCESS)
}

pub async fn import(args: ImportArgs) -> anyhow::Result<ExitCode> {
    if !args.file.is_file() {
        eprintln!("jobcenter: {} is not a file", args.file.display());
        return Ok(ExitCode::from(EXIT_USAGE));
    }
    let store = match args.store.open().await {
        Ok(store) => store,
        Err(e) => {
            eprintln!("jobcenter: {e:#}");
            return Ok(ExitCode::from(EXIT_USAGE));
        }
    };
    let file = args.file.clone();
    match tokio::task::spawn_blocking(move || transfer::import(&*store, &file)).await? {
        Ok(summary) => {
            eprintln!(
                "imported {} jobs ({} tasks) and {} settings; {} jobs were there already",
                summary.jobs, summary.tasks, summary.settings, summary.unchanged
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("jobcenter: cannot import {}: {e}", args.file.display());
            Ok(ExitCode::from(EXIT_USAGE))
        }
    }
}
