//! The in-process executor: joins the engine as one handler with N slots
//! and runs each assignment with the registered handler for its job type.

use foldhash::HashMap;
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::{AbortHandle, JoinSet};

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
        // Its owner is the engine: the loop ends when the engine drops the
        // handler's sink or takes no more reports, and its tasks end with
        // it. It holds no lock and nothing in it panics; a handler's panic
        // is its task's, heard by the loop and reported as a failure.
        tokio::spawn(run(engine, registry, handler, orders, exec_log));
        Ok(handler)
    }
}

/// Runs the engine's orders until it drops its sink. Each attempt runs as
/// a task of one `JoinSet`, which this loop owns: the loop hears each one
/// end (a panic is reported as a failure) and reports its outcome without
/// waiting for the step, and when the loop ends the set aborts what still
/// runs.
async fn run(
    engine: EngineHandle,
    registry: Registry,
    handler: HandlerId,
    mut orders: mpsc::UnboundedReceiver<WorkOrder>,
    exec_log: Option<ExecLog>,
) {
    let mut tasks: JoinSet<(AttemptId, Outcome)> = JoinSet::new();
    // The attempts running, and the task of each: one canceled is removed
    // here first, and its task's end is then no one's to report.
    let mut running: HashMap<AttemptId, AbortHandle> = HashMap::default();
    loop {
        let ended = tokio::select! {
            // Orders first: what the engine hands out starts at once, and
            // ends are heard whenever no order waits.
            biased;
            order = orders.recv() => match order {
                Some(WorkOrder::Execute(assignment)) => {
                    let attempt = assignment.attempt;
                    let found = registry.get(&assignment.job_type).cloned();
                    let exec_log = exec_log.clone();
                    // Boxed: the future is large (the handler's, its
                    // timeout), and tokio moves a future it spawns, and the
                    // stage it leaves, by value more than once.
                    let task = tasks.spawn(Box::pin(async move {
                        (attempt, execute(found, assignment, exec_log.as_ref()).await)
                    }));
                    running.insert(attempt, task);
                    continue;
                }
                Some(WorkOrder::Cancel { attempt }) => match running.remove(&attempt) {
                    Some(task) => {
                        task.abort();
                        (attempt, Outcome::Canceled { reason: "canceled with its job".into() })
                    }
                    None => continue,
                },
                None => break,
            },
            Some(joined) = tasks.join_next() => match joined {
                Ok((attempt, outcome)) if running.remove(&attempt).is_some() => (attempt, outcome),
                Ok(_) => continue,
                Err(e) => {
                    let Some(attempt) = running.iter().find(|(_, task)| task.id() == e.id()).map(|(a, _)| *a) else {
                        continue;
                    };
                    running.remove(&attempt);
                    let error = match e.is_panic() {
                        true => "the handler panicked",
                        false => "the execution was aborted",
                    };
                    (attempt, Outcome::Failed { error: error.into(), output: Vec::new() })
                }
            },
        };
        let (attempt, outcome) = ended;
        // A refusal is logged by the engine.
        if let Err(e) = engine.report(attempt, handler, outcome, None, None).await {
            tracing::debug!(error = %e, "engine gone before the completion");
            break;
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
