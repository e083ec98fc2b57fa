//! The steps that end an attempt, all through `Core::end`: a completion, a
//! loss (its handler gone, away too long, or back without it), a timeout,
//! a job failed whole, and a reconnected handler's reconciliation.

use std::collections::HashSet;
use std::sync::Arc;

use super::super::attempts::{Deadline, Ending};
use super::{Action, Core, Returned, Step, COOLING, HANDLER_NAME, SHARE};
use crate::clock::Timestamp;
use crate::dispatch::WorkOrder;
use crate::follower::{self, Loss, Outcome, Rejection};
use crate::leader;
use crate::model::{AttemptId, HandlerId, JobId, JobOrigin, TaskIdx, TaskRef};

impl Core {
    /// The one way an attempt ends, however it ended, held or borrowed: the
    /// ledger forgets it with its volume lock and deadline, and its slot is
    /// free again. One that did not succeed, of a type whose worker undoes
    /// it on its own, keeps its volume locked while that may run
    /// (`Options::rollback_windows`), in the store too.
    pub(super) fn end(&mut self, attempt: AttemptId, ending: Ending, now: Timestamp, step: &mut Step) {
        let Some(ended) = self.attempts.end(attempt, ending, now) else { return };
        self.dispatch.release_slot(ended.handler, &ended.job_type);
        if self.shares.end(attempt).is_some() {
            step.batch.settings.push((format!("{SHARE}{attempt}"), None));
        }
        if let Some((key, until)) = ended.cooling {
            tracing::info!(%attempt, resource = %key, until_ms = until.as_millis(), "an attempt that ended without success keeps its volume locked while its worker may undo it");
            step.batch.settings.push((format!("{COOLING}{key}"), Some(until.as_millis().to_be_bytes().to_vec())));
        }
    }

    /// Volumes whose cooling is over at `now` are forgotten (in the store too).
    pub(super) fn cooled(&mut self, now: Timestamp, step: &mut Step) {
        for key in self.attempts.cooled(now) {
            step.batch.settings.push((format!("{COOLING}{key}"), None));
        }
    }

    /// Tells a handler to stop an attempt, here or, when it is connected to
    /// another instance, there.
    pub(super) fn cancel_attempt(&self, handler: HandlerId, task: TaskRef, attempt: u32, step: &mut Step) {
        let order = WorkOrder::Cancel { attempt: AttemptId::new(task, attempt) };
        match (self.dispatch.sink(handler), &self.options.foreign_orders) {
            (Some(sink), _) => step.send(Some(sink), order),
            (None, Some(to)) => {
                step.actions.push(Action::Foreign { to: to.clone(), handler, order });
            }
            (None, None) => {}
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn complete(
        &mut self,
        task: TaskRef,
        attempt: u32,
        handler: HandlerId,
        outcome: Outcome,
        received: Option<std::time::Instant>,
        waited_ms: i64,
        now: Timestamp,
        step: &mut Step,
    ) -> Result<(), Rejection> {
        let Some(job) = self.jobs.get_mut(&task.job) else {
            return Err(Rejection::JobEnded { job: task.job });
        };
        let succeeded = matches!(outcome, Outcome::Succeeded { .. });
        // A report may name a task the job does not have: `complete` refuses it.
        let since = job.tasks.get(task.idx.index()).and_then(|t| t.assigned_at());
        let released = follower::complete(job, task.idx.0, attempt, handler, outcome, now, &mut step.batch)?;
        if let (true, Some(since), Some(held)) = (succeeded, since, self.attempts.get(task)) {
            let job_type = held.job_type.clone();
            // The handler's time, not the report's wait for this loop.
            let held_for = now.as_millis() - since.as_millis() - waited_ms;
            self.dispatch.record_duration(handler, &job_type, held_for, now);
        }
        let ending = if succeeded { Ending::Succeeded } else { Ending::Unsuccessful };
        self.end(AttemptId::new(task, attempt), ending, now, step);
        self.after_release(task.job, released, received, now, step);
        Ok(())
    }

    /// Every attempt held by `handler` is lost at once.
    pub(super) fn lose_handler(&mut self, handler: HandlerId, loss: &Loss, now: Timestamp, step: &mut Step) {
        for attempt in self.attempts.of_handler(handler) {
            self.lose_attempt(attempt, loss, now, step);
        }
    }

    /// The held attempt is gone with its handler. A scheduler job is not
    /// resubmitted: it fails whole, and the next detection proposes the work again.
    pub(super) fn lose_attempt(&mut self, attempt: AttemptId, loss: &Loss, now: Timestamp, step: &mut Step) {
        let from_scheduler = self
            .jobs
            .get(&attempt.task.job)
            .is_some_and(|job| matches!(job.record.origin, JobOrigin::Scheduler { .. }));
        if from_scheduler {
            let reason = format!("the scheduler job was failed, not resubmitted: {}", loss.reason());
            self.fail_job(attempt.task.job, &reason, now, step);
        } else {
            self.lose(attempt, loss, now, step);
        }
    }

    /// The attempt is lost, if it is still the one its task runs.
    pub(super) fn lose(&mut self, attempt: AttemptId, loss: &Loss, now: Timestamp, step: &mut Step) {
        let limit = self.options.lost_attempt_limit;
        let task = attempt.task;
        let Some(job) = self.jobs.get_mut(&task.job) else { return };
        let record = &job.tasks[task.idx.index()];
        if record.hold().is_none() || record.attempt != attempt.number {
            return;
        }
        let released = follower::lose(job, task.idx.0, loss, limit, now, &mut step.batch);
        self.end(attempt, Ending::Unsuccessful, now, step);
        self.after_release(task.job, released, None, now, step);
    }

    /// Fails a whole job: unfinished tasks fail, running ones are told to stop.
    pub(super) fn fail_job(&mut self, job_id: JobId, reason: &str, now: Timestamp, step: &mut Step) {
        let Some(job) = self.jobs.get_mut(&job_id) else { return };
        let running = leader::fail_job(job, reason, now, &mut step.batch);
        for (idx, attempt, handler) in running.running {
            let task = TaskRef { job: job_id, idx: TaskIdx(idx) };
            self.end(AttemptId::new(task, attempt), Ending::Unsuccessful, now, step);
            self.cancel_attempt(handler, task, attempt, step);
        }
        self.dispatch.forget_job(job_id);
        self.finalize(job_id, now, step);
    }

    /// Ends attempts that ran past their execution timeout (the handler is
    /// told to stop, and the attempt fails, and is retried if it may be),
    /// and takes back the attempts of handlers that did not come back in time.
    pub(super) fn expire(&mut self, now: Timestamp, step: &mut Step) {
        while let Some((at, attempt)) = self.attempts.overdue(now) {
            let task = attempt.task;
            let Some(handler) = self.attempts.get(task).map(|held| held.handler) else { break };
            let assigned_at = self.jobs.get(&task.job).and_then(|j| j.tasks[task.idx.index()].assigned_at());
            let seconds = at.millis_since(assigned_at.unwrap_or(at)) / 1000;
            self.cancel_attempt(handler, task, attempt.number, step);
            let error = format!("execution timed out after {seconds} s");
            let outcome = Outcome::Failed { error, output: Vec::new() };
            if let Err(rejection) = self.complete(task, attempt.number, handler, outcome, None, 0, now, step) {
                tracing::warn!(%attempt, %rejection, "timeout not applied");
                // Never leave a deadline that cannot be applied in the table.
                self.attempts.set_deadline(task, Deadline::OfType(None));
            }
        }
        while let Some((handler, reason)) = self.attempts.due_back(now) {
            tracing::warn!(%handler, held = self.dispatch.held_by(handler), "taking back the attempts of a handler that did not come back");
            self.lose_handler(handler, &Loss::WithWorker(reason), now, step);
        }
    }

    /// A worker without a lease connected as `handler`, under its id
    /// `name`: any other handler of that worker, away, dropped what it held
    /// when its stream broke, so its attempts end now (uncounted: the
    /// worker itself is fine) rather than when it is given up for gone.
    pub(super) fn returned(
        &mut self,
        handler: HandlerId,
        name: Arc<str>,
        now: Timestamp,
        step: &mut Step,
    ) -> Vec<Returned> {
        let before: Vec<HandlerId> = self
            .names
            .iter()
            .filter(|(old, old_name)| **old != handler && **old_name == name && !self.dispatch.has_handler(**old))
            .map(|(old, _)| *old)
            .collect();
        let mut ended = Vec::new();
        for old in before {
            self.attempts.back(old);
            self.names.remove(&old);
            step.batch.settings.push((format!("{HANDLER_NAME}{old}"), None));
            let reason = format!(
                "its worker {name} came back without it (a worker without a lease drops its work with its stream)"
            );
            for attempt in self.attempts.of_handler(old) {
                let Some(job) = self.jobs.get(&attempt.task.job) else { continue };
                let spec = &job.spec.tasks[attempt.task.idx.index()];
                ended.push(Returned {
                    attempt,
                    task_id: Arc::from(&*spec.id),
                    job_type: spec.job_type.clone(),
                    from_scheduler: matches!(job.record.origin, JobOrigin::Scheduler { .. }),
                });
                self.lose_attempt(attempt, &Loss::NotCounted(reason.clone()), now, step);
            }
        }
        if self.names.insert(handler, name.clone()).as_deref() != Some(&*name) {
            step.batch.settings.push((format!("{HANDLER_NAME}{handler}"), Some(name.as_bytes().to_vec())));
        }
        ended
    }

    /// Of these attempts, those the handler holds here.
    pub(super) fn held_by(&self, handler: HandlerId, attempts: Vec<AttemptId>) -> Vec<AttemptId> {
        attempts.into_iter().filter(|a| self.attempts.holds(handler, *a)).collect()
    }

    /// What an attempt a handler runs is here.
    fn holding(&self, handler: HandlerId, attempt: AttemptId) -> Holding {
        if self.attempts.holds(handler, attempt) {
            Holding::Held
        } else if self.jobs.contains_key(&attempt.task.job) {
            Holding::TakenBack
        } else {
            Holding::NotLedHere
        }
    }

    /// Of these attempts, those the handler holds here and those of jobs
    /// not led here; any other was taken back.
    pub(super) fn holdings(&self, handler: HandlerId, attempts: Vec<AttemptId>) -> crate::engine::Holdings {
        let mut holdings = crate::engine::Holdings::default();
        for attempt in attempts {
            match self.holding(handler, attempt) {
                Holding::Held => holdings.held.push(attempt),
                Holding::NotLedHere => holdings.not_led_here.push(attempt),
                Holding::TakenBack => {}
            }
        }
        holdings
    }

    /// A (re)connected handler says what it runs. On its first report
    /// (`dropped_before` set), attempts it was given before then, no longer
    /// runs and did not report on (`reported`: an outcome on its way to
    /// another instance, which may lead the job here by the time it comes
    /// back) are lost, uncounted (a worker that drops its work with its
    /// stream). Attempts it runs of jobs led here that it does not hold are
    /// returned, so that it is told to stop them: they were taken back while
    /// it was away; those of jobs not led here are returned apart.
    pub(super) fn reconcile(
        &mut self,
        handler: HandlerId,
        running: &HashSet<AttemptId>,
        reported: &HashSet<AttemptId>,
        dropped_before: Option<Timestamp>,
        now: Timestamp,
        step: &mut Step,
    ) -> crate::engine::Reconciled {
        let mut reconciled = crate::engine::Reconciled::default();
        for &attempt in running {
            match self.holding(handler, attempt) {
                Holding::Held => reconciled.adopted += 1,
                Holding::TakenBack => reconciled.not_held.push(attempt),
                Holding::NotLedHere => reconciled.not_led_here.push(attempt),
            }
        }
        if let Some(before) = dropped_before {
            for attempt in self.attempts.of_handler(handler) {
                let task = attempt.task;
                let assigned_at = self.jobs.get(&task.job).and_then(|j| j.tasks[task.idx.index()].assigned_at());
                let carried = running.contains(&attempt) || reported.contains(&attempt);
                if !carried && assigned_at.is_some_and(|at| at < before) {
                    reconciled.dropped += 1;
                    self.lose_attempt(attempt, &Loss::NotCounted("its worker no longer runs it".into()), now, step);
                }
            }
        }
        reconciled
    }
}

/// What an attempt a handler runs is to this engine.
enum Holding {
    /// The handler holds it here.
    Held,
    /// Its job is led here, and the handler does not hold it.
    TakenBack,
    /// Its job is not led here (another instance's, ended, or adopted and
    /// not loaded yet).
    NotLedHere,
}
