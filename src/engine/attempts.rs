//! The ledger of every attempt this instance knows, and the one way an
//! attempt ends.
//!
//! An attempt is known here in one of two ways: it is **held** (of a job led
//! here, run by a handler connected here or lent to another instance's
//! handler, or waiting for an absent handler to come back), or it is
//! **borrowed** (of a job another instance leads, run by a handler here
//! until its report is settled with that leader). A held attempt locks its
//! volume and has its deadline; an absent handler's attempts are taken back
//! when its time is up, not before another instance's vouch for it runs
//! out. `Ledger::end` is the one place either kind stops being known: it
//! forgets the attempt with its lock and deadline and says what it released
//! (the slot to free, and how long its volume stays locked after a failure).

use std::collections::hash_map::Entry;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use foldhash::{HashMap, HashSet};

use crate::clock::Timestamp;
use crate::model::{AttemptId, HandlerId, JobId, TaskRef};

/// A held attempt: of a job led here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Held {
    pub attempt: u32,
    pub handler: HandlerId,
    pub job_type: Arc<str>,
    /// The resource (volume) the attempt locks while it runs.
    pub resource: Option<String>,
    /// When the attempt times out, and by whose timeout.
    pub deadline: Deadline,
}

/// When a held attempt times out: by its task's own timeout, or by its
/// type's, which a policy change moves (or takes away).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Deadline {
    Own(Timestamp),
    OfType(Option<Timestamp>),
}

impl Deadline {
    pub(super) fn at(self) -> Option<Timestamp> {
        match self {
            Deadline::Own(at) => Some(at),
            Deadline::OfType(at) => at,
        }
    }
}

/// A borrowed attempt: of a job another instance leads, run by a handler here.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Borrowed {
    attempt: u32,
    handler: HandlerId,
    job_type: Arc<str>,
}

/// How an attempt ended, as far as what it holds is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Ending {
    /// It succeeded: its volume is free at once.
    Succeeded,
    /// It failed, timed out, was canceled or lost: a worker that undoes its
    /// work on its own may still run, so its volume stays locked for its
    /// type's rollback window.
    Unsuccessful,
    /// A borrowed attempt's report was settled with its leader (or its job
    /// is led here now).
    Settled,
}

/// What an attempt's end released.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Ended {
    /// The handler whose slot of `job_type` is free again.
    pub handler: HandlerId,
    pub job_type: Arc<str>,
    /// The volume that stays locked, and until when (a failure of a type
    /// with a rollback window).
    pub cooling: Option<(String, Timestamp)>,
}

/// Every attempt this instance knows, with what each implies.
#[derive(Default)]
pub(super) struct Ledger {
    held: HashMap<TaskRef, Held>,
    deadlines: BTreeSet<(Timestamp, TaskRef, u32)>,
    locks: HashMap<String, (TaskRef, u32)>,
    borrowed: HashMap<TaskRef, Borrowed>,
    /// Handlers that hold attempts while disconnected: when their attempts
    /// are taken back, and why.
    absent: HashMap<HandlerId, (Timestamp, String)>,
    take_backs: BTreeSet<(Timestamp, HandlerId)>,
    /// Handlers whose attempts another instance vouched for (it renews
    /// their lease): none of them is taken back before this.
    vouched: HashMap<HandlerId, Timestamp>,
    /// Volumes an attempt that ended without success keeps locked until then.
    cooling: HashMap<String, Timestamp>,
    /// How long a failed attempt of each job type keeps its volume locked.
    rollback_windows: std::collections::HashMap<String, Duration>,
}

impl Ledger {
    pub(super) fn new(rollback_windows: std::collections::HashMap<String, Duration>) -> Ledger {
        Ledger { rollback_windows, ..Ledger::default() }
    }

    /// The attempt is held: its lock and deadline with it. A new attempt of
    /// the same task replaces the old one.
    pub(super) fn hold(&mut self, task: TaskRef, held: Held) {
        self.forget_held(task);
        if let Some(at) = held.deadline.at() {
            self.deadlines.insert((at, task, held.attempt));
        }
        if let Some(key) = &held.resource {
            self.locks.insert(key.clone(), (task, held.attempt));
        }
        self.held.insert(task, held);
    }

    /// Another instance lent the attempt to `handler` here.
    pub(super) fn borrow(&mut self, attempt: AttemptId, handler: HandlerId, job_type: Arc<str>) {
        self.borrowed.insert(attempt.task, Borrowed { attempt: attempt.number, handler, job_type });
    }

    /// The one way an attempt stops being known, however it ended: it is
    /// forgotten with its lock and deadline, and what it released is
    /// returned. `None` when this attempt (task and number) is not known.
    pub(super) fn end(&mut self, attempt: AttemptId, ending: Ending, now: Timestamp) -> Option<Ended> {
        if ending == Ending::Settled {
            let borrowed = self.borrowed.get(&attempt.task).filter(|b| b.attempt == attempt.number)?;
            let ended = Ended { handler: borrowed.handler, job_type: borrowed.job_type.clone(), cooling: None };
            self.borrowed.remove(&attempt.task);
            return Some(ended);
        }
        let Entry::Occupied(entry) = self.held.entry(attempt.task) else { return None };
        if entry.get().attempt != attempt.number {
            return None;
        }
        let held = entry.remove();
        self.unlock(attempt.task, &held);
        let window = self.rollback_windows.get(&*held.job_type).filter(|_| ending == Ending::Unsuccessful);
        let cooling = window.zip(held.resource).map(|(window, key)| {
            let until = now.plus_millis(window.as_millis() as i64);
            let kept = self.cooling.entry(key.clone()).or_insert(until);
            *kept = (*kept).max(until);
            (key, *kept)
        });
        Some(Ended { handler: held.handler, job_type: held.job_type, cooling })
    }

    fn forget_held(&mut self, task: TaskRef) {
        if let Some(held) = self.held.remove(&task) {
            self.unlock(task, &held);
        }
    }

    /// Releases what a held attempt implied: its deadline and its lock.
    fn unlock(&mut self, task: TaskRef, held: &Held) {
        if let Some(at) = held.deadline.at() {
            self.deadlines.remove(&(at, task, held.attempt));
        }
        if let Some(key) = &held.resource {
            if self.locks.get(key) == Some(&(task, held.attempt)) {
                self.locks.remove(key);
            }
        }
    }

    pub(super) fn get(&self, task: TaskRef) -> Option<&Held> {
        self.held.get(&task)
    }

    /// Whether `handler` holds this attempt here.
    pub(super) fn holds(&self, handler: HandlerId, attempt: AttemptId) -> bool {
        self.held.get(&attempt.task).is_some_and(|h| h.handler == handler && h.attempt == attempt.number)
    }

    pub(super) fn len(&self) -> usize {
        self.held.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Every held attempt.
    pub(super) fn iter(&self) -> impl Iterator<Item = (&TaskRef, &Held)> {
        self.held.iter()
    }

    /// Every held attempt `handler` holds, in task order.
    pub(super) fn of_handler(&self, handler: HandlerId) -> Vec<AttemptId> {
        let mut attempts: Vec<AttemptId> = self
            .held
            .iter()
            .filter(|(_, h)| h.handler == handler)
            .map(|(task, h)| AttemptId::new(*task, h.attempt))
            .collect();
        attempts.sort_by_key(|a| a.task);
        attempts
    }

    /// Every held attempt of `job_type`, in task order.
    pub(super) fn of_type(&self, job_type: &str) -> Vec<AttemptId> {
        let mut attempts: Vec<AttemptId> = self
            .held
            .iter()
            .filter(|(_, h)| &*h.job_type == job_type)
            .map(|(task, h)| AttemptId::new(*task, h.attempt))
            .collect();
        attempts.sort_by_key(|a| a.task);
        attempts
    }

    /// Whether an attempt of `job_type` is held.
    pub(super) fn runs_of_type(&self, job_type: &str) -> bool {
        self.held.values().any(|h| &*h.job_type == job_type)
    }

    /// Every handler that holds an attempt.
    pub(super) fn handlers(&self) -> BTreeSet<HandlerId> {
        self.held.values().map(|h| h.handler).collect()
    }

    /// Jobs with at least one held attempt.
    pub(super) fn jobs(&self) -> HashSet<JobId> {
        self.held.keys().map(|task| task.job).collect()
    }

    /// Borrowed attempts of these jobs.
    pub(super) fn borrowed_of(&self, jobs: &HashSet<JobId>) -> Vec<AttemptId> {
        self.borrowed
            .iter()
            .filter(|(task, _)| jobs.contains(&task.job))
            .map(|(task, b)| AttemptId::new(*task, b.attempt))
            .collect()
    }

    /// Every held attempt of `job_type` whose deadline comes from the type's policy.
    pub(super) fn of_type_without_own_timeout(&self, job_type: &str) -> Vec<TaskRef> {
        let of_type = |h: &Held| matches!(h.deadline, Deadline::OfType(_)) && &*h.job_type == job_type;
        self.held.iter().filter(|(_, h)| of_type(h)).map(|(t, _)| *t).collect()
    }

    /// Moves a held attempt's deadline (or removes it).
    pub(super) fn set_deadline(&mut self, task: TaskRef, deadline: Deadline) {
        let Some(held) = self.held.get_mut(&task) else { return };
        if let Some(at) = held.deadline.at() {
            self.deadlines.remove(&(at, task, held.attempt));
        }
        held.deadline = deadline;
        if let Some(at) = deadline.at() {
            self.deadlines.insert((at, task, held.attempt));
        }
    }

    /// The next held attempt whose deadline has passed at `now`, if any.
    pub(super) fn overdue(&self, now: Timestamp) -> Option<(Timestamp, AttemptId)> {
        let (at, task, attempt) = self.deadlines.first().copied().filter(|(at, _, _)| *at <= now)?;
        Some((at, AttemptId::new(task, attempt)))
    }

    /// Whether a held attempt locks the volume, or one that failed keeps it
    /// locked at `now`.
    pub(super) fn locked(&self, resource: &str, now: Timestamp) -> bool {
        self.locks.contains_key(resource) || self.cooling.get(resource).is_some_and(|until| *until > now)
    }

    /// Every volume locked here: by a held attempt or cooling after a failure.
    pub(super) fn locked_resources(&self) -> impl Iterator<Item = &String> {
        self.locks.keys().chain(self.cooling.keys())
    }

    /// Volumes whose cooling is over at `now`: forgotten, and returned.
    pub(super) fn cooled(&mut self, now: Timestamp) -> Vec<String> {
        let done: Vec<String> =
            self.cooling.iter().filter(|(_, until)| **until <= now).map(|(k, _)| k.clone()).collect();
        for key in &done {
            self.cooling.remove(key);
        }
        done
    }

    /// A cooling volume the store kept across a restart.
    pub(super) fn keep_cooling(&mut self, resource: String, until: Timestamp) {
        self.cooling.insert(resource, until);
    }

    /// The handler went away holding attempts: they are taken back at
    /// `until` unless it comes back (never before a vouch runs out).
    pub(super) fn away(&mut self, handler: HandlerId, until: Timestamp, reason: String) {
        let until = self.not_before(handler, until);
        self.back(handler);
        self.take_backs.insert((until, handler));
        self.absent.insert(handler, (until, reason));
    }

    /// The handler is back (here or on another live instance), or gone for good.
    pub(super) fn back(&mut self, handler: HandlerId) {
        if let Some((at, _)) = self.absent.remove(&handler) {
            self.take_backs.remove(&(at, handler));
        }
    }

    pub(super) fn is_away(&self, handler: HandlerId) -> bool {
        self.absent.contains_key(&handler)
    }

    /// Every handler away now.
    pub(super) fn away_handlers(&self) -> impl Iterator<Item = HandlerId> + '_ {
        self.absent.keys().copied()
    }

    /// The next handler whose time away is up at `now`, with the reason to give.
    pub(super) fn due_back(&mut self, now: Timestamp) -> Option<(HandlerId, String)> {
        let &(at, handler) = self.take_backs.first().filter(|(at, _)| *at <= now)?;
        self.take_backs.remove(&(at, handler));
        let (_, reason) = self.absent.remove(&handler)?;
        Some((handler, reason))
    }

    /// Another instance renews the lease of `handler` until `until`: none
    /// of its attempts is taken back before then, even one counting down.
    pub(super) fn vouch(&mut self, handler: HandlerId, until: Timestamp, now: Timestamp) {
        self.vouched.retain(|_, at| *at > now);
        let floor = self.vouched.entry(handler).or_insert(until);
        *floor = (*floor).max(until);
        if let Some((at, reason)) = self.absent.get(&handler).cloned() {
            if at < until {
                self.away(handler, until, reason);
            }
        }
    }

    /// When a handler's attempts may be taken back, from `at`: not before
    /// another instance's vouch for them runs out.
    fn not_before(&self, handler: HandlerId, at: Timestamp) -> Timestamp {
        self.vouched.get(&handler).map_or(at, |floor| at.max(*floor))
    }

    /// Handlers another instance vouched for that are still within it at `now`.
    pub(super) fn vouched(&self, now: Timestamp) -> impl Iterator<Item = HandlerId> + '_ {
        self.vouched.iter().filter(move |(_, until)| **until > now).map(|(handler, _)| *handler)
    }

    /// When the next deadline, take-back or cooling falls.
    pub(super) fn next_wake(&self) -> Option<Timestamp> {
        let deadline = self.deadlines.first().map(|(at, _, _)| *at);
        let take_back = self.take_backs.first().map(|(at, _)| *at);
        let cooled = self.cooling.values().min().copied();
        [deadline, take_back, cooled].into_iter().flatten().min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::TaskIdx;

    fn task(i: u32) -> TaskRef {
        TaskRef { job: JobId::from_bytes([3; 16]), idx: TaskIdx(i) }
    }

    fn handler(byte: u8) -> HandlerId {
        HandlerId(uuid::Uuid::from_bytes([byte; 16]))
    }

    fn held(attempt: u32, resource: Option<&str>, deadline: Option<i64>) -> Held {
        Held {
            attempt,
            handler: handler(1),
            job_type: Arc::from("vacuum"),
            resource: resource.map(String::from),
            deadline: Deadline::OfType(deadline.map(Timestamp)),
        }
    }

    #[test]
    fn ending_an_attempt_releases_its_lock_its_deadline_and_its_slot() {
        let mut ledger = Ledger::default();
        ledger.hold(task(1), held(1, Some("volume:7"), Some(500)));
        ledger.hold(task(2), held(1, None, Some(300)));
        assert!(ledger.locked("volume:7", Timestamp(0)));
        assert_eq!(ledger.next_wake(), Some(Timestamp(300)));
        assert_eq!(ledger.overdue(Timestamp(299)), None);
        assert_eq!(ledger.overdue(Timestamp(300)), Some((Timestamp(300), AttemptId::new(task(2), 1))));
        let ended = ledger.end(AttemptId::new(task(1), 1), Ending::Succeeded, Timestamp(10));
        assert_eq!(ended, Some(Ended { handler: handler(1), job_type: Arc::from("vacuum"), cooling: None }));
        assert!(!ledger.locked("volume:7", Timestamp(10)));
        ledger.end(AttemptId::new(task(2), 1), Ending::Unsuccessful, Timestamp(10));
        assert_eq!(ledger.next_wake(), None);
        assert!(ledger.is_empty());
    }

    #[test]
    fn an_attempt_ends_once_and_only_by_its_own_number() {
        let mut ledger = Ledger::default();
        ledger.hold(task(1), held(2, Some("volume:7"), Some(500)));
        assert_eq!(ledger.end(AttemptId::new(task(1), 1), Ending::Unsuccessful, Timestamp(0)), None);
        assert!(ledger.holds(handler(1), AttemptId::new(task(1), 2)));
        assert!(ledger.end(AttemptId::new(task(1), 2), Ending::Unsuccessful, Timestamp(0)).is_some());
        assert_eq!(ledger.end(AttemptId::new(task(1), 2), Ending::Unsuccessful, Timestamp(0)), None);
        // A held attempt is not settled as a borrowed one.
        ledger.hold(task(1), held(3, None, None));
        assert_eq!(ledger.end(AttemptId::new(task(1), 3), Ending::Settled, Timestamp(0)), None);
        assert_eq!(ledger.len(), 1);
    }

    #[test]
    fn a_new_attempt_replaces_the_old_one() {
        let mut ledger = Ledger::default();
        ledger.hold(task(1), held(1, Some("volume:7"), Some(500)));
        ledger.hold(task(1), held(2, Some("volume:7"), Some(900)));
        assert_eq!(ledger.len(), 1);
        assert_eq!(ledger.next_wake(), Some(Timestamp(900)));
        ledger.set_deadline(task(1), Deadline::OfType(None));
        assert_eq!(ledger.next_wake(), None);
        ledger.end(AttemptId::new(task(1), 2), Ending::Succeeded, Timestamp(0));
        assert!(!ledger.locked("volume:7", Timestamp(0)));
    }

    #[test]
    fn a_failure_keeps_its_volume_locked_for_its_types_rollback_window() {
        let mut ledger =
            Ledger::new(std::collections::HashMap::from([("vacuum".to_string(), Duration::from_millis(100))]));
        ledger.hold(task(1), held(1, Some("volume:7"), None));
        let ended = ledger.end(AttemptId::new(task(1), 1), Ending::Unsuccessful, Timestamp(1000)).unwrap();
        assert_eq!(ended.cooling, Some(("volume:7".to_string(), Timestamp(1100))));
        assert!(ledger.locked("volume:7", Timestamp(1099)));
        assert!(!ledger.locked("volume:7", Timestamp(1100)));
        assert_eq!(ledger.next_wake(), Some(Timestamp(1100)));
        assert_eq!(ledger.cooled(Timestamp(1099)), Vec::<String>::new());
        assert_eq!(ledger.cooled(Timestamp(1100)), vec!["volume:7".to_string()]);
        // A success keeps nothing locked.
        ledger.hold(task(2), held(1, Some("volume:8"), None));
        let ended = ledger.end(AttemptId::new(task(2), 1), Ending::Succeeded, Timestamp(1000)).unwrap();
        assert_eq!(ended.cooling, None);
        assert_eq!(ledger.locked_resources().count(), 0);
    }

    #[test]
    fn a_borrowed_attempt_ends_when_settled() {
        let mut ledger = Ledger::default();
        let attempt = AttemptId::new(task(4), 2);
        ledger.borrow(attempt, handler(2), Arc::from("balance"));
        assert_eq!(ledger.borrowed_of(&HashSet::from_iter([task(4).job])), vec![attempt]);
        assert!(!ledger.holds(handler(2), attempt), "borrowed is not held");
        assert_eq!(ledger.end(AttemptId::new(task(4), 1), Ending::Settled, Timestamp(0)), None);
        let ended = ledger.end(attempt, Ending::Settled, Timestamp(0));
        assert_eq!(ended, Some(Ended { handler: handler(2), job_type: Arc::from("balance"), cooling: None }));
        assert!(ledger.borrowed_of(&HashSet::from_iter([task(4).job])).is_empty());
    }

    #[test]
    fn absent_handlers_come_due_in_order_and_not_before_a_vouch() {
        let mut ledger = Ledger::default();
        let (a, b) = (handler(1), handler(2));
        ledger.away(a, Timestamp(200), "a".into());
        ledger.away(b, Timestamp(100), "b".into());
        assert_eq!(ledger.next_wake(), Some(Timestamp(100)));
        ledger.back(b);
        assert!(!ledger.is_away(b));
        assert_eq!(ledger.due_back(Timestamp(150)), None);
        // A vouch until 300 moves a's take-back there.
        ledger.vouch(a, Timestamp(300), Timestamp(150));
        assert_eq!(ledger.due_back(Timestamp(250)), None);
        assert_eq!(ledger.due_back(Timestamp(300)), Some((a, "a".into())));
        assert_eq!(ledger.next_wake(), None);
        assert_eq!(ledger.vouched(Timestamp(299)).collect::<Vec<_>>(), vec![a]);
        // Going away again within the vouch waits for it.
        ledger.away(a, Timestamp(200), "again".into());
        assert_eq!(ledger.due_back(Timestamp(299)), None);
    }
}
