//! The stored form of a task's record, flat and versioned, and its
//! conversions to and from the engine's `TaskRecord`.
//!
//! `TaskRecordV1` is what schema 1 of both stores holds (postcard, in a sled
//! task group or a PostgreSQL `tasks.record`) and what version 1 of an
//! export holds (JSON): its fields and their order are frozen, as the
//! fixtures under `tests/fixtures/stored-v1/` hold them. A later form is a
//! new type beside it, with its own conversion, never a change to this one.
//!
//! Decoding repairs the one state a stored record may hold that the engine
//! never makes (recovery rule R1): a task assigned or running with no
//! handler recorded is ready again, its attempt given up uncounted.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::record::{empty_text, lines_or_none, text_or_empty};
use super::{HandlerId, TaskRecord, TaskState};
use crate::clock::Timestamp;

/// A task's record as schema 1 stores it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TaskRecordV1 {
    pub state: TaskState,
    pub attempt: u32,
    pub failures: u32,
    pub lost: u32,
    pub handler: Option<HandlerId>,
    pub created_at: Timestamp,
    pub assigned_at: Option<Timestamp>,
    pub started_at: Option<Timestamp>,
    pub updated_at: Timestamp,
    pub finished_at: Option<Timestamp>,
    pub not_before: Option<Timestamp>,
    pub error: Option<Arc<str>>,
    #[serde(deserialize_with = "lines_or_none")]
    pub output: Arc<[Arc<str>]>,
    pub progress_percent: f32,
    #[serde(deserialize_with = "text_or_empty")]
    pub stage: Arc<str>,
}

impl From<TaskRecord> for TaskRecordV1 {
    fn from(task: TaskRecord) -> TaskRecordV1 {
        TaskRecordV1 {
            state: task.state,
            attempt: task.attempt,
            failures: task.failures,
            lost: task.lost,
            handler: task.handler,
            created_at: task.created_at,
            assigned_at: task.assigned_at,
            started_at: task.started_at,
            updated_at: task.updated_at,
            finished_at: task.finished_at,
            not_before: task.not_before,
            error: task.error,
            output: task.output,
            progress_percent: task.progress_percent,
            stage: task.stage,
        }
    }
}

impl From<TaskRecordV1> for TaskRecord {
    fn from(stored: TaskRecordV1) -> TaskRecord {
        let task = TaskRecord {
            state: stored.state,
            attempt: stored.attempt,
            failures: stored.failures,
            lost: stored.lost,
            handler: stored.handler,
            created_at: stored.created_at,
            assigned_at: stored.assigned_at,
            started_at: stored.started_at,
            updated_at: stored.updated_at,
            finished_at: stored.finished_at,
            not_before: stored.not_before,
            error: stored.error,
            output: stored.output,
            progress_percent: stored.progress_percent,
            stage: stored.stage,
        };
        if task.state.is_held() && task.handler.is_none() {
            return held_without_handler(task);
        }
        task
    }
}

/// Rule R1 at decode time: the attempt went to no handler anyone knows, so
/// nothing runs it; the task is ready again, the loss not counted.
fn held_without_handler(task: TaskRecord) -> TaskRecord {
    tracing::warn!(
        state = %task.state,
        attempt = task.attempt,
        "a stored task was held with no handler recorded: it is ready again (recovery rule R1)"
    );
    TaskRecord {
        state: TaskState::Ready,
        assigned_at: None,
        started_at: None,
        progress_percent: 0.0,
        stage: empty_text(),
        ..task
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(state: TaskState, handler: Option<HandlerId>) -> TaskRecord {
        let mut task = TaskRecord::initial(false, Timestamp(1_700_000_000_000));
        task.state = state;
        task.attempt = 2;
        task.failures = 1;
        task.handler = handler;
        task.assigned_at = Some(Timestamp(1_700_000_001_000));
        task.started_at = Some(Timestamp(1_700_000_002_000));
        task.progress_percent = 40.0;
        task.stage = "copying".into();
        task
    }

    #[test]
    fn a_record_goes_through_its_stored_form_unchanged() {
        for state in TaskState::ALL {
            let task = held(state, Some(HandlerId::new()));
            assert_eq!(TaskRecord::from(TaskRecordV1::from(task.clone())), task, "{state}");
        }
        let task = held(TaskState::Succeeded, None);
        assert_eq!(TaskRecord::from(TaskRecordV1::from(task.clone())), task);
    }

    #[test]
    fn a_task_held_with_no_handler_decodes_as_ready_with_its_counts_kept() {
        for state in [TaskState::Assigned, TaskState::Running] {
            let task = TaskRecord::from(TaskRecordV1::from(held(state, None)));
            assert_eq!(task.state, TaskState::Ready, "{state}");
            assert_eq!((task.attempt, task.failures, task.lost), (2, 1, 0));
            assert_eq!((task.assigned_at, task.started_at, task.progress_percent), (None, None, 0.0));
            assert!(task.stage.is_empty());
        }
    }
}
