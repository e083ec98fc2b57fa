//! The validated, immutable description of a job: its tasks and their graph.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::dag::Dag;

/// Dispatch priority among ready tasks; the highest goes first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Priority {
    Low,
    #[default]
    Normal,
    High,
    Critical,
}

impl Priority {
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Low => "low",
            Priority::Normal => "normal",
            Priority::High => "high",
            Priority::Critical => "critical",
        }
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One task as the job file declared it, after validation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TaskSpec {
    pub id: Box<str>,
    pub job_type: Arc<str>,
    /// The parameters object as JSON text (validated, at most 64 KiB).
    pub parameters: Box<str>,
    pub priority: Priority,
    pub labels: BTreeMap<String, String>,
    pub retry_limit: u32,
    pub retry_backoff_seconds: u64,
    pub execution_timeout_seconds: Option<u64>,
}

/// A validated job: tasks in a fixed order (their `TaskIdx`) and the graph over them.
#[derive(Clone, Debug, PartialEq)]
pub struct JobSpec {
    pub name: String,
    pub tasks: Vec<TaskSpec>,
    pub dag: Dag,
    /// SHA-256 of the source the job was read from; lets `jobcenter run` resume its own job.
    pub fingerprint: [u8; 32],
}

impl JobSpec {
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    pub fn task(&self, idx: super::TaskIdx) -> &TaskSpec {
        &self.tasks[idx.index()]
    }

    /// Job types used by this job, sorted, each once.
    pub fn job_types(&self) -> Vec<Arc<str>> {
        let mut types: Vec<Arc<str>> = Vec::new();
        for task in &self.tasks {
            if !types.iter().any(|t| Arc::ptr_eq(t, &task.job_type) || **t == *task.job_type) {
                types.push(task.job_type.clone());
            }
        }
        types.sort();
        types
    }

    pub fn fingerprint_hex(&self) -> String {
        hex(&self.fingerprint)
    }
}

pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut out, b| {
        let _ = write!(out, "{b:02x}");
        out
    })
}
