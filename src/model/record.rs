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
    /// One run of a schedule: the slot its calendar named (ms since the epoch).
    Schedule { name: String, slot: i64 },
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
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(from = "TaskRecordV1")]
pub struct TaskRecord {
    /// Where the task is in its life, with the data of that state.
    pub phase: Phase,
    /// Number of times the task was handed to a handler; 0 before the first.
    pub attempt: u32,
    /// Attempts that failed (counted against `retry_limit`).
    pub failures: u32,
    /// Attempts lost with their handler (counted against the lost-attempt limit).
    pub lost: u32,
    /// The latest attempt no longer held, as views show it; empty while
    /// an attempt is held (the phase has it).
    pub last_attempt: LastAttempt,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    pub error: Option<Arc<str>>,
    /// The last lines of output the handler reported (bounded).
    pub output: Arc<[Arc<str>]>,
    /// The last progress the handler reported for the current attempt.
    pub progress_percent: f32,
    pub stage: Arc<str>,
}

/// Where a task is in its life, each state with the data only it has: a
/// held task always has its handler and the time it was handed out; only a
/// ready task waits out a backoff; only an ended one has an end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Waiting on dependencies.
    Pending,
    /// Every dependency succeeded: waiting for a handler, and not handed
    /// out before `not_before` (a retry's backoff).
    Ready { not_before: Option<Timestamp> },
    /// Its current attempt (the record's `attempt`) is held by a handler.
    Held(Hold),
    /// Ended, at `at`, until its job is retried.
    Ended { end: End, at: Timestamp },
}

/// The current attempt of a held task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hold {
    pub handler: HandlerId,
    pub assigned_at: Timestamp,
    /// When the handler said it started: `None` while it is only assigned.
    pub started_at: Option<Timestamp>,
}

/// How a task ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    Succeeded,
    /// Its retries ran out, or it was lost too often.
    Failed,
    /// It never ran because an ancestor failed.
    UpstreamFailed,
    Canceled,
}

/// The latest attempt of a task that no longer holds one: when it was
/// handed out and started, and by whom while that still says something (a
/// success or a failure its handler reported; not a lost attempt, and not
/// one its task has gone back to wait after).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LastAttempt {
    pub handler: Option<HandlerId>,
    pub assigned_at: Option<Timestamp>,
    pub started_at: Option<Timestamp>,
}

impl Phase {
    #[inline]
    pub fn state(self) -> TaskState {
        match self {
            Phase::Pending => TaskState::Pending,
            Phase::Ready { .. } => TaskState::Ready,
            Phase::Held(Hold { started_at: None, .. }) => TaskState::Assigned,
            Phase::Held(Hold { started_at: Some(_), .. }) => TaskState::Running,
            Phase::Ended { end, .. } => end.state(),
        }
    }

    /// Ready, to be handed out as soon as a handler is free.
    pub const READY: Phase = Phase::Ready { not_before: None };
}

impl End {
    #[inline]
    pub fn state(self) -> TaskState {
        match self {
            End::Succeeded => TaskState::Succeeded,
            End::Failed => TaskState::Failed,
            End::UpstreamFailed => TaskState::UpstreamFailed,
            End::Canceled => TaskState::Canceled,
        }
    }

    /// The end a terminal state names; `None` for a state that is no end.
    #[inline]
    pub fn of(state: TaskState) -> Option<End> {
        match state {
            TaskState::Succeeded => Some(End::Succeeded),
            TaskState::Failed => Some(End::Failed),
            TaskState::UpstreamFailed => Some(End::UpstreamFailed),
            TaskState::Canceled => Some(End::Canceled),
            TaskState::Pending | TaskState::Ready | TaskState::Assigned | TaskState::Running => None,
        }
    }
}

impl TaskRecord {
    pub fn initial(has_dependencies: bool, created_at: Timestamp) -> TaskRecord {
        TaskRecord {
            phase: if has_dependencies { Phase::Pending } else { Phase::READY },
            attempt: 0,
            failures: 0,
            lost: 0,
            last_attempt: LastAttempt::default(),
            created_at,
            updated_at: created_at,
            error: None,
            output: no_lines(),
            progress_percent: 0.0,
            stage: empty_text(),
        }
    }

    #[inline]
    pub fn state(&self) -> TaskState {
        self.phase.state()
    }

    /// The current attempt, when a handler holds one.
    #[inline]
    pub fn hold(&self) -> Option<&Hold> {
        match &self.phase {
            Phase::Held(hold) => Some(hold),
            _ => None,
        }
    }

    /// The handler holding the current attempt.
    #[inline]
    pub fn holder(&self) -> Option<HandlerId> {
        self.hold().map(|hold| hold.handler)
    }

    /// The handler of the current attempt, or of the last one while it
    /// still says something (`LastAttempt`): what views show.
    #[inline]
    pub fn handler(&self) -> Option<HandlerId> {
        self.hold().map(|hold| hold.handler).or(self.last_attempt.handler)
    }

    /// When the current attempt, or else the last one, was handed out.
    #[inline]
    pub fn assigned_at(&self) -> Option<Timestamp> {
        self.hold().map(|hold| hold.assigned_at).or(self.last_attempt.assigned_at)
    }

    /// When the current attempt, or else the last one, started.
    #[inline]
    pub fn started_at(&self) -> Option<Timestamp> {
        match self.hold() {
            Some(hold) => hold.started_at,
            None => self.last_attempt.started_at,
        }
    }

    #[inline]
    pub fn finished_at(&self) -> Option<Timestamp> {
        match self.phase {
            Phase::Ended { at, .. } => Some(at),
            _ => None,
        }
    }

    /// A ready task's backoff: not handed out before this.
    #[inline]
    pub fn not_before(&self) -> Option<Timestamp> {
        match self.phase {
            Phase::Ready { not_before } => not_before,
            _ => None,
        }
    }

    /// Moves the task to `phase` at `now`. A held attempt that ends leaves
    /// its handler and times in `last_attempt`; a new one clears it.
    /// (`ActiveJob::set_phase` keeps a job's counts with it.)
    #[inline]
    pub fn set_phase(&mut self, phase: Phase, now: Timestamp) {
        let holds = matches!(phase, Phase::Held(_));
        if let Phase::Held(hold) = self.phase {
            if !holds {
                self.last_attempt = LastAttempt {
                    handler: Some(hold.handler),
                    assigned_at: Some(hold.assigned_at),
                    started_at: hold.started_at,
                };
            }
        } else if holds {
            self.last_attempt = LastAttempt::default();
        }
        self.phase = phase;
        self.updated_at = now;
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
    fn an_attempt_that_ends_is_kept_as_the_last_until_the_next_is_held() {
        let (handler, at) = (HandlerId::new(), |s: i64| Timestamp(1_000 * s));
        let mut task = TaskRecord::initial(false, at(0));
        let hold = Hold { handler, assigned_at: at(1), started_at: None };
        task.set_phase(Phase::Held(hold), at(1));
        assert_eq!(
            (task.state(), task.holder(), task.last_attempt),
            (TaskState::Assigned, Some(handler), LastAttempt::default())
        );
        task.set_phase(Phase::Held(Hold { started_at: Some(at(2)), ..hold }), at(2));
        assert_eq!((task.state(), task.started_at(), task.updated_at), (TaskState::Running, Some(at(2)), at(2)));
        task.set_phase(Phase::Ready { not_before: Some(at(9)) }, at(3));
        let last = LastAttempt { handler: Some(handler), assigned_at: Some(at(1)), started_at: Some(at(2)) };
        assert_eq!((task.holder(), task.handler(), task.last_attempt), (None, Some(handler), last));
        assert_eq!((task.assigned_at(), task.not_before(), task.finished_at()), (Some(at(1)), Some(at(9)), None));
        let other = HandlerId::new();
        task.set_phase(Phase::Held(Hold { handler: other, assigned_at: at(10), started_at: None }), at(10));
        assert_eq!((task.handler(), task.assigned_at(), task.started_at()), (Some(other), Some(at(10)), None));
        assert_eq!((task.not_before(), task.last_attempt), (None, LastAttempt::default()));
        task.set_phase(Phase::Ended { end: End::Succeeded, at: at(11) }, at(11));
        assert_eq!(
            (task.state(), task.finished_at(), task.handler()),
            (TaskState::Succeeded, Some(at(11)), Some(other))
        );
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
