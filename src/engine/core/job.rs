//! The steps about jobs and their types: submit, cancel, retry, remove,
//! settings, limits and gates, and the recovery check's actions.

use super::super::Error;
use super::{Action, Core, JobCommand, Step};
use crate::active::ActiveJob;
use crate::clock::Timestamp;
use crate::leader;
use crate::model::audit;
use crate::model::{JobId, JobState, TaskIdx, TaskRef};

impl Core {
    pub(super) fn apply_job(&mut self, command: JobCommand, now: Timestamp, step: &mut Step) {
        match command {
            JobCommand::Submit { id, spec, origin, audit, reply } => {
                let (job, ready) = leader::submit(id, spec, origin, self.options.instance, now, &mut step.batch);
                tracing::info!(job.id = %id, job.name = %job.record.name, tasks = job.len(), "job submitted");
                self.jobs.insert(id, job);
                self.queue_ready(id, &ready, now);
                step.batch.settings.extend(audit.map(audit::Entry::into_setting));
                step.reply(reply, Ok(id));
            }
            JobCommand::Cancel { job, audit, reply } => {
                let result = match self.jobs.get_mut(&job) {
                    Some(active) => {
                        let running = leader::cancel(active, now, &mut step.batch);
                        for (idx, attempt, handler) in running.running {
                            self.cancel_attempt(handler, TaskRef { job, idx: TaskIdx(idx) }, attempt, step);
                        }
                        self.dispatch.forget_job(job);
                        self.finalize(job, now, step);
                        Ok(())
                    }
                    None => Err(Error::JobEnded(job)),
                };
                step.record(audit, &result);
                step.reply(reply, result);
            }
            JobCommand::Retry { job, removals, audit, reply } => {
                let id = job.record.id;
                let durable = self.removals_durable.load(std::sync::atomic::Ordering::Acquire);
                self.removing.retain(|_, number| *number > durable);
                if self.removing.contains_key(&id) {
                    step.reply(reply, Some(Err(Error::UnknownJob(id))));
                    return;
                }
                if durable != removals {
                    step.reply(reply, None);
                    return;
                }
                let result = if self.jobs.contains_key(&id) || !job.record.state.is_terminal() {
                    Err(Error::JobNotEnded(id))
                } else if job.record.state == JobState::Succeeded {
                    Err(Error::NothingToRetry { job: id, state: job.record.state })
                } else {
                    let mut active = ActiveJob::from_stored(job);
                    let ready = leader::retry(&mut active, self.options.instance, now, &mut step.batch);
                    self.jobs.insert(id, active);
                    self.queue_ready(id, &ready, now);
                    Ok(())
                };
                step.record(audit, &result);
                step.reply(reply, Some(result));
            }
            JobCommand::Remove { jobs, reply } => {
                let jobs: Vec<JobId> = jobs.into_iter().filter(|id| !self.jobs.contains_key(id)).collect();
                self.removals += 1;
                let number = self.removals;
                self.removing.extend(jobs.iter().map(|&id| (id, number)));
                let count = jobs.len();
                step.batch.removed.extend(jobs);
                let durable = self.removals_durable.clone();
                step.actions.push(Action::Reply(Box::new(move || {
                    durable.fetch_max(number, std::sync::atomic::Ordering::AcqRel);
                    let _ = reply.send(count);
                })));
            }
            JobCommand::PutSettings { settings, reply } => {
                step.batch.settings.extend(settings);
                step.reply(reply, ());
            }
            JobCommand::SetLimits { job_type, limits } => {
                self.dispatch.set_limits(job_type.clone(), limits, now);
                self.retime_held(&job_type, limits.execution_timeout_seconds);
            }
            JobCommand::SetPriority { job, priority, audit, reply } => {
                let result = if self.jobs.contains_key(&job) {
                    self.priorities.insert(job, priority);
                    self.dispatch.reprioritize(job, priority);
                    let value = serde_json::to_vec(&priority).expect("a priority serializes");
                    step.batch.settings.push((priority_key(job), Some(value)));
                    Ok(())
                } else {
                    Err(Error::JobEnded(job))
                };
                step.record(audit, &result);
                step.reply(reply, result);
            }
            JobCommand::SetNotify { routes } => self.options.notify = routes,
            JobCommand::Gate { gated, open, reply } => {
                self.dispatch.set_gate(gated, open);
                let _ = reply.send((self.dispatch.gated_queued(), self.dispatch.gated_running()));
            }
            JobCommand::ApplyRecovery { actions, reply } => {
                let applied =
                    actions.iter().map(|(rule, action)| self.apply_recovery(*rule, action, now, step)).collect();
                step.reply(reply, applied);
            }
            JobCommand::SetWindow { job_type, window } => self.set_window(job_type, window, now),
            JobCommand::SetBudget { budget, marks } => self.shares.set(budget, marks),
        }
    }
}

/// The setting that keeps the priority an operator gave a running job.
pub(in crate::engine) fn priority_key(job: JobId) -> String {
    format!("{}{job}", super::PRIORITY_PREFIX)
}
