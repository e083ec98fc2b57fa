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

/// Opens the store, or says on stderr why it cannot.
async fn open_or_say(store: &StoreArgs) -> Option<std::sync::Arc<dyn crate::store::Store>> {
    store.open().await.map_err(|e| eprintln!("jobcenter: {e:#}")).ok()
}

pub(super) async fn export(args: ExportArgs) -> anyhow::Result<ExitCode> {
    let Some(store) = open_or_say(&args.store).await else { return Ok(ExitCode::from(EXIT_USAGE)) };
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

pub(super) async fn import(args: ImportArgs) -> anyhow::Result<ExitCode> {
    if !args.file.is_file() {
        eprintln!("jobcenter: {} is not a file", args.file.display());
        return Ok(ExitCode::from(EXIT_USAGE));
    }
    let Some(store) = open_or_say(&args.store).await else { return Ok(ExitCode::from(EXIT_USAGE)) };
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

#[derive(clap::Args, Debug)]
pub struct BackupArgs {
    /// Where to write the copy (written aside, then renamed into place).
    pub file: PathBuf,
    #[command(flatten)]
    pub connection: super::client::Connection,
}

#[derive(clap::Args, Debug)]
pub struct RestoreArgs {
    /// A file written by `jobcenter backup` (or `jobcenter export`).
    pub file: PathBuf,
    /// The empty data directory (or, with --database-url, the empty database) to restore into.
    #[command(flatten)]
    pub store: StoreArgs,
}

/// Asks the running server for a consistent copy and writes it to a file.
pub(super) async fn backup(args: BackupArgs) -> anyhow::Result<ExitCode> {
    use std::io::Write;
    let mut client = args.connection.connect().await?;
    let mut chunks = match client.backup(crate::proto::api::BackupRequest {}).await {
        Ok(response) => response.into_inner(),
        Err(status) => {
            eprintln!("jobcenter: {}", status.message());
            return Ok(ExitCode::from(EXIT_USAGE));
        }
    };
    let partial = args.file.with_extension("partial");
    let file = std::fs::File::create(&partial).with_context(|| format!("creating {}", partial.display()))?;
    let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
    let (mut bytes, mut summary) = (0u64, None);
    let received = async {
        while let Some(chunk) = chunks.message().await? {
            out.write_all(&chunk.data)?;
            bytes += chunk.data.len() as u64;
            if chunk.summary.is_some() {
                summary = chunk.summary;
            }
        }
        anyhow::Ok(())
    }
    .await;
    let finished = received.and_then(|()| {
        let summary = summary.context("the copy was cut short (its last chunk never came)")?;
        out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        std::fs::rename(&partial, &args.file)?;
        if let Some(dir) = args.file.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(summary)
    });
    match finished {
        Ok(summary) => {
            eprintln!(
                "backed up {} jobs ({} tasks) and {} settings to {} ({bytes} bytes), as of {}",
                summary.jobs,
                summary.tasks,
                summary.settings,
                args.file.display(),
                crate::clock::Timestamp(summary.taken_at_ms).to_rfc3339()
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            eprintln!("jobcenter: backup failed, nothing written to {}: {e:#}", args.file.display());
            Ok(ExitCode::FAILURE)
        }
    }
}

/// Brings a backup back into an empty data directory or database.
pub(super) async fn restore(args: RestoreArgs) -> anyhow::Result<ExitCode> {
    if !args.file.is_file() {
        eprintln!("jobcenter: {} is not a file", args.file.display());
        return Ok(ExitCode::from(EXIT_USAGE));
    }
    let fresh_dir = match &args.store.database_url {
        Some(_) => None,
        None => {
            let dir = &args.store.data_dir;
            let empty = match std::fs::read_dir(dir) {
                Ok(mut entries) => entries.next().is_none(),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
                Err(e) => {
                    eprintln!("jobcenter: cannot read {}: {e}", dir.display());
                    return Ok(ExitCode::from(EXIT_USAGE));
                }
            };
            if !empty {
                eprintln!(
                    "jobcenter: cannot restore into {}: it is not empty; restore into a new directory and start the server there",
                    dir.display()
                );
                return Ok(ExitCode::from(EXIT_USAGE));
            }
            Some(dir.clone())
        }
    };
    let Some(store) = open_or_say(&args.store).await else { return Ok(ExitCode::from(EXIT_USAGE)) };
    let file = args.file.clone();
    let result = tokio::task::spawn_blocking(move || {
        let limit_one = crate::store::JobFilter { limit: Some(1), ..Default::default() };
        if !store.list_jobs(&limit_one)?.is_empty() || !store.settings("")?.is_empty() {
            anyhow::bail!("the database is not empty: restore into a new database");
        }
        Ok(transfer::import(&*store, &file)?)
    })
    .await?;
    match result {
        Ok(summary) => {
            eprintln!("restored {} jobs ({} tasks) and {} settings", summary.jobs, summary.tasks, summary.settings);
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            // A new directory half filled is of no use: leave none.
            if let Some(dir) = fresh_dir {
                let _ = std::fs::remove_dir_all(dir);
            }
            eprintln!("jobcenter: cannot restore {}: {e:#}", args.file.display());
            Ok(ExitCode::from(EXIT_USAGE))
        }
    }
}
