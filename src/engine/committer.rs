//! The committer thread: writes every step it has as one batch, flushes
//! once (group commit), and only then performs the steps' actions: work
//! orders as soon as the batch is durable, replies and events once reads
//! see it too. A store that is away for a while (a database
//! restarting) is waited for: the same batch is flushed again with backoff,
//! nothing is acknowledged meanwhile, and the engine reports itself not
//! ready. Any other store error is fail-stop: the thread records it in the
//! engine's `Fate` and ends, so that nothing after it is acknowledged. Its crash points are in
//! `crate::crash`.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{broadcast, mpsc};

use super::core::{Action, Step};
use super::spans::{self, Spans};
use super::Event;
use crate::backoff::Backoff;
use crate::crash::CrashPoint;
use crate::dispatch::WorkOrder;
use crate::fate::{Fatal, Fate};
use crate::store::{self, Batch, Store};

/// Called after each group commit with the time of its write and flush, and of the flush alone.
pub type CommitObserver = Arc<dyn Fn(std::time::Duration, std::time::Duration) + Send + Sync>;

/// What the committer tells of its commits: their timings, to the observer
/// the server sets, the jobs that ended, and with `traces` the spans of
/// jobs, attempts and commits.
pub(super) struct Observers {
    pub(super) commit: Arc<std::sync::OnceLock<CommitObserver>>,
    pub(super) endings: Arc<Endings>,
    pub(super) traces: bool,
}

/// The jobs that ended here since the start, by how, counted once their
/// end is durable.
#[derive(Debug, Default)]
pub struct Endings {
    succeeded: std::sync::atomic::AtomicU64,
    failed: std::sync::atomic::AtomicU64,
    canceled: std::sync::atomic::AtomicU64,
}

impl Endings {
    fn count(&self, state: crate::model::JobState) {
        use crate::model::JobState;
        let counter = match state {
            JobState::Succeeded => &self.succeeded,
            JobState::Failed => &self.failed,
            JobState::Canceled => &self.canceled,
            JobState::Pending | JobState::Running => return,
        };
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Each end and its count.
    pub fn counts(&self) -> [(crate::model::JobState, u64); 3] {
        use crate::model::JobState;
        let load = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        [
            (JobState::Succeeded, load(&self.succeeded)),
            (JobState::Failed, load(&self.failed)),
            (JobState::Canceled, load(&self.canceled)),
        ]
    }
}

pub(super) fn spawn(
    store: Arc<dyn Store>,
    steps: mpsc::Receiver<Step>,
    events: broadcast::Sender<Event>,
    observers: Observers,
    ready: Arc<super::Readiness>,
    fate: Fate,
    done: tokio_util::sync::CancellationToken,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("jobcenter-commit".into())
        .spawn(move || {
            if let Err(fatal) = run(store, steps, events, &observers, ready) {
                // The receiver drops with this thread: the engine loop stops
                // at its next step and nothing more is acknowledged.
                fate.meet(fatal);
            }
            done.cancel();
        })
        .map(|_| ())
}

fn run(
    store: Arc<dyn Store>,
    mut steps: mpsc::Receiver<Step>,
    events: broadcast::Sender<Event>,
    observers: &Observers,
    ready: Arc<super::Readiness>,
) -> Result<(), Fatal> {
    let (observer, endings) = (&observers.commit, &observers.endings);
    let mut pending: Vec<Step> = Vec::new();
    let mut spans = observers.traces.then(Spans::default);
    let crash = CrashPoint::from_env();
    while let Some(step) = steps.blocking_recv() {
        pending.push(step);
        while let Ok(step) = steps.try_recv() {
            pending.push(step);
        }
        let batch = Batch::concat(pending.iter_mut().map(|step| std::mem::take(&mut step.batch)));
        if !batch.is_empty() {
            let commit = spans.as_mut().map(|spans| {
                spans.observe(&batch);
                spans::commit(&batch, pending.len())
            });
            let started = std::time::Instant::now();
            until_available(&ready, || store.write(&batch))?;
            crash.reached("before-flush");
            let flush_started = std::time::Instant::now();
            let mut sent = false;
            // Work orders go out once the batch is durable; replies and
            // events once reads see it too.
            until_available(&ready, || {
                store.flush_then(&mut || {
                    if !std::mem::replace(&mut sent, true) {
                        crash.reached("after-flush");
                        send_orders(&mut pending, &events, spans.as_ref());
                    }
                })
            })?;
            let (took, flush_took) = (started.elapsed(), flush_started.elapsed());
            if let Some(observe) = observer.get() {
                observe(took, flush_took);
            }
            if let Some(commit) = commit {
                commit.record("duration_ms", took.as_secs_f64() * 1000.0);
                commit.record("flush_ms", flush_took.as_secs_f64() * 1000.0);
            }
            // A job record is written in an ended state once per end.
            for record in &batch.jobs {
                endings.count(record.state);
            }
        }
        for step in pending.drain(..) {
            for action in step.actions {
                perform(action, &events);
            }
        }
    }
    Ok(())
}

fn perform(action: Action, events: &broadcast::Sender<Event>) {
    match action {
        Action::Send { sink, order } => {
            let _ = sink.send(order);
        }
        Action::Foreign { to, handler, order } => {
            let _ = to.send((handler, order));
        }
        Action::Reply(reply) => reply(),
        Action::Answer(answer, result) => answer(result),
        Action::Event(event) => {
            let _ = events.send(event);
        }
    }
}

/// Sends the steps' work orders, each with its attempt's span when traced,
/// leaving their other actions in order.
fn send_orders(steps: &mut [Step], events: &broadcast::Sender<Event>, spans: Option<&Spans>) {
    for step in steps {
        // Collected in place: the actions kept reuse the list's allocation.
        step.actions = std::mem::take(&mut step.actions)
            .into_iter()
            .filter_map(|mut action| {
                if let (Some(spans), Action::Send { order: WorkOrder::Execute(assignment), .. }) = (spans, &mut action)
                {
                    assignment.traceparent = spans.traceparent(assignment.attempt);
                }
                match action {
                    Action::Send { .. } | Action::Foreign { .. } => {
                        perform(action, events);
                        None
                    }
                    other => Some(other),
                }
            })
            .collect();
    }
}

/// Runs a store call until it succeeds while the store is only away
/// (backing off from 50 ms to 5 s, reporting the engine not ready
/// meanwhile). Any other failure is fail-stop: nothing after it may be
/// acknowledged.
fn until_available(ready: &super::Readiness, mut call: impl FnMut() -> Result<(), store::Error>) -> Result<(), Fatal> {
    let mut pauses = Backoff::doubling(Duration::from_millis(50), Duration::from_secs(5));
    loop {
        match call() {
            Ok(()) => {
                if !ready.set(true) {
                    tracing::warn!("the store is back: acknowledging again");
                }
                return Ok(());
            }
            Err(e) if e.is_transient() => {
                if ready.set(false) {
                    tracing::error!(error = %e, "the store is away: nothing is acknowledged until it is back");
                }
                std::thread::sleep(pauses.next_pause());
            }
            Err(e @ store::Error::Fenced { .. }) => {
                tracing::warn!(error = %e, "write refused: this instance was deactivated");
                return Err(Fatal::Deactivated);
            }
            Err(e) => return Err(Fatal::Store(e.to_string())),
        }
    }
}
