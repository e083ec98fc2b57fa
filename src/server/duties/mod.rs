//! The server's background duties in one supervised set. Each duty is a
//! loop meant to run until the server stops; one that panics or ends early
//! is reported and started again after a pause, never lost silently. A stop
//! goes in a stated order: the duties that take work end first, the
//! cluster's heartbeats last, after the jobs were handed over. A fatal
//! condition (`crate::fate`) ends them all without a restart.
//!
//! The duties of the server itself are here too: the scheduler's
//! detections (`scheduler`), the recovery check (`recovery`) and pruning
//! (`retention`), with the single-flight gates they share (`flight`). The
//! cluster's duties are in `super::cluster`, SeaweedFS's in
//! `super::seaweedfs`.

mod flight;
pub(crate) mod recovery;
pub(crate) mod retention;
pub(crate) mod scheduler;
pub(crate) mod schedules;

use std::future::Future;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::backoff::Backoff;
use crate::fate::Fate;

/// When a duty ends in a stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stage {
    /// With the first step: it takes or makes work (detections, recovery,
    /// borrowing, pruning, the SeaweedFS locks).
    Intake,
    /// Once the jobs are handed over: it keeps this instance a member of its
    /// cluster (heartbeats, the fence) until then.
    Membership,
}

/// Why a duty's run asked for now (a recovery check, a prune, a detection)
/// did not happen or did not finish.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DutyError {
    /// One of its kind is running: try again when it has ended.
    #[error("{0}")]
    Busy(String),
    /// It cannot run now: what it needs is away (the store, a detector, the
    /// master's lock, another instance's answer).
    #[error("{0}")]
    NotNow(String),
    /// It ran and failed.
    #[error("{0}")]
    Failed(String),
    #[error(transparent)]
    Engine(#[from] crate::engine::Error),
    #[error(transparent)]
    Store(#[from] crate::store::Error),
}

/// The pause before a duty that failed starts again, doubling up to the most.
const FIRST_PAUSE: Duration = Duration::from_secs(1);
const MOST_PAUSE: Duration = Duration::from_secs(30);

/// The supervised set. Cheap to clone.
#[derive(Clone, Debug)]
pub(crate) struct Duties {
    intake: Group,
    membership: Group,
    fate: Fate,
}

/// The duties of one stage: their tasks, and what ends them.
#[derive(Clone, Debug, Default)]
struct Group {
    tasks: TaskTracker,
    stop: CancellationToken,
}

impl Group {
    async fn end(&self) {
        self.stop.cancel();
        self.tasks.close();
        self.tasks.wait().await;
    }
}

impl Duties {
    pub(crate) fn new(fate: Fate) -> Duties {
        Duties { intake: Group::default(), membership: Group::default(), fate }
    }

    fn group(&self, stage: Stage) -> &Group {
        match stage {
            Stage::Intake => &self.intake,
            Stage::Membership => &self.membership,
        }
    }

    /// Keeps the loop `duty` makes running until its stage of a stop: one
    /// that panics or ends before it is started again after a pause (1 s,
    /// doubling to 30 s, back to 1 s after a run of 30 s or more) and
    /// reported at error level each time. Nothing is
    /// started again once a fatal condition was met.
    pub(crate) fn keep<F, Fut>(&self, name: &'static str, stage: Stage, duty: F)
    where
        F: Fn() -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let group = self.group(stage);
        let stop = group.stop.clone();
        let fate = self.fate.clone();
        group.tasks.spawn(async move {
            let mut pauses = Backoff::doubling(FIRST_PAUSE, MOST_PAUSE);
            loop {
                let began = tokio::time::Instant::now();
                let mut run = tokio::spawn(duty());
                let ended = tokio::select! {
                    ended = &mut run => ended,
                    () = stop.cancelled() => {
                        run.abort();
                        let _ = run.await;
                        return;
                    }
                };
                if fate.fatal().is_some() || stop.is_cancelled() {
                    return;
                }
                // A duty that ran a good while before it failed starts at the first pause again.
                if began.elapsed() >= MOST_PAUSE {
                    pauses.reset();
                }
                let pause = pauses.next_pause();
                match ended {
                    Ok(()) => tracing::error!(duty = name, pause_ms = pause.as_millis() as u64, "duty ended early; starting it again"),
                    Err(e) => tracing::error!(duty = name, error = %crate::fate::panic_text(e), pause_ms = pause.as_millis() as u64, "duty panicked; starting it again"),
                }
                tokio::select! {
                    () = tokio::time::sleep(pause) => {}
                    () = stop.cancelled() => return,
                }
            }
        });
    }

    /// Runs a one-off piece of a duty (a detection, a deferred check) in the
    /// set: it ends at the first step of a stop if it has not by then.
    pub(crate) fn spawn<Fut>(&self, work: Fut)
    where
        Fut: Future<Output = ()> + Send + 'static,
    {
        let stop = self.intake.stop.clone();
        self.intake.tasks.spawn(async move {
            tokio::select! {
                () = work => {}
                () = stop.cancelled() => {}
            }
        });
    }

    /// The first step of a stop: every duty that takes or makes work has
    /// ended when this returns.
    pub(crate) async fn stop_intake(&self) {
        self.intake.end().await;
    }

    /// The last step: every duty has ended when this returns.
    pub(crate) async fn stop_all(&self) {
        self.intake.end().await;
        self.membership.end().await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_duty_that_panics_is_started_again() {
        let duties = Duties::new(Fate::default());
        let runs = Arc::new(AtomicU32::new(0));
        let counted = runs.clone();
        duties.keep("flaky", Stage::Intake, move || {
            let counted = counted.clone();
            async move {
                if counted.fetch_add(1, Ordering::SeqCst) < 2 {
                    panic!("boom");
                }
                std::future::pending::<()>().await;
            }
        });
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 3, "two panics, then a run that lasts");
        duties.stop_all().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_duty_that_ends_early_is_started_again_and_a_stop_ends_it() {
        let duties = Duties::new(Fate::default());
        let runs = Arc::new(AtomicU32::new(0));
        let counted = runs.clone();
        duties.keep("short", Stage::Membership, move || {
            let counted = counted.clone();
            async move {
                counted.fetch_add(1, Ordering::SeqCst);
            }
        });
        // Pauses of 1, 2, 4 and 8 s: five runs within 16 s.
        tokio::time::sleep(Duration::from_millis(15_500)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 5);
        duties.stop_intake().await;
        tokio::time::sleep(Duration::from_secs(20)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 6, "a membership duty outlives the first step of a stop");
        duties.stop_all().await;
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 6, "nothing runs after the stop");
    }

    #[tokio::test(start_paused = true)]
    async fn a_duty_that_ran_a_good_while_starts_again_after_the_first_pause() {
        let duties = Duties::new(Fate::default());
        let runs = Arc::new(AtomicU32::new(0));
        let counted = runs.clone();
        duties.keep("long", Stage::Intake, move || {
            let counted = counted.clone();
            async move {
                counted.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_secs(40)).await;
            }
        });
        // Runs of 40 s with pauses of 1 s: starts at 0, 41 and 82 s (not 83,
        // as a second pause of 2 s would give).
        tokio::time::sleep(Duration::from_millis(82_500)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 3);
        duties.stop_all().await;
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_starts_again_after_a_fatal_condition() {
        let fate = Fate::default();
        let duties = Duties::new(fate.clone());
        let runs = Arc::new(AtomicU32::new(0));
        let (counted, meets) = (runs.clone(), fate.clone());
        duties.keep("heartbeats", Stage::Membership, move || {
            let (counted, meets) = (counted.clone(), meets.clone());
            async move {
                counted.fetch_add(1, Ordering::SeqCst);
                meets.meet(crate::fate::Fatal::Deactivated);
            }
        });
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        duties.stop_all().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_one_off_piece_ends_with_the_intake() {
        let duties = Duties::new(Fate::default());
        let finished = Arc::new(AtomicU32::new(0));
        let marked = finished.clone();
        duties.spawn(async move {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            marked.fetch_add(1, Ordering::SeqCst);
        });
        duties.stop_all().await;
        assert_eq!(finished.load(Ordering::SeqCst), 0);
    }
}
