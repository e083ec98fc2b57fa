//! The stored form of a task's record, flat and versioned, and its
//! conversions to and from the engine's `TaskRecord`.
//!
//! `TaskRecordV1` is what schema 1 of both stores holds (postcard, in a sled
//! task group or a PostgreSQL `tasks.record`) and what version 1 of an
//! export holds (JSON): its fields and their order are frozen, as the
//! fixtures under `tests/fixtures/stored-v1/` hold them. A later form is a
//! new type beside it, with its own conversion, never a change to this one.
//!
//! The engine's record holds a task's state as a `Phase` that carries the
//! data of that state; the stored form keeps the flat fields, and decoding
//! builds the phase from them. It repairs the one state a stored record may
//! hold that a phase cannot (recovery rule R1): a task assigned or running
//! with no handler recorded is ready again, its attempt given up uncounted.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::record::{empty_text, lines_or_none, text_or_empty};
use super::record::{End, Hold, LastAttempt, Phase};
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

/// The engine's record is written as `TaskRecordV1` is, field for field,
/// from the record itself: the same bytes, with no copy made to write them.
impl Serialize for TaskRecord {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut stored = serializer.serialize_struct("TaskRecordV1", 15)?;
        stored.serialize_field("state", &self.state())?;
        stored.serialize_field("attempt", &self.attempt)?;
        stored.serialize_field("failures", &self.failures)?;
        stored.serialize_field("lost", &self.lost)?;
        stored.serialize_field("handler", &self.handler())?;
        stored.serialize_field("created_at", &self.created_at)?;
        stored.serialize_field("assigned_at", &self.assigned_at())?;
        stored.serialize_field("started_at", &self.started_at())?;
        stored.serialize_field("updated_at", &self.updated_at)?;
        stored.serialize_field("finished_at", &self.finished_at())?;
        stored.serialize_field("not_before", &self.not_before())?;
        stored.serialize_field("error", &self.error)?;
        stored.serialize_field("output", &self.output)?;
        stored.serialize_field("progress_percent", &self.progress_percent)?;
        stored.serialize_field("stage", &self.stage)?;
        stored.end()
    }
}

impl TaskRecord {
    /// Appends the bytes postcard gives for this record (its stored form,
    /// `TaskRecordV1`), written field by field: the store encodes a record
    /// for every step, and this skips serde's calls for each field.
    pub fn encode_stored(&self, out: &mut Vec<u8>) {
        // The fields of bounded size are put together on the stack and
        // appended at once: at most 1 + 3 * 5 + 18 + 5 * 11 bytes.
        let mut fixed = Fixed::default();
        // A unit variant is its index, as declared.
        fixed.varint(self.state() as u64);
        fixed.varint(u64::from(self.attempt));
        fixed.varint(u64::from(self.failures));
        fixed.varint(u64::from(self.lost));
        match self.handler() {
            None => fixed.byte(0),
            Some(handler) => {
                fixed.byte(1);
                let bytes = handler.0.as_bytes();
                fixed.varint(bytes.len() as u64);
                fixed.bytes[fixed.len..fixed.len + bytes.len()].copy_from_slice(bytes);
                fixed.len += bytes.len();
            }
        }
        fixed.time(self.created_at);
        fixed.some_time(self.assigned_at());
        fixed.some_time(self.started_at());
        fixed.time(self.updated_at);
        fixed.some_time(self.finished_at());
        fixed.some_time(self.not_before());
        fixed.append_to(out);
        fn text(out: &mut Vec<u8>, text: &str) {
            Fixed::append_varint(out, text.len() as u64);
            out.extend_from_slice(text.as_bytes());
        }
        match &self.error {
            None => out.push(0),
            Some(error) => {
                out.push(1);
                text(out, error);
            }
        }
        Fixed::append_varint(out, self.output.len() as u64);
        for line in self.output.iter() {
            text(out, line);
        }
        out.extend_from_slice(&self.progress_percent.to_le_bytes());
        text(out, &self.stage);
    }
}

/// Bytes of a record put together before they are appended, as postcard
/// writes them: integers as LEB128 varints, an `i64` zigzagged first.
struct Fixed {
    bytes: [u8; 96],
    len: usize,
}

impl Default for Fixed {
    fn default() -> Fixed {
        Fixed { bytes: [0; 96], len: 0 }
    }
}

impl Fixed {
    fn append_to(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.bytes[..self.len]);
    }

    fn append_varint(out: &mut Vec<u8>, value: u64) {
        let mut fixed = Fixed::default();
        fixed.varint(value);
        fixed.append_to(out);
    }

    fn byte(&mut self, byte: u8) {
        self.bytes[self.len] = byte;
        self.len += 1;
    }

    fn varint(&mut self, mut value: u64) {
        while value >= 0x80 {
            self.byte(value as u8 | 0x80);
            value >>= 7;
        }
        self.byte(value as u8);
    }

    fn time(&mut self, at: Timestamp) {
        self.varint(((at.0 << 1) ^ (at.0 >> 63)) as u64);
    }

    fn some_time(&mut self, at: Option<Timestamp>) {
        match at {
            None => self.byte(0),
            Some(at) => {
                self.byte(1);
                self.time(at);
            }
        }
    }
}

impl From<TaskRecordV1> for TaskRecord {
    fn from(stored: TaskRecordV1) -> TaskRecord {
        let last =
            LastAttempt { handler: stored.handler, assigned_at: stored.assigned_at, started_at: stored.started_at };
        let (phase, last_attempt) = match (End::of(stored.state), stored.state, stored.handler) {
            (Some(end), ..) => (Phase::Ended { end, at: stored.finished_at.unwrap_or(stored.updated_at) }, last),
            (None, TaskState::Pending, _) => (Phase::Pending, last),
            (None, TaskState::Ready, _) => (Phase::Ready { not_before: stored.not_before }, last),
            (None, _, Some(handler)) => {
                let assigned_at = stored.assigned_at.unwrap_or(stored.updated_at);
                let started_at = (stored.state == TaskState::Running).then(|| stored.started_at.unwrap_or(assigned_at));
                (Phase::Held(Hold { handler, assigned_at, started_at }), LastAttempt::default())
            }
            (None, state, None) => return held_without_handler(stored, state),
        };
        TaskRecord {
            phase,
            attempt: stored.attempt,
            failures: stored.failures,
            lost: stored.lost,
            last_attempt,
            created_at: stored.created_at,
            updated_at: stored.updated_at,
            error: stored.error,
            output: stored.output,
            progress_percent: stored.progress_percent,
            stage: stored.stage,
        }
    }
}

/// Rule R1 at decode time: the attempt went to no handler anyone knows, so
/// nothing runs it; the task is ready again, the loss not counted.
fn held_without_handler(stored: TaskRecordV1, state: TaskState) -> TaskRecord {
    tracing::warn!(
        %state,
        attempt = stored.attempt,
        "a stored task was held with no handler recorded: it is ready again (recovery rule R1)"
    );
    TaskRecord {
        phase: Phase::Ready { not_before: stored.not_before },
        attempt: stored.attempt,
        failures: stored.failures,
        lost: stored.lost,
        last_attempt: LastAttempt::default(),
        created_at: stored.created_at,
        updated_at: stored.updated_at,
        error: stored.error,
        output: stored.output,
        progress_percent: 0.0,
        stage: empty_text(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp(1_700_000_000_000 + seconds * 1000)
    }

    /// A task on its second attempt, in `phase`.
    fn task(phase: Phase, last_attempt: LastAttempt) -> TaskRecord {
        let mut task = TaskRecord::initial(false, at(0));
        (task.phase, task.last_attempt) = (phase, last_attempt);
        (task.attempt, task.failures, task.updated_at) = (2, 1, at(5));
        (task.progress_percent, task.stage) = (40.0, "copying".into());
        task
    }

    fn every_phase() -> Vec<TaskRecord> {
        let handler = HandlerId::new();
        let last = LastAttempt { handler: Some(handler), assigned_at: Some(at(1)), started_at: Some(at(2)) };
        let lost = LastAttempt { handler: None, ..last };
        let mut tasks = vec![
            task(Phase::Pending, LastAttempt::default()),
            task(Phase::Pending, lost),
            task(Phase::READY, LastAttempt::default()),
            task(Phase::Ready { not_before: Some(at(30)) }, lost),
            task(Phase::Held(Hold { handler, assigned_at: at(3), started_at: None }), LastAttempt::default()),
            task(Phase::Held(Hold { handler, assigned_at: at(3), started_at: Some(at(4)) }), LastAttempt::default()),
        ];
        for end in [End::Succeeded, End::Failed, End::UpstreamFailed, End::Canceled] {
            tasks.push(task(Phase::Ended { end, at: at(5) }, last));
            tasks.push(task(Phase::Ended { end, at: at(5) }, LastAttempt::default()));
        }
        tasks
    }

    /// What a record is stored as, read back as the stored form.
    fn stored_form(task: &TaskRecord) -> TaskRecordV1 {
        let bytes = postcard::to_allocvec(task).expect("a record encodes");
        let stored: TaskRecordV1 = postcard::from_bytes(&bytes).expect("as its stored form");
        let json: TaskRecordV1 = serde_json::from_value(serde_json::to_value(task).unwrap()).expect("exported too");
        assert_eq!(json, stored, "an export holds the stored form");
        stored
    }

    proptest::proptest! {
        /// A record written field by field is the bytes postcard gives for
        /// it, whatever its phase, counts, times, error, output and stage.
        #[test]
        fn a_record_encoded_by_hand_is_what_postcard_encodes(
            phase in 0..14usize,
            counts in proptest::array::uniform3(proptest::num::u32::ANY),
            times in proptest::array::uniform5(proptest::num::i64::ANY),
            error in proptest::option::of(".{0,200}"),
            output in proptest::collection::vec(".{0,40}", 0..4),
            progress in proptest::num::f32::ANY,
            stage in ".{0,20}",
        ) {
            let mut task = every_phase().swap_remove(phase);
            (task.attempt, task.failures, task.lost) = (counts[0], counts[1], counts[2]);
            (task.created_at, task.updated_at) = (Timestamp(times[0]), Timestamp(times[1]));
            match &mut task.phase {
                Phase::Held(hold) => {
                    hold.assigned_at = Timestamp(times[2]);
                    hold.started_at = hold.started_at.map(|_| Timestamp(times[3]));
                }
                Phase::Ended { at, .. } => *at = Timestamp(times[4]),
                Phase::Ready { not_before } => *not_before = not_before.map(|_| Timestamp(times[4])),
                Phase::Pending => {}
            }
            task.last_attempt.assigned_at = task.last_attempt.assigned_at.map(|_| Timestamp(times[2]));
            task.error = error.map(|e| Arc::from(e.as_str()));
            task.output = output.iter().map(|line| Arc::from(line.as_str())).collect();
            (task.progress_percent, task.stage) = (progress, Arc::from(stage.as_str()));
            let mut by_hand = vec![7];
            task.encode_stored(&mut by_hand);
            proptest::prop_assert_eq!(&by_hand[1..], &postcard::to_allocvec(&task).unwrap()[..]);
        }
    }

    #[test]
    fn a_record_goes_through_its_stored_form_unchanged() {
        let tasks = every_phase();
        let states: std::collections::BTreeSet<TaskState> = tasks.iter().map(TaskRecord::state).collect();
        assert_eq!(states.len(), TaskState::ALL.len(), "every state is tried");
        for task in tasks {
            let stored = stored_form(&task);
            assert_eq!(stored.state, task.state());
            assert_eq!(TaskRecord::from(stored.clone()), task, "{}", task.state());
            assert_eq!(stored_form(&TaskRecord::from(stored.clone())), stored, "{}", task.state());
        }
    }

    #[test]
    fn a_stored_held_task_is_read_with_its_handler_and_times() {
        let handler = HandlerId::new();
        let mut stored = stored_form(&task(Phase::READY, LastAttempt::default()));
        (stored.state, stored.handler, stored.assigned_at, stored.started_at) =
            (TaskState::Running, Some(handler), Some(at(3)), Some(at(4)));
        let hold = Hold { handler, assigned_at: at(3), started_at: Some(at(4)) };
        assert_eq!(TaskRecord::from(stored.clone()).phase, Phase::Held(hold));
        // What no build wrote, read as near as it can be: a held task's times
        // are never missing, an ended one always has its end.
        (stored.assigned_at, stored.started_at) = (None, None);
        let hold = Hold { handler, assigned_at: at(5), started_at: Some(at(5)) };
        assert_eq!(TaskRecord::from(stored.clone()).phase, Phase::Held(hold));
        (stored.state, stored.finished_at) = (TaskState::Failed, None);
        assert_eq!(TaskRecord::from(stored).phase, Phase::Ended { end: End::Failed, at: at(5) });
    }

    #[test]
    fn a_task_held_with_no_handler_decodes_as_ready_with_its_counts_kept() {
        for state in [TaskState::Assigned, TaskState::Running] {
            let mut stored = stored_form(&task(Phase::READY, LastAttempt::default()));
            (stored.state, stored.handler, stored.assigned_at, stored.started_at) =
                (state, None, Some(at(3)), Some(at(4)));
            let task = TaskRecord::from(stored);
            assert_eq!(task.phase, Phase::READY, "{state}");
            assert_eq!((task.attempt, task.failures, task.lost), (2, 1, 0));
            assert_eq!((task.assigned_at(), task.started_at(), task.progress_percent), (None, None, 0.0));
            assert!(task.stage.is_empty());
        }
    }
}
