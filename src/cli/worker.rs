//! `jobcenter worker`: executes tasks for an admin server over the worker
//! stream until SIGINT or SIGTERM.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;

use super::EXIT_USAGE;
use crate::worker::remote::{self, RemoteWorkerOptions};
use crate::worker::{builtin_handlers, ExecLog, Registry};

/// The environment variable that holds the bearer token, unless `--token-file` gives one.
pub(super) const TOKEN_ENV: &str = "JOBCENTER_TOKEN";

#[derive(clap::Args, Debug)]
pub struct WorkerArgs {
    /// The admin server's HTTP address; the worker stream's port is asked
    /// from it. Several, comma-separated, are tried in turn (a failover);
    /// `grpc://HOST:PORT` gives the worker stream's address directly.
    #[arg(long, default_value = "127.0.0.1:23646", value_delimiter = ',')]
    pub admin: Vec<String>,
    /// Job types to serve, comma-separated [default: every built-in job type].
    #[arg(long, value_delimiter = ',')]
    pub job_types: Vec<String>,
    /// Executions at once.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_execute: u32,
    /// Detection slots reported to the admin (this worker runs no detection).
    #[arg(long, default_value_t = 1)]
    pub max_detect: u32,
    /// The worker's stable id [default: jobcenter-worker-HOSTNAME].
    #[arg(long)]
    pub id: Option<String>,
    /// Heartbeat interval, e.g. 15s, 500ms or 2m, unless the admin names one.
    #[arg(long, default_value = "15s", value_parser = parse_interval)]
    pub heartbeat: Duration,
    /// How long executions go on while no admin can be reached; then they
    /// are stopped. An admin keeps a disconnected worker's attempts for the
    /// lease plus a quarter (at least 0.5 s), which must be shorter than its
    /// --orphan-grace and --silence-timeout.
    #[arg(long, default_value = "20s", value_parser = parse_interval)]
    pub lease: Duration,
    /// Append a line per execution event (start and outcome) to this file.
    #[arg(long, env = "JOBCENTER_EXEC_LOG")]
    pub exec_log: Option<PathBuf>,
    /// A file holding the bearer token for the admin (else $JOBCENTER_TOKEN).
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// A file holding the token the `recovery_check` job type asks the
    /// admin's API with (a role that may recover: operator); else the
    /// --token-file token.
    #[arg(long)]
    pub api_token_file: Option<PathBuf>,
    /// Export traces over OTLP/gRPC to this endpoint (`http://HOST:PORT`):
    /// a span for each execution, the child of its attempt's span on the
    /// admin (docs/operations.md, "Traces").
    #[arg(long)]
    pub otlp_endpoint: Option<String>,
    #[command(flatten)]
    pub tls: crate::tls::ClientTls,
}

pub(super) async fn run(args: WorkerArgs) -> anyhow::Result<ExitCode> {
    let token = match &args.token_file {
        Some(path) => Some(read_token_file(path).await?),
        None => std::env::var(TOKEN_ENV).ok().map(|t| t.trim().to_string()).filter(|t| !t.is_empty()),
    };
    let mut handlers = builtin_handlers();
    let admins: Vec<String> = args.admin.iter().map(|a| a.trim().to_string()).filter(|a| !a.is_empty()).collect();
    let api_token = match &args.api_token_file {
        Some(path) => Some(read_token_file(path).await?),
        None => token.clone(),
    };
    handlers.push(crate::worker::RecoveryCheckHandler::shared(admins, api_token, args.tls.clone()));
    let registry = match select_handlers(handlers, &args.job_types) {
        Ok(registry) => registry,
        Err(message) => {
            eprintln!("jobcenter worker: {message}");
            return Ok(ExitCode::from(EXIT_USAGE));
        }
    };
    let exec_log = match &args.exec_log {
        Some(path) => Some(ExecLog::open(path).with_context(|| format!("opening {}", path.display()))?),
        None => None,
    };
    let worker_id = match args.id.as_deref().map(str::trim) {
        Some("") => anyhow::bail!("--id must not be empty"),
        Some(id) => id.to_string(),
        None => remote::default_worker_id(),
    };
    let options = RemoteWorkerOptions {
        admins: args.admin.iter().map(|a| a.trim().to_string()).filter(|a| !a.is_empty()).collect(),
        worker_id,
        max_execute: args.max_execute,
        max_detect: args.max_detect,
        heartbeat: args.heartbeat,
        lease: args.lease,
        token,
        exec_log,
        tls: args.tls.clone(),
    };
    let shutdown = shutdown_signal()?;
    remote::run(options, registry, shutdown).await?;
    Ok(ExitCode::SUCCESS)
}

/// The built-in handlers named in `job_types`, or all of them for an empty list.
fn select_handlers(
    handlers: Vec<std::sync::Arc<dyn crate::worker::Handler>>,
    job_types: &[String],
) -> Result<Registry, String> {
    let wanted: Vec<&str> = job_types.iter().map(|t| t.trim()).filter(|t| !t.is_empty()).collect();
    if wanted.is_empty() {
        return Ok(Registry::new(handlers));
    }
    if let Some(unknown) = wanted.iter().find(|t| !handlers.iter().any(|h| h.job_type() == **t)) {
        let known: Vec<&str> = handlers.iter().map(|h| h.job_type()).collect();
        return Err(format!("unknown job type {unknown:?}; this worker serves {}", known.join(", ")));
    }
    Ok(Registry::new(handlers.into_iter().filter(|h| wanted.contains(&h.job_type())).collect()))
}

async fn read_token_file(path: &Path) -> anyhow::Result<String> {
    let text = tokio::fs::read_to_string(path).await.with_context(|| format!("reading {}", path.display()))?;
    let token = text.trim();
    if token.is_empty() {
        anyhow::bail!("the token file {} is empty", path.display());
    }
    Ok(token.to_string())
}

/// Completes at the first SIGINT or SIGTERM.
fn shutdown_signal() -> anyhow::Result<impl Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut terminate = signal(SignalKind::terminate()).context("listening for SIGTERM")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("listening for SIGINT")?;
    Ok(async move {
        tokio::select! {
            _ = terminate.recv() => tracing::info!("SIGTERM: stopping"),
            _ = interrupt.recv() => tracing::info!("SIGINT: stopping"),
        }
    })
}

/// A heartbeat interval: `parse_duration`, and longer than zero.
fn parse_interval(text: &str) -> Result<Duration, String> {
    let duration = parse_duration(text)?;
    if duration.is_zero() {
        return Err("the interval must be longer than zero".into());
    }
    Ok(duration)
}

/// A duration as a whole number and a unit: `500ms`, `15s`, `2m` or `1h`.
pub(super) fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    if number.is_empty() {
        return Err(format!("{text:?} is not a duration like 15s, 500ms or 2m"));
    }
    let amount: u64 = number.parse().map_err(|_| format!("{text:?} is too long a duration"))?;
    let millis_per_unit: u64 = match unit {
        "ms" => 1,
        "s" => 1000,
        "m" => 60 * 1000,
        "h" => 60 * 60 * 1000,
        "" => return Err(format!("{text:?} has no unit; write it like 15s, 500ms or 2m")),
        _ => return Err(format!("{text:?} has an unknown unit {unit:?}; use ms, s, m or h")),
    };
    let millis = amount.checked_mul(millis_per_unit).ok_or_else(|| format!("{text:?} is too long a duration"))?;
    Ok(Duration::from_millis(millis))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_durations() {
        assert_eq!(parse_duration("15s"), Ok(Duration::from_secs(15)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration(" 1h "), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        for bad in ["", "s", "15", "1.5s", "15 s", "-1s", "15d", "99999999999999999999s", "18446744073709551615h"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} was accepted");
        }
        assert!(parse_interval("0ms").is_err());
        assert_eq!(parse_interval("1ms"), Ok(Duration::from_millis(1)));
    }

    #[test]
    fn selects_built_in_handlers() {
        let types =
            |registry: Registry| -> Vec<String> { registry.job_types().iter().map(|t| t.to_string()).collect() };
        assert_eq!(types(select_handlers(builtin_handlers(), &[]).unwrap()), ["noop", "shell"]);
        assert_eq!(types(select_handlers(builtin_handlers(), &["shell".into(), " ".into()]).unwrap()), ["shell"]);
        assert_eq!(types(select_handlers(builtin_handlers(), &["noop".into(), "noop".into()]).unwrap()), ["noop"]);
        let error = select_handlers(builtin_handlers(), &["noop".into(), "vacuum".into()]).err().unwrap();
        assert_eq!(error, "unknown job type \"vacuum\"; this worker serves noop, shell");
    }

    #[test]
    fn worker_arguments_parse() {
        use clap::Parser;
        let cli = crate::cli::Cli::try_parse_from([
            "jobcenter",
            "worker",
            "--admin",
            "10.0.0.1:23646",
            "--job-types",
            "noop,shell",
            "--max-execute",
            "2",
            "--heartbeat",
            "500ms",
        ])
        .unwrap();
        let crate::cli::Command::Worker(args) = cli.command else { panic!("not the worker command") };
        assert_eq!(args.admin, ["10.0.0.1:23646"]);
        assert_eq!(args.job_types, ["noop", "shell"]);
        assert_eq!((args.max_execute, args.max_detect), (2, 1));
        assert_eq!(args.heartbeat, Duration::from_millis(500));
        assert!(crate::cli::Cli::try_parse_from(["jobcenter", "worker", "--max-execute", "0"]).is_err());
        assert!(crate::cli::Cli::try_parse_from(["jobcenter", "worker", "--heartbeat", "0s"]).is_err());
    }
}
