//! `jobcenter server`: the admin server on a data directory.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;

use super::client::token;
use super::EXIT_USAGE;
use crate::server::{self, ServerOptions};
use crate::wire::GRPC_PORT_OFFSET;

#[derive(clap::Args, Debug)]
pub struct ServerArgs {
    #[command(flatten)]
    pub store: super::store_args::StoreArgs,
    /// HTTP address (JSON API, health, worker port lookup).
    #[arg(long, default_value = "127.0.0.1:23646")]
    pub http: SocketAddr,
    /// gRPC port (worker stream and client API); default: HTTP port + 10000.
    #[arg(long)]
    pub grpc: Option<u16>,
    /// Master gRPC addresses handed to workers (repeat or comma-separate).
    #[arg(long, value_delimiter = ',')]
    pub master: Vec<String>,
    /// PEM CA that signed the masters' gRPC certificates (SeaweedFS's
    /// `grpc.ca`): reaches the masters with TLS.
    #[arg(long, requires = "master")]
    pub master_tls_ca: Option<PathBuf>,
    /// PEM certificate to present to the masters (mutual TLS), e.g. the one
    /// of `grpc.client` in SeaweedFS's `security.toml`.
    #[arg(long, requires_all = ["master_tls_key", "master_tls_ca"])]
    pub master_tls_cert: Option<PathBuf>,
    /// PEM private key of --master-tls-cert.
    #[arg(long, requires = "master_tls_cert")]
    pub master_tls_key: Option<PathBuf>,
    /// With --master: jobcenter holds the cluster's `shell` lock at most
    /// this long at a stretch while maintenance runs, then lets it go once
    /// the running attempts end, so an operator's `weed shell` gets in.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub cluster_lock_turn: Duration,
    /// In-process workers running the built-in job types.
    #[arg(long, default_value_t = 0)]
    pub local_workers: u32,
    /// Slots of each in-process worker.
    #[arg(long, default_value_t = 4)]
    pub local_worker_slots: u32,
    /// Heartbeat interval asked of workers.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub heartbeat: Duration,
    /// How long attempts of a previous run wait for their worker to return.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub orphan_grace: Duration,
    /// How long a wait makes up for one level of priority: a ready task is
    /// never passed by one that became ready this long times their
    /// difference in levels after it (low, normal, high, critical).
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub priority_aging: Duration,
    /// A worker silent for longer loses its attempts (recovery rule R3).
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub silence_timeout: Duration,
    /// How often the recovery check runs.
    #[arg(long, default_value = "1m", value_parser = parse_duration)]
    pub recovery_interval: Duration,
    /// A job whose tasks all ended is finalized by recovery after this (rule R5).
    #[arg(long, default_value = "1m", value_parser = parse_duration)]
    pub finalize_grace: Duration,
    /// A task held this long without progress is taken back (recovery rule R3-progress).
    #[arg(long, default_value = "24h", value_parser = parse_duration)]
    pub progress_timeout: Duration,
    /// With several admins on one database: a task assigned this long ago
    /// that its connected worker never got (its leader died before sending
    /// it) is taken back (recovery rule R2-undelivered).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub delivery_grace: Duration,
    /// The largest job file a client may submit, in bytes (`submit` streams
    /// it in chunks; the HTTP API takes at most --max-request-bytes at once).
    #[arg(long, default_value_t = 512 * 1024 * 1024)]
    pub max_job_bytes: u64,
    /// The most tasks a submitted job may hold.
    #[arg(long, default_value_t = 1_000_000)]
    pub max_tasks: usize,
    /// The largest single request the API takes, in bytes: a job file sent
    /// in one piece (HTTP, or gRPC `SubmitJob`).
    #[arg(long, default_value_t = 64 * 1024 * 1024)]
    pub max_request_bytes: usize,
    /// With several admins on one database: how often this one writes its heartbeat.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub cluster_heartbeat: Duration,
    /// With several admins on one database: an admin silent this long (on
    /// the database's clock) is deactivated and its jobs taken over.
    #[arg(long, default_value = "20s", value_parser = parse_duration)]
    pub lag_threshold: Duration,
    /// An ended job is removed once it ended longer ago than this.
    #[arg(long, default_value = "7d", value_parser = parse_duration)]
    pub keep_ended_for: Duration,
    /// At most this many ended jobs are kept (the newest); older ones are removed.
    #[arg(long, default_value_t = 10_000)]
    pub keep_ended: usize,
    /// The recovery check's own jobs (one per --recovery-interval) are kept this long once ended.
    #[arg(long, default_value = "1h", value_parser = parse_duration)]
    pub keep_recovery_checks_for: Duration,
    /// An audit record is removed once it is older than this.
    #[arg(long, default_value = "90d", value_parser = parse_duration)]
    pub keep_audit_for: Duration,
    /// At most this many audit records are kept (the newest); older ones are removed.
    #[arg(long, default_value_t = 100_000)]
    pub keep_audit: usize,
    /// How often ended jobs and audit records past those rules are removed (in bounded batches).
    #[arg(long, default_value = "1m", value_parser = parse_duration)]
    pub prune_interval: Duration,
    /// Attempts a task may lose with its worker before it fails.
    #[arg(long, default_value_t = 3)]
    pub lost_attempt_limit: u32,
    /// Workers connected at once; more are refused until one leaves. Each
    /// takes a file descriptor: the server raises its own limit of open
    /// files to the system's hard limit at start.
    #[arg(long, default_value_t = 16_384)]
    pub max_workers: usize,
    /// With several admins on one database: the gRPC address the other
    /// instances reach this one at, when it is not the one it listens on
    /// (a proxy, a load balancer or NAT in between).
    #[arg(long)]
    pub advertise_grpc: Option<String>,
    /// A client (HTTP or gRPC) that takes none of a response's bytes for
    /// this long has its connection closed.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub send_timeout: Duration,
    /// A file holding a token that may do everything (role admin), for
    /// clients, workers and the other instances (or JOBCENTER_TOKEN).
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// A file of named tokens, each with its role (viewer, operator,
    /// worker, instance, admin), kept as hashes (`jobcenter credentials
    /// add`); read again on change and on SIGHUP.
    #[arg(long)]
    pub credentials: Option<PathBuf>,
    /// A file of webhook endpoints (TOML, or YAML by its name), each with
    /// the events it wants (job.failed, job.succeeded, recovery.findings,
    /// instance.lost, worker.lost, detection.failed) and, optionally, the
    /// file of its signing key; read again on change and on SIGHUP.
    #[arg(long)]
    pub notify: Option<PathBuf>,
    /// A file holding the token this instance presents to the others
    /// (role instance); else the --token-file token.
    #[arg(long)]
    pub peer_token_file: Option<PathBuf>,
    /// PEM CA that signed the other instances' certificates, when they
    /// serve TLS (else --tls-client-ca); this instance presents its own
    /// --tls-cert to them.
    #[arg(long, requires = "tls_cert")]
    pub peer_tls_ca: Option<PathBuf>,
    /// Unknown credentials one address may present in a minute; past them
    /// a credential it presents that was not verified before waits before it
    /// is judged (250 ms, twice as long at each further failure, up to 5 s).
    #[arg(long, default_value_t = 5)]
    pub free_credential_failures: u32,
    /// Bind a non-loopback address without a token or credentials.
    #[arg(long)]
    pub allow_insecure_bind: bool,
    /// Export traces over OTLP/gRPC to this endpoint (`http://HOST:PORT`):
    /// a span for each job, task attempt, detection run, recovery check
    /// and store commit (docs/operations.md, "Traces").
    #[arg(long)]
    pub otlp_endpoint: Option<String>,
    #[command(flatten)]
    pub tls: crate::tls::ServerTls,
}

/// TLS to the other instances when this one serves it: they serve it too,
/// with certificates of --peer-tls-ca (or --tls-client-ca), and this one
/// presents its own.
fn peer_tls(args: &ServerArgs) -> Option<crate::tls::ClientTls> {
    let tls = &args.tls;
    tls.tls_cert.as_ref()?;
    Some(crate::tls::ClientTls {
        tls_ca: args.peer_tls_ca.clone().or_else(|| tls.tls_client_ca.clone()),
        tls_cert: tls.tls_cert.clone(),
        tls_key: tls.tls_key.clone(),
    })
}

/// `15s`, `500ms`, `2m`, `1h`, `7d`, or plain seconds.
pub(super) fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = text.split_at(text.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(text.len()));
    let value: f64 = number.parse().map_err(|_| format!("{text:?} is not a duration such as 15s, 500ms or 2m"))?;
    let seconds = match unit {
        "" | "s" => value,
        "ms" => value / 1000.0,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        "d" => value * 86_400.0,
        _ => return Err(format!("{text:?}: unknown unit {unit:?}; use ms, s, m, h or d")),
    };
    Ok(Duration::from_secs_f64(seconds))
}

pub(super) async fn run(args: ServerArgs) -> anyhow::Result<ExitCode> {
    let token = token(&args.token_file)?;
    if !args.http.ip().is_loopback() && token.is_none() && args.credentials.is_none() && !args.allow_insecure_bind {
        eprintln!(
            "jobcenter: refusing to listen on {} without a token: give --token-file (or JOBCENTER_TOKEN) or \
             --credentials, or --allow-insecure-bind",
            args.http
        );
        return Ok(ExitCode::from(EXIT_USAGE));
    }
    if let Some(path) = &args.credentials {
        if let Err(e) = crate::server::surface::access::credentials::read(path) {
            eprintln!("jobcenter: {e}");
            return Ok(ExitCode::from(EXIT_USAGE));
        }
    }
    if let Some(path) = &args.notify {
        if let Err(e) = crate::server::notify::file::read(path) {
            eprintln!("jobcenter: {e}");
            return Ok(ExitCode::from(EXIT_USAGE));
        }
    }
    let peer_token = match &args.peer_token_file {
        Some(path) => Some(crate::wire::read_token(path).with_context(|| format!("reading {}", path.display()))?),
        None => None,
    };
    // Workers are told the interval in whole seconds.
    let heartbeat = Duration::from_secs(args.heartbeat.as_secs_f64().ceil().max(1.0) as u64);
    if args.silence_timeout <= heartbeat * 2 {
        eprintln!(
            "jobcenter: --silence-timeout ({:?}) must be longer than twice --heartbeat ({:?}), \
             or healthy workers would be taken for silent ones",
            args.silence_timeout, heartbeat
        );
        return Ok(ExitCode::from(EXIT_USAGE));
    }
    if args.lag_threshold < args.cluster_heartbeat * 2 {
        eprintln!(
            "jobcenter: --lag-threshold ({:?}) must be at least twice --cluster-heartbeat ({:?}), \
             or live admins would be taken for silent ones",
            args.lag_threshold, args.cluster_heartbeat
        );
        return Ok(ExitCode::from(EXIT_USAGE));
    }
    let grpc_port = match args.grpc {
        Some(port) => port,
        None if args.http.port() == 0 => 0,
        None => args.http.port().checked_add(GRPC_PORT_OFFSET).context("the HTTP port leaves no room for +10000")?,
    };
    let grpc_addr = SocketAddr::new(args.http.ip(), grpc_port);
    let store = match args.store.open().await {
        Ok(store) => store,
        Err(e) => {
            eprintln!("jobcenter: {e:#}");
            return Ok(ExitCode::from(EXIT_USAGE));
        }
    };
    let http = tokio::net::TcpListener::bind(args.http).await.with_context(|| format!("binding {}", args.http))?;
    let grpc = tokio::net::TcpListener::bind(grpc_addr).await.with_context(|| format!("binding {grpc_addr}"))?;
    let peer_tls = peer_tls(&args);
    let options = ServerOptions {
        masters: crate::server::seaweedfs::master::Masters {
            addresses: args.master,
            tls: crate::tls::ClientTls {
                tls_ca: args.master_tls_ca,
                tls_cert: args.master_tls_cert,
                tls_key: args.master_tls_key,
            },
        },
        heartbeat_interval: args.heartbeat,
        orphan_grace: args.orphan_grace,
        local_workers: args.local_workers,
        local_worker_slots: args.local_worker_slots,
        token,
        credentials: args.credentials,
        notify: args.notify,
        peer_token,
        peer_tls,
        free_credential_failures: args.free_credential_failures,
        lost_attempt_limit: args.lost_attempt_limit,
        max_workers: args.max_workers,
        tls: args.tls.config()?,
        silence_timeout: args.silence_timeout,
        recovery_interval: args.recovery_interval,
        finalize_grace: args.finalize_grace,
        progress_timeout: args.progress_timeout,
        delivery_grace: args.delivery_grace,
        cluster: server::cluster::Timing { heartbeat: args.cluster_heartbeat, lag: args.lag_threshold },
        limits: crate::jobfile::Limits {
            max_file_bytes: args.max_job_bytes,
            max_tasks: args.max_tasks,
            ..crate::jobfile::Limits::default()
        },
        max_request_bytes: args.max_request_bytes,
        retention: crate::retention::Retention {
            age: args.keep_ended_for,
            count: args.keep_ended,
            recovery_checks: args.keep_recovery_checks_for,
            audit: crate::model::audit::Keep { age: args.keep_audit_for, count: args.keep_audit },
        },
        prune_interval: args.prune_interval,
        cluster_lock_turn: args.cluster_lock_turn,
        send_timeout: args.send_timeout,
        advertise_grpc: args.advertise_grpc,
        traces: args.otlp_endpoint.is_some(),
        priority_aging: args.priority_aging,
        ..ServerOptions::default()
    };
    match server::run(store, options, http, grpc, shutdown_signal()).await {
        Ok(()) => Ok(ExitCode::SUCCESS),
        // The process's fate, for `main` to act on.
        Err(server::Error::Fatal(fatal)) => Err(fatal.into()),
        Err(e) => Err(e.into()),
    }
}

async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    let mut terminate = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(signal) => signal,
        Err(_) => {
            let _ = interrupt.await;
            return;
        }
    };
    tokio::select! {
        _ = interrupt => {}
        _ = terminate.recv() => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_durations() {
        assert_eq!(parse_duration("15s"), Ok(Duration::from_secs(15)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert!(parse_duration("3 days").is_err());
        assert!(parse_duration("fast").is_err());
    }
}
