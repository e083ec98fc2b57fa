//! The attempts handlers hold now, and what each one implies: the volume it
//! locks and the deadline it must end by. Kept beside the ready queues,
//! rebuilt from the stored records on load, and released in one place when
//! an attempt ends, however it ends.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use crate::clock::Timestamp;
use crate::model::{HandlerId, JobId, TaskRef};

/// One held attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    pub attempt: u32,
    pub handler: HandlerId,
    pub job_type: Arc<str>,
    /// The resource (volume) the attempt locks while it runs.
    pub resource: Option<String>,
    /// When the attempt times out.
    pub deadline: Option<Timestamp>,
    /// The deadline comes from the task's own timeout, not its type's policy.
    pub own_timeout: bool,
}

#[derive(Default)]
pub struct HeldTable {
    by_task: HashMap<TaskRef, Held>,
    deadlines: BTreeSet<(Timestamp, TaskRef, u32)>,
    resources: HashMap<String, (TaskRef, u32)>,
}

impl HeldTable {
    pub fn insert(&mut self, task: TaskRef, held: Held) {
        self.remove(task);
        if let Some(at) = held.deadline {
            self.deadlines.insert((at, task, held.attempt));
        }
        if let Some(key) = &held.resource {
            self.resources.insert(key.clone(), (task, held.attempt));
        }
        self.by_task.insert(task, held);
    }

    /// Forgets the attempt with its lock and deadline; returns what it held.
    pub fn remove(&mut self, task: TaskRef) -> Option<Held> {
        let held = self.by_task.remove(&task)?;
        if let Some(at) = held.deadline {
            self.deadlines.remove(&(at, task, held.attempt));
        }
        if let Some(key) = &held.resource {
            if self.resources.get(key) == Some(&(task, held.attempt)) {
                self.resources.remove(key);
            }
        }
        Some(held)
    }

    pub fn get(&self, task: TaskRef) -> Option<&Held> {
        self.by_task.get(&task)
    }

    pub fn len(&self) -> usize {
        self.by_task.len()
    }

    /// Every held attempt.
    pub fn iter(&self) -> impl Iterator<Item = (&TaskRef, &Held)> {
        self.by_task.iter()
    }

    pub fn is_empty(&self) -> bool {
        self.by_task.is_empty()
    }

    /// Every resource a held attempt locks now.
    pub fn resources(&self) -> impl Iterator<Item = &String> {
        self.resources.keys()
    }

    /// Whether a held attempt locks the resource.
    pub fn locks(&self, resource: &str) -> bool {
        self.resources.contains_key(resource)
    }

    /// Every attempt `handler` holds.
    pub fn of_handler(&self, handler: HandlerId) -> Vec<TaskRef> {
        let mut tasks: Vec<TaskRef> =
            self.by_task.iter().filter(|(_, h)| h.handler == handler).map(|(task, _)| *task).collect();
        tasks.sort();
        tasks
    }

    /// Every attempt of `job_type` whose deadline comes from the type's policy.
    pub fn of_type_without_own_timeout(&self, job_type: &str) -> Vec<TaskRef> {
        self.by_task.iter().filter(|(_, h)| !h.own_timeout && &*h.job_type == job_type).map(|(t, _)| *t).collect()
    }

    /// Moves an attempt's deadline (or removes it).
    pub fn set_deadline(&mut self, task: TaskRef, deadline: Option<Timestamp>) {
        let Some(held) = self.by_task.get_mut(&task) else { return };
        if let Some(at) = held.deadline {
            self.deadlines.remove(&(at, task, held.attempt));
        }
        held.deadline = deadline;
        if let Some(at) = deadline {
            self.deadlines.insert((at, task, held.attempt));
        }
    }

    pub fn next_deadline(&self) -> Option<Timestamp> {
        self.deadlines.first().map(|(at, _, _)| *at)
    }

    /// The next attempt whose deadline has passed at `now`, if any.
    pub fn due(&self, now: Timestamp) -> Option<(Timestamp, TaskRef, u32)> {
        self.deadlines.first().copied().filter(|(at, _, _)| *at <= now)
    }

    pub fn handlers(&self) -> BTreeSet<HandlerId> {
        self.by_task.values().map(|h| h.handler).collect()
    }

    /// Jobs with at least one held attempt.
    pub fn jobs(&self) -> std::collections::HashSet<JobId> {
        self.by_task.keys().map(|task| task.job).collect()
    }
}

/// Handlers that hold attempts while disconnected, and when the admin takes
/// those attempts back if they have not come back by then.
#[derive(Default)]
pub struct Absent {
    until: HashMap<HandlerId, (Timestamp, String)>,
    order: BTreeSet<(Timestamp, HandlerId)>,
}

impl Absent {
    pub fn insert(&mut self, handler: HandlerId, take_back_at: Timestamp, reason: String) {
        self.remove(handler);
        self.order.insert((take_back_at, handler));
        self.until.insert(handler, (take_back_at, reason));
    }

    pub fn remove(&mut self, handler: HandlerId) {
        if let Some((at, _)) = self.until.remove(&handler) {
            self.order.remove(&(at, handler));
        }
    }

    pub fn handlers(&self) -> impl Iterator<Item = HandlerId> + '_ {
        self.until.keys().copied()
    }

    /// When the handler's attempts are taken back, and why, if it is absent.
    pub fn get(&self, handler: HandlerId) -> Option<(Timestamp, String)> {
        self.until.get(&handler).cloned()
    }

    pub fn next_wake(&self) -> Option<Timestamp> {
        self.order.first().map(|(at, _)| *at)
    }

    /// The next handler whose time is up at `now`, with the reason to give.
    pub fn pop_due(&mut self, now: Timestamp) -> Option<(HandlerId, String)> {
        let &(at, handler) = self.order.first().filter(|(at, _)| *at <= now)?;
        self.order.remove(&(at, handler));
        let (_, reason) = self.until.remove(&handler)?;
        Some((handler, reason))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{JobId, TaskIdx};

    fn task(i: u32) -> TaskRef {
        TaskRef { job: JobId::from_bytes([3; 16]), idx: TaskIdx(i) }
    }

    fn held(attempt: u32, resource: Option<&str>, deadline: Option<i64>) -> Held {
        Held {
            attempt,
            handler: HandlerId(uuid::Uuid::from_bytes([1; 16])),
            job_type: Arc::from("vacuum"),
            resource: resource.map(String::from),
            deadline: deadline.map(Timestamp),
            own_timeout: false,
        }
    }

    #[test]
    fn removing_an_attempt_releases_its_lock_and_its_deadline() {
        let mut table = HeldTable::default();
        table.insert(task(1), held(1, Some("volume:7"), Some(500)));
        table.insert(task(2), held(1, None, Some(300)));
        assert!(table.locks("volume:7"));
        assert_eq!(table.next_deadline(), Some(Timestamp(300)));
        assert_eq!(table.due(Timestamp(299)), None);
        assert_eq!(table.due(Timestamp(300)), Some((Timestamp(300), task(2), 1)));
        assert!(table.remove(task(1)).is_some());
        assert!(!table.locks("volume:7"));
        table.remove(task(2));
        assert_eq!(table.next_deadline(), None);
        assert!(table.is_empty());
    }

    #[test]
    fn a_new_attempt_replaces_the_old_one() {
        let mut table = HeldTable::default();
        table.insert(task(1), held(1, Some("volume:7"), Some(500)));
        table.insert(task(1), held(2, Some("volume:7"), Some(900)));
        assert_eq!(table.len(), 1);
        assert_eq!(table.next_deadline(), Some(Timestamp(900)));
        table.set_deadline(task(1), None);
        assert_eq!(table.next_deadline(), None);
        table.remove(task(1));
        assert!(!table.locks("volume:7"));
    }

    #[test]
    fn absent_handlers_come_due_in_order() {
        let mut absent = Absent::default();
        let (a, b) = (HandlerId(uuid::Uuid::from_bytes([1; 16])), HandlerId(uuid::Uuid::from_bytes([2; 16])));
        absent.insert(a, Timestamp(200), "a".into());
        absent.insert(b, Timestamp(100), "b".into());
        assert_eq!(absent.next_wake(), Some(Timestamp(100)));
        absent.remove(b);
        assert_eq!(absent.pop_due(Timestamp(150)), None);
        assert_eq!(absent.pop_due(Timestamp(200)), Some((a, "a".into())));
        assert_eq!(absent.next_wake(), None);
    }
}
