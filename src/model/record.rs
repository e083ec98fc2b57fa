//! The persisted runtime records of jobs and tasks.

use serde::{Deserialize, Serialize};

use super::{HandlerId, JobId, JobState, TaskState};
use crate::clock::Timestamp;

/// Where a job came from; scheduler jobs follow stricter recovery rules.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobOrigin {
    /// Submitted by a user (file, API, or `jobcenter run`).
    #[default]
    User,
    /// One detection run of the scheduler.
    Scheduler { job_type: String, sequence: u64 },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobRecord {
    pub id: JobId,
    pub name: String,
    pub state: JobState,
    pub origin: JobOrigin,
    pub n_tasks: u32,
    pub fingerprint: [u8; 32],
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    pub finished_at: Option<Timestamp>,
    pub cancel_requested: bool,
    /// The admin instance that took the job's last leader step (its
    /// per-process UUID): the job's handler, as a task's is its worker's.
    pub handler: Option<HandlerId>,
}

/// The runtime state of one task. A task with no stored record is in its
/// initial state: `ready` without dependencies, `pending` with.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TaskRecord {
    pub state: TaskState,
    /// Number of times the task was handed to a handler; 0 before the first.
    pub attempt: u32,
    /// Attempts that failed (counted against `retry_limit`).
    pub failures: u32,
    /// Attempts lost with their handler (counted against the lost-attempt limit).
    pub lost: u32,
    /// The handler holding the current attempt.
    pub handler: Option<HandlerId>,
    pub created_at: Timestamp,
    pub assigned_at: Option<Timestamp>,
    pub started_at: Option<Timestamp>,
    pub updated_at: Timestamp,
    pub finished_at: Option<Timestamp>,
    /// A ready task is not dispatched before this (retry backoff).
    pub not_before: Option<Timestamp>,
    pub error: Option<String>,
    /// The last lines of output the handler reported (bounded).
    pub output: Vec<String>,
    /// The last progress the handler reported for the current attempt.
    pub progress_percent: f32,
    pub stage: String,
}

impl TaskRecord {
    pub fn initial(has_dependencies: bool, created_at: Timestamp) -> TaskRecord {
        TaskRecord {
            state: if has_dependencies { TaskState::Pending } else { TaskState::Ready },
            attempt: 0,
            failures: 0,
            lost: 0,
            handler: None,
            created_at,
            assigned_at: None,
            started_at: None,
            updated_at: created_at,
            finished_at: None,
            not_before: None,
            error: None,
            output: Vec::new(),
            progress_percent: 0.0,
            stage: String::new(),
        }
    }
}
