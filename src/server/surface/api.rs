//! The client API's operations, shared by the gRPC `JobService` and the
//! JSON-over-HTTP routes; errors map to a gRPC status or an HTTP code here,
//! in one place.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;

use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status};

use super::audit::{Trail, Who};
use super::convert;
use super::metrics::Metrics;
use crate::engine::EngineHandle;
use crate::engine::{self, Event};
use crate::jobfile::{self, Format};
use crate::model::audit::{Filter, Record};
use crate::model::{JobId, JobOrigin, JobState};
use crate::proto::api::{self, job_event, job_service_server::JobService};
use crate::server::cluster::peer::Peers;
use crate::server::cluster::Topology;
use crate::server::duties::recovery::Recovery;
use crate::server::duties::retention::Pruner;
use crate::server::duties::scheduler::{self, Scheduler};
use crate::server::policies::Policies;
use crate::server::seaweedfs::{capacity, SeaweedFs};
use crate::server::workers::registry::Registry;
use crate::store::{JobFilter, StoredJob};
use crate::wire;

/// Workers in a page when the request names no limit, and the most a page holds.
pub(crate) const WORKERS_PAGE: u32 = 500;
pub(crate) const MAX_WORKERS_PAGE: u32 = 5_000;

/// The most one unary answer carries (the clients' decoding limit).
const MAX_ANSWER_BYTES: usize = 64 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Invalid(String),
    /// A request past a size limit, naming the option that raises it.
    #[error("{0}")]
    TooLarge(String),
    /// A job file that breaks the rules: every problem, for the caller to show.
    #[error("{0}")]
    Rejected(jobfile::Error),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    Internal(String),
}

impl Error {
    pub fn http_status(&self) -> u16 {
        match self {
            Error::Invalid(_) | Error::Rejected(_) => 400,
            Error::TooLarge(_) => 413,
            Error::NotFound(_) => 404,
            Error::Conflict(_) => 409,
            Error::Unavailable(_) => 503,
            Error::Internal(_) => 500,
        }
    }
}

impl From<Error> for Status {
    fn from(e: Error) -> Status {
        match e {
            Error::Invalid(m) => Status::invalid_argument(m),
            Error::Rejected(e) => Status::invalid_argument(e.to_string()),
            Error::TooLarge(m) => Status::invalid_argument(m),
            Error::NotFound(m) => Status::not_found(m),
            Error::Conflict(m) => Status::failed_precondition(m),
            Error::Unavailable(m) => Status::unavailable(m),
            Error::Internal(m) => Status::internal(m),
        }
    }
}

impl From<engine::Error> for Error {
    fn from(e: engine::Error) -> Error {
        match e {
            engine::Error::UnknownJob(_) => Error::NotFound(e.to_string()),
            engine::Error::JobEnded(_) | engine::Error::JobNotEnded(_) | engine::Error::NothingToRetry { .. } => {
                Error::Conflict(e.to_string())
            }
            engine::Error::Store(ref store) if store.is_transient() => Error::Unavailable(e.to_string()),
            engine::Error::Store(_) => Error::Internal(e.to_string()),
            engine::Error::Stopped => Error::Unavailable(e.to_string()),
        }
    }
}

/// A duty run asked for now that did not happen or finish: the caller may
/// try again (409, as documented for detect, recover and prune).
impl From<crate::server::duties::DutyError> for Error {
    fn from(e: crate::server::duties::DutyError) -> Error {
        Error::Conflict(e.to_string())
    }
}

fn store_error(e: crate::store::Error) -> Error {
    if e.is_transient() {
        Error::Unavailable(e.to_string())
    } else {
        Error::Internal(e.to_string())
    }
}

/// The answer of another instance, as this one's.
fn status_error(status: &Status) -> Error {
    let message = status.message().to_string();
    match status.code() {
        tonic::Code::InvalidArgument => Error::Invalid(message),
        tonic::Code::NotFound => Error::NotFound(message),
        tonic::Code::FailedPrecondition => Error::Conflict(message),
        tonic::Code::Unavailable | tonic::Code::DeadlineExceeded => Error::Unavailable(message),
        _ => Error::Internal(message),
    }
}

/// A submitted job file past the server's limit, naming the option that raises it.
fn job_too_large(source_name: &str, limit: u64) -> Error {
    let name = if source_name.is_empty() { "the submitted job" } else { source_name };
    Error::TooLarge(format!(
        "invalid job {name}: file too large: more than {limit} bytes, the server's limit (its --max-job-bytes raises it)"
    ))
}

/// The id `instances` gives an admin that runs alone (it has no UUID in a
/// shared database); `set_scheduler_paused` takes it too.
const LOCAL_INSTANCE: &str = "local";

type JobServiceClientOf = api::job_service_client::JobServiceClient<tonic::transport::Channel>;

fn parse_job_id(text: &str) -> Result<JobId, Error> {
    text.parse().map_err(|_| Error::Invalid(format!("{text:?} is not a job id (a UUID)")))
}

/// The client API: the engine it reads and writes; the workers connected;
/// the cluster (the instances, the leader of a job led elsewhere); the
/// duties it runs on demand (a detection, a recovery check, a prune); the
/// policy book; the SeaweedFS capacity view; the metrics of the steps it
/// waits for; and its settings. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Api {
    pub(crate) engine: EngineHandle,
    pub(crate) registry: Registry,
    pub(crate) topology: Topology,
    pub(crate) peers: Peers,
    pub(crate) policies: Policies,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) scheduler: Arc<Scheduler>,
    pub(crate) recovery: Arc<Recovery>,
    pub(crate) pruner: Arc<Pruner>,
    pub(crate) seaweedfs: SeaweedFs,
    /// What a submitted job may hold.
    pub(crate) limits: crate::jobfile::Limits,
    /// This instance's gRPC port, as `instances` lists it alone.
    pub(crate) grpc_port: u16,
    /// Where each change is recorded, with who asked for it.
    pub(crate) trail: Trail,
    /// The webhook endpoints and their outbox.
    pub(crate) notifier: Arc<crate::server::notify::Notifier>,
    /// The schedules: their duty, and the changes made to them.
    pub(crate) schedules: Arc<crate::server::duties::schedules::Schedules>,
}

impl Api {
    /// Takes a job file from `who`; the job and its audit record are one step.
    pub(crate) async fn submit(
        &self,
        who: &Who,
        content: Vec<u8>,
        format: &str,
        source_name: &str,
    ) -> Result<String, Error> {
        let record =
            self.trail.begin(who, "job.submit", "").arg("source", source_name).arg("bytes", content.len().to_string());
        let result = self.submit_recorded(record.clone(), content, format, source_name).await;
        self.trail.refused(record, &result).await;
        result
    }

    async fn submit_recorded(
        &self,
        record: Record,
        content: Vec<u8>,
        format: &str,
        source_name: &str,
    ) -> Result<String, Error> {
        let format = match format {
            "" | "json" => Format::Json,
            "toml" => Format::Toml,
            "yaml" | "yml" => Format::Yaml,
            other => return Err(Error::Invalid(format!("unknown job file format {other:?}: use json, toml or yaml"))),
        };
        let limits = self.limits.clone();
        if content.len() as u64 > limits.max_file_bytes {
            return Err(job_too_large(source_name, limits.max_file_bytes));
        }
        let name = if source_name.is_empty() { "the submitted job".to_string() } else { source_name.to_string() };
        let policies = self.policies.clone();
        let type_priority = move |job_type: &str| policies.effective(job_type).0.priority;
        let spec =
            tokio::task::spawn_blocking(move || jobfile::parse_with(&content, format, &name, &limits, &type_priority))
                .await
                .map_err(|e| Error::Internal(e.to_string()))?
                .map_err(Error::Rejected)?;
        let started = std::time::Instant::now();
        let record = record.arg("name", spec.name.as_str()).arg("tasks", spec.len().to_string());
        let id =
            self.engine.submit_recorded(spec, JobOrigin::User, |id| Some(record.on(&id.to_string()).entry())).await?;
        if let Some(node) = self.topology.member() {
            node.wake_permits();
        }
        // Until the committer reports its own timings: a submission is a step that waits to be durable.
        self.metrics.observe_api_step(started.elapsed());
        Ok(id.to_string())
    }

    /// A job as stored (or as its leader holds it now).
    /// A job as stored, its tasks with the priority they are dispatched by
    /// (one an operator gave the job while it ran, over each task's own).
    pub(super) async fn stored(&self, id: JobId) -> Result<StoredJob, Error> {
        let mut stored = self.engine.job(id).await?.ok_or_else(|| Error::NotFound(format!("no job {id}")))?;
        if let Some(priority) = self.engine.job_priority(id).await? {
            for task in &mut Arc::make_mut(&mut stored.spec).tasks {
                task.priority = priority;
            }
        }
        Ok(stored)
    }

    /// The tasks in `range` of a job as one part, with the worker behind each handler.
    fn part(&self, stored: &StoredJob, range: std::ops::Range<usize>) -> api::Job {
        let mut part = convert::part(stored, range);
        for task in part.tasks.iter_mut().filter(|t| !t.handler.is_empty()) {
            task.worker_id = self.registry.worker_id(&task.handler).unwrap_or_default();
        }
        part
    }

    /// A job whole, in one message: refused past what one answer may carry.
    pub(crate) async fn job(&self, id: &str) -> Result<api::Job, Error> {
        let id = parse_job_id(id)?;
        let stored = self.stored(id).await?;
        let job = self.part(&stored, 0..stored.spec.len());
        let size = prost::Message::encoded_len(&job);
        if size > MAX_ANSWER_BYTES {
            return Err(Error::TooLarge(format!(
                "job {id} has {} tasks ({size} bytes), more than one answer carries ({MAX_ANSWER_BYTES} bytes): read it in parts with ReadJob (as `jobcenter job` does), or GET /api/jobs/{id}",
                stored.spec.len()
            )));
        }
        Ok(job)
    }

    /// A job of any size in parts of `wire::TASKS_PER_PART` tasks, each
    /// built only when the reader is ready for it.
    pub(crate) async fn read(&self, id: &str) -> Result<impl Stream<Item = api::Job> + Send, Error> {
        let id = parse_job_id(id)?;
        let stored = Arc::new(self.stored(id).await?);
        let api = self.clone();
        Ok(tokio_stream::iter(wire::part_ranges(stored.spec.len())).map(move |range| api.part(&stored, range)))
    }

    pub(crate) async fn list(&self, request: &api::ListJobsRequest) -> Result<api::ListJobsResponse, Error> {
        let state = match request.state.as_str() {
            "" => None,
            s => Some(s.parse::<JobState>().map_err(Error::Invalid)?),
        };
        // The recovery check's own jobs (one a minute) are left out unless asked for.
        let (scheduled, recovery_checks) = match request.origin.as_str() {
            "" => (None, Some(false)),
            "all" => (None, None),
            "submitted" | "user" => (Some(false), Some(false)),
            "scheduler" => (Some(true), Some(false)),
            "recovery" => (Some(true), Some(true)),
            other => {
                return Err(Error::Invalid(format!("origin {other:?}: use submitted, scheduler, recovery or all")))
            }
        };
        let before = match request.before.as_str() {
            "" => None,
            id => Some(parse_job_id(id)?),
        };
        let limit = if request.limit == 0 { 50 } else { request.limit as usize };
        let filter = JobFilter {
            state,
            name_contains: Some(request.name.clone()).filter(|n| !n.is_empty()),
            scheduled,
            recovery_checks,
            before,
            // One more than asked tells whether another page follows.
            limit: Some(limit + 1),
            ..JobFilter::default()
        };
        let mut jobs: Vec<api::JobSummary> = self.engine.list(filter).await?.iter().map(convert::summary).collect();
        let next = if jobs.len() > limit {
            jobs.truncate(limit);
            jobs.last().map(|j| j.id.clone()).unwrap_or_default()
        } else {
            String::new()
        };
        Ok(api::ListJobsResponse { jobs, next })
    }

    /// In a cluster: the gRPC address of the live instance that leads an
    /// active job, when that is not this one.
    async fn led_by(&self, id: crate::model::JobId) -> Result<Option<String>, Error> {
        let Some(node) = self.topology.member() else { return Ok(None) };
        let store = self.engine.store().clone();
        let whereabouts = tokio::task::spawn_blocking(move || store.cluster().map(|c| c.whereabouts(id)))
            .await
            .map_err(|e| Error::Internal(e.to_string()))?;
        match whereabouts {
            Some(Ok(Some(w))) if !w.state.is_terminal() => match w.owner {
                Some(owner) if owner.id != node.id => Ok(Some(owner.grpc_address)),
                Some(_) => Ok(None),
                None => Err(Error::Unavailable(format!(
                    "no instance leads job {id} at this moment (another instance is taking it over); try again in a few seconds"
                ))),
            },
            Some(Err(e)) => Err(Error::Unavailable(e.to_string())),
            _ => Ok(None),
        }
    }

    /// A client for the instance at `address`, and the request, with this one's token.
    async fn forward<T>(&self, address: &str, message: T) -> Result<(JobServiceClientOf, Request<T>), Error> {
        let client = self.peers.job_service(address).await.map_err(|e| {
            Error::Unavailable(format!("the instance leading the job ({address}) cannot be reached: {e}"))
        })?;
        let request = self.peers.request_within(message, std::time::Duration::from_secs(30));
        Ok((client, request))
    }

    /// Cancels a job for `who`; the cancel and its audit record are one step
    /// (on the instance that leads the job, the record is this one's).
    pub(crate) async fn cancel(&self, who: &Who, id: &str) -> Result<(), Error> {
        let record = self.trail.begin(who, "job.cancel", id);
        let result = self.cancel_recorded(record.clone(), id).await;
        self.trail.refused(record, &result).await;
        result
    }

    async fn cancel_recorded(&self, record: Record, id: &str) -> Result<(), Error> {
        let id = parse_job_id(id)?;
        let started = std::time::Instant::now();
        match self.engine.cancel_recorded(id, Some(record.entry())).await {
            Err(crate::engine::Error::JobEnded(_)) if self.topology.member().is_some() => {
                let Some(address) = self.led_by(id).await? else {
                    return Err(crate::engine::Error::JobEnded(id).into());
                };
                let (mut client, request) = self.forward(&address, api::JobRef { job_id: id.to_string() }).await?;
                client.cancel_job(request).await.map_err(|s| status_error(&s))?;
                self.trail.write(record.arg("led_by", address.as_str())).await;
                tracing::info!(job.id = %id, leader = address, "job canceled over the API, by the instance leading it");
                return Ok(());
            }
            other => other?,
        }
        self.metrics.observe_api_step(started.elapsed());
        tracing::info!(job.id = %id, "job canceled over the API");
        Ok(())
    }

    /// Gives a running job's tasks a priority for `who`; the change and its
    /// audit record are one step (on the instance leading the job).
    pub(crate) async fn set_job_priority(&self, who: &Who, id: &str, priority: &str) -> Result<(), Error> {
        let record = self.trail.begin(who, "job.priority", id).arg("priority", priority);
        let result = self.set_job_priority_recorded(record.clone(), id, priority).await;
        self.trail.refused(record, &result).await;
        result
    }

    async fn set_job_priority_recorded(&self, record: Record, id: &str, priority: &str) -> Result<(), Error> {
        let id = parse_job_id(id)?;
        let level = crate::model::Priority::from_name(priority).ok_or_else(|| {
            Error::Invalid(format!(
                "priority: {priority:?} is not a priority; priorities are low, normal, high, critical"
            ))
        })?;
        match self.engine.set_priority_recorded(id, level, Some(record.entry())).await {
            Err(crate::engine::Error::JobEnded(_)) if self.topology.member().is_some() => {
                let Some(address) = self.led_by(id).await? else {
                    return Err(crate::engine::Error::JobEnded(id).into());
                };
                let request = api::SetJobPriorityRequest { job_id: id.to_string(), priority: priority.to_string() };
                let (mut client, request) = self.forward(&address, request).await?;
                client.set_job_priority(request).await.map_err(|s| status_error(&s))?;
                self.trail.write(record.arg("led_by", address.as_str())).await;
                tracing::info!(job.id = %id, priority, leader = address, "job priority set, by the instance leading it");
                return Ok(());
            }
            other => other?,
        }
        tracing::info!(job.id = %id, priority, "job priority set over the API");
        Ok(())
    }

    /// Retries a job for `who`; the retry and its audit record are one step.
    pub(crate) async fn retry(&self, who: &Who, id: &str) -> Result<(), Error> {
        let record = self.trail.begin(who, "job.retry", id);
        let result = async {
            let id = parse_job_id(id)?;
            let started = std::time::Instant::now();
            self.engine.retry_recorded(id, Some(record.entry())).await?;
            self.metrics.observe_api_step(started.elapsed());
            tracing::info!(job.id = %id, "job retried over the API");
            Ok(())
        }
        .await;
        self.trail.refused(record, &result).await;
        result
    }

    /// A page of the connected workers in the order of their ids, and how
    /// many are connected.
    pub(crate) fn workers(&self, offset: u32, limit: u32) -> Result<(Vec<api::Worker>, u32), Error> {
        let limit = match limit {
            0 => WORKERS_PAGE,
            over if over > MAX_WORKERS_PAGE => {
                return Err(Error::Invalid(format!(
                    "limit {over}: a page holds at most {MAX_WORKERS_PAGE} workers; page on with offset"
                )))
            }
            limit => limit,
        };
        let (page, total) = self.registry.page(offset as usize, limit as usize);
        Ok((page.iter().map(|w| w.to_api()).collect(), u32::try_from(total).unwrap_or(u32::MAX)))
    }

    /// The instances sharing this one's database; this one alone otherwise.
    pub(crate) async fn instances(&self) -> Result<Vec<api::Instance>, Error> {
        let Some(node) = self.topology.member().cloned() else {
            let led = self.engine.active_jobs().await?.len();
            return Ok(vec![api::Instance {
                id: LOCAL_INSTANCE.into(),
                role: "server".into(),
                grpc_address: format!("127.0.0.1:{}", self.grpc_port),
                status: "active".into(),
                paused: self.scheduler.paused(),
                jobs_led: u32::try_from(led).unwrap_or(u32::MAX),
                workers: u32::try_from(self.registry.len()).unwrap_or(u32::MAX),
                answering: true,
                ..api::Instance::default()
            }]);
        };
        let store = self.engine.store().clone();
        let instances = tokio::task::spawn_blocking(move || store.cluster().expect("cluster").instances())
            .await
            .map_err(|e| Error::Internal(e.to_string()))?
            .map_err(store_error)?;
        Ok(instances
            .into_iter()
            .map(|i| api::Instance {
                id: i.id.to_string(),
                role: i.role.as_str().into(),
                grpc_address: i.grpc_address,
                http_address: i.http_address,
                status: if i.active { "active" } else { "deactivated" }.into(),
                started_at_ms: i.started_at_ms,
                heartbeat_ms: i.heartbeat_ms,
                heartbeat_age_ms: i.heartbeat_age_ms,
                paused: i.paused,
                jobs_led: u32::try_from(i.jobs_led).unwrap_or(u32::MAX),
                detections: i.detections,
                workers: u32::try_from(i.workers).unwrap_or(u32::MAX),
                answering: i.id == node.id,
            })
            .collect())
    }

    /// Pauses or resumes the scheduler loop of one instance (by id) or of
    /// all, for `who` (recorded once done: the pause is not the engine's).
    pub(crate) async fn set_scheduler_paused(&self, who: &Who, paused: bool, instance: &str) -> Result<u32, Error> {
        let action = if paused { "scheduler.pause" } else { "scheduler.resume" };
        let record = self.trail.begin(who, action, instance);
        let result = self.pause(paused, instance).await;
        self.trail.end(record, &result).await;
        result
    }

    async fn pause(&self, paused: bool, instance: &str) -> Result<u32, Error> {
        let Some(node) = self.topology.member().cloned() else {
            // Alone, the one instance is `local`, as `instances` lists it.
            match instance {
                "" | LOCAL_INSTANCE => {}
                text if text.parse::<uuid::Uuid>().is_ok() => {
                    return Err(Error::NotFound(format!(
                        "no instance {text}: this admin runs alone, as instance {LOCAL_INSTANCE:?}"
                    )))
                }
                text => {
                    return Err(Error::Invalid(format!(
                        "{text:?} is not an instance id: this admin runs alone, as instance {LOCAL_INSTANCE:?}"
                    )))
                }
            }
            self.scheduler.board.set_paused(paused);
            self.scheduler.board.wake();
            return Ok(1);
        };
        let target = match instance {
            "" => None,
            text => Some(crate::model::HandlerId(text.parse::<uuid::Uuid>().map_err(|_| {
                Error::Invalid(format!("{text:?} is not an instance id (a UUID): see `jobcenter instances`"))
            })?)),
        };
        let store = self.engine.store().clone();
        let changed = tokio::task::spawn_blocking(move || store.cluster().expect("cluster").set_paused(target, paused))
            .await
            .map_err(|e| Error::Internal(e.to_string()))?
            .map_err(store_error)?;
        if target.is_some() && changed == 0 {
            return Err(Error::NotFound(format!("no active instance {instance}: see `jobcenter instances`")));
        }
        if target.is_none_or(|t| t == node.id) {
            node.set_paused_here(paused);
        }
        tracing::info!(paused, instance, changed, "scheduler pause set over the API");
        Ok(u32::try_from(changed).unwrap_or(u32::MAX))
    }

    pub(crate) fn policy(&self, job_type: &str) -> Result<api::Policy, Error> {
        if job_type.is_empty() {
            return Err(Error::Invalid("a job type is required".into()));
        }
        let (policy, sources) = self.policies.effective(job_type);
        let mut out = convert::policy(job_type, &policy, &sources);
        // Each value as JSON text.
        let texts = |values: std::collections::BTreeMap<String, crate::proto::plugin::ConfigValue>| {
            values.into_iter().map(|(k, v)| (k, crate::wire::value_to_json(&v).to_string())).collect()
        };
        out.worker_config = texts(self.policies.worker_values(job_type));
        out.admin_config = texts(self.policies.admin_values(job_type));
        Ok(out)
    }

    /// Changes a job type's policy for `who`; the change and its audit record are one step.
    pub(crate) async fn set_policy(
        &self,
        who: &Who,
        job_type: &str,
        changes: &BTreeMap<String, String>,
    ) -> Result<api::Policy, Error> {
        let record =
            changes.iter().fold(self.trail.begin(who, "policy.set", job_type), |r, (k, v)| r.arg(k, v.as_str()));
        let result = self.change_policy(record.clone(), job_type, changes).await;
        self.trail.refused(record, &result).await;
        result
    }

    async fn change_policy(
        &self,
        record: Record,
        job_type: &str,
        changes: &BTreeMap<String, String>,
    ) -> Result<api::Policy, Error> {
        if job_type.is_empty() {
            return Err(Error::Invalid("a job type is required".into()));
        }
        self.policies
            .set(job_type, changes, Some(record.entry()), self.topology.calendar_now(&*self.trail.clock))
            .await
            .map_err(Error::from)?
            .map_err(|e| Error::Invalid(e.to_string()))?;
        self.policies.push_limits(&self.engine, job_type).await;
        self.scheduler.board.wake();
        self.policy(job_type)
    }

    /// Asks a detector for `who`, recorded once answered (with the job it made, if any).
    pub(crate) async fn detect(&self, who: &Who, job_type: &str, run: bool) -> Result<api::DetectResponse, Error> {
        let record = self.trail.begin(who, "detect", job_type).arg("run", run.to_string());
        let result = self.detect_now(job_type, run).await;
        let record = match &result {
            Ok(answer) if !answer.job_id.is_empty() => record.arg("job", answer.job_id.as_str()),
            _ => record,
        };
        self.trail.end(record, &result).await;
        result
    }

    async fn detect_now(&self, job_type: &str, run: bool) -> Result<api::DetectResponse, Error> {
        if job_type.is_empty() {
            return Err(Error::Invalid("a job type is required".into()));
        }
        let outcome = self.scheduler.detect(job_type, run).await?;
        Ok(api::DetectResponse {
            proposals: outcome
                .proposals
                .iter()
                .map(|p| api::ProposalSummary {
                    proposal_id: p.proposal_id.clone(),
                    dedupe_key: p.dedupe_key.clone(),
                    summary: p.summary.clone(),
                    priority: p.priority.as_str().into(),
                    parameters: serde_json::Value::Object(p.parameters.clone()).to_string(),
                    labels: p.labels.clone().into_iter().collect(),
                })
                .collect(),
            dropped: outcome
                .dropped
                .iter()
                .map(|d| api::DroppedProposal { proposal_id: d.proposal_id.clone(), reason: d.reason.clone() })
                .collect(),
            job_id: outcome.job.map(|j| j.to_string()).unwrap_or_default(),
        })
    }

    pub(crate) fn activities(&self, job_type: &str, limit: u32) -> Vec<api::ActivityEntry> {
        let all = self.scheduler.board.activities();
        let mut picked: Vec<api::ActivityEntry> = all
            .into_iter()
            .filter(|a| job_type.is_empty() || a.job_type == job_type)
            .map(|a| api::ActivityEntry { at_ms: a.at_ms, job_type: a.job_type, message: a.message })
            .collect();
        if limit > 0 && picked.len() > limit as usize {
            picked.drain(..picked.len() - limit as usize);
        }
        picked
    }

    /// The capacity view of the SeaweedFS cluster of `--master`.
    pub(crate) async fn capacity(&self) -> Result<api::Capacity, Error> {
        if !self.seaweedfs.has_masters() {
            return Err(Error::Invalid(
                "no SeaweedFS master: start the server with --master to see its capacity".into(),
            ));
        }
        let (topology, error) = self.seaweedfs.topology(true).await;
        let Some(topology) = topology else {
            return Err(Error::Unavailable(format!("the master's topology: {}", error.unwrap_or_default())));
        };
        let changes = self.seaweedfs.changes();
        let disks = capacity::view(&topology, &changes);
        let changes = changes
            .into_iter()
            .map(|c| api::CapacityChange {
                key: c.key,
                kind: c.kind.name().to_string(),
                volume: c.volume,
                finished_at_ms: c.finished_at_ms.unwrap_or(0),
            })
            .collect();
        Ok(api::Capacity {
            disks,
            changes,
            error: error.unwrap_or_default(),
            volume_size_limit_bytes: topology.volume_size_limit,
            budget: Some(self.budget().await?),
        })
    }

    /// The bandwidth budget and every running budgeted task's share, as
    /// the store keeps them (in a cluster, every instance's).
    pub(crate) async fn budget(&self) -> Result<api::Budget, Error> {
        let job_types = self.policies.budgeted_types();
        let Some(budget) = self.policies.budget() else {
            return Ok(api::Budget { job_types, ..api::Budget::default() });
        };
        let store = self.engine.store().clone();
        let stored = tokio::task::spawn_blocking(move || store.settings(engine::SHARE_SETTINGS))
            .await
            .map_err(|e| Error::Internal(e.to_string()))?
            .map_err(store_error)?;
        let shares = stored
            .into_iter()
            .filter_map(|(key, bytes)| {
                Some((key.strip_prefix(engine::SHARE_SETTINGS)?.to_string(), serde_json::from_slice(&bytes).ok()?))
            })
            .collect();
        Ok(convert::budget(&crate::budget::View::of(budget, shares), job_types))
    }

    /// Sets, changes or clears the bandwidth budget for `who`; the change
    /// and its audit record are one step, and a refused one stores nothing.
    pub(crate) async fn set_budget(&self, who: &Who, request: &api::SetBudgetRequest) -> Result<api::Budget, Error> {
        let given = [("cluster", &request.cluster), ("per_server", &request.per_server), ("minimum", &request.minimum)];
        let mut record = self.trail.begin(who, "budget.set", "bandwidth");
        for (name, value) in given.iter().filter(|(_, v)| !v.trim().is_empty()) {
            record = record.arg(name, value.trim());
        }
        if request.clear {
            record = record.arg("clear", "true");
        }
        let result = self.change_budget(record.clone(), request).await;
        self.trail.refused(record, &result).await;
        result
    }

    async fn change_budget(&self, record: Record, request: &api::SetBudgetRequest) -> Result<api::Budget, Error> {
        let budget = if request.clear {
            if [&request.cluster, &request.per_server, &request.minimum].iter().any(|v| !v.trim().is_empty()) {
                return Err(Error::Invalid("budget clear: takes no rates (give either clear or the rates)".into()));
            }
            None
        } else {
            let change = crate::budget::Change {
                cluster: &request.cluster,
                per_server: &request.per_server,
                minimum: &request.minimum,
            };
            let budget = crate::budget::Budget::changed(self.policies.budget(), &change);
            Some(budget.map_err(|e| Error::Invalid(e.to_string()))?)
        };
        self.policies.set_budget(budget, Some(record.entry())).await?;
        tracing::info!(?budget, "bandwidth budget set over the API");
        self.budget().await
    }

    pub(crate) fn runs(&self, job_type: &str) -> api::RunHistory {
        let runs = self.scheduler.board.runs(job_type);
        let entry = |r: &scheduler::Run| api::RunEntry {
            at_ms: r.at_ms,
            duration_ms: r.duration_ms,
            detector: r.detector.clone(),
            proposals: r.proposals as u32,
            kept: r.kept as u32,
            job_id: r.job_id.clone().unwrap_or_default(),
            error: r.error.clone().unwrap_or_default(),
        };
        api::RunHistory {
            job_type: job_type.into(),
            succeeded: runs.succeeded.iter().map(entry).collect(),
            failed: runs.failed.iter().map(entry).collect(),
        }
    }

    /// Runs the recovery check for `who`, recorded once done.
    pub(crate) async fn recover(
        &self,
        who: &Who,
        dry_run: bool,
        here_only: bool,
    ) -> Result<api::RecoverResponse, Error> {
        let record = self.trail.begin(who, "recover", "").arg("dry_run", dry_run.to_string());
        let findings =
            if here_only { self.recovery.check(dry_run).await } else { self.recovery.check_cluster(dry_run).await };
        let result = findings.map(|findings| api::RecoverResponse { findings, dry_run }).map_err(Error::from);
        let record = match &result {
            Ok(answer) => record.arg("findings", answer.findings.len().to_string()),
            Err(_) => record,
        };
        self.trail.end(record, &result).await;
        result
    }

    /// The job's summary once it has ended.
    pub(crate) async fn wait(&self, id: &str) -> Result<api::JobSummary, Error> {
        let id = parse_job_id(id)?;
        Ok(convert::summary(&self.engine.wait(id).await?))
    }

    /// Removes the ended jobs past the retention rules now (or only names them).
    pub(crate) async fn prune(&self, who: &Who, dry_run: bool) -> Result<api::PruneResponse, Error> {
        let record = self.trail.begin(who, "prune", "").arg("dry_run", dry_run.to_string());
        let result = self.pruner.prune(dry_run).await.map_err(Error::from);
        let record = match &result {
            Ok(answer) => record.arg("jobs", answer.jobs.len().to_string()),
            Err(_) => record,
        };
        self.trail.end(record, &result).await;
        result
    }

    /// The audit trail, oldest first.
    pub(crate) async fn audit(&self, filter: Filter) -> Result<Vec<api::AuditRecord>, Error> {
        let records = self.trail.read(filter).await.map_err(store_error)?;
        Ok(records.into_iter().map(convert::audit_record).collect())
    }

    /// Each webhook endpoint, with its pending events and last delivery.
    pub(crate) async fn notifications(&self) -> Result<Vec<api::NotificationEndpoint>, Error> {
        self.notifier.listing().await.map_err(store_error)
    }

    /// Each job type's maintenance windows, read now (the database's time in a cluster).
    pub(crate) fn windows(&self) -> api::ListWindowsResponse {
        let now = self.topology.calendar_now(&*self.trail.clock);
        let mut types: std::collections::BTreeSet<String> = self.policies.job_types().into_iter().collect();
        for worker in self.registry.workers() {
            types.extend(worker.capabilities.iter().map(|c| c.job_type.clone()));
        }
        let windows =
            types.iter().map(|job_type| convert::window(job_type, &self.policies.effective(job_type).0, now)).collect();
        api::ListWindowsResponse { windows, now_ms: now.as_millis() }
    }

    /// A snapshot (in parts), then the job's transitions, until it has ended.
    pub(crate) async fn watch(
        &self,
        id: &str,
    ) -> Result<impl Stream<Item = Result<api::JobEvent, Status>> + Send, Error> {
        let id = parse_job_id(id)?;
        let events = self.engine.subscribe();
        let snapshot = self.stored(id).await?;
        Ok(watch_stream(snapshot, events, self.clone()))
    }

    /// Sends a job's snapshot part by part, each built once the watcher
    /// has taken nearly all that was queued before it, so that a huge job
    /// is never held converted; false once the watcher has gone.
    async fn send_snapshot(&self, stored: &StoredJob, tx: &Sender<Result<api::JobEvent, Status>>) -> bool {
        for range in wire::part_ranges(stored.spec.len()) {
            let Ok(mut room) = tx.reserve_many(WATCH_BUFFER - 4).await else { return false };
            let part = self.part(stored, range);
            if let Some(slot) = room.next() {
                slot.send(Ok(api::JobEvent { event: Some(job_event::Event::Snapshot(part)) }));
            }
        }
        true
    }
}

type Sender<T> = tokio::sync::mpsc::Sender<T>;

/// Events queued for one watcher: slack for a burst of transitions.
const WATCH_BUFFER: usize = 1024;

fn watch_stream(
    snapshot: StoredJob,
    subscribed: tokio::sync::broadcast::Receiver<Event>,
    api: Api,
) -> impl Stream<Item = Result<api::JobEvent, Status>> + Send {
    let (tx, rx) = tokio::sync::mpsc::channel(WATCH_BUFFER);
    // The watcher may vanish while its job is quiet: the task ends with it,
    // not at the job's next event.
    let gone = tx.clone();
    tokio::spawn(async move {
        tokio::select! {
            () = gone.closed() => {}
            () = forward(snapshot, subscribed, api, tx) => {}
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// Sends a job's snapshot, then its transitions, to one watcher until the
/// job ends or the watcher goes.
async fn forward(
    snapshot: StoredJob,
    subscribed: tokio::sync::broadcast::Receiver<Event>,
    api: Api,
    tx: Sender<Result<api::JobEvent, Status>>,
) {
    let (id, spec) = (snapshot.record.id, snapshot.spec.clone());
    if !api.send_snapshot(&snapshot, &tx).await || snapshot.record.state.is_terminal() {
        return;
    }
    let task_id = |idx: u32| spec.tasks.get(idx as usize).map(|t| t.id.to_string()).unwrap_or_default();
    let mut events = tokio_stream::wrappers::BroadcastStream::new(subscribed);
    // In a cluster, a job led by another instance (from the start, or
    // since it moved) sends no events here: its durable state is read
    // every second instead, and sent as a fresh snapshot when it changed.
    let cluster = api.topology.member().is_some();
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    // What was last sent, to compare with (kept only where it is needed).
    let mut last = cluster.then_some((snapshot.record, snapshot.tasks));
    loop {
        let event = tokio::select! {
            event = events.next() => match event {
                Some(event) => event,
                None => return,
            },
            _ = tick.tick(), if cluster => {
                if matches!(api.engine.summary(id).await, Ok(Some(_))) {
                    continue;
                }
                let stored = match api.stored(id).await {
                    Ok(stored) => stored,
                    Err(e) => {
                        let _ = tx.send(Err(Status::from(e))).await;
                        return;
                    }
                };
                if last.as_ref().is_some_and(|(record, tasks)| *record == stored.record && *tasks == stored.tasks) {
                    continue;
                }
                let ended = stored.record.state.is_terminal();
                let transition = api::JobTransition {
                    state: stored.record.state.as_str().into(),
                    at_ms: stored.record.finished_at.map(|t| t.as_millis()).unwrap_or(0),
                };
                if !api.send_snapshot(&stored, &tx).await {
                    return;
                }
                if ended {
                    let _ = tx.send(Ok(api::JobEvent { event: Some(job_event::Event::Job(transition)) })).await;
                    return;
                }
                last = Some((stored.record, stored.tasks));
                continue;
            }
        };
        let out = match event {
            Ok(Event::Task { job, idx, state, attempt, error, handler, at, progress_percent, stage }) if job == id => {
                api::JobEvent {
                    event: Some(job_event::Event::Task(api::TaskTransition {
                        task_id: task_id(idx),
                        state: state.as_str().into(),
                        attempt,
                        error: error.unwrap_or_default(),
                        handler: handler.map(|h| h.to_string()).unwrap_or_default(),
                        at_ms: at.as_millis(),
                        progress_percent: f64::from(progress_percent),
                        stage,
                    })),
                }
            }
            Ok(Event::Job { job, state, at }) if job == id => {
                let event = api::JobEvent {
                    event: Some(job_event::Event::Job(api::JobTransition {
                        state: state.as_str().into(),
                        at_ms: at.as_millis(),
                    })),
                };
                let done = state.is_terminal();
                if tx.send(Ok(event)).await.is_err() || done {
                    return;
                }
                continue;
            }
            Ok(_) => continue,
            // Fell behind: start again from the transitions after a
            // fresh subscription, and a snapshot taken after it.
            Err(_lagged) => {
                events = tokio_stream::wrappers::BroadcastStream::new(api.engine.subscribe());
                let stored = match api.stored(id).await {
                    Ok(stored) => stored,
                    Err(e) => {
                        let _ = tx.send(Err(Status::from(e))).await;
                        return;
                    }
                };
                if !api.send_snapshot(&stored, &tx).await {
                    return;
                }
                last = None;
                continue;
            }
        };
        if tx.send(Ok(out)).await.is_err() {
            return;
        }
    }
}

/// The gRPC face of the API (its calls judged before they reach it:
/// `access::grpc`).
#[derive(Clone)]
pub(crate) struct JobServiceImpl {
    api: Api,
}

impl JobServiceImpl {
    pub(crate) fn new(api: Api) -> JobServiceImpl {
        JobServiceImpl { api }
    }
}

#[tonic::async_trait]
impl JobService for JobServiceImpl {
    type WatchJobStream = Pin<Box<dyn Stream<Item = Result<api::JobEvent, Status>> + Send + 'static>>;
    type ReadJobStream = Pin<Box<dyn Stream<Item = Result<api::Job, Status>> + Send + 'static>>;
    type BackupStream = tokio_stream::wrappers::ReceiverStream<Result<api::BackupChunk, Status>>;

    async fn submit_job(
        &self,
        request: Request<api::SubmitJobRequest>,
    ) -> Result<Response<api::SubmitJobResponse>, Status> {
        let who = who(&request);
        let r = request.into_inner();
        let job_id = self.api.submit(&who, r.content, &r.format, &r.source_name).await?;
        Ok(Response::new(api::SubmitJobResponse { job_id }))
    }

    async fn submit_job_stream(
        &self,
        request: Request<tonic::Streaming<api::SubmitJobChunk>>,
    ) -> Result<Response<api::SubmitJobResponse>, Status> {
        let limit = self.api.limits.max_file_bytes;
        let who = who(&request);
        let mut chunks = request.into_inner();
        let (mut content, mut format, mut source_name) = (Vec::new(), String::new(), String::new());
        while let Some(chunk) = chunks.message().await? {
            if content.is_empty() && format.is_empty() && source_name.is_empty() {
                (format, source_name) = (chunk.format, chunk.source_name);
            }
            if (content.len() + chunk.content.len()) as u64 > limit {
                return Err(job_too_large(&source_name, limit).into());
            }
            content.extend_from_slice(&chunk.content);
        }
        let job_id = self.api.submit(&who, content, &format, &source_name).await?;
        Ok(Response::new(api::SubmitJobResponse { job_id }))
    }

    async fn get_job(&self, request: Request<api::JobRef>) -> Result<Response<api::Job>, Status> {
        Ok(Response::new(self.api.job(&request.into_inner().job_id).await?))
    }

    async fn wait_job(&self, request: Request<api::JobRef>) -> Result<Response<api::JobSummary>, Status> {
        Ok(Response::new(self.api.wait(&request.into_inner().job_id).await?))
    }

    async fn read_job(&self, request: Request<api::JobRef>) -> Result<Response<Self::ReadJobStream>, Status> {
        let parts = self.api.read(&request.into_inner().job_id).await?;
        Ok(Response::new(Box::pin(parts.map(Ok))))
    }

    async fn list_jobs(
        &self,
        request: Request<api::ListJobsRequest>,
    ) -> Result<Response<api::ListJobsResponse>, Status> {
        let r = request.into_inner();
        Ok(Response::new(self.api.list(&r).await?))
    }

    async fn watch_job(&self, request: Request<api::JobRef>) -> Result<Response<Self::WatchJobStream>, Status> {
        let stream = self.api.watch(&request.into_inner().job_id).await?;
        Ok(Response::new(Box::pin(stream)))
    }

    async fn cancel_job(&self, request: Request<api::JobRef>) -> Result<Response<api::JobRef>, Status> {
        let who = who(&request);
        let r = request.into_inner();
        self.api.cancel(&who, &r.job_id).await?;
        Ok(Response::new(r))
    }

    async fn set_job_priority(
        &self,
        request: Request<api::SetJobPriorityRequest>,
    ) -> Result<Response<api::JobRef>, Status> {
        let who = who(&request);
        let r = request.into_inner();
        self.api.set_job_priority(&who, &r.job_id, &r.priority).await?;
        Ok(Response::new(api::JobRef { job_id: r.job_id }))
    }

    async fn retry_job(&self, request: Request<api::JobRef>) -> Result<Response<api::JobRef>, Status> {
        let who = who(&request);
        let r = request.into_inner();
        self.api.retry(&who, &r.job_id).await?;
        Ok(Response::new(r))
    }

    async fn list_workers(
        &self,
        request: Request<api::ListWorkersRequest>,
    ) -> Result<Response<api::ListWorkersResponse>, Status> {
        let r = request.into_inner();
        let (workers, total) = self.api.workers(r.offset, r.limit)?;
        Ok(Response::new(api::ListWorkersResponse { workers, total }))
    }

    async fn get_policy(&self, request: Request<api::PolicyRef>) -> Result<Response<api::Policy>, Status> {
        Ok(Response::new(self.api.policy(&request.into_inner().job_type)?))
    }

    async fn detect(&self, request: Request<api::DetectRequest>) -> Result<Response<api::DetectResponse>, Status> {
        let who = who(&request);
        let r = request.into_inner();
        Ok(Response::new(self.api.detect(&who, &r.job_type, r.run).await?))
    }

    async fn list_activities(
        &self,
        request: Request<api::ListActivitiesRequest>,
    ) -> Result<Response<api::ListActivitiesResponse>, Status> {
        let r = request.into_inner();
        Ok(Response::new(api::ListActivitiesResponse { activities: self.api.activities(&r.job_type, r.limit) }))
    }

    async fn list_runs(&self, request: Request<api::PolicyRef>) -> Result<Response<api::RunHistory>, Status> {
        Ok(Response::new(self.api.runs(&request.into_inner().job_type)))
    }

    async fn get_capacity(&self, _request: Request<api::CapacityRequest>) -> Result<Response<api::Capacity>, Status> {
        Ok(Response::new(self.api.capacity().await?))
    }

    async fn list_instances(
        &self,
        _request: Request<api::ListInstancesRequest>,
    ) -> Result<Response<api::ListInstancesResponse>, Status> {
        Ok(Response::new(api::ListInstancesResponse { instances: self.api.instances().await? }))
    }

    async fn set_scheduler_paused(
        &self,
        request: Request<api::SetSchedulerPausedRequest>,
    ) -> Result<Response<api::SetSchedulerPausedResponse>, Status> {
        let who = who(&request);
        let r = request.into_inner();
        let changed = self.api.set_scheduler_paused(&who, r.paused, &r.instance).await?;
        Ok(Response::new(api::SetSchedulerPausedResponse { changed }))
    }

    async fn recover(&self, request: Request<api::RecoverRequest>) -> Result<Response<api::RecoverResponse>, Status> {
        let who = who(&request);
        let r = request.into_inner();
        Ok(Response::new(self.api.recover(&who, r.dry_run, r.here_only).await?))
    }

    /// A backup is recorded as it starts: it reads everything.
    async fn backup(&self, request: Request<api::BackupRequest>) -> Result<Response<Self::BackupStream>, Status> {
        let trail = &self.api.trail;
        trail.write(trail.begin(&who(&request), "backup", "")).await;
        Ok(Response::new(super::backup::stream(self.api.engine.clone())))
    }

    async fn prune(&self, request: Request<api::PruneRequest>) -> Result<Response<api::PruneResponse>, Status> {
        let who = who(&request);
        Ok(Response::new(self.api.prune(&who, request.into_inner().dry_run).await?))
    }

    async fn set_policy(&self, request: Request<api::SetPolicyRequest>) -> Result<Response<api::Policy>, Status> {
        let who = who(&request);
        let r = request.into_inner();
        let changes: BTreeMap<String, String> = r.values.into_iter().collect();
        Ok(Response::new(self.api.set_policy(&who, &r.job_type, &changes).await?))
    }

    async fn list_audit(
        &self,
        request: Request<api::ListAuditRequest>,
    ) -> Result<Response<api::ListAuditResponse>, Status> {
        let r = request.into_inner();
        let filter = Filter {
            since_ms: (r.since_ms > 0).then(|| u64::try_from(r.since_ms).unwrap_or(0)),
            who: Some(r.who).filter(|w| !w.is_empty()),
            limit: (r.limit > 0).then_some(r.limit as usize),
        };
        Ok(Response::new(api::ListAuditResponse { records: self.api.audit(filter).await? }))
    }

    async fn list_notifications(
        &self,
        _request: Request<api::ListNotificationsRequest>,
    ) -> Result<Response<api::ListNotificationsResponse>, Status> {
        Ok(Response::new(api::ListNotificationsResponse { endpoints: self.api.notifications().await? }))
    }

    async fn list_windows(
        &self,
        _request: Request<api::ListWindowsRequest>,
    ) -> Result<Response<api::ListWindowsResponse>, Status> {
        Ok(Response::new(self.api.windows()))
    }

    async fn get_budget(&self, _request: Request<api::GetBudgetRequest>) -> Result<Response<api::Budget>, Status> {
        Ok(Response::new(self.api.budget().await?))
    }

    async fn set_budget(&self, request: Request<api::SetBudgetRequest>) -> Result<Response<api::Budget>, Status> {
        let who = who(&request);
        Ok(Response::new(self.api.set_budget(&who, request.get_ref()).await?))
    }

    async fn add_schedule(&self, request: Request<api::AddScheduleRequest>) -> Result<Response<api::Schedule>, Status> {
        let who = who(&request);
        Ok(Response::new(self.api.add_schedule(&who, request.into_inner()).await?))
    }

    async fn list_schedules(
        &self,
        _request: Request<api::ListSchedulesRequest>,
    ) -> Result<Response<api::ListSchedulesResponse>, Status> {
        Ok(Response::new(api::ListSchedulesResponse { schedules: self.api.schedules().await? }))
    }

    async fn set_schedule_paused(
        &self,
        request: Request<api::SetSchedulePausedRequest>,
    ) -> Result<Response<api::Schedule>, Status> {
        let who = who(&request);
        let r = request.into_inner();
        Ok(Response::new(self.api.set_schedule_paused(&who, &r.name, r.paused).await?))
    }

    async fn remove_schedule(&self, request: Request<api::ScheduleRef>) -> Result<Response<api::ScheduleRef>, Status> {
        let who = who(&request);
        let r = request.into_inner();
        self.api.remove_schedule(&who, &r.name).await?;
        Ok(Response::new(r))
    }

    async fn run_schedule_now(
        &self,
        request: Request<api::ScheduleRef>,
    ) -> Result<Response<api::RunScheduleNowResponse>, Status> {
        let who = who(&request);
        let r = request.into_inner();
        let job_id = self.api.run_schedule_now(&who, &r.name).await?;
        Ok(Response::new(api::RunScheduleNowResponse { name: r.name, job_id }))
    }
}

/// Who made a call, as the guard (`access::grpc`) judged it.
fn who<T>(request: &Request<T>) -> Who {
    request.extensions().get::<Who>().cloned().unwrap_or_else(|| Who::unknown(None))
}

/// A refused or failed change to schedules, as the API answers it.
impl From<crate::server::duties::schedules::Error> for Error {
    fn from(e: crate::server::duties::schedules::Error) -> Error {
        use crate::server::duties::schedules::Error as Refused;
        match e {
            Refused::Invalid(e) => Error::Invalid(e.to_string()),
            Refused::Rejected(e) => Error::Rejected(e),
            Refused::NotFound(_) => Error::NotFound(e.to_string()),
            Refused::Exists(_) => Error::Conflict(e.to_string()),
            Refused::Engine(e) => e.into(),
            Refused::Store(e) => store_error(e),
        }
    }
}

/// Schedules: each change and its audit record are one step.
impl Api {
    pub(crate) async fn add_schedule(&self, who: &Who, r: api::AddScheduleRequest) -> Result<api::Schedule, Error> {
        let record = self
            .trail
            .begin(who, "schedule.add", &r.name)
            .arg("calendar", r.calendar.as_str())
            .arg("time_zone", r.time_zone.as_str())
            .arg("overlap", r.overlap.as_str())
            .arg("catch_up", r.catch_up.as_str())
            .arg("catch_up_window", r.catch_up_window.as_str())
            .arg("jitter", r.jitter.as_str())
            .arg("paused", r.paused.to_string())
            .arg("bytes", r.job_file.len().to_string());
        let result = async {
            if r.job_file.len() as u64 > self.limits.max_file_bytes {
                return Err(job_too_large(&format!("the job file of schedule {}", r.name), self.limits.max_file_bytes));
            }
            let job_file = String::from_utf8(r.job_file)
                .map_err(|_| Error::Invalid("schedule job_file: not UTF-8 text".into()))?;
            let terms = crate::model::schedule::Terms {
                name: r.name,
                calendar: r.calendar,
                time_zone: r.time_zone,
                overlap: r.overlap,
                catch_up: r.catch_up,
                catch_up_window: r.catch_up_window,
                jitter: r.jitter,
                paused: r.paused,
            };
            let audit = vec![record.entry().into_setting()];
            let listed = self.schedules.add(terms, job_file, r.format, audit).await?;
            Ok(self.schedule_view(listed))
        }
        .await;
        self.trail.refused(record, &result).await;
        result
    }

    pub(crate) async fn schedules(&self) -> Result<Vec<api::Schedule>, Error> {
        let listed = self.schedules.list().await?;
        Ok(listed.into_iter().map(|l| self.schedule_view(l)).collect())
    }

    pub(crate) async fn set_schedule_paused(
        &self,
        who: &Who,
        name: &str,
        paused: bool,
    ) -> Result<api::Schedule, Error> {
        let action = if paused { "schedule.pause" } else { "schedule.resume" };
        let record = self.trail.begin(who, action, name);
        let audit = vec![record.entry().into_setting()];
        let result = self.schedules.set_paused(name, paused, audit).await.map_err(Error::from);
        self.trail.refused(record, &result).await;
        Ok(self.schedule_view(result?))
    }

    pub(crate) async fn remove_schedule(&self, who: &Who, name: &str) -> Result<(), Error> {
        let record = self.trail.begin(who, "schedule.remove", name);
        let result = self.schedules.remove(name, vec![record.entry().into_setting()]).await.map_err(Error::from);
        self.trail.refused(record, &result).await;
        result
    }

    pub(crate) async fn run_schedule_now(&self, who: &Who, name: &str) -> Result<String, Error> {
        let record = self.trail.begin(who, "schedule.run_now", name);
        let audit = |id: JobId| vec![record.clone().arg("job_id", id.to_string()).entry().into_setting()];
        let result = self.schedules.run_now(name, audit).await.map_err(Error::from);
        self.trail.refused(record.clone(), &result).await;
        if let Some(node) = self.topology.member() {
            node.wake_permits();
        }
        Ok(result?.to_string())
    }

    fn schedule_view(&self, listed: crate::server::duties::schedules::Listed) -> api::Schedule {
        let crate::server::duties::schedules::Listed { schedule, last, next_ms } = listed;
        let job_name = self.schedules.job_name(&schedule);
        let terms = schedule.terms;
        api::Schedule {
            name: schedule.name,
            calendar: terms.calendar,
            time_zone: terms.time_zone,
            overlap: schedule.overlap.as_str().into(),
            catch_up: match schedule.catch_up {
                crate::model::schedule::CatchUp::None => "none".into(),
                crate::model::schedule::CatchUp::Last { .. } => "last".into(),
            },
            catch_up_window: terms.catch_up_window,
            jitter: terms.jitter,
            paused: schedule.paused,
            next_run_ms: next_ms.unwrap_or(0),
            last_slot_ms: last.slot.unwrap_or(0),
            last_job_id: last.job.unwrap_or_default(),
            last_outcome: last.outcome,
            queued_slot_ms: last.queued.unwrap_or(0),
            format: schedule.format,
            job_name,
        }
    }
}
