//! Maintenance windows in the engine: each job type with windows is open or
//! closed by its calendar, read on the database's clock in a cluster (the
//! engine's own clock plus the offset the heartbeats measure). A closed type
//! is not dispatched; what runs when its window closes drains within the
//! grace, or is canceled at once (`on_window_close`). A canceled attempt
//! ends through `Core::end` as a loss that does not count: its task is ready
//! again, and waits for the next window, with no try spent.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{Core, Step};
use crate::clock::Timestamp;
use crate::follower::Loss;
use crate::windows::{OnClose, Window};

/// How often a calendar with no change within its horizon is read again.
const RECHECK_MS: i64 = 86_400_000;
/// How much the database clock's measured offset may vary between two
/// heartbeats without being taken (the round trip's noise).
const OFFSET_NOISE_MS: i64 = 50;

/// The windows of every job type that has some.
#[derive(Default)]
pub(super) struct Windows {
    types: BTreeMap<Arc<str>, TypeWindow>,
    /// The database's clock minus the engine's, in ms; `None` in a cluster
    /// until the first heartbeat measured it (until then, every type with
    /// windows stays closed, and nothing of it is canceled).
    offset_ms: Option<i64>,
    /// When a type's window must be read again, on the engine's clock.
    due: Option<Timestamp>,
}

struct TypeWindow {
    window: Arc<Window>,
    open: bool,
    /// When its calendar next changes, on the calendar's clock.
    next_change: Option<Timestamp>,
    /// Since when it has been closed, on the engine's clock (`None` while
    /// open, or while the calendar's clock is unknown).
    closed_at: Option<Timestamp>,
    /// Its window or the clock changed: read it again at the next turn.
    stale: bool,
}

impl TypeWindow {
    /// When what still runs of the type is canceled, while closed: at once,
    /// or at the end of the drain's grace (none when the grace is 0).
    fn cancel_at(&self) -> Option<Timestamp> {
        let closed_at = self.closed_at?;
        match (self.window.on_close, self.window.grace_seconds) {
            (OnClose::Cancel, _) => Some(closed_at),
            (OnClose::Drain, 0) => None,
            (OnClose::Drain, grace) => Some(closed_at.plus_seconds(u64::from(grace))),
        }
    }
}

impl Windows {
    /// Windows alone read the engine's own clock; in a cluster they wait
    /// for the database's.
    pub(super) fn new(database_clock: bool) -> Windows {
        Windows { offset_ms: (!database_clock).then_some(0), ..Windows::default() }
    }

    /// The next time the loop must wake for a window: a change, or the end of a drain.
    pub(super) fn next_wake(&self) -> Option<Timestamp> {
        self.due
    }
}

impl Core {
    /// A job type's windows changed (`None`: it is always open): applied at the next turn.
    pub(super) fn set_window(&mut self, job_type: Arc<str>, window: Option<Arc<Window>>, now: Timestamp) {
        let windows = &mut self.windows;
        match window {
            None => {
                if windows.types.remove(&job_type).is_some() {
                    tracing::info!(job_type = %job_type, "the job type has no maintenance windows now: always open");
                }
                self.dispatch.set_closed(job_type, false);
            }
            Some(window) => match windows.types.get_mut(&job_type) {
                Some(known) if known.window == window => {}
                Some(known) => {
                    known.window = window;
                    known.stale = true;
                }
                None => {
                    // Closed until read, when the calendar's clock is not known yet.
                    let open = windows.offset_ms.is_some();
                    self.dispatch.set_closed(job_type.clone(), !open);
                    let known = TypeWindow { window, open, next_change: None, closed_at: None, stale: true };
                    windows.types.insert(job_type, known);
                }
            },
        }
        self.windows.due = Some(now);
    }

    /// The database's clock is `offset_ms` ahead of the engine's (a
    /// heartbeat measured it). A change of less than `OFFSET_NOISE_MS` is
    /// the noise of the measure, and changes nothing.
    pub(super) fn set_database_clock(&mut self, offset_ms: i64, now: Timestamp) {
        let windows = &mut self.windows;
        if windows.offset_ms.is_some_and(|known| (known - offset_ms).abs() < OFFSET_NOISE_MS) {
            return;
        }
        windows.offset_ms = Some(offset_ms);
        windows.types.values_mut().for_each(|known| known.stale = true);
        windows.due = Some(now);
    }

    /// Reads each window that changed or is due, closing and opening its
    /// type, and cancels what still runs of a closed type whose time is up.
    pub(super) fn apply_windows(&mut self, now: Timestamp, step: &mut Step) {
        if self.windows.due.is_none_or(|due| due > now) {
            return;
        }
        let Some(offset) = self.windows.offset_ms else {
            self.windows.due = None;
            return;
        };
        let calendar_now = now.plus_millis(offset);
        let mut cancel = Vec::new();
        let mut due: Option<Timestamp> = None;
        for (job_type, known) in &mut self.windows.types {
            if known.stale || known.next_change.is_none_or(|at| at <= calendar_now) {
                known.stale = false;
                let state = known.window.calendar.state(calendar_now);
                if state.open != known.open {
                    let change = if state.open { "opened" } else { "closed" };
                    tracing::info!(job_type = %job_type, running = self.dispatch.running(job_type), "maintenance window {change}");
                }
                known.open = state.open;
                known.next_change = Some(state.next_change.unwrap_or(calendar_now.plus_millis(RECHECK_MS)));
                known.closed_at = if known.open { None } else { Some(known.closed_at.unwrap_or(now)) };
                self.dispatch.set_closed(job_type.clone(), !known.open);
            }
            // Only what this instance holds is its to cancel.
            let cancel_at = known.cancel_at().filter(|_| self.attempts.runs_of_type(job_type));
            if cancel_at.is_some_and(|at| at <= now) {
                cancel.push((job_type.clone(), known.window.on_close, known.window.grace_seconds));
            }
            let wake = [known.next_change.map(|at| at.plus_millis(-offset)), cancel_at.filter(|at| *at > now)];
            due = wake.into_iter().flatten().chain(due).min();
        }
        self.windows.due = due;
        for (job_type, on_close, grace) in cancel {
            self.cancel_of_type(&job_type, on_close, grace, now, step);
        }
    }

    /// Cancels every attempt of `job_type` held here: each handler is told
    /// to stop, and each task is ready again, the loss not counted.
    fn cancel_of_type(&mut self, job_type: &str, on_close: OnClose, grace: u32, now: Timestamp, step: &mut Step) {
        let reason = match on_close {
            OnClose::Cancel => format!("canceled when the maintenance window of {job_type} closed; it runs again when the window opens"),
            OnClose::Drain => format!("canceled when the maintenance window of {job_type} had been closed for its grace of {grace} s; it runs again when the window opens"),
        };
        let attempts = self.attempts.of_type(job_type);
        tracing::info!(job_type, attempts = attempts.len(), "canceling what runs outside the maintenance window");
        for attempt in attempts {
            let Some(handler) = self.attempts.get(attempt.task).map(|held| held.handler) else { continue };
            self.cancel_attempt(handler, attempt.task, attempt.number, step);
            self.lose(attempt, &Loss::NotCounted(reason.clone()), now, step);
        }
    }
}
