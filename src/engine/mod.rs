//! The engine: one loop that owns every active job, applies leader and
//! follower steps in order, and hands each iteration's changes to a
//! committer thread that writes them as one atomic batch, flushes (group
//! commit), and only then sends replies and dispatches work.
//!
//! Because the loop is the only writer of jobs and hands over whole
//! iterations, no reader (of the engine or of the store) ever sees half of a
//! step.
//!
//! - `core.rs`: the loop's state and every step it applies;
//! - `attempts.rs`: the ledger of every attempt known here (held, lent,
//!   borrowed, or waiting for an absent handler), and the one way one ends;
//! - `committer.rs`: the group-commit thread and the crash points;
//! - `spans.rs`: the spans of jobs and attempts the committer keeps for the
//!   trace export;
//! - `handle.rs`: `EngineHandle`, the cheap cloneable API.

mod attempts;
mod committer;
mod core;
mod handle;
mod run_loop;
mod spans;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

pub use self::committer::{CommitObserver, Endings};
pub use self::core::Returned;
/// The settings that keep each running budgeted attempt's share of the bandwidth budget.
pub(crate) use self::core::SHARE as SHARE_SETTINGS;
pub use self::handle::{Answer, EngineHandle, Holdings, Reconciled};
use crate::clock::{Clock, Timestamp};
use crate::model::{HandlerId, JobId, JobRecord, JobState, StateCounts, TaskState};
use crate::store::{self, Store};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("unknown job {0}")]
    UnknownJob(JobId),
    #[error("job {0} has already ended")]
    JobEnded(JobId),
    #[error("job {0} has not ended: only an ended job can be retried")]
    JobNotEnded(JobId),
    #[error("job {job} has nothing to retry: it {state}")]
    NothingToRetry { job: JobId, state: JobState },
    #[error(transparent)]
    Store(#[from] store::Error),
    #[error("the engine has stopped")]
    Stopped,
}

/// What to do at start-up with attempts held by handlers of a previous run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Orphans {
    /// Run them again at once: their handlers died with the process (embedded use).
    Requeue,
    /// Keep them: their workers keep running them and report when they are
    /// back. Attempts of a handler that has not come back within `grace`
    /// are taken back, counted as lost with their worker.
    Keep { grace: Duration },
}

#[derive(Clone, Debug)]
pub struct Options {
    /// This admin instance's own handler id, fresh at every start; recorded
    /// on the jobs whose leader steps it takes.
    pub instance: HandlerId,
    pub orphans: Orphans,
    /// Attempts a task may lose with its handler before it fails.
    pub lost_attempt_limit: u32,
    /// Commands one iteration takes at most.
    pub max_commands_per_iteration: usize,
    /// Where work orders go for handlers connected to another instance (in
    /// a cluster): the attempts lent to them.
    pub foreign_orders: Option<ForeignOrders>,
    /// Job types whose workers undo an attempt that ended without success on
    /// their own, after it ended, within this long: its volume stays locked
    /// for that long (no other task on it starts while the undoing may run).
    pub rollback_windows: HashMap<String, Duration>,
    /// Where the committer records a store failure it cannot wait out.
    pub fate: crate::fate::Fate,
    /// The endpoints that want each kind of notification: a job that ends
    /// failed or succeeded puts its event in the outbox in the same step.
    pub notify: crate::model::notify::Routes,
    /// The committer makes the spans of jobs, attempts and commits for the
    /// trace export (`spans.rs`), and work orders carry their attempt's.
    pub traces: bool,
    /// How long a wait makes up for one level of priority (`dispatch::Aging`).
    pub priority_aging: Duration,
    /// Maintenance windows follow the database's clock (in a cluster): until
    /// `EngineHandle::database_clock` first tells it, job types with windows
    /// stay closed.
    pub database_clock: bool,
}

/// Work orders for handlers connected elsewhere, with the handler they are for.
pub type ForeignOrders = tokio::sync::mpsc::UnboundedSender<(crate::model::HandlerId, crate::dispatch::WorkOrder)>;

impl Default for Options {
    fn default() -> Options {
        Options {
            instance: HandlerId::new(),
            orphans: Orphans::Keep { grace: Duration::from_secs(30) },
            lost_attempt_limit: 3,
            max_commands_per_iteration: 8192,
            foreign_orders: None,
            rollback_windows: HashMap::new(),
            fate: crate::fate::Fate::default(),
            notify: crate::model::notify::Routes::default(),
            traces: false,
            priority_aging: Duration::from_secs(600),
            database_clock: false,
        }
    }
}

/// An attempt a handler holds now, as the views of workers show it.
#[derive(Clone, Debug)]
pub struct HeldAttempt {
    pub job: JobId,
    pub task_id: String,
    pub attempt: u32,
    pub handler: HandlerId,
    /// When it started on its worker: `None` while only assigned.
    pub started_at: Option<Timestamp>,
}

/// A task of a job, by its id or its index.
#[derive(Debug)]
pub enum TaskKey {
    Id(String),
    Index(usize),
}

/// One task of a job led here: the job's spec, its index and its record.
pub type OneTask = (Arc<crate::model::JobSpec>, usize, crate::model::TaskRecord);

/// A summary of a job for progress displays.
#[derive(Clone, Debug)]
pub struct Summary {
    pub record: JobRecord,
    pub counts: StateCounts,
}

/// A change that watchers see, after it is durable.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    Task {
        job: JobId,
        idx: u32,
        state: TaskState,
        attempt: u32,
        error: Option<String>,
        handler: Option<HandlerId>,
        at: Timestamp,
        progress_percent: f32,
        stage: String,
    },
    Job {
        job: JobId,
        state: JobState,
        at: Timestamp,
    },
}

/// Progress a handler reports for an attempt it holds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Progress {
    pub percent: f32,
    pub stage: String,
    pub message: String,
}

/// The longest stage line a task keeps, in bytes.
pub const MAX_STAGE_LEN: usize = 512;

impl Progress {
    /// The line a task keeps as its stage: the stage and the message beside
    /// it (`starting: rate=50/s`), either alone when the other is empty,
    /// cut at [`MAX_STAGE_LEN`] bytes.
    pub fn stage_line(&self) -> String {
        let (stage, message) = (self.stage.trim(), self.message.trim());
        let mut line = match (stage.is_empty(), message.is_empty() || message == stage) {
            (_, true) => stage.to_string(),
            (true, false) => message.to_string(),
            (false, false) => format!("{stage}: {message}"),
        };
        if line.len() > MAX_STAGE_LEN {
            let mut end = MAX_STAGE_LEN;
            while !line.is_char_boundary(end) {
                end -= 1;
            }
            line.truncate(end);
        }
        line
    }
}

/// The engine itself; `start` loads the store and returns its handle.
pub struct Engine;

impl Engine {
    /// Loads every active job, makes start-up repairs durable, then runs the
    /// loop and the committer until every handle is dropped.
    pub async fn start(store: Arc<dyn Store>, clock: Arc<dyn Clock>, options: Options) -> Result<EngineHandle, Error> {
        let (loaded, cooling, names, priorities, shares) = {
            let store = store.clone();
            tokio::task::spawn_blocking(move || -> Result<_, store::Error> {
                Ok((
                    store.load_active()?,
                    store.settings(core::COOLING)?,
                    store.settings(core::HANDLER_NAME)?,
                    store.settings(core::PRIORITY_PREFIX)?,
                    store.settings(core::SHARE)?,
                ))
            })
            .await
            .map_err(|_| Error::Stopped)??
        };
        let (events, _) = broadcast::channel(65_536);
        let fate = options.fate.clone();
        let traces = options.traces;
        let mut core = core::Core::new(options, events.clone());
        core.remember(cooling, names, shares);
        core.remember_priorities(priorities);
        let mut step = core::Step::default();
        core.restore(loaded, clock.now(), &mut step);
        if !step.batch.is_empty() {
            let store = store.clone();
            let batch = std::mem::take(&mut step.batch);
            tokio::task::spawn_blocking(move || store.write(&batch).and_then(|()| store.flush()))
                .await
                .map_err(|_| Error::Stopped)??;
        }
        let (commands_tx, commands_rx) = mpsc::channel(65_536);
        let (steps_tx, steps_rx) = mpsc::channel(64);
        let commit_observer: Arc<std::sync::OnceLock<CommitObserver>> = Arc::default();
        let endings = Arc::new(Endings::default());
        let ready = Arc::new(Readiness::default());
        let (stop, done) = (CancellationToken::new(), CancellationToken::new());
        committer::spawn(
            store.clone(),
            steps_rx,
            events.clone(),
            committer::Observers { commit: commit_observer.clone(), endings: endings.clone(), traces },
            ready.clone(),
            fate.clone(),
            done.clone(),
        )
        .map_err(|e| Error::Store(store::Error::Io(e.to_string())))?;
        // Steps made while restoring (orphans requeued, jobs finalized) go first.
        if !step.actions.is_empty() {
            let _ = steps_tx.send(step).await;
        }
        let removals = core.removals();
        // The loop ends when `stop` is cancelled (`EngineHandle::close`, which
        // waits for the committer's last step after it) or when every handle
        // is gone. Its watcher ends with it, and makes a panic the server's
        // fate, so that no loop dies unheard.
        let run = tokio::spawn(run_loop::run(core, clock, commands_rx, steps_tx, stop.clone()));
        tokio::spawn(fatal_if_it_panics(run, fate.clone()));
        let lifetime = handle::Lifetime { ready, removals, fate, stop, done, endings };
        Ok(EngineHandle::new(commands_tx, store, events, commit_observer, lifetime))
    }
}

/// The waiters of each job, answered when it ends.
type Waiters = HashMap<JobId, Vec<tokio::sync::oneshot::Sender<Option<JobRecord>>>>;

/// Records the engine loop's panic as the server's fate: nothing else would
/// notice that no step is taken any more.
async fn fatal_if_it_panics(run: tokio::task::JoinHandle<()>, fate: crate::fate::Fate) {
    if let Err(error) = run.await {
        if error.is_panic() {
            fate.meet(crate::fate::Fatal::Engine(crate::fate::panic_text(error)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(stage: &str, message: &str) -> String {
        Progress { percent: 0.0, stage: stage.into(), message: message.into() }.stage_line()
    }

    #[tokio::test]
    async fn a_loop_that_panics_is_the_server_s_fate_and_one_that_ends_is_not() {
        let fate = crate::fate::Fate::default();
        fatal_if_it_panics(tokio::spawn(async {}), fate.clone()).await;
        assert_eq!(fate.fatal(), None, "a loop that ends (its handles gone, or stopped) is no failure");
        fatal_if_it_panics(tokio::spawn(async { panic!("an invariant broke") }), fate.clone()).await;
        assert_eq!(fate.fatal(), Some(&crate::fate::Fatal::Engine("an invariant broke".into())));
    }

    #[test]
    fn a_stage_line_keeps_the_stage_and_its_message() {
        assert_eq!(line("starting", "rate=50/s burst=5"), "starting: rate=50/s burst=5");
        assert_eq!(line("copying", ""), "copying");
        assert_eq!(line("", "half way"), "half way");
        assert_eq!(line("done", "done"), "done");
        assert_eq!(line("", ""), "");
        let long = line("stage", &"é".repeat(600));
        assert!(long.len() <= MAX_STAGE_LEN && long.starts_with("stage: é"), "{}", long.len());
    }
}

/// Whether the store takes writes now, and since when: nothing is
/// acknowledged while it does not, and nothing that waited meanwhile could
/// have gone out before it did again.
#[derive(Debug)]
pub struct Readiness {
    ready: std::sync::atomic::AtomicBool,
    since: std::sync::Mutex<std::time::Instant>,
}

impl Default for Readiness {
    fn default() -> Readiness {
        Readiness { ready: true.into(), since: std::sync::Mutex::new(std::time::Instant::now()) }
    }
}

impl Readiness {
    pub fn is_ready(&self) -> bool {
        self.ready.load(std::sync::atomic::Ordering::Acquire)
    }

    /// How long the store has taken writes without a break, if it does now.
    pub fn ready_for(&self) -> Option<std::time::Duration> {
        self.is_ready().then(|| self.since.lock().expect("readiness lock").elapsed())
    }

    /// Sets whether the store takes writes; returns what it was.
    pub(crate) fn set(&self, ready: bool) -> bool {
        // `since` is held while the flag changes: a reader that sees the
        // store ready again waits for the new `since`, never the old one.
        let mut since = self.since.lock().expect("readiness lock");
        let was = self.ready.swap(ready, std::sync::atomic::Ordering::AcqRel);
        if ready && !was {
            *since = std::time::Instant::now();
        }
        was
    }
}
