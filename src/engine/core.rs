//! The engine loop's state and every step it applies. Pure bookkeeping over
//! memory: each command appends its writes to the iteration's `Step` and
//! defers its effects (replies, work orders, events) until the committer
//! has made that step durable.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use jobcenter_recovery as recovery;
use tokio::sync::{broadcast, oneshot};

use super::attempts::Ledger;
use super::{Answer, Error, Event, Options, Progress, Summary, Waiters};
use crate::active::ActiveJob;
use crate::clock::Timestamp;
use crate::dispatch::{Assignment, Dispatch, FreeSlots, HandlerSpec, Sink, TypeLimits, WorkOrder};
use crate::follower::{Loss, Outcome, Rejection};
use crate::model::audit;
use crate::model::{AttemptId, HandlerId, JobId, JobOrigin, JobRecord, JobSpec, TaskRecord, TaskRef};
use crate::store::{Batch, StoredJob};

mod assign;
mod cluster;
mod end;
mod finalize;
mod handler;
mod job;
mod query;
mod recover;
mod report;
mod restore;
#[cfg(test)]
mod tests;
mod windows;

pub(super) type Reply<T> = oneshot::Sender<T>;

/// Every step the engine applies, by what it is about.
pub(super) enum Command {
    Job(JobCommand),
    Report(ReportCommand),
    Handler(HandlerCommand),
    Cluster(ClusterCommand),
    Query(Query),
}

impl Command {
    /// The loop took the command at `taken`: a report notes how long it
    /// waited since the server received it.
    pub(super) fn taken(&mut self, taken: std::time::Instant) {
        if let Command::Report(ReportCommand::Complete { received: Some(at), waited_ms, .. }) = self {
            *waited_ms = i64::try_from(taken.saturating_duration_since(*at).as_millis()).unwrap_or(i64::MAX);
        }
    }
}

impl From<JobCommand> for Command {
    fn from(command: JobCommand) -> Command {
        Command::Job(command)
    }
}

impl From<ReportCommand> for Command {
    fn from(command: ReportCommand) -> Command {
        Command::Report(command)
    }
}

impl From<HandlerCommand> for Command {
    fn from(command: HandlerCommand) -> Command {
        Command::Handler(command)
    }
}

impl From<ClusterCommand> for Command {
    fn from(command: ClusterCommand) -> Command {
        Command::Cluster(command)
    }
}

impl From<Query> for Command {
    fn from(command: Query) -> Command {
        Command::Query(command)
    }
}

/// Jobs and their types: submit, cancel, retry, remove, settings, limits and gates, and recovery's actions on them.
pub(super) enum JobCommand {
    Submit {
        id: JobId,
        spec: Arc<JobSpec>,
        origin: JobOrigin,
        /// Written with the job, if it is taken.
        audit: Option<audit::Entry>,
        reply: Reply<Result<JobId, Error>>,
    },
    Cancel {
        job: JobId,
        /// Written with the cancel, if it is taken.
        audit: Option<audit::Entry>,
        reply: Reply<Result<(), Error>>,
    },
    /// `removals`: how many removals were durable before the caller read the
    /// job; `None` answers that it must be read again (one became durable since).
    Retry {
        job: StoredJob,
        removals: u64,
        /// Written with the retry, if it is taken.
        audit: Option<audit::Entry>,
        reply: Reply<Option<Result<(), Error>>>,
    },
    /// Removes ended jobs (retention) that are not led here; answers, once
    /// durable, how many were asked for removal.
    Remove {
        jobs: Vec<JobId>,
        reply: Reply<usize>,
    },
    PutSettings {
        settings: Vec<(String, Option<Vec<u8>>)>,
        reply: Reply<()>,
    },
    SetLimits {
        job_type: Arc<str>,
        limits: TypeLimits,
    },
    /// Gives every task of a running job a priority (an operator's change,
    /// written as the setting `job-priority/ID` with `audit`).
    SetPriority {
        job: JobId,
        priority: crate::model::Priority,
        audit: Option<audit::Entry>,
        reply: Reply<Result<(), Error>>,
    },
    /// The endpoints that now want each kind of notification.
    SetNotify {
        routes: crate::model::notify::Routes,
    },
    Gate {
        gated: Vec<Arc<str>>,
        open: bool,
        /// (queued, running) attempts of gated job types.
        reply: Reply<(usize, u32)>,
    },
    ApplyRecovery {
        actions: Vec<(recovery::Rule, recovery::Action)>,
        reply: Reply<Vec<bool>>,
    },
    /// A job type's maintenance windows (`None`: always open).
    SetWindow {
        job_type: Arc<str>,
        window: Option<Arc<crate::windows::Window>>,
    },
    /// The bandwidth budget (or none) and the job types whose policy says
    /// whether they share it.
    SetBudget {
        budget: Option<crate::budget::Budget>,
        marks: HashMap<Arc<str>, bool>,
    },
    /// A submit with settings written in its step (a schedule's last run
    /// and the audit record of the request that asked for it).
    SubmitWith {
        id: JobId,
        spec: Arc<JobSpec>,
        origin: JobOrigin,
        settings: Vec<(String, Option<Vec<u8>>)>,
        reply: Reply<Result<JobId, Error>>,
    },
}

/// What a handler reports of an attempt it holds: started, progress, its outcome, or that it gave it up.
pub(super) enum ReportCommand {
    Started {
        attempt: AttemptId,
        handler: HandlerId,
        reply: Option<Reply<Result<(), Rejection>>>,
    },
    Complete {
        attempt: AttemptId,
        handler: HandlerId,
        outcome: Outcome,
        /// When the report reached the server, to measure dispatch latency.
        received: Option<std::time::Instant>,
        /// How long it then waited for the engine's loop, in milliseconds:
        /// set by the loop as it takes the command (`Command::taken`).
        waited_ms: i64,
        /// Told once the step is durable (or the report refused).
        answer: Option<Answer>,
    },
    Progress {
        attempt: AttemptId,
        handler: HandlerId,
        progress: Progress,
    },
    /// The handler gave the attempt up without an outcome.
    GiveUp {
        attempt: AttemptId,
        handler: HandlerId,
        loss: Loss,
        answer: Option<Answer>,
    },
}

/// Handlers coming and going: connections, slots, reconciliations after a reconnect, and leases renewed.
pub(super) enum HandlerCommand {
    Connected {
        spec: HandlerSpec,
    },
    Disconnected {
        handler: HandlerId,
        session: u64,
        /// `None`: its attempts are lost now; else they wait this long for it.
        keep_for: Option<Duration>,
        reason: String,
    },
    HandlerGone {
        handler: HandlerId,
        loss: Loss,
    },
    HandlerSlots {
        handler: HandlerId,
        total: u32,
    },
    /// The handler runs this many attempts not held here.
    HandlerElsewhere {
        handler: HandlerId,
        running: u32,
    },
    Reconcile {
        handler: HandlerId,
        running: HashSet<AttemptId>,
        /// Attempts whose outcome the handler's session received and sent
        /// on to their job's leader, not settled yet: never dropped.
        reported: HashSet<AttemptId>,
        dropped_before: Option<Timestamp>,
        reply: Reply<super::Reconciled>,
    },
    /// Which of these attempts the handler holds here, and which are of
    /// jobs not led here (read from memory: an attempt a worker runs was
    /// durable before it was sent).
    Holds {
        handler: HandlerId,
        attempts: Vec<AttemptId>,
        reply: Reply<super::Holdings>,
    },
    /// A worker without a lease (it drops its work with its stream)
    /// connected as `handler`: the attempts any other handler of the same
    /// worker id holds while away are over now. Answers them.
    Returned {
        handler: HandlerId,
        name: Arc<str>,
        reply: Reply<Vec<Returned>>,
    },
    /// Another instance renews the handler's lease for these attempts: of
    /// those it holds, none is taken back before `keep` from now.
    Vouch {
        handler: HandlerId,
        attempts: Vec<AttemptId>,
        keep: Duration,
        reply: Reply<Vec<AttemptId>>,
    },
}

/// Work between instances on one store: jobs adopted and released, slots reserved, attempts lent and borrowed, permits.
pub(super) enum ClusterCommand {
    /// Takes the lead of jobs claimed from the store (another instance led them).
    /// `priorities`: the settings of jobs' priorities (`job-priority/ID`).
    Adopt { jobs: Vec<StoredJob>, priorities: Vec<(String, Vec<u8>)>, reply: Reply<usize> },
    /// Stops leading up to `up_to` jobs that no attempt runs for and nobody
    /// waits on, so that other instances may claim them.
    Release { up_to: usize, reply: Reply<Vec<JobId>> },
    /// Reserves the free slots no queued task here can use, to offer them
    /// to the jobs other instances lead.
    Reserve { reply: Reply<Vec<FreeSlots>> },
    /// Attempts another instance lent for the reserved slots of a handler.
    Borrowed { handler: HandlerId, reserved: u32, lent: Vec<Assignment>, reply: Reply<Vec<Assignment>> },
    /// A borrowed attempt's report was settled with its leader.
    ReturnBorrowed { attempt: AttemptId },
    /// Lends queued tasks to another instance's handlers.
    Lend { slots: Vec<FreeSlots>, reply: Reply<Vec<(HandlerId, Assignment)>> },
    /// What this instance asks of the cluster's permits: limited job types and resources.
    PermitDemand { reply: oneshot::Sender<crate::dispatch::Demand> },
    /// The slots of each type's global limit this instance holds, and the
    /// resources (volumes) it holds the cluster's lock of.
    SetPermits { permits: HashMap<Arc<str>, u32>, resources: HashSet<String> },
    /// The handlers connected to the other live instances now.
    PeerHandlers { handlers: HashSet<HandlerId> },
    /// The database's clock is this far ahead of the engine's (ms), as a
    /// heartbeat measured it: windows follow the database's clock.
    DatabaseTime { offset_ms: i64 },
    /// The slots of the bandwidth budget's permits this instance holds.
    SetBudgetPermits { held: crate::budget::Held },
    /// The shares the store keeps (`SHARE`), read before jobs are adopted:
    /// an adopted attempt counts the share its worker was given.
    KeepShares { shares: Vec<(String, Vec<u8>)> },
}

/// Reads: each is answered from memory once the step it sees is durable, and changes nothing but who waits.
pub(super) enum Query {
    RecoverySnapshot {
        reply: Reply<(Vec<recovery::JobSnapshot>, Vec<HandlerId>)>,
    },
    ActiveDedupeKeys {
        reply: Reply<HashSet<String>>,
    },
    Get {
        job: JobId,
        reply: Reply<Option<StoredJob>>,
    },
    /// Every attempt held now (answered once the step is durable).
    Attempts {
        reply: Reply<Vec<super::HeldAttempt>>,
    },
    /// One task of a job led here by its id: `None` when the job is not led
    /// here, `Some(None)` when it has no such task.
    Task {
        job: JobId,
        task: super::TaskKey,
        reply: Reply<Option<Option<super::OneTask>>>,
    },
    /// Every job led here, whole, as of one step (answered once it is durable), and that step's time.
    Snapshot {
        reply: Reply<(Timestamp, Vec<StoredJob>)>,
    },
    Summary {
        job: JobId,
        reply: Reply<Option<Summary>>,
    },
    Wait {
        job: JobId,
        reply: Reply<Option<JobRecord>>,
    },
    ActiveJobs {
        reply: Reply<Vec<JobRecord>>,
    },
}

/// The settings that keep what the engine must remember across a restart:
/// cooling resources (`cooling/<resource>`: until when, ms, big-endian) and
/// the workers of handlers without a lease (`handler/<id>`: the worker id).
pub(super) const COOLING: &str = "cooling/";
pub(super) const HANDLER_NAME: &str = "handler/";
/// The prefix of the settings that keep the priorities operators gave running jobs.
pub(super) const PRIORITY_PREFIX: &str = "job-priority/";
/// The share of the bandwidth budget each running budgeted attempt was
/// given (`share/<attempt>`: a `budget::Share` as JSON), kept so that a
/// restart or another instance counts what its workers were told, and that
/// every instance shows every share.
pub(crate) const SHARE: &str = "share/";

/// An attempt that ended because its worker came back without it.
#[derive(Clone, Debug)]
pub struct Returned {
    pub attempt: AttemptId,
    pub task_id: Arc<str>,
    pub job_type: Arc<str>,
    /// Its job came from a detection: it fails whole, and the next
    /// detection proposes the work again.
    pub from_scheduler: bool,
}

/// Work that may only happen after the iteration's batch is durable.
pub(super) enum Action {
    Send {
        sink: Sink,
        order: WorkOrder,
    },
    Foreign {
        to: super::ForeignOrders,
        handler: HandlerId,
        order: WorkOrder,
    },
    Reply(Box<dyn FnOnce() + Send>),
    /// A report's answer, told the result of its step.
    Answer(Answer, Result<(), Rejection>),
    Event(Event),
}

#[derive(Default)]
pub(super) struct Step {
    pub batch: Batch,
    pub actions: Vec<Action>,
}

impl Step {
    fn reply<T: Send + 'static>(&mut self, reply: Reply<T>, value: T) {
        self.actions.push(Action::Reply(Box::new(move || {
            let _ = reply.send(value);
        })));
    }

    /// Writes an audit record with the change it records, if the change is taken.
    fn record<T, E>(&mut self, audit: Option<audit::Entry>, result: &Result<T, E>) {
        if result.is_ok() {
            self.batch.settings.extend(audit.map(audit::Entry::into_setting));
        }
    }

    fn answer(&mut self, answer: Option<Answer>, result: Result<(), Rejection>) {
        if let Some(answer) = answer {
            self.actions.push(Action::Answer(answer, result));
        }
    }

    fn send(&mut self, sink: Option<&Sink>, order: WorkOrder) {
        if let Some(sink) = sink {
            self.actions.push(Action::Send { sink: sink.clone(), order });
        }
    }
}

/// The engine's state: every active job, the dispatch table, the held
/// attempts and the waiters.
pub(super) struct Core {
    options: Options,
    jobs: foldhash::HashMap<JobId, ActiveJob>,
    dispatch: Dispatch,
    /// Every attempt known here: held, borrowed, or waiting for an absent handler.
    attempts: Ledger,
    waiters: Waiters,
    events: broadcast::Sender<Event>,
    /// When the completion that made each queued task ready reached the server.
    released_at: foldhash::HashMap<TaskRef, std::time::Instant>,
    /// Handlers connected to the other live instances: alive, though not here.
    peer_handlers: HashSet<HandlerId>,
    /// The worker (its id) of each handler without a lease that holds or
    /// held attempts: such a worker drops its work with its stream, so when
    /// it comes back, under another handler, what its old one holds is over.
    names: foldhash::HashMap<HandlerId, Arc<str>>,
    /// In a cluster: the resources (volumes) whose lock this instance holds;
    /// a task on another resource waits.
    resource_permits: Option<HashSet<String>>,
    /// Whether a job has tasks on a resource, as first looked up.
    resource_jobs: foldhash::HashMap<JobId, bool>,
    /// Removals of ended jobs taken (each numbered), and how many of them
    /// are durable, so that a retry never brings back a job being removed.
    removals: u64,
    removals_durable: Arc<std::sync::atomic::AtomicU64>,
    /// Jobs of removals not known to be durable yet, with the removal's number.
    removing: foldhash::HashMap<JobId, u64>,
    /// Jobs an operator gave a priority while they ran: every task of the
    /// job takes it (kept in the settings until the job ends).
    priorities: foldhash::HashMap<JobId, crate::model::Priority>,
    /// The maintenance windows of the job types that have some.
    windows: windows::Windows,
    /// The bandwidth budget and the shares of the budgeted attempts held here.
    shares: crate::budget::Shares,
    /// The shares the store kept of attempts held before a restart, until
    /// their attempts are restored.
    kept_shares: foldhash::HashMap<AttemptId, crate::budget::Share>,
}

impl Core {
    pub(super) fn new(options: Options, events: broadcast::Sender<Event>) -> Core {
        let mut dispatch = Dispatch::default();
        dispatch.set_aging(crate::dispatch::Aging(options.priority_aging.as_millis() as i64));
        let windows = windows::Windows::new(options.database_clock);
        Core {
            attempts: Ledger::new(options.rollback_windows.clone()),
            options,
            jobs: foldhash::HashMap::default(),
            dispatch,
            waiters: HashMap::new(),
            events,
            released_at: foldhash::HashMap::default(),
            peer_handlers: HashSet::new(),
            names: foldhash::HashMap::default(),
            resource_permits: None,
            resource_jobs: foldhash::HashMap::default(),
            removals: 0,
            removals_durable: Arc::default(),
            removing: foldhash::HashMap::default(),
            priorities: foldhash::HashMap::default(),
            windows,
            shares: crate::budget::Shares::default(),
            kept_shares: foldhash::HashMap::default(),
        }
    }

    /// How many removals are durable, shared with the handle.
    pub(super) fn removals(&self) -> Arc<std::sync::atomic::AtomicU64> {
        self.removals_durable.clone()
    }

    pub(super) fn apply(&mut self, command: Command, now: Timestamp, step: &mut Step) {
        match command {
            Command::Job(command) => self.apply_job(command, now, step),
            Command::Report(command) => self.apply_report(command, now, step),
            Command::Handler(command) => self.apply_handler(command, now, step),
            Command::Cluster(command) => self.apply_cluster(command, now, step),
            Command::Query(query) => self.answer(query, now, step),
        }
    }

    /// One turn of the engine's loop, at `now`: applies the commands that
    /// arrived, ends what has run out and hands ready tasks to handlers. The
    /// step it returns is made durable before anything in it takes effect.
    pub(super) fn turn(&mut self, commands: impl IntoIterator<Item = Command>, now: Timestamp) -> Step {
        let commands = commands.into_iter();
        // Most commands are reports, and a report writes three task records
        // (one ends, its child is released, then started) and two actions
        // (the answer, the work order): the step's lists are grown once.
        let reports = commands.size_hint().0;
        let mut step = Step::default();
        step.batch.tasks.reserve(3 * reports);
        step.actions.reserve(2 * reports);
        for command in commands {
            self.apply(command, now, &mut step);
        }
        self.apply_windows(now, &mut step);
        self.expire(now, &mut step);
        self.dispatch_ready(now, &mut step);
        if self.events.receiver_count() > 0 {
            step.actions.extend(batch_events(&step.batch).into_iter().map(Action::Event));
        }
        step
    }

    /// How many commands one turn takes at most.
    pub(super) fn most_commands_per_turn(&self) -> usize {
        self.options.max_commands_per_iteration
    }

    /// When the next deadline falls, if any: the loop wakes then without a command.
    pub(super) fn next_wake(&self, now: Timestamp) -> Option<Timestamp> {
        [self.dispatch.next_wake(now), self.attempts.next_wake(), self.windows.next_wake()].into_iter().flatten().min()
    }
}

fn task_event(job: JobId, idx: u32, record: &TaskRecord) -> Event {
    Event::Task {
        job,
        idx,
        state: record.state(),
        attempt: record.attempt,
        error: record.error.as_deref().map(String::from),
        handler: record.handler(),
        at: record.updated_at,
        progress_percent: record.progress_percent,
        stage: record.stage.to_string(),
    }
}

/// The events of a step's batch, for watchers, in the order a watcher needs
/// them: jobs created, then task transitions, then the jobs' own (so that a
/// job's final state comes after the last task's).
fn batch_events(batch: &Batch) -> Vec<Event> {
    let job_event = |record: &JobRecord| Event::Job { job: record.id, state: record.state, at: record.updated_at };
    let created = batch.new_jobs.iter().map(|(record, _)| job_event(record));
    let tasks = batch.tasks.iter().map(|(job, idx, record)| task_event(*job, idx.0, record));
    let changed = batch.jobs.iter().map(job_event);
    created.chain(tasks).chain(changed).collect()
}
