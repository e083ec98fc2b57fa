//! What outlives a session: the running executions, the outcomes kept
//! until an admin acknowledges them, and the lease that gives every
//! execution up when no admin renews it in time.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use tokio::task::{JoinError, JoinSet};
use tokio::time::Instant;

use super::executions::{Execution, Executions};
use super::messages::{job_completed, refusal};
use super::{sleep_until, Worker};
use crate::follower::Outcome;
use crate::proto::plugin::JobCompleted;
use crate::wire;

/// An outcome kept until an admin acknowledges it.
pub(super) struct Ended {
    pub(super) completed: JobCompleted,
    /// When it was last sent, in this session.
    pub(super) sent: Option<Instant>,
}

/// What outlives a session: the running executions, the outcomes that no
/// admin has acknowledged yet, and when an admin was last heard from.
pub(super) struct Work {
    pub(super) lease: Duration,
    pub(super) executions: Executions,
    /// The executions' futures; dropping the set drops them all.
    pub(super) tasks: JoinSet<Outcome>,
    /// By job id, oldest first in `order`.
    pub(super) unacknowledged: BTreeMap<String, Ended>,
    /// The lease runs from here: when the worker sent the newest hello or
    /// heartbeat that an admin renewed (not when the renewal arrived, which
    /// a slow or partitioned network can hold up past the admin's count).
    pub(super) renewed_as_of: Instant,
    /// The last admin renewed the lease: executions outlive its stream, and
    /// are given up when the lease runs out.
    pub(super) keeps_work: bool,
    /// Set when the table of executions changed, for the next heartbeat.
    pub(super) changed: bool,
    /// Executions canceled before their order arrived (a cancel and its
    /// execute order can take different paths): their order is refused.
    pub(super) canceled_unseen: CanceledUnseen,
}

/// The targets of cancels that found nothing, the newest kept.
#[derive(Default)]
pub(super) struct CanceledUnseen {
    order: std::collections::VecDeque<String>,
    targets: std::collections::HashSet<String>,
}

/// How many such targets are kept.
const CANCELED_UNSEEN_KEPT: usize = 4096;

impl CanceledUnseen {
    pub(super) fn insert(&mut self, target: &str) {
        if self.targets.insert(target.to_string()) {
            self.order.push_back(target.to_string());
            if self.order.len() > CANCELED_UNSEEN_KEPT {
                if let Some(oldest) = self.order.pop_front() {
                    self.targets.remove(&oldest);
                }
            }
        }
    }

    /// Whether `job_id` was canceled before its order arrived.
    pub(super) fn contains(&self, job_id: &str) -> bool {
        !self.targets.is_empty() && self.targets.contains(job_id)
    }
}

impl Work {
    pub(super) fn new(lease: Duration) -> Work {
        Work {
            lease,
            executions: Executions::new(0),
            tasks: JoinSet::new(),
            unacknowledged: BTreeMap::new(),
            renewed_as_of: Instant::now(),
            keeps_work: false,
            changed: false,
            canceled_unseen: CanceledUnseen::default(),
        }
    }

    /// An admin renewed the lease as of `sent`, when the hello or heartbeat
    /// it answers left.
    pub(super) fn renewed_as_of(&mut self, sent: Instant) {
        self.renewed_as_of = self.renewed_as_of.max(sent);
    }

    /// When the lease runs out, if it binds now.
    pub(super) fn lease_deadline(&self) -> Option<Instant> {
        (self.keeps_work && self.executions.len() > 0).then_some(self.renewed_as_of + self.lease)
    }

    /// Runs `future` while executions go on: an execution that ends keeps
    /// its outcome for the next session, and every execution is given up
    /// when the lease runs out.
    pub(super) async fn meanwhile<F: Future>(&mut self, worker: &Worker, future: F) -> F::Output {
        tokio::pin!(future);
        loop {
            let lease = self.lease_deadline();
            tokio::select! {
                output = &mut future => return output,
                Some(joined) = self.tasks.join_next_with_id(), if !self.tasks.is_empty() => {
                    if let Some(completed) = self.finished(worker, joined) {
                        self.keep(completed, None);
                    }
                }
                () = sleep_until(lease), if lease.is_some() => self.give_up_all(worker),
            }
        }
    }

    /// An execution's future ended: its outcome, unless a cancel already reported it.
    pub(super) fn finished(
        &mut self,
        worker: &Worker,
        joined: Result<(tokio::task::Id, Outcome), JoinError>,
    ) -> Option<JobCompleted> {
        let (task, result) = match joined {
            Ok((task, outcome)) => (task, Ok(outcome)),
            Err(e) => (e.id(), Err(e)),
        };
        let execution = self.executions.remove_task(task)?;
        self.changed = true;
        let outcome = match result {
            Ok(outcome) => outcome,
            Err(e) if e.is_panic() => Outcome::Failed { error: "the handler panicked".into(), output: Vec::new() },
            Err(_) => Outcome::Canceled { reason: "the execution was aborted".into() },
        };
        Some(ended(worker, execution, outcome))
    }

    /// Keeps an outcome until an admin acknowledges it (when the admin does).
    pub(super) fn keep(&mut self, completed: JobCompleted, sent: Option<Instant>) {
        if self.keeps_work {
            self.unacknowledged.insert(completed.job_id.clone(), Ended { completed, sent });
        }
    }

    /// The lease ran out: every execution stops, and its attempt is given up.
    pub(super) fn give_up_all(&mut self, worker: &Worker) {
        let running = self.executions.take_all();
        tracing::warn!(
            n_executions = running.len(),
            lease_ms = self.lease.as_millis() as u64,
            "no admin reached within the lease: giving up every execution"
        );
        for execution in running {
            execution.abort.abort();
            let completed = given_up(worker, execution, wire::LEASE_EXPIRED, "abandoned");
            self.keep(completed, None);
        }
        self.changed = true;
    }
}

/// The outcome of an execution that ran, logged and made a `JobCompleted`.
pub(super) fn ended(worker: &Worker, execution: Execution, outcome: Outcome) -> JobCompleted {
    let event = match &outcome {
        Outcome::Succeeded { .. } => "succeeded",
        Outcome::Failed { .. } => "failed",
        Outcome::Canceled { .. } => "canceled",
    };
    if let Some(log) = &worker.options.exec_log {
        log.record_event(execution.record.job, &execution.record.task_id, execution.record.attempt, event);
    }
    tracing::info!(work.id = %execution.job_id, job_type = %execution.job_type, outcome = event, "execution ended");
    execution.span.record("outcome", event);
    job_completed(execution.request_id, execution.job_id, execution.job_type, outcome, worker.clock.now())
}

/// An execution stopped without an outcome of its own: `error` tells the
/// admin why (its lease ran out, or the worker is stopping).
pub(super) fn given_up(worker: &Worker, execution: Execution, error: &str, event: &str) -> JobCompleted {
    if let Some(log) = &worker.options.exec_log {
        log.record_event(execution.record.job, &execution.record.task_id, execution.record.attempt, event);
    }
    tracing::warn!(work.id = %execution.job_id, job_type = %execution.job_type, error, "execution given up");
    execution.span.record("outcome", event);
    refusal(execution.request_id, execution.job_id, execution.job_type, error.to_string(), worker.clock.now())
}
