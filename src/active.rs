//! The in-memory state of a job that has not ended: records, unmet
//! dependency counts (the in-degree) and per-state counts.

use std::sync::Arc;

use crate::clock::Timestamp;
use crate::model::{End, JobId, JobRecord, JobSpec, Phase, StateCounts, TaskIdx, TaskRecord, TaskState, Texts};
use crate::store::{Batch, StoredJob};

pub struct ActiveJob {
    pub record: JobRecord,
    pub spec: Arc<JobSpec>,
    pub tasks: Vec<TaskRecord>,
    /// For each task, how many of its parents have not succeeded.
    pub unmet: Vec<u32>,
    pub counts: StateCounts,
    /// The texts its tasks report alike, held once.
    pub texts: Texts,
}

impl ActiveJob {
    /// Rebuilds the derived state (unmet counts, state counts) from stored records.
    pub fn from_stored(stored: StoredJob) -> ActiveJob {
        let StoredJob { record, spec, mut tasks } = stored;
        let mut texts = Texts::default();
        for task in &mut tasks {
            texts.share(task);
        }
        let unmet = (0..spec.len() as u32)
            .map(|t| {
                spec.dag.parents(t).iter().filter(|&&p| tasks[p as usize].state() != TaskState::Succeeded).count()
                    as u32
            })
            .collect();
        let mut counts = StateCounts::default();
        for task in &tasks {
            counts.add(task.state());
        }
        ActiveJob { record, spec, tasks, unmet, counts, texts }
    }

    pub fn id(&self) -> JobId {
        self.record.id
    }

    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    pub fn task(&self, idx: TaskIdx) -> Option<&TaskRecord> {
        self.tasks.get(idx.index())
    }

    /// Moves a task to `phase`, keeping the counts and the update time right.
    #[inline]
    pub fn set_phase(&mut self, idx: u32, phase: Phase, now: Timestamp) {
        let task = &mut self.tasks[idx as usize];
        self.counts.shift(task.state(), phase.state());
        task.set_phase(phase, now);
    }

    /// Ends a task at `now`.
    #[inline]
    pub fn end(&mut self, idx: u32, end: End, now: Timestamp) {
        self.set_phase(idx, Phase::Ended { end, at: now }, now);
    }

    /// Adds the task's current record to the batch.
    pub fn record_task(&self, idx: u32, batch: &mut Batch) {
        batch.tasks.push((self.record.id, TaskIdx(idx), self.tasks[idx as usize].clone()));
    }

    pub fn all_ended(&self) -> bool {
        self.counts.terminal() as usize == self.tasks.len()
    }

    pub fn to_stored(&self) -> StoredJob {
        StoredJob { record: self.record.clone(), spec: self.spec.clone(), tasks: self.tasks.clone() }
    }
}
