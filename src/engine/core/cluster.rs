//! The steps of work between instances on one store: jobs adopted and
//! released, slots reserved, attempts lent and borrowed, permits.

use foldhash::HashSet;

use super::super::attempts::Ending;
use super::super::Orphans;
use super::{ClusterCommand, Core, Step};
use crate::clock::Timestamp;
use crate::model::{HandlerId, JobId};

impl Core {
    pub(super) fn apply_cluster(&mut self, command: ClusterCommand, now: Timestamp, step: &mut Step) {
        match command {
            ClusterCommand::Adopt { jobs, priorities, reply } => {
                self.remember_priorities(priorities);
                let mut adopted = 0;
                let mut fresh = Vec::with_capacity(jobs.len());
                for mut stored in jobs.into_iter().filter(|job| !self.jobs.contains_key(&job.record.id)) {
                    stored.record.handler = Some(self.options.instance);
                    step.batch.jobs.push(stored.record.clone());
                    fresh.push(stored);
                    adopted += 1;
                }
                // Attempts borrowed for these jobs are held here now, as the leader's.
                let jobs: HashSet<JobId> = fresh.iter().map(|job| job.record.id).collect();
                for attempt in self.attempts.borrowed_of(&jobs) {
                    self.end(attempt, Ending::Settled, now, step);
                }
                self.restore(fresh, now, step);
                step.reply(reply, adopted);
            }
            ClusterCommand::Release { up_to, reply } => {
                let busy = self.attempts.jobs();
                let mut candidates: Vec<JobId> = self
                    .jobs
                    .keys()
                    .filter(|job| !busy.contains(job) && !self.waiters.contains_key(job))
                    .copied()
                    .collect();
                candidates.sort();
                candidates.truncate(up_to);
                for &job in &candidates {
                    self.jobs.remove(&job);
                    self.dispatch.forget_job(job);
                    self.released_at.retain(|task, _| task.job != job);
                    tracing::info!(job.id = %job, "job released for another instance to lead");
                }
                step.batch.released.extend(candidates.iter().copied());
                step.reply(reply, candidates);
            }
            ClusterCommand::Reserve { reply } => {
                let _ = reply.send(self.dispatch.reserve_free());
            }
            ClusterCommand::Borrowed { handler, reserved, lent, reply } => {
                let unsent = self.borrowed(handler, reserved, lent, step);
                let _ = reply.send(unsent);
            }
            ClusterCommand::ReturnBorrowed { attempt } => self.end(attempt, Ending::Settled, now, step),
            ClusterCommand::Lend { slots, reply } => {
                // A handler another live instance offers is connected there
                // now: not away, as if its heartbeat had listed it.
                for offered in &slots {
                    self.attempts.back(offered.handler);
                }
                let lent = self.lend(slots, now, step);
                step.reply(reply, lent);
            }
            ClusterCommand::PermitDemand { reply } => {
                let _ = reply.send(self.permit_demand());
            }
            ClusterCommand::SetPermits { permits, resources } => {
                self.dispatch.set_permits(permits, now);
                self.resource_permits = Some(resources);
            }
            ClusterCommand::PeerHandlers { handlers } => {
                // A handler that moved to another live instance is not away.
                let moved: Vec<HandlerId> = self.attempts.away_handlers().filter(|h| handlers.contains(h)).collect();
                for handler in moved {
                    self.attempts.back(handler);
                }
                if handlers != self.peer_handlers {
                    tracing::debug!(handlers = handlers.len(), "handlers connected to other instances");
                }
                // A handler whose instance went away is away, as a worker that
                // disconnected from here is: its worker keeps running what it
                // holds and reports it wherever it reconnects, so its attempts
                // wait for it before they are taken back.
                if let Orphans::Keep { grace } = self.options.orphans {
                    let gone: Vec<HandlerId> = self
                        .peer_handlers
                        .iter()
                        .filter(|h| !handlers.contains(h) && !self.dispatch.has_handler(**h))
                        .filter(|h| !self.attempts.of_handler(**h).is_empty())
                        .copied()
                        .collect();
                    for handler in gone {
                        if self.attempts.is_away(handler) {
                            continue;
                        }
                        let reason = format!(
                            "lost with its worker: its admin instance went away, and the worker did not come back within {:.1} s",
                            grace.as_secs_f64()
                        );
                        self.attempts.away(handler, now.plus_millis(grace.as_millis() as i64), reason);
                    }
                }
                self.peer_handlers = handlers;
            }
            ClusterCommand::DatabaseTime { offset_ms } => self.set_database_clock(offset_ms, now),
            ClusterCommand::SetBudgetPermits { held } => self.shares.set_held(held),
            ClusterCommand::KeepShares { shares } => self.remember(Vec::new(), Vec::new(), shares),
        }
    }
}
