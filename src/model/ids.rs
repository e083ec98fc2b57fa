//! Identifier newtypes for jobs, tasks and handlers.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// A job's id: a time-ordered UUID (v7), so ids sort by submission.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct JobId(pub Uuid);

impl JobId {
    pub fn new() -> JobId {
        JobId(Uuid::now_v7())
    }

    pub fn as_bytes(&self) -> &[u8; 16] {
        self.0.as_bytes()
    }

    pub fn from_bytes(bytes: [u8; 16]) -> JobId {
        JobId(Uuid::from_bytes(bytes))
    }
}

impl Default for JobId {
    fn default() -> JobId {
        JobId::new()
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl fmt::Debug for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "JobId({})", self.0)
    }
}

impl FromStr for JobId {
    type Err = uuid::Error;
    fn from_str(s: &str) -> Result<JobId, uuid::Error> {
        Uuid::parse_str(s).map(JobId)
    }
}

/// The handler of an attempt: a worker process's per-lifetime UUID (or the
/// admin instance's own UUID for work it runs itself).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct HandlerId(pub Uuid);

impl HandlerId {
    pub fn new() -> HandlerId {
        HandlerId(Uuid::new_v4())
    }
}

impl Default for HandlerId {
    fn default() -> HandlerId {
        HandlerId::new()
    }
}

impl fmt::Display for HandlerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl fmt::Debug for HandlerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HandlerId({})", self.0)
    }
}

impl FromStr for HandlerId {
    type Err = uuid::Error;
    fn from_str(s: &str) -> Result<HandlerId, uuid::Error> {
        Uuid::parse_str(s).map(HandlerId)
    }
}

/// A task's position inside its job: an index into the job's task list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TaskIdx(pub u32);

impl TaskIdx {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// A task anywhere: its job and its index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TaskRef {
    pub job: JobId,
    pub idx: TaskIdx,
}

/// One attempt of one task: the task and its attempt number (the first is
/// 1). Its text, on the worker stream and between instances, is
/// `JOB_UUID.TASK_INDEX.ATTEMPT`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct AttemptId {
    pub task: TaskRef,
    pub number: u32,
}

impl AttemptId {
    pub fn new(task: TaskRef, number: u32) -> AttemptId {
        AttemptId { task, number }
    }
}

impl fmt::Display for AttemptId {
    /// Written whole at once: an attempt's text goes out with every task
    /// dispatched, and a `String` written piece by piece grows each time.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut text = [0u8; uuid::fmt::Hyphenated::LENGTH + 2 * (1 + 10)];
        let mut len = self.task.job.0.hyphenated().encode_lower(&mut text).len();
        for n in [self.task.idx.0, self.number] {
            let mut digits = itoa::Buffer::new();
            let digits = digits.format(n).as_bytes();
            text[len] = b'.';
            text[len + 1..len + 1 + digits.len()].copy_from_slice(digits);
            len += 1 + digits.len();
        }
        f.write_str(std::str::from_utf8(&text[..len]).expect("an attempt's text is ASCII"))
    }
}

/// Text that is not `JOB_UUID.TASK_INDEX.ATTEMPT`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("not an attempt id (JOB_UUID.TASK_INDEX.ATTEMPT): {0:?}")]
pub struct NotAnAttemptId(pub String);

impl FromStr for AttemptId {
    type Err = NotAnAttemptId;

    fn from_str(text: &str) -> Result<AttemptId, NotAnAttemptId> {
        let wrong = || NotAnAttemptId(text.chars().take(80).collect());
        let mut parts = text.split('.');
        let mut next = || parts.next().ok_or_else(wrong);
        let job: JobId = next()?.parse().map_err(|_| wrong())?;
        let idx: u32 = next()?.parse().map_err(|_| wrong())?;
        let number: u32 = next()?.parse().map_err(|_| wrong())?;
        if parts.next().is_some() {
            return Err(wrong());
        }
        Ok(AttemptId { task: TaskRef { job, idx: TaskIdx(idx) }, number })
    }
}

#[cfg(test)]
mod attempt_id_tests {
    use super::*;

    #[test]
    fn an_attempt_id_reads_back_as_written_and_nothing_else_reads() {
        let attempt = AttemptId::new(TaskRef { job: JobId::new(), idx: TaskIdx(7) }, 3);
        assert_eq!(attempt.to_string().parse::<AttemptId>(), Ok(attempt));
        assert!(attempt.to_string().ends_with(".7.3"));
        for wrong in [
            "",
            "x.1.1",
            &format!("{}.1", attempt.task.job),
            &format!("{attempt}.1"),
            &format!("{}.-1.1", attempt.task.job),
        ] {
            assert!(wrong.parse::<AttemptId>().is_err(), "{wrong:?}");
        }
    }

    #[test]
    fn an_attempt_s_text_is_job_task_and_number_and_reads_back() {
        let job = JobId(uuid::Uuid::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef));
        for (idx, number) in [(0, 1), (7, 10), (999_999, 3), (u32::MAX, u32::MAX)] {
            let attempt = AttemptId::new(TaskRef { job, idx: TaskIdx(idx) }, number);
            let text = attempt.to_string();
            assert_eq!(text, format!("{}.{idx}.{number}", job.0));
            assert_eq!(text.parse::<AttemptId>(), Ok(attempt));
            assert_eq!(format!("[{attempt:>5}]"), format!("[{text}]"), "wider than any width");
        }
    }
}
