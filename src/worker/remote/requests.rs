//! What a session does with the admin's requests: executions started and
//! canceled, schemas, detection (refused), the admin's shutdown, and the
//! renewals and acknowledgements that keep the lease and settle outcomes.

use std::time::Duration;

use tracing::Instrument;

use super::connection::SessionEnd;
use super::executions::{self, execute_with_timeout, Admission, ExecRecord, Execution};
use super::messages::{refusal, schema_response, task_context, wire_timestamp};
use super::session::{Session, Step};
use super::work::ended;
use crate::follower::Outcome;
use crate::proto::plugin::admin_to_worker_message::Body as AdminBody;
use crate::proto::plugin::worker_to_admin_message::Body;
use crate::proto::plugin::{
    AdminToWorkerMessage, CancelRequest, DetectionComplete, ExecuteJobRequest, JobProgressUpdate, JobSpec, JobState,
};
use crate::wire;

/// The reason of a `CancelRequest` that gives none.
const DEFAULT_CANCEL_REASON: &str = "requested by the admin";

impl Session<'_> {
    pub(super) async fn handle(&mut self, message: AdminToWorkerMessage) -> Step {
        let request_id = message.request_id;
        match message.body {
            Some(AdminBody::Hello(hello)) if !hello.accepted => Err(SessionEnd::Refused {
                message: hello.message,
                reconnect_delay: Duration::from_secs(u64::try_from(hello.reconnect_delay_seconds).unwrap_or(0)),
            }),
            Some(AdminBody::Hello(_)) => Ok(()),
            Some(AdminBody::RequestConfigSchema(request)) => {
                let served = self.worker.registry.get(&request.job_type).is_some();
                let response = schema_response(request_id, &request.job_type, served, self.worker.options.max_execute);
                self.send(Body::ConfigSchemaResponse(response)).await
            }
            Some(AdminBody::RunDetectionRequest(request)) => {
                let request_id = if request_id.is_empty() { request.request_id } else { request_id };
                let error_message = format!("this worker runs no detection (job type {:?})", request.job_type);
                self.send(Body::DetectionComplete(DetectionComplete {
                    request_id,
                    job_type: request.job_type,
                    success: false,
                    error_message,
                    total_proposals: 0,
                }))
                .await
            }
            Some(AdminBody::ExecuteJobRequest(request)) => self.execute(request_id, request).await,
            Some(AdminBody::CancelRequest(request)) => self.cancel(request_id, request).await,
            Some(AdminBody::Shutdown(request)) => {
                tracing::info!(reason = %request.reason, "the admin is shutting down; taking no more work");
                self.draining = true;
                self.acknowledge(request_id, true, "shutdown acknowledged").await
            }
            None if wire::parse_lease_renewal(&request_id).is_some() || request_id == wire::LEASE_RENEWAL => {
                self.renewed();
                // The lease runs from when the renewed heartbeat left; a
                // renewal that names none, or one too old to remember,
                // renews nothing.
                let number = wire::parse_lease_renewal(&request_id);
                if let Some(&(_, sent)) = self.sent_beats.iter().find(|(n, _)| Some(*n) == number) {
                    self.work.renewed_as_of(sent);
                }
                Ok(())
            }
            None if wire::parse_outcome_ack(&request_id).is_some() => {
                self.renewed();
                if let Some((attempt, refused)) = wire::parse_outcome_ack(&request_id) {
                    if let Some(reason) = refused {
                        tracing::info!(work.id = attempt, %reason, "the admin refused an outcome; forgetting it");
                    }
                    self.work.unacknowledged.remove(attempt);
                }
                Ok(())
            }
            Some(AdminBody::RequestObjectPreview(_)) | None => {
                self.acknowledge(request_id, false, "unsupported request").await
            }
        }
    }

    /// This admin renews the lease: executions outlive its stream from now on.
    fn renewed(&mut self) {
        if self.admin_renews != Some(true) {
            self.admin_renews = Some(true);
            self.work.keeps_work = true;
        }
    }

    async fn refuse(&self, request_id: String, job: Option<&JobSpec>, error: String) -> Step {
        let (job_id, job_type) = job.map(|j| (j.job_id.clone(), j.job_type.clone())).unwrap_or_default();
        tracing::debug!(work.id = %job_id, job_type = %job_type, %error, "execute request refused");
        let completed = refusal(request_id, job_id, job_type, error, self.worker.clock.now());
        self.send(Body::JobCompleted(completed)).await
    }

    async fn execute(&mut self, request_id: String, request: ExecuteJobRequest) -> Step {
        let request_id = if request_id.is_empty() { request.request_id.clone() } else { request_id };
        let Some(job) = request.job.as_ref() else {
            return self.refuse(request_id, None, "execute request without a job".into()).await;
        };
        if job.job_id.is_empty() {
            return self.refuse(request_id, Some(job), "execute request without a job id".into()).await;
        }
        let Some(handler) = self.worker.registry.get(&job.job_type).cloned() else {
            return self.refuse(request_id, Some(job), format!("unknown job type {}", job.job_type)).await;
        };
        if self.draining {
            return self.refuse(request_id, Some(job), wire::AT_CAPACITY.into()).await;
        }
        if self.work.canceled_unseen.contains(&job.job_id) {
            let message = format!("job {} was canceled before its order arrived", job.job_id);
            return self.acknowledge(request_id, false, &message).await;
        }
        match self.work.executions.admit(&job.job_id) {
            Admission::Admit => {}
            Admission::AtCapacity => return self.refuse(request_id, Some(job), wire::AT_CAPACITY.into()).await,
            Admission::AlreadyRunning => {
                let message = format!("job {} is already running here", job.job_id);
                return self.acknowledge(request_id, false, &message).await;
            }
        }
        let ctx = task_context(job, request.attempt);
        let timeout_seconds = request
            .admin_runtime
            .as_ref()
            .and_then(|runtime| u64::try_from(runtime.execution_timeout_seconds).ok())
            .filter(|seconds| *seconds > 0);
        let record = ExecRecord { job: ctx.job, task_id: ctx.task_id.clone(), attempt: ctx.attempt };
        if let Some(log) = &self.worker.options.exec_log {
            log.record_event(record.job, &record.task_id, record.attempt, "start");
        }
        tracing::info!(work.id = %job.job_id, job_type = %job.job_type, task.id = %ctx.task_id, attempt = ctx.attempt, "execution started");
        let span = executions::span(job, &ctx, &self.worker.options.worker_id);
        let abort = self.work.tasks.spawn(execute_with_timeout(handler, ctx, timeout_seconds).instrument(span.clone()));
        let (job_id, job_type) = (job.job_id.clone(), job.job_type.clone());
        self.work.executions.insert(Execution {
            job_id: job_id.clone(),
            request_id: request_id.clone(),
            job_type,
            record,
            abort,
            span,
        });
        self.acknowledge(request_id.clone(), true, "execute request accepted").await?;
        self.unannounced.push(job_id);
        self.heartbeat_soon().await
    }

    /// Reports "started" for the executions accepted since the last call
    /// that still run. Called once they have had a turn, so that one that
    /// ended in its first turn reports only its outcome, which says as
    /// much: an admin takes the outcome of an attempt it has not seen start.
    pub(super) async fn announce_starts(&mut self) -> Step {
        for job_id in std::mem::take(&mut self.unannounced) {
            let Some(execution) = self.work.executions.running.get(&job_id) else { continue };
            if execution.abort.is_finished() {
                continue;
            }
            let (request_id, job_type) = (execution.request_id.clone(), execution.job_type.clone());
            self.send(Body::JobProgressUpdate(JobProgressUpdate {
                request_id,
                job_id,
                job_type,
                state: JobState::Running.into(),
                progress_percent: 0.0,
                stage: "started".into(),
                updated_at: Some(wire_timestamp(self.worker.clock.now())),
                ..JobProgressUpdate::default()
            }))
            .await?;
        }
        Ok(())
    }

    async fn cancel(&mut self, request_id: String, request: CancelRequest) -> Step {
        let target = request.target_id.trim();
        if target.is_empty() {
            return self.acknowledge(request_id, false, "cancel target is required").await;
        }
        let Some(execution) = self.work.executions.find(target) else {
            // Its order may still be on its way: it is not run when it comes.
            self.work.canceled_unseen.insert(target);
            return self.acknowledge(request_id, false, "cancel target not found").await;
        };
        if execution.abort.is_finished() {
            // Its outcome is waiting in `tasks`; `finished` reports it.
            return self.acknowledge(request_id, false, "cancel target has already finished").await;
        }
        let job_id = execution.job_id.clone();
        let Some(execution) = self.work.executions.remove(&job_id) else { return Ok(()) };
        execution.abort.abort();
        let reason = match request.reason.trim() {
            "" => DEFAULT_CANCEL_REASON.to_string(),
            reason => reason.to_string(),
        };
        self.acknowledge(request_id, true, "cancel request accepted").await?;
        let completed = ended(self.worker, execution, Outcome::Canceled { reason });
        self.report(completed).await?;
        self.heartbeat_soon().await
    }
}
