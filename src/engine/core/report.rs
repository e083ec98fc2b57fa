//! The steps a handler's reports make: an attempt started, its progress,
//! its outcome, or that it was given up.

use super::{task_event, Action, Core, ReportCommand, Step};
use crate::clock::Timestamp;
use crate::follower::{self, Rejection};
use crate::model::AttemptId;

impl Core {
    pub(super) fn apply_report(&mut self, command: ReportCommand, now: Timestamp, step: &mut Step) {
        match command {
            ReportCommand::Started { attempt: AttemptId { task, number: attempt }, handler, reply } => {
                let result = match self.jobs.get_mut(&task.job) {
                    Some(job) => follower::start(job, task.idx.0, attempt, handler, now),
                    None => Err(Rejection::JobEnded { job: task.job }),
                };
                if let Some(reply) = reply {
                    step.reply(reply, result);
                }
            }
            ReportCommand::Complete {
                attempt: AttemptId { task, number: attempt },
                handler,
                outcome,
                received,
                waited_ms,
                answer,
            } => {
                let result = self.complete(task, attempt, handler, outcome, received, waited_ms, now, step);
                if let Err(rejection) = &result {
                    tracing::warn!(job.id = %task.job, task.idx = task.idx.0, attempt, %handler, %rejection, "completion rejected");
                }
                step.answer(answer, result);
            }
            ReportCommand::Progress { attempt: AttemptId { task, number: attempt }, handler, progress } => {
                let Some(job) = self.jobs.get_mut(&task.job) else { return };
                if follower::start(job, task.idx.0, attempt, handler, now).is_ok() {
                    let stage = job.texts.text(&progress.stage_line());
                    let record = &mut job.tasks[task.idx.index()];
                    record.progress_percent = progress.percent;
                    record.stage = stage;
                    record.updated_at = now;
                    if self.events.receiver_count() > 0 {
                        step.actions.push(Action::Event(task_event(task.job, task.idx.0, record)));
                    }
                }
            }
            ReportCommand::GiveUp { attempt: AttemptId { task, number: attempt }, handler, loss, answer } => {
                let result = match self.jobs.get(&task.job) {
                    Some(job) => follower::check_holder(job, task.idx.0, attempt, handler),
                    None => Err(Rejection::JobEnded { job: task.job }),
                };
                match &result {
                    Ok(()) => self.lose(AttemptId::new(task, attempt), &loss, now, step),
                    Err(rejection) => {
                        tracing::warn!(job.id = %task.job, task.idx = task.idx.0, attempt, %handler, %rejection, reason = loss.reason(), "report refused");
                    }
                }
                step.answer(answer, result);
            }
        }
    }
}
