//! Who runs what: the ready queues (one per job type, so types never block
//! each other), delayed retries, and the handlers with their free slots.
//! A pure table: the engine asks it and applies its answers.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::sync::Arc;

use tokio::sync::mpsc::UnboundedSender;

use crate::clock::Timestamp;
use crate::model::{HandlerId, JobId, Priority, TaskRef};

/// A unit of work sent to a handler.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WorkOrder {
    Execute(Assignment),
    /// Stop the attempt; the handler answers with a `canceled` outcome.
    Cancel {
        task: TaskRef,
        attempt: u32,
    },
}

/// Everything a handler needs to execute one attempt of a task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assignment {
    pub task: TaskRef,
    pub attempt: u32,
    pub job_name: String,
    pub task_id: Box<str>,
    pub job_type: Arc<str>,
    pub parameters: Box<str>,
    pub labels: BTreeMap<String, String>,
    pub priority: Priority,
    pub execution_timeout_seconds: Option<u64>,
}

pub type Sink = UnboundedSender<WorkOrder>;

/// What a handler declares when it joins.
#[derive(Clone, Debug)]
pub struct HandlerSpec {
    pub handler: HandlerId,
    /// The job types it executes; `None` for any.
    pub job_types: Option<Vec<Arc<str>>>,
    pub capacity: u32,
    /// It starts an attempt as soon as it gets it (no separate start report).
    pub starts_running: bool,
    pub sink: Sink,
}

struct Slot {
    spec: HandlerSpec,
    in_use: u32,
}

impl Slot {
    fn accepts(&self, job_type: &str) -> bool {
        self.spec.job_types.as_ref().is_none_or(|types| types.iter().any(|t| &**t == job_type))
    }

    fn free(&self) -> u32 {
        self.spec.capacity.saturating_sub(self.in_use)
    }
}

#[derive(PartialEq, Eq)]
struct Entry {
    priority: Priority,
    seq: u64,
    task: TaskRef,
}

impl Ord for Entry {
    /// Highest priority first, then first in first out.
    fn cmp(&self, other: &Entry) -> Ordering {
        self.priority.cmp(&other.priority).then_with(|| other.seq.cmp(&self.seq))
    }
}

impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Entry) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

#[derive(Default)]
pub struct Dispatch {
    handlers: BTreeMap<HandlerId, Slot>,
    queues: BTreeMap<Arc<str>, BinaryHeap<Entry>>,
    delayed: BTreeSet<(Timestamp, u64, TaskRef)>,
    delayed_meta: BTreeMap<u64, (Arc<str>, Priority)>,
    next_seq: u64,
}

impl Dispatch {
    pub fn add_handler(&mut self, spec: HandlerSpec) {
        let in_use = self.handlers.get(&spec.handler).map(|s| s.in_use).unwrap_or(0);
        self.handlers.insert(spec.handler, Slot { spec, in_use });
    }

    pub fn remove_handler(&mut self, handler: HandlerId) -> bool {
        self.handlers.remove(&handler).is_some()
    }

    pub fn has_handler(&self, handler: HandlerId) -> bool {
        self.handlers.contains_key(&handler)
    }

    pub fn sink(&self, handler: HandlerId) -> Option<&Sink> {
        self.handlers.get(&handler).map(|s| &s.spec.sink)
    }

    pub fn starts_running(&self, handler: HandlerId) -> bool {
        self.handlers.get(&handler).is_some_and(|s| s.spec.starts_running)
    }

    /// Queues a ready task; one with a future `not_before` waits until then.
    pub fn push_ready(
        &mut self,
        job_type: Arc<str>,
        priority: Priority,
        task: TaskRef,
        not_before: Option<Timestamp>,
        now: Timestamp,
    ) {
        self.next_seq += 1;
        let seq = self.next_seq;
        match not_before {
            Some(at) if at > now => {
                self.delayed.insert((at, seq, task));
                self.delayed_meta.insert(seq, (job_type, priority));
            }
            _ => self.queues.entry(job_type).or_default().push(Entry { priority, seq, task }),
        }
    }

    /// Moves delayed tasks whose time has come into their queues.
    pub fn promote_due(&mut self, now: Timestamp) {
        while let Some(&(at, seq, task)) = self.delayed.first() {
            if at > now {
                break;
            }
            self.delayed.pop_first();
            if let Some((job_type, priority)) = self.delayed_meta.remove(&seq) {
                self.queues.entry(job_type).or_default().push(Entry { priority, seq, task });
            }
        }
    }

    /// When the earliest delayed task becomes due.
    pub fn next_wake(&self) -> Option<Timestamp> {
        self.delayed.first().map(|(at, _, _)| *at)
    }

    /// Job types with queued tasks.
    pub fn queued_types(&self) -> Vec<Arc<str>> {
        self.queues.iter().filter(|(_, q)| !q.is_empty()).map(|(t, _)| t.clone()).collect()
    }

    pub fn queued(&self) -> usize {
        self.queues.values().map(BinaryHeap::len).sum::<usize>() + self.delayed.len()
    }

    /// The handler with the most free slots that accepts this job type.
    pub fn pick_handler(&self, job_type: &str) -> Option<HandlerId> {
        self.handlers
            .iter()
            .filter(|(_, slot)| slot.free() > 0 && slot.accepts(job_type))
            .max_by_key(|(_, slot)| slot.free())
            .map(|(id, _)| *id)
    }

    pub fn pop(&mut self, job_type: &str) -> Option<TaskRef> {
        self.queues.get_mut(job_type)?.pop().map(|e| e.task)
    }

    pub fn take_slot(&mut self, handler: HandlerId) {
        if let Some(slot) = self.handlers.get_mut(&handler) {
            slot.in_use += 1;
        }
    }

    pub fn release_slot(&mut self, handler: HandlerId) {
        if let Some(slot) = self.handlers.get_mut(&handler) {
            slot.in_use = slot.in_use.saturating_sub(1);
        }
    }

    /// Forgets every queued entry of a job (it was canceled or ended).
    pub fn forget_job(&mut self, job: JobId) {
        for queue in self.queues.values_mut() {
            queue.retain(|e| e.task.job != job);
        }
        let seqs: Vec<u64> = self.delayed.iter().filter(|(_, _, t)| t.job == job).map(|(_, s, _)| *s).collect();
        self.delayed.retain(|(_, _, t)| t.job != job);
        for seq in seqs {
            self.delayed_meta.remove(&seq);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::TaskIdx;

    fn task(i: u32) -> TaskRef {
        TaskRef { job: JobId::from_bytes([1; 16]), idx: TaskIdx(i) }
    }

    #[test]
    fn highest_priority_first_then_fifo() {
        let mut d = Dispatch::default();
        let t: Arc<str> = Arc::from("noop");
        let now = Timestamp(0);
        d.push_ready(t.clone(), Priority::Normal, task(1), None, now);
        d.push_ready(t.clone(), Priority::Critical, task(2), None, now);
        d.push_ready(t.clone(), Priority::Normal, task(3), None, now);
        d.push_ready(t.clone(), Priority::Low, task(4), None, now);
        d.push_ready(t.clone(), Priority::High, task(5), None, now);
        let order: Vec<u32> = std::iter::from_fn(|| d.pop("noop")).map(|t| t.idx.0).collect();
        assert_eq!(order, vec![2, 5, 1, 3, 4]);
    }

    #[test]
    fn delayed_tasks_wait_for_their_time() {
        let mut d = Dispatch::default();
        let t: Arc<str> = Arc::from("noop");
        d.push_ready(t.clone(), Priority::Normal, task(1), Some(Timestamp(5000)), Timestamp(0));
        assert_eq!(d.pop("noop"), None);
        assert_eq!(d.next_wake(), Some(Timestamp(5000)));
        d.promote_due(Timestamp(4999));
        assert_eq!(d.pop("noop"), None);
        d.promote_due(Timestamp(5000));
        assert_eq!(d.pop("noop"), Some(task(1)));
        assert_eq!(d.next_wake(), None);
    }

    #[test]
    fn picks_the_handler_with_most_free_slots_that_accepts_the_type() {
        let mut d = Dispatch::default();
        let (sink, _rx) = tokio::sync::mpsc::unbounded_channel();
        let a = HandlerId::new();
        let b = HandlerId::new();
        d.add_handler(HandlerSpec {
            handler: a,
            job_types: None,
            capacity: 2,
            starts_running: true,
            sink: sink.clone(),
        });
        d.add_handler(HandlerSpec {
            handler: b,
            job_types: Some(vec![Arc::from("shell")]),
            capacity: 3,
            starts_running: true,
            sink,
        });
        assert_eq!(d.pick_handler("noop"), Some(a));
        assert_eq!(d.pick_handler("shell"), Some(b));
        d.take_slot(b);
        d.take_slot(b);
        assert_eq!(d.pick_handler("shell"), Some(a));
        d.take_slot(a);
        d.take_slot(a);
        assert_eq!(d.pick_handler("noop"), None);
        d.release_slot(a);
        assert_eq!(d.pick_handler("noop"), Some(a));
    }
}
