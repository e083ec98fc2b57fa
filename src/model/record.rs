//! The persisted runtime records of jobs and tasks.

use std::collections::HashSet;
use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Serialize};

use super::stored::TaskRecordV1;
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
/// initial state: `ready` without dependencies, `pending` with. Stored and
/// exported as `TaskRecordV1` (`super::stored`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(from = "TaskRecordV1", into = "TaskRecordV1")]
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
    pub error: Option<Arc<str>>,
    /// The last lines of output the handler reported (bounded).
    pub output: Arc<[Arc<str>]>,
    /// The last progress the handler reported for the current attempt.
    pub progress_percent: f32,
    pub stage: Arc<str>,
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
            output: no_lines(),
            progress_percent: 0.0,
            stage: empty_text(),
        }
    }
}

/// The empty text, one allocation for every record that has none.
pub(super) fn empty_text() -> Arc<str> {
    static EMPTY: OnceLock<Arc<str>> = OnceLock::new();
    EMPTY.get_or_init(|| Arc::from("")).clone()
}

/// No output, one allocation for every record that has none.
pub(super) fn no_lines() -> Arc<[Arc<str>]> {
    static NONE: OnceLock<Arc<[Arc<str>]>> = OnceLock::new();
    NONE.get_or_init(|| Arc::new([])).clone()
}

pub(super) fn text_or_empty<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Arc<str>, D::Error> {
    let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
    Ok(if text.is_empty() { empty_text() } else { Arc::from(text.as_ref()) })
}

pub(super) fn lines_or_none<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Arc<[Arc<str>]>, D::Error> {
    let lines = <Vec<Arc<str>>>::deserialize(deserializer)?;
    Ok(if lines.is_empty() { no_lines() } else { Arc::from(lines) })
}

/// Shares the texts that tasks of one job report alike (a stage, an
/// output, an error), so that a million tasks saying the same words hold
/// them once: stored and encoded the same as owned strings, the sharing
/// costs nothing on disk. Long or many-line texts are not looked up, and
/// the table starts over past a bound, so it stays small.
#[derive(Debug, Default)]
pub struct Texts {
    texts: HashSet<Arc<str>>,
    lines: HashSet<Arc<[Arc<str>]>>,
}

impl Texts {
    /// Texts longer than this are kept as they are.
    const LONGEST: usize = 256;
    /// Outputs of more lines than this are kept as they are.
    const MOST_LINES: usize = 8;
    /// Distinct texts (and outputs) kept before the table starts over.
    const MOST: usize = 4096;

    pub fn text(&mut self, text: &str) -> Arc<str> {
        if text.is_empty() {
            return empty_text();
        }
        if text.len() > Self::LONGEST {
            return Arc::from(text);
        }
        if let Some(shared) = self.texts.get(text) {
            return shared.clone();
        }
        if self.texts.len() >= Self::MOST {
            self.texts.clear();
        }
        let shared: Arc<str> = Arc::from(text);
        self.texts.insert(shared.clone());
        shared
    }

    pub fn lines<S: AsRef<str>>(&mut self, lines: &[S]) -> Arc<[Arc<str>]> {
        if lines.is_empty() {
            return no_lines();
        }
        let lines: Vec<Arc<str>> = lines.iter().map(|l| self.text(l.as_ref())).collect();
        if lines.len() > Self::MOST_LINES {
            return Arc::from(lines);
        }
        if let Some(shared) = self.lines.get(&lines[..]) {
            return shared.clone();
        }
        if self.lines.len() >= Self::MOST {
            self.lines.clear();
        }
        let shared: Arc<[Arc<str>]> = Arc::from(lines);
        self.lines.insert(shared.clone());
        shared
    }

    /// Shares the texts of a record read back from the store.
    pub fn share(&mut self, record: &mut TaskRecord) {
        record.stage = self.text(&record.stage);
        record.output = self.lines(&record.output);
        if let Some(error) = record.error.as_mut() {
            *error = self.text(error);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alike_texts_and_outputs_are_held_once() {
        let mut texts = Texts::default();
        let (a, b) = (texts.text("started"), texts.text(&String::from("started")));
        assert!(Arc::ptr_eq(&a, &b));
        let (one, two) = (texts.lines(&["succeeded"]), texts.lines(&[String::from("succeeded")]));
        assert!(Arc::ptr_eq(&one, &two));
        assert!(!Arc::ptr_eq(&one, &texts.lines(&["succeeded", "again"])));
        assert!(Arc::ptr_eq(&texts.text(""), &TaskRecord::initial(false, Timestamp::default()).stage));
        let none: [&str; 0] = [];
        assert!(Arc::ptr_eq(&texts.lines(&none), &TaskRecord::initial(true, Timestamp::default()).output));
        let long = "x".repeat(Texts::LONGEST + 1);
        assert!(!Arc::ptr_eq(&texts.text(&long), &texts.text(&long)));
    }

    #[test]
    fn the_table_starts_over_past_its_bound_and_stays_correct() {
        let mut texts = Texts::default();
        for n in 0..Texts::MOST * 2 {
            assert_eq!(&*texts.text(&n.to_string()), n.to_string());
        }
        assert!(texts.texts.len() <= Texts::MOST);
    }

    #[test]
    fn shared_texts_are_stored_as_owned_strings_were() {
        // Records written before the texts were shared read back the same.
        let stage: Arc<str> = Arc::from("copying");
        assert_eq!(postcard::to_allocvec(&stage).unwrap(), postcard::to_allocvec(&String::from("copying")).unwrap());
        let output: Arc<[Arc<str>]> = Arc::from(vec![Arc::from("one"), Arc::from("two")]);
        let owned = vec![String::from("one"), String::from("two")];
        assert_eq!(postcard::to_allocvec(&output).unwrap(), postcard::to_allocvec(&owned).unwrap());
        let error: Option<Arc<str>> = Some(Arc::from("broke"));
        assert_eq!(
            postcard::to_allocvec(&error).unwrap(),
            postcard::to_allocvec(&Some(String::from("broke"))).unwrap()
        );

        let fresh = TaskRecord::initial(false, Timestamp::default());
        let decoded: TaskRecord = postcard::from_bytes(&postcard::to_allocvec(&fresh).unwrap()).unwrap();
        assert_eq!(decoded, fresh);
        assert!(Arc::ptr_eq(&decoded.stage, &fresh.stage) && Arc::ptr_eq(&decoded.output, &fresh.output));

        let mut record = fresh;
        (record.stage, record.output, record.error) = (stage, output, error);
        let decoded: TaskRecord = postcard::from_bytes(&postcard::to_allocvec(&record).unwrap()).unwrap();
        assert_eq!(decoded, record);
        let mut shared = record.clone();
        Texts::default().share(&mut shared);
        assert_eq!(shared, record);
    }
}
