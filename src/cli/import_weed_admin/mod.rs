//! `jobcenter import-weed-admin DIR [--dry-run]`: reads the job type
//! settings a SeaweedFS `weed admin -dataDir` keeps
//! (`plugin/job_types/TYPE/config.pb`) and sets them as policies on a running
//! admin, through the call `jobcenter policy set` makes. Everything is read
//! and planned before anything is set, so a directory that is not weed
//! admin's, or a file that does not decode, changes nothing; `plan` says
//! what each value becomes.
#![allow(clippy::print_stdout)]

mod plan;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use prost::Message;

use super::client::{Client, Connection};
use crate::proto::api;
use crate::proto::plugin::PersistedJobTypeConfig;

#[derive(clap::Args, Debug)]
pub struct ImportWeedAdminArgs {
    /// The data directory of `weed admin` (its `-dataDir`).
    pub dir: PathBuf,
    /// Print what would be set and change nothing.
    #[arg(long)]
    pub dry_run: bool,
    #[command(flatten)]
    pub connection: Connection,
}

/// Files weed admin writes in a job type's directory. Only `config.pb` is
/// read, as weed admin reads only it: the `.json` files are copies for
/// people, the descriptor comes to jobcenter from the worker itself, and
/// `runs.json` is history.
const WEED_FILES: [&str; 5] = ["config.pb", "config.json", "descriptor.pb", "descriptor.json", "runs.json"];

/// Policy changes by job type: `policy set` names and texts.
type Changes = BTreeMap<String, BTreeMap<String, String>>;

pub(super) async fn run(args: ImportWeedAdminArgs) -> anyhow::Result<ExitCode> {
    let entries = read_data_dir(&args.dir)?;
    let lines: Vec<plan::Line> = entries.iter().flat_map(plan::plan).collect();
    let changes = plan::changes(&lines);
    plan::check(&changes).map_err(|e| anyhow::anyhow!("{}: the admin would refuse {e}", args.dir.display()))?;
    let count: usize = changes.values().map(BTreeMap::len).sum();
    // Reach the admin before printing a plan that would not be carried out.
    let client = match args.dry_run || changes.is_empty() {
        true => None,
        false => Some(args.connection.connect().await?),
    };
    for line in &lines {
        println!("{line}");
    }
    if let Some(client) = client {
        apply(client, &changes).await?;
    }
    match args.dry_run {
        true => println!("would set {count} values on {} job types (--dry-run: nothing changed)", changes.len()),
        false => println!("set {count} values on {} job types", changes.len()),
    }
    Ok(ExitCode::SUCCESS)
}

/// Sets each job type's policy in turn (one call each, which the admin
/// applies whole or not at all); on a refusal, says what was set before it.
async fn apply(mut client: Client, changes: &Changes) -> anyhow::Result<()> {
    let mut done: Vec<&str> = Vec::new();
    for (job_type, values) in changes {
        let request =
            api::SetPolicyRequest { job_type: job_type.clone(), values: values.clone().into_iter().collect() };
        if let Err(status) = client.set_policy(request).await {
            let before = match done.is_empty() {
                true => "nothing was set".to_string(),
                false => format!("the policies of {} were set", done.join(", ")),
            };
            anyhow::bail!("{job_type}: the admin refused the policy: {}; {before}", status.message());
        }
        done.push(job_type);
    }
    Ok(())
}

/// What `DIR/plugin/job_types/` holds, by name.
fn read_data_dir(dir: &Path) -> anyhow::Result<Vec<plan::Entry>> {
    anyhow::ensure!(dir.exists(), "{}: no such directory", dir.display());
    anyhow::ensure!(dir.is_dir(), "{}: not a directory", dir.display());
    let job_types = dir.join("plugin").join("job_types");
    anyhow::ensure!(
        job_types.is_dir(),
        "{}: not a weed admin data directory: it has no plugin/job_types, which `weed admin -dataDir` makes when it starts",
        dir.display()
    );
    let mut entries = Vec::new();
    for (name, path) in sorted_entries(&job_types)? {
        let entry = match path.is_dir() {
            true => plan::Entry::JobType(Box::new(read_job_type(&name, &path)?)),
            false => plan::Entry::Stray(name),
        };
        entries.push(entry);
    }
    Ok(entries)
}

/// The names and paths in a directory, sorted by name.
fn sorted_entries(dir: &Path) -> anyhow::Result<Vec<(String, PathBuf)>> {
    let cannot_read = || format!("{}: cannot read the directory", dir.display());
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(cannot_read)? {
        let entry = entry.with_context(cannot_read)?;
        out.push((entry.file_name().to_string_lossy().into_owned(), entry.path()));
    }
    out.sort();
    Ok(out)
}

/// A job type's directory; only a job type SeaweedFS's workers serve is read.
fn read_job_type(job_type: &str, dir: &Path) -> anyhow::Result<plan::JobTypeFiles> {
    let mut files = plan::JobTypeFiles { job_type: job_type.to_string(), config: None, unknown_files: Vec::new() };
    if !plan::KNOWN_JOB_TYPES.contains(&job_type) {
        return Ok(files);
    }
    files.unknown_files = sorted_entries(dir)?
        .into_iter()
        .map(|(name, _)| name)
        .filter(|name| !WEED_FILES.contains(&name.as_str()))
        .collect();
    let path = dir.join("config.pb");
    files.config = match std::fs::read(&path) {
        Ok(bytes) => Some(decode_config(&path, job_type, &bytes)?),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => anyhow::bail!("{}: cannot read: {e}", path.display()),
    };
    Ok(files)
}

/// A `config.pb`: a `PersistedJobTypeConfig` of the job type whose directory it is in.
fn decode_config(path: &Path, job_type: &str, bytes: &[u8]) -> anyhow::Result<PersistedJobTypeConfig> {
    let config = PersistedJobTypeConfig::decode(bytes).map_err(|e| {
        anyhow::anyhow!("{}: not a weed admin job type configuration (PersistedJobTypeConfig): {e}", path.display())
    })?;
    anyhow::ensure!(
        config.job_type.is_empty() || config.job_type == job_type,
        "{}: holds the configuration of job type {:?}, not of {job_type:?}, whose directory it is in",
        path.display(),
        config.job_type
    );
    Ok(config)
}
