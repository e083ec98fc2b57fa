//! Executing tasks: the `Handler` trait that a job type implements, the
//! built-in job types, and the in-process executor used by `jobcenter run`.

mod builtin;
mod local;
mod recovery_check;
pub mod remote;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

pub use builtin::{builtin_handlers, cut, NoopHandler, ShellHandler};
pub use local::{ExecLog, LocalExecutor};
pub use recovery_check::RecoveryCheckHandler;

use crate::follower::Outcome;
use crate::model::{JobId, TaskRef};

/// What a handler gets to execute one attempt.
#[derive(Clone, Debug)]
pub struct TaskContext {
    pub task: TaskRef,
    pub job: JobId,
    pub job_name: String,
    pub task_id: Box<str>,
    pub job_type: Arc<str>,
    pub attempt: u32,
    /// The task's parameters object.
    pub parameters: serde_json::Value,
    pub labels: BTreeMap<String, String>,
}

pub type BoxFuture = Pin<Box<dyn Future<Output = Outcome> + Send>>;

/// One job type's executor. It returns the attempt's outcome; dropping the
/// future cancels the attempt (and must stop whatever it started).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot execute tasks",
    label = "implement `jobcenter::worker::Handler` for this type: `job_type()` and `execute(ctx)`"
)]
pub trait Handler: Send + Sync + 'static {
    fn job_type(&self) -> &'static str;
    fn execute(&self, ctx: TaskContext) -> BoxFuture;
}

/// Handlers by job type.
#[derive(Clone, Default)]
pub struct Registry {
    handlers: BTreeMap<String, Arc<dyn Handler>>,
}

impl Registry {
    pub fn new(handlers: Vec<Arc<dyn Handler>>) -> Registry {
        Registry { handlers: handlers.into_iter().map(|h| (h.job_type().to_string(), h)).collect() }
    }

    pub fn get(&self, job_type: &str) -> Option<&Arc<dyn Handler>> {
        self.handlers.get(job_type)
    }

    pub fn job_types(&self) -> Vec<Arc<str>> {
        self.handlers.keys().map(|t| Arc::from(t.as_str())).collect()
    }
}
