//! The command line: one module per command; `main.rs` only parses and calls `run`.

mod bench;
mod budget;
mod client;
mod credentials;
mod import_weed_admin;
mod inspect;
mod output;
mod run;
mod server;
mod store_args;
mod transfer;
mod watch;
mod worker;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Exit code of a command whose job failed or was canceled.
pub const EXIT_JOB_FAILED: u8 = 1;
/// Exit code of a command refused for its input or environment.
pub const EXIT_USAGE: u8 = 2;

#[derive(Parser, Debug)]
#[command(name = "jobcenter", version, about = "Maintenance work as DAG jobs with leader/follower execution")]
pub struct Cli {
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value = "text")]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run a job file in this process: engine, embedded store and executor.
    Run(run::RunArgs),
    /// Check a job file and print what it holds, storing nothing.
    Validate { file: PathBuf },
    /// Run the admin server: engine, worker stream, client API.
    Server(Box<server::ServerArgs>),
    /// Submit a job file to an admin server.
    Submit(client::SubmitArgs),
    /// List jobs, newest first.
    Jobs(client::JobsArgs),
    /// Show one job with its tasks.
    Job(client::JobArgs),
    /// Cancel a job: waiting tasks are canceled, running ones asked to stop.
    Cancel(client::JobIdArgs),
    /// Run the failed part of an ended job again.
    Retry(client::JobIdArgs),
    /// List the connected workers.
    Workers(client::WorkersArgs),
    /// List the admin instances sharing the database.
    Instances(client::InstancesArgs),
    /// The SeaweedFS cluster's capacity per volume server and disk, with
    /// the maintenance under way counted.
    Capacity(client::CapacityArgs),
    /// Pause or resume the scheduler loop.
    Scheduler(client::SchedulerArgs),
    /// Show or change a job type's policy.
    Policy(client::PolicyArgs),
    /// Run a job file on a fresh server and worker processes and measure it.
    Bench(bench::BenchArgs),
    /// Run the recovery check now and print each finding.
    Recover(client::RecoverArgs),
    /// Remove now the ended jobs past the server's retention rules
    /// (--keep-ended-for, --keep-ended, --keep-recovery-checks-for).
    Prune(client::PruneArgs),
    /// Ask a detector what a job type needs now (`--run` makes it a job).
    Detect(client::DetectArgs),
    /// The scheduler's activity log.
    Activities(client::ActivitiesArgs),
    /// A job type's last detection runs.
    Runs(client::RunsArgs),
    /// The audit trail: who changed what, signed in or out, or was refused, from where, and how it ended.
    Audit(client::AuditArgs),
    /// The webhook endpoints of the server's --notify file: events wanted, pending, last delivery, last error.
    Notifications(client::NotificationsArgs),
    /// Execute tasks for an admin server over the worker stream.
    Worker(worker::WorkerArgs),
    /// Follow a job live: its graph by level, full screen (plain lines when not a terminal).
    Watch(watch::WatchArgs),
    /// Write every job and setting of a data directory or a database as JSON lines.
    Export(transfer::ExportArgs),
    /// Read what `export` wrote into a data directory or a database.
    Import(transfer::ImportArgs),
    /// Write a consistent copy of a running server's jobs and settings to a file.
    Backup(transfer::BackupArgs),
    /// Bring a backup back into an empty data directory (or database).
    Restore(transfer::RestoreArgs),
    /// Named tokens with their roles, for a server's --credentials file.
    Credentials(credentials::CredentialsArgs),
    /// Set the job type settings a `weed admin -dataDir` keeps as policies of
    /// a running admin, one line per value (`--dry-run`: print, change nothing).
    ImportWeedAdmin(import_weed_admin::ImportWeedAdminArgs),
    /// Each job type's maintenance windows: open now or not, when it next opens and closes, and its terms.
    Windows(client::WindowsArgs),
    /// Show, set or clear the bandwidth budget of the tasks that move data
    /// (balance, EC encode, EC balance, and job types a policy marks).
    Budget(budget::BudgetArgs),
}

impl Cli {
    /// Where the command exports its spans, and the service it names: a
    /// server's or a worker's `--otlp-endpoint`.
    pub fn otlp_endpoint(&self) -> Option<(&str, &'static str)> {
        match &self.command {
            Command::Server(args) => args.otlp_endpoint.as_deref().map(|endpoint| (endpoint, "jobcenter-server")),
            Command::Worker(args) => args.otlp_endpoint.as_deref().map(|endpoint| (endpoint, "jobcenter-worker")),
            _ => None,
        }
    }
}

/// Runs a parsed command line; returns the process exit code, or the
/// fatal condition that stopped a server (`main` decides what follows).
pub fn main(cli: Cli) -> Result<ExitCode, crate::fate::Fatal> {
    // A worker process is one stream and the executions it runs, all of
    // them waiting on I/O (handlers are async; a shell command is a child
    // process): on one thread, a message goes from the session to the
    // stream's connection without waking another thread.
    let mut builder = match cli.command {
        Command::Worker(_) => tokio::runtime::Builder::new_current_thread(),
        _ => tokio::runtime::Builder::new_multi_thread(),
    };
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("jobcenter: cannot start the runtime: {e}");
            return Ok(ExitCode::from(EXIT_USAGE));
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Run(args) => run::run(args).await,
            Command::Validate { file } => run::validate(&file).await,
            Command::Server(args) => server::run(*args).await,
            Command::Submit(args) => client::submit(args).await,
            Command::Jobs(args) => match inspect::location(&args.data_dir, &args.database_url) {
                Some(place) => inspect::jobs(place, args.state.as_deref(), args.limit as usize, args.json).await,
                None => client::jobs(args).await,
            },
            Command::Job(args) => match inspect::location(&args.data_dir, &args.database_url) {
                Some(place) => inspect::job(place, &args.id, args.json).await,
                None => client::job(args).await,
            },
            Command::Cancel(args) => client::cancel(args).await,
            Command::Retry(args) => client::retry(args).await,
            Command::Workers(args) => client::workers(args).await,
            Command::Instances(args) => client::instances(args).await,
            Command::Capacity(args) => client::capacity(args).await,
            Command::Scheduler(args) => client::scheduler(args).await,
            Command::Policy(args) => client::policy(args).await,
            Command::Bench(args) => bench::run(args).await,
            Command::Recover(args) => client::recover(args).await,
            Command::Prune(args) => client::prune(args).await,
            Command::Detect(args) => client::detect(args).await,
            Command::Activities(args) => client::activities(args).await,
            Command::Runs(args) => client::runs(args).await,
            Command::Audit(args) => client::audit(args).await,
            Command::Notifications(args) => client::notifications(args).await,
            Command::Worker(args) => worker::run(args).await,
            Command::Watch(args) => watch::run(args).await,
            Command::Export(args) => transfer::export(args).await,
            Command::Import(args) => transfer::import(args).await,
            Command::Backup(args) => transfer::backup(args).await,
            Command::Restore(args) => transfer::restore(args).await,
            Command::Credentials(args) => Ok(credentials::run(args)),
            Command::ImportWeedAdmin(args) => import_weed_admin::run(args).await,
            Command::Windows(args) => client::windows(args).await,
            Command::Budget(args) => budget::run(args).await,
        }
    });
    // A blocking call stuck on a failed store must not hold the process.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    match result {
        Ok(code) => Ok(code),
        Err(e) => match e.downcast::<crate::fate::Fatal>() {
            Ok(fatal) => Err(fatal),
            Err(e) => {
                eprintln!("jobcenter: {e:#}");
                Ok(ExitCode::from(EXIT_USAGE))
            }
        },
    }
}
