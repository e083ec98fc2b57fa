//! Commands that talk to a running admin server over its client API:
//! submit, jobs, job, cancel, retry, workers and policy.
#![allow(clippy::print_stdout)]

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use super::{EXIT_JOB_FAILED, EXIT_USAGE};
use crate::backoff::Backoff;
use crate::jobfile::Format;
use crate::proto::api::{self, job_service_client::JobServiceClient};
use crate::wire;

/// Where the admin is and how to prove who we are.
#[derive(clap::Args, Debug, Clone)]
pub struct Connection {
    /// The admin server's HTTP address; its gRPC port is looked up there.
    /// Several admins of one cluster, comma-separated, are tried in turn:
    /// commands go to the first that answers, and `watch` and
    /// `submit --wait` carry on with the next when theirs goes away.
    #[arg(long, global = true, default_value = "127.0.0.1:23646", env = "JOBCENTER_ADMIN")]
    pub admin: String,
    /// A file holding the shared token (the token may also come from JOBCENTER_TOKEN).
    #[arg(long, global = true)]
    pub token_file: Option<PathBuf>,
    #[command(flatten)]
    pub tls: crate::tls::ClientTls,
    /// The address that answered last, tried first next time.
    #[arg(skip)]
    preferred: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

pub(super) type Client = JobServiceClient<InterceptedService<Channel, Bearer>>;

#[derive(Clone)]
pub struct Bearer(Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request.metadata_mut().insert("authorization", value.clone());
        }
        Ok(request)
    }
}

/// The token from `--token-file` or `JOBCENTER_TOKEN`, never from argv.
pub(super) fn token(token_file: &Option<PathBuf>) -> anyhow::Result<Option<String>> {
    if let Some(path) = token_file {
        let token = crate::wire::read_token(path).with_context(|| format!("reading {}", path.display()))?;
        return Ok(Some(token));
    }
    Ok(std::env::var("JOBCENTER_TOKEN").ok().filter(|t| !t.trim().is_empty()))
}

impl Connection {
    /// The admin addresses given, in order.
    pub fn admins(&self) -> Vec<&str> {
        self.admin.split(',').map(str::trim).filter(|a| !a.is_empty()).collect()
    }

    /// Connects to the first admin that answers, starting with the one that
    /// answered last.
    pub async fn connect(&self) -> anyhow::Result<Client> {
        use std::sync::atomic::Ordering;
        let admins = self.admins();
        anyhow::ensure!(!admins.is_empty(), "--admin names no address");
        let first = self.preferred.load(Ordering::Relaxed) % admins.len();
        let mut failures = Vec::new();
        for n in 0..admins.len() {
            let index = (first + n) % admins.len();
            match self.connect_to(admins[index]).await {
                Ok(client) => {
                    self.preferred.store(index, Ordering::Relaxed);
                    return Ok(client);
                }
                Err(e) if admins.len() == 1 => return Err(e),
                Err(e) => failures.push(format!("{e:#}")),
            }
        }
        anyhow::bail!("no admin answered: {}", failures.join("; "))
    }

    async fn connect_to(&self, admin: &str) -> anyhow::Result<Client> {
        let address = wire::resolve_grpc_address(admin).await?;
        let channel = self
            .tls
            .endpoint(&address)?
            .connect_timeout(std::time::Duration::from_secs(5))
            .connect()
            .await
            .with_context(|| format!("cannot reach the admin at {admin} (gRPC {address})"))?;
        let bearer = match token(&self.token_file)? {
            Some(token) => Some(format!("Bearer {token}").parse().context("the token is not valid header text")?),
            None => None,
        };
        Ok(JobServiceClient::with_interceptor(channel, Bearer(bearer))
            .max_decoding_message_size(256 * 1024 * 1024)
            .max_encoding_message_size(256 * 1024 * 1024))
    }
}

fn status_error(status: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{}", status.message())
}

#[derive(clap::Args, Debug)]
pub struct SubmitArgs {
    pub file: PathBuf,
    /// Wait until the job ends; exit 0 if it succeeded, 1 otherwise.
    #[arg(long)]
    pub wait: bool,
    /// With --wait, print the final job as JSON.
    #[arg(long)]
    pub json: bool,
    /// Follow the job live, as `jobcenter watch` does; exit 0 if it succeeded, 1 otherwise.
    #[arg(long, conflicts_with = "wait")]
    pub watch: bool,
    /// With --watch, print plain lines (the default when stdout is not a terminal).
    #[arg(long, requires = "watch")]
    pub plain: bool,
    #[command(flatten)]
    pub connection: Connection,
}

pub(super) async fn submit(args: SubmitArgs) -> anyhow::Result<ExitCode> {
    let content = std::fs::read(&args.file).with_context(|| format!("reading {}", args.file.display()))?;
    let format = Format::from_path(&args.file).name();
    let mut client = args.connection.connect().await?;
    let chunks = submit_chunks(content, format, &args.file.display().to_string());
    let job_id = match client.submit_job_stream(tokio_stream::iter(chunks)).await {
        Ok(response) => response.into_inner().job_id,
        Err(status) if status.code() == tonic::Code::InvalidArgument => {
            eprintln!("{}", status.message());
            return Ok(ExitCode::from(EXIT_USAGE));
        }
        Err(status) => return Err(status_error(status)),
    };
    if args.watch {
        eprintln!("submitted job {job_id}");
        return super::watch::watch(&args.connection, &job_id, args.plain).await;
    }
    if !args.wait {
        if args.json {
            println!("{}", serde_json::json!({ "job_id": job_id }));
        } else {
            println!("{job_id}");
        }
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!("submitted job {job_id}");
    wait(&args.connection, &job_id).await?;
    print_final(&args.connection, &job_id, args.json).await
}

/// How much of a job file one message of `SubmitJobStream` carries.
const SUBMIT_CHUNK_BYTES: usize = 1024 * 1024;

/// A job file as the messages of `SubmitJobStream`: the first names its
/// format and source.
pub(super) fn submit_chunks(content: Vec<u8>, format: &str, source_name: &str) -> Vec<api::SubmitJobChunk> {
    let mut chunks: Vec<api::SubmitJobChunk> = content
        .chunks(SUBMIT_CHUNK_BYTES)
        .map(|part| api::SubmitJobChunk { content: part.to_vec(), ..api::SubmitJobChunk::default() })
        .collect();
    if chunks.is_empty() {
        chunks.push(api::SubmitJobChunk::default());
    }
    chunks[0].format = format.to_string();
    chunks[0].source_name = source_name.to_string();
    chunks
}

/// How long `wait` keeps trying while no admin answers.
const WAIT_PATIENCE: std::time::Duration = std::time::Duration::from_secs(120);

/// Waits until the job has ended (`WaitJob`, which follows no task).
/// When its admin goes away, it carries on with another (`--admin A,B`)
/// or the same one back, for up to two minutes without one.
pub(super) async fn wait(connection: &Connection, job_id: &str) -> anyhow::Result<api::JobSummary> {
    let mut pauses = Backoff::doubling(std::time::Duration::from_millis(200), std::time::Duration::from_secs(2));
    let mut reached = std::time::Instant::now();
    loop {
        let attempt: Result<api::JobSummary, tonic::Status> = async {
            let mut client = connection.connect().await.map_err(|e| tonic::Status::unavailable(format!("{e:#}")))?;
            reached = std::time::Instant::now();
            Ok(client.wait_job(api::JobRef { job_id: job_id.into() }).await?.into_inner())
        }
        .await;
        match attempt {
            Ok(summary) => return Ok(summary),
            Err(status)
                if matches!(
                    status.code(),
                    tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled
                ) =>
            {
                if reached.elapsed() > WAIT_PATIENCE {
                    return Err(status_error(status));
                }
                tracing::debug!(job.id = job_id, error = status.message(), "wait lost; trying again");
                tokio::time::sleep(pauses.next_pause()).await;
            }
            Err(status) => return Err(status_error(status)),
        }
    }
}

/// A job of any size, read in parts and put back together.
pub(super) async fn read_job(client: &mut Client, job_id: &str) -> Result<api::Job, tonic::Status> {
    let mut parts = client.read_job(api::JobRef { job_id: job_id.into() }).await?.into_inner();
    let mut assembly = wire::JobAssembly::default();
    while let Some(part) = parts.message().await? {
        if let Some(job) = assembly.push(part).map_err(tonic::Status::data_loss)? {
            return Ok(job);
        }
    }
    Err(tonic::Status::data_loss(format!("the parts of job {job_id} ended before its last task")))
}

/// How `print_parts` shows a job.
#[derive(Clone, Copy, PartialEq)]
enum Style {
    Table,
    /// Every field, as `/api/jobs/{id}` gives it.
    Json,
    /// What `jobcenter run --json` prints.
    ShortJson,
}

/// Reads a job in parts and prints each as it comes, so that a job of any
/// size is never held whole; answers the job's state.
async fn print_parts(client: &mut Client, job_id: &str, style: Style) -> Result<String, tonic::Status> {
    let mut parts = client.read_job(api::JobRef { job_id: job_id.into() }).await?.into_inner();
    let mut json = wire::JobJson::new(style == Style::ShortJson);
    let (mut state, mut width) = (String::new(), 2);
    while let Some(part) = parts.message().await? {
        let last = part.first_task as usize + part.tasks.len() >= part.task_count as usize;
        if part.first_task == 0 {
            state = part.state.clone();
        }
        let text = match style {
            Style::Json | Style::ShortJson => json.part(part) + if last { json.end() } else { "" },
            Style::Table => {
                let mut text = String::new();
                if part.first_task == 0 {
                    width = part.tasks.iter().map(|t| t.id.len()).max().unwrap_or(2).clamp(2, 40);
                    text += &format!("job {} {:?}: {}", part.id, part.name, part.state);
                    if !part.priority.is_empty() {
                        text += &format!(" (priority {})", part.priority);
                    }
                    text.push('\n');
                    text +=
                        &format!("{:<width$}  {:<16}  {:<16}  {:>7}  ERROR\n", "ID", "JOB TYPE", "STATE", "ATTEMPT");
                }
                for t in &part.tasks {
                    let error = if t.state == "succeeded" { "" } else { t.error.as_str() };
                    text += &format!(
                        "{:<width$}  {:<16}  {:<16}  {:>7}  {}\n",
                        t.id, t.job_type, t.state, t.attempt, error
                    );
                }
                text.pop();
                text
            }
        };
        println!("{text}");
        if last {
            return Ok(state);
        }
    }
    Err(tonic::Status::data_loss(format!("the parts of job {job_id} ended before its last task")))
}

/// Prints an ended job (short JSON with `json`); exit 0 if it succeeded, 1 otherwise.
async fn print_final(connection: &Connection, job_id: &str, json: bool) -> anyhow::Result<ExitCode> {
    let mut client = connection.connect().await?;
    let style = if json { Style::ShortJson } else { Style::Table };
    let state = print_parts(&mut client, job_id, style).await.map_err(status_error)?;
    Ok(if state == "succeeded" { ExitCode::SUCCESS } else { ExitCode::from(EXIT_JOB_FAILED) })
}

fn time(millis: i64) -> String {
    if millis == 0 {
        "-".into()
    } else {
        crate::clock::Timestamp(millis).to_rfc3339()
    }
}

#[derive(clap::Args, Debug)]
pub struct JobsArgs {
    /// Only jobs in this state.
    #[arg(long)]
    pub state: Option<String>,
    /// Only jobs whose name contains this.
    #[arg(long, conflicts_with_all = ["data_dir", "database_url", "watch"])]
    pub name: Option<String>,
    /// Only jobs submitted by users (`submitted`), made by the scheduler
    /// (`scheduler`) or by the recovery check (`recovery`; left out otherwise).
    #[arg(long, conflicts_with_all = ["data_dir", "database_url", "watch", "all"])]
    pub origin: Option<String>,
    /// Every job, the recovery check's own included.
    #[arg(long, conflicts_with_all = ["data_dir", "database_url", "watch"])]
    pub all: bool,
    /// Only jobs created before this job id (the next page).
    #[arg(long, conflicts_with_all = ["data_dir", "database_url", "watch"])]
    pub before: Option<String>,
    #[arg(long, default_value_t = 50)]
    pub limit: u32,
    #[arg(long)]
    pub json: bool,
    /// Read a data directory directly instead of asking a server.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Read a database directly instead of asking a server.
    #[arg(long, conflicts_with = "data_dir")]
    pub database_url: Option<String>,
    /// Show the list live, read again every second.
    #[arg(long, conflicts_with_all = ["json", "data_dir", "database_url"])]
    pub watch: bool,
    /// With --watch, stop after this many refreshes (default: until Ctrl-C or q).
    #[arg(long, requires = "watch")]
    pub count: Option<u32>,
    #[command(flatten)]
    pub connection: Connection,
}

pub(super) async fn jobs(args: JobsArgs) -> anyhow::Result<ExitCode> {
    if args.watch {
        let source = super::watch::tables::Source::Jobs { state: args.state, limit: args.limit };
        return super::watch::tables::live(&args.connection, source, args.count).await;
    }
    let mut client = args.connection.connect().await?;
    let request = api::ListJobsRequest {
        state: args.state.unwrap_or_default(),
        limit: args.limit,
        name: args.name.unwrap_or_default(),
        origin: if args.all { "all".into() } else { args.origin.unwrap_or_default() },
        before: args.before.unwrap_or_default(),
    };
    let jobs = client.list_jobs(request).await.map_err(status_error)?.into_inner().jobs;
    if args.json {
        println!("{}", serde_json::to_string(&jobs)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!("{:<36}  {:<10}  {:>8}  {:<24}  NAME", "ID", "STATE", "TASKS", "CREATED");
    for j in jobs {
        println!("{:<36}  {:<10}  {:>8}  {:<24}  {}", j.id, j.state, j.tasks, time(j.created_at_ms), j.name);
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(clap::Args, Debug)]
pub struct JobArgs {
    pub id: String,
    #[arg(long)]
    pub json: bool,
    /// Read a data directory directly instead of asking a server.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Read a database directly instead of asking a server.
    #[arg(long, conflicts_with = "data_dir")]
    pub database_url: Option<String>,
    /// Give every task of the job, while it has not ended, this priority
    /// (low, normal, high, critical): what waits is dispatched by it.
    #[arg(long, conflicts_with_all = ["data_dir", "database_url"])]
    pub priority: Option<String>,
    #[command(flatten)]
    pub connection: Connection,
}

pub(super) async fn job(args: JobArgs) -> anyhow::Result<ExitCode> {
    let mut client = args.connection.connect().await?;
    if let Some(priority) = args.priority {
        let request = api::SetJobPriorityRequest { job_id: args.id.clone(), priority: priority.clone() };
        return match client.set_job_priority(request).await {
            Ok(_) => {
                println!("job {}: its tasks are dispatched at priority {priority} from now on", args.id);
                Ok(ExitCode::SUCCESS)
            }
            Err(status) => {
                eprintln!("jobcenter: {}", status.message());
                Ok(ExitCode::from(EXIT_USAGE))
            }
        };
    }
    let style = if args.json { Style::Json } else { Style::Table };
    match print_parts(&mut client, &args.id, style).await {
        Ok(_) => Ok(ExitCode::SUCCESS),
        Err(status) => {
            eprintln!("jobcenter: {}", status.message());
            Ok(ExitCode::from(EXIT_USAGE))
        }
    }
}

#[derive(clap::Args, Debug)]
pub struct JobIdArgs {
    pub id: String,
    #[command(flatten)]
    pub connection: Connection,
}

pub(super) async fn cancel(args: JobIdArgs) -> anyhow::Result<ExitCode> {
    let mut client = args.connection.connect().await?;
    match client.cancel_job(api::JobRef { job_id: args.id.clone() }).await {
        Ok(_) => {
            println!("job {} canceled: waiting tasks are canceled, running ones are asked to stop", args.id);
            Ok(ExitCode::SUCCESS)
        }
        Err(status) => {
            eprintln!("jobcenter: {}", status.message());
            Ok(ExitCode::from(EXIT_USAGE))
        }
    }
}

pub(super) async fn retry(args: JobIdArgs) -> anyhow::Result<ExitCode> {
    let mut client = args.connection.connect().await?;
    match client.retry_job(api::JobRef { job_id: args.id.clone() }).await {
        Ok(_) => {
            println!("job {}: its failed part runs again", args.id);
            Ok(ExitCode::SUCCESS)
        }
        Err(status) => {
            eprintln!("jobcenter: {}", status.message());
            Ok(ExitCode::from(EXIT_USAGE))
        }
    }
}

#[derive(clap::Args, Debug)]
pub struct WorkersArgs {
    #[arg(long)]
    pub json: bool,
    /// Show the list live, read again every second.
    #[arg(long, conflicts_with = "json")]
    pub watch: bool,
    /// With --watch, stop after this many refreshes (default: until Ctrl-C or q).
    #[arg(long, requires = "watch")]
    pub count: Option<u32>,
    #[command(flatten)]
    pub connection: Connection,
}

pub(super) async fn workers(args: WorkersArgs) -> anyhow::Result<ExitCode> {
    if args.watch {
        return super::watch::tables::live(&args.connection, super::watch::tables::Source::Workers, args.count).await;
    }
    let mut client = args.connection.connect().await?;
    let mut workers = Vec::new();
    loop {
        let request = api::ListWorkersRequest { offset: u32::try_from(workers.len())?, limit: 5_000 };
        let page = client.list_workers(request).await.map_err(status_error)?.into_inner();
        let last = page.workers.is_empty() || workers.len() + page.workers.len() >= page.total as usize;
        workers.extend(page.workers);
        if last {
            break;
        }
    }
    if args.json {
        println!("{}", serde_json::to_string(&workers)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!("{:<24}  {:<36}  {:<9}  {:<24}  JOB TYPES", "WORKER", "HANDLER", "SLOTS", "LAST HEARTBEAT");
    for w in workers {
        let types: Vec<String> = w
            .capabilities
            .iter()
            .map(|c| {
                let roles = match (c.can_detect, c.can_execute) {
                    (true, true) => "detect+execute",
                    (true, false) => "detect",
                    _ => "execute",
                };
                format!("{}({roles})", c.job_type)
            })
            .collect();
        let slots = format!("{}/{}", w.execution_slots_used, w.execution_slots_total);
        println!(
            "{:<24}  {:<36}  {:<9}  {:<24}  {}",
            w.worker_id,
            w.handler,
            slots,
            time(w.last_heartbeat_ms),
            types.join(" ")
        );
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(clap::Args, Debug)]
pub struct InstancesArgs {
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub connection: Connection,
}

pub(super) async fn instances(args: InstancesArgs) -> anyhow::Result<ExitCode> {
    let mut client = args.connection.connect().await?;
    let instances =
        client.list_instances(api::ListInstancesRequest {}).await.map_err(status_error)?.into_inner().instances;
    if args.json {
        println!("{}", serde_json::to_string(&instances)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:<38}  {:<6}  {:<11}  {:<21}  {:<24}  {:>5}  {:>7}  {:<6}  DETECTIONS",
        "INSTANCE", "ROLE", "STATUS", "ADDRESS", "LAST HEARTBEAT (DB)", "JOBS", "WORKERS", "PAUSED"
    );
    for i in instances {
        let id = if i.answering { format!("{} *", i.id) } else { i.id.clone() };
        let heartbeat = if i.heartbeat_ms == 0 {
            "-".to_string()
        } else {
            format!("{} ({:.1} s ago)", time(i.heartbeat_ms), i.heartbeat_age_ms as f64 / 1000.0)
        };
        println!(
            "{:<38}  {:<6}  {:<11}  {:<21}  {:<24}  {:>5}  {:>7}  {:<6}  {}",
            id,
            i.role,
            i.status,
            i.http_address,
            heartbeat,
            i.jobs_led,
            i.workers,
            if i.paused { "yes" } else { "no" },
            i.detections.join(",")
        );
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(clap::Args, Debug)]
pub struct CapacityArgs {
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub connection: Connection,
}

/// Bytes as KiB, MiB or GiB, signed.
fn size(bytes: i64) -> String {
    let magnitude = bytes.unsigned_abs() as f64;
    let sign = if bytes < 0 { "-" } else { "" };
    match magnitude {
        m if m >= 1024.0 * 1024.0 * 1024.0 => format!("{sign}{:.1} GiB", m / (1024.0 * 1024.0 * 1024.0)),
        m if m >= 1024.0 * 1024.0 => format!("{sign}{:.1} MiB", m / (1024.0 * 1024.0)),
        m => format!("{sign}{:.1} KiB", m / 1024.0),
    }
}

pub(super) async fn capacity(args: CapacityArgs) -> anyhow::Result<ExitCode> {
    let mut client = args.connection.connect().await?;
    let capacity = client.get_capacity(api::CapacityRequest {}).await.map_err(status_error)?.into_inner();
    if args.json {
        println!("{}", serde_json::to_string(&capacity)?);
        return Ok(ExitCode::SUCCESS);
    }
    if !capacity.error.is_empty() {
        eprintln!("jobcenter: the master could not be asked; last known figures: {}", capacity.error);
    }
    println!(
        "{:<24}  {:<14}  {:>9}  {:>7}  {:>6}  {:>10}  {:>20}  {:>12}  {:>10}",
        "SERVER", "DISK", "VOLUMES", "SHARDS", "FREE", "USED", "PENDING", "PENDING SIZE", "FREE AFTER"
    );
    for d in &capacity.disks {
        let pending = format!("{:+} vol {:+} shards", d.pending_volumes, d.pending_shards);
        println!(
            "{:<24}  {:<14}  {:>9}  {:>7}  {:>6}  {:>10}  {:>20}  {:>12}  {:>10}",
            d.server,
            format!("{} {}", d.disk_type, d.disk_id),
            format!("{}/{}", d.volumes, d.max_volumes),
            d.ec_shards,
            d.free_slots,
            size(d.used_bytes as i64),
            pending,
            size(d.pending_bytes),
            d.free_slots_after
        );
        for work in &d.work {
            println!("{:<24}    {work}", "");
        }
    }
    if let Some(budget) = &capacity.budget {
        print!("\n{}", super::budget::lines(budget));
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(clap::Args, Debug)]
pub struct SchedulerArgs {
    #[command(subcommand)]
    pub command: SchedulerCommand,
    #[command(flatten)]
    pub connection: Connection,
}

#[derive(clap::Subcommand, Debug)]
pub enum SchedulerCommand {
    /// Stop starting detections (running ones finish).
    Pause {
        /// Only this instance (see `jobcenter instances`); default: all.
        #[arg(long)]
        instance: Option<String>,
    },
    /// Start detecting again.
    Resume {
        #[arg(long)]
        instance: Option<String>,
    },
}

pub(super) async fn scheduler(args: SchedulerArgs) -> anyhow::Result<ExitCode> {
    let (paused, instance) = match args.command {
        SchedulerCommand::Pause { instance } => (true, instance),
        SchedulerCommand::Resume { instance } => (false, instance),
    };
    let mut client = args.connection.connect().await?;
    let request = api::SetSchedulerPausedRequest { paused, instance: instance.clone().unwrap_or_default() };
    let changed = client.set_scheduler_paused(request).await.map_err(status_error)?.into_inner().changed;
    let verb = if paused { "paused" } else { "resumed" };
    match instance {
        Some(id) => println!("scheduler {verb} on instance {id}"),
        None => println!("scheduler {verb} on {changed} instance(s)"),
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(clap::Args, Debug)]
pub struct PolicyArgs {
    #[command(subcommand)]
    pub command: PolicyCommand,
    #[command(flatten)]
    pub connection: Connection,
}

#[derive(clap::Subcommand, Debug)]
pub enum PolicyCommand {
    /// Show a job type's effective policy and where each value comes from.
    Get {
        job_type: String,
        #[arg(long)]
        json: bool,
    },
    /// Change settings: NAME=VALUE (VALUE `default` removes what was set).
    Set {
        job_type: String,
        #[arg(required = true)]
        settings: Vec<String>,
    },
}

pub(super) async fn policy(args: PolicyArgs) -> anyhow::Result<ExitCode> {
    let mut client = args.connection.connect().await?;
    let (policy, json) = match args.command {
        PolicyCommand::Get { job_type, json } => {
            (client.get_policy(api::PolicyRef { job_type }).await.map_err(status_error)?.into_inner(), json)
        }
        PolicyCommand::Set { job_type, settings } => {
            let mut values = HashMap::new();
            for setting in settings {
                let Some((name, value)) = setting.split_once('=') else {
                    eprintln!("jobcenter: {setting:?} is not NAME=VALUE");
                    return Ok(ExitCode::from(EXIT_USAGE));
                };
                values.insert(name.trim().to_string(), value.trim().to_string());
            }
            match client.set_policy(api::SetPolicyRequest { job_type, values }).await {
                Ok(r) => (r.into_inner(), false),
                Err(status) => {
                    eprintln!("jobcenter: {}", status.message());
                    return Ok(ExitCode::from(EXIT_USAGE));
                }
            }
        }
    };
    if json {
        println!("{}", serde_json::to_string(&policy)?);
        return Ok(ExitCode::SUCCESS);
    }
    let values = BTreeMap::from([
        ("global_execution_concurrency", policy.global_execution_concurrency),
        ("per_worker_execution_concurrency", policy.per_worker_execution_concurrency),
        ("retry_limit", policy.retry_limit),
        ("retry_backoff_seconds", policy.retry_backoff_seconds),
        ("execution_timeout_seconds", policy.execution_timeout_seconds),
        ("job_type_max_runtime_seconds", policy.job_type_max_runtime_seconds),
        ("detection_interval_seconds", policy.detection_interval_seconds),
        ("detection_timeout_seconds", policy.detection_timeout_seconds),
        ("max_jobs_per_detection", policy.max_jobs_per_detection),
        ("detection_enabled", u32::from(policy.detection_enabled)),
        ("rate_per_minute", policy.rate_per_minute),
        ("rate_burst", policy.rate_burst),
        ("window_grace_seconds", policy.window_grace_seconds),
        ("uses_bandwidth_budget", policy.uses_bandwidth_budget),
    ]);
    println!("policy of {}", policy.job_type);
    for (name, value) in values {
        let source = policy.sources.get(name).map(String::as_str).unwrap_or("default");
        println!("  {name:<34} {value:>8}  ({source})");
    }
    let terms: BTreeMap<&String, &String> = policy.terms.iter().collect();
    for (name, text) in terms {
        let source = policy.sources.get(name).map(String::as_str).unwrap_or("default");
        println!("  {name:<34} {text:>8}  ({source})");
    }
    let worker: BTreeMap<&String, &String> = policy.worker_config.iter().collect();
    for (name, value) in worker {
        println!("  worker.{name:<27} {value:>8}");
    }
    let admin: BTreeMap<&String, &String> = policy.admin_config.iter().collect();
    for (name, value) in admin {
        println!("  admin.{name:<28} {value:>8}");
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(clap::Args, Debug)]
pub struct RecoverArgs {
    /// Report the findings without acting on them.
    #[arg(long)]
    pub dry_run: bool,
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub connection: Connection,
}

pub(super) async fn recover(args: RecoverArgs) -> anyhow::Result<ExitCode> {
    let mut client = args.connection.connect().await?;
    let response = match client.recover(api::RecoverRequest { dry_run: args.dry_run, here_only: false }).await {
        Ok(r) => r.into_inner(),
        Err(status) => {
            eprintln!("jobcenter: {}", status.message());
            return Ok(ExitCode::from(EXIT_USAGE));
        }
    };
    if args.json {
        println!("{}", serde_json::to_string(&response.findings)?);
        return Ok(ExitCode::SUCCESS);
    }
    if response.findings.is_empty() {
        println!("recovery: nothing to do");
    }
    for f in &response.findings {
        let done = match (args.dry_run, f.applied) {
            (true, _) => "would",
            (false, true) => "did",
            (false, false) => "skipped (moved on)",
        };
        let age = format!("{:.1}s", f.age_ms as f64 / 1000.0);
        let task = if f.task_id.is_empty() { "-" } else { f.task_id.as_str() };
        let handler = if f.handler.is_empty() { "-" } else { f.handler.as_str() };
        println!(
            "{:<10} {:<22} job {} task {task} handler {handler} age {age}: {done} {} ({})",
            f.rule, f.rule_name, f.job_id, f.action, f.detail
        );
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(clap::Args, Debug)]
pub struct PruneArgs {
    /// Name the jobs that would go, remove nothing.
    #[arg(long)]
    pub dry_run: bool,
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub connection: Connection,
}

pub(super) async fn prune(args: PruneArgs) -> anyhow::Result<ExitCode> {
    let mut client = args.connection.connect().await?;
    let response = match client.prune(api::PruneRequest { dry_run: args.dry_run }).await {
        Ok(r) => r.into_inner(),
        Err(status) => {
            eprintln!("jobcenter: {}", status.message());
            return Ok(ExitCode::from(EXIT_USAGE));
        }
    };
    if args.json {
        println!("{}", serde_json::to_string(&response)?);
        return Ok(ExitCode::SUCCESS);
    }
    for pruned in &response.jobs {
        let Some(j) = &pruned.job else { continue };
        println!(
            "{:<36}  {:<10}  {:>8}  {:<24}  {}: {}",
            j.id,
            j.state,
            j.tasks,
            time(j.finished_at_ms),
            j.name,
            pruned.reason
        );
    }
    let verb = if args.dry_run { "would remove" } else { "removed" };
    println!("{verb} {} ended jobs ({})", response.jobs.len(), response.rules);
    Ok(ExitCode::SUCCESS)
}

#[derive(clap::Args, Debug)]
pub struct DetectArgs {
    pub job_type: String,
    /// Make the proposals a job and run it now.
    #[arg(long)]
    pub run: bool,
    /// With --run, wait until the job ends; exit 0 if it succeeded.
    #[arg(long, requires = "run")]
    pub wait: bool,
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub connection: Connection,
}

pub(super) async fn detect(args: DetectArgs) -> anyhow::Result<ExitCode> {
    let mut client = args.connection.connect().await?;
    let request = api::DetectRequest { job_type: args.job_type.clone(), run: args.run };
    let response = match client.detect(request).await {
        Ok(r) => r.into_inner(),
        Err(status) => {
            eprintln!("jobcenter: {}", status.message());
            return Ok(ExitCode::from(EXIT_USAGE));
        }
    };
    if args.wait && !response.job_id.is_empty() {
        wait(&args.connection, &response.job_id).await?;
        return print_final(&args.connection, &response.job_id, args.json).await;
    }
    if args.json {
        println!("{}", serde_json::to_string(&response)?);
        return Ok(ExitCode::SUCCESS);
    }
    for p in &response.proposals {
        println!("{:<40} {:<8} {:<24} {}", p.proposal_id, p.priority, p.dedupe_key, p.summary);
    }
    for d in &response.dropped {
        println!("{:<40} dropped: {}", d.proposal_id, d.reason);
    }
    match (args.run, response.job_id.as_str()) {
        (true, "") => println!("{} proposals: no job made", response.proposals.len()),
        (true, job) => println!("{} proposals became job {job}", response.proposals.len()),
        (false, _) => println!("{} proposals (nothing created; --run makes them a job)", response.proposals.len()),
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(clap::Args, Debug)]
pub struct ActivitiesArgs {
    /// Only this job type's.
    #[arg(long)]
    pub job_type: Option<String>,
    /// The newest this many.
    #[arg(long, default_value_t = 50)]
    pub limit: u32,
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub connection: Connection,
}

pub(super) async fn activities(args: ActivitiesArgs) -> anyhow::Result<ExitCode> {
    let mut client = args.connection.connect().await?;
    let request = api::ListActivitiesRequest { job_type: args.job_type.unwrap_or_default(), limit: args.limit };
    let entries = client.list_activities(request).await.map_err(status_error)?.into_inner().activities;
    if args.json {
        println!("{}", serde_json::to_string(&entries)?);
        return Ok(ExitCode::SUCCESS);
    }
    for a in entries {
        println!("{}  {:<16} {}", time(a.at_ms), a.job_type, a.message);
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(clap::Args, Debug)]
pub struct RunsArgs {
    pub job_type: String,
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub connection: Connection,
}

pub(super) async fn runs(args: RunsArgs) -> anyhow::Result<ExitCode> {
    let mut client = args.connection.connect().await?;
    let history =
        client.list_runs(api::PolicyRef { job_type: args.job_type }).await.map_err(status_error)?.into_inner();
    if args.json {
        println!("{}", serde_json::to_string(&history)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!("runs of {}", history.job_type);
    for (label, runs) in [("succeeded", &history.succeeded), ("failed", &history.failed)] {
        for r in runs.iter() {
            let outcome = if r.error.is_empty() {
                format!("job {}", if r.job_id.is_empty() { "-" } else { &r.job_id })
            } else {
                r.error.clone()
            };
            println!(
                "  {label:<9} {}  {:>6} ms  {} proposals, {} kept  {}",
                time(r.at_ms),
                r.duration_ms,
                r.proposals,
                r.kept,
                outcome
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(clap::Args, Debug)]
pub struct AuditArgs {
    /// Only records since then: a time (RFC 3339, `2026-11-27T10:00:00Z`) or
    /// a span back from now (`2h`, `7d`).
    #[arg(long, value_parser = parse_since)]
    pub since: Option<i64>,
    /// Only this credential's records (its name, or `certificate SUBJECT`).
    #[arg(long)]
    pub who: Option<String>,
    /// The newest this many; 0 for all kept.
    #[arg(long, default_value_t = 200)]
    pub limit: u32,
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub connection: Connection,
}

/// `--since`: an RFC 3339 time, or a span back from now; ms since the epoch.
fn parse_since(text: &str) -> Result<i64, String> {
    if let Ok(at) = time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339) {
        return i64::try_from(at.unix_timestamp_nanos() / 1_000_000).map_err(|e| e.to_string());
    }
    let back = super::server::parse_duration(text)
        .map_err(|_| format!("{text:?} is neither a time (2026-11-27T10:00:00Z) nor a span back from now (2h, 7d)"))?;
    let now = crate::clock::Clock::now(&crate::clock::SystemClock);
    Ok(now.as_millis().saturating_sub(i64::try_from(back.as_millis()).unwrap_or(i64::MAX)))
}

pub(super) async fn audit(args: AuditArgs) -> anyhow::Result<ExitCode> {
    let mut client = args.connection.connect().await?;
    let request = api::ListAuditRequest {
        since_ms: args.since.unwrap_or(0),
        who: args.who.unwrap_or_default(),
        limit: args.limit,
    };
    let records = client.list_audit(request).await.map_err(status_error)?.into_inner().records;
    if args.json {
        println!("{}", serde_json::to_string(&records)?);
        return Ok(ExitCode::SUCCESS);
    }
    for r in records {
        let role = if r.role.is_empty() { String::new() } else { format!(" ({})", r.role) };
        let what: Vec<String> = std::iter::once(r.target.clone())
            .chain(
                r.args
                    .iter()
                    .collect::<std::collections::BTreeMap<_, _>>()
                    .into_iter()
                    .map(|(k, v)| format!("{k}={v}")),
            )
            .collect();
        let target: Vec<&String> = what.iter().filter(|t| !t.is_empty()).collect();
        println!(
            "{}  {}{role} from {}  {}  {}  -> {}",
            time(r.at_ms),
            r.who,
            if r.from.is_empty() { "-" } else { &r.from },
            r.action,
            target.iter().map(|t| t.as_str()).collect::<Vec<_>>().join(" "),
            r.outcome
        );
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(clap::Args, Debug)]
pub struct NotificationsArgs {
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub connection: Connection,
}

/// Each webhook endpoint: its URL and events, what waits for it, its last
/// delivery and its last error.
pub(super) async fn notifications(args: NotificationsArgs) -> anyhow::Result<ExitCode> {
    let mut client = args.connection.connect().await?;
    let request = api::ListNotificationsRequest {};
    let endpoints = client.list_notifications(request).await.map_err(status_error)?.into_inner().endpoints;
    if args.json {
        println!("{}", serde_json::to_string(&endpoints)?);
        return Ok(ExitCode::SUCCESS);
    }
    if endpoints.is_empty() {
        println!("no webhook endpoints (the server was started without --notify, or its file names none)");
        return Ok(ExitCode::SUCCESS);
    }
    println!("{:<16} {:>7}  {:<20}  {:<40}  ERROR", "ENDPOINT", "PENDING", "LAST DELIVERY", "URL");
    for e in endpoints {
        let last = if e.last_delivery_ms > 0 { time(e.last_delivery_ms) } else { "-".into() };
        let error = if e.last_error.is_empty() { "-" } else { &e.last_error };
        println!("{:<16} {:>7}  {:<20}  {:<40}  {error}", e.name, e.pending, last, e.url);
        println!("{:<16} events: {}{}", "", e.events.join(", "), if e.signed { "; signed" } else { "" });
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(clap::Args, Debug)]
pub struct WindowsArgs {
    /// Only this job type.
    pub job_type: Option<String>,
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub connection: Connection,
}

/// Each job type's maintenance windows: open now or not, when it next
/// opens and closes (in its windows' time zone), and the terms that say so.
pub(super) async fn windows(args: WindowsArgs) -> anyhow::Result<ExitCode> {
    let mut client = args.connection.connect().await?;
    let mut listing = client.list_windows(api::ListWindowsRequest {}).await.map_err(status_error)?.into_inner();
    if let Some(job_type) = &args.job_type {
        listing.windows.retain(|w| &w.job_type == job_type);
        if listing.windows.is_empty() {
            anyhow::bail!("no job type {job_type:?}: no worker declared it and no policy names it");
        }
    }
    if args.json {
        println!("{}", serde_json::to_string(&listing)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!("as of {} (the database's time in a cluster)", time(listing.now_ms));
    println!("{:<24} {:<6}  {:<26}  NEXT CLOSES", "JOB TYPE", "NOW", "NEXT OPENS");
    for w in listing.windows {
        let when = |ms: i64, local: &str| match (ms, local) {
            (0, _) => "-".to_string(),
            (_, "") => time(ms),
            (_, local) => local.to_string(),
        };
        let now = if w.open { "open" } else { "closed" };
        let (opens, closes) = (when(w.next_open_ms, &w.next_open_local), when(w.next_close_ms, &w.next_close_local));
        println!("{:<24} {now:<6}  {opens:<26}  {closes}", w.job_type);
        if w.windows == crate::windows::ALWAYS && w.blackouts == crate::windows::NONE {
            continue;
        }
        let grace = match w.window_grace_seconds {
            0 => "without bound".to_string(),
            seconds => format!("for up to {seconds} s"),
        };
        let on_close = match w.on_window_close.as_str() {
            "cancel" => "what runs is canceled".to_string(),
            _ => format!("what runs drains {grace}"),
        };
        println!("{:<24} windows: {}; blackouts: {}; on close, {on_close}", "", w.windows, w.blackouts);
    }
    Ok(ExitCode::SUCCESS)
}
