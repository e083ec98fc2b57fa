//! The in-process executor: joins the engine as one handler with N slots
//! and runs each assignment with the registered handler for its job type.

use foldhash::HashMap;
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::AbortHandle;

use super::{Handler, Registry, TaskContext};
use crate::dispatch::{Assignment, HandlerSpec, WorkOrder};
use crate::engine::{self, EngineHandle};
use crate::follower::Outcome;
use crate::model::{AttemptId, HandlerId, JobId};

/// An append-only record of executions, one line per event:
/// `JOB_ID TASK_ID ATTEMPT start|succeeded|failed|canceled`. Tests read it
/// to prove that nothing that had succeeded ran again.
#[derive(Clone)]
pub struct ExecLog {
    file: Arc<Mutex<std::fs::File>>,
}

impl ExecLog {
    pub fn open(path: &Path) -> std::io::Result<ExecLog> {
        let file = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
        Ok(ExecLog { file: Arc::new(Mutex::new(file)) })
    }

    /// Appends `JOB_ID TASK_ID ATTEMPT EVENT`.
    pub(crate) fn record_event(&self, job: JobId, task_id: &str, attempt: u32, event: &str) {
        let line = format!("{job} {task_id} {attempt} {event}\n");
        let mut file = self.file.lock().expect("exec log lock");
        if let Err(e) = file.write_all(line.as_bytes()) {
            tracing::error!(error = %e, "cannot write the execution log");
        }
    }
}

pub struct LocalExecutor;

impl LocalExecutor {
    /// Joins the engine with `concurrency` slots for the registry's job
    /// types; runs until the engine stops. Returns the handler id.
    pub async fn start(
        engine: EngineHandle,
        registry: Registry,
        concurrency: u32,
        exec_log: Option<ExecLog>,
    ) -> Result<HandlerId, engine::Error> {
        let handler = HandlerId::new();
        let (sink, orders) = mpsc::unbounded_channel();
        engine
            .connected(HandlerSpec {
                handler,
                job_types: Some(registry.job_types()),
                capacity: concurrency.max(1),
                type_capacity: Default::default(),
                starts_running: true,
                session: 0,
                sink,
                place: Default::default(),
            })
            .await?;
        tokio::spawn(run(engine, registry, handler, orders, exec_log));
        Ok(handler)
    }
}

type Running = Arc<Mutex<HashMap<AttemptId, AbortHandle>>>;

async fn run(
    engine: EngineHandle,
    registry: Registry,
    handler: HandlerId,
    mut orders: mpsc::UnboundedReceiver<WorkOrder>,
    exec_log: Option<ExecLog>,
) {
    let running: Running = Arc::default();
    // Shared by the tasks: one count rather than a clone of each of its parts.
    let engine = Arc::new(engine);
    while let Some(order) = orders.recv().await {
        match order {
            WorkOrder::Execute(assignment) => {
                let key = assignment.attempt;
                let engine = engine.clone();
                let found = registry.get(&assignment.job_type).cloned();
                let exec_log = exec_log.clone();
                let running_for_task = running.clone();
                // Boxed: the task's future is large (the handler's, its
                // timeout, the report's send), and tokio moves a future it
                // spawns, and the stage it leaves, by value more than once.
                let join = tokio::spawn(Box::pin(async move {
                    let task_id = assignment.task_id.clone();
                    let outcome = execute(found, assignment, exec_log.as_ref()).await;
                    running_for_task.lock().expect("running lock").remove(&key);
                    report(&engine, handler, key, &task_id, outcome).await;
                }));
                running.lock().expect("running lock").insert(key, join.abort_handle());
            }
            WorkOrder::Cancel { attempt } => {
                let aborted = running.lock().expect("running lock").remove(&attempt);
                if let Some(abort) = aborted {
                    abort.abort();
                    let outcome = Outcome::Canceled { reason: "canceled with its job".into() };
                    if let Ok(Err(rejection)) = engine.complete(attempt, handler, outcome).await {
                        tracing::debug!(%rejection, "cancel report refused");
                    }
                }
            }
        }
    }
}

/// Runs `assignment` with `found`, the handler of its job type if there is one.
async fn execute(found: Option<Arc<dyn Handler>>, assignment: Assignment, exec_log: Option<&ExecLog>) -> Outcome {
    let Some(handler) = found else {
        return Outcome::Failed {
            error: format!("no handler for job type {:?}", assignment.job_type),
            output: Vec::new(),
        };
    };
    let mut parameters: serde_json::Value = match serde_json::from_str(&assignment.parameters) {
        Ok(value) => value,
        Err(e) => return Outcome::Failed { error: format!("invalid parameters: {e}"), output: Vec::new() },
    };
    // Its share of the bandwidth budget, as a worker of the stream gets it.
    if let (Some(rate), Some(parameters)) = (assignment.io_byte_per_second, parameters.as_object_mut()) {
        parameters.insert(crate::budget::PARAMETER.to_string(), rate.into());
    }
    let attempt = assignment.attempt;
    let timeout = assignment.execution_timeout_seconds;
    let ctx = TaskContext {
        task: attempt.task,
        job: attempt.task.job,
        job_name: assignment.job_name,
        task_id: assignment.task_id,
        job_type: assignment.job_type,
        attempt: attempt.number,
        parameters,
        labels: assignment.labels,
    };
    // The log names the task after the handler has taken its context.
    let logged = exec_log.map(|log| {
        log.record_event(attempt.task.job, &ctx.task_id, attempt.number, "start");
        (log, ctx.task_id.clone())
    });
    let future = handler.execute(ctx);
    let outcome = match timeout {
        Some(seconds) => match tokio::time::timeout(Duration::from_secs(seconds), future).await {
            Ok(outcome) => outcome,
            Err(_) => Outcome::Failed { error: format!("execution timed out after {seconds} s"), output: Vec::new() },
        },
        None => future.await,
    };
    if let Some((log, task_id)) = logged {
        let event = match &outcome {
            Outcome::Succeeded { .. } => "succeeded",
            Outcome::Failed { .. } => "failed",
            Outcome::Canceled { .. } => "canceled",
        };
        log.record_event(attempt.task.job, &task_id, attempt.number, event);
    }
    outcome
}

async fn report(engine: &EngineHandle, handler: HandlerId, attempt: AttemptId, task_id: &str, outcome: Outcome) {
    match engine.complete(attempt, handler, outcome).await {
        Ok(Ok(())) => {}
        Ok(Err(rejection)) => tracing::warn!(task.id = %task_id, %rejection, "completion refused"),
        Err(e) => tracing::debug!(error = %e, "engine gone before the completion"),
    }
}
