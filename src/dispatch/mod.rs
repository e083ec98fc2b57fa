//! Who runs what: the ready queues (one per job type, so types never block
//! each other), delayed retries, and the handlers with their free slots.
//! A pure table: the engine asks it and applies its answers.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::sync::Arc;

use foldhash::HashMap;
use tokio::sync::mpsc::UnboundedSender;

use crate::clock::Timestamp;
pub use crate::model::Place;
use crate::model::{AttemptId, HandlerId, JobId, Priority, TaskRef};
use crate::rate::{Bucket, Rate};

mod open;

/// A unit of work sent to a handler.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WorkOrder {
    Execute(Assignment),
    /// Stop the attempt; the handler answers with a `canceled` outcome.
    Cancel {
        attempt: AttemptId,
    },
}

/// Everything a handler needs to execute one attempt of a task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assignment {
    pub attempt: AttemptId,
    pub job_name: String,
    pub task_id: Box<str>,
    pub job_type: Arc<str>,
    pub parameters: Box<str>,
    pub labels: BTreeMap<String, String>,
    pub priority: Priority,
    pub execution_timeout_seconds: Option<u64>,
    /// When the completion that released this task reached the server.
    pub released_at: Option<std::time::Instant>,
    /// The gRPC address of the instance that leads the job, when another
    /// instance lent this attempt: reports on it go there.
    pub lent_by: Option<Arc<str>>,
    /// The W3C `traceparent` of the attempt's span, when traces are
    /// exported: set by the committer as the order leaves.
    pub traceparent: Option<Box<str>>,
    /// Its share of the bandwidth budget, in bytes per second, when its job
    /// type shares one: its handler gets it as the parameter
    /// `io_byte_per_second` (`budget::PARAMETER`).
    pub io_byte_per_second: Option<u64>,
}

pub type Sink = UnboundedSender<WorkOrder>;

/// What a handler declares when it joins.
#[derive(Clone, Debug)]
pub struct HandlerSpec {
    pub handler: HandlerId,
    /// The job types it executes; `None` for any.
    pub job_types: Option<Vec<Arc<str>>>,
    /// Attempts it runs at once, over all job types.
    pub capacity: u32,
    /// Attempts of one job type it runs at once (its declared maximum);
    /// a type not listed is bounded by `capacity` only.
    pub type_capacity: BTreeMap<Arc<str>, u32>,
    /// It starts an attempt as soon as it gets it (no separate start report).
    pub starts_running: bool,
    /// Which connection of the handler this is; a later one replaces it.
    pub session: u64,
    pub sink: Sink,
    /// Where it runs, to prefer it for work on its own host or rack.
    pub place: Place,
}

/// How long a handler held a slot for a job type lately: a moving average
/// over its successful attempts (`record_duration`), and when the last one
/// ended.
#[derive(Clone, Copy, Debug)]
struct Speed {
    millis: f64,
    at: Timestamp,
}

/// Attempts of a job type started here, this second and the one before.
#[derive(Clone, Copy, Debug, Default)]
struct Pace {
    second: i64,
    this: u32,
    before: u32,
}

impl Pace {
    fn start(&mut self, now: Timestamp) {
        let second = now.as_millis().div_euclid(1000);
        if second != self.second {
            self.before = if second == self.second + 1 { self.this } else { 0 };
            self.this = 0;
            self.second = second;
        }
        self.this += 1;
    }

    /// Attempts started a second lately: the whole second before this one,
    /// or this one so far if more.
    fn per_second(&self, now: Timestamp) -> u32 {
        match now.as_millis().div_euclid(1000) - self.second {
            0 => self.this.max(self.before),
            1 => self.this,
            _ => 0,
        }
    }
}

/// How many times the pace its attempts start at the handlers here must
/// reach for a job type to keep its tasks here rather than lend them.
const HEADROOM: f64 = 2.0;

/// Durations older than this are forgotten: the handler is tried afresh.
const RECENT_MS: i64 = 10 * 60 * 1000;
/// Handlers whose recent duration is within this factor of the best, or
/// within `AS_FAST_MS` of it, count as equally fast; load and nearness
/// decide between them. (For tasks of a few milliseconds the difference is
/// the noise of the round trip, and spreading them is worth more.)
const AS_FAST: f64 = 1.25;
const AS_FAST_MS: f64 = 20.0;
/// A pick looks at this many of the least loaded handlers with a slot free
/// for the task's type, beside those that take any type and this many on
/// the task's host or in its rack.
const LOOK: usize = 32;

/// Free slots of one handler, for work led by another instance: the slots
/// it may take now over all job types, and by each type it executes that
/// has nothing queued here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FreeSlots {
    pub handler: HandlerId,
    pub total: u32,
    pub job_types: Vec<(Arc<str>, u32)>,
}

/// The job type under which slots reserved for borrowing are held.
const RESERVED: &str = "\u{0}reserved";

/// Dispatch limits of one job type, from its policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TypeLimits {
    /// Attempts of this type running at once, over every handler.
    pub global: u32,
    /// Attempts of this type one handler runs at once.
    pub per_worker: u32,
    /// How long an attempt of this type may run when its task sets no limit.
    pub execution_timeout_seconds: Option<u64>,
    /// Attempts of this type started per minute, over every handler.
    pub rate: Option<Rate>,
}

struct Slot {
    spec: HandlerSpec,
    /// The slot total the handler last reported, when it reports one.
    reported_total: Option<u32>,
    /// Attempts it runs that this instance does not hold (jobs led by
    /// another instance, from before the worker moved here): they take
    /// slots all the same.
    elsewhere: u32,
}

/// Attempts one handler holds, by job type: kept while the handler is
/// disconnected, so that it finds its slots taken when it comes back.
#[derive(Default)]
struct HeldSlots {
    total: u32,
    by_type: BTreeMap<Arc<str>, u32>,
}

impl Slot {
    fn accepts(&self, job_type: &str) -> bool {
        self.spec.job_types.as_ref().is_none_or(|types| types.iter().any(|t| &**t == job_type))
    }

    /// Attempts it runs at once: as declared, or as it last reported if fewer.
    fn capacity(&self) -> u32 {
        self.spec.capacity.min(self.reported_total.unwrap_or(u32::MAX))
    }

    fn free(&self, held: Option<&HeldSlots>) -> u32 {
        self.capacity().saturating_sub(held.map_or(0, |h| h.total)).saturating_sub(self.elsewhere)
    }

    fn free_for(&self, job_type: &str, per_worker: u32, held: Option<&HeldSlots>) -> u32 {
        let cap = self.spec.type_capacity.get(job_type).copied().unwrap_or(u32::MAX).min(per_worker);
        let used = held.and_then(|h| h.by_type.get(job_type)).copied().unwrap_or(0);
        cap.saturating_sub(used).min(self.free(held))
    }
}

/// A handler's load: the attempts it holds per thousand of its slots.
fn load(held: Option<&HeldSlots>, slot: &Slot) -> u64 {
    u64::from(held.map_or(0, |h| h.total)) * 1000 / u64::from(slot.capacity().max(1))
}

/// A ready task in its type's queue, ranked by when it became ready less
/// its priority's head start (`Aging`): each level above another counts
/// as having waited one aging period longer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Queued {
    rank: i64,
    seq: u64,
    pub task: TaskRef,
    pub priority: Priority,
}

impl Ord for Queued {
    /// The lowest rank first, then first in first out.
    fn cmp(&self, other: &Queued) -> Ordering {
        other.rank.cmp(&self.rank).then_with(|| other.seq.cmp(&self.seq))
    }
}

impl PartialOrd for Queued {
    fn partial_cmp(&self, other: &Queued) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// How long a wait makes up for one level of priority: a ready task is
/// never passed by one that became ready more than (their difference in
/// levels) × this after it, so a low priority waits a bounded time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Aging(pub i64);

impl Default for Aging {
    fn default() -> Aging {
        Aging(10 * 60 * 1000)
    }
}

impl Aging {
    fn rank(self, ready_at: Timestamp, priority: Priority) -> i64 {
        ready_at.as_millis() - level(priority) * self.0
    }
}

fn level(priority: Priority) -> i64 {
    match priority {
        Priority::Low => 0,
        Priority::Normal => 1,
        Priority::High => 2,
        Priority::Critical => 3,
    }
}

/// What an instance's queues and held attempts ask of the cluster's
/// permits: each limited job type, and each resource (volume) its ready
/// tasks need or its held attempts lock (true when one is held).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Demand {
    pub types: Vec<TypeDemand>,
    pub resources: std::collections::BTreeMap<String, bool>,
    /// What it asks of the bandwidth budget's permits.
    pub(crate) budget: Vec<crate::budget::Ask>,
}

/// A job type's global limit, its tasks queued and its attempts running.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TypeDemand {
    pub job_type: Arc<str>,
    pub limit: u32,
    pub queued: u32,
    pub running: u32,
}

#[derive(Default)]
pub struct Dispatch {
    handlers: BTreeMap<HandlerId, Slot>,
    queues: BTreeMap<Arc<str>, BinaryHeap<Queued>>,
    aging: Aging,
    /// Job types with a rate limit: their tokens.
    buckets: BTreeMap<Arc<str>, Bucket>,
    delayed: BTreeSet<(Timestamp, u64, TaskRef)>,
    delayed_meta: BTreeMap<u64, (Arc<str>, Priority)>,
    next_seq: u64,
    limits: BTreeMap<Arc<str>, TypeLimits>,
    /// Attempts held now by job type, over every handler, connected or not.
    running: BTreeMap<Arc<str>, u32>,
    held: BTreeMap<HandlerId, HeldSlots>,
    /// Every task in a queue or waiting there for its backoff.
    queued: foldhash::HashSet<TaskRef>,
    /// Job types that run only while the gate is open (the cluster lock is held).
    gated: std::collections::HashSet<Arc<str>>,
    gate_open: bool,
    /// In a cluster: the slots of each job type's global limit this
    /// instance holds (permits); a type not listed has none.
    permits: Option<HashMap<Arc<str>, u32>>,
    /// Each handler's recent duration by job type (kept across reconnects).
    speeds: HashMap<HandlerId, BTreeMap<Arc<str>, Speed>>,
    /// Attempts started by job type, here or lent.
    paces: BTreeMap<Arc<str>, Pace>,
    /// Job types outside their maintenance window: none is dispatched.
    closed: std::collections::HashSet<Arc<str>>,
    /// Who a pick looks at, kept as each handler's free slots change, once
    /// there are more handlers than a pick looks at; `None` while a pick
    /// looks at every handler, which costs less than keeping it.
    open: Option<open::Open>,
    /// From how many handlers `open` is kept: `LOOK` but in tests.
    index_from: Option<usize>,
}

impl Dispatch {
    /// Adds a handler, or replaces its session; the attempts it already
    /// holds (kept across a disconnect or a restart) occupy its slots.
    pub fn add_handler(&mut self, spec: HandlerSpec) {
        let handler = spec.handler;
        let before = self.handlers.remove(&handler);
        if let Some(open) = &mut self.open {
            if let Some(before) = &before {
                open.leave(handler, &before.spec.place);
            }
            open.join(handler, &spec.place, spec.job_types.is_none());
        }
        self.handlers.insert(handler, Slot { spec, reported_total: None, elsewhere: 0 });
        self.restand(handler);
        self.reindex();
    }

    /// Keeps `open` from more handlers than `index_from` on, and drops it
    /// once they are half as many again.
    fn reindex(&mut self) {
        let (n, from) = (self.handlers.len(), self.index_from.unwrap_or(LOOK));
        match &self.open {
            None if n > from => {
                let mut open = open::Open::default();
                for (id, slot) in &self.handlers {
                    open.join(*id, &slot.spec.place, slot.spec.job_types.is_none());
                }
                self.open = Some(open);
                let ids: Vec<HandlerId> = self.handlers.keys().copied().collect();
                for id in ids {
                    self.restand(id);
                }
            }
            Some(_) if n <= from / 2 => self.open = None,
            _ => {}
        }
    }

    /// The handler's own count of its slots, from its heartbeat.
    pub fn report_slots(&mut self, handler: HandlerId, total: u32) {
        if let Some(slot) = self.handlers.get_mut(&handler) {
            slot.reported_total = Some(total);
            self.restand(handler);
        }
    }

    /// How many attempts the handler runs that this instance does not hold.
    pub fn report_elsewhere(&mut self, handler: HandlerId, running: u32) {
        if let Some(slot) = self.handlers.get_mut(&handler) {
            slot.elsewhere = running;
            self.restand(handler);
        }
    }

    /// Puts a handler where it now stands among those a pick looks at:
    /// called whenever its slots, what it holds or its types' limits change.
    fn restand(&mut self, handler: HandlerId) {
        let Dispatch { handlers, held, limits, open: Some(open), .. } = self else { return };
        let Some((slot, types)) = handlers.get(&handler).and_then(|s| Some((s, s.spec.job_types.as_ref()?))) else {
            return open.stand(handler, 0, std::iter::empty());
        };
        let held = held.get(&handler);
        let load = load(held, slot);
        let free = types.iter().map(|t| {
            let per_worker = limits.get(t).map_or(u32::MAX, |l| l.per_worker);
            (t.clone(), slot.free_for(t, per_worker, held))
        });
        open.stand(handler, load, free);
    }

    pub fn set_limits(&mut self, job_type: Arc<str>, limits: TypeLimits, now: Timestamp) {
        let per_worker = self.limits.insert(job_type.clone(), limits).map(|l| l.per_worker);
        self.rebucket(&job_type, now);
        if self.open.is_some() && per_worker != Some(limits.per_worker) {
            let declaring: Vec<HandlerId> = self
                .handlers
                .iter()
                .filter(|(_, slot)| slot.spec.job_types.as_ref().is_some_and(|types| types.contains(&job_type)))
                .map(|(id, _)| *id)
                .collect();
            for handler in declaring {
                self.restand(handler);
            }
        }
    }

    /// The bucket of a type's rate, or of the part of it this instance
    /// uses in a cluster (as its permits are of the type's global limit).
    fn rebucket(&mut self, job_type: &Arc<str>, now: Timestamp) {
        let Some(limits) = self.limits.get(job_type) else { return };
        let Some(rate) = limits.rate else {
            self.buckets.remove(job_type);
            return;
        };
        let rate = match &self.permits {
            Some(permits) => rate.share(permits.get(job_type).copied().unwrap_or(0), limits.global),
            None => rate,
        };
        match self.buckets.get_mut(job_type) {
            Some(bucket) if bucket.rate() == rate => {}
            Some(bucket) => bucket.set_rate(rate, now),
            None => {
                self.buckets.insert(job_type.clone(), Bucket::new(rate, now));
            }
        }
    }

    /// How long a wait makes up for one level of priority.
    pub fn set_aging(&mut self, aging: Aging) {
        self.aging = aging;
    }

    pub fn limits(&self, job_type: &str) -> Option<TypeLimits> {
        self.limits.get(job_type).copied()
    }

    /// In a cluster, the slots of each type's global limit held here: a
    /// type's tasks are dispatched only within them.
    pub fn set_permits(&mut self, permits: std::collections::HashMap<Arc<str>, u32>, now: Timestamp) {
        self.permits = Some(permits.into_iter().collect());
        let rated: Vec<Arc<str>> = self.buckets.keys().cloned().collect();
        for job_type in rated {
            self.rebucket(&job_type, now);
        }
    }

    /// What each job type with a global limit asks of it now. In a
    /// cluster, the slots held of each stop at what runs until the next
    /// `set_permits`: the settlement this demand is for may give the others
    /// back, and none of them may start an attempt meanwhile.
    pub fn demand(&mut self) -> Vec<TypeDemand> {
        let demand: Vec<TypeDemand> = self
            .limits
            .iter()
            .map(|(t, l)| TypeDemand {
                job_type: t.clone(),
                limit: l.global,
                queued: self.queues.get(t).map_or(0, |q| q.len() as u32),
                running: self.running(t),
            })
            .collect();
        if let Some(permits) = self.permits.as_mut() {
            for asked in &demand {
                if let Some(held) = permits.get_mut(&asked.job_type) {
                    *held = (*held).min(asked.running);
                }
            }
        }
        demand
    }

    /// Whether the type is at its global limit, past the slots of it held
    /// here, or out of tokens of its rate.
    fn at_limit(&self, job_type: &str, limits: Option<&TypeLimits>, now: Timestamp) -> bool {
        let Some(limits) = limits else { return false };
        let running = self.running(job_type);
        let held = self.permits.as_ref().map_or(u32::MAX, |p| p.get(job_type).copied().unwrap_or(0));
        running >= limits.global.min(held)
            || (limits.rate.is_some() && self.buckets.get(job_type).is_some_and(|b| !b.has_token(now)))
    }

    /// An attempt of the type started from its queue, here or lent: it
    /// spends a token of its rate and counts in its pace.
    pub fn started(&mut self, job_type: &Arc<str>, now: Timestamp) {
        if let Some(bucket) = self.buckets.get_mut(job_type) {
            bucket.spend(now);
        }
        match self.paces.get_mut(job_type) {
            Some(pace) => pace.start(now),
            None => self.paces.entry(job_type.clone()).or_default().start(now),
        }
    }

    /// Whether the handlers here turn their slots for a job type at least
    /// `HEADROOM` times as fast as its attempts started lately, so that the
    /// slots of another instance's workers would add the hop and no pace.
    /// A handler's pace is its slots for the type over its recent time
    /// holding one (`record_duration`), counting only the slots the type
    /// holds there or has free (not those other types hold); one not
    /// measured lately adds none, and nothing started lately tells nothing.
    pub fn keeps_pace(&self, job_type: &str, now: Timestamp) -> bool {
        let started = self.paces.get(job_type).map_or(0, |pace| pace.per_second(now));
        if started == 0 {
            return false;
        }
        let needed = HEADROOM * f64::from(started);
        let per_worker = self.limits.get(job_type).map_or(u32::MAX, |l| l.per_worker);
        let mut pace = 0.0;
        for (id, slot) in &self.handlers {
            if !slot.accepts(job_type) {
                continue;
            }
            let Some(millis) = self.recent(id, job_type, now) else { continue };
            // The slots the type has there: those it holds and those free for it.
            let held = self.held.get(id);
            let holds = held.and_then(|h| h.by_type.get(job_type)).copied().unwrap_or(0);
            let slots = slot.free_for(job_type, per_worker, held) + holds;
            // A slot turns at most once a millisecond, as time is measured here.
            pace += f64::from(slots) * 1000.0 / millis.max(1.0);
            if pace >= needed {
                return true;
            }
        }
        false
    }

    /// Attempts of a job type running now, over every handler.
    pub fn running(&self, job_type: &str) -> u32 {
        self.running.get(job_type).copied().unwrap_or(0)
    }

    /// Stops dispatching to a handler: its session ended (`session` names
    /// which one, so that a newer session of the same handler stays), or it
    /// is gone (`None`). The attempts it holds keep their slots until they end.
    pub fn remove_handler(&mut self, handler: HandlerId, session: Option<u64>) -> bool {
        match self.handlers.get(&handler) {
            Some(slot) if session.is_none_or(|s| s == slot.spec.session) => {
                let place = slot.spec.place.clone();
                self.handlers.remove(&handler);
                if let Some(open) = &mut self.open {
                    open.leave(handler, &place);
                }
                self.reindex();
                true
            }
            _ => false,
        }
    }

    /// The session a connected handler is in.
    pub fn session(&self, handler: HandlerId) -> Option<u64> {
        self.handlers.get(&handler).map(|s| s.spec.session)
    }

    pub fn handler_ids(&self) -> Vec<HandlerId> {
        self.handlers.keys().copied().collect()
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
        self.queued.insert(task);
        match not_before {
            Some(at) if at > now => {
                self.delayed.insert((at, seq, task));
                self.delayed_meta.insert(seq, (job_type, priority));
            }
            _ => {
                let rank = self.aging.rank(now, priority);
                self.queues.entry(job_type).or_default().push(Queued { rank, seq, task, priority });
            }
        }
    }

    /// Puts back a task taken from its queue that could not run (its volume
    /// is busy), where it was: it keeps its place and its wait.
    pub fn requeue(&mut self, job_type: Arc<str>, queued: Queued) {
        self.queued.insert(queued.task);
        self.queues.entry(job_type).or_default().push(queued);
    }

    /// A job's queued tasks take a new priority; each keeps its wait so far.
    pub fn reprioritize(&mut self, job: JobId, priority: Priority) {
        let aging = self.aging;
        for queue in self.queues.values_mut() {
            if !queue.iter().any(|q| q.task.job == job) {
                continue;
            }
            let mut entries = std::mem::take(queue).into_vec();
            for q in entries.iter_mut().filter(|q| q.task.job == job) {
                let ready_at = q.rank + level(q.priority) * aging.0;
                q.rank = aging.rank(Timestamp(ready_at), priority);
                q.priority = priority;
            }
            *queue = BinaryHeap::from(entries);
        }
        let delayed: Vec<u64> = self.delayed.iter().filter(|(_, _, t)| t.job == job).map(|(_, s, _)| *s).collect();
        for seq in delayed {
            if let Some((_, p)) = self.delayed_meta.get_mut(&seq) {
                *p = priority;
            }
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
                let rank = self.aging.rank(at, priority);
                self.queues.entry(job_type).or_default().push(Queued { rank, seq, task, priority });
            }
        }
    }

    /// When the earliest delayed task becomes due, or a rate-limited type
    /// with tasks queued has its next token.
    pub fn next_wake(&self, now: Timestamp) -> Option<Timestamp> {
        let tokens = self.buckets.iter().filter(|(t, _)| self.queues.get(*t).is_some_and(|q| !q.is_empty()));
        let tokens = tokens.filter_map(|(_, b)| b.next_token(now));
        self.delayed.first().map(|(at, _, _)| *at).into_iter().chain(tokens).min()
    }

    /// Of the given job types, the one whose next task goes first by rank;
    /// types with nothing queued are dropped from the list.
    pub fn first_of<T: AsRef<str>>(&self, types: &mut Vec<T>) -> Option<usize> {
        types.retain(|t| self.queues.get(t.as_ref()).is_some_and(|q| !q.is_empty()));
        (0..types.len()).max_by_key(|&i| self.queues[types[i].as_ref()].peek())
    }

    /// Job types with queued tasks.
    pub fn queued_types(&self) -> Vec<Arc<str>> {
        self.queues.iter().filter(|(_, q)| !q.is_empty()).map(|(t, _)| t.clone()).collect()
    }

    pub fn queued(&self) -> usize {
        self.queues.values().map(BinaryHeap::len).sum::<usize>() + self.delayed.len()
    }

    /// Job types that may be dispatched only while the gate is open.
    pub fn set_gate(&mut self, gated: Vec<Arc<str>>, open: bool) {
        self.gated = gated.into_iter().collect();
        self.gate_open = open;
    }

    /// Tasks of gated job types queued now.
    pub fn gated_queued(&self) -> usize {
        self.queues.iter().filter(|(t, _)| self.gated.contains(*t)).map(|(_, q)| q.len()).sum()
    }

    /// Attempts of gated job types running now.
    pub fn gated_running(&self) -> u32 {
        self.gated.iter().map(|t| self.running(t)).sum()
    }

    /// A successful attempt of `job_type` held a slot of `handler` for
    /// `millis`: from its assignment to its report, less the report's wait
    /// for the engine's loop where the server knows when it came.
    pub fn record_duration(&mut self, handler: HandlerId, job_type: &Arc<str>, millis: i64, now: Timestamp) {
        let millis = millis.max(0) as f64;
        // Each worker process has a handler of its own: forget those gone
        // for good, so the table stays as large as the workers there are.
        if self.speeds.len() > self.handlers.len() + 64 {
            let handlers = &self.handlers;
            self.speeds.retain(|h, speeds| {
                handlers.contains_key(h) || speeds.values().any(|s| now.as_millis() - s.at.as_millis() < RECENT_MS)
            });
        }
        let speeds = self.speeds.entry(handler).or_default();
        match speeds.get_mut(&**job_type) {
            Some(speed) if now.as_millis() - speed.at.as_millis() < RECENT_MS => {
                speed.millis = 0.7 * speed.millis + 0.3 * millis;
                speed.at = now;
            }
            _ => {
                speeds.insert(job_type.clone(), Speed { millis, at: now });
            }
        }
    }

    /// A handler's recent duration for a job type, if it has one.
    fn recent(&self, handler: &HandlerId, job_type: &str, now: Timestamp) -> Option<f64> {
        let speed = self.speeds.get(handler)?.get(job_type)?;
        (now.as_millis() - speed.at.as_millis() < RECENT_MS).then_some(speed.millis)
    }

    /// Which handler runs the next task of this job type, within the type's
    /// global and per-worker limits: among those with a free slot, the
    /// fastest lately for the type (a handler not measured lately counts as
    /// fast, so it is tried), then the least loaded, then the one nearest
    /// the task's data (`near`), then the one with most free slots. With
    /// more than `LOOK` handlers free for the type, it looks at the `LOOK`
    /// least loaded and at up to `LOOK` on the data's host or rack (and
    /// those that take any type): the fastest is the fastest of those.
    pub fn pick_handler(&self, job_type: &str, near: impl FnOnce() -> Place, now: Timestamp) -> Option<HandlerId> {
        if !self.gate_open && self.gated.contains(job_type) || self.is_closed(job_type) {
            return None;
        }
        let limits = self.limits.get(job_type);
        if self.at_limit(job_type, limits, now) {
            return None;
        }
        let per_worker = limits.map(|l| l.per_worker).unwrap_or(u32::MAX);
        let fits = |id: HandlerId| {
            let slot = self.handlers.get(&id).filter(|slot| slot.accepts(job_type))?;
            let free = slot.free_for(job_type, per_worker, self.held.get(&id));
            (free > 0).then_some((id, slot, free))
        };
        match &self.open {
            None => {
                self.pick_among(job_type, || self.handlers.keys().copied().filter_map(fits), |_| Vec::new(), near, now)
            }
            Some(open) => {
                let more = open.free_for(job_type) > LOOK;
                let least_loaded = || open.least_loaded(job_type).take(LOOK).chain(open.any()).filter_map(fits);
                let beside = |near: &Place| match more {
                    true => open.beside(near).filter_map(fits).take(LOOK).collect(),
                    false => Vec::new(),
                };
                self.pick_among(job_type, least_loaded, beside, near, now)
            }
        }
    }

    /// The pick among the handlers `looked` gives, and, when there is a
    /// choice, those `beside` the task's data gives.
    fn pick_among<'a, I>(
        &'a self,
        job_type: &str,
        looked: impl Fn() -> I,
        beside: impl FnOnce(&Place) -> Vec<(HandlerId, &'a Slot, u32)>,
        near: impl FnOnce() -> Place,
        now: Timestamp,
    ) -> Option<HandlerId>
    where
        I: Iterator<Item = (HandlerId, &'a Slot, u32)>,
    {
        // One handler that fits is the pick: nothing else is looked at.
        let mut fitting = looked();
        let first = fitting.next()?;
        let Some(second) = fitting.next() else { return Some(first.0) };
        // Two passes, no allocation among few handlers: dispatch runs this for every task.
        let mut best = f64::INFINITY;
        for (id, _, _) in [first, second].into_iter().chain(fitting) {
            best = self.recent(&id, job_type, now).map_or(best, |ms| best.min(ms));
        }
        let near = near();
        let beside = beside(&near);
        for (id, _, _) in &beside {
            best = self.recent(id, job_type, now).map_or(best, |ms| best.min(ms));
        }
        looked()
            .chain(beside)
            .min_by_key(|(id, slot, free)| {
                let slower =
                    self.recent(id, job_type, now).is_some_and(|ms| ms > best * AS_FAST && ms > best + AS_FAST_MS);
                let load = load(self.held.get(id), slot);
                (slower, load, slot.spec.place.distance(&near), std::cmp::Reverse(*free), *id)
            })
            .map(|(id, _, _)| id)
    }

    /// The task at the head of a job type's queue.
    pub fn peek(&self, job_type: &str) -> Option<TaskRef> {
        self.queues.get(job_type)?.peek().map(|e| e.task)
    }

    pub fn pop(&mut self, job_type: &str) -> Option<Queued> {
        let queued = self.queues.get_mut(job_type)?.pop()?;
        self.queued.remove(&queued.task);
        Some(queued)
    }

    /// Whether the task waits in a queue.
    pub fn is_queued(&self, task: TaskRef) -> bool {
        self.queued.contains(&task)
    }

    /// An attempt of `job_type` is held by `handler` (connected or not).
    pub fn take_slot(&mut self, handler: HandlerId, job_type: &Arc<str>) {
        let held = self.held.entry(handler).or_default();
        held.total += 1;
        *held.by_type.entry(job_type.clone()).or_default() += 1;
        *self.running.entry(job_type.clone()).or_default() += 1;
        self.restand(handler);
    }

    /// The attempt ended (or was taken back): its slot is free again.
    pub fn release_slot(&mut self, handler: HandlerId, job_type: &str) {
        let Some(held) = self.held.get_mut(&handler) else { return };
        let Some(used) = held.by_type.get_mut(job_type).filter(|u| **u > 0) else { return };
        *used -= 1;
        held.total -= 1;
        if held.total == 0 {
            self.held.remove(&handler);
        }
        if let Some(running) = self.running.get_mut(job_type) {
            *running = running.saturating_sub(1);
        }
        self.restand(handler);
    }

    /// Attempts a handler holds now, connected or not.
    pub fn held_by(&self, handler: HandlerId) -> u32 {
        self.held.get(&handler).map_or(0, |h| h.total)
    }

    /// Reserves every free slot of connected handlers that no task queued
    /// here can use, and says which job types each may take: the slots an
    /// instance offers to the jobs other instances lead. Handlers that take
    /// any job type (in-process executors) are not offered.
    pub fn reserve_free(&mut self) -> Vec<FreeSlots> {
        let mut offers = Vec::new();
        for (id, slot) in &self.handlers {
            let Some(types) = &slot.spec.job_types else { continue };
            let held = self.held.get(id);
            let total = slot.free(held);
            if total == 0 {
                continue;
            }
            let job_types: Vec<(Arc<str>, u32)> = types
                .iter()
                .filter(|t| self.queues.get(&**t).is_none_or(BinaryHeap::is_empty))
                .filter(|t| self.gate_open || !self.gated.contains(&**t))
                .filter(|t| !self.is_closed(t))
                .filter_map(|t| {
                    let limits = self.limits.get(&**t);
                    if limits.is_some_and(|l| self.running(t) >= l.global) {
                        return None;
                    }
                    let per_worker = limits.map(|l| l.per_worker).unwrap_or(u32::MAX);
                    let free = slot.free_for(t, per_worker, held);
                    (free > 0).then(|| (t.clone(), free))
                })
                .collect();
            if !job_types.is_empty() {
                offers.push(FreeSlots { handler: *id, total, job_types });
            }
        }
        let reserved: Arc<str> = Arc::from(RESERVED);
        for offer in &offers {
            for _ in 0..offer.total {
                self.take_slot(offer.handler, &reserved);
            }
        }
        offers
    }

    /// Gives back `n` slots reserved by `reserve_free`.
    pub fn unreserve(&mut self, handler: HandlerId, n: u32) {
        for _ in 0..n {
            self.release_slot(handler, RESERVED);
        }
    }

    /// Whether a job type may be dispatched now, by the gate, its window,
    /// its global limit and its rate.
    pub fn may_run(&self, job_type: &str, now: Timestamp) -> bool {
        if !self.gate_open && self.gated.contains(job_type) || self.is_closed(job_type) {
            return false;
        }
        !self.at_limit(job_type, self.limits.get(job_type), now)
    }

    /// Closes a job type (outside its maintenance window, nothing of it is
    /// dispatched) or opens it again.
    pub(crate) fn set_closed(&mut self, job_type: Arc<str>, closed: bool) {
        match closed {
            true => self.closed.insert(job_type),
            false => self.closed.remove(&job_type),
        };
    }

    /// Whether a job type is outside its maintenance window (no hashing when none is).
    fn is_closed(&self, job_type: &str) -> bool {
        !self.closed.is_empty() && self.closed.contains(job_type)
    }

    /// Forgets every queued entry of a job (it was canceled or ended).
    pub fn forget_job(&mut self, job: JobId) {
        self.queued.retain(|t| t.job != job);
        for queue in self.queues.values_mut() {
            queue.retain(|e| e.task.job != job);
        }
        let seqs: Vec<u64> = self.delayed.iter().filter(|(_, _, t)| t.job == job).map(|(_, s, _)| *s).collect();
        self.delayed.retain(|(_, _, t)| t.job != job);
        for seq in seqs {
            self.delayed_meta.remove(&seq);
        }
    }

    /// Tasks of a job type in its queue now (not those waiting for a backoff).
    pub fn queued_of(&self, job_type: &str) -> u32 {
        self.queues.get(job_type).map_or(0, |q| u32::try_from(q.len()).unwrap_or(u32::MAX))
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
        let order: Vec<u32> = std::iter::from_fn(|| d.pop("noop")).map(|q| q.task.idx.0).collect();
        assert_eq!(order, vec![2, 5, 1, 3, 4]);
    }

    #[test]
    fn delayed_tasks_wait_for_their_time() {
        let mut d = Dispatch::default();
        let t: Arc<str> = Arc::from("noop");
        d.push_ready(t.clone(), Priority::Normal, task(1), Some(Timestamp(5000)), Timestamp(0));
        assert_eq!(d.pop("noop"), None);
        assert_eq!(d.next_wake(Timestamp(0)), Some(Timestamp(5000)));
        d.promote_due(Timestamp(4999));
        assert_eq!(d.pop("noop"), None);
        d.promote_due(Timestamp(5000));
        assert_eq!(d.pop("noop").map(|q| q.task), Some(task(1)));
        assert_eq!(d.next_wake(Timestamp(5000)), None);
    }

    #[test]
    fn picks_the_handler_with_most_free_slots_that_accepts_the_type() {
        let mut d = Dispatch::default();
        let (sink, _rx) = tokio::sync::mpsc::unbounded_channel();
        let a = HandlerId::new();
        let b = HandlerId::new();
        let (noop, shell): (Arc<str>, Arc<str>) = (Arc::from("noop"), Arc::from("shell"));
        d.add_handler(HandlerSpec {
            handler: a,
            job_types: None,
            capacity: 2,
            type_capacity: BTreeMap::new(),
            starts_running: true,
            session: 0,
            sink: sink.clone(),
            place: Place::default(),
        });
        d.add_handler(HandlerSpec {
            handler: b,
            job_types: Some(vec![shell.clone()]),
            capacity: 3,
            type_capacity: BTreeMap::new(),
            starts_running: true,
            session: 0,
            sink,
            place: Place::default(),
        });
        assert_eq!(d.pick_handler("noop", Place::default, Timestamp(0)), Some(a));
        assert_eq!(d.pick_handler("shell", Place::default, Timestamp(0)), Some(b));
        d.take_slot(b, &shell);
        d.take_slot(b, &shell);
        assert_eq!(d.pick_handler("shell", Place::default, Timestamp(0)), Some(a));
        d.take_slot(a, &noop);
        d.take_slot(a, &noop);
        assert_eq!(d.pick_handler("noop", Place::default, Timestamp(0)), None);
        d.release_slot(a, "noop");
        assert_eq!(d.pick_handler("noop", Place::default, Timestamp(0)), Some(a));
    }

    fn handler_at(d: &mut Dispatch, capacity: u32, host: Option<&str>) -> HandlerId {
        let (sink, _rx) = tokio::sync::mpsc::unbounded_channel();
        let handler = HandlerId::new();
        d.add_handler(HandlerSpec {
            handler,
            job_types: None,
            capacity,
            type_capacity: BTreeMap::new(),
            starts_running: true,
            session: 0,
            sink,
            place: Place { host: host.map(Arc::from), rack: None },
        });
        handler
    }

    #[test]
    fn the_handlers_here_keep_pace_when_their_slots_turn_twice_as_fast_as_attempts_start() {
        let mut d = Dispatch::default();
        let vacuum: Arc<str> = Arc::from("vacuum");
        let now = Timestamp(1_000_000);
        let handler = handler_at(&mut d, 10, None);
        let start = |d: &mut Dispatch, n: u32, at: Timestamp| (0..n).for_each(|_| d.started(&vacuum, at));
        start(&mut d, 400, now);
        assert!(!d.keeps_pace("vacuum", now), "a handler not measured lately tells nothing");
        // 10 slots held 20 ms each turn 500 a second: not twice 400.
        d.record_duration(handler, &vacuum, 20, now);
        assert!(!d.keeps_pace("vacuum", now));
        // Held 2 ms lately (the average falls to 6.3 ms), they turn 1,580 a second.
        (0..4).for_each(|_| d.record_duration(handler, &vacuum, 2, Timestamp(1_000_100)));
        assert!(d.keeps_pace("vacuum", Timestamp(1_000_200)));
        // The second after, the one before counts; two seconds on, nothing started lately.
        assert!(d.keeps_pace("vacuum", Timestamp(1_001_500)));
        assert!(!d.keeps_pace("vacuum", Timestamp(1_002_000)), "nothing started lately tells nothing");
        start(&mut d, 1, Timestamp(1_002_000));
        assert!(d.keeps_pace("vacuum", Timestamp(1_002_000)));
        // A per-worker limit caps the slots a handler turns.
        d.set_limits(
            vacuum.clone(),
            TypeLimits { global: 100, per_worker: 1, execution_timeout_seconds: None, rate: None },
            Timestamp(1_002_000),
        );
        start(&mut d, 500, Timestamp(1_002_000));
        assert!(!d.keeps_pace("vacuum", Timestamp(1_002_000)), "1 slot held 6.3 ms turns 158 a second, not twice 501");
        assert!(!d.keeps_pace("other", Timestamp(1_002_000)), "a type nothing started of");
        // Slots another type holds are not the type's to turn.
        d.set_limits(
            vacuum.clone(),
            TypeLimits { global: 100, per_worker: 100, execution_timeout_seconds: None, rate: None },
            Timestamp(1_002_000),
        );
        assert!(d.keeps_pace("vacuum", Timestamp(1_002_000)));
        let balance: Arc<str> = Arc::from("balance");
        (0..9).for_each(|_| d.take_slot(handler, &balance));
        assert!(!d.keeps_pace("vacuum", Timestamp(1_002_000)), "1 slot of 10 left for it");
    }

    #[test]
    fn the_fastest_handler_lately_is_chosen_and_an_unmeasured_one_is_tried() {
        let mut d = Dispatch::default();
        let vacuum: Arc<str> = Arc::from("vacuum");
        let (fast, slow) = (handler_at(&mut d, 2, None), handler_at(&mut d, 2, None));
        let now = Timestamp(1_000_000);
        d.record_duration(fast, &vacuum, 100, now);
        d.record_duration(slow, &vacuum, 300, now);
        assert_eq!(d.pick_handler("vacuum", Place::default, now), Some(fast));
        // Busier but faster still wins; full, the slow one gets the task.
        d.take_slot(fast, &vacuum);
        assert_eq!(d.pick_handler("vacuum", Place::default, now), Some(fast));
        d.take_slot(fast, &vacuum);
        assert_eq!(d.pick_handler("vacuum", Place::default, now), Some(slow));
        d.release_slot(fast, "vacuum");
        d.release_slot(fast, "vacuum");
        // Durations of another job type do not count: for it, the less loaded one.
        d.take_slot(fast, &vacuum);
        assert_eq!(d.pick_handler("other", Place::default, now), Some(slow));
        d.release_slot(fast, "vacuum");
        // A new handler, not measured yet, counts as fast and is tried.
        let new = handler_at(&mut d, 2, None);
        d.take_slot(fast, &vacuum);
        assert_eq!(d.pick_handler("vacuum", Place::default, now), Some(new));
        d.release_slot(fast, "vacuum");
        // Within 25% of the best is as fast: the less loaded one wins.
        d.record_duration(new, &vacuum, 120, now);
        d.take_slot(fast, &vacuum);
        assert_eq!(d.pick_handler("vacuum", Place::default, now), Some(new));
        // So is a few milliseconds more (round-trip noise on short tasks).
        let mut quick = Dispatch::default();
        let (q1, q2) = (handler_at(&mut quick, 2, None), handler_at(&mut quick, 2, None));
        quick.record_duration(q1, &vacuum, 2, now);
        quick.record_duration(q2, &vacuum, 6, now);
        quick.take_slot(q1, &vacuum);
        assert_eq!(quick.pick_handler("vacuum", Place::default, now), Some(q2));
        // A moving average: one quick run does not make the slow one fast...
        d.record_duration(slow, &vacuum, 100, now);
        assert!(d.recent(&slow, "vacuum", now).unwrap() > 200.0);
        // ...and what was measured ten minutes ago is forgotten.
        let later = now.plus_millis(RECENT_MS);
        assert_eq!(d.recent(&slow, "vacuum", later), None);
        d.record_duration(slow, &vacuum, 90, later);
        assert_eq!(d.recent(&slow, "vacuum", later), Some(90.0));
    }

    #[test]
    fn between_equally_fast_and_loaded_handlers_the_one_near_the_data_wins() {
        let mut d = Dispatch::default();
        let far = handler_at(&mut d, 4, Some("10.0.0.1"));
        let near = handler_at(&mut d, 2, Some("10.0.0.2"));
        let data = || Place { host: Place::host_of("10.0.0.2:8080"), rack: None };
        assert_eq!(d.pick_handler("vacuum", data, Timestamp(0)), Some(near));
        // Without a place, the one with more free slots.
        assert_eq!(d.pick_handler("vacuum", Place::default, Timestamp(0)), Some(far));
        // A rack in common is nearer than nothing in common.
        let rack = Some(Arc::from("r1"));
        let there = Place { host: Some(Arc::from("10.0.0.9")), rack: rack.clone() };
        assert_eq!(there.distance(&Place { host: None, rack }), 1);
        assert_eq!(there.distance(&Place::default()), 2);
        assert_eq!(Place::host_of("[::1]:8080").as_deref(), Some("::1"));
        assert_eq!(Place::host_of("volume-3").as_deref(), Some("volume-3"));
        assert_eq!(Place::host_of(""), None);
    }

    #[test]
    fn in_a_cluster_a_type_runs_only_within_the_permits_held() {
        let mut d = Dispatch::default();
        let (sink, _rx) = tokio::sync::mpsc::unbounded_channel();
        let vacuum: Arc<str> = Arc::from("vacuum");
        let handler = HandlerId::new();
        d.add_handler(HandlerSpec {
            handler,
            job_types: None,
            capacity: 10,
            type_capacity: BTreeMap::new(),
            starts_running: false,
            session: 0,
            sink,
            place: Place::default(),
        });
        d.set_limits(
            vacuum.clone(),
            TypeLimits { global: 5, per_worker: 10, execution_timeout_seconds: None, rate: None },
            Timestamp(0),
        );
        d.set_permits(std::collections::HashMap::new(), Timestamp(0));
        assert!(d.pick_handler("vacuum", Place::default, Timestamp(0)).is_none(), "no permit held: nothing runs");
        assert!(!d.may_run("vacuum", Timestamp(0)));
        d.set_permits(std::collections::HashMap::from([(vacuum.clone(), 2)]), Timestamp(0));
        while let Some(h) = d.pick_handler("vacuum", Place::default, Timestamp(0)) {
            d.take_slot(h, &vacuum);
        }
        assert_eq!(d.running("vacuum"), 2, "two permits held");
        d.set_permits(std::collections::HashMap::from([(vacuum.clone(), 9)]), Timestamp(0));
        while let Some(h) = d.pick_handler("vacuum", Place::default, Timestamp(0)) {
            d.take_slot(h, &vacuum);
        }
        assert_eq!(d.running("vacuum"), 5, "never past the global limit itself");
        let demand = d.demand();
        assert_eq!(demand, vec![TypeDemand { job_type: vacuum, limit: 5, queued: 0, running: 5 }]);
    }

    /// The settlement of permits reads what runs, then gives back in the
    /// store what is held above it: in between, no attempt may start on a
    /// slot it is giving back, which another instance may take at once.
    #[test]
    fn once_its_demand_is_read_a_type_starts_nothing_more_until_its_permits_are_settled() {
        let mut d = Dispatch::default();
        let noop: Arc<str> = Arc::from("noop");
        handler_at(&mut d, 10, None);
        d.set_limits(
            noop.clone(),
            TypeLimits { global: 2, per_worker: 10, execution_timeout_seconds: None, rate: None },
            Timestamp(0),
        );
        d.set_permits(std::collections::HashMap::from([(noop.clone(), 2)]), Timestamp(0));
        let h = d.pick_handler("noop", Place::default, Timestamp(0)).expect("a permit held");
        d.take_slot(h, &noop);
        assert_eq!(d.demand(), vec![TypeDemand { job_type: noop.clone(), limit: 2, queued: 0, running: 1 }]);
        assert!(d.pick_handler("noop", Place::default, Timestamp(0)).is_none(), "the other slot may be given back");
        d.set_permits(std::collections::HashMap::from([(noop.clone(), 2)]), Timestamp(0));
        assert!(d.pick_handler("noop", Place::default, Timestamp(0)).is_some(), "kept: it starts again");
    }

    #[test]
    fn type_limits_bound_dispatch_globally_and_per_worker() {
        let mut d = Dispatch::default();
        let (sink, _rx) = tokio::sync::mpsc::unbounded_channel();
        let vacuum: Arc<str> = Arc::from("vacuum");
        let handlers: Vec<HandlerId> = (0..2).map(|_| HandlerId::new()).collect();
        for &handler in &handlers {
            d.add_handler(HandlerSpec {
                handler,
                job_types: None,
                capacity: 10,
                type_capacity: BTreeMap::from([(vacuum.clone(), 2)]),
                starts_running: false,
                session: 0,
                sink: sink.clone(),
                place: Place::default(),
            });
        }
        d.set_limits(
            vacuum.clone(),
            TypeLimits { global: 3, per_worker: 5, execution_timeout_seconds: None, rate: None },
            Timestamp(0),
        );
        let mut taken = Vec::new();
        while let Some(h) = d.pick_handler("vacuum", Place::default, Timestamp(0)) {
            d.take_slot(h, &vacuum);
            taken.push(h);
        }
        assert_eq!(taken.len(), 3, "the global limit");
        assert_eq!(d.running("vacuum"), 3);
        d.set_limits(
            vacuum.clone(),
            TypeLimits { global: 10, per_worker: 5, execution_timeout_seconds: None, rate: None },
            Timestamp(0),
        );
        while let Some(h) = d.pick_handler("vacuum", Place::default, Timestamp(0)) {
            d.take_slot(h, &vacuum);
        }
        assert_eq!(d.running("vacuum"), 4, "each worker declared at most 2 vacuums");
        d.report_slots(handlers[0], 1);
        d.release_slot(handlers[0], "vacuum");
        assert_eq!(
            d.pick_handler("vacuum", Place::default, Timestamp(0)),
            None,
            "the worker reports one slot, and it is in use"
        );
        assert!(!d.remove_handler(handlers[1], Some(7)), "only the session named is removed");
        assert!(d.remove_handler(handlers[1], Some(0)));
        assert_eq!(d.running("vacuum"), 3, "a removed handler's attempts hold their slots until they end");
        assert_eq!(d.held_by(handlers[1]), 2);
        d.release_slot(handlers[1], "vacuum");
        d.release_slot(handlers[1], "vacuum");
        d.release_slot(handlers[1], "vacuum");
        assert_eq!(d.running("vacuum"), 1, "a release with nothing held changes nothing");
        d.add_handler(HandlerSpec {
            handler: handlers[0],
            job_types: None,
            capacity: 1,
            type_capacity: BTreeMap::new(),
            starts_running: false,
            session: 1,
            sink: sink.clone(),
            place: Place::default(),
        });
        assert_eq!(
            d.pick_handler("vacuum", Place::default, Timestamp(0)),
            None,
            "a reconnected handler finds the slot its kept attempt holds"
        );
    }

    #[test]
    fn free_slots_are_offered_for_types_with_nothing_queued_and_held_while_reserved() {
        let mut d = Dispatch::default();
        let (sink, _rx) = tokio::sync::mpsc::unbounded_channel();
        let (local, remote): (Arc<str>, Arc<str>) = (Arc::from("local"), Arc::from("remote"));
        let h = HandlerId::new();
        d.add_handler(HandlerSpec {
            handler: h,
            job_types: Some(vec![local.clone(), remote.clone()]),
            capacity: 3,
            type_capacity: BTreeMap::from([(remote.clone(), 2)]),
            starts_running: false,
            session: 0,
            sink,
            place: Place::default(),
        });
        d.push_ready(local.clone(), Priority::Normal, task(1), None, Timestamp(0));
        let offers = d.reserve_free();
        assert_eq!(offers, vec![FreeSlots { handler: h, total: 3, job_types: vec![(remote.clone(), 2)] }]);
        assert_eq!(
            d.pick_handler("local", Place::default, Timestamp(0)),
            None,
            "reserved slots are not dispatched here"
        );
        assert!(d.reserve_free().is_empty(), "nothing is offered twice");
        d.unreserve(h, 3);
        assert_eq!(d.pick_handler("local", Place::default, Timestamp(0)), Some(h));
        d.set_limits(
            remote.clone(),
            TypeLimits { global: 0, per_worker: 5, execution_timeout_seconds: None, rate: None },
            Timestamp(0),
        );
        assert!(d.reserve_free().is_empty(), "a type at its global limit is not offered");
    }

    const MINUTE: i64 = 60_000;

    #[test]
    fn a_wait_makes_up_for_priority_so_a_low_priority_is_passed_only_for_a_bounded_time() {
        let mut d = Dispatch::default();
        d.set_aging(Aging(10 * MINUTE));
        let t: Arc<str> = Arc::from("vacuum");
        d.push_ready(t.clone(), Priority::Low, task(1), None, Timestamp(0));
        // Critical is three levels above low: it passes a low task that
        // became ready up to 30 minutes before it, and no earlier one.
        d.push_ready(t.clone(), Priority::Critical, task(2), None, Timestamp(30 * MINUTE - 1));
        d.push_ready(t.clone(), Priority::Critical, task(3), None, Timestamp(30 * MINUTE + 1));
        d.push_ready(t.clone(), Priority::Normal, task(4), None, Timestamp(10 * MINUTE));
        let order: Vec<u32> = std::iter::from_fn(|| d.pop("vacuum")).map(|q| q.task.idx.0).collect();
        assert_eq!(order, vec![2, 1, 4, 3]);
    }

    #[test]
    fn the_first_task_by_rank_over_every_job_type_goes_first() {
        let mut d = Dispatch::default();
        let (vacuum, balance): (Arc<str>, Arc<str>) = (Arc::from("vacuum"), Arc::from("balance"));
        d.push_ready(vacuum.clone(), Priority::Normal, task(1), None, Timestamp(0));
        d.push_ready(balance.clone(), Priority::High, task(2), None, Timestamp(1));
        d.push_ready(balance.clone(), Priority::Normal, task(3), None, Timestamp(2));
        let mut types = d.queued_types();
        let mut order = Vec::new();
        while let Some(i) = d.first_of(&mut types) {
            order.push(d.pop(&types[i]).unwrap().task.idx.0);
        }
        assert_eq!(order, vec![2, 1, 3], "high first, then the normal ones in the order they became ready");
        assert!(types.is_empty());
    }

    #[test]
    fn a_new_priority_keeps_the_wait_so_far_and_a_requeued_task_its_place() {
        let mut d = Dispatch::default();
        d.set_aging(Aging(10 * MINUTE));
        let t: Arc<str> = Arc::from("vacuum");
        let other = TaskRef { job: JobId::from_bytes([2; 16]), idx: TaskIdx(9) };
        d.push_ready(t.clone(), Priority::Normal, other, None, Timestamp(5 * MINUTE));
        d.push_ready(t.clone(), Priority::Low, task(1), None, Timestamp(0));
        assert_eq!(d.peek("vacuum"), Some(other));
        d.reprioritize(task(1).job, Priority::High);
        let first = d.pop("vacuum").unwrap();
        assert_eq!((first.task, first.priority), (task(1), Priority::High));
        d.requeue(t.clone(), first);
        assert_eq!(d.peek("vacuum"), Some(task(1)), "put back where it was");
        assert!(d.is_queued(task(1)));
    }

    #[test]
    fn a_rate_limit_holds_a_type_until_its_next_token_and_the_loop_wakes_then() {
        let mut d = Dispatch::default();
        let h = handler_at(&mut d, 10, None);
        let t: Arc<str> = Arc::from("vacuum");
        let rate = Some(Rate { per_minute: 2, burst: 1 });
        d.set_limits(
            t.clone(),
            TypeLimits { global: 10, per_worker: 10, execution_timeout_seconds: None, rate },
            Timestamp(0),
        );
        d.push_ready(t.clone(), Priority::Normal, task(1), None, Timestamp(0));
        d.push_ready(t.clone(), Priority::Normal, task(2), None, Timestamp(0));
        assert_eq!(d.pick_handler("vacuum", Place::default, Timestamp(0)), Some(h));
        d.pop("vacuum");
        d.started(&t, Timestamp(0));
        assert_eq!(d.pick_handler("vacuum", Place::default, Timestamp(0)), None, "the burst of one is spent");
        assert_eq!(d.next_wake(Timestamp(0)), Some(Timestamp(30_000)), "two a minute: the next in 30 s");
        assert_eq!(d.pick_handler("vacuum", Place::default, Timestamp(30_000)), Some(h));
        // In a cluster, an instance with a third of the type's permits starts a third of its rate.
        d.set_permits(std::collections::HashMap::from([(t.clone(), 3)]), Timestamp(30_000));
        d.set_limits(
            t.clone(),
            TypeLimits {
                global: 9,
                per_worker: 10,
                execution_timeout_seconds: None,
                rate: Some(Rate { per_minute: 6, burst: 1 }),
            },
            Timestamp(30_000),
        );
        d.started(&t, Timestamp(30_000));
        assert_eq!(d.next_wake(Timestamp(30_000)), Some(Timestamp(60_000)), "two a minute here, of six");
    }

    /// What the order of those a pick looks at should be, computed afresh.
    fn fresh_standings(d: &Dispatch) -> BTreeMap<HandlerId, Vec<(Arc<str>, open::Standing)>> {
        let mut all = BTreeMap::new();
        for (id, slot) in &d.handlers {
            let Some(types) = &slot.spec.job_types else { continue };
            let held = d.held.get(id);
            let mut entries: Vec<_> = types
                .iter()
                .filter_map(|t| {
                    let per_worker = d.limits.get(t).map_or(u32::MAX, |l| l.per_worker);
                    let free = slot.free_for(t, per_worker, held);
                    (free > 0).then(|| (t.clone(), (load(held, slot), std::cmp::Reverse(free), *id)))
                })
                .collect();
            entries.sort();
            entries.dedup();
            if !entries.is_empty() {
                all.insert(*id, entries);
            }
        }
        all
    }

    /// The pick as it would be made looking at every handler.
    fn pick_among_all(d: &Dispatch, job_type: &str, near: &Place, now: Timestamp) -> Option<HandlerId> {
        if !d.may_run(job_type, now) {
            return None;
        }
        let per_worker = d.limits.get(job_type).map_or(u32::MAX, |l| l.per_worker);
        let candidates: Vec<(HandlerId, &Slot, u32)> = d
            .handlers
            .iter()
            .filter(|(_, slot)| slot.accepts(job_type))
            .map(|(id, slot)| (*id, slot, slot.free_for(job_type, per_worker, d.held.get(id))))
            .filter(|(_, _, free)| *free > 0)
            .collect();
        let best = candidates.iter().filter_map(|(id, _, _)| d.recent(id, job_type, now)).fold(f64::INFINITY, f64::min);
        candidates
            .iter()
            .min_by_key(|(id, slot, free)| {
                let slower =
                    d.recent(id, job_type, now).is_some_and(|ms| ms > best * AS_FAST && ms > best + AS_FAST_MS);
                (slower, load(d.held.get(id), slot), slot.spec.place.distance(near), std::cmp::Reverse(*free), *id)
            })
            .map(|(id, _, _)| *id)
    }

    #[derive(Clone, Debug)]
    enum Op {
        Join { n: usize, types: Vec<usize>, capacity: u32, per_type: Option<u32>, host: Option<usize> },
        Leave(usize),
        Take(usize, usize),
        Release(usize, usize),
        Reported(usize, u32),
        Elsewhere(usize, u32),
        PerWorker(usize, u32),
        Took(usize, usize, i64),
    }

    const TYPES: [&str; 3] = ["vacuum", "balance", "ec"];

    fn op(handlers: usize) -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        let h = 0..handlers;
        prop_oneof![
            (
                h.clone(),
                proptest::collection::vec(0..3usize, 0..3),
                1..4u32,
                proptest::option::of(1..3u32),
                proptest::option::of(0..4usize)
            )
                .prop_map(|(n, types, capacity, per_type, host)| Op::Join {
                    n,
                    types,
                    capacity,
                    per_type,
                    host
                }),
            h.clone().prop_map(Op::Leave),
            (h.clone(), 0..3usize).prop_map(|(n, t)| Op::Take(n, t)),
            (h.clone(), 0..3usize).prop_map(|(n, t)| Op::Release(n, t)),
            (h.clone(), 0..4u32).prop_map(|(n, total)| Op::Reported(n, total)),
            (h.clone(), 0..2u32).prop_map(|(n, running)| Op::Elsewhere(n, running)),
            (0..3usize, 1..4u32).prop_map(|(t, per_worker)| Op::PerWorker(t, per_worker)),
            (h, 0..3usize, 1..400i64).prop_map(|(n, t, ms)| Op::Took(n, t, ms)),
        ]
    }

    /// Applies the operations to a dispatch table of `handlers` possible
    /// handlers, which keeps its index of who a pick looks at from
    /// `index_from` handlers on (`None`: as it does outside the tests).
    fn apply(ops: &[Op], handlers: usize, index_from: Option<usize>) -> (Dispatch, Vec<HandlerId>) {
        let mut d = Dispatch { index_from, ..Dispatch::default() };
        let ids: Vec<HandlerId> = (0..handlers).map(|_| HandlerId::new()).collect();
        let types: Vec<Arc<str>> = TYPES.iter().map(|t| Arc::from(*t)).collect();
        let now = Timestamp(1_000_000);
        for op in ops {
            match op.clone() {
                Op::Join { n, types: declared, capacity, per_type, host } => {
                    let (sink, _rx) = tokio::sync::mpsc::unbounded_channel();
                    let job_types: Vec<Arc<str>> = declared.iter().map(|t| types[*t].clone()).collect();
                    let type_capacity =
                        per_type.map(|c| job_types.iter().map(|t| (t.clone(), c)).collect()).unwrap_or_default();
                    let place = Place {
                        host: host.map(|h| Arc::from(format!("host{h}"))),
                        rack: host.map(|h| Arc::from(format!("rack{}", h % 2))),
                    };
                    let any = declared.is_empty() && capacity == 1;
                    d.add_handler(HandlerSpec {
                        handler: ids[n],
                        job_types: (!any).then_some(job_types),
                        capacity,
                        type_capacity,
                        starts_running: true,
                        session: 0,
                        sink,
                        place,
                    });
                }
                Op::Leave(n) => {
                    d.remove_handler(ids[n], None);
                }
                Op::Take(n, t) => d.take_slot(ids[n], &types[t]),
                Op::Release(n, t) => d.release_slot(ids[n], &types[t]),
                Op::Reported(n, total) => d.report_slots(ids[n], total),
                Op::Elsewhere(n, running) => d.report_elsewhere(ids[n], running),
                Op::PerWorker(t, per_worker) => {
                    let limits = TypeLimits { global: 1000, per_worker, execution_timeout_seconds: None, rate: None };
                    d.set_limits(types[t].clone(), limits, now);
                }
                Op::Took(n, t, ms) => d.record_duration(ids[n], &types[t], ms, now),
            }
        }
        (d, ids)
    }

    proptest::proptest! {
        /// Whatever happened to the handlers, the order a pick looks
        /// through is as computed afresh, and with no more handlers than a
        /// pick looks at, it picks as if it looked at every one.
        #[test]
        fn a_pick_among_few_handlers_is_the_pick_among_all(ops in proptest::collection::vec(op(8), 0..60), host in proptest::option::of(0..4usize)) {
            let near = Place { host: host.map(|h| Arc::from(format!("host{h}"))), rack: host.map(|h| Arc::from(format!("rack{}", h % 2))) };
            // Kept from the first handler on, and as outside the tests (never, among 8).
            for index_from in [Some(0), None] {
                let (d, _) = apply(&ops, 8, index_from);
                proptest::prop_assert_eq!(d.open.is_some(), index_from.is_some() && !d.handlers.is_empty());
                if let Some(open) = &d.open {
                    proptest::prop_assert_eq!(open.standings(), fresh_standings(&d));
                }
                for job_type in TYPES {
                    let now = Timestamp(1_000_000);
                    proptest::prop_assert_eq!(d.pick_handler(job_type, || near.clone(), now), pick_among_all(&d, job_type, &near, now));
                }
            }
        }

        /// Among many handlers a pick finds one whenever one has a slot
        /// free, never one without, and prefers the least loaded.
        #[test]
        fn a_pick_among_many_handlers_takes_a_free_one(ops in proptest::collection::vec(op(120), 100..400)) {
            let (d, _) = apply(&ops, 120, Some(8));
            if let Some(open) = &d.open {
                proptest::prop_assert_eq!(open.standings(), fresh_standings(&d));
            }
            let now = Timestamp(1_000_000);
            for job_type in TYPES {
                let picked = d.pick_handler(job_type, Place::default, now);
                let among_all = pick_among_all(&d, job_type, &Place::default(), now);
                proptest::prop_assert_eq!(picked.is_some(), among_all.is_some());
                if let Some(id) = picked {
                    let slot = &d.handlers[&id];
                    let per_worker = d.limits.get(job_type).map_or(u32::MAX, |l| l.per_worker);
                    proptest::prop_assert!(slot.accepts(job_type) && slot.free_for(job_type, per_worker, d.held.get(&id)) > 0);
                }
            }
        }
    }
}
