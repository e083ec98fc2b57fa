//! The reads: each is answered from memory once the step it sees is
//! durable, and changes nothing but who waits.

use super::super::Summary;
use super::{Core, Query, Step};
use crate::active::ActiveJob;
use crate::clock::Timestamp;

impl Core {
    pub(super) fn answer(&mut self, query: Query, now: Timestamp, step: &mut Step) {
        match query {
            Query::RecoverySnapshot { reply } => {
                let _ = reply.send(self.recovery_snapshot(now));
            }
            Query::ActiveDedupeKeys { reply } => {
                let keys =
                    self.jobs
                        .values()
                        .flat_map(|job| {
                            job.spec.tasks.iter().zip(&job.tasks).filter(|(_, t)| !t.state().is_terminal()).filter_map(
                                |(spec, _)| spec.placement.as_ref()?.dedupe_key.as_deref().map(str::to_string),
                            )
                        })
                        .collect();
                let _ = reply.send(keys);
            }
            // Readers see only what is durable: an answer is taken from memory
            // now and given once every step so far is flushed. A job that is
            // not active is read from the store by the caller, after that too.
            Query::Get { job, reply } => step.reply(reply, self.jobs.get(&job).map(ActiveJob::to_stored)),
            Query::Attempts { reply } => {
                let attempts = self
                    .attempts
                    .iter()
                    .filter_map(|(task, held)| {
                        let job = self.jobs.get(&task.job)?;
                        let record = &job.tasks[task.idx.index()];
                        Some(crate::engine::HeldAttempt {
                            job: task.job,
                            task_id: job.spec.tasks[task.idx.index()].id.to_string(),
                            attempt: held.attempt,
                            handler: held.handler,
                            started_at: record.started_at(),
                        })
                    })
                    .collect();
                step.reply(reply, attempts);
            }
            Query::Task { job, task, reply } => {
                let found = self.jobs.get(&job).map(|active| {
                    let idx = match &task {
                        crate::engine::TaskKey::Id(id) => active.spec.tasks.iter().position(|t| *t.id == **id)?,
                        crate::engine::TaskKey::Index(idx) => Some(*idx).filter(|i| *i < active.tasks.len())?,
                    };
                    Some((active.spec.clone(), idx, active.tasks[idx].clone()))
                });
                step.reply(reply, found);
            }
            Query::Snapshot { reply } => {
                step.reply(reply, (now, self.jobs.values().map(ActiveJob::to_stored).collect()))
            }
            Query::Summary { job, reply } => {
                let summary = self.jobs.get(&job).map(|a| Summary { record: a.record.clone(), counts: a.counts });
                step.reply(reply, summary);
            }
            Query::Wait { job, reply } => {
                if self.jobs.contains_key(&job) {
                    self.waiters.entry(job).or_default().push(reply);
                } else {
                    step.reply(reply, None);
                }
            }
            Query::ActiveJobs { reply } => {
                let _ = reply.send(self.jobs.values().map(|a| a.record.clone()).collect());
            }
        }
    }
}
