//! Task and job lifecycle states.

use std::fmt;

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskState {
    /// Waiting on dependencies.
    Pending,
    /// Every dependency succeeded; waiting for a handler (and its backoff, if any).
    Ready,
    /// Handed to a handler, not yet reported started.
    Assigned,
    Running,
    Succeeded,
    /// Failed after its retries ran out (or it was lost too often).
    Failed,
    /// Never ran because an ancestor failed.
    UpstreamFailed,
    Canceled,
}

impl TaskState {
    pub const ALL: [TaskState; 8] = [
        TaskState::Pending,
        TaskState::Ready,
        TaskState::Assigned,
        TaskState::Running,
        TaskState::Succeeded,
        TaskState::Failed,
        TaskState::UpstreamFailed,
        TaskState::Canceled,
    ];

    pub fn is_terminal(self) -> bool {
        matches!(self, TaskState::Succeeded | TaskState::Failed | TaskState::UpstreamFailed | TaskState::Canceled)
    }

    /// Held by a handler: assigned or running.
    pub fn is_held(self) -> bool {
        matches!(self, TaskState::Assigned | TaskState::Running)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Pending => "pending",
            TaskState::Ready => "ready",
            TaskState::Assigned => "assigned",
            TaskState::Running => "running",
            TaskState::Succeeded => "succeeded",
            TaskState::Failed => "failed",
            TaskState::UpstreamFailed => "upstream_failed",
            TaskState::Canceled => "canceled",
        }
    }

    #[inline]
    fn slot(self) -> usize {
        self as usize
    }
}

impl fmt::Display for TaskState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    Pending,
    Running,
    Succeeded,
    Failed,
    Canceled,
}

impl JobState {
    pub fn is_terminal(self) -> bool {
        matches!(self, JobState::Succeeded | JobState::Failed | JobState::Canceled)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Pending => "pending",
            JobState::Running => "running",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
            JobState::Canceled => "canceled",
        }
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for JobState {
    type Err = String;
    fn from_str(s: &str) -> Result<JobState, String> {
        [JobState::Pending, JobState::Running, JobState::Succeeded, JobState::Failed, JobState::Canceled]
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| format!("unknown job state {s:?}: expected pending, running, succeeded, failed or canceled"))
    }
}

/// How many tasks of a job are in each state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateCounts([u32; 8]);

impl StateCounts {
    #[inline]
    pub fn get(&self, state: TaskState) -> u32 {
        self.0[state.slot()]
    }

    #[inline]
    pub fn add(&mut self, state: TaskState) {
        self.0[state.slot()] += 1;
    }

    #[inline]
    pub fn shift(&mut self, from: TaskState, to: TaskState) {
        self.0[from.slot()] -= 1;
        self.0[to.slot()] += 1;
    }

    pub fn total(&self) -> u32 {
        self.0.iter().sum()
    }

    pub fn terminal(&self) -> u32 {
        TaskState::ALL.iter().filter(|s| s.is_terminal()).map(|s| self.get(*s)).sum()
    }

    pub fn iter(&self) -> impl Iterator<Item = (TaskState, u32)> + '_ {
        TaskState::ALL.iter().map(|s| (*s, self.get(*s)))
    }
}
